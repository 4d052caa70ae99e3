//! The signed, short-lived list of revoked gateway certificates.
//!
//! A gateway's serving certificate lives 30 days, and a revoked gateway
//! still holds its key: nodes must be told. Every tenth of the list's life
//! (`serve --gateway-revocations-life`, by default
//! [`crate::api::join::GATEWAY_REVOCATIONS_LIFE`]), and at once when an
//! operator revokes a gateway, the key holder signs with a
//! worker key the certificates it issued that their name's credential no
//! longer admits (revoked, or the name added again since), each until a
//! day past its own end (`bc_store::gateways::LISTED_PAST_END_MS`), in a
//! list that runs out after its life; it keeps the newest in the store, where every gateway reads it and hands it to its nodes
//! (`gateway::feeds::gateway_revocations`). A node leaves a gateway the
//! list names, and one that lets its list run out without a newer one
//! (`bcd_core::gateways`). What the list names comes from the key
//! holder's own records of what it issued (a gateway's database role
//! reads none of them); a gateway that withholds or replays a list gains
//! only the list's life.

use std::sync::Arc;
use std::time::Duration;

use bc_store::gateways::SignedRevocations;
use bc_store::{Store, StoreError};
use bcd_proto::v1::{GatewayRevocations, RevokedGatewayCert};
use tracing::{debug, info};

/// How far ahead of the store's clock the last list's issue time may be
/// and still be followed (a clock that stepped back).
const AHEAD_MS: i64 = 60_000;

/// How often a list is signed again: a tenth of its life, so a node is
/// handed several before the one it holds runs out.
pub fn every(life: Duration) -> Duration {
    (life / 10).max(Duration::from_millis(100))
}

/// One pass: signs the list anew and keeps it; returns how many
/// certificates it names.
pub async fn tick(
    store: &Store,
    key: &Arc<ring::signature::Ed25519KeyPair>,
    life: Duration,
) -> Result<usize, StoreError> {
    let revoked = store.revoked_gateway_certs().await?;
    let now = store.now().await?;
    // Each list is newer than the last, even on a clock that stepped back
    // a little; a stored issue time further ahead than that (a row
    // rewritten in the store) moves nothing: the list is issued now.
    let issued_ms = match store.gateway_revocations().await? {
        Some(last) if last.issued_ms >= now && last.issued_ms < now.saturating_add(AHEAD_MS) => {
            last.issued_ms + 1
        }
        _ => now,
    };
    let named = revoked.len();
    let list = GatewayRevocations {
        purpose: String::new(),
        issued_ms,
        not_after_ms: issued_ms.saturating_add(life.as_millis() as i64),
        certs: revoked
            .into_iter()
            .map(|c| RevokedGatewayCert {
                name: c.name.into_string(),
                sha256: c.sha256,
                not_after_ms: c.not_after_ms,
            })
            .collect(),
    };
    let envelope = bcd_proto::gateways::seal(key, list);
    store
        .put_gateway_revocations(&SignedRevocations {
            issued_ms,
            envelope,
        })
        .await?;
    debug!(issued_ms, named, "gateway revocation list signed");
    Ok(named)
}

/// Logs a change in how many gateway certificates the list names.
pub fn log_change(before: Option<usize>, now: usize) {
    if before.is_some_and(|b| b != now) {
        info!(revoked = now, "gateway revocation list changed");
    }
}
