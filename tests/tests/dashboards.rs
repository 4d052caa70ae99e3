//! The shipped monitoring (monitoring/): the Prometheus rules pass
//! `promtool check rules` and their unit tests, and a real Prometheus
//! scraping a control plane and two nodes evaluates every dashboard panel's
//! query to a value and every rule with each metric it names present, so a
//! renamed metric breaks the test instead of silencing an alert.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bc_tests::{FAST, Node, Proc, Server, stderr, wait_for};

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../monitoring")
}

fn tool(name: &str) -> &'static str {
    let path: &'static str = match name {
        "promtool" => "/usr/bin/promtool",
        _ => "/usr/bin/prometheus",
    };
    assert!(
        Path::new(path).exists(),
        "{path} is missing: install Debian's prometheus package (scripts/test does)"
    );
    path
}

#[test]
fn the_rules_check_and_every_alert_fires_in_its_unit_test() {
    let rules = monitoring().join("prometheus/rules.yml");
    let out = Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = Command::new(tool("promtool"))
        .args(["test", "rules"])
        .arg(monitoring().join("prometheus/rules_test.yml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    // Every alert has a firing case in the unit tests.
    let text = std::fs::read_to_string(&rules).unwrap();
    let tests = std::fs::read_to_string(monitoring().join("prometheus/rules_test.yml")).unwrap();
    for alert in text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - "
            )),
            "{alert} has no firing case in rules_test.yml"
        );
    }
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `GET path` from Prometheus, as JSON (HTTP/1.0: the body ends with the
/// connection).
fn api(prometheus: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    let mut s = std::net::TcpStream::connect(prometheus).map_err(|e| format!("{path}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw)
        .map_err(|e| format!("{path}: {e}"))?;
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).map_err(|e| format!("{path}: {e}: {raw}"))
}

fn encoded(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The query's result, or the error Prometheus gave.
fn query(prometheus: SocketAddr, q: &str) -> Result<Vec<serde_json::Value>, String> {
    let v = api(prometheus, &format!("/api/v1/query?query={}", encoded(q)))?;
    if v["status"] != "success" {
        return Err(format!("{q}: {}", v["error"]));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The metric names a query reads (ours and `up`).
fn metrics_named(q: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = q.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
        if word(bytes[i]) && (i == 0 || !word(bytes[i - 1])) {
            let end = (i..bytes.len())
                .find(|&j| !word(bytes[j]))
                .unwrap_or(bytes.len());
            let w = &q[i..end];
            let quoted = q[..i].matches('"').count() % 2 == 1;
            if !quoted && (w.starts_with("bc_") || w.starts_with("bcd_") || w == "up") {
                names.insert(w.trim_end_matches("_bucket").to_string());
            }
            i = end;
        } else {
            i += 1;
        }
    }
    names
}

struct Prometheus(Proc);

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.0.kill();
    }
}

#[test]
fn every_panel_and_rule_evaluates_against_a_live_fleet() {
    let prom_bin = tool("prometheus");
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut targets = Vec::new();
    let mut nodes = Vec::new();
    for seed in [61, 62] {
        let mut node = Node::new(&d.path().join(format!("node{seed}")), seed);
        let out = node.join(&server.url(), &server.token(1));
        assert!(out.status.success(), "{}", stderr(&out));
        let addr = free_port();
        node.args = vec!["--metrics-listen".into(), addr.to_string()];
        node.start();
        server.wait_node(&node.id(), "connected", |n| n.state == "connected");
        // A spec, so the node reports its sections' convergence.
        let out = server.cli(&["nodes", "label", &node.id(), "pool=a"]);
        assert!(out.status.success(), "{}", stderr(&out));
        targets.push(addr);
        nodes.push(node);
    }
    let listen = free_port();
    let config = d.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n\
             \x20 - job_name: better-compute\n    static_configs: [{{targets: [\"{http}\"]}}]\n\
             \x20 - job_name: bcd\n    static_configs: [{{targets: [\"{n0}\", \"{n1}\"]}}]\n",
            rules = monitoring().join("prometheus/rules.yml"),
            http = server.http.expect("the server's HTTP listener"),
            n0 = targets[0],
            n1 = targets[1],
        ),
    )
    .unwrap();
    let log = d.path().join("prometheus.log");
    let child = Command::new(prom_bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            d.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _prometheus = Prometheus(Proc { child, log });

    wait_for(Duration::from_secs(60), "three targets up", || {
        let up = query(listen, "sum(up)").ok()?;
        (up.first()?["value"][1] == "3").then_some(())
    });
    // A command once scraping runs, so dispatch latency moves in a window.
    let id = nodes[0].id();
    let c = server.wait_command(&server.run_command(&id, "exec.run", &["/bin/true"]));
    assert_eq!(c.state, "succeeded");

    let dashboard: serde_json::Value = serde_json::from_slice(
        &std::fs::read(monitoring().join("grafana/better-compute.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 20, "{} panels", panels.len());
    // Rates need two samples in their window, the fleet gauges the key
    // holder's first read: every panel has a value within a minute.
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            // A quantile of a call with no samples in its window is NaN;
            // a panel must still show something.
            wait_for(
                Duration::from_secs(60),
                &format!("panel {:?} to show a value: {expr}", p["title"]),
                || {
                    query(listen, expr)
                        .ok()
                        .filter(|r| r.iter().any(|s| s["value"][1] != "NaN"))
                },
            );
        }
    }

    // Every rule as Prometheus loaded it: evaluated without error, and
    // every metric it names has series.
    let rules = wait_for(Duration::from_secs(30), "every rule evaluated", || {
        let v = api(listen, "/api/v1/rules").ok()?;
        let rules: Vec<serde_json::Value> = v["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.iter().all(|r| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001"))
        });
        (evaluated && !rules.is_empty()).then_some(rules)
    });
    let shipped = std::fs::read_to_string(monitoring().join("prometheus/rules.yml")).unwrap();
    assert_eq!(
        rules.len(),
        shipped.matches("- alert: ").count() + shipped.matches("- record: ").count()
    );
    for r in &rules {
        let expr = r["query"].as_str().unwrap();
        assert_eq!(r["health"], "ok", "{}: {r}", r["name"]);
        query(listen, expr).unwrap();
        for metric in metrics_named(expr) {
            let series = query(
                listen,
                &format!("count({{__name__=~\"{metric}(_bucket)?\"}})"),
            )
            .unwrap();
            assert!(
                !series.is_empty(),
                "rule {} reads {metric}, which no target exposes",
                r["name"]
            );
        }
    }
    // A healthy fleet raises none.
    let firing = api(listen, "/api/v1/alerts").unwrap();
    assert_eq!(firing["data"]["alerts"], serde_json::json!([]), "{firing}");
}
