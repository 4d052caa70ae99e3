//! Rollouts.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, json_col, now, to_json};
use crate::error::{StoreError, TxError};
use crate::rollouts::{
    Candidate, NewRollout, NodeStatus, Rollout, RolloutCommand, RolloutNode, RolloutState,
    new_rollout_id, plan,
};

pub(super) fn start(c: &Connection, r: &NewRollout) -> Result<Rollout, TxError> {
    let release_known = c
        .query_row_kept(
            "SELECT 1 FROM releases WHERE sequence = ?1",
            [r.sequence as i64],
            |_| Ok(()),
        )
        .optional()?
        .is_some();
    let active: Option<String> = c
        .query_row_kept(
            "SELECT id FROM rollouts WHERE state IN (?1, ?2) LIMIT 1",
            params![RolloutState::Running.name(), RolloutState::Paused.name()],
            |row| row.get(0),
        )
        .optional()?;
    let candidates: Vec<Candidate> = c
        .prepare(
            "SELECT id, hostname, agent_version FROM nodes WHERE deleted_at IS NULL ORDER BY id",
        )?
        .query_map([], |row| {
            Ok(Candidate {
                node_id: row.get(0)?,
                hostname: row.get(1)?,
                version: row.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let chosen = plan(r, release_known, active.as_deref(), &candidates)?;
    let id = new_rollout_id();
    let now = now(c)?;
    c.execute_kept(
        "INSERT INTO rollouts (id, sequence, selector, waves, max_failures, state, wave,
             created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?7)",
        params![
            id,
            r.sequence as i64,
            r.recorded_selector(),
            to_json(&r.waves),
            r.max_failures,
            RolloutState::Running.name(),
            now
        ],
    )?;
    for (i, node) in chosen.iter().enumerate() {
        c.execute_kept(
            "INSERT INTO rollout_nodes (rollout_id, node_id, position) VALUES (?1, ?2, ?3)",
            params![id, node, i as i64],
        )?;
    }
    get(c, &id)?.ok_or_else(|| StoreError::Corrupt(format!("rollout {id} vanished")).into())
}

pub(super) fn get(c: &Connection, id: &str) -> rusqlite::Result<Option<Rollout>> {
    let row = c
        .query_row_kept(
            "SELECT r.id, r.sequence, COALESCE(rel.version, ''), r.selector, r.waves,
                    r.max_failures, r.state, r.wave, r.reason, r.created_at
             FROM rollouts r LEFT JOIN releases rel ON rel.sequence = r.sequence
             WHERE r.id = ?1",
            [id],
            |r| {
                let state: String = r.get(6)?;
                Ok(Rollout {
                    id: r.get(0)?,
                    sequence: r.get::<_, i64>(1)? as u64,
                    version: r.get(2)?,
                    selector: r.get(3)?,
                    waves: json_col(r, 4)?,
                    max_failures: r.get(5)?,
                    state: RolloutState::parse(&state).ok_or_else(|| {
                        rusqlite::Error::FromSqlConversionFailure(
                            6,
                            rusqlite::types::Type::Text,
                            format!("unknown rollout state {state:?}").into(),
                        )
                    })?,
                    wave: r.get::<_, i64>(7)? as usize,
                    reason: r.get(8)?,
                    created_at_ms: r.get(9)?,
                    nodes: Vec::new(),
                })
            },
        )
        .optional()?;
    let Some(mut rollout) = row else {
        return Ok(None);
    };
    rollout.nodes = c
        .prepare_cached(
            "SELECT rn.node_id, rn.position, rn.command_id, c.state, COALESCE(c.reason, ''),
                    rn.rollback_id, rn.skipped, COALESCE(n.release_floor, 0)
             FROM rollout_nodes rn
             LEFT JOIN commands c ON c.id = rn.command_id
             LEFT JOIN nodes n ON n.id = rn.node_id
             WHERE rn.rollout_id = ?1 ORDER BY rn.position",
        )?
        .query_map([id], |r| {
            let state: Option<String> = r.get(3)?;
            let reason: String = r.get(4)?;
            let skipped: bool = r.get(6)?;
            Ok(RolloutNode {
                node_id: r.get(0)?,
                position: r.get::<_, i64>(1)? as usize,
                status: if skipped {
                    NodeStatus::Skipped
                } else {
                    NodeStatus::of_command(state.as_deref(), &reason)
                },
                command_id: r.get(2)?,
                command_state: state,
                reason,
                rollback_id: r.get(5)?,
                release_floor: r.get::<_, i64>(7)? as u64,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(Some(rollout))
}

pub(super) fn list(c: &Connection) -> Result<Vec<Rollout>, StoreError> {
    let ids: Vec<String> = c
        .prepare("SELECT id FROM rollouts ORDER BY created_at DESC, id")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = get(c, &id)? {
            out.push(r);
        }
    }
    Ok(out)
}

pub(super) fn set_state(
    c: &Connection,
    id: &str,
    from: &[RolloutState],
    to: RolloutState,
    reason: &str,
) -> Result<bool, StoreError> {
    let from: Vec<&str> = from.iter().map(|s| s.name()).collect();
    let n = c.execute_kept(
        "UPDATE rollouts SET state = ?2, reason = ?3, updated_at = compute_now()
         WHERE id = ?1 AND state IN (SELECT value FROM json_each(?4))",
        params![id, to.name(), reason, to_json(&from)],
    )?;
    Ok(n == 1)
}

pub(super) fn advance(
    c: &Connection,
    id: &str,
    from: usize,
    to: usize,
) -> Result<bool, StoreError> {
    let n = c.execute_kept(
        "UPDATE rollouts SET wave = ?3 WHERE id = ?1 AND wave = ?2 AND state = ?4",
        params![id, from as i64, to as i64, RolloutState::Running.name()],
    )?;
    Ok(n == 1)
}

pub(super) fn record_command(
    c: &Connection,
    id: &str,
    node_id: &str,
    which: RolloutCommand,
    command_id: &str,
) -> Result<(), StoreError> {
    let sql = match which {
        RolloutCommand::Upgrade => {
            "UPDATE rollout_nodes SET command_id = ?3 WHERE rollout_id = ?1 AND node_id = ?2"
        }
        RolloutCommand::Rollback => {
            "UPDATE rollout_nodes SET rollback_id = ?3 WHERE rollout_id = ?1 AND node_id = ?2"
        }
    };
    c.execute_kept(sql, params![id, node_id, command_id])?;
    Ok(())
}

pub(super) fn skip(c: &Connection, id: &str, node_id: &str) -> Result<(), StoreError> {
    c.execute_kept(
        "UPDATE rollout_nodes SET skipped = 1 WHERE rollout_id = ?1 AND node_id = ?2",
        params![id, node_id],
    )?;
    Ok(())
}
