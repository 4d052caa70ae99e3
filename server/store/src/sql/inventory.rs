//! Inventory sections.

use super::Db;
use super::bindings::fleet_event;
use super::nodes::valid_certs;
use crate::bindings::VerifySignature;
use crate::error::StoreError;
use crate::id::NodeId;
use crate::inventory::{FORGED, InventoryInput, InventoryRow, host_macs};
use crate::nodes::{Signed, judge_signed};
use crate::specs::FactApplied;
use bcd_core::report::InventorySection;

/// Stores a section the node signed (a forgery is recorded) if it names
/// `epoch` and that is the node's session epoch; the session row is held
/// `FOR SHARE` so a Hello cannot bump the epoch meanwhile.
pub(crate) async fn put(
    db: &impl Db,
    node_id: &NodeId,
    epoch: u64,
    signed: &Signed<InventoryInput>,
    verify: VerifySignature,
) -> Result<FactApplied, StoreError> {
    let now = db.now().await?;
    let certs = valid_certs(db, node_id, now).await?;
    let section = match judge_signed(node_id, signed, &certs, verify) {
        Ok(s) => s,
        Err(reason) => {
            let detail = match &signed.fact {
                Some(s) => format!("section {}: {reason}", s.section.name()),
                None => reason,
            };
            fleet_event(db, now, FORGED, node_id, &detail).await?;
            return Ok(FactApplied::Forged(detail));
        }
    };
    let current: Option<i64> = db
        .query_opt(
            "SELECT epoch FROM node_sessions WHERE node_id = $1 FOR SHARE",
            &[&node_id],
        )
        .await?
        .map(|r| r.get(0))
        .transpose()?;
    // Sent under this session's epoch, and this session is the current one.
    if section.epoch != epoch
        || !current.is_some_and(|cur| bcd_core::epoch::write_applies(cur as u64, epoch))
    {
        return Ok(FactApplied::Stale);
    }
    db.execute(
        "INSERT INTO inventory (node_id, section, sha256, body, updated_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (node_id, section) DO UPDATE SET
             sha256 = excluded.sha256, body = excluded.body, updated_at = excluded.updated_at",
        &[
            &node_id,
            &section.section.name(),
            &section.sha256,
            &section.body,
            &now,
        ],
    )
    .await?;
    if let Some(macs) = host_macs(section.section, &section.body) {
        record_macs(db, node_id, &macs, now).await?;
    }
    Ok(FactApplied::Applied)
}

pub(crate) async fn get(
    db: &impl Db,
    node_id: &NodeId,
    section: InventorySection,
) -> Result<Option<InventoryRow>, StoreError> {
    db.query_opt(
        "SELECT sha256, body, updated_at FROM inventory WHERE node_id = $1 AND section = $2",
        &[&node_id, &section.name()],
    )
    .await?
    .map(|r| {
        Ok(InventoryRow {
            sha256: r.get(0)?,
            body: r.get::<Option<Vec<u8>>>(1)?.unwrap_or_default(),
            updated_at_ms: r.get(2)?,
        })
    })
    .transpose()
}

/// Stores a MAC address as `node_id`'s, taking it from any node that
/// reported it before.
pub(crate) const INSERT_MAC: &str = "INSERT INTO node_macs (mac, node_id, reported_at)
     VALUES ($1, $2, $3) ON CONFLICT (mac) DO UPDATE SET node_id = $2, reported_at = $3";

/// The MAC addresses `node_id` reported replace those it reported before;
/// a MAC another node reported before names this node now.
pub(crate) async fn record_macs(
    db: &impl Db,
    node_id: &NodeId,
    macs: &[String],
    now: i64,
) -> Result<(), StoreError> {
    db.execute("DELETE FROM node_macs WHERE node_id = $1", &[&node_id])
        .await?;
    for mac in macs {
        db.execute(INSERT_MAC, &[mac, &node_id, &now]).await?;
    }
    Ok(())
}
