//! The doctor's checks, one function each, every one read-only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bcd_proto::v1;
use prost::Message;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use rustls_pki_types::{CertificateDer, UnixTime};

use super::{Check, Options};
use crate::converge::access::{self, SshdPlan};
use crate::converge::devices::{self, CDI_FILE, env_files_in};
use crate::identity::{self, CA, CERT, IDENTITY, IdentityError, IdentityFile, JOURNAL, KEY};
use crate::journal::{EventBounds, SCHEMA_VERSION};
use crate::slots::Slots;

const JOIN_AGAIN: &str = "join again: bcd join --reset --yes, then bcd join";
use crate::tpm_key::TPM_UNAVAILABLE;

fn ago(ms: i64) -> String {
    let d = Duration::from_millis(ms.unsigned_abs());
    let s = d.as_secs();
    if s >= 2 * 86_400 {
        format!("{} days", s / 86_400)
    } else if s >= 2 * 3600 {
        format!("{} h", s / 3600)
    } else if s >= 120 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

fn utc(ms: i64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64),
    )
    .to_string()
}

/// The identity's files as they are on disk, read once.
#[derive(Debug)]
pub struct IdentityFiles {
    pub dir: PathBuf,
    pub file: Result<IdentityFile, IdentityError>,
    pub key: std::io::Result<String>,
    pub cert: Result<CertificateDer<'static>, String>,
    pub ca: Result<CertificateDer<'static>, String>,
}

fn read_cert(path: &Path) -> Result<CertificateDer<'static>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(&bytes)
        .map_err(|e| format!("{} is not a PEM certificate ({e})", path.display()))
}

impl IdentityFiles {
    pub fn read(dir: &Path) -> IdentityFiles {
        let id_path = dir.join(IDENTITY);
        let file = match std::fs::read(&id_path) {
            Ok(bytes) => identity::parse(&id_path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(IdentityError::NotJoined {
                dir: dir.to_path_buf(),
            }),
            Err(e) => Err(IdentityError::Corrupt {
                path: id_path,
                reason: e.to_string(),
            }),
        };
        IdentityFiles {
            dir: dir.to_path_buf(),
            file,
            key: std::fs::read_to_string(dir.join(KEY)),
            cert: read_cert(&dir.join(CERT)),
            ca: read_cert(&dir.join(CA)),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether `cert` chains to `ca` at `now_ms` as a client certificate:
/// `Ok(true)` valid, `Ok(false)` valid but expired, `Err` not issued by it.
fn chains_to(
    cert: &CertificateDer<'static>,
    ca: &CertificateDer<'static>,
    now_ms: i64,
) -> Result<bool, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(ca.clone())
        .map_err(|e| format!("ca.crt is not a usable CA certificate ({e})"))?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.into(),
        bcd_proto::tls::provider(),
    )
    .build()
    .map_err(|e| format!("ca.crt is not a usable CA certificate ({e})"))?;
    let now = UnixTime::since_unix_epoch(Duration::from_millis(now_ms.max(0) as u64));
    match verifier.verify_client_cert(cert, &[], now) {
        Ok(_) => Ok(true),
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Expired | rustls::CertificateError::ExpiredContext { .. },
        )) => Ok(false),
        Err(e) => Err(format!(
            "node.crt does not chain to the fleet CA in ca.crt ({e})"
        )),
    }
}

/// Files present and consistent, the key matching the certificate (in the
/// TPM when `node.key` is a TPM record), the certificate issued by the
/// fleet CA.
pub async fn identity(opts: &Options, f: &IdentityFiles) -> Check {
    const C: &str = "identity";
    let file = match &f.file {
        Ok(file) => file,
        Err(e @ IdentityError::NotJoined { .. }) => {
            return Check::fail(
                C,
                format!("no identity in {}", f.dir.display()),
                e.to_string()
                    .split_once(": ")
                    .map_or_else(String::new, |(_, next)| next.to_string()),
            );
        }
        Err(e) => return Check::fail(C, e.to_string(), JOIN_AGAIN),
    };
    let key = match &f.key {
        Ok(k) => k,
        Err(e) => {
            return Check::fail(
                C,
                format!(
                    "{} cannot be read ({e}): the node has no key",
                    f.dir.join(KEY).display()
                ),
                JOIN_AGAIN,
            );
        }
    };
    let (cert, ca) = match (&f.cert, &f.ca) {
        (Ok(c), Ok(a)) => (c, a),
        (Err(e), _) | (_, Err(e)) => return Check::fail(C, e.clone(), JOIN_AGAIN),
    };
    let held = if key.trim_start().starts_with("bcd-tpm-key ") {
        match tpm_key(opts, key, cert).await {
            Ok(()) => "in the TPM",
            Err(check) => return check,
        }
    } else {
        let pair = match rcgen::KeyPair::from_pem(key) {
            Ok(p) => p,
            Err(e) => {
                return Check::fail(
                    C,
                    format!("{} is not a node key ({e})", f.dir.join(KEY).display()),
                    JOIN_AGAIN,
                );
            }
        };
        if !contains(cert, &rcgen::PublicKeyData::subject_public_key_info(&pair)) {
            return Check::fail(
                C,
                format!(
                    "the node key does not match the node certificate in {}",
                    f.dir.display()
                ),
                JOIN_AGAIN,
            );
        }
        "in node.key"
    };
    if let Err(e) = chains_to(cert, ca, opts.now_ms) {
        return Check::fail(C, e, JOIN_AGAIN);
    }
    Check::ok(
        C,
        format!(
            "node {} (certificate {}); the key {held} matches the certificate, which the fleet CA issued",
            file.node_id, file.cert_serial
        ),
    )
}

/// The TPM still holds the identity: its AK is the one the certificate
/// names (if any), and the record still derives the certificate's key.
async fn tpm_key(opts: &Options, key: &str, cert: &CertificateDer<'static>) -> Result<(), Check> {
    const C: &str = "identity";
    let record = bcd_tpm::NodeKeyRecord::parse_text(key.trim()).map_err(|e| {
        Check::fail(
            C,
            format!("node.key is not a TPM key record ({e})"),
            JOIN_AGAIN,
        )
    })?;
    let endpoint = match &opts.helper {
        Some(socket) => bcd_tpm::TpmAt {
            backend: opts.tpm.backend,
            endpoint: bcd_tpm::Endpoint::Helper(socket.clone()),
        },
        None => opts.tpm.clone(),
    };
    if let Err(e) = endpoint.backend.check(&endpoint.endpoint) {
        return Err(Check::fail(
            C,
            e.to_string(),
            "check with --tpm-backend protocol (BCD_TPM_BACKEND), the backend bcd node uses here",
        ));
    }
    let cert = cert.clone();
    // What bcd node checks before it starts: the AK the certificate names
    // (another TPM), then the key the record derives (a cleared TPM).
    let checked = tokio::task::spawn_blocking(move || {
        crate::tpm_key::TpmKey::for_certificate(endpoint, record, &cert).map(drop)
    })
    .await
    .map_err(|e| Check::fail(C, format!("the TPM check did not finish: {e}"), ""))?;
    match checked {
        Ok(()) => Ok(()),
        Err(m) if m.starts_with(TPM_UNAVAILABLE) => Err(Check::fail(
            C,
            m,
            "check the TPM (/dev/tpmrm0), or bcd-helper.service where bcd node runs unprivileged: bcd node does not start without it",
        )),
        Err(m) => Err(Check::fail(C, m, JOIN_AGAIN)),
    }
}

/// Life left and the renewal state.
pub fn certificate(opts: &Options, f: &IdentityFiles) -> Check {
    const C: &str = "certificate";
    let Ok(file) = &f.file else {
        return Check::fail(C, "no identity: no certificate", "see the identity check");
    };
    let not_after = file.cert_not_after_ms;
    let issued = if file.cert_issued_ms > 0 {
        file.cert_issued_ms
    } else {
        not_after - bcd_core::renewal::MAX_CERT_LIFE_MS
    };
    let life = (not_after - issued).max(1);
    let left = not_after - opts.now_ms;
    if left <= 0 {
        return Check::fail(
            C,
            format!(
                "certificate {} expired at {} ({} ago): the gateway refuses it",
                file.cert_serial,
                utc(not_after),
                ago(-left)
            ),
            format!("a certificate that expired cannot be renewed: {JOIN_AGAIN}"),
        );
    }
    if file.next.is_some() {
        return Check::warn(
            C,
            "a renewed certificate is half installed",
            "start bcd node: it finishes the renewal before anything else",
        );
    }
    let renew_at = issued + life * 6 / 10;
    let summary = format!(
        "certificate {} valid until {} ({} left of {}{}); renews at about {}",
        file.cert_serial,
        utc(not_after),
        ago(left),
        ago(life),
        if file.ramdisk { ", a ramdisk's" } else { "" },
        utc(renew_at)
    );
    if opts.now_ms > issued + life * 8 / 10 {
        return Check::warn(
            C,
            format!("renewal is overdue: {summary}"),
            "check that bcd node runs and reaches the server (its log says \"renewal failed\" with why)",
        );
    }
    Check::ok(C, summary)
}

/// The server time mark against this machine's clock.
pub fn clock(opts: &Options, f: &IdentityFiles) -> Check {
    const C: &str = "clock";
    let Ok(file) = &f.file else {
        return Check::ok(C, "no identity: no server time mark yet");
    };
    let mark = file.server_time_mark_ms;
    if mark <= 0 {
        return Check::ok(C, "no server time mark yet (never connected)");
    }
    let behind = mark - opts.now_ms;
    if behind > 1000 {
        return Check::warn(
            C,
            format!(
                "this machine's clock is at least {} behind the server's (the server time mark is {})",
                ago(behind),
                utc(mark)
            ),
            "check the time service (timedatectl status, chronyc tracking): TLS and certificate lifetimes use this clock",
        );
    }
    Check::ok(
        C,
        format!(
            "the server time mark is {} ({} ago by this clock; bcd itself uses server time)",
            utc(mark),
            ago(-behind)
        ),
    )
}

/// The journal as SQLite reads it, read-only.
#[derive(Debug)]
pub enum JournalView {
    Missing,
    Broken(String),
    Open(Connection),
}

impl JournalView {
    pub fn open(dir: &Path) -> JournalView {
        let path = dir.join(JOURNAL);
        if !path.exists() {
            return JournalView::Missing;
        }
        match Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        ) {
            Ok(c) => {
                let _ = c.busy_timeout(Duration::from_secs(2));
                JournalView::Open(c)
            }
            Err(e) => JournalView::Broken(e.to_string()),
        }
    }
}

const MOVE_ASIDE: &str = "stop bcd node and move journal.db aside (mv journal.db journal.db.bad), or let bcd node do it at its next start: a new journal begins, and the server fails the commands in flight as journal-lost";

fn journal_facts(c: &Connection) -> rusqlite::Result<(u32, Vec<String>, [i64; 4])> {
    let version: u32 = c.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let mut stmt = c.prepare("PRAGMA integrity_check")?;
    let problems: Vec<String> = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    let problems = problems.into_iter().filter(|p| p != "ok").collect();
    let one = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0));
    let counts = [
        one("SELECT count(*) FROM commands WHERE state = 'done' AND acked = 0")?,
        one("SELECT count(*) FROM commands WHERE state != 'done'")?,
        one("SELECT count(*) FROM events")?,
        one("SELECT coalesce(sum(size), 0) FROM events")?,
    ];
    Ok((version, problems, counts))
}

/// Opens, passes `PRAGMA integrity_check`, its schema version, what waits
/// for the server, and the event backlog against its bounds.
pub fn journal(view: &JournalView) -> Check {
    const C: &str = "journal";
    let c = match view {
        JournalView::Missing => return Check::ok(C, "no journal yet: bcd node starts one"),
        JournalView::Broken(e) => {
            return Check::fail(C, format!("journal.db does not open ({e})"), MOVE_ASIDE);
        }
        JournalView::Open(c) => c,
    };
    let (version, problems, [results, running, events, bytes]) = match journal_facts(c) {
        Ok(f) => f,
        Err(e) => {
            return Check::fail(
                C,
                format!("journal.db is not a readable journal ({e})"),
                MOVE_ASIDE,
            );
        }
    };
    if !problems.is_empty() {
        return Check::fail(
            C,
            format!(
                "journal.db fails its integrity check: {}",
                problems
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            MOVE_ASIDE,
        );
    }
    if version > SCHEMA_VERSION {
        return Check::fail(
            C,
            format!(
                "journal.db has schema version {version}, written by a newer bcd (this one knows up to {SCHEMA_VERSION})"
            ),
            "run that release of bcd or a newer one",
        );
    }
    let bounds = EventBounds::default();
    let summary = format!(
        "schema version {version}, integrity ok; {results} results and {events} events unacknowledged ({} KiB of {} MiB, {events} of {}), {running} commands in flight",
        bytes / 1024,
        bounds.max_bytes >> 20,
        bounds.max_count
    );
    let full = |n: i64, max: u64| n as u64 * 10 >= max * 8;
    if full(events, bounds.max_count) || full(bytes, bounds.max_bytes) {
        return Check::warn(
            C,
            format!("the event backlog is near its bound: {summary}"),
            "bcd drops metric events oldest first when full (never results or transitions): check that the node reaches the server",
        );
    }
    Check::ok(C, summary)
}

/// The spec the node enforces, as the journal holds it (verified against
/// the worker keys learned at join, as the daemon does).
pub fn applied_spec(f: &IdentityFiles, view: &JournalView) -> Option<v1::NodeSpec> {
    let JournalView::Open(c) = view else {
        return None;
    };
    let signed: Vec<u8> = c
        .query_row("SELECT signed FROM spec WHERE id = 1", [], |r| r.get(0))
        .optional()
        .ok()??;
    let keys: Vec<Vec<u8>> = f
        .file
        .as_ref()
        .ok()?
        .worker_keys
        .iter()
        .filter_map(|k| hex::decode(k).ok())
        .collect();
    let payload = bcd_proto::sign::open(&signed, &keys).ok()?;
    v1::NodeSpec::decode(payload.as_slice()).ok()
}

/// The A/B slots: the link, a pending upgrade, the floor, the other slot.
pub fn slots(opts: &Options) -> Check {
    const C: &str = "slots";
    let slots = Slots::new(&opts.data_dir);
    if !slots.exist() {
        return Check::ok(C, "no self-update yet: bcd runs as installed");
    }
    let state = match slots.load() {
        Ok(s) => s,
        Err(e) => {
            return Check::fail(
                C,
                bcd_sys::error::chain(&e),
                "bcd rollback --data-dir DIR, or reinstall bcd",
            );
        }
    };
    let cur = state.current;
    let other = cur.other();
    let seq = |s: bcd_core::update::Slot| state.sequences[s as usize];
    let describe = |s: bcd_core::update::Slot| {
        format!(
            "slot {} (release {}{})",
            s.name(),
            seq(s),
            match state.versions[s as usize].as_str() {
                "" => String::new(),
                v => format!(", {v}"),
            }
        )
    };
    if std::fs::metadata(slots.binary(cur)).is_err() {
        return Check::fail(
            C,
            format!("current points at {}, which has no binary", describe(cur)),
            "bcd rollback, or reinstall bcd",
        );
    }
    if !state.usable(cur) && state.pending.is_none() {
        return Check::fail(
            C,
            format!(
                "current points at {}, below the release floor {}",
                describe(cur),
                state.floor
            ),
            format!("roll forward to a release at or above {}", state.floor),
        );
    }
    let other_text = if std::fs::metadata(slots.binary(other)).is_err() {
        format!("slot {} is empty", other.name())
    } else if !state.usable(other) {
        format!("{} is below the floor: no swap back to it", describe(other))
    } else if state.failed.contains(&seq(other)) {
        format!("{} failed before", describe(other))
    } else {
        format!("{} can be swapped back to", describe(other))
    };
    let summary = format!(
        "current: {}; floor {}; {other_text}",
        describe(cur),
        state.floor
    );
    if let Some(p) = &state.pending {
        let left = p.deadline_ms as i64 - opts.boot_ms as i64;
        return Check::warn(
            C,
            format!(
                "release {} is unconfirmed ({}); {summary}",
                p.to_sequence,
                if left >= 0 {
                    format!("swapped back unless it confirms within {}", ago(left))
                } else {
                    format!("{} past its deadline", ago(-left))
                }
            ),
            "it confirms on the key holder's receipt of its first report: check that bcd node \
             reaches the server and that the server's key holder runs",
        );
    }
    Check::ok(C, summary)
}

/// The helper: up, and speaking this protocol version.
pub async fn helper(opts: &Options) -> Check {
    const C: &str = "helper";
    let Some(socket) = opts.helper.clone() else {
        return Check::ok(C, "not in use: bcd node acts itself (root mode)");
    };
    let config = bcd_helper::ClientConfig::new(&socket);
    let info =
        tokio::task::spawn_blocking(move || bcd_helper::BlockingClient::new(config).server_info())
            .await;
    match info {
        Ok(Ok(info)) => Check::ok(
            C,
            format!(
                "{} at {} speaks protocol version {}",
                info.software,
                socket.display(),
                info.version
            ),
        ),
        Ok(Err(bcd_helper::ClientError::Refused(why))) => Check::warn(
            C,
            format!(
                "bcd-helper at {} is up but refuses this user: {why}",
                socket.display()
            ),
            "run bcd doctor as the user bcd node runs as, or as root with bcd helper --allow-root",
        ),
        Ok(Err(e)) => Check::fail(
            C,
            e.to_string(),
            "systemctl start bcd-helper.service (journalctl -u bcd-helper.service says why it stopped); until then every privileged act of bcd node fails",
        ),
        Err(e) => Check::fail(C, format!("the helper check did not finish: {e}"), ""),
    }
}

/// GPUs, the CDI spec and the env files against the applied spec.
pub fn devices(opts: &Options, spec: Option<&v1::NodeSpec>) -> Vec<Check> {
    let gpus = opts.host.gpus();
    let (list, inv) = match (gpus.list(), gpus.cdi_inventory()) {
        (Ok(l), Ok(i)) => (l, i),
        (Err(e), _) | (_, Err(e)) => {
            let read = format!("cannot read the GPUs: {e}");
            return vec![
                Check::fail(
                    "gpus",
                    read.clone(),
                    "check /sys/bus/pci and the NVIDIA driver",
                ),
                Check::warn("cdi", "not checked: no GPU inventory", "see the gpus check"),
                Check::warn(
                    "env-files",
                    "not checked: no GPU inventory",
                    "see the gpus check",
                ),
            ];
        }
    };
    let empty = v1::NodeSpec::default();
    let spec_ref = spec.unwrap_or(&empty);
    let plan = devices::plan(spec_ref, &inv);
    let backend = if cfg!(feature = "nvml") {
        "sysfs, NVML where enabled"
    } else {
        "sysfs"
    };
    let names = |v: &[crate::hw::Gpu]| {
        v.iter()
            .map(|g| g.pci_address.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let gpus_check = match &plan {
        Err(e) => Check::fail(
            "gpus",
            format!("{e} ({} GPUs here: {})", list.len(), names(&list)),
            "the GPU is gone from the machine or its driver is not loaded (lspci, nvidia-smi): the devices section stays failed until it is back or the allocation is unassigned",
        ),
        Ok(_) => {
            let no_driver: Vec<&str> = list
                .iter()
                .filter(|g| g.uuid.is_none())
                .map(|g| g.pci_address.as_str())
                .collect();
            let text = format!(
                "{} NVIDIA GPUs ({backend}){}{}",
                list.len(),
                if list.is_empty() {
                    String::new()
                } else {
                    format!(": {}", names(&list))
                },
                if spec.is_some() {
                    "; every GPU the spec assigns is here"
                } else {
                    ""
                }
            );
            if no_driver.is_empty() {
                Check::ok("gpus", text)
            } else {
                Check::warn(
                    "gpus",
                    format!("{text}; no driver for {}", no_driver.join(", ")),
                    "load the NVIDIA driver (modprobe nvidia): without it containers cannot use those GPUs",
                )
            }
        }
    };
    let Ok(plan) = plan else {
        return vec![
            gpus_check,
            Check::warn(
                "cdi",
                "not checked: the spec cannot be applied here",
                "see the gpus check",
            ),
            Check::warn(
                "env-files",
                "not checked: the spec cannot be applied here",
                "see the gpus check",
            ),
        ];
    };
    vec![gpus_check, cdi(opts, &plan), env(opts, &plan)]
}

const REWRITES: &str = "bcd node rewrites it at its next pass (every 30 s); if it stays wrong, read bcd node's log for the devices section";

fn cdi(opts: &Options, plan: &devices::DevicePlan) -> Check {
    const C: &str = "cdi";
    let path = opts.devices.cdi_dir.join(CDI_FILE);
    let on_disk = std::fs::read(&path).ok();
    match (&plan.cdi_spec, on_disk) {
        (None, None) => Check::ok(C, "no GPU assigned: no CDI spec, none on disk"),
        (None, Some(_)) => Check::warn(
            C,
            format!("{} is there though no GPU is assigned", path.display()),
            REWRITES,
        ),
        (Some(_), None) => Check::fail(C, format!("{} is missing", path.display()), REWRITES),
        (Some(want), Some(have)) => {
            let parsed = cdi::Spec::parse(&have)
                .map_err(|e| e.to_string())
                .and_then(|s| s.validate().map(|()| s).map_err(|e| e.to_string()));
            match parsed {
                Err(e) => Check::fail(
                    C,
                    format!("{} is not a valid CDI spec: {e}", path.display()),
                    REWRITES,
                ),
                Ok(_) if &have != want => Check::fail(
                    C,
                    format!(
                        "{} differs from what the spec asks for (edited by hand?)",
                        path.display()
                    ),
                    REWRITES,
                ),
                Ok(s) => Check::ok(
                    C,
                    format!(
                        "{} is valid (cdiVersion {}, {} devices) and matches the spec",
                        path.display(),
                        s.cdi_version,
                        s.devices.len()
                    ),
                ),
            }
        }
    }
}

fn env(opts: &Options, plan: &devices::DevicePlan) -> Check {
    const C: &str = "env-files";
    let dir = &opts.devices.env_dir;
    let mut wrong = Vec::new();
    for (id, file) in &plan.env_files {
        let path = dir.join(format!("{id}.env"));
        match std::fs::read_to_string(&path) {
            Ok(text) if text == file.render() => {}
            Ok(_) => wrong.push(format!("{id}.env differs")),
            Err(_) => wrong.push(format!("{id}.env is missing")),
        }
    }
    let extra: Vec<String> = env_files_in(dir)
        .into_iter()
        .filter(|id| !plan.env_files.contains_key(id))
        .map(|id| format!("{id}.env"))
        .collect();
    if !wrong.is_empty() {
        return Check::fail(
            C,
            format!("in {}: {}", dir.display(), wrong.join(", ")),
            REWRITES,
        );
    }
    if !extra.is_empty() {
        return Check::warn(
            C,
            format!(
                "in {}: {} belong to no assigned allocation",
                dir.display(),
                extra.join(", ")
            ),
            REWRITES,
        );
    }
    Check::ok(
        C,
        format!(
            "{} env files in {}, each as the spec says",
            plan.env_files.len(),
            dir.display()
        ),
    )
}

/// The sshd drop-in (checked by `sshd -t`) and table `inet bcd`.
pub fn access(opts: &Options, spec: Option<&v1::NodeSpec>) -> Vec<Check> {
    let access = spec.and_then(|s| s.access.clone()).unwrap_or_default();
    vec![sshd(opts, &access), firewall(opts, &access)]
}

fn sshd(opts: &Options, spec: &v1::AccessSpec) -> Check {
    const C: &str = "sshd";
    let conf = opts.sshd.etc_dir.join("ssh/sshd_config.d/bcd.conf");
    let plan: SshdPlan = match access::sshd_plan(spec) {
        Ok(p) => p,
        Err(e) => {
            return Check::fail(
                C,
                format!("the spec's access cannot be applied: {e}"),
                "correct the node's access with better-compute nodes access",
            );
        }
    };
    let on_disk = std::fs::read_to_string(&conf).ok();
    if !plan.in_use() {
        return match on_disk {
            None => Check::ok(C, "not in use: the spec grants no ssh access"),
            Some(_) => Check::warn(
                C,
                format!(
                    "{} is there though the spec grants no access",
                    conf.display()
                ),
                REWRITES,
            ),
        };
    }
    let Some(text) = on_disk else {
        return Check::fail(C, format!("{} is missing", conf.display()), REWRITES);
    };
    let bcd = opts.sshd.etc_dir.join("ssh/bcd");
    let mut wrong = Vec::new();
    if text != access::sshd_conf(&opts.sshd) {
        wrong.push("bcd.conf".to_string());
    }
    for u in &plan.users {
        for (sub, want) in [
            ("authorized_keys", &u.authorized_keys),
            ("principals", &u.principals),
        ] {
            if std::fs::read_to_string(bcd.join(sub).join(&u.name))
                .ok()
                .as_ref()
                != Some(want)
            {
                wrong.push(format!("{sub}/{}", u.name));
            }
        }
    }
    if std::fs::read_to_string(bcd.join("trusted_user_ca_keys"))
        .ok()
        .as_ref()
        != Some(&plan.trusted_user_ca_keys)
    {
        wrong.push("trusted_user_ca_keys".into());
    }
    if !wrong.is_empty() {
        return Check::fail(
            C,
            format!("these differ from the spec: {}", wrong.join(", ")),
            REWRITES,
        );
    }
    if !opts.sshd.sshd.exists() {
        return Check::warn(
            C,
            format!(
                "the files match the spec for {} users; sshd is not installed at {}",
                plan.users.len(),
                opts.sshd.sshd.display()
            ),
            "install openssh-server, or the access the spec grants has no effect",
        );
    }
    match access::sshd_check(&opts.sshd, &text) {
        Ok(()) => Check::ok(
            C,
            format!(
                "{} matches the spec ({} users) and sshd -t accepts it",
                conf.display(),
                plan.users.len()
            ),
        ),
        Err(e) => Check::fail(
            C,
            e,
            "the sshd drop-in must pass sshd -t: check sshd's own configuration and version",
        ),
    }
}

fn firewall(opts: &Options, spec: &v1::AccessSpec) -> Check {
    const C: &str = "firewall";
    let wanted: Option<Vec<String>> = spec
        .firewall
        .as_ref()
        .map(|f| f.rules.iter().map(access::rule_comment).collect());
    let current = match access::current_rules(&opts.nft) {
        Ok(c) => c,
        Err(e) if wanted.is_none() => {
            return Check::ok(C, format!("not in use: the spec has no firewall ({e})"));
        }
        Err(e) => {
            return Check::fail(
                C,
                e,
                "install nftables (nft) and make sure bcd node may run it",
            );
        }
    };
    match (wanted, current) {
        (None, None) => Check::ok(C, "not in use: no table inet bcd, and the spec wants none"),
        (None, Some(_)) => Check::warn(
            C,
            "table inet bcd is there though the spec has no firewall",
            REWRITES,
        ),
        (Some(w), None) => Check::fail(
            C,
            format!("table inet bcd is missing; the spec has {} rules", w.len()),
            REWRITES,
        ),
        (Some(w), Some(c)) if w == c => Check::ok(
            C,
            format!("table inet bcd holds the spec's {} rules", w.len()),
        ),
        (Some(w), Some(c)) => Check::fail(
            C,
            format!(
                "table inet bcd differs from the spec: {} rules there{}, {} wanted",
                c.iter().filter(|r| !r.starts_with('<')).count(),
                if c.iter().any(|r| !r.starts_with("bcd:")) {
                    ", some not written by bcd"
                } else {
                    ""
                },
                w.len()
            ),
            "bcd node replaces the table at its next pass: keep rules of your own in a table of your own, not in inet bcd",
        ),
    }
}

/// The udev rules a packaged install needs, where udevd runs.
pub fn udev(opts: &Options) -> Check {
    const C: &str = "udev";
    if !opts.udevd.exists() {
        return Check::ok(
            C,
            "no udev daemon here (a ramdisk: bcd init loads drivers by modalias)",
        );
    }
    let mut wrong = Vec::new();
    for f in bcd_udev::rules::FILES {
        let path = opts.udev_rules_dir.join(f.name);
        match std::fs::read_to_string(&path) {
            Ok(t) if t == f.text => {}
            Ok(_) => wrong.push(format!("{} differs from this bcd's", path.display())),
            Err(_) => wrong.push(format!("{} is missing", path.display())),
        }
    }
    if wrong.is_empty() {
        return Check::ok(
            C,
            format!("{} rules files installed", bcd_udev::rules::FILES.len()),
        );
    }
    Check::warn(
        C,
        wrong.join("; "),
        format!(
            "install udev/rules/* into {}, then udevadm control --reload && udevadm trigger --tag-match=bcd",
            opts.udev_rules_dir.display()
        ),
    )
}

/// Whether a gateway answers this identity: a mutual-TLS call outside the
/// session, so a running daemon keeps its own.
pub async fn gateway(opts: &Options, f: &IdentityFiles) -> Check {
    const C: &str = "gateway";
    let (Ok(file), Ok(key), Ok(cert), Ok(ca)) = (&f.file, &f.key, &f.cert, &f.ca) else {
        return Check::fail(
            C,
            "not probed: the identity is incomplete",
            "see the identity check",
        );
    };
    if key.trim_start().starts_with("bcd-tpm-key ") {
        return Check::warn(
            C,
            "not probed: the node key is in the TPM",
            "bcd node's log shows its sessions",
        );
    }
    use rustls_pki_types::pem::PemObject;
    let Ok(private) = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()) else {
        return Check::fail(
            C,
            "not probed: node.key does not parse",
            "see the identity check",
        );
    };
    let server = file.server.clone();
    let probe = async {
        let config = bcd_proto::tls::client_config(
            bcd_proto::tls::ServerTrust::Ca(ca.clone()),
            Some(bcd_proto::tls::ClientIdentity {
                chain: vec![cert.clone()],
                key: private,
            }),
        )
        .map_err(|e| format!("{e:#}"))?;
        let conn = bcd_proto::tls::dial(&server, config)
            .await
            .map_err(|e| bcd_sys::error::chain(&e))?;
        Ok::<_, String>(
            v1::join_client::JoinClient::new(conn)
                .fetch_release(v1::FetchReleaseRequest {
                    sequence: i64::MAX as u64,
                    offset: 0,
                })
                .await,
        )
    };
    match tokio::time::timeout(opts.gateway_timeout, probe).await {
        Err(_) => Check::fail(
            C,
            format!(
                "no answer from {server} within {} s",
                opts.gateway_timeout.as_secs()
            ),
            "check the network and that better-compute serve runs there; bcd node redials with back-off",
        ),
        Ok(Err(e)) => Check::fail(
            C,
            format!("cannot reach {server}: {e}"),
            "check the network and that better-compute serve runs there; bcd node redials with back-off",
        ),
        Ok(Ok(Err(s))) if s.code() == tonic::Code::NotFound => {
            Check::ok(C, format!("{server} answers and accepts this identity"))
        }
        Ok(Ok(Err(s)))
            if matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ) =>
        {
            Check::fail(
                C,
                format!("{server} refuses this identity: {}", s.message()),
                format!("the node was deleted or its certificate revoked or expired: {JOIN_AGAIN}"),
            )
        }
        Ok(Ok(Err(s))) => Check::fail(
            C,
            format!("{server} answered {}: {}", s.code(), s.message()),
            "check the server's log",
        ),
        Ok(Ok(Ok(_))) => Check::ok(C, format!("{server} answers and accepts this identity")),
    }
}
