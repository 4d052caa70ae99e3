//! Node inventory: one body per section, keyed by its SHA-256.
//!
//! The node sends hashes in its Hello; the Welcome names the sections whose
//! hash the store lacks ([`crate::sessions::inventory_wanted`]); the node
//! sends only those, and a write applies only under the current epoch.

/// A stored inventory section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryRow {
    pub sha256: String,
    pub body: Vec<u8>,
    pub updated_at_ms: i64,
}
