//! Nodes and their certificates.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Kept, json_col, now};
use crate::error::{StoreError, TxError};
use crate::nodes::{
    CertRow, NODE_DELETED, NodeList, NodeRow, RenewCert, Revocation, SealStatement, StatementKind,
    StatementSeal, ValidCert, check_cert as check, check_renewable,
};
use crate::tokens::Joined;

/// The DER of every certificate of `node_id` valid at `now`, newest first:
/// what a node's signed facts are verified against.
pub(super) fn valid_certs(
    c: &Connection,
    node_id: &str,
    now: i64,
) -> rusqlite::Result<Vec<Vec<u8>>> {
    c.prepare_cached(
        "SELECT der FROM node_certs WHERE node_id = ?1 AND revoked_at IS NULL
         AND not_after >= ?2 AND der IS NOT NULL ORDER BY not_after DESC",
    )?
    .query_map(params![node_id, now], |r| r.get(0))?
    .collect()
}

/// The replay floors the store knows for a node: the highest sequence it
/// dispatched and its spec generation.
pub(super) fn floors(c: &Connection, node_id: &str) -> rusqlite::Result<(u64, u64)> {
    let seq: Option<i64> = c.query_row_kept(
        "SELECT MAX(seq) FROM commands WHERE node_id = ?1 AND state != 'pending'",
        [node_id],
        |r| r.get(0),
    )?;
    let generation: Option<i64> = c
        .query_row_kept(
            "SELECT generation FROM node_specs WHERE node_id = ?1",
            [node_id],
            |r| r.get(0),
        )
        .optional()?;
    Ok((
        seq.unwrap_or(0).max(0) as u64,
        generation.unwrap_or(0).max(0) as u64,
    ))
}

/// The certificate with `fingerprint`, with its node's deletion time.
pub(super) fn cert_row(c: &Connection, fingerprint: &str) -> rusqlite::Result<Option<CertRow>> {
    c.query_row_kept(
        "SELECT c.node_id, c.serial, c.revoked_at, c.revoke_reason, c.not_after, n.deleted_at,
                c.statement
         FROM node_certs c JOIN nodes n ON n.id = c.node_id
         WHERE c.fingerprint = ?1",
        [fingerprint],
        |r| {
            Ok(CertRow {
                node_id: r.get(0)?,
                serial: r.get(1)?,
                revoked_at_ms: r.get(2)?,
                revoke_reason: r.get(3)?,
                not_after_ms: r.get(4)?,
                node_deleted_at_ms: r.get(5)?,
                statement: r.get(6)?,
            })
        },
    )
    .optional()
}

pub(super) fn check_cert(c: &Connection, fingerprint: &str) -> Result<ValidCert, TxError> {
    let row = cert_row(c, fingerprint)?;
    Ok(check(row, now(c)?)?)
}

pub(super) fn renew(
    c: &Connection,
    fingerprint: &str,
    issue: RenewCert,
    expired_grace_ms: i64,
) -> Result<Joined, TxError> {
    let now = now(c)?;
    let valid = check_renewable(cert_row(c, fingerprint)?, now, expired_grace_ms)?;
    let (ramdisk, generation): (bool, i64) = c.query_row_kept(
        "SELECT ramdisk, identity_generation FROM nodes WHERE id = ?1",
        [&valid.node_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let cert = issue(&valid.node_id, now, ramdisk)?;
    c.execute_kept(
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            cert.serial,
            valid.node_id,
            cert.fingerprint,
            generation,
            cert.not_before_ms,
            cert.not_after_ms,
            cert.der
        ],
    )?;
    let (command_seq_floor, spec_generation_floor) = floors(c, &valid.node_id)?;
    Ok(Joined {
        node_id: valid.node_id,
        cert,
        now_ms: now,
        command_seq_floor,
        spec_generation_floor,
        identity_generation: generation.max(0) as u64,
    })
}

pub(super) fn revoked_since(c: &Connection, since_ms: i64) -> Result<Vec<Revocation>, StoreError> {
    let mut q = c.prepare_cached(
        "SELECT serial, node_id, COALESCE(revoke_reason, ''), revoked_at, statement FROM node_certs
         WHERE revoked_at IS NOT NULL AND revoked_at >= ?1 ORDER BY revoked_at",
    )?;
    let rows = q
        .query_map([since_ms], |r| {
            Ok(Revocation {
                serial: r.get(0)?,
                node_id: r.get(1)?,
                reason: r.get(2)?,
                at_ms: r.get(3)?,
                statement: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn list_nodes(c: &Connection) -> Result<NodeList, StoreError> {
    nodes_matching(c, None)
}

/// Every live node, or the one named.
pub(super) fn nodes_matching(c: &Connection, only: Option<&str>) -> Result<NodeList, StoreError> {
    let now = now(c)?;
    let mut q = c.prepare_cached(
        "SELECT n.id, n.hostname, COALESCE(s.state, 'disconnected'), COALESCE(s.epoch, 0),
                COALESCE(s.gateway_id, ''),
                (SELECT MAX(c.not_after) FROM node_certs c
                   WHERE c.node_id = n.id AND c.revoked_at IS NULL),
                COALESCE(s.last_seen, n.created_at), COALESCE(s.boot_id, ''),
                COALESCE(s.journal_id, ''), COALESCE(s.incarnation_id, ''),
                n.agent_version, n.conditions, n.taints, n.release_floor, n.pool,
                n.ek_sha256
         FROM nodes n LEFT JOIN node_sessions s ON s.node_id = n.id
         WHERE n.deleted_at IS NULL AND (?1 IS NULL OR n.id = ?1) ORDER BY n.id",
    )?;
    let mut macs = std::collections::HashMap::<String, Vec<String>>::new();
    for row in c
        .prepare_cached(
            "SELECT node_id, mac FROM node_macs WHERE ?1 IS NULL OR node_id = ?1
             ORDER BY node_id, mac",
        )?
        .query_map([only], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?
    {
        let (node, mac) = row?;
        macs.entry(node).or_default().push(mac);
    }
    let nodes = q
        .query_map([only], |r| {
            Ok(NodeRow {
                node_id: r.get(0)?,
                hostname: r.get(1)?,
                state: r.get(2)?,
                epoch: r.get::<_, i64>(3)? as u64,
                gateway_id: r.get(4)?,
                cert_not_after_ms: r.get::<_, Option<i64>>(5)?.unwrap_or(0),
                last_seen_age_ms: now - r.get::<_, i64>(6)?,
                boot_id: r.get(7)?,
                journal_id: r.get(8)?,
                incarnation_id: r.get(9)?,
                agent_version: r.get(10)?,
                conditions: json_col(r, 11)?,
                taints: json_col(r, 12)?,
                release_floor: r.get::<_, i64>(13)? as u64,
                pool: r.get(14)?,
                macs: Vec::new(),
                ek_sha256: r.get(15)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let nodes = nodes
        .into_iter()
        .map(|mut n| {
            n.macs = macs.remove(&n.node_id).unwrap_or_default();
            n
        })
        .collect();
    Ok(NodeList { nodes, now_ms: now })
}

pub(super) fn delete_node(
    c: &Connection,
    node_id: &str,
    seal: SealStatement,
) -> Result<bool, StoreError> {
    let now = now(c)?;
    let n = c.execute_kept(
        "UPDATE nodes SET deleted_at = ?2 WHERE id = ?1 AND deleted_at IS NULL",
        params![node_id, now],
    )?;
    if n == 0 {
        return Ok(false);
    }
    let serials: Vec<String> = c
        .prepare("SELECT serial FROM node_certs WHERE node_id = ?1 AND revoked_at IS NULL")?
        .query_map([node_id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    // Every certificate the node ever had gets the statement: a node
    // presenting an older one is told the same.
    let statement = seal(&StatementSeal {
        node_id: node_id.to_string(),
        kind: StatementKind::Deleted,
        serials,
        reason: NODE_DELETED.to_string(),
        issued_at_ms: now,
    });
    c.execute_kept(
        "UPDATE node_certs SET revoked_at = COALESCE(revoked_at, ?2),
             revoke_reason = COALESCE(revoke_reason, ?3), statement = ?4
         WHERE node_id = ?1",
        params![node_id, now, NODE_DELETED, statement],
    )?;
    Ok(true)
}
