//! Rollouts.

use super::{Tx, execute, json_col, now, query, query_opt};
use crate::error::{StoreError, TxError};
use crate::rollouts::{
    Candidate, NewRollout, NodeStatus, Rollout, RolloutCommand, RolloutNode, RolloutState,
    new_rollout_id, plan,
};

/// Orders rollout starts: at most one active rollout.
const START_LOCK: i64 = 0x6263_5f72_6f6c; // "bc_rol"

pub(super) async fn start(tx: &Tx<'_>, r: &NewRollout) -> Result<Rollout, TxError> {
    execute(tx, "SELECT pg_advisory_xact_lock($1)", &[&START_LOCK]).await?;
    let sequence = r.sequence.min(i64::MAX as u64) as i64;
    let release_known = query_opt(
        tx,
        "SELECT 1 FROM releases WHERE sequence = $1",
        &[&sequence],
    )
    .await?
    .is_some();
    let active: Option<String> = query_opt(
        tx,
        "SELECT id FROM rollouts WHERE state IN ($1, $2) LIMIT 1",
        &[&RolloutState::Running.name(), &RolloutState::Paused.name()],
    )
    .await?
    .map(|row| row.get(0));
    let candidates: Vec<Candidate> = query(
        tx,
        "SELECT id, hostname, agent_version FROM nodes WHERE deleted_at IS NULL ORDER BY id",
        &[],
    )
    .await?
    .iter()
    .map(|row| Candidate {
        node_id: row.get(0),
        hostname: row.get(1),
        version: row.get(2),
    })
    .collect();
    let chosen = plan(r, release_known, active.as_deref(), &candidates)?;
    let id = new_rollout_id();
    let now = now(tx).await?;
    execute(
        tx,
        "INSERT INTO rollouts (id, sequence, selector, waves, max_failures, state, wave,
             created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $7)",
        &[
            &id,
            &sequence,
            &r.recorded_selector(),
            &super::to_json(&r.waves),
            &i64::from(r.max_failures),
            &RolloutState::Running.name(),
            &now,
        ],
    )
    .await?;
    let positions: Vec<i64> = (0..chosen.len() as i64).collect();
    execute(
        tx,
        "INSERT INTO rollout_nodes (rollout_id, node_id, position)
         SELECT $1, n.node_id, n.position FROM unnest($2::text[], $3::bigint[]) AS n(node_id, position)",
        &[&id, &chosen, &positions],
    )
    .await?;
    Ok(get(tx, &id)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("rollout {id} vanished")))?)
}

pub(super) async fn get(tx: &Tx<'_>, id: &str) -> Result<Option<Rollout>, StoreError> {
    let Some(r) = query_opt(
        tx,
        "SELECT r.id, r.sequence, COALESCE(rel.version, ''), r.selector, r.waves,
                r.max_failures, r.state, r.wave, r.reason, r.created_at
         FROM rollouts r LEFT JOIN releases rel ON rel.sequence = r.sequence
         WHERE r.id = $1",
        &[&id],
    )
    .await?
    else {
        return Ok(None);
    };
    let state: String = r.get(6);
    let mut rollout = Rollout {
        id: r.get(0),
        sequence: r.get::<_, i64>(1) as u64,
        version: r.get(2),
        selector: r.get(3),
        waves: json_col(&r, 4)?,
        max_failures: r.get::<_, i64>(5).clamp(0, u32::MAX as i64) as u32,
        state: RolloutState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown rollout state {state:?}")))?,
        wave: r.get::<_, i64>(7) as usize,
        reason: r.get(8),
        created_at_ms: r.get(9),
        nodes: Vec::new(),
    };
    rollout.nodes = query(
        tx,
        "SELECT rn.node_id, rn.position, rn.command_id, c.state, COALESCE(c.reason, ''),
                rn.rollback_id, rn.skipped, COALESCE(n.release_floor, 0)
         FROM rollout_nodes rn
         LEFT JOIN commands c ON c.id = rn.command_id
         LEFT JOIN nodes n ON n.id = rn.node_id
         WHERE rn.rollout_id = $1 ORDER BY rn.position",
        &[&id],
    )
    .await?
    .iter()
    .map(|r| {
        let state: Option<String> = r.get(3);
        let reason: String = r.get(4);
        let skipped: bool = r.get(6);
        RolloutNode {
            node_id: r.get(0),
            position: r.get::<_, i64>(1) as usize,
            status: if skipped {
                NodeStatus::Skipped
            } else {
                NodeStatus::of_command(state.as_deref(), &reason)
            },
            command_id: r.get(2),
            command_state: state,
            reason,
            rollback_id: r.get(5),
            release_floor: r.get::<_, i64>(7) as u64,
        }
    })
    .collect();
    Ok(Some(rollout))
}

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<Rollout>, StoreError> {
    let ids: Vec<String> = query(
        tx,
        "SELECT id FROM rollouts ORDER BY created_at DESC, id",
        &[],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = get(tx, &id).await? {
            out.push(r);
        }
    }
    Ok(out)
}

pub(super) async fn set_state(
    tx: &Tx<'_>,
    id: &str,
    from: &[RolloutState],
    to: RolloutState,
    reason: &str,
) -> Result<bool, StoreError> {
    let from: Vec<&str> = from.iter().map(|s| s.name()).collect();
    let n = execute(
        tx,
        "UPDATE rollouts SET state = $2, reason = $3, updated_at = compute_now()
         WHERE id = $1 AND state = ANY($4)",
        &[&id, &to.name(), &reason, &from],
    )
    .await?;
    Ok(n == 1)
}

pub(super) async fn advance(
    tx: &Tx<'_>,
    id: &str,
    from: usize,
    to: usize,
) -> Result<bool, StoreError> {
    let n = execute(
        tx,
        "UPDATE rollouts SET wave = $3 WHERE id = $1 AND wave = $2 AND state = $4",
        &[
            &id,
            &(from as i64),
            &(to as i64),
            &RolloutState::Running.name(),
        ],
    )
    .await?;
    Ok(n == 1)
}

pub(super) async fn record_command(
    tx: &Tx<'_>,
    id: &str,
    node_id: &str,
    which: RolloutCommand,
    command_id: &str,
) -> Result<(), StoreError> {
    let sql = match which {
        RolloutCommand::Upgrade => {
            "UPDATE rollout_nodes SET command_id = $3 WHERE rollout_id = $1 AND node_id = $2"
        }
        RolloutCommand::Rollback => {
            "UPDATE rollout_nodes SET rollback_id = $3 WHERE rollout_id = $1 AND node_id = $2"
        }
    };
    execute(tx, sql, &[&id, &node_id, &command_id]).await?;
    Ok(())
}

pub(super) async fn skip(tx: &Tx<'_>, id: &str, node_id: &str) -> Result<(), StoreError> {
    execute(
        tx,
        "UPDATE rollout_nodes SET skipped = TRUE WHERE rollout_id = $1 AND node_id = $2",
        &[&id, &node_id],
    )
    .await?;
    Ok(())
}
