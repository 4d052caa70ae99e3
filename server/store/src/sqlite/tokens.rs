//! Join tokens and operator credentials.

use rusqlite::{Connection, OptionalExtension, params};

use super::Lite;
use super::{Kept, ms, now};
use crate::sql::inventory::record_macs;
use crate::sql::nodes::{quarantine_node, revoke_all};
use crate::sql::ready;

use crate::clones;
use crate::error::{StoreError, TxError};
use crate::machines::{self, BoundNode, Enrolled, ProvesMachine, TokenlessJoin};
use crate::nodes::{REENROLLED, SealStatement};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OPERATOR_COLUMNS, OperatorRole,
    OperatorRow, PreviousProof, ProvenNode, REENROLLED_EVENT, SealRevocation, TOKEN_INFO_COLUMNS,
    TokenInfo, TokenRow, admit, judge_proof, new_node_id, no_operator, operator_exists,
    operator_role, reattest_detail, reclaim_detail, reenrol_detail,
};

pub(super) fn add_operator(c: &Connection, o: &NewOperator) -> Result<(), TxError> {
    let taken: bool = c.query_row_kept(
        "SELECT EXISTS (SELECT 1 FROM operators WHERE id = ?1)",
        [&o.id],
        |r| r.get(0),
    )?;
    if taken {
        return Err(operator_exists(&o.id).into());
    }
    c.execute_kept(
        "INSERT INTO operators (id, role, cert_sha256, cert_serial, created_at, not_after)
         VALUES (?1, ?2, ?3, ?4, compute_now(), ?5)",
        params![
            o.id,
            o.role.as_str(),
            o.cert_sha256,
            o.cert_serial,
            o.not_after
        ],
    )?;
    Ok(())
}

fn operator_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(OperatorRow, String)> {
    let role: String = r.get(1)?;
    Ok((
        OperatorRow {
            id: r.get(0)?,
            role: OperatorRole::ReadOnly,
            cert_sha256: r.get(2)?,
            cert_serial: r.get(3)?,
            created_at: r.get(4)?,
            not_after: r.get(5)?,
            revoked_at: r.get(6)?,
            revocation: r.get(7)?,
        },
        role,
    ))
}

fn with_role((mut row, role): (OperatorRow, String)) -> Result<OperatorRow, StoreError> {
    row.role = operator_role(&role)?;
    Ok(row)
}

pub(super) fn list_operators(c: &Connection) -> Result<Vec<OperatorRow>, StoreError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {OPERATOR_COLUMNS} FROM operators ORDER BY created_at, id"
    ))?;
    let rows = stmt
        .query_map([], operator_row)?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(with_role).collect()
}

pub(super) fn operator_by_cert(
    c: &Connection,
    cert_sha256: &str,
) -> Result<Option<OperatorRow>, StoreError> {
    c.query_row_kept(
        &format!("SELECT {OPERATOR_COLUMNS} FROM operators WHERE cert_sha256 = ?1"),
        [cert_sha256],
        operator_row,
    )
    .optional()?
    .map(with_role)
    .transpose()
}

pub(super) fn revoke_operator(
    c: &Connection,
    id: &str,
    seal: SealRevocation,
) -> Result<OperatorRow, TxError> {
    let read = |c: &Connection| -> Result<OperatorRow, TxError> {
        let row = c
            .query_row_kept(
                &format!("SELECT {OPERATOR_COLUMNS} FROM operators WHERE id = ?1"),
                [id],
                operator_row,
            )
            .optional()?
            .ok_or_else(|| no_operator(id))?;
        Ok(with_role(row)?)
    };
    let row = read(c)?;
    if row.revocation.is_some() {
        return Ok(row);
    }
    // Revoked before revocations were signed: signed now, at its time.
    let at = match row.revoked_at {
        Some(at) => at,
        None => c.query_row_kept("SELECT compute_now()", [], |r| r.get(0))?,
    };
    let revocation = seal(&row, at);
    c.execute_kept(
        "UPDATE operators SET revoked_at = ?2, revocation = ?3 WHERE id = ?1 AND revocation IS NULL",
        params![id, at, revocation],
    )?;
    read(c)
}

pub(super) fn create_token(c: &Connection, t: &NewToken) -> Result<i64, StoreError> {
    Ok(c.query_row_kept(
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total, uses_left, description, pool)
         VALUES (?1, ?2, compute_now(), compute_now() + ?3, ?4, ?4, ?5, ?6) RETURNING expires_at",
        params![t.id, t.secret_sha256, ms(t.ttl), t.uses, t.description, t.pool],
        |r| r.get(0),
    )?)
}

fn token_info(r: &rusqlite::Row<'_>) -> rusqlite::Result<TokenInfo> {
    Ok(TokenInfo {
        id: r.get(0)?,
        created_at_ms: r.get(1)?,
        expires_at_ms: r.get(2)?,
        uses_total: r.get(3)?,
        uses_left: r.get(4)?,
        description: r.get(5)?,
        pool: r.get(6)?,
        minted_for_mac: r.get(7)?,
    })
}

pub(super) fn list_tokens(c: &Connection, all: bool) -> Result<Vec<TokenInfo>, StoreError> {
    let mut st = c.prepare_cached(&format!(
        "SELECT {TOKEN_INFO_COLUMNS} FROM join_tokens
         WHERE ?1 OR (expires_at >= compute_now() AND uses_left > 0)
         ORDER BY created_at DESC, id LIMIT ?2"
    ))?;
    let rows = st.query_map(params![all, crate::tokens::LIST_LIMIT], token_info)?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(super) fn revoke_token(c: &Connection, id: &str) -> Result<Option<TokenInfo>, StoreError> {
    Ok(c.query_row_kept(
        &format!(
            "UPDATE join_tokens SET expires_at = MIN(expires_at, compute_now() - 1)
             WHERE id = ?1 RETURNING {TOKEN_INFO_COLUMNS}"
        ),
        [id],
        token_info,
    )
    .optional()?)
}

/// Checks the token (`admit`); the caller spends it.
fn check_token(c: &Connection, j: &JoinInput, now: i64) -> Result<(), TxError> {
    let token: Option<TokenRow> = c
        .query_row_kept(
            "SELECT secret_sha256, expires_at, uses_left FROM join_tokens WHERE id = ?1",
            [&j.token_id],
            |r| {
                Ok(TokenRow {
                    secret_sha256: r.get(0)?,
                    expires_at_ms: r.get(1)?,
                    uses_left: r.get(2)?,
                })
            },
        )
        .optional()?;
    admit(token.as_ref(), &j.secret_sha256, now)?;
    Ok(())
}

fn spend_token(c: &Connection, token_id: &str) -> rusqlite::Result<()> {
    c.execute_kept(
        "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = ?1",
        [token_id],
    )?;
    Ok(())
}

pub(super) fn join(c: &Connection, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
    let now = now(c)?;
    check_token(c, j, now)?;
    spend_token(c, &j.token_id)?;
    new_node(c, j, now, issue, None)
}

/// Creates a node (bound to the EK `ek_sha256`, if any) with the
/// certificate `issue` builds; the token was spent.
fn new_node(
    c: &Connection,
    j: &JoinInput,
    now: i64,
    issue: IssueCert,
    ek_sha256: Option<&str>,
) -> Result<Joined, TxError> {
    let node_id = new_node_id();
    let cert = issue(&node_id, now)?;
    c.execute_kept(
        "INSERT INTO nodes (id, hostname, created_at, identity_generation, ramdisk, join_token, ek_sha256, pool)
         VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, (SELECT pool FROM join_tokens WHERE id = ?5))",
        params![node_id, j.hostname, now, j.ramdisk, j.token_id, ek_sha256],
    )?;
    ready(record_macs(&Lite(c), &node_id, &j.macs, now))?;
    c.execute_kept(
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)",
        params![
            cert.serial,
            node_id,
            cert.fingerprint,
            cert.not_before_ms,
            cert.not_after_ms,
            cert.der
        ],
    )?;
    Ok(Joined::new_node(node_id, cert, now))
}

pub(super) fn reenrol(
    c: &Connection,
    j: &JoinInput,
    proof: &PreviousProof,
    issue: IssueCert,
    seal: SealStatement,
) -> Result<Joined, TxError> {
    let now = now(c)?;
    check_token(c, j, now)?;
    let node_id = proof.node_id.as_str();
    let node = c
        .query_row_kept(
            "SELECT deleted_at IS NOT NULL, identity_generation FROM nodes WHERE id = ?1",
            [node_id],
            |r| {
                Ok(ProvenNode {
                    deleted: r.get(0)?,
                    identity_generation: r.get(1)?,
                })
            },
        )
        .optional()?;
    // Unrevoked, expired or not: a machine offline past its certificate's
    // end still holds the node's key.
    let certs: Vec<Vec<u8>> = c
        .prepare(
            "SELECT der FROM node_certs WHERE node_id = ?1 AND revoked_at IS NULL
             AND der IS NOT NULL ORDER BY not_after DESC",
        )?
        .query_map([node_id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let generation = judge_proof(node.as_ref(), &certs, proof)?;
    spend_token(c, &j.token_id)?;
    reenrol_node(c, j, node_id, generation, now, issue, seal, reenrol_detail)
}

/// Joins the machine whose EK has `ek_sha256` with a token: the node
/// bound to that EK again, at its next identity generation with its
/// earlier certificates revoked, or a new node bound to it.
pub(super) fn join_attested(
    c: &Connection,
    j: &JoinInput,
    ek_sha256: &str,
    issue: IssueCert,
    seal: SealStatement,
) -> Result<Joined, TxError> {
    let now = now(c)?;
    check_token(c, j, now)?;
    let bound = bound_node(c, ek_sha256)?;
    spend_token(c, &j.token_id)?;
    match bound {
        None => new_node(c, j, now, issue, Some(ek_sha256)),
        Some(BoundNode {
            node_id,
            generation,
            ..
        }) => {
            let generation = generation.max(0) as u64 + 1;
            // An operator's join with a token ends a quarantine, and the
            // clone watch starts over.
            c.execute_kept(
                "UPDATE nodes SET quarantined_at = NULL WHERE id = ?1",
                [&node_id],
            )?;
            c.execute_kept("DELETE FROM ek_sightings WHERE node_id = ?1", [&node_id])?;
            reenrol_node(c, j, &node_id, generation, now, issue, seal, reclaim_detail)
        }
    }
}

/// Moves `node_id` to identity `generation` with the certificate `issue`
/// builds: every earlier certificate revoked with the statement `seal`
/// signs, a fleet event (`detail` of the generation, the revoked serials
/// and the token) kept.
#[allow(clippy::too_many_arguments)]
fn reenrol_node(
    c: &Connection,
    j: &JoinInput,
    node_id: &str,
    generation: u64,
    now: i64,
    issue: IssueCert,
    seal: SealStatement,
    detail: fn(u64, &[String], &str) -> String,
) -> Result<Joined, TxError> {
    let cert = issue(node_id, now)?;
    let serials = ready(revoke_all(&Lite(c), node_id, now, REENROLLED, seal))?;
    c.execute_kept(
        "UPDATE nodes SET identity_generation = ?2, hostname = ?3, ramdisk = ?4,
             hello_proofs_since = NULL,
             pool = COALESCE((SELECT pool FROM join_tokens WHERE id = ?5), pool)
         WHERE id = ?1",
        params![
            node_id,
            generation as i64,
            j.hostname,
            j.ramdisk,
            j.token_id
        ],
    )?;
    ready(record_macs(&Lite(c), node_id, &j.macs, now))?;
    c.execute_kept(
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            cert.serial,
            node_id,
            cert.fingerprint,
            generation as i64,
            cert.not_before_ms,
            cert.not_after_ms,
            cert.der
        ],
    )?;
    super::fleet_event(
        c,
        now,
        REENROLLED_EVENT,
        node_id,
        &detail(generation, &serials, &j.token_id),
    )?;
    let (command_seq_floor, spec_generation_floor) =
        ready(crate::sql::nodes::floors(&Lite(c), node_id))?;
    Ok(Joined {
        node_id: node_id.to_string(),
        cert,
        now_ms: now,
        command_seq_floor,
        spec_generation_floor,
        identity_generation: generation,
    })
}

/// Joins the machine whose EK has `ek_sha256` with no token
/// (`crate::machines`): the node bound to the EK again, or a new node when
/// the EK is enrolled or certified by the enrolled EK CA `ek_ca`. Nothing
/// is spent. The join's `boot_id` is a sighting for the clone watch: a
/// node whose re-attestations alternate between machines is quarantined.
pub(super) fn join_enrolled(
    c: &Connection,
    j: &JoinInput,
    ek_sha256: &str,
    ek_ca: Option<&str>,
    boot_id: &str,
    (issue, seal): (IssueCert, SealStatement),
    proves: ProvesMachine,
) -> Result<Enrolled, TxError> {
    let now = now(c)?;
    let bound = bound_node(c, ek_sha256)?;
    let enrolled: bool = c.query_row_kept(
        "SELECT EXISTS (SELECT 1 FROM machine_enrolments WHERE id = ?1)",
        [machines::ek_id(ek_sha256)],
        |r| r.get(0),
    )?;
    let ca: Option<String> = match ek_ca {
        None => None,
        Some(id) => c
            .query_row_kept(
                "SELECT id FROM machine_enrolments WHERE id = ?1 AND kind = 'ek-ca'",
                [id],
                |r| r.get(0),
            )
            .optional()?,
    };
    match machines::admit_tokenless(ek_sha256, bound, enrolled, ca.as_deref())? {
        TokenlessJoin::Reclaim {
            node_id,
            generation,
        } => {
            let certs: Vec<Vec<u8>> = c
                .prepare_cached(
                    "SELECT der FROM node_certs WHERE node_id = ?1 AND der IS NOT NULL",
                )?
                .query_map([&node_id], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            if !certs.iter().any(|der| proves(&node_id, der)) {
                super::fleet_event(
                    c,
                    now,
                    machines::EK_BINDING_FORGED,
                    &node_id,
                    machines::EK_BINDING_FORGED_DETAIL,
                )?;
                return Ok(Enrolled::Forged { node_id });
            }
            if watch_reattest(c, &node_id, boot_id, now)? {
                ready(quarantine_node(
                    &Lite(c),
                    &node_id,
                    now,
                    seal,
                    clones::reattest_quarantine_detail,
                ))?;
                return Ok(Enrolled::Quarantined { node_id });
            }
            reenrol_node(
                c,
                j,
                &node_id,
                generation,
                now,
                issue,
                seal,
                reattest_detail,
            )
            .map(Enrolled::Joined)
        }
        TokenlessJoin::NewNode { admitted_by } => {
            let j = JoinInput {
                token_id: admitted_by,
                ..j.clone()
            };
            let joined = new_node(c, &j, now, issue, Some(ek_sha256))?;
            watch_reattest(c, &joined.node_id, boot_id, now)?;
            Ok(Enrolled::Joined(joined))
        }
    }
}

/// The clone watch's part of a join with no token (`crate::clones`, keyed
/// by the node): records the boot id, publishes a takeover of a connected
/// session from another boot; true when the alternations call for
/// quarantine. A join with no boot id (an older bcd) is not watched.
fn watch_reattest(c: &Connection, node_id: &str, boot_id: &str, now: i64) -> Result<bool, TxError> {
    if boot_id.is_empty() {
        return Ok(false);
    }
    let sightings: Vec<(String, i64)> = c
        .prepare_cached("SELECT boot_id, at FROM ek_sightings WHERE node_id = ?1 ORDER BY id")?
        .query_map([node_id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let connected: Option<String> = c
        .query_row_kept(
            "SELECT boot_id FROM node_sessions WHERE node_id = ?1 AND state = 'connected'",
            [node_id],
            |r| r.get(0),
        )
        .optional()?;
    let v = clones::judge(&sightings, connected.as_deref(), boot_id, now);
    if v.record {
        c.prepare_cached("INSERT INTO ek_sightings (node_id, boot_id, at) VALUES (?1, ?2, ?3)")?
            .execute(params![node_id, boot_id, now])?;
        c.prepare_cached("DELETE FROM ek_sightings WHERE node_id = ?1 AND at < ?2")?
            .execute(params![node_id, now - clones::CLONE_WINDOW_MS])?;
    }
    if v.takeover {
        super::fleet_event(
            c,
            now,
            clones::DUPLICATE_SESSION,
            node_id,
            &clones::reattest_takeover_detail(boot_id, connected.as_deref().unwrap_or_default()),
        )?;
    }
    Ok(v.quarantine())
}

/// The live node bound to the EK `ek_sha256` (the writer's transaction
/// orders joins of one EK).
fn bound_node(c: &Connection, ek_sha256: &str) -> rusqlite::Result<Option<BoundNode>> {
    c.query_row_kept(
        "SELECT id, identity_generation, quarantined_at IS NOT NULL FROM nodes
         WHERE ek_sha256 = ?1 AND deleted_at IS NULL",
        [ek_sha256],
        |r| {
            Ok(BoundNode {
                node_id: r.get(0)?,
                generation: r.get(1)?,
                quarantined: r.get(2)?,
            })
        },
    )
    .optional()
}
