//! The audit history, read for the invariant checkers, and the simulated
//! stall.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Tx, json_col, now, query, query_one};
use crate::audit::AUDIT_IN_ORDER;
use crate::audit::{
    AuditHistory, AuditRow, AuditSnapshot, BindingFact, ChainHead, CommandFact, SessionFact,
    Settling,
};
use crate::error::StoreError;

pub(super) async fn history(tx: &Tx<'_>) -> Result<AuditHistory, StoreError> {
    let now = now(tx).await?;
    let audit = query(tx, AUDIT_IN_ORDER, &[])
        .await?
        .iter()
        .enumerate()
        .map(|(i, r)| AuditRow {
            id: i as i64 + 1,
            chain: r.get(0),
            seq: r.get(1),
            at: r.get(2),
            node_id: r.get(3),
            kind: r.get(4),
            epoch: r.get::<_, i64>(5) as u64,
            gateway_id: r.get(6),
            value: r.get(7),
            detail: r.get(8),
            prev_hash: r.get(9),
            hash: r.get(10),
        })
        .collect();
    let heads = query(
        tx,
        "SELECT chain, seq, hash FROM audit_head ORDER BY chain",
        &[],
    )
    .await?
    .iter()
    .map(|r| ChainHead {
        chain: r.get(0),
        seq: r.get(1),
        hash: r.get(2),
    })
    .collect();
    Ok(AuditHistory { now, audit, heads })
}

pub(super) async fn snapshot(tx: &Tx<'_>) -> Result<AuditSnapshot, StoreError> {
    let AuditHistory { now, audit, heads } = history(tx).await?;
    let sessions = query(
        tx,
        "SELECT node_id, epoch, gateway_id, state FROM node_sessions",
        &[],
    )
    .await?
    .iter()
    .map(|r| SessionFact {
        node_id: r.get(0),
        epoch: r.get::<_, i64>(1) as u64,
        gateway_id: r.get(2),
        state: r.get(3),
    })
    .collect();
    let leases = query(
        tx,
        "SELECT owner, expires_at FROM leases WHERE name LIKE 'gateway:%'",
        &[],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect::<BTreeMap<_, _>>();
    let all_leases = query(tx, "SELECT name, owner, expires_at FROM leases", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect::<BTreeMap<_, _>>();
    let nodes = query(tx, "SELECT id FROM nodes", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let commands = query(
        tx,
        "SELECT id, node_id, kind, state, reason, exit_code, created_at FROM commands",
        &[],
    )
    .await?
    .iter()
    .map(|r| CommandFact {
        id: r.get(0),
        node_id: r.get(1),
        kind: r.get(2),
        state: r.get(3),
        reason: r.get(4),
        exit_code: r.get(5),
        created_at: r.get(6),
    })
    .collect();
    let rows = query(
        tx,
        "SELECT node_id, allocation_id, gpus, state FROM bindings",
        &[],
    )
    .await?;
    let mut bindings = Vec::with_capacity(rows.len());
    for r in &rows {
        bindings.push(BindingFact {
            node_id: r.get(0),
            allocation_id: r.get(1),
            gpus: json_col(r, 2)?,
            state: r.get(3),
        });
    }
    let desired = query(tx, "SELECT node_id, generation FROM node_specs", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
        .collect::<BTreeMap<_, _>>();
    let applied = query(
        tx,
        "SELECT node_id, applied_generation FROM node_state",
        &[],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get::<_, i64>(1) as u64))
    .collect::<BTreeMap<_, _>>();
    Ok(AuditSnapshot {
        now,
        audit,
        heads,
        sessions,
        leases,
        all_leases,
        nodes,
        commands,
        bindings,
        desired,
        applied,
        backups: super::backups::list(tx).await?,
    })
}

pub(super) async fn settling(tx: &Tx<'_>) -> Result<Settling, StoreError> {
    let open: i64 = query_one(
        tx,
        "SELECT COUNT(*) FROM commands
         WHERE state NOT IN ('succeeded', 'failed', 'expired', 'rejected')",
        &[],
    )
    .await?
    .get(0);
    let unapplied: i64 = query_one(
        tx,
        "SELECT COUNT(*) FROM node_specs s LEFT JOIN node_state t ON t.node_id = s.node_id
         WHERE COALESCE(t.applied_generation, 0) <> s.generation",
        &[],
    )
    .await?
    .get(0);
    Ok(Settling {
        open_commands: open.max(0) as usize,
        unapplied_specs: unapplied.max(0) as usize,
    })
}

/// Holds a lock on the fleet's tables that lets readers through and makes
/// every writer wait (or fail after its lock timeout), as a stalled
/// database does.
pub(super) async fn stall(tx: &Tx<'_>, duration: Duration) -> Result<(), StoreError> {
    tx.batch_execute(
        "SET LOCAL lock_timeout = 0;
         LOCK TABLE leases, nodes, node_sessions, commands, node_state, node_specs, inventory,
             node_events, bindings, audit IN EXCLUSIVE MODE",
    )
    .await?;
    tx.execute("SELECT pg_sleep($1)", &[&duration.as_secs_f64()])
        .await?;
    Ok(())
}
