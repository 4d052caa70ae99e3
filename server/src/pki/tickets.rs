//! The exec ticket key (ed25519, `ticket.key`): the key holder signs with
//! it the tickets that open tunnels on nodes (`bcd_proto::ticket`). Its
//! public half travels to each node as a JWKS inside the node's
//! worker-signed spec, the only place a node takes ticket keys from.

use std::path::Path;

use bcd_proto::ticket::{self, Claims, Jwks};
use ring::signature::{Ed25519KeyPair, KeyPair};

use super::ca::CaError;

/// The file in the data directory.
pub const KEY_FILE: &str = "ticket.key";

pub struct TicketKey {
    key: Ed25519KeyPair,
    jwks: String,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKey")
            .field("kid", &self.kid())
            .finish_non_exhaustive()
    }
}

impl TicketKey {
    /// The key in `dir`, made on first start.
    pub fn load_or_create(dir: &Path) -> Result<TicketKey, CaError> {
        Ok(TicketKey::new(super::worker::load_or_create(
            &dir.join(KEY_FILE),
        )?))
    }

    pub fn new(key: Ed25519KeyPair) -> TicketKey {
        let jwks = Jwks::of(&[key.public_key().as_ref().to_vec()]).to_json();
        TicketKey { key, jwks }
    }

    /// The JWKS nodes verify tickets with (JSON).
    pub fn jwks(&self) -> &str {
        &self.jwks
    }

    /// The key's id (its RFC 7638 thumbprint).
    pub fn kid(&self) -> String {
        ticket::thumbprint(self.key.public_key().as_ref())
    }

    /// A ticket for `claims`, in compact form.
    pub fn issue(&self, claims: &Claims) -> String {
        ticket::sign(&self.key, claims)
    }

    /// The secret broker's signed delivery (`bcd_proto::secret`): nodes
    /// check it against the same JWKS.
    pub fn deliver(&self, delivery: &bcd_proto::secret::Delivery) -> String {
        bcd_proto::secret::sign_delivery(&self.key, delivery)
    }
}
