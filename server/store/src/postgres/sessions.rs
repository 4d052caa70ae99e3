//! What sessions write besides the Hello (`crate::sql::sessions`), with
//! arrays: writes on behalf of a session carry `AND epoch = $epoch` and
//! match nothing once a newer Hello ran.

use super::{Tx, execute, ms, query, query_one, query_opt};
use crate::error::StoreError;
use crate::leases::gateway_lease;
use crate::sessions::{Ended, FleetSize, Seen, SessionKey, SessionRow};

/// One statement for every session that ended; rows whose epoch moved on
/// match nothing.
pub(super) async fn disconnect(
    tx: &Tx<'_>,
    ended: &[Ended],
) -> Result<Vec<SessionKey>, StoreError> {
    if ended.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted: Vec<&Ended> = ended.iter().collect();
    // One order for every writer of many session rows.
    sorted.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let nodes: Vec<&str> = sorted.iter().map(|e| e.node_id.as_str()).collect();
    let epochs: Vec<i64> = sorted.iter().map(|e| e.epoch as i64).collect();
    let causes: Vec<&str> = sorted.iter().map(|e| e.cause.as_str()).collect();
    let seen: Vec<i64> = sorted.iter().map(|e| ms(e.seen_age)).collect();
    let ended_ages: Vec<i64> = sorted.iter().map(|e| ms(e.ended_age)).collect();
    Ok(query(
        tx,
        "UPDATE node_sessions s SET state = 'disconnected', state_since = compute_now() - v.ended,
             disconnect_cause = v.cause, last_seen = GREATEST(s.last_seen, compute_now() - v.seen)
         FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[])
              AS v(node_id, epoch, cause, seen, ended)
         WHERE s.node_id = v.node_id AND s.epoch = v.epoch AND s.state = 'connected'
         RETURNING s.node_id, s.epoch",
        &[&nodes, &epochs, &causes, &seen, &ended_ages],
    )
    .await?
    .iter()
    .map(|r| SessionKey {
        node_id: r.get(0),
        epoch: r.get::<_, i64>(1) as u64,
    })
    .collect())
}

/// One statement for the whole flush: the database turns each age into a
/// time on its own clock; rows whose epoch moved on match nothing, and
/// those sessions are answered as gone.
pub(super) async fn flush_liveness(
    tx: &Tx<'_>,
    gateway_id: &str,
    seen: &[Seen],
) -> Result<Vec<SessionKey>, StoreError> {
    if seen.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted: Vec<&Seen> = seen.iter().collect();
    // One order for every writer of many session rows.
    sorted.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let nodes: Vec<&str> = sorted.iter().map(|s| s.node_id.as_str()).collect();
    let epochs: Vec<i64> = sorted.iter().map(|s| s.epoch as i64).collect();
    let ages: Vec<i64> = sorted.iter().map(|s| ms(s.age)).collect();
    let current: std::collections::HashSet<(String, i64)> = query(
        tx,
        "UPDATE node_sessions s SET last_seen = GREATEST(s.last_seen, compute_now() - v.age)
         FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(node_id, epoch, age)
         WHERE s.node_id = v.node_id AND s.epoch = v.epoch AND s.gateway_id = $4
           AND s.state = 'connected'
         RETURNING s.node_id, s.epoch",
        &[&nodes, &epochs, &ages, &gateway_id],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    Ok(seen
        .iter()
        .filter(|s| !current.contains(&(s.node_id.clone(), s.epoch as i64)))
        .map(|s| SessionKey {
            node_id: s.node_id.clone(),
            epoch: s.epoch,
        })
        .collect())
}

pub(super) async fn gateway_shutdown(
    tx: &Tx<'_>,
    gateway_id: &str,
    sessions: &[SessionKey],
) -> Result<(), StoreError> {
    let ended: Vec<Ended> = sessions.iter().map(Ended::at_shutdown).collect();
    disconnect(tx, &ended).await?;
    execute(
        tx,
        "DELETE FROM leases WHERE name = $1 AND owner = $2",
        &[&gateway_lease(gateway_id), &gateway_id],
    )
    .await?;
    Ok(())
}

pub(super) async fn fleet_size(tx: &Tx<'_>) -> Result<FleetSize, StoreError> {
    let r = query_one(
        tx,
        "SELECT (SELECT COUNT(*) FROM node_sessions WHERE state = 'connected'),
                (SELECT COUNT(*) FROM leases WHERE name LIKE 'gateway:%'
                    AND expires_at >= compute_now()),
                (SELECT COALESCE(SUM(absorbs_per_s), 0)::bigint FROM leases
                    WHERE name LIKE 'gateway:%' AND expires_at >= compute_now())",
        &[],
    )
    .await?;
    Ok(FleetSize {
        connected: r.get::<_, i64>(0).max(0) as usize,
        gateways: r.get::<_, i64>(1).max(0) as usize,
        absorbs_per_s: r.get::<_, i64>(2).max(0) as u64,
    })
}

pub(super) async fn session(tx: &Tx<'_>, node_id: &str) -> Result<Option<SessionRow>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT epoch, gateway_id, state FROM node_sessions WHERE node_id = $1",
        &[&node_id],
    )
    .await?
    .map(|r| SessionRow {
        epoch: r.get::<_, i64>(0) as u64,
        gateway_id: r.get(1),
        state: r.get(2),
    }))
}

pub(super) async fn connected_to(tx: &Tx<'_>, gateway_id: &str) -> Result<Vec<String>, StoreError> {
    Ok(query(
        tx,
        "SELECT node_id FROM node_sessions WHERE gateway_id = $1 AND state = 'connected'
         ORDER BY node_id",
        &[&gateway_id],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

pub(super) async fn spec_generations(
    tx: &Tx<'_>,
    gateway_id: &str,
) -> Result<Vec<(String, u64)>, StoreError> {
    Ok(query(
        tx,
        "SELECT s.node_id, p.generation FROM node_sessions s
         JOIN node_specs p ON p.node_id = s.node_id
         WHERE s.gateway_id = $1 AND s.state = 'connected'
         ORDER BY s.node_id",
        &[&gateway_id],
    )
    .await?
    .iter()
    .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
    .collect())
}

pub(super) async fn nodes_with_work(
    tx: &Tx<'_>,
    gateway_id: &str,
    specs_since_ms: i64,
) -> Result<Vec<String>, StoreError> {
    Ok(query(
        tx,
        "SELECT s.node_id FROM node_sessions s
         WHERE s.gateway_id = $1 AND s.state = 'connected' AND (
             EXISTS (SELECT 1 FROM commands c
                     WHERE c.node_id = s.node_id AND c.state = 'pending')
             OR EXISTS (SELECT 1 FROM node_specs p
                        WHERE p.node_id = s.node_id AND p.updated_at >= $2))",
        &[&gateway_id, &specs_since_ms],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}
