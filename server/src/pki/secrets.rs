//! The secret broker's key (`secrets.key`, 32 random bytes): the key
//! holder seals every secret's value under it before the store sees it
//! (`bcd_proto::secret::at_rest`), so a database, a backup of one, or a
//! gateway with its role reads no value. It is among the key files a
//! backup set carries; a store restored without it holds values nothing
//! opens.

use std::path::Path;

use super::ca::CaError;

/// The file in the data directory.
pub const KEY_FILE: &str = "secrets.key";

pub struct SecretsKey([u8; 32]);

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretsKey(..)")
    }
}

impl SecretsKey {
    /// The key in `dir`, made (0600) on first start.
    pub fn load_or_create(dir: &Path) -> Result<SecretsKey, CaError> {
        let path = dir.join(KEY_FILE);
        if !path.exists() {
            let mut key = [0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
                .map_err(|_| CaError::RawKey { path: path.clone() })?;
            bcd_sys::fs::atomic_write(&path, &key, 0o600)?;
        }
        let bytes = super::ca::read(&path)?;
        let key = <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| CaError::RawKey { path })?;
        Ok(SecretsKey(key))
    }

    pub fn new(key: [u8; 32]) -> SecretsKey {
        SecretsKey(key)
    }

    /// `value` sealed for `name` at `version`.
    pub fn seal(&self, name: &str, version: u64, value: &[u8]) -> Option<Vec<u8>> {
        bcd_proto::secret::at_rest::seal(&self.0, name, version, value)
    }

    /// The value the store keeps for `name` at `version`; `None` when the
    /// bytes were not sealed by this key for that name and version.
    pub fn open(&self, name: &str, version: u64, sealed: &[u8]) -> Option<Vec<u8>> {
        bcd_proto::secret::at_rest::open(&self.0, name, version, sealed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_private_and_opens_what_it_sealed() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let a = SecretsKey::load_or_create(d.path()).unwrap();
        let b = SecretsKey::load_or_create(d.path()).unwrap();
        let sealed = a.seal("db", 1, b"pw").unwrap();
        assert_eq!(b.open("db", 1, &sealed).unwrap(), b"pw");
        let mode = std::fs::metadata(d.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(d.path().join(KEY_FILE), b"short").unwrap();
        assert!(SecretsKey::load_or_create(d.path()).is_err());
    }
}
