//! The key holder's part of the clone watch (see [`crate::clones`]): the
//! certificates superseded and cloned identities quarantined.

use super::bindings::fleet_event;
use super::nodes::quarantine_node;
use super::{Db, List, Row, in_list};
use crate::clones;
use crate::error::{StoreError, TxError};
use crate::id::NodeId;
use crate::nodes::{SUPERSEDED, SealStatement};
use crate::sessions::Sighting;

const SIGHTING: &str = "SELECT s.id, s.serial, c.node_id, s.boot_id, s.at, s.seq,
         s.proof, s.proof_signature
     FROM cert_sightings s JOIN node_certs c ON c.serial = s.serial";

fn sighting(r: &Row) -> Result<Sighting, StoreError> {
    Ok(Sighting {
        id: r.get(0)?,
        serial: r.get(1)?,
        node_id: r.get(2)?,
        boot_id: r.get(3)?,
        at_ms: r.get(4)?,
        seq: r.get::<i64>(5)? as u64,
        proof: r.get::<Option<Vec<u8>>>(6)?.unwrap_or_default(),
        proof_signature: r.get::<Option<Vec<u8>>>(7)?.unwrap_or_default(),
    })
}

pub(crate) async fn unwatched(db: &impl Db, limit: u32) -> Result<Vec<Sighting>, StoreError> {
    let rows = db
        .query(
            &format!("{SIGHTING} WHERE NOT s.watched ORDER BY s.id LIMIT $1"),
            &[&i64::from(limit)],
        )
        .await?;
    rows.iter().map(sighting).collect()
}

pub(crate) async fn mark_watched(db: &impl Db, ids: &[i64]) -> Result<(), StoreError> {
    db.execute(
        &format!(
            "UPDATE cert_sightings SET watched = TRUE WHERE {}",
            in_list(db.dialect(), "id", 1)
        ),
        &[&List(ids.to_vec())],
    )
    .await?;
    Ok(())
}

pub(crate) async fn of(
    db: &impl Db,
    serial: &str,
    since_ms: i64,
) -> Result<Vec<Sighting>, StoreError> {
    let rows = db
        .query(
            &format!("{SIGHTING} WHERE s.serial = $1 AND s.at >= $2 ORDER BY s.id"),
            &[&serial, &since_ms],
        )
        .await?;
    rows.iter().map(sighting).collect()
}

pub(crate) async fn drop_forged(
    db: &impl Db,
    forged: &[(Sighting, String)],
) -> Result<(), StoreError> {
    let at = db.now().await?;
    for (s, why) in forged {
        let gone = db
            .execute("DELETE FROM cert_sightings WHERE id = $1", &[&s.id])
            .await?;
        if gone > 0 {
            fleet_event(
                db,
                at,
                clones::FORGED_SIGHTING,
                &s.node_id,
                &clones::forged_detail(s, why),
            )
            .await?;
        }
    }
    Ok(())
}

/// Marks a node as sending proofs with its Hellos, from now on: only while
/// the certificate is still valid, so a proof read after a re-enrolment
/// does not set the mark for the new identity.
pub(crate) async fn require_hello_proofs(
    db: &impl Db,
    node_id: &NodeId,
    serial: &str,
) -> Result<bool, StoreError> {
    let at = db.now().await?;
    let set = db
        .execute(
            "UPDATE nodes SET hello_proofs_since = $3
         WHERE id = $1 AND hello_proofs_since IS NULL
           AND EXISTS (SELECT 1 FROM node_certs
                       WHERE serial = $2 AND node_id = $1 AND revoked_at IS NULL)",
            &[&node_id, &serial, &at],
        )
        .await?;
    Ok(set > 0)
}

pub(crate) async fn supersede(
    db: &impl Db,
    node_id: &NodeId,
    serial: &str,
) -> Result<Vec<String>, StoreError> {
    let at = db.now().await?;
    let Some(row) = db
        .query_opt(
            "SELECT not_before FROM node_certs WHERE serial = $1 AND node_id = $2",
            &[&serial, &node_id],
        )
        .await?
    else {
        return Ok(vec![]);
    };
    let not_before: i64 = row.get(0)?;
    let rows = db
        .query(
            "UPDATE node_certs SET revoked_at = $4, revoke_reason = $5
         WHERE node_id = $1 AND revoked_at IS NULL AND serial != $2 AND not_before <= $3
         RETURNING serial",
            &[&node_id, &serial, &not_before, &at, &SUPERSEDED],
        )
        .await?;
    let mut serials: Vec<String> = rows.iter().map(|r| r.get(0)).collect::<Result<_, _>>()?;
    serials.sort();
    Ok(serials)
}

pub(crate) async fn quarantine(
    db: &impl Db,
    node_id: &NodeId,
    serial: &str,
    alternations: u32,
    seal: SealStatement,
) -> Result<bool, TxError> {
    let at = db.now().await?;
    let already: bool = db
        .query_one(
            "SELECT quarantined_at IS NOT NULL FROM nodes WHERE id = $1 FOR UPDATE",
            &[&node_id],
        )
        .await?
        .get(0)?;
    if already {
        return Ok(false);
    }
    quarantine_node(db, node_id, at, seal, |revoked| {
        clones::quarantine_detail(serial, alternations, revoked)
    })
    .await?;
    Ok(true)
}
