use std::time::Duration;

use bc_store::backups::{COMPLETE, CREATING, FAILED, MANIFEST_INCOMPLETE, NewBackup, Value};
use bcd_core::command::{Kind, Outcome};

use super::commands::{command, result};
use super::{Fixture, T0, hello, joined, verify};

/// A dump with each table's rows in one order.
fn sorted(mut d: bc_store::backups::Dump) -> bc_store::backups::Dump {
    for t in &mut d.tables {
        t.rows
            .sort_by_cached_key(|r| serde_json::to_string(r).unwrap());
    }
    d
}

fn set(id: &str) -> NewBackup {
    NewBackup {
        id: id.into(),
        location: format!("/backups/{id}"),
        host: "host boot".into(),
        process: "7:100".into(),
    }
}

pub async fn a_set_leaves_creating_once_and_every_state_is_audited(f: Fixture) {
    let s = &f.store;
    let a = s.begin_backup(&set("a")).await.unwrap();
    assert_eq!(
        (
            a.state.as_str(),
            a.restore_eligible,
            a.created_at,
            a.finished_at
        ),
        (CREATING, false, T0, None)
    );
    s.begin_backup(&set("b")).await.unwrap();
    f.advance(Duration::from_millis(100));
    assert!(s.finish_backup("a", 12, 3400).await.unwrap());
    assert!(s.fail_backup("b", MANIFEST_INCOMPLETE).await.unwrap());
    // Settled: neither moves again; a failed set never becomes eligible.
    assert!(!s.finish_backup("b", 1, 1).await.unwrap());
    assert!(!s.fail_backup("a", MANIFEST_INCOMPLETE).await.unwrap());
    let a = s.backup("a").await.unwrap().unwrap();
    assert_eq!(
        (
            a.state.as_str(),
            a.restore_eligible,
            a.finished_at,
            a.files,
            a.bytes
        ),
        (COMPLETE, true, Some(T0 + 100), 12, 3400)
    );
    let b = s.backup("b").await.unwrap().unwrap();
    assert_eq!(
        (b.state.as_str(), b.reason.as_str(), b.restore_eligible),
        (FAILED, MANIFEST_INCOMPLETE, false)
    );
    assert_eq!(s.backups().await.unwrap().len(), 2);
    assert!(s.backup("c").await.unwrap().is_none());
    let snap = s.audit_snapshot().await.unwrap();
    assert_eq!(snap.backups.len(), 2);
    let history: Vec<(String, String, i64)> = snap
        .audit
        .iter()
        .filter(|r| r.kind == "backup")
        .map(|r| {
            let d: serde_json::Value = serde_json::from_str(&r.detail).unwrap();
            (
                d["backup"].as_str().unwrap().to_string(),
                d["state"].as_str().unwrap().to_string(),
                r.value,
            )
        })
        .collect();
    let want: Vec<(String, String, i64)> = [
        ("a", CREATING, 0),
        ("b", CREATING, 0),
        ("a", COMPLETE, 1),
        ("b", FAILED, 0),
    ]
    .iter()
    .map(|(b, st, v)| (b.to_string(), st.to_string(), *v))
    .collect();
    assert_eq!(history, want);
}

/// A dump restored over a store that moved on brings back exactly what
/// was dumped: every table, the history (not replayed by the triggers) and
/// the sequences (the next history row follows the dumped ones).
pub async fn a_dump_restores_exactly_over_a_store_that_moved_on(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.hello(&hello(&node, 1, "gw", 0)).await.unwrap();
    let (c, _) = s
        .create_command(
            &command(&node, Kind::ExecRun, "x"),
            Box::new(|_| vec![1, 2, 3]),
        )
        .await
        .unwrap();
    s.command_result(&node, &result(&node, 1, &c.id, Outcome::Failed), verify)
        .await
        .unwrap();
    s.begin_backup(&set("self")).await.unwrap();
    let dump = s.dump().await.unwrap();
    assert_eq!(dump.taken_at, T0);
    let backups = dump.tables.iter().find(|t| t.name == "backups").unwrap();
    assert_eq!(backups.rows.len(), 1);
    let state = backups.columns.iter().position(|c| c == "state").unwrap();
    assert_eq!(backups.rows[0][state], Value::Text(CREATING.into()));
    let nodes = dump.tables.iter().position(|t| t.name == "nodes").unwrap();
    let commands = dump
        .tables
        .iter()
        .position(|t| t.name == "commands")
        .unwrap();
    assert!(nodes < commands, "parents come first");
    let history = s.audit_snapshot().await.unwrap().audit;

    // The store moves on: another node, the set completes, a new command.
    f.advance(Duration::from_secs(1));
    let other = joined(s, 2).await;
    s.finish_backup("self", 1, 1).await.unwrap();
    s.create_command(&command(&node, Kind::ExecRun, "y"), Box::new(|_| vec![]))
        .await
        .unwrap();

    s.restore(dump.clone()).await.unwrap();
    let mut again = s.dump().await.unwrap();
    again.taken_at = dump.taken_at;
    assert!(
        sorted(again) == sorted(dump.clone()),
        "the restored store is not the dump"
    );
    assert_eq!(s.audit_snapshot().await.unwrap().audit, history);
    assert!(
        s.list_nodes()
            .await
            .unwrap()
            .nodes
            .iter()
            .all(|n| n.node_id != other)
    );
    assert_eq!(
        s.backup("self").await.unwrap().unwrap().state.as_str(),
        CREATING,
        "the restored store holds the set as the dump saw it"
    );
    // The triggers are back, and the history continues after the dump's.
    let last = history.last().unwrap().id;
    s.fail_backup("self", MANIFEST_INCOMPLETE).await.unwrap();
    let after = s.audit_snapshot().await.unwrap().audit;
    assert_eq!(after.len(), history.len() + 1);
    assert!(after.last().unwrap().id > last);

    // A dump of another schema version or backend is refused, and
    // changes nothing.
    let mut old = dump.clone();
    old.schema_version -= 1;
    let e = s.restore(old).await.unwrap_err().to_string();
    assert!(e.contains("schema version"), "{e}");
    let mut other_kind = dump;
    other_kind.backend = "elsewhere".into();
    assert!(s.restore(other_kind).await.is_err());
    assert_eq!(s.audit_snapshot().await.unwrap().audit, after);
}
