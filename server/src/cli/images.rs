//! `better-compute images`: keygen, build (offline), register, list,
//! assign, unassign, boots, and the boot allow-list (allow-mac,
//! disallow-mac, allowed-macs).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use bcd_proto::v1::{
    AssignImageRequest, BootOutcome, DefaultTarget, ImageInfo, ImageTarget, ListBootMacsRequest,
    ListBootsRequest, ListImagesRequest, RegisterImageRequest, SetBootMacRequest, image_target,
};
use clap::Subcommand;
use serde::Serialize;

use super::Target;
use super::output::{self, out};
use crate::client::status;

/// `better-compute images ...`.
// Parsed once per process: a boxed Build variant would save nothing worth
// the indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum ImagesCommand {
    /// Make an ed25519 image key (offline); prints the public half for
    /// serve --image-pubkey.
    #[command(after_help = "Examples:\n  better-compute images keygen --out image.key")]
    Keygen {
        /// Where to write the image private key (its public half goes beside it, .pub).
        #[arg(long)]
        out: PathBuf,
    },
    /// Build a netboot image: kernel, initrd with bcd as init, signed
    /// manifest and iPXE script, into --out.
    #[command(
        after_help = "Examples:\n  better-compute images build --kernel kernel.deb --bcd bcd --key image.key --out img/\n  better-compute images build --kernel vmlinuz --modules-root /srv/rootfs --bcd bcd \\\n      --module virtio_net --carry ixgbe --program /usr/sbin/kexec --key image.key --out img/\n  better-compute images build --kernel kernel.deb --bcd bcd --key image.key --out img/ \\\n      --cmdline 'console=ttyS0 bcd.server=https://10.0.0.5:7443' --compression zstd"
    )]
    Build {
        /// A kernel: a Debian package (.deb), its unpacked folder, or a
        /// vmlinuz file (modules then under --modules-root).
        #[arg(long)]
        kernel: PathBuf,
        /// The root the kernel's modules are under (`lib/modules/VERSION`
        /// below it); `/` by default.
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
        /// A driver to carry without loading it at boot: bcd init loads it
        /// when a device's modalias asks for it (e.g. NIC drivers, so one
        /// image boots machines with different NICs); repeatable.
        #[arg(long = "carry")]
        carry: Vec<String>,
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
        /// Build for machines with a TPM enrolled by their EK (better-compute
        /// machines enroll): adds bcd.attestor=tpm and bcd.ca_pin=PIN (the
        /// pin machines enroll prints) to the command line. No token goes
        /// in it: what the boot network sees is the server and the pin.
        #[arg(long, value_name = "PIN")]
        tpm_ca_pin: Option<String>,
        /// The image's name, as images list and assignments show it.
        #[arg(long, default_value = "bcd-node")]
        name: String,
        /// The image key (from images keygen).
        #[arg(long)]
        key: PathBuf,
        /// The folder to write the image to (kernel, initrd, signed manifest).
        #[arg(long)]
        out: PathBuf,
        /// gzip (the default: builds in a second), zstd (about a fifth
        /// smaller, several seconds at level 19) or none.
        #[arg(long, value_enum, default_value = "gzip")]
        compression: initramfs::Compression,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Upload a built image (the folder images build wrote) to the server.
    #[command(
        after_help = "Examples:\n  better-compute images register img/\n  better-compute images register img/ --json"
    )]
    Register {
        /// The folder images build wrote.
        dir: PathBuf,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Registered images and what boots them.
    #[command(
        after_help = "Examples:\n  better-compute images list\n  better-compute images list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Choose the image a MAC address, a node, a pool's nodes or the fleet
    /// by default boots. A booting MAC takes its own assignment, else its
    /// node's, else its node's pool's, else the default.
    #[command(
        after_help = "Examples:\n  better-compute images assign gpu-node --default --join-token-ttl 15m\n  better-compute images assign gpu-node --pool gpu --append bcd.state=bcd-state\n  better-compute images assign 3f2a19c0d1e4 --mac 52:54:00:12:34:56"
    )]
    Assign {
        /// An image id (or 6+ hex digits of one) or name.
        image: String,
        #[command(flatten)]
        target: TargetArgs,
        /// Appended to the image's kernel command line for this target
        /// (bcd.state=LABEL). A literal bcd.token= here is readable by
        /// anyone on the boot network: prefer --join-token-ttl.
        #[arg(long, default_value = "")]
        append: String,
        /// For machines without a TPM: the boot endpoint mints a one-use
        /// join token living this long (e.g. 15m; 1s to 24h) for each
        /// script it serves to a MAC on the allow-list (images allow-mac),
        /// into the pool assigned to (or the allow-list's), and refuses
        /// other MAC addresses.
        #[arg(long, value_parser = super::dur)]
        join_token_ttl: Option<std::time::Duration>,
    },
    /// Remove an assignment.
    #[command(
        after_help = "Examples:\n  better-compute images unassign --pool gpu\n  better-compute images unassign --node nd-0f3a9c1b2c3d\n  better-compute images unassign --default"
    )]
    Unassign {
        #[command(flatten)]
        target: TargetArgs,
    },
    /// Allow a MAC address to get minted join tokens from the boot
    /// endpoint (assignments with --join-token-ttl).
    #[command(
        after_help = "Examples:\n  better-compute images allow-mac 52:54:00:12:34:56\n  better-compute images allow-mac 52:54:00:12:34:56 --pool gpu"
    )]
    AllowMac {
        /// The MAC address (52:54:00:12:34:56).
        mac: String,
        /// The pool its node joins (default: the pool assigned to).
        #[arg(long)]
        pool: Option<String>,
    },
    /// Take a MAC address off the allow-list; its unspent minted token is
    /// deleted.
    #[command(after_help = "Examples:\n  better-compute images disallow-mac 52:54:00:12:34:56")]
    DisallowMac {
        /// The MAC address.
        mac: String,
    },
    /// The MAC addresses allowed minted join tokens.
    #[command(
        after_help = "Examples:\n  better-compute images allowed-macs\n  better-compute images allowed-macs --json"
    )]
    AllowedMacs {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Recorded boots (requests for a boot script), newest first.
    #[command(
        after_help = "Examples:\n  better-compute images boots\n  better-compute images boots --mac 52:54:00:12:34:56 --limit 10"
    )]
    Boots {
        /// Only this MAC address's boots.
        #[arg(long)]
        mac: Option<String>,
        /// At most this many, the newest.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
}

/// The bytes of one upload message.
const UPLOAD_CHUNK: usize = 1 << 20;

/// Uploads an image in chunks behind a progress bar of the bytes sent; a
/// server from before `UploadImage` takes it whole.
async fn upload(
    c: &mut crate::client::Admin,
    signed_manifest: Vec<u8>,
    kernel: Vec<u8>,
    initrd: Vec<u8>,
    json: bool,
) -> anyhow::Result<ImageInfo> {
    use bcd_proto::v1::{ImageUpload, image_upload::Part};
    use std::sync::Arc;
    use tokio_stream::StreamExt;
    let bar = output::progress(
        crate::cli::output::json_wanted(json),
        "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec}  {msg}",
    );
    bar.set_length((kernel.len() + initrd.len()) as u64);
    bar.set_message("uploading");
    // Each chunk is copied as the stream sends it, not all at once.
    let (kernel, initrd) = (Arc::new(kernel), Arc::new(initrd));
    let chunks = |bytes: &Arc<Vec<u8>>, part: fn(Vec<u8>) -> Part| {
        let bytes = bytes.clone();
        (0..bytes.len().div_ceil(UPLOAD_CHUNK)).map(move |i| {
            let end = ((i + 1) * UPLOAD_CHUNK).min(bytes.len());
            part(bytes[i * UPLOAD_CHUNK..end].to_vec())
        })
    };
    let parts = std::iter::once(Part::SignedManifest(signed_manifest.clone()))
        .chain(chunks(&kernel, Part::Kernel))
        .chain(chunks(&initrd, Part::Initrd));
    let counted = bar.clone();
    let stream = tokio_stream::iter(parts).map(move |part| {
        if let Part::Kernel(b) | Part::Initrd(b) = &part {
            counted.inc(b.len() as u64);
        }
        ImageUpload { part: Some(part) }
    });
    let sent = c.upload_image(stream).await;
    bar.finish_and_clear();
    match sent {
        Ok(i) => Ok(i.into_inner()),
        Err(e) if e.code() == tonic::Code::Unimplemented => Ok(c
            .register_image(RegisterImageRequest {
                signed_manifest,
                kernel: Arc::unwrap_or_clone(kernel),
                initrd: Arc::unwrap_or_clone(initrd),
            })
            .await
            .map_err(status)?
            .into_inner()),
        Err(e) => Err(status(e)),
    }
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

/// The command line of an image for TPM machines: `bcd.attestor=tpm` and
/// the CA pin added, and no token.
fn tpm_cmdline(cmdline: &str, pin: &str) -> anyhow::Result<String> {
    let pin = pin.trim().to_ascii_lowercase();
    if pin.len() != 64 || !pin.bytes().all(|b| b.is_ascii_hexdigit()) {
        anyhow::bail!(
            "--tpm-ca-pin takes the fleet CA's pin, 64 hex digits, as better-compute machines \
             enroll prints it"
        );
    }
    let words = cmdline_names(cmdline);
    if words.iter().any(|w| w == "bcd.token") {
        anyhow::bail!(
            "an image for TPM machines carries no token: drop bcd.token= from --cmdline (enrol \
             the machines with better-compute machines enroll)"
        );
    }
    if words
        .iter()
        .any(|w| w == "bcd.attestor" || w == "bcd.ca_pin")
    {
        anyhow::bail!("--tpm-ca-pin sets bcd.attestor= and bcd.ca_pin=: drop them from --cmdline");
    }
    Ok(format!(
        "{} bcd.attestor=tpm bcd.ca_pin={pin}",
        cmdline.trim()
    ))
}

/// The parameter names of a kernel command line (the part before `=`).
fn cmdline_names(cmdline: &str) -> Vec<String> {
    cmdline
        .split_whitespace()
        .map(|w| {
            w.trim_matches('"')
                .split('=')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
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

/// Who an assignment is for: exactly one of these.
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// One MAC address.
    #[arg(long)]
    mac: Option<String>,
    /// One node (by the MAC addresses it reported when it joined).
    #[arg(long)]
    node: Option<String>,
    /// The nodes of a pool (tokens create --pool).
    #[arg(long)]
    pool: Option<String>,
    /// Every machine with no other assignment.
    #[arg(long)]
    default: bool,
}

fn target_of(t: TargetArgs) -> anyhow::Result<ImageTarget> {
    let target = match t {
        TargetArgs { default: true, .. } => image_target::Target::Default(DefaultTarget {}),
        TargetArgs { mac: Some(m), .. } => image_target::Target::Mac(
            crate::boot::parse::parse_mac(&m)
                .ok_or_else(|| anyhow::anyhow!("{m:?} is not a MAC address (52:54:00:12:34:56)"))?,
        ),
        TargetArgs { node: Some(n), .. } => image_target::Target::Node(n),
        TargetArgs { pool: Some(p), .. } => image_target::Target::Pool(p),
        _ => anyhow::bail!("give --mac MAC, --node NODE_ID, --pool NAME or --default"),
    };
    Ok(ImageTarget {
        target: Some(target),
    })
}

/// What `images assign` warns of an assignment: a literal token in its
/// command line.
fn literal_token_warning(append: &str, minted: bool) -> Option<&'static str> {
    (!minted && crate::api::images::carries_token(append)).then_some(
        "warning: the bcd.token= in --append is served in clear to anyone on the boot network \
         who asks for this target's script, and works for them until the token runs out; for \
         machines without a TPM, assign with --join-token-ttl 15m and allow their MAC addresses \
         (images allow-mac) instead",
    )
}

/// A target as the operator spells it.
fn shown(t: &Option<ImageTarget>) -> String {
    t.as_ref()
        .map_or("-".to_string(), bcd_proto::typed::image_target)
}

/// What `images build --json` prints.
#[derive(Debug, Serialize)]
struct Built<'a> {
    image_id: &'a str,
    name: &'a str,
    out: &'a std::path::Path,
    kernel_version: &'a str,
    bcd_version: &'a str,
    cmdline: &'a str,
    modules: &'a [String],
    kernel: Part<'a>,
    initrd: Initrd<'a>,
    seconds: f64,
}

#[derive(Debug, Serialize)]
struct Part<'a> {
    size: u64,
    sha256: &'a str,
}

#[derive(Debug, Serialize)]
struct Initrd<'a> {
    size: u64,
    sha256: &'a str,
    unpacked: u64,
    entries: usize,
}

pub async fn run(cmd: ImagesCommand, target: &Target) -> anyhow::Result<()> {
    match cmd {
        ImagesCommand::Keygen { out } => {
            let out = std::path::absolute(&out)
                .with_context(|| format!("cannot use {}", out.display()))?;
            let public = super::releases::keygen(&out)?;
            out!("{public}");
            Ok(())
        }
        ImagesCommand::Build {
            kernel,
            modules_root,
            bcd,
            busybox,
            modules,
            carry,
            programs,
            files,
            cmdline,
            tpm_ca_pin,
            name,
            key,
            out,
            compression,
            json,
        } => {
            let cmdline = match &tpm_ca_pin {
                Some(pin) => tpm_cmdline(&cmdline, pin)?,
                None => cmdline,
            };
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
                carry,
                files,
                cmdline,
                compression,
            };
            let started = crate::clock::mono();
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
            if crate::cli::output::json_wanted(json) {
                return output::json_line(&Built {
                    image_id: &built.id.0,
                    name: &m.name,
                    out: &out,
                    kernel_version: &m.kernel_version,
                    bcd_version: &m.bcd_version,
                    cmdline: &m.cmdline,
                    modules: &m.modules,
                    kernel: Part {
                        size: m.kernel.size,
                        sha256: &m.kernel.sha256,
                    },
                    initrd: Initrd {
                        size: m.initrd.size,
                        sha256: &m.initrd.sha256,
                        unpacked: built.initrd_unpacked,
                        entries: built.entries,
                    },
                    seconds,
                });
            }
            out!(
                "image {} ({})\n  kernel {} ({}), initrd {} ({} unpacked, {} entries)\n  {}\n  \
                 written to {}",
                built.id,
                m.name,
                m.kernel_version,
                output::mib(m.kernel.size),
                output::mib(m.initrd.size),
                output::mib(built.initrd_unpacked),
                built.entries,
                m.bcd_version,
                out.display()
            );
            Ok(())
        }
        ImagesCommand::Register { dir, json } => {
            let image::build::Files {
                manifest: signed_manifest,
                kernel,
                initrd,
            } = image::build::load(&dir)?;
            let mut c = target.connect().await?;
            let i = upload(&mut c, signed_manifest, kernel, initrd, json).await?;
            if crate::cli::output::json_wanted(json) {
                return output::json_line(&i);
            }
            out!("registered image {} ({})", i.image_id, i.name);
            Ok(())
        }
        ImagesCommand::List { json } => {
            let mut c = target.connect().await?;
            let r = c
                .list_images(ListImagesRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.images);
            }
            out!(
                "{:<17} {:<16} {:<24} {:>9} {:>9} ASSIGNED",
                "IMAGE",
                "NAME",
                "KERNEL",
                "KERNEL",
                "INITRD"
            );
            for i in &r.images {
                out!(
                    "{:<17} {:<16} {:<24} {:>9} {:>9} {}",
                    output::short(&i.image_id),
                    i.name,
                    i.kernel_version,
                    output::mib(i.kernel_size),
                    output::mib(i.initrd_size),
                    if i.assigned_to.is_empty() {
                        "-".to_string()
                    } else {
                        i.assigned_to
                            .iter()
                            .map(bcd_proto::typed::image_target)
                            .collect::<Vec<_>>()
                            .join(",")
                    }
                );
            }
            if r.images.is_empty() {
                out!("(no images: images build, then images register)");
            }
            Ok(())
        }
        ImagesCommand::Assign {
            image,
            target: who,
            append,
            join_token_ttl,
        } => {
            let target_name = target_of(who)?;
            let mut c = target.connect().await?;
            let r = c
                .assign_image(AssignImageRequest {
                    image,
                    target: Some(target_name),
                    append,
                    join_token_ttl_ms: join_token_ttl.map_or(0, |d| d.as_millis() as u64),
                })
                .await
                .map_err(status)?
                .into_inner();
            out!(
                "{} boots image {}{}",
                shown(&r.target),
                r.image_id,
                if r.join_token_ttl_ms > 0 {
                    format!(
                        " with a one-use join token minted per boot, living {}, for allowed MAC \
                         addresses",
                        humantime::format_duration(std::time::Duration::from_millis(
                            r.join_token_ttl_ms
                        ))
                    )
                } else {
                    String::new()
                }
            );
            if let Some(w) = literal_token_warning(&r.append, r.join_token_ttl_ms > 0) {
                eprintln!("{w}");
            }
            Ok(())
        }
        ImagesCommand::Unassign { target: who } => {
            let target_name = target_of(who)?;
            let mut c = target.connect().await?;
            let r = c
                .assign_image(AssignImageRequest {
                    image: String::new(),
                    target: Some(target_name),
                    append: String::new(),
                    join_token_ttl_ms: 0,
                })
                .await
                .map_err(status)?
                .into_inner();
            out!("{} has no image assigned", shown(&r.target));
            Ok(())
        }
        ImagesCommand::AllowMac { mac, pool } => {
            let mut c = target.connect().await?;
            c.set_boot_mac(SetBootMacRequest {
                mac: mac.clone(),
                allowed: true,
                pool: pool.clone().unwrap_or_default(),
            })
            .await
            .map_err(status)?;
            out!(
                "{mac} may get minted join tokens{}",
                output::around(" into pool ", &pool.unwrap_or_default(), "")
            );
            Ok(())
        }
        ImagesCommand::DisallowMac { mac } => {
            let mut c = target.connect().await?;
            c.set_boot_mac(SetBootMacRequest {
                mac: mac.clone(),
                allowed: false,
                pool: String::new(),
            })
            .await
            .map_err(status)?;
            out!("{mac} gets no minted join token any more");
            Ok(())
        }
        ImagesCommand::AllowedMacs { json } => {
            let mut c = target.connect().await?;
            let r = c
                .list_boot_macs(ListBootMacsRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.macs);
            }
            out!("{:<17} {:<16} ADDED", "MAC", "POOL");
            for m in &r.macs {
                out!(
                    "{:<17} {:<16} {}",
                    m.mac,
                    if m.pool.is_empty() { "-" } else { &m.pool },
                    output::time(m.added_at_ms)
                );
            }
            if r.macs.is_empty() {
                out!("(no MAC address allowed: images allow-mac MAC)");
            }
            Ok(())
        }
        ImagesCommand::Boots { mac, limit, json } => {
            let mut c = target.connect().await?;
            let r = c
                .list_boots(ListBootsRequest {
                    mac: mac.unwrap_or_default(),
                    limit,
                })
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.boots);
            }
            out!(
                "{:<20} {:<17} {:<22} {:<21} OUTCOME",
                "TIME",
                "MAC",
                "FROM",
                "IMAGE"
            );
            for b in &r.boots {
                out!(
                    "{:<20} {:<17} {:<22} {:<21} {}",
                    output::time(b.at_ms),
                    b.mac,
                    b.remote,
                    if b.image_id.is_empty() {
                        "-"
                    } else {
                        output::short(&b.image_id)
                    },
                    output::spelled::<BootOutcome>(b.outcome)
                        + &output::around(": ", &b.detail, "")
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_for_tpm_machines_has_the_pin_and_no_token() {
        let pin = "AB".repeat(32);
        let line = tpm_cmdline("console=ttyS0 bcd.server=https://s:1 ", &pin).unwrap();
        assert_eq!(
            line,
            format!(
                "console=ttyS0 bcd.server=https://s:1 bcd.attestor=tpm bcd.ca_pin={}",
                pin.to_lowercase()
            )
        );
        let e = tpm_cmdline("console=ttyS0 bcd.token=bct1.a.b.c", &pin).unwrap_err();
        assert!(e.to_string().contains("carries no token"), "{e}");
        let e = tpm_cmdline("\"bcd.token=x y\"", &pin).unwrap_err();
        assert!(e.to_string().contains("carries no token"), "{e}");
        let e = tpm_cmdline("bcd.attestor=token", &pin).unwrap_err();
        assert!(e.to_string().contains("drop them"), "{e}");
        let e = tpm_cmdline("console=ttyS0", "abc").unwrap_err();
        assert!(e.to_string().contains("64 hex digits"), "{e}");
    }

    #[test]
    fn a_literal_token_is_warned_of_and_a_minted_one_is_not() {
        let w = literal_token_warning("bcd.state=x bcd.token=bct1.a.b.c", false).unwrap();
        assert!(
            w.contains("anyone on the boot network") && w.contains("--join-token-ttl"),
            "{w}"
        );
        assert_eq!(literal_token_warning("bcd.state=x", false), None);
        assert_eq!(literal_token_warning("", true), None);
    }
}
