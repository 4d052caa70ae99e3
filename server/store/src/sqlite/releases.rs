//! Releases.

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{StoreError, TxError};
use crate::releases::{NewRelease, ReleaseFiles, ReleaseRow, already_registered};

pub(super) fn register(c: &Connection, r: &NewRelease) -> Result<ReleaseRow, TxError> {
    let n = c.execute(
        "INSERT INTO releases (sequence, version, target, size, sha256, key_id,
             signed_manifest, binary, registered_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, compute_now()) ON CONFLICT (sequence) DO NOTHING",
        params![
            r.sequence as i64,
            r.version,
            r.target,
            r.size as i64,
            r.sha256,
            r.key_id,
            r.signed_manifest,
            r.binary
        ],
    )?;
    if n == 0 {
        return Err(already_registered(r.sequence).into());
    }
    list(c)?
        .into_iter()
        .find(|row| row.sequence == r.sequence)
        .ok_or_else(|| StoreError::Corrupt(format!("release {} vanished", r.sequence)).into())
}

pub(super) fn files(c: &Connection, sequence: u64) -> Result<Option<ReleaseFiles>, StoreError> {
    Ok(c.query_row(
        "SELECT signed_manifest, binary FROM releases WHERE sequence = ?1",
        [sequence as i64],
        |r| {
            Ok(ReleaseFiles {
                signed_manifest: r.get(0)?,
                binary: r.get(1)?,
            })
        },
    )
    .optional()?)
}

pub(super) fn list(c: &Connection) -> rusqlite::Result<Vec<ReleaseRow>> {
    c.prepare_cached(
        "SELECT version, sequence, target, size, sha256, key_id, registered_at
         FROM releases ORDER BY sequence DESC",
    )?
    .query_map([], |r| {
        Ok(ReleaseRow {
            version: r.get(0)?,
            sequence: r.get::<_, i64>(1)? as u64,
            target: r.get(2)?,
            size: r.get::<_, i64>(3)? as u64,
            sha256: r.get(4)?,
            key_id: r.get(5)?,
            registered_at_ms: r.get(6)?,
        })
    })?
    .collect()
}
