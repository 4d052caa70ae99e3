//! Join tokens as an operator manages them: listed without their secrets,
//! revoked by id or as the whole token found lying around, after which no
//! node joins with it while the nodes that joined before keep working; a
//! rack minted a one-use token per machine, each machine joining with its
//! own.

use bc_tests::{Node, Server, stderr};

fn ok(server: &Server, args: &[&str]) -> String {
    let o = server.cli(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn listed(server: &Server, args: &[&str]) -> Vec<serde_json::Value> {
    serde_json::from_str(&ok(server, args)).unwrap()
}

#[test]
fn a_revoked_pool_token_joins_no_more_nodes_and_the_joined_ones_stay() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), &[]).unwrap();
    let token = ok(
        &server,
        &[
            "tokens",
            "create",
            "--uses",
            "3",
            "--pool",
            "rack-a",
            "--description",
            "rack A",
        ],
    );
    let token = token.trim();
    let id = token.split('.').nth(1).unwrap();
    let secret = token.split('.').nth(2).unwrap();

    let first = Node::new(&d.path().join("n1"), 1);
    let joined = first.join(&server.url(), token);
    assert!(joined.status.success(), "{}", stderr(&joined));

    let live = listed(&server, &["tokens", "list", "--json"]);
    let mine: Vec<_> = live.iter().filter(|t| t["token_id"] == id).collect();
    assert_eq!(mine.len(), 1, "{live:?}");
    assert_eq!(mine[0]["uses_left"], 2);
    assert_eq!(mine[0]["uses_total"], 3);
    assert_eq!(mine[0]["pool"], "rack-a");
    assert_eq!(mine[0]["description"], "rack A");
    let table = ok(&server, &["tokens", "list"]);
    assert!(table.contains(id) && table.contains("2/3"), "{table}");
    assert!(
        !table.contains(secret) && !serde_json::to_string(&live).unwrap().contains(secret),
        "a listing never shows a token's secret"
    );

    // Revoked as found: the whole token.
    let revoked = ok(&server, &["tokens", "revoke", token]);
    assert!(
        revoked.contains(&format!("token {id} revoked")),
        "{revoked}"
    );
    let second = Node::new(&d.path().join("n2"), 2);
    let refused = second.join(&server.url(), token);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("the join token expired"),
        "{}",
        stderr(&refused)
    );
    assert!(
        listed(&server, &["tokens", "list", "--json"])
            .iter()
            .all(|t| t["token_id"] != id),
        "a revoked token is not live"
    );
    let all = listed(&server, &["tokens", "list", "--all", "--json"]);
    assert!(
        all.iter()
            .any(|t| t["token_id"] == id && t["uses_left"] == 2)
    );

    // The node that joined before keeps its identity and connects.
    let mut first = first;
    let node_id = first.id();
    first.start();
    server.wait_node(&node_id, "connected", |n| n.state == "connected");

    let unknown = server.cli(&["tokens", "revoke", "0000000000000000"]);
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("no join token \"0000000000000000\""),
        "{}",
        stderr(&unknown)
    );
}

/// `tokens create --count N` prints N one-use tokens, one per line, and
/// `bcd sim --tokens-file` joins node k with line k: every token is spent
/// once, by its own machine (no two joins share a token's row). Too few
/// tokens for the nodes, or a count of none, is refused before anything
/// happens.
#[test]
fn a_rack_minted_a_token_per_machine_joins_each_with_its_own() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), &[]).unwrap();
    let printed = ok(
        &server,
        &["tokens", "create", "--count", "5", "--pool", "rack-b"],
    );
    let tokens: Vec<&str> = printed.lines().collect();
    assert_eq!(tokens.len(), 5, "{printed}");
    let ids: std::collections::BTreeSet<&str> = tokens
        .iter()
        .map(|t| t.split('.').nth(1).unwrap())
        .collect();
    assert_eq!(ids.len(), 5, "five distinct tokens: {printed}");
    let live = listed(&server, &["tokens", "list", "--json"]);
    for id in &ids {
        let t = live.iter().find(|t| t["token_id"] == *id).unwrap();
        assert_eq!((&t["uses_left"], &t["pool"]), (&1.into(), &"rack-b".into()));
    }
    let none = server.cli(&["tokens", "create", "--count", "0"]);
    assert_eq!(none.status.code(), Some(2), "{}", stderr(&none));
    assert!(stderr(&none).contains("--count"), "{}", stderr(&none));

    let file = d.path().join("rack-b.tokens");
    std::fs::write(&file, &printed).unwrap();
    let sim = |nodes: &str| {
        let mut c = std::process::Command::new(bc_tests::bin("bcd"));
        c.args(["sim", "--nodes", nodes, "--server", &server.url()])
            .arg("--tokens-file")
            .arg(&file)
            .arg("--data-dir")
            .arg(d.path().join(format!("sim-{nodes}")))
            .args(["--duration", "30s"]);
        c
    };
    let short = sim("6").output().unwrap();
    assert!(!short.status.success());
    assert!(
        stderr(&short).contains("5 join tokens for 6 simulated nodes"),
        "{}",
        stderr(&short)
    );
    let mut running = sim("5")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    bc_tests::wait_for(
        std::time::Duration::from_secs(60),
        "five simulated machines connected",
        || {
            (server
                .nodes()
                .iter()
                .filter(|n| n.state == "connected")
                .count()
                == 5)
                .then_some(())
        },
    );
    let _ = running.kill();
    let _ = running.wait();
    let all = listed(&server, &["tokens", "list", "--all", "--json"]);
    for id in &ids {
        let t = all.iter().find(|t| t["token_id"] == *id).unwrap();
        assert_eq!(t["uses_left"], 0, "token {id} was spent once: {t}");
    }
}
