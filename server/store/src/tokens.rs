//! Join tokens and operator credentials.
//!
//! The store keeps a token's secret only as its SHA-256. A join spends one
//! use of a token, creates the node and records its first certificate in
//! one transaction; [`admit`] decides whether the token may be spent.

use std::time::Duration;

use crate::error::Refusal;
use crate::nodes::IssuedCert;

/// A join token to create.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub id: String,
    pub secret_sha256: String,
    pub ttl: Duration,
    pub uses: u32,
    pub description: String,
}

/// A node's request to join with a token.
#[derive(Debug, Clone)]
pub struct JoinInput {
    pub token_id: String,
    pub secret_sha256: String,
    pub hostname: String,
    pub ramdisk: bool,
}

/// A node that joined (or renewed): its id, the certificate recorded for
/// it, the store's time of the transaction, and what the store knows the
/// node took on (its replay floors: a node that joins again as itself
/// starts above them).
#[derive(Debug, Clone)]
pub struct Joined {
    pub node_id: String,
    pub cert: IssuedCert,
    pub now_ms: i64,
    /// The highest command sequence the store issued the node.
    pub command_seq_floor: u64,
    /// The node's spec generation.
    pub spec_generation_floor: u64,
}

/// Builds the joining node's certificate once the token is known good:
/// gets the new node id and the store's now. Runs inside the join's
/// transaction; a refusal from it leaves nothing behind.
pub type IssueCert = Box<dyn FnOnce(&str, i64) -> Result<IssuedCert, Refusal> + Send>;

/// A token as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub secret_sha256: String,
    pub expires_at_ms: i64,
    pub uses_left: i64,
}

/// Whether a join may spend one use of `token` (`None`: no such token).
/// A wrong secret reads as an unknown token, so a guesser learns nothing.
pub fn admit(token: Option<&TokenRow>, secret_sha256: &str, now_ms: i64) -> Result<(), Refusal> {
    let Some(t) = token else {
        return Err(Refusal::UnknownToken);
    };
    if t.secret_sha256 != secret_sha256 {
        return Err(Refusal::UnknownToken);
    }
    if t.expires_at_ms < now_ms {
        return Err(Refusal::ExpiredToken);
    }
    if t.uses_left <= 0 {
        return Err(Refusal::UsedToken);
    }
    Ok(())
}

/// A fresh node id: `nd-` and 12 hex digits.
pub fn new_node_id() -> String {
    format!("nd-{:012x}", rand::random::<u64>() >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(expires_at_ms: i64, uses_left: i64) -> TokenRow {
        TokenRow {
            secret_sha256: "h".into(),
            expires_at_ms,
            uses_left,
        }
    }

    #[test]
    fn a_token_is_spent_while_it_has_uses_and_time() {
        assert_eq!(admit(Some(&row(100, 1)), "h", 100), Ok(()));
        assert_eq!(admit(None, "h", 0), Err(Refusal::UnknownToken));
        assert_eq!(
            admit(Some(&row(100, 1)), "wrong", 0),
            Err(Refusal::UnknownToken)
        );
        assert_eq!(
            admit(Some(&row(100, 1)), "h", 101),
            Err(Refusal::ExpiredToken)
        );
        assert_eq!(admit(Some(&row(100, 0)), "h", 0), Err(Refusal::UsedToken));
    }

    #[test]
    fn node_ids_have_one_shape() {
        let id = new_node_id();
        assert_eq!(id.len(), 15);
        assert!(id.starts_with("nd-") && id[3..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
