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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bcd_core::report::Status;
use bcd_proto::secret::{self, OneTimeKey, Request};
use bcd_proto::ticket::Jwks;
use bcd_proto::v1;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Shared;
use super::conn::Conn;
use crate::converge::Outcome;
use crate::converge::access::StepError;
use crate::events::SecretRefused;

// The helper takes what the broker may send.
const _: () = assert!(bcd_helper::validate::MAX_SECRET == secret::MAX_VALUE);

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
/// Apart from `files`, which the daemon sets before it runs the agent,
/// this module alone reads or changes it.
#[derive(Debug)]
pub struct Secrets {
    /// Where values go; `None`: this daemon has nowhere to write them (a
    /// simulated node).
    pub files: Option<std::sync::Arc<dyn SecretFiles>>,
    /// (allocation, file) → (name, version) written by this process.
    written: BTreeMap<(String, String), (String, u64)>,
    /// Whether this process removed what an earlier one left: until then
    /// a pass with nothing to hold still sweeps.
    swept: bool,
    /// Whether a batch of fetches is under way.
    fetching: bool,
    /// When the next fetch after a failed one may start.
    retry_at: Option<Instant>,
    /// The wait after the next failure.
    retry_in: Duration,
    /// Why the last fetch failed, for the section's message.
    last_error: Option<String>,
    /// Where a batch of fetches reports how it ended.
    done_tx: mpsc::UnboundedSender<Vec<Fetched>>,
    /// Where the loop reads the batches, until it takes it.
    done_rx: Option<mpsc::UnboundedReceiver<Vec<Fetched>>>,
}

impl Secrets {
    /// Nothing written or fetching yet; values go to `files`.
    pub fn new(files: Option<std::sync::Arc<dyn SecretFiles>>) -> Secrets {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Secrets {
            files,
            written: BTreeMap::new(),
            swept: false,
            fetching: false,
            retry_at: None,
            retry_in: RETRY_FIRST,
            last_error: None,
            done_tx,
            done_rx: Some(done_rx),
        }
    }

    /// Where batches of fetches end, for the loop to read (once).
    pub(super) fn take_done(&mut self) -> Option<mpsc::UnboundedReceiver<Vec<Fetched>>> {
        self.done_rx.take()
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

/// Where a node's secrets are written: its own memory-backed directory
/// as root ([`MemoryDir`]), or the helper's under `bcd helper`
/// (`crate::helper::via::HelperSecrets`).
pub trait SecretFiles: std::fmt::Debug + Send + Sync {
    /// Makes the place ready (it must be memory-backed) and removes every
    /// secret file `keep` does not name; true if any went.
    fn retain(&self, keep: &[Want]) -> Result<bool, StepError>;
    /// Writes one value, readable by its owner only.
    fn write(&self, want: &Want, value: &[u8]) -> Result<(), String>;
    /// Whether the file is still there, so that one removed behind the
    /// node's back is fetched again. Through the helper, which writes in a
    /// directory the daemon cannot read, a file written stays written for
    /// this process.
    fn holds(&self, want: &Want) -> bool;
}

/// Secrets in a memory-backed directory of the node's own
/// (`<run-dir>/secrets`).
#[derive(Debug, Clone)]
pub struct MemoryDir(pub PathBuf);

impl SecretFiles for MemoryDir {
    fn retain(&self, keep: &[Want]) -> Result<bool, StepError> {
        if keep.is_empty() && !self.0.exists() {
            return Ok(false);
        }
        prepare(&self.0).map_err(|e| (Status::Failed, e))?;
        let keep: BTreeSet<(&str, &str)> = keep
            .iter()
            .map(|w| (w.allocation.as_str(), w.file.as_str()))
            .collect();
        remove_unwanted(&self.0, &keep).map_err(|e| (Status::Progressing, e))
    }

    fn write(&self, want: &Want, value: &[u8]) -> Result<(), String> {
        write(&self.0, &want.allocation, &want.file, value)
    }

    fn holds(&self, want: &Want) -> bool {
        self.0.join(&want.allocation).join(&want.file).exists()
    }
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
pub fn prepare(dir: &Path) -> Result<(), String> {
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
             point --run-dir at a tmpfs",
            dir.display()
        ));
    }
    Ok(())
}

/// Removes the files `keep` does not name (as allocation, file), then
/// allocation directories it names nothing in. True if anything went.
pub fn remove_unwanted(dir: &Path, keep: &BTreeSet<(&str, &str)>) -> Result<bool, String> {
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
            if !keep.contains(&(alloc_name.as_str(), file_name.as_str())) {
                std::fs::remove_file(file.path())
                    .map_err(|e| format!("cannot remove {}: {e}", file.path().display()))?;
                changed = true;
            }
        }
        if !keep.iter().any(|(a, _)| *a == alloc_name) {
            std::fs::remove_dir(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
            changed = true;
        }
    }
    Ok(changed)
}

/// Writes one value (0400; its directory 0700) under `dir`, which
/// [`prepare`] made.
pub fn write(dir: &Path, allocation: &str, file: &str, value: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    prepare(dir)?;
    let alloc = dir.join(allocation);
    if !alloc.exists() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&alloc)
            .map_err(|e| format!("cannot make {}: {e}", alloc.display()))?;
    }
    bcd_sys::fs::atomic_write(&alloc.join(file), value, 0o400)
        .map_err(|e| bcd_sys::error::chain(&e))
}

impl Secrets {
    /// One pass over the secrets: removes what the spec no longer names,
    /// starts fetching what is missing (requests dated `server_now_ms`, the
    /// session's server time at the loop's last turn), and says how far it
    /// got.
    pub(super) fn converge(
        &mut self,
        shared: &mut Shared,
        spec: &v1::NodeSpec,
        conn: &Conn,
        server_now_ms: Option<i64>,
    ) -> Outcome {
        let wanted = wanted(spec);
        let Some(files) = self.files.clone() else {
            if wanted.is_empty() {
                return Outcome::ready(false);
            }
            return Outcome::not(
                Status::Failed,
                "this daemon has nowhere to write secrets (no run directory)".into(),
            );
        };
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
        if wanted.is_empty() && self.written.is_empty() && self.swept {
            return Outcome::ready(false);
        }
        let changed = match files.retain(&wanted) {
            Ok(c) => c,
            Err((status, e)) => return Outcome::not(status, e),
        };
        self.swept = true;
        if changed {
            info!("secrets the spec no longer names were removed");
        }
        self.written.retain(|(a, f), _| {
            wanted
                .iter()
                .any(|w| &w.allocation == a && &w.file == f && files.holds(w))
        });
        let missing: Vec<Want> = wanted
            .into_iter()
            .filter(|w| {
                self.written.get(&(w.allocation.clone(), w.file.clone()))
                    != Some(&(w.name.clone(), w.version))
            })
            .collect();
        if missing.is_empty() {
            self.last_error = None;
            self.retry_in = RETRY_FIRST;
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
        if self.fetching {
            return waiting("fetching");
        }
        if let Some(at) = self.retry_at
            && Instant::now() < at
        {
            let why = self.last_error.clone().unwrap_or_default();
            return waiting(&why);
        }
        let Some(c) = conn else {
            return waiting("waiting for a session");
        };
        let Some(now_ms) = server_now_ms else {
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
                node: &shared.identity.file.node_id,
                allocation: &w.allocation,
                name: &w.name,
                version: w.version,
                one_time_key: &public,
                time_ms: now_ms,
            });
            let Some(signature) = shared.sign(&statement) else {
                return waiting("the node key did not sign the request");
            };
            requests.push((
                w.clone(),
                otk,
                v1::SecretRequest {
                    node_id: shared.identity.file.node_id.clone(),
                    allocation_id: w.allocation,
                    name: w.name,
                    version: w.version,
                    one_time_key: public.to_vec(),
                    time_ms: now_ms,
                    signature,
                },
            ));
        }
        self.fetching = true;
        let (h2, done) = (c.conn.clone(), self.done_tx.clone());
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
    pub(super) fn fetched(&mut self, shared: &mut Shared, batch: Vec<Fetched>) {
        self.fetching = false;
        let Some(files) = self.files.clone() else {
            return;
        };
        let mut failed = None;
        for f in batch {
            let key = (f.want.allocation.clone(), f.want.file.clone());
            match f
                .result
                .and_then(|value| files.write(&f.want, &value).map_err(Failed::from))
            {
                Ok(()) => {
                    info!(allocation = %f.want.allocation, secret = %f.want.name, version = f.want.version, "secret written");
                    self.written
                        .insert(key, (f.want.name.clone(), f.want.version));
                }
                Err(e) if e.forged => {
                    shared.refused_frame(SecretRefused {
                        allocation: f.want.allocation.clone(),
                        secret: f.want.name.clone(),
                        version: f.want.version,
                        why: e.message.clone(),
                    });
                    failed.get_or_insert(format!(
                        "{} v{}: {}",
                        f.want.name, f.want.version, e.message
                    ));
                }
                Err(e) => {
                    if let Some(held) = shared.warned.allow("secret.fetch", shared.now()) {
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
                self.retry_at = None;
                self.retry_in = RETRY_FIRST;
                self.last_error = None;
            }
            Some(e) => {
                self.retry_at = Some(Instant::now() + self.retry_in);
                self.retry_in = (self.retry_in * 2).min(RETRY_MAX);
                self.last_error = Some(e);
            }
        }
    }

    /// Whether the spec names a secret this process has not written and
    /// is not fetching.
    pub(super) fn pending(&self, spec: Option<&v1::NodeSpec>) -> bool {
        let Some(spec) = spec else {
            return false;
        };
        !self.fetching
            && self.files.is_some()
            && wanted(spec).iter().any(|w| {
                self.written.get(&(w.allocation.clone(), w.file.clone()))
                    != Some(&(w.name.clone(), w.version))
            })
    }

    /// The retry's time came: the next pass fetches (or, with no session,
    /// the pass after one is established).
    pub(super) fn retry_due(&mut self) {
        self.retry_at = None;
    }

    /// When the next retry is due, if one waits.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at.filter(|_| !self.fetching)
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

    /// A memory-backed directory for a test (/dev/shm is a tmpfs).
    fn memory() -> tempfile::TempDir {
        tempfile::tempdir_in("/dev/shm").unwrap()
    }

    #[test]
    fn what_the_spec_no_longer_names_goes_and_the_rest_stays() {
        let d = memory();
        let dir = MemoryDir(d.path().to_path_buf());
        dir.write(&want("job-a", "db"), b"1").unwrap();
        dir.write(&want("job-a", "api"), b"2").unwrap();
        dir.write(&want("job-b", "db"), b"3").unwrap();
        std::fs::write(d.path().join("stray"), b"x").unwrap();
        assert!(
            dir.retain(&[want("job-a", "db"), want("job-c", "x")])
                .unwrap()
        );
        assert_eq!(std::fs::read(d.path().join("job-a/db")).unwrap(), b"1");
        assert!(dir.holds(&want("job-a", "db")));
        assert!(!dir.holds(&want("job-a", "api")));
        assert!(!d.path().join("job-b").exists());
        assert!(!d.path().join("stray").exists());
        assert!(!dir.retain(&[want("job-a", "db")]).unwrap(), "nothing more");
    }

    #[test]
    fn a_value_is_written_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = memory();
        let dir = MemoryDir(d.path().to_path_buf());
        dir.write(&want("job-a", "db"), b"pw").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d.path().join("job-a/db")), 0o400);
        assert_eq!(mode(&d.path().join("job-a")), 0o700);
        // A new version replaces it whole.
        dir.write(&want("job-a", "db"), b"pw2").unwrap();
        assert_eq!(std::fs::read(d.path().join("job-a/db")).unwrap(), b"pw2");
    }

    #[test]
    fn only_a_memory_backed_directory_takes_secrets() {
        // The checkout is on a disk (as on every machine the suite runs
        // on); /dev/shm is a tmpfs.
        let on_disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let e = prepare(&on_disk.path().join("secrets")).unwrap_err();
        assert!(e.contains("is not memory-backed"), "{e}");
        let e = MemoryDir(on_disk.path().join("secrets"))
            .write(&want("job-a", "db"), b"pw")
            .unwrap_err();
        assert!(e.contains("is not memory-backed"), "{e}");
        assert!(!on_disk.path().join("secrets/job-a").exists());
        let d = tempfile::tempdir_in("/dev/shm").unwrap();
        prepare(&d.path().join("secrets")).unwrap();
        assert!(d.path().join("secrets").is_dir());
    }
}
