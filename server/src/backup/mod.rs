//! Backups and restores of the control plane.
//!
//! A backup set is a directory: the store's dump (every table, read in one
//! consistent read transaction through the store interface, so it is taken
//! on SQLite or PostgreSQL alike while the control plane runs), the CA and
//! signing keys of the data directory, and [`manifest::Manifest`], written
//! last, naming each file with its SHA-256 and size. The store records the
//! set in `backups` ([`bc_store::backups`]): CREATING before the dump is
//! taken (so the dump holds the set as CREATING and a control plane
//! restored from it reports that set as not restore eligible), COMPLETE and
//! restore eligible once the manifest is on disk.
//!
//! - [`create`]: the set, under `<dir>/<id>/`. While it writes, its process
//!   renews the lease `backup:<id>`.
//! - [`reconcile`]: at every start of `serve`, a CREATING set whose process
//!   is gone moves to FAILED with `MANIFEST_INCOMPLETE` (audited by the
//!   store); its directory, when this host wrote it, is marked with a
//!   `FAILED` file, so it is never restored.
//! - [`restore`]: into a stopped control plane's data directory and store,
//!   every hash verified first; the set it came from is FAILED there with
//!   `RESTORED_FROM_THIS_SET` (its dump held it as CREATING). Its phases go
//!   to a journal ([`journal::Journal`]); an interrupted restore stops
//!   `serve` and later restores until the operator resumes or abandons it.
//!
//! Test builds (the `failpoints` feature) pause at named points
//! ([`pause`]) so a test can kill the process there.

pub mod journal;
pub mod manifest;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use bc_store::backups::{
    BackupRow, Dump, MANIFEST_INCOMPLETE, NewBackup, RESTORED_FROM_THIS_SET, SequenceDump,
    TableDump, Value, backup_lease, interrupted,
};
use bc_store::{Store, StoreError, TxError};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use tracing::warn;

use self::journal::{Journal, Phase};
use self::manifest::{FileEntry, Manifest};

/// The files of the data directory a set carries: the fleet CA, the
/// serving certificate, the worker's signing key, the operator CA with the
/// API's serving certificate, the first admin's credential and the operator
/// certificates the key holder knows revoked. Those
/// marked required must be there (the operator CA is not: sets from before
/// it existed restore too, and serve creates one).
pub const KEY_FILES: &[(&str, bool, u32)] = &[
    ("ca.key", true, 0o600),
    ("ca.crt", true, 0o644),
    ("worker.key", true, 0o600),
    (crate::pki::tickets::KEY_FILE, false, 0o600),
    (crate::pki::tickets::PREVIOUS_FILE, false, 0o600),
    (crate::pki::secrets::KEY_FILE, false, 0o600),
    ("gateway.key", false, 0o600),
    ("gateway.crt", false, 0o644),
    ("gateway.names", false, 0o644),
    (crate::pki::operator::KEY_FILE, false, 0o600),
    (crate::pki::operator::CERT_FILE, false, 0o644),
    ("api.key", false, 0o600),
    ("api.crt", false, 0o644),
    ("api.names", false, 0o644),
    (crate::api::auth::OPERATOR_FILE, false, 0o600),
    (crate::api::revoked_operators::FILE, false, 0o600),
];

/// The marker a set's directory gets when its set failed.
pub const FAILED_MARKER: &str = "FAILED";
/// How long a backup's lease lasts without renewal, and how often it is
/// renewed.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
const LEASE_EVERY: Duration = Duration::from_secs(5);

/// A reason for a set whose writing failed with an error (the process
/// lived to record it).
pub const WRITE_FAILED: &str = "WRITE_FAILED";

/// Where sets go by default.
pub fn default_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("backups")
}

/// Pauses here forever if the test build was told to (`BC_PAUSE_AT`
/// names this point): the test kills the process while it waits. Prints
/// `paused at NAME` on stderr first. Nothing happens in other builds.
pub fn pause(point: &str) {
    #[cfg(feature = "failpoints")]
    if std::env::var("BC_PAUSE_AT").is_ok_and(|v| v.split(',').any(|p| p.trim() == point)) {
        eprintln!("paused at {point}");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = point;
}

/// This host: its name and boot id (a reboot makes it another host, on
/// which no process of the last boot runs).
pub fn host_identity() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "{} {}",
        read("/proc/sys/kernel/hostname"),
        read("/proc/sys/kernel/random/boot_id")
    )
}

/// A process's start time in clock ticks since boot (field 22 of
/// `/proc/PID/stat`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process, as `PID:START`.
pub fn process_identity() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", start_time(pid).unwrap_or(0))
}

/// Whether the process `PID:START` runs on this host.
pub fn process_alive(process: &str) -> bool {
    let Some((pid, start)) = process.split_once(':') else {
        return false;
    };
    match (pid.parse::<u32>(), start.parse::<u64>()) {
        (Ok(pid), Ok(start)) => start_time(pid) == Some(start),
        _ => false,
    }
}

/// A store failure as an operator reads it: what failed and what to do.
/// The database's own words (which may name the driver or carry SQL) go to
/// the log only; a refusal or a version mismatch is shown as it is.
pub fn store_error(e: StoreError, what: &str) -> anyhow::Error {
    match e {
        StoreError::TooNew { .. } | StoreError::Missing | StoreError::Address(_) => {
            anyhow::anyhow!("{what}: {e}")
        }
        other => {
            tracing::error!(error = %other, "{what}");
            anyhow::anyhow!(
                "{what}: the store failed (its error is logged above); check it with \
                 better-compute doctor, then run this again"
            )
        }
    }
}

/// [`store_error`] on a result.
pub trait OrStore<T> {
    fn or_store(self, what: &str) -> anyhow::Result<T>;
}

impl<T> OrStore<T> for Result<T, StoreError> {
    fn or_store(self, what: &str) -> anyhow::Result<T> {
        self.map_err(|e| store_error(e, what))
    }
}

/// SHA-256 of bytes, lowercase hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// The store part of a set: its tables in order, with the sequences.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DumpHeader {
    pub backend: String,
    pub schema_version: u32,
    pub taken_at_ms: i64,
    pub tables: Vec<TableHeader>,
    pub sequences: Vec<SequenceDump>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableHeader {
    pub name: String,
    pub columns: Vec<String>,
    /// Its rows, one JSON array a line, relative to the set's directory.
    pub file: String,
    pub rows: u64,
}

/// Writes `bytes` to `dir/rel` (fsynced, `mode`) and returns its entry.
fn put(dir: &Path, rel: &str, bytes: &[u8], mode: u32) -> anyhow::Result<FileEntry> {
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        private_dir(parent)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(FileEntry {
        path: rel.to_string(),
        sha256: sha256(bytes),
        size: bytes.len() as u64,
    })
}

/// Creates `dir` (and its parents) readable by its owner only: a set
/// holds the CA's key.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

/// What `create` made.
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    pub id: String,
    pub location: String,
    pub files: u64,
    pub bytes: u64,
}

/// A new set's id: its time on the store's clock and a random suffix.
fn new_id(now_ms: i64) -> String {
    let t = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(now_ms.max(0) as u64),
    )
    .to_string()
    .replace(['-', ':'], "");
    format!(
        "bk-{}-{:04x}",
        t.trim_end_matches('Z'),
        rand::random::<u16>()
    )
}

/// Takes a backup set of `store` and the keys in `data_dir` into a new
/// directory under `dir`.
pub async fn create(
    store: &Store,
    data_dir: &Path,
    dir: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<Created> {
    for (name, required, _) in KEY_FILES {
        anyhow::ensure!(
            !required || data_dir.join(name).is_file(),
            "{} is missing: pass --data-dir of the control plane (the directory with its CA)",
            data_dir.join(name).display()
        );
    }
    private_dir(dir)?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", dir.display()))?;
    let id = new_id(
        store
            .now()
            .await
            .or_store("cannot read the store's clock")?,
    );
    let set = dir.join(&id);
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&set)
            .with_context(|| format!("cannot create {}", set.display()))?;
    }
    let process = process_identity();
    let lease = backup_lease(&id);
    anyhow::ensure!(
        store
            .renew_lease(&lease, &process, LEASE_TTL)
            .await
            .or_store("cannot take the backup's lease")?
            .is_some(),
        "the lease {lease} is held by another process"
    );
    if let Err(e) = store
        .begin_backup(&NewBackup {
            id: id.clone(),
            location: set.display().to_string(),
            host: host_identity(),
            process: process.clone(),
        })
        .await
    {
        let _ = store.release_lease(&lease, &process).await;
        let _ = std::fs::remove_dir(&set);
        return Err(store_error(e, "cannot record the backup set in the store"));
    }
    let renew = {
        let (store, lease, process) = (store.clone(), lease.clone(), process.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_EVERY).await;
                if let Err(e) = store.renew_lease(&lease, &process, LEASE_TTL).await {
                    warn!(error = %e, "cannot renew the backup's lease");
                }
            }
        })
    };
    let written = write_set(store, data_dir, &set, &id, bar).await;
    renew.abort();
    let out = match written {
        Ok((files, bytes)) => {
            pause("backup-after-manifest");
            if store
                .finish_backup(&id, files, bytes)
                .await
                .or_store("cannot record the backup set complete")?
            {
                Ok(Created {
                    id: id.clone(),
                    location: set.display().to_string(),
                    files,
                    bytes,
                })
            } else {
                mark_failed(&set, "the set was marked FAILED while it was written");
                Err(anyhow::anyhow!(
                    "backup {id} was marked FAILED while it was written (a start of serve took \
                     its process for gone): take another backup"
                ))
            }
        }
        Err(e) => {
            let _ = store.fail_backup(&id, WRITE_FAILED).await;
            mark_failed(
                &set,
                &format!("{WRITE_FAILED}: {}", bcd_sys::error::chain(e.as_ref())),
            );
            Err(e.context(format!("backup {id} failed and is not restore eligible")))
        }
    };
    let _ = store.release_lease(&lease, &process).await;
    out
}

/// Marks a set's directory failed (best effort: the store's row is what
/// counts; the marker stops a restore from the directory).
fn mark_failed(set: &Path, why: &str) {
    if set.is_dir() {
        let _ = std::fs::write(set.join(FAILED_MARKER), format!("{why}\n"));
        let _ = sync_dir(set);
    }
}

async fn write_set(
    store: &Store,
    data_dir: &Path,
    set: &Path,
    id: &str,
    bar: &ProgressBar,
) -> anyhow::Result<(u64, u64)> {
    pause("backup-after-row");
    bar.set_message("reading the store");
    let dump = store.dump().await.or_store("cannot read the store")?;
    let rows: u64 = dump.tables.iter().map(|t| t.rows.len() as u64).sum();
    bar.set_length(rows);
    bar.set_position(0);
    let mut files = Vec::new();
    let mut tables = Vec::new();
    for t in &dump.tables {
        bar.set_message(format!("writing {}", t.name));
        let mut text = String::new();
        for row in &t.rows {
            text.push_str(&serde_json::to_string(row)?);
            text.push('\n');
        }
        let rel = format!("store/{}.jsonl", t.name);
        files.push(put(set, &rel, text.as_bytes(), 0o600)?);
        bar.inc(t.rows.len() as u64);
        tables.push(TableHeader {
            name: t.name.clone(),
            columns: t.columns.clone(),
            file: rel,
            rows: t.rows.len() as u64,
        });
    }
    let header = DumpHeader {
        backend: dump.backend.clone(),
        schema_version: dump.schema_version,
        taken_at_ms: dump.taken_at,
        tables,
        sequences: dump.sequences.clone(),
    };
    files.push(put(
        set,
        "store/dump.json",
        &serde_json::to_vec_pretty(&header)?,
        0o600,
    )?);
    sync_dir(&set.join("store"))?;
    pause("backup-after-store");
    bar.set_message("copying the keys");
    for (name, _, mode) in KEY_FILES {
        let path = data_dir.join(name);
        if path.is_file() {
            let bytes =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            files.push(put(set, &format!("keys/{name}"), &bytes, *mode)?);
        }
    }
    sync_dir(&set.join("keys"))?;
    pause("backup-after-keys");
    let row = store
        .backup(id)
        .await
        .or_store("cannot read the backup set back")?
        .context("the backup's own row is gone from the store")?;
    let manifest = Manifest::new(id, row.created_at, &dump, files);
    let bytes = manifest.to_json();
    bcd_sys::fs::atomic_write(&set.join(manifest::FILE), &bytes, 0o600)?;
    sync_dir(set)?;
    Ok((manifest.files.len() as u64, manifest.total_size()))
}

/// The start-of-serve reconcile: every CREATING set whose process is gone
/// moves to FAILED with `MANIFEST_INCOMPLETE`. Returns the ids moved.
pub async fn reconcile(store: &Store) -> anyhow::Result<Vec<String>> {
    const WHAT: &str = "cannot reconcile the backup sets";
    let now = store.now().await.or_store(WHAT)?;
    let leases = store.leases().await.or_store(WHAT)?;
    let here = host_identity();
    let mut moved = Vec::new();
    for row in store.backups().await.or_store(WHAT)? {
        let lease = leases.iter().find(|l| l.name == backup_lease(&row.id));
        if interrupted(&row, now, lease, &here, process_alive)
            && store
                .fail_backup(&row.id, MANIFEST_INCOMPLETE)
                .await
                .or_store(WHAT)?
        {
            warn!(
                backup = %row.id,
                location = %row.location,
                "backup interrupted while it was written: FAILED ({MANIFEST_INCOMPLETE}), never restore eligible"
            );
            // Only a directory this host wrote: a set another plane wrote
            // (this one restored from a dump holding it) is not this
            // plane's to mark.
            if row.host == here {
                mark_failed(
                    Path::new(&row.location),
                    &format!("{MANIFEST_INCOMPLETE}: interrupted while it was written"),
                );
            }
            moved.push(row.id);
        }
    }
    Ok(moved)
}

/// A set read back and verified: every file's hash and size match the
/// manifest.
#[derive(Debug)]
pub struct Verified {
    pub manifest: Manifest,
    pub dir: PathBuf,
}

/// Reads the set in `dir` and checks every file against its manifest.
pub fn verify(dir: &Path, bar: &ProgressBar) -> anyhow::Result<Verified> {
    if let Ok(why) = std::fs::read_to_string(dir.join(FAILED_MARKER)) {
        bail!(
            "backup {} failed ({}) and is not restore eligible: restore another backup \
             (better-compute backup list)",
            dir.display(),
            why.trim()
        );
    }
    let path = dir.join(manifest::FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} has no manifest ({MANIFEST_INCOMPLETE}): the backup was interrupted while it \
             was written and is not restore eligible; restore another backup",
            dir.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let manifest = Manifest::parse(&text)
        .with_context(|| format!("{} is not a backup manifest", path.display()))?;
    bar.set_length(manifest.total_size());
    bar.set_position(0);
    for f in &manifest.files {
        bar.set_message(format!("verifying {}", f.path));
        let rel = Path::new(&f.path);
        anyhow::ensure!(
            rel.components()
                .all(|c| matches!(c, std::path::Component::Normal(_))),
            "the manifest names {}, outside the backup: the backup was altered; restore another",
            f.path
        );
        let bytes = std::fs::read(dir.join(rel)).with_context(|| {
            format!(
                "backup file {} is missing: the backup is damaged; restore another backup",
                f.path
            )
        })?;
        let got = sha256(&bytes);
        if got != f.sha256 || bytes.len() as u64 != f.size {
            bail!(
                "backup file {} does not match its manifest (SHA-256 {got}, {} bytes; the \
                 manifest says {}, {} bytes): the backup is damaged or was altered; restore \
                 another backup",
                f.path,
                bytes.len(),
                f.sha256,
                f.size
            );
        }
        bar.inc(f.size);
    }
    Ok(Verified {
        manifest,
        dir: dir.to_path_buf(),
    })
}

impl Verified {
    /// The store part, parsed.
    pub fn dump(&self) -> anyhow::Result<Dump> {
        let header: DumpHeader =
            serde_json::from_slice(&std::fs::read(self.dir.join("store/dump.json"))?)
                .context("store/dump.json does not parse")?;
        let mut tables = Vec::new();
        for t in header.tables {
            let text = std::fs::read_to_string(self.dir.join(&t.file))
                .with_context(|| format!("cannot read {}", t.file))?;
            let rows = text
                .lines()
                .map(serde_json::from_str::<Vec<Value>>)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{} does not parse", t.file))?;
            anyhow::ensure!(
                rows.len() as u64 == t.rows && rows.iter().all(|r| r.len() == t.columns.len()),
                "{} does not hold the rows its header names",
                t.file
            );
            tables.push(TableDump {
                name: t.name,
                columns: t.columns,
                rows,
            });
        }
        Ok(Dump {
            backend: header.backend,
            schema_version: header.schema_version,
            taken_at: header.taken_at_ms,
            tables,
            sequences: header.sequences,
        })
    }
}

/// How a restore goes on from an interrupted one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupted {
    /// Refuse: say MANUAL_INTERVENTION_REQUIRED and what to do.
    Refuse,
    /// Redo every phase of the journal's restore from the start.
    Resume,
}

/// Restores the set in `source` (or, resuming, the journal's) into
/// `data_dir` and the store at `location`.
pub async fn restore(
    source: Option<&Path>,
    data_dir: &Path,
    location: &bc_store::Location,
    on_interrupted: Interrupted,
    bar: &ProgressBar,
) -> anyhow::Result<String> {
    private_dir(data_dir)?;
    let previous = Journal::read(data_dir)?;
    let source: PathBuf = match (&previous, on_interrupted) {
        (Some(j), Interrupted::Refuse) if !j.is_complete() => {
            bail!("{}", j.intervention_required(data_dir))
        }
        (Some(j), Interrupted::Resume) if !j.is_complete() => {
            if let Some(s) = source {
                anyhow::ensure!(
                    s == j.source(),
                    "the interrupted restore was of {}, not {}: resume it without naming a \
                     backup, or abandon it (--abandon)",
                    j.source().display(),
                    s.display()
                );
            }
            j.source().to_path_buf()
        }
        (_, Interrupted::Resume) => {
            bail!(
                "there is no interrupted restore in {} to resume",
                data_dir.display()
            )
        }
        (_, Interrupted::Refuse) => source
            .context("name the backup to restore (a directory under the backups directory)")?
            .to_path_buf(),
    };
    let verified = verify(&source, bar)?;
    let dump = verified.dump()?;
    let store = Store::open(location, std::sync::Arc::new(bc_store::SystemClock))
        .await
        .or_store(&format!("cannot open {location}"))?;
    refuse_live(&store).await?;
    let id = verified.manifest.id.clone();
    let mut journal = Journal::start(data_dir, &id, &source)?;
    for (name, _, mode) in KEY_FILES {
        let from = source.join("keys").join(name);
        if verified
            .manifest
            .files
            .iter()
            .any(|f| f.path == format!("keys/{name}"))
        {
            let bytes = std::fs::read(&from)?;
            bcd_sys::fs::atomic_write(&data_dir.join(name), &bytes, *mode)?;
        }
    }
    journal.reached(Phase::KeysRestored)?;
    pause("restore-after-keys");
    bar.set_message("restoring the store (one transaction)");
    match store.restore(dump).await {
        Ok(()) => {}
        Err(TxError::Refused(r)) => bail!("cannot restore the store: {r}"),
        Err(TxError::Store(e)) => {
            return Err(store_error(
                e,
                "cannot restore the store (nothing of it was restored: its restore is one \
                 transaction; run backup restore --resume once the store is well)",
            ));
        }
    }
    // The dump holds its own set as CREATING: here it is the set this
    // plane came from, never restore eligible (audited by the store).
    store
        .fail_backup(&id, RESTORED_FROM_THIS_SET)
        .await
        .or_store("cannot record the restored set")?;
    journal.reached(Phase::StoreRestored)?;
    pause("restore-after-store");
    journal.reached(Phase::Complete)?;
    Ok(id)
}

/// Refuses while any process holds a live lease on the store (a gateway,
/// a controller, a backup being written).
async fn refuse_live(store: &Store) -> anyhow::Result<()> {
    const WHAT: &str = "cannot read the store's leases";
    let now = store.now().await.or_store(WHAT)?;
    let leases = store.leases().await.or_store(WHAT)?;
    if let Some(l) = leases.into_iter().find(|l| l.live(now)) {
        bail!(
            "a control plane is using this store: {} holds the lease {} for {} s more; stop \
             every better-compute serve on it (systemctl stop better-compute on each host), \
             wait for its leases to lapse, then run backup restore again",
            l.owner,
            l.name,
            ((l.expires_at_ms - now).max(0) + 999) / 1000
        );
    }
    Ok(())
}

/// Abandons an interrupted restore: its journal is kept beside, renamed,
/// and the data directory is left as the restore left it.
pub fn abandon(data_dir: &Path) -> anyhow::Result<String> {
    match Journal::read(data_dir)? {
        Some(j) if !j.is_complete() => j.abandon(data_dir),
        _ => bail!(
            "there is no interrupted restore in {} to abandon",
            data_dir.display()
        ),
    }
}

/// For `backup list` and `show`.
#[derive(Debug, Clone, Serialize)]
pub struct SetView {
    #[serde(flatten)]
    pub row: BackupRow,
    /// This control plane was restored from this set.
    pub restored_here: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_or_garbage_is_not() {
        let me = process_identity();
        assert!(process_alive(&me), "{me}");
        let pid = std::process::id();
        let start = start_time(pid).unwrap();
        assert!(!process_alive(&format!("{pid}:{}", start + 1)));
        assert!(!process_alive("garbage"));
        assert!(!process_alive("4294967295:1"));
        let host = host_identity();
        assert!(host.split_whitespace().count() == 2, "{host}");
    }

    #[test]
    fn a_set_is_verified_file_by_file() {
        let d = tempfile::tempdir().unwrap();
        let set = d.path().join("bk-1");
        // No manifest: an interrupted set.
        std::fs::create_dir(&set).unwrap();
        let e = verify(&set, &ProgressBar::hidden())
            .unwrap_err()
            .to_string();
        assert!(e.contains(MANIFEST_INCOMPLETE), "{e}");
        let files = vec![put(&set, "keys/ca.key", b"key", 0o600).unwrap()];
        let dump = Dump {
            backend: "sqlite".into(),
            schema_version: 1,
            taken_at: 0,
            tables: vec![],
            sequences: vec![],
        };
        let m = Manifest::new("bk-1", 0, &dump, files);
        std::fs::write(set.join(manifest::FILE), m.to_json()).unwrap();
        verify(&set, &ProgressBar::hidden()).unwrap();
        std::fs::write(set.join("keys/ca.key"), b"kez").unwrap();
        let e = verify(&set, &ProgressBar::hidden())
            .unwrap_err()
            .to_string();
        assert!(e.contains("backup file keys/ca.key does not match"), "{e}");
        // A manifest naming a path outside the set.
        let mut m = m;
        m.files[0].path = "../elsewhere".into();
        std::fs::write(set.join(manifest::FILE), m.to_json()).unwrap();
        assert!(
            verify(&set, &ProgressBar::hidden())
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
        // A failed set is never restored.
        mark_failed(&set, MANIFEST_INCOMPLETE);
        let e = verify(&set, &ProgressBar::hidden())
            .unwrap_err()
            .to_string();
        assert!(e.contains("not restore eligible"), "{e}");
    }
}
