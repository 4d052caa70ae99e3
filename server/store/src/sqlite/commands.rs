//! Commands.

use bcd_core::command::{ServerState, apply_result};
use rusqlite::{Connection, OptionalExtension, params};

use super::fleet_event;
use super::{Kept, Lite, now};
use crate::bindings::VerifySignature;
use crate::commands::{
    CommandRow, CommandSeal, Dispatch, FORGED, NewCommand, ResultApplied, ResultInput, Route,
    SWEPT, SealCommand, UNKNOWN_RESULTS_PER_NODE, UnknownResult, ack_moves, dispatchable,
    new_command_id, raises_floor, same_request, signed_result,
};
use crate::error::{Refusal, StoreError, TxError};
use crate::events::SECURITY_EVENTS_KEPT_MS;
use crate::nodes::{Signed, judge_signed};
use crate::sql::ready;

const COLUMNS: &str = "id, node_id, seq, kind, summary, state, reason, exit_code, \
     COALESCE(output, X''), output_truncated, created_at, not_after, result_at, epoch, \
     result_payload, result_signature, \
     EXISTS (SELECT 1 FROM legacy_results l WHERE l.command_id = commands.id)";

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<CommandRow> {
    Ok(CommandRow {
        id: r.get(0)?,
        node_id: r.get(1)?,
        seq: r.get::<_, i64>(2)? as u64,
        kind: r.get(3)?,
        summary: r.get(4)?,
        state: r.get(5)?,
        reason: r.get(6)?,
        exit_code: r.get(7)?,
        output: r.get(8)?,
        output_truncated: r.get(9)?,
        created_at_ms: r.get(10)?,
        not_after_ms: r.get(11)?,
        result_at_ms: r.get(12)?,
        epoch: r.get::<_, i64>(13)? as u64,
        signed_result: signed_result(r.get(14)?, r.get(15)?),
        legacy: r.get(16)?,
    })
}

pub(super) fn row(c: &Connection, id: &str) -> rusqlite::Result<Option<CommandRow>> {
    c.prepare_cached(&format!("SELECT {COLUMNS} FROM commands WHERE id = ?1"))?
        .query_row([id], read)
        .optional()
}

pub(super) fn create(
    c: &Connection,
    cmd: &NewCommand,
    seal: SealCommand,
) -> Result<(CommandRow, bool), TxError> {
    if let Some(key) = &cmd.idempotency_key {
        let existing: Option<String> = c
            .query_row_kept(
                "SELECT id FROM commands WHERE idempotency_key = ?1",
                [key],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = existing {
            let first = row(c, &id)?
                .ok_or_else(|| StoreError::Corrupt(format!("command {id} vanished")))?;
            same_request(&first, cmd, key)?;
            return Ok((first, false));
        }
    }
    let node: Option<(Option<i64>, i64)> = c
        .query_row_kept(
            "SELECT deleted_at, next_seq FROM nodes WHERE id = ?1",
            [&cmd.node_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let seq = match node {
        Some((None, seq)) => seq as u64,
        _ => return Err(Refusal::NoSuchNode(cmd.node_id.clone()).into()),
    };
    let now = now(c)?;
    let sealed = CommandSeal {
        id: new_command_id(),
        node_id: cmd.node_id.clone(),
        seq,
        kind: cmd.kind,
        issued_at_ms: now,
        not_after_ms: now + super::ms(cmd.not_after),
        min_generation: cmd.min_generation,
    };
    let signed = seal(&sealed);
    c.execute_kept(
        "UPDATE nodes SET next_seq = next_seq + 1 WHERE id = ?1",
        [&cmd.node_id],
    )?;
    c.execute_kept(
        "INSERT INTO commands (id, node_id, seq, kind, summary, signed, not_after, min_generation,
             idempotency_key, state, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending', ?10, ?10)",
        params![
            sealed.id,
            cmd.node_id,
            seq as i64,
            cmd.kind.name(),
            cmd.summary,
            signed,
            sealed.not_after_ms,
            cmd.min_generation as i64,
            cmd.idempotency_key,
            now
        ],
    )?;
    let created = row(c, &sealed.id)?
        .ok_or_else(|| StoreError::Corrupt(format!("command {} vanished", sealed.id)))?;
    Ok((created, true))
}

pub(super) fn list(
    c: &Connection,
    node_id: Option<&str>,
    limit: u32,
) -> Result<Vec<CommandRow>, StoreError> {
    let rows = c
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM commands
             WHERE (?1 IS NULL OR node_id = ?1) ORDER BY created_at DESC, seq DESC LIMIT ?2"
        ))?
        .query_map(params![node_id, limit], read)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn take_dispatchable(
    c: &Connection,
    gateway_id: &str,
    node_id: &str,
    epoch: u64,
) -> Result<Vec<Dispatch>, StoreError> {
    let applied: i64 = c
        .prepare_cached("SELECT applied_generation FROM node_state WHERE node_id = ?1")?
        .query_row([node_id], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    let pending: Vec<(Dispatch, u64)> = c
        .prepare_cached(
            "SELECT c.id, c.seq, c.signed, c.min_generation, compute_now() - c.created_at
             FROM commands c
             JOIN node_sessions s ON s.node_id = c.node_id
             JOIN leases l ON l.name = ?4 AND l.owner = ?2 AND l.expires_at >= compute_now()
             WHERE c.node_id = ?1 AND c.state = 'pending'
               AND s.gateway_id = ?2 AND s.epoch = ?3 AND s.state = 'connected'
             ORDER BY c.seq",
        )?
        .query_map(
            params![
                node_id,
                gateway_id,
                epoch as i64,
                crate::leases::gateway_lease(gateway_id)
            ],
            |r| {
                Ok((
                    Dispatch {
                        id: r.get(0)?,
                        seq: r.get::<_, i64>(1)? as u64,
                        signed: r.get(2)?,
                        waited_ms: Some(r.get(4)?),
                    },
                    r.get::<_, i64>(3)?.max(0) as u64,
                ))
            },
        )?
        .collect::<rusqlite::Result<_>>()?;
    let out = dispatchable(pending, applied.max(0) as u64);
    let mut mark = c.prepare_cached(
        "UPDATE commands SET state = 'dispatched', epoch = ?2, updated_at = compute_now()
         WHERE id = ?1 AND state = 'pending'",
    )?;
    for d in &out {
        mark.execute(params![d.id, epoch as i64])?;
    }
    Ok(out)
}

pub(super) fn ack(
    c: &Connection,
    route: &Route,
    id: &str,
    running: bool,
) -> Result<bool, StoreError> {
    let (state, from) = ack_moves(running);
    let n = c
        .prepare_cached(&format!(
            "UPDATE commands SET state = ?3, updated_at = compute_now()
             WHERE id = ?1 AND node_id = ?2 AND epoch = ?5 AND state IN ({from})
               AND EXISTS (SELECT 1 FROM node_sessions s WHERE s.node_id = ?2
                   AND s.gateway_id = ?4 AND s.epoch = ?5 AND s.state = 'connected')"
        ))?
        .execute(params![
            id,
            route.node_id,
            state,
            route.gateway_id,
            route.epoch as i64
        ])?;
    Ok(n == 1)
}

pub(super) fn result(
    c: &Connection,
    node_id: &str,
    signed: &Signed<ResultInput>,
    verify: VerifySignature,
) -> Result<ResultApplied, StoreError> {
    let now = now(c)?;
    let certs = ready(crate::sql::nodes::valid_certs(&Lite(c), node_id, now))?;
    let r = match judge_signed(node_id, signed, &certs, verify) {
        Ok(r) => r,
        Err(reason) => {
            let detail = match &signed.fact {
                Some(r) => format!("command {}: {reason}", r.command_id),
                None => reason,
            };
            fleet_event(c, now, FORGED, node_id, &detail)?;
            return Ok(ResultApplied::Forged(detail));
        }
    };
    let found: Option<String> = c
        .prepare_cached("SELECT state FROM commands WHERE id = ?1 AND node_id = ?2")?
        .query_row(params![r.command_id, node_id], |row| row.get(0))
        .optional()?;
    let Some(state) = found else {
        return Ok(ResultApplied::Unknown);
    };
    let Some(state) = ServerState::parse(&state) else {
        return Ok(ResultApplied::Unknown);
    };
    let Some(next) = apply_result(state, r.outcome) else {
        return Ok(ResultApplied::Duplicate);
    };
    c.prepare_cached(
        "UPDATE commands SET state = ?2, reason = ?3, exit_code = ?4, output = ?5,
             output_truncated = ?6, result_at = ?7, updated_at = ?7, result_payload = ?8,
             result_signature = ?9
         WHERE id = ?1",
    )?
    .execute(params![
        r.command_id,
        next.name(),
        r.reason,
        r.exit_code,
        r.output,
        r.output_truncated,
        now,
        signed.payload,
        signed.signature
    ])?;
    // A confirmed upgrade raises no floor here: the key holder raises it
    // once it verified the result (`judge_upgrade_floor`).
    Ok(ResultApplied::Applied)
}

pub(super) fn upgrades_unjudged(c: &Connection, limit: u32) -> Result<Vec<String>, StoreError> {
    Ok(c.prepare_cached(UPGRADES_UNJUDGED)?
        .query_map([limit], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?)
}

/// Succeeded upgrades whose floor the key holder has not judged.
const UPGRADES_UNJUDGED: &str = "SELECT id FROM commands
     WHERE kind = 'daemon.upgrade' AND state = 'succeeded' AND floor_judged = 0
     ORDER BY id LIMIT ?1";

pub(super) fn judge_upgrade_floor(
    c: &Connection,
    id: &str,
    believed: bool,
) -> Result<Option<u64>, StoreError> {
    let row: Option<(String, String, String)> = c
        .query_row_kept(
            "SELECT node_id, kind, summary FROM commands
             WHERE id = ?1 AND state = 'succeeded' AND floor_judged = 0",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((node, kind, summary)) = row else {
        return Ok(None);
    };
    c.execute_kept("UPDATE commands SET floor_judged = 1 WHERE id = ?1", [id])?;
    let Some(floor) = raises_floor(&kind, &summary).filter(|_| believed) else {
        return Ok(None);
    };
    c.execute_kept(
        "UPDATE nodes SET release_floor = MAX(release_floor, ?2) WHERE id = ?1",
        params![node, floor.min(i64::MAX as u64) as i64],
    )?;
    Ok(Some(floor))
}

pub(super) fn sweep(c: &Connection) -> Result<Vec<String>, StoreError> {
    let ids = c
        .prepare_cached(
            "UPDATE commands SET state = 'expired', reason = ?1,
                 result_at = compute_now(), updated_at = compute_now()
             WHERE state = 'pending' AND not_after < compute_now() RETURNING id",
        )?
        .query_map([SWEPT], |r| r.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(ids)
}

pub(super) fn cancel_pending(c: &Connection, id: &str, reason: &str) -> Result<bool, StoreError> {
    let n = c.execute_kept(
        "UPDATE commands SET state = 'expired', reason = ?2,
             result_at = compute_now(), updated_at = compute_now()
         WHERE id = ?1 AND state = 'pending'",
        params![id, reason],
    )?;
    Ok(n == 1)
}

pub(super) fn states(c: &Connection) -> Result<Vec<(String, u64)>, StoreError> {
    Ok(
        c.prepare_cached("SELECT state, COUNT(*) FROM commands GROUP BY state ORDER BY state")?
            .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64)))?
            .collect::<rusqlite::Result<_>>()?,
    )
}

pub(super) fn results_unreceipted(c: &Connection, limit: u32) -> Result<Vec<String>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT id FROM commands WHERE receipt IS NULL AND result_signature IS NOT NULL \
         ORDER BY id LIMIT ?1",
    )?
    .query_map([limit], |r| r.get(0))?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn put_result_receipt(
    c: &Connection,
    id: &str,
    receipt: &[u8],
) -> Result<(), StoreError> {
    c.prepare_cached("UPDATE commands SET receipt = ?2 WHERE id = ?1 AND receipt IS NULL")?
        .execute(rusqlite::params![id, receipt])?;
    Ok(())
}

pub(super) fn result_receipts(
    c: &Connection,
    node: &str,
    ids: &[String],
) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    let mut st = c.prepare_cached(
        "SELECT receipt FROM commands WHERE id = ?1 AND node_id = ?2 AND receipt IS NOT NULL",
    )?;
    let mut unknown = c.prepare_cached(
        "SELECT receipt FROM unknown_results
         WHERE node_id = ?2 AND command_id = ?1 AND length(receipt) > 0",
    )?;
    let mut out = Vec::new();
    for id in ids {
        if let Some(r) = st
            .query_row(rusqlite::params![id, node], |r| r.get::<_, Vec<u8>>(0))
            .optional()?
        {
            out.push((id.clone(), r));
        }
        for r in unknown.query_map(rusqlite::params![id, node], |r| r.get::<_, Vec<u8>>(0))? {
            out.push((id.clone(), r?));
        }
    }
    Ok(out)
}

pub(super) fn put_unknown_result(c: &Connection, r: &UnknownResult) -> Result<bool, StoreError> {
    let held: i64 = c
        .prepare_cached("SELECT COUNT(*) FROM unknown_results WHERE node_id = ?1")?
        .query_row([&r.node_id], |row| row.get(0))?;
    if held >= UNKNOWN_RESULTS_PER_NODE {
        return Ok(false);
    }
    c.prepare_cached(
        "INSERT INTO unknown_results (node_id, command_id, payload, signature, payload_sha256, at)
         VALUES (?1, ?2, ?3, ?4, sha256_hex(?3), compute_now())
         ON CONFLICT DO NOTHING",
    )?
    .execute(rusqlite::params![
        r.node_id,
        r.command_id,
        r.payload,
        r.signature
    ])?;
    Ok(true)
}

pub(super) fn unknown_results_unreceipted(
    c: &Connection,
    limit: u32,
) -> Result<Vec<UnknownResult>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT node_id, command_id, payload, signature FROM unknown_results
         WHERE receipt IS NULL ORDER BY at LIMIT ?1",
    )?
    .query_map([limit], |r| {
        Ok(UnknownResult {
            node_id: r.get(0)?,
            command_id: r.get(1)?,
            payload: r.get(2)?,
            signature: r.get(3)?,
        })
    })?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn put_unknown_result_receipt(
    c: &Connection,
    r: &UnknownResult,
    receipt: &[u8],
) -> Result<(), StoreError> {
    c.prepare_cached(
        "UPDATE unknown_results SET receipt = ?4, receipted_at = compute_now()
         WHERE node_id = ?1 AND command_id = ?2 AND payload_sha256 = sha256_hex(?3)
           AND receipt IS NULL",
    )?
    .execute(rusqlite::params![
        r.node_id,
        r.command_id,
        r.payload,
        receipt
    ])?;
    c.prepare_cached(
        "DELETE FROM unknown_results WHERE node_id = ?1
           AND (length(receipt) = 0 OR receipted_at < compute_now() - ?2)",
    )?
    .execute(rusqlite::params![r.node_id, SECURITY_EVENTS_KEPT_MS])?;
    Ok(())
}
