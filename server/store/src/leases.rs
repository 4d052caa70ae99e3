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

/// A lease as its holder took or renewed it: the store's now at the
/// renewal, and the lease's generation, which stays the same only while
/// the same owner renews it before it runs out. Writes made under a lease
/// name it ([`crate::GatewayBackend::sweep_commands`] and the other
/// controller passes): inside the write's own transaction the store checks
/// that `owner` still holds `name` at this generation, unexpired, and
/// writes nothing otherwise ([`crate::StoreError::LeaseLost`]). A lease
/// released (its row deleted) starts again at generation 1 with its next
/// owner; the owner in the check tells the two apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub name: String,
    pub owner: String,
    pub generation: u64,
    /// The store's now when it was taken or renewed.
    pub now_ms: i64,
}

impl Held {
    /// The refusal of a write under a lease no longer held so.
    pub fn lost(&self) -> crate::StoreError {
        crate::StoreError::LeaseLost {
            lease: self.name.clone(),
            owner: self.owner.clone(),
            generation: self.generation,
        }
    }
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
