//! Node inventory: one body per section, keyed by its SHA-256.
//!
//! The node sends hashes in its Hello; the Welcome names the sections whose
//! hash the store lacks ([`crate::sessions::inventory_wanted`]); the node
//! sends only those, signed by its key and naming the session epoch, and a
//! write applies only when it verifies ([`crate::nodes::judge_signed`]; a
//! forged one is recorded as `security.inventory.forged`) and names the
//! current epoch.

/// The fleet event a forged inventory section is recorded as.
pub const FORGED: &str = "security.inventory.forged";

/// An inventory section as the node signed it (inside a
/// [`crate::nodes::Signed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryInput {
    pub node_id: String,
    /// The session epoch the node sent it under.
    pub epoch: u64,
    pub section: String,
    pub sha256: String,
    pub body: Vec<u8>,
}

impl crate::nodes::About for InventoryInput {
    fn node_id(&self) -> &str {
        &self.node_id
    }
}

/// A stored inventory section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventoryRow {
    pub sha256: String,
    pub body: Vec<u8>,
    pub updated_at_ms: i64,
}
