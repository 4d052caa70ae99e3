//! The start-up reconcile (see `crate::reconcile`).

use super::{Db, to_json};
use crate::clock::ms;
use crate::error::StoreError;
use crate::reconcile::{HistoryLimits, Pruned, Reconciled, derived};

/// Removes leases dead for longer than `dead_after`; returns their names.
pub(crate) async fn remove_dead_leases(
    db: &impl Db,
    dead_after: std::time::Duration,
) -> Result<Vec<String>, StoreError> {
    db.column(
        "DELETE FROM leases WHERE expires_at < compute_now() - $1 RETURNING name",
        &[&ms(dead_after)],
    )
    .await
}

/// Removes the oldest security events and boot records past `limits`.
pub(crate) async fn prune_history(
    db: &impl Db,
    limits: HistoryLimits,
) -> Result<Pruned, StoreError> {
    let fleet_events = db
        .execute(
            "DELETE FROM fleet_events WHERE id IN (
             SELECT id FROM (
                 SELECT id, row_number() OVER (PARTITION BY node_id ORDER BY id DESC) AS n
                 FROM fleet_events) AS ranked
             WHERE n > $1)",
            &[&i64::from(limits.fleet_events_per_node)],
        )
        .await?;
    let boots = db
        .execute(
            "DELETE FROM boots WHERE id IN (
             SELECT id FROM (
                 SELECT id,
                        row_number() OVER (PARTITION BY mac ORDER BY id DESC) AS per_mac,
                        row_number() OVER (ORDER BY id DESC) AS overall
                 FROM boots) AS ranked
             WHERE per_mac > $1 OR overall > $2)",
            &[&i64::from(limits.boots_per_mac), &i64::from(limits.boots)],
        )
        .await?;
    Ok(Pruned {
        fleet_events,
        boots,
    })
}

pub(crate) async fn run(
    db: &impl Db,
    owner: &str,
    dead_after: std::time::Duration,
) -> Result<Reconciled, StoreError> {
    let mut out = Reconciled {
        leases_removed: remove_dead_leases(db, dead_after).await?,
        ..Default::default()
    };
    out.leases_removed.sort();
    let rows = db
        .query(
            "SELECT n.id, n.conditions, n.taints, s.state FROM nodes n
         LEFT JOIN node_sessions s ON s.node_id = n.id ORDER BY n.id FOR UPDATE OF n",
            &[],
        )
        .await?;
    for r in &rows {
        let id: String = r.get(0)?;
        let conditions: Vec<String> = r.json(1)?;
        let taints: Vec<String> = r.json(2)?;
        let state: Option<String> = r.get(3)?;
        let want = derived(conditions.clone(), taints.clone(), state.as_deref());
        if want != (conditions, taints) {
            db.execute(
                "UPDATE nodes SET conditions = $2, taints = $3 WHERE id = $1",
                &[&id, &to_json(&want.0), &to_json(&want.1)],
            )
            .await?;
            out.derived_fixed.push(id);
        }
    }
    let count = |sql: &'static str| async move {
        Ok::<_, StoreError>(db.query_one(sql, &[]).await?.get::<i64>(0)?.max(0) as u64)
    };
    out.routes_to_dead_gateways = count(
        "SELECT count(*) FROM node_sessions s WHERE s.state = 'connected' AND NOT EXISTS (
             SELECT 1 FROM leases WHERE name = 'gateway:' || s.gateway_id
                 AND expires_at >= compute_now())",
    )
    .await?;
    out.commands_held_by_away_nodes = count(
        "SELECT count(*) FROM commands c WHERE c.state IN ('dispatched', 'acked', 'running')
             AND NOT EXISTS (SELECT 1 FROM node_sessions s
                 WHERE s.node_id = c.node_id AND s.state = 'connected')",
    )
    .await?;
    out.rollouts_running = count("SELECT count(*) FROM rollouts WHERE state = 'running'").await?;
    db.execute(
        "INSERT INTO audit (at, node_id, kind, gateway_id, detail)
         VALUES (compute_now(), '', 'reconcile', $1, $2)",
        &[&owner, &to_json(&out)],
    )
    .await?;
    Ok(out)
}
