use std::time::Duration;

use bc_store::NodeId;
use bc_store::events::{EventInput, EventKey};

use super::{Fixture, T0, joined};

fn ev(id: u64, kind: &str, age_ms: u64) -> EventInput {
    EventInput {
        id,
        kind: kind.into(),
        body: format!("body{id}").into_bytes(),
        age_ms,
    }
}

pub async fn events_are_kept_once_and_acknowledged_up_to_the_highest(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    f.advance(Duration::from_secs(10));
    let up_to = s
        .put_events(
            &node,
            "j1",
            &[
                ev(2, "command.running", 1_000),
                ev(1, "command.accepted", 2_000),
            ],
        )
        .await
        .unwrap();
    assert_eq!(up_to, 2);
    // Resent: ignored, still acknowledged.
    assert_eq!(
        s.put_events(&node, "j1", &[ev(2, "changed", 0)])
            .await
            .unwrap(),
        2
    );
    // A new journal counts from 1 again.
    assert_eq!(
        s.put_events(&node, "j2", &[ev(1, "command.accepted", 0)])
            .await
            .unwrap(),
        1
    );
    assert_eq!(s.put_events(&node, "j2", &[]).await.unwrap(), 0);
    let got: Vec<(String, u64, String, i64)> = s
        .node_events(&node)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.journal_id, e.event_id, e.kind, e.at_ms))
        .collect();
    assert_eq!(
        got,
        vec![
            ("j1".into(), 1, "command.accepted".into(), T0 + 8_000),
            ("j1".into(), 2, "command.running".into(), T0 + 9_000),
            ("j2".into(), 1, "command.accepted".into(), T0 + 10_000),
        ],
        "oldest first, timed by the reported age"
    );
}

/// The fleet's events read back oldest first, by node, kind glob, age and
/// position, the newest ones when more match than asked for.
pub async fn fleet_events_are_read_by_node_kind_age_and_position(f: Fixture) {
    use bc_store::events::EventQuery;
    let s = &f.store;
    for (kind, node) in [
        ("security.node.quarantined", "nd-a"),
        ("reservation.binding-rejected", "nd-b"),
        ("security.result.forged", "nd-b"),
        ("security_x", "nd-a"),
    ] {
        s.publish_fleet_event(kind, &NodeId::from(node), &format!("{kind} of {node}"))
            .await
            .unwrap();
        f.advance(Duration::from_secs(60));
    }
    let read = |q: EventQuery| async move {
        s.list_fleet_events(&EventQuery { limit: 100, ..q })
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.kind, e.node_id))
            .collect::<Vec<_>>()
    };
    let all = s
        .list_fleet_events(&EventQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 4);
    assert!(
        all.windows(2)
            .all(|w| w[0].id < w[1].id && w[0].at_ms < w[1].at_ms)
    );
    assert_eq!(all[0].at_ms, T0);
    assert_eq!(all[0].detail, "security.node.quarantined of nd-a");
    let kinds = |v: Vec<(String, NodeId)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    // A glob: `*` any run, and the `_` of a kind is no wildcard.
    assert_eq!(
        kinds(
            read(EventQuery {
                kind: "security.*".into(),
                ..Default::default()
            })
            .await
        ),
        ["security.node.quarantined", "security.result.forged"]
    );
    assert_eq!(
        kinds(
            read(EventQuery {
                kind: "security?x".into(),
                ..Default::default()
            })
            .await
        ),
        ["security_x"]
    );
    assert_eq!(
        kinds(
            read(EventQuery {
                kind: "security_*".into(),
                ..Default::default()
            })
            .await
        ),
        ["security_x"]
    );
    assert_eq!(
        read(EventQuery {
            node_id: Some("nd-b".into()),
            ..Default::default()
        })
        .await
        .len(),
        2
    );
    // After a position (what --follow reads), and since a time.
    assert_eq!(
        kinds(
            read(EventQuery {
                after_id: all[2].id,
                ..Default::default()
            })
            .await
        ),
        ["security_x"]
    );
    assert_eq!(
        read(EventQuery {
            since_ms: all[1].at_ms,
            ..Default::default()
        })
        .await
        .len(),
        3
    );
    // More than the limit: the newest, still oldest first.
    let newest = s
        .list_fleet_events(&EventQuery {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        newest.iter().map(|e| e.id).collect::<Vec<_>>(),
        [all[2].id, all[3].id]
    );
    // After a position, the oldest: a follower misses none of a burst.
    let next = s
        .list_fleet_events(&EventQuery {
            after_id: all[0].id,
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(next.iter().map(|e| e.id).collect::<Vec<_>>(), [all[1].id]);
}

pub async fn security_events_are_kept_apart_until_their_one_receipt(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let other = joined(s, 2).await;
    s.put_events(
        &node,
        "j1",
        &[
            ev(1, "command.accepted", 0),
            ev(2, "security.command.refused", 0),
            ev(3, "security.spec.refused", 0),
        ],
    )
    .await
    .unwrap();
    // Resent as it was: kept once.
    s.put_events(&node, "j1", &[ev(2, "security.command.refused", 0)])
        .await
        .unwrap();
    let waiting = s.security_events_unreceipted(10).await.unwrap();
    let kinds: Vec<(u64, &str)> = waiting
        .iter()
        .map(|e| (e.event_id, e.kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (2, "security.command.refused"),
            (3, "security.spec.refused")
        ]
    );
    assert_eq!(waiting[0].body, b"body2");
    let keys: Vec<EventKey> = [
        ev(1, "command.accepted", 0),
        ev(2, "security.command.refused", 0),
        ev(3, "security.spec.refused", 0),
    ]
    .iter()
    .map(EventKey::of)
    .collect();
    assert!(
        s.event_receipts(&node, "j1", &keys)
            .await
            .unwrap()
            .is_empty()
    );
    s.put_event_receipt(&waiting[0], b"r2").await.unwrap();
    s.put_event_receipt(&waiting[0], b"again").await.unwrap();
    assert_eq!(
        s.gateway()
            .event_receipts(&node, "j1", &keys)
            .await
            .unwrap(),
        vec![(keys[1].clone(), b"r2".to_vec())],
        "once only"
    );
    assert!(
        s.event_receipts(&node, "j2", &keys[1..2])
            .await
            .unwrap()
            .is_empty(),
        "another journal's event 2 is another event"
    );
    assert!(
        s.event_receipts(&other, "j1", &keys[1..2])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(s.security_events_unreceipted(10).await.unwrap().len(), 1);
}

/// A gateway stores an event of its own under the node's next event id
/// (the ids are sequential) before the node sends its own: both are kept,
/// each is receipted, and the node settles the one it journaled.
pub async fn a_planted_security_event_keeps_the_nodes_own_out_no_longer(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let planted = EventInput {
        body: b"{\"planted\":true}".to_vec(),
        ..ev(7, "security.command.refused", 0)
    };
    let other_kind = ev(7, "security.spec.refused", 0);
    s.gateway()
        .put_events(&node, "j1", &[planted.clone(), other_kind])
        .await
        .unwrap();
    let own = ev(7, "security.command.refused", 0);
    s.gateway()
        .put_events(&node, "j1", std::slice::from_ref(&own))
        .await
        .unwrap();
    let mut waiting = s.security_events_unreceipted(10).await.unwrap();
    waiting.sort_by(|a, b| (&a.kind, &a.body).cmp(&(&b.kind, &b.body)));
    let kept: Vec<(&str, &[u8])> = waiting
        .iter()
        .map(|e| (e.kind.as_str(), e.body.as_slice()))
        .collect();
    assert_eq!(
        kept,
        [
            ("security.command.refused", b"body7".as_slice()),
            ("security.command.refused", planted.body.as_slice()),
            ("security.spec.refused", b"body7".as_slice()),
        ],
        "the node's own event is kept beside the planted ones"
    );
    for (i, e) in waiting.iter().enumerate() {
        s.put_event_receipt(e, format!("r{i}").as_bytes())
            .await
            .unwrap();
    }
    // Each session asks for what it stored: the one receipt of each.
    for (e, want) in [(&own, "r0"), (&planted, "r1")] {
        let key = EventKey::of(e);
        assert_eq!(
            s.gateway()
                .event_receipts(&node, "j1", std::slice::from_ref(&key))
                .await
                .unwrap(),
            vec![(key, want.as_bytes().to_vec())]
        );
    }
    assert!(s.security_events_unreceipted(10).await.unwrap().is_empty());
}
