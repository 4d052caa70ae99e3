//! The start-up reconcile (see `crate::reconcile`).

use rusqlite::{Connection, params};

use super::{Kept, json_col, ms, to_json};
use crate::error::StoreError;
use crate::reconcile::{HistoryLimits, Pruned, Reconciled, derived};

/// Removes leases dead for longer than `dead_after`; returns their names.
pub(super) fn remove_dead_leases(
    c: &Connection,
    dead_after: std::time::Duration,
) -> Result<Vec<String>, StoreError> {
    Ok(
        c.prepare_cached(
            "DELETE FROM leases WHERE expires_at < compute_now() - ?1 RETURNING name",
        )?
        .query_map([ms(dead_after)], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?,
    )
}

/// A node's id, conditions and taints, and its session's state.
type NodeDerived = (String, Vec<String>, Vec<String>, Option<String>);

/// Removes the oldest security events and boot records past `limits`.
pub(super) fn prune_history(c: &Connection, limits: HistoryLimits) -> Result<Pruned, StoreError> {
    let fleet_events = c.execute_kept(
        "DELETE FROM fleet_events WHERE id IN (
             SELECT id FROM (
                 SELECT id, row_number() OVER (PARTITION BY node_id ORDER BY id DESC) AS n
                 FROM fleet_events) AS ranked
             WHERE n > ?1)",
        [i64::from(limits.fleet_events_per_node)],
    )? as u64;
    let boots = c.execute_kept(
        "DELETE FROM boots WHERE id IN (
             SELECT id FROM (
                 SELECT id,
                        row_number() OVER (PARTITION BY mac ORDER BY id DESC) AS per_mac,
                        row_number() OVER (ORDER BY id DESC) AS overall
                 FROM boots) AS ranked
             WHERE per_mac > ?1 OR overall > ?2)",
        params![i64::from(limits.boots_per_mac), i64::from(limits.boots)],
    )? as u64;
    Ok(Pruned {
        fleet_events,
        boots,
    })
}

pub(super) fn run(
    c: &Connection,
    owner: &str,
    dead_after: std::time::Duration,
) -> Result<Reconciled, StoreError> {
    let mut out = Reconciled {
        leases_removed: remove_dead_leases(c, dead_after)?,
        ..Default::default()
    };
    out.leases_removed.sort();
    let nodes: Vec<NodeDerived> = c
        .prepare(
            "SELECT n.id, n.conditions, n.taints, s.state FROM nodes n
             LEFT JOIN node_sessions s ON s.node_id = n.id ORDER BY n.id",
        )?
        .query_map([], |r| {
            Ok((r.get(0)?, json_col(r, 1)?, json_col(r, 2)?, r.get(3)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (id, conditions, taints, state) in nodes {
        let want = derived(conditions.clone(), taints.clone(), state.as_deref());
        if want != (conditions, taints) {
            c.execute_kept(
                "UPDATE nodes SET conditions = ?2, taints = ?3 WHERE id = ?1",
                params![id, to_json(&want.0), to_json(&want.1)],
            )?;
            out.derived_fixed.push(id);
        }
    }
    out.routes_to_dead_gateways = c.query_row_kept(
        "SELECT count(*) FROM node_sessions s WHERE s.state = 'connected' AND NOT EXISTS (
             SELECT 1 FROM leases WHERE name = 'gateway:' || s.gateway_id
                 AND expires_at >= compute_now())",
        [],
        |r| r.get::<_, i64>(0).map(|n| n.max(0) as u64),
    )?;
    out.commands_held_by_away_nodes = c.query_row_kept(
        "SELECT count(*) FROM commands c WHERE c.state IN ('dispatched', 'acked', 'running')
             AND NOT EXISTS (SELECT 1 FROM node_sessions s
                 WHERE s.node_id = c.node_id AND s.state = 'connected')",
        [],
        |r| r.get::<_, i64>(0).map(|n| n.max(0) as u64),
    )?;
    out.rollouts_running = c.query_row_kept(
        "SELECT count(*) FROM rollouts WHERE state = 'running'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n.max(0) as u64),
    )?;
    c.execute_kept(
        "INSERT INTO audit (at, node_id, kind, gateway_id, detail)
         VALUES (compute_now(), '', 'reconcile', ?1, ?2)",
        params![owner, to_json(&out)],
    )?;
    Ok(out)
}
