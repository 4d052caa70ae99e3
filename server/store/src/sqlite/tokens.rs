//! Join tokens and operator credentials.

use rusqlite::{Connection, OptionalExtension, params};

use super::{ms, now};
use crate::error::{StoreError, TxError};
use crate::tokens::{IssueCert, JoinInput, Joined, NewToken, TokenRow, admit, new_node_id};

pub(super) fn add_operator(c: &Connection, id: &str, token_sha256: &str) -> Result<(), StoreError> {
    c.execute(
        "INSERT INTO operators (id, token_sha256, created_at) VALUES (?1, ?2, compute_now())",
        params![id, token_sha256],
    )?;
    Ok(())
}

pub(super) fn operator_by_token(
    c: &Connection,
    token_sha256: &str,
) -> Result<Option<String>, StoreError> {
    Ok(c.query_row(
        "SELECT id FROM operators WHERE token_sha256 = ?1",
        [token_sha256],
        |r| r.get(0),
    )
    .optional()?)
}

pub(super) fn create_token(c: &Connection, t: &NewToken) -> Result<i64, StoreError> {
    Ok(c.query_row(
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total, uses_left, description)
         VALUES (?1, ?2, compute_now(), compute_now() + ?3, ?4, ?4, ?5) RETURNING expires_at",
        params![t.id, t.secret_sha256, ms(t.ttl), t.uses, t.description],
        |r| r.get(0),
    )?)
}

pub(super) fn join(c: &Connection, j: &JoinInput, issue: IssueCert) -> Result<Joined, TxError> {
    let now = now(c)?;
    let token: Option<TokenRow> = c
        .query_row(
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
    c.execute(
        "UPDATE join_tokens SET uses_left = uses_left - 1 WHERE id = ?1",
        [&j.token_id],
    )?;
    let node_id = new_node_id();
    let cert = issue(&node_id, now)?;
    c.execute(
        "INSERT INTO nodes (id, hostname, created_at, identity_generation, ramdisk, join_token)
         VALUES (?1, ?2, ?3, 1, ?4, ?5)",
        params![node_id, j.hostname, now, j.ramdisk, j.token_id],
    )?;
    c.execute(
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
    let (command_seq_floor, spec_generation_floor) = super::nodes::floors(c, &node_id)?;
    Ok(Joined {
        node_id,
        cert,
        now_ms: now,
        command_seq_floor,
        spec_generation_floor,
    })
}
