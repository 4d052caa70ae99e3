//! Join and session, end to end: real `better-compute serve` and `bcd`
//! processes on loopback.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use bc_tests::{FAST, Node, Server, setup, setup_connected, stderr, wait_for};
use rustix::process::Signal;

#[test]
fn join_then_session_shows_connected() {
    let (_d, server, mut node) = setup(1);
    let id = node.id();
    let identity = node.identity();
    assert_eq!(identity["server"], server.url());
    assert!(identity["server_time_mark_ms"].as_i64().unwrap() > 1_700_000_000_000);
    node.start();
    let v = server.wait_node(&id, "the node connected", |n| n.state == "connected");
    assert_eq!(v.epoch, 1);
    assert_eq!(v.hostname, "fake-1");
    assert!(!v.boot_id.is_empty() && !v.journal_id.is_empty() && !v.incarnation_id.is_empty());
    assert!(v.gateway.starts_with("gw-"));
    let remaining = v.cert_not_after_ms
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
    assert!(
        (23 * 3600 * 1000..=24 * 3600 * 1000 + 60_000).contains(&remaining),
        "certificate lasts 24 h by default, {remaining} ms left"
    );
    // Heartbeats keep it connected and its last-seen age small.
    let v = wait_for(Duration::from_secs(10), "a fresh liveness flush", || {
        server
            .node(&id)
            .filter(|n| n.state == "connected" && n.last_seen_age_ms < 2_000)
    });
    assert_eq!(v.epoch, 1);
    // The human table shows the same.
    let table = String::from_utf8(server.cli(&["nodes", "list"]).stdout).unwrap();
    assert!(
        table.contains(&id) && table.contains("connected"),
        "{table}"
    );
    // An orderly stop marks it disconnected at once.
    assert!(node.proc().stop().success());
    server.wait_node(&id, "disconnected after stop", |n| {
        n.state == "disconnected"
    });
}

#[test]
fn server_restart_and_crash_give_the_node_higher_epochs() {
    let (_d, mut server, mut node) = setup(2);
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected" && n.epoch == 1);
    server.restart().unwrap();
    let v = server.wait_node(&id, "reconnected after restart", |n| {
        n.state == "connected" && n.epoch == 2
    });
    let gw2 = v.gateway.clone();
    server.crash_restart().unwrap();
    let v = server.wait_node(&id, "reconnected after crash", |n| {
        n.state == "connected" && n.epoch == 3
    });
    assert_ne!(v.gateway, gw2, "each server process is a new gateway");
    // The node persisted the epoch it accepted.
    wait_for(
        Duration::from_secs(5),
        "identity.json records epoch 3",
        || (node.identity()["last_epoch"] == 3).then_some(()),
    );
}

#[test]
fn a_frozen_node_is_closed_after_three_missed_heartbeats_and_comes_back() {
    let (_d, server, mut node, id) = setup_connected(3);
    // SIGSTOP keeps the TCP connection open but stops heartbeats: only the
    // missed-heartbeat rule can close this session.
    node.proc().signal(Signal::STOP);
    server.wait_node(&id, "disconnected by missed heartbeats", |n| {
        n.state == "disconnected" || n.state == "unreachable"
    });
    assert!(
        server
            .proc
            .log()
            .contains("missed heartbeats; closing the session"),
        "{}",
        server.proc.log()
    );
    let v = server.wait_node(&id, "unreachable after the node lease TTL", |n| {
        n.state == "unreachable"
    });
    assert!(v.conditions.contains(&"NodeUnreachable".to_string()));
    assert!(
        v.taints
            .contains(&"NoSchedule:node.unreachable".to_string())
    );
    node.proc().signal(Signal::CONT);
    let v = server.wait_node(&id, "back after SIGCONT", |n| {
        n.state == "connected" && n.epoch == 2
    });
    assert!(v.conditions.is_empty() && v.taints.is_empty());
}

#[test]
fn a_killed_node_goes_disconnected_and_a_restart_is_a_new_incarnation() {
    let (_d, server, mut node) = setup(4);
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");
    node.proc().kill();
    server.wait_node(&id, "disconnected after kill -9", |n| {
        n.state != "connected"
    });
    node.start();
    let after = server.wait_node(&id, "reconnected", |n| {
        n.state == "connected" && n.epoch == 2
    });
    assert_ne!(after.incarnation_id, before.incarnation_id);
    assert_eq!(after.journal_id, before.journal_id, "the journal survived");
    assert_eq!(after.boot_id, before.boot_id, "same (fake) boot");
}

#[test]
fn a_second_node_process_on_the_same_data_dir_is_refused() {
    let (_d, server, mut node) = setup(5);
    node.start();
    server.wait_node(&node.id(), "connected", |n| n.state == "connected");
    let out = node.bcd(&["node"]).output().unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("another bcd process") && e.contains("bcd.lock"),
        "{e}"
    );
}

#[test]
fn a_deleted_node_is_refused_and_told_to_join_again() {
    let (_d, server, mut node, id) = setup_connected(6);
    let refused = server.cli(&["nodes", "delete", &id]);
    assert!(!refused.status.success() && stderr(&refused).contains("--yes"));
    let out = server.cli(&["nodes", "delete", &id, "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(server.node(&id).is_none());
    // Deleting revokes the certificate; the revocation feed ends the live
    // session with a notice carrying the worker-signed statement of the
    // deletion, and the node stops for good.
    let status = node
        .proc()
        .wait(Duration::from_secs(30))
        .expect("bcd node exits once revoked");
    assert_eq!(status.code(), Some(3));
    let log = node.proc().log();
    assert!(
        log.contains(&format!("node {id} was deleted")) && log.contains("bcd join --reset --yes"),
        "{log}"
    );
    assert!(
        server
            .proc
            .log()
            .contains("certificate revoked; closing the session")
    );
    // Started again, it is refused at its Hello.
    node.start();
    let status = node
        .proc()
        .wait(Duration::from_secs(30))
        .expect("bcd node exits once refused");
    assert_eq!(status.code(), Some(3));
    let log = node.proc().log();
    assert!(
        log.contains("was deleted") && log.contains("bcd join --reset --yes"),
        "{log}"
    );
    let unknown = server.cli(&["nodes", "delete", "nd-000000000000", "--yes"]);
    let e = stderr(&unknown);
    assert!(e.contains("no node nd-000000000000"), "{e}");
    assert!(!e.to_lowercase().contains("sql"), "{e}");
}

#[test]
fn rejoining_refuses_until_reset_and_reset_moves_aside() {
    let (_d, server, node) = setup(7);
    let first = node.id();
    let out = node.join(&server.url(), &server.token(1));
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains(&format!("already joined as node {first}"))
            && e.contains("bcd join --reset --yes"),
        "{e}"
    );
    let out = node
        .bcd(&[
            "join",
            "--reset",
            "--server",
            &server.url(),
            "--token",
            &server.token(1),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success() && stderr(&out).contains("--yes"));
    let out = node
        .bcd(&[
            "join",
            "--reset",
            "--yes",
            "--server",
            &server.url(),
            "--token",
            &server.token(1),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // It proved the key moved aside: the same node, re-enrolled.
    assert_eq!(node.id(), first, "the same node");
    assert_eq!(node.identity()["identity_generation"], 2);
    let aside: Vec<String> = std::fs::read_dir(&node.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".reset-"))
        .collect();
    for f in ["identity.json", "node.key", "node.crt", "ca.crt"] {
        assert!(
            aside.iter().any(|a| a.starts_with(&format!("{f}.reset-"))),
            "{f} moved aside: {aside:?}"
        );
    }
}

fn join_error(node: &Node, server: &str, token: &str) -> String {
    let out = node.join(server, token);
    assert!(!out.status.success(), "join should fail");
    let e = stderr(&out);
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    // Nothing half-written.
    if node.dir.exists() {
        for entry in std::fs::read_dir(&node.dir).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().to_string();
            assert_eq!(name, "bcd.lock", "a failed join left {name} behind");
        }
    }
    e
}

#[test]
fn bad_tokens_get_one_line_errors_and_leave_nothing_behind() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let other = Server::start(&d.path().join("other"), FAST).unwrap();
    let node = Node::new(&d.path().join("n"), 8);

    let e = join_error(&node, &server.url(), "not-a-token");
    assert!(e.contains("malformed"), "{e}");

    let good = server.token(1);
    let parts: Vec<&str> = good.split('.').collect();
    let unknown = format!(
        "bct2.{}.{}.{}.{}",
        "0".repeat(16),
        parts[2],
        parts[3],
        parts[4]
    );
    let e = join_error(&node, &server.url(), &unknown);
    assert!(e.contains("not known to this server"), "{e}");

    let out = server.cli(&["tokens", "create", "--ttl", "1ms"]);
    // It expired a millisecond after creation, before any join can start.
    let expired = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let e = join_error(&node, &server.url(), &expired);
    assert!(e.contains("expired"), "{e}");

    // A token of this server, used against another one: the pin catches it.
    let e = join_error(&node, &other.url(), &good);
    assert!(e.contains("does not match the token's pin"), "{e}");

    let e = join_error(&node, "https://127.0.0.1:1", &good);
    assert!(e.contains("cannot reach the server"), "{e}");

    let used = server.token(1);
    let first = Node::new(&d.path().join("first"), 9);
    assert!(first.join(&server.url(), &used).status.success());
    let e = join_error(&node, &server.url(), &used);
    assert!(e.contains("already used"), "{e}");

    // The good token still works after all of that.
    let out = node.join(&server.url(), &good);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn corrupt_or_mismatched_identity_says_how_to_recover() {
    let (d, server, node) = setup(10);
    let path = node.dir.join("identity.json");
    let good = std::fs::read(&path).unwrap();
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let out = node.bcd(&["node"]).output().unwrap();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("corrupt") && e.contains("bcd join --reset --yes"),
        "{e}"
    );
    std::fs::write(&path, &good).unwrap();

    // Another node's key under this certificate.
    let other = Node::new(&d.path().join("other"), 11);
    assert!(other.join(&server.url(), &server.token(1)).status.success());
    std::fs::copy(other.dir.join("node.key"), node.dir.join("node.key")).unwrap();
    let out = node.bcd(&["node"]).output().unwrap();
    let e = stderr(&out);
    assert!(e.contains("does not match the node certificate"), "{e}");

    let empty = Node::new(&d.path().join("empty"), 12);
    std::fs::create_dir_all(&empty.dir).unwrap();
    let out = empty.bcd(&["node"]).output().unwrap();
    assert!(stderr(&out).contains("join first"), "{}", stderr(&out));
}

#[test]
fn the_operator_api_needs_the_credential() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let cred = server.dir.join("operator.json");
    let mode = std::fs::metadata(&cred).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    // Another key under the credential's certificate: the API's TLS
    // refuses it.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&cred).unwrap()).unwrap();
    v["key_pem"] = serde_json::json!(
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .unwrap()
            .serialize_pem()
    );
    let forged = d.path().join("forged.json");
    std::fs::write(&forged, serde_json::to_vec(&v).unwrap()).unwrap();
    let out = server.cli(&["--operator", forged.to_str().unwrap(), "nodes", "list"]);
    assert!(!out.status.success());
    assert!(server.cli(&["nodes", "list"]).status.success());
    let missing = server.cli(&["--operator", "/nonexistent/op.json", "nodes", "list"]);
    assert!(stderr(&missing).contains("cannot read the operator credential"));
}

#[test]
fn sim_runs_many_fakehw_agents_in_one_process() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let token = server.token(25);
    let sim = std::process::Command::new(bc_tests::bin("bcd"))
        .args([
            "sim",
            "--nodes",
            "25",
            "--server",
            &server.url(),
            "--token",
            &token,
        ])
        .arg("--data-dir")
        .arg(d.path().join("sim"))
        .args(["--duration", "60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let nodes = wait_for(
        Duration::from_secs(60),
        "25 simulated nodes connected",
        || {
            let n = server.nodes();
            (n.iter().filter(|n| n.state == "connected").count() == 25).then_some(n)
        },
    );
    let mut hosts: Vec<_> = nodes.iter().map(|n| n.hostname.clone()).collect();
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 25, "each simulated node is its own machine");
    // Connected and idle, a simulated node closes its journal (SQLite
    // removes the WAL and its index at the last close): the connection's
    // memory goes while the session stays up.
    let open_journals = || {
        (0..25)
            .filter(|i| {
                d.path()
                    .join(format!("sim/node-{i:05}/journal.db-shm"))
                    .exists()
            })
            .count()
    };
    wait_for(
        Duration::from_secs(30),
        "every idle simulated node's journal closed",
        || (open_journals() == 0).then_some(()),
    );
    assert_eq!(
        server
            .nodes()
            .iter()
            .filter(|n| n.state == "connected")
            .count(),
        25,
        "sessions stay up while the journals are closed"
    );
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(sim.id() as i32).unwrap(),
        Signal::INT,
    );
    let out = sim.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("25 nodes") && stdout.contains("0 nodes failed"),
        "{stdout}"
    );
    for i in 0..25 {
        assert!(
            d.path()
                .join(format!("sim/node-{i:05}/identity.json"))
                .exists()
        );
    }
}

/// Two gateways on one store. A node's session moves from gateway A to
/// gateway B while A still holds the old stream: A's writes under the old
/// epoch (liveness, disconnect) must change nothing.
#[test]
fn a_stale_gateway_cannot_write_for_a_node_that_moved() {
    let d = tempfile::tempdir().unwrap();
    let a = Server::start(&d.path().join("server"), FAST).unwrap();
    let b = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 13);
    assert!(node.join(&a.url(), &a.token(1)).status.success());
    let id = node.id();
    node.start();
    let on_a = a.wait_node(&id, "connected via A", |n| n.state == "connected");
    // Freeze the node: its stream on A stays open, A keeps its session.
    node.proc().signal(Signal::STOP);
    // The same identity dials B (a clone of the node's data directory whose
    // server is B).
    let clone = Node::new(&d.path().join("clone"), 13);
    std::fs::create_dir_all(&clone.dir).unwrap();
    for f in ["node.key", "node.crt", "ca.crt", "journal.db"] {
        std::fs::copy(node.dir.join(f), clone.dir.join(f)).unwrap();
    }
    let mut identity = node.identity();
    identity["server"] = serde_json::json!(b.url());
    std::fs::write(clone.dir.join("identity.json"), identity.to_string()).unwrap();
    let mut clone = clone;
    clone.start();
    let on_b = b.wait_node(&id, "connected via B", |n| n.epoch == on_a.epoch + 1);
    assert_ne!(on_b.gateway, on_a.gateway);
    // A notices that its session is stale and drops it without a write.
    wait_for(
        Duration::from_secs(30),
        "gateway A to drop the stale session",
        || {
            let log = a.proc.log();
            (log.contains("session superseded; closing it")
                || log.contains("a newer session owns the node"))
            .then_some(())
        },
    );
    // Past three heartbeat intervals of A, the node is still B's.
    std::thread::sleep(Duration::from_millis(1_500));
    let now = b.node(&id).unwrap();
    assert_eq!(
        (now.state.as_str(), now.epoch, now.gateway.as_str()),
        ("connected", on_b.epoch, on_b.gateway.as_str())
    );
    node.proc().signal(Signal::CONT);
    node.proc().kill();
}

/// Certificates renew at 60% of their life over the current session's
/// credentials; the node keeps working past its first certificate's expiry.
#[test]
fn the_node_renews_its_certificate_before_it_expires() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--node-cert-ttl", "8s"]);
    let mut server = Server::start(&d.path().join("server"), &args).unwrap();
    let mut node = Node::new(&d.path().join("n"), 14);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    let first = node.identity();
    let first_cert = std::fs::read(node.dir.join("node.crt")).unwrap();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let renewed = wait_for(Duration::from_secs(30), "a renewed certificate", || {
        let now = node.identity();
        (now["cert_serial"] != first["cert_serial"]).then_some(now)
    });
    assert!(renewed["cert_not_after_ms"].as_i64() > first["cert_not_after_ms"].as_i64());
    assert_ne!(
        std::fs::read(node.dir.join("node.crt")).unwrap(),
        first_cert
    );
    // The daemon logs the renewal once the new pair is installed, just
    // after identity.json names it.
    wait_for(Duration::from_secs(10), "the renewal in bcd's log", || {
        node.proc()
            .log()
            .contains("certificate renewed")
            .then_some(())
    });
    // When the first certificate runs out, the gateway closes that session
    // and the node comes back with the renewed one.
    let v = server.wait_node(&id, "a session under a renewed certificate", |n| {
        n.state == "connected" && n.epoch >= 2
    });
    assert!(v.cert_not_after_ms > first["cert_not_after_ms"].as_i64().unwrap());
    assert!(
        server
            .proc
            .log()
            .contains("certificate expired; closing the session")
    );
    server.restart().unwrap();
    let v = server.wait_node(&id, "reconnected with the renewed certificate", |n| {
        n.state == "connected" && n.epoch >= 2
    });
    assert!(v.cert_not_after_ms >= renewed["cert_not_after_ms"].as_i64().unwrap());
}
