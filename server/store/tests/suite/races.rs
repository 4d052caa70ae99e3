//! Races between handles on one store, as between gateway processes: each
//! is run many times so both orders happen, or the interleaving that
//! would break its rule is forced (a transaction held open on the
//! database stalls one side between its read and its write while the
//! other runs); what must hold holds in every order.

use std::time::Duration;

use bc_store::commands::ResultApplied;
use bc_store::{GatewayId, NodeId, Refusal, TxError};
use bcd_core::command::{Kind, Outcome};

use super::commands::{command, result};
use super::{Fixture, hello, joined, lease, verify};

const ROUNDS: usize = 40;
/// Rounds of a race whose interleaving a held transaction forces.
const HELD_ROUNDS: usize = 3;

pub async fn two_hellos_for_one_node_get_distinct_epochs(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    for round in 0..ROUNDS {
        let (ha, hb) = (hello(&node, 1, "gw-a", 0), hello(&node, 1, "gw-b", 0));
        let (ra, rb) = tokio::join!(a.hello(&ha), b.hello(&hb));
        let (ea, eb) = (ra.unwrap().epoch, rb.unwrap().epoch);
        assert_ne!(ea, eb, "round {round}");
        let winner = if ea > eb { "gw-a" } else { "gw-b" };
        let s = a.session(&node).await.unwrap().unwrap();
        assert_eq!(
            (s.epoch, s.gateway_id.as_str()),
            (ea.max(eb), winner),
            "the later Hello owns the route"
        );
        assert_eq!(ea.max(eb), 2 * round as u64 + 2);
    }
    // Every route in the history carries a higher epoch than the last.
    let snap = a.audit_snapshot().await.unwrap();
    let epochs: Vec<u64> = snap
        .audit
        .iter()
        .filter(|r| r.kind == "route")
        .map(|r| r.epoch)
        .collect();
    assert_eq!(epochs, (1..=2 * ROUNDS as u64).collect::<Vec<_>>());
}

/// Forced: the first Hello has the node's row and stalls writing the
/// session (a held writer has that row); the second comes then. It must
/// queue on the node's row and read the first's epoch, not the one
/// before: without that lock both would route under one epoch.
pub async fn two_hellos_for_one_node_queue_on_the_nodes_row(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    a.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap();
    for round in 0..HELD_ROUNDS {
        let stalled = f
            .hold(&format!(
                "UPDATE node_sessions SET last_seen = last_seen WHERE node_id = '{node}'"
            ))
            .await;
        let (a2, ha) = (a.clone(), hello(&node, 1, "gw-a", 0));
        let first = tokio::spawn(async move { a2.hello(&ha).await });
        // The first has read the session and waits to write it.
        f.until_waiting(1).await;
        let (b2, hb) = (b.clone(), hello(&node, 1, "gw-b", 0));
        let second = tokio::spawn(async move { b2.hello(&hb).await });
        f.until_waiting(2).await;
        drop(stalled);
        let mut epochs = [
            first.await.unwrap().unwrap().epoch,
            second.await.unwrap().unwrap().epoch,
        ];
        epochs.sort_unstable();
        assert_eq!(
            epochs[1],
            epochs[0] + 1,
            "round {round}: the later Hello read the earlier one's epoch"
        );
        let s = a.session(&node).await.unwrap().unwrap();
        assert_eq!(s.epoch, epochs[1], "round {round}");
    }
}

/// Forced: a Hello through another gateway bumps the node's epoch and
/// stalls at its commit (a held writer has the audit chains' heads), the
/// command it replays locked; the old session's late ack comes then and
/// waits on that command. Once the Hello commits, the ack must match
/// nothing: the command stays dispatched under the new epoch, not acked.
pub async fn an_ack_against_an_epoch_bump_moves_nothing(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    for round in 0..HELD_ROUNDS {
        let e1 = a.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap().epoch;
        let (c, _) = a
            .create_command(&command(&node, Kind::ExecRun, ""), Box::new(|_| vec![]))
            .await
            .unwrap();
        let taken = a
            .take_dispatchable(&GatewayId::from("gw-a"), &node, e1)
            .await
            .unwrap();
        assert!(taken.iter().any(|d| d.id == c.id), "round {round}");
        let stalled = f.hold("UPDATE audit_head SET seq = seq").await;
        let (b2, h) = (b.clone(), hello(&node, 1, "gw-b", 0));
        let bump = tokio::spawn(async move { b2.hello(&h).await });
        f.until_waiting(1).await;
        let (a2, id) = (a.clone(), c.id.clone());
        let old = super::route("gw-a", &node, e1);
        let ack = tokio::spawn(async move { a2.command_ack(&old, &id, false).await });
        f.until_waiting(2).await;
        drop(stalled);
        let bumped = bump.await.unwrap().unwrap();
        ack.await.unwrap().unwrap();
        let row = a.get_command(&c.id).await.unwrap().unwrap();
        assert_eq!(
            (row.state.text(), row.epoch),
            ("dispatched", bumped.epoch),
            "round {round}: the old session's ack moved the replayed command"
        );
        a.command_result(&node, &result(&node, 1, &c.id, Outcome::Succeeded), verify)
            .await
            .unwrap();
    }
}

pub async fn a_hello_against_a_lease_takeover_never_routes_without_the_lease(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    // A session row to hold: the Hello below writes it last.
    lease(&a, "gw-x", Duration::from_secs(1)).await;
    a.hello(&hello(&node, 1, "gw-x", 0)).await.unwrap();
    for round in 0..HELD_ROUNDS {
        // gw-x holds its lease while its Hello reads it; the Hello then
        // waits on the node's session row, held by a stalled writer,
        // while the lease runs out and a newcomer takes it.
        lease(&a, "gw-x", Duration::from_millis(10)).await;
        let stalled = f
            .hold(&format!(
                "UPDATE node_sessions SET last_seen = last_seen WHERE node_id = '{node}'"
            ))
            .await;
        let h = hello(&node, 1, "gw-x", 0);
        let a2 = a.clone();
        let routing = tokio::spawn(async move { a2.hello(&h).await });
        // The Hello has read the lease and waits on the session row.
        f.until_waiting(1).await;
        f.advance(Duration::from_millis(11));
        let b2 = b.clone();
        let takeover = tokio::spawn(async move {
            b2.renew_lease("gateway:gw-x", "newcomer", Duration::from_millis(10))
                .await
        });
        // The takeover waits on the lease the Hello holds FOR SHARE.
        f.until_waiting(2).await;
        drop(stalled);
        let (routed, took) = (routing.await.unwrap(), takeover.await.unwrap());
        assert!(
            took.unwrap().is_some(),
            "round {round}: an expired lease is free"
        );
        // Whatever the order, a route of gw-x's comes before the lease
        // left it: the Hello fenced itself, or it finished first and the
        // takeover waited for it.
        let snap = a.audit_snapshot().await.unwrap();
        let taken = snap
            .audit
            .iter()
            .rev()
            .find(|r| r.kind == "lease" && r.gateway_id == "newcomer")
            .expect("the takeover is audited")
            .id;
        let last_route = snap
            .audit
            .iter()
            .rev()
            .find(|r| r.kind == "route" && r.gateway_id == "gw-x")
            .map(|r| r.id);
        match routed {
            Ok(_) => assert!(
                last_route.is_some_and(|id| id < taken),
                "round {round}: gw-x routed (audit {last_route:?}) after its lease \
                 went to another (audit {taken})"
            ),
            Err(TxError::Refused(Refusal::Fenced(_))) => {}
            Err(e) => panic!("round {round}: {e:?}"),
        }
        b.release_lease("gateway:gw-x", "newcomer").await.unwrap();
    }
    // While gw-x holds it, the newcomer cannot take it, and gw-x routes.
    lease(&a, "gw-x", Duration::from_secs(1)).await;
    let h = hello(&node, 1, "gw-x", 0);
    let (routed_by_x, took) = tokio::join!(
        a.hello(&h),
        b.renew_lease("gateway:gw-x", "newcomer", Duration::from_millis(10))
    );
    assert!(took.unwrap().is_none());
    routed_by_x.unwrap();
}

pub async fn dispatch_against_an_epoch_bump_is_replayed_or_left_pending(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    let (mut before, mut after) = (0, 0);
    for round in 0..HELD_ROUNDS {
        let e1 = a.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap().epoch;
        let (c, _) = a
            .create_command(&command(&node, Kind::ExecRun, ""), Box::new(|_| vec![]))
            .await
            .unwrap();
        // The dispatch has read the session and waits to mark the command
        // (a stalled writer holds its row) when the Hello that bumps the
        // epoch comes; then the writer lets go.
        let stalled = f
            .hold(&format!(
                "UPDATE commands SET updated_at = updated_at WHERE id = '{}'",
                c.id
            ))
            .await;
        let a2 = a.clone();
        let n2 = node.clone();
        let dispatch = tokio::spawn(async move {
            a2.take_dispatchable(&GatewayId::from("gw-a"), &n2, e1)
                .await
        });
        // The dispatch has read the session and waits on the command row.
        f.until_waiting(1).await;
        let (b2, h) = (b.clone(), hello(&node, 1, "gw-b", 0));
        let bump = tokio::spawn(async move { b2.hello(&h).await });
        // The Hello waits on the session the dispatch holds FOR SHARE.
        f.until_waiting(2).await;
        drop(stalled);
        let (taken, bumped) = (dispatch.await.unwrap(), bump.await.unwrap());
        let (taken, bumped) = (taken.unwrap(), bumped.unwrap());
        let row = a.get_command(&c.id).await.unwrap().unwrap();
        if taken.iter().any(|d| d.id == c.id) {
            // Dispatched first: the Hello moved it to the new epoch and
            // replays it.
            before += 1;
            assert!(bumped.replay.iter().any(|d| d.id == c.id), "round {round}");
            assert_eq!((row.state.text(), row.epoch), ("dispatched", bumped.epoch));
        } else {
            // The bump came first: nothing went to the old session; the
            // command waits for the new one.
            after += 1;
            assert!(bumped.replay.is_empty(), "round {round}");
            assert_eq!(row.state.text(), "pending");
            let d = b
                .take_dispatchable(&GatewayId::from("gw-b"), &node, bumped.epoch)
                .await
                .unwrap();
            assert_eq!(d.len(), 1);
        }
        // Finish it so the next round starts clean.
        a.command_result(&node, &result(&node, 1, &c.id, Outcome::Succeeded), verify)
            .await
            .unwrap();
    }
    assert_eq!(before + after, HELD_ROUNDS);
}

pub async fn of_two_results_the_first_wins(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    for round in 0..ROUNDS {
        let (c, _) = a
            .create_command(&command(&node, Kind::ExecRun, ""), Box::new(|_| vec![]))
            .await
            .unwrap();
        let (ok, failed) = (
            result(&node, 1, &c.id, Outcome::Succeeded),
            result(&node, 1, &c.id, Outcome::Failed),
        );
        let (ra, rb) = tokio::join!(
            a.command_result(&node, &ok, verify),
            b.command_result(&node, &failed, verify)
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let state = a.get_command(&c.id).await.unwrap().unwrap().state;
        match (ra, rb) {
            (ResultApplied::Applied, ResultApplied::Duplicate) => {
                assert_eq!(state.text(), "succeeded")
            }
            (ResultApplied::Duplicate, ResultApplied::Applied) => {
                assert_eq!(state.text(), "failed")
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    let snap = a.audit_snapshot().await.unwrap();
    assert_eq!(
        snap.audit.iter().filter(|r| r.kind == "result").count(),
        ROUNDS,
        "one terminal result per command"
    );
}

/// Many writes at once, some refused: each is its own transaction. The
/// refused ones change nothing; the others all land, in one order.
pub async fn concurrent_writes_are_each_their_own_transaction(f: Fixture) {
    let (a, b) = (f.store.clone(), f.reopen().await);
    let node = joined(&a, 1).await;
    let mut tasks = Vec::new();
    for i in 0..48 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        let target = if i % 3 == 0 {
            NodeId::from("nd-nope")
        } else {
            node.clone()
        };
        tasks.push(tokio::spawn(async move {
            s.create_command(
                &command(&target, Kind::ExecRun, ""),
                Box::new(|c| c.id.to_string().into_bytes()),
            )
            .await
        }));
    }
    let mut seqs = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok((row, true)) => {
                assert!(i % 3 != 0);
                seqs.push(row.seq);
            }
            Err(TxError::Refused(Refusal::NoSuchNode(_))) => assert_eq!(i % 3, 0),
            other => panic!("write {i}: {other:?}"),
        }
    }
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..=32).collect::<Vec<_>>(),
        "one sequence each, no gaps"
    );
    let (next, _) = a
        .create_command(&command(&node, Kind::ExecRun, ""), Box::new(|_| vec![]))
        .await
        .unwrap();
    assert_eq!(next.seq, 33);
    assert_eq!(a.list_commands(Some(&node), 100).await.unwrap().len(), 33);
}
