//! Ranges of the large values (a release's binary, an image's artifacts),
//! read so that only those bytes leave the database; the rest of releases
//! and images is `crate::sql`'s.

use crate::id::ReleaseSeq;
use rusqlite::{Connection, OptionalExtension};

use super::Kept;
use crate::error::StoreError;
use crate::releases::MAX_CHUNK;

/// Reads the range through SQLite's incremental blob I/O (the row is found
/// by its rowid, `sequence`), so only the pages holding it are read.
pub(super) fn release_chunk(
    c: &Connection,
    sequence: ReleaseSeq,
    offset: u64,
    len: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Ok(rowid) = i64::try_from(sequence.get()) else {
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

/// Reads the range through SQLite's incremental blob I/O, so only the
/// pages holding it are read.
pub(super) fn artifact_chunk(
    c: &Connection,
    sha256: &str,
    offset: u64,
    len: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    let row: Option<(i64, i64)> = c
        .query_row_kept(
            "SELECT rowid, length(bytes) FROM image_artifacts WHERE sha256 = ?1",
            [sha256],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((rowid, size)) = row else {
        return Ok(None);
    };
    let size = size as u64;
    if offset >= size {
        return Ok(Some(Vec::new()));
    }
    let n = (size - offset).min(u64::from(len.min(crate::releases::MAX_CHUNK))) as usize;
    let blob = c.blob_open(rusqlite::MAIN_DB, c"image_artifacts", c"bytes", rowid, true)?;
    let mut buf = vec![0u8; n];
    blob.read_at_exact(&mut buf, offset as usize)?;
    Ok(Some(buf))
}
