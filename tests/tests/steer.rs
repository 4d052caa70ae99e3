//! Steering the fleet: labels and cordons are the operator's intent, signed
//! into each node's spec. Label selectors pick nodes for lists, rollouts
//! and fanned-out commands; a cordon keeps new allocations and rollout
//! waves off a node; `nodes drain` waits for the allocations' owners and
//! releases nothing itself. A label or cordon written into the store's
//! columns, or a spec row swapped behind the key holder's back, steers
//! nothing.

use std::time::Duration;

use bc_tests::{FAST, Node, Server, fleet, stderr, wait_for};

fn ok(server: &Server, args: &[&str]) -> String {
    let out = server.cli(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The ids `nodes list` prints with these extra arguments, in order.
fn listed(server: &Server, args: &[&str]) -> Vec<String> {
    let all: Vec<&str> = ["nodes", "list", "--json"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let v: serde_json::Value = serde_json::from_str(&ok(server, &all)).unwrap();
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_str().unwrap().to_string())
        .collect()
}

fn connected(server: &Server, seed: u64, dir: &std::path::Path) -> (Node, String) {
    let mut node = Node::new(&dir.join(format!("node{seed}")), seed);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    (node, id)
}

#[test]
fn labels_select_cordons_keep_allocations_off_and_drain_waits_for_owners() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let (_a_node, a) = connected(&server, 91, d.path());
    let (_b_node, b) = connected(&server, 92, d.path());
    let mut both = vec![a.clone(), b.clone()];
    both.sort();

    ok(
        &server,
        &["nodes", "label", &a, "pool=a", "gpu=h200", "rack=r1"],
    );
    ok(&server, &["nodes", "label", &b, "pool=b", "rack=r1"]);
    assert_eq!(listed(&server, &["-l", "pool=a"]), vec![a.clone()]);
    assert_eq!(listed(&server, &["-l", "gpu!=h200"]), vec![b.clone()]);
    assert_eq!(listed(&server, &["-l", "!gpu"]), vec![b.clone()]);
    assert_eq!(listed(&server, &["-l", "rack=r1,gpu"]), vec![a.clone()]);
    assert_eq!(listed(&server, &["-l", "rack"]), both);
    ok(&server, &["nodes", "label", &a, "rack-"]);
    assert_eq!(listed(&server, &["-l", "rack"]), vec![b.clone()]);
    // The node receives the labelled spec like any other and applies it.
    let spec = wait_for(Duration::from_secs(20), "a's new spec applied", || {
        let v = server.spec(&a);
        (v["applied_generation"] == v["desired_generation"] && v["desired_generation"] == 2)
            .then_some(v)
    });
    assert_eq!(
        spec["intent"]["labels"],
        serde_json::json!({"gpu": "h200", "pool": "a"})
    );

    // Bad selectors and labels say what to write, and change nothing.
    let out = server.cli(&["nodes", "list", "-l", "pool=a b"]);
    assert!(
        stderr(&out).contains("use letters, digits"),
        "{}",
        stderr(&out)
    );
    let out = server.cli(&["nodes", "label", &a, "pool"]);
    assert!(stderr(&out).contains("key- (remove)"), "{}", stderr(&out));
    assert_eq!(server.spec(&a)["desired_generation"], 2);

    // Pages.
    let out = server.cli(&["nodes", "list", "--json", "--limit", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("--after {}", both[0])),
        "{}",
        stderr(&out)
    );
    assert_eq!(listed(&server, &["--limit", "1"]), vec![both[0].clone()]);
    assert_eq!(
        listed(&server, &["--limit", "1", "--after", &both[0]]),
        vec![both[1].clone()]
    );
    assert_eq!(
        listed(&server, &["--state", "connected", "-l", "pool"]),
        both
    );
    assert!(listed(&server, &["--state", "unreachable"]).is_empty());

    // A command fanned out to every labelled node: one each, a summary.
    let out = server.cli(&[
        "commands",
        "run",
        "-l",
        "pool",
        "exec.run",
        "--wait",
        "--",
        "/bin/true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("2 nodes: 2 succeeded"),
        "{}",
        stderr(&out)
    );
    for n in [&a, &b] {
        assert_eq!(server.commands(n).len(), 1, "one command on {n}");
    }
    let out = server.cli(&[
        "commands",
        "run",
        "-l",
        "pool=a",
        "exec.run",
        "--wait",
        "--",
        "/bin/false",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("1 nodes: 1 failed"),
        "{}",
        stderr(&out)
    );
    let out = server.cli(&[
        "commands",
        "run",
        "-l",
        "pool=zz",
        "exec.run",
        "--",
        "/bin/true",
    ]);
    assert!(
        stderr(&out).contains("no node's labels match"),
        "{}",
        stderr(&out)
    );

    // Cordoned: shown, no new allocation lands; one it holds may change.
    ok(&server, &["nodes", "assign", &b, "job-held", "--gpus", "0"]);
    ok(
        &server,
        &["nodes", "cordon", &b, "--reason", "fan 3 failing"],
    );
    let wide = ok(&server, &["-o", "wide", "nodes", "list"]);
    let row = wide.lines().find(|l| l.starts_with(&b)).unwrap();
    assert!(
        row.contains("connected,cordoned") && row.contains("(fan 3 failing)"),
        "{wide}"
    );
    let out = server.cli(&["nodes", "assign", &b, "job-new", "--gpus", "1"]);
    assert!(
        stderr(&out).contains(&format!("node {b} is cordoned (fan 3 failing)")),
        "{}",
        stderr(&out)
    );
    ok(
        &server,
        &[
            "nodes", "assign", &b, "job-held", "--gpus", "0", "--env", "A=1",
        ],
    );
    ok(&server, &["nodes", "assign", &a, "job-new", "--gpus", "1"]);
    let shown = ok(&server, &["nodes", "show", &b]);
    assert!(shown.contains("(fan 3 failing)"), "{shown}");
    assert!(shown.contains("labels      pool=b,rack=r1"), "{shown}");

    // Drain: cordons, waits for the owners, releases nothing itself.
    let out = server.cli(&["nodes", "drain", &b, "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("still holds job-held"),
        "{}",
        stderr(&out)
    );
    let spec = server.spec(&b);
    assert_eq!(spec["assignments"][0]["allocation_id"], "job-held");
    let mut drain = server
        .cli_command(&["nodes", "drain", &b, "--timeout", "60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ok(&server, &["nodes", "unassign", &b, "job-held"]);
    let status = wait_for(Duration::from_secs(30), "the drain to end", || {
        drain.try_wait().unwrap()
    });
    let mut said = String::new();
    std::io::Read::read_to_string(drain.stdout.as_mut().unwrap(), &mut said).unwrap();
    assert!(status.success(), "{said}");
    assert!(said.contains(&format!("drained {b}")), "{said}");

    // Uncordoned: allocations land again.
    ok(&server, &["nodes", "uncordon", &b]);
    ok(&server, &["nodes", "assign", &b, "job-new", "--gpus", "1"]);
    let wide = ok(&server, &["-o", "wide", "nodes", "list"]);
    assert!(!wide.contains("cordoned"), "{wide}");
}

/// What the store's columns say is not read: the intent is in the signed
/// spec, and a spec row swapped for another node's makes the node's intent
/// unknown (it matches no selector and shows as spec-forged) rather than
/// another node's.
#[test]
fn a_spec_row_swapped_in_the_store_steers_nothing() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let (_a_node, a) = connected(&server, 93, d.path());
    let (_b_node, b) = connected(&server, 94, d.path());
    ok(&server, &["nodes", "label", &a, "pool=a"]);
    ok(&server, &["nodes", "label", &b, "pool=b"]);
    ok(&server, &["nodes", "cordon", &b]);
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.execute(
        "UPDATE node_specs SET signed = (SELECT signed FROM node_specs WHERE node_id = ?1)
         WHERE node_id = ?2",
        [&a, &b],
    )
    .unwrap();
    assert_eq!(listed(&server, &["-l", "pool=a"]), vec![a.clone()]);
    assert!(listed(&server, &["-l", "pool=b"]).is_empty());
    let wide = ok(&server, &["-o", "wide", "nodes", "list"]);
    let row = wide.lines().find(|l| l.starts_with(&b)).unwrap();
    assert!(row.contains("spec-forged"), "{wide}");
    // Changes start from the signed bytes, so none is made on it.
    let out = server.cli(&["nodes", "uncordon", &b]);
    assert!(!out.status.success(), "{}", stderr(&out));
}

/// A rollout by label selector upgrades only the labelled nodes, and a
/// cordoned one is not given its upgrade until it is uncordoned (its
/// wave waits for it).
#[test]
fn a_rollout_by_label_holds_a_cordoned_node_until_uncordoned() {
    let f = fleet();
    let nodes = [f.node("a"), f.node("b"), f.node("c")];
    let [a, b, c] = [0, 1, 2].map(|i| nodes[i].id());
    ok(&f.server, &["nodes", "label", &a, "pool=gpu"]);
    ok(&f.server, &["nodes", "label", &b, "pool=gpu"]);
    ok(&f.server, &["nodes", "label", &c, "pool=cpu"]);
    ok(
        &f.server,
        &["nodes", "cordon", &b, "--reason", "maintenance"],
    );
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let out = f.server.cli(&[
        "rollouts", "start", "2", "-l", "pool=gpu", "--waves", "100%", "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rollout = r["id"].as_str().unwrap().to_string();
    assert_eq!(r["selector"], "all -l pool=gpu");
    let status = || -> serde_json::Value {
        let out = f.server.cli(&["rollouts", "status", &rollout, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let command_of = |s: &serde_json::Value, node: &str| -> Option<String> {
        s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node_id"] == node)
            .and_then(|n| n["command_id"].as_str())
            .filter(|c| !c.is_empty())
            .map(String::from)
    };
    let s = status();
    let mut chosen: Vec<&str> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node_id"].as_str().unwrap())
        .collect();
    chosen.sort();
    let mut expected = [a.as_str(), b.as_str()];
    expected.sort();
    assert_eq!(chosen, expected, "only the labelled nodes");
    wait_for(Duration::from_secs(20), "a's upgrade", || {
        command_of(&status(), &a)
    });
    // The controller passes every second or so: a few passes later, the
    // cordoned node still has none.
    std::thread::sleep(Duration::from_secs(3));
    let s = status();
    assert_eq!(command_of(&s, &b), None, "{s}");
    assert_eq!(s["state"], "running");
    ok(&f.server, &["nodes", "uncordon", &b]);
    wait_for(
        Duration::from_secs(20),
        "b's upgrade once uncordoned",
        || command_of(&status(), &b),
    );
    assert!(f.server.commands(&c).is_empty(), "c is not labelled");
}

/// `GET /readyz` from a server's HTTP listener: the status code and body.
fn readyz(server: &Server) -> (u16, String) {
    let (code, _, body) =
        bc_tests::netboot::http_get(server.http.expect("the HTTP listener"), "/readyz", &[]);
    (code, String::from_utf8_lossy(&body).to_string())
}

/// `gateways drain` moves a running gateway's sessions to the others
/// behind the balancer without stopping it, and the drained gateway
/// refuses sessions and is not ready until undrained: a gateway process
/// (reached by the request stream it holds open) and the key holder's own.
#[test]
fn a_drained_gateway_hands_its_sessions_to_the_others_until_undrained() {
    use bc_tests::gateways::{add_gateway, start_gateway};
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--gateway-id", "gw-main"]);
    let server = Server::start(&d.path().join("server"), &args).unwrap();
    let cred = d.path().join("gw-a.json");
    add_gateway(&server, "gw-a", &cred);
    let a = start_gateway(&server, &d.path().join("a"), &cred, "gw-a-1");
    let front = bc_tests::Front::new();
    front.set("a", Some(a.addr));
    let mut node = Node::new(&d.path().join("n"), 95);
    let out = node.join(&front.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "the node on gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-a-1"
    });
    // A node that dials gw-a alone: while it drains, it has nowhere to go.
    let mut only_a = Node::new(&d.path().join("only-a"), 96);
    let out = only_a.join(&a.url(), &server.token(1));
    assert!(out.status.success(), "{}", stderr(&out));
    let only = only_a.id();
    only_a.start();
    server.wait_node(&only, "the second node on gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-a-1"
    });
    front.set("main", Some(server.addr));

    let out = server.cli(&["gateways", "drain", "gw-nope"]);
    assert!(
        stderr(&out).contains("no running gateway gw-nope"),
        "{}",
        stderr(&out)
    );
    // gw-a's request stream may still be dialling the key holder.
    wait_for(Duration::from_secs(10), "gw-a to take the drain", || {
        server
            .cli(&["gateways", "drain", "gw-a-1", "--within", "1s"])
            .status
            .success()
            .then_some(())
    });
    let moved = server.wait_node(&id, "the node on gw-main", |n| {
        n.state == "connected" && n.gateway == "gw-main"
    });
    let (code, why) = readyz(&a);
    assert_eq!(code, 503, "{why}");
    assert!(why.contains("gateway: draining"), "{why}");
    // gw-a refuses the node that dials it alone.
    wait_for(
        Duration::from_secs(20),
        "gw-a to refuse the second node",
        || {
            only_a
                .proc()
                .log()
                .contains("gateway gw-a-1 is draining; reconnect to another")
                .then_some(())
        },
    );
    assert_ne!(server.node(&only).unwrap().state, "connected");
    // The balancer still sends half the dials to gw-a; the node stays.
    std::thread::sleep(Duration::from_secs(2));
    let still = server.node(&id).unwrap();
    assert_eq!(
        (still.gateway.as_str(), still.epoch),
        ("gw-main", moved.epoch)
    );

    ok(&server, &["gateways", "undrain", "gw-a-1"]);
    wait_for(Duration::from_secs(10), "gw-a ready again", || {
        (readyz(&a).0 == 200).then_some(())
    });
    server.wait_node(&only, "the second node back on gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-a-1"
    });

    // The key holder's own gateway, asked directly: it counts the sessions.
    let said = ok(&server, &["gateways", "drain", "gw-main", "--within", "1s"]);
    assert!(said.contains("1 sessions told"), "{said}");
    server.wait_node(&id, "the node back on gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-a-1"
    });
    assert_eq!(readyz(&server).0, 503);
    ok(&server, &["gateways", "undrain", "gw-main"]);
    wait_for(Duration::from_secs(10), "gw-main ready again", || {
        (readyz(&server).0 == 200).then_some(())
    });
}
