//! The liveness sweep.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, json_col, now, to_json};
use crate::error::StoreError;
use crate::liveness::{GATEWAY_LOST, LivenessRules, SweepOutcome, hold_until, unreachable_due};
use crate::nodes::{CONDITION_UNREACHABLE, TAINT_UNREACHABLE, with};

const LAST_SWEEP: &str = "liveness.last_sweep";
const HOLD_UNTIL: &str = "liveness.hold_until";

fn get(c: &Connection, name: &str) -> rusqlite::Result<Option<i64>> {
    c.query_row_kept(
        "SELECT value FROM controller_state WHERE name = ?1",
        [name],
        |r| r.get(0),
    )
    .optional()
}

fn set(c: &Connection, name: &str, value: i64) -> rusqlite::Result<()> {
    c.execute_kept(
        "INSERT INTO controller_state (name, value) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        params![name, value],
    )?;
    Ok(())
}

pub(super) fn sweep(c: &Connection, rules: &LivenessRules) -> Result<SweepOutcome, StoreError> {
    let now = now(c)?;
    let held_until = hold_until(
        get(c, LAST_SWEEP)?,
        get(c, HOLD_UNTIL)?.unwrap_or(0),
        now,
        rules,
    );
    set(c, LAST_SWEEP, now)?;
    set(c, HOLD_UNTIL, held_until)?;
    let mut out = SweepOutcome {
        held: now < held_until,
        ..Default::default()
    };
    if out.held {
        return Ok(out);
    }
    out.disconnected = c
        .prepare_cached(
            "UPDATE node_sessions SET state = 'disconnected', state_since = ?1,
                 disconnect_cause = ?2
             WHERE state = 'connected' AND NOT EXISTS (
                 SELECT 1 FROM leases WHERE name = 'gateway:' || node_sessions.gateway_id
                     AND expires_at >= ?1)
             RETURNING node_id",
        )?
        .query_map(params![now, GATEWAY_LOST], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let disconnected: Vec<(String, i64, String)> = c
        .prepare_cached(
            "SELECT node_id, last_seen, disconnect_cause FROM node_sessions
             WHERE state = 'disconnected' ORDER BY node_id",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (node, last_seen, cause) in disconnected {
        if !unreachable_due(last_seen, &cause, now, rules) {
            continue;
        }
        c.prepare_cached(
            "UPDATE node_sessions SET state = 'unreachable', state_since = ?2 WHERE node_id = ?1",
        )?
        .execute(params![node, now])?;
        let (conditions, taints): (Vec<String>, Vec<String>) = c
            .prepare_cached("SELECT conditions, taints FROM nodes WHERE id = ?1")?
            .query_row([&node], |r| Ok((json_col(r, 0)?, json_col(r, 1)?)))?;
        c.prepare_cached("UPDATE nodes SET conditions = ?2, taints = ?3 WHERE id = ?1")?
            .execute(params![
                node,
                to_json(&with(conditions, CONDITION_UNREACHABLE)),
                to_json(&with(taints, TAINT_UNREACHABLE))
            ])?;
        out.unreachable.push(node);
    }
    Ok(out)
}
