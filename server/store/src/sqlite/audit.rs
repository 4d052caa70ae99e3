//! The audit history, read for the invariant checkers.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::{json_col, now};
use crate::audit::{
    AuditRow, AuditSnapshot, BindingFact, ChainHead, CommandFact, SessionFact, Settling,
};
use crate::error::StoreError;

pub(super) fn snapshot(c: &Connection) -> Result<AuditSnapshot, StoreError> {
    let now = now(c)?;
    let audit = c
        .prepare(
            "SELECT COALESCE(seq, 0), at, node_id, kind, epoch, gateway_id, value, detail, \
         COALESCE(prev_hash, ''), COALESCE(hash, '') FROM audit ORDER BY seq NULLS FIRST, id",
        )?
        .query_map([], |r| {
            Ok(AuditRow {
                id: r.get(0)?,
                at: r.get(1)?,
                node_id: r.get(2)?,
                kind: r.get(3)?,
                epoch: r.get::<_, i64>(4)? as u64,
                gateway_id: r.get(5)?,
                value: r.get(6)?,
                detail: r.get(7)?,
                prev_hash: r.get(8)?,
                hash: r.get(9)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let head = c.query_row("SELECT seq, hash FROM audit_head WHERE one = 1", [], |r| {
        Ok(ChainHead {
            seq: r.get(0)?,
            hash: r.get(1)?,
        })
    })?;
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
        head,
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
    let open: i64 = c.query_row(
        "SELECT COUNT(*) FROM commands
         WHERE state NOT IN ('succeeded', 'failed', 'expired', 'rejected')",
        [],
        |r| r.get(0),
    )?;
    let unapplied: i64 = c.query_row(
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
