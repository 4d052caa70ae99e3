use std::time::Duration;

use bc_store::commands::{NewCommand, ResultApplied, ResultInput};
use bc_store::named::Named;
use bc_store::{CommandId, GatewayId, Refusal, TxError};
use bcd_core::command::{Kind, Outcome, ServerState};

use bc_store::nodes::Signed;

use super::{Fixture, T0, hello, joined, signed, state, verify};

pub fn command(node: &str, kind: Kind, summary: &str) -> NewCommand {
    NewCommand {
        node_id: node.into(),
        kind,
        summary: summary.into(),
        not_after: Duration::from_secs(60),
        min_generation: 0,
        idempotency_key: None,
    }
}

/// A result of `node` (certificate `cert`), signed.
pub fn result(node: &str, cert: u8, id: &str, outcome: Outcome) -> Signed<ResultInput> {
    signed(cert, result_of(node, id, outcome))
}

pub fn result_of(node: &str, id: &str, outcome: Outcome) -> ResultInput {
    ResultInput {
        node_id: node.into(),
        command_id: id.into(),
        outcome,
        reason: String::new(),
        exit_code: Some(0),
        output: b"out".to_vec(),
        output_truncated: false,
    }
}

pub async fn results_first_one_wins_and_unknown_ones_change_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let (c, created) = s
        .create_command(
            &command(&node, Kind::ExecRun, "x"),
            Box::new(|seal| {
                assert_eq!((seal.seq, seal.issued_at_ms), (1, T0));
                assert_eq!(seal.not_after_ms, T0 + 60_000);
                b"signed".to_vec()
            }),
        )
        .await
        .unwrap();
    assert!(created);
    assert_eq!((c.seq, c.state.text()), (1, "pending"));
    assert_eq!((c.created_at_ms, c.not_after_ms), (T0, T0 + 60_000));
    assert_eq!(
        s.command_result(
            &node,
            &result(&node, 1, "cmd-nope", Outcome::Succeeded),
            verify
        )
        .await
        .unwrap(),
        ResultApplied::Unknown
    );
    let other = joined(s, 2).await;
    assert_eq!(
        s.command_result(
            &other,
            &result(&other, 2, &c.id, Outcome::Succeeded),
            verify
        )
        .await
        .unwrap(),
        ResultApplied::Unknown,
        "another node cannot report it"
    );
    f.advance(Duration::from_millis(7));
    assert_eq!(
        s.command_result(&node, &result(&node, 1, &c.id, Outcome::Succeeded), verify)
            .await
            .unwrap(),
        ResultApplied::Applied
    );
    assert_eq!(
        s.command_result(&node, &result(&node, 1, &c.id, Outcome::Failed), verify)
            .await
            .unwrap(),
        ResultApplied::Duplicate
    );
    let row = s.get_command(&c.id).await.unwrap().unwrap();
    assert_eq!(row.state.text(), "succeeded");
    assert_eq!(
        (row.exit_code, row.output.as_slice()),
        (Some(0), &b"out"[..])
    );
    assert_eq!(row.result_at_ms, Some(T0 + 7));
    // The first result's signed bytes and signature stay with it, for a
    // reader to verify (the duplicate left them as they were).
    let first = result(&node, 1, &c.id, Outcome::Succeeded);
    assert_eq!(
        row.signed_result,
        Some(bc_store::commands::SignedResult {
            payload: first.payload,
            signature: first.signature,
        })
    );
    assert!(
        !s.command_ack(&super::route("gw", &node, 1), &c.id, true)
            .await
            .unwrap(),
        "a finished command stays finished"
    );
    let listed = s.list_commands(Some(&node), 10).await.unwrap();
    assert_eq!(listed, vec![row]);
    assert!(s.list_commands(Some(&other), 10).await.unwrap().is_empty());
}

/// A gateway dispatches only while it holds its lease: one whose lease ran
/// out (a zombie that has not fenced itself yet) or went to another owner
/// sends nothing, and the command waits for the session that holds it.
pub async fn dispatch_needs_the_gateways_lease(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    super::lease(s, "gw-z", std::time::Duration::from_secs(20)).await;
    let e = s.hello(&hello(&node, 1, "gw-z", 0)).await.unwrap().epoch;
    let (c, _) = s
        .create_command(&command(&node, Kind::ExecRun, "z"), Box::new(|_| vec![]))
        .await
        .unwrap();
    f.clock.advance(std::time::Duration::from_secs(21));
    assert!(
        s.take_dispatchable(&GatewayId::from("gw-z"), &node, e)
            .await
            .unwrap()
            .is_empty(),
        "a lapsed lease dispatches nothing"
    );
    s.renew_lease(
        &bc_store::leases::gateway_lease("gw-z"),
        "newcomer",
        std::time::Duration::from_secs(20),
    )
    .await
    .unwrap()
    .expect("the lapsed lease is free");
    assert!(
        s.take_dispatchable(&GatewayId::from("gw-z"), &node, e)
            .await
            .unwrap()
            .is_empty(),
        "a lease of another owner dispatches nothing"
    );
    assert_eq!(
        s.get_command(&c.id).await.unwrap().unwrap().state.text(),
        "pending"
    );
    f.clock.advance(std::time::Duration::from_secs(21));
    super::lease(s, "gw-z", std::time::Duration::from_secs(20)).await;
    let d = s
        .take_dispatchable(&GatewayId::from("gw-z"), &node, e)
        .await
        .unwrap();
    assert_eq!(d.len(), 1, "held again, it dispatches");
}

pub async fn dispatch_follows_the_route_and_the_applied_generation(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let e1 = s.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap().epoch;
    let e2 = s.hello(&hello(&node, 1, "gw-b", 0)).await.unwrap().epoch;
    let (c1, _) = s
        .create_command(
            &command(&node, Kind::ExecRun, "a"),
            Box::new(|_| b"1".to_vec()),
        )
        .await
        .unwrap();
    let mut gated = command(&node, Kind::ExecRun, "b");
    gated.min_generation = 2;
    let (c2, _) = s
        .create_command(&gated, Box::new(|_| b"2".to_vec()))
        .await
        .unwrap();
    let (c3, _) = s
        .create_command(
            &command(&node, Kind::ExecRun, "c"),
            Box::new(|_| b"3".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!((c1.seq, c2.seq, c3.seq), (1, 2, 3));
    assert_eq!(
        s.nodes_with_work(&GatewayId::from("gw-b"), i64::MAX)
            .await
            .unwrap(),
        vec![node.clone()]
    );
    assert!(
        s.nodes_with_work(&GatewayId::from("gw-a"), i64::MAX)
            .await
            .unwrap()
            .is_empty()
    );
    // Nothing goes to a stale route or epoch.
    assert!(
        s.take_dispatchable(&GatewayId::from("gw-a"), &node, e1)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.take_dispatchable(&GatewayId::from("gw-b"), &node, e1)
            .await
            .unwrap()
            .is_empty()
    );
    // The command waiting for generation 2 holds back the one after it.
    f.advance(Duration::from_millis(250));
    let d = s
        .take_dispatchable(&GatewayId::from("gw-b"), &node, e2)
        .await
        .unwrap();
    assert_eq!(d[0].waited_ms, Some(250), "how long it waited, store clock");
    assert_eq!(
        d.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        [c1.id.as_str()]
    );
    assert_eq!(d[0].signed, b"1");
    assert!(
        s.take_dispatchable(&GatewayId::from("gw-b"), &node, e2)
            .await
            .unwrap()
            .is_empty(),
        "once"
    );
    s.put_state_report(&node, &state(&node, 1, e2, 2, vec![]), verify)
        .await
        .unwrap();
    let d = s
        .take_dispatchable(&GatewayId::from("gw-b"), &node, e2)
        .await
        .unwrap();
    assert_eq!(
        d.iter().map(|d| d.seq).collect::<Vec<_>>(),
        [2, 3],
        "in sequence order"
    );
    let row = s.get_command(&c3.id).await.unwrap().unwrap();
    assert_eq!((row.state.text(), row.epoch), ("dispatched", e2));
    assert!(
        s.command_ack(&super::route("gw-b", &node, e2), &c3.id, false)
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_command(&c3.id).await.unwrap().unwrap().state.text(),
        "acked"
    );
    assert!(
        s.nodes_with_work(&GatewayId::from("gw-b"), i64::MAX)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn idempotency_keys_return_the_first_command(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let mut c = command(&node, Kind::ExecRun, "x");
    c.idempotency_key = Some("k1".into());
    let (first, created) = s.create_command(&c, Box::new(|_| vec![1])).await.unwrap();
    assert!(created);
    let (again, created) = s
        .create_command(&c, Box::new(|_| panic!("a repeat is not sealed again")))
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(again, first);
    let other = joined(s, 2).await;
    let mut elsewhere = c.clone();
    elsewhere.node_id = other;
    let err = s
        .create_command(&elsewhere, Box::new(|_| vec![2]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, TxError::Refused(Refusal::Conflict(ref m)) if m.contains("k1")),
        "{err:?}"
    );
}

pub async fn the_sweeper_expires_only_pending_commands_past_their_deadline(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let e = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap().epoch;
    let (held, _) = s
        .create_command(&command(&node, Kind::ExecRun, "held"), Box::new(|_| vec![]))
        .await
        .unwrap();
    assert_eq!(
        s.take_dispatchable(&GatewayId::from("gw"), &node, e)
            .await
            .unwrap()
            .len(),
        1
    );
    let (waiting, _) = s
        .create_command(
            &command(&node, Kind::ExecRun, "waiting"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    let (cancelled, _) = s
        .create_command(
            &command(&node, Kind::ExecRun, "cancelled"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    assert!(
        s.cancel_pending_command(&cancelled.id, "rollout-aborted")
            .await
            .unwrap()
    );
    assert!(
        !s.cancel_pending_command(&held.id, "rollout-aborted")
            .await
            .unwrap()
    );
    f.advance(Duration::from_secs(60));
    assert!(
        s.sweep_commands(&super::controller(s).await)
            .await
            .unwrap()
            .is_empty(),
        "at the deadline"
    );
    f.advance(Duration::from_millis(1));
    assert_eq!(
        s.sweep_commands(&super::controller(s).await).await.unwrap(),
        vec![waiting.id.clone()]
    );
    let w = s.get_command(&waiting.id).await.unwrap().unwrap();
    assert_eq!(
        (w.state.text(), w.reason.as_str()),
        ("expired", "not_after passed before dispatch")
    );
    assert_eq!(
        s.get_command(&cancelled.id).await.unwrap().unwrap().reason,
        "rollout-aborted"
    );
    assert_eq!(
        s.get_command(&held.id).await.unwrap().unwrap().state.text(),
        "dispatched",
        "a command the node may hold is never swept"
    );
}

pub async fn a_confirmed_upgrade_raises_the_release_floor(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let (failed, _) = s
        .create_command(
            &command(&node, Kind::DaemonUpgrade, "release 9"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    s.command_result(
        &node,
        &result(&node, 1, &failed.id, Outcome::Failed),
        verify,
    )
    .await
    .unwrap();
    assert_eq!(s.list_nodes().await.unwrap().nodes[0].release_floor, 0);
    let (ok, _) = s
        .create_command(
            &command(&node, Kind::DaemonUpgrade, "release 7"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    s.command_result(&node, &result(&node, 1, &ok.id, Outcome::Succeeded), verify)
        .await
        .unwrap();
    // A gateway applied it; the floor waits for the key holder, who
    // verifies the stored result first, and raises it only then.
    assert_eq!(s.list_nodes().await.unwrap().nodes[0].release_floor, 0);
    assert_eq!(s.upgrades_unjudged(10).await.unwrap(), [ok.id.as_str()]);
    assert_eq!(s.judge_upgrade_floor(&ok.id, true).await.unwrap(), Some(7));
    assert_eq!(s.list_nodes().await.unwrap().nodes[0].release_floor, 7);
    assert!(s.upgrades_unjudged(10).await.unwrap().is_empty());
    assert_eq!(s.judge_upgrade_floor(&ok.id, true).await.unwrap(), None);
    assert_eq!(s.judge_upgrade_floor(&failed.id, true).await.unwrap(), None);
    // A success written into the store with no result the node signed is
    // judged once, and raises nothing.
    let (made_up, _) = s
        .create_command(
            &command(&node, Kind::DaemonUpgrade, "release 40"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    f.tamper(&format!(
        "UPDATE commands SET state = 'succeeded', result_at = created_at WHERE id = '{}'",
        made_up.id
    ))
    .await;
    assert_eq!(
        s.upgrades_unjudged(10).await.unwrap(),
        [made_up.id.as_str()]
    );
    assert_eq!(
        s.judge_upgrade_floor(&made_up.id, false).await.unwrap(),
        None
    );
    assert!(s.upgrades_unjudged(10).await.unwrap().is_empty());
    assert_eq!(s.list_nodes().await.unwrap().nodes[0].release_floor, 7);
    // A Hello does not move it: it is not signed.
    s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    assert_eq!(s.list_nodes().await.unwrap().nodes[0].release_floor, 7);
    // Nor does a success the node did not sign.
    let (later, _) = s
        .create_command(
            &command(&node, Kind::DaemonUpgrade, "release 9"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    let forged = result(&node, 4, &later.id, Outcome::Succeeded);
    assert!(matches!(
        s.command_result(&node, &forged, verify).await.unwrap(),
        ResultApplied::Forged(_)
    ));
    assert_eq!(s.list_nodes().await.unwrap().nodes[0].release_floor, 7);
}

pub async fn commands_for_unknown_nodes_are_refused(f: Fixture) {
    let s = &f.store;
    let err = s
        .create_command(&command("nd-nope", Kind::ExecRun, ""), Box::new(|_| vec![]))
        .await
        .unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::NoSuchNode("nd-nope".into())));
    let node = joined(s, 1).await;
    s.delete_node(&node, Box::new(|_| vec![])).await.unwrap();
    assert!(
        s.create_command(&command(&node, Kind::ExecRun, ""), Box::new(|_| vec![]))
            .await
            .is_err(),
        "nor for deleted ones"
    );
}

/// A command row whose kind or state a gateway rewrote to a name this
/// build does not know still reads, in a listing and alone, holding the
/// text it was given: the reader decides (the evidence calls such a row
/// forged), and the rest of the listing is not lost to one row.
pub async fn a_row_naming_no_known_kind_or_state_still_reads(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let (c, _) = s
        .create_command(&command(&node, Kind::ExecRun, "x"), Box::new(|_| vec![]))
        .await
        .unwrap();
    let (other, _) = s
        .create_command(&command(&node, Kind::GpuReset, "y"), Box::new(|_| vec![]))
        .await
        .unwrap();
    f.tamper(&format!(
        "UPDATE commands SET kind = 'exec.root', state = 'won' WHERE id = '{}'",
        c.id
    ))
    .await;
    let row = s.get_command(&c.id).await.unwrap().unwrap();
    assert_eq!(row.kind, Named::Unknown("exec.root".into()));
    assert_eq!(row.state, Named::Unknown("won".into()));
    assert_eq!(row.kind.known(), None);
    let listed = s.list_commands(Some(&node), 10).await.unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let other = listed.iter().find(|r| r.id == other.id).unwrap();
    assert_eq!(other.kind, Named::Known(Kind::GpuReset));
    assert!(other.state == ServerState::Pending);
}

pub async fn command_states_are_counted(f: Fixture) {
    let s = &f.store;
    assert!(s.command_states().await.unwrap().is_empty());
    let node = joined(s, 1).await;
    let e = s.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap().epoch;
    for summary in ["a", "b"] {
        s.create_command(
            &command(&node, Kind::ExecRun, summary),
            Box::new(|_| b"x".to_vec()),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        s.command_states().await.unwrap(),
        [("pending".to_string(), 2)]
    );
    let d = s
        .take_dispatchable(&GatewayId::from("gw-a"), &node, e)
        .await
        .unwrap();
    s.command_result(
        &node,
        &result(&node, 1, &d[0].id, Outcome::Succeeded),
        verify,
    )
    .await
    .unwrap();
    assert_eq!(
        s.command_states().await.unwrap(),
        [("dispatched".to_string(), 1), ("succeeded".to_string(), 1)]
    );
}

/// Acks are fenced like dispatch: only forward, and only on the session
/// the command is in flight on. A late ACCEPTED cannot take a running
/// command back; once the node said Hello elsewhere, the old gateway's acks
/// (a zombie's, or a replayed frame) move nothing, nor does one naming the
/// new epoch through the wrong gateway.
pub async fn a_late_or_stale_ack_moves_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let e1 = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap().epoch;
    let seal =
        || -> bc_store::commands::SealCommand { Box::new(|c| c.id.to_string().into_bytes()) };
    let (a, _) = s
        .create_command(&command(&node, Kind::ExecRun, "a"), seal())
        .await
        .unwrap();
    assert_eq!(
        s.take_dispatchable(&GatewayId::from("gw"), &node, e1)
            .await
            .unwrap()
            .len(),
        1
    );
    let old = super::route("gw", &node, e1);
    assert!(s.command_ack(&old, &a.id, true).await.unwrap());
    assert!(
        !s.command_ack(&old, &a.id, false).await.unwrap(),
        "an ACCEPTED after RUNNING"
    );
    assert_eq!(
        s.get_command(&a.id).await.unwrap().unwrap().state.text(),
        "running"
    );

    // The node moves to gw-b, reporting `a` running; `b` is dispatched there.
    let mut h = hello(&node, 1, "gw-b", e1);
    h.journal_running = vec![a.id.clone()];
    let e2 = s.hello(&h).await.unwrap().epoch;
    let (b, _) = s
        .create_command(&command(&node, Kind::ExecRun, "b"), seal())
        .await
        .unwrap();
    assert_eq!(
        s.take_dispatchable(&GatewayId::from("gw-b"), &node, e2)
            .await
            .unwrap()
            .len(),
        1
    );
    for stale in [
        super::route("gw", &node, e1),
        super::route("gw", &node, e2),
        super::route("gw-b", &node, e1),
    ] {
        for running in [false, true] {
            assert!(
                !s.command_ack(&stale, &b.id, running).await.unwrap(),
                "{stale:?} running={running}"
            );
        }
    }
    assert_eq!(
        s.get_command(&b.id).await.unwrap().unwrap().state.text(),
        "dispatched"
    );
    assert!(
        s.command_ack(&super::route("gw-b", &node, e2), &b.id, false)
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_command(&b.id).await.unwrap().unwrap().state.text(),
        "acked"
    );
}

/// Only the migration that began keeping results' signatures lists the
/// results from before it: a result written unsigned later is no legacy,
/// and the list takes no new name.
pub async fn no_result_becomes_legacy_after_the_migration(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let (c, _) = s
        .create_command(
            &command(&node, Kind::ExecRun, "x"),
            Box::new(|_| b"signed".to_vec()),
        )
        .await
        .unwrap();
    // Ended with no node's signature (its deadline swept): not legacy.
    f.advance(Duration::from_secs(61));
    assert_eq!(
        s.sweep_commands(&super::controller(s).await).await.unwrap(),
        vec![c.id.clone()]
    );
    let row = s.get_command(&c.id).await.unwrap().unwrap();
    assert_eq!((row.state.text(), row.legacy), ("expired", false));
    assert!(row.signed_result.is_none());
    let sql = format!(
        "INSERT INTO legacy_results (command_id) VALUES ('{}')",
        c.id
    );
    let refused = f.try_tamper(&sql).await.expect_err(&sql);
    assert!(refused.contains("written once"), "{sql}: {refused}");
    assert!(!s.get_command(&c.id).await.unwrap().unwrap().legacy);
}

/// A finished command's ending is written once: no writer turns a result,
/// a failure or an expiry into another ending afterwards, and what the
/// store itself writes on a finished command (a late result, an ack)
/// leaves it as it was.
pub async fn a_finished_commands_ending_is_written_once(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let mut ids = Vec::new();
    for summary in ["done", "swept"] {
        let (c, _) = s
            .create_command(
                &command(&node, Kind::ExecRun, summary),
                Box::new(|_| b"signed".to_vec()),
            )
            .await
            .unwrap();
        ids.push(c.id);
    }
    assert_eq!(
        s.command_result(
            &node,
            &result(&node, 1, &ids[0], Outcome::Succeeded),
            verify
        )
        .await
        .unwrap(),
        ResultApplied::Applied
    );
    f.advance(Duration::from_secs(61));
    assert_eq!(
        s.sweep_commands(&super::controller(s).await).await.unwrap(),
        vec![ids[1].clone()]
    );
    let before: Vec<_> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(s.get_command(id).await.unwrap().unwrap());
        }
        v
    };
    for (id, sql) in [
        (&ids[0], "state = 'failed', reason = 'journal-lost'"),
        (&ids[0], "reason = 'rebooted'"),
        (&ids[0], "exit_code = 1"),
        (&ids[0], "output = result_payload"),
        (&ids[0], "result_payload = NULL, result_signature = NULL"),
        (&ids[0], "result_at = 0"),
        (&ids[0], "state = 'running'"),
        (&ids[1], "state = 'succeeded', reason = 'rebooted'"),
        (&ids[1], "state = 'pending'"),
    ] {
        let sql = format!("UPDATE commands SET {sql} WHERE id = '{id}'");
        let refused = f.try_tamper(&sql).await.expect_err(&sql);
        assert!(refused.contains("written once"), "{sql}: {refused}");
    }
    // What the store writes on a finished command changes nothing.
    assert_eq!(
        s.command_result(&node, &result(&node, 1, &ids[0], Outcome::Failed), verify)
            .await
            .unwrap(),
        ResultApplied::Duplicate
    );
    assert!(
        !s.command_ack(&super::route("gw", &node, 1), &ids[1], true)
            .await
            .unwrap()
    );
    // Columns that are not the ending still move.
    f.tamper(&format!(
        "UPDATE commands SET updated_at = updated_at + 1 WHERE id = '{}'",
        ids[0]
    ))
    .await;
    for (id, was) in ids.iter().zip(&before) {
        let row = s.get_command(id).await.unwrap().unwrap();
        assert_eq!(
            (
                &row.state,
                &row.reason,
                &row.signed_result,
                row.result_at_ms
            ),
            (
                &was.state,
                &was.reason,
                &was.signed_result,
                was.result_at_ms
            )
        );
    }
}

pub async fn signed_results_wait_for_one_receipt_that_only_their_node_reads(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let other = joined(s, 2).await;
    let (a, _) = s
        .create_command(&command(&node, Kind::ExecRun, "a"), Box::new(|_| vec![]))
        .await
        .unwrap();
    let (b, _) = s
        .create_command(&command(&node, Kind::ExecRun, "b"), Box::new(|_| vec![]))
        .await
        .unwrap();
    assert!(
        s.results_unreceipted(10).await.unwrap().is_empty(),
        "no result yet"
    );
    s.command_result(&node, &result(&node, 1, &a.id, Outcome::Succeeded), verify)
        .await
        .unwrap();
    assert_eq!(s.results_unreceipted(10).await.unwrap(), [a.id.as_str()]);
    let ids = vec![a.id.clone(), b.id.clone()];
    assert!(s.result_receipts(&node, &ids).await.unwrap().is_empty());
    s.put_result_receipt(&a.id, b"receipt-a").await.unwrap();
    // Once only: a second judgement changes nothing.
    s.put_result_receipt(&a.id, b"other").await.unwrap();
    assert!(s.results_unreceipted(10).await.unwrap().is_empty());
    assert_eq!(
        s.gateway().result_receipts(&node, &ids).await.unwrap(),
        vec![(a.id.clone(), b"receipt-a".to_vec())]
    );
    assert!(
        s.result_receipts(&other, &ids).await.unwrap().is_empty(),
        "another node's session reads none of it"
    );
    // Judged and given none: nothing to hand on.
    s.command_result(&node, &result(&node, 1, &b.id, Outcome::Failed), verify)
        .await
        .unwrap();
    assert_eq!(s.results_unreceipted(10).await.unwrap(), [b.id.as_str()]);
    s.put_result_receipt(&b.id, b"").await.unwrap();
    assert!(s.results_unreceipted(10).await.unwrap().is_empty());
    // Listed empty, so a gateway stops waiting for it.
    let mut listed = s.result_receipts(&node, &ids).await.unwrap();
    listed.sort();
    let mut want = vec![
        (a.id.clone(), b"receipt-a".to_vec()),
        (b.id.clone(), vec![]),
    ];
    want.sort();
    assert_eq!(listed, want);
}

/// A result a node signed for a command the store does not know is kept
/// for the key holder's receipt, through the gateway's interface: once,
/// beside one planted under the same id with other bytes, each judged
/// once; only a receipt given goes to the node; at most
/// `UNKNOWN_RESULTS_PER_NODE` a node.
pub async fn unknown_results_are_kept_for_one_receipt_and_bounded(f: Fixture) {
    use bc_store::commands::{UNKNOWN_RESULTS_PER_NODE, UnknownResult};
    let s = &f.store;
    let node = joined(s, 1).await;
    let other = joined(s, 2).await;
    let own = UnknownResult {
        node_id: node.clone(),
        command_id: "cmd-gone".into(),
        payload: b"signed bytes".to_vec(),
        signature: b"sig".to_vec(),
    };
    let gw = s.gateway();
    assert!(gw.put_unknown_result(&own).await.unwrap());
    assert!(
        gw.put_unknown_result(&own).await.unwrap(),
        "again: kept once"
    );
    let planted = UnknownResult {
        payload: b"other bytes".to_vec(),
        ..own.clone()
    };
    assert!(gw.put_unknown_result(&planted).await.unwrap());
    let mut waiting = s.unknown_results_unreceipted(10).await.unwrap();
    waiting.sort_by(|a, b| a.payload.cmp(&b.payload));
    assert_eq!(waiting, vec![planted.clone(), own.clone()]);
    let ids = [CommandId::from("cmd-gone")];
    assert!(gw.result_receipts(&node, &ids).await.unwrap().is_empty());
    s.put_unknown_result_receipt(&own, b"receipt")
        .await
        .unwrap();
    s.put_unknown_result_receipt(&own, b"again").await.unwrap();
    s.put_unknown_result_receipt(&planted, b"").await.unwrap();
    assert_eq!(
        gw.result_receipts(&node, &ids).await.unwrap(),
        vec![(CommandId::from("cmd-gone"), b"receipt".to_vec())],
        "the one receipt given, once"
    );
    assert!(gw.result_receipts(&other, &ids).await.unwrap().is_empty());
    assert!(s.unknown_results_unreceipted(10).await.unwrap().is_empty());

    // A result judged unsigned is not kept (it takes no room), one
    // receipted is: 1 held, then up to the bound, then none.
    for i in 1..UNKNOWN_RESULTS_PER_NODE {
        let r = UnknownResult {
            command_id: CommandId::from(format!("cmd-{i}")),
            ..own.clone()
        };
        assert!(gw.put_unknown_result(&r).await.unwrap(), "{i}");
    }
    let past = UnknownResult {
        command_id: "cmd-past".into(),
        ..own.clone()
    };
    assert!(!gw.put_unknown_result(&past).await.unwrap());
    assert!(
        gw.put_unknown_result(&UnknownResult {
            node_id: other.clone(),
            ..past
        })
        .await
        .unwrap(),
        "another node's bound is its own"
    );
}
