//! The key holder's part of the clone watch (as SQLite's; see
//! [`crate::clones`]).

use super::fleet_event;
use super::{Tx, execute, now, query, query_one, query_opt};
use crate::clones;
use crate::error::{StoreError, TxError};
use crate::nodes::{SUPERSEDED, SealStatement};
use crate::sessions::Sighting;

const SIGHTING: &str = "SELECT s.id, s.serial, c.node_id, s.boot_id, s.at, s.seq,
         COALESCE(s.proof, ''::bytea), COALESCE(s.proof_signature, ''::bytea)
     FROM cert_sightings s JOIN node_certs c ON c.serial = s.serial";

fn sighting(r: &tokio_postgres::Row) -> Sighting {
    Sighting {
        id: r.get(0),
        serial: r.get(1),
        node_id: r.get(2),
        boot_id: r.get(3),
        at_ms: r.get(4),
        seq: r.get::<_, i64>(5) as u64,
        proof: r.get(6),
        proof_signature: r.get(7),
    }
}

pub(super) async fn unwatched(tx: &Tx<'_>, limit: u32) -> Result<Vec<Sighting>, StoreError> {
    let rows = query(
        tx,
        &format!("{SIGHTING} WHERE NOT s.watched ORDER BY s.id LIMIT $1"),
        &[&i64::from(limit)],
    )
    .await?;
    Ok(rows.iter().map(sighting).collect())
}

pub(super) async fn mark_watched(tx: &Tx<'_>, ids: &[i64]) -> Result<(), StoreError> {
    execute(
        tx,
        "UPDATE cert_sightings SET watched = TRUE WHERE id = ANY($1)",
        &[&ids],
    )
    .await?;
    Ok(())
}

pub(super) async fn of(
    tx: &Tx<'_>,
    serial: &str,
    since_ms: i64,
) -> Result<Vec<Sighting>, StoreError> {
    let rows = query(
        tx,
        &format!("{SIGHTING} WHERE s.serial = $1 AND s.at >= $2 ORDER BY s.id"),
        &[&serial, &since_ms],
    )
    .await?;
    Ok(rows.iter().map(sighting).collect())
}

pub(super) async fn drop_forged(
    tx: &Tx<'_>,
    forged: &[(Sighting, String)],
) -> Result<(), StoreError> {
    let at = now(tx).await?;
    for (s, why) in forged {
        let gone = execute(tx, "DELETE FROM cert_sightings WHERE id = $1", &[&s.id]).await?;
        if gone > 0 {
            fleet_event(
                tx,
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

/// As SQLite's: only while the certificate is still valid, so a proof read
/// after a re-enrolment does not set the mark for the new identity.
pub(super) async fn require_hello_proofs(
    tx: &Tx<'_>,
    node_id: &str,
    serial: &str,
) -> Result<bool, StoreError> {
    let at = now(tx).await?;
    let set = execute(
        tx,
        "UPDATE nodes SET hello_proofs_since = $3
         WHERE id = $1 AND hello_proofs_since IS NULL
           AND EXISTS (SELECT 1 FROM node_certs
                       WHERE serial = $2 AND node_id = $1 AND revoked_at IS NULL)",
        &[&node_id, &serial, &at],
    )
    .await?;
    Ok(set > 0)
}

pub(super) async fn supersede(
    tx: &Tx<'_>,
    node_id: &str,
    serial: &str,
) -> Result<Vec<String>, StoreError> {
    let at = now(tx).await?;
    let Some(row) = query_opt(
        tx,
        "SELECT not_before FROM node_certs WHERE serial = $1 AND node_id = $2",
        &[&serial, &node_id],
    )
    .await?
    else {
        return Ok(vec![]);
    };
    let not_before: i64 = row.get(0);
    let rows = query(
        tx,
        "UPDATE node_certs SET revoked_at = $4, revoke_reason = $5
         WHERE node_id = $1 AND revoked_at IS NULL AND serial != $2 AND not_before <= $3
         RETURNING serial",
        &[&node_id, &serial, &not_before, &at, &SUPERSEDED],
    )
    .await?;
    let mut serials: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    serials.sort();
    Ok(serials)
}

pub(super) async fn quarantine(
    tx: &Tx<'_>,
    node_id: &str,
    serial: &str,
    alternations: u32,
    seal: SealStatement,
) -> Result<bool, TxError> {
    let at = now(tx).await?;
    let already: bool = query_one(
        tx,
        "SELECT quarantined_at IS NOT NULL FROM nodes WHERE id = $1 FOR UPDATE",
        &[&node_id],
    )
    .await?
    .get(0);
    if already {
        return Ok(false);
    }
    super::tokens::quarantine_node(tx, node_id, at, seal, |revoked| {
        clones::quarantine_detail(serial, alternations, revoked)
    })
    .await?;
    Ok(true)
}
