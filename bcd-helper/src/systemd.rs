//! systemd over D-Bus: reboot through logind, kexec and restart a unit
//! through the systemd manager (zbus on tokio).
//!
//! Where the machine runs systemd, a reboot goes through
//! `org.freedesktop.login1.Manager`: the helper lists the inhibitors first
//! and waits, a bounded time, while any of them blocks shutdown, then
//! fails or reboots anyway as its [`RebootPolicy`] says, and calls
//! `Reboot(false)`. logind itself handles delay inhibitors. A kexec, with
//! the kernel already loaded, waits on the same inhibitors and then starts
//! `kexec.target` in `replace-irreversibly` mode, as `systemctl kexec`
//! does, so services stop in order before the jump. The restart
//! after an upgrade is `org.freedesktop.systemd1.Manager.RestartUnit(unit,
//! "replace")`, waiting for the job's `JobRemoved` signal (after
//! `Subscribe`, without which systemd sends none).
//!
//! [`detect`] says whether to use any of this: only when systemd manages
//! the machine (`/run/systemd/system` exists, as `sd_booted()` checks) and
//! the system bus socket is there. Elsewhere (a ramdisk with `bcd init` as
//! PID 1) the caller takes the direct path: `reboot(2)`, its own restart.
//!
//! Tested against a real `dbus-daemon` on a private bus. logind and
//! systemd cannot run in a test, so the tests serve the two objects on that
//! bus themselves, with only the methods and the signal used here.
//!
//! Cost: zbus (default features off, tokio only) adds about 860 KiB to a
//! static musl binary built with the workspace's release profile (a
//! throw-away binary using the client: 738,080 bytes; the same calling
//! these functions too: 1,622,848 bytes; zbus's own code is about 425 KiB
//! of it).

use std::path::Path;
use std::time::Duration;

use tokio_stream::StreamExt;
use zbus::zvariant::OwnedObjectPath;

/// The system bus socket, under the root.
pub const SYSTEM_BUS_SOCKET: &str = "run/dbus/system_bus_socket";

/// The bcd service, as the units install it.
pub const BCD_UNIT: &str = "bcd.service";

/// What `systemctl kexec` starts.
pub const KEXEC_TARGET: &str = "kexec.target";

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
trait Login1 {
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;

    fn reboot(&self, interactive: bool) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Manager {
    fn subscribe(&self) -> zbus::Result<()>;

    fn restart_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: zbus::zvariant::ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

#[derive(Debug, thiserror::Error)]
pub enum DbusError {
    #[error("cannot connect to the system bus at {address}")]
    Connect {
        address: String,
        #[source]
        source: zbus::Error,
    },
    #[error("{call} failed")]
    Call {
        call: &'static str,
        #[source]
        source: zbus::Error,
    },
    #[error(
        "the reboot is blocked by {} after waiting {} s: retry once they end, or configure the helper to reboot anyway",
        describe(blocking),
        waited.as_secs()
    )]
    Inhibited {
        blocking: Vec<Inhibitor>,
        waited: Duration,
    },
    #[error("systemd's job to restart {unit} ended {result:?}: see journalctl -u {unit}")]
    Job { unit: String, result: String },
    #[error("systemd's job to restart {unit} did not finish within {} s", within.as_secs())]
    JobTimeout { unit: String, within: Duration },
}

fn call(call: &'static str) -> impl FnOnce(zbus::Error) -> DbusError {
    move |source| DbusError::Call { call, source }
}

/// A logind inhibitor lock, as `ListInhibitors` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inhibitor {
    /// Colon-separated: `shutdown:sleep:idle`...
    pub what: String,
    pub who: String,
    pub why: String,
    /// `block`, `block-weak` or `delay`.
    pub mode: String,
    pub uid: u32,
    pub pid: u32,
}

impl Inhibitor {
    /// Whether it keeps a reboot from starting: a block lock on shutdown.
    /// (A delay lock only delays it, and logind handles that itself.)
    pub fn blocks_shutdown(&self) -> bool {
        matches!(self.mode.as_str(), "block" | "block-weak")
            && self.what.split(':').any(|w| w == "shutdown")
    }
}

fn describe(inhibitors: &[Inhibitor]) -> String {
    let mut parts: Vec<String> = inhibitors
        .iter()
        .take(5)
        .map(|i| format!("{} ({}, pid {})", i.who, i.why, i.pid))
        .collect();
    if inhibitors.len() > 5 {
        parts.push(format!("{} more", inhibitors.len() - 5));
    }
    parts.join(", ")
}

/// What to do about block inhibitors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenBlocked {
    /// Still blocked after the wait: the reboot fails.
    Fail,
    /// Still blocked after the wait: reboot anyway (root may).
    Proceed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebootPolicy {
    /// How long to wait for block inhibitors to end.
    pub max_wait: Duration,
    /// How often to look again meanwhile.
    pub poll: Duration,
    pub when_blocked: WhenBlocked,
}

impl Default for RebootPolicy {
    /// Waits up to 60 s (well within the helper's request timeout), looking
    /// every second, then fails.
    fn default() -> RebootPolicy {
        RebootPolicy {
            max_wait: Duration::from_secs(60),
            poll: Duration::from_secs(1),
            when_blocked: WhenBlocked::Fail,
        }
    }
}

/// The next step of a reboot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Reboot now; `overriding` the block locks still held (policy
    /// `Proceed` after the wait).
    Reboot { overriding: Vec<Inhibitor> },
    /// Look again after the poll interval.
    Wait,
    /// Give up: these still block.
    Refuse { blocking: Vec<Inhibitor> },
}

/// The reboot decision after `waited`, given the inhibitors now held.
pub fn decide(inhibitors: &[Inhibitor], waited: Duration, policy: &RebootPolicy) -> Decision {
    let blocking: Vec<Inhibitor> = inhibitors
        .iter()
        .filter(|i| i.blocks_shutdown())
        .cloned()
        .collect();
    if blocking.is_empty() {
        return Decision::Reboot {
            overriding: Vec::new(),
        };
    }
    if waited < policy.max_wait {
        return Decision::Wait;
    }
    match policy.when_blocked {
        WhenBlocked::Fail => Decision::Refuse { blocking },
        WhenBlocked::Proceed => Decision::Reboot {
            overriding: blocking,
        },
    }
}

/// How the machine goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Down {
    Reboot,
    /// Into the kernel already loaded for kexec.
    Kexec,
}

/// A reboot logind accepted (or a kexec systemd did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebooting {
    pub waited: Duration,
    /// Block locks rebooted through (policy `Proceed`).
    pub overriding: Vec<Inhibitor>,
}

/// Escapes a D-Bus address value: bytes outside `[-0-9A-Za-z_/.*]` as
/// `%xx`.
fn escape_address_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'/' | b'.' | b'*') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

/// The system bus address when systemd manages the machine under `root`
/// (`/` normally) and its bus socket is there; `None` means the direct path.
pub fn detect(root: &Path) -> Option<String> {
    use std::os::unix::fs::FileTypeExt;
    let booted = root.join("run/systemd/system").is_dir();
    let socket = root.join(SYSTEM_BUS_SOCKET);
    let bus = std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket());
    (booted && bus).then(|| {
        format!(
            "unix:path={}",
            escape_address_value(&socket.to_string_lossy())
        )
    })
}

/// A connection to logind and the systemd manager.
#[derive(Debug, Clone)]
pub struct Systemd {
    conn: zbus::Connection,
    subscribed: std::sync::Arc<tokio::sync::OnceCell<()>>,
}

impl Systemd {
    /// Connects to the bus at `address` (from [`detect`]).
    pub async fn connect(address: &str) -> Result<Systemd, DbusError> {
        let connect_error = |source| DbusError::Connect {
            address: address.to_string(),
            source,
        };
        let conn = zbus::connection::Builder::address(address)
            .map_err(connect_error)?
            .method_timeout(Duration::from_secs(25))
            .build()
            .await
            .map_err(connect_error)?;
        Ok(Systemd {
            conn,
            subscribed: Default::default(),
        })
    }

    async fn login1(&self) -> Result<Login1Proxy<'static>, DbusError> {
        Login1Proxy::builder(&self.conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(call("org.freedesktop.login1"))
    }

    async fn manager(&self) -> Result<ManagerProxy<'static>, DbusError> {
        ManagerProxy::builder(&self.conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(call("org.freedesktop.systemd1"))
    }

    /// logind's inhibitor locks.
    pub async fn inhibitors(&self) -> Result<Vec<Inhibitor>, DbusError> {
        let list = self
            .login1()
            .await?
            .list_inhibitors()
            .await
            .map_err(call("org.freedesktop.login1.Manager.ListInhibitors"))?;
        Ok(list
            .into_iter()
            .map(|(what, who, why, mode, uid, pid)| Inhibitor {
                what,
                who,
                why,
                mode,
                uid,
                pid,
            })
            .collect())
    }

    /// Waits as `policy` says for the block inhibitors on shutdown to end:
    /// how long it waited and the locks it goes through (policy `Proceed`),
    /// or the refusal naming who still blocks.
    async fn through_inhibitors(
        &self,
        policy: &RebootPolicy,
    ) -> Result<(Duration, Vec<Inhibitor>), DbusError> {
        let start = tokio::time::Instant::now();
        loop {
            let inhibitors = self.inhibitors().await?;
            let waited = start.elapsed();
            match decide(&inhibitors, waited, policy) {
                Decision::Wait => {
                    let left = policy.max_wait.saturating_sub(waited);
                    tracing::info!(
                        blocking = %describe(&inhibitors.iter().filter(|i| i.blocks_shutdown()).cloned().collect::<Vec<_>>()),
                        "shutdown waits for inhibitors"
                    );
                    tokio::time::sleep(policy.poll.min(left).max(Duration::from_millis(1))).await;
                }
                Decision::Refuse { blocking } => {
                    return Err(DbusError::Inhibited { blocking, waited });
                }
                Decision::Reboot { overriding } => {
                    if !overriding.is_empty() {
                        tracing::warn!(
                            blocking = %describe(&overriding),
                            "going down through block inhibitors, as configured"
                        );
                    }
                    return Ok((waited, overriding));
                }
            }
        }
    }

    /// Takes the machine down as `down` says, honouring block inhibitors
    /// as `policy` says: a reboot through logind (`Reboot(false)`), or a
    /// jump into the kernel loaded for kexec as `systemctl kexec` does
    /// (`kexec.target` started irreversibly, so services stop in order
    /// before systemd's shutdown executes it). Returns once logind or
    /// systemd accepted.
    pub async fn go_down(&self, down: Down, policy: &RebootPolicy) -> Result<Rebooting, DbusError> {
        let (waited, overriding) = self.through_inhibitors(policy).await?;
        match down {
            Down::Reboot => self
                .login1()
                .await?
                .reboot(false)
                .await
                .map_err(call("org.freedesktop.login1.Manager.Reboot"))?,
            Down::Kexec => {
                self.manager()
                    .await?
                    .start_unit(KEXEC_TARGET, "replace-irreversibly")
                    .await
                    .map_err(call("org.freedesktop.systemd1.Manager.StartUnit"))?;
            }
        }
        Ok(Rebooting { waited, overriding })
    }

    /// Restarts `unit` (`replace` mode) and waits up to `within` for its
    /// job to finish.
    pub async fn restart_unit(&self, unit: &str, within: Duration) -> Result<(), DbusError> {
        let manager = self.manager().await?;
        self.subscribed
            .get_or_try_init(|| async {
                match manager.subscribe().await {
                    Ok(()) => Ok(()),
                    // This connection subscribed before (another clone).
                    Err(zbus::Error::MethodError(name, _, _))
                        if name.as_str() == "org.freedesktop.systemd1.AlreadySubscribed" =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(call("org.freedesktop.systemd1.Manager.Subscribe")(e)),
                }
            })
            .await?;
        // Listen before asking: the job may end before the reply arrives.
        let mut removed = manager
            .receive_job_removed()
            .await
            .map_err(call("JobRemoved"))?;
        let job = manager
            .restart_unit(unit, "replace")
            .await
            .map_err(call("org.freedesktop.systemd1.Manager.RestartUnit"))?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                let Ok(args) = signal.args() else { continue };
                if args.job().as_str() == job.as_str() {
                    return Some(args.result().to_string());
                }
            }
            None
        };
        match tokio::time::timeout(within, wait).await {
            Ok(Some(result)) if result == "done" => Ok(()),
            Ok(Some(result)) => Err(DbusError::Job {
                unit: unit.to_string(),
                result,
            }),
            Ok(None) | Err(_) => Err(DbusError::JobTimeout {
                unit: unit.to_string(),
                within,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(what: &str, mode: &str) -> Inhibitor {
        Inhibitor {
            what: what.into(),
            who: "fwupd".into(),
            why: "Firmware update in progress".into(),
            mode: mode.into(),
            uid: 0,
            pid: 812,
        }
    }

    #[test]
    fn only_block_locks_on_shutdown_hold_a_reboot() {
        assert!(lock("shutdown", "block").blocks_shutdown());
        assert!(lock("sleep:shutdown:idle", "block").blocks_shutdown());
        assert!(lock("shutdown", "block-weak").blocks_shutdown());
        assert!(!lock("shutdown", "delay").blocks_shutdown());
        assert!(!lock("sleep:idle", "block").blocks_shutdown());
        assert!(!lock("handle-power-key", "block").blocks_shutdown());
    }

    #[test]
    fn the_wait_is_bounded_and_ends_as_configured() {
        let fail = RebootPolicy {
            max_wait: Duration::from_secs(60),
            poll: Duration::from_secs(1),
            when_blocked: WhenBlocked::Fail,
        };
        let proceed = RebootPolicy {
            when_blocked: WhenBlocked::Proceed,
            ..fail
        };
        let none = Decision::Reboot {
            overriding: Vec::new(),
        };
        let delay = [lock("shutdown", "delay")];
        assert_eq!(decide(&[], Duration::ZERO, &fail), none);
        assert_eq!(decide(&delay, Duration::ZERO, &fail), none);
        let held = [lock("shutdown", "block"), lock("sleep", "block")];
        assert_eq!(decide(&held, Duration::ZERO, &fail), Decision::Wait);
        assert_eq!(
            decide(&held, Duration::from_millis(59_999), &fail),
            Decision::Wait
        );
        assert_eq!(
            decide(&held, Duration::from_secs(60), &fail),
            Decision::Refuse {
                blocking: vec![held[0].clone()]
            }
        );
        assert_eq!(
            decide(&held, Duration::from_secs(61), &proceed),
            Decision::Reboot {
                overriding: vec![held[0].clone()]
            }
        );
        assert_eq!(
            decide(&held, Duration::from_secs(5), &proceed),
            Decision::Wait
        );
    }

    #[test]
    fn the_refusal_names_who_blocks() {
        let e = DbusError::Inhibited {
            blocking: vec![lock("shutdown", "block")],
            waited: Duration::from_secs(60),
        };
        assert_eq!(
            e.to_string(),
            "the reboot is blocked by fwupd (Firmware update in progress, pid 812) after waiting 60 s: retry once they end, or configure the helper to reboot anyway"
        );
        let many = DbusError::Inhibited {
            blocking: vec![lock("shutdown", "block"); 7],
            waited: Duration::from_secs(1),
        };
        assert!(many.to_string().contains(", 2 more after"), "{many}");
    }

    #[test]
    fn detection_needs_systemd_and_the_bus_socket() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(detect(d.path()), None);
        std::fs::create_dir_all(d.path().join("run/systemd/system")).unwrap();
        assert_eq!(detect(d.path()), None, "systemd without a bus");
        std::fs::create_dir_all(d.path().join("run/dbus")).unwrap();
        std::fs::write(d.path().join(SYSTEM_BUS_SOCKET), b"").unwrap();
        assert_eq!(detect(d.path()), None, "a plain file is not the bus");
        std::fs::remove_file(d.path().join(SYSTEM_BUS_SOCKET)).unwrap();
        let _listener =
            std::os::unix::net::UnixListener::bind(d.path().join(SYSTEM_BUS_SOCKET)).unwrap();
        let address = detect(d.path()).unwrap();
        assert_eq!(
            address,
            format!(
                "unix:path={}",
                escape_address_value(&d.path().join(SYSTEM_BUS_SOCKET).to_string_lossy())
            )
        );
        std::fs::remove_dir(d.path().join("run/systemd/system")).unwrap();
        assert_eq!(detect(d.path()), None, "a bus without systemd (a ramdisk)");
    }

    #[test]
    fn address_values_are_escaped() {
        assert_eq!(
            escape_address_value("/run/dbus/system_bus_socket"),
            "/run/dbus/system_bus_socket"
        );
        assert_eq!(escape_address_value("/tmp/a b,c=d"), "/tmp/a%20b%2cc%3dd");
    }
}
