//! `better-compute doctor`.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::doctor::Options;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute doctor\n  better-compute --data-dir /var/lib/better-compute doctor --json\n  better-compute doctor --release-pubkey $(cat release.key.pub) --store-timeout 15s"
)]
pub struct DoctorArgs {
    /// The report as JSON (for scripts).
    #[arg(long)]
    json: bool,
    /// A release public key to check releases with (hex); repeatable.
    /// Besides these, the keys serve recorded in keys.json.
    #[arg(long = "release-pubkey")]
    release_pubkeys: Vec<String>,
    /// An image public key to check images with (hex); repeatable.
    #[arg(long = "image-pubkey")]
    image_pubkeys: Vec<String>,
    /// How long each store call may take.
    #[arg(long, default_value = "5s", value_parser = super::dur)]
    store_timeout: Duration,
}

fn keys(flag: &str, hex_keys: &[String]) -> anyhow::Result<Vec<Vec<u8>>> {
    hex_keys
        .iter()
        .map(|k| {
            hex::decode(k.trim())
                .ok()
                .filter(|b| b.len() == 32)
                .ok_or_else(|| anyhow::anyhow!("{flag} takes 64 hex digits, not {k:?}"))
        })
        .collect()
}

pub async fn run(a: DoctorArgs, data_dir: &Path, store: Option<&str>) -> anyhow::Result<ExitCode> {
    let opts = Options {
        data_dir: data_dir.to_path_buf(),
        store: crate::serve::store_location(data_dir, store),
        release_keys: keys("--release-pubkey", &a.release_pubkeys)?,
        image_keys: keys("--image-pubkey", &a.image_pubkeys)?,
        store_timeout: a.store_timeout,
        now_ms: crate::clock::unix_ms(),
    };
    let report = crate::doctor::run(&opts).await;
    if crate::cli::output::json_wanted(a.json) {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    Ok(ExitCode::from(report.exit_code()))
}
