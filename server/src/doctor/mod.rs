//! `better-compute doctor`: what an operator runs on a control-plane host
//! that will not start, a fleet whose nodes cannot connect, a certificate
//! about to run out. Each check says ok, warn or fail with what to do
//! next, in the node doctor's format (`bcd_proto::doctor::Report`: the
//! same text, `--json` and exit codes: 0 all ok, 1 a failure, 2 warnings
//! only).
//!
//! Read-only: certificates and keys are read as files, the store is
//! opened as it is (`Store::open_existing`: nothing created, no migration
//! run, no lease taken), every store call is bounded by
//! [`Options::store_timeout`]. What it prints about the store names it as
//! `bc_store::Location` shows it, never its address, SQL or the driver's
//! words.
//!
//! Time is a parameter ([`Options::now_ms`]); the checks are in
//! [`checks`], one function each.

pub mod checks;

use std::path::PathBuf;
use std::time::Duration;

use bc_store::Location;
pub use bcd_proto::doctor::{Check, Level, Report};

/// The public keys `serve` runs with, recorded in the data directory at
/// each start so that the doctor can check what the store holds.
pub const KEYS_FILE: &str = "keys.json";

/// What the doctor looks at: the same places `serve` uses.
#[derive(Debug, Clone)]
pub struct Options {
    pub data_dir: PathBuf,
    pub store: Location,
    /// Release and image public keys (raw 32 bytes each), besides those
    /// in [`KEYS_FILE`].
    pub release_keys: Vec<Vec<u8>>,
    pub image_keys: Vec<Vec<u8>>,
    /// The bound on each store call.
    pub store_timeout: Duration,
    /// Wall clock, unix ms.
    pub now_ms: i64,
}

/// Runs every check.
pub async fn run(opts: &Options) -> Report {
    let mut out = vec![
        checks::ca(&opts.data_dir, opts.now_ms),
        checks::serving(&opts.data_dir, opts.now_ms),
    ];
    let (store_check, store) = checks::store(opts).await;
    out.push(store_check);
    match store {
        Some(store) => {
            let now = checks::store_now(opts, &store).await;
            out.extend(checks::leases(opts, &store, now).await);
            out.push(checks::clock(opts, &store).await);
            let keys = checks::Keys::load(opts);
            out.push(checks::releases(opts, &store, &keys).await);
            out.push(checks::images(opts, &store, &keys).await);
        }
        None => {
            for check in ["gateways", "controllers", "clock", "releases", "images"] {
                out.push(Check::warn(
                    check,
                    "not checked: the store cannot be read",
                    "fix the store first (see the store check)",
                ));
            }
        }
    }
    Report::new(out)
}
