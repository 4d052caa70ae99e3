//! Sessions: the Hello transaction (see [`crate::sessions`] for its
//! decisions) and what sessions write. The Hello: what it reads is read in one batch (the node's row locked,
//! then the lease `FOR SHARE`, then the time), what it writes in a second,
//! so on PostgreSQL a Hello costs two round trips, not one per statement
//! (SQLite runs a batch's statements one after another on its writer). The
//! Hello locks the node's row first (two Hellos of one node queue there),
//! re-reads its gateway's lease `FOR SHARE` (a renewal by another owner
//! waits until the Hello commits, and a Hello after it sees the new owner
//! and is fenced), then routes. The other writes of a session carry
//! `AND epoch = $epoch` and match nothing once a newer Hello ran.

use bcd_core::command::{HelloDecision, ServerState};

use super::bindings::fleet_event;
use super::nodes::{CERT_ROW, cert_from_row};
use super::{Db, Dialect, List, to_json};
use crate::clock::ms;
use crate::clones;
use crate::commands::Dispatch;
use crate::error::{Refusal, StoreError, TxError};
use crate::id::{GatewayId, NodeId};
use crate::leases::gateway_lease;
use crate::nodes::{SUPERSEDED, TAINT_UNREACHABLE, check_cert, conditions_at_hello, without};
use crate::sessions::{
    Ended, Finished, FleetSize, HELLO_WORK, HelloInput, HelloOutcome, InFlight, Seen, SessionKey,
    SessionRow, inventory_wanted, lease_admits, settle_in_flight,
};

/// The node's row, found through the certificate presented (never the
/// node id the Hello claims, so a Hello naming another node locks nothing
/// of it), locked: two Hellos of one node queue here.
const HELLO_NODE: &str = "SELECT id, conditions, taints, hello_proofs_since IS NOT NULL FROM nodes
     WHERE id = (SELECT node_id FROM node_certs WHERE fingerprint = $1) FOR NO KEY UPDATE";
/// The routing transaction's fence: this gateway holds its lease now, and
/// nobody changes it until this transaction ends.
const HELLO_LEASE: &str = "SELECT expires_at FROM leases WHERE name = $1 AND owner = $2 FOR SHARE";
/// Whether the lease (locked above) still runs now that the route is
/// written: a lease that ran out between the check and the write (the
/// write waited, or the machine stalled) fences the Hello, whose writes its
/// caller then rolls back, so no route is recorded after its gateway's
/// lease ended.
const HELLO_LEASE_HELD: &str =
    "SELECT expires_at >= compute_now() FROM leases WHERE name = $1 AND owner = $2";
const HELLO_SIGHTINGS: &str =
    "SELECT boot_id FROM cert_sightings WHERE serial = $1 ORDER BY id DESC LIMIT 1";
/// The node's session, and whether it names a certificate of the node
/// newer than this Hello's (which is then superseded: a copy of a key the
/// node renewed away from no longer connects).
const HELLO_PREV: &str = "SELECT s.epoch, s.journal_id, s.boot_id, s.hello_seq,
         COALESCE(c.not_before > (SELECT not_before FROM node_certs WHERE serial = $2), false),
         s.state = 'connected' AND s.cert_serial = $2
     FROM node_sessions s LEFT JOIN node_certs c ON c.serial = s.cert_serial AND c.node_id = s.node_id
     WHERE s.node_id = $1";
const HELLO_INVENTORY: &str = "SELECT section, sha256 FROM inventory WHERE node_id = $1";
/// The node's commands in flight, in order, locked: a result arriving
/// meanwhile waits and then finds the new state.
pub(crate) const HELLO_IN_FLIGHT: &str = "SELECT id, seq, kind, state, signed FROM commands
     WHERE node_id = $1 AND state IN ('dispatched', 'acked', 'running') ORDER BY seq
     FOR UPDATE";

/// The Hello: two batches (above) and the settlement of the node's
/// commands in flight.
pub(crate) async fn hello(db: &impl Db, h: &HelloInput) -> Result<HelloOutcome, TxError> {
    let lease_name = gateway_lease(&h.gateway_id);
    let mut read = db
        .batch(&[
            (HELLO_NODE, &[&h.cert_fingerprint]),
            (CERT_ROW, &[&h.cert_fingerprint]),
            (HELLO_LEASE, &[&lease_name, &h.gateway_id]),
            // The time is read once the locks above are held: a Hello that
            // queued behind another of its node (for as long as that one's
            // group ran) judges the lease at the time it routes, not at the
            // time it started waiting.
            ("SELECT compute_now()", &[]),
            (HELLO_SIGHTINGS, &[&h.cert_serial]),
            (HELLO_PREV, &[&h.node_id, &h.cert_serial]),
            (HELLO_INVENTORY, &[&h.node_id]),
            (HELLO_WORK, &[&h.node_id]),
        ])
        .await?
        .into_iter();
    let mut next = || read.next().unwrap_or_default();
    let node = next();
    let cert = next();
    let lease: Option<i64> = next().first().map(|r| r.get(0)).transpose()?;
    let now: i64 = next()
        .first()
        .map(|r| r.get(0))
        .ok_or_else(|| StoreError::Database("compute_now() returned no row".into()))??;
    let cert = check_cert(cert.first().map(cert_from_row).transpose()?, now)?;
    if cert.node_id != h.node_id || cert.serial != h.cert_serial {
        return Err(Refusal::WrongCertificate(h.node_id.to_string()).into());
    }
    if !lease_admits(lease, now) {
        return Err(Refusal::Fenced(h.gateway_id.to_string()).into());
    }
    let last_sighting: Option<String> = next().first().map(|r| r.get(0)).transpose()?;
    let node = node.first().ok_or_else(|| {
        StoreError::Database(format!("node {} has a certificate but no row", h.node_id).into())
    })?;
    let (conditions, taints): (Vec<String>, Vec<String>) = (node.json(1)?, node.json(2)?);
    let proofs_required: bool = node.get(3)?;
    if !clones::admits(h.proof.is_some(), proofs_required) {
        return Err(Refusal::HelloUnproved(h.node_id.to_string()).into());
    }
    let prev = next()
        .first()
        .map(|r| {
            Ok::<_, StoreError>((
                r.get::<i64>(0)?,
                r.get::<String>(1)?,
                r.get::<String>(2)?,
                r.get::<i64>(3)?,
                r.get::<bool>(4)?,
                r.get::<bool>(5)?,
            ))
        })
        .transpose()?;
    if prev.as_ref().is_some_and(|p| p.4) {
        return Err(Refusal::Revoked(SUPERSEDED.into(), None).into());
    }
    // The boot of the certificate's session, if that is connected.
    let connected = prev.as_ref().filter(|p| p.5).map(|p| p.2.as_str());
    watch_clones(
        db,
        h,
        now,
        last_sighting.as_deref(),
        connected,
        proofs_required,
    )
    .await?;
    let proof_seq = h.proof.as_ref().map_or(0, |p| p.seq as i64);
    let hello_seq_seen = prev.as_ref().map_or(0, |p| p.3).max(proof_seq) as u64;
    let known: Vec<(String, String)> = next()
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<_, StoreError>>()?;
    let (commands_pending, spec_generation) = next().first().map_or(Ok((false, 0)), |r| {
        Ok::<_, StoreError>((r.get::<bool>(0)?, r.get::<i64>(1)?))
    })?;
    let stored = prev.as_ref().map_or(0, |p| p.0 as u64);
    let epoch = bcd_core::epoch::next_epoch(stored, h.last_epoch);
    let conditions = to_json(&conditions_at_hello(conditions, h.daemon_exits));
    let taints = to_json(&without(taints, TAINT_UNREACHABLE));
    let written = db
        .batch(&[
            // The key holder supersedes the certificates the node renewed
            // away from, from its proofs; this Hello refused an older one.
            (
                "INSERT INTO node_sessions (node_id, epoch, gateway_id, state, state_since,
                     disconnect_cause, incarnation_id, boot_id, journal_id, cert_serial,
                     connected_at, last_seen, hello_seq)
                 VALUES ($1, $2, $3, 'connected', $4, '', $5, $6, $7, $8, $4, $4, $9)
                 ON CONFLICT (node_id) DO UPDATE SET
                     epoch = excluded.epoch, gateway_id = excluded.gateway_id, state = 'connected',
                     state_since = excluded.state_since, disconnect_cause = '',
                     incarnation_id = excluded.incarnation_id, boot_id = excluded.boot_id,
                     journal_id = excluded.journal_id, cert_serial = excluded.cert_serial,
                     connected_at = excluded.connected_at, last_seen = excluded.last_seen,
                     hello_seq = CASE WHEN node_sessions.hello_seq > excluded.hello_seq
                         THEN node_sessions.hello_seq ELSE excluded.hello_seq END",
                &[
                    &h.node_id,
                    &(epoch as i64),
                    &h.gateway_id,
                    &now,
                    &h.incarnation_id,
                    &h.boot_id,
                    &h.journal_id,
                    &h.cert_serial,
                    &proof_seq,
                ],
            ),
            // A node that is back is reachable again. The Hello is not
            // signed: the release floor it reports is not taken (only the
            // node's signed upgrade results raise it).
            (
                "UPDATE nodes SET agent_version = $2, conditions = $3, taints = $4 WHERE id = $1",
                &[&h.node_id, &h.agent_version, &conditions, &taints],
            ),
            (HELLO_IN_FLIGHT, &[&h.node_id]),
            // Read once the route is written (its audit record stamped
            // with the time of the write): the lease still held then.
            (HELLO_LEASE_HELD, &[&lease_name, &h.gateway_id]),
        ])
        .await?;
    let held = written
        .get(3)
        .and_then(|rows| rows.first())
        .map(|r| r.get::<bool>(0))
        .transpose()?
        .unwrap_or(false);
    if !held {
        return Err(Refusal::Fenced(h.gateway_id.to_string()).into());
    }
    let in_flight: Vec<InFlight> = written
        .get(2)
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    Ok(InFlight {
                        id: r.get(0)?,
                        seq: r.get::<i64>(1)? as u64,
                        kind: r.get(2)?,
                        state: r.get(3)?,
                        signed: r.get(4)?,
                    })
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
        .transpose()?
        .unwrap_or_default();
    let wanted = inventory_wanted(&h.inventory_hashes, |section| {
        known
            .iter()
            .find(|(s, _)| s == section)
            .map(|(_, sha)| sha.clone())
    });
    let new_journal = prev.as_ref().is_some_and(|p| p.1 != h.journal_id);
    let new_boot = prev.as_ref().is_some_and(|p| p.2 != h.boot_id);
    let (replay, finished) = settle(db, h, in_flight, epoch, now, new_journal, new_boot).await?;
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

/// The clone watch's part of a Hello (see [`crate::clones`]; as SQLite's):
/// a proved Hello from another boot than the certificate's last sighting
/// is recorded with its proof, and one that takes a connected session is
/// a takeover. The quarantine is the key holder's.
async fn watch_clones(
    db: &impl Db,
    h: &HelloInput,
    now: i64,
    last: Option<&str>,
    connected: Option<&str>,
    proofs_required: bool,
) -> Result<(), StoreError> {
    let first_confirmed = !proofs_required && h.proof.as_ref().is_some_and(|p| p.release_confirmed);
    let v = clones::at_hello(
        last,
        connected,
        &h.boot_id,
        h.proof.is_some(),
        first_confirmed,
    );
    if let (true, Some(p)) = (v.record, &h.proof) {
        db.execute(
            "INSERT INTO cert_sightings (serial, boot_id, at, seq, proof, proof_signature)
             VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &h.cert_serial,
                &h.boot_id,
                &now,
                &(p.seq as i64),
                &p.payload,
                &p.signature,
            ],
        )
        .await?;
        db.execute(
            "DELETE FROM cert_sightings WHERE serial = $1 AND at < $2",
            &[&h.cert_serial, &(now - clones::CLONE_WINDOW_MS)],
        )
        .await?;
    }
    if v.takeover {
        fleet_event(
            db,
            now,
            clones::DUPLICATE_SESSION,
            &h.node_id,
            &clones::takeover_detail(&h.cert_serial, &h.boot_id, connected.unwrap_or_default()),
        )
        .await?;
    }
    Ok(())
}

/// The Hello's part for commands: every in-flight command moves to the new
/// epoch and is replayed, kept, awaited or finished. The rows are locked:
/// a result arriving meanwhile waits and then finds the new state.
async fn settle(
    db: &impl Db,
    h: &HelloInput,
    in_flight: Vec<InFlight>,
    epoch: u64,
    now: i64,
    new_journal: bool,
    new_boot: bool,
) -> Result<(Vec<Dispatch>, Vec<Finished>), StoreError> {
    let mut replay = Vec::new();
    let mut finished = Vec::new();
    let epoch = epoch as i64;
    for (cmd, decision) in settle_in_flight(in_flight, h, new_journal, new_boot) {
        match decision {
            HelloDecision::Replay => {
                db.execute("UPDATE commands SET state = 'dispatched', epoch = $2, updated_at = $3 WHERE id = $1",
                    &[&cmd.id, &epoch, &now],
                )
                .await?;
                replay.push(Dispatch {
                    id: cmd.id,
                    seq: cmd.seq,
                    signed: cmd.signed,
                    waited_ms: None,
                });
            }
            HelloDecision::KeepRunning | HelloDecision::AwaitResult => {
                db.execute(
                    "UPDATE commands SET epoch = $2, updated_at = $3 WHERE id = $1",
                    &[&cmd.id, &epoch, &now],
                )
                .await?;
            }
            HelloDecision::Finish(outcome, reason) => {
                let state = ServerState::Terminal(outcome).name();
                // The Hello's proof is what a reader believes this ending
                // from (`evidence`); none, and it is not believed.
                let proof = h.proof.as_ref();
                db.execute(
                    "UPDATE commands SET state = $2, reason = $3, result_at = $4, updated_at = $4,
                         result_payload = $5, result_signature = $6
                     WHERE id = $1",
                    &[
                        &cmd.id,
                        &state,
                        &reason,
                        &now,
                        &proof.map(|p| &p.payload),
                        &proof.map(|p| &p.signature),
                    ],
                )
                .await?;
                finished.push(Finished {
                    id: cmd.id,
                    outcome,
                    reason: reason.to_string(),
                });
            }
        }
    }
    Ok((replay, finished))
}

/// Marks each session disconnected (since it ended) if its epoch is still
/// the node's; rows whose epoch moved on match nothing. On PostgreSQL one
/// statement for all of them (the rows taken in one order, as every writer
/// of many session rows takes them), on SQLite one a session.
pub(crate) async fn disconnect(
    db: &impl Db,
    ended: &[Ended],
) -> Result<Vec<SessionKey>, StoreError> {
    if ended.is_empty() {
        return Ok(Vec::new());
    }
    if db.dialect() == Dialect::Sqlite {
        let mut applied = Vec::new();
        for e in ended {
            let n = db
                .execute(
                    "UPDATE node_sessions SET state = 'disconnected',
                         state_since = compute_now() - $5, disconnect_cause = $3,
                         last_seen = MAX(last_seen, compute_now() - $4)
                     WHERE node_id = $1 AND epoch = $2 AND state = 'connected'",
                    &[
                        &e.node_id,
                        &(e.epoch as i64),
                        &e.cause,
                        &ms(e.seen_age),
                        &ms(e.ended_age),
                    ],
                )
                .await?;
            if n == 1 {
                applied.push(SessionKey {
                    node_id: e.node_id.clone(),
                    epoch: e.epoch,
                });
            }
        }
        return Ok(applied);
    }
    let mut sorted: Vec<&Ended> = ended.iter().collect();
    sorted.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let nodes = List(sorted.iter().map(|e| e.node_id.as_str()).collect());
    let epochs = List(sorted.iter().map(|e| e.epoch as i64).collect());
    let causes = List(sorted.iter().map(|e| e.cause.as_str()).collect());
    let seen = List(sorted.iter().map(|e| ms(e.seen_age)).collect());
    let ended_ages = List(sorted.iter().map(|e| ms(e.ended_age)).collect());
    db.query(
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
    .map(|r| {
        Ok(SessionKey {
            node_id: r.get(0)?,
            epoch: r.get::<i64>(1)? as u64,
        })
    })
    .collect()
}

/// Records when each of a gateway's sessions was last heard (the database
/// turns each age into a time on its own clock); returns the sessions that
/// are no longer current, whose rows matched nothing. On PostgreSQL one
/// statement for the flush, on SQLite one a session.
pub(crate) async fn flush_liveness(
    db: &impl Db,
    gateway_id: &GatewayId,
    seen: &[Seen],
) -> Result<Vec<SessionKey>, StoreError> {
    if seen.is_empty() {
        return Ok(Vec::new());
    }
    let gone = |s: &Seen| SessionKey {
        node_id: s.node_id.clone(),
        epoch: s.epoch,
    };
    if db.dialect() == Dialect::Sqlite {
        let mut out = Vec::new();
        for s in seen {
            let n = db
                .execute(
                    "UPDATE node_sessions SET last_seen = MAX(last_seen, compute_now() - $4)
                     WHERE node_id = $1 AND epoch = $2 AND gateway_id = $3
                       AND state = 'connected'",
                    &[&s.node_id, &(s.epoch as i64), &gateway_id, &ms(s.age)],
                )
                .await?;
            if n == 0 {
                out.push(gone(s));
            }
        }
        return Ok(out);
    }
    let mut sorted: Vec<&Seen> = seen.iter().collect();
    sorted.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let nodes = List(sorted.iter().map(|s| s.node_id.as_str()).collect());
    let epochs = List(sorted.iter().map(|s| s.epoch as i64).collect());
    let ages = List(sorted.iter().map(|s| ms(s.age)).collect());
    let current: std::collections::HashSet<(String, i64)> = db
        .query(
            "UPDATE node_sessions s SET last_seen = GREATEST(s.last_seen, compute_now() - v.age)
             FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS v(node_id, epoch, age)
             WHERE s.node_id = v.node_id AND s.epoch = v.epoch AND s.gateway_id = $4
               AND s.state = 'connected'
             RETURNING s.node_id, s.epoch",
            &[&nodes, &epochs, &ages, &gateway_id],
        )
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<_, StoreError>>()?;
    Ok(seen
        .iter()
        .filter(|s| !current.contains(&(s.node_id.to_string(), s.epoch as i64)))
        .map(gone)
        .collect())
}

/// An orderly gateway stop: its remaining sessions disconnected (cause
/// `gateway-shutdown`) and its lease released, together.
pub(crate) async fn gateway_shutdown(
    db: &impl Db,
    gateway_id: &GatewayId,
    sessions: &[SessionKey],
) -> Result<(), StoreError> {
    let ended: Vec<Ended> = sessions.iter().map(Ended::at_shutdown).collect();
    disconnect(db, &ended).await?;
    db.execute(
        "DELETE FROM leases WHERE name = $1 AND owner = $2",
        &[&gateway_lease(gateway_id), &gateway_id],
    )
    .await?;
    Ok(())
}

pub(crate) async fn fleet_size(db: &impl Db) -> Result<FleetSize, StoreError> {
    let r = db
        .query_one(
            "SELECT (SELECT COUNT(*) FROM node_sessions WHERE state = 'connected'),
                    (SELECT COUNT(*) FROM leases WHERE name LIKE 'gateway:%'
                        AND expires_at >= compute_now()),
                    (SELECT CAST(COALESCE(SUM(absorbs_per_s), 0) AS BIGINT) FROM leases
                        WHERE name LIKE 'gateway:%' AND expires_at >= compute_now())",
            &[],
        )
        .await?;
    Ok(FleetSize {
        connected: r.get::<i64>(0)?.max(0) as usize,
        gateways: r.get::<i64>(1)?.max(0) as usize,
        absorbs_per_s: r.get::<i64>(2)?.max(0) as u64,
    })
}

pub(crate) async fn session(
    db: &impl Db,
    node_id: &NodeId,
) -> Result<Option<SessionRow>, StoreError> {
    db.query_opt(
        "SELECT epoch, gateway_id, state FROM node_sessions WHERE node_id = $1",
        &[&node_id],
    )
    .await?
    .map(|r| {
        Ok(SessionRow {
            epoch: r.get::<i64>(0)? as u64,
            gateway_id: r.get(1)?,
            state: r.get(2)?,
        })
    })
    .transpose()
}

pub(crate) async fn connected_to(
    db: &impl Db,
    gateway_id: &GatewayId,
) -> Result<Vec<NodeId>, StoreError> {
    db.column(
        "SELECT node_id FROM node_sessions WHERE gateway_id = $1 AND state = 'connected'
         ORDER BY node_id",
        &[&gateway_id],
    )
    .await
}

pub(crate) async fn spec_generations(
    db: &impl Db,
    gateway_id: &GatewayId,
) -> Result<Vec<(NodeId, u64)>, StoreError> {
    db.query(
        "SELECT s.node_id, p.generation FROM node_sessions s
         JOIN node_specs p ON p.node_id = s.node_id
         WHERE s.gateway_id = $1 AND s.state = 'connected'
         ORDER BY s.node_id",
        &[&gateway_id],
    )
    .await?
    .iter()
    .map(|r| Ok((r.get::<NodeId>(0)?, r.get::<i64>(1)? as u64)))
    .collect()
}

pub(crate) async fn nodes_with_work(
    db: &impl Db,
    gateway_id: &GatewayId,
    specs_since_ms: i64,
) -> Result<Vec<NodeId>, StoreError> {
    db.column(
        "SELECT s.node_id FROM node_sessions s
         WHERE s.gateway_id = $1 AND s.state = 'connected' AND (
             EXISTS (SELECT 1 FROM commands c
                     WHERE c.node_id = s.node_id AND c.state = 'pending')
             OR EXISTS (SELECT 1 FROM node_specs p
                        WHERE p.node_id = s.node_id AND p.updated_at >= $2))",
        &[&gateway_id, &specs_since_ms],
    )
    .await
}
