//! Join tokens and operator credentials.

use super::bindings::fleet_event;
use super::inventory::{INSERT_MAC, record_macs};
use super::nodes::{floors, quarantine_node, revoke_all};
use super::{Db, Dialect, Param, Params, Row};
use crate::clock::ms;
use crate::clones;
use crate::error::{StoreError, TxError};
use crate::id::{NodeId, OperatorId, TokenId};
use crate::machines::{self, BoundNode, Enrolled, TokenlessJoin};
use crate::nodes::{REENROLLED, SealStatement};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OPERATOR_COLUMNS, OperatorRow,
    PreviousProof, ProvenNode, REENROLLED_EVENT, SealRevocation, TOKEN_INFO_COLUMNS, TokenInfo,
    TokenRow, admit, judge_proof, new_node_id, no_operator, operator_exists, operator_role,
    reattest_detail, reclaim_detail, reenrol_detail,
};

pub(crate) async fn add_operator(db: &impl Db, o: &NewOperator) -> Result<(), TxError> {
    let taken: bool = db
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM operators WHERE id = $1)",
            &[&o.id],
        )
        .await?
        .get(0)?;
    if taken {
        return Err(operator_exists(&o.id).into());
    }
    db.execute(
        "INSERT INTO operators (id, role, cert_sha256, cert_serial, created_at, not_after)
         VALUES ($1, $2, $3, $4, compute_now(), $5)",
        &[
            &o.id,
            &o.role.as_str(),
            &o.cert_sha256,
            &o.cert_serial,
            &o.not_after,
        ],
    )
    .await?;
    Ok(())
}

fn operator_row(r: &Row) -> Result<OperatorRow, StoreError> {
    Ok(OperatorRow {
        id: r.get(0)?,
        role: operator_role(&r.get::<String>(1)?)?,
        cert_sha256: r.get(2)?,
        cert_serial: r.get(3)?,
        created_at: r.get(4)?,
        not_after: r.get(5)?,
        revoked_at: r.get(6)?,
        revocation: r.get(7)?,
    })
}

pub(crate) async fn list_operators(db: &impl Db) -> Result<Vec<OperatorRow>, StoreError> {
    db.query(
        &format!("SELECT {OPERATOR_COLUMNS} FROM operators ORDER BY created_at, id"),
        &[],
    )
    .await?
    .iter()
    .map(operator_row)
    .collect()
}

pub(crate) async fn operator_by_cert(
    db: &impl Db,
    cert_sha256: &str,
) -> Result<Option<OperatorRow>, StoreError> {
    db.query_opt(
        &format!("SELECT {OPERATOR_COLUMNS} FROM operators WHERE cert_sha256 = $1"),
        &[&cert_sha256],
    )
    .await?
    .as_ref()
    .map(operator_row)
    .transpose()
}

pub(crate) async fn revoke_operator(
    db: &impl Db,
    id: &OperatorId,
    seal: SealRevocation,
) -> Result<OperatorRow, TxError> {
    let row = db
        .query_opt(
            &format!("SELECT {OPERATOR_COLUMNS} FROM operators WHERE id = $1 FOR UPDATE"),
            &[&id],
        )
        .await?
        .ok_or_else(|| no_operator(id))?;
    let row = operator_row(&row)?;
    if row.revocation.is_some() {
        return Ok(row);
    }
    // Revoked before revocations were signed: signed now, at its time.
    let now: i64 = match row.revoked_at {
        Some(at) => at,
        None => db.now().await?,
    };
    let revocation = seal(&row, now);
    db.execute(
        "UPDATE operators SET revoked_at = $2, revocation = $3 WHERE id = $1",
        &[&id, &now, &revocation],
    )
    .await?;
    Ok(OperatorRow {
        revoked_at: Some(now),
        revocation: Some(revocation),
        ..row
    })
}

pub(crate) async fn create_token(db: &impl Db, t: &NewToken) -> Result<i64, StoreError> {
    db.query_one(
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total,
             uses_left, description, pool)
         VALUES ($1, $2, compute_now(), compute_now() + $3, $4, $4, $5, $6) RETURNING expires_at",
        &[
            &t.id,
            &t.secret_sha256,
            &ms(t.ttl),
            &i64::from(t.uses),
            &t.description,
            &t.pool,
        ],
    )
    .await?
    .get(0)
}

fn token_info(r: &Row) -> Result<TokenInfo, StoreError> {
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

pub(crate) async fn list_tokens(db: &impl Db, all: bool) -> Result<Vec<TokenInfo>, StoreError> {
    db.query(
        &format!(
            "SELECT {TOKEN_INFO_COLUMNS} FROM join_tokens
             WHERE $1 OR (expires_at >= compute_now() AND uses_left > 0)
             ORDER BY created_at DESC, id LIMIT $2"
        ),
        &[&all, &crate::tokens::LIST_LIMIT],
    )
    .await?
    .iter()
    .map(token_info)
    .collect()
}

pub(crate) async fn revoke_token(
    db: &impl Db,
    id: &TokenId,
) -> Result<Option<TokenInfo>, StoreError> {
    db.query_opt(
        &format!(
            "UPDATE join_tokens SET expires_at = CASE WHEN expires_at < compute_now() - 1
                 THEN expires_at ELSE compute_now() - 1 END
             WHERE id = $1 RETURNING {TOKEN_INFO_COLUMNS}"
        ),
        &[&id],
    )
    .await?
    .as_ref()
    .map(token_info)
    .transpose()
}

/// Checks the token (`admit`), locking its row; the caller spends it.
async fn check_token(db: &impl Db, j: &JoinInput, now: i64) -> Result<(), TxError> {
    // Locked: two joins with one token spend two uses, one after the other.
    let token = db
        .query_opt(
            "SELECT secret_sha256, expires_at, uses_left FROM join_tokens WHERE id = $1 FOR UPDATE",
            &[&j.token_id],
        )
        .await?
        .map(|r| {
            Ok::<_, StoreError>(TokenRow {
                secret_sha256: r.get(0)?,
                expires_at_ms: r.get(1)?,
                uses_left: r.get(2)?,
            })
        })
        .transpose()?;
    admit(token.as_ref(), &j.secret_sha256, now)?;
    Ok(())
}

const SPEND_TOKEN: &str = "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = $1";

async fn spend_token(db: &impl Db, token_id: &TokenId) -> Result<(), StoreError> {
    db.execute(SPEND_TOKEN, &[&token_id]).await?;
    Ok(())
}

pub(crate) async fn join(db: &impl Db, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
    let now = db.now().await?;
    check_token(db, j, now).await?;
    new_node(db, j, now, issue, None, Spend::Token).await
}

/// Whether [`new_node`] spends the join's token, or its caller did (or
/// there is none: a machine enrolled by its EK has no token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spend {
    Token,
    Done,
}

/// Creates a node (bound to the EK `ek_sha256`, if any) with the
/// certificate `issue` builds, spending the token first if `spend` says
/// so. Its writes go in one batch (one round trip on PostgreSQL): a join holds its token's
/// row locked from the check to the commit, and every join with that
/// token waits for it.
async fn new_node(
    db: &impl Db,
    j: &JoinInput,
    now: i64,
    issue: IssueCert,
    ek_sha256: Option<&str>,
    spend: Spend,
) -> Result<Joined, TxError> {
    let node_id = new_node_id();
    let cert = issue(&node_id, now)?;
    let mut batch: Vec<(&str, Params<'_>)> = Vec::new();
    let token: [&dyn Param; 1] = [&j.token_id];
    if spend == Spend::Token {
        batch.push((SPEND_TOKEN, &token));
    }
    let node: [&dyn Param; 6] = [
        &node_id,
        &j.hostname,
        &now,
        &j.ramdisk,
        &j.token_id,
        &ek_sha256,
    ];
    batch.push((
        "INSERT INTO nodes (id, hostname, created_at, identity_generation, ramdisk, join_token, ek_sha256, pool)
         VALUES ($1, $2, $3, 1, $4, $5, $6, (SELECT pool FROM join_tokens WHERE id = $5))",
        &node,
    ));
    let macs: Vec<[&dyn Param; 3]> = j
        .macs
        .iter()
        .map(|m| [m as &dyn Param, &node_id, &now])
        .collect();
    for m in &macs {
        batch.push((INSERT_MAC, m));
    }
    let certificate: [&dyn Param; 6] = [
        &cert.serial,
        &node_id,
        &cert.fingerprint,
        &cert.not_before_ms,
        &cert.not_after_ms,
        &cert.der,
    ];
    batch.push((
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES ($1, $2, $3, 1, $4, $5, $6)",
        &certificate,
    ));
    db.batch(&batch).await?;
    Ok(Joined::new_node(node_id, cert, now))
}

pub(crate) async fn reenrol(
    db: &impl Db,
    j: &JoinInput,
    proof: &PreviousProof,
    issue: IssueCert,
    seal: SealStatement,
) -> Result<Joined, TxError> {
    let now = db.now().await?;
    check_token(db, j, now).await?;
    let node_id = &proof.node_id;
    // Locked (after the token, as every join locks): of two re-enrolments
    // of one node the second reads what the first left, its proof's
    // certificate revoked.
    let node = db.query_opt("SELECT deleted_at IS NOT NULL, identity_generation FROM nodes WHERE id = $1 FOR UPDATE",
        &[&node_id],
    )
    .await?
    .map(|r| {
        Ok::<_, StoreError>(ProvenNode {
            deleted: r.get(0)?,
            identity_generation: r.get(1)?,
        })
    })
    .transpose()?;
    // Unrevoked, expired or not: a machine offline past its certificate's
    // end still holds the node's key.
    let certs: Vec<Vec<u8>> = db
        .column(
            "SELECT der FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL
         AND der IS NOT NULL ORDER BY not_after DESC",
            &[&node_id],
        )
        .await?;
    let generation = judge_proof(node.as_ref(), &certs, proof)?;
    spend_token(db, &j.token_id).await?;
    reenrol_node(db, j, node_id, generation, now, issue, seal, reenrol_detail).await
}

/// Joins the machine whose EK has `ek_sha256` with a token: the node
/// bound to that EK again, at its next identity generation with its
/// earlier certificates revoked, or a new node bound to it.
pub(crate) async fn join_attested(
    db: &impl Db,
    j: &JoinInput,
    ek_sha256: &str,
    issue: IssueCert,
    seal: SealStatement,
) -> Result<Joined, TxError> {
    let now = db.now().await?;
    check_token(db, j, now).await?;
    // Locked after the token, as every join locks.
    let bound = bound_node(db, ek_sha256).await?;
    spend_token(db, &j.token_id).await?;
    match bound {
        None => new_node(db, j, now, issue, Some(ek_sha256), Spend::Done).await,
        Some(BoundNode {
            node_id,
            generation,
            ..
        }) => {
            let generation = generation.max(0) as u64 + 1;
            // An operator's join with a token ends a quarantine, and the
            // clone watch starts over.
            db.execute(
                "UPDATE nodes SET quarantined_at = NULL WHERE id = $1",
                &[&node_id],
            )
            .await?;
            db.execute("DELETE FROM ek_sightings WHERE node_id = $1", &[&node_id])
                .await?;
            reenrol_node(
                db,
                j,
                &node_id,
                generation,
                now,
                issue,
                seal,
                reclaim_detail,
            )
            .await
        }
    }
}

/// Moves `node_id` to identity `generation` with the certificate `issue`
/// builds: every earlier certificate revoked with the statement `seal`
/// signs, a fleet event (`detail` of the generation, the revoked serials
/// and the token) kept.
#[allow(clippy::too_many_arguments)]
async fn reenrol_node(
    db: &impl Db,
    j: &JoinInput,
    node_id: &NodeId,
    generation: u64,
    now: i64,
    issue: IssueCert,
    seal: SealStatement,
    detail: fn(u64, &[String], &str) -> String,
) -> Result<Joined, TxError> {
    let cert = issue(node_id, now)?;
    let serials = revoke_all(db, node_id, now, REENROLLED, seal).await?;
    let generation_col = generation as i64;
    db.execute(
        "UPDATE nodes SET identity_generation = $2, hostname = $3, ramdisk = $4,
             hello_proofs_since = NULL,
             pool = COALESCE((SELECT pool FROM join_tokens WHERE id = $5), pool)
         WHERE id = $1",
        &[
            &node_id,
            &generation_col,
            &j.hostname,
            &j.ramdisk,
            &j.token_id,
        ],
    )
    .await?;
    record_macs(db, node_id, &j.macs, now).await?;
    db.execute("INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &cert.serial,
            &node_id,
            &cert.fingerprint,
            &generation_col,
            &cert.not_before_ms,
            &cert.not_after_ms,
            &cert.der,
        ],
    )
    .await?;
    fleet_event(
        db,
        now,
        REENROLLED_EVENT,
        node_id,
        &detail(generation, &serials, &j.token_id),
    )
    .await?;
    let (command_seq_floor, spec_generation_floor) = floors(db, node_id).await?;
    Ok(Joined {
        node_id: NodeId::from(node_id),
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
#[allow(clippy::too_many_arguments)]
pub(crate) async fn join_enrolled(
    db: &impl Db,
    j: &JoinInput,
    ek_sha256: &str,
    ek_ca: Option<&str>,
    boot_id: &str,
    (issue, seal): (IssueCert, SealStatement),
    proves: machines::ProvesMachine,
) -> Result<Enrolled, TxError> {
    let now = db.now().await?;
    let bound = bound_node(db, ek_sha256).await?;
    // FOR SHARE: an enrolment removed meanwhile waits for this join.
    let enrolled = db
        .query_opt(
            "SELECT 1 FROM machine_enrolments WHERE id = $1 FOR SHARE",
            &[&machines::ek_id(ek_sha256)],
        )
        .await?
        .is_some();
    let ca: Option<String> = match ek_ca {
        None => None,
        Some(id) => db
            .query_opt(
                "SELECT id FROM machine_enrolments WHERE id = $1 AND kind = 'ek-ca' FOR SHARE",
                &[&id],
            )
            .await?
            .map(|r| r.get(0))
            .transpose()?,
    };
    match machines::admit_tokenless(ek_sha256, bound, enrolled, ca.as_deref())? {
        TokenlessJoin::Reclaim {
            node_id,
            generation,
        } => {
            let certs: Vec<Vec<u8>> = db
                .column(
                    "SELECT der FROM node_certs WHERE node_id = $1 AND der IS NOT NULL",
                    &[&node_id],
                )
                .await?;
            if !certs.iter().any(|der| proves(&node_id, der)) {
                fleet_event(
                    db,
                    now,
                    machines::EK_BINDING_FORGED,
                    &node_id,
                    machines::EK_BINDING_FORGED_DETAIL,
                )
                .await?;
                return Ok(Enrolled::Forged { node_id });
            }
            if watch_reattest(db, &node_id, boot_id, now).await? {
                quarantine_node(db, &node_id, now, seal, clones::reattest_quarantine_detail)
                    .await?;
                return Ok(Enrolled::Quarantined { node_id });
            }
            reenrol_node(
                db,
                j,
                &node_id,
                generation,
                now,
                issue,
                seal,
                reattest_detail,
            )
            .await
            .map(Enrolled::Joined)
        }
        TokenlessJoin::NewNode { admitted_by } => {
            let j = JoinInput {
                token_id: admitted_by,
                ..j.clone()
            };
            let joined = new_node(db, &j, now, issue, Some(ek_sha256), Spend::Done).await?;
            watch_reattest(db, &joined.node_id, boot_id, now).await?;
            Ok(Enrolled::Joined(joined))
        }
    }
}

/// The clone watch's part of a join with no token (`crate::clones`, keyed
/// by the node; the node's row is locked): records the boot id, publishes
/// a takeover of a connected session from another boot; true when the
/// alternations call for quarantine. A join with no boot id is not watched.
async fn watch_reattest(
    db: &impl Db,
    node_id: &NodeId,
    boot_id: &str,
    now: i64,
) -> Result<bool, TxError> {
    if boot_id.is_empty() {
        return Ok(false);
    }
    let sightings: Vec<(String, i64)> = db
        .query(
            "SELECT boot_id, at FROM ek_sightings WHERE node_id = $1 ORDER BY id",
            &[&node_id],
        )
        .await?
        .iter()
        .map(|r| Ok((r.get(0)?, r.get(1)?)))
        .collect::<Result<_, StoreError>>()?;
    let connected: Option<String> = db
        .query_opt(
            "SELECT boot_id FROM node_sessions WHERE node_id = $1 AND state = 'connected'",
            &[&node_id],
        )
        .await?
        .map(|r| r.get(0))
        .transpose()?;
    let v = clones::judge(&sightings, connected.as_deref(), boot_id, now);
    if v.record {
        db.execute(
            "INSERT INTO ek_sightings (node_id, boot_id, at) VALUES ($1, $2, $3)",
            &[&node_id, &boot_id, &now],
        )
        .await?;
        db.execute(
            "DELETE FROM ek_sightings WHERE node_id = $1 AND at < $2",
            &[&node_id, &(now - clones::CLONE_WINDOW_MS)],
        )
        .await?;
    }
    if v.takeover {
        fleet_event(
            db,
            now,
            clones::DUPLICATE_SESSION,
            node_id,
            &clones::reattest_takeover_detail(boot_id, connected.as_deref().unwrap_or_default()),
        )
        .await?;
    }
    Ok(v.quarantine())
}

/// The live node bound to the EK `ek_sha256`, locked as a re-enrolment
/// locks the node it proves. Two first joins of one EK at once: the
/// second waits for the first and then finds its node (a row lock cannot
/// hold a row not yet there), by an advisory lock on the EK's hash held
/// to the end of the transaction (SQLite's one writer orders them).
async fn bound_node(db: &impl Db, ek_sha256: &str) -> Result<Option<BoundNode>, TxError> {
    if db.dialect() == Dialect::Postgres {
        db.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&ek_sha256],
        )
        .await?;
    }
    Ok(db
        .query_opt(
            "SELECT id, identity_generation, quarantined_at IS NOT NULL FROM nodes
             WHERE ek_sha256 = $1 AND deleted_at IS NULL FOR UPDATE",
            &[&ek_sha256],
        )
        .await?
        .map(|r| {
            Ok::<_, StoreError>(BoundNode {
                node_id: r.get(0)?,
                generation: r.get(1)?,
                quarantined: r.get(2)?,
            })
        })
        .transpose()?)
}
