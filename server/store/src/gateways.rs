//! Credentials of gateway processes that hold no key.
//!
//! A gateway-only process starts from a directory with no private key: it
//! makes its serving key in memory and proves a secret to the process that
//! holds the fleet CA, which certifies the key under the gateway's name.
//! The store keeps the secret only as its SHA-256, with when the name was
//! added and when it was revoked. [`GatewayCredential::admits`] decides whether a credential
//! (or a certificate issued under it) still counts.

use crate::error::Refusal;
use crate::id::GatewayId;

/// A gateway credential as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayCredential {
    pub name: GatewayId,
    pub secret_sha256: String,
    pub created_ms: i64,
    pub revoked_ms: Option<i64>,
}

impl GatewayCredential {
    /// Whether a certificate issued under this name at `issued_ms` (its
    /// not-before plus the issuer's back-dating) still counts: the
    /// credential is not revoked, and the certificate is not older than
    /// the credential (a name added again after a revocation does not
    /// revive what was issued before).
    pub fn admits(&self, issued_ms: i64) -> bool {
        self.revoked_ms.is_none() && issued_ms >= self.created_ms
    }
}

/// A serving certificate the key holder issued a gateway, recorded when it
/// was issued so that a revocation can name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayCert {
    pub name: GatewayId,
    /// SHA-256 of the certificate's DER, lowercase hex.
    pub sha256: String,
    /// When it was issued, on the store's clock.
    pub issued_ms: i64,
    pub not_after_ms: i64,
}

/// The newest list of revoked gateway certificates the key holder signed
/// (a worker-signed `GatewayRevocations`), as gateways hand it to nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRevocations {
    pub issued_ms: i64,
    pub envelope: Vec<u8>,
}

/// How long after its end a gateway certificate's record is kept: past
/// it no node accepts the certificate anyway.
pub const CERT_KEPT_PAST_END_MS: i64 = 24 * 3600 * 1000;

/// How long after its end a revoked gateway certificate stays in the
/// signed list: a node checks a gateway certificate's end on its own
/// clock, which may lag the store's.
pub const LISTED_PAST_END_MS: i64 = CERT_KEPT_PAST_END_MS;

/// The refusal for adding a name that is live already.
pub fn name_taken(name: &str) -> Refusal {
    Refusal::Conflict(format!(
        "gateway {name} already has a credential: revoke it first \
         (better-compute gateways revoke {name}) or choose another name"
    ))
}

/// The longest gateway name: it goes into a certificate's URI.
pub const MAX_NAME: usize = 63;

/// Whether `name` can name a gateway: 1 to 63 of `a-z`, `0-9` and `-`, not
/// starting with `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain() {
        for ok in ["gw-1", "a", "edge-07"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-gw", "GW", "gw/1", "gw 1", "gw:1", &"a".repeat(64)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn revoked_or_older_certificates_do_not_count() {
        let c = GatewayCredential {
            name: "gw".into(),
            secret_sha256: String::new(),
            created_ms: 1_000,
            revoked_ms: None,
        };
        assert!(c.admits(1_000));
        assert!(c.admits(5_000));
        assert!(!c.admits(999), "issued before the name was added (again)");
        let revoked = GatewayCredential {
            revoked_ms: Some(2_000),
            ..c
        };
        assert!(!revoked.admits(5_000));
    }
}
