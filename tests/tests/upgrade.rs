//! A/B self-update end to end, with real binaries: the static bcd as the
//! installed release, copies of it as new releases (they claim the old
//! version: the version a binary reports decides nothing), and small C
//! programs built here as releases that crash at start or never connect.
//! Each node runs under `bcd supervise`, as a ramdisk's init or a unit
//! would run it.
#![allow(clippy::disallowed_methods)]

use bc_store::NodeId;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bc_tests::hostile::Hostile;
use bc_tests::{Node, Server, fleet, stderr, wait_for};
use bcd_proto::v1::{self, node_message::Msg as N, server_message::Msg as S};

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// A new release's deadline for the key holder's confirmation, and the supervisor's
/// grace past it (the defaults are 120 s and 30 s).
const CONFIRM_WITHIN: &str = "4s";
const GRACE: &str = "1s";

fn supervise(node: &mut Node) {
    node.supervise(
        &["--restart-delay", "200ms", "--grace", GRACE],
        &["--confirm-within", CONFIRM_WITHIN],
    );
}

/// A joined node running under `bcd supervise`, connected.
fn supervised(f: &bc_tests::Fleet, name: &str) -> (Node, String) {
    let mut node = f.node(name);
    let id = node.id();
    supervise(&mut node);
    wait_connected(&f.server, &id);
    (node, id)
}

/// A release that aborts at start.
fn crasher(f: &bc_tests::Fleet) -> std::path::PathBuf {
    f.c_program(
        "crasher",
        "#include <stdlib.h>\nint main(void) { abort(); }\n",
    )
}

fn wait_connected(server: &Server, id: &str) {
    server.wait_node(id, "connected", |n| n.state == "connected");
}

fn link(node: &Node) -> String {
    std::fs::read_link(node.dir.join("slots/current"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn update_state(node: &Node) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(node.dir.join("slots/update.json")).unwrap()).unwrap()
}

fn node_json(server: &Server, id: &str) -> serde_json::Value {
    let out = server.cli(&["nodes", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == id)
        .cloned()
        .unwrap()
}

/// Results the node sent for a command, as `command.finished` events.
fn finished_events(server: &Server, cmd: &str) -> usize {
    let node = server.command(cmd).node_id;
    let store = server.store();
    store
        .block(store.store.node_events(&NodeId::from(&node)))
        .unwrap()
        .iter()
        .filter(|e| e.kind == "command.finished" && String::from_utf8_lossy(&e.body).contains(cmd))
        .count()
}

fn upgrade(server: &Server, node: &str, sequence: u64) -> bc_tests::CommandView {
    let id = server.run_command(node, "daemon.upgrade", &[&sequence.to_string()]);
    wait_for(Duration::from_secs(90), "the upgrade to finish", || {
        Some(server.command(&id)).filter(|c| c.is_terminal())
    })
}

#[test]
fn a_good_release_confirms_raises_the_floor_and_older_binaries_are_refused() {
    let f = fleet();
    let (mut node, id) = supervised(&f, "n1");
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);

    let started = Instant::now();
    let c = upgrade(&f.server, &id, 2);
    assert_eq!(c.state, "succeeded", "{c:?}\n{}", node.proc().log());
    assert!(c.output.contains("confirmed"), "{}", c.output);
    eprintln!("daemon.upgrade to confirmed: {:?}", started.elapsed());
    assert_eq!(link(&node), "b");
    let state = update_state(&node);
    assert_eq!(state["floor"], 2);
    assert!(state["pending"].is_null());
    // The version reported is the release `current` holds (the binary
    // itself claims the installed version).
    let n = wait_for(
        Duration::from_secs(10),
        "the new floor on the server",
        || Some(node_json(&f.server, &id)).filter(|n| n["release_floor"] == 2),
    );
    assert_eq!(n["agent_version"], "0.2.0");
    assert_eq!(finished_events(&f.server, &c.command_id), 1);

    // An older release is refused after confirmation, before any download.
    f.release(&f.bcd_release("0.1.5"), "0.1.5", 1);
    let c = upgrade(&f.server, &id, 1);
    assert_eq!(c.state, "failed");
    assert!(
        c.reason.contains("at or below the release floor 2"),
        "{c:?}"
    );
    assert_eq!(link(&node), "b", "nothing switched");

    // The old binary in the other slot is refused too: pointed at by hand,
    // it will not run.
    node.proc().stop();
    std::fs::remove_file(node.dir.join("slots/current")).unwrap();
    std::os::unix::fs::symlink("a", node.dir.join("slots/current")).unwrap();
    let out = Command::new(node.dir.join("slots/current/bcd"))
        .args(["node", "--data-dir"])
        .arg(&node.dir)
        .args(["--host-root", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("below the release floor 2"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_release_that_crashes_at_start_is_swapped_back_and_fails_once() {
    let f = fleet();
    let (mut node, id) = supervised(&f, "n1");
    let crasher = crasher(&f);
    f.release(&crasher, "0.2.0-bad", 2);

    let started = Instant::now();
    let c = upgrade(&f.server, &id, 2);
    assert_eq!(c.state, "failed", "{c:?}\n{}", node.proc().log());
    assert_eq!(c.reason, "update-failed");
    eprintln!(
        "failed start to the old version reporting: {:?}",
        started.elapsed()
    );
    assert_eq!(link(&node), "a");
    let state = update_state(&node);
    assert_eq!(state["failed"], serde_json::json!([2]));
    assert_eq!(state["floor"], 0);
    wait_connected(&f.server, &id);
    // Reported exactly once, and never tried again.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(finished_events(&f.server, &c.command_id), 1);
    let again = upgrade(&f.server, &id, 2);
    assert_eq!(again.state, "failed");
    assert!(again.reason.contains("not tried again"), "{again:?}");
    assert_eq!(link(&node), "a");
}

#[test]
fn a_release_that_never_connects_is_swapped_back_by_the_supervisor() {
    let f = fleet();
    let (mut node, id) = supervised(&f, "n1");
    let hanger = f.c_program(
        "hanger",
        "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
    );
    f.release(&hanger, "0.2.0-hangs", 2);
    let c = upgrade(&f.server, &id, 2);
    assert_eq!(c.state, "failed", "{c:?}\n{}", node.proc().log());
    assert_eq!(c.reason, "update-failed");
    assert_eq!(link(&node), "a");
    assert!(
        node.proc()
            .log()
            .contains("unconfirmed past the helper's deadline"),
        "{}",
        node.proc().log()
    );
    assert_eq!(finished_events(&f.server, &c.command_id), 1);
}

/// A supervised node on the test build, upgraded to release 2 (the static
/// bcd tagged `tag`): the daemon dies right after switching, and the
/// supervisor waits 3 s before starting the new binary (which has 8 s to
/// confirm), time for the test to take the server away. Returns the node
/// and the upgrade command, once the link names the new slot.
fn switched_with_time_to_spare(f: &bc_tests::Fleet, tag: &str) -> (Node, String) {
    let mut node = f.node_with("n1", bc_tests::bin("bcd"));
    let id = node.id();
    node.env = vec![("BCD_CRASH_AT".into(), "after-switch".into())];
    node.supervise(
        &["--restart-delay", "3s", "--grace", "30s"],
        &["--confirm-within", "8s"],
    );
    wait_connected(&f.server, &id);
    f.release(&f.bcd_release(tag), "0.2.0", 2);
    let cmd = f.server.run_command(&id, "daemon.upgrade", &["2"]);
    wait_for(Duration::from_secs(30), "the switch", || {
        (link(&node) == "b").then_some(())
    });
    (node, cmd)
}

/// The new release is our own code, claiming the installed version; it
/// gets no Welcome (the server is stopped while it starts). Its own
/// watchdog swaps it back by the link and the pending record, whatever it
/// claims to be, and the old binary reports the failure once.
///
/// The installed binary is the test build (failpoints armed, so it dies
/// right after the switch); the release it switches to is the static
/// release build, which has no failpoints.
#[test]
fn a_binary_claiming_the_old_version_does_not_disarm_the_watchdog() {
    let f = fleet();
    let (mut node, cmd) = switched_with_time_to_spare(&f, "0.2.0-liar");
    f.server.proc.signal(rustix::process::Signal::STOP);
    wait_for(Duration::from_secs(30), "the swap back", || {
        (link(&node) == "a").then_some(())
    });
    f.server.proc.signal(rustix::process::Signal::CONT);
    let c = f.server.wait_command(&cmd);
    assert_eq!(c.state, "failed", "{c:?}\n{}", node.proc().log());
    assert_eq!(c.reason, "update-failed");
    assert!(
        node.proc()
            .log()
            .contains("not confirmed by the key holder before the deadline"),
        "{}",
        node.proc().log()
    );
    assert_eq!(update_state(&node)["failed"], serde_json::json!([2]));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(finished_events(&f.server, &cmd), 1);
}

/// A new release is welcomed by a gateway that holds the serving key and
/// the store but passes nothing on to the key holder: a Welcome confirms
/// nothing. With no receipt of its report by the deadline the new binary
/// is swapped back, raises no floor and rotates nothing; the old one
/// reports the upgrade failed once the honest server is back.
///
/// The installed binary is the test build, armed to die right after the
/// switch, as in the test above.
#[test]
fn a_welcome_without_the_key_holders_receipt_confirms_no_upgrade() {
    let mut f = fleet();
    let (mut node, cmd) = switched_with_time_to_spare(&f, "0.2.0");
    f.server.proc.stop();
    let mut h = Hostile::start(&f.server.dir, f.server.addr).expect("hostile gateway");
    // The new binary's session: welcomed, its report received and
    // acknowledged, and kept from the store.
    let s = h.next_session(Duration::from_secs(30));
    s.welcome(s.hello.last_epoch + 1, now_ms(), &[]);
    let report = s.recv_until(
        Duration::from_secs(20),
        "the release's report",
        |m| match m {
            N::Events(b) => b
                .events
                .iter()
                .find(|e| e.kind == "security.release.running")
                .cloned(),
            _ => None,
        },
    );
    assert!(
        String::from_utf8_lossy(&report.body).contains(&cmd),
        "{report:?}"
    );
    s.send(S::EventAck(v1::EventAck { up_to: report.id }));
    wait_for(Duration::from_secs(30), "the swap back", || {
        (link(&node) == "a").then_some(())
    });
    drop(s);
    h.stop();
    assert!(
        node.proc()
            .log()
            .contains("not confirmed by the key holder before the deadline"),
        "{}",
        node.proc().log()
    );
    assert_eq!(update_state(&node)["floor"], 0);
    f.server.start_again().expect("the server starts again");
    let c = f.server.wait_command(&cmd);
    assert_eq!(c.state, "failed", "{c:?}\n{}", node.proc().log());
    assert_eq!(c.reason, "update-failed");
    let state = update_state(&node);
    assert_eq!(state["floor"], 0, "{state}");
    assert_eq!(state["failed"], serde_json::json!([2]));
}

#[test]
fn bad_releases_are_refused_before_anything_switches() {
    let f = fleet();
    let (node, id) = supervised(&f, "n1");
    let binary = f.bcd_release("0.2.0");
    let manifest = f.sign(&binary, "0.2.0", 2);
    // The verified release, registered with half its binary: what a
    // compromised store could hand out. The node's own hash check refuses
    // it.
    let signed = std::fs::read(&manifest).unwrap();
    let m = release::SignedManifest::parse(&signed)
        .unwrap()
        .verify(&[f.public_key()])
        .unwrap();
    let bytes = std::fs::read(&binary).unwrap();
    let store = f.server.store();
    store
        .block(
            store
                .store
                .register_release(&bc_store::releases::NewRelease {
                    sequence: bc_store::ReleaseSeq::new(m.sequence),
                    version: m.version,
                    target: m.target,
                    size: m.size,
                    sha256: m.sha256,
                    key_id: release::SignedManifest::parse(&signed).unwrap().key_id,
                    signed_manifest: signed,
                    binary: bytes[..bytes.len() / 2].to_vec(),
                }),
        )
        .unwrap();
    let c = upgrade(&f.server, &id, 2);
    assert_eq!(c.state, "failed");
    assert!(c.reason.contains("manifest says"), "{c:?}");
    assert!(!node.dir.join("slots/current").exists() || link(&node) == "a");
    // A sequence the server does not have.
    let c = upgrade(&f.server, &id, 9);
    assert_eq!(c.state, "failed");
    assert!(c.reason.contains("did not hand out release 9"), "{c:?}");
    wait_connected(&f.server, &id);
}

#[test]
fn a_rollout_halts_on_its_failure_budget_and_a_good_one_completes() {
    let f = fleet();
    let mut nodes: Vec<Node> = (0..4).map(|i| f.node(&format!("n{i}"))).collect();
    for n in &mut nodes {
        supervise(n);
    }
    for n in &nodes {
        wait_connected(&f.server, &n.id());
    }
    let crasher = crasher(&f);
    f.release(&crasher, "0.2.0-bad", 2);
    let out = f.server.cli(&[
        "rollouts",
        "start",
        "2",
        "--waves",
        "25%,50%,100%",
        "--max-failures",
        "0",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rollout = r["id"].as_str().unwrap().to_string();
    let status = |id: &str| -> serde_json::Value {
        let out = f.server.cli(&["rollouts", "status", id, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // --watch follows it to its end and exits 1 when it halts.
    let watched = f
        .server
        .cli(&["rollouts", "status", &rollout, "--watch", "--json"]);
    assert_eq!(watched.status.code(), Some(1), "{}", stderr(&watched));
    assert!(
        stderr(&watched).contains(&format!("rollout {rollout} halted: the failure budget")),
        "{}",
        stderr(&watched)
    );
    assert!(
        stderr(&watched).contains("1/4 settled, halted wave 1/3"),
        "a line per change when stderr is not a terminal: {}",
        stderr(&watched)
    );
    let s: serde_json::Value = serde_json::from_slice(&watched.stdout).unwrap();
    assert_eq!(s["state"], "halted", "{s}");
    assert!(s["reason"].as_str().unwrap().contains("failure budget"));
    let statuses: Vec<&str> = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["failed", "waiting", "waiting", "waiting"]);
    // Halted means halted: nothing more is issued.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(status(&rollout)["nodes"][1]["status"], "waiting");
    let text = f.server.cli(&["rollouts", "status", &rollout]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("failed 1 (budget 0)"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    let out = f.server.cli(&["rollouts", "abort", &rollout, "--rollback"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Roll forward with a good release: every wave, every node.
    f.release(&f.bcd_release("0.3.0"), "0.3.0", 3);
    let out = f
        .server
        .cli(&["rollouts", "start", "3", "--waves", "25%,100%", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rollout = r["id"].as_str().unwrap().to_string();
    let watched = f
        .server
        .cli(&["rollouts", "status", &rollout, "--watch", "--json"]);
    assert!(watched.status.success(), "{}", stderr(&watched));
    let s: serde_json::Value = serde_json::from_slice(&watched.stdout).unwrap();
    assert_eq!(s["state"], "done", "{s}");
    for n in s["nodes"].as_array().unwrap() {
        assert_eq!(n["status"], "confirmed", "{s}");
    }
    for n in &nodes {
        assert_eq!(update_state(n)["floor"], 3);
    }
}

/// A rollout mid-wave when the control plane crashes resumes from its
/// recorded state after the restart: every node upgraded once, no command
/// issued twice.
#[test]
fn a_rollout_resumes_after_the_control_plane_crashes_mid_wave() {
    let mut f = fleet();
    let mut nodes: Vec<Node> = (0..3).map(|i| f.node(&format!("r{i}"))).collect();
    for n in &mut nodes {
        supervise(n);
    }
    for n in &nodes {
        wait_connected(&f.server, &n.id());
    }
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let out = f
        .server
        .cli(&["rollouts", "start", "2", "--waves", "34%,100%", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rollout = r["id"].as_str().unwrap().to_string();
    let status = |server: &Server| -> serde_json::Value {
        let out = server.cli(&["rollouts", "status", &rollout, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The first wave has its command: crash the control plane there.
    wait_for(Duration::from_secs(60), "the first wave's command", || {
        let s = status(&f.server);
        s["nodes"]
            .as_array()?
            .iter()
            .any(|n| n["status"] != "waiting")
            .then_some(())
    });
    f.server.crash_restart().unwrap();
    let s = wait_for(Duration::from_secs(120), "the rollout to finish", || {
        Some(status(&f.server)).filter(|s| s["state"] != "running")
    });
    if s["state"] != "done" {
        let logs: Vec<String> = nodes.iter_mut().map(|n| n.proc().log()).collect();
        panic!("{s}\n{}", logs.join("\n-----\n"));
    }
    for n in &nodes {
        let upgrades: Vec<_> = f
            .server
            .commands(&n.id())
            .into_iter()
            .filter(|c| c.kind == "daemon.upgrade")
            .collect();
        assert_eq!(upgrades.len(), 1, "{upgrades:?}");
        assert_eq!(upgrades[0].state, "succeeded", "{upgrades:?}");
        assert_eq!(update_state(n)["floor"], 2);
    }
}

/// Two key-holding gateways on one PostgreSQL store, the rollout
/// controller's lease on gw-a: gw-a is killed (SIGKILL) with the first
/// wave's upgrade issued, gw-b takes the lease over and finishes the
/// rollout from the store's record: every node upgraded once, no command
/// issued twice, and the rollout done.
#[test]
fn a_rollout_taken_over_mid_wave_is_finished_by_the_next_holder() {
    let url = bc_tests::postgres_database("rollover");
    let f = bc_tests::fleet_on(Some(&url), &["--gateway-id", "gw-a"]);
    let public = std::fs::read_to_string(f.key.with_extension("key.pub")).unwrap();
    wait_for(
        Duration::from_secs(20),
        "gw-a to hold the rollout controller",
        || {
            f.server
                .proc
                .log()
                .contains(
                    "holding the controller lease; running it lease=controller:rollouts owner=gw-a",
                )
                .then_some(())
        },
    );
    let mut args = bc_tests::FAST.to_vec();
    args.extend(["--release-pubkey", public.trim(), "--gateway-id", "gw-b"]);
    let b = Server::start_postgres(&f.server.dir, &url, &args).unwrap();
    let front = bc_tests::Front::new();
    front.set("gw-a", Some(f.server.addr));
    front.set("gw-b", Some(b.addr));
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            let mut node = Node::new(&f.d.path().join(format!("t{i}")), 0);
            node.host_root = Some(std::path::PathBuf::from("/"));
            node.binary = Some(bc_tests::static_bcd());
            let out = node.join(&front.url(), &b.token(1));
            assert!(out.status.success(), "join: {}", stderr(&out));
            node
        })
        .collect();
    for n in &mut nodes {
        supervise(n);
    }
    for n in &nodes {
        wait_connected(&b, &n.id());
    }
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let out = f
        .server
        .cli(&["rollouts", "start", "2", "--waves", "33%,100%", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rollout = r["id"].as_str().unwrap().to_string();
    let status = |server: &Server| -> serde_json::Value {
        let out = server.cli(&["rollouts", "status", &rollout, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The first wave's upgrade is issued and the second wave's are not:
    // gw-a dies there, with the lease.
    let s = wait_for(Duration::from_secs(60), "the first wave's command", || {
        let s = status(&f.server);
        let issued = s["nodes"]
            .as_array()?
            .iter()
            .filter(|n| n["status"] != "waiting")
            .count();
        (issued >= 1).then_some(s)
    });
    let mut a = f.server;
    a.proc.kill();
    front.set("gw-a", None);
    let waiting = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["status"] == "waiting")
        .count();
    assert_eq!(waiting, 2, "killed mid-wave, before the second wave: {s}");
    let s = wait_for(
        Duration::from_secs(120),
        "gw-b to finish the rollout",
        || Some(status(&b)).filter(|s| s["state"] != "running"),
    );
    if s["state"] != "done" {
        let logs: Vec<String> = nodes.iter_mut().map(|n| n.proc().log()).collect();
        panic!("{s}\n{}\n{}", b.proc.log(), logs.join("\n-----\n"));
    }
    assert!(
        b.proc.log().contains(
            "holding the controller lease; running it lease=controller:rollouts owner=gw-b"
        ),
        "{}",
        b.proc.log()
    );
    for n in &nodes {
        let upgrades: Vec<_> = b
            .commands(&n.id())
            .into_iter()
            .filter(|c| c.kind == "daemon.upgrade")
            .collect();
        assert_eq!(upgrades.len(), 1, "{upgrades:?}");
        assert_eq!(upgrades[0].state, "succeeded", "{upgrades:?}");
        assert_eq!(update_state(n)["floor"], 2);
    }
}

#[test]
fn aborting_cancels_upgrades_not_yet_dispatched() {
    let f = fleet();
    let mut live = f.node("live");
    let offline = f.node("offline");
    supervise(&mut live);
    wait_connected(&f.server, &live.id());
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let out = f.server.cli(&[
        "rollouts",
        "start",
        "2",
        "--selector",
        &format!("node={}", offline.id()),
        "--waves",
        "100%",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rollout = r["id"].as_str().unwrap().to_string();
    let cmd = wait_for(Duration::from_secs(10), "the upgrade command", || {
        let out = f.server.cli(&["rollouts", "status", &rollout, "--json"]);
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        s["nodes"][0]["command_id"]
            .as_str()
            .filter(|c| !c.is_empty())
            .map(String::from)
    });
    let out = f.server.cli(&["rollouts", "abort", &rollout, "--rollback"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c = f.server.command(&cmd);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("expired", "rollout-aborted")
    );
    let out = f.server.cli(&["rollouts", "status", &rollout, "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["state"], "aborted");
    assert_eq!(s["nodes"][0]["status"], "cancelled");
    // A second rollout may start once this one is over.
    let out = f.server.cli(&["rollouts", "start", "2", "--waves", "100%"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Both flavours of the systemd units verify (root mode, and the
/// unprivileged daemon beside its helper with the root rollback unit), and
/// their bcd command lines parse and run.
#[test]
fn the_systemd_units_verify() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bcd/bin/systemd");
    let bcd = bc_tests::bin("bcd");
    for (flavour, dirs, want) in [
        (
            "root",
            vec![units.clone()],
            vec![
                "bcd-rollback.service",
                "bcd-watchdog.service",
                "bcd-watchdog.timer",
                "bcd.service",
            ],
        ),
        (
            "unprivileged",
            vec![units.join("unprivileged"), units.clone()],
            vec!["bcd-helper.service", "bcd-rollback.service", "bcd.service"],
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        let mut names = Vec::new();
        for dir in dirs {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if !path.is_file() {
                    continue;
                }
                let name = path.file_name().unwrap().to_str().unwrap().to_string();
                // The flavour's own file wins; the rest come from root mode.
                if names.contains(&name) || !want.contains(&name.as_str()) {
                    continue;
                }
                let text = std::fs::read_to_string(&path)
                    .unwrap()
                    .replace("/usr/bin/bcd", bcd.to_str().unwrap())
                    .replace("/var/lib/bcd", data.to_str().unwrap());
                for line in text.lines() {
                    let Some(cmd) = line.strip_prefix("ExecStart=") else {
                        continue;
                    };
                    let args: Vec<&str> = cmd.split_whitespace().collect();
                    if cmd.contains(" rollback ") {
                        // Every rollback line runs here (and finds nothing
                        // to roll back).
                        let args: Vec<&str> = args
                            .iter()
                            .copied()
                            .take_while(|a| *a != "--restart-unit")
                            .collect();
                        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
                        assert!(out.status.success(), "{cmd}: {}", stderr(&out));
                        assert!(
                            String::from_utf8_lossy(&out.stdout).contains("nothing to roll back")
                        );
                    } else {
                        // The daemon's and the helper's lines parse.
                        let mut c = Command::new(args[0]);
                        c.args(&args[1..]);
                        assert_parses(c, cmd);
                    }
                }
                std::fs::write(d.path().join(&name), text).unwrap();
                names.push(name);
            }
        }
        names.sort();
        assert_eq!(names, want, "{flavour}");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .args(names.iter().map(|n| format!("./{n}")))
            .current_dir(d.path())
            .output()
            .expect("systemd-analyze is missing: apt-get install systemd (scripts/test does)");
        assert!(out.status.success(), "{flavour}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{flavour}: no warnings either");
    }
}

/// A command line that clap accepts: run with a bad extra argument, it
/// fails on that argument and nothing before it.
fn assert_parses(mut c: Command, line: &str) {
    let out = c.arg("--no-such-flag-here").output().unwrap();
    let err = stderr(&out);
    assert!(
        err.contains("unexpected argument '--no-such-flag-here'"),
        "{line}: {err}"
    );
}

/// A full disk while the new release is written: the command fails with
/// the reason, nothing switches, and the node keeps running its release.
#[test]
fn a_full_disk_while_writing_the_slot_switches_nothing() {
    let f = fleet();
    let mut node = f.node("n1");
    let id = node.id();
    // Room for slot a (the running binary) and the state, not for slot b.
    let slots = node.dir.join("slots");
    std::fs::create_dir_all(&slots).unwrap();
    let size = std::fs::metadata(bc_tests::static_bcd()).unwrap().len() * 3 / 2;
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&slots)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mounting a small tmpfs needs root (CAP_SYS_ADMIN): {}",
        stderr(&out)
    );
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(slots.clone());
    supervise(&mut node);
    wait_connected(&f.server, &id);
    f.release(&f.bcd_release("0.2.0"), "0.2.0", 2);
    let c = upgrade(&f.server, &id, 2);
    assert_eq!(c.state, "failed", "{c:?}");
    assert!(
        c.reason.contains("cannot write slot b") && c.reason.contains("No space left"),
        "{c:?}"
    );
    assert_eq!(link(&node), "a");
    assert!(update_state(&node)["pending"].is_null());
    let leftovers: Vec<_> = std::fs::read_dir(slots.join("b"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "no partial files: {leftovers:?}");
    // Still the same process, still connected.
    wait_connected(&f.server, &id);
    node.proc().stop();
}

/// A release signed with the current key rotates the release key: once it
/// confirms, the node installs only releases signed with the new key.
#[test]
fn a_release_rotates_the_release_key() {
    let mut f = fleet();
    let next = f.d.path().join("next.key");
    let out = Command::new(bc_tests::bin("better-compute"))
        .args(["releases", "keygen", "--out"])
        .arg(&next)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let next_pub = f.d.path().join("next.key.pub");
    let next_hex = std::fs::read_to_string(&next_pub)
        .unwrap()
        .trim()
        .to_string();
    let mut node = f.node("n1");
    let id = node.id();
    let first = node.identity()["release_keys"].clone();
    supervise(&mut node);
    wait_connected(&f.server, &id);

    let key = f.key.clone();
    f.release_with(&f.bcd_release("0.2.0"), "0.2.0", 2, &key, Some(&next_pub));
    let c = upgrade(&f.server, &id, 2);
    assert_eq!(c.state, "succeeded", "{c:?}");
    assert!(c.output.contains("release key is rotated"), "{}", c.output);
    assert_eq!(
        node.identity()["release_keys"],
        serde_json::json!([next_hex])
    );
    assert_ne!(node.identity()["release_keys"], first);

    // The server learns the new key too; the old one stays registered there.
    f.server
        .args
        .extend(["--release-pubkey".into(), next_hex.clone()]);
    f.server.restart().unwrap();
    wait_connected(&f.server, &id);
    f.release_with(&f.bcd_release("0.3.0"), "0.3.0", 3, &next, None);
    let c = upgrade(&f.server, &id, 3);
    assert_eq!(c.state, "succeeded", "{c:?}");
    // A release signed with the retired key is refused by the node.
    f.release_with(&f.bcd_release("0.4.0"), "0.4.0", 4, &key, None);
    let c = upgrade(&f.server, &id, 4);
    assert_eq!(c.state, "failed");
    assert!(
        c.reason.contains("not a release key of this fleet"),
        "{c:?}"
    );
}

/// `rollouts start --waves` as an operator mistypes it: a wave that is no
/// percentage is a usage error naming it, waves that fall or stop short of
/// 100% are refused with an example, and nothing is started.
#[test]
fn mistyped_waves_are_refused_before_a_rollout_starts() {
    let d = tempfile::tempdir().unwrap();
    let server = bc_tests::Server::start(&d.path().join("server"), &[]).unwrap();
    let start = |waves: &str| server.cli(&["rollouts", "start", "1", "--waves", waves]);
    let typo = start("10%,x");
    assert_eq!(typo.status.code(), Some(2), "{}", bc_tests::stderr(&typo));
    assert!(
        bc_tests::stderr(&typo).contains("\"x\" is not a percentage: e.g. 1%,10%,50%,100%"),
        "{}",
        bc_tests::stderr(&typo)
    );
    for (waves, says) in [
        ("50%,10%,100%", "the waves must rise, from above 0% to 100%"),
        ("10%,50%", "the waves must end at 100%"),
    ] {
        let out = start(waves);
        assert!(!out.status.success(), "{waves} was taken");
        assert!(
            bc_tests::stderr(&out).contains(says),
            "{waves}: {}",
            bc_tests::stderr(&out)
        );
    }
    let status = server.cli(&["rollouts", "status"]);
    assert!(
        !status.status.success(),
        "a rollout exists: {}",
        String::from_utf8_lossy(&status.stdout)
    );
    println!("{}", bc_tests::stderr(&status));
}
