//! Backups and restores with real processes, on SQLite and PostgreSQL:
//! a set taken while a fleet runs restores into a fresh data directory and
//! store, table for table; `backup create` killed at each of its points
//! leaves a set that the next start of serve fails (MANIFEST_INCOMPLETE)
//! and that no restore takes; `backup restore` killed mid-phase stops
//! serve and later restores (MANUAL_INTERVENTION_REQUIRED, with the phase)
//! until it is resumed or abandoned; a tampered file is refused, naming
//! it; a restored control plane reports the set it came from as not
//! restore eligible.
//!
//! The pause points need the test build (`--all-features`: the server's
//! `failpoints` feature).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bc_store::backups::{Dump, Value};
use bc_tests::{FAST, Node, Proc, Server, StoreAccess, bin, postgres_database, stderr, wait_for};

/// Where a control plane's store is: SQLite in its data directory, or a
/// PostgreSQL database.
#[derive(Debug, Clone)]
struct Plane {
    dir: PathBuf,
    url: Option<String>,
}

impl Plane {
    fn new(dir: PathBuf, postgres: bool) -> Plane {
        std::fs::create_dir_all(&dir).unwrap();
        Plane {
            dir,
            url: postgres.then(|| postgres_database("backup")),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin("better-compute"));
        if let Some(url) = &self.url {
            c.env("BC_STORE", url);
        }
        c.arg("--data-dir").arg(&self.dir).args(args);
        c
    }

    fn cli(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run better-compute")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(!out.status.success(), "{args:?} should fail");
        stderr(&out)
    }

    /// Starts `args` in the background, paused at `point`: returns once it
    /// says it is there.
    fn paused(&self, args: &[&str], point: &str) -> Proc {
        let log = self.dir.join(format!("{point}.log"));
        let child = self
            .command(args)
            .env("BC_PAUSE_AT", point)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut p = Proc { child, log };
        let want = format!("paused at {point}");
        wait_for(Duration::from_secs(60), &want, || {
            if let Some(s) = p.child.try_wait().unwrap() {
                panic!("{args:?} exited ({s}) before {point}:\n{}", p.log());
            }
            p.log().contains(&want).then_some(())
        });
        p
    }

    fn serve(&self) -> anyhow::Result<Server> {
        match &self.url {
            Some(url) => Server::start_postgres(&self.dir, url, FAST),
            None => Server::start(&self.dir, FAST),
        }
    }

    fn store(&self) -> StoreAccess {
        StoreAccess::open(&match &self.url {
            Some(url) => bc_store::Location::Postgres(url.clone()),
            None => bc_store::Location::Sqlite(self.dir.join("store.db")),
        })
    }

    fn dump(&self) -> Dump {
        let s = self.store();
        s.block(s.store.dump()).unwrap()
    }

    fn backups(&self) -> Vec<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["backup", "list", "--json"])).unwrap();
        v["backups"].as_array().unwrap().clone()
    }

    fn backup(&self, id: &str) -> serde_json::Value {
        self.backups()
            .into_iter()
            .find(|b| b["id"] == id)
            .unwrap_or_else(|| panic!("no backup {id}"))
    }

    /// `backup create`: the set's id and directory.
    fn create(&self) -> (String, PathBuf) {
        let v: serde_json::Value =
            serde_json::from_str(&self.ok(&["backup", "create", "--json"])).unwrap();
        (
            v["id"].as_str().unwrap().to_string(),
            PathBuf::from(v["location"].as_str().unwrap()),
        )
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A table's rows, sorted, as text.
fn rows(d: &Dump, table: &str) -> Vec<String> {
    let mut r: Vec<String> = d
        .tables
        .iter()
        .find(|t| t.name == table)
        .unwrap_or_else(|| panic!("no table {table}"))
        .rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    r.sort();
    r
}

fn column(d: &Dump, table: &str, row_has: &str, col: &str) -> Value {
    let t = d.tables.iter().find(|t| t.name == table).unwrap();
    let i = t.columns.iter().position(|c| c == col).unwrap();
    t.rows
        .iter()
        .find(|r| r.contains(&Value::Text(row_has.into())))
        .unwrap_or_else(|| panic!("no {table} row with {row_has}"))[i]
        .clone()
}

fn a_set_taken_while_a_fleet_runs_restores_into_a_fresh_plane(postgres: bool) {
    let d = tempfile::tempdir().unwrap();
    let src = Plane::new(d.path().join("src"), postgres);
    let server = src.serve().unwrap();
    let mut nodes: Vec<Node> = (0..2)
        .map(|i| {
            let n = Node::new(&d.path().join(format!("node{i}")), 40 + i);
            let out = n.join(&server.url(), &server.token(1));
            assert!(out.status.success(), "join: {}", stderr(&out));
            n
        })
        .collect();
    for n in &mut nodes {
        n.start();
    }
    let ids: Vec<String> = nodes.iter().map(Node::id).collect();
    for id in &ids {
        server.wait_node(id, "connected", |n| n.state == "connected");
    }
    // Commands flow while the set is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, sent, url, dir, store, node) = (
            stop.clone(),
            sent.clone(),
            server.api_url(),
            src.dir.clone(),
            src.url.clone(),
            ids[0].clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut c = Command::new(bin("better-compute"));
                if let Some(u) = &store {
                    c.env("BC_STORE", u);
                }
                let out = c
                    .arg("--data-dir")
                    .arg(&dir)
                    .args(["--server", &url, "commands", "run", &node, "exec.run", "--"])
                    .arg("/bin/true")
                    .output()
                    .unwrap();
                assert!(out.status.success(), "commands run: {}", stderr(&out));
                sent.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    wait_for(Duration::from_secs(30), "commands flowing", || {
        (sent.load(Ordering::Relaxed) > 0).then_some(())
    });
    let (live_id, live_dir) = src.create();
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    let b = src.backup(&live_id);
    assert_eq!(
        (b["state"].as_str(), b["restore_eligible"].as_bool()),
        (Some("COMPLETE"), Some(true))
    );
    assert!(b["files"].as_u64().unwrap() > 10, "{b}");
    let show = src.ok(&["backup", "show", &live_id]);
    assert!(
        show.contains("store/nodes.jsonl") && show.contains("keys/ca.key"),
        "{show}"
    );

    // Quiesced, a second set; restored, every table is the source's.
    for n in &mut nodes {
        n.proc().stop();
    }
    drop(server);
    let (quiet_id, quiet_dir) = src.create();
    let before = src.dump();
    let dst = Plane::new(d.path().join("dst"), postgres);
    let said = dst.ok(&["backup", "restore", s(&quiet_dir)]);
    assert!(said.contains(&quiet_id), "{said}");
    let after = dst.dump();
    for t in &before.tables {
        match t.name.as_str() {
            // The set itself: COMPLETE at the source; CREATING in its dump,
            // so FAILED in the plane restored from it.
            "backups" => {
                assert_eq!(
                    column(&before, "backups", &quiet_id, "state"),
                    Value::Text("COMPLETE".into())
                );
                assert_eq!(
                    column(&after, "backups", &quiet_id, "state"),
                    Value::Text("FAILED".into())
                );
                assert_eq!(
                    column(&after, "backups", &quiet_id, "reason"),
                    Value::Text("RESTORED_FROM_THIS_SET".into())
                );
                assert_eq!(
                    rows(&after, "backups").len(),
                    rows(&before, "backups").len()
                );
            }
            // After the dump, the source recorded the set COMPLETE and the
            // restored plane FAILED: one history row each, past the dump's.
            "audit" => {
                let mine = |rows: Vec<String>| -> (Vec<String>, Vec<String>) {
                    rows.into_iter().partition(|r| !r.contains(&quiet_id))
                };
                let (b, b_set) = mine(rows(&before, "audit"));
                let (a, a_set) = mine(rows(&after, "audit"));
                assert_eq!(a, b);
                assert!(b_set.iter().any(|r| r.contains("COMPLETE")), "{b_set:?}");
                assert!(
                    a_set.iter().any(|r| r.contains("RESTORED_FROM_THIS_SET")),
                    "{a_set:?}"
                );
                assert!(a_set.iter().all(|r| !r.contains("COMPLETE")), "{a_set:?}");
            }
            // Each plane's chain heads follow its own last records (the
            // set's COMPLETE at the source, FAILED here, in that set's
            // chain): `check` verifies the restored chains whole below.
            "audit_head" => {
                let (b, a) = (rows(&before, "audit_head"), rows(&after, "audit_head"));
                assert_eq!(a.len(), b.len());
            }
            // The set's own lease, released at the source after its dump.
            "leases" => {
                let (b, a) = (rows(&before, "leases"), rows(&after, "leases"));
                let a: Vec<&String> = a.iter().filter(|r| !r.contains("backup:")).collect();
                let b: Vec<&String> = b.iter().filter(|r| !r.contains("backup:")).collect();
                assert_eq!(a, b);
            }
            name => assert_eq!(rows(&before, name), rows(&after, name), "table {name}"),
        }
    }
    for f in ["ca.key", "ca.crt", "worker.key"] {
        assert_eq!(
            std::fs::read(src.dir.join(f)).unwrap(),
            std::fs::read(dst.dir.join(f)).unwrap(),
            "{f}"
        );
    }
    // The restored history is one unbroken chain up to its own head.
    let out = dst.cli(&["check", "--json"]);
    let outcomes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let chain = outcomes
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "AC")
        .unwrap();
    assert!(
        chain["violations"].as_array().unwrap().is_empty() && chain["checked"].as_u64() > Some(0),
        "{chain}"
    );

    // The set taken under load restores too, and that plane starts and
    // holds its invariants; it reports the set it came from as not
    // restore eligible.
    let live = Plane::new(d.path().join("live"), postgres);
    live.ok(&["backup", "restore", s(&live_dir)]);
    // Read back as its files say, table by table.
    let restored_tables = live.dump();
    let header: serde_json::Value =
        serde_json::from_slice(&std::fs::read(live_dir.join("store/dump.json")).unwrap()).unwrap();
    for t in header["tables"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let mut want: Vec<String> =
            std::fs::read_to_string(live_dir.join(t["file"].as_str().unwrap()))
                .unwrap()
                .lines()
                .map(String::from)
                .collect();
        want.sort();
        let got = rows(&restored_tables, name);
        match name {
            // The set's own move to FAILED there: its row, one history row.
            "backups" => assert_eq!(got.len(), want.len()),
            "audit" => assert!(want.iter().all(|r| got.contains(r)), "{name}"),
            // That row's chain's head moved on to it.
            "audit_head" => assert_eq!(got.len(), want.len()),
            // The history's position moved by that row; the rest did not.
            "sqlite_sequence" => {
                let others = |v: Vec<String>| -> Vec<String> {
                    v.into_iter()
                        .filter(|r| !r.starts_with("[\"audit\""))
                        .collect()
                };
                assert_eq!(others(got), others(want));
            }
            _ => assert_eq!(got, want, "table {name}"),
        }
    }
    let restored = live.serve().unwrap();
    let b = live.backup(&live_id);
    assert_eq!(
        (
            b["state"].as_str(),
            b["reason"].as_str(),
            b["restore_eligible"].as_bool()
        ),
        (Some("FAILED"), Some("RESTORED_FROM_THIS_SET"), Some(false)),
        "{b}"
    );
    assert_eq!(b["restored_here"].as_bool(), Some(true), "{b}");
    let listed: Vec<String> = restored.nodes().into_iter().map(|n| n.node_id).collect();
    for id in &ids {
        assert!(listed.contains(id), "{id} in {listed:?}");
    }
    // Polled with a deadline; on a timeout the last report says which
    // invariant did not hold.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = restored.cli(&["check"]);
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restored plane's invariants did not hold within 60s:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(backup_states_held(&restored.cli(&["check", "--json"])));
}

/// Whether `check --json` says every backup state is legal, having
/// checked some.
fn backup_states_held(out: &Output) -> bool {
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("check --json");
    let bk = all
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "BK")
        .expect("the backup invariant");
    bk["checked"].as_u64().unwrap() > 0 && bk["violations"].as_array().unwrap().is_empty()
}

#[test]
fn a_set_taken_while_a_fleet_runs_restores_into_a_fresh_plane_on_sqlite() {
    a_set_taken_while_a_fleet_runs_restores_into_a_fresh_plane(false);
}

#[test]
fn a_set_taken_while_a_fleet_runs_restores_into_a_fresh_plane_on_postgres() {
    a_set_taken_while_a_fleet_runs_restores_into_a_fresh_plane(true);
}

fn a_create_killed_at_each_point_fails_at_the_next_start(postgres: bool) {
    let d = tempfile::tempdir().unwrap();
    let plane = Plane::new(d.path().join("plane"), postgres);
    // The first start makes the CA and keys.
    let mut server = plane.serve().unwrap();
    server.proc.stop();
    for point in [
        "backup-after-row",
        "backup-after-store",
        "backup-after-keys",
        "backup-after-manifest",
    ] {
        let mut p = plane.paused(&["backup", "create"], point);
        p.kill();
        let creating: Vec<serde_json::Value> = plane
            .backups()
            .into_iter()
            .filter(|b| b["state"] == "CREATING")
            .collect();
        assert_eq!(creating.len(), 1, "{point}: {creating:?}");
        let id = creating[0]["id"].as_str().unwrap().to_string();
        let dir = PathBuf::from(creating[0]["location"].as_str().unwrap());

        // The next start of serve reconciles it.
        server.start_again().unwrap();
        let b = plane.backup(&id);
        assert_eq!(
            (
                b["state"].as_str(),
                b["reason"].as_str(),
                b["restore_eligible"].as_bool()
            ),
            (Some("FAILED"), Some("MANIFEST_INCOMPLETE"), Some(false)),
            "{point}"
        );
        let s_ = plane.store();
        let audit = s_.block(s_.store.audit_snapshot()).unwrap().audit;
        assert!(
            audit.iter().any(|a| a.kind == "backup"
                && a.detail.contains(&id)
                && a.detail.contains("FAILED")),
            "{point}: the move is audited"
        );
        drop(s_);
        assert!(
            backup_states_held(&server.cli(&["check", "--json"])),
            "{point}"
        );
        server.proc.stop();
        // No restore takes it.
        let fresh = Plane::new(d.path().join(format!("fresh-{point}")), false);
        let e = fresh.fails(&["backup", "restore", s(&dir)]);
        assert!(
            e.contains("MANIFEST_INCOMPLETE") && e.contains("not restore eligible"),
            "{point}: {e}"
        );
        assert!(!fresh.dir.join("ca.key").exists());
    }
}

#[test]
fn a_create_killed_at_each_point_fails_at_the_next_start_on_sqlite() {
    a_create_killed_at_each_point_fails_at_the_next_start(false);
}

#[test]
fn a_create_killed_at_each_point_fails_at_the_next_start_on_postgres() {
    a_create_killed_at_each_point_fails_at_the_next_start(true);
}

fn a_restore_killed_mid_phase_needs_the_operator(postgres: bool) {
    let d = tempfile::tempdir().unwrap();
    let src = Plane::new(d.path().join("src"), postgres);
    let server = src.serve().unwrap();
    let (id, set) = src.create();
    drop(server);
    for (point, phase, act) in [
        ("restore-after-keys", "keys-restored", "--resume"),
        ("restore-after-store", "store-restored", "--abandon"),
    ] {
        let dst = Plane::new(d.path().join(point), postgres);
        let mut p = dst.paused(&["backup", "restore", s(&set)], point);
        p.kill();
        let e = dst.serve().unwrap_err().to_string();
        assert!(
            e.contains("MANUAL_INTERVENTION_REQUIRED") && e.contains(phase) && e.contains(act),
            "{point}: {e}"
        );
        let e = dst.fails(&["backup", "restore", s(&set)]);
        assert!(
            e.contains("MANUAL_INTERVENTION_REQUIRED") && e.contains(phase),
            "{e}"
        );
        let said = dst.ok(&["backup", "restore", act]);
        if act == "--resume" {
            assert!(said.contains(&id), "{said}");
        } else {
            assert!(said.contains("abandoned") && said.contains(phase), "{said}");
        }
        let mut server = dst.serve().unwrap();
        server.proc.stop();
    }
}

#[test]
fn a_restore_killed_mid_phase_needs_the_operator_on_sqlite() {
    a_restore_killed_mid_phase_needs_the_operator(false);
}

#[test]
fn a_restore_killed_mid_phase_needs_the_operator_on_postgres() {
    a_restore_killed_mid_phase_needs_the_operator(true);
}

#[test]
fn a_tampered_set_and_a_running_plane_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let src = Plane::new(d.path().join("src"), false);
    let server = src.serve().unwrap();
    let (_, set) = src.create();
    // Into a plane that runs: refused, saying what to do.
    let e = src.fails(&["backup", "restore", s(&set)]);
    assert!(e.contains("stop every better-compute serve"), "{e}");
    drop(server);

    let nodes = set.join("store/nodes.jsonl");
    let mut text = std::fs::read(&nodes).unwrap();
    text.extend_from_slice(b"[]\n");
    std::fs::write(&nodes, text).unwrap();
    let dst = Plane::new(d.path().join("dst"), false);
    let e = dst.fails(&["backup", "restore", s(&set)]);
    assert!(
        e.contains("backup file store/nodes.jsonl does not match its manifest"),
        "{e}"
    );
    // Nothing was written.
    assert!(!dst.dir.join("ca.key").exists());
    assert!(!dst.dir.join("restore.journal").exists());
}
