//! Secrets the node's spec gives its allocations: fetched from the broker
//! through the gateway that holds the session, written to
//! `<run-dir>/secrets/ALLOCATION/FILE` (mode 0400, in a memory-backed
//! directory only), removed when the spec stops naming them.
//!
//! Each fetch makes a one-time X25519 key, signs the request with the node
//! key (`bcd_proto::secret::request_statement`) and sends it on the
//! session's own connection. The answer must be a delivery signed by a
//! ticket key of the spec this node enforces, for exactly the request it
//! made; only then is the JWE opened with the one-time key, which is gone
//! after it. A value never goes to the journal, a log line, an event or a
//! metric. While the broker is unreachable the section stays progressing
//! and the fetch is retried with back-off; a value already written stays.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bcd_core::report::Status;
use bcd_proto::secret::{self, OneTimeKey, Request};
use bcd_proto::ticket::Jwks;
use bcd_proto::v1;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Agent;
use super::conn::Conn;
use crate::converge::Outcome;

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The first retry after a failed fetch; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The directory under the run directory.
pub const DIR: &str = "secrets";

/// A secret the spec gives an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub allocation: String,
    pub name: String,
    pub version: u64,
    pub file: String,
}

/// What one fetch came back with.
#[derive(Debug)]
pub struct Fetched {
    want: Want,
    result: Result<Vec<u8>, Failed>,
}

/// Why a fetch failed.
#[derive(Debug)]
struct Failed {
    message: String,
    /// The answer was not the broker's delivery for this request: a
    /// gateway made it up or changed it.
    forged: bool,
}

impl From<String> for Failed {
    fn from(message: String) -> Failed {
        Failed {
            message,
            forged: false,
        }
    }
}

/// The node's secrets: where they go, what was written, what is fetching.
#[derive(Debug)]
pub struct Secrets {
    /// `<run-dir>/secrets`; `None`: this node writes no secret (a daemon
    /// that reaches the machine only through `bcd helper`).
    pub dir: Option<PathBuf>,
    /// (allocation, file) → (name, version) written by this process.
    written: BTreeMap<(String, String), (String, u64)>,
    fetching: bool,
    retry_at: Option<Instant>,
    retry_in: Duration,
    last_error: Option<String>,
    done_tx: mpsc::UnboundedSender<Vec<Fetched>>,
}

impl Secrets {
    pub fn new(dir: Option<PathBuf>) -> (Secrets, mpsc::UnboundedReceiver<Vec<Fetched>>) {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        (
            Secrets {
                dir,
                written: BTreeMap::new(),
                fetching: false,
                retry_at: None,
                retry_in: RETRY_FIRST,
                last_error: None,
                done_tx,
            },
            done_rx,
        )
    }
}

/// What a spec asks for.
pub fn wanted(spec: &v1::NodeSpec) -> Vec<Want> {
    spec.devices
        .iter()
        .flat_map(|d| d.assignments.iter())
        .flat_map(|a| {
            a.secrets.iter().map(|s| Want {
                allocation: a.allocation_id.clone(),
                name: s.name.clone(),
                version: s.version,
                file: if s.file.is_empty() {
                    s.name.clone()
                } else {
                    s.file.clone()
                },
            })
        })
        .collect()
}

/// Whether `dir` is memory-backed (tmpfs or ramfs).
fn memory_backed(dir: &Path) -> Result<bool, String> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    let st = rustix::fs::statfs(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    #[allow(clippy::unnecessary_cast)]
    let kind = st.f_type as u64;
    Ok(kind == TMPFS_MAGIC || kind == RAMFS_MAGIC)
}

/// Makes `dir` (0700) and checks that it is memory-backed.
fn prepare(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    }
    if !memory_backed(dir)? {
        return Err(format!(
            "{} is not memory-backed (tmpfs or ramfs): a secret is never written to a disk; \
             point bcd node --run-dir at a tmpfs",
            dir.display()
        ));
    }
    Ok(())
}

/// Removes what the spec no longer names: files, then emptied allocation
/// directories. True if anything went.
fn remove_unwanted(dir: &Path, wanted: &[Want]) -> Result<bool, String> {
    let mut changed = false;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    for alloc in entries.flatten() {
        let alloc_name = alloc.file_name().to_string_lossy().into_owned();
        let path = alloc.path();
        if !path.is_dir() {
            std::fs::remove_file(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
            changed = true;
            continue;
        }
        for file in std::fs::read_dir(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            .flatten()
        {
            let file_name = file.file_name().to_string_lossy().into_owned();
            if !wanted
                .iter()
                .any(|w| w.allocation == alloc_name && w.file == file_name)
            {
                std::fs::remove_file(file.path())
                    .map_err(|e| format!("cannot remove {}: {e}", file.path().display()))?;
                changed = true;
            }
        }
        if !wanted.iter().any(|w| w.allocation == alloc_name) {
            std::fs::remove_dir(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Writes one value (0400; its directory 0700).
fn write(dir: &Path, want: &Want, value: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    let alloc = dir.join(&want.allocation);
    if !alloc.exists() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&alloc)
            .map_err(|e| format!("cannot make {}: {e}", alloc.display()))?;
    }
    bcd_sys::fs::atomic_write(&alloc.join(&want.file), value, 0o400)
        .map_err(|e| bcd_sys::error::chain(&e))
}

impl Agent {
    /// One pass over the secrets: removes what the spec no longer names,
    /// starts fetching what is missing, and says how far it got.
    pub(super) fn converge_secrets(&mut self, spec: &v1::NodeSpec, conn: &Conn) -> Outcome {
        let wanted = wanted(spec);
        let Some(dir) = self.secrets.dir.clone() else {
            if wanted.is_empty() {
                return Outcome::ready(false);
            }
            return Outcome::not(
                Status::Failed,
                "this node's daemon runs through bcd helper, which writes no secrets: run bcd \
                 node without --helper to hold secrets"
                    .into(),
            );
        };
        if wanted.is_empty() && !dir.exists() {
            self.secrets.written.clear();
            return Outcome::ready(false);
        }
        for w in &wanted {
            for (what, v) in [("secret name", &w.name), ("secret file", &w.file)] {
                if let Err(e) = secret::check_name(what, v) {
                    return Outcome::not(Status::Failed, e);
                }
            }
            if let Err(e) = bcd_helper::validate::AllocationId::parse(&w.allocation) {
                return Outcome::not(Status::Failed, e.to_string());
            }
        }
        if let Err(e) = prepare(&dir) {
            return Outcome::not(Status::Failed, e);
        }
        let changed = match remove_unwanted(&dir, &wanted) {
            Ok(c) => c,
            Err(e) => return Outcome::not(Status::Progressing, e),
        };
        if changed {
            info!("secrets the spec no longer names were removed");
        }
        self.secrets.written.retain(|(a, f), _| {
            wanted
                .iter()
                .any(|w| &w.allocation == a && &w.file == f && dir.join(a).join(f).exists())
        });
        let missing: Vec<Want> = wanted
            .into_iter()
            .filter(|w| {
                self.secrets
                    .written
                    .get(&(w.allocation.clone(), w.file.clone()))
                    != Some(&(w.name.clone(), w.version))
            })
            .collect();
        if missing.is_empty() {
            self.secrets.last_error = None;
            self.secrets.retry_in = RETRY_FIRST;
            return Outcome::ready(changed);
        }
        let waiting = |why: &str| {
            Outcome::not(
                Status::Progressing,
                format!(
                    "{} secret(s) to fetch ({} v{} first): {why}",
                    missing.len(),
                    missing[0].name,
                    missing[0].version
                ),
            )
        };
        if self.secrets.fetching {
            return waiting("fetching");
        }
        if let Some(at) = self.secrets.retry_at
            && Instant::now() < at
        {
            let why = self.secrets.last_error.clone().unwrap_or_default();
            return waiting(&why);
        }
        let Some(c) = conn else {
            return waiting("waiting for a session");
        };
        let Some(now_ms) = self.server_now_ms else {
            return waiting("waiting for the server's time");
        };
        let keys = match Jwks::parse(&spec.ticket_jwks) {
            Ok(k) => k,
            Err(e) => return Outcome::not(Status::Failed, e.to_string()),
        };
        let mut requests = Vec::new();
        for w in missing.iter().cloned() {
            let otk = match OneTimeKey::new() {
                Ok(k) => k,
                Err(e) => return waiting(&e.to_string()),
            };
            let public = otk.public();
            let statement = secret::request_statement(&Request {
                node: &self.identity.file.node_id,
                allocation: &w.allocation,
                name: &w.name,
                version: w.version,
                one_time_key: &public,
                time_ms: now_ms,
            });
            let Some(signature) = self.sign(&statement) else {
                return waiting("the node key did not sign the request");
            };
            requests.push((
                w.clone(),
                otk,
                v1::SecretRequest {
                    node_id: self.identity.file.node_id.clone(),
                    allocation_id: w.allocation,
                    name: w.name,
                    version: w.version,
                    one_time_key: public.to_vec(),
                    time_ms: now_ms,
                    signature,
                },
            ));
        }
        self.secrets.fetching = true;
        let (h2, done) = (c.conn.clone(), self.secrets.done_tx.clone());
        tokio::spawn(async move {
            let mut out = Vec::new();
            for (want, otk, request) in requests {
                let result = fetch(h2.clone(), &keys, otk, request).await;
                out.push(Fetched { want, result });
            }
            let _ = done.send(out);
        });
        waiting("fetching")
    }

    /// A batch of fetches ended: writes what came, schedules a retry for
    /// what did not.
    pub(super) fn secrets_fetched(&mut self, batch: Vec<Fetched>) {
        self.secrets.fetching = false;
        let Some(dir) = self.secrets.dir.clone() else {
            return;
        };
        let mut failed = None;
        for f in batch {
            let key = (f.want.allocation.clone(), f.want.file.clone());
            match f
                .result
                .and_then(|value| write(&dir, &f.want, &value).map_err(Failed::from))
            {
                Ok(()) => {
                    info!(allocation = %f.want.allocation, secret = %f.want.name, version = f.want.version, "secret written");
                    self.secrets
                        .written
                        .insert(key, (f.want.name.clone(), f.want.version));
                }
                Err(e) if e.forged => {
                    self.refused_frame(
                        "security.secret.refused",
                        serde_json::json!({
                            "allocation": f.want.allocation,
                            "secret": f.want.name,
                            "version": f.want.version,
                            "why": e.message,
                        }),
                    );
                    failed.get_or_insert(format!(
                        "{} v{}: {}",
                        f.want.name, f.want.version, e.message
                    ));
                }
                Err(e) => {
                    if let Some(held) = self.warned.allow("secret.fetch", self.now()) {
                        warn!(allocation = %f.want.allocation, secret = %f.want.name, version = f.want.version, error = %e.message, held_back = held, "secret not fetched; retrying");
                    }
                    failed.get_or_insert(format!(
                        "{} v{}: {}",
                        f.want.name, f.want.version, e.message
                    ));
                }
            }
        }
        match failed {
            None => {
                self.secrets.retry_at = None;
                self.secrets.retry_in = RETRY_FIRST;
                self.secrets.last_error = None;
            }
            Some(e) => {
                self.secrets.retry_at = Some(Instant::now() + self.secrets.retry_in);
                self.secrets.retry_in = (self.secrets.retry_in * 2).min(RETRY_MAX);
                self.secrets.last_error = Some(e);
            }
        }
    }

    /// Whether the spec names a secret this process has not written and
    /// is not fetching.
    pub(super) fn secrets_pending(&self) -> bool {
        let Some(spec) = &self.spec else {
            return false;
        };
        !self.secrets.fetching
            && self.secrets.dir.is_some()
            && wanted(spec).iter().any(|w| {
                self.secrets
                    .written
                    .get(&(w.allocation.clone(), w.file.clone()))
                    != Some(&(w.name.clone(), w.version))
            })
    }

    /// The retry's time came: the next pass fetches (or, with no session,
    /// the pass after one is established).
    pub(super) fn secrets_retry_due(&mut self) {
        self.secrets.retry_at = None;
    }

    /// When the next retry is due, if one waits.
    pub(super) fn secrets_retry_at(&self) -> Option<Instant> {
        self.secrets.retry_at.filter(|_| !self.secrets.fetching)
    }
}

/// One request on the session's connection, its delivery checked against
/// the spec's ticket keys and opened with the one-time key.
async fn fetch(
    h2: bcd_proto::tls::Conn,
    keys: &Jwks,
    otk: OneTimeKey,
    request: v1::SecretRequest,
) -> Result<Vec<u8>, Failed> {
    let r = request.clone();
    let delivery = tokio::time::timeout(
        FETCH_TIMEOUT,
        v1::join_client::JoinClient::new(h2).fetch_secret(request),
    )
    .await
    .map_err(|_| {
        Failed::from(format!(
            "the broker did not answer within {FETCH_TIMEOUT:?}"
        ))
    })?
    .map_err(|s| {
        let reason = bcd_proto::refusal::reason(&s);
        if reason == v1::RefusalReason::Unavailable || s.code() == tonic::Code::Unavailable {
            Failed::from(format!("unavailable: {}", s.message()))
        } else {
            Failed::from(s.message().to_string())
        }
    })?
    .into_inner();
    let jwe =
        secret::verify_delivery(&delivery.jws, keys, &Request::from(&r)).map_err(|e| Failed {
            message: format!("the delivery was refused ({e}): a gateway forged or changed it"),
            forged: true,
        })?;
    otk.open(&jwe).map_err(|e| Failed {
        message: format!("the delivery's JWE was refused ({e}): a gateway changed it"),
        forged: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(allocation: &str, file: &str) -> Want {
        Want {
            allocation: allocation.into(),
            name: file.into(),
            version: 1,
            file: file.into(),
        }
    }

    #[test]
    fn what_the_spec_no_longer_names_goes_and_the_rest_stays() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        write(dir, &want("job-a", "db"), b"1").unwrap();
        write(dir, &want("job-a", "api"), b"2").unwrap();
        write(dir, &want("job-b", "db"), b"3").unwrap();
        std::fs::write(dir.join("stray"), b"x").unwrap();
        assert!(remove_unwanted(dir, &[want("job-a", "db"), want("job-c", "x")]).unwrap());
        assert_eq!(std::fs::read(dir.join("job-a/db")).unwrap(), b"1");
        assert!(!dir.join("job-a/api").exists());
        assert!(!dir.join("job-b").exists());
        assert!(!dir.join("stray").exists());
        assert!(
            !remove_unwanted(dir, &[want("job-a", "db")]).unwrap(),
            "nothing more"
        );
    }

    #[test]
    fn a_value_is_written_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        write(d.path(), &want("job-a", "db"), b"pw").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d.path().join("job-a/db")), 0o400);
        assert_eq!(mode(&d.path().join("job-a")), 0o700);
        // A new version replaces it whole.
        write(d.path(), &want("job-a", "db"), b"pw2").unwrap();
        assert_eq!(std::fs::read(d.path().join("job-a/db")).unwrap(), b"pw2");
    }

    #[test]
    fn only_a_memory_backed_directory_takes_secrets() {
        // The checkout is on a disk (as on every machine the suite runs
        // on); /dev/shm is a tmpfs.
        let on_disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let e = prepare(&on_disk.path().join("secrets")).unwrap_err();
        assert!(e.contains("is not memory-backed"), "{e}");
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        prepare(&d.path().join("secrets")).unwrap();
        assert!(d.path().join("secrets").is_dir());
    }
}
