//! Netboot images on the control plane: `better-compute images` (keygen,
//! build, register, list, assign, unassign, boots), the store's image
//! tables, and the operator API's image calls. The boot endpoint that
//! serves them is `boot`; what goes into an image is the `image` crate's.
//!
//! An image is registered only when its manifest verifies against one of
//! the server's image keys (`serve --image-pubkey`) and its kernel and
//! initrd match the manifest; the bytes are kept once per SHA-256. An
//! assignment says which image a MAC address boots, or the fleet by
//! default, and may append to the kernel command line (a pool token, the
//! state partition's label).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use bcd_proto::v1::{
    AssignImageRequest, AssignImageResponse, BootInfo, ImageInfo, ListBootsRequest,
    ListBootsResponse, ListImagesRequest, ListImagesResponse, RegisterImageRequest,
};
use clap::Subcommand;
use rusqlite::{OptionalExtension, params};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::admin::AdminService;
use crate::client;
use crate::store::{Store, StoreError};

/// The store's image tables (one migration).
pub const MIGRATION: &str = "
    CREATE TABLE images (
        image_id        TEXT PRIMARY KEY,
        name            TEXT NOT NULL,
        key_id          TEXT NOT NULL,
        kernel_version  TEXT NOT NULL,
        bcd_version     TEXT NOT NULL,
        cmdline         TEXT NOT NULL,
        kernel_sha256   TEXT NOT NULL,
        kernel_size     INTEGER NOT NULL,
        initrd_sha256   TEXT NOT NULL,
        initrd_size     INTEGER NOT NULL,
        signed_manifest BLOB NOT NULL,
        registered_at   INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE image_artifacts (
        sha256 TEXT PRIMARY KEY,
        bytes  BLOB NOT NULL
    ) STRICT;
    CREATE TABLE image_assignments (
        target      TEXT PRIMARY KEY,
        image_id    TEXT NOT NULL REFERENCES images(image_id),
        append      TEXT NOT NULL DEFAULT '',
        assigned_at INTEGER NOT NULL
    ) STRICT;
    CREATE TABLE boots (
        id       INTEGER PRIMARY KEY AUTOINCREMENT,
        mac      TEXT NOT NULL,
        image_id TEXT,
        remote   TEXT NOT NULL,
        outcome  TEXT NOT NULL,
        at       INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX boots_mac ON boots(mac, id);
";

const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
/// Boots kept per MAC address.
const BOOTS_KEPT: i64 = 1000;
/// The most an assignment may append to the kernel command line.
const MAX_APPEND: usize = 2048;

/// A registered image, as the store lists it.
#[derive(Debug, Clone)]
pub struct ImageRow {
    pub info: ImageInfo,
}

/// What the boot endpoint needs to answer a MAC address.
#[derive(Debug, Clone)]
pub struct Assigned {
    pub image_id: String,
    pub signed_manifest: Vec<u8>,
    pub append: String,
}

/// An assignment target: the fleet default or one MAC address.
pub fn parse_target(t: &str) -> Option<String> {
    if t == "default" {
        return Some(t.to_string());
    }
    let mac = crate::boot::parse_mac(t.strip_prefix("mac:")?)?;
    Some(format!("mac:{mac}"))
}

impl Store {
    /// Registers a verified image; returns false when it was already there.
    pub fn register_image(
        &self,
        id: &str,
        key_id: &str,
        m: &image::Manifest,
        signed_manifest: &[u8],
        kernel: &[u8],
        initrd: &[u8],
    ) -> Result<bool, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction()?;
        for (sha, bytes) in [(&m.kernel.sha256, kernel), (&m.initrd.sha256, initrd)] {
            tx.execute(
                "INSERT INTO image_artifacts (sha256, bytes) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                params![sha, bytes],
            )?;
        }
        let n = tx.execute(
            &format!(
                "INSERT INTO images (image_id, name, key_id, kernel_version, bcd_version, cmdline,
                     kernel_sha256, kernel_size, initrd_sha256, initrd_size, signed_manifest,
                     registered_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, {NOW})
                 ON CONFLICT (image_id) DO NOTHING"
            ),
            params![
                id,
                m.name,
                key_id,
                m.kernel_version,
                m.bcd_version,
                m.cmdline,
                m.kernel.sha256,
                m.kernel.size as i64,
                m.initrd.sha256,
                m.initrd.size as i64,
                signed_manifest,
            ],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    pub fn list_images(&self) -> Result<Vec<ImageInfo>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT image_id, name, kernel_version, bcd_version, cmdline, kernel_size,
                    kernel_sha256, initrd_size, initrd_sha256, key_id, registered_at
             FROM images ORDER BY registered_at, image_id",
        )?;
        let mut images = stmt
            .query_map([], |r| {
                Ok(ImageInfo {
                    image_id: r.get(0)?,
                    name: r.get(1)?,
                    kernel_version: r.get(2)?,
                    bcd_version: r.get(3)?,
                    cmdline: r.get(4)?,
                    kernel_size: r.get::<_, i64>(5)? as u64,
                    kernel_sha256: r.get(6)?,
                    initrd_size: r.get::<_, i64>(7)? as u64,
                    initrd_sha256: r.get(8)?,
                    key_id: r.get(9)?,
                    registered_at_ms: r.get(10)?,
                    assigned_to: Vec::new(),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        let mut stmt =
            conn.prepare("SELECT target, image_id FROM image_assignments ORDER BY target")?;
        let assignments = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        for (target, id) in assignments {
            if let Some(i) = images.iter_mut().find(|i| i.image_id == id) {
                i.assigned_to.push(target);
            }
        }
        Ok(images)
    }

    /// An image by id, unique id prefix, or name (the latest registered of
    /// that name).
    pub fn resolve_image(&self, what: &str) -> Result<Result<String, String>, StoreError> {
        let conn = self.lock();
        if crate::boot::valid_sha256(what) {
            let found: Option<String> = conn
                .query_row(
                    "SELECT image_id FROM images WHERE image_id = ?1",
                    [what],
                    |r| r.get(0),
                )
                .optional()?;
            return Ok(
                found.ok_or_else(|| format!("no image {what}: see better-compute images list"))
            );
        }
        let by_name: Option<String> = conn
            .query_row(
                "SELECT image_id FROM images WHERE name = ?1 ORDER BY registered_at DESC, image_id LIMIT 1",
                [what],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = by_name {
            return Ok(Ok(id));
        }
        if what.len() >= 6 && what.bytes().all(|b| b.is_ascii_hexdigit()) {
            let mut stmt =
                conn.prepare("SELECT image_id FROM images WHERE image_id LIKE ?1 || '%'")?;
            let ids = stmt
                .query_map([what.to_ascii_lowercase()], |r| r.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(match ids.as_slice() {
                [one] => Ok(one.clone()),
                [] => Err(format!("no image {what}: see better-compute images list")),
                _ => Err(format!(
                    "{what} names {} images: give more of the id",
                    ids.len()
                )),
            });
        }
        Ok(Err(format!(
            "no image named {what}: give an image id (6 or more hex digits) or a name from better-compute images list"
        )))
    }

    /// Sets (or with `None` clears) what `target` boots.
    pub fn assign_image(
        &self,
        target: &str,
        image_id: Option<&str>,
        append: &str,
    ) -> Result<(), StoreError> {
        let conn = self.lock();
        match image_id {
            Some(id) => conn.execute(
                &format!(
                    "INSERT INTO image_assignments (target, image_id, append, assigned_at)
                     VALUES (?1, ?2, ?3, {NOW})
                     ON CONFLICT (target) DO UPDATE SET image_id = ?2, append = ?3,
                         assigned_at = {NOW}"
                ),
                params![target, id, append],
            )?,
            None => conn.execute("DELETE FROM image_assignments WHERE target = ?1", [target])?,
        };
        Ok(())
    }

    /// What `mac` boots: its own assignment, else the fleet default.
    pub fn image_for_mac(&self, mac: &str) -> Result<Option<Assigned>, StoreError> {
        let conn = self.lock();
        Ok(conn
            .query_row(
                "SELECT a.image_id, i.signed_manifest, a.append
                 FROM image_assignments a JOIN images i ON i.image_id = a.image_id
                 WHERE a.target IN ('mac:' || ?1, 'default')
                 ORDER BY a.target = 'default' LIMIT 1",
                [mac],
                |r| {
                    Ok(Assigned {
                        image_id: r.get(0)?,
                        signed_manifest: r.get(1)?,
                        append: r.get(2)?,
                    })
                },
            )
            .optional()?)
    }

    /// A kernel or initrd by its SHA-256.
    pub fn image_artifact(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .lock()
            .query_row(
                "SELECT bytes FROM image_artifacts WHERE sha256 = ?1",
                [sha256],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Records a request for a boot script; keeps the last boots of each MAC.
    pub fn record_boot(
        &self,
        mac: &str,
        image_id: Option<&str>,
        remote: &str,
        outcome: &str,
    ) -> Result<(), StoreError> {
        let conn = self.lock();
        conn.execute(
            &format!(
                "INSERT INTO boots (mac, image_id, remote, outcome, at) VALUES (?1, ?2, ?3, ?4, {NOW})"
            ),
            params![mac, image_id, remote, outcome],
        )?;
        conn.execute(
            "DELETE FROM boots WHERE mac = ?1 AND id <= (SELECT id FROM boots WHERE mac = ?1
                 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            params![mac, BOOTS_KEPT],
        )?;
        Ok(())
    }

    pub fn boots(&self, mac: Option<&str>, limit: u32) -> Result<Vec<BootInfo>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(
            "SELECT mac, COALESCE(image_id, ''), at, remote, outcome FROM boots
             WHERE ?1 IS NULL OR mac = ?1 ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = stmt
            .query_map(params![mac, limit.max(1) as i64], |r| {
                Ok(BootInfo {
                    mac: r.get(0)?,
                    image_id: r.get(1)?,
                    at_ms: r.get(2)?,
                    remote: r.get(3)?,
                    outcome: r.get(4)?,
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}

fn unavailable(e: StoreError) -> Status {
    warn!(error = %format!("{e:#}"), "store error");
    Status::unavailable("the server's store is unavailable; retry later")
}

/// `RegisterImage`.
pub async fn register(
    svc: &AdminService,
    request: Request<RegisterImageRequest>,
) -> Result<Response<ImageInfo>, Status> {
    let r = request.into_inner();
    if svc.image_keys.is_empty() {
        return Err(Status::failed_precondition(
            "this server has no image key: start it with --image-pubkey HEX (from images keygen)",
        ));
    }
    let signed = image::SignedManifest::parse(&r.signed_manifest)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let manifest = signed
        .verify(&svc.image_keys)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    for (part, bytes) in [(&manifest.kernel, &r.kernel), (&manifest.initrd, &r.initrd)] {
        part.check(bytes)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    let id = signed
        .id()
        .map_err(|e| Status::invalid_argument(e.to_string()))?
        .0;
    let (i, key_id, m) = (id.clone(), signed.key_id.clone(), manifest.clone());
    let created = svc
        .store
        .run(move |s| s.register_image(&i, &key_id, &m, &r.signed_manifest, &r.kernel, &r.initrd))
        .await
        .map_err(unavailable)?;
    info!(image = %id, name = %manifest.name, created, "image registered");
    let images = svc
        .store
        .run(|s| s.list_images())
        .await
        .map_err(unavailable)?;
    images
        .into_iter()
        .find(|i| i.image_id == id)
        .map(Response::new)
        .ok_or_else(|| Status::internal("the image just registered is not listed"))
}

/// `ListImages`.
pub async fn list(
    svc: &AdminService,
    _request: Request<ListImagesRequest>,
) -> Result<Response<ListImagesResponse>, Status> {
    let images = svc
        .store
        .run(|s| s.list_images())
        .await
        .map_err(unavailable)?;
    Ok(Response::new(ListImagesResponse { images }))
}

/// `AssignImage`.
pub async fn assign(
    svc: &AdminService,
    request: Request<AssignImageRequest>,
) -> Result<Response<AssignImageResponse>, Status> {
    let r = request.into_inner();
    let target = parse_target(&r.target).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{:?} is not a target: use default or mac:52:54:00:12:34:56",
            r.target
        ))
    })?;
    if r.append.len() > MAX_APPEND || r.append.contains(['\n', '\r', '\0']) {
        return Err(Status::invalid_argument(format!(
            "--append takes one line of at most {MAX_APPEND} bytes"
        )));
    }
    let image_id = if r.image.is_empty() {
        None
    } else {
        let what = r.image.clone();
        let resolved = svc
            .store
            .run(move |s| s.resolve_image(&what))
            .await
            .map_err(unavailable)?;
        Some(resolved.map_err(Status::not_found)?)
    };
    let (t, i, a) = (target.clone(), image_id.clone(), r.append.clone());
    svc.store
        .run(move |s| s.assign_image(&t, i.as_deref(), &a))
        .await
        .map_err(unavailable)?;
    info!(%target, image = ?image_id, "image assignment changed");
    Ok(Response::new(AssignImageResponse {
        image_id: image_id.unwrap_or_default(),
        target,
        append: r.append,
    }))
}

/// `ListBoots`.
pub async fn boots(
    svc: &AdminService,
    request: Request<ListBootsRequest>,
) -> Result<Response<ListBootsResponse>, Status> {
    let r = request.into_inner();
    let mac =
        if r.mac.is_empty() {
            None
        } else {
            Some(crate::boot::parse_mac(&r.mac).ok_or_else(|| {
                Status::invalid_argument(format!("{:?} is not a MAC address", r.mac))
            })?)
        };
    let limit = if r.limit == 0 {
        100
    } else {
        r.limit.min(10_000)
    };
    let boots = svc
        .store
        .run(move |s| s.boots(mac.as_deref(), limit))
        .await
        .map_err(unavailable)?;
    Ok(Response::new(ListBootsResponse { boots }))
}

/// `better-compute images ...`.
#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Make an ed25519 image key (offline); prints the public half for
    /// serve --image-pubkey.
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Build a netboot image: kernel, initrd with bcd as init, signed
    /// manifest and iPXE script, into --out.
    Build {
        /// A kernel: a Debian package (.deb), its unpacked folder, or a
        /// vmlinuz file (modules then under --modules-root).
        #[arg(long)]
        kernel: PathBuf,
        #[arg(long)]
        modules_root: Option<PathBuf>,
        /// The static bcd (x86_64-unknown-linux-musl).
        #[arg(long)]
        bcd: PathBuf,
        /// A static busybox (Debian: busybox-static).
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
        /// A kernel module to load at boot (its dependencies come along);
        /// repeatable, in load order.
        #[arg(long = "module")]
        modules: Vec<String>,
        /// A dynamic program to carry with its libraries (e.g.
        /// /usr/sbin/kexec for boot.kexec); repeatable.
        #[arg(long = "program")]
        programs: Vec<PathBuf>,
        /// An extra file, SRC:DEST with DEST absolute in the image;
        /// repeatable.
        #[arg(long = "file", value_parser = parse_file)]
        files: Vec<(PathBuf, PathBuf)>,
        /// The kernel command line (console=..., bcd.server=...).
        #[arg(long, default_value = "console=ttyS0")]
        cmdline: String,
        #[arg(long, default_value = "bcd-node")]
        name: String,
        /// The image key (from images keygen).
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// gzip (the default: builds in a second), zstd (about a fifth
        /// smaller, several seconds at level 19) or none.
        #[arg(long, default_value = "gzip", value_parser = parse_compression)]
        compression: initramfs::Compression,
        #[arg(long)]
        json: bool,
    },
    /// Upload a built image (the folder images build wrote) to the server.
    Register {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Registered images and what boots them.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Choose the image a MAC address boots, or the fleet's default.
    Assign {
        /// An image id (or 6+ hex digits of one) or name.
        image: String,
        #[arg(long, conflicts_with = "default", required_unless_present = "default")]
        mac: Option<String>,
        #[arg(long)]
        default: bool,
        /// Appended to the image's kernel command line for this target
        /// (bcd.token=..., bcd.state=LABEL).
        #[arg(long, default_value = "")]
        append: String,
    },
    /// Remove an assignment.
    Unassign {
        #[arg(long, conflicts_with = "default", required_unless_present = "default")]
        mac: Option<String>,
        #[arg(long)]
        default: bool,
    },
    /// Recorded boots (requests for a boot script), newest first.
    Boots {
        #[arg(long)]
        mac: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
}

fn parse_file(s: &str) -> Result<(PathBuf, PathBuf), String> {
    let (src, dest) = s
        .split_once(':')
        .ok_or_else(|| format!("--file takes SRC:DEST, not {s:?}"))?;
    if !dest.starts_with('/') {
        return Err(format!(
            "--file {s}: DEST must be an absolute path in the image"
        ));
    }
    Ok((src.into(), dest.into()))
}

fn parse_compression(s: &str) -> Result<initramfs::Compression, String> {
    match s {
        "zstd" => Ok(initramfs::Compression::Zstd),
        "gzip" => Ok(initramfs::Compression::Gzip),
        "none" => Ok(initramfs::Compression::None),
        _ => Err(format!("--compression takes zstd, gzip or none, not {s:?}")),
    }
}

fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// A progress bar on stderr for a terminal, one line a step otherwise.
#[derive(Debug)]
struct Bar {
    tty: bool,
    started: Instant,
}

impl image::build::Progress for Bar {
    fn step(&mut self, index: usize, what: &str) {
        let total = image::build::STEPS;
        if self.tty {
            let width = 24;
            let filled = index * width / total;
            eprint!(
                "\r\x1b[2K[{}{}] {}/{} {what}",
                "#".repeat(filled),
                "-".repeat(width - filled),
                index + 1,
                total
            );
        } else {
            eprintln!(
                "[{}/{}] {what} ({:.1}s)",
                index + 1,
                total,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(16)]
}

fn fmt_size(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
}

fn image_json(i: &ImageInfo) -> serde_json::Value {
    serde_json::json!({
        "image_id": i.image_id, "name": i.name, "kernel_version": i.kernel_version,
        "bcd_version": i.bcd_version, "cmdline": i.cmdline,
        "kernel": {"size": i.kernel_size, "sha256": i.kernel_sha256},
        "initrd": {"size": i.initrd_size, "sha256": i.initrd_sha256},
        "key_id": i.key_id, "registered_at_ms": i.registered_at_ms,
        "assigned_to": i.assigned_to,
    })
}

fn target_of(mac: Option<String>, default: bool) -> anyhow::Result<String> {
    match (mac, default) {
        (_, true) => Ok("default".into()),
        (Some(m), false) => Ok(format!(
            "mac:{}",
            crate::boot::parse_mac(&m)
                .ok_or_else(|| anyhow::anyhow!("{m:?} is not a MAC address (52:54:00:12:34:56)"))?
        )),
        (None, false) => anyhow::bail!("give --mac MAC or --default"),
    }
}

/// Runs `better-compute images ...`.
pub async fn run(cmd: ImagesCommand, operator: &Path, server: Option<&str>) -> anyhow::Result<()> {
    match cmd {
        ImagesCommand::Keygen { out } => {
            let out = std::path::absolute(&out)
                .with_context(|| format!("cannot use {}", out.display()))?;
            let pkcs8 =
                ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
                    .map_err(|_| anyhow::anyhow!("cannot generate a key"))?;
            let key = image::read_key(pkcs8.as_ref())?;
            use ring::signature::KeyPair;
            let public = hex::encode(key.public_key().as_ref());
            crate::files::write_atomic(&out, pkcs8.as_ref(), 0o600)?;
            let mut pub_path = out.clone().into_os_string();
            pub_path.push(".pub");
            crate::files::write_atomic(
                Path::new(&pub_path),
                format!("{public}\n").as_bytes(),
                0o644,
            )?;
            emit(&format!("{public}\n"))
        }
        ImagesCommand::Build {
            kernel,
            modules_root,
            bcd,
            busybox,
            modules,
            programs,
            files,
            cmdline,
            name,
            key,
            out,
            compression,
            json,
        } => {
            let key_bytes = std::fs::read(&key)
                .with_context(|| format!("cannot read the image key {}", key.display()))?;
            let key = image::read_key(&key_bytes).with_context(|| key.display().to_string())?;
            let spec = image::build::Spec {
                name,
                kernel,
                modules_root,
                bcd,
                busybox,
                programs,
                modules,
                files,
                cmdline,
                compression,
            };
            let started = Instant::now();
            let mut bar = Bar {
                tty: std::io::stderr().is_terminal(),
                started,
            };
            let built = image::build::build(&spec, &key, &mut bar)?;
            built.write(&out)?;
            let seconds = started.elapsed().as_secs_f64();
            if bar.tty {
                eprintln!("\r\x1b[2K[{}] done in {seconds:.1}s", "#".repeat(24));
            }
            let m = &built.manifest;
            if json {
                emit(&format!(
                    "{}\n",
                    serde_json::json!({
                        "image_id": built.id.0, "name": m.name, "out": out,
                        "kernel_version": m.kernel_version, "bcd_version": m.bcd_version,
                        "cmdline": m.cmdline, "modules": m.modules,
                        "kernel": {"size": m.kernel.size, "sha256": m.kernel.sha256},
                        "initrd": {"size": m.initrd.size, "sha256": m.initrd.sha256,
                                   "unpacked": built.initrd_unpacked, "entries": built.entries},
                        "seconds": seconds,
                    })
                ))
            } else {
                emit(&format!(
                    "image {} ({})\n  kernel {} ({}), initrd {} ({} unpacked, {} entries)\n  {}\n  \
                     written to {}\n",
                    built.id,
                    m.name,
                    m.kernel_version,
                    fmt_size(m.kernel.size),
                    fmt_size(m.initrd.size),
                    fmt_size(built.initrd_unpacked),
                    built.entries,
                    m.bcd_version,
                    out.display()
                ))
            }
        }
        ImagesCommand::Register { dir, json } => {
            let image::build::Files {
                manifest: signed_manifest,
                kernel,
                initrd,
            } = image::build::load(&dir)?;
            let mut c = client::connect(operator, server).await?;
            let i = c
                .register_image(RegisterImageRequest {
                    signed_manifest,
                    kernel,
                    initrd,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            if json {
                emit(&format!("{}\n", image_json(&i)))
            } else {
                emit(&format!("registered image {} ({})\n", i.image_id, i.name))
            }
        }
        ImagesCommand::List { json } => {
            let mut c = client::connect(operator, server).await?;
            let r = c
                .list_images(ListImagesRequest {})
                .await
                .map_err(client::status)?
                .into_inner();
            if json {
                let v: Vec<_> = r.images.iter().map(image_json).collect();
                return emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
            }
            let mut text = format!(
                "{:<17} {:<16} {:<24} {:>9} {:>9} ASSIGNED\n",
                "IMAGE", "NAME", "KERNEL", "KERNEL", "INITRD"
            );
            for i in &r.images {
                text.push_str(&format!(
                    "{:<17} {:<16} {:<24} {:>9} {:>9} {}\n",
                    short(&i.image_id),
                    i.name,
                    i.kernel_version,
                    fmt_size(i.kernel_size),
                    fmt_size(i.initrd_size),
                    if i.assigned_to.is_empty() {
                        "-".to_string()
                    } else {
                        i.assigned_to.join(",")
                    }
                ));
            }
            if r.images.is_empty() {
                text.push_str("(no images: images build, then images register)\n");
            }
            emit(&text)
        }
        ImagesCommand::Assign {
            image,
            mac,
            default,
            append,
        } => {
            let target = target_of(mac, default)?;
            let mut c = client::connect(operator, server).await?;
            let r = c
                .assign_image(AssignImageRequest {
                    image,
                    target,
                    append,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            emit(&format!("{} boots image {}\n", r.target, r.image_id))
        }
        ImagesCommand::Unassign { mac, default } => {
            let target = target_of(mac, default)?;
            let mut c = client::connect(operator, server).await?;
            let r = c
                .assign_image(AssignImageRequest {
                    image: String::new(),
                    target,
                    append: String::new(),
                })
                .await
                .map_err(client::status)?
                .into_inner();
            emit(&format!("{} has no image assigned\n", r.target))
        }
        ImagesCommand::Boots { mac, limit, json } => {
            let mut c = client::connect(operator, server).await?;
            let r = c
                .list_boots(ListBootsRequest {
                    mac: mac.unwrap_or_default(),
                    limit,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            if json {
                let v: Vec<_> = r
                    .boots
                    .iter()
                    .map(|b| {
                        serde_json::json!({"mac": b.mac, "image_id": b.image_id, "at_ms": b.at_ms,
                                           "remote": b.remote, "outcome": b.outcome})
                    })
                    .collect();
                return emit(&format!("{}\n", serde_json::to_string_pretty(&v)?));
            }
            let mut text = format!(
                "{:<20} {:<17} {:<22} {:<21} OUTCOME\n",
                "TIME", "MAC", "FROM", "IMAGE"
            );
            for b in &r.boots {
                text.push_str(&format!(
                    "{:<20} {:<17} {:<22} {:<21} {}\n",
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH
                            + std::time::Duration::from_millis(b.at_ms.max(0) as u64)
                    ),
                    b.mac,
                    b.remote,
                    if b.image_id.is_empty() {
                        "-"
                    } else {
                        short(&b.image_id)
                    },
                    b.outcome
                ));
            }
            emit(&text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("store.db")).unwrap();
        (d, s)
    }

    fn manifest(name: &str, kernel: &[u8], initrd: &[u8]) -> image::Manifest {
        image::Manifest {
            format: image::FORMAT,
            name: name.into(),
            kernel_version: "6.1.0-test".into(),
            bcd_version: "bcd 0.1.0".into(),
            cmdline: "console=ttyS0".into(),
            kernel: image::Part::of(image::KERNEL_FILE, kernel),
            initrd: image::Part::of(image::INITRD_FILE, initrd),
            modules: vec![],
        }
    }

    #[test]
    fn targets() {
        assert_eq!(parse_target("default").as_deref(), Some("default"));
        assert_eq!(
            parse_target("mac:52-54-00-12-34-AB").as_deref(),
            Some("mac:52:54:00:12:34:ab")
        );
        assert_eq!(parse_target("52:54:00:12:34:ab"), None);
        assert_eq!(parse_target("node:x"), None);
    }

    #[test]
    fn assignments_prefer_the_mac_over_the_default_and_boots_are_kept() {
        let (_d, s) = store();
        let a = manifest("a", b"kernel", b"initrd-a");
        let b = manifest("b", b"kernel", b"initrd-b");
        assert!(
            s.register_image(&"a".repeat(64), "k", &a, b"{a}", b"kernel", b"initrd-a")
                .unwrap()
        );
        assert!(
            !s.register_image(&"a".repeat(64), "k", &a, b"{a}", b"kernel", b"initrd-a")
                .unwrap()
        );
        assert!(
            s.register_image(&"b".repeat(64), "k", &b, b"{b}", b"kernel", b"initrd-b")
                .unwrap()
        );
        assert_eq!(
            s.image_artifact(&a.kernel.sha256).unwrap().unwrap(),
            b"kernel"
        );
        assert_eq!(s.image_artifact(&"0".repeat(64)).unwrap(), None);

        let mac = "52:54:00:12:34:56";
        assert!(s.image_for_mac(mac).unwrap().is_none());
        s.assign_image("default", Some(&"a".repeat(64)), "")
            .unwrap();
        assert_eq!(
            s.image_for_mac(mac).unwrap().unwrap().image_id,
            "a".repeat(64)
        );
        s.assign_image(&format!("mac:{mac}"), Some(&"b".repeat(64)), "bcd.state=x")
            .unwrap();
        let got = s.image_for_mac(mac).unwrap().unwrap();
        assert_eq!(
            (got.image_id, got.append),
            ("b".repeat(64), "bcd.state=x".to_string())
        );
        assert_eq!(
            s.image_for_mac("52:54:00:00:00:01")
                .unwrap()
                .unwrap()
                .image_id,
            "a".repeat(64)
        );
        s.assign_image(&format!("mac:{mac}"), None, "").unwrap();
        assert_eq!(
            s.image_for_mac(mac).unwrap().unwrap().image_id,
            "a".repeat(64)
        );

        let listed = s.list_images().unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].assigned_to, vec!["default".to_string()]);

        assert_eq!(s.resolve_image("b").unwrap(), Ok("b".repeat(64)));
        assert_eq!(s.resolve_image("bbbbbbbb").unwrap(), Ok("b".repeat(64)));
        assert!(s.resolve_image("cccccccc").unwrap().is_err());

        s.record_boot(mac, Some(&"a".repeat(64)), "127.0.0.1:1", "script")
            .unwrap();
        s.record_boot(mac, None, "127.0.0.1:2", "no image").unwrap();
        let boots = s.boots(Some(mac), 10).unwrap();
        assert_eq!(boots.len(), 2);
        assert_eq!(boots[0].outcome, "no image");
        assert!(s.boots(Some("52:54:00:00:00:09"), 10).unwrap().is_empty());
    }
}
