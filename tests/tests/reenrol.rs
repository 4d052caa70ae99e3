//! Re-enrolment, end to end: a machine that joins again after `bcd join
//! --reset --yes` proves its old node key and stays the same node; its old
//! certificate is revoked and refused.

use std::time::Duration;

use bc_tests::{Node, setup, setup_connected, stderr};

/// Copies the files of a node's data directory (not its subdirectories):
/// a second machine holding the same identity.
fn copy_identity(from: &Node, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(&from.dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn joining_again_after_reset_re_enrols_the_same_node_and_revokes_the_old_certificate() {
    let (d, server, mut node, id) = setup_connected(41);
    let first = node.identity();
    assert_eq!(first["identity_generation"], 1);
    // A copy of the machine as it was keeps running on the old identity.
    assert!(node.proc().stop().success());
    let old_dir = d.path().join("old-copy");
    copy_identity(&node, &old_dir);
    let mut old = Node::new(&old_dir, 41);
    old.start();
    server.wait_node(&id, "the old copy connected", |n| {
        n.state == "connected" && n.epoch == 2
    });

    let out = node.bcd(&["join", "--reset", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        said.contains(&format!("re-enrolled as node {id}")),
        "{said}"
    );
    let again = node.identity();
    assert_eq!(node.id(), id, "the same node id");
    assert_eq!(again["identity_generation"], 2);
    assert_ne!(again["cert_serial"], first["cert_serial"]);

    // The revocation feed cuts the old copy's session off, with the
    // worker-signed statement: it stops for good.
    let status = old
        .proc()
        .wait(Duration::from_secs(30))
        .expect("the old copy exits once its certificate is revoked");
    assert_eq!(status.code(), Some(3), "{}", old.proc().log());
    let log = old.proc().log();
    assert!(
        log.contains("revoked (re-enrolled)") && log.contains("bcd join --new-node"),
        "{log}"
    );
    // The machine connects with its new certificate.
    node.start();
    server.wait_node(&id, "connected with the new certificate", |n| {
        n.state == "connected" && n.epoch > 2
    });
    // Started again, the old certificate is refused at its Hello.
    old.start();
    let status = old
        .proc()
        .wait(Duration::from_secs(30))
        .expect("the old copy is refused");
    assert_eq!(status.code(), Some(3));
    assert!(old.proc().log().contains("revoked (re-enrolled)"));
    let nodes = server.nodes();
    assert_eq!(
        nodes.iter().map(|n| n.node_id.as_str()).collect::<Vec<_>>(),
        vec![id.as_str()],
        "one node"
    );
    assert!(
        server
            .proc
            .log()
            .contains("node re-enrolled; its earlier certificates are revoked")
    );
}

#[test]
fn a_deleted_node_is_not_re_enrolled_and_the_machine_joins_as_a_new_node() {
    let (_d, server, node) = setup(42);
    let id = node.id();
    assert!(
        server
            .cli(&["nodes", "delete", &id, "--yes"])
            .status
            .success()
    );
    let out = node.bcd(&["join", "--reset", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let token = server.token(1);
    let out = node.join(&server.url(), &token);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains(&format!("cannot re-enrol node {id}: it was deleted"))
            && e.contains("bcd join --new-node"),
        "{e}"
    );
    assert!(!e.to_lowercase().contains("sql"), "{e}");
    // The refusal spent nothing: the same one-use token joins a new node.
    let out = node
        .bcd(&[
            "join",
            "--new-node",
            "--server",
            &server.url(),
            "--token",
            &token,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(node.id(), id);
    assert_eq!(node.identity()["identity_generation"], 1);
}

/// A command is running when the machine's identity is reset and it joins
/// again as the same node: its journal went aside with the identity, so
/// the first Hello of the new identity ends the command `journal-lost`,
/// and the proof that Hello carries shows the lost journal (the new
/// identity took the earlier one's last session over), so the ending is
/// believed, not read as forged.
#[test]
fn a_command_a_re_enrolment_ends_journal_lost_is_proved_by_its_hello() {
    let (d, server, mut node, id) = setup_connected(43);
    let cmd = server.run_long_command(&id, &d.path().join("started"));
    node.proc().kill();
    let out = node.bcd(&["join", "--reset", "--yes"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(node.id(), id);
    node.start();
    let c = server.wait_command(&cmd);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("failed", "journal-lost"),
        "{c:?}"
    );
    assert_eq!(c.evidence, "decided", "{c:?}");
}
