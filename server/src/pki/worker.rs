//! The worker signing key (ed25519): commands and NodeSpecs are sealed with
//! it; nodes learn its public half at join and verify everything it signed.

use std::path::Path;

use super::ca::{CaError, read};

/// The worker signing key (ed25519) in `worker.key`, created on first start.
/// Commands and specs are signed with it; nodes learn its public half at
/// join.
pub fn load_or_create_worker_key(dir: &Path) -> Result<ring::signature::Ed25519KeyPair, CaError> {
    load_or_create(&dir.join("worker.key"))
}

/// An ed25519 key (PKCS#8) at `path`, made and written 0600 when there
/// is none.
pub fn load_or_create(path: &Path) -> Result<ring::signature::Ed25519KeyPair, CaError> {
    let path = path.to_path_buf();
    if !path.exists() {
        let pkcs8 =
            ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
                .map_err(|_| CaError::Pem { path: path.clone() })?;
        bcd_sys::fs::atomic_write(&path, pkcs8.as_ref(), 0o600)?;
    }
    let bytes = read(&path)?;
    ring::signature::Ed25519KeyPair::from_pkcs8(&bytes).map_err(|_| CaError::Pem { path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_key_is_made_once_and_kept_private() {
        use ring::signature::KeyPair;
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let a = load_or_create_worker_key(d.path()).unwrap();
        let b = load_or_create_worker_key(d.path()).unwrap();
        assert_eq!(a.public_key().as_ref(), b.public_key().as_ref());
        let mode = std::fs::metadata(d.path().join("worker.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
