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
