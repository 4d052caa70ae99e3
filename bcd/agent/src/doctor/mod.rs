//! `bcd doctor`: what an operator runs on a node that will not join, a GPU
//! the container does not see, a certificate about to run out. Each check
//! reads the machine and the data directory and says ok, warn or fail,
//! with what to do next; nothing here writes a file, takes the data
//! directory's lock or the daemon's session.
//!
//! Read-only by construction: the identity's files are read as files (not
//! through `Identity::load`, which finishes an interrupted renewal), the
//! journal is opened read-only by SQLite (`PRAGMA integrity_check` on what
//! is there, never a migration or a move aside), `nft` only lists, `sshd
//! -t` checks a copy. The gateway is probed with the node's own
//! certificate by an authenticated call outside the session
//! (`FetchRelease` of a release that cannot exist: the join service checks
//! the certificate against the store, then answers NOT_FOUND), so a running
//! daemon keeps its session.
//!
//! Time is a parameter ([`Options::now_ms`]); the checks are in
//! `checks`, one function each.

mod checks;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::converge::{DeviceDirs, Nft, SshdDirs};
use crate::hw::Host;

pub use bcd_proto::doctor::{Check, Level, Report};

/// What the doctor looks at: the same places `bcd node` uses.
#[derive(Debug, Clone)]
pub struct Options {
    pub data_dir: PathBuf,
    pub devices: DeviceDirs,
    pub sshd: SshdDirs,
    pub nft: Nft,
    pub host: Arc<dyn Host>,
    /// The helper's socket, when the node runs under one.
    pub helper: Option<PathBuf>,
    /// Where a packaged install keeps udev rules (`/usr/lib/udev/rules.d`).
    pub udev_rules_dir: PathBuf,
    /// udevd's control socket (`/run/udev/control`): no udevd, no rules
    /// needed (a ramdisk, where `bcd init` is the device manager).
    pub udevd: PathBuf,
    /// The TPM and its backend, when `node.key` is a TPM record (with a
    /// helper, the helper's TPM through the same backend).
    pub tpm: bcd_tpm::TpmAt,
    /// How long the gateway probe may take.
    pub gateway_timeout: Duration,
    /// Wall clock, unix ms.
    pub now_ms: i64,
    /// The boot clock (`CLOCK_BOOTTIME`), ms: an upgrade's deadline.
    pub boot_ms: u64,
}

/// Runs every check.
pub async fn run(opts: &Options) -> Report {
    let mut out = Vec::new();
    let files = checks::IdentityFiles::read(&opts.data_dir);
    out.push(checks::identity(opts, &files).await);
    out.push(checks::certificate(opts, &files));
    out.push(checks::clock(opts, &files));
    let journal = checks::JournalView::open(&opts.data_dir);
    out.push(checks::journal(&journal));
    out.push(checks::slots(opts));
    out.push(checks::helper(opts).await);
    let spec = checks::applied_spec(&files, &journal);
    out.extend(checks::devices(opts, spec.as_ref()));
    out.extend(checks::access(opts, spec.as_ref()));
    out.push(checks::udev(opts));
    out.push(checks::gateway(opts, &files).await);
    Report::new(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_the_worst_status() {
        let ok = Check::ok("a", "fine");
        let warn = Check::warn("b", "meh", "look");
        let fail = Check::fail("c", "broken", "fix");
        assert_eq!(Report::new(vec![ok.clone()]).exit_code(), 0);
        assert_eq!(Report::new(vec![ok.clone(), warn.clone()]).exit_code(), 2);
        assert_eq!(Report::new(vec![warn, fail, ok]).exit_code(), 1);
        assert_eq!(Report::new(vec![]).exit_code(), 0);
    }

    #[test]
    fn json_and_text_name_each_check() {
        let r = Report::new(vec![
            Check::ok("journal", "opens"),
            Check::fail("gateway", "unreachable", "start the server"),
        ]);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["status"], "fail");
        assert_eq!(v["checks"][0]["check"], "journal");
        assert_eq!(v["checks"][0]["status"], "ok");
        assert!(v["checks"][0].get("next").is_none());
        assert_eq!(v["checks"][1]["next"], "start the server");
        let text = r.to_text();
        assert!(text.contains("fail  gateway      unreachable\n"), "{text}");
        assert!(text.contains("-> start the server"), "{text}");
        assert!(text.ends_with("2 checks: 1 ok, 0 warn, 1 fail\n"), "{text}");
    }
}
