//! Netboot images. A range of an artifact is read by each backend its own
//! way (`artifact_chunk` in each backend's `images`).

use super::{Db, List, Row, in_list};
use crate::clock::ms;
use crate::error::{StoreError, TxError};
use crate::id::ImageId;
use crate::images::{
    AllowedMac, Assigned, BOOTS_KEPT, BootRecord, BootRow, IMAGE_COLUMNS, ImageRef, ImageRow,
    MacOwner, Minted, NewImage, boot_targets, by_prefix, image_ref, no_image_named, no_such_image,
};
use crate::tokens::NewToken;

pub(crate) async fn register(db: &impl Db, i: &NewImage) -> Result<bool, StoreError> {
    for (sha, bytes) in [(&i.kernel_sha256, &i.kernel), (&i.initrd_sha256, &i.initrd)] {
        db.execute(
            "INSERT INTO image_artifacts (sha256, bytes) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[sha, bytes],
        )
        .await?;
    }
    let n = db
        .execute(
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

fn image_row(r: &Row) -> Result<ImageRow, StoreError> {
    Ok(ImageRow {
        image_id: r.get(0)?,
        name: r.get(1)?,
        kernel_version: r.get(2)?,
        bcd_version: r.get(3)?,
        cmdline: r.get(4)?,
        kernel_size: r.get::<i64>(5)? as u64,
        kernel_sha256: r.get(6)?,
        initrd_size: r.get::<i64>(7)? as u64,
        initrd_sha256: r.get(8)?,
        key_id: r.get(9)?,
        registered_at_ms: r.get(10)?,
        assigned_to: Vec::new(),
    })
}

pub(crate) async fn list(db: &impl Db) -> Result<Vec<ImageRow>, StoreError> {
    let mut images: Vec<ImageRow> = db
        .query(
            &format!("SELECT {IMAGE_COLUMNS} FROM images ORDER BY registered_at, image_id"),
            &[],
        )
        .await?
        .iter()
        .map(image_row)
        .collect::<Result<_, _>>()?;
    let assignments = db
        .query(
            "SELECT target, image_id FROM image_assignments ORDER BY target",
            &[],
        )
        .await?;
    for r in &assignments {
        let (target, id): (String, String) = (r.get(0)?, r.get(1)?);
        if let Some(i) = images.iter_mut().find(|i| i.image_id == id) {
            i.assigned_to.push(target);
        }
    }
    Ok(images)
}

pub(crate) async fn resolve(db: &impl Db, what: &str) -> Result<ImageId, TxError> {
    let (name, prefix) = match image_ref(what) {
        ImageRef::Id(id) => {
            let found: Option<ImageId> = db
                .query_opt("SELECT image_id FROM images WHERE image_id = $1", &[&id])
                .await?
                .map(|r| r.get(0))
                .transpose()?;
            return Ok(found.ok_or_else(|| no_such_image(what))?);
        }
        ImageRef::Name { name, prefix } => (name, prefix),
    };
    let by_name: Option<ImageId> = db
        .query_opt(
            "SELECT image_id FROM images WHERE name = $1
         ORDER BY registered_at DESC, image_id LIMIT 1",
            &[&name],
        )
        .await?
        .map(|r| r.get(0))
        .transpose()?;
    if let Some(id) = by_name {
        return Ok(id);
    }
    let Some(prefix) = prefix else {
        return Err(no_image_named(what).into());
    };
    let ids: Vec<String> = db
        .column(
            "SELECT image_id FROM images
             WHERE substr(image_id, 1, length(CAST($1 AS TEXT))) = $1",
            &[&prefix],
        )
        .await?;
    Ok(ImageId::from(by_prefix(what, ids)?))
}

pub(crate) async fn assign(
    db: &impl Db,
    target: &str,
    image_id: Option<&ImageId>,
    append: &str,
    mint_ttl_ms: Option<i64>,
) -> Result<(), StoreError> {
    match image_id {
        Some(id) => {
            db.execute(
                "INSERT INTO image_assignments (target, image_id, append, assigned_at, mint_ttl_ms)
                 VALUES ($1, $2, $3, compute_now(), $4)
                 ON CONFLICT (target) DO UPDATE SET image_id = $2, append = $3,
                     assigned_at = compute_now(), mint_ttl_ms = $4",
                &[&target, &id, &append, &mint_ttl_ms],
            )
            .await?
        }
        None => {
            db.execute(
                "DELETE FROM image_assignments WHERE target = $1",
                &[&target],
            )
            .await?
        }
    };
    Ok(())
}

pub(crate) async fn for_mac(db: &impl Db, mac: &str) -> Result<Option<Assigned>, StoreError> {
    let r = db
        .query_one(
            "SELECT (SELECT n.id FROM node_macs m JOIN nodes n ON n.id = m.node_id
                 WHERE m.mac = $1 AND n.deleted_at IS NULL),
                COALESCE((SELECT n.pool FROM node_macs m JOIN nodes n ON n.id = m.node_id
                          WHERE m.mac = $1 AND n.deleted_at IS NULL),
                         (SELECT pool FROM boot_allowed_macs WHERE mac = $1))",
            &[&mac],
        )
        .await?;
    let owner = MacOwner {
        node_id: r.get(0)?,
        pool: r.get(1)?,
    };
    let targets = List(boot_targets(mac, &owner));
    let found = db
        .query(
            &format!(
                "SELECT a.target, a.image_id, i.signed_manifest, a.append, a.mint_ttl_ms
                 FROM image_assignments a JOIN images i ON i.image_id = a.image_id
                 WHERE {}",
                in_list(db.dialect(), "a.target", 1)
            ),
            &[&targets],
        )
        .await?
        .into_iter()
        .map(|r| {
            Ok((
                r.get::<String>(0)?,
                Assigned {
                    target: r.get(0)?,
                    image_id: r.get(1)?,
                    signed_manifest: r.get(2)?,
                    append: r.get(3)?,
                    mint_ttl_ms: r.get(4)?,
                },
            ))
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(crate::images::resolve(mac, &owner, found))
}

pub(crate) async fn mint(
    db: &impl Db,
    mac: &str,
    t: &NewToken,
) -> Result<Option<Minted>, StoreError> {
    // Locked: two script requests of one MAC mint one after the other, so
    // at most one minted token of the MAC is unspent.
    let Some(allowed) = db
        .query_opt(
            "SELECT pool FROM boot_allowed_macs WHERE mac = $1 FOR UPDATE",
            &[&mac],
        )
        .await?
    else {
        return Ok(None);
    };
    let replaced = db
        .execute(
            "DELETE FROM join_tokens WHERE minted_for_mac = $1 AND uses_left = uses_total",
            &[&mac],
        )
        .await?;
    let pool: Option<String> = allowed.get::<Option<String>>(0)?.or_else(|| t.pool.clone());
    let expires_at_ms: i64 = db
        .query_one(
            "INSERT INTO join_tokens (id, secret_sha256, created_at, expires_at, uses_total,
             uses_left, description, pool, minted_for_mac)
         VALUES ($1, $2, compute_now(), compute_now() + $3, $4, $4, $5, $6, $7)
         RETURNING expires_at",
            &[
                &t.id,
                &t.secret_sha256,
                &ms(t.ttl),
                &i64::from(t.uses),
                &t.description,
                &pool,
                &mac,
            ],
        )
        .await?
        .get(0)?;
    Ok(Some(Minted {
        expires_at_ms,
        pool,
        replaced,
    }))
}

pub(crate) async fn allow_mac(
    db: &impl Db,
    mac: &str,
    pool: Option<&str>,
) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO boot_allowed_macs (mac, pool, added_at) VALUES ($1, $2, compute_now())
         ON CONFLICT (mac) DO UPDATE SET pool = $2",
        &[&mac, &pool],
    )
    .await?;
    Ok(())
}

pub(crate) async fn disallow_mac(db: &impl Db, mac: &str) -> Result<bool, StoreError> {
    let n = db
        .execute("DELETE FROM boot_allowed_macs WHERE mac = $1", &[&mac])
        .await?;
    db.execute(
        "DELETE FROM join_tokens WHERE minted_for_mac = $1 AND uses_left = uses_total",
        &[&mac],
    )
    .await?;
    Ok(n == 1)
}

pub(crate) async fn allowed_macs(db: &impl Db) -> Result<Vec<AllowedMac>, StoreError> {
    db.query(
        "SELECT mac, pool, added_at FROM boot_allowed_macs ORDER BY mac",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(AllowedMac {
            mac: r.get(0)?,
            pool: r.get(1)?,
            added_at_ms: r.get(2)?,
        })
    })
    .collect()
}

pub(crate) async fn artifact(db: &impl Db, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
    db.query_opt(
        "SELECT bytes FROM image_artifacts WHERE sha256 = $1",
        &[&sha256],
    )
    .await?
    .map(|r| r.get(0))
    .transpose()
}

pub(crate) async fn record_boot(db: &impl Db, b: &BootRecord) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO boots (mac, image_id, remote, outcome, at)
         VALUES ($1, $2, $3, $4, compute_now())",
        &[&b.mac, &b.image_id, &b.remote, &b.outcome],
    )
    .await?;
    db.execute(
        "DELETE FROM boots WHERE mac = $1 AND id <= (SELECT id FROM boots WHERE mac = $1
             ORDER BY id DESC LIMIT 1 OFFSET $2)",
        &[&b.mac, &BOOTS_KEPT],
    )
    .await?;
    Ok(())
}

pub(crate) async fn boots(
    db: &impl Db,
    mac: Option<&str>,
    limit: u32,
) -> Result<Vec<BootRow>, StoreError> {
    db.query(
        "SELECT mac, COALESCE(image_id, ''), at, remote, outcome FROM boots
         WHERE CAST($1 AS TEXT) IS NULL OR mac = $1 ORDER BY id DESC LIMIT $2",
        &[&mac, &i64::from(limit.max(1))],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(BootRow {
            mac: r.get(0)?,
            image_id: r.get(1)?,
            at_ms: r.get(2)?,
            remote: r.get(3)?,
            outcome: r.get(4)?,
        })
    })
    .collect()
}

pub(crate) async fn get(
    db: &impl Db,
    image_id: &ImageId,
) -> Result<Option<(ImageRow, Vec<u8>)>, StoreError> {
    db.query_opt(
        &format!("SELECT {IMAGE_COLUMNS}, signed_manifest FROM images WHERE image_id = $1"),
        &[&image_id],
    )
    .await?
    .map(|r| Ok((image_row(&r)?, r.get(11)?)))
    .transpose()
}

pub(crate) async fn manifests(db: &impl Db) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    db.query(
        "SELECT image_id, signed_manifest FROM images ORDER BY image_id",
        &[],
    )
    .await?
    .iter()
    .map(|r| Ok((r.get(0)?, r.get(1)?)))
    .collect()
}

pub(crate) async fn artifact_size(db: &impl Db, sha256: &str) -> Result<Option<u64>, StoreError> {
    // length() of a stored blob or bytea reads its header, not its bytes.
    db.query_opt(
        "SELECT CAST(length(bytes) AS BIGINT) FROM image_artifacts WHERE sha256 = $1",
        &[&sha256],
    )
    .await?
    .map(|r| Ok(r.get::<i64>(0)?.max(0) as u64))
    .transpose()
}
