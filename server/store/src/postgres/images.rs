//! Netboot images.

use super::{Tx, execute, query, query_one, query_opt};
use crate::error::{StoreError, TxError};
use crate::images::{
    AllowedMac, Assigned, BOOTS_KEPT, BootRecord, BootRow, IMAGE_COLUMNS, ImageRef, ImageRow,
    MacOwner, Minted, NewImage, boot_targets, by_prefix, image_ref, no_image_named, no_such_image,
};
use crate::tokens::NewToken;

pub(super) async fn register(tx: &Tx<'_>, i: &NewImage) -> Result<bool, StoreError> {
    for (sha, bytes) in [(&i.kernel_sha256, &i.kernel), (&i.initrd_sha256, &i.initrd)] {
        execute(
            tx,
            "INSERT INTO image_artifacts (sha256, bytes) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[sha, bytes],
        )
        .await?;
    }
    let n = execute(
        tx,
        "INSERT INTO images (image_id, name, key_id, kernel_version, bcd_version, cmdline,
             kernel_sha256, kernel_size, initrd_sha256, initrd_size, signed_manifest,
             registered_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, compute_now())
         ON CONFLICT (image_id) DO NOTHING",
        &[
            &i.image_id,
            &i.name,
            &i.key_id,
            &i.kernel_version,
            &i.bcd_version,
            &i.cmdline,
            &i.kernel_sha256,
            &(i.kernel_size.min(i64::MAX as u64) as i64),
            &i.initrd_sha256,
            &(i.initrd_size.min(i64::MAX as u64) as i64),
            &i.signed_manifest,
        ],
    )
    .await?;
    Ok(n == 1)
}

fn image_row(r: &tokio_postgres::Row) -> ImageRow {
    ImageRow {
        image_id: r.get(0),
        name: r.get(1),
        kernel_version: r.get(2),
        bcd_version: r.get(3),
        cmdline: r.get(4),
        kernel_size: r.get::<_, i64>(5) as u64,
        kernel_sha256: r.get(6),
        initrd_size: r.get::<_, i64>(7) as u64,
        initrd_sha256: r.get(8),
        key_id: r.get(9),
        registered_at_ms: r.get(10),
        assigned_to: Vec::new(),
    }
}

pub(super) async fn list(tx: &Tx<'_>) -> Result<Vec<ImageRow>, StoreError> {
    let mut images: Vec<ImageRow> = query(
        tx,
        &format!("SELECT {IMAGE_COLUMNS} FROM images ORDER BY registered_at, image_id"),
        &[],
    )
    .await?
    .iter()
    .map(image_row)
    .collect();
    let assignments = query(
        tx,
        "SELECT target, image_id FROM image_assignments ORDER BY target",
        &[],
    )
    .await?;
    for r in &assignments {
        let (target, id): (String, String) = (r.get(0), r.get(1));
        if let Some(i) = images.iter_mut().find(|i| i.image_id == id) {
            i.assigned_to.push(target);
        }
    }
    Ok(images)
}

pub(super) async fn resolve(tx: &Tx<'_>, what: &str) -> Result<String, TxError> {
    let (name, prefix) = match image_ref(what) {
        ImageRef::Id(id) => {
            let found: Option<String> = query_opt(
                tx,
                "SELECT image_id FROM images WHERE image_id = $1",
                &[&id],
            )
            .await?
            .map(|r| r.get(0));
            return Ok(found.ok_or_else(|| no_such_image(what))?);
        }
        ImageRef::Name { name, prefix } => (name, prefix),
    };
    let by_name: Option<String> = query_opt(
        tx,
        "SELECT image_id FROM images WHERE name = $1
         ORDER BY registered_at DESC, image_id LIMIT 1",
        &[&name],
    )
    .await?
    .map(|r| r.get(0));
    if let Some(id) = by_name {
        return Ok(id);
    }
    let Some(prefix) = prefix else {
        return Err(no_image_named(what).into());
    };
    let ids: Vec<String> = query(
        tx,
        "SELECT image_id FROM images WHERE starts_with(image_id, $1)",
        &[&prefix],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    Ok(by_prefix(what, ids)?)
}

pub(super) async fn assign(
    tx: &Tx<'_>,
    target: &str,
    image_id: Option<&str>,
    append: &str,
    mint_ttl_ms: Option<i64>,
) -> Result<(), StoreError> {
    match image_id {
        Some(id) => {
            execute(
                tx,
                "INSERT INTO image_assignments (target, image_id, append, assigned_at, mint_ttl_ms)
                 VALUES ($1, $2, $3, compute_now(), $4)
                 ON CONFLICT (target) DO UPDATE SET image_id = $2, append = $3,
                     assigned_at = compute_now(), mint_ttl_ms = $4",
                &[&target, &id, &append, &mint_ttl_ms],
            )
            .await?
        }
        None => {
            execute(
                tx,
                "DELETE FROM image_assignments WHERE target = $1",
                &[&target],
            )
            .await?
        }
    };
    Ok(())
}

pub(super) async fn for_mac(tx: &Tx<'_>, mac: &str) -> Result<Option<Assigned>, StoreError> {
    let r = query_one(
        tx,
        "SELECT (SELECT n.id FROM node_macs m JOIN nodes n ON n.id = m.node_id
                 WHERE m.mac = $1 AND n.deleted_at IS NULL),
                COALESCE((SELECT n.pool FROM node_macs m JOIN nodes n ON n.id = m.node_id
                          WHERE m.mac = $1 AND n.deleted_at IS NULL),
                         (SELECT pool FROM boot_allowed_macs WHERE mac = $1))",
        &[&mac],
    )
    .await?;
    let owner = MacOwner {
        node_id: r.get(0),
        pool: r.get(1),
    };
    let targets = boot_targets(mac, &owner);
    let found = query(
        tx,
        "SELECT a.target, a.image_id, i.signed_manifest, a.append, a.mint_ttl_ms
             FROM image_assignments a JOIN images i ON i.image_id = a.image_id
             WHERE a.target = ANY($1)",
        &[&targets],
    )
    .await?
    .into_iter()
    .map(|r| {
        (
            r.get::<_, String>(0),
            Assigned {
                target: r.get(0),
                image_id: r.get(1),
                signed_manifest: r.get(2),
                append: r.get(3),
                mint_ttl_ms: r.get(4),
            },
        )
    })
    .collect();
    Ok(crate::images::resolve(mac, &owner, found))
}

pub(super) async fn mint(
    tx: &Tx<'_>,
    mac: &str,
    t: &NewToken,
) -> Result<Option<Minted>, StoreError> {
    // Locked: two script requests of one MAC mint one after the other, so
    // at most one minted token of the MAC is unspent.
    let Some(allowed) = query_opt(
        tx,
        "SELECT pool FROM boot_allowed_macs WHERE mac = $1 FOR UPDATE",
        &[&mac],
    )
    .await?
    else {
        return Ok(None);
    };
    let replaced = execute(
        tx,
        "DELETE FROM join_tokens WHERE minted_for_mac = $1 AND uses_left = uses_total",
        &[&mac],
    )
    .await?;
    let pool: Option<String> = allowed
        .get::<_, Option<String>>(0)
        .or_else(|| t.pool.clone());
    let expires_at_ms: i64 = query_one(
        tx,
        "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total,
             uses_left, description, pool, minted_for_mac)
         VALUES ($1, $2, compute_now(), compute_now() + $3, $4, $4, $5, $6, $7)
         RETURNING expires_at",
        &[
            &t.id,
            &t.secret_sha256,
            &super::ms(t.ttl),
            &i64::from(t.uses),
            &t.description,
            &pool,
            &mac,
        ],
    )
    .await?
    .get(0);
    Ok(Some(Minted {
        expires_at_ms,
        pool,
        replaced,
    }))
}

pub(super) async fn allow_mac(
    tx: &Tx<'_>,
    mac: &str,
    pool: Option<&str>,
) -> Result<(), StoreError> {
    execute(
        tx,
        "INSERT INTO boot_allowed_macs (mac, pool, added_at) VALUES ($1, $2, compute_now())
         ON CONFLICT (mac) DO UPDATE SET pool = $2",
        &[&mac, &pool],
    )
    .await?;
    Ok(())
}

pub(super) async fn disallow_mac(tx: &Tx<'_>, mac: &str) -> Result<bool, StoreError> {
    let n = execute(tx, "DELETE FROM boot_allowed_macs WHERE mac = $1", &[&mac]).await?;
    execute(
        tx,
        "DELETE FROM join_tokens WHERE minted_for_mac = $1 AND uses_left = uses_total",
        &[&mac],
    )
    .await?;
    Ok(n == 1)
}

pub(super) async fn allowed_macs(tx: &Tx<'_>) -> Result<Vec<AllowedMac>, StoreError> {
    Ok(query(
        tx,
        "SELECT mac, pool, added_at FROM boot_allowed_macs ORDER BY mac",
        &[],
    )
    .await?
    .iter()
    .map(|r| AllowedMac {
        mac: r.get(0),
        pool: r.get(1),
        added_at_ms: r.get(2),
    })
    .collect())
}

pub(super) async fn artifact(tx: &Tx<'_>, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT bytes FROM image_artifacts WHERE sha256 = $1",
        &[&sha256],
    )
    .await?
    .map(|r| r.get(0)))
}

pub(super) async fn record_boot(tx: &Tx<'_>, b: &BootRecord) -> Result<(), StoreError> {
    execute(
        tx,
        "INSERT INTO boots (mac, image_id, remote, outcome, at)
         VALUES ($1, $2, $3, $4, compute_now())",
        &[&b.mac, &b.image_id, &b.remote, &b.outcome],
    )
    .await?;
    execute(
        tx,
        "DELETE FROM boots WHERE mac = $1 AND id <= (SELECT id FROM boots WHERE mac = $1
             ORDER BY id DESC LIMIT 1 OFFSET $2)",
        &[&b.mac, &BOOTS_KEPT],
    )
    .await?;
    Ok(())
}

pub(super) async fn boots(
    tx: &Tx<'_>,
    mac: Option<&str>,
    limit: u32,
) -> Result<Vec<BootRow>, StoreError> {
    Ok(query(
        tx,
        "SELECT mac, COALESCE(image_id, ''), at, remote, outcome FROM boots
         WHERE $1::text IS NULL OR mac = $1 ORDER BY id DESC LIMIT $2",
        &[&mac, &i64::from(limit.max(1))],
    )
    .await?
    .iter()
    .map(|r| BootRow {
        mac: r.get(0),
        image_id: r.get(1),
        at_ms: r.get(2),
        remote: r.get(3),
        outcome: r.get(4),
    })
    .collect())
}

pub(super) async fn get(
    tx: &Tx<'_>,
    image_id: &str,
) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError> {
    Ok(query_opt(
        tx,
        &format!("SELECT {IMAGE_COLUMNS}, signed_manifest FROM images WHERE image_id = $1"),
        &[&image_id],
    )
    .await?
    .map(|r| (image_row(&r), r.get(11))))
}

pub(super) async fn manifests(tx: &Tx<'_>) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    Ok(query(
        tx,
        "SELECT image_id, signed_manifest FROM images ORDER BY image_id",
        &[],
    )
    .await?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect())
}

pub(super) async fn artifact_size(tx: &Tx<'_>, sha256: &str) -> Result<Option<u64>, StoreError> {
    Ok(query_opt(
        tx,
        "SELECT octet_length(bytes) FROM image_artifacts WHERE sha256 = $1",
        &[&sha256],
    )
    .await?
    .map(|r| r.get::<_, i32>(0) as u64))
}

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
