//! Ranges of the large values (a release's binary, an image's artifacts),
//! read so that only those bytes leave the database; the rest of releases
//! and images is `crate::sql`'s.

use super::{Tx, query_opt};
use crate::error::StoreError;
use crate::id::ReleaseSeq;
use crate::releases::MAX_CHUNK;

/// Reads the range with `substring()`, so only those bytes leave the
/// database.
pub(super) async fn release_chunk(
    tx: &Tx<'_>,
    sequence: ReleaseSeq,
    offset: u64,
    len: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    // bytea positions are 32-bit and count from 1; past them is past the
    // end of any stored binary.
    let from = i32::try_from(offset.saturating_add(1)).unwrap_or(i32::MAX);
    let len = len.min(MAX_CHUNK) as i32;
    Ok(query_opt(
        tx,
        "SELECT substring(\"binary\" from $2 for $3) FROM releases WHERE sequence = $1",
        &[&sequence, &from, &len],
    )
    .await?
    .map(|r| r.get(0)))
}

/// Reads the range with `substring()`.
pub(super) async fn artifact_chunk(
    tx: &Tx<'_>,
    sha256: &str,
    offset: u64,
    len: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    // bytea positions are 32-bit and count from 1.
    let from = i32::try_from(offset.saturating_add(1)).unwrap_or(i32::MAX);
    let len = len.min(crate::releases::MAX_CHUNK) as i32;
    Ok(query_opt(
        tx,
        "SELECT substring(bytes from $2 for $3) FROM image_artifacts WHERE sha256 = $1",
        &[&sha256, &from, &len],
    )
    .await?
    .map(|r| r.get(0)))
}
