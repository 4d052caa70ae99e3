//! The access converger end to end: sshd files and the node's nftables
//! table (in a network namespace of the test's own) from the signed spec.

use bc_tests::{Netns, Node, Server, section, stderr, wait_for};
use bcd_agent::converge::Nft;
use bcd_agent::converge::Status;
use bcd_agent::converge::access::firewall;
use bcd_proto::v1::{AccessSpec, FirewallRule, FirewallSpec};
use std::time::Duration;

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

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
        let v = server.spec(&id);
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
        let v = server.spec(&id);
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

/// A rule as the operator spells it (an unknown spelling is UNSPECIFIED,
/// which the node refuses).
fn rule(protocol: &str, port: u32, source: &str, action: &str) -> FirewallRule {
    use bcd_proto::typed::parse;
    use bcd_proto::v1::{FirewallAction, FirewallProtocol};
    FirewallRule {
        protocol: parse::<FirewallProtocol>(protocol).unwrap_or(FirewallProtocol::Unspecified)
            as i32,
        port,
        source: source.into(),
        action: parse::<FirewallAction>(action).unwrap_or(FirewallAction::Unspecified) as i32,
    }
}

/// The firewall half of the access converger against the real `nft`, in a
/// network namespace of the test's own.
#[test]
fn our_table_is_applied_kept_changed_and_removed_and_others_untouched() {
    assert!(
        std::path::Path::new("/usr/sbin/nft").exists(),
        "nft is missing: apt-get install nftables"
    );
    let ns = Netns::new();
    let ns_nft = |args: &[&str]| {
        ns.nft(args)
            .unwrap_or_else(|| panic!("nft {args:?} failed"))
    };
    ns_nft(&["add", "table", "ip", "theirs"]);
    ns_nft(&[
        "add",
        "chain",
        "ip",
        "theirs",
        "c",
        "{ type filter hook input priority 10 ; }",
    ]);
    ns_nft(&[
        "add", "rule", "ip", "theirs", "c", "tcp", "dport", "8080", "accept",
    ]);
    let theirs = ns_nft(&["list", "table", "ip", "theirs"]);
    let p = Nft {
        nft: ns.nft.clone(),
    };
    let mut spec = AccessSpec {
        firewall: Some(FirewallSpec {
            rules: vec![
                rule("tcp", 22, "10.0.0.0/8", "accept"),
                rule("tcp", 22, "", "drop"),
                rule("udp", 4789, "fd00::/8", "accept"),
            ],
        }),
        ..Default::default()
    };
    assert_eq!(firewall(&p, &spec), Ok(true));
    let listed = ns_nft(&["list", "table", "inet", "bcd"]);
    assert!(
        listed.contains("ip saddr 10.0.0.0/8 tcp dport 22 accept"),
        "{listed}"
    );
    assert!(listed.contains("tcp dport 22 drop"), "{listed}");
    assert!(
        listed.contains("ip6 saddr fd00::/8 udp dport 4789 accept"),
        "{listed}"
    );
    assert_eq!(
        firewall(&p, &spec),
        Ok(false),
        "re-applying changes nothing"
    );
    // Drift: someone deletes a rule; the next pass restores the table.
    ns_nft(&["flush", "chain", "inet", "bcd", "input"]);
    assert_eq!(firewall(&p, &spec), Ok(true));
    assert!(ns_nft(&["list", "table", "inet", "bcd"]).contains("tcp dport 22 drop"));
    // A change replaces the table's rules atomically.
    spec.firewall.as_mut().unwrap().rules = vec![rule("tcp", 9100, "192.168.1.7", "accept")];
    assert_eq!(firewall(&p, &spec), Ok(true));
    let listed = ns_nft(&["list", "table", "inet", "bcd"]);
    assert!(
        listed.contains("ip saddr 192.168.1.7 tcp dport 9100 accept"),
        "{listed}"
    );
    assert!(!listed.contains("dport 22"), "{listed}");
    // A rule nft would refuse is refused before nft sees it.
    let mut bad = spec.clone();
    bad.firewall
        .as_mut()
        .unwrap()
        .rules
        .push(rule("sctp", 1, "", "accept"));
    assert!(matches!(firewall(&p, &bad), Err((Status::Failed, _))));
    bad.firewall.as_mut().unwrap().rules = vec![rule("tcp", 22, "10.0.0.0/33", "accept")];
    assert!(matches!(firewall(&p, &bad), Err((Status::Failed, _))));
    assert!(
        ns_nft(&["list", "table", "inet", "bcd"]).contains("dport 9100"),
        "the last good table stays"
    );
    // Dropped from the spec: the table goes, cleanly.
    spec.firewall = None;
    assert_eq!(firewall(&p, &spec), Ok(true));
    assert!(!ns_nft(&["list", "tables"]).contains("inet bcd"));
    assert_eq!(firewall(&p, &spec), Ok(false));
    assert_eq!(
        ns_nft(&["list", "table", "ip", "theirs"]),
        theirs,
        "another table untouched"
    );
}
