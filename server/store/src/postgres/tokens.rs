//! Join tokens and operator credentials.

use super::Pg;
use super::{Params, Tx, execute, ms, now, pipeline, query, query_one, query_opt};
use crate::sql::inventory::{INSERT_MAC, record_macs};
use crate::sql::nodes::{quarantine_node, revoke_all};

use crate::clones;
use crate::error::{StoreError, TxError};
use crate::machines::{self, BoundNode, Enrolled, TokenlessJoin};
use crate::nodes::{REENROLLED, SealStatement};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewOperator, NewToken, OPERATOR_COLUMNS, OperatorRow,
    PreviousProof, ProvenNode, REENROLLED_EVENT, SealRevocation, TOKEN_INFO_COLUMNS, TokenInfo,
    TokenRow, admit, judge_proof, new_node_id, no_operator, operator_exists, operator_role,
    reattest_detail, reclaim_detail, reenrol_detail,
};
use tokio_postgres::types::ToSql;

pub(super) async fn add_operator(tx: &Tx<'_>, o: &NewOperator) -> Result<(), TxError> {
    let taken: bool = query_one(
        tx,
        "SELECT EXISTS (SELECT 1 FROM operators WHERE id = $1)",
        &[&o.id],
    )
    .await?
    .get(0);
    if taken {
        return Err(operator_exists(&o.id).into());
    }
    execute(
        tx,
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

fn operator_row(r: &tokio_postgres::Row) -> Result<OperatorRow, StoreError> {
    Ok(OperatorRow {
        id: r.get(0),
        role: operator_role(r.get(1))?,
        cert_sha256: r.get(2),
        cert_serial: r.get(3),
        created_at: r.get(4),
        not_after: r.get(5),
        revoked_at: r.get(6),
        revocation: r.get(7),
    })
}

pub(super) async fn list_operators(tx: &Tx<'_>) -> Result<Vec<OperatorRow>, StoreError> {
    query(
        tx,
        &format!("SELECT {OPERATOR_COLUMNS} FROM operators ORDER BY created_at, id"),
        &[],
    )
    .await?
    .iter()
    .map(operator_row)
    .collect()
}

pub(super) async fn operator_by_cert(
    tx: &Tx<'_>,
    cert_sha256: &str,
) -> Result<Option<OperatorRow>, StoreError> {
    query_opt(
        tx,
        &format!("SELECT {OPERATOR_COLUMNS} FROM operators WHERE cert_sha256 = $1"),
        &[&cert_sha256],
    )
    .await?
    .as_ref()
    .map(operator_row)
    .transpose()
}

pub(super) async fn revoke_operator(
    tx: &Tx<'_>,
    id: &str,
    seal: SealRevocation,
) -> Result<OperatorRow, TxError> {
    let row = query_opt(
        tx,
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
        None => query_one(tx, "SELECT compute_now()", &[]).await?.get(0),
    };
    let revocation = seal(&row, now);
    execute(
        tx,
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

pub(super) async fn create_token(tx: &Tx<'_>, t: &NewToken) -> Result<i64, StoreError> {
    Ok(query_one(
        tx,
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total, uses_left, description, pool)
         VALUES ($1, $2, compute_now(), compute_now() + $3, $4, $4, $5, $6) RETURNING expires_at",
        &[&t.id, &t.secret_sha256, &ms(t.ttl), &i64::from(t.uses), &t.description, &t.pool],
    )
    .await?
    .get(0))
}

fn token_info(r: &tokio_postgres::Row) -> TokenInfo {
    TokenInfo {
        id: r.get(0),
        created_at_ms: r.get(1),
        expires_at_ms: r.get(2),
        uses_total: r.get(3),
        uses_left: r.get(4),
        description: r.get(5),
        pool: r.get(6),
        minted_for_mac: r.get(7),
    }
}

pub(super) async fn list_tokens(tx: &Tx<'_>, all: bool) -> Result<Vec<TokenInfo>, StoreError> {
    Ok(query(
        tx,
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
    .collect())
}

pub(super) async fn revoke_token(tx: &Tx<'_>, id: &str) -> Result<Option<TokenInfo>, StoreError> {
    Ok(query_opt(
        tx,
        &format!(
            "UPDATE join_tokens SET expires_at = LEAST(expires_at, compute_now() - 1)
             WHERE id = $1 RETURNING {TOKEN_INFO_COLUMNS}"
        ),
        &[&id],
    )
    .await?
    .as_ref()
    .map(token_info))
}

/// Checks the token (`admit`), locking its row; the caller spends it.
async fn check_token(tx: &Tx<'_>, j: &JoinInput, now: i64) -> Result<(), TxError> {
    // Locked: two joins with one token spend two uses, one after the other.
    let token = query_opt(
        tx,
        "SELECT secret_sha256, expires_at, uses_left FROM join_tokens WHERE id = $1 FOR UPDATE",
        &[&j.token_id],
    )
    .await?
    .map(|r| TokenRow {
        secret_sha256: r.get(0),
        expires_at_ms: r.get(1),
        uses_left: r.get(2),
    });
    admit(token.as_ref(), &j.secret_sha256, now)?;
    Ok(())
}

const SPEND_TOKEN: &str = "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = $1";

async fn spend_token(tx: &Tx<'_>, token_id: &str) -> Result<(), tokio_postgres::Error> {
    execute(tx, SPEND_TOKEN, &[&token_id]).await?;
    Ok(())
}

pub(super) async fn join(tx: &Tx<'_>, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
    let now = now(tx).await?;
    check_token(tx, j, now).await?;
    new_node(tx, j, now, issue, None, Spend::Token).await
}

/// A MAC address `$1` that node `$2` reported at `$3`; one another node
/// reported before names this node now.
/// Whether [`new_node`] spends the join's token, or its caller did (or
/// there is none: a machine enrolled by its EK has no token).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spend {
    Token,
    Done,
}

/// Creates a node (bound to the EK `ek_sha256`, if any) with the
/// certificate `issue` builds, spending the token first if `spend` says
/// so. Its writes go in one pipelined batch: a join holds its token's
/// row locked from the check to the commit, and every join with that
/// token waits for it.
async fn new_node(
    tx: &Tx<'_>,
    j: &JoinInput,
    now: i64,
    issue: IssueCert,
    ek_sha256: Option<&str>,
    spend: Spend,
) -> Result<Joined, TxError> {
    let node_id = new_node_id();
    let cert = issue(&node_id, now)?;
    let mut batch: Vec<(&str, Params<'_>)> = Vec::new();
    let token = [&j.token_id as &(dyn ToSql + Sync)];
    if spend == Spend::Token {
        batch.push((SPEND_TOKEN, &token));
    }
    let node = [
        &node_id as &(dyn ToSql + Sync),
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
    let macs: Vec<[&(dyn ToSql + Sync); 3]> = j
        .macs
        .iter()
        .map(|m| [m as _, &node_id as _, &now as _])
        .collect();
    for m in &macs {
        batch.push((INSERT_MAC, m));
    }
    let certificate = [
        &cert.serial as &(dyn ToSql + Sync),
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
    pipeline(tx, &batch).await?;
    Ok(Joined::new_node(node_id, cert, now))
}

pub(super) async fn reenrol(
    tx: &Tx<'_>,
    j: &JoinInput,
    proof: &PreviousProof,
    issue: IssueCert,
    seal: SealStatement,
) -> Result<Joined, TxError> {
    let now = now(tx).await?;
    check_token(tx, j, now).await?;
    let node_id = proof.node_id.as_str();
    // Locked (after the token, as every join locks): of two re-enrolments
    // of one node the second reads what the first left, its proof's
    // certificate revoked.
    let node = query_opt(
        tx,
        "SELECT deleted_at IS NOT NULL, identity_generation FROM nodes WHERE id = $1 FOR UPDATE",
        &[&node_id],
    )
    .await?
    .map(|r| ProvenNode {
        deleted: r.get(0),
        identity_generation: r.get(1),
    });
    // Unrevoked, expired or not: a machine offline past its certificate's
    // end still holds the node's key.
    let certs: Vec<Vec<u8>> = query(
        tx,
        "SELECT der FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL
         AND der IS NOT NULL ORDER BY not_after DESC",
        &[&node_id],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let generation = judge_proof(node.as_ref(), &certs, proof)?;
    spend_token(tx, &j.token_id).await?;
    reenrol_node(tx, j, node_id, generation, now, issue, seal, reenrol_detail).await
}

/// Joins the machine whose EK has `ek_sha256` with a token: the node
/// bound to that EK again, at its next identity generation with its
/// earlier certificates revoked, or a new node bound to it.
pub(super) async fn join_attested(
    tx: &Tx<'_>,
    j: &JoinInput,
    ek_sha256: &str,
    issue: IssueCert,
    seal: SealStatement,
) -> Result<Joined, TxError> {
    let now = now(tx).await?;
    check_token(tx, j, now).await?;
    // Locked after the token, as every join locks.
    let bound = bound_node(tx, ek_sha256).await?;
    spend_token(tx, &j.token_id).await?;
    match bound {
        None => new_node(tx, j, now, issue, Some(ek_sha256), Spend::Done).await,
        Some(BoundNode {
            node_id,
            generation,
            ..
        }) => {
            let generation = generation.max(0) as u64 + 1;
            // An operator's join with a token ends a quarantine, and the
            // clone watch starts over.
            execute(
                tx,
                "UPDATE nodes SET quarantined_at = NULL WHERE id = $1",
                &[&node_id],
            )
            .await?;
            execute(
                tx,
                "DELETE FROM ek_sightings WHERE node_id = $1",
                &[&node_id],
            )
            .await?;
            reenrol_node(
                tx,
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
    tx: &Tx<'_>,
    j: &JoinInput,
    node_id: &str,
    generation: u64,
    now: i64,
    issue: IssueCert,
    seal: SealStatement,
    detail: fn(u64, &[String], &str) -> String,
) -> Result<Joined, TxError> {
    let cert = issue(node_id, now)?;
    let serials = revoke_all(&Pg(tx), node_id, now, REENROLLED, seal).await?;
    let generation_col = generation as i64;
    execute(
        tx,
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
    record_macs(&Pg(tx), node_id, &j.macs, now).await?;
    execute(
        tx,
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
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
    super::fleet_event(
        tx,
        now,
        REENROLLED_EVENT,
        node_id,
        &detail(generation, &serials, &j.token_id),
    )
    .await?;
    let (command_seq_floor, spec_generation_floor) =
        crate::sql::nodes::floors(&Pg(tx), node_id).await?;
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
#[allow(clippy::too_many_arguments)]
pub(super) async fn join_enrolled(
    tx: &Tx<'_>,
    j: &JoinInput,
    ek_sha256: &str,
    ek_ca: Option<&str>,
    boot_id: &str,
    (issue, seal): (IssueCert, SealStatement),
    proves: machines::ProvesMachine,
) -> Result<Enrolled, TxError> {
    let now = now(tx).await?;
    let bound = bound_node(tx, ek_sha256).await?;
    // FOR SHARE: an enrolment removed meanwhile waits for this join.
    let enrolled = query_opt(
        tx,
        "SELECT 1 FROM machine_enrolments WHERE id = $1 FOR SHARE",
        &[&machines::ek_id(ek_sha256)],
    )
    .await?
    .is_some();
    let ca: Option<String> = match ek_ca {
        None => None,
        Some(id) => query_opt(
            tx,
            "SELECT id FROM machine_enrolments WHERE id = $1 AND kind = 'ek-ca' FOR SHARE",
            &[&id],
        )
        .await?
        .map(|r| r.get(0)),
    };
    match machines::admit_tokenless(ek_sha256, bound, enrolled, ca.as_deref())? {
        TokenlessJoin::Reclaim {
            node_id,
            generation,
        } => {
            let certs: Vec<Vec<u8>> = query(
                tx,
                "SELECT der FROM node_certs WHERE node_id = $1 AND der IS NOT NULL",
                &[&node_id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
            if !certs.iter().any(|der| proves(&node_id, der)) {
                super::fleet_event(
                    tx,
                    now,
                    machines::EK_BINDING_FORGED,
                    &node_id,
                    machines::EK_BINDING_FORGED_DETAIL,
                )
                .await?;
                return Ok(Enrolled::Forged { node_id });
            }
            if watch_reattest(tx, &node_id, boot_id, now).await? {
                quarantine_node(
                    &Pg(tx),
                    &node_id,
                    now,
                    seal,
                    clones::reattest_quarantine_detail,
                )
                .await?;
                return Ok(Enrolled::Quarantined { node_id });
            }
            reenrol_node(
                tx,
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
            let joined = new_node(tx, &j, now, issue, Some(ek_sha256), Spend::Done).await?;
            watch_reattest(tx, &joined.node_id, boot_id, now).await?;
            Ok(Enrolled::Joined(joined))
        }
    }
}

/// The clone watch's part of a join with no token (`crate::clones`, keyed
/// by the node; the node's row is locked): records the boot id, publishes
/// a takeover of a connected session from another boot; true when the
/// alternations call for quarantine. A join with no boot id is not watched.
async fn watch_reattest(
    tx: &Tx<'_>,
    node_id: &str,
    boot_id: &str,
    now: i64,
) -> Result<bool, TxError> {
    if boot_id.is_empty() {
        return Ok(false);
    }
    let sightings: Vec<(String, i64)> = query(
        tx,
        "SELECT boot_id, at FROM ek_sightings WHERE node_id = $1 ORDER BY id",
        &[&node_id],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let connected: Option<String> = query_opt(
        tx,
        "SELECT boot_id FROM node_sessions WHERE node_id = $1 AND state = 'connected'",
        &[&node_id],
    )
    .await?
    .map(|r| r.get(0));
    let v = clones::judge(&sightings, connected.as_deref(), boot_id, now);
    if v.record {
        execute(
            tx,
            "INSERT INTO ek_sightings (node_id, boot_id, at) VALUES ($1, $2, $3)",
            &[&node_id, &boot_id, &now],
        )
        .await?;
        execute(
            tx,
            "DELETE FROM ek_sightings WHERE node_id = $1 AND at < $2",
            &[&node_id, &(now - clones::CLONE_WINDOW_MS)],
        )
        .await?;
    }
    if v.takeover {
        super::fleet_event(
            tx,
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
/// to the end of the transaction.
async fn bound_node(tx: &Tx<'_>, ek_sha256: &str) -> Result<Option<BoundNode>, TxError> {
    execute(
        tx,
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&ek_sha256],
    )
    .await?;
    Ok(query_opt(
        tx,
        "SELECT id, identity_generation, quarantined_at IS NOT NULL FROM nodes
         WHERE ek_sha256 = $1 AND deleted_at IS NULL FOR UPDATE",
        &[&ek_sha256],
    )
    .await?
    .map(|r| BoundNode {
        node_id: r.get(0),
        generation: r.get(1),
        quarantined: r.get(2),
    }))
}
