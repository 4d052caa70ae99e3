//! Rollouts.

use super::{Db, Dialect, List, in_list, to_json};
use crate::error::{StoreError, TxError};
use crate::id::{CommandId, NodeId};
use crate::rollouts::{
    Candidate, NewRollout, NodeStatus, Rollout, RolloutCommand, RolloutNode, RolloutState,
    new_rollout_id, plan,
};

/// Orders rollout starts on PostgreSQL: at most one active rollout
/// (SQLite's one writer orders them).
const START_LOCK: i64 = 0x6263_5f72_6f6c; // "bc_rol"

pub(crate) async fn start(db: &impl Db, r: &NewRollout) -> Result<Rollout, TxError> {
    if db.dialect() == Dialect::Postgres {
        db.execute("SELECT pg_advisory_xact_lock($1)", &[&START_LOCK])
            .await?;
    }
    let sequence = r.sequence;
    let release_known = db
        .query_opt("SELECT 1 FROM releases WHERE sequence = $1", &[&sequence])
        .await?
        .is_some();
    let active: Option<String> = db
        .query_opt(
            "SELECT id FROM rollouts WHERE state IN ($1, $2) LIMIT 1",
            &[&RolloutState::Running.name(), &RolloutState::Paused.name()],
        )
        .await?
        .map(|row| row.get(0))
        .transpose()?;
    let candidates: Vec<Candidate> = db
        .query(
            "SELECT id, hostname, agent_version FROM nodes WHERE deleted_at IS NULL ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|row| {
            Ok(Candidate {
                node_id: row.get(0)?,
                hostname: row.get(1)?,
                version: row.get(2)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let chosen = plan(r, release_known, active.as_deref(), &candidates)?;
    let id = new_rollout_id();
    let now = db.now().await?;
    db.execute(
        "INSERT INTO rollouts (id, sequence, selector, waves, max_failures, state, wave,
             created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $7)",
        &[
            &id,
            &sequence,
            &r.recorded_selector(),
            &to_json(&r.waves),
            &i64::from(r.max_failures),
            &RolloutState::Running.name(),
            &now,
        ],
    )
    .await?;
    // One statement for the chosen nodes, each at its place in the list
    // (from 0).
    let sql = match db.dialect() {
        Dialect::Sqlite => {
            "INSERT INTO rollout_nodes (rollout_id, node_id, position)
             SELECT $1, value, key FROM json_each($2)"
        }
        Dialect::Postgres => {
            "INSERT INTO rollout_nodes (rollout_id, node_id, position)
             SELECT $1, n.node_id, n.position - 1
             FROM unnest($2::text[]) WITH ORDINALITY AS n(node_id, position)"
        }
    };
    db.execute(sql, &[&id, &List(chosen)]).await?;
    Ok(get(db, &id)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("rollout {id} vanished")))?)
}

pub(crate) async fn get(db: &impl Db, id: &str) -> Result<Option<Rollout>, StoreError> {
    let Some(r) = db
        .query_opt(
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
    let state: String = r.get(6)?;
    let mut rollout = Rollout {
        id: r.get(0)?,
        sequence: r.get(1)?,
        version: r.get(2)?,
        selector: r.get(3)?,
        waves: r.json(4)?,
        max_failures: r.get::<i64>(5)?.clamp(0, u32::MAX as i64) as u32,
        state: RolloutState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown rollout state {state:?}")))?,
        wave: r.get::<i64>(7)? as usize,
        reason: r.get(8)?,
        created_at_ms: r.get(9)?,
        nodes: Vec::new(),
    };
    rollout.nodes = db
        .query(
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
            let state: Option<String> = r.get(3)?;
            let reason: String = r.get(4)?;
            let skipped: bool = r.get(6)?;
            Ok(RolloutNode {
                node_id: r.get(0)?,
                position: r.get::<i64>(1)? as usize,
                status: if skipped {
                    NodeStatus::Skipped
                } else {
                    NodeStatus::of_command(state.as_deref(), &reason)
                },
                command_id: r.get(2)?,
                command_state: state,
                reason,
                rollback_id: r.get(5)?,
                release_floor: r.get::<i64>(7)? as u64,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Some(rollout))
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<Rollout>, StoreError> {
    let ids: Vec<String> = db
        .column("SELECT id FROM rollouts ORDER BY created_at DESC, id", &[])
        .await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = get(db, &id).await? {
            out.push(r);
        }
    }
    Ok(out)
}

pub(crate) async fn set_state(
    db: &impl Db,
    id: &str,
    from: &[RolloutState],
    to: RolloutState,
    reason: &str,
) -> Result<bool, StoreError> {
    let from: Vec<&str> = from.iter().map(|s| s.name()).collect();
    let n = db
        .execute(
            &format!(
                "UPDATE rollouts SET state = $2, reason = $3, updated_at = compute_now()
                 WHERE id = $1 AND {}",
                in_list(db.dialect(), "state", 4)
            ),
            &[&id, &to.name(), &reason, &List(from)],
        )
        .await?;
    Ok(n == 1)
}

pub(crate) async fn advance(
    db: &impl Db,
    id: &str,
    from: usize,
    to: usize,
) -> Result<bool, StoreError> {
    let n = db
        .execute(
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

pub(crate) async fn record_command(
    db: &impl Db,
    id: &str,
    node_id: &NodeId,
    which: RolloutCommand,
    command_id: &CommandId,
) -> Result<(), StoreError> {
    let sql = match which {
        RolloutCommand::Upgrade => {
            "UPDATE rollout_nodes SET command_id = $3 WHERE rollout_id = $1 AND node_id = $2"
        }
        RolloutCommand::Rollback => {
            "UPDATE rollout_nodes SET rollback_id = $3 WHERE rollout_id = $1 AND node_id = $2"
        }
    };
    db.execute(sql, &[&id, &node_id, &command_id]).await?;
    Ok(())
}

pub(crate) async fn skip(db: &impl Db, id: &str, node_id: &NodeId) -> Result<(), StoreError> {
    db.execute(
        "UPDATE rollout_nodes SET skipped = TRUE WHERE rollout_id = $1 AND node_id = $2",
        &[&id, &node_id],
    )
    .await?;
    Ok(())
}
