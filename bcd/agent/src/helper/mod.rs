//! `bcd helper` and `bcd node --helper`: the privileged helper of an
//! unprivileged daemon, on top of the `bcd-helper` crate (protocol,
//! validation, socket server and client, systemd over D-Bus).
//!
//! - [`handler`]: the helper's side. [`AgentHandler`] carries out each
//!   validated request through the implementation the daemon uses as root
//!   (the convergers' file writers, `nft`, the sysfs GPU reset, reboot and
//!   kexec, the slots), so both modes leave the same machine; reboot goes
//!   through logind and the restart after a swap back through systemd's
//!   manager where systemd runs. [`handler::watchdog`] swaps back an
//!   upgrade still unconfirmed 30 s past its deadline.
//! - [`via`]: the daemon's side. `node::Machine`'s traits and the
//!   self-update's `SlotActs` over the helper's client; errors start
//!   `helper: ` and never end the daemon.
//!
//! [`serve`] is `bcd helper`: it resolves the daemon's user, makes the
//! socket's directory (root, the user's group, 0750), binds, and serves
//! with the watchdog beside it. Root-only mode (ramdisks) has no helper:
//! the daemon takes the direct paths.

pub mod handler;
pub mod via;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use bcd_tpm::Endpoint as TpmEndpoint;
pub use handler::{AgentHandler, HandlerConfig};

/// Where `bcd helper` listens and `bcd node --helper` connects by default.
pub const DEFAULT_SOCKET: &str = bcd_helper::DEFAULT_SOCKET;
/// Where a packaged install keeps its udev rules.
pub const UDEV_RULES_DIR: &str = bcd_udev::rules::INSTALL_DIR;

/// A user of the system: the one the daemon runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum HelperSetupError {
    #[error(
        "no user {0:?} in {1}: create it (useradd --system bcd), or pass --user with the user bcd node runs as"
    )]
    NoUser(String, PathBuf),
    #[error("cannot read {0}")]
    Passwd(PathBuf, #[source] std::io::Error),
    #[error(
        "bcd helper serves uid 0 only with --allow-root: run bcd node as its own user (--user bcd)"
    )]
    Root,
    #[error("cannot prepare {0}")]
    Dir(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Server(#[from] bcd_helper::ServerError),
}

/// Finds `name` (or a numeric uid) in a passwd file (`/etc/passwd`).
pub fn lookup_user(passwd: &Path, name: &str) -> Result<User, HelperSetupError> {
    let text = std::fs::read_to_string(passwd)
        .map_err(|e| HelperSetupError::Passwd(passwd.to_path_buf(), e))?;
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 {
            continue;
        }
        let (Ok(uid), Ok(gid)) = (f[2].parse::<u32>(), f[3].parse::<u32>()) else {
            continue;
        };
        if f[0] == name || name.parse::<u32>() == Ok(uid) {
            return Ok(User {
                name: f[0].to_string(),
                uid,
                gid,
            });
        }
    }
    Err(HelperSetupError::NoUser(
        name.to_string(),
        passwd.to_path_buf(),
    ))
}

/// How `bcd helper` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub user: User,
    pub allow_root: bool,
    pub socket: PathBuf,
    /// The watchdog's grace past an upgrade's deadline.
    pub grace: Duration,
    /// Where GPU resets are checked (`/sys`).
    pub sysfs_root: PathBuf,
}

/// Makes `dir` root's with `gid`'s group, mode 0750 (so only root and the
/// daemon's group reach the socket), when this process may.
fn prepare_dir(dir: &Path, gid: u32) -> Result<(), HelperSetupError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |e: std::io::Error| HelperSetupError::Dir(dir.to_path_buf(), e);
    std::fs::create_dir_all(dir).map_err(err)?;
    if rustix::process::geteuid().is_root() {
        rustix::fs::chown(dir, None, Some(rustix::fs::Gid::from_raw(gid)))
            .map_err(|e| err(e.into()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).map_err(err)?;
    }
    Ok(())
}

/// `bcd helper`: serves the daemon's user until `shutdown`, with the
/// update watchdog.
pub async fn serve(
    opts: ServeOptions,
    handler: AgentHandler,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), HelperSetupError> {
    if opts.user.uid == 0 && !opts.allow_root {
        return Err(HelperSetupError::Root);
    }
    if let Some(dir) = opts.socket.parent() {
        prepare_dir(dir, opts.user.gid)?;
    }
    let staging = handler.config().staging.clone();
    prepare_staging(&staging, &opts.user)?;
    let mut config = bcd_helper::ServerConfig::new(&opts.socket, opts.user.uid);
    config.allow_root = opts.allow_root;
    config.socket_gid = rustix::process::geteuid()
        .is_root()
        .then_some(opts.user.gid);
    config.sysfs_root = opts.sysfs_root.clone();
    config.software = format!("bcd helper {}", env!("CARGO_PKG_VERSION"));
    let server = bcd_helper::Server::bind(config, handler.clone())?;
    tracing::info!(
        socket = %opts.socket.display(),
        user = %opts.user.name,
        uid = opts.user.uid,
        systemd = handler.config().system_bus.is_some(),
        "bcd helper serving"
    );
    let watchdog = tokio::spawn(handler::watchdog(handler, opts.grace));
    server.serve_until(shutdown).await;
    watchdog.abort();
    Ok(())
}

/// The staging directory belongs to the daemon's user (it writes there;
/// the helper reads by name, never following a link).
fn prepare_staging(dir: &Path, user: &User) -> Result<(), HelperSetupError> {
    let err = |e: std::io::Error| HelperSetupError::Dir(dir.to_path_buf(), e);
    std::fs::create_dir_all(dir).map_err(err)?;
    if rustix::process::geteuid().is_root() {
        rustix::fs::chown(
            dir,
            Some(rustix::fs::Uid::from_raw(user.uid)),
            Some(rustix::fs::Gid::from_raw(user.gid)),
        )
        .map_err(|e| err(e.into()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_found_by_name_or_uid() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("passwd");
        std::fs::write(
            &p,
            "root:x:0:0:root:/root:/bin/bash\n# a comment\nbcd:x:998:997:bcd:/var/lib/bcd:/usr/sbin/nologin\nbroken:x:y\n",
        )
        .unwrap();
        let bcd = User {
            name: "bcd".into(),
            uid: 998,
            gid: 997,
        };
        assert_eq!(lookup_user(&p, "bcd").unwrap(), bcd);
        assert_eq!(lookup_user(&p, "998").unwrap(), bcd);
        let e = lookup_user(&p, "nobody").unwrap_err().to_string();
        assert!(e.starts_with("no user \"nobody\""), "{e}");
        assert!(e.contains("useradd --system bcd"), "{e}");
    }
}
