use std::time::Duration;

use bc_store::commands::NewCommand;
use bc_store::nodes::IssuedCert;
use bc_store::sessions::{Ended, HelloInput, Seen, SessionKey};
use bc_store::{GatewayId, NodeId, Refusal, TxError};
use bcd_core::command::{Kind, ServerState};

use bc_store::inventory::InventoryInput;
use bc_store::nodes::Signed;
use bc_store::specs::FactApplied;

use super::{
    Fixture, T0, disconnect, fake_cert, hello, joined, joined_with, lease, proved, signed, verify,
};

/// The `gpus` section of `node` (certificate 1), sent under `epoch`.
fn inventory(node: &str, epoch: u64) -> Signed<InventoryInput> {
    signed(
        1,
        InventoryInput {
            node_id: node.into(),
            epoch,
            section: bcd_core::report::InventorySection::Gpus,
            sha256: "abc".into(),
            body: b"[]".to_vec(),
        },
    )
}

fn seen(node: &str, epoch: u64) -> Vec<Seen> {
    vec![Seen {
        node_id: node.into(),
        epoch,
        age: Duration::ZERO,
    }]
}

pub async fn hello_bumps_the_epoch_and_stale_writes_change_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let first = s.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap();
    assert_eq!(first.epoch, 1);
    assert_eq!(first.server_time_ms, T0);
    assert_eq!(first.inventory_wanted, vec!["gpus".to_string()]);
    let second = s.hello(&hello(&node, 1, "gw-b", 0)).await.unwrap();
    assert_eq!(second.epoch, 2);
    // gw-a's late writes under epoch 1 are fenced.
    assert!(!disconnect(s, &node, 1, Duration::ZERO).await);
    let gone = s
        .flush_liveness(&GatewayId::from("gw-a"), &seen(&node, 1))
        .await
        .unwrap();
    assert_eq!(
        gone,
        vec![SessionKey {
            node_id: node.clone(),
            epoch: 1
        }]
    );
    assert_eq!(
        s.put_inventory(&node, 1, &inventory(&node, 1), verify)
            .await
            .unwrap(),
        FactApplied::Stale
    );
    let sess = s.session(&node).await.unwrap().unwrap();
    assert_eq!(
        (sess.epoch, sess.gateway_id.as_str(), sess.state.as_str()),
        (2, "gw-b", "connected")
    );
    assert_eq!(
        s.connected_to(&GatewayId::from("gw-b")).await.unwrap(),
        vec![node.clone()]
    );
    assert!(
        s.connected_to(&GatewayId::from("gw-a"))
            .await
            .unwrap()
            .is_empty()
    );
    // The current session's writes apply.
    assert!(
        s.flush_liveness(&GatewayId::from("gw-b"), &seen(&node, 2))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.put_inventory(&node, 2, &inventory(&node, 2), verify)
            .await
            .unwrap(),
        FactApplied::Applied
    );
    let inv = s
        .inventory(&node, bcd_core::report::InventorySection::Gpus)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (inv.sha256.as_str(), inv.body.as_slice()),
        ("abc", &b"[]"[..])
    );
    f.advance(Duration::from_secs(5));
    assert!(disconnect(s, &node, 2, Duration::from_secs(2)).await);
    assert_eq!(
        s.session(&node).await.unwrap().unwrap().state.as_str(),
        "disconnected"
    );
    let row = s.list_nodes().await.unwrap().nodes.remove(0);
    assert_eq!(row.last_seen_age_ms, 2_000, "last seen = now - the age");
    // Inventory now matches: not wanted again.
    let third = s.hello(&hello(&node, 1, "gw-a", 0)).await.unwrap();
    assert!(third.inventory_wanted.is_empty());
}

pub async fn epoch_rises_above_what_the_node_saw(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    assert_eq!(s.hello(&hello(&node, 1, "gw", 41)).await.unwrap().epoch, 42);
    assert_eq!(s.hello(&hello(&node, 1, "gw", 0)).await.unwrap().epoch, 43);
}

pub async fn deleted_nodes_and_foreign_certificates_are_refused(f: Fixture) {
    let s = &f.store;
    let a = joined(s, 1).await;
    let b = joined(s, 2).await;
    let refusal = |h: HelloInput| async move {
        match s.hello(&h).await {
            Err(TxError::Refused(r)) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(
        refusal(hello(&b, 1, "gw", 0)).await,
        Refusal::WrongCertificate(b.to_string())
    );
    assert_eq!(
        refusal(hello(&a, 7, "gw", 0)).await,
        Refusal::UnknownCertificate
    );
    assert!(
        s.delete_node(&a, Box::new(|_| b"statement".to_vec()))
            .await
            .unwrap()
    );
    assert!(
        !s.delete_node(&a, Box::new(|_| panic!("nothing to state")))
            .await
            .unwrap()
    );
    assert_eq!(
        refusal(hello(&a, 1, "gw", 0)).await,
        Refusal::DeletedNode(a.to_string(), Some(b"statement".to_vec()))
    );
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 1);
}

pub async fn a_gateway_without_its_lease_routes_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let fenced = |gw: &'static str| {
        let node = node.clone();
        async move {
            matches!(
                s.hello(&hello(&node, 1, gw, 0)).await,
                Err(TxError::Refused(Refusal::Fenced(_)))
            )
        }
    };
    assert!(fenced("gw-never-leased").await);
    lease(s, "gw-short", Duration::from_millis(10)).await;
    assert!(!fenced("gw-short").await);
    f.advance(Duration::from_millis(10));
    assert!(
        !fenced("gw-short").await,
        "held through its last millisecond"
    );
    f.advance(Duration::from_millis(1));
    assert!(fenced("gw-short").await, "an expired lease fences too");
    assert_eq!(
        s.session(&node).await.unwrap().unwrap().gateway_id,
        "gw-short"
    );
}

fn command(node: &str, kind: Kind) -> NewCommand {
    NewCommand {
        node_id: node.into(),
        kind,
        summary: String::new(),
        not_after: Duration::from_secs(60),
        min_generation: 0,
        idempotency_key: None,
    }
}

pub async fn hello_settles_in_flight_commands(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let e1 = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap().epoch;
    let mut ids = Vec::new();
    for kind in [
        Kind::ExecRun,
        Kind::ExecRun,
        Kind::NodeReboot,
        Kind::InventoryRefresh,
    ] {
        let (c, _) = s
            .create_command(
                &command(&node, kind),
                Box::new(|c| c.id.to_string().into_bytes()),
            )
            .await
            .unwrap();
        ids.push(c.id);
    }
    assert_eq!(
        s.take_dispatchable(&GatewayId::from("gw"), &node, e1)
            .await
            .unwrap()
            .len(),
        4
    );
    assert!(
        s.command_ack(&super::route("gw", &node, e1), &ids[2], true)
            .await
            .unwrap()
    );
    // Same journal and boot: what the node does not report is replayed;
    // what it reports running or done is kept.
    let mut h = hello(&node, 1, "gw", 0);
    h.journal_running = vec![ids[1].clone()];
    let out = s.hello(&h).await.unwrap();
    let replayed: Vec<&str> = out.replay.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        replayed,
        [ids[0].as_str(), ids[2].as_str(), ids[3].as_str()]
    );
    assert_eq!(
        out.replay[0].signed,
        ids[0].as_bytes(),
        "the stored bytes, verbatim"
    );
    assert!(out.finished.is_empty());
    assert_eq!(
        s.get_command(&ids[1]).await.unwrap().unwrap().epoch,
        out.epoch,
        "moved to the new epoch"
    );
    // A new boot and a new journal: the reboot it took on did what it was
    // for; the command it cannot know fails journal-lost; the retry-safe one
    // is replayed.
    assert!(
        s.command_ack(&super::route("gw", &node, out.epoch), &ids[2], true)
            .await
            .unwrap()
    );
    let mut h = hello(&node, 1, "gw", 0);
    h.boot_id = "b2".into();
    h.journal_id = "j2".into();
    let out = s.hello(&h).await.unwrap();
    let finished: Vec<(&str, &str, &str)> = out
        .finished
        .iter()
        .map(|x| {
            (
                x.id.as_str(),
                ServerState::Terminal(x.outcome).name(),
                x.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        finished,
        [
            (ids[0].as_str(), "failed", "journal-lost"),
            (ids[1].as_str(), "failed", "journal-lost"),
            (ids[2].as_str(), "succeeded", "rebooted"),
        ]
    );
    assert_eq!(
        out.replay.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        [ids[3].as_str()]
    );
    let reboot = s.get_command(&ids[2]).await.unwrap().unwrap();
    assert_eq!(
        (reboot.state.text(), reboot.result_at_ms),
        ("succeeded", Some(T0))
    );
}

pub async fn a_gateway_shutdown_disconnects_and_releases_together(f: Fixture) {
    let s = &f.store;
    let a = joined(s, 1).await;
    let b = joined(s, 2).await;
    lease(s, "gw-x", Duration::from_secs(60)).await;
    let ea = s.hello(&hello(&a, 1, "gw-x", 0)).await.unwrap().epoch;
    let eb = s.hello(&hello(&b, 2, "gw-x", 0)).await.unwrap().epoch;
    // b moved on meanwhile: its disconnect under the old epoch is fenced.
    s.hello(&hello(&b, 2, "gw", 0)).await.unwrap();
    s.gateway_shutdown(
        &GatewayId::from("gw-x"),
        &[
            SessionKey {
                node_id: a.clone(),
                epoch: ea,
            },
            SessionKey {
                node_id: b.clone(),
                epoch: eb,
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        s.session(&a).await.unwrap().unwrap().state.as_str(),
        "disconnected"
    );
    assert_eq!(
        s.session(&b).await.unwrap().unwrap().state.as_str(),
        "connected"
    );
    // The lease is free: another owner takes it at once.
    assert!(
        s.renew_lease("gateway:gw-x", "someone", Duration::from_secs(1))
            .await
            .unwrap()
            .is_some()
    );
}

pub async fn a_gateway_writes_the_sessions_that_ended_together(f: Fixture) {
    let s = &f.store;
    let (a, b, c) = (joined(s, 1).await, joined(s, 2).await, joined(s, 3).await);
    let ea = s.hello(&hello(&a, 1, "gw", 0)).await.unwrap().epoch;
    let eb = s.hello(&hello(&b, 2, "gw", 0)).await.unwrap().epoch;
    let ec = s.hello(&hello(&c, 3, "gw", 0)).await.unwrap().epoch;
    // b moved on to another gateway before gw wrote its end.
    s.hello(&hello(&b, 2, "gw-a", 0)).await.unwrap();
    f.advance(Duration::from_secs(10));
    let ended = |node: &str, epoch, seen_s, cause: &str| Ended {
        node_id: node.into(),
        epoch,
        seen_age: Duration::from_secs(seen_s),
        ended_age: Duration::from_secs(1),
        cause: cause.into(),
    };
    assert!(s.disconnect(&[]).await.unwrap().is_empty());
    let mut applied = s
        .disconnect(&[
            ended(&c, ec, 3, "missed-heartbeats"),
            ended(&b, eb, 0, "stream-ended"),
            ended(&a, ea, 2, "stream-ended"),
        ])
        .await
        .unwrap();
    applied.sort_by(|x, y| x.node_id.cmp(&y.node_id));
    let mut want = vec![
        SessionKey {
            node_id: a.clone(),
            epoch: ea,
        },
        SessionKey {
            node_id: c.clone(),
            epoch: ec,
        },
    ];
    want.sort_by(|x, y| x.node_id.cmp(&y.node_id));
    assert_eq!(applied, want, "b's newer session is not touched");
    for (n, want) in [
        (&a, "disconnected"),
        (&b, "connected"),
        (&c, "disconnected"),
    ] {
        assert_eq!(
            s.session(n).await.unwrap().unwrap().state.as_str(),
            want,
            "{n}"
        );
    }
    let ages: std::collections::HashMap<NodeId, i64> = s
        .list_nodes()
        .await
        .unwrap()
        .nodes
        .into_iter()
        .map(|n| (n.node_id, n.last_seen_age_ms))
        .collect();
    assert_eq!(
        (ages[&a], ages[&c]),
        (2_000, 3_000),
        "last seen = now - the age"
    );
    // Written again (a retried batch), nothing applies twice.
    assert!(
        s.disconnect(&[ended(&a, ea, 2, "stream-ended")])
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn a_hello_says_whether_work_waits_for_the_node(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let idle = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    assert!(
        !idle.commands_pending && idle.spec_generation == 0,
        "{idle:?}"
    );
    assert!(!idle.work_waits(0));
    let (generation, _) = s
        .update_spec(
            &node,
            Box::new(|_| Ok(())),
            super::open_spec(&node),
            super::seal_spec(&node),
        )
        .await
        .unwrap();
    let spec = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    assert_eq!(spec.spec_generation, generation);
    assert!(!spec.commands_pending);
    assert!(spec.work_waits(generation - 1), "a node behind its spec");
    assert!(!spec.work_waits(generation), "a node that applied it");
    s.create_command(
        &super::commands::command(&node, Kind::ExecRun, "x"),
        Box::new(|_| vec![]),
    )
    .await
    .unwrap();
    let pending = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    assert!(pending.commands_pending && pending.work_waits(generation));
}

pub async fn certificates_renew_expire_and_are_revoked_with_their_node(f: Fixture) {
    let s = &f.store;
    let short = IssuedCert {
        not_after_ms: T0 + 1_000,
        ..fake_cert(1)
    };
    let node = joined_with(s, short).await;
    let valid = s.check_cert("fp1").await.unwrap();
    assert_eq!(
        (valid.node_id.as_str(), valid.serial.as_str()),
        (node.as_str(), "serial1")
    );
    let renewed = s
        .renew(
            "fp1",
            Box::new(|n, now, ramdisk| {
                assert!(!ramdisk);
                assert_eq!(now, T0);
                Ok(IssuedCert {
                    not_after_ms: now + 86_400_000,
                    ..fake_cert(2)
                })
                .inspect(|_| assert!(n.starts_with("nd-")))
            }),
        )
        .await
        .unwrap();
    assert_eq!(renewed.node_id, node);
    f.advance(Duration::from_millis(1_001));
    assert_eq!(
        s.check_cert("fp1").await.unwrap_err().refusal(),
        Some(&Refusal::Expired)
    );
    assert!(
        s.renew("fp1", Box::new(|_, _, _| Ok(fake_cert(3))))
            .await
            .is_err(),
        "an expired certificate cannot renew"
    );
    assert_eq!(s.check_cert("fp2").await.unwrap().serial, "serial2");
    let before = s.now().await.unwrap();
    assert!(s.revoked_since(before).await.unwrap().is_empty());
    s.delete_node(&node, Box::new(|_| b"st".to_vec()))
        .await
        .unwrap();
    let revoked = s.revoked_since(before).await.unwrap();
    let serials: Vec<(&str, &str)> = revoked
        .iter()
        .map(|r| (r.serial.as_str(), r.reason.as_str()))
        .collect();
    assert!(
        serials.contains(&("serial2", "node-deleted")),
        "{serials:?}"
    );
    assert!(revoked.iter().all(|r| r.node_id == node
        && r.at_ms == before
        && r.statement.as_deref() == Some(&b"st"[..])));
    assert_eq!(
        s.check_cert("fp2").await.unwrap_err().refusal(),
        Some(&Refusal::DeletedNode(
            node.to_string(),
            Some(b"st".to_vec())
        ))
    );
}

/// x509pop: a certificate that ran out renews within the grace the join
/// service allows, not past it, and never once its node is deleted.
pub async fn an_expired_certificate_renews_only_within_the_grace(f: Fixture) {
    let s = &f.store;
    let short = IssuedCert {
        not_after_ms: T0 + 1_000,
        ..fake_cert(1)
    };
    let node = joined_with(s, short).await;
    f.advance(Duration::from_millis(1_500));
    let refused = s
        .renew("fp1", Box::new(|_, _, _| Ok(fake_cert(2))))
        .await
        .unwrap_err();
    assert_eq!(
        refused.refusal(),
        Some(&Refusal::Expired),
        "no grace: refused"
    );
    let renewed = s
        .renew_within("fp1", Box::new(|_, _, _| Ok(fake_cert(2))), 1_000)
        .await
        .unwrap();
    assert_eq!(renewed.node_id, node);
    assert_eq!(s.check_cert("fp2").await.unwrap().node_id, node);
    // Past the grace: refused, and nothing recorded.
    f.advance(Duration::from_millis(600));
    let refused = s
        .renew_within("fp1", Box::new(|_, _, _| Ok(fake_cert(3))), 1_000)
        .await
        .unwrap_err();
    assert_eq!(refused.refusal(), Some(&Refusal::Expired));
    assert!(s.check_cert("fp3").await.is_err());
    // Within a larger grace, but the node is deleted: refused.
    s.delete_node(&node, Box::new(|_| b"st".to_vec()))
        .await
        .unwrap();
    let refused = s
        .renew_within("fp1", Box::new(|_, _, _| Ok(fake_cert(3))), 3_600_000)
        .await
        .unwrap_err();
    assert!(
        matches!(refused.refusal(), Some(Refusal::DeletedNode(..))),
        "{refused:?}"
    );
    assert!(s.check_cert("fp3").await.is_err());
}

pub async fn published_fleet_events_are_read_back_newest_first(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.publish_fleet_event("security.renew.refused", &node, "renew:node-deleted: gone")
        .await
        .unwrap();
    s.publish_fleet_event(
        "security.renew.refused",
        &node,
        "renew:certificate-expired: late",
    )
    .await
    .unwrap();
    assert_eq!(
        s.fleet_events(&node, 10).await.unwrap(),
        vec![
            "security.renew.refused: renew:certificate-expired: late".to_string(),
            "security.renew.refused: renew:node-deleted: gone".to_string(),
        ]
    );
    assert!(
        s.fleet_events(&NodeId::from("nd-other"), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn the_first_hello_with_a_renewed_certificate_supersedes_the_old_one(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    f.advance(Duration::from_millis(10));
    let now = s.now().await.unwrap();
    s.renew(
        "fp1",
        Box::new(move |_, _, _| {
            Ok(IssuedCert {
                not_before_ms: now,
                ..fake_cert(2)
            })
        }),
    )
    .await
    .unwrap();
    // Renewed but not used yet: both valid (a lost renewal answer leaves
    // the node its old certificate).
    assert!(s.check_cert("fp1").await.is_ok());
    assert!(s.check_cert("fp2").await.is_ok());
    s.hello(&proved(hello(&node, 2, "gw", 1), 1)).await.unwrap();
    // A Hello with the old one is refused from now on; no gateway revokes
    // it (its role cannot), the key holder does, from the node's proof.
    let err = s.hello(&hello(&node, 1, "gw", 2)).await.unwrap_err();
    assert_eq!(
        err.refusal(),
        Some(&Refusal::Revoked("superseded".into(), None))
    );
    assert!(s.check_cert("fp1").await.is_ok());
    assert_eq!(s.supersede(&node, "serial2").await.unwrap(), ["serial1"]);
    assert!(s.supersede(&node, "serial2").await.unwrap().is_empty());
    assert_eq!(
        s.check_cert("fp1").await.unwrap_err().refusal(),
        Some(&Refusal::Revoked("superseded".into(), None))
    );
    // The current one goes on working.
    s.hello(&hello(&node, 2, "gw", 2)).await.unwrap();
    assert!(s.check_cert("fp2").await.is_ok());
    assert!(
        s.supersede(&node, "no-such-serial")
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn two_machines_alternating_on_one_certificate_are_quarantined(f: Fixture) {
    use bc_store::clones::{DUPLICATE_IDENTITY, DUPLICATE_SESSION, FORGED_SIGHTING, QUARANTINED};
    let s = &f.store;
    let node = joined(s, 1).await;
    let from = |boot: &str| HelloInput {
        boot_id: boot.into(),
        ..hello(&node, 1, "gw", 0)
    };
    let mut seq = 0;
    let mut hello_from = |boot: &str| {
        seq += 1;
        proved(from(boot), seq)
    };
    // A restart of the same machine, and a reboot: one sighting a boot.
    for boot in ["boot-a", "boot-a", "boot-b"] {
        f.advance(Duration::from_millis(10));
        s.hello(&hello_from(boot)).await.unwrap();
    }
    let sightings = s.sightings_unwatched(100).await.unwrap();
    let seen: Vec<(&str, u64)> = sightings
        .iter()
        .map(|x| (x.boot_id.as_str(), x.seq))
        .collect();
    assert_eq!(seen, [("boot-a", 1), ("boot-b", 3)]);
    assert!(sightings.iter().all(|x| x.node_id == node
        && x.serial == "serial1"
        && x.proof == format!("serial1/{}/{}", x.boot_id, x.seq).into_bytes()));
    // An unproved Hello records nothing (the key holder could believe
    // nothing of it), and the Welcome's count is the highest proved.
    f.advance(Duration::from_millis(10));
    let o = s.hello(&from("boot-c")).await.unwrap();
    assert_eq!(o.hello_seq_seen, 3);
    assert_eq!(s.sightings_unwatched(100).await.unwrap().len(), 2);
    // boot-b took a session of boot-a's, boot-c one of boot-b's.
    let takeovers = |events: &[String]| {
        events
            .iter()
            .filter(|e| e.starts_with(DUPLICATE_SESSION))
            .count()
    };
    assert_eq!(takeovers(&s.fleet_events(&node, 50).await.unwrap()), 2);
    // Clones back and forth: recorded, never quarantined by a Hello.
    for boot in ["boot-a", "boot-b", "boot-a", "boot-b"] {
        f.advance(Duration::from_millis(10));
        s.hello(&hello_from(boot)).await.unwrap();
    }
    assert!(s.check_cert("fp1").await.is_ok());
    let recent = s.sightings_of("serial1", 0).await.unwrap();
    assert_eq!(recent.len(), 6);
    assert!(
        s.sightings_of("serial1", i64::MAX)
            .await
            .unwrap()
            .is_empty()
    );
    // A sighting the key holder could not verify goes, with an event.
    let forged = recent[0].clone();
    s.drop_forged_sightings(&[(forged.clone(), "its signature is not by the key".into())])
        .await
        .unwrap();
    assert_eq!(s.sightings_of("serial1", 0).await.unwrap().len(), 5);
    let events = s.fleet_events(&node, 50).await.unwrap();
    assert!(
        events.iter().any(|e| e.starts_with(FORGED_SIGHTING)
            && e.contains("its signature is not by the key")
            && e.contains("boot-a")),
        "{events:?}"
    );
    // The key holder's quarantine: every certificate revoked with a
    // statement, the event, and once only.
    let sealed = |_: &bc_store::nodes::StatementSeal| b"sealed".to_vec();
    assert!(
        s.quarantine_clone(&node, "serial1", 4, Box::new(sealed))
            .await
            .unwrap()
    );
    assert!(
        !s.quarantine_clone(&node, "serial1", 5, Box::new(sealed))
            .await
            .unwrap()
    );
    assert_eq!(
        s.check_cert("fp1").await.unwrap_err().refusal(),
        Some(&Refusal::Revoked(
            DUPLICATE_IDENTITY.into(),
            Some(b"sealed".to_vec())
        ))
    );
    let events = s.fleet_events(&node, 50).await.unwrap();
    assert_eq!(
        events.iter().filter(|e| e.starts_with(QUARANTINED)).count(),
        1
    );
    assert!(
        events.iter().any(|e| e.starts_with(QUARANTINED)
            && e.contains("4 alternations")
            && e.contains("join the real machine again")),
        "{events:?}"
    );
    // Both clones are refused from now on; the revocation feed has it.
    assert!(s.hello(&from("boot-a")).await.is_err());
    let revoked = s.revoked_since(super::T0).await.unwrap();
    assert!(revoked.iter().any(|r| r.reason == DUPLICATE_IDENTITY));
}
