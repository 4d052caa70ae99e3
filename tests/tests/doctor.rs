//! `bcd doctor` against nodes made healthy and broken for real: a deleted
//! key, a foreign certificate, an expired certificate, a corrupt journal,
//! a CDI file edited by hand, a foreign nft rule, a missing GPU, a stopped
//! helper, no server. Each asserts its check's status and text, through
//! `--json`, and the exit code (0 all ok, 1 a failure, 2 warnings only).
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bc_tests::hosttree::HostTree;
use bc_tests::{FAST, Netns, Node, Server, section, stderr, wait_for};

fn doctor(node: &Node, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut c = Command::new(bc_tests::bin("bcd"));
    c.arg("doctor")
        .arg("--data-dir")
        .arg(&node.dir)
        .arg("--cdi-dir")
        .arg(node.dir.join("cdi"))
        .arg("--run-dir")
        .arg(node.dir.join("run"))
        .arg("--etc-dir")
        .arg(node.dir.join("etc"))
        .arg("--nft")
        .arg(node.nft.clone().unwrap_or_else(|| node.dir.join("no-nft")))
        .arg("--udevd")
        .arg(node.dir.join("no-udevd"))
        .args(["--timeout", "3s", "--json"]);
    match &node.host_root {
        Some(root) => c.arg("--host-root").arg(root),
        None => c.arg("--fake-hw").arg(node.seed.to_string()),
    };
    let out = c.args(extra).output().unwrap();
    let json = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", stderr(&out)));
    (out.status.code().unwrap(), json)
}

fn check<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {report}"))
}

fn assert_check(report: &serde_json::Value, name: &str, status: &str, text: &str) {
    let c = check(report, name);
    assert_eq!(c["status"], status, "{name}: {c}");
    let all = format!("{} {}", c["summary"], c["next"]);
    assert!(all.contains(text), "{name}: {text:?} not in {c}");
}

/// A node on a host tree with two GPUs, one assigned, firewall rules in a
/// network namespace of its own; running and connected.
fn healthy(d: &Path, server: &Server, ns: &Netns) -> (Node, String, HostTree) {
    let tree = HostTree::new(&d.join("host"), "doctor-host");
    tree.gpu("0000:17:00.0", 0);
    tree.gpu("0000:2a:00.0", 1);
    let mut node = Node::new(&d.join("n"), 0);
    node.host_root = Some(tree.root.clone());
    node.nft = Some(ns.nft.clone());
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    server.assign_and_wait(&id, "job-a", "0", 1);
    let access = d.join("access.json");
    std::fs::write(
        &access,
        serde_json::json!({"firewall": {"rules": [{"protocol": "tcp", "port": 22, "action": "accept"}]}})
            .to_string(),
    )
    .unwrap();
    assert!(
        server
            .cli(&["nodes", "access", &id, "--file", access.to_str().unwrap()])
            .status
            .success()
    );
    wait_for(Duration::from_secs(20), "access applied", || {
        let v = server.spec(&id);
        (section(&v, "access")["status"] == "READY"
            && v["applied_generation"] == v["desired_generation"])
            .then_some(())
    });
    (node, id, tree)
}

#[test]
fn a_healthy_node_and_each_thing_that_breaks_it() {
    let d = tempfile::tempdir().unwrap();
    let mut server = Server::start(&d.path().join("server"), FAST).unwrap();
    let ns = Netns::new();
    let (mut node, _id, tree) = healthy(d.path(), &server, &ns);

    // Healthy, with the daemon running: every check ok, exit 0. The
    // daemon keeps its session through the gateway probe.
    let (code, r) = doctor(&node, &[]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "ok");
    for name in [
        "identity",
        "certificate",
        "clock",
        "journal",
        "slots",
        "helper",
        "gpus",
        "cdi",
        "env-files",
        "sshd",
        "firewall",
        "udev",
        "gateway",
    ] {
        assert_eq!(check(&r, name)["status"], "ok", "{name}: {r:#}");
    }
    assert_check(&r, "gateway", "ok", "accepts this identity");
    assert_check(&r, "cdi", "ok", "matches the spec");
    assert_check(&r, "firewall", "ok", "holds the spec's 1 rules");
    assert_check(&r, "journal", "ok", "integrity ok");
    // The text form says the same.
    let text = Command::new(bc_tests::bin("bcd"))
        .args(["doctor", "--udevd", "/nonexistent", "--data-dir"])
        .arg(&node.dir)
        .arg("--host-root")
        .arg(&tree.root)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("ok    identity     node "),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );

    // Stop the daemon: what follows would be repaired at its next pass.
    node.proc().stop();

    // Warnings only: exit 2. An env file of no allocation.
    let stale = node.dir.join("run/env/stale.env");
    std::fs::write(&stale, "NVIDIA_VISIBLE_DEVICES=all\n").unwrap();
    let (code, r) = doctor(&node, &[]);
    assert_eq!(code, 2, "{r:#}");
    assert_eq!(r["status"], "warn");
    assert_check(
        &r,
        "env-files",
        "warn",
        "stale.env belong to no assigned allocation",
    );
    std::fs::remove_file(&stale).unwrap();

    // A CDI spec edited by hand.
    let cdi = node.dir.join("cdi/bcd-nvidia-gpu.json");
    let good_cdi = std::fs::read(&cdi).unwrap();
    let edited = String::from_utf8(good_cdi.clone())
        .unwrap()
        .replace("/dev/nvidia0", "/dev/nvidia7");
    std::fs::write(&cdi, edited).unwrap();
    let (code, r) = doctor(&node, &[]);
    assert_eq!(code, 1);
    assert_check(
        &r,
        "cdi",
        "fail",
        "differs from what the spec asks for (edited by hand?)",
    );
    std::fs::write(&cdi, &good_cdi).unwrap();

    // A foreign rule in table inet bcd.
    assert!(
        ns.nft(&[
            "add", "rule", "inet", "bcd", "input", "tcp", "dport", "9999", "drop"
        ])
        .is_some()
    );
    let (_, r) = doctor(&node, &[]);
    assert_check(&r, "firewall", "fail", "some not written by bcd");
    assert_check(
        &r,
        "firewall",
        "fail",
        "keep rules of your own in a table of your own",
    );

    // A GPU the spec assigns is gone.
    tree.remove_gpu("0000:17:00.0", 0);
    let (_, r) = doctor(&node, &[]);
    assert_check(&r, "gpus", "fail", "allocation job-a: GPU");
    assert_check(&r, "gpus", "fail", "is not on this node");
    tree.gpu("0000:17:00.0", 0);

    // A stopped helper.
    let (code, r) = doctor(
        &node,
        &[
            "--helper",
            d.path().join("no-helper.sock").to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1);
    assert_check(&r, "helper", "fail", "helper: cannot reach bcd-helper at");
    assert_check(&r, "helper", "fail", "systemctl start bcd-helper.service");

    // No server.
    server.proc.stop();
    let (_, r) = doctor(&node, &[]);
    assert_check(&r, "gateway", "fail", "cannot reach");
    server.restart().unwrap();

    // A corrupt journal.
    let journal = node.dir.join("journal.db");
    let saved = std::fs::read(&journal).unwrap();
    for side in ["journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(node.dir.join(side));
    }
    std::fs::write(&journal, vec![0x5a; 8192]).unwrap();
    let (_, r) = doctor(&node, &[]);
    assert_check(&r, "journal", "fail", "move journal.db aside");
    std::fs::write(&journal, saved).unwrap();

    // A foreign certificate: another node's.
    let other = Node::new(&d.path().join("other"), 9);
    assert!(other.join(&server.url(), &server.token(1)).status.success());
    let cert = node.dir.join("node.crt");
    let own = std::fs::read(&cert).unwrap();
    std::fs::copy(other.dir.join("node.crt"), &cert).unwrap();
    let (_, r) = doctor(&node, &[]);
    assert_check(
        &r,
        "identity",
        "fail",
        "the node key does not match the node certificate",
    );
    assert_check(
        &r,
        "identity",
        "fail",
        "bcd join --reset --yes, then bcd join",
    );
    std::fs::write(&cert, own).unwrap();

    // A deleted key.
    std::fs::remove_file(node.dir.join("node.key")).unwrap();
    let (code, r) = doctor(&node, &[]);
    assert_eq!(code, 1);
    assert_check(&r, "identity", "fail", "node.key cannot be read");
    assert_check(&r, "gateway", "fail", "not probed");
}

#[test]
fn an_expired_certificate_fails() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--node-cert-ttl", "2s"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let node = Node::new(&d.path().join("n"), 3);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let not_after = node.identity()["cert_not_after_ms"].as_i64().unwrap();
    wait_for(Duration::from_secs(10), "the certificate to expire", || {
        (bcd_sys_now_ms() > not_after + 500).then_some(())
    });
    let (code, r) = doctor(&node, &[]);
    assert_eq!(code, 1);
    assert_check(&r, "certificate", "fail", "expired at");
    assert_check(
        &r,
        "certificate",
        "fail",
        "join again: bcd join --reset --yes, then bcd join",
    );
    assert_check(&r, "identity", "ok", "which the fleet CA issued");
    assert_check(&r, "gateway", "fail", "");
}

fn bcd_sys_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
