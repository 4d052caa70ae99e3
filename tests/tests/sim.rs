//! The fleet simulator end to end: real gateways on one store behind the
//! balancer, fakehw agents, a workload and seeded faults, with every
//! invariant checked at the end; and `better-compute check` on a store,
//! catching a violation planted in it.

use std::process::Command;

use bc_tests::{FAST, Node, Server, bin, stderr};

fn sim(nodes: usize, chaos: &str, seed: u64, duration: &str) -> serde_json::Value {
    sim_on("sqlite", nodes, chaos, seed, duration)
}

fn sim_on(store: &str, nodes: usize, chaos: &str, seed: u64, duration: &str) -> serde_json::Value {
    sim_with(&["--store", store], nodes, chaos, seed, duration)
}

fn sim_with(
    extra: &[&str],
    nodes: usize,
    chaos: &str,
    seed: u64,
    duration: &str,
) -> serde_json::Value {
    let out = Command::new(bin("bc-sim"))
        .args(["--gateways", "3", "--json"])
        .args(extra)
        .args(["--nodes", &nodes.to_string(), "--chaos", chaos])
        .args(["--seed", &seed.to_string(), "--duration", duration])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", stderr(&out)));
    assert!(
        out.status.success(),
        "{}\n{}",
        serde_json::to_string_pretty(&report["invariants"]).unwrap(),
        stderr(&out)
    );
    report
}

fn assert_clean(r: &serde_json::Value, nodes: usize) {
    assert_eq!(r["ok"], true);
    // The fleet powered on as a rack does: each machine joined with a
    // one-use token minted for it, and every one of them was spent.
    if r["join_tokens"] == "one-use" {
        assert_eq!(r["tokens_unspent"], 0, "{r}");
    } else {
        assert_eq!(r["join_tokens"], "shared", "{r}");
        assert!(r["tokens_unspent"].is_null(), "{r}");
    }
    assert!(r["power_on_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["settled"], true, "{r}");
    assert_eq!(r["connected_at_end"], nodes, "{r}");
    assert_eq!(r["connected_in_store"], nodes, "the store agrees: {r}");
    let inv = r["invariants"].as_array().unwrap();
    let names: Vec<&str> = inv.iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "I1", "I2", "I3", "I4", "I5", "I7", "I8", "AC", "OL", "SC", "RS", "BK"
        ]
    );
    // Every result was judged against the fleet CA, not skipped for want
    // of one.
    let rs = inv.iter().find(|i| i["name"] == "RS").unwrap();
    assert_eq!(rs["what"], "results", "{rs}");
    for i in inv {
        assert!(i["violations"].as_array().unwrap().is_empty(), "{i}");
    }
    // Every command the workload issued ended, and none failed.
    let commands = r["commands"].as_object().unwrap();
    assert_eq!(
        commands.values().map(|v| v.as_u64().unwrap()).sum::<u64>(),
        r["commands_issued"].as_u64().unwrap()
    );
}

#[test]
fn light_chaos_two_seeds() {
    // The second with the simulated machines' state in memory, as
    // diskless nodes keep it, and one token for every machine.
    for (seed, state, tokens) in [(1, "disk", "one-use"), (2, "memory", "shared")] {
        let r = sim_with(
            &["--node-state", state, "--join-tokens", tokens],
            150,
            "light",
            seed,
            "15s",
        );
        assert_clean(&r, 150);
        assert_eq!(r["node_state"], state, "{r}");
        assert_eq!(r["join_tokens"], tokens, "{r}");
        assert_eq!(r["faults"]["gateway kill"], 1, "{r}");
        let rehome = &r["rehome"][0];
        assert_eq!(rehome["rehomed"], rehome["nodes"], "{r}");
    }
}

/// The same fleet and faults with the gateways on PostgreSQL, one of them
/// with its host clock stepped off: it raises ClockSkew, and the server
/// clock invariant holds on rows it checked.
#[test]
fn light_chaos_on_postgres() {
    let r = sim_on("postgres", 150, "light", 5, "15s");
    assert_clean(&r, 150);
    assert_eq!(r["store"], "postgres");
    assert_eq!(r["faults"]["gateway kill"], 1, "{r}");
    let clock = &r["clock_faults"][0];
    assert_eq!(clock["raised"], true, "{r}");
    let i4 = &r["invariants"][3];
    assert!(i4["checked"].as_u64().unwrap() > 0, "{i4}");
}

/// Heavy chaos on the run's own PostgreSQL cluster: its store outage is
/// the server stopped and started again, its stall the server's processes
/// frozen, and the fleet still settles with every invariant held.
#[test]
fn heavy_chaos_on_postgres_with_a_real_outage_and_a_hung_database() {
    let r = sim_on("postgres", 100, "heavy", 3, "25s");
    assert_clean(&r, 100);
    for kind in ["store outage", "store stall", "gateway kill", "partition"] {
        assert!(r["faults"][kind].as_u64().unwrap() >= 1, "{kind}: {r}");
    }
}

#[test]
fn heavy_chaos_two_seeds() {
    for seed in [3, 4] {
        let r = sim(200, "heavy", seed, "25s");
        assert_clean(&r, 200);
        for kind in ["store outage", "partition", "journal loss", "daemon crash"] {
            assert!(r["faults"][kind].as_u64().unwrap() >= 1, "{kind}: {r}");
        }
    }
}

/// `check` on a live store holds, and names the invariant when a second
/// terminal result for one command is planted in the history.
#[test]
fn check_catches_a_planted_violation() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 5);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    node.start();
    let id = node.id();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let cmd = server.run_command(&id, "exec.run", &["/bin/true"]);
    assert_eq!(server.wait_command(&cmd).state, "succeeded");
    let check = || {
        Command::new(bin("better-compute"))
            .arg("--data-dir")
            .arg(&server.dir)
            .args([
                "check",
                "--node-lease-ttl",
                "1s",
                "--gateway-loss-grace",
                "2s",
            ])
            .output()
            .unwrap()
    };
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("I2 exactly once       held"));

    // No store method can write a second terminal result for one command
    // (the first result wins inside the store), so the violation the
    // checker must catch is planted in the history directly.
    // The record is sealed into the chain as the store would seal it (the
    // chain holds): only I2 sees the second result.
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    bc_store::sqlite::audit_functions(&db).unwrap();
    db.execute(
        "INSERT INTO audit (at, node_id, kind, detail)
         VALUES (0, ?1, 'result', json_object('command', ?2))",
        [&id, &cmd],
    )
    .unwrap();
    let out = check();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("I2 exactly once       VIOLATED"), "{text}");
    assert!(
        text.contains(&format!("command {cmd}: 2 terminal results")),
        "{text}"
    );
    assert!(text.contains("AC audit_chain_intact held"), "{text}");

    // Edited in the store: the chain catches it, and names the record.
    let (chain, seq): (i64, i64) = db
        .query_row(
            "SELECT chain, seq FROM audit WHERE kind = 'route' ORDER BY id LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let at = "WHERE chain = ?1 AND seq = ?2";
    db.execute(
        &format!("UPDATE audit SET epoch = epoch + 7 {at}"),
        [chain, seq],
    )
    .unwrap();
    let out = check();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("AC audit_chain_intact VIOLATED"), "{text}");
    assert!(
        text.contains(&format!(
            "audit record {seq} of chain {chain} (route of node '{id}') was edited"
        )),
        "{text}"
    );
    db.execute(
        &format!("UPDATE audit SET epoch = epoch - 7 {at}"),
        [chain, seq],
    )
    .unwrap();
    assert!(String::from_utf8_lossy(&check().stdout).contains("AC audit_chain_intact held"));
    // Removed: the gap is named (the node's result follows its route in
    // its chain).
    db.execute(&format!("DELETE FROM audit {at}"), [chain, seq + 1])
        .unwrap();
    let text = String::from_utf8_lossy(&check().stdout).to_string();
    assert!(
        text.contains(&format!(
            "audit record {} of chain {chain} is missing: it was removed",
            seq + 1
        )),
        "{text}"
    );
}

/// A gateway that stops tells its nodes to reconnect at random within the
/// drain window instead of all at once.
#[test]
fn a_stopping_gateway_drains_its_nodes() {
    let d = tempfile::tempdir().unwrap();
    // FAST drains within 1 s.
    let mut server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 6);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    node.start();
    let id = node.id();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    server.restart().unwrap();
    server.wait_node(&id, "connected again", |n| {
        n.state == "connected" && n.epoch >= 2
    });
    let server_log = std::fs::read_dir(&server.dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("serve-"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    assert!(server_log.contains("draining"), "{server_log}");
    assert!(
        node.proc().log().contains("the gateway is draining"),
        "{}",
        node.proc().log()
    );
}
