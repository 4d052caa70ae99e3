//! The operator certificates a key holder knows revoked.
//!
//! A revocation is a statement the key holder signs with a worker key
//! (`OperatorRevocation`, naming the certificate's SHA-256), kept beside
//! the operator's row, where every key holder sharing the store reads it.
//! A statement that verifies is remembered in the data directory
//! ([`FILE`], one certificate digest a line, appended), beside the keys no
//! gateway reads: from then on that key holder refuses the certificate
//! whatever the store says, so a revocation cleared, deleted or the row
//! added again opens nothing there. A statement that does not verify (a
//! row someone wrote) revokes nothing: it cannot lock an admin out either.
//!
//! What it cannot do: a key holder that first starts after the statement
//! was deleted from the store never learns it (the row's `revoked_at` still
//! revokes while it stands).

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context as _;
use bcd_proto::v1::OperatorRevocation;
use tracing::{info, warn};

/// The file in the data directory.
pub const FILE: &str = "operator-revocations";

#[derive(Debug)]
pub struct RevokedOperators {
    path: PathBuf,
    /// Worker public keys: what a revocation is signed with.
    keys: Vec<Vec<u8>>,
    known: Mutex<HashSet<String>>,
}

fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl RevokedOperators {
    /// Reads what `dir` remembers (none yet: an empty set).
    pub fn open(dir: &Path, keys: Vec<Vec<u8>>) -> anyhow::Result<RevokedOperators> {
        let path = dir.join(FILE);
        let known = match std::fs::read_to_string(&path) {
            Ok(text) => text
                .lines()
                .map(str::trim)
                .filter(|l| is_digest(l))
                .map(str::to_string)
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot read {}: it lists the operator certificates this server \
                         revoked; check its permissions",
                        path.display()
                    )
                });
            }
        };
        Ok(RevokedOperators {
            path,
            keys,
            known: Mutex::new(known),
        })
    }

    /// Whether the certificate of SHA-256 `cert_sha256` is known revoked.
    pub fn contains(&self, cert_sha256: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(cert_sha256)
    }

    /// A revocation read from the store: when it verifies, the certificate
    /// it names is known revoked from now on (and written down if new).
    /// Returns what it names, or why it revokes nothing.
    pub fn learn(&self, statement: &[u8]) -> Result<String, String> {
        let r: OperatorRevocation = bcd_proto::sign::open_as(statement, &self.keys)
            .map_err(|e| format!("an operator revocation that does not verify: {e}"))?;
        if !is_digest(&r.cert_sha256) {
            return Err(format!(
                "an operator revocation naming no certificate ({:?})",
                r.cert_sha256
            ));
        }
        let new = self
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(r.cert_sha256.clone());
        if new {
            info!(operator = %r.name, cert = %r.cert_sha256, "operator certificate known revoked");
            if let Err(e) = self.remember(&r.cert_sha256) {
                warn!(error = %e, path = %self.path.display(),
                    "cannot write down a revoked operator certificate; it is refused until a restart");
            }
        }
        Ok(r.cert_sha256)
    }

    /// Appends a digest: processes sharing the directory each append
    /// whole lines, and nothing is ever rewritten.
    fn remember(&self, cert_sha256: &str) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&self.path)?;
        f.write_all(format!("{cert_sha256}\n").as_bytes())?;
        f.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{Ed25519KeyPair, KeyPair};

    fn key(seed: u8) -> Ed25519KeyPair {
        Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
    }

    fn revocation(k: &Ed25519KeyPair, cert: &str) -> Vec<u8> {
        bcd_proto::sign::seal_as(
            k,
            OperatorRevocation {
                name: "bob".into(),
                cert_sha256: cert.into(),
                revoked_at_ms: 7,
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_signed_revocation_is_remembered_across_restarts_and_a_forged_one_revokes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let k = key(1);
        let keys = vec![k.public_key().as_ref().to_vec()];
        let bob = "b0".repeat(32);
        let admin = "ad".repeat(32);
        let r = RevokedOperators::open(d.path(), keys.clone()).unwrap();
        assert!(!r.contains(&bob));
        assert_eq!(r.learn(&revocation(&k, &bob)), Ok(bob.clone()));
        assert!(r.contains(&bob));
        // Learnt again: written once.
        r.learn(&revocation(&k, &bob)).unwrap();
        // Signed by another key, or not a revocation at all.
        assert!(r.learn(&revocation(&key(2), &admin)).is_err());
        let other = bcd_proto::sign::seal_as(
            &k,
            bcd_proto::v1::EventReceipt {
                kind: admin.clone(),
                ..Default::default()
            },
        );
        assert!(r.learn(&other).is_err());
        assert!(r.learn(b"garbage").is_err());
        assert!(r.learn(&revocation(&k, "not a digest")).is_err());
        assert!(!r.contains(&admin));

        let again = RevokedOperators::open(d.path(), keys).unwrap();
        assert!(again.contains(&bob), "remembered in the data directory");
        assert!(!again.contains(&admin));
        let text = std::fs::read_to_string(d.path().join(FILE)).unwrap();
        assert_eq!(text, format!("{bob}\n"));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(d.path().join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
