//! Leases: one owner at a time, until the lease runs out.
//!
//! `renew_lease` takes a free or expired lease, or renews one the caller
//! holds, and answers the store's now (gateways anchor their clock to it);
//! another owner's live lease is not taken. Each gateway holds
//! [`gateway_lease`]; the Hello transaction checks it.

/// The lease a gateway holds while it routes nodes.
pub fn gateway_lease(gateway_id: &str) -> String {
    format!("gateway:{gateway_id}")
}

/// The lease of a controller (`liveness`, `sweeper`, `rollouts`).
pub fn controller_lease(name: &str) -> String {
    format!("controller:{name}")
}

/// A lease as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub name: String,
    pub owner: String,
    pub expires_at_ms: i64,
    pub renewed_at_ms: i64,
}

impl LeaseRow {
    /// Whether it is held at `now_ms` (store clock).
    pub fn live(&self, now_ms: i64) -> bool {
        self.expires_at_ms >= now_ms
    }
}
