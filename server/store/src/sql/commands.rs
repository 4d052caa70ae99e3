//! Commands.

use bcd_core::command::{ServerState, apply_result};

use super::bindings::fleet_event;
use super::nodes::valid_certs;
use super::{Db, Dialect, List, Row, in_list};
use crate::bindings::VerifySignature;
use crate::clock::ms;
use crate::commands::{
    CommandRow, CommandSeal, Dispatch, FORGED, NewCommand, ResultApplied, ResultInput, Route,
    SWEPT, SealCommand, UNKNOWN_RESULTS_PER_NODE, UnknownResult, ack_moves, dispatchable,
    new_command_id, raises_floor, same_request, signed_result,
};
use crate::error::{Refusal, StoreError, TxError};
use crate::events::SECURITY_EVENTS_KEPT_MS;
use crate::id::{CommandId, GatewayId, NodeId};
use crate::named::Named;
use crate::nodes::{Signed, judge_signed};

const COLUMNS: &str = "id, node_id, seq, kind, summary, state, reason, exit_code, \
     output, output_truncated, created_at, not_after, result_at, epoch, \
     result_payload, result_signature, \
     EXISTS (SELECT 1 FROM legacy_results l WHERE l.command_id = commands.id)";

fn read(r: &Row) -> Result<CommandRow, StoreError> {
    Ok(CommandRow {
        id: r.get(0)?,
        node_id: r.get(1)?,
        seq: r.get::<i64>(2)? as u64,
        kind: Named::read(r.get(3)?),
        summary: r.get(4)?,
        state: Named::read(r.get(5)?),
        reason: r.get(6)?,
        exit_code: r.get(7)?,
        output: r.get::<Option<Vec<u8>>>(8)?.unwrap_or_default(),
        output_truncated: r.get(9)?,
        created_at_ms: r.get(10)?,
        not_after_ms: r.get(11)?,
        result_at_ms: r.get(12)?,
        epoch: r.get::<i64>(13)? as u64,
        signed_result: signed_result(r.get(14)?, r.get(15)?),
        legacy: r.get(16)?,
    })
}

pub(crate) async fn row(db: &impl Db, id: &CommandId) -> Result<Option<CommandRow>, StoreError> {
    db.query_opt(
        &format!("SELECT {COLUMNS} FROM commands WHERE id = $1"),
        &[&id],
    )
    .await?
    .map(|r| read(&r))
    .transpose()
}

pub(crate) async fn create(
    db: &impl Db,
    cmd: &NewCommand,
    seal: SealCommand,
) -> Result<(CommandRow, bool), TxError> {
    // The node's row orders its commands: sequence numbers without gaps,
    // and a repeated idempotency key finds the first command.
    let node = db
        .query_opt(
            "SELECT deleted_at, next_seq FROM nodes WHERE id = $1 FOR NO KEY UPDATE",
            &[&cmd.node_id],
        )
        .await?
        .map(|r| Ok::<_, StoreError>((r.get::<Option<i64>>(0)?, r.get::<i64>(1)?)))
        .transpose()?;
    if let Some(key) = &cmd.idempotency_key {
        let existing: Option<CommandId> = db
            .query_opt("SELECT id FROM commands WHERE idempotency_key = $1", &[key])
            .await?
            .map(|r| r.get(0))
            .transpose()?;
        if let Some(id) = existing {
            let first = row(db, &id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("command {id} vanished")))?;
            same_request(&first, cmd, key)?;
            return Ok((first, false));
        }
    }
    let seq = match node {
        Some((None, seq)) => seq as u64,
        _ => return Err(Refusal::NoSuchNode(cmd.node_id.to_string()).into()),
    };
    let now = db.now().await?;
    let sealed = CommandSeal {
        id: CommandId::from(new_command_id()),
        node_id: cmd.node_id.clone(),
        seq,
        kind: cmd.kind,
        issued_at_ms: now,
        not_after_ms: now + ms(cmd.not_after),
        min_generation: cmd.min_generation,
    };
    let signed = seal(&sealed);
    db.execute(
        "UPDATE nodes SET next_seq = next_seq + 1 WHERE id = $1",
        &[&cmd.node_id],
    )
    .await?;
    let created = db.query_one(&format!(
            "INSERT INTO commands (id, node_id, seq, kind, summary, signed, not_after, min_generation,
                 idempotency_key, state, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, $10)
             RETURNING {COLUMNS}"
        ),
        &[
            &sealed.id,
            &cmd.node_id,
            &(seq as i64),
            &cmd.kind.name(),
            &cmd.summary,
            &signed,
            &sealed.not_after_ms,
            &(cmd.min_generation.min(i64::MAX as u64) as i64),
            &cmd.idempotency_key,
            &now,
        ],
    )
    .await?;
    Ok((read(&created)?, true))
}

pub(crate) async fn list(
    db: &impl Db,
    node_id: Option<&NodeId>,
    limit: u32,
) -> Result<Vec<CommandRow>, StoreError> {
    db.query(
        &format!(
            "SELECT {COLUMNS} FROM commands
             WHERE (CAST($1 AS TEXT) IS NULL OR node_id = $1)
             ORDER BY created_at DESC, seq DESC LIMIT $2"
        ),
        &[&node_id, &i64::from(limit)],
    )
    .await?
    .iter()
    .map(read)
    .collect()
}

/// Dispatch holds the session row and the gateway's lease `FOR SHARE`: a
/// Hello bumping the epoch waits until this commits (and then replays
/// what it marked), or runs first and this finds nothing to send on the
/// old epoch; a gateway whose lease ran out or went to another owner
/// dispatches nothing, and a takeover waits for a dispatch under way.
pub(crate) async fn take_dispatchable(
    db: &impl Db,
    gateway_id: &GatewayId,
    node_id: &NodeId,
    epoch: u64,
) -> Result<Vec<Dispatch>, StoreError> {
    let epoch = epoch as i64;
    let lease = crate::leases::gateway_lease(gateway_id);
    let current = db
        .query_opt(
            "SELECT 1 FROM node_sessions s
         JOIN leases l ON l.name = $4 AND l.owner = $2 AND l.expires_at >= compute_now()
         WHERE s.node_id = $1 AND s.gateway_id = $2 AND s.epoch = $3 AND s.state = 'connected'
         FOR SHARE OF s, l",
            &[&node_id, &gateway_id, &epoch, &lease],
        )
        .await?;
    if current.is_none() {
        return Ok(Vec::new());
    }
    let applied: i64 = db
        .query_opt(
            "SELECT applied_generation FROM node_state WHERE node_id = $1",
            &[&node_id],
        )
        .await?
        .map_or(Ok(0), |r| r.get(0))?;
    let pending: Vec<(Dispatch, u64)> = db
        .query(
            "SELECT id, seq, signed, min_generation, compute_now() - created_at FROM commands
         WHERE node_id = $1 AND state = 'pending' ORDER BY seq",
            &[&node_id],
        )
        .await?
        .iter()
        .map(|r| {
            Ok((
                Dispatch {
                    id: r.get(0)?,
                    seq: r.get::<i64>(1)? as u64,
                    signed: r.get(2)?,
                    waited_ms: Some(r.get(4)?),
                },
                r.get::<i64>(3)?.max(0) as u64,
            ))
        })
        .collect::<Result<_, StoreError>>()?;
    let mut out = dispatchable(pending, applied.max(0) as u64);
    if out.is_empty() {
        return Ok(out);
    }
    let ids: Vec<&str> = out.iter().map(|d| d.id.as_str()).collect();
    // Marked in one statement; a command another transaction finished or
    // expired meanwhile is not sent.
    let marked: std::collections::HashSet<CommandId> = db
        .column(
            &format!(
                "UPDATE commands SET state = 'dispatched', epoch = $2, updated_at = compute_now()
                 WHERE {} AND state = 'pending' RETURNING id",
                in_list(db.dialect(), "id", 1)
            ),
            &[&List(ids), &epoch],
        )
        .await?;
    out.retain(|d| marked.contains(&d.id));
    Ok(out)
}

pub(crate) async fn ack(
    db: &impl Db,
    route: &Route,
    id: &CommandId,
    running: bool,
) -> Result<bool, StoreError> {
    let (state, from) = ack_moves(running);
    let n = db
        .execute(
            &format!(
                "UPDATE commands SET state = $3, updated_at = compute_now()
             WHERE id = $1 AND node_id = $2 AND epoch = $5 AND state IN ({from})
               AND EXISTS (SELECT 1 FROM node_sessions s WHERE s.node_id = $2
                   AND s.gateway_id = $4 AND s.epoch = $5 AND s.state = 'connected')"
            ),
            &[
                &id,
                &route.node_id,
                &state,
                &route.gateway_id,
                &(route.epoch as i64),
            ],
        )
        .await?;
    Ok(n == 1)
}

pub(crate) async fn result(
    db: &impl Db,
    node_id: &NodeId,
    signed: &Signed<ResultInput>,
    verify: VerifySignature,
) -> Result<ResultApplied, StoreError> {
    let now = db.now().await?;
    let certs = valid_certs(db, node_id, now).await?;
    let r = match judge_signed(node_id, signed, &certs, verify) {
        Ok(r) => r,
        Err(reason) => {
            let detail = match &signed.fact {
                Some(r) => format!("command {}: {reason}", r.command_id),
                None => reason,
            };
            fleet_event(db, now, FORGED, node_id, &detail).await?;
            return Ok(ResultApplied::Forged(detail));
        }
    };
    // Locked: of two results at once, the second waits and finds the
    // first. (A confirmed upgrade raises no floor here: the key holder
    // raises it once it verified the result, `judge_upgrade_floor`.)
    let Some(state) = db
        .query_opt(
            "SELECT state FROM commands WHERE id = $1 AND node_id = $2 FOR UPDATE",
            &[&r.command_id, &node_id],
        )
        .await?
        .map(|row| row.get::<String>(0))
        .transpose()?
    else {
        return Ok(ResultApplied::Unknown);
    };
    let Some(state) = ServerState::parse(&state) else {
        return Ok(ResultApplied::Unknown);
    };
    let Some(next) = apply_result(state, r.outcome) else {
        return Ok(ResultApplied::Duplicate);
    };
    db.execute(
        "UPDATE commands SET state = $2, reason = $3, exit_code = $4, output = $5,
             output_truncated = $6, result_at = compute_now(), updated_at = compute_now(),
             result_payload = $7, result_signature = $8
         WHERE id = $1",
        &[
            &r.command_id,
            &next.name(),
            &r.reason,
            &r.exit_code,
            &r.output,
            &r.output_truncated,
            &signed.payload,
            &signed.signature,
        ],
    )
    .await?;
    Ok(ResultApplied::Applied)
}

pub(crate) async fn upgrades_unjudged(
    db: &impl Db,
    limit: u32,
) -> Result<Vec<CommandId>, StoreError> {
    db.column(
        "SELECT id FROM commands
         WHERE kind = 'daemon.upgrade' AND state = 'succeeded' AND NOT floor_judged
         ORDER BY id LIMIT $1",
        &[&i64::from(limit)],
    )
    .await
}

/// Raises the node's release floor from a confirmed upgrade the key holder
/// believed. The node's row is taken before the command's, the order a
/// Hello takes them in.
pub(crate) async fn judge_upgrade_floor(
    db: &impl Db,
    id: &CommandId,
    believed: bool,
) -> Result<Option<u64>, StoreError> {
    let Some(node) = db
        .query_opt("SELECT node_id FROM commands WHERE id = $1", &[&id])
        .await?
        .map(|r| r.get::<String>(0))
        .transpose()?
    else {
        return Ok(None);
    };
    db.execute(
        "SELECT 1 FROM nodes WHERE id = $1 FOR NO KEY UPDATE",
        &[&node],
    )
    .await?;
    let Some((kind, summary)) = db
        .query_opt(
            "SELECT kind, summary FROM commands
         WHERE id = $1 AND state = 'succeeded' AND NOT floor_judged FOR UPDATE",
            &[&id],
        )
        .await?
        .map(|r| Ok::<_, StoreError>((r.get::<String>(0)?, r.get::<String>(1)?)))
        .transpose()?
    else {
        return Ok(None);
    };
    db.execute(
        "UPDATE commands SET floor_judged = TRUE WHERE id = $1",
        &[&id],
    )
    .await?;
    let Some(floor) = raises_floor(&kind, &summary).filter(|_| believed) else {
        return Ok(None);
    };
    db.execute("UPDATE nodes SET release_floor = CASE WHEN release_floor > $2 THEN release_floor ELSE $2 END
         WHERE id = $1",
        &[&node, &(floor.min(i64::MAX as u64) as i64)],
    )
    .await?;
    Ok(Some(floor))
}

pub(crate) async fn sweep(db: &impl Db) -> Result<Vec<CommandId>, StoreError> {
    // "now" as a value, so the deadline index bounds the scan.
    let now = db.now().await?;
    db.column(
        "UPDATE commands SET state = 'expired', reason = $1, result_at = $2, updated_at = $2
         WHERE state = 'pending' AND not_after < $2 RETURNING id",
        &[&SWEPT, &now],
    )
    .await
}

pub(crate) async fn cancel_pending(
    db: &impl Db,
    id: &CommandId,
    reason: &str,
) -> Result<bool, StoreError> {
    let n = db
        .execute(
            "UPDATE commands SET state = 'expired', reason = $2,
             result_at = compute_now(), updated_at = compute_now()
         WHERE id = $1 AND state = 'pending'",
            &[&id, &reason],
        )
        .await?;
    Ok(n == 1)
}

pub(crate) async fn states(db: &impl Db) -> Result<Vec<(String, u64)>, StoreError> {
    db.query(
        "SELECT state, COUNT(*) FROM commands GROUP BY state ORDER BY state",
        &[],
    )
    .await?
    .iter()
    .map(|r| Ok((r.get(0)?, r.get::<i64>(1)?.max(0) as u64)))
    .collect()
}

pub(crate) async fn results_unreceipted(
    db: &impl Db,
    limit: u32,
) -> Result<Vec<CommandId>, StoreError> {
    db.column(
        "SELECT id FROM commands WHERE receipt IS NULL AND result_signature IS NOT NULL \
         ORDER BY id LIMIT $1",
        &[&i64::from(limit)],
    )
    .await
}

pub(crate) async fn put_result_receipt(
    db: &impl Db,
    id: &CommandId,
    receipt: &[u8],
) -> Result<(), StoreError> {
    db.execute(
        "UPDATE commands SET receipt = $2 WHERE id = $1 AND receipt IS NULL",
        &[&id, &receipt],
    )
    .await?;
    Ok(())
}

pub(crate) async fn result_receipts(
    db: &impl Db,
    node: &NodeId,
    ids: &[CommandId],
) -> Result<Vec<(CommandId, Vec<u8>)>, StoreError> {
    let (commands, unknown) = (
        in_list(db.dialect(), "id", 1),
        in_list(db.dialect(), "command_id", 1),
    );
    db.query(
        &format!(
            "SELECT id, receipt FROM commands
             WHERE {commands} AND node_id = $2 AND receipt IS NOT NULL
             UNION ALL
             SELECT command_id, receipt FROM unknown_results
             WHERE {unknown} AND node_id = $2 AND length(receipt) > 0"
        ),
        &[&List(ids.to_vec()), &node],
    )
    .await?
    .iter()
    .map(|r| Ok((r.get(0)?, r.get(1)?)))
    .collect()
}

pub(crate) async fn put_unknown_result(
    db: &impl Db,
    r: &UnknownResult,
) -> Result<bool, StoreError> {
    let held: i64 = db
        .query_one(
            "SELECT COUNT(*) FROM unknown_results WHERE node_id = $1",
            &[&r.node_id],
        )
        .await?
        .get(0)?;
    if held >= UNKNOWN_RESULTS_PER_NODE {
        return Ok(false);
    }
    // PostgreSQL derives the payload's digest (a generated column); SQLite
    // is given it.
    let sql = match db.dialect() {
        Dialect::Sqlite => {
            "INSERT INTO unknown_results (node_id, command_id, payload, signature, payload_sha256, at)
             VALUES ($1, $2, $3, $4, sha256_hex($3), compute_now())
             ON CONFLICT DO NOTHING"
        }
        Dialect::Postgres => {
            "INSERT INTO unknown_results (node_id, command_id, payload, signature, at)
             VALUES ($1, $2, $3, $4, compute_now())
             ON CONFLICT DO NOTHING"
        }
    };
    db.execute(sql, &[&r.node_id, &r.command_id, &r.payload, &r.signature])
        .await?;
    Ok(true)
}

pub(crate) async fn unknown_results_unreceipted(
    db: &impl Db,
    limit: u32,
) -> Result<Vec<UnknownResult>, StoreError> {
    db.query(
        "SELECT node_id, command_id, payload, signature FROM unknown_results
         WHERE receipt IS NULL ORDER BY at LIMIT $1",
        &[&i64::from(limit)],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(UnknownResult {
            node_id: r.get(0)?,
            command_id: r.get(1)?,
            payload: r.get(2)?,
            signature: r.get(3)?,
        })
    })
    .collect()
}

pub(crate) async fn put_unknown_result_receipt(
    db: &impl Db,
    r: &UnknownResult,
    receipt: &[u8],
) -> Result<(), StoreError> {
    let digest = match db.dialect() {
        Dialect::Sqlite => "sha256_hex($3)",
        Dialect::Postgres => "encode(sha256($3), 'hex')",
    };
    db.execute(
        &format!(
            "UPDATE unknown_results SET receipt = $4, receipted_at = compute_now()
             WHERE node_id = $1 AND command_id = $2 AND payload_sha256 = {digest}
               AND receipt IS NULL"
        ),
        &[&r.node_id, &r.command_id, &r.payload, &receipt],
    )
    .await?;
    db.execute(
        "DELETE FROM unknown_results WHERE node_id = $1
           AND (length(receipt) = 0 OR receipted_at < compute_now() - $2)",
        &[&r.node_id, &SECURITY_EVENTS_KEPT_MS],
    )
    .await?;
    Ok(())
}
