//! The control plane's HTTP listener on a real server: `/metrics` scraped
//! while a node joins, a command runs and the node goes away, parsed with
//! a Prometheus text parser (`prometheus-parse`), the values moving with
//! what happened; `/healthz` and `/readyz` on a healthy server, `/readyz`
//! 503 (with a clean reason) while the store is locked away from it, as
//! the simulator's outage does, and 200 again after; a node that dials
//! again resuming its TLS session.
#![allow(clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bc_tests::{Front, Node, setup_connected, setup_dirs, stderr, wait_for};

/// One plain HTTP/1.1 GET: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: bc\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, head.to_string(), body.to_string()))
}

fn scrape(addr: SocketAddr) -> Option<prometheus_parse::Scrape> {
    let (code, head, body) = get(addr, "/metrics")?;
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    let lines = body.lines().map(|l| Ok(l.to_string()));
    Some(prometheus_parse::Scrape::parse(lines).expect("the exposition parses"))
}

fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            // A histogram's total: its +Inf bucket.
            prometheus_parse::Value::Histogram(b) => b
                .iter()
                .find(|c| c.less_than.is_infinite())
                .map_or(f64::NAN, |c| c.count),
            prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}

#[test]
fn server_metrics_move_with_a_node_and_a_command() {
    let (_d, server, mut node, id) = setup_connected(41);
    let http = server.http.expect("the server's http listener");

    let s = wait_for(
        Duration::from_secs(10),
        "the session in the metrics",
        || scrape(http).filter(|s| value(s, "bc_gateway_sessions", &[]) == Some(1.0)),
    );
    assert_eq!(
        value(&s, "bc_hellos_total", &[("outcome", "welcomed")]),
        Some(1.0)
    );
    assert!(value(&s, "bc_handshakes_total", &[("outcome", "admitted")]).unwrap() >= 1.0);
    assert!(value(&s, "bc_store_latency_seconds", &[("call", "hello")]).unwrap() >= 1.0);
    assert!(value(&s, "bc_store_latency_seconds", &[("call", "renew_lease")]).unwrap() >= 1.0);
    assert_eq!(value(&s, "bc_gateway_fenced", &[]), Some(0.0));
    let offset = value(&s, "bc_clock_offset_seconds", &[]).unwrap();
    assert!(offset.abs() < 1.0, "{offset}");
    assert!(
        s.samples
            .iter()
            .any(|x| x.metric == "bc_gateway" && x.labels.get("gateway").is_some()),
        "the gateway's id is labelled"
    );

    // A command runs: dispatched once, counted by state from the store.
    let ok = server.run_command(&id, "exec.run", &["/bin/true"]);
    let bad = server.run_command(&id, "exec.run", &["/nonexistent/program"]);
    assert_eq!(server.wait_command(&ok).state, "succeeded");
    assert_eq!(server.wait_command(&bad).state, "failed");
    let s = wait_for(
        Duration::from_secs(15),
        "commands by state in the metrics",
        || {
            scrape(http).filter(|s| {
                value(s, "bc_commands", &[("state", "succeeded")]) == Some(1.0)
                    && value(s, "bc_commands", &[("state", "failed")]) == Some(1.0)
            })
        },
    );
    assert_eq!(value(&s, "bc_dispatch_latency_seconds", &[]), Some(2.0));
    assert!(
        value(
            &s,
            "bc_store_latency_seconds",
            &[("call", "command_result")]
        )
        .unwrap()
            >= 2.0
    );

    // The node goes away and comes back: the session count follows, a
    // second Hello is counted, the disconnect is a liveness transition.
    node.proc().stop();
    let s = wait_for(Duration::from_secs(15), "no session in the metrics", || {
        scrape(http).filter(|s| value(s, "bc_gateway_sessions", &[]) == Some(0.0))
    });
    assert!(
        value(
            &s,
            "bc_liveness_transitions_total",
            &[("to", "disconnected")]
        )
        .unwrap()
            >= 1.0
    );
    node.start();
    let s = wait_for(
        Duration::from_secs(30),
        "the node back in the metrics",
        || {
            scrape(http).filter(|s| {
                value(s, "bc_gateway_sessions", &[]) == Some(1.0)
                    && value(s, "bc_hellos_total", &[("outcome", "welcomed")]) == Some(2.0)
            })
        },
    );
    assert!(value(&s, "bc_liveness_transitions_total", &[("to", "connected")]).unwrap() >= 2.0);

    // A deleted node started again is refused at its Hello, by reason.
    let out = server.cli(&["nodes", "delete", &id, "--yes"]);
    assert!(out.status.success(), "{}", bc_tests::stderr(&out));
    node.proc().wait(Duration::from_secs(30)).expect("revoked");
    node.start();
    let status = node.proc().wait(Duration::from_secs(30)).expect("refused");
    assert_eq!(status.code(), Some(3));
    let s = wait_for(
        Duration::from_secs(10),
        "the refusal in the metrics",
        || {
            scrape(http).filter(|s| {
                value(s, "bc_hello_refusals_total", &[("reason", "deleted-node")]) == Some(1.0)
            })
        },
    );
    assert_eq!(
        value(&s, "bc_hellos_total", &[("outcome", "refused")]),
        Some(1.0)
    );
    assert_eq!(value(&s, "bc_gateway_sessions", &[]), Some(0.0));
}

/// A node whose link is reset dials the same gateway again from the same
/// process: the handshake resumes the TLS session (the gateway's ticket)
/// instead of signing and checking certificates again, and its Hello is
/// welcomed as before.
#[test]
fn a_node_that_dials_again_resumes_its_tls_session() {
    let (d, server) = setup_dirs();
    let http = server.http.expect("the server's http listener");
    let front = Front::new();
    front.set("gw", Some(server.addr));
    let mut node = Node::new(&d.path().join("node"), 43);
    let out = node.join(&front.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let s = wait_for(
        Duration::from_secs(10),
        "the session in the metrics",
        || scrape(http).filter(|s| value(s, "bc_gateway_sessions", &[]) == Some(1.0)),
    );
    let full = value(&s, "bc_tls_sessions_total", &[("kind", "full")]).unwrap();
    assert!(full >= 1.0, "{full}");
    assert_eq!(
        value(&s, "bc_tls_sessions_total", &[("kind", "resumed")]).unwrap_or(0.0),
        0.0
    );

    assert_eq!(front.reset_all(), 1, "one link through the balancer");
    let s = wait_for(Duration::from_secs(30), "the node back, resumed", || {
        scrape(http).filter(|s| {
            value(s, "bc_gateway_sessions", &[]) == Some(1.0)
                && value(s, "bc_hellos_total", &[("outcome", "welcomed")]) == Some(2.0)
        })
    });
    assert_eq!(
        value(&s, "bc_tls_sessions_total", &[("kind", "resumed")]),
        Some(1.0),
        "{}",
        node.proc().log()
    );
    assert_eq!(
        value(&s, "bc_tls_sessions_total", &[("kind", "full")]),
        Some(full),
        "no full handshake for the redial"
    );
    server.wait_node(&id, "connected again", |n| n.state == "connected");

    // A new process has no session to resume.
    node.proc().stop();
    node.start();
    wait_for(
        Duration::from_secs(30),
        "a full handshake after a restart",
        || {
            scrape(http).filter(|s| {
                value(s, "bc_hellos_total", &[("outcome", "welcomed")]) == Some(3.0)
                    && value(s, "bc_tls_sessions_total", &[("kind", "full")]) == Some(full + 1.0)
            })
        },
    );
}

#[test]
fn health_and_readiness_follow_the_store() {
    let (_d, server) = setup_dirs();
    let http = server.http.expect("the server's http listener");
    let (code, _, body) = get(http, "/healthz").unwrap();
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    wait_for(Duration::from_secs(10), "ready", || {
        get(http, "/readyz").filter(|(c, _, b)| *c == 200 && b == "ready\n")
    });
    let (code, _, _) = get(http, "/nothing").unwrap();
    assert_eq!(code, 404);

    // The store locked away from every writer (as the simulator's outage
    // does): the lease cannot be renewed, the gateway fences, and /readyz
    // says so; /healthz keeps answering at once.
    let lock = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    lock.busy_timeout(Duration::from_secs(10)).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (_, _, why) = wait_for(Duration::from_secs(15), "not ready", || {
        get(http, "/readyz").filter(|(c, _, _)| *c == 503)
    });
    assert!(why.starts_with("not ready\n"), "{why}");
    assert!(why.contains("gateway lease: not held (fenced)"), "{why}");
    for leak in ["store.db", "sqlite", "SQL", "database", "locked", "/"] {
        assert!(!why.contains(leak), "{leak:?} in {why:?}");
    }
    let start = Instant::now();
    let (code, _, _) = get(http, "/healthz").unwrap();
    assert_eq!(code, 200);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let s = scrape(http).unwrap();
    assert_eq!(value(&s, "bc_gateway_fenced", &[]), Some(1.0));

    lock.execute_batch("COMMIT").unwrap();
    wait_for(Duration::from_secs(20), "ready again", || {
        get(http, "/readyz").filter(|(c, _, b)| *c == 200 && b == "ready\n")
    });
}

#[test]
fn the_listener_can_be_off() {
    let d = tempfile::tempdir().unwrap();
    let server = bc_tests::Server::start(&d.path().join("s"), &["--http-listen", "off"]).unwrap();
    assert!(server.http.is_none());
    assert!(
        !server.proc.log().contains("http listener"),
        "{}",
        server.proc.log()
    );
}
