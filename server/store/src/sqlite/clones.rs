//! The key holder's part of the clone watch (see [`crate::clones`]): the
//! sightings gateways recorded, read back; forged ones dropped; older
//! certificates superseded and cloned identities quarantined, each only
//! once the caller verified the proofs.

use rusqlite::{Connection, OptionalExtension, params};

use super::fleet_event;
use super::{Kept, now};
use crate::clones;
use crate::error::{StoreError, TxError};
use crate::nodes::{SUPERSEDED, SealStatement};
use crate::sessions::Sighting;

const SIGHTING: &str = "SELECT s.id, s.serial, c.node_id, s.boot_id, s.at, s.seq,
         COALESCE(s.proof, X''), COALESCE(s.proof_signature, X'')
     FROM cert_sightings s JOIN node_certs c ON c.serial = s.serial";

fn sighting(r: &rusqlite::Row<'_>) -> rusqlite::Result<Sighting> {
    Ok(Sighting {
        id: r.get(0)?,
        serial: r.get(1)?,
        node_id: r.get(2)?,
        boot_id: r.get(3)?,
        at_ms: r.get(4)?,
        seq: r.get::<_, i64>(5)? as u64,
        proof: r.get(6)?,
        proof_signature: r.get(7)?,
    })
}

pub(super) fn unwatched(c: &Connection, limit: u32) -> Result<Vec<Sighting>, StoreError> {
    Ok(c.prepare_cached(&format!(
        "{SIGHTING} WHERE s.watched = 0 ORDER BY s.id LIMIT ?1"
    ))?
    .query_map(params![limit], sighting)?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn mark_watched(c: &Connection, ids: &[i64]) -> Result<(), StoreError> {
    let mut mark = c.prepare_cached("UPDATE cert_sightings SET watched = 1 WHERE id = ?1")?;
    for id in ids {
        mark.execute([id])?;
    }
    Ok(())
}

pub(super) fn of(c: &Connection, serial: &str, since_ms: i64) -> Result<Vec<Sighting>, StoreError> {
    Ok(c.prepare_cached(&format!(
        "{SIGHTING} WHERE s.serial = ?1 AND s.at >= ?2 ORDER BY s.id"
    ))?
    .query_map(params![serial, since_ms], sighting)?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn drop_forged(c: &Connection, forged: &[(Sighting, String)]) -> Result<(), StoreError> {
    let at = now(c)?;
    for (s, why) in forged {
        let gone = c.execute_kept("DELETE FROM cert_sightings WHERE id = ?1", [s.id])?;
        if gone > 0 {
            fleet_event(
                c,
                at,
                clones::FORGED_SIGHTING,
                &s.node_id,
                &clones::forged_detail(s, why),
            )?;
        }
    }
    Ok(())
}

pub(super) fn supersede(
    c: &Connection,
    node_id: &str,
    serial: &str,
) -> Result<Vec<String>, StoreError> {
    let at = now(c)?;
    let not_before: Option<i64> = c
        .query_row_kept(
            "SELECT not_before FROM node_certs WHERE serial = ?1 AND node_id = ?2",
            params![serial, node_id],
            |r| r.get(0),
        )
        .optional()?;
    let Some(not_before) = not_before else {
        return Ok(vec![]);
    };
    let mut serials: Vec<String> = c
        .prepare_cached(
            "UPDATE node_certs SET revoked_at = ?4, revoke_reason = ?5
             WHERE node_id = ?1 AND revoked_at IS NULL AND serial != ?2 AND not_before <= ?3
             RETURNING serial",
        )?
        .query_map(params![node_id, serial, not_before, at, SUPERSEDED], |r| {
            r.get(0)
        })?
        .collect::<rusqlite::Result<_>>()?;
    serials.sort();
    Ok(serials)
}

pub(super) fn require_hello_proofs(
    c: &Connection,
    node_id: &str,
    serial: &str,
) -> Result<bool, StoreError> {
    let at = now(c)?;
    let set = c.execute_kept(REQUIRE_PROOFS, params![node_id, serial, at])?;
    Ok(set > 0)
}

/// [`require_hello_proofs`]: only while the certificate is still valid, so
/// a proof read after a re-enrolment (which revokes every earlier
/// certificate and clears the mark) does not set it for the new identity.
const REQUIRE_PROOFS: &str = "UPDATE nodes SET hello_proofs_since = ?3
     WHERE id = ?1 AND hello_proofs_since IS NULL
       AND EXISTS (SELECT 1 FROM node_certs
                   WHERE serial = ?2 AND node_id = ?1 AND revoked_at IS NULL)";

pub(super) fn quarantine(
    c: &Connection,
    node_id: &str,
    serial: &str,
    alternations: u32,
    seal: SealStatement,
) -> Result<bool, TxError> {
    let at = now(c)?;
    let already: bool = c.query_row_kept(
        "SELECT quarantined_at IS NOT NULL FROM nodes WHERE id = ?1",
        [node_id],
        |r| r.get(0),
    )?;
    if already {
        return Ok(false);
    }
    super::tokens::quarantine_node(c, node_id, at, seal, |revoked| {
        clones::quarantine_detail(serial, alternations, revoked)
    })?;
    Ok(true)
}
