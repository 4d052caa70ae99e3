use std::time::Duration;

use bc_store::specs::Assignment;
use bcd_core::command::{Kind, Outcome};

use super::commands::{command, result};
use super::{Fixture, T0, disconnect, hello, joined, lease, state, verify};

pub async fn triggers_stamp_history_with_the_store_clock(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    f.advance(Duration::from_millis(100));
    lease(s, "gw-t", Duration::from_secs(20)).await;
    f.advance(Duration::from_millis(100));
    let e = s.hello(&hello(&node, 1, "gw-t", 0)).await.unwrap().epoch;
    f.advance(Duration::from_millis(100));
    let (c, _) = s
        .create_command(&command(&node, Kind::ExecRun, "x"), Box::new(|_| vec![]))
        .await
        .unwrap();
    s.command_result(&node, &result(&node, 1, &c.id, Outcome::Failed), verify)
        .await
        .unwrap();
    f.advance(Duration::from_millis(100));
    assert!(disconnect(s, &node, e, Duration::ZERO).await);
    let snap = s.audit_snapshot().await.unwrap();
    // The history alone reads the same records and heads.
    let history = s.audit_history().await.unwrap();
    assert_eq!(
        (&history.audit, &history.heads, history.now),
        (&snap.audit, &snap.heads, snap.now)
    );
    let mine: Vec<(&str, i64)> = snap
        .audit
        .iter()
        .filter(|a| a.node_id == node || a.gateway_id == "gw-t")
        .map(|a| (a.kind.as_str(), a.at))
        .collect();
    assert_eq!(
        mine,
        [
            ("lease", T0 + 100),
            ("route", T0 + 200),
            ("result", T0 + 300),
            ("disconnected", T0 + 400),
        ]
    );
    let result = snap.audit.iter().find(|a| a.kind == "result").unwrap();
    let detail: serde_json::Value = serde_json::from_str(&result.detail).unwrap();
    assert_eq!(detail["command"], c.id.as_str());
    assert_eq!(
        (detail["from"].as_str(), detail["state"].as_str()),
        (Some("pending"), Some("failed"))
    );
    assert_eq!(snap.now, T0 + 400);
}

pub async fn a_snapshot_reads_the_history_and_the_tables(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    s.create_command(&command(&node, Kind::ExecRun, ""), Box::new(|_| vec![]))
        .await
        .unwrap();
    s.update_spec(
        &node,
        Box::new(|b| {
            b.assignments.push(Assignment {
                allocation_id: "a".into(),
                gpus: vec!["0".into()],
                env: Default::default(),
                secrets: Vec::new(),
            });
            Ok(())
        }),
        super::open_spec(&node),
        super::seal_spec(&node),
    )
    .await
    .unwrap();
    let snap = s.audit_snapshot().await.unwrap();
    assert_eq!(snap.sessions.len(), 1);
    assert_eq!(snap.sessions[0].gateway_id, "gw");
    assert_eq!(snap.leases.get("gw"), Some(&(T0 + 3_600_000)));
    assert_eq!(snap.commands.len(), 1);
    assert_eq!(snap.desired.get(node.as_str()), Some(&1));
    assert_eq!(snap.applied.get(node.as_str()), None);
    assert!(
        snap.audit
            .iter()
            .any(|a| a.kind == "generation" && a.value == 1)
    );
    let settling = s.settling().await.unwrap();
    assert_eq!((settling.open_commands, settling.unapplied_specs), (1, 1));
    s.put_state_report(&node, &state(&node, 1, 0, 1, vec![]), verify)
        .await
        .unwrap();
    assert_eq!(s.settling().await.unwrap().unapplied_specs, 0);
}
