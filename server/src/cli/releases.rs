//! `better-compute releases`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use bcd_proto::v1::{ListReleasesRequest, RegisterReleaseRequest};
use clap::Subcommand;

use super::Target;
use super::output::{self, out};
use crate::client::status;

#[derive(Debug, Subcommand)]
pub enum ReleasesCommand {
    /// Make a release key pair: KEY (pkcs8, mode 0600) and KEY.pub (hex).
    #[command(after_help = "Examples:\n  better-compute releases keygen --out release.key")]
    Keygen {
        /// Where to write the private key (its public half goes beside it, .pub).
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a bcd binary's manifest, offline, with a release key file.
    #[command(
        after_help = "Examples:\n  better-compute releases sign --key release.key --binary bcd --version 0.2.0 \\\n      --sequence 2 --out bcd-0.2.0.json\n  better-compute releases sign --key release.key --next-key release-2.key.pub --binary bcd \\\n      --version 0.3.0 --sequence 3 --out bcd-0.3.0.json"
    )]
    Sign {
        /// The release private key (from releases keygen).
        #[arg(long)]
        key: PathBuf,
        /// The bcd binary to release.
        #[arg(long)]
        binary: PathBuf,
        #[arg(long)]
        version: String,
        /// Must be above every sequence registered before.
        #[arg(long)]
        sequence: u64,
        /// The target triple the binary runs on (x86_64-unknown-linux-musl).
        #[arg(long, default_value = "x86_64-unknown-linux-musl")]
        target: String,
        /// Rotate the release key: nodes that confirm this release trust
        /// the public key in this file (KEY.pub from releases keygen) from
        /// then on, instead of --key's.
        #[arg(long)]
        next_key: Option<PathBuf>,
        /// Where to write the signed manifest.
        #[arg(long)]
        out: PathBuf,
    },
    /// Upload a signed manifest and its binary to the server.
    #[command(
        after_help = "Examples:\n  better-compute releases register --manifest bcd-0.2.0.json --binary bcd"
    )]
    Register {
        /// The signed manifest (from releases sign).
        #[arg(long)]
        manifest: PathBuf,
        /// The binary it signs: its size and SHA-256 must match.
        #[arg(long)]
        binary: PathBuf,
    },
    /// Registered releases, newest first.
    #[command(
        after_help = "Examples:\n  better-compute releases list\n  better-compute releases list --json"
    )]
    List {
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
}

/// Makes an ed25519 key pair: `out` (pkcs8, 0600) and `out.pub` (hex).
/// Returns the public key in hex.
pub fn keygen(out: &Path) -> anyhow::Result<String> {
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new())
        .map_err(|_| anyhow::anyhow!("cannot generate a key"))?;
    let key = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
        .map_err(|_| anyhow::anyhow!("cannot read the generated key"))?;
    use ring::signature::KeyPair;
    let public = hex::encode(key.public_key().as_ref());
    bcd_sys::fs::atomic_write(out, pkcs8.as_ref(), 0o600)?;
    let mut pub_path = out.to_path_buf().into_os_string();
    pub_path.push(".pub");
    bcd_sys::fs::atomic_write(
        Path::new(&pub_path),
        format!("{public}\n").as_bytes(),
        0o644,
    )?;
    Ok(public)
}

pub async fn run(cmd: ReleasesCommand, target: &Target) -> anyhow::Result<()> {
    match cmd {
        ReleasesCommand::Keygen { out } => {
            let public = keygen(&out)?;
            out!("{public}");
            Ok(())
        }
        ReleasesCommand::Sign {
            key,
            binary,
            version,
            sequence,
            target: triple,
            next_key,
            out,
        } => {
            let next_key = next_key
                .map(|p| -> anyhow::Result<String> {
                    let text = std::fs::read_to_string(&p)
                        .with_context(|| format!("cannot read {}", p.display()))?;
                    release::parse_public_key(&text)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                    Ok(text.trim().to_string())
                })
                .transpose()?;
            let pkcs8 =
                std::fs::read(&key).with_context(|| format!("cannot read {}", key.display()))?;
            let key = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8)
                .map_err(|_| anyhow::anyhow!("{} is not an ed25519 release key", key.display()))?;
            let bin = std::fs::read(&binary)
                .with_context(|| format!("cannot read {}", binary.display()))?;
            let mut manifest = release::manifest_for(&bin, &version, sequence, &triple);
            manifest.next_key = next_key;
            manifest
                .check(&bin)
                .map_err(|e| anyhow::anyhow!("{}: {e}", binary.display()))?;
            let signed = release::sign(&manifest, &key);
            bcd_sys::fs::atomic_write(&out, &signed.to_json(), 0o644)?;
            out!(
                "signed {version} (sequence {sequence}, {} bytes, sha256 {})",
                manifest.size,
                manifest.sha256
            );
            Ok(())
        }
        ReleasesCommand::Register { manifest, binary } => {
            let signed_manifest = std::fs::read(&manifest)
                .with_context(|| format!("cannot read {}", manifest.display()))?;
            let path = binary;
            let binary =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            // The request carries the binary: keep it under the API's
            // message limit (a release is the static bcd, a few MB).
            let limit = crate::api::MAX_REQUEST - (1 << 20);
            anyhow::ensure!(
                binary.len() < limit,
                "{} is {} MiB; a release may be at most {} MiB: register the stripped static build \
                 (cargo build -p bcd --release --target x86_64-unknown-linux-musl)",
                path.display(),
                binary.len() >> 20,
                limit >> 20
            );
            let mut c = target.connect().await?;
            let r = c
                .register_release(RegisterReleaseRequest {
                    signed_manifest,
                    binary,
                })
                .await
                .map_err(status)?
                .into_inner();
            out!("registered {} (sequence {})", r.version, r.sequence);
            Ok(())
        }
        ReleasesCommand::List { json } => {
            let mut c = target.connect().await?;
            let r = c
                .list_releases(ListReleasesRequest {})
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                return output::json(&r.releases);
            }
            out!(
                "{:>8} {:<12} {:<28} {:>10} REGISTERED",
                "SEQUENCE",
                "VERSION",
                "TARGET",
                "SIZE"
            );
            for x in &r.releases {
                out!(
                    "{:>8} {:<12} {:<28} {:>10} {}",
                    x.sequence,
                    x.version,
                    x.target,
                    x.size,
                    output::time(x.registered_at_ms)
                );
            }
            Ok(())
        }
    }
}
