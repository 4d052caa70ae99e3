//! Netboot images.

use rusqlite::{Connection, OptionalExtension, params};

use super::Kept;
use crate::error::{StoreError, TxError};
use crate::images::{
    AllowedMac, Assigned, BOOTS_KEPT, BootRecord, BootRow, IMAGE_COLUMNS, ImageRef, ImageRow,
    MacOwner, Minted, NewImage, boot_targets, by_prefix, image_ref, no_image_named, no_such_image,
};
use crate::tokens::NewToken;

pub(super) fn register(c: &Connection, i: &NewImage) -> Result<bool, StoreError> {
    for (sha, bytes) in [(&i.kernel_sha256, &i.kernel), (&i.initrd_sha256, &i.initrd)] {
        c.execute_kept(
            "INSERT INTO image_artifacts (sha256, bytes) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![sha, bytes],
        )?;
    }
    let n = c.execute_kept(
        "INSERT INTO images (image_id, name, key_id, kernel_version, bcd_version, cmdline,
             kernel_sha256, kernel_size, initrd_sha256, initrd_size, signed_manifest,
             registered_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, compute_now())
         ON CONFLICT (image_id) DO NOTHING",
        params![
            i.image_id,
            i.name,
            i.key_id,
            i.kernel_version,
            i.bcd_version,
            i.cmdline,
            i.kernel_sha256,
            i.kernel_size as i64,
            i.initrd_sha256,
            i.initrd_size as i64,
            i.signed_manifest,
        ],
    )?;
    Ok(n == 1)
}

fn image_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ImageRow> {
    Ok(ImageRow {
        image_id: r.get(0)?,
        name: r.get(1)?,
        kernel_version: r.get(2)?,
        bcd_version: r.get(3)?,
        cmdline: r.get(4)?,
        kernel_size: r.get::<_, i64>(5)? as u64,
        kernel_sha256: r.get(6)?,
        initrd_size: r.get::<_, i64>(7)? as u64,
        initrd_sha256: r.get(8)?,
        key_id: r.get(9)?,
        registered_at_ms: r.get(10)?,
        assigned_to: Vec::new(),
    })
}

pub(super) fn list(c: &Connection) -> Result<Vec<ImageRow>, StoreError> {
    let mut images = c
        .prepare(&format!(
            "SELECT {IMAGE_COLUMNS} FROM images ORDER BY registered_at, image_id"
        ))?
        .query_map([], image_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let assignments = c
        .prepare("SELECT target, image_id FROM image_assignments ORDER BY target")?
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (target, id) in assignments {
        if let Some(i) = images.iter_mut().find(|i| i.image_id == id) {
            i.assigned_to.push(target);
        }
    }
    Ok(images)
}

pub(super) fn resolve(c: &Connection, what: &str) -> Result<String, TxError> {
    let (name, prefix) = match image_ref(what) {
        ImageRef::Id(id) => {
            let found: Option<String> = c
                .query_row_kept(
                    "SELECT image_id FROM images WHERE image_id = ?1",
                    [&id],
                    |r| r.get(0),
                )
                .optional()?;
            return Ok(found.ok_or_else(|| no_such_image(what))?);
        }
        ImageRef::Name { name, prefix } => (name, prefix),
    };
    let by_name: Option<String> = c
        .query_row_kept(
            "SELECT image_id FROM images WHERE name = ?1
             ORDER BY registered_at DESC, image_id LIMIT 1",
            [&name],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(id) = by_name {
        return Ok(id);
    }
    let Some(prefix) = prefix else {
        return Err(no_image_named(what).into());
    };
    let ids = c
        .prepare("SELECT image_id FROM images WHERE image_id LIKE ?1 || '%'")?
        .query_map([prefix], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(by_prefix(what, ids)?)
}

pub(super) fn assign(
    c: &Connection,
    target: &str,
    image_id: Option<&str>,
    append: &str,
    mint_ttl_ms: Option<i64>,
) -> Result<(), StoreError> {
    match image_id {
        Some(id) => c.execute_kept(
            "INSERT INTO image_assignments (target, image_id, append, assigned_at, mint_ttl_ms)
             VALUES (?1, ?2, ?3, compute_now(), ?4)
             ON CONFLICT (target) DO UPDATE SET image_id = ?2, append = ?3,
                 assigned_at = compute_now(), mint_ttl_ms = ?4",
            params![target, id, append, mint_ttl_ms],
        )?,
        None => c.execute_kept("DELETE FROM image_assignments WHERE target = ?1", [target])?,
    };
    Ok(())
}

pub(super) fn for_mac(c: &Connection, mac: &str) -> Result<Option<Assigned>, StoreError> {
    let owner = c.query_row_kept(
        "SELECT (SELECT n.id FROM node_macs m JOIN nodes n ON n.id = m.node_id
                 WHERE m.mac = ?1 AND n.deleted_at IS NULL),
                COALESCE((SELECT n.pool FROM node_macs m JOIN nodes n ON n.id = m.node_id
                          WHERE m.mac = ?1 AND n.deleted_at IS NULL),
                         (SELECT pool FROM boot_allowed_macs WHERE mac = ?1))",
        [mac],
        |r| {
            Ok(MacOwner {
                node_id: r.get(0)?,
                pool: r.get(1)?,
            })
        },
    )?;
    let mut q = c.prepare_cached(
        "SELECT a.target, a.image_id, i.signed_manifest, a.append, a.mint_ttl_ms
             FROM image_assignments a JOIN images i ON i.image_id = a.image_id
             WHERE a.target = ?1",
    )?;
    let mut found = Vec::new();
    for target in boot_targets(mac, &owner) {
        let row = q
            .query_row([&target], |r| {
                Ok(Assigned {
                    target: r.get(0)?,
                    image_id: r.get(1)?,
                    signed_manifest: r.get(2)?,
                    append: r.get(3)?,
                    mint_ttl_ms: r.get(4)?,
                })
            })
            .optional()?;
        if let Some(a) = row {
            found.push((target, a));
        }
    }
    Ok(crate::images::resolve(mac, &owner, found))
}

pub(super) fn mint(c: &Connection, mac: &str, t: &NewToken) -> Result<Option<Minted>, StoreError> {
    let allowed: Option<Option<String>> = c
        .query_row_kept(
            "SELECT pool FROM boot_allowed_macs WHERE mac = ?1",
            [mac],
            |r| r.get(0),
        )
        .optional()?;
    let Some(allowed_pool) = allowed else {
        return Ok(None);
    };
    let replaced = c.execute_kept(
        "DELETE FROM join_tokens WHERE minted_for_mac = ?1 AND uses_left = uses_total",
        [mac],
    )?;
    let pool = allowed_pool.or_else(|| t.pool.clone());
    let expires_at_ms = c.query_row_kept(
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total,
             uses_left, description, pool, minted_for_mac)
         VALUES (?1, ?2, compute_now(), compute_now() + ?3, ?4, ?4, ?5, ?6, ?7)
         RETURNING expires_at",
        params![
            t.id,
            t.secret_sha256,
            super::ms(t.ttl),
            t.uses,
            t.description,
            pool,
            mac
        ],
        |r| r.get(0),
    )?;
    Ok(Some(Minted {
        expires_at_ms,
        pool,
        replaced: replaced as u64,
    }))
}

pub(super) fn allow_mac(c: &Connection, mac: &str, pool: Option<&str>) -> Result<(), StoreError> {
    c.execute_kept(
        "INSERT INTO boot_allowed_macs (mac, pool, added_at) VALUES (?1, ?2, compute_now())
         ON CONFLICT (mac) DO UPDATE SET pool = ?2",
        params![mac, pool],
    )?;
    Ok(())
}

pub(super) fn disallow_mac(c: &Connection, mac: &str) -> Result<bool, StoreError> {
    let n = c.execute_kept("DELETE FROM boot_allowed_macs WHERE mac = ?1", [mac])?;
    c.execute_kept(
        "DELETE FROM join_tokens WHERE minted_for_mac = ?1 AND uses_left = uses_total",
        [mac],
    )?;
    Ok(n == 1)
}

pub(super) fn allowed_macs(c: &Connection) -> Result<Vec<AllowedMac>, StoreError> {
    Ok(
        c.prepare("SELECT mac, pool, added_at FROM boot_allowed_macs ORDER BY mac")?
            .query_map([], |r| {
                Ok(AllowedMac {
                    mac: r.get(0)?,
                    pool: r.get(1)?,
                    added_at_ms: r.get(2)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?,
    )
}

pub(super) fn artifact(c: &Connection, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(c.query_row_kept(
        "SELECT bytes FROM image_artifacts WHERE sha256 = ?1",
        [sha256],
        |r| r.get(0),
    )
    .optional()?)
}

pub(super) fn record_boot(c: &Connection, b: &BootRecord) -> Result<(), StoreError> {
    c.execute_kept(
        "INSERT INTO boots (mac, image_id, remote, outcome, at)
         VALUES (?1, ?2, ?3, ?4, compute_now())",
        params![b.mac, b.image_id, b.remote, b.outcome],
    )?;
    c.execute_kept(
        "DELETE FROM boots WHERE mac = ?1 AND id <= (SELECT id FROM boots WHERE mac = ?1
             ORDER BY id DESC LIMIT 1 OFFSET ?2)",
        params![b.mac, BOOTS_KEPT],
    )?;
    Ok(())
}

pub(super) fn boots(
    c: &Connection,
    mac: Option<&str>,
    limit: u32,
) -> Result<Vec<BootRow>, StoreError> {
    let rows = c
        .prepare(
            "SELECT mac, COALESCE(image_id, ''), at, remote, outcome FROM boots
             WHERE ?1 IS NULL OR mac = ?1 ORDER BY id DESC LIMIT ?2",
        )?
        .query_map(params![mac, limit.max(1) as i64], |r| {
            Ok(BootRow {
                mac: r.get(0)?,
                image_id: r.get(1)?,
                at_ms: r.get(2)?,
                remote: r.get(3)?,
                outcome: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

pub(super) fn get(
    c: &Connection,
    image_id: &str,
) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError> {
    Ok(c.prepare_cached(&format!(
        "SELECT {IMAGE_COLUMNS}, signed_manifest FROM images WHERE image_id = ?1"
    ))?
    .query_row([image_id], |r| Ok((image_row(r)?, r.get(11)?)))
    .optional()?)
}

pub(super) fn manifests(c: &Connection) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    Ok(
        c.prepare_cached("SELECT image_id, signed_manifest FROM images ORDER BY image_id")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?,
    )
}

pub(super) fn artifact_size(c: &Connection, sha256: &str) -> Result<Option<u64>, StoreError> {
    Ok(c.query_row_kept(
        "SELECT length(bytes) FROM image_artifacts WHERE sha256 = ?1",
        [sha256],
        |r| r.get::<_, i64>(0),
    )
    .optional()?
    .map(|n| n as u64))
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
