//! Join tokens: `bct1.<id>.<secret>.<ca pin>`.
//!
//! The id names the token in the store, the secret proves it (the store keeps
//! only its SHA-256), and the pin is the SHA-256 of the fleet CA certificate,
//! which lets a new node trust the server on first contact. Only `<id>.<secret>`
//! is sent to the server.

use std::fmt;

#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
    pub ca_pin: String,
}

impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .field("ca_pin", &self.ca_pin)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the join token is malformed: expected bct1.<id>.<secret>.<ca pin> as printed by \
     `better-compute tokens create`"
)]
pub struct MalformedToken;

const PREFIX: &str = "bct1";

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl JoinToken {
    pub fn parse(s: &str) -> Result<JoinToken, MalformedToken> {
        let mut parts = s.trim().split('.');
        let (Some(PREFIX), Some(id), Some(secret), Some(pin), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(MalformedToken);
        };
        if !is_hex(id, 16) || !is_hex(secret, 32) || !is_hex(pin, 64) {
            return Err(MalformedToken);
        }
        Ok(JoinToken {
            id: id.to_ascii_lowercase(),
            secret: secret.to_ascii_lowercase(),
            ca_pin: pin.to_ascii_lowercase(),
        })
    }

    /// What the node sends to the server: the id and the secret.
    pub fn credential(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Splits a credential sent by a node.
    pub fn split_credential(s: &str) -> Option<(&str, &str)> {
        let (id, secret) = s.split_once('.')?;
        (is_hex(id, 16) && is_hex(secret, 32)).then_some((id, secret))
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}.{}.{}.{}", self.id, self.secret, self.ca_pin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(id in "[0-9a-f]{16}", secret in "[0-9a-f]{32}", pin in "[0-9a-f]{64}") {
            let t = JoinToken { id, secret, ca_pin: pin };
            prop_assert_eq!(JoinToken::parse(&t.to_string()), Ok(t.clone()));
            let cred = t.credential();
            prop_assert_eq!(JoinToken::split_credential(&cred), Some((t.id.as_str(), t.secret.as_str())));
        }

        #[test]
        fn never_panics_on_arbitrary_input(s in ".{0,200}") {
            let _ = JoinToken::parse(&s);
            let _ = JoinToken::split_credential(&s);
        }
    }

    #[test]
    fn rejects_near_misses() {
        let good = format!(
            "bct1.{}.{}.{}",
            "a".repeat(16),
            "b".repeat(32),
            "c".repeat(64)
        );
        assert!(JoinToken::parse(&good).is_ok());
        assert!(JoinToken::parse(&good.replace("bct1", "bct2")).is_err());
        assert!(JoinToken::parse(&format!("{good}.x")).is_err());
        assert!(JoinToken::parse(&good[..good.len() - 1]).is_err());
        assert!(JoinToken::parse(&good.replacen('a', "g", 1)).is_err());
        assert!(format!("{:?}", JoinToken::parse(&good).unwrap()).contains("redacted"));
    }
}
