//! Join tokens: `bct2.<id>.<secret>.<ca pin>.<seal key>` (and the older
//! `bct1.<id>.<secret>.<ca pin>`).
//!
//! The id names the token in the store, the secret proves it (the store keeps
//! only its SHA-256), and the pin is the SHA-256 of the fleet CA certificate,
//! which lets a new node trust the server on first contact. The seal key is
//! the join service's X25519 public key: a node sends `<id>.<secret>` sealed
//! to it ([`crate::seal`]), so a gateway that relays the join can neither
//! read the token nor spend it on a key of its own. A `bct1` token has no
//! seal key, and its `<id>.<secret>` travels as it is: only the key
//! holder's own listener still takes one.

use std::fmt;

#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub id: String,
    pub secret: String,
    pub ca_pin: String,
    /// The join service's X25519 public key (`bct2`); `None` for `bct1`.
    pub seal_key: Option<[u8; 32]>,
}

impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .field("ca_pin", &self.ca_pin)
            .field("seal_key", &self.seal_key.map(hex::encode))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the join token is malformed: expected bct2.<id>.<secret>.<ca pin>.<seal key> (or the \
     older bct1.<id>.<secret>.<ca pin>) as printed by `better-compute tokens create`"
)]
pub struct MalformedToken;

const SEALED: &str = "bct2";
const PLAIN: &str = "bct1";

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl JoinToken {
    pub fn parse(s: &str) -> Result<JoinToken, MalformedToken> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        let (id, secret, pin, seal_key) = match parts.as_slice() {
            [SEALED, id, secret, pin, key] if is_hex(key, 64) => {
                let mut k = [0u8; 32];
                hex::decode_to_slice(key, &mut k).map_err(|_| MalformedToken)?;
                (*id, *secret, *pin, Some(k))
            }
            [PLAIN, id, secret, pin] => (*id, *secret, *pin, None),
            _ => return Err(MalformedToken),
        };
        if !is_hex(id, 16) || !is_hex(secret, 32) || !is_hex(pin, 64) {
            return Err(MalformedToken);
        }
        Ok(JoinToken {
            id: id.to_ascii_lowercase(),
            secret: secret.to_ascii_lowercase(),
            ca_pin: pin.to_ascii_lowercase(),
            seal_key,
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
        match &self.seal_key {
            Some(k) => write!(
                f,
                "{SEALED}.{}.{}.{}.{}",
                self.id,
                self.secret,
                self.ca_pin,
                hex::encode(k)
            ),
            None => write!(f, "{PLAIN}.{}.{}.{}", self.id, self.secret, self.ca_pin),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(id in "[0-9a-f]{16}", secret in "[0-9a-f]{32}", pin in "[0-9a-f]{64}",
                       key in proptest::option::of(any::<[u8; 32]>())) {
            let t = JoinToken { id, secret, ca_pin: pin, seal_key: key };
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
        let sealed = format!("{}.{}", good.replace("bct1", "bct2"), "d".repeat(64));
        let t = JoinToken::parse(&sealed).unwrap();
        assert_eq!(t.seal_key, Some([0xdd; 32]));
        assert_eq!(t.to_string(), sealed);
        // A bct1 with a key, a bct2 without one, a short key.
        assert!(JoinToken::parse(&format!("{good}.{}", "d".repeat(64))).is_err());
        assert!(JoinToken::parse(&good.replace("bct1", "bct2")).is_err());
        assert!(JoinToken::parse(&sealed[..sealed.len() - 2]).is_err());
    }
}
