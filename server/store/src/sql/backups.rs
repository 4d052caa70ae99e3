//! Backup sets' records. The dump and the restore read each database's
//! own catalog (`dump` in each backend).

use super::{Db, Row};
use crate::backups::{BackupRow, NewBackup};
use crate::error::StoreError;

const COLUMNS: &str = "id, state, reason, restore_eligible, created_at, finished_at, location, \
                       host, process, files, bytes";

fn backup_row(r: &Row) -> Result<BackupRow, StoreError> {
    Ok(BackupRow {
        id: r.get(0)?,
        state: r.get(1)?,
        reason: r.get(2)?,
        restore_eligible: r.get(3)?,
        created_at: r.get(4)?,
        finished_at: r.get(5)?,
        location: r.get(6)?,
        host: r.get(7)?,
        process: r.get(8)?,
        files: r.get::<i64>(9)? as u64,
        bytes: r.get::<i64>(10)? as u64,
    })
}

pub(crate) async fn begin(db: &impl Db, b: &NewBackup) -> Result<BackupRow, StoreError> {
    let sql = format!(
        "INSERT INTO backups (id, state, created_at, location, host, process)
         VALUES ($1, 'CREATING', compute_now(), $2, $3, $4) RETURNING {COLUMNS}"
    );
    backup_row(
        &db.query_one(&sql, &[&b.id, &b.location, &b.host, &b.process])
            .await?,
    )
}

pub(crate) async fn finish(
    db: &impl Db,
    id: &str,
    files: u64,
    bytes: u64,
) -> Result<bool, StoreError> {
    Ok(db
        .execute(
            "UPDATE backups SET state = 'COMPLETE', restore_eligible = TRUE,
                 finished_at = compute_now(), files = $2, bytes = $3
             WHERE id = $1 AND state = 'CREATING'",
            &[&id, &(files as i64), &(bytes as i64)],
        )
        .await?
        == 1)
}

pub(crate) async fn fail(db: &impl Db, id: &str, reason: &str) -> Result<bool, StoreError> {
    Ok(db
        .execute(
            "UPDATE backups SET state = 'FAILED', restore_eligible = FALSE, reason = $2,
                 finished_at = compute_now()
             WHERE id = $1 AND state = 'CREATING'",
            &[&id, &reason],
        )
        .await?
        == 1)
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<BackupRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM backups ORDER BY created_at DESC, id");
    db.query(&sql, &[]).await?.iter().map(backup_row).collect()
}

pub(crate) async fn get(db: &impl Db, id: &str) -> Result<Option<BackupRow>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM backups WHERE id = $1");
    db.query_opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(backup_row)
        .transpose()
}
