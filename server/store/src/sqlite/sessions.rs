//! Sessions: the Hello transaction and what sessions write.

use bcd_core::command::{HelloDecision, ServerState};
use rusqlite::{Connection, OptionalExtension, params};

use super::Lite;
use super::fleet_event;
use super::{Kept, json_col, ms, now, to_json};
use crate::clones;
use crate::commands::Dispatch;
use crate::error::{Refusal, StoreError, TxError};
use crate::leases::gateway_lease;
use crate::nodes::{SUPERSEDED, TAINT_UNREACHABLE, check_cert, conditions_at_hello, without};
use crate::sessions::{
    Ended, Finished, FleetSize, HELLO_WORK, HelloInput, HelloOutcome, InFlight, Seen, SessionKey,
    SessionRow, inventory_wanted, lease_admits, settle_in_flight,
};
use crate::sql::nodes::cert_row;
use crate::sql::ready;

pub(super) fn hello(c: &Connection, h: &HelloInput) -> Result<HelloOutcome, TxError> {
    let now = now(c)?;
    let cert = check_cert(ready(cert_row(&Lite(c), &h.cert_fingerprint))?, now)?;
    if cert.node_id != h.node_id || cert.serial != h.cert_serial {
        return Err(Refusal::WrongCertificate(h.node_id.clone()).into());
    }
    // The routing transaction's fence: this gateway must hold its lease
    // now. A lease that moved or ran out aborts the route (the gateway
    // then fences itself).
    let lease: Option<i64> = c
        .query_row_kept(
            "SELECT expires_at FROM leases WHERE name = ?1 AND owner = ?2",
            params![gateway_lease(&h.gateway_id), h.gateway_id],
            |r| r.get(0),
        )
        .optional()?;
    if !lease_admits(lease, now) {
        return Err(Refusal::Fenced(h.gateway_id.clone()).into());
    }
    let (conditions, taints, proofs_required): (Vec<String>, Vec<String>, bool) = c
        .prepare_cached(
            "SELECT conditions, taints, hello_proofs_since IS NOT NULL FROM nodes WHERE id = ?1",
        )?
        .query_row([&h.node_id], |r| {
            Ok((json_col(r, 0)?, json_col(r, 1)?, r.get(2)?))
        })?;
    if !clones::admits(h.proof.is_some(), proofs_required) {
        return Err(Refusal::HelloUnproved(h.node_id.clone()).into());
    }
    // The node's session, and whether it names a certificate of the node
    // newer than this Hello's: this one is then superseded (a copy of a key
    // the node renewed away from no longer connects; the key holder
    // revokes it from the node's proofs).
    let prev: Option<(i64, String, String, i64, bool, bool)> = c
        .query_row_kept(
            "SELECT s.epoch, s.journal_id, s.boot_id, s.hello_seq,
                 COALESCE(c.not_before > (SELECT not_before FROM node_certs WHERE serial = ?2), 0),
                 s.state = 'connected' AND s.cert_serial = ?2
             FROM node_sessions s
             LEFT JOIN node_certs c ON c.serial = s.cert_serial AND c.node_id = s.node_id
             WHERE s.node_id = ?1",
            params![h.node_id, h.cert_serial],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()?;
    if prev.as_ref().is_some_and(|p| p.4) {
        return Err(Refusal::Revoked(SUPERSEDED.into(), None).into());
    }
    // The boot of the certificate's session, if that is connected.
    let connected = prev.as_ref().filter(|p| p.5).map(|p| p.2.as_str());
    watch_clones(c, h, now, connected, proofs_required)?;
    let proof_seq = h.proof.as_ref().map_or(0, |p| p.seq as i64);
    let hello_seq_seen = prev.as_ref().map_or(0, |p| p.3).max(proof_seq) as u64;
    let stored = prev.as_ref().map_or(0, |p| p.0 as u64);
    let epoch = bcd_core::epoch::next_epoch(stored, h.last_epoch);
    c.prepare_cached(
        "INSERT INTO node_sessions (node_id, epoch, gateway_id, state, state_since, disconnect_cause,
             incarnation_id, boot_id, journal_id, cert_serial, connected_at, last_seen, hello_seq)
         VALUES (?1, ?2, ?3, 'connected', ?4, '', ?5, ?6, ?7, ?8, ?4, ?4, ?9)
         ON CONFLICT (node_id) DO UPDATE SET
             epoch = excluded.epoch, gateway_id = excluded.gateway_id, state = 'connected',
             state_since = excluded.state_since, disconnect_cause = '',
             incarnation_id = excluded.incarnation_id, boot_id = excluded.boot_id,
             journal_id = excluded.journal_id, cert_serial = excluded.cert_serial,
             connected_at = excluded.connected_at, last_seen = excluded.last_seen,
             hello_seq = MAX(node_sessions.hello_seq, excluded.hello_seq)",
    )?
    .execute(params![
        h.node_id,
        epoch as i64,
        h.gateway_id,
        now,
        h.incarnation_id,
        h.boot_id,
        h.journal_id,
        h.cert_serial,
        proof_seq
    ])?;
    // A node that is back is reachable again. The Hello is not signed: the release floor it reports is not taken
    // (only the node's signed upgrade results raise it).
    c.prepare_cached(
        "UPDATE nodes SET agent_version = ?2, conditions = ?3, taints = ?4 WHERE id = ?1",
    )?
    .execute(params![
        h.node_id,
        h.agent_version,
        to_json(&conditions_at_hello(conditions, h.daemon_exits)),
        to_json(&without(taints, TAINT_UNREACHABLE)),
    ])?;
    let wanted = {
        let mut q =
            c.prepare_cached("SELECT sha256 FROM inventory WHERE node_id = ?1 AND section = ?2")?;
        let mut failed = None;
        let wanted = inventory_wanted(&h.inventory_hashes, |section| {
            match q
                .query_row(params![h.node_id, section], |r| r.get(0))
                .optional()
            {
                Ok(known) => known,
                Err(e) => {
                    failed.get_or_insert(e);
                    None
                }
            }
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        wanted
    };
    let new_journal = prev.as_ref().is_some_and(|p| p.1 != h.journal_id);
    let new_boot = prev.as_ref().is_some_and(|p| p.2 != h.boot_id);
    let (replay, finished) = settle(c, h, epoch, now, new_journal, new_boot)?;
    let (commands_pending, spec_generation): (bool, i64) = c
        .prepare_cached(HELLO_WORK)?
        .query_row([&h.node_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(HelloOutcome {
        epoch,
        server_time_ms: now,
        inventory_wanted: wanted,
        replay,
        finished,
        cert_not_after_ms: cert.not_after_ms,
        hello_seq_seen,
        commands_pending,
        spec_generation: spec_generation.max(0) as u64,
    })
}

/// The clone watch's part of a Hello (see [`crate::clones`]): a proved
/// Hello from another boot than the certificate's last sighting is
/// recorded with its proof, and one that takes a connected session is a
/// takeover. The quarantine is the key holder's.
fn watch_clones(
    c: &Connection,
    h: &HelloInput,
    now: i64,
    connected: Option<&str>,
    proofs_required: bool,
) -> Result<(), StoreError> {
    let last: Option<String> = c
        .query_row_kept(
            "SELECT boot_id FROM cert_sightings WHERE serial = ?1 ORDER BY id DESC LIMIT 1",
            [&h.cert_serial],
            |r| r.get(0),
        )
        .optional()?;
    let first_confirmed = !proofs_required && h.proof.as_ref().is_some_and(|p| p.release_confirmed);
    let v = clones::at_hello(
        last.as_deref(),
        connected,
        &h.boot_id,
        h.proof.is_some(),
        first_confirmed,
    );
    if let (true, Some(p)) = (v.record, &h.proof) {
        c.prepare_cached(
            "INSERT INTO cert_sightings (serial, boot_id, at, seq, proof, proof_signature)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            h.cert_serial,
            h.boot_id,
            now,
            p.seq as i64,
            p.payload,
            p.signature
        ])?;
        c.prepare_cached("DELETE FROM cert_sightings WHERE serial = ?1 AND at < ?2")?
            .execute(params![h.cert_serial, now - clones::CLONE_WINDOW_MS])?;
    }
    if v.takeover {
        fleet_event(
            c,
            now,
            clones::DUPLICATE_SESSION,
            &h.node_id,
            &clones::takeover_detail(&h.cert_serial, &h.boot_id, connected.unwrap_or_default()),
        )?;
    }
    Ok(())
}

/// A node's commands in flight, in order.
pub(super) const IN_FLIGHT: &str = "SELECT id, seq, kind, state, signed FROM commands
     WHERE node_id = ?1 AND state IN ('dispatched', 'acked', 'running') ORDER BY seq";

/// The Hello's part for commands: every in-flight command moves to the new
/// epoch and is replayed, kept, awaited or finished.
fn settle(
    c: &Connection,
    h: &HelloInput,
    epoch: u64,
    now: i64,
    new_journal: bool,
    new_boot: bool,
) -> rusqlite::Result<(Vec<Dispatch>, Vec<Finished>)> {
    let in_flight: Vec<InFlight> = c
        .prepare_cached(IN_FLIGHT)?
        .query_map([&h.node_id], |r| {
            Ok(InFlight {
                id: r.get(0)?,
                seq: r.get::<_, i64>(1)? as u64,
                kind: r.get(2)?,
                state: r.get(3)?,
                signed: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut replay = Vec::new();
    let mut finished = Vec::new();
    for (cmd, decision) in settle_in_flight(in_flight, h, new_journal, new_boot) {
        match decision {
            HelloDecision::Replay => {
                c.prepare_cached(
                    "UPDATE commands SET state = 'dispatched', epoch = ?2, updated_at = ?3 WHERE id = ?1",
                )?
                .execute(params![cmd.id, epoch as i64, now])?;
                replay.push(Dispatch {
                    id: cmd.id,
                    seq: cmd.seq,
                    signed: cmd.signed,
                    waited_ms: None,
                });
            }
            HelloDecision::KeepRunning | HelloDecision::AwaitResult => {
                c.prepare_cached("UPDATE commands SET epoch = ?2, updated_at = ?3 WHERE id = ?1")?
                    .execute(params![cmd.id, epoch as i64, now])?;
            }
            HelloDecision::Finish(outcome, reason) => {
                let state = ServerState::Terminal(outcome).name();
                // The Hello's proof is what a reader believes this ending
                // from (`evidence`); none, and it is not believed.
                let proof = h.proof.as_ref();
                c.prepare_cached(
                    "UPDATE commands SET state = ?2, reason = ?3, result_at = ?4, updated_at = ?4,
                         result_payload = ?5, result_signature = ?6
                     WHERE id = ?1",
                )?
                .execute(params![
                    cmd.id,
                    state,
                    reason,
                    now,
                    proof.map(|p| &p.payload),
                    proof.map(|p| &p.signature)
                ])?;
                finished.push(Finished {
                    id: cmd.id,
                    state: state.to_string(),
                    reason: reason.to_string(),
                });
            }
        }
    }
    Ok((replay, finished))
}

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
