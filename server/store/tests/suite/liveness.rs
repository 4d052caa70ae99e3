use std::time::Duration;

use bc_store::GatewayId;
use bc_store::leases::LeaseRow;
use bc_store::liveness::{LivenessRules, SweepOutcome};
use bc_store::nodes::{CONDITION_UNREACHABLE, TAINT_UNREACHABLE};

use super::{Fixture, disconnect, hello, joined, lease};

pub async fn gateway_loss_then_unreachable_releases_nothing_and_hello_clears_it(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let rules = LivenessRules {
        node_lease_ttl: Duration::from_millis(200),
        gateway_loss_grace: Duration::from_millis(200),
        outage_gap: Duration::from_secs(20),
        outage_hold: Duration::from_secs(300),
    };
    lease(s, "gw-l", Duration::from_millis(20)).await;
    s.hello(&hello(&node, 1, "gw-l", 0)).await.unwrap();
    assert_eq!(
        s.sweep_liveness(&rules, &super::controller(s).await)
            .await
            .unwrap(),
        SweepOutcome::default()
    );
    f.advance(Duration::from_millis(20));
    assert_eq!(
        s.sweep_liveness(&rules, &super::controller(s).await)
            .await
            .unwrap(),
        SweepOutcome::default(),
        "the lease runs through its last millisecond"
    );
    f.advance(Duration::from_millis(1));
    let out = s
        .sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    assert_eq!(out.disconnected, vec![node.clone()]);
    // Last seen at the Hello (21 ms ago): unreachable after the node lease
    // TTL plus the grace, 400 ms after that.
    f.advance(Duration::from_millis(379));
    assert!(
        s.sweep_liveness(&rules, &super::controller(s).await)
            .await
            .unwrap()
            .unreachable
            .is_empty()
    );
    f.advance(Duration::from_millis(1));
    let out = s
        .sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    assert_eq!(out.unreachable, vec![node.clone()]);
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert_eq!(row.state.as_str(), "unreachable");
    assert_eq!(row.conditions, vec![CONDITION_UNREACHABLE.to_string()]);
    assert_eq!(row.taints, vec![TAINT_UNREACHABLE.to_string()]);
    assert!(row.cert_not_after_ms > 0, "the certificate is not revoked");
    assert!(
        s.sweep_liveness(&rules, &super::controller(s).await)
            .await
            .unwrap()
            .unreachable
            .is_empty(),
        "once"
    );
    s.hello(&hello(&node, 1, "gw2", 0)).await.unwrap();
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert_eq!(row.state.as_str(), "connected");
    assert!(row.conditions.is_empty() && row.taints.is_empty());
}

pub async fn a_sweep_gap_holds_timed_transitions(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let rules = LivenessRules {
        node_lease_ttl: Duration::ZERO,
        gateway_loss_grace: Duration::ZERO,
        outage_gap: Duration::from_millis(20),
        outage_hold: Duration::from_millis(100),
    };
    lease(s, "gw-g", Duration::from_millis(10)).await;
    s.hello(&hello(&node, 1, "gw-g", 0)).await.unwrap();
    s.sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    // The gateway's lease ran out during a 30 ms gap in sweeps: held.
    f.advance(Duration::from_millis(30));
    let out = s
        .sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    assert!(out.held);
    assert!(out.disconnected.is_empty() && out.unreachable.is_empty());
    assert_eq!(
        s.session(&node).await.unwrap().unwrap().state.as_str(),
        "connected"
    );
    // Regular sweeps during the hold keep holding until it ends.
    for _ in 0..4 {
        f.advance(Duration::from_millis(20));
        assert!(
            s.sweep_liveness(&rules, &super::controller(s).await)
                .await
                .unwrap()
                .held
        );
    }
    f.advance(Duration::from_millis(20));
    let out = s
        .sweep_liveness(&rules, &super::controller(s).await)
        .await
        .unwrap();
    assert!(!out.held);
    assert_eq!(out.disconnected, vec![node.clone()]);
}

pub async fn leases_have_one_owner_until_they_expire(f: Fixture) {
    let s = &f.store;
    let ttl = Duration::from_millis(30);
    assert_eq!(
        s.renew_lease("gateway:a", "a", ttl).await.unwrap(),
        Some(super::T0),
        "a renewal answers the store's now"
    );
    assert!(
        s.renew_lease("gateway:a", "b", ttl)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        s.renew_lease("gateway:a", "a", ttl)
            .await
            .unwrap()
            .is_some()
    );
    f.advance(Duration::from_millis(30));
    assert!(
        s.renew_lease("gateway:a", "b", ttl)
            .await
            .unwrap()
            .is_none(),
        "not before it expires"
    );
    f.advance(Duration::from_millis(1));
    assert!(
        s.renew_lease("gateway:a", "b", ttl)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        s.renew_lease("gateway:a", "a", ttl)
            .await
            .unwrap()
            .is_none()
    );
    s.release_lease("gateway:a", "a").await.unwrap();
    assert!(
        s.renew_lease("gateway:a", "a", ttl)
            .await
            .unwrap()
            .is_none(),
        "only the owner releases"
    );
    s.release_lease("gateway:a", "b").await.unwrap();
    assert!(
        s.renew_lease("gateway:a", "a", ttl)
            .await
            .unwrap()
            .is_some()
    );
}

pub async fn the_fleet_size_counts_connected_sessions_and_live_gateways(f: Fixture) {
    let s = &f.store;
    // The fixture's four gateways hold their leases.
    let size = s.fleet_size().await.unwrap();
    assert_eq!((size.connected, size.gateways), (0, 4));
    let (a, b) = (joined(s, 1).await, joined(s, 2).await);
    let ea = s.hello(&hello(&a, 1, "gw", 0)).await.unwrap().epoch;
    s.hello(&hello(&b, 2, "gw2", 0)).await.unwrap();
    lease(s, "gw-short", Duration::from_millis(10)).await;
    assert_eq!(s.fleet_size().await.unwrap().gateways, 5);
    f.advance(Duration::from_millis(11));
    assert!(disconnect(s, &a, ea, Duration::ZERO).await);
    let size = s.fleet_size().await.unwrap();
    assert_eq!((size.connected, size.gateways), (1, 4));
}

pub async fn the_fleet_absorbs_what_its_live_gateways_reported(f: Fixture) {
    let s = &f.store;
    // Nothing reported yet: 0 (the gateways fall back to their floors).
    assert_eq!(s.fleet_size().await.unwrap().absorbs_per_s, 0);
    s.report_absorption(&GatewayId::from("gw"), 450)
        .await
        .unwrap();
    s.report_absorption(&GatewayId::from("gw2"), 300)
        .await
        .unwrap();
    assert_eq!(s.fleet_size().await.unwrap().absorbs_per_s, 750);
    // A report replaces the last one; a gateway without its lease writes
    // nothing; a lapsed gateway's figure stops counting with it.
    s.report_absorption(&GatewayId::from("gw"), 200)
        .await
        .unwrap();
    s.report_absorption(&GatewayId::from("gw-nobody"), 10_000)
        .await
        .unwrap();
    assert_eq!(s.fleet_size().await.unwrap().absorbs_per_s, 500);
    lease(s, "gw-short", Duration::from_millis(10)).await;
    s.report_absorption(&GatewayId::from("gw-short"), 1_000)
        .await
        .unwrap();
    assert_eq!(s.fleet_size().await.unwrap().absorbs_per_s, 1_500);
    f.advance(Duration::from_millis(11));
    let size = s.fleet_size().await.unwrap();
    assert_eq!((size.gateways, size.absorbs_per_s), (4, 500));
}

pub async fn leases_are_listed_with_owner_and_expiry(f: Fixture) {
    let s = &f.store;
    // Only the leases this test takes (a fixture may hold others).
    let mine = || async {
        s.leases()
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.owner == "listed")
            .collect::<Vec<_>>()
    };
    assert!(mine().await.is_empty());
    let ttl = Duration::from_millis(30);
    s.renew_lease("gateway:listed", "listed", ttl)
        .await
        .unwrap();
    f.advance(Duration::from_millis(5));
    s.renew_lease("controller:listed", "listed", ttl)
        .await
        .unwrap();
    let rows = mine().await;
    assert_eq!(
        rows,
        [
            LeaseRow {
                name: "controller:listed".into(),
                owner: "listed".into(),
                expires_at_ms: super::T0 + 35,
                renewed_at_ms: super::T0 + 5,
            },
            LeaseRow {
                name: "gateway:listed".into(),
                owner: "listed".into(),
                expires_at_ms: super::T0 + 30,
                renewed_at_ms: super::T0,
            },
        ]
    );
    let now = super::T0 + 31;
    assert!(rows[0].live(now) && !rows[1].live(now));
    s.release_lease("gateway:listed", "listed").await.unwrap();
    assert_eq!(mine().await.len(), 1, "a released lease is gone");
}

/// A controller's write names the lease as it was held: once the lease ran
/// out, went to another owner, or was taken again by the same owner after
/// it lapsed (a new generation), the write changes nothing.
pub async fn a_controller_writes_only_under_the_lease_it_holds(f: Fixture) {
    let s = &f.store;
    let ttl = Duration::from_secs(10);
    let grace = Duration::from_secs(60);
    // A gateway lease its holder left behind, dead past the grace.
    lease(s, "gone", Duration::from_secs(1)).await;
    f.advance(Duration::from_secs(3_600));
    let name = bc_store::leases::controller_lease("sweeper");
    let a = s.hold_lease(&name, "a", ttl).await.unwrap().unwrap();
    // Renewed in time: the same generation.
    f.advance(Duration::from_secs(5));
    let renewed = s.hold_lease(&name, "a", ttl).await.unwrap().unwrap();
    assert_eq!(renewed.generation, a.generation);
    assert!(s.hold_lease(&name, "b", ttl).await.unwrap().is_none());
    // It runs out: a write under it is refused and leaves the dead lease.
    f.advance(Duration::from_secs(11));
    let lost = |e: bc_store::StoreError| match e {
        bc_store::StoreError::LeaseLost { lease, owner, .. } => (lease, owner),
        other => panic!("not LeaseLost: {other}"),
    };
    let e = s.remove_dead_leases(grace, &renewed).await.unwrap_err();
    assert_eq!(lost(e), (name.clone(), "a".to_string()));
    assert!(
        s.leases()
            .await
            .unwrap()
            .iter()
            .any(|l| l.name == "gateway:gone")
    );
    // Its owner takes it again: a new generation, and a write naming the
    // old one is still refused.
    let again = s.hold_lease(&name, "a", ttl).await.unwrap().unwrap();
    assert_eq!(again.generation, a.generation + 1);
    assert!(s.sweep_commands(&renewed).await.is_err());
    assert_eq!(
        s.remove_dead_leases(grace, &again).await.unwrap(),
        vec!["gateway:gone".to_string()]
    );
    // Another owner takes it over: the old holder writes nothing.
    f.advance(Duration::from_secs(11));
    let b = s.hold_lease(&name, "b", ttl).await.unwrap().unwrap();
    assert_eq!(b.generation, again.generation + 1);
    assert!(s.sweep_commands(&again).await.is_err());
    assert!(s.sweep_commands(&b).await.unwrap().is_empty());
    let rules = LivenessRules {
        node_lease_ttl: Duration::from_secs(40),
        gateway_loss_grace: Duration::from_secs(60),
        outage_gap: Duration::from_secs(20),
        outage_hold: Duration::from_secs(300),
    };
    assert!(s.sweep_liveness(&rules, &again).await.is_err());
    // Released and taken by its next owner: new again.
    s.release_lease(&name, "b").await.unwrap();
    let c = s.hold_lease(&name, "c", ttl).await.unwrap().unwrap();
    assert!(s.sweep_commands(&b).await.is_err());
    assert!(s.sweep_commands(&c).await.is_ok());
}
