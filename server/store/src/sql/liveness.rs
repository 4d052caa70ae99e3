//! The liveness sweep.

use super::{Db, Dialect, List, in_list, to_json};
use crate::error::StoreError;
use crate::liveness::{GATEWAY_LOST, LivenessRules, SweepOutcome, hold_until, unreachable_due};
use crate::nodes::{CONDITION_UNREACHABLE, TAINT_UNREACHABLE, with};

const LAST_SWEEP: &str = "liveness.last_sweep";
const HOLD_UNTIL: &str = "liveness.hold_until";
/// Orders sweeps on PostgreSQL: two controllers (a lease takeover) never
/// interleave one (SQLite's one writer orders them).
const SWEEP_LOCK: i64 = 0x6263_5f6c_6976; // "bc_liv"

async fn get(db: &impl Db, name: &str) -> Result<Option<i64>, StoreError> {
    db.query_opt(
        "SELECT value FROM controller_state WHERE name = $1",
        &[&name],
    )
    .await?
    .map(|r| r.get(0))
    .transpose()
}

async fn set(db: &impl Db, name: &str, value: i64) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO controller_state (name, value) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        &[&name, &value],
    )
    .await?;
    Ok(())
}

pub(crate) async fn sweep(db: &impl Db, rules: &LivenessRules) -> Result<SweepOutcome, StoreError> {
    if db.dialect() == Dialect::Postgres {
        db.execute("SELECT pg_advisory_xact_lock($1)", &[&SWEEP_LOCK])
            .await?;
    }
    let now = db.now().await?;
    let held_until = hold_until(
        get(db, LAST_SWEEP).await?,
        get(db, HOLD_UNTIL).await?.unwrap_or(0),
        now,
        rules,
    );
    set(db, LAST_SWEEP, now).await?;
    set(db, HOLD_UNTIL, held_until).await?;
    let mut out = SweepOutcome {
        held: now < held_until,
        ..Default::default()
    };
    if out.held {
        return Ok(out);
    }
    // Disconnected nodes past their time become unreachable. Each is
    // locked node row first, as a Hello locks it, and changes only if it
    // is still disconnected and unseen since it was judged.
    let disconnected: Vec<(String, i64, String)> = db
        .query(
            "SELECT node_id, last_seen, disconnect_cause FROM node_sessions
         WHERE state = 'disconnected' ORDER BY node_id",
            &[],
        )
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .collect::<Result<_, StoreError>>()?;
    for (node, last_seen, cause) in disconnected {
        if !unreachable_due(last_seen, &cause, now, rules) {
            continue;
        }
        let Some(row) = db
            .query_opt(
                "SELECT conditions, taints FROM nodes WHERE id = $1 FOR NO KEY UPDATE",
                &[&node],
            )
            .await?
        else {
            continue;
        };
        let changed = db
            .execute(
                "UPDATE node_sessions SET state = 'unreachable', state_since = $2
             WHERE node_id = $1 AND state = 'disconnected' AND last_seen = $3",
                &[&node, &now, &last_seen],
            )
            .await?;
        if changed == 0 {
            continue;
        }
        let (conditions, taints): (Vec<String>, Vec<String>) = (row.json(0)?, row.json(1)?);
        db.execute(
            "UPDATE nodes SET conditions = $2, taints = $3 WHERE id = $1",
            &[
                &node,
                &to_json(&with(conditions, CONDITION_UNREACHABLE)),
                &to_json(&with(taints, TAINT_UNREACHABLE)),
            ],
        )
        .await?;
        out.unreachable.push(node);
    }
    // Sessions of a gateway whose lease ran out. The expired leases are
    // held FOR SHARE, so a renewal racing this sweep lands after it.
    let expired: Vec<String> = db
        .column(
            "SELECT substr(name, 9) FROM leases WHERE name LIKE 'gateway:%' AND expires_at < $1
         FOR SHARE",
            &[&now],
        )
        .await?;
    let mut lost: Vec<String> = db
        .column(
            &format!(
                "UPDATE node_sessions SET state = 'disconnected', state_since = $1,
                     disconnect_cause = $2
                 WHERE state = 'connected' AND ({} OR NOT EXISTS (
                     SELECT 1 FROM leases WHERE name = 'gateway:' || node_sessions.gateway_id))
                 RETURNING node_id",
                in_list(db.dialect(), "gateway_id", 3)
            ),
            &[&now, &GATEWAY_LOST, &List(expired)],
        )
        .await?;
    lost.sort();
    out.disconnected = lost;
    Ok(out)
}
