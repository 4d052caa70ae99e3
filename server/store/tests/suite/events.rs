use std::time::Duration;

use bc_store::events::EventInput;

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
