//! Releases.

use rusqlite::{Connection, OptionalExtension, params};

use super::Kept;
use crate::error::{StoreError, TxError};
use crate::releases::{
    MAX_CHUNK, NewRelease, ReleaseFiles, ReleaseHead, ReleaseRow, already_registered,
};

pub(super) fn register(c: &Connection, r: &NewRelease) -> Result<ReleaseRow, TxError> {
    let n = c.execute_kept(
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
    Ok(c.query_row_kept(
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

pub(super) fn head(c: &Connection, sequence: u64) -> Result<Option<ReleaseHead>, StoreError> {
    // length() of a blob reads its header, not its bytes.
    Ok(c.query_row_kept(
        "SELECT signed_manifest, length(binary) FROM releases WHERE sequence = ?1",
        [sequence as i64],
        |r| {
            Ok(ReleaseHead {
                signed_manifest: r.get(0)?,
                size: r.get::<_, i64>(1)? as u64,
            })
        },
    )
    .optional()?)
}

/// Reads the range through SQLite's incremental blob I/O (the row is found
/// by its rowid, `sequence`), so only the pages holding it are read.
pub(super) fn chunk(
    c: &Connection,
    sequence: u64,
    offset: u64,
    len: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Ok(rowid) = i64::try_from(sequence) else {
        return Ok(None);
    };
    let size: Option<i64> = c
        .query_row_kept(
            "SELECT length(binary) FROM releases WHERE sequence = ?1",
            [rowid],
            |r| r.get(0),
        )
        .optional()?;
    let Some(size) = size else {
        return Ok(None);
    };
    let size = size as u64;
    if offset >= size {
        return Ok(Some(Vec::new()));
    }
    let n = (size - offset).min(u64::from(len.min(MAX_CHUNK))) as usize;
    let blob = c.blob_open(rusqlite::MAIN_DB, c"releases", c"binary", rowid, true)?;
    let mut buf = vec![0u8; n];
    blob.read_at_exact(&mut buf, offset as usize)?;
    Ok(Some(buf))
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
