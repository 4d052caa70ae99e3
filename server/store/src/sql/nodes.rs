//! Nodes and their certificates.

use super::bindings::fleet_event;
use super::{Db, Row};
use crate::clones;
use crate::error::{StoreError, TxError};
use crate::id::NodeId;
use crate::nodes::{
    CertRow, NODE_DELETED, NodeList, NodeRow, RenewCert, Revocation, SealStatement, StatementKind,
    StatementSeal, ValidCert, check_cert as check, check_renewable,
};
use crate::tokens::Joined;

/// The DER of `node_id`'s certificates valid at `now`, newest first: the
/// keys a fact the node signed is checked against.
pub(crate) async fn valid_certs(
    db: &impl Db,
    node_id: &NodeId,
    now: i64,
) -> Result<Vec<Vec<u8>>, StoreError> {
    db.column(
        "SELECT der FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL
         AND not_after >= $2 AND der IS NOT NULL ORDER BY not_after DESC",
        &[&node_id, &now],
    )
    .await
}

/// The replay floors the store knows for a node: the highest sequence it
/// dispatched and its spec generation.
pub(crate) async fn floors(db: &impl Db, node_id: &NodeId) -> Result<(u64, u64), StoreError> {
    let seq: Option<i64> = db
        .query_one(
            "SELECT MAX(seq) FROM commands WHERE node_id = $1 AND state <> 'pending'",
            &[&node_id],
        )
        .await?
        .get(0)?;
    let generation: Option<i64> = db
        .query_opt(
            "SELECT generation FROM node_specs WHERE node_id = $1",
            &[&node_id],
        )
        .await?
        .map(|r| r.get(0))
        .transpose()?;
    Ok((
        seq.unwrap_or(0).max(0) as u64,
        generation.unwrap_or(0).max(0) as u64,
    ))
}

/// The certificate with fingerprint `$1`, with its node's deletion time
/// (read by [`cert_from_row`]).
pub(crate) const CERT_ROW: &str =
    "SELECT c.node_id, c.serial, c.revoked_at, c.revoke_reason, c.not_after, n.deleted_at,
            c.statement
     FROM node_certs c JOIN nodes n ON n.id = c.node_id
     WHERE c.fingerprint = $1";

pub(crate) fn cert_from_row(r: &Row) -> Result<CertRow, StoreError> {
    Ok(CertRow {
        node_id: r.get(0)?,
        serial: r.get(1)?,
        revoked_at_ms: r.get(2)?,
        revoke_reason: r.get(3)?,
        not_after_ms: r.get(4)?,
        node_deleted_at_ms: r.get(5)?,
        statement: r.get(6)?,
    })
}

/// The certificate with `fingerprint`, with its node's deletion time.
pub(crate) async fn cert_row(
    db: &impl Db,
    fingerprint: &str,
) -> Result<Option<CertRow>, StoreError> {
    db.query_opt(CERT_ROW, &[&fingerprint])
        .await?
        .as_ref()
        .map(cert_from_row)
        .transpose()
}

/// A node's certificates (DER), in serial order (serials are random: no
/// order in time); those kept without their bytes are left out.
pub(crate) async fn certificates(
    db: &impl Db,
    node_id: &NodeId,
) -> Result<Vec<Vec<u8>>, StoreError> {
    db.column(
        "SELECT der FROM node_certs WHERE node_id = $1 AND der IS NOT NULL ORDER BY serial",
        &[&node_id],
    )
    .await
}

pub(crate) async fn check_cert(db: &impl Db, fingerprint: &str) -> Result<ValidCert, TxError> {
    let row = cert_row(db, fingerprint).await?;
    Ok(check(row, db.now().await?)?)
}

pub(crate) async fn renew(
    db: &impl Db,
    fingerprint: &str,
    issue: RenewCert,
    expired_grace_ms: i64,
) -> Result<Joined, TxError> {
    let now = db.now().await?;
    let valid = check_renewable(cert_row(db, fingerprint).await?, now, expired_grace_ms)?;
    let r = db
        .query_one(
            "SELECT ramdisk, identity_generation FROM nodes WHERE id = $1",
            &[&valid.node_id],
        )
        .await?;
    let (ramdisk, generation): (bool, i64) = (r.get(0)?, r.get(1)?);
    let cert = issue(&valid.node_id, now, ramdisk)?;
    db.execute("INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, not_after, der)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &cert.serial,
            &valid.node_id,
            &cert.fingerprint,
            &generation,
            &cert.not_before_ms,
            &cert.not_after_ms,
            &cert.der,
        ],
    )
    .await?;
    let (command_seq_floor, spec_generation_floor) = floors(db, &valid.node_id).await?;
    Ok(Joined {
        node_id: valid.node_id,
        cert,
        now_ms: now,
        command_seq_floor,
        spec_generation_floor,
        identity_generation: generation.max(0) as u64,
    })
}

pub(crate) async fn revoked_since(
    db: &impl Db,
    since_ms: i64,
) -> Result<Vec<Revocation>, StoreError> {
    db.query(
        "SELECT serial, node_id, COALESCE(revoke_reason, ''), revoked_at, statement FROM node_certs
         WHERE revoked_at IS NOT NULL AND revoked_at >= $1 ORDER BY revoked_at",
        &[&since_ms],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Revocation {
            serial: r.get(0)?,
            node_id: r.get(1)?,
            reason: r.get(2)?,
            at_ms: r.get(3)?,
            statement: r.get(4)?,
        })
    })
    .collect()
}

pub(crate) async fn list_nodes(db: &impl Db) -> Result<NodeList, StoreError> {
    nodes_matching(db, None).await
}

/// Every live node, or the one named.
pub(crate) async fn nodes_matching(
    db: &impl Db,
    only: Option<&str>,
) -> Result<NodeList, StoreError> {
    let now = db.now().await?;
    let rows = db
        .query(
            "SELECT n.id, n.hostname, COALESCE(s.state, 'disconnected'), COALESCE(s.epoch, 0),
                COALESCE(s.gateway_id, ''),
                (SELECT MAX(c.not_after) FROM node_certs c
                   WHERE c.node_id = n.id AND c.revoked_at IS NULL),
                COALESCE(s.last_seen, n.created_at), COALESCE(s.boot_id, ''),
                COALESCE(s.journal_id, ''), COALESCE(s.incarnation_id, ''),
                n.agent_version, n.conditions, n.taints, n.release_floor, n.pool,
                n.ek_sha256
         FROM nodes n LEFT JOIN node_sessions s ON s.node_id = n.id
         WHERE n.deleted_at IS NULL AND (CAST($1 AS TEXT) IS NULL OR n.id = $1) ORDER BY n.id",
            &[&only],
        )
        .await?;
    let mut macs = std::collections::HashMap::<String, Vec<String>>::new();
    for r in db
        .query(
            "SELECT node_id, mac FROM node_macs WHERE CAST($1 AS TEXT) IS NULL OR node_id = $1
         ORDER BY node_id, mac",
            &[&only],
        )
        .await?
    {
        macs.entry(r.get(0)?).or_default().push(r.get(1)?);
    }
    let mut nodes = Vec::with_capacity(rows.len());
    for r in &rows {
        nodes.push(NodeRow {
            node_id: r.get(0)?,
            hostname: r.get(1)?,
            state: r.get(2)?,
            epoch: r.get::<i64>(3)? as u64,
            gateway_id: r.get(4)?,
            cert_not_after_ms: r.get::<Option<i64>>(5)?.unwrap_or(0),
            last_seen_age_ms: now - r.get::<i64>(6)?,
            boot_id: r.get(7)?,
            journal_id: r.get(8)?,
            incarnation_id: r.get(9)?,
            agent_version: r.get(10)?,
            conditions: r.json(11)?,
            taints: r.json(12)?,
            release_floor: r.get::<i64>(13)? as u64,
            pool: r.get(14)?,
            macs: Vec::new(),
            ek_sha256: r.get(15)?,
        });
        if let Some(m) = macs.remove(nodes[nodes.len() - 1].node_id.as_str()) {
            nodes.last_mut().expect("just pushed").macs = m;
        }
    }
    Ok(NodeList { nodes, now_ms: now })
}

pub(crate) async fn delete_node(
    db: &impl Db,
    node_id: &NodeId,
    seal: SealStatement,
) -> Result<bool, StoreError> {
    let now = db.now().await?;
    let n = db
        .execute(
            "UPDATE nodes SET deleted_at = $2 WHERE id = $1 AND deleted_at IS NULL",
            &[&node_id, &now],
        )
        .await?;
    if n == 0 {
        return Ok(false);
    }
    let serials: Vec<String> = db.column("SELECT serial FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL ORDER BY serial",
        &[&node_id],
    )
    .await?;
    // Every certificate the node ever had gets the statement: a node
    // presenting an older one is told the same.
    let statement = seal(&StatementSeal {
        node_id: NodeId::from(node_id),
        kind: StatementKind::Deleted,
        serials,
        reason: NODE_DELETED.to_string(),
        issued_at_ms: now,
    });
    db.execute(
        "UPDATE node_certs SET revoked_at = COALESCE(revoked_at, $2),
             revoke_reason = COALESCE(revoke_reason, $3), statement = $4
         WHERE node_id = $1",
        &[&node_id, &now, &NODE_DELETED, &statement],
    )
    .await?;
    Ok(true)
}

/// Quarantines `node_id` as a cloned identity: every certificate it holds
/// is revoked (the statement `seal` signs says why), and a fleet event
/// says which (`detail` words it from their serials).
pub(crate) async fn quarantine_node(
    db: &impl Db,
    node_id: &NodeId,
    now: i64,
    seal: SealStatement,
    detail: impl FnOnce(&[String]) -> String,
) -> Result<(), TxError> {
    let serials = revoke_all(db, node_id, now, clones::DUPLICATE_IDENTITY, seal).await?;
    db.execute(
        "UPDATE nodes SET quarantined_at = $2 WHERE id = $1",
        &[&node_id, &now],
    )
    .await?;
    fleet_event(db, now, clones::QUARANTINED, node_id, &detail(&serials)).await?;
    Ok(())
}

/// Revokes every certificate of `node_id` still valid, for `reason`, with
/// the statement `seal` signs; returns their serials.
pub(crate) async fn revoke_all(
    db: &impl Db,
    node_id: &NodeId,
    now: i64,
    reason: &str,
    seal: SealStatement,
) -> Result<Vec<String>, TxError> {
    let serials: Vec<String> = db
        .column(
            "SELECT serial FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL
             ORDER BY serial",
            &[&node_id],
        )
        .await?;
    let statement = seal(&StatementSeal {
        node_id: NodeId::from(node_id),
        kind: StatementKind::Revoked,
        serials: serials.clone(),
        reason: reason.to_string(),
        issued_at_ms: now,
    });
    db.execute(
        "UPDATE node_certs SET revoked_at = $2, revoke_reason = $3, statement = $4
         WHERE node_id = $1 AND revoked_at IS NULL",
        &[&node_id, &now, &reason, &statement],
    )
    .await?;
    Ok(serials)
}
