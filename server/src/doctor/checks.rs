//! The control-plane doctor's checks, one function each. None writes.

use std::path::Path;
use std::time::Duration;

use bc_store::leases::LeaseRow;
use bc_store::{Store, StoreError, SystemClock};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;

use super::{Check, KEYS_FILE, Options};

const DAY_MS: i64 = 86_400_000;
/// The CA warns this long before it runs out.
pub const CA_WARN: Duration = Duration::from_secs(90 * 86_400);
/// The serving certificate warns this long before it runs out.
pub const SERVING_WARN: Duration = Duration::from_secs(7 * 86_400);
/// The controllers every fleet needs one holder of.
pub const CONTROLLERS: &[&str] = &["liveness", "sweeper", "rollouts"];

fn utc(ms: i64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64),
    )
    .to_string()
}

/// "3d 4h", "5m 2s": how long, for people.
fn span(ms: i64) -> String {
    let secs = ms.unsigned_abs() / 1000;
    let d = Duration::from_secs(if secs >= 86_400 {
        secs - secs % 3600
    } else if secs >= 3600 {
        secs - secs % 60
    } else {
        secs
    });
    humantime::format_duration(d).to_string()
}

/// A certificate's validity and the raw key it carries.
struct CertView {
    not_after_ms: i64,
    public_key: Vec<u8>,
    tbs: Vec<u8>,
    signature: Vec<u8>,
}

fn read_cert(path: &Path) -> Result<CertView, String> {
    use x509_parser::prelude::FromDer;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let der = CertificateDer::from_pem_slice(&bytes)
        .map_err(|_| format!("{} is not a PEM certificate", path.display()))?;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der)
        .map_err(|_| format!("{} does not parse as a certificate", path.display()))?;
    Ok(CertView {
        not_after_ms: cert.validity().not_after.timestamp() * 1000,
        public_key: cert.public_key().subject_public_key.data.to_vec(),
        tbs: cert.tbs_certificate.as_ref().to_vec(),
        signature: cert.signature_value.data.to_vec(),
    })
}

fn read_key(path: &Path) -> Result<rcgen::KeyPair, String> {
    let pem = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    rcgen::KeyPair::from_pem(&pem).map_err(|_| format!("{} is not a usable key", path.display()))
}

/// Ok, warn or fail by the time left before `not_after_ms`.
fn expiry(
    check: &'static str,
    what: &str,
    not_after_ms: i64,
    now_ms: i64,
    warn: Duration,
    next: &str,
) -> Check {
    let left = not_after_ms - now_ms;
    if left <= 0 {
        Check::fail(
            check,
            format!(
                "{what} expired at {} ({} ago)",
                utc(not_after_ms),
                span(left)
            ),
            next,
        )
    } else if left < warn.as_millis() as i64 {
        Check::warn(
            check,
            format!(
                "{what} expires at {} (in {})",
                utc(not_after_ms),
                span(left)
            ),
            next,
        )
    } else {
        Check::ok(
            check,
            format!(
                "{what} valid until {} ({} days left)",
                utc(not_after_ms),
                left / DAY_MS
            ),
        )
    }
}

/// The fleet CA: `ca.crt` and `ca.key` present, the key the certificate's,
/// and its life left.
pub fn ca(dir: &Path, now_ms: i64) -> Check {
    const C: &str = "ca";
    let (cert_path, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
    if !cert_path.exists() && !key_path.exists() {
        return Check::fail(
            C,
            format!("no fleet CA in {}", dir.display()),
            "better-compute serve creates it at its first start; if this fleet ran before, \
             restore ca.crt and ca.key from a backup (a new CA means every node joins again)",
        );
    }
    let cert = match read_cert(&cert_path) {
        Ok(c) => c,
        Err(e) => {
            return Check::fail(
                C,
                e,
                "restore ca.crt from a backup (a new CA means every node joins again)",
            );
        }
    };
    if !key_path.exists() {
        return Check::fail(
            C,
            format!(
                "ca.key is missing from {}: no node can join or renew its certificate",
                dir.display()
            ),
            "restore ca.key (mode 0600) from a backup; without it the fleet needs a new CA \
             and every node joins again",
        );
    }
    match read_key(&key_path) {
        Err(e) => {
            return Check::fail(C, e, "restore ca.key (mode 0600) from a backup");
        }
        Ok(key) if key.public_key_raw() != cert.public_key.as_slice() => {
            return Check::fail(
                C,
                "ca.key is not the key of ca.crt",
                "restore the matching pair from one backup",
            );
        }
        Ok(_) => {}
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key_path).map_or(0, |m| m.permissions().mode());
    if mode & 0o077 != 0 {
        return Check::warn(
            C,
            format!(
                "ca.key is readable beyond its owner (mode {:o}): whoever reads it can mint node \
                 certificates",
                mode & 0o777
            ),
            format!("chmod 600 {}", key_path.display()),
        );
    }
    expiry(
        C,
        "the fleet CA is",
        cert.not_after_ms,
        now_ms,
        CA_WARN,
        "plan a new CA: every node must join again under it",
    )
}

/// The gateway's serving certificate: present, signed by the fleet CA,
/// and its life left.
pub fn serving(dir: &Path, now_ms: i64) -> Check {
    const C: &str = "serving-cert";
    let renew = "remove gateway.crt and gateway.key and restart better-compute serve: it issues \
                 a new serving certificate from the CA (nodes trust the CA, not the certificate)";
    let cert = match read_cert(&dir.join("gateway.crt")) {
        Ok(c) => c,
        Err(e) if !dir.join("gateway.crt").exists() => {
            return Check::fail(
                C,
                format!("no serving certificate in {}: {e}", dir.display()),
                "better-compute serve issues one from the CA at its start",
            );
        }
        Err(e) => return Check::fail(C, e, renew),
    };
    if !dir.join("gateway.key").exists() {
        return Check::fail(
            C,
            "gateway.key is missing: the gateway cannot serve TLS",
            renew,
        );
    }
    if let Ok(ca) = read_cert(&dir.join("ca.crt")) {
        let signed = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            &ca.public_key,
        )
        .verify(&cert.tbs, &cert.signature)
        .is_ok();
        if !signed {
            return Check::fail(
                C,
                "gateway.crt is not signed by this data directory's CA: nodes will refuse it",
                renew,
            );
        }
    }
    expiry(
        C,
        "the serving certificate is",
        cert.not_after_ms,
        now_ms,
        SERVING_WARN,
        renew,
    )
}

async fn bounded<T>(
    opts: &Options,
    f: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Option<Result<T, StoreError>> {
    tokio::time::timeout(opts.store_timeout, f).await.ok()
}

/// The store: reachable, and every migration this binary knows applied.
/// Returns it for the checks that read it.
pub async fn store(opts: &Options) -> (Check, Option<Store>) {
    const C: &str = "store";
    let at = &opts.store;
    let next_unreachable = if at.is_postgres() {
        "check that the database runs and this host reaches it with the address in --store \
         (or BC_STORE), and the credentials it carries"
    } else {
        "check the path given by --data-dir or --store, and that this user can read it"
    };
    let store = match bounded(
        opts,
        Store::open_existing(at, std::sync::Arc::new(SystemClock)),
    )
    .await
    {
        Some(Ok(s)) => s,
        Some(Err(StoreError::Missing)) => {
            return (
                Check::fail(
                    C,
                    format!("there is no store: {at} does not exist"),
                    "better-compute serve creates it at its first start; check --data-dir or \
                     --store",
                ),
                None,
            );
        }
        Some(Err(StoreError::TooNew { found, known })) => {
            return (too_new(found, known), None);
        }
        Some(Err(_)) | None => {
            return (
                Check::fail(C, format!("{at} cannot be opened"), next_unreachable),
                None,
            );
        }
    };
    let want = Store::schema_target(at);
    match bounded(opts, store.schema_version()).await {
        Some(Ok(v)) if v == want => (
            Check::ok(
                C,
                format!("{at} answers; schema {v}, every migration applied"),
            ),
            Some(store),
        ),
        Some(Ok(v)) if v < want => (
            Check::warn(
                C,
                format!("{at} answers; {v} of {want} migrations applied"),
                "better-compute serve applies the rest at its next start",
            ),
            Some(store),
        ),
        Some(Ok(v)) => (too_new(v, want), None),
        Some(Err(_)) => (
            Check::fail(
                C,
                format!("{at} does not answer: its schema cannot be read"),
                format!(
                    "{next_unreachable}; a store never migrated has no schema: better-compute \
                     serve migrates it"
                ),
            ),
            None,
        ),
        None => (
            Check::fail(
                C,
                format!(
                    "{at} did not answer within {}",
                    humantime::format_duration(opts.store_timeout)
                ),
                next_unreachable,
            ),
            None,
        ),
    }
}

fn too_new(found: u32, known: u32) -> Check {
    Check::fail(
        "store",
        format!("the store's schema {found} is newer than this binary knows ({known})"),
        "run the better-compute release that wrote it, or a newer one",
    )
}

/// The store's now (`compute_now()` for PostgreSQL; this host's clock for
/// SQLite, which is the store's clock there).
pub async fn store_now(opts: &Options, store: &Store) -> i64 {
    match bounded(opts, store.now()).await {
        Some(Ok(now)) => now,
        _ => opts.now_ms,
    }
}

/// Gateway leases (live and expired) and the controllers' holders.
pub async fn leases(opts: &Options, store: &Store, now: i64) -> Vec<Check> {
    let rows = match bounded(opts, store.leases()).await {
        Some(Ok(rows)) => rows,
        _ => {
            let c = |name| {
                Check::fail(
                    name,
                    "the leases cannot be read from the store",
                    "check the store (see the store check) and run doctor again",
                )
            };
            return vec![c("gateways"), c("controllers")];
        }
    };
    vec![gateway_leases(&rows, now), controllers(&rows, now)]
}

/// Every `gateway:<id>` lease: live ones are gateways serving; expired
/// ones are processes that died or lost the store.
pub fn gateway_leases(rows: &[LeaseRow], now: i64) -> Check {
    const C: &str = "gateways";
    let gateways: Vec<(&str, &LeaseRow)> = rows
        .iter()
        .filter_map(|r| r.name.strip_prefix("gateway:").map(|id| (id, r)))
        .collect();
    let live: Vec<&str> = gateways
        .iter()
        .filter(|(_, r)| r.live(now))
        .map(|(id, _)| *id)
        .collect();
    let expired: Vec<String> = gateways
        .iter()
        .filter(|(_, r)| !r.live(now))
        .map(|(id, r)| format!("{id} ({} ago)", span(now - r.expires_at_ms)))
        .collect();
    match (live.is_empty(), expired.is_empty()) {
        (true, true) => Check::warn(
            C,
            "no gateway holds a lease on this store",
            "start better-compute serve",
        ),
        (true, false) => Check::warn(
            C,
            format!("no gateway holds a lease; expired: {}", expired.join(", ")),
            "start better-compute serve (or see why the gateways stopped in their logs)",
        ),
        (false, true) => Check::ok(C, format!("{} live: {}", live.len(), live.join(", "))),
        (false, false) => Check::warn(
            C,
            format!(
                "{} live: {}; expired: {}",
                live.len(),
                live.join(", "),
                expired.join(", ")
            ),
            "an expired lease is a gateway that died or lost the store: its nodes re-home to \
             the live ones; restart it, or ignore a gateway retired on purpose",
        ),
    }
}

/// Who holds each controller's lease.
pub fn controllers(rows: &[LeaseRow], now: i64) -> Check {
    const C: &str = "controllers";
    let mut held = Vec::new();
    let mut missing = Vec::new();
    for name in CONTROLLERS {
        let lease = bc_store::leases::controller_lease(name);
        match rows.iter().find(|r| r.name == lease && r.live(now)) {
            Some(r) => held.push(format!("{name} by {}", r.owner)),
            None => missing.push(*name),
        }
    }
    if missing.is_empty() {
        Check::ok(C, held.join(", "))
    } else {
        let mut summary = format!("no process runs {}", missing.join(", "));
        if !held.is_empty() {
            summary.push_str(&format!("; {}", held.join(", ")));
        }
        Check::warn(
            C,
            summary,
            "every better-compute serve takes a free controller lease within its TTL (15 s): \
             start one, or see its log for why it cannot",
        )
    }
}

/// This host's clock against the store's.
pub async fn clock(opts: &Options, store: &Store) -> Check {
    const C: &str = "clock";
    if !opts.store.is_postgres() {
        return Check::ok(C, "the SQLite store's clock is this host's own");
    }
    let before = crate::clock::unix_ms();
    let now = bounded(opts, store.now()).await;
    let after = crate::clock::unix_ms();
    match now {
        Some(Ok(store_now)) => {
            let offset = crate::gateway::lease::clock_offset_ms(before, after, store_now);
            let seconds = offset as f64 / 1000.0;
            if crate::gateway::lease::skewed(offset) {
                Check::warn(
                    C,
                    format!("this host's clock is {seconds:+.3} s off the store's"),
                    "fix this host's time sync (chrony, systemd-timesyncd); gateways here raise \
                     ClockSkew, though nothing decides on their clocks",
                )
            } else {
                Check::ok(
                    C,
                    format!("this host's clock is {seconds:+.3} s off the store's"),
                )
            }
        }
        _ => Check::fail(
            C,
            "the store's clock cannot be read",
            "check the store (see the store check) and run doctor again",
        ),
    }
}

/// The public keys to check signatures with: the flags' and those
/// `serve` recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Keys {
    pub release: Vec<Vec<u8>>,
    pub image: Vec<Vec<u8>>,
    /// Whether the recorded file was there.
    pub recorded: bool,
}

#[derive(Debug, Default, Deserialize)]
struct KeysFile {
    #[serde(default)]
    release_pubkeys: Vec<String>,
    #[serde(default)]
    image_pubkeys: Vec<String>,
}

impl Keys {
    pub fn load(opts: &Options) -> Keys {
        let mut keys = Keys {
            release: opts.release_keys.clone(),
            image: opts.image_keys.clone(),
            recorded: false,
        };
        let file: Option<KeysFile> = std::fs::read(opts.data_dir.join(KEYS_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(f) = file {
            keys.recorded = true;
            let hex = |v: Vec<String>| -> Vec<Vec<u8>> {
                v.iter()
                    .filter_map(|k| hex::decode(k.trim()).ok().filter(|b| b.len() == 32))
                    .collect()
            };
            for k in hex(f.release_pubkeys) {
                if !keys.release.contains(&k) {
                    keys.release.push(k);
                }
            }
            for k in hex(f.image_pubkeys) {
                if !keys.image.contains(&k) {
                    keys.image.push(k);
                }
            }
        }
        keys
    }
}

fn no_keys(check: &'static str, n: usize, what: &str, flag: &str) -> Check {
    Check::warn(
        check,
        format!("{n} {what} registered, and no {what} key to check them with"),
        format!(
            "pass {flag} HEX, or start better-compute serve with it once (it records its keys \
             in {KEYS_FILE})"
        ),
    )
}

/// Every registered release: its manifest verifies against a release key
/// and its binary matches the manifest.
pub async fn releases(opts: &Options, store: &Store, keys: &Keys) -> Check {
    const C: &str = "releases";
    let rows = match bounded(opts, store.list_releases()).await {
        Some(Ok(rows)) => rows,
        _ => {
            return Check::fail(
                C,
                "the releases cannot be read from the store",
                "check the store (see the store check) and run doctor again",
            );
        }
    };
    if rows.is_empty() {
        return Check::ok(C, "no releases registered");
    }
    if keys.release.is_empty() {
        return no_keys(C, rows.len(), "release", "--release-pubkey");
    }
    let mut bad = Vec::new();
    for row in &rows {
        let files = match bounded(opts, store.release(row.sequence)).await {
            Some(Ok(Some(f))) => f,
            _ => {
                bad.push(format!("release {}: cannot be read", row.sequence));
                continue;
            }
        };
        let checked = release::SignedManifest::parse(&files.signed_manifest)
            .and_then(|s| s.verify(&keys.release))
            .and_then(|m| m.check(&files.binary).map(|()| m));
        match checked {
            Ok(m) if m.sequence == row.sequence.get() => {}
            Ok(m) => bad.push(format!(
                "release {}: its manifest says sequence {}",
                row.sequence, m.sequence
            )),
            Err(e) => bad.push(format!("release {}: {e}", row.sequence)),
        }
    }
    if bad.is_empty() {
        Check::ok(
            C,
            format!("{} releases verify and match their binaries", rows.len()),
        )
    } else {
        Check::fail(
            C,
            bad.join("; "),
            "nodes refuse these: register the release again signed with a current key, or \
             restore the store from a backup",
        )
    }
}

/// Every registered image: its manifest verifies against an image key and
/// its kernel and initrd match it.
pub async fn images(opts: &Options, store: &Store, keys: &Keys) -> Check {
    const C: &str = "images";
    let rows = match bounded(opts, store.image_manifests()).await {
        Some(Ok(rows)) => rows,
        _ => {
            return Check::fail(
                C,
                "the images cannot be read from the store",
                "check the store (see the store check) and run doctor again",
            );
        }
    };
    if rows.is_empty() {
        return Check::ok(C, "no images registered");
    }
    if keys.image.is_empty() {
        return no_keys(C, rows.len(), "image", "--image-pubkey");
    }
    let mut bad = Vec::new();
    for (id, signed) in &rows {
        let short = &id[..id.len().min(12)];
        let manifest =
            match image::SignedManifest::parse(signed).and_then(|s| s.verify(&keys.image)) {
                Ok(m) => m,
                Err(e) => {
                    bad.push(format!("image {short}: {e}"));
                    continue;
                }
            };
        for part in [&manifest.kernel, &manifest.initrd] {
            match bounded(opts, store.image_artifact(&part.sha256)).await {
                Some(Ok(Some(bytes))) => {
                    if let Err(e) = part.check(&bytes) {
                        bad.push(format!("image {short}: {e}"));
                    }
                }
                Some(Ok(None)) => bad.push(format!(
                    "image {short}: the artifact {} is missing",
                    &part.sha256[..part.sha256.len().min(12)]
                )),
                _ => bad.push(format!("image {short}: its artifacts cannot be read")),
            }
        }
    }
    if bad.is_empty() {
        Check::ok(
            C,
            format!("{} images verify and match their artifacts", rows.len()),
        )
    } else {
        Check::fail(
            C,
            bad.join("; "),
            "machines cannot boot these: register the image again (images register), or \
             restore the store from a backup",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, owner: &str, expires_at_ms: i64) -> LeaseRow {
        LeaseRow {
            name: name.into(),
            owner: owner.into(),
            expires_at_ms,
            renewed_at_ms: expires_at_ms - 20_000,
        }
    }

    #[test]
    fn gateway_leases_name_live_and_expired_ones() {
        let now = 1_000_000;
        assert_eq!(gateway_leases(&[], now).status, super::super::Level::Warn);
        let live = [lease("gateway:gw-a", "gw-a", now + 5_000)];
        let c = gateway_leases(&live, now);
        assert_eq!(c.status, super::super::Level::Ok);
        assert_eq!(c.summary, "1 live: gw-a");
        let both = [
            lease("gateway:gw-a", "gw-a", now + 5_000),
            lease("gateway:gw-b", "gw-b", now - 65_000),
            lease("controller:liveness", "gw-a", now + 5_000),
        ];
        let c = gateway_leases(&both, now);
        assert_eq!(c.status, super::super::Level::Warn);
        assert_eq!(c.summary, "1 live: gw-a; expired: gw-b (1m 5s ago)");
    }

    #[test]
    fn controllers_name_their_holders_or_none() {
        let now = 1_000_000;
        let rows: Vec<LeaseRow> = CONTROLLERS
            .iter()
            .map(|c| lease(&format!("controller:{c}"), "gw-a", now + 1))
            .collect();
        let c = controllers(&rows, now);
        assert_eq!(c.status, super::super::Level::Ok);
        assert_eq!(
            c.summary,
            "liveness by gw-a, sweeper by gw-a, rollouts by gw-a"
        );
        let c = controllers(&rows[..1], now);
        assert_eq!(c.status, super::super::Level::Warn);
        assert_eq!(
            c.summary,
            "no process runs sweeper, rollouts; liveness by gw-a"
        );
        let c = controllers(&[lease("controller:liveness", "gw-a", now - 1)], now);
        assert!(
            c.summary
                .starts_with("no process runs liveness, sweeper, rollouts")
        );
    }

    #[test]
    fn expiry_warns_near_and_fails_past() {
        let now = 10 * DAY_MS;
        let warn = Duration::from_secs(7 * 86_400);
        let c = expiry("x", "it is", now + 30 * DAY_MS, now, warn, "renew");
        assert_eq!(c.status, super::super::Level::Ok);
        let c = expiry("x", "it is", now + 2 * DAY_MS, now, warn, "renew");
        assert_eq!(c.status, super::super::Level::Warn);
        assert_eq!(c.next, "renew");
        let c = expiry("x", "it is", now - DAY_MS, now, warn, "renew");
        assert_eq!(c.status, super::super::Level::Fail);
        assert!(c.summary.contains("expired at"), "{}", c.summary);
    }
}

#[cfg(test)]
mod store_tests {
    use std::sync::Arc;

    use bc_store::images::NewImage;
    use ring::signature::KeyPair;

    use super::*;
    use crate::doctor::Level;

    fn options(dir: &Path) -> Options {
        Options {
            data_dir: dir.to_path_buf(),
            store: bc_store::Location::Sqlite(dir.join("store.db")),
            release_keys: vec![],
            image_keys: vec![],
            store_timeout: Duration::from_secs(5),
            now_ms: crate::clock::unix_ms(),
        }
    }

    /// An image registered as `images register` would: its manifest
    /// signed, its parts stored by hash.
    fn new_image(key: &ring::signature::Ed25519KeyPair) -> NewImage {
        let (kernel, initrd) = (b"kernel".to_vec(), b"initrd".to_vec());
        let manifest = image::Manifest {
            format: image::FORMAT,
            name: "gpu-node".into(),
            kernel_version: "6.1.0".into(),
            bcd_version: "bcd 0.1.0".into(),
            cmdline: "console=ttyS0".into(),
            kernel: image::Part::of("vmlinuz", &kernel),
            initrd: image::Part::of("initrd.img", &initrd),
            modules: vec![],
        };
        let signed = image::sign(&manifest, key);
        NewImage {
            image_id: bc_store::ImageId::from(signed.id().unwrap().0),
            name: manifest.name.clone(),
            key_id: signed.key_id.clone(),
            kernel_version: manifest.kernel_version.clone(),
            bcd_version: manifest.bcd_version.clone(),
            cmdline: manifest.cmdline.clone(),
            kernel_sha256: manifest.kernel.sha256.clone(),
            kernel_size: manifest.kernel.size,
            initrd_sha256: manifest.initrd.sha256.clone(),
            initrd_size: manifest.initrd.size,
            signed_manifest: signed.to_json(),
            kernel,
            initrd,
        }
    }

    #[test]
    fn the_ca_and_serving_certificate_are_checked_as_files() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let now = crate::clock::unix_ms();
        crate::pki::Ca::load_or_create(d.path(), &[], now).unwrap();
        let c = ca(d.path(), now);
        assert_eq!(c.status, Level::Ok, "{c:?}");
        assert!(c.summary.ends_with(" days left)"), "{c:?}");
        let s = serving(d.path(), now);
        assert_eq!(s.status, Level::Ok, "{s:?}");
        // 25 days on: the serving certificate (30 days) warns.
        let later = now + 25 * DAY_MS;
        assert_eq!(serving(d.path(), later).status, Level::Warn);
        // A key readable by others.
        let key = d.path().join("ca.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = ca(d.path(), now);
        assert_eq!(c.status, Level::Warn, "{c:?}");
        assert!(c.next.starts_with("chmod 600 "), "{c:?}");
        // Another CA's key: not a pair; and a serving certificate that
        // this CA did not sign.
        let other = tempfile::tempdir().unwrap();
        crate::pki::Ca::load_or_create(other.path(), &[], now).unwrap();
        std::fs::copy(other.path().join("ca.key"), &key).unwrap();
        let c = ca(d.path(), now);
        assert_eq!(
            (c.status, c.summary.as_str()),
            (Level::Fail, "ca.key is not the key of ca.crt")
        );
        std::fs::copy(
            other.path().join("gateway.crt"),
            d.path().join("gateway.crt"),
        )
        .unwrap();
        let s = serving(d.path(), now);
        assert_eq!(s.status, Level::Fail, "{s:?}");
        assert!(
            s.summary.contains("not signed by this data directory's CA"),
            "{s:?}"
        );
    }

    #[tokio::test]
    async fn images_verify_with_their_key_and_fail_with_another() {
        let d = tempfile::tempdir().unwrap();
        let opts = options(d.path());
        let store = Store::open(&opts.store, Arc::new(SystemClock))
            .await
            .unwrap();
        let keys = |k: &ring::signature::Ed25519KeyPair| Keys {
            image: vec![k.public_key().as_ref().to_vec()],
            ..Keys::default()
        };
        let rng = ring::rand::SystemRandom::new();
        let gen_key = || {
            let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
            ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap()
        };
        let (key, other) = (gen_key(), gen_key());
        let c = images(&opts, &store, &keys(&key)).await;
        assert_eq!(
            (c.status, c.summary.as_str()),
            (Level::Ok, "no images registered")
        );
        store.register_image(&new_image(&key)).await.unwrap();
        let c = images(&opts, &store, &keys(&key)).await;
        assert_eq!(
            (c.status, c.summary.as_str()),
            (Level::Ok, "1 images verify and match their artifacts")
        );
        let c = images(&opts, &store, &Keys::default()).await;
        assert_eq!(c.status, Level::Warn, "{c:?}");
        assert!(c.next.contains("--image-pubkey"), "{c:?}");
        let c = images(&opts, &store, &keys(&other)).await;
        assert_eq!(c.status, Level::Fail, "{c:?}");
        assert!(
            c.summary.contains("not an image key of this server"),
            "{c:?}"
        );
    }

    #[tokio::test]
    async fn a_store_behind_this_binary_warns_and_one_missing_fails() {
        let d = tempfile::tempdir().unwrap();
        let opts = options(d.path());
        let (c, store) = super::store(&opts).await;
        assert_eq!(c.status, Level::Fail);
        assert!(store.is_none());
        assert!(!d.path().join("store.db").exists(), "nothing created");
        // A store at version 3, as an older server left it.
        let db = rusqlite::Connection::open(d.path().join("store.db")).unwrap();
        db.pragma_update(None, "user_version", 3).unwrap();
        drop(db);
        let (c, store) = super::store(&opts).await;
        assert_eq!(c.status, Level::Warn, "{c:?}");
        assert!(
            c.summary.ends_with(&format!(
                "3 of {} migrations applied",
                bc_store::sqlite::SCHEMA_VERSION
            )),
            "{c:?}"
        );
        assert!(c.next.contains("serve applies the rest"), "{c:?}");
        assert!(store.is_some());
    }
}
