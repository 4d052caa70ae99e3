//! The control plane on PostgreSQL, as separate processes: gateways
//! sharing one database, the controllers run by whichever process holds
//! their table lease and taken over when it dies, a zombie gateway (paused
//! past its lease, then resumed) whose writes match nothing, and the
//! database stopped for 30 s under load: the gateways fence, nothing is
//! marked unreachable or released, every command ends once, the pools
//! recover without a restart, and no error a peer or an operator sees
//! carries an address, SQL or a driver's words.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bc_tests::fence::{Failure, bcd_sim, fence_time, own_cluster};
use bc_tests::{FAST, Front, Node, Server, bin, postgres_database, stderr, wait_for};
use rustix::process::Signal;

fn args(gateway: &str) -> Vec<&str> {
    let mut a = FAST.to_vec();
    a.extend(["--gateway-id", gateway]);
    a
}

fn gateway(dir: &Path, url: &str, id: &str) -> Server {
    Server::start_postgres(dir, url, &args(id)).expect("gateway starts")
}

/// Words that must never reach a peer or an operator's terminal.
const FORBIDDEN: &[&str] = &[
    "postgres://",
    "postgresql://",
    "?host=/",
    "SELECT",
    "INSERT",
    "UPDATE ",
    "DELETE FROM",
    "SQLSTATE",
    "db error",
    "tokio_postgres",
    "tokio-postgres",
    "deadpool",
    "rusqlite",
    "panicked",
    "backtrace",
];

fn leaks(text: &str, secret_dir: &str) -> Vec<String> {
    text.lines()
        .filter(|l| FORBIDDEN.iter().any(|w| l.contains(w)) || l.contains(secret_dir))
        .map(String::from)
        .collect()
}

#[test]
fn gateways_share_the_store_and_a_dead_holders_controllers_are_taken_over() {
    let url = postgres_database("gateways");
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let mut a = gateway(&dir, &url, "gw-a");
    wait_for(
        Duration::from_secs(10),
        "gw-a to run the controllers",
        || {
            a.proc
                .log()
                .contains("holding the controller lease; running it lease=controller:liveness")
                .then_some(())
        },
    );
    let b = gateway(&dir, &url, "gw-b");
    let mut n1 = Node::new(&d.path().join("n1"), 1);
    assert!(n1.join(&a.url(), &a.token(1)).status.success());
    let mut n2 = Node::new(&d.path().join("n2"), 2);
    assert!(n2.join(&b.url(), &b.token(1)).status.success());
    let (id1, id2) = (n1.id(), n2.id());
    n1.start();
    n2.start();
    a.wait_node(&id1, "n1 on gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-a"
    });
    a.wait_node(&id2, "n2 on gw-b, seen through gw-a", |n| {
        n.state == "connected" && n.gateway == "gw-b"
    });
    // An operator on gw-a reaches a node on gw-b through the store.
    let cmd = a.run_command(&id2, "exec.run", &["/bin/true"]);
    assert_eq!(a.wait_command(&cmd).state, "succeeded");
    assert!(
        !b.proc.log().contains("controller:liveness owner=gw-b"),
        "one process runs the liveness controller"
    );

    // gw-a dies with the controllers' leases; gw-b takes them over and
    // sweeps: n1 (whose gateway is gone) goes disconnected, then
    // unreachable, and n2 stays connected.
    a.proc.kill();
    b.wait_node(&id1, "n1 unreachable, swept by gw-b", |n| {
        n.state == "unreachable"
    });
    assert!(
        b.proc.log().contains(
            "holding the controller lease; running it lease=controller:liveness owner=gw-b"
        ),
        "{}",
        b.proc.log()
    );
    assert_eq!(b.node(&id2).unwrap().state, "connected");
    // The other controllers move too, and run: a command for the away n1
    // whose deadline passes is expired by gw-b's sweeper.
    for controller in ["sweeper", "rollouts"] {
        wait_for(
            Duration::from_secs(10),
            &format!("gw-b to run {controller}"),
            || {
                b.proc
                .log()
                .contains(&format!(
                    "holding the controller lease; running it lease=controller:{controller} owner=gw-b"
                ))
                .then_some(())
            },
        );
    }
    let out = b.cli(&[
        "commands",
        "run",
        &id1,
        "exec.run",
        "--not-after",
        "1s",
        "--",
        "/bin/true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let late = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let swept = b.wait_command(&late);
    assert_eq!(
        (swept.state.as_str(), swept.reason.as_str()),
        ("expired", "not_after passed before dispatch"),
        "{swept:?}"
    );
    // gw-a comes back on its address: n1 reconnects, reachable again.
    a.crash_restart().unwrap();
    let n = b.wait_node(&id1, "n1 back", |n| n.state == "connected");
    assert!(n.conditions.is_empty() && n.taints.is_empty(), "{n:?}");
    let out = b.cli(&[
        "check",
        "--node-lease-ttl",
        "1s",
        "--gateway-loss-grace",
        "2s",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

#[test]
fn a_zombie_gateways_writes_match_nothing() {
    let url = postgres_database("zombie");
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let z = gateway(&dir, &url, "gw-z");
    let y = gateway(&dir, &url, "gw-y");
    let front = Front::new();
    front.set("gw-z", Some(z.addr));
    let mut node = Node::new(&d.path().join("n"), 3);
    assert!(node.join(&front.url(), &z.token(1)).status.success());
    let id = node.id();
    node.start();
    let first = y.wait_node(&id, "the node on gw-z", |n| {
        n.state == "connected" && n.gateway == "gw-z"
    });

    // gw-z stops (SIGSTOP) with the node's session; the balancer's health
    // check moves new connections to gw-y.
    z.proc.signal(Signal::STOP);
    let paused = Instant::now();
    front.set("gw-z", None);
    front.set("gw-y", Some(y.addr));
    let moved = y.wait_node(&id, "the node re-homed on gw-y", |n| {
        n.state == "connected" && n.gateway == "gw-y" && n.epoch > first.epoch
    });
    // Past gw-z's lease (FAST: 2 s) before it wakes.
    let store = y.store();
    wait_for(Duration::from_secs(20), "gw-z's lease to run out", || {
        let snap = store.block(store.store.audit_snapshot()).unwrap();
        (paused.elapsed() > Duration::from_secs(3)
            && snap.leases.get("gw-z").is_none_or(|e| *e < snap.now))
        .then_some(())
    });
    z.proc.signal(Signal::CONT);
    // The zombie lets go of the node's session one of four ways: its
    // liveness flush matches nothing (superseded); the stream's end finds
    // a newer session (its disconnect matches nothing); that disconnect
    // fails on a pooled connection PostgreSQL cut while it slept
    // (idle_in_transaction_session_timeout), writing nothing; or its
    // first renewal fails past half the lease TTL and it fences, closing
    // every stream and writing nothing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = z.proc.log();
        if log.contains("session superseded; closing it")
            || log.contains("session ended; a newer session owns the node")
            || log.contains("cannot record the disconnect")
            || log.contains("fencing: closing every session")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the zombie held on to the node's session for 20 s after SIGCONT; its log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // And it knows it went without its lease: its first renewal after
    // waking finds the lease lapsed (the store's clock moved past a TTL)
    // and it fences, closing every session, before it serves again.
    wait_for(
        Duration::from_secs(10),
        "the zombie fenced after waking",
        || {
            z.proc
                .log()
                .contains("fencing: closing every session")
                .then_some(())
        },
    );
    // Several of its flush intervals later, the route is still gw-y's.
    std::thread::sleep(Duration::from_secs(2));
    let now = y.node(&id).unwrap();
    assert_eq!(
        (now.state.as_str(), now.gateway.as_str(), now.epoch),
        ("connected", "gw-y", moved.epoch),
        "the zombie changed the node's session"
    );
    let snap = store.block(store.store.audit_snapshot()).unwrap();
    let late: Vec<_> = snap
        .audit
        .iter()
        .filter(|a| a.node_id == id && a.epoch >= moved.epoch && a.gateway_id == "gw-z")
        .collect();
    assert!(late.is_empty(), "the zombie wrote {late:?}");
    let out = y.cli(&[
        "check",
        "--node-lease-ttl",
        "1s",
        "--gateway-loss-grace",
        "2s",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

#[test]
fn a_database_outage_under_load_loses_nothing() {
    const NODES: usize = 20;
    let (mut cluster, url) = own_cluster("outage");
    let secret = cluster.dir().display().to_string();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let mut g1 = gateway(&dir, &url, "gw-1");
    let mut g2 = gateway(&dir, &url, "gw-2");
    let (pid1, pid2) = (g1.proc.pid(), g2.proc.pid());
    let front = Front::new();
    front.set("gw-1", Some(g1.addr));
    front.set("gw-2", Some(g2.addr));
    let sim_log = d.path().join("sim.log");
    let mut sim = bcd_sim(
        &front.url(),
        &g1.token(NODES as u32),
        &d.path().join("nodes"),
        NODES,
        &sim_log,
    );
    let connected = |s: &Server| s.nodes().iter().filter(|n| n.state == "connected").count();
    wait_for(Duration::from_secs(60), "the fleet connected", || {
        (connected(&g1) == NODES).then_some(())
    });
    let ids: Vec<String> = g1.nodes().into_iter().map(|n| n.node_id).collect();
    // Work in flight: commands that take a while, and more queued behind
    // them, when the database goes.
    let mut commands = Vec::new();
    for id in &ids {
        commands.push(g1.run_command(id, "exec.run", &["/bin/sh", "-c", "sleep 1"]));
        commands.push(g2.run_command(id, "exec.run", &["/bin/true"]));
    }

    cluster.stop().unwrap();
    let down = Instant::now();
    let mut seen = String::new();
    // Both gateways fence themselves within 10 s and refuse sessions.
    wait_for(Duration::from_secs(10), "both gateways fenced", || {
        (g1.proc.log().contains("fencing") && g2.proc.log().contains("fencing")).then_some(())
    });
    let fenced_in = down.elapsed();
    // What an operator sees meanwhile, and a node trying to join.
    while down.elapsed() < Duration::from_secs(30) {
        for s in [&g1, &g2] {
            for args in [
                vec!["nodes", "list"],
                vec!["commands", "run", &ids[0], "exec.run", "--", "/bin/true"],
                vec!["tokens", "create"],
            ] {
                let out = s.cli(&args);
                assert!(!out.status.success(), "{args:?} worked without a database");
                seen.push_str(&stderr(&out));
            }
        }
        let joiner = Node::new(&d.path().join("joiner"), 9);
        let out = joiner.join(&front.url(), "bct1.x.y.z");
        seen.push_str(&stderr(&out));
        std::thread::sleep(Duration::from_secs(3));
    }
    cluster.start_again().unwrap();
    let up = Instant::now();
    wait_for(Duration::from_secs(120), "the fleet back", || {
        g1.cli(&["nodes", "list", "--json"])
            .status
            .success()
            .then(|| connected(&g1) == NODES)
            .and_then(|all| all.then_some(()))
    });
    let back_in = up.elapsed();
    eprintln!(
        "outage: fenced in {:.1}s; every node connected {:.1}s after the database returned",
        fenced_in.as_secs_f64(),
        back_in.as_secs_f64()
    );
    // The same processes: the pools recovered by themselves.
    assert_eq!((g1.proc.pid(), g2.proc.pid()), (pid1, pid2));
    assert!(g1.proc.child.try_wait().unwrap().is_none());
    assert!(g2.proc.child.try_wait().unwrap().is_none());
    for c in &commands {
        let done = g2.wait_command(c);
        assert_eq!(done.state, "succeeded", "{done:?}");
    }
    let store = g1.store();
    let snap = store.block(store.store.audit_snapshot()).unwrap();
    let unreachable: Vec<_> = snap
        .audit
        .iter()
        .filter(|a| a.kind == "unreachable")
        .collect();
    assert!(
        unreachable.is_empty(),
        "marked unreachable: {unreachable:?}"
    );
    let out = g1.cli(&[
        "check",
        "--node-lease-ttl",
        "1s",
        "--gateway-loss-grace",
        "2s",
        "--settle",
        "1s",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    // The audit history went on through the database's restart as one
    // chain: no sequence number given twice, none skipped.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("AC audit_chain_intact held"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = sim.kill();
    let _ = sim.wait();
    // Every error seen: by operators, by a joining node, by the fleet, and
    // in the gateways' own logs (a store error reads with the database's
    // code, never the driver's words).
    seen.push_str(&std::fs::read_to_string(&sim_log).unwrap_or_default());
    seen.push_str(&g1.proc.log());
    seen.push_str(&g2.proc.log());
    assert!(
        seen.contains("unavailable") || seen.contains("UNAVAILABLE"),
        "the outage showed as unavailable: {seen}"
    );
    let bad = leaks(&seen, &secret);
    assert!(
        bad.is_empty(),
        "errors carry internals:\n{}",
        bad.join("\n")
    );
}

/// `check` reads a store as it is: pointed at an empty database (a typo
/// in the address, a database the server never used), it fails, saying it
/// cannot read it, and leaves the database empty: no schema created, no
/// migration run.
#[test]
fn check_on_an_empty_database_creates_nothing() {
    let url = postgres_database("check");
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(bin("better-compute"))
        .arg("--data-dir")
        .arg(d.path())
        .args(["--store", &url, "check"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a check of an empty database passed");
    assert!(
        stderr(&out).contains("the PostgreSQL store"),
        "{}",
        stderr(&out)
    );
    let tables = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
                .query_one(
                    "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        });
    assert_eq!(tables, 0, "check created tables");
}

/// A database that hangs (its host frozen: connections open, nothing
/// answers) fences a gateway at the default timings within half its 20 s
/// lease, as a refused one does: a renewal waits only until the fence
/// deadline, not half a TTL from whenever it began.
#[test]
fn a_hung_database_fences_its_gateway_within_half_the_default_lease() {
    fenced_within_half_the_default_lease(Failure::Hung);
}

/// A database that is gone (connections refused at once) fences a gateway
/// at the default timings within half its lease too: the renewal refused
/// at the tick before the deadline fences at the deadline, not at the
/// tick after it (15 s).
#[test]
fn a_stopped_database_fences_its_gateway_within_half_the_default_lease() {
    fenced_within_half_the_default_lease(Failure::Stopped);
}

/// At most half the TTL after the last renewal that answered, which was
/// before the failure (a second of slack for a loaded machine): the lease
/// cannot pass to another gateway before 20 s.
fn fenced_within_half_the_default_lease(failure: Failure) {
    let fenced_in = fence_time(failure, 20);
    eprintln!(
        "{} database: fenced in {:.1}s",
        failure.name(),
        fenced_in.as_secs_f64()
    );
    assert!(
        fenced_in <= Duration::from_secs(11),
        "fenced {:.1}s after the database {}",
        fenced_in.as_secs_f64(),
        failure.name()
    );
}

/// A spec change whose transaction commits long after its `updated_at`
/// stamp (held up on the spec's row here; a stepped clock does the same)
/// still reaches a node connected through another gateway: the gateway
/// compares the store's spec generations with what each session sent,
/// with no time in the comparison.
#[test]
fn a_spec_that_commits_long_after_its_stamp_still_reaches_the_node() {
    use bc_tests::gateways::{add_gateway, database_role, start_gateway_on};
    let url = postgres_database("late_spec");
    let f = bc_tests::fleet_on(Some(&url), &[]);
    let cred = f.d.path().join("gw-edge.json");
    let printed = add_gateway(&f.server, "gw-edge", &cred);
    let gw_dir = f.d.path().join("gateway");
    std::fs::create_dir_all(&gw_dir).unwrap();
    let _gw = start_gateway_on(&database_role(&url, &printed), &gw_dir, &cred, "gw-edge-1");
    let mut node = Node::new(&f.d.path().join("n1"), 4);
    let out = node.join(&_gw.url(), &f.server.token(1));
    assert!(out.status.success(), "join: {}", stderr(&out));
    let id = node.id();
    node.start();
    f.server
        .wait_node(&id, "connected through the gateway", |n| {
            n.state == "connected" && n.gateway == "gw-edge-1"
        });
    f.server.assign_and_wait(&id, "job-a", "0", 1);

    // The next change is held up between its stamp and its commit for 6 s
    // (twice the work loop's overlap; a lock wait could not be: locks time
    // out at 3 s): a trigger of the test's own sleeps in its statement.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(
                "CREATE FUNCTION test_stall() RETURNS trigger LANGUAGE plpgsql AS
                     $$ BEGIN PERFORM pg_sleep(6); RETURN NEW; END $$;
                 CREATE TRIGGER test_stall BEFORE UPDATE ON node_specs FOR EACH ROW
                     WHEN (NEW.generation = 2) EXECUTE FUNCTION test_stall();",
            )
            .await
            .unwrap();
    });
    let at = Instant::now();
    let out = f
        .server
        .cli(&["nodes", "assign", &id, "job-b", "--gpus", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(at.elapsed() >= Duration::from_secs(6), "{:?}", at.elapsed());
    let committed = Instant::now();
    wait_for(Duration::from_secs(20), "generation 2 applied", || {
        (f.server.spec(&id)["applied_generation"] == 2).then_some(())
    });
    println!(
        "the late spec reached the node {:?} after it committed",
        committed.elapsed()
    );
}
