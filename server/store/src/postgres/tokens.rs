//! Join tokens and operator credentials.

use super::{Tx, execute, ms, now, query_one, query_opt};
use crate::error::{StoreError, TxError};
use crate::tokens::{IssueCert, JoinInput, Joined, NewToken, TokenRow, admit, new_node_id};

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

pub(super) async fn join(tx: &Tx<'_>, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
    let now = now(tx).await?;
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
    execute(
        tx,
        "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = $1",
        &[&j.token_id],
    )
    .await?;
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
    })
}
