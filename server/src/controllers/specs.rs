//! Specs signed again before they expire.
//!
//! A signed NodeSpec lives `bc_store::specs::LIFETIME` (a day); a node
//! refuses one that arrives after its `not_after`, so an old spec a gateway
//! kept (one that still grants a removed key) cannot be replayed to a node
//! that lost its journal. Every spec that expires within
//! `bc_store::specs::RESIGN_WITHIN` gets a new generation of the body its
//! last signed spec holds (verified with the worker key first, never read
//! from the store's unsigned columns: a rewritten row signs nothing and is
//! recorded as `security.spec.forged`), sealed with the worker key, and its
//! node's session is woken to send it.
//! Each store call is one transaction: a crash between two leaves the
//! others due at the next tick; two controllers signing one spec at once
//! give it two generations, which nodes take in order.

use std::sync::Arc;

use bc_store::specs::RESIGN_WITHIN;
use bc_store::{NodeId, Store, TxError};
use tracing::{info, warn};

use crate::pki::seal::{own_spec_opener, spec_sealer};

/// One pass: signs every spec expiring soon again; returns the nodes whose
/// spec changed.
pub async fn tick(
    store: &Store,
    key: &Arc<ring::signature::Ed25519KeyPair>,
    tickets: &Arc<crate::pki::tickets::TicketKey>,
) -> Result<Vec<NodeId>, TxError> {
    let mut renewed = Vec::new();
    for node in store.specs_expiring(RESIGN_WITHIN).await? {
        match store
            .update_spec(
                &node,
                Box::new(|_| Ok(())),
                own_spec_opener(key, &node),
                spec_sealer(key.clone(), tickets.clone(), &node),
            )
            .await
        {
            Ok((generation, _)) => {
                info!(%node, generation, "spec signed again before it expires");
                renewed.push(node);
            }
            // A node deleted meanwhile has no spec to sign.
            Err(TxError::Refused(r)) => warn!(%node, refusal = %r, "spec not signed again"),
            Err(e) => return Err(e),
        }
    }
    Ok(renewed)
}
