//! The node's identity on disk: who it is, the key that proves it, and the
//! server time mark.
//!
//! Layout of the data directory (default `/var/lib/bcd`):
//!
//! | file | what |
//! |---|---|
//! | `node.key` | the node's ECDSA P-256 key, PKCS#8 PEM, mode 0600 |
//! | `node.crt` | its certificate from the fleet CA, PEM |
//! | `ca.crt` | the fleet CA, pinned at join, PEM |
//! | `identity.json` | node id, server, serial, expiry, server time mark, highest epoch |
//! | `journal.db` | the journal (see `journal`) |
//! | `bcd.lock` | held by the one bcd process using the directory |
//!
//! `identity.json` is written last at join: it is the commit point, and a
//! directory without it holds no identity. Every write is atomic.
//!
//! # Format versions
//!
//! `identity.json` carries `version`. This bcd writes [`IDENTITY_VERSION`]
//! and reads every version up to it; a file from a newer bcd is refused
//! ([`IdentityError::Newer`]), never misread. Version 1 is frozen: it was
//! first written without `cert_issued_ms`, `next` and `release_keys`
//! (those shapes still load, with the defaults below), and anything added
//! from now on is version 2, with its own reader and a migration from 1.
//! Golden files in `testdata/identity/` pin what this code writes and every
//! earlier shape it reads (`tests/formats.rs`).
//!
//! A release must not write a version the previous release cannot read
//! until it has confirmed (`bcd_core::update`): until then it can be
//! swapped back to that release, which would refuse the file.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rcgen::PublicKeyData;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use bcd_sys::fs::{self as fsutil, FsError};

pub const IDENTITY: &str = "identity.json";
pub const KEY: &str = "node.key";
pub const CERT: &str = "node.crt";
pub const CA: &str = "ca.crt";
pub const JOURNAL: &str = "journal.db";

/// The `identity.json` format this bcd writes (and the newest it reads).
pub const IDENTITY_VERSION: u32 = 1;

/// The files `bcd join --reset` moves aside, identity last.
const RESET_FILES: &[&str] = &[
    KEY,
    CERT,
    CA,
    "journal.db",
    "journal.db-wal",
    "journal.db-shm",
    IDENTITY,
];

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "no identity in {dir}: join first: bcd join --server https://HOST:PORT --token TOKEN \
         --data-dir {dir}"
    )]
    NotJoined { dir: PathBuf },
    #[error(
        "{path} is unreadable or corrupt ({reason}): join again: bcd join --reset --yes, then \
         bcd join"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "the node key does not match the node certificate in {dir}: join again: bcd join --reset \
         --yes, then bcd join"
    )]
    KeyMismatch { dir: PathBuf },
    #[error(
        "{path} is format version {version}, written by a newer bcd (this one reads up to \
         {known}): run that release of bcd or a newer one"
    )]
    Newer {
        path: PathBuf,
        version: u32,
        known: u32,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("cannot move {path} aside")]
    MoveAside {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The contents of `identity.json`, format version 1.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdentityFile {
    pub version: u32,
    pub node_id: String,
    pub server: String,
    pub cert_serial: String,
    pub cert_not_after_ms: i64,
    pub identity_generation: u64,
    /// Server time mark, unix ms: only moves forward.
    pub server_time_mark_ms: i64,
    /// Highest session epoch accepted.
    pub last_epoch: u64,
    #[serde(default)]
    pub ramdisk: bool,
    /// Worker public keys (ed25519, hex) learned at join.
    #[serde(default)]
    pub worker_keys: Vec<String>,
    /// Release public keys (ed25519, hex) learned at join: the releases this
    /// node installs.
    #[serde(default)]
    pub release_keys: Vec<String>,
    /// Server time the current certificate was issued at, unix ms.
    #[serde(default)]
    pub cert_issued_ms: i64,
    /// A renewed certificate being installed (see [`Identity::install_renewal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextCert>,
}

/// What identity.json records about a renewed certificate before its files
/// replace the current ones: the commit point of a renewal.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NextCert {
    pub serial: String,
    pub not_after_ms: i64,
    pub issued_ms: i64,
}

const NEXT: &str = ".next";

fn next_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{NEXT}"))
}

#[derive(Debug, Clone)]
pub struct Identity {
    pub dir: PathBuf,
    pub file: IdentityFile,
    pub key_pem: String,
    pub cert: CertificateDer<'static>,
    pub ca: CertificateDer<'static>,
}

fn corrupt(path: &Path, reason: impl std::fmt::Display) -> IdentityError {
    IdentityError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, IdentityError> {
    fs::read(path).map_err(|e| corrupt(path, e))
}

/// Reads `identity.json` of any version this bcd knows.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<IdentityFile, IdentityError> {
    #[derive(Deserialize)]
    struct Probe {
        version: Option<u32>,
    }
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| corrupt(path, e))?;
    match probe.version {
        Some(1) => {
            let file: IdentityFile = serde_json::from_slice(bytes).map_err(|e| corrupt(path, e))?;
            if file.node_id.is_empty() {
                return Err(corrupt(path, "no node id"));
            }
            Ok(file)
        }
        Some(version) if version > IDENTITY_VERSION => Err(IdentityError::Newer {
            path: path.to_path_buf(),
            version,
            known: IDENTITY_VERSION,
        }),
        Some(version) => Err(corrupt(path, format!("unknown format version {version}"))),
        None => Err(corrupt(path, "no format version")),
    }
}

pub fn exists(dir: &Path) -> bool {
    dir.join(IDENTITY).exists()
}

impl Identity {
    pub fn load(dir: &Path) -> Result<Identity, IdentityError> {
        let id_path = dir.join(IDENTITY);
        if !id_path.exists() {
            return Err(IdentityError::NotJoined {
                dir: dir.to_path_buf(),
            });
        }
        let mut file = parse(&id_path, &read(&id_path)?)?;
        settle_renewal(dir, &mut file)?;
        let key_path = dir.join(KEY);
        let key_pem = String::from_utf8(read(&key_path)?).map_err(|e| corrupt(&key_path, e))?;
        let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|e| corrupt(&key_path, e))?;
        let cert_path = dir.join(CERT);
        let cert = CertificateDer::from_pem_slice(&read(&cert_path)?)
            .map_err(|e| corrupt(&cert_path, e))?;
        let ca_path = dir.join(CA);
        let ca =
            CertificateDer::from_pem_slice(&read(&ca_path)?).map_err(|e| corrupt(&ca_path, e))?;
        // The certificate embeds the subject public key info verbatim.
        let spki = key.subject_public_key_info();
        if !cert.windows(spki.len()).any(|w| w == spki.as_slice()) {
            return Err(IdentityError::KeyMismatch {
                dir: dir.to_path_buf(),
            });
        }
        Ok(Identity {
            dir: dir.to_path_buf(),
            file,
            key_pem,
            cert,
            ca,
        })
    }

    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .expect("the key parsed when the identity was loaded")
    }

    /// Writes every file of a new identity; `identity.json` last.
    pub fn create(
        dir: &Path,
        file: IdentityFile,
        key_pem: String,
        cert: CertificateDer<'static>,
        ca: CertificateDer<'static>,
    ) -> Result<Identity, IdentityError> {
        fsutil::atomic_write(&dir.join(KEY), key_pem.as_bytes(), 0o600)?;
        fsutil::atomic_write(&dir.join(CERT), pem("CERTIFICATE", &cert).as_bytes(), 0o644)?;
        fsutil::atomic_write(&dir.join(CA), pem("CERTIFICATE", &ca).as_bytes(), 0o644)?;
        let id = Identity {
            dir: dir.to_path_buf(),
            file,
            key_pem,
            cert,
            ca,
        };
        id.save_state()?;
        Ok(id)
    }

    /// The current certificate's life on server time, for the renewal
    /// schedule (`bcd_core::renewal`).
    pub fn cert_life(&self) -> bcd_core::CertLife {
        let not_after_ms = self.file.cert_not_after_ms;
        let issued_ms = if self.file.cert_issued_ms > 0 {
            self.file.cert_issued_ms
        } else {
            // Written before issue times were kept: assume the longest
            // life the CA grants.
            not_after_ms - bcd_core::renewal::MAX_CERT_LIFE_MS
        };
        bcd_core::CertLife {
            issued_ms,
            not_after_ms,
        }
    }

    /// Installs a renewed key and certificate so that a crash at any point
    /// leaves either the old pair or the new one:
    /// 1. write `node.key.next` and `node.crt.next`;
    /// 2. record the new serial in identity.json (`next`): the commit point;
    /// 3. rename both over the current files;
    /// 4. make the new serial current in identity.json.
    ///
    /// [`Identity::load`] finishes steps 3–4 after a crash past step 2, and
    /// removes leftovers of a renewal that never reached it.
    pub fn install_renewal(
        &mut self,
        key_pem: String,
        cert: CertificateDer<'static>,
        next: NextCert,
    ) -> Result<(), IdentityError> {
        fsutil::atomic_write(&next_path(&self.dir, KEY), key_pem.as_bytes(), 0o600)?;
        fsutil::atomic_write(
            &next_path(&self.dir, CERT),
            pem("CERTIFICATE", &cert).as_bytes(),
            0o644,
        )?;
        self.file.next = Some(next);
        self.save_state()?;
        settle_renewal(&self.dir, &mut self.file)?;
        self.key_pem = key_pem;
        self.cert = cert;
        Ok(())
    }

    /// Rewrites `identity.json` (the mark and the epoch change over time).
    pub fn save_state(&self) -> Result<(), IdentityError> {
        write_file(&self.dir, &self.file)
    }
}

/// Writes `identity.json` in the current format version.
fn write_file(dir: &Path, file: &IdentityFile) -> Result<(), IdentityError> {
    let mut file = file.clone();
    file.version = IDENTITY_VERSION;
    let json = serde_json::to_vec_pretty(&file).expect("identity serializes");
    fsutil::atomic_write(&dir.join(IDENTITY), &json, 0o600)?;
    Ok(())
}

/// Finishes or discards an interrupted renewal (see
/// [`Identity::install_renewal`]).
fn settle_renewal(dir: &Path, file: &mut IdentityFile) -> Result<(), IdentityError> {
    let moved = |path: &Path, source| IdentityError::MoveAside {
        path: path.to_path_buf(),
        source,
    };
    match file.next.take() {
        Some(next) => {
            for name in [KEY, CERT] {
                let from = next_path(dir, name);
                if from.exists() {
                    fs::rename(&from, dir.join(name)).map_err(|e| moved(&from, e))?;
                }
            }
            fsutil::sync_dir(dir).map_err(|e| moved(dir, e))?;
            file.cert_serial = next.serial;
            file.cert_not_after_ms = next.not_after_ms;
            file.cert_issued_ms = next.issued_ms;
            write_file(dir, file)?;
        }
        None => {
            for name in [KEY, CERT] {
                let stray = next_path(dir, name);
                if stray.exists() {
                    fs::remove_file(&stray).map_err(|e| moved(&stray, e))?;
                }
            }
        }
    }
    Ok(())
}

/// Moves the identity and journal aside as `<name>.reset-<UTC time>`; never
/// deletes. Returns the new paths.
pub fn reset(dir: &Path) -> Result<Vec<PathBuf>, IdentityError> {
    let stamp = utc_stamp(SystemTime::now());
    let mut moved = Vec::new();
    for name in RESET_FILES {
        let path = dir.join(name);
        if path.exists() {
            let to = fsutil::aside_name(&path, "reset", &stamp);
            fs::rename(&path, &to).map_err(|source| IdentityError::MoveAside {
                path: path.clone(),
                source,
            })?;
            moved.push(to);
        }
    }
    fsutil::sync_dir(dir).map_err(|source| IdentityError::MoveAside {
        path: dir.to_path_buf(),
        source,
    })?;
    Ok(moved)
}

/// `20261129T101500Z`: compact UTC time for file names.
pub fn utc_stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace(['-', ':'], "")
}

pub fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ascii"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_is_compact_utc() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
        assert_eq!(utc_stamp(t), "20261118T110640Z");
    }

    #[test]
    fn missing_identity_says_how_to_join() {
        let d = tempfile::tempdir().unwrap();
        let e = Identity::load(d.path()).unwrap_err().to_string();
        assert!(e.contains("bcd join --server"), "{e}");
    }

    #[test]
    fn corrupt_identity_says_how_to_recover() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(IDENTITY), b"{\"version\": 1, \"node_id\": ").unwrap();
        let e = Identity::load(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("corrupt") && e.contains("bcd join --reset --yes"),
            "{e}"
        );
    }

    fn pair(cn: &str) -> (String, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec![cn.to_string()]).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from_slice(cn.as_bytes()));
        let cert = params.self_signed(&key).unwrap();
        (key.serialize_pem(), cert.der().clone())
    }

    fn identity(dir: &Path) -> Identity {
        let (key, cert) = pair("old");
        let file = IdentityFile {
            version: 1,
            node_id: "nd-1".into(),
            server: "https://127.0.0.1:1".into(),
            cert_serial: "old".into(),
            cert_not_after_ms: 1_000_000,
            identity_generation: 1,
            server_time_mark_ms: 0,
            last_epoch: 0,
            ramdisk: false,
            worker_keys: vec![],
            release_keys: vec![],
            cert_issued_ms: 0,
            next: None,
        };
        let (_, ca) = pair("ca");
        Identity::create(dir, file, key, cert, ca).unwrap()
    }

    #[test]
    fn renewal_installs_the_new_pair_and_survives_a_crash_at_every_step() {
        let next = NextCert {
            serial: "new".into(),
            not_after_ms: 2_000_000,
            issued_ms: 1_500_000,
        };
        // Completed.
        let d = tempfile::tempdir().unwrap();
        let mut id = identity(d.path());
        let (key, cert) = pair("new");
        id.install_renewal(key.clone(), cert.clone(), next.clone())
            .unwrap();
        let loaded = Identity::load(d.path()).unwrap();
        assert_eq!(loaded.file.cert_serial, "new");
        assert_eq!(loaded.cert, cert);
        assert_eq!(loaded.file.next, None);
        assert_eq!(loaded.cert_life().renew_at_ms(), 1_500_000 + 300_000);

        // Crash before the commit point: the old pair stays, leftovers go.
        let d = tempfile::tempdir().unwrap();
        let old = identity(d.path());
        fs::write(next_path(d.path(), KEY), &key).unwrap();
        fs::write(next_path(d.path(), CERT), pem("CERTIFICATE", &cert)).unwrap();
        let loaded = Identity::load(d.path()).unwrap();
        assert_eq!(
            (loaded.file.cert_serial.as_str(), &loaded.cert),
            ("old", &old.cert)
        );
        assert!(!next_path(d.path(), KEY).exists() && !next_path(d.path(), CERT).exists());

        // Crash after the commit point, with the key already renamed and the
        // certificate not: loading rolls forward to a consistent new pair.
        let d = tempfile::tempdir().unwrap();
        let mut old = identity(d.path());
        fs::write(d.path().join(KEY), &key).unwrap();
        fs::write(next_path(d.path(), CERT), pem("CERTIFICATE", &cert)).unwrap();
        old.file.next = Some(next);
        old.save_state().unwrap();
        let loaded = Identity::load(d.path()).unwrap();
        assert_eq!(
            (loaded.file.cert_serial.as_str(), &loaded.cert),
            ("new", &cert)
        );
        assert_eq!(loaded.key_pem, key);
    }

    #[test]
    fn reset_moves_aside_and_deletes_nothing() {
        let d = tempfile::tempdir().unwrap();
        for f in [IDENTITY, KEY, CERT, JOURNAL] {
            fs::write(d.path().join(f), f).unwrap();
        }
        let moved = reset(d.path()).unwrap();
        assert_eq!(moved.len(), 4);
        assert!(!exists(d.path()));
        for m in moved {
            let name = m.file_name().unwrap().to_string_lossy().to_string();
            assert!(name.contains(".reset-"), "{name}");
            let original = name.split(".reset-").next().unwrap().to_string();
            assert_eq!(fs::read_to_string(&m).unwrap(), original);
        }
    }
}
