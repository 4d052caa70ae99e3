//! The access converger end to end: sshd files and the node's nftables
//! table (in a network namespace of the test's own) from the signed spec.

use std::time::Duration;

use bc_tests::{Netns, Node, Server, stderr, wait_for};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

fn spec_json(server: &Server, node: &str) -> serde_json::Value {
    let out = server.cli(&["nodes", "spec", node, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn section<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["sections"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["section"] == name))
        .unwrap_or(&serde_json::Value::Null)
}

#[test]
fn access_reaches_sshd_files_and_the_firewall_table() {
    let d = tempfile::tempdir().unwrap();
    let server =
        Server::start(&d.path().join("server"), &["--heartbeat-interval", "300ms"]).unwrap();
    let ns = Netns::new();
    let mut node = Node::new(&d.path().join("n"), 51);
    node.nft = Some(ns.nft.clone());
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");

    let file = d.path().join("access.json");
    let access = serde_json::json!({
        "users": [{"name": "alice", "authorized_keys": [KEY], "principals": ["alice", "ops"]}],
        "firewall": {"rules": [
            {"protocol": "tcp", "port": 22, "source": "10.0.0.0/8", "action": "accept"},
            {"protocol": "tcp", "port": 22, "action": "drop"}
        ]}
    });
    std::fs::write(&file, access.to_string()).unwrap();
    let out = server.cli(&["nodes", "access", &id, "--file", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let keys = node.dir.join("etc/ssh/bcd/authorized_keys/alice");
    wait_for(Duration::from_secs(20), "alice's authorized_keys", || {
        keys.exists().then_some(())
    });
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), format!("{KEY}\n"));
    let table = wait_for(Duration::from_secs(20), "the inet bcd table", || {
        ns.nft(&["list", "table", "inet", "bcd"])
    });
    assert!(
        table.contains("ip saddr 10.0.0.0/8 tcp dport 22 accept"),
        "{table}"
    );
    let v = wait_for(Duration::from_secs(20), "access READY and applied", || {
        let v = spec_json(&server, &id);
        (section(&v, "access")["status"] == "READY"
            && v["applied_generation"] == v["desired_generation"])
            .then_some(v)
    });
    assert_eq!(section(&v, "devices")["status"], "READY");

    // A key sshd could not use: FAILED with the reason; nothing changes.
    let bad =
        serde_json::json!({"users": [{"name": "alice", "authorized_keys": ["ssh-ed25519 AAAA"]}]});
    std::fs::write(&file, bad.to_string()).unwrap();
    assert!(
        server
            .cli(&["nodes", "access", &id, "--file", file.to_str().unwrap()])
            .status
            .success()
    );
    let v = wait_for(Duration::from_secs(20), "access FAILED", || {
        let v = spec_json(&server, &id);
        (section(&v, "access")["status"] == "FAILED").then_some(v)
    });
    assert!(
        section(&v, "access")["message"]
            .as_str()
            .unwrap()
            .contains("alice"),
        "{v}"
    );
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), format!("{KEY}\n"));
    assert!(
        ns.nft(&["list", "table", "inet", "bcd"]).is_some(),
        "the table stays"
    );

    // Cleared: our files and our table go.
    assert!(
        server
            .cli(&["nodes", "access", &id, "--clear"])
            .status
            .success()
    );
    wait_for(Duration::from_secs(20), "files and table removed", || {
        (!keys.exists() && ns.nft(&["list", "table", "inet", "bcd"]).is_none()).then_some(())
    });
}
