//! Control-plane restarts, with real processes: four consecutive restarts
//! of every control-plane process while a fleet is connected and commands
//! flow leave the authoritative tables as they were (nodes, certificates,
//! tokens, operators, specs and generations, terminal commands, bindings,
//! releases, images, rollouts, backup sets), the API answers after every
//! start, every
//! start reconciles and audits it, and `check --label` holds after each;
//! on the embedded store and on PostgreSQL with two gateways. And joins
//! racing on one single-use token, as separate `bcd join` processes.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bc_tests::{FAST, Node, Server, bin, postgres_database, stderr, wait_for};

/// The authoritative tables, each as the text of its rows in key order
/// (binary columns left out where a hash or fingerprint column stands for
/// them). Commands: the terminal ones. A binding's `updated_at` is when a
/// node's report last confirmed it, which every reconnect does, and a
/// node's `next_seq` counts the commands the load adds: both left out.
const TABLES: &[(&str, &str)] = &[
    (
        "nodes",
        "SELECT id, hostname, created_at, deleted_at, identity_generation, ramdisk, join_token, \
         agent_version, conditions, taints, release_floor FROM nodes ORDER BY id",
    ),
    (
        "node_certs",
        "SELECT serial, node_id, fingerprint, identity_generation, not_before, not_after, \
         revoked_at, revoke_reason FROM node_certs ORDER BY serial",
    ),
    (
        "join_tokens",
        "SELECT id, secret_sha256, created_at, expires_at, uses_total, uses_left, description \
         FROM join_tokens ORDER BY id",
    ),
    (
        "operators",
        "SELECT id, role, cert_sha256, cert_serial, created_at, not_after, revoked_at FROM operators ORDER BY id",
    ),
    (
        "node_specs",
        "SELECT node_id, generation, assignments, access, not_after FROM node_specs \
         ORDER BY node_id",
    ),
    (
        "commands",
        "SELECT id, node_id, seq, kind, state, epoch, reason, exit_code, result_at, created_at \
         FROM commands WHERE state IN ('succeeded', 'failed', 'expired', 'rejected') ORDER BY id",
    ),
    (
        "bindings",
        "SELECT node_id, allocation_id, gpus, state, spec_generation FROM bindings \
         ORDER BY node_id, allocation_id",
    ),
    (
        "releases",
        "SELECT sequence, version, target, size, sha256, key_id, registered_at FROM releases \
         ORDER BY sequence",
    ),
    (
        "images",
        "SELECT image_id, name, kernel_sha256, initrd_sha256, registered_at FROM images \
         ORDER BY image_id",
    ),
    (
        "image_assignments",
        "SELECT target, image_id, append, assigned_at FROM image_assignments ORDER BY target",
    ),
    (
        "rollouts",
        "SELECT id, sequence, selector, waves, max_failures, state, wave, reason, created_at, \
         updated_at FROM rollouts ORDER BY id",
    ),
    (
        "backups",
        "SELECT id, state, reason, restore_eligible, created_at, finished_at, location \
         FROM backups ORDER BY id",
    ),
    (
        "rollout_nodes",
        "SELECT rollout_id, node_id, position, command_id, rollback_id, skipped \
         FROM rollout_nodes ORDER BY rollout_id, node_id",
    ),
];

type Tables = BTreeMap<&'static str, Vec<String>>;

/// The authoritative tables of the SQLite store in `dir`.
fn sqlite_tables(dir: &Path) -> Tables {
    let db = rusqlite::Connection::open_with_flags(
        dir.join("store.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    TABLES
        .iter()
        .map(|(name, sql)| {
            let mut st = db.prepare(sql).unwrap();
            let n = st.column_count();
            let rows = st
                .query_map([], |r| {
                    Ok((0..n)
                        .map(|i| text(r.get_ref(i).unwrap()))
                        .collect::<Vec<_>>()
                        .join("|"))
                })
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            (*name, rows)
        })
        .collect()
}

fn text(v: rusqlite::types::ValueRef<'_>) -> String {
    use rusqlite::types::ValueRef;
    match v {
        ValueRef::Null => String::new(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(b) => format!("{} bytes", b.len()),
    }
}

/// The authoritative tables of the PostgreSQL store at `url`, read with
/// psql.
fn postgres_tables(url: &str) -> Tables {
    TABLES
        .iter()
        .map(|(name, sql)| {
            let out = Command::new("psql")
                .args([
                    "-X",
                    "-At",
                    "-F",
                    "|",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-d",
                    url,
                    "-c",
                    sql,
                ])
                .output()
                .expect("psql runs");
            assert!(out.status.success(), "psql: {}", stderr(&out));
            let rows = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(String::from)
                .collect();
            (*name, rows)
        })
        .collect()
}

/// Every table as it was; commands may have been added by the load (those
/// that were terminal before are unchanged).
fn assert_no_drift(before: &Tables, after: &Tables) {
    for (name, rows) in before {
        let now = &after[name];
        if *name == "commands" {
            for r in rows {
                assert!(now.contains(r), "command drifted or vanished: {r}");
            }
        } else {
            assert_eq!(rows, now, "table {name} drifted across the restarts");
        }
    }
}

/// Submits `exec.run /bin/true` to the nodes in turn until stopped, through
/// whichever of `servers` answers; returns the commands accepted.
fn load(
    servers: Vec<(std::path::PathBuf, String, Option<String>)>,
    nodes: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut accepted = Vec::new();
        let mut i = 0usize;
        while !stop.load(Ordering::SeqCst) {
            let (dir, url, store) = &servers[i % servers.len()];
            let node = &nodes[i % nodes.len()];
            i += 1;
            let mut c = Command::new(bin("better-compute"));
            if let Some(s) = store {
                c.env("BC_STORE", s);
            }
            let out = c
                .arg("--data-dir")
                .arg(dir)
                .args(["--server", url, "commands", "run", node, "exec.run", "--"])
                .arg("/bin/true")
                .output()
                .unwrap();
            if out.status.success() {
                accepted.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
            } else {
                // A restarting server refuses or drops the call: the
                // operator sees a clean error and tries again.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        accepted
    })
}

/// `check --label LABEL` until it holds: right after a restart a route may
/// still name a gateway whose new process has not renewed its lease yet
/// (the liveness sweep's next second settles it); a violation that stays
/// fails the test with the last report.
fn check(server: &Server, label: &str) {
    let run = || {
        server.cli(&[
            "check",
            "--label",
            label,
            "--node-lease-ttl",
            "1s",
            "--gateway-loss-grace",
            "2s",
        ])
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let out = loop {
        let out = run();
        if out.status.success() || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(
        text.starts_with(&format!("== {label}: 12 invariants ==")),
        "{text}"
    );
    for name in [
        "I1",
        "I2",
        "I3",
        "I4",
        "I5",
        "I7",
        "I8",
        "AC audit_chain_intact",
        "OL no orphaned lease",
        "SC no stuck command",
        "RS results signed",
        "BK backup state legal",
    ] {
        assert!(text.contains(name), "{name} missing: {text}");
    }
}

fn reconciles(server: &Server) -> usize {
    std::fs::read_dir(&server.dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("serve-"))
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .matches(" reconciled ")
                .count()
        })
        .sum()
}

/// The fleet the storms run on: `servers` share one store; nodes are
/// connected, GPUs assigned and commands run before the storm.
fn fleet(servers: &[Server], root: &Path, n: u64) -> (Vec<Node>, Vec<String>) {
    let mut nodes = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let s = &servers[i as usize % servers.len()];
        let mut node = Node::new(&root.join(format!("n{i}")), 40 + i);
        let out = node.join(&s.url(), &s.token(1));
        assert!(out.status.success(), "join: {}", stderr(&out));
        node.start();
        ids.push(node.id());
        nodes.push(node);
    }
    for id in &ids {
        servers[0].wait_node(id, "connected", |n| n.state == "connected");
        servers[0].assign_and_wait(id, "alloc-1", "0", 1);
        for _ in 0..2 {
            let c = servers[0].run_command(id, "exec.run", &["/bin/true"]);
            assert_eq!(servers[0].wait_command(&c).state, "succeeded");
        }
    }
    // A backup set, which the restarts must leave as it is.
    let out = servers[0].cli(&["backup", "create"]);
    assert!(out.status.success(), "backup create: {}", stderr(&out));
    (nodes, ids)
}

/// Waits until every node is connected and every command it was given is
/// terminal.
fn settle(server: &Server, ids: &[String], accepted: &[String]) {
    for id in ids {
        server.wait_node(id, "connected after the storm", |n| n.state == "connected");
    }
    for c in accepted {
        let v = server.wait_command(c);
        assert!(v.is_terminal(), "{c}: {}", v.state);
    }
}

#[test]
fn four_restarts_under_load_leave_the_embedded_store_as_it_was() {
    let d = tempfile::tempdir().unwrap();
    let mut args = FAST.to_vec();
    args.extend(["--gateway-id", "gw-1"]);
    let mut server = Server::start(&d.path().join("server"), &args).unwrap();
    let (_nodes, ids) = fleet(std::slice::from_ref(&server), d.path(), 3);
    let before = sqlite_tables(&server.dir);
    assert_eq!(before["nodes"].len(), 3);
    assert_eq!(before["bindings"].len(), 3);
    assert_eq!(before["commands"].len(), 6);
    assert_eq!(before["backups"].len(), 1);

    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(
        vec![(server.dir.clone(), server.api_url(), None)],
        ids.clone(),
        stop.clone(),
    );
    let reconciled_before = reconciles(&server);
    for i in 1..=4 {
        // Let load reach the server, then restart it: crashes and orderly
        // stops in turn.
        std::thread::sleep(Duration::from_millis(700));
        if i % 2 == 1 {
            server.crash_restart().unwrap();
        } else {
            server.restart().unwrap();
        }
        // The API answers on every start.
        assert_eq!(server.nodes().len(), 3, "restart {i}");
        check(&server, &format!("after restart {i}"));
    }
    stop.store(true, Ordering::SeqCst);
    let accepted = loader.join().unwrap();
    assert!(!accepted.is_empty(), "the load ran");
    settle(&server, &ids, &accepted);
    assert_no_drift(&before, &sqlite_tables(&server.dir));
    // Every start reconciled, and said so.
    assert_eq!(reconciles(&server) - reconciled_before, 4);
    check(&server, "after the storm");
}

#[test]
fn four_restarts_of_both_gateways_under_load_leave_postgresql_as_it_was() {
    let url = postgres_database("storm");
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("server");
    let start = |id: &str| {
        let mut args = FAST.to_vec();
        args.extend(["--gateway-id", id]);
        Server::start_postgres(&dir, &url, &args).unwrap()
    };
    let mut servers = vec![start("gw-a"), start("gw-b")];
    let (_nodes, ids) = fleet(&servers, d.path(), 4);
    let before = postgres_tables(&url);
    assert_eq!(before["nodes"].len(), 4);
    assert_eq!(before["commands"].len(), 8);

    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(
        servers
            .iter()
            .map(|s| (s.dir.clone(), s.api_url(), Some(url.clone())))
            .collect(),
        ids.clone(),
        stop.clone(),
    );
    for i in 1..=4 {
        for s in servers.iter_mut() {
            std::thread::sleep(Duration::from_millis(500));
            if i % 2 == 1 {
                s.crash_restart().unwrap();
            } else {
                s.restart().unwrap();
            }
            assert_eq!(s.nodes().len(), 4, "restart {i}");
        }
        check(&servers[0], &format!("after restart {i}"));
    }
    stop.store(true, Ordering::SeqCst);
    let accepted = loader.join().unwrap();
    assert!(!accepted.is_empty(), "the load ran");
    settle(&servers[0], &ids, &accepted);
    assert_no_drift(&before, &postgres_tables(&url));
    check(&servers[1], "after the storm");
}

#[test]
fn joins_racing_on_one_single_use_token_make_one_identity() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let token = server.token(1);
    let nodes: Vec<Node> = (0..6)
        .map(|i| Node::new(&d.path().join(format!("racer{i}")), 60 + i))
        .collect();
    let url = server.url();
    let outs: Vec<std::process::Output> = std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter()
            .map(|n| {
                let (url, token) = (url.clone(), token.clone());
                s.spawn(move || n.join(&url, &token))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(won, 1, "{:?}", outs.iter().map(stderr).collect::<Vec<_>>());
    for o in outs.iter().filter(|o| !o.status.success()) {
        let e = stderr(o);
        assert!(e.contains("token"), "the refusal names the token: {e}");
    }
    wait_for(Duration::from_secs(5), "one node in the store", || {
        (server.nodes().len() == 1).then_some(())
    });
}

/// The one `bcd node` child of a supervisor.
fn daemon_of(supervisor: i32) -> Option<i32> {
    let children =
        std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn a_daemon_in_a_crash_loop_shows_on_its_node_until_it_stays_up() {
    let (_d, server, mut node) = bc_tests::setup(71);
    let id = node.id();
    let supervisor = node
        .supervise(
            &["--restart-delay", "100ms", "--crash-loop-window", "6s"],
            &[],
        )
        .pid();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let mut epoch = server.node(&id).unwrap().epoch;
    // Three abnormal exits in the window: the daemon that starts after them
    // says so in its Hello.
    for _ in 0..3 {
        let child = wait_for(Duration::from_secs(10), "the daemon", || {
            daemon_of(supervisor)
        });
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(child).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
        let seen = epoch;
        let n = server.wait_node(&id, "connected again", |n| {
            n.state == "connected" && n.epoch > seen
        });
        epoch = n.epoch;
    }
    let n = server.node(&id).unwrap();
    assert!(
        n.conditions.contains(&"DaemonCrashLoop".to_string()),
        "{n:?}"
    );
    let log = node.proc().log();
    assert!(log.contains("the daemon is in a crash loop"), "{log}");
    // Once the exits age out of the window, the next start clears it.
    std::thread::sleep(Duration::from_secs(6));
    let child = daemon_of(supervisor).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let n = server.wait_node(&id, "connected, the loop over", |n| {
        n.state == "connected" && n.epoch > epoch
    });
    assert!(n.conditions.is_empty(), "{n:?}");
}
