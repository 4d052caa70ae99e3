//! The node's metrics, scraped during a run and parsed with a Prometheus
//! text parser (`prometheus-parse`): the values move with what happened
//! (a session, a reconnect after the server restarts, commands run, the
//! devices section's status, the certificate's life left).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bc_tests::{Node, Proc, setup_dirs, stderr, wait_for};

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// GET /metrics, parsed.
fn scrape(addr: SocketAddr) -> Option<prometheus_parse::Scrape> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bcd\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    Some(prometheus_parse::Scrape::parse(lines).expect("the exposition parses"))
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

fn start(node: &Node, addr: SocketAddr) -> Proc {
    let log = node.dir.with_extension("metrics.log");
    let child = std::process::Command::new(bc_tests::bin("bcd"))
        .arg("node")
        .arg("--data-dir")
        .arg(&node.dir)
        .args(["--fake-hw", &node.seed.to_string()])
        .arg("--cdi-dir")
        .arg(node.dir.join("cdi"))
        .arg("--run-dir")
        .arg(node.dir.join("run"))
        .arg("--etc-dir")
        .arg(node.dir.join("etc"))
        .arg("--nft")
        .arg(node.dir.join("no-nft"))
        .args([
            "--converge-every",
            "300ms",
            "--metrics-listen",
            &addr.to_string(),
        ])
        .env("BCD_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Proc { child, log }
}

#[test]
fn metrics_move_with_what_happened() {
    let (d, mut server) = setup_dirs();
    let node = Node::new(&d.path().join("n"), 21);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    let addr = free_port();
    let mut proc = start(&node, addr);
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let first = wait_for(Duration::from_secs(10), "connected in the metrics", || {
        scrape(addr).filter(|s| value(s, "bcd_session_connected", &[]) == Some(1.0))
    });
    assert_eq!(value(&first, "bcd_sessions_total", &[]), Some(1.0));
    assert_eq!(value(&first, "bcd_reconnects_total", &[]), Some(0.0));
    let life = value(&first, "bcd_certificate_seconds_left", &[]).unwrap();
    assert!(life > 20.0 * 3600.0 && life <= 24.0 * 3600.0, "{life}");
    assert!(
        value(&first, "bcd_clock_offset_seconds", &[])
            .unwrap()
            .abs()
            < 5.0
    );

    // Commands run, by kind and outcome.
    let ok = server.run_command(&id, "exec.run", &["/bin/true"]);
    let bad = server.run_command(&id, "exec.run", &["/nonexistent/program"]);
    assert_eq!(server.wait_command(&ok).state, "succeeded");
    assert_eq!(server.wait_command(&bad).state, "failed");
    let s = wait_for(Duration::from_secs(10), "commands in the metrics", || {
        scrape(addr).filter(|s| {
            value(
                s,
                "bcd_commands_total",
                &[("kind", "exec.run"), ("outcome", "failed")],
            ) == Some(1.0)
        })
    });
    assert_eq!(
        value(
            &s,
            "bcd_commands_total",
            &[("kind", "exec.run"), ("outcome", "succeeded")]
        ),
        Some(1.0)
    );

    // A tunnel, and the bytes it carried each way.
    let o = server.cli(&["exec", &id, "--", "echo", "through"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = wait_for(Duration::from_secs(10), "a tunnel in the metrics", || {
        scrape(addr).filter(|s| value(s, "bcd_tunnels_total", &[]) == Some(1.0))
    });
    assert!(value(&s, "bcd_tunnel_bytes_total", &[("direction", "out")]).unwrap() > 0.0);
    assert!(value(&s, "bcd_tunnel_bytes_total", &[("direction", "in")]).unwrap() > 0.0);

    // The devices section: a GPU the node does not have fails it.
    let out = server.cli(&["nodes", "assign", &id, "job-x", "--gpus", "GPU-not-here"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(
        Duration::from_secs(10),
        "devices failed in the metrics",
        || {
            scrape(addr).filter(|s| {
                value(
                    s,
                    "bcd_convergence",
                    &[("section", "devices"), ("status", "failed")],
                ) == Some(1.0)
                    && value(
                        s,
                        "bcd_convergence",
                        &[("section", "devices"), ("status", "ready")],
                    ) == Some(0.0)
            })
        },
    );

    // The server goes away and comes back: disconnected, then a reconnect.
    server.proc.stop();
    wait_for(
        Duration::from_secs(20),
        "disconnected in the metrics",
        || scrape(addr).filter(|s| value(s, "bcd_session_connected", &[]) == Some(0.0)),
    );
    server.restart().unwrap();
    let s = wait_for(
        Duration::from_secs(60),
        "a reconnect in the metrics",
        || {
            scrape(addr).filter(|s| {
                value(s, "bcd_session_connected", &[]) == Some(1.0)
                    && value(s, "bcd_reconnects_total", &[]) == Some(1.0)
            })
        },
    );
    assert_eq!(value(&s, "bcd_sessions_total", &[]), Some(2.0));
    assert!(value(&s, "bcd_session_epoch", &[]).unwrap() >= 2.0);
    // The same certificate, on server time a moment later.
    let later = value(&s, "bcd_certificate_seconds_left", &[]).unwrap();
    assert!(
        later <= life + 1.0 && later > life - 60.0,
        "{later} after {life}"
    );
    assert!(value(&s, "bcd_journal_unacked_events", &[]).is_some());
    proc.stop();
}
