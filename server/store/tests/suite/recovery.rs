//! What a restart relies on: the audit chain across processes and
//! reopenings, and the reconcile every start runs.

use std::time::Duration;

use bc_store::audit::verify_chain;
use bc_store::liveness::LivenessRules;
use bcd_core::command::Kind;

use super::commands::command;
use super::{Fixture, hello, joined, lease};

async fn intact(s: &bc_store::Store) -> bc_store::audit::AuditSnapshot {
    let snap = s.audit_snapshot().await.unwrap();
    let broken = verify_chain(&snap.audit, &snap.heads);
    assert!(broken.is_empty(), "{broken:?}");
    snap
}

/// How many records the chains' heads count.
fn sealed(snap: &bc_store::audit::AuditSnapshot) -> i64 {
    snap.heads.iter().map(|h| h.seq).sum()
}

pub async fn the_audit_history_is_one_chain_across_handles_and_reopenings(f: Fixture) {
    let a = f.store.clone();
    let b = f.reopen().await;
    let n1 = joined(&a, 1).await;
    let n2 = joined(&b, 2).await;
    // Two handles writing at once, as two processes would.
    let (x, y) = tokio::join!(
        async {
            for _ in 0..5 {
                a.hello(&hello(&n1, 1, "gw", 0)).await.unwrap();
            }
        },
        async {
            for _ in 0..5 {
                b.hello(&hello(&n2, 2, "gw-a", 0)).await.unwrap();
            }
        }
    );
    let ((), ()) = (x, y);
    let before = intact(&a).await;
    assert!(before.audit.len() >= 10, "{}", before.audit.len());
    assert_eq!(sealed(&before), before.audit.len() as i64);
    // A new handle (a restarted process, a database restart) continues the
    // same sequence: no number repeats.
    drop(b);
    let c = f.reopen().await;
    c.create_command(&command(&n1, Kind::ExecRun, "x"), Box::new(|_| vec![]))
        .await
        .unwrap();
    c.hello(&hello(&n1, 1, "gw", 0)).await.unwrap();
    let after = intact(&c).await;
    assert!(sealed(&after) > sealed(&before));
    assert_eq!(&after.audit[..before.audit.len()], &before.audit[..]);
    let places: Vec<i64> = after.audit.iter().map(|r| r.id).collect();
    assert_eq!(places, (1..=after.audit.len() as i64).collect::<Vec<_>>());
    // Each chain numbers its records 1, 2, 3... with no gap, and each
    // node's records are in one chain, numbered in the order they were
    // written. Two nodes can share a chain; their records are numbered as
    // their transactions commit, which on PostgreSQL need not be the order
    // their rows were inserted in.
    let mut chains: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    let mut nodes: std::collections::BTreeMap<&str, Vec<i64>> = Default::default();
    for r in &after.audit {
        chains.entry(r.chain).or_default().push(r.seq);
        if !r.node_id.is_empty() {
            assert_eq!(r.chain, bc_store::audit::chain_of(&r.node_id, ""), "{r:?}");
            nodes.entry(&r.node_id).or_default().push(r.seq);
        }
    }
    for seqs in chains.values_mut() {
        seqs.sort_unstable();
        assert_eq!(*seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    }
    for (node, seqs) in nodes {
        assert!(seqs.is_sorted(), "{node}: {seqs:?}");
    }
}

pub async fn reconcile_clears_dead_leases_keeps_live_ones_and_is_idempotent(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    // gw-dead held a lease for 10 s, routed a node, and died.
    lease(s, "gw-dead", Duration::from_secs(10)).await;
    s.hello(&hello(&node, 1, "gw-dead", 0)).await.unwrap();
    let grace = Duration::from_secs(120);
    f.advance(Duration::from_secs(60));
    let first = s.reconcile("gw-new", grace).await.unwrap();
    assert!(
        first.leases_removed.is_empty(),
        "within the grace: {first:?}"
    );
    assert_eq!(first.routes_to_dead_gateways, 1, "{first:?}");
    f.advance(Duration::from_secs(80));
    let second = s.reconcile("gw-new", grace).await.unwrap();
    assert_eq!(second.leases_removed, vec!["gateway:gw-dead".to_string()]);
    // Live leases (the fixture's gateways hold theirs for an hour) stay.
    let names: Vec<String> = s
        .leases()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert!(names.contains(&"gateway:gw".to_string()), "{names:?}");
    assert!(!names.contains(&"gateway:gw-dead".to_string()), "{names:?}");
    // The liveness sweep takes the route over; reconcile derives the node's
    // conditions from what the sweep decided, and changes nothing twice.
    let rules = LivenessRules {
        node_lease_ttl: Duration::from_secs(1),
        gateway_loss_grace: Duration::from_secs(1),
        outage_gap: Duration::from_secs(3600),
        outage_hold: Duration::from_secs(1),
    };
    s.sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    s.sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    let third = s.reconcile("gw-new", grace).await.unwrap();
    let fourth = s.reconcile("gw-new", grace).await.unwrap();
    assert_eq!(third, fourth);
    assert!(fourth.leases_removed.is_empty() && fourth.derived_fixed.is_empty());
    assert_eq!(fourth.routes_to_dead_gateways, 0, "{fourth:?}");
    // Each reconcile is audited, and the history stays one chain.
    let snap = intact(s).await;
    let audited: Vec<&str> = snap
        .audit
        .iter()
        .filter(|r| r.kind == "reconcile")
        .map(|r| r.gateway_id.as_str())
        .collect();
    assert_eq!(audited, vec!["gw-new"; 4]);
}

pub async fn the_sweeper_removes_only_leases_dead_past_the_grace(f: Fixture) {
    let s = &f.store;
    lease(s, "gw-gone", Duration::from_secs(1)).await;
    let grace = Duration::from_secs(120);
    f.advance(Duration::from_secs(121));
    assert!(
        s.remove_dead_leases(grace, &super::controller(s).await)
            .await
            .unwrap()
            .is_empty()
    );
    f.advance(Duration::from_secs(1));
    assert_eq!(
        s.remove_dead_leases(grace, &super::controller(s).await)
            .await
            .unwrap(),
        vec!["gateway:gw-gone".to_string()]
    );
    assert!(
        s.remove_dead_leases(grace, &super::controller(s).await)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn racing_joins_never_burn_one_token_on_two_identities(f: Fixture) {
    use super::{fake_cert, join_input, token};
    let s = &f.store;
    let other = f.reopen().await;
    s.create_token(&token("race", Duration::from_secs(60), 1))
        .await
        .unwrap();
    // Eight joins at once on a single-use token, through two handles (two
    // processes): one identity, the other seven refused.
    let joins = (0..8u8).map(|i| {
        let store = if i % 2 == 0 { s.clone() } else { other.clone() };
        async move {
            store
                .join(
                    &join_input("race", "h"),
                    Box::new(move |_, _| Ok(fake_cert(100 + i))),
                )
                .await
        }
    });
    let outcomes = futures_join_all(joins).await;
    let won: Vec<_> = outcomes.iter().filter(|o| o.is_ok()).collect();
    assert_eq!(won.len(), 1, "{outcomes:?}");
    for o in outcomes.iter().filter(|o| o.is_err()) {
        assert_eq!(
            o.as_ref().unwrap_err().refusal(),
            Some(&bc_store::Refusal::UsedToken),
            "{o:?}"
        );
    }
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 1);
}

/// Runs the futures concurrently on the test's runtime; their outputs in
/// order.
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("a join task"));
    }
    out
}

pub async fn a_hello_after_a_crash_loop_shows_it_and_the_next_clears_it(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let mut h = hello(&node, 1, "gw", 0);
    h.daemon_exits = 2;
    s.hello(&h).await.unwrap();
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert!(row.conditions.is_empty(), "{:?}", row.conditions);
    h.daemon_exits = 3;
    s.hello(&h).await.unwrap();
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert_eq!(row.conditions, vec!["DaemonCrashLoop".to_string()]);
    // A reconcile keeps it: it is not derived from the session.
    s.reconcile("gw", Duration::from_secs(120)).await.unwrap();
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert_eq!(row.conditions, vec!["DaemonCrashLoop".to_string()]);
    h.daemon_exits = 0;
    s.hello(&h).await.unwrap();
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert!(row.conditions.is_empty(), "{:?}", row.conditions);
}

pub async fn history_peers_can_add_to_is_pruned_to_its_limits(f: Fixture) {
    use super::commands::result;
    use bc_store::images::BootRecord;
    use bc_store::reconcile::{HistoryLimits, Pruned};
    use bcd_core::command::Outcome;
    let s = &f.store;
    let node = joined(s, 1).await;
    let other = joined(s, 2).await;
    let (c, _) = s
        .create_command(&command(&node, Kind::ExecRun, "x"), Box::new(|_| vec![]))
        .await
        .unwrap();
    // Six forged results on node's session, two on other's: security events.
    for (n, times) in [(&node, 6), (&other, 2)] {
        for _ in 0..times {
            s.command_result(n, &result(n, 9, &c.id, Outcome::Succeeded), super::verify)
                .await
                .unwrap();
        }
    }
    for i in 0..5 {
        for mac in ["52:54:00:00:00:01", "52:54:00:00:00:02"] {
            s.record_boot(&BootRecord {
                mac: mac.into(),
                image_id: None,
                remote: format!("10.0.0.{i}"),
                outcome: "script".into(),
            })
            .await
            .unwrap();
        }
    }
    let limits = HistoryLimits {
        fleet_events_per_node: 4,
        boots_per_mac: 3,
        boots: 5,
    };
    let newest_events = s.fleet_events(&node, 4).await.unwrap();
    let newest_boot = s.boots(None, 1).await.unwrap();
    assert_eq!(
        s.prune_history(limits, &super::controller(s).await)
            .await
            .unwrap(),
        Pruned {
            fleet_events: 2,
            boots: 5
        }
    );
    // The newest of each stay.
    assert_eq!(s.fleet_events(&node, 50).await.unwrap(), newest_events);
    assert_eq!(s.fleet_events(&other, 50).await.unwrap().len(), 2);
    assert_eq!(s.boots(None, 50).await.unwrap().len(), 5);
    assert_eq!(s.boots(None, 1).await.unwrap(), newest_boot);
    for mac in ["52:54:00:00:00:01", "52:54:00:00:00:02"] {
        assert!(s.boots(Some(mac), 50).await.unwrap().len() <= 3);
    }
    // Nothing more to do.
    assert_eq!(
        s.prune_history(limits, &super::controller(s).await)
            .await
            .unwrap(),
        Pruned::default()
    );
}
