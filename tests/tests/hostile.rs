//! A compromised gateway (`bc_tests::hostile`): it holds the serving
//! certificate and key and the store, and tries every forgery it can on a
//! real `bcd` and on the store. Then the honest server comes back on the
//! same store: the node still works, the store applied none of the
//! forgeries, and each attempt is an event.
#![allow(clippy::disallowed_methods)]

use bc_store::{CommandId, NodeId};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bc_store::commands::ResultApplied;
use bc_store::specs::FactApplied;
use bc_tests::hostile::{Hostile, HostileSession, fact};
use bc_tests::{Node, Server, foreign_worker_key, setup_connected, wait_for};
use bcd_proto::v1::{self, node_message::Msg as N, server_message::Msg as S};
use better_compute::certs::verify_node_signature;
use better_compute::gateway::facts;
use prost::Message;

/// How long a node may take to dial again after a refused session (its
/// back-off starts at a second).
const REDIAL: Duration = Duration::from_secs(30);
/// What a node is given to answer a frame.
const ANSWER: Duration = Duration::from_secs(20);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// The kinds of the events in what the node sends until `kind` is among
/// them.
fn event(s: &HostileSession, kind: &str) -> v1::Event {
    s.recv_until(ANSWER, kind, |m| match m {
        N::Events(b) => b.events.iter().find(|e| e.kind == kind).cloned(),
        _ => None,
    })
}

/// The node's signed result for command `id`.
fn signed_result(s: &HostileSession, id: &str) -> (v1::NodeSigned, v1::CommandResult) {
    s.recv_until(ANSWER, "a command result", |m| match m {
        N::CommandResult(r) => {
            let f: v1::CommandResult = fact(r);
            (f.command_id == id).then(|| (r.clone(), f))
        }
        _ => None,
    })
}

/// A command for `node` sealed by a key that is not a worker key.
fn forged_command(node: &str, id: &str, seq: u64, marker: &std::path::Path) -> v1::CommandDispatch {
    let now = now_ms();
    let payload = v1::CommandPayload {
        command_id: id.into(),
        node_id: node.into(),
        seq,
        kind: v1::CommandKind::ExecRun as i32,
        not_after_ms: now + 3_600_000,
        issued_at_ms: now,
        args: Some(v1::command_payload::Args::Exec(v1::ExecArgs {
            program: "touch".into(),
            args: vec![marker.display().to_string()],
            ..Default::default()
        })),
        ..Default::default()
    };
    v1::CommandDispatch {
        command_id: id.into(),
        seq,
        signed: bcd_proto::sign::seal(&foreign_worker_key(), payload.encode_to_vec()),
        epoch: 0,
    }
}

/// A statement that `node` was deleted, sealed by a key that is not a
/// worker key.
fn forged_deletion(node: &str, serial: &str) -> Vec<u8> {
    bcd_proto::sign::seal_statement(
        &foreign_worker_key(),
        &v1::NodeStatement {
            node_id: node.into(),
            kind: v1::NodeStatementKind::Deleted as i32,
            serials: vec![serial.into()],
            reason: "node-deleted".into(),
            issued_at_ms: now_ms(),
        },
    )
}

/// The signed envelope and sequence of a command, read from the store as a
/// gateway with the store can.
fn envelope(server: &Server, command: &str) -> (u64, Vec<u8>) {
    let db = rusqlite::Connection::open(server.dir.join("store.db")).expect("open the store");
    db.query_row(
        "SELECT seq, signed FROM commands WHERE id = ?1",
        [command],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
    )
    .expect("the command's envelope")
}

fn node_event_kinds(server: &Server, node: &str) -> Vec<String> {
    let store = server.store();
    store
        .block(store.store.node_events(&NodeId::from(node)))
        .expect("node events")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

fn stop_node(node: &mut Node) {
    node.proc().stop();
}

#[test]
fn a_hostile_gateway_forges_nothing_and_disables_nothing() {
    let (d, mut server, mut node, id) = setup_connected(61);
    let serial = node.identity()["cert_serial"]
        .as_str()
        .expect("cert_serial")
        .to_string();
    server.assign_and_wait(&id, "alloc-a", "0", 1);
    // A command the node has not seen yet: it is down when it is made.
    stop_node(&mut node);
    let pending = server.run_command(&id, "exec.run", &["sh", "-c", "exit 3"]);
    server.proc.stop();
    let mut h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();

    // A session whose Welcome jumps the epoch out of bounds is refused.
    let a = h.next_session(REDIAL);
    assert_eq!(a.hello.node_id, id);
    let last = a.hello.last_epoch;
    a.welcome(u64::MAX, now_ms(), &[]);
    assert!(
        a.closed_within(ANSWER),
        "the node closes a session whose epoch jumps"
    );

    // A Welcome within bounds: what the node sends is signed, and a
    // gateway that alters it has the store refuse it.
    let b = h.next_session(REDIAL);
    assert_eq!(b.hello.last_epoch, last, "the huge epoch was not taken");
    b.welcome(last + 1, now_ms(), &["gpus"]);
    let (mut report, mut inventory) = (None, None);
    b.recv_until(ANSWER, "a state report and an inventory section", |m| {
        match m {
            N::StateReport(s) => report = Some(s.clone()),
            N::Inventory(s) => inventory = Some(s.clone()),
            _ => {}
        }
        (report.is_some() && inventory.is_some()).then_some(())
    });
    let (report, inventory) = (report.unwrap(), inventory.unwrap());
    let (seq, signed) = envelope(&server, &pending);
    b.send(S::Command(v1::CommandDispatch {
        command_id: pending.clone(),
        seq,
        signed,
        epoch: last + 1,
    }));
    let (result, honest) = signed_result(&b, &pending);
    assert_eq!(
        (honest.outcome, honest.exit_code),
        (v1::Outcome::Failed as i32, 3)
    );

    let store = server.store();
    let current = store
        .block(store.store.session(&NodeId::from(&id)))
        .unwrap()
        .expect("the node's session row")
        .epoch;
    // The failure made a success, the signature kept.
    let flipped = v1::NodeSigned {
        payload: v1::CommandResult {
            outcome: v1::Outcome::Succeeded as i32,
            exit_code: 0,
            ..honest.clone()
        }
        .encode_to_vec(),
        signature: result.signature.clone(),
    };
    assert!(matches!(
        store
            .block(store.store.command_result(
                &NodeId::from(&id),
                &facts::result(flipped),
                verify_node_signature
            ))
            .unwrap(),
        ResultApplied::Forged(_)
    ));
    // A generation the node never applied, under the store's epoch.
    let r: v1::StateReport = fact(&report);
    let raised = v1::NodeSigned {
        payload: v1::StateReport {
            applied_generation: 99,
            epoch: current,
            ..r
        }
        .encode_to_vec(),
        signature: report.signature.clone(),
    };
    assert!(matches!(
        store
            .block(store.store.put_state_report(
                &NodeId::from(&id),
                &facts::state_report(raised),
                verify_node_signature
            ))
            .unwrap(),
        FactApplied::Forged(_)
    ));
    let i: v1::Inventory = fact(&inventory);
    let planted = v1::NodeSigned {
        payload: v1::Inventory {
            body: b"[]".to_vec(),
            sha256: "00".repeat(32),
            epoch: current,
            ..i
        }
        .encode_to_vec(),
        signature: inventory.signature.clone(),
    };
    assert!(matches!(
        store
            .block(store.store.put_inventory(
                &NodeId::from(&id),
                current,
                &facts::inventory(planted).expect("a known section"),
                verify_node_signature
            ))
            .unwrap(),
        FactApplied::Forged(_)
    ));
    drop(store);

    // A command and a spec sealed by a key that is not a worker key.
    let marker = d.path().join("forged-command-ran");
    b.send(S::Command(forged_command(
        &id,
        "cmd-forged",
        1_000,
        &marker,
    )));
    let (_, rejected) = signed_result(&b, "cmd-forged");
    assert_eq!(rejected.outcome, v1::Outcome::Rejected as i32);
    assert!(rejected.reason.contains("signature"), "{rejected:?}");
    let spec = v1::NodeSpec {
        node_id: id.clone(),
        generation: 100,
        issued_at_ms: now_ms(),
        not_after_ms: now_ms() + 3_600_000,
        ..Default::default()
    };
    b.send(S::DesiredState(v1::DesiredState {
        generation: 100,
        signed_spec: bcd_proto::sign::seal(&foreign_worker_key(), spec.encode_to_vec()),
    }));
    event(&b, "spec.refused");
    // Revocation notices without a statement, or with a forged one.
    b.send(S::Revocation(v1::RevocationNotice {
        reason: "revoked".into(),
        serials: vec![serial.clone()],
        statement: vec![],
    }));
    b.send(S::Revocation(v1::RevocationNotice {
        reason: "revoked".into(),
        serials: vec![serial.clone()],
        statement: forged_deletion(&id, &serial),
    }));
    event(&b, "security.revocation.unconfirmed");
    // A Drain that would keep the node away for 49 days.
    let drained = Instant::now();
    b.send(S::Drain(v1::Drain {
        reconnect_within_ms: u32::MAX,
        reason: "maintenance".into(),
    }));
    assert!(b.closed_within(ANSWER), "the node leaves a drained session");

    // It comes back within the 60 seconds a Drain may spread it over.
    let c = h.next_session(Duration::from_secs(75));
    assert!(
        drained.elapsed() < Duration::from_secs(62),
        "redialed after {:?}",
        drained.elapsed()
    );
    assert!(!marker.exists(), "the forged command ran");
    // Server time ten years ahead: held to what the node's mark and the
    // key holder's signed list allow, and the mark the node persists moves
    // at most a minute past its own clocks.
    let future = now_ms() + 10 * 365 * 86_400_000;
    c.welcome(last + 2, future, &[]);
    wait_for(ANSWER, "the mark persisted", || {
        (node.identity()["last_epoch"] == last + 2).then_some(())
    });
    let mark = node.identity()["server_time_mark_ms"]
        .as_i64()
        .expect("mark");
    assert!(
        mark <= now_ms() + 2 * 60_000,
        "the mark went {} ms ahead",
        mark - now_ms()
    );
    // A refusal claiming the node was deleted, with a forged statement.
    c.end(bcd_proto::refusal::status(
        tonic::Code::Unauthenticated,
        v1::RefusalReason::NodeDeleted,
        format!("node {id} was deleted"),
        forged_deletion(&id, &serial),
    ));
    // And the words alone, as an older server said them.
    let e = h.next_session(REDIAL);
    assert!(e.hello.server_time_mark_ms <= now_ms() + 2 * 60_000);
    e.end(tonic::Status::permission_denied(format!(
        "node {id} was deleted"
    )));
    let f = h.next_session(REDIAL);
    assert!(
        node.proc().wait(Duration::ZERO).is_none(),
        "the node is still running"
    );
    drop(f);
    h.stop();

    // The honest server on the same store.
    server.start_again().expect("the server starts again");
    server.wait_node(&id, "connected again", |n| n.state == "connected");
    let c = server.wait_command(&pending);
    assert_eq!(
        (c.state.as_str(), c.exit()),
        ("failed", Some(3)),
        "the node's own result, not the forged one"
    );
    let ok = server.run_command(&id, "exec.run", &["true"]);
    assert_eq!(server.wait_command(&ok).state, "succeeded");
    let spec = server.spec(&id);
    assert_eq!(spec["desired_generation"], 1, "{spec}");
    wait_for(ANSWER, "the node to report its spec", || {
        (server.spec(&id)["applied_generation"] == 1).then_some(())
    });
    let store = server.store();
    let gpus = store
        .block(
            store
                .store
                .inventory(&NodeId::from(&id), bcd_core::report::InventorySection::Gpus),
        )
        .unwrap()
        .expect("the node's gpus section");
    assert_ne!(gpus.body, b"[]".to_vec(), "the planted inventory");
    let fleet = store
        .block(store.store.fleet_events(&NodeId::from(&id), 100))
        .unwrap();
    drop(store);
    for kind in [
        "security.result.forged",
        "security.state-report.forged",
        "security.inventory.forged",
    ] {
        assert!(
            fleet.iter().any(|e| e.starts_with(kind)),
            "{kind}: {fleet:?}"
        );
    }
    // What the node refused reached the store from its journal.
    let wanted = [
        "security.welcome.refused",
        "security.command.refused",
        "spec.refused",
        "security.revocation.unconfirmed",
        "security.drain.clamped",
        "security.refusal.unconfirmed",
    ];
    wait_for(ANSWER, "the node's security events in the store", || {
        let kinds = node_event_kinds(&server, &id);
        wanted
            .iter()
            .all(|w| kinds.iter().any(|k| k == w))
            .then_some(())
    });
}

#[test]
fn a_replay_after_a_lost_journal_is_refused() {
    let (d, mut server, mut node, id) = setup_connected(62);
    server.assign_and_wait(&id, "alloc-a", "0", 1);
    let store = server.store();
    let (generation, old_spec) = store
        .block(store.store.signed_spec(&NodeId::from(&id)))
        .unwrap()
        .expect("a signed spec");
    drop(store);
    assert_eq!(generation, 1);
    server.assign_and_wait(&id, "alloc-b", "1", 2);
    let file = d.path().join("ran");
    let script = format!("echo ran >> {}", file.display());
    let old = server.run_command(&id, "exec.run", &["sh", "-c", &script]);
    assert_eq!(server.wait_command(&old).state, "succeeded");
    let (seq, signed) = envelope(&server, &old);

    // The node restarts without its journal (a ramdisk node at boot); a
    // hostile gateway replays the old spec and the old command, both
    // validly signed and not expired.
    stop_node(&mut node);
    for f in ["journal.db", "journal.db-wal", "journal.db-shm"] {
        let _ = std::fs::remove_file(node.dir.join(f));
    }
    server.proc.stop();
    let mut h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();
    let s = h.next_session(REDIAL);
    assert_eq!(s.hello.applied_generation, 0, "the journal is new");
    s.welcome(s.hello.last_epoch + 1, now_ms(), &[]);
    s.send(S::DesiredState(v1::DesiredState {
        generation: 1,
        signed_spec: old_spec,
    }));
    let refused = event(&s, "spec.refused");
    let body = String::from_utf8_lossy(&refused.body).to_string();
    assert!(body.contains("the highest this node took on"), "{body}");
    s.send(S::Command(v1::CommandDispatch {
        command_id: old.clone(),
        seq,
        signed,
        epoch: s.hello.last_epoch + 1,
    }));
    let (_, r) = signed_result(&s, &old);
    assert_eq!(r.outcome, v1::Outcome::Rejected as i32);
    assert!(r.reason.contains("replayed"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "ran\n",
        "the replayed command ran again"
    );
    drop(s);
    h.stop();

    // The honest server: the node takes the current spec and keeps working.
    server.start_again().expect("the server starts again");
    server.wait_node(&id, "connected again", |n| n.state == "connected");
    wait_for(ANSWER, "generation 2 applied", || {
        (server.spec(&id)["applied_generation"] == 2).then_some(())
    });
    let c = server.run_command(&id, "exec.run", &["sh", "-c", &script]);
    assert_eq!(server.wait_command(&c).state, "succeeded");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "ran\nran\n");
    assert_eq!(server.command(&old).state, "succeeded");
    wait_for(ANSWER, "the refusals in the store", || {
        let kinds = node_event_kinds(&server, &id);
        ["spec.refused", "security.command.refused"]
            .iter()
            .all(|w| kinds.iter().any(|k| k == w))
            .then_some(())
    });
}

/// How the node's journal holds command `id`'s result: 0 unacknowledged,
/// 1 settled by a receipt, 2 acknowledged by a gateway and not settled.
fn journal_acked(node: &Node, id: &str) -> Option<i64> {
    let conn = rusqlite::Connection::open_with_flags(
        node.dir.join("journal.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .ok()?;
    conn.query_row(
        "SELECT acked FROM commands WHERE id = ?1 AND state = 'done'",
        [id],
        |r| r.get(0),
    )
    .ok()
}

/// A gateway's acknowledgement is unsigned: one that acknowledges a result
/// and stores nothing must not make the node forget it. The node keeps an
/// acknowledged result until the key holder's receipt (worker-signed,
/// naming the node, the sequence and the bytes it signed) says the store
/// holds it; a receipt of a foreign key or of another command settles
/// nothing, and the honest control plane settles it once it has it.
#[test]
fn a_result_a_gateway_acknowledged_is_kept_until_the_key_holder_receipts_it() {
    let (d, mut server, mut node, id) = setup_connected(63);
    let first = server.run_command(&id, "exec.run", &["true"]);
    assert_eq!(server.wait_command(&first).state, "succeeded");
    wait_for(ANSWER, "the first result settled by its receipt", || {
        (journal_acked(&node, &first) == Some(1)).then_some(())
    });
    let store = server.store();
    let (_, first_receipt) = store
        .block(store.store.result_receipts(
            &NodeId::from(&id),
            std::slice::from_ref(&CommandId::from(&first)),
        ))
        .unwrap()
        .pop()
        .expect("the key holder's receipt for the first result");
    drop(store);

    stop_node(&mut node);
    let pending = server.run_command(&id, "exec.run", &["true"]);
    let (seq, signed) = envelope(&server, &pending);
    server.proc.stop();
    let mut h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();
    let s = h.next_session(REDIAL);
    let epoch = s.hello.last_epoch + 1;
    s.welcome(epoch, now_ms(), &[]);
    s.send(S::Command(v1::CommandDispatch {
        command_id: pending.clone(),
        seq,
        signed,
        epoch,
    }));
    let (result, _) = signed_result(&s, &pending);
    // Acknowledged, never stored.
    s.send(S::ResultAck(v1::ResultAck {
        command_ids: vec![pending.clone()],
    }));
    wait_for(ANSWER, "the acknowledgement taken", || {
        (journal_acked(&node, &pending) == Some(2)).then_some(())
    });
    // A receipt signed by a key of the gateway's own, and the key holder's
    // real receipt of another command, settle nothing.
    s.send(S::ResultReceipt(bcd_proto::receipts::seal(
        &foreign_worker_key(),
        v1::ResultReceipt {
            purpose: String::new(),
            node_id: id.clone(),
            command_id: pending.clone(),
            seq,
            result_sha256: bcd_proto::fingerprint(&result.payload),
        },
    )));
    event(&s, "security.receipt.refused");
    s.send(S::ResultReceipt(first_receipt));
    // A forged command answered: the node has read the frames before it.
    let marker = d.path().join("forged-ran");
    s.send(S::Command(forged_command(
        &id,
        "cmd-probe",
        seq + 1,
        &marker,
    )));
    signed_result(&s, "cmd-probe");
    assert_eq!(
        journal_acked(&node, &pending),
        Some(2),
        "a receipt the key holder did not sign for this result settled it"
    );
    drop(s);
    h.stop();

    // The honest control plane: the node sends the result again, the
    // store records it, and the key holder's receipt settles it.
    server.start_again().expect("the server starts again");
    assert_eq!(server.wait_command(&pending).state, "succeeded");
    wait_for(ANSWER, "the result settled by its receipt", || {
        (journal_acked(&node, &pending) == Some(1)).then_some(())
    });
    stop_node(&mut node);
}

/// How many events of `kind` the node's journal holds.
fn journal_events(node: &Node, kind: &str) -> i64 {
    let conn = rusqlite::Connection::open_with_flags(
        node.dir.join("journal.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("the journal opens");
    conn.query_row("SELECT COUNT(*) FROM events WHERE kind = ?1", [kind], |r| {
        r.get(0)
    })
    .expect("the journal reads")
}

/// A gateway's `EventAck` is unsigned: one that forged a command and then
/// acknowledged the node's record of refusing it must not erase that
/// record. The node keeps its security events until the key holder's
/// receipt says the store keeps them where no gateway can delete them; a
/// receipt of a foreign key erases nothing.
#[test]
fn a_security_event_a_gateway_acknowledged_is_kept_until_the_key_holder_receipts_it() {
    let (d, mut server, mut node, id) = setup_connected(64);
    stop_node(&mut node);
    server.proc.stop();
    let mut h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();
    let s = h.next_session(REDIAL);
    s.welcome(s.hello.last_epoch + 1, now_ms(), &[]);
    let marker = d.path().join("forged-ran");
    s.send(S::Command(forged_command(&id, "cmd-forged", 1, &marker)));
    let refused = event(&s, "security.command.refused");
    s.send(S::EventAck(v1::EventAck { up_to: refused.id }));
    s.send(S::EventReceipt(bcd_proto::receipts::seal_event(
        &foreign_worker_key(),
        v1::EventReceipt {
            purpose: String::new(),
            node_id: id.clone(),
            journal_id: s.hello.journal_id.clone(),
            event_id: refused.id,
            kind: refused.kind.clone(),
            body_sha256: bcd_proto::fingerprint(&refused.body),
        },
    )));
    event(&s, "security.receipt.refused");
    assert_eq!(
        journal_events(&node, "security.command.refused"),
        1,
        "an unsigned acknowledgement or a foreign receipt erased the node's record"
    );
    drop(s);
    h.stop();

    // The honest control plane: the node sends its security events again,
    // the store keeps them, and the key holder's receipts settle them.
    server.start_again().expect("the server starts again");
    wait_for(ANSWER, "the security events settled by receipts", || {
        (journal_events(&node, "security.command.refused") == 0
            && journal_events(&node, "security.receipt.refused") == 0)
            .then_some(())
    });
    let kinds = node_event_kinds(&server, &id);
    assert!(
        kinds.iter().any(|k| k == "security.command.refused"),
        "{kinds:?}"
    );
    stop_node(&mut node);
}

/// A gateway dates its Welcome a day ahead, so that a command the key
/// holder signed for an hour would run out: the node holds server time to
/// what its mark allows until a list the key holder signed comes, then to
/// what that list allows, runs the command, and records the gateway's
/// time as a security event.
#[test]
fn a_gateway_that_dates_its_welcome_ahead_expires_no_command() {
    const DAY: i64 = 86_400_000;
    let (_d, mut server, mut node, id) = setup_connected(67);
    // The node keeps the key holder's gateway revocation list.
    wait_for(ANSWER, "the node to keep a gateway revocation list", || {
        node.dir.join("gateway-revocations").exists().then_some(())
    });
    stop_node(&mut node);
    let first = server.run_command(&id, "exec.run", &["true"]);
    let second = server.run_command(&id, "exec.run", &["true"]);
    server.proc.stop();
    let store = server.store();
    let list = store
        .block(store.store.gateway_revocations())
        .unwrap()
        .expect("the key holder's list")
        .envelope;
    drop(store);
    let mut h = Hostile::start(&server.dir, server.addr).expect("hostile gateway");
    node.start();

    // A day ahead, and no list: the mark limits server time.
    let a = h.next_session(REDIAL);
    let epoch = a.hello.last_epoch + 1;
    a.welcome(epoch, now_ms() + DAY, &[]);
    let (seq, signed) = envelope(&server, &first);
    a.send(S::Command(v1::CommandDispatch {
        command_id: first.clone(),
        seq,
        signed,
        epoch,
    }));
    let (_, r) = signed_result(&a, &first);
    assert_eq!(
        r.outcome,
        v1::Outcome::Succeeded as i32,
        "the command a day-ahead Welcome would expire: {r:?}"
    );
    // The key holder's list, handed on as an honest gateway would: the
    // limit is now the list's, and the node records the gateway's time.
    a.send(S::GatewayRevocations(list));
    let ahead = event(&a, "security.clock.ahead");
    let body = String::from_utf8_lossy(&ahead.body);
    assert!(body.contains("limit_ms"), "{body}");
    let (seq, signed) = envelope(&server, &second);
    a.send(S::Command(v1::CommandDispatch {
        command_id: second.clone(),
        seq,
        signed,
        epoch,
    }));
    let (_, r) = signed_result(&a, &second);
    assert_eq!(r.outcome, v1::Outcome::Succeeded as i32, "{r:?}");
    drop(a);
    h.stop();
    let mark = node.identity()["server_time_mark_ms"]
        .as_i64()
        .expect("mark");
    assert!(
        mark <= now_ms() + 5 * 60_000,
        "the mark went {} ms ahead",
        mark - now_ms()
    );
}
