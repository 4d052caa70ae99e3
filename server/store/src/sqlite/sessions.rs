//! What sessions write besides the Hello (`crate::sql::sessions`).

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, ms};
use crate::error::StoreError;
use crate::leases::gateway_lease;
use crate::sessions::{Ended, FleetSize, Seen, SessionKey, SessionRow};

pub(super) fn disconnect(c: &Connection, ended: &[Ended]) -> Result<Vec<SessionKey>, StoreError> {
    let mut q = c.prepare_cached(
        "UPDATE node_sessions SET state = 'disconnected', state_since = compute_now() - ?5,
             disconnect_cause = ?3, last_seen = MAX(last_seen, compute_now() - ?4)
         WHERE node_id = ?1 AND epoch = ?2 AND state = 'connected'",
    )?;
    let mut applied = Vec::new();
    for e in ended {
        let n = q.execute(params![
            e.node_id,
            e.epoch as i64,
            e.cause,
            ms(e.seen_age),
            ms(e.ended_age)
        ])?;
        if n == 1 {
            applied.push(SessionKey {
                node_id: e.node_id.clone(),
                epoch: e.epoch,
            });
        }
    }
    Ok(applied)
}

pub(super) fn flush_liveness(
    c: &Connection,
    gateway_id: &str,
    seen: &[Seen],
) -> Result<Vec<SessionKey>, StoreError> {
    let mut gone = Vec::new();
    let mut q = c.prepare_cached(
        "UPDATE node_sessions SET last_seen = MAX(last_seen, compute_now() - ?4)
         WHERE node_id = ?1 AND epoch = ?2 AND gateway_id = ?3 AND state = 'connected'",
    )?;
    for s in seen {
        if q.execute(params![s.node_id, s.epoch as i64, gateway_id, ms(s.age)])? == 0 {
            gone.push(SessionKey {
                node_id: s.node_id.clone(),
                epoch: s.epoch,
            });
        }
    }
    Ok(gone)
}

pub(super) fn gateway_shutdown(
    c: &Connection,
    gateway_id: &str,
    sessions: &[SessionKey],
) -> Result<(), StoreError> {
    let ended: Vec<Ended> = sessions.iter().map(Ended::at_shutdown).collect();
    disconnect(c, &ended)?;
    c.execute_kept(
        "DELETE FROM leases WHERE name = ?1 AND owner = ?2",
        params![gateway_lease(gateway_id), gateway_id],
    )?;
    Ok(())
}

pub(super) fn fleet_size(c: &Connection) -> Result<FleetSize, StoreError> {
    let (connected, gateways, absorbs): (i64, i64, i64) = c.query_row_kept(
        "SELECT (SELECT COUNT(*) FROM node_sessions WHERE state = 'connected'),
                (SELECT COUNT(*) FROM leases WHERE name LIKE 'gateway:%'
                    AND expires_at >= compute_now()),
                (SELECT COALESCE(SUM(absorbs_per_s), 0) FROM leases
                    WHERE name LIKE 'gateway:%' AND expires_at >= compute_now())",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )?;
    Ok(FleetSize {
        connected: connected.max(0) as usize,
        gateways: gateways.max(0) as usize,
        absorbs_per_s: absorbs.max(0) as u64,
    })
}

pub(super) fn session(c: &Connection, node_id: &str) -> Result<Option<SessionRow>, StoreError> {
    Ok(c.query_row_kept(
        "SELECT epoch, gateway_id, state FROM node_sessions WHERE node_id = ?1",
        [node_id],
        |r| {
            Ok(SessionRow {
                epoch: r.get::<_, i64>(0)? as u64,
                gateway_id: r.get(1)?,
                state: r.get(2)?,
            })
        },
    )
    .optional()?)
}

pub(super) fn connected_to(c: &Connection, gateway_id: &str) -> Result<Vec<String>, StoreError> {
    let mut q = c.prepare_cached(
        "SELECT node_id FROM node_sessions WHERE gateway_id = ?1 AND state = 'connected'
         ORDER BY node_id",
    )?;
    let rows = q
        .query_map([gateway_id], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(rows)
}

pub(super) fn spec_generations(
    c: &Connection,
    gateway_id: &str,
) -> Result<Vec<(String, u64)>, StoreError> {
    let mut q = c.prepare_cached(
        "SELECT s.node_id, p.generation FROM node_sessions s
         JOIN node_specs p ON p.node_id = s.node_id
         WHERE s.gateway_id = ?1 AND s.state = 'connected'
         ORDER BY s.node_id",
    )?;
    let rows = q
        .query_map(params![gateway_id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn nodes_with_work(
    c: &Connection,
    gateway_id: &str,
    specs_since_ms: i64,
) -> Result<Vec<String>, StoreError> {
    let mut q = c.prepare_cached(
        "SELECT s.node_id FROM node_sessions s
         WHERE s.gateway_id = ?1 AND s.state = 'connected' AND (
             EXISTS (SELECT 1 FROM commands c
                     WHERE c.node_id = s.node_id AND c.state = 'pending')
             OR EXISTS (SELECT 1 FROM node_specs p
                        WHERE p.node_id = s.node_id AND p.updated_at >= ?2))",
    )?;
    let rows = q
        .query_map(params![gateway_id, specs_since_ms], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(rows)
}
