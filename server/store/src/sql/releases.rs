//! Releases. A range of a release's binary is read by each backend its
//! own way (SQLite's blob I/O, PostgreSQL's `substring()`), so only those
//! bytes leave the database: `chunk` in each backend's `releases`.

use super::{Db, Row};
use crate::error::{StoreError, TxError};
use crate::id::ReleaseSeq;
use crate::releases::{NewRelease, ReleaseFiles, ReleaseHead, ReleaseRow, already_registered};

pub(crate) async fn register(db: &impl Db, r: &NewRelease) -> Result<ReleaseRow, TxError> {
    let n = db
        .execute(
            "INSERT INTO releases (sequence, version, target, size, sha256, key_id,
                 signed_manifest, \"binary\", registered_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, compute_now())
             ON CONFLICT (sequence) DO NOTHING",
            &[
                &r.sequence,
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
    list(db)
        .await?
        .into_iter()
        .find(|row| row.sequence == r.sequence)
        .ok_or_else(|| StoreError::Corrupt(format!("release {} vanished", r.sequence)).into())
}

pub(crate) async fn files(
    db: &impl Db,
    sequence: ReleaseSeq,
) -> Result<Option<ReleaseFiles>, StoreError> {
    db.query_opt(
        "SELECT signed_manifest, \"binary\" FROM releases WHERE sequence = $1",
        &[&sequence],
    )
    .await?
    .map(|r| {
        Ok(ReleaseFiles {
            signed_manifest: r.get(0)?,
            binary: r.get(1)?,
        })
    })
    .transpose()
}

pub(crate) async fn head(
    db: &impl Db,
    sequence: ReleaseSeq,
) -> Result<Option<ReleaseHead>, StoreError> {
    // length() of a stored blob or bytea reads its header, not its bytes.
    db.query_opt(
        "SELECT signed_manifest, CAST(length(\"binary\") AS BIGINT) FROM releases
         WHERE sequence = $1",
        &[&sequence],
    )
    .await?
    .map(|r| {
        Ok(ReleaseHead {
            signed_manifest: r.get(0)?,
            size: r.get::<i64>(1)? as u64,
        })
    })
    .transpose()
}

fn row(r: &Row) -> Result<ReleaseRow, StoreError> {
    Ok(ReleaseRow {
        version: r.get(0)?,
        sequence: r.get(1)?,
        target: r.get(2)?,
        size: r.get::<i64>(3)? as u64,
        sha256: r.get(4)?,
        key_id: r.get(5)?,
        registered_at_ms: r.get(6)?,
    })
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<ReleaseRow>, StoreError> {
    db.query(
        "SELECT version, sequence, target, size, sha256, key_id, registered_at
         FROM releases ORDER BY sequence DESC",
        &[],
    )
    .await?
    .iter()
    .map(row)
    .collect()
}
