//! Releases.

use super::{Tx, execute, query, query_opt};
use crate::error::{StoreError, TxError};
use crate::releases::{
    MAX_CHUNK, NewRelease, ReleaseFiles, ReleaseHead, ReleaseRow, already_registered,
};

pub(super) async fn register(tx: &Tx<'_>, r: &NewRelease) -> Result<ReleaseRow, TxError> {
    let n = execute(
        tx,
        "INSERT INTO releases (sequence, version, target, size, sha256, key_id,
             signed_manifest, \"binary\", registered_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, compute_now()) ON CONFLICT (sequence) DO NOTHING",
        &[
            &(r.sequence.min(i64::MAX as u64) as i64),
            &r.version,
            &r.target,
            &(r.size.min(i64::MAX as u64) as i64),
            &r.sha256,
            &r.key_id,
            &r.signed_manifest,
            &r.binary,
        ],
    )
    .await?;
    if n == 0 {
        return Err(already_registered(r.sequence).into());
    }
    list(tx)
        .await?
        .into_iter()
        .find(|row| row.sequence == r.sequence)
        .ok_or_else(|| StoreError::Corrupt(format!("release {} vanished", r.sequence)).into())
}

pub(super) async fn files(tx: &Tx<'_>, sequence: u64) -> Result<Option<ReleaseFiles>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT signed_manifest, \"binary\" FROM releases WHERE sequence = $1",
        &[&(sequence.min(i64::MAX as u64) as i64)],
    )
    .await?
    .map(|r| ReleaseFiles {
        signed_manifest: r.get(0),
        binary: r.get(1),
    }))
}

pub(super) async fn head(tx: &Tx<'_>, sequence: u64) -> Result<Option<ReleaseHead>, StoreError> {
    // octet_length() of a stored bytea reads its header, not its bytes.
    Ok(query_opt(
        tx,
        "SELECT signed_manifest, octet_length(\"binary\")::bigint FROM releases WHERE sequence = $1",
        &[&(sequence.min(i64::MAX as u64) as i64)],
    )
    .await?
    .map(|r| ReleaseHead {
        signed_manifest: r.get(0),
        size: r.get::<_, i64>(1) as u64,
    }))
}

/// Reads the range with `substring()`, so only those bytes leave the
/// database.
pub(super) async fn chunk(
    tx: &Tx<'_>,
    sequence: u64,
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
        &[&(sequence.min(i64::MAX as u64) as i64), &from, &len],
    )
    .await?
    .map(|r| r.get(0)))
}

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<ReleaseRow>, StoreError> {
    Ok(query(
        tx,
        "SELECT version, sequence, target, size, sha256, key_id, registered_at
         FROM releases ORDER BY sequence DESC",
        &[],
    )
    .await?
    .iter()
    .map(|r| ReleaseRow {
        version: r.get(0),
        sequence: r.get::<_, i64>(1) as u64,
        target: r.get(2),
        size: r.get::<_, i64>(3) as u64,
        sha256: r.get(4),
        key_id: r.get(5),
        registered_at_ms: r.get(6),
    })
    .collect())
}
