//! The node's identity on disk: who it is, the key that proves it, the
//! server time mark and the replay floors.
//!
//! Layout of the data directory (default `/var/lib/bcd`):
//!
//! | file | what |
//! |---|---|
//! | `node.key` | the node's ECDSA P-256 key, PKCS#8 PEM, mode 0600; or, joined with `--attestor tpm`, the `bcd-tpm-key` record the TPM derives the key from (`crate::tpm_key`) |
//! | `node.crt` | its certificate from the fleet CA, PEM |
//! | `ca.crt` | the fleet CA, pinned at join, PEM |
//! | `identity.json` | node id, server, serial, expiry, server time mark (with the base that bounds it), highest epoch, replay floors |
//! | `journal.db` | the journal (see `journal`) |
//! | `bcd.lock` | held by the one bcd process using the directory |
//!
//! `identity.json` is written last at join: it is the commit point, and a
//! directory without it holds no identity. Every write is atomic.
//!
//! `bcd join --reset` moves these files aside as `<name>.reset-<UTC time>`;
//! the newest key and certificate among them (or a `node.key` and
//! `node.crt` left without `identity.json`) are what the next join proves
//! to re-enrol the same node ([`previous`]).
//!
//! # Format versions
//!
//! `identity.json` carries `version`. This bcd writes [`IDENTITY_VERSION`]
//! and reads every version up to it; a file from a newer bcd is refused
//! ([`IdentityError::Newer`]), never misread. Golden files in
//! `testdata/identity/` pin what this code writes and every earlier shape
//! it reads (`tests/formats.rs`).
//!
//! - Version 1 (frozen): first written without `cert_issued_ms`, `next`
//!   and `release_keys` (those shapes still load, with defaults).
//! - Version 2 adds `replay_floors` (the highest command sequence and spec
//!   generation the node took on: kept here because a ramdisk node loses
//!   its journal at every boot) and `clock_base` (what bounds how far the
//!   server time mark may move; see `bcd_core::clock`). Reading version 1
//!   migrates it: floors 0, no base (a base starts at the next start).
//! - Both versions later gained `image_keys` (the netboot image keys
//!   learned at join), written only when there are some: a file without
//!   it (every file an earlier release wrote) loads with none, and an
//!   earlier release reading a file with it ignores it. They gained
//!   `hello_seq` (the count of the node's signed Hellos), `last_boot_id`
//!   and `last_journal_id` (those of the last session a Welcome
//!   confirmed) the same way: written once there is one, 0 or empty when
//!   absent.
//!
//! A release must not write a version the previous release cannot read
//! until it has confirmed (`bcd_core::update`): until then it can be
//! swapped back to that release, which would refuse the file. So
//! [`Identity::write_version`] is 1 while this binary is an unconfirmed
//! upgrade (the floors and the base then live in memory only; the journal
//! still holds what the floors guard), and 2 from its confirmation on.

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
pub const IDENTITY_VERSION: u32 = 2;

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

/// The contents of `identity.json`, format version 2 (version 1 is the
/// same without `replay_floors` and `clock_base`).
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
    /// Netboot image public keys (ed25519, hex) learned at join: the images
    /// `boot.kexec image=` loads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_keys: Vec<String>,
    /// Server time the current certificate was issued at, unix ms.
    #[serde(default)]
    pub cert_issued_ms: i64,
    /// A renewed certificate being installed (see [`Identity::install_renewal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<NextCert>,
    /// Version 2: what this node took on, journal or not.
    pub replay_floors: ReplayFloors,
    /// Version 2: what bounds the server time mark (`None` until a session
    /// of this version ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_base: Option<ClockBase>,
    /// This identity's Hellos counted so far (on through renewals): the
    /// count of the last signed Hello proof (`bcd_proto::hello`). Written
    /// before the proof is signed, so no count is signed twice.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hello_seq: u64,
    /// The boot and the journal of the last session a Welcome confirmed:
    /// what the next start's Hello proofs say came before (so a reader can
    /// tell the node rebooted or lost its journal since).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_boot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_journal_id: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The highest command sequence and spec generation this node accepted.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplayFloors {
    pub command_seq: u64,
    pub spec_generation: u64,
}

/// A server time known to have passed at a reading of one boot's boot
/// clock (`bcd_core::clock::Base`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClockBase {
    pub boot_id: String,
    pub boot_ms: i64,
    pub server_ms: i64,
}

impl IdentityFile {
    /// The persisted server time mark, for `bcd_core::ServerClock`.
    pub fn mark(&self) -> bcd_core::Mark {
        bcd_core::Mark {
            ms: self.server_time_mark_ms,
            base: self.clock_base.as_ref().map(|b| bcd_core::clock::Base {
                boot_id: b.boot_id.clone(),
                boot_ms: b.boot_ms,
                server_ms: b.server_ms,
            }),
        }
    }

    /// Takes the mark to persist.
    pub fn set_mark(&mut self, mark: &bcd_core::Mark) {
        self.server_time_mark_ms = mark.ms;
        self.clock_base = mark.base.as_ref().map(|b| ClockBase {
            boot_id: b.boot_id.clone(),
            boot_ms: b.boot_ms,
            server_ms: b.server_ms,
        });
    }
}

/// Version 1 of `identity.json`, as that version wrote it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct IdentityFileV1 {
    version: u32,
    node_id: String,
    server: String,
    cert_serial: String,
    cert_not_after_ms: i64,
    identity_generation: u64,
    server_time_mark_ms: i64,
    last_epoch: u64,
    #[serde(default)]
    ramdisk: bool,
    #[serde(default)]
    worker_keys: Vec<String>,
    #[serde(default)]
    release_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    image_keys: Vec<String>,
    #[serde(default)]
    cert_issued_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    next: Option<NextCert>,
    #[serde(default, skip_serializing_if = "is_zero")]
    hello_seq: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    last_boot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    last_journal_id: String,
}

impl From<IdentityFileV1> for IdentityFile {
    fn from(v: IdentityFileV1) -> IdentityFile {
        IdentityFile {
            version: 1,
            node_id: v.node_id,
            server: v.server,
            cert_serial: v.cert_serial,
            cert_not_after_ms: v.cert_not_after_ms,
            identity_generation: v.identity_generation,
            server_time_mark_ms: v.server_time_mark_ms,
            last_epoch: v.last_epoch,
            ramdisk: v.ramdisk,
            worker_keys: v.worker_keys,
            release_keys: v.release_keys,
            image_keys: v.image_keys,
            cert_issued_ms: v.cert_issued_ms,
            next: v.next,
            replay_floors: ReplayFloors::default(),
            clock_base: None,
            hello_seq: v.hello_seq,
            last_boot_id: v.last_boot_id,
            last_journal_id: v.last_journal_id,
        }
    }
}

impl From<&IdentityFile> for IdentityFileV1 {
    fn from(f: &IdentityFile) -> IdentityFileV1 {
        IdentityFileV1 {
            version: 1,
            node_id: f.node_id.clone(),
            server: f.server.clone(),
            cert_serial: f.cert_serial.clone(),
            cert_not_after_ms: f.cert_not_after_ms,
            identity_generation: f.identity_generation,
            server_time_mark_ms: f.server_time_mark_ms,
            last_epoch: f.last_epoch,
            ramdisk: f.ramdisk,
            worker_keys: f.worker_keys.clone(),
            release_keys: f.release_keys.clone(),
            image_keys: f.image_keys.clone(),
            cert_issued_ms: f.cert_issued_ms,
            next: f.next.clone(),
            hello_seq: f.hello_seq,
            last_boot_id: f.last_boot_id.clone(),
            last_journal_id: f.last_journal_id.clone(),
        }
    }
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
    /// The format version [`Identity::save_state`] writes: the previous one
    /// while this binary is an unconfirmed upgrade (see the module docs).
    pub write_version: u32,
    /// The node key in the TPM, once [`Identity::attach_tpm`] checked it
    /// (`node.key` is then a `bcd-tpm-key` record, not a key).
    pub tpm: Option<std::sync::Arc<crate::tpm_key::TpmKey>>,
    /// The TLS client configuration [`Identity::client_config`] last built,
    /// shared by this identity's clones (each dial takes one): its session
    /// cache is what lets the next dial resume.
    tls: TlsCache,
}

/// The client configuration last built, shared by an identity's clones.
#[derive(Debug, Clone, Default)]
struct TlsCache(std::sync::Arc<std::sync::Mutex<Option<Built>>>);

/// A client configuration and the certificate and CA it was built for.
#[derive(Debug)]
struct Built {
    cert: CertificateDer<'static>,
    ca: CertificateDer<'static>,
    config: std::sync::Arc<rustls::ClientConfig>,
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
    let file: IdentityFile = match probe.version {
        Some(1) => serde_json::from_slice::<IdentityFileV1>(bytes)
            .map_err(|e| corrupt(path, e))?
            .into(),
        Some(2) => serde_json::from_slice(bytes).map_err(|e| corrupt(path, e))?,
        Some(version) if version > IDENTITY_VERSION => {
            return Err(IdentityError::Newer {
                path: path.to_path_buf(),
                version,
                known: IDENTITY_VERSION,
            });
        }
        Some(version) => return Err(corrupt(path, format!("unknown format version {version}"))),
        None => return Err(corrupt(path, "no format version")),
    };
    if file.node_id.is_empty() {
        return Err(corrupt(path, "no node id"));
    }
    Ok(file)
}

/// Whether `node.key` holds a TPM key record rather than a key.
pub fn is_tpm_record(key: &str) -> bool {
    key.trim_start().starts_with("bcd-tpm-key ")
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
        // A file rewritten while settling keeps its version: the binary that
        // loads it may be an unconfirmed upgrade.
        let version = file.version.min(IDENTITY_VERSION);
        settle_renewal(dir, &mut file, version)?;
        let key_path = dir.join(KEY);
        let key_pem = String::from_utf8(read(&key_path)?).map_err(|e| corrupt(&key_path, e))?;
        let cert_path = dir.join(CERT);
        let cert = CertificateDer::from_pem_slice(&read(&cert_path)?)
            .map_err(|e| corrupt(&cert_path, e))?;
        let ca_path = dir.join(CA);
        let ca =
            CertificateDer::from_pem_slice(&read(&ca_path)?).map_err(|e| corrupt(&ca_path, e))?;
        if is_tpm_record(&key_pem) {
            // The TPM derives the key: Identity::attach_tpm checks it.
            bcd_tpm::NodeKeyRecord::parse_text(&key_pem).map_err(|e| corrupt(&key_path, e))?;
        } else {
            let key = rcgen::KeyPair::from_pem(&key_pem).map_err(|e| corrupt(&key_path, e))?;
            // The certificate embeds the subject public key info verbatim.
            let spki = key.subject_public_key_info();
            if !cert.windows(spki.len()).any(|w| w == spki.as_slice()) {
                return Err(IdentityError::KeyMismatch {
                    dir: dir.to_path_buf(),
                });
            }
        }
        Ok(Identity {
            dir: dir.to_path_buf(),
            file,
            key_pem,
            cert,
            ca,
            write_version: IDENTITY_VERSION,
            tpm: None,
            tls: TlsCache::default(),
        })
    }

    /// The record of the node key when it lives in the TPM.
    pub fn tpm_record(&self) -> Option<bcd_tpm::NodeKeyRecord> {
        is_tpm_record(&self.key_pem)
            .then(|| bcd_tpm::NodeKeyRecord::parse_text(&self.key_pem).ok())
            .flatten()
    }

    /// Opens the TPM `endpoint` (through its backend) for a TPM-held node
    /// key and checks it holds this identity (the AK the certificate names,
    /// the key the record derives), in the spec's words when it does not.
    /// Blocks.
    pub fn attach_tpm(&mut self, endpoint: bcd_tpm::TpmAt) -> Result<(), String> {
        let Some(record) = self.tpm_record() else {
            return Ok(());
        };
        let key = crate::tpm_key::TpmKey::for_certificate(endpoint, record, &self.cert)?;
        self.tpm = Some(std::sync::Arc::new(key));
        Ok(())
    }

    /// Signs `message` with the node key (ECDSA P-256, ASN.1 DER): in the
    /// TPM when it is there, never with a file key in its place.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        if self.tpm_record().is_some() {
            let tpm = self
                .tpm
                .as_ref()
                .ok_or("the node key is in the TPM, which this process has not opened")?;
            return tpm.sign(message).map_err(|e| bcd_sys::error::chain(&e));
        }
        let key = rcgen::KeyPair::from_pem(&self.key_pem).map_err(|e| e.to_string())?;
        rcgen::SigningKey::sign(&key, message).map_err(|e| e.to_string())
    }

    /// The TLS client configuration that presents this identity's
    /// certificate and trusts only the fleet CA: signing through the TPM
    /// for a TPM-held key. The same one while the certificate and the CA
    /// stay, so a dial resumes the session of the one before it (the
    /// gateway's ticket); a renewed certificate gets a new one, which
    /// never resumes a session made with the old.
    pub fn client_config(&self) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
        let mut cache = self.tls.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(built) = cache.as_ref()
            && built.cert == self.cert
            && built.ca == self.ca
        {
            return Ok(built.config.clone());
        }
        let config = self.build_client_config()?;
        *cache = Some(Built {
            cert: self.cert.clone(),
            ca: self.ca.clone(),
            config: config.clone(),
        });
        Ok(config)
    }

    fn build_client_config(&self) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
        use bcd_proto::tls::{self, ClientIdentity, ClientSigner, ServerTrust};
        let trust = ServerTrust::Ca(self.ca.clone());
        let config = if self.tpm_record().is_some() {
            let tpm = self
                .tpm
                .as_ref()
                .ok_or("the node key is in the TPM, which this process has not opened")?;
            tls::client_config_signed(
                trust,
                ClientSigner {
                    chain: vec![self.cert.clone()],
                    key: tpm.rustls_key(),
                },
            )
        } else {
            tls::client_config(
                trust,
                Some(ClientIdentity {
                    chain: vec![self.cert.clone()],
                    key: self.private_key(),
                }),
            )
        };
        config.map_err(|e| format!("{e:#}"))
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
            write_version: IDENTITY_VERSION,
            tpm: None,
            tls: TlsCache::default(),
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
        settle_renewal(&self.dir, &mut self.file, self.write_version)?;
        self.key_pem = key_pem;
        self.cert = cert;
        Ok(())
    }

    /// Rewrites `identity.json` (the mark, the epoch and the floors change
    /// over time) in [`Identity::write_version`].
    pub fn save_state(&self) -> Result<(), IdentityError> {
        write_file(&self.dir, &self.file, self.write_version)
    }

    /// [`Identity::save_state`] on tokio's blocking pool, for a write in
    /// the hot path of many daemons sharing a runtime: its two fsyncs
    /// (the file, its directory) then hold no runtime thread, and the
    /// filesystem commits many daemons' writes together. The caller waits
    /// for it as before. Were the caller dropped meanwhile, the write goes
    /// on to its end; identity writes never share a temporary file, so a
    /// daemon started in the dropped one's place writes beside it safely.
    pub async fn save_state_blocking_pool(&self) -> Result<(), IdentityError> {
        // Encoded here: the pool's threads only write, so they allocate
        // (and keep in their malloc arenas) next to nothing.
        let bytes = encode(&self.file, self.write_version);
        let path = self.dir.join(IDENTITY);
        let target = path.clone();
        tokio::task::spawn_blocking(move || fsutil::atomic_write_shared(&target, &bytes, 0o600))
            .await
            .unwrap_or_else(|e| {
                Err(FsError::Write {
                    path,
                    source: io::Error::other(e),
                })
            })
            .map_err(IdentityError::from)
    }

    /// Raises the floors (never lowers them) and writes them before the
    /// caller acts on what they guard; nothing is written when they do not
    /// rise.
    pub fn raise_floors(&mut self, floors: ReplayFloors) -> Result<(), IdentityError> {
        let f = &mut self.file.replay_floors;
        let raised = ReplayFloors {
            command_seq: f.command_seq.max(floors.command_seq),
            spec_generation: f.spec_generation.max(floors.spec_generation),
        };
        if raised == *f {
            return Ok(());
        }
        *f = raised;
        self.save_state()
    }
}

/// Writes `identity.json` in format `version` (1 or the current one).
fn write_file(dir: &Path, file: &IdentityFile, version: u32) -> Result<(), IdentityError> {
    fsutil::atomic_write_shared(&dir.join(IDENTITY), &encode(file, version), 0o600)?;
    Ok(())
}

/// `identity.json`'s bytes in format `version`.
fn encode(file: &IdentityFile, version: u32) -> Vec<u8> {
    if version == 1 {
        serde_json::to_vec_pretty(&IdentityFileV1::from(file))
    } else {
        let mut file = file.clone();
        file.version = IDENTITY_VERSION;
        serde_json::to_vec_pretty(&file)
    }
    .expect("identity serializes")
}

/// Finishes or discards an interrupted renewal (see
/// [`Identity::install_renewal`]).
fn settle_renewal(dir: &Path, file: &mut IdentityFile, version: u32) -> Result<(), IdentityError> {
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
            write_file(dir, file, version)?;
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
    let stamp = utc_stamp(bcd_sys::clock::system_now());
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

/// The key of an earlier identity of this machine, found on disk: what a
/// join proves to re-enrol that node rather than create another.
#[derive(Debug, Clone)]
pub struct Previous {
    pub node_id: String,
    pub key_pem: String,
    /// Where the key and its certificate were found.
    pub key_path: PathBuf,
    pub cert_path: PathBuf,
    /// The boot and the journal of that identity's last confirmed session,
    /// from the `identity.json` moved aside with the pair (empty when there
    /// is none): what the re-enrolled identity's first Hello proof says came
    /// before, so an ending it drives (a reboot, a lost journal) is proved.
    pub last_boot_id: String,
    pub last_journal_id: String,
}

/// Finds the node key of this machine's latest earlier identity: `node.key`
/// and `node.crt` still in `dir` when there is no `identity.json` (the file
/// was lost), else the newest pair `bcd join --reset` moved aside
/// (`node.key.reset-STAMP` and `node.crt.reset-STAMP`, one stamp). The node
/// id is the one the certificate names (`urn:bc:node:ID`), and the key must
/// be the certificate's: a pair that does not read so is passed over.
/// `identity.json` is not needed.
pub fn previous(dir: &Path) -> Option<Previous> {
    if !exists(dir)
        && let Some(p) = previous_pair(dir.join(KEY), dir.join(CERT), None)
    {
        return Some(p);
    }
    let prefix = format!("{KEY}.reset-");
    let mut stamps: Vec<String> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some(name.strip_prefix(&prefix)?.to_string())
        })
        .collect();
    // Compact UTC stamps sort in time order; the newest first.
    stamps.sort_unstable_by(|a, b| b.cmp(a));
    stamps.into_iter().find_map(|stamp| {
        previous_pair(
            dir.join(format!("{KEY}.reset-{stamp}")),
            dir.join(format!("{CERT}.reset-{stamp}")),
            Some(dir.join(format!("{IDENTITY}.reset-{stamp}"))),
        )
    })
}

fn previous_pair(
    key_path: PathBuf,
    cert_path: PathBuf,
    identity: Option<PathBuf>,
) -> Option<Previous> {
    let key_pem = fs::read_to_string(&key_path).ok()?;
    let key = rcgen::KeyPair::from_pem(&key_pem).ok()?;
    let cert = CertificateDer::from_pem_slice(&fs::read(&cert_path).ok()?).ok()?;
    let spki = key.subject_public_key_info();
    if !cert.windows(spki.len()).any(|w| w == spki.as_slice()) {
        return None;
    }
    // The last confirmed session, if the identity file moved aside with
    // the pair reads (any version: only these two fields are taken).
    let last: Option<serde_json::Value> = identity
        .and_then(|p| fs::read(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok());
    let field = |name: &str| -> String {
        last.as_ref()
            .and_then(|v| v.get(name)?.as_str().map(str::to_string))
            .unwrap_or_default()
    };
    Some(Previous {
        node_id: cert_node_id(&cert)?,
        last_boot_id: field("last_boot_id"),
        last_journal_id: field("last_journal_id"),
        key_pem,
        key_path,
        cert_path,
    })
}

/// The node id a node certificate names in its subject alternative name,
/// `urn:bc:node:ID` (a URI, context tag 6, short form length).
pub fn cert_node_id(der: &[u8]) -> Option<String> {
    const URN: &[u8] = b"urn:bc:node:";
    let at = der.windows(URN.len()).position(|w| w == URN)?;
    let (tag, len) = (*der.get(at.checked_sub(2)?)?, usize::from(der[at - 1]));
    if tag != 0x86 || len <= URN.len() || len > 0x7f {
        return None;
    }
    let id = std::str::from_utf8(der.get(at + URN.len()..at + len)?).ok()?;
    bcd_proto::reenrol::valid_node_id(id).then(|| id.to_string())
}

/// `20261129T101500Z`: compact UTC time for file names.
pub fn utc_stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace(['-', ':'], "")
}

/// A PEM block: `label` and `der`, base64 in 64-column lines, LF.
pub fn pem(label: &str, der: &[u8]) -> String {
    ::pem::encode_config(
        &::pem::Pem::new(label, der),
        ::pem::EncodeConfig::new().set_line_ending(::pem::LineEnding::LF),
    )
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
            image_keys: vec![],
            cert_issued_ms: 0,
            next: None,
            replay_floors: ReplayFloors::default(),
            clock_base: None,
            hello_seq: 0,
            last_boot_id: String::new(),
            last_journal_id: String::new(),
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

    /// A certificate shaped as the fleet CA issues them: the node id in a
    /// URI subject alternative name.
    fn node_pair(node_id: &str) -> (String, CertificateDer<'static>) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            format!("urn:bc:node:{node_id}").try_into().unwrap(),
        )];
        let cert = params.self_signed(&key).unwrap();
        (key.serialize_pem(), cert.der().clone())
    }

    #[test]
    fn the_client_configuration_is_kept_per_certificate() {
        let d = tempfile::tempdir().unwrap();
        let mut id = identity(d.path());
        let first = id.client_config().unwrap();
        // A clone (each dial takes one) gets the same configuration, and
        // with it the sessions the last dial can resume.
        let clone = id.clone();
        assert!(std::sync::Arc::ptr_eq(
            &first,
            &clone.client_config().unwrap()
        ));
        // A renewed certificate gets a configuration of its own.
        let (key, cert) = pair("new");
        id.key_pem = key;
        id.cert = cert;
        let renewed = id.client_config().unwrap();
        assert!(!std::sync::Arc::ptr_eq(&first, &renewed));
        assert!(std::sync::Arc::ptr_eq(
            &renewed,
            &id.client_config().unwrap()
        ));
    }

    #[test]
    fn the_previous_key_is_the_newest_reset_pair_or_the_one_left_without_identity() {
        let d = tempfile::tempdir().unwrap();
        assert!(previous(d.path()).is_none());
        let write = |suffix: &str, (key, cert): &(String, CertificateDer<'static>)| {
            fs::write(d.path().join(format!("{KEY}{suffix}")), key).unwrap();
            fs::write(
                d.path().join(format!("{CERT}{suffix}")),
                pem("CERTIFICATE", cert),
            )
            .unwrap();
        };
        write(".reset-20261101T000000Z", &node_pair("nd-000000000001"));
        write(".reset-20261102T000000Z", &node_pair("nd-000000000002"));
        let p = previous(d.path()).unwrap();
        assert_eq!(p.node_id, "nd-000000000002", "the newest reset");
        assert!(p.key_path.ends_with("node.key.reset-20261102T000000Z"));
        assert_eq!(
            (p.last_boot_id.as_str(), p.last_journal_id.as_str()),
            ("", "")
        );
        // The identity moved aside with it names its last session.
        fs::write(
            d.path().join(format!("{IDENTITY}.reset-20261102T000000Z")),
            r#"{"version":2,"node_id":"nd-000000000002","last_boot_id":"boot-7","last_journal_id":"jr-3"}"#,
        )
        .unwrap();
        let p = previous(d.path()).unwrap();
        assert_eq!(
            (p.last_boot_id.as_str(), p.last_journal_id.as_str()),
            ("boot-7", "jr-3")
        );
        // A pair whose key is not its certificate's is passed over.
        let (other_key, _) = node_pair("nd-000000000009");
        let (_, cert) = node_pair("nd-000000000003");
        write(".reset-20261103T000000Z", &(other_key, cert));
        assert_eq!(previous(d.path()).unwrap().node_id, "nd-000000000002");
        // A key and certificate left behind without identity.json come first.
        write("", &node_pair("nd-000000000004"));
        assert_eq!(previous(d.path()).unwrap().node_id, "nd-000000000004");
        // With identity.json, they are the current identity, not a previous.
        fs::write(d.path().join(IDENTITY), "{}").unwrap();
        assert_eq!(previous(d.path()).unwrap().node_id, "nd-000000000002");
    }

    #[test]
    fn a_certificate_without_a_node_urn_names_no_node() {
        let (_, cert) = pair("nd-1");
        assert_eq!(cert_node_id(&cert), None);
        let (_, cert) = node_pair("nd-0f3a9c");
        assert_eq!(cert_node_id(&cert).as_deref(), Some("nd-0f3a9c"));
        assert_eq!(cert_node_id(b"urn:bc:node:nd-1"), None);
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
