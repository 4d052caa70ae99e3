//! Join tokens and operator credentials.

use super::{Tx, execute, ms, now, query, query_one, query_opt};
use crate::error::{StoreError, TxError};
use crate::nodes::{REENROLLED, SealStatement, StatementKind, StatementSeal};
use crate::tokens::{
    IssueCert, JoinInput, Joined, NewToken, PreviousProof, ProvenNode, REENROLLED_EVENT, TokenRow,
    admit, judge_proof, new_node_id, reenrol_detail,
};

pub(super) async fn add_operator(
    tx: &Tx<'_>,
    id: &str,
    token_sha256: &str,
) -> Result<(), StoreError> {
    execute(
        tx,
        "INSERT INTO operators (id, token_sha256, created_at) VALUES ($1, $2, compute_now())",
        &[&id, &token_sha256],
    )
    .await?;
    Ok(())
}

pub(super) async fn operator_by_token(
    tx: &Tx<'_>,
    token_sha256: &str,
) -> Result<Option<String>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT id FROM operators WHERE token_sha256 = $1",
        &[&token_sha256],
    )
    .await?
    .map(|r| r.get(0)))
}

pub(super) async fn create_token(tx: &Tx<'_>, t: &NewToken) -> Result<i64, StoreError> {
    Ok(query_one(
        tx,
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total, uses_left, description)
         VALUES ($1, $2, compute_now(), compute_now() + $3, $4, $4, $5) RETURNING expires_at",
        &[&t.id, &t.secret_sha256, &ms(t.ttl), &i64::from(t.uses), &t.description],
    )
    .await?
    .get(0))
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

async fn spend_token(tx: &Tx<'_>, token_id: &str) -> Result<(), tokio_postgres::Error> {
    execute(
        tx,
        "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = $1",
        &[&token_id],
    )
    .await?;
    Ok(())
}

pub(super) async fn join(tx: &Tx<'_>, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
    let now = now(tx).await?;
    check_token(tx, j, now).await?;
    spend_token(tx, &j.token_id).await?;
    let node_id = new_node_id();
    let cert = issue(&node_id, now)?;
    execute(
        tx,
        "INSERT INTO nodes (id, hostname, created_at, identity_generation, ramdisk, join_token)
         VALUES ($1, $2, $3, 1, $4, $5)",
        &[&node_id, &j.hostname, &now, &j.ramdisk, &j.token_id],
    )
    .await?;
    execute(
        tx,
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES ($1, $2, $3, 1, $4, $5, $6)",
        &[
            &cert.serial,
            &node_id,
            &cert.fingerprint,
            &cert.not_before_ms,
            &cert.not_after_ms,
            &cert.der,
        ],
    )
    .await?;
    let (command_seq_floor, spec_generation_floor) = super::nodes::floors(tx, &node_id).await?;
    Ok(Joined {
        node_id,
        cert,
        now_ms: now,
        command_seq_floor,
        spec_generation_floor,
        identity_generation: 1,
    })
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
    let cert = issue(node_id, now)?;
    let serials: Vec<String> = query(
        tx,
        "SELECT serial FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL ORDER BY serial",
        &[&node_id],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let statement = seal(&StatementSeal {
        node_id: node_id.to_string(),
        kind: StatementKind::Revoked,
        serials: serials.clone(),
        reason: REENROLLED.to_string(),
        issued_at_ms: now,
    });
    execute(
        tx,
        "UPDATE node_certs SET revoked_at = $2, revoke_reason = $3, statement = $4
         WHERE node_id = $1 AND revoked_at IS NULL",
        &[&node_id, &now, &REENROLLED, &statement],
    )
    .await?;
    let generation_col = generation as i64;
    execute(
        tx,
        "UPDATE nodes SET identity_generation = $2, hostname = $3, ramdisk = $4 WHERE id = $1",
        &[&node_id, &generation_col, &j.hostname, &j.ramdisk],
    )
    .await?;
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
    super::bindings::fleet_event(
        tx,
        now,
        REENROLLED_EVENT,
        node_id,
        &reenrol_detail(generation, &serials, &j.token_id),
    )
    .await?;
    let (command_seq_floor, spec_generation_floor) = super::nodes::floors(tx, node_id).await?;
    Ok(Joined {
        node_id: node_id.to_string(),
        cert,
        now_ms: now,
        command_seq_floor,
        spec_generation_floor,
        identity_generation: generation,
    })
}
