//! The audit history, read for the invariant checkers.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::{Kept, json_col, now};
use crate::audit::AUDIT_IN_ORDER;
use crate::audit::{
    AuditHistory, AuditRow, AuditSnapshot, BindingFact, ChainHead, CommandFact, SessionFact,
    Settling,
};
use crate::error::StoreError;

pub(super) fn history(c: &Connection) -> Result<AuditHistory, StoreError> {
    let now = now(c)?;
    let audit = c
        .prepare(AUDIT_IN_ORDER)?
        .query_map([], |r| {
            Ok(AuditRow {
                id: 0,
                chain: r.get(0)?,
                seq: r.get(1)?,
                at: r.get(2)?,
                node_id: r.get(3)?,
                kind: r.get(4)?,
                epoch: r.get::<_, i64>(5)? as u64,
                gateway_id: r.get(6)?,
                value: r.get(7)?,
                detail: r.get(8)?,
                prev_hash: r.get(9)?,
                hash: r.get(10)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let audit = audit
        .into_iter()
        .enumerate()
        .map(|(i, r)| AuditRow {
            id: i as i64 + 1,
            ..r
        })
        .collect();
    let heads = c
        .prepare("SELECT chain, seq, hash FROM audit_head ORDER BY chain")?
        .query_map([], |r| {
            Ok(ChainHead {
                chain: r.get(0)?,
                seq: r.get(1)?,
                hash: r.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(AuditHistory { now, audit, heads })
}

pub(super) fn snapshot(c: &Connection) -> Result<AuditSnapshot, StoreError> {
    let AuditHistory { now, audit, heads } = history(c)?;
    let sessions = c
        .prepare("SELECT node_id, epoch, gateway_id, state FROM node_sessions")?
        .query_map([], |r| {
            Ok(SessionFact {
                node_id: r.get(0)?,
                epoch: r.get::<_, i64>(1)? as u64,
                gateway_id: r.get(2)?,
                state: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let leases = c
        .prepare("SELECT owner, expires_at FROM leases WHERE name LIKE 'gateway:%'")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<BTreeMap<_, _>>>()?;
    let all_leases = c
        .prepare("SELECT name, owner, expires_at FROM leases")?
        .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?
        .collect::<rusqlite::Result<BTreeMap<_, _>>>()?;
    let nodes = c
        .prepare("SELECT id FROM nodes")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let commands = c
        .prepare("SELECT id, node_id, kind, state, reason, exit_code, created_at FROM commands")?
        .query_map([], |r| {
            Ok(CommandFact {
                id: r.get(0)?,
                node_id: r.get(1)?,
                kind: r.get(2)?,
                state: r.get(3)?,
                reason: r.get(4)?,
                exit_code: r.get(5)?,
                created_at: r.get(6)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let bindings = c
        .prepare("SELECT node_id, allocation_id, gpus, state FROM bindings")?
        .query_map([], |r| {
            Ok(BindingFact {
                node_id: r.get(0)?,
                allocation_id: r.get(1)?,
                gpus: json_col(r, 2)?,
                state: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let desired = c
        .prepare("SELECT node_id, generation FROM node_specs")?
        .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
        .collect::<rusqlite::Result<BTreeMap<_, _>>>()?;
    let applied = c
        .prepare("SELECT node_id, applied_generation FROM node_state")?
        .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
        .collect::<rusqlite::Result<BTreeMap<_, _>>>()?;
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
        backups: super::backups::list(c)?,
    })
}

pub(super) fn settling(c: &Connection) -> Result<Settling, StoreError> {
    let open: i64 = c.query_row_kept(
        "SELECT COUNT(*) FROM commands
         WHERE state NOT IN ('succeeded', 'failed', 'expired', 'rejected')",
        [],
        |r| r.get(0),
    )?;
    let unapplied: i64 = c.query_row_kept(
        "SELECT COUNT(*) FROM node_specs s LEFT JOIN node_state t ON t.node_id = s.node_id
         WHERE COALESCE(t.applied_generation, 0) != s.generation",
        [],
        |r| r.get(0),
    )?;
    Ok(Settling {
        open_commands: open as usize,
        unapplied_specs: unapplied as usize,
    })
}
