//! The exec ticket keys (ed25519): the key holder signs with them the
//! tickets that open tunnels on nodes (`bcd_proto::ticket`) and the secret
//! broker's deliveries (`bcd_proto::secret`). Their public halves travel
//! to each node as a JWKS inside the node's worker-signed spec, the only
//! place a node takes ticket keys from.
//!
//! Two keys overlap: `ticket.key` (the current one) and, after a rotation
//! (`better-compute tickets rotate`), `ticket.prev.key` (the one before).
//! Every spec signed names both; a ticket or delivery for a node is signed
//! with the newest key the node's own signed spec names, so a node that
//! has not taken the spec naming a new key yet goes on verifying with the
//! old one. The next rotation drops the older.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use bcd_proto::ticket::{self, Claims, Jwks};
use ring::signature::{Ed25519KeyPair, KeyPair};

use super::ca::CaError;

/// The current key's file in the data directory.
pub const KEY_FILE: &str = "ticket.key";

/// The previous key's file, after a rotation.
pub const PREVIOUS_FILE: &str = "ticket.prev.key";

struct Key {
    pkcs8: Vec<u8>,
    pair: Ed25519KeyPair,
    kid: String,
}

impl Key {
    fn from_pkcs8(pkcs8: Vec<u8>, path: &Path) -> Result<Key, CaError> {
        let pair = Ed25519KeyPair::from_pkcs8(&pkcs8).map_err(|_| CaError::Pem {
            path: path.to_path_buf(),
        })?;
        let kid = ticket::thumbprint(pair.public_key().as_ref());
        Ok(Key { pkcs8, pair, kid })
    }

    fn generate(path: &Path) -> Result<Key, CaError> {
        let pkcs8 =
            Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).map_err(|_| {
                CaError::Pem {
                    path: path.to_path_buf(),
                }
            })?;
        Key::from_pkcs8(pkcs8.as_ref().to_vec(), path)
    }
}

struct Keys {
    current: Arc<Key>,
    previous: Option<Arc<Key>>,
}

/// The ticket keys of a key holder: the current one and, after a rotation,
/// the previous one.
pub struct TicketKey {
    dir: Option<PathBuf>,
    keys: RwLock<Keys>,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKey")
            .field("kid", &self.kid())
            .finish_non_exhaustive()
    }
}

/// What a rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    pub kid: String,
    pub previous_kid: String,
    /// The key the rotation dropped, if there was one before the previous.
    pub retired_kid: Option<String>,
}

impl TicketKey {
    /// The keys in `dir`: the current one made on first start.
    pub fn load_or_create(dir: &Path) -> Result<TicketKey, CaError> {
        let path = dir.join(KEY_FILE);
        if !path.exists() {
            let key = Key::generate(&path)?;
            bcd_sys::fs::atomic_write(&path, &key.pkcs8, 0o600)?;
        }
        let current = Key::from_pkcs8(super::ca::read(&path)?, &path)?;
        let prev_path = dir.join(PREVIOUS_FILE);
        let previous = if prev_path.exists() {
            Some(Arc::new(Key::from_pkcs8(
                super::ca::read(&prev_path)?,
                &prev_path,
            )?))
        } else {
            None
        };
        Ok(TicketKey {
            dir: Some(dir.to_path_buf()),
            keys: RwLock::new(Keys {
                current: Arc::new(current),
                previous,
            }),
        })
    }

    /// One key held in memory only (tests).
    pub fn new(key: Ed25519KeyPair) -> TicketKey {
        let kid = ticket::thumbprint(key.public_key().as_ref());
        TicketKey {
            dir: None,
            keys: RwLock::new(Keys {
                current: Arc::new(Key {
                    pkcs8: Vec::new(),
                    pair: key,
                    kid,
                }),
                previous: None,
            }),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The JWKS nodes verify with (JSON): the current key, then the
    /// previous one.
    pub fn jwks(&self) -> String {
        let keys = self.read();
        let publics: Vec<Vec<u8>> = std::iter::once(&keys.current)
            .chain(keys.previous.as_ref())
            .map(|k| k.pair.public_key().as_ref().to_vec())
            .collect();
        Jwks::of(&publics).to_json()
    }

    /// The current key's id (its RFC 7638 thumbprint).
    pub fn kid(&self) -> String {
        self.read().current.kid.clone()
    }

    /// The newest of the keys that `spec_jwks` (a node's signed spec's
    /// JWKS) names; `None` when it names neither.
    fn for_spec(&self, spec_jwks: &str) -> Option<Arc<Key>> {
        let named = Jwks::parse(spec_jwks).ok()?;
        let keys = self.read();
        std::iter::once(&keys.current)
            .chain(keys.previous.as_ref())
            .find(|k| named.contains(&k.kid))
            .cloned()
    }

    /// Whether a node whose spec carries `spec_jwks` verifies what this
    /// key holder signs for it.
    pub fn named_in(&self, spec_jwks: &str) -> bool {
        self.for_spec(spec_jwks).is_some()
    }

    /// A ticket for `claims`, in compact form, signed with the newest key
    /// the node's spec names.
    pub fn issue(&self, spec_jwks: &str, claims: &Claims) -> Option<String> {
        self.for_spec(spec_jwks)
            .map(|k| ticket::sign(&k.pair, claims))
    }

    /// The secret broker's signed delivery (`bcd_proto::secret`), with the
    /// newest key the node's spec names.
    pub fn deliver(
        &self,
        spec_jwks: &str,
        delivery: &bcd_proto::secret::Delivery,
    ) -> Option<String> {
        self.for_spec(spec_jwks)
            .map(|k| bcd_proto::secret::sign_delivery(&k.pair, delivery))
    }

    /// Makes a new current key; the current one becomes the previous and
    /// the previous one is dropped. Written to the data directory first
    /// (the previous file, then the current), so a crash between leaves
    /// both keys a node may hold.
    pub fn rotate(&self) -> Result<Rotated, CaError> {
        let dir = self.dir.clone().ok_or_else(|| CaError::Pem {
            path: PathBuf::from(KEY_FILE),
        })?;
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let path = dir.join(KEY_FILE);
        let next = Arc::new(Key::generate(&path)?);
        bcd_sys::fs::atomic_write(&dir.join(PREVIOUS_FILE), &keys.current.pkcs8, 0o600)?;
        bcd_sys::fs::atomic_write(&path, &next.pkcs8, 0o600)?;
        let previous = std::mem::replace(&mut keys.current, next);
        let retired = keys.previous.replace(previous);
        Ok(Rotated {
            kid: keys.current.kid.clone(),
            previous_kid: keys
                .previous
                .as_ref()
                .map(|k| k.kid.clone())
                .unwrap_or_default(),
            retired_kid: retired.map(|k| k.kid.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            iss: ticket::ISSUER.into(),
            sub: "ops".into(),
            node: "nd-1".into(),
            sid: "tn-1".into(),
            jti: "j".into(),
            iat: 1,
            exp: 31,
            exec: Some(vec!["true".into()]),
            port: None,
            tty: false,
            user: "root".into(),
            epk: String::new(),
        }
    }

    fn kid_of(compact: &str) -> String {
        use base64::Engine;
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(compact.split('.').next().unwrap())
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&header).unwrap()["kid"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn two_keys_overlap_and_each_node_gets_the_newest_its_spec_names() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let keys = TicketKey::load_or_create(d.path()).unwrap();
        let first = keys.kid();
        let old_spec = keys.jwks();
        assert_eq!(Jwks::parse(&old_spec).unwrap().keys.len(), 1);

        let r = keys.rotate().unwrap();
        assert_eq!(
            (r.previous_kid.as_str(), r.retired_kid),
            (first.as_str(), None)
        );
        let second = keys.kid();
        assert_ne!(second, first);
        let both = keys.jwks();
        let named = Jwks::parse(&both).unwrap();
        assert!(named.contains(&first) && named.contains(&second));
        // A node still on the spec naming the first key gets tickets it
        // verifies; one on the new spec gets the new key's.
        assert_eq!(kid_of(&keys.issue(&old_spec, &claims()).unwrap()), first);
        assert_eq!(kid_of(&keys.issue(&both, &claims()).unwrap()), second);
        assert!(keys.issue(r#"{"keys":[]}"#, &claims()).is_none());
        assert!(!keys.named_in(""));

        // Kept across restarts, private.
        let again = TicketKey::load_or_create(d.path()).unwrap();
        assert_eq!((again.kid(), again.jwks()), (second.clone(), both.clone()));
        for f in [KEY_FILE, PREVIOUS_FILE] {
            let mode = std::fs::metadata(d.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }

        // The next rotation drops the first key.
        let r = again.rotate().unwrap();
        assert_eq!(r.retired_kid.as_deref(), Some(first.as_str()));
        assert!(again.issue(&old_spec, &claims()).is_none());
        assert_eq!(kid_of(&again.issue(&both, &claims()).unwrap()), second);
    }
}
