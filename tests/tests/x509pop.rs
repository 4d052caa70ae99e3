//! x509pop: a node whose certificate ran out while it was offline renews
//! by proving the old certificate's key, where the control plane allows it
//! (`serve --x509pop`), and stays the same node; without it, or once the
//! node is deleted, the renewal is refused with what to do.
#![allow(clippy::disallowed_methods)]

use bc_store::NodeId;
use std::time::Duration;

use bc_tests::{FAST, Node, Server, stderr, wait_for};

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A server with 3 s node certificates and `extra` flags, and a node that
/// joined and then stayed away until its certificate ran out.
fn expired_node(d: &std::path::Path, extra: &[&str]) -> (Server, Node, String) {
    let mut args = FAST.to_vec();
    args.extend(["--node-cert-ttl", "3s"]);
    args.extend_from_slice(extra);
    let server = Server::start(&d.join("server"), &args).unwrap();
    let node = Node::new(&d.join("n"), 31);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    // Offline past the certificate's end.
    let not_after = node.identity()["cert_not_after_ms"].as_i64().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the certificate to run out",
        || (unix_ms() > not_after + 500).then_some(()),
    );
    (server, node, id)
}

#[test]
fn a_node_back_after_its_certificate_ran_out_renews_by_its_old_key() {
    let d = tempfile::tempdir().unwrap();
    let (server, mut node, id) = expired_node(d.path(), &["--x509pop"]);
    let before = node.identity();
    node.start();
    server.wait_node(&id, "connected again", |n| n.state == "connected");
    let after = node.identity();
    assert_eq!(after["node_id"], before["node_id"], "the same node");
    assert_ne!(
        after["cert_serial"], before["cert_serial"],
        "a new certificate"
    );
    assert_eq!(
        after["identity_generation"], before["identity_generation"],
        "a renewal, not a re-enrolment"
    );
    assert!(
        node.proc().log().contains("renewing it by proving its key"),
        "{}",
        node.proc().log()
    );
    // A deleted node's old key renews nothing, within the window or not.
    node.proc().kill();
    let at_delete = node.identity();
    let out = server.cli(&["nodes", "delete", &id, "--yes"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let not_after = node.identity()["cert_not_after_ms"].as_i64().unwrap();
    wait_for(
        Duration::from_secs(10),
        "the certificate to run out",
        || (unix_ms() > not_after + 500).then_some(()),
    );
    node.proc = None;
    node.start();
    wait_for(Duration::from_secs(30), "the refusal", || {
        node.proc()
            .log()
            .contains(&format!("node {id} was deleted"))
            .then_some(())
    });
    assert_eq!(
        node.identity()["cert_serial"],
        at_delete["cert_serial"],
        "no certificate"
    );
    // It proved its key: the refusal is published, naming the node.
    let access = server.store();
    let events = access
        .block(access.store.fleet_events(&NodeId::from(&id), 50))
        .unwrap()
        .join("\n");
    assert!(
        events.contains("security.renew.refused: renew:node-deleted"),
        "{events}"
    );
}

#[test]
fn without_x509pop_an_expired_certificate_is_refused_with_what_to_do() {
    let d = tempfile::tempdir().unwrap();
    let (server, mut node, id) = expired_node(d.path(), &[]);
    let before = node.identity();
    node.start();
    let log = wait_for(Duration::from_secs(30), "the refusal", || {
        let log = node.proc().log();
        log.contains("start it with --x509pop").then_some(log)
    });
    assert!(
        log.contains("join again: bcd join --reset --yes, then bcd join"),
        "{log}"
    );
    assert_eq!(node.identity()["cert_serial"], before["cert_serial"]);
    assert_ne!(server.node(&id).unwrap().state, "connected");
}
