//! The audit history, read for the invariant checkers.

use std::collections::BTreeMap;

use super::Db;
use crate::audit::AUDIT_IN_ORDER;
use crate::audit::{
    AuditHistory, AuditRow, AuditSnapshot, BindingFact, ChainHead, CommandFact, SessionFact,
    Settling,
};
use crate::error::StoreError;

pub(crate) async fn history(db: &impl Db) -> Result<AuditHistory, StoreError> {
    let now = db.now().await?;
    let audit = db
        .query(AUDIT_IN_ORDER, &[])
        .await?
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Ok(AuditRow {
                id: i as i64 + 1,
                chain: r.get(0)?,
                seq: r.get(1)?,
                at: r.get(2)?,
                node_id: r.get(3)?,
                kind: r.get(4)?,
                epoch: r.get::<i64>(5)? as u64,
                gateway_id: r.get(6)?,
                value: r.get(7)?,
                detail: r.get(8)?,
                prev_hash: r.get(9)?,
                hash: r.get(10)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let heads = db
        .query(
            "SELECT chain, seq, hash FROM audit_head ORDER BY chain",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(ChainHead {
                chain: r.get(0)?,
                seq: r.get(1)?,
                hash: r.get(2)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(AuditHistory { now, audit, heads })
}

pub(crate) async fn snapshot(db: &impl Db) -> Result<AuditSnapshot, StoreError> {
    let AuditHistory { now, audit, heads } = history(db).await?;
    let sessions = db
        .query(
            "SELECT node_id, epoch, gateway_id, state FROM node_sessions",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(SessionFact {
                node_id: r.get(0)?,
                epoch: r.get::<i64>(1)? as u64,
                gateway_id: r.get(2)?,
                state: r.get(3)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let leases = db
        .query(
            "SELECT owner, expires_at FROM leases WHERE name LIKE 'gateway:%'",
            &[],
        )
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<BTreeMap<_, _>, StoreError>>()?;
    let all_leases = db
        .query("SELECT name, owner, expires_at FROM leases", &[])
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .collect::<Result<BTreeMap<_, _>, StoreError>>()?;
    let nodes = db.column("SELECT id FROM nodes", &[]).await?;
    let commands = db
        .query(
            "SELECT id, node_id, kind, state, reason, exit_code, created_at FROM commands",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(CommandFact {
                id: r.get(0)?,
                node_id: r.get(1)?,
                kind: r.get(2)?,
                state: r.get(3)?,
                reason: r.get(4)?,
                exit_code: r.get(5)?,
                created_at: r.get(6)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let rows = db
        .query(
            "SELECT node_id, allocation_id, gpus, state FROM bindings",
            &[],
        )
        .await?;
    let mut bindings = Vec::with_capacity(rows.len());
    for r in &rows {
        bindings.push(BindingFact {
            node_id: r.get(0)?,
            allocation_id: r.get(1)?,
            gpus: r.json(2)?,
            state: r.get(3)?,
        });
    }
    let desired = db
        .query("SELECT node_id, generation FROM node_specs", &[])
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get::<i64>(1)? as u64)))
        .collect::<Result<BTreeMap<_, _>, StoreError>>()?;
    let applied = db
        .query("SELECT node_id, applied_generation FROM node_state", &[])
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get::<i64>(1)? as u64)))
        .collect::<Result<BTreeMap<_, _>, StoreError>>()?;
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
        backups: super::backups::list(db).await?,
    })
}

pub(crate) async fn settling(db: &impl Db) -> Result<Settling, StoreError> {
    let open: i64 = db
        .query_one(
            "SELECT COUNT(*) FROM commands
         WHERE state NOT IN ('succeeded', 'failed', 'expired', 'rejected')",
            &[],
        )
        .await?
        .get(0)?;
    let unapplied: i64 = db
        .query_one(
            "SELECT COUNT(*) FROM node_specs s LEFT JOIN node_state t ON t.node_id = s.node_id
         WHERE COALESCE(t.applied_generation, 0) <> s.generation",
            &[],
        )
        .await?
        .get(0)?;
    Ok(Settling {
        open_commands: open.max(0) as usize,
        unapplied_specs: unapplied.max(0) as usize,
    })
}
