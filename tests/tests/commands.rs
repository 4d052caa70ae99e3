//! Exactly-once commands, end to end: real server and node processes,
//! crashes injected at every step boundary and kill -9 from outside.
#![allow(clippy::disallowed_methods)]

use bc_store::NodeId;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use bc_tests::{Node, Server, setup, setup_connected, stderr, wait_for};

/// `exec.run` that appends its token to `file`: the side effect's own record.
fn append(server: &Server, node: &str, file: &std::path::Path, token: &str) -> String {
    server.run_command(
        node,
        "exec.run",
        &[
            "/bin/sh",
            "-c",
            &format!("echo \"$0\" >> {}", file.display()),
            token,
        ],
    )
}

#[test]
fn commands_run_and_report_results() {
    let (_d, server, _node, id) = setup_connected(21);
    let c = server.wait_command(&server.run_command(
        &id,
        "exec.run",
        &["/bin/sh", "-c", "echo out; echo err >&2; exit 7"],
    ));
    assert_eq!((c.state.as_str(), c.exit()), ("failed", Some(7)));
    assert_eq!(c.reason, "exit code 7");
    assert!(
        c.output.contains("out") && c.output.contains("err"),
        "{}",
        c.output
    );
    let c = server.wait_command(&server.run_command(&id, "inventory.refresh", &[]));
    assert_eq!(c.state, "succeeded");
    // --wait prints the output and exits with the command's status.
    let out = server.cli(&[
        "commands",
        "run",
        &id,
        "exec.run",
        "--wait",
        "--",
        "/bin/echo",
        "hi",
    ]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    let out = server.cli(&[
        "commands",
        "run",
        &id,
        "exec.run",
        "--wait",
        "--",
        "/bin/false",
    ]);
    assert_eq!(out.status.code(), Some(1));
    // Idempotency: the same key returns the first command.
    let run = |key: &str| {
        let out = server.cli(&[
            "commands",
            "run",
            &id,
            "exec.run",
            "--idempotency-key",
            key,
            "--",
            "/bin/true",
        ]);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(run("k1"), run("k1"));
    assert_ne!(run("k1"), run("k2"));
}

#[test]
fn bad_commands_are_refused_with_clear_errors() {
    let (_d, server, node) = setup(22);
    let id = node.id();
    let err = |args: &[&str]| {
        let out = server.cli(args);
        assert!(!out.status.success(), "{args:?} should fail");
        stderr(&out)
    };
    assert!(
        err(&[
            "commands",
            "run",
            "nd-000000000000",
            "exec.run",
            "--",
            "/bin/true"
        ])
        .contains("no node nd-000000000000")
    );
    assert!(err(&["commands", "run", &id, "rm.rf"]).contains("unknown command kind"));
    assert!(err(&["commands", "run", &id, "exec.run"]).contains("needs a program"));
    assert!(err(&["commands", "run", &id, "node.reboot", "now"]).contains("takes no arguments"));
    let e = err(&["commands", "run", &id, "boot.kexec", "initrd=/x"]);
    assert!(
        e.contains("needs image=ID") && e.contains("or kernel=PATH"),
        "{e}"
    );
    assert!(
        err(&[
            "commands",
            "run",
            &id,
            "exec.run",
            "--not-after",
            "2020-01-01T00:00:00Z",
            "--",
            "/bin/true"
        ])
        .contains("already passed")
    );
    assert!(err(&["commands", "show", "cmd-0000000000000000"]).contains("no command"));
    assert!(server.commands(&id).is_empty(), "nothing was created");
}

#[test]
fn a_command_past_its_deadline_expires_and_never_runs() {
    let (d, server, mut node) = setup(23);
    let id = node.id();
    let file = d.path().join("ran");
    let out = server.cli(&[
        "commands",
        "run",
        &id,
        "exec.run",
        "--not-after",
        "300ms",
        "--",
        "/bin/sh",
        "-c",
        &format!("echo ran >> {}", file.display()),
    ]);
    let cmd = String::from_utf8(out.stdout).unwrap().trim().to_string();
    // The node is offline; the sweeper expires the pending command.
    let c = server.wait_command(&cmd);
    assert_eq!(c.state, "expired");
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let c2 = server.wait_command(&server.run_command(&id, "exec.run", &["/bin/true"]));
    assert_eq!(c2.state, "succeeded");
    assert!(!file.exists(), "an expired command never runs");
}

#[test]
fn a_node_killed_mid_command_reports_interrupted_and_never_reruns() {
    let (d, server, mut node, id) = setup_connected(24);
    let file = d.path().join("count");
    let cmd = server.start_marked_command(&id, &file, "sleep 30");
    node.proc().kill();
    node.start();
    let c = server.wait_command(&cmd);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("failed", "interrupted")
    );
    let starts = std::fs::read_to_string(&file).unwrap();
    assert_eq!(starts.lines().count(), 1, "ran once: {starts}");
}

#[test]
fn a_server_restart_mid_command_loses_nothing() {
    let (d, mut server, _node, id) = setup_connected(25);
    let file = d.path().join("count");
    let cmd = server.start_marked_command(&id, &file, "sleep 1; echo done");
    server.crash_restart().unwrap();
    let c = server.wait_command(&cmd);
    assert_eq!(c.state, "succeeded");
    assert_eq!(c.output, "done\n");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 1);
    assert!(c.epoch >= 2, "finished under the new session");
}

#[test]
fn reboot_is_reported_rebooted_exactly_once() {
    let (_d, server, mut node) = setup(26);
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");
    let c = server.wait_command(&server.run_command(&id, "node.reboot", &[]));
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("succeeded", "rebooted")
    );
    // Believed from the node's signed word: its result, or the proof of
    // the Hello that ended it.
    assert!(
        matches!(c.evidence.as_str(), "decided" | "node-signed"),
        "{c:?}"
    );
    let after = server.wait_node(&id, "back after the reboot", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });
    assert_eq!(after.journal_id, before.journal_id);
    assert_eq!(server.commands(&id).len(), 1);
}

#[test]
fn journal_loss_fails_in_flight_commands_with_journal_lost() {
    let (d, server, mut node) = setup(27);
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");
    let file = d.path().join("started");
    let cmd = server.run_long_command(&id, &file);
    node.proc().kill();
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(node.dir.join(f));
    }
    node.start();
    let c = server.wait_command(&cmd);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("failed", "journal-lost")
    );
    // Believed from the proof of the Hello that ended it.
    assert_eq!(c.evidence, "decided", "{c:?}");
    assert!(c.evidence_detail.contains("signed Hello"), "{c:?}");
    let after = server.wait_node(&id, "reconnected", |n| n.state == "connected");
    assert_ne!(after.journal_id, before.journal_id);
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 1);
    // New commands run on the new journal.
    assert_eq!(
        server
            .wait_command(&server.run_command(&id, "exec.run", &["/bin/true"]))
            .state,
        "succeeded"
    );
}

#[test]
fn a_corrupt_journal_is_moved_aside_and_the_node_carries_on() {
    let (_d, server, mut node) = setup(28);
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");
    node.proc().stop();
    for f in ["journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(node.dir.join(f));
    }
    std::fs::write(node.dir.join("journal.db"), vec![0x42; 4096]).unwrap();
    node.start();
    let after = server.wait_node(&id, "reconnected", |n| {
        n.state == "connected" && n.epoch > before.epoch
    });
    assert_ne!(after.journal_id, before.journal_id);
    let aside: Vec<_> = std::fs::read_dir(&node.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("journal.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(node.dir.join(&aside[0])).unwrap(),
        vec![0x42; 4096]
    );
    assert_eq!(
        server
            .wait_command(&server.run_command(&id, "exec.run", &["/bin/true"]))
            .state,
        "succeeded"
    );
}

/// The node's wall clock ten minutes off either way changes nothing: it
/// judges deadlines on server time.
#[test]
fn a_node_clock_ten_minutes_off_still_runs_commands_with_short_deadlines() {
    for offset in ["+10m", "-10m"] {
        let (_d, server, node) = setup(29);
        let id = node.id();
        let log = node.dir.with_extension("faketime.log");
        let lib = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
        assert!(
            std::path::Path::new(lib).exists(),
            "{lib} is missing: apt-get install faketime (scripts/test installs it)"
        );
        // libfaketime in the daemon itself (not the faketime wrapper, which
        // would stand between the test and the process it must kill).
        let child = node
            .bcd(&["node"])
            .env("LD_PRELOAD", lib)
            .env("FAKETIME", offset)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut proc = bc_tests::Proc { child, log };
        server.wait_node(&id, "connected", |n| n.state == "connected");
        let out = server.cli(&[
            "commands",
            "run",
            &id,
            "exec.run",
            "--not-after",
            "30s",
            "--wait",
            "--",
            "/bin/date",
            "+%s",
        ]);
        assert!(
            out.status.success(),
            "{offset}: {}\n{}",
            stderr(&out),
            proc.log()
        );
        let node_now: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        // The program ran under the fake clock (children inherit it).
        assert!(
            (node_now - real).abs() > 500,
            "{offset}: the node's clock was not offset"
        );
        proc.kill();
    }
}

/// Hundreds of crashes: the daemon aborts at random step boundaries
/// (BCD_CRASH_AT) and is killed with SIGKILL from outside, and restarted
/// each time. Afterwards every command has exactly one terminal result and
/// no side effect ran twice.
#[test]
fn exactly_once_through_hundreds_of_crashes() {
    let (d, server, mut node) = setup(30);
    let id = node.id();
    let file = d.path().join("effects");
    const COMMANDS: usize = 150;
    let mut tokens = HashMap::new();
    for i in 0..COMMANDS {
        let token = format!("tok-{i}");
        tokens.insert(append(&server, &id, &file, &token), token);
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut aborts, mut kills) = (0, 0);
    let started = Instant::now();
    while aborts + kills < 300 && started.elapsed() < Duration::from_secs(240) {
        let seed = next();
        let mut cmd = node.bcd(&["node"]);
        cmd.env(
            "BCD_CRASH_AT",
            "after-accept,after-running,mid-effect,after-result,before-ack",
        )
        .env("BCD_CRASH_PROBABILITY", "0.08")
        .env("BCD_CRASH_SEED", seed.to_string())
        .env("BCD_LOG", "warn")
        .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let wait = Duration::from_millis(20 + next() % 400);
        let deadline = Instant::now() + wait;
        let mut exited = None;
        while Instant::now() < deadline {
            if let Some(s) = child.try_wait().unwrap() {
                exited = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        match exited {
            Some(s) => {
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(
                    s.signal(),
                    Some(6),
                    "the daemon only stops by injected abort: {s:?}"
                );
                aborts += 1;
            }
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
            }
        }
    }
    assert!(
        aborts + kills >= 300,
        "only {aborts} aborts and {kills} kills in time"
    );
    assert!(aborts > 20 && kills > 20, "{aborts} aborts, {kills} kills");
    // No more faults: the node finishes everything.
    node.start();
    let commands = wait_for(Duration::from_secs(120), "every command to finish", || {
        let cs = server.commands(&id);
        (cs.len() == COMMANDS && cs.iter().all(|c| c.is_terminal())).then_some(cs)
    });
    let effects = std::fs::read_to_string(&file).unwrap_or_default();
    let mut ran: HashMap<&str, usize> = HashMap::new();
    for line in effects.lines() {
        *ran.entry(line).or_default() += 1;
    }
    let mut states: HashMap<String, usize> = HashMap::new();
    for c in &commands {
        let token = &tokens[&c.command_id];
        let n = ran.get(token.as_str()).copied().unwrap_or(0);
        assert!(n <= 1, "{} ({token}) ran {n} times", c.command_id);
        match c.state.as_str() {
            "succeeded" => assert_eq!(n, 1, "{} succeeded without its effect", c.command_id),
            "failed" => assert_eq!(c.reason, "interrupted", "{c:?}"),
            other => panic!("{} ended {other}: {c:?}", c.command_id),
        }
        *states
            .entry(format!("{} {}", c.state, c.reason))
            .or_default() += 1;
    }
    eprintln!("{aborts} injected aborts, {kills} kills; outcomes: {states:?}");
}

#[test]
fn events_reach_the_server_and_restart_with_a_new_journal() {
    let (_d, server, mut node, id) = setup_connected(31);
    let cmd = server.run_command(&id, "exec.run", &["/bin/true"]);
    server.wait_command(&cmd);
    let store = server.store();
    let events = wait_for(Duration::from_secs(20), "the command's events", || {
        let ev = store
            .block(store.store.node_events(&NodeId::from(&id)))
            .unwrap();
        (ev.iter()
            .filter(|e| String::from_utf8_lossy(&e.body).contains(&cmd))
            .count()
            == 3)
            .then_some(ev)
    });
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.kind.as_str())
        .filter(|k| k.starts_with("command."))
        .collect();
    assert_eq!(
        kinds,
        ["command.accepted", "command.running", "command.finished"]
    );
    // Ids count from 1 in a journal.
    let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    // Acknowledged events leave the node's journal.
    wait_for(
        Duration::from_secs(20),
        "the node to drop acknowledged events",
        || {
            let n: i64 = rusqlite_count(&node.dir.join("journal.db"));
            (n == 0).then_some(())
        },
    );
    // A new journal starts its event ids (and the server's ack) from 1.
    node.proc().stop();
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(node.dir.join(f));
    }
    node.start();
    server.wait_node(&id, "reconnected", |n| {
        n.state == "connected" && n.epoch >= 2
    });
    let cmd2 = server.run_command(&id, "exec.run", &["/bin/true"]);
    server.wait_command(&cmd2);
    let first_journal = events[0].journal_id.clone();
    let events = wait_for(
        Duration::from_secs(20),
        "the second journal's events",
        || {
            let ev: Vec<_> = store
                .block(store.store.node_events(&NodeId::from(&id)))
                .unwrap()
                .into_iter()
                .filter(|e| e.journal_id != first_journal)
                .collect();
            (ev.iter()
                .filter(|e| String::from_utf8_lossy(&e.body).contains(&cmd2))
                .count()
                == 3)
                .then_some(ev)
        },
    );
    let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "a new journal counts from 1"
    );
}

fn rusqlite_count(journal: &std::path::Path) -> i64 {
    let (j, _) = bcd_agent::journal::Journal::open(journal).unwrap();
    j.events_after(0, 100_000).unwrap().len() as i64
}

/// What a compromised control plane could write: commands whose signed
/// bytes are not what a worker key signed for this node. They go into the
/// store through the same method as every command, with their own sealers.
/// The node refuses each and the server records why.
#[test]
fn forged_and_tampered_commands_are_rejected_with_the_reason_recorded() {
    use prost::Message;
    let (d, server, mut node) = setup(32);
    let id = node.id();
    let file = d.path().join("ran");
    let other = Node::new(&d.path().join("other"), 33);
    assert!(other.join(&server.url(), &server.token(1)).status.success());
    let worker_key = std::sync::Arc::new(
        better_compute::pki::worker::load_or_create_worker_key(&server.dir).unwrap(),
    );
    let store = server.store();
    let plant = |tag: &str, seal: bc_store::commands::SealCommand| -> String {
        let new = bc_store::commands::NewCommand {
            node_id: NodeId::from(&id),
            kind: bcd_core::command::Kind::ExecRun,
            summary: tag.to_string(),
            not_after: Duration::from_secs(3600),
            min_generation: 0,
            idempotency_key: None,
        };
        store
            .block(store.store.create_command(&new, seal))
            .unwrap()
            .0
            .id
            .into_string()
    };
    let args = |tag: &str| {
        bcd_proto::v1::command_payload::Args::Exec(bcd_proto::v1::ExecArgs {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("echo \"$0\" >> {}", file.display()),
                tag.into(),
            ],
            timeout_ms: 10_000,
            max_output: 1024,
        })
    };
    // Validly signed, but for another node.
    let (key, a, other_id) = (worker_key.clone(), args("wrong-node"), other.id());
    let wrong_node = plant(
        "wrong-node",
        Box::new(move |c| {
            let mut p = better_compute::pki::seal::command_payload(c, a);
            p.node_id = other_id;
            bcd_proto::sign::seal(&key, p.encode_to_vec())
        }),
    );
    // Signed by a key that is not a worker key of this fleet.
    let a = args("forged");
    let forged = plant(
        "forged",
        Box::new(move |c| {
            let p = better_compute::pki::seal::command_payload(c, a);
            bcd_proto::sign::seal(&bc_tests::foreign_worker_key(), p.encode_to_vec())
        }),
    );
    // The payload changed after signing: another program.
    let (key, a) = (worker_key.clone(), args("tampered"));
    let tampered = plant(
        "tampered",
        Box::new(move |c| {
            let p = better_compute::pki::seal::command_payload(c, a);
            let mut env = bcd_proto::v1::SignedEnvelope::decode(
                bcd_proto::sign::seal(&key, p.encode_to_vec()).as_slice(),
            )
            .unwrap();
            let mut changed =
                bcd_proto::v1::CommandPayload::decode(env.payload.as_slice()).unwrap();
            if let Some(bcd_proto::v1::command_payload::Args::Exec(e)) = &mut changed.args {
                e.program = "/bin/rm".into();
            }
            env.payload = changed.encode_to_vec();
            env.encode_to_vec()
        }),
    );
    drop(store);

    node.start();
    for (cmd, why) in [
        (&forged, "not signed by a worker key"),
        (&tampered, "does not verify"),
        (
            &wrong_node,
            &format!("is for node {}, not this one", other.id()),
        ),
    ] {
        let c = server.wait_command(cmd);
        assert_eq!(c.state, "rejected", "{c:?}");
        assert!(c.reason.contains(why), "{cmd}: {}", c.reason);
    }
    assert!(!file.exists(), "nothing ran");
    // The node goes on with genuine commands.
    assert_eq!(
        server
            .wait_command(&server.run_command(&id, "exec.run", &["/bin/true"]))
            .state,
        "succeeded"
    );
}

#[test]
fn min_generation_and_kexec() {
    let (_d, server, mut node) = setup(34);
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");
    // A command that needs spec generation 1 waits for the node to apply
    // it, and so does the command queued after it.
    let out = server.cli(&[
        "commands",
        "run",
        &id,
        "exec.run",
        "--min-generation",
        "1",
        "--",
        "/bin/true",
    ]);
    let cmd = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let after = server.run_command(&id, "exec.run", &["/bin/true"]);
    // Give dispatch a chance it must not take: the gateway polls every second.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(server.command(&cmd).state, "pending");
    assert_eq!(
        server.command(&after).state,
        "pending",
        "sequence order holds"
    );
    assert!(
        server
            .cli(&["nodes", "assign", &id, "job-a", "--gpus", "0"])
            .status
            .success()
    );
    assert_eq!(server.wait_command(&cmd).state, "succeeded");
    assert_eq!(server.wait_command(&after).state, "succeeded");
    let c = server.wait_command(&server.run_command(
        &id,
        "boot.kexec",
        &["kernel=/boot/vmlinuz", "cmdline=quiet"],
    ));
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("succeeded", "rebooted")
    );
    server.wait_node(&id, "back on a new boot", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });
}

#[test]
fn gpu_reset_refuses_an_assigned_gpu_and_resets_a_free_one() {
    let (_d, server, _node, id) = setup_connected(35);
    server.assign_and_wait(&id, "job-a", "0", 1);
    let c = server.wait_command(&server.run_command(&id, "gpu.reset", &["0"]));
    assert_eq!(c.state, "failed");
    assert!(
        c.reason.contains("assigned to allocation job-a and in use"),
        "{}",
        c.reason
    );
    let c = server.wait_command(&server.run_command(&id, "gpu.reset", &["1"]));
    assert_eq!(c.state, "succeeded", "{c:?}");
    assert!(c.output.contains("function reset"), "{}", c.output);
    let c = server.wait_command(&server.run_command(&id, "gpu.reset", &["GPU-nope"]));
    assert!(c.reason.contains("not on this node"), "{}", c.reason);
}

/// A node holds the result of a command the store does not know (the store
/// was restored from a set taken before the command): the gateway keeps
/// the result as the node signed it, the key holder verifies it and signs
/// a receipt naming the command, its sequence and the signed bytes, and
/// the gateway hands the receipt on, so the node forgets the result
/// instead of sending it at every session.
#[test]
fn a_result_for_a_command_the_store_does_not_know_gets_the_key_holders_receipt() {
    use bcd_proto::v1::{self, node_message, server_message};
    use prost::Message;
    let (_d, server, mut node, id) = setup_connected(71);
    node.proc().stop();
    let key_pem = std::fs::read_to_string(node.dir.join("node.key")).unwrap();
    let node_key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    let worker_keys: Vec<Vec<u8>> = node.identity()["worker_keys"]
        .as_array()
        .expect("worker keys")
        .iter()
        .map(|k| hex::decode(k.as_str().unwrap()).unwrap())
        .collect();
    let payload = v1::CommandResult {
        command_id: "cmd-restored-away".into(),
        seq: 9,
        outcome: v1::Outcome::Succeeded as i32,
        node_id: id.clone(),
        output: b"done\n".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    let signature = rcgen::SigningKey::sign(&node_key, &payload).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let receipt = rt.block_on(async {
        let (tx, mut stream) = node.raw_session(&server.url()).await;
        tx.send(node.hello()).await.unwrap();
        let welcome = stream.message().await.unwrap().unwrap();
        assert!(matches!(welcome.msg, Some(server_message::Msg::Welcome(_))));
        tx.send(v1::NodeMessage {
            msg: Some(node_message::Msg::CommandResult(v1::NodeSigned {
                payload: payload.clone(),
                signature,
            })),
        })
        .await
        .unwrap();
        // Heartbeats keep the session while the receipt is awaited.
        let mut beat = tokio::time::interval(Duration::from_millis(100));
        let mut seq = 0;
        tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                tokio::select! {
                    _ = beat.tick() => {
                        seq += 1;
                        let hb = node_message::Msg::Heartbeat(v1::Heartbeat { seq });
                        tx.send(v1::NodeMessage { msg: Some(hb) }).await.unwrap();
                    }
                    m = stream.message() => {
                        let m = m.unwrap().expect("the session stays open");
                        if let Some(server_message::Msg::ResultReceipt(envelope)) = m.msg {
                            break envelope;
                        }
                    }
                }
            }
        })
        .await
        .expect("the key holder's receipt within 20 s")
    });
    let r = bcd_proto::receipts::open(&receipt, &worker_keys).expect("a worker-signed receipt");
    assert_eq!(
        (r.node_id.as_str(), r.command_id.as_str(), r.seq),
        (id.as_str(), "cmd-restored-away", 9)
    );
    assert_eq!(r.result_sha256, bcd_proto::fingerprint(&payload));
}
