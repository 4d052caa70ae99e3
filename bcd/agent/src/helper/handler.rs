//! The helper's side: [`AgentHandler`] carries out the requests
//! `bcd_helper::Server` validated, each through the implementation the
//! agent uses when it runs as root, so both modes leave the same machine;
//! [`watchdog`] swaps back an upgrade that never confirmed.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use bcd_core::update::Slot;
use bcd_helper::systemd::{Down, RebootPolicy, Systemd};
use bcd_helper::validate::{self, StagedFile};
use bcd_helper::{HelperError, Peer, Reply, Request};
use bcd_proto::v1;
use tracing::{info, warn};

use crate::converge::access::{SshdPlan, SshdUser};
use crate::converge::devices::{CDI_FILE, ENV_MODE};
use crate::converge::{DeviceDirs, Firewall, Nft, SshdDirs, SshdFiles, Status};
use crate::hw::{Host, Power};
use crate::slots::Slots;

/// The largest file the helper copies out of the staging directory (a
/// release binary, a kernel, an initrd).
pub const MAX_STAGED: u64 = 512 << 20;

/// What the helper acts on.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// The node's data directory (its slots).
    pub data_dir: PathBuf,
    /// Where the daemon leaves files for the helper to install (kexec
    /// images, release binaries), by name.
    pub staging: PathBuf,
    /// Root's own directory for the copies it checks and uses (kexec).
    pub private: PathBuf,
    pub devices: DeviceDirs,
    /// Where secrets go (`<run dir>/secrets`, memory-backed only).
    pub secrets: PathBuf,
    pub sshd: SshdDirs,
    pub nft: Nft,
    /// GPU resets (and the machine read under the host root).
    pub host: Arc<dyn Host>,
    /// Reboot and kexec where systemd does not run.
    pub power: Arc<dyn Power>,
    /// The system bus where systemd manages the machine
    /// (`bcd_helper::systemd::detect`); `None`: the direct path.
    pub system_bus: Option<String>,
    pub reboot: RebootPolicy,
    /// The unit restarted after a swap back.
    pub unit: String,
    /// Where TPM commands go (`/dev/tpmrm0`).
    pub tpm: bcd_tpm::Endpoint,
}

/// Carries out validated requests; one per helper process.
#[derive(Debug, Clone)]
pub struct AgentHandler {
    config: Arc<HandlerConfig>,
    /// The pid of the latest client: the daemon, restarted directly (by
    /// SIGTERM to its supervisor's child) where there is no systemd.
    last_peer: Arc<AtomicI32>,
}

/// One connection's state: its own TPM connection, opened at its first
/// TPM command, so the handles it makes live as long as the client's
/// connection.
#[derive(Debug, Default)]
pub struct Conn {
    tpm: Option<bcd_tpm::transport::Connection>,
}

impl AgentHandler {
    pub fn new(config: HandlerConfig) -> AgentHandler {
        AgentHandler {
            config: Arc::new(config),
            last_peer: Arc::new(AtomicI32::new(0)),
        }
    }

    pub fn config(&self) -> &HandlerConfig {
        &self.config
    }

    /// The pid of the latest client served, 0 before any.
    pub fn last_peer(&self) -> i32 {
        self.last_peer.load(Ordering::Relaxed)
    }
}

fn failed(e: impl std::fmt::Display) -> HelperError {
    HelperError::failed(e.to_string())
}

fn fs_failed(e: bcd_sys::fs::FsError) -> HelperError {
    HelperError::failed(bcd_sys::error::chain(&e))
}

/// Runs blocking work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HelperError> + Send + 'static,
) -> Result<T, HelperError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| HelperError::failed(format!("the act did not finish: {e}")))?
}

/// The staged file's bytes, if they are a regular file of at most
/// [`MAX_STAGED`] bytes whose SHA-256 is `sha256`. A link is not followed.
pub fn read_staged(
    staging: &Path,
    file: &StagedFile,
    sha256: &[u8; 32],
) -> Result<Vec<u8>, HelperError> {
    let path = staging.join(file.as_str());
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(|e| {
            HelperError::invalid(format!("cannot open the staged {}: {e}", path.display()))
        })?;
    let meta = f.metadata().map_err(failed)?;
    if !meta.is_file() {
        return Err(HelperError::invalid(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.len() > MAX_STAGED {
        return Err(HelperError::invalid(format!(
            "{} has {} bytes, more than {MAX_STAGED}",
            path.display(),
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&mut f)
        .take(MAX_STAGED + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    check_sha256(&path, &bytes, sha256)?;
    Ok(bytes)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

fn check_sha256(path: &Path, bytes: &[u8], want: &[u8; 32]) -> Result<(), HelperError> {
    let got = sha256(bytes);
    if &got != want {
        return Err(HelperError::invalid(format!(
            "{} has SHA-256 {}, not the {} asked for",
            path.display(),
            hex::encode(got),
            hex::encode(want)
        )));
    }
    Ok(())
}

fn slot(s: validate::Slot) -> Slot {
    match s {
        validate::Slot::A => Slot::A,
        validate::Slot::B => Slot::B,
    }
}

/// The converger's step error as the helper answers it: what cannot be
/// applied as it is is invalid (sending it again cannot help), the rest
/// failed (retried).
fn step_error((status, message): (Status, String)) -> HelperError {
    if status == Status::Failed {
        HelperError::invalid(message)
    } else {
        HelperError::failed(message)
    }
}

/// The validated sshd files as the access converger plans them.
fn sshd_plan(files: &validate::SshdFiles) -> SshdPlan {
    let lines = |v: &[String]| v.iter().map(|l| format!("{l}\n")).collect::<String>();
    SshdPlan {
        users: files
            .users()
            .iter()
            .map(|u| SshdUser {
                name: u.name().to_string(),
                authorized_keys: lines(u.authorized_keys()),
                principals: lines(u.principals()),
            })
            .collect(),
        trusted_user_ca_keys: lines(files.trusted_user_ca_keys()),
    }
}

/// A validated rule as the node's spec states it.
pub fn spec_rule(r: &validate::FirewallRule) -> v1::FirewallRule {
    let w = r.to_wire();
    v1::FirewallRule {
        protocol: match bcd_helper::wire::Protocol::try_from(w.protocol) {
            Ok(bcd_helper::wire::Protocol::Tcp) => v1::FirewallProtocol::Tcp,
            Ok(bcd_helper::wire::Protocol::Udp) => v1::FirewallProtocol::Udp,
            Ok(bcd_helper::wire::Protocol::Unspecified) | Err(_) => {
                v1::FirewallProtocol::Unspecified
            }
        } as i32,
        port: w.port,
        source: w.source,
        action: match bcd_helper::wire::Action::try_from(w.action) {
            Ok(bcd_helper::wire::Action::Accept) => v1::FirewallAction::Accept,
            Ok(bcd_helper::wire::Action::Drop) => v1::FirewallAction::Drop,
            Ok(bcd_helper::wire::Action::Unspecified) | Err(_) => v1::FirewallAction::Unspecified,
        } as i32,
    }
}

impl AgentHandler {
    async fn systemd(&self) -> Result<Option<Systemd>, HelperError> {
        match &self.config.system_bus {
            None => Ok(None),
            Some(address) => Systemd::connect(address)
                .await
                .map(Some)
                .map_err(|e| HelperError::unavailable(bcd_sys::error::chain(&e))),
        }
    }

    async fn reboot(&self, reason: String) -> Result<Reply, HelperError> {
        if let Some(systemd) = self.systemd().await? {
            info!(%reason, "rebooting through logind");
            let r = systemd
                .go_down(Down::Reboot, &self.config.reboot)
                .await
                .map_err(|e| failed(bcd_sys::error::chain(&e)))?;
            if !r.overriding.is_empty() {
                warn!(
                    locks = r.overriding.len(),
                    "rebooted through block inhibitors"
                );
            }
            return Ok(Reply::Done);
        }
        info!(%reason, "rebooting");
        let power = self.config.power.clone();
        blocking(move || power.reboot().map_err(|e| failed(format!("reboot: {e}")))).await?;
        Ok(Reply::Done)
    }

    async fn kexec(&self, k: validate::Kexec) -> Result<Reply, HelperError> {
        let c = self.config.clone();
        blocking(move || {
            // Copies in root's own directory, checked after the copy: the
            // daemon cannot change what is loaded after the check.
            std::fs::create_dir_all(&c.private).map_err(failed)?;
            let place = |name: &str, staged: &StagedFile, hash: &validate::Sha256| {
                let bytes = read_staged(&c.staging, staged, &hash.0)?;
                let path = c.private.join(name);
                bcd_sys::fs::atomic_write(&path, &bytes, 0o600).map_err(fs_failed)?;
                let copy = std::fs::read(&path).map_err(failed)?;
                check_sha256(&path, &copy, &hash.0)?;
                Ok::<_, HelperError>(path)
            };
            let kernel = place("kexec-kernel", &k.kernel, &k.kernel_sha256)?;
            let initrd = match &k.initrd {
                Some((f, h)) => place("kexec-initrd", f, h)?.display().to_string(),
                None => String::new(),
            };
            info!(kernel = %kernel.display(), "kexec");
            c.power
                .kexec(&kernel.display().to_string(), &initrd, &k.cmdline)
                .map_err(|e| failed(format!("kexec: {e}")))
        })
        .await?;
        Ok(Reply::Done)
    }

    async fn restart_daemon(&self) -> Result<Reply, HelperError> {
        match self.systemd().await? {
            Some(systemd) => {
                systemd
                    .restart_unit(&self.config.unit, Duration::from_secs(60))
                    .await
                    .map_err(|e| failed(bcd_sys::error::chain(&e)))?;
                Ok(Reply::Done)
            }
            None => Err(HelperError::unavailable(
                "systemd does not manage this machine: restart bcd node with what started it",
            )),
        }
    }
}

impl bcd_helper::Handler for AgentHandler {
    type Conn = Conn;

    fn open(&self, peer: &Peer) -> Conn {
        self.last_peer.store(peer.pid, Ordering::Relaxed);
        Conn::default()
    }

    async fn handle(&self, conn: &mut Conn, request: Request) -> Result<Reply, HelperError> {
        let c = self.config.clone();
        match request {
            Request::WriteCdiSpec(spec) => {
                let json = spec.json().to_vec();
                blocking(move || {
                    let changed = bcd_sys::fs::write_if_changed(
                        &c.devices.cdi_dir.join(CDI_FILE),
                        &json,
                        0o644,
                    )
                    .map_err(fs_failed)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::RemoveCdiSpec => {
                blocking(move || {
                    let changed = bcd_sys::fs::remove_if_present(&c.devices.cdi_dir.join(CDI_FILE))
                        .map_err(fs_failed)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::WriteEnvFile(e) => {
                blocking(move || {
                    let path = c.devices.env_dir.join(e.allocation().env_file_name());
                    let changed =
                        bcd_sys::fs::write_if_changed(&path, e.render().as_bytes(), ENV_MODE)
                            .map_err(fs_failed)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::RemoveEnvFile(id) => {
                blocking(move || {
                    let changed =
                        bcd_sys::fs::remove_if_present(&c.devices.env_dir.join(id.env_file_name()))
                            .map_err(fs_failed)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::WriteSecret { path, value } => {
                blocking(move || {
                    crate::node::secrets::write(
                        &c.secrets,
                        path.allocation.as_str(),
                        path.file(),
                        value.bytes(),
                    )
                    .map_err(failed)?;
                    info!(secret = %path, "secret written");
                    Ok(Reply::Written { changed: true })
                })
                .await
            }
            Request::RetainSecrets(keep) => {
                blocking(move || {
                    if keep.is_empty() && !c.secrets.exists() {
                        return Ok(Reply::Written { changed: false });
                    }
                    crate::node::secrets::prepare(&c.secrets).map_err(failed)?;
                    let keep = keep
                        .iter()
                        .map(|p| (p.allocation.as_str(), p.file()))
                        .collect();
                    let changed =
                        crate::node::secrets::remove_unwanted(&c.secrets, &keep).map_err(failed)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::WriteSshd(files) => {
                blocking(move || {
                    let changed = c.sshd.apply(&sshd_plan(&files)).map_err(step_error)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::ApplyFirewall(rules) => {
                blocking(move || {
                    let rules: Vec<v1::FirewallRule> = rules.iter().map(spec_rule).collect();
                    let changed = c.nft.apply(Some(&rules)).map_err(step_error)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::DeleteFirewall => {
                blocking(move || {
                    let changed = c.nft.apply(None).map_err(step_error)?;
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::ResetGpu(address) => {
                blocking(move || {
                    let how = c
                        .host
                        .gpus()
                        .reset(address.as_str())
                        .map_err(|e| failed(format!("reset {address}: {e}")))?;
                    info!(%address, how, "GPU reset");
                    Ok(Reply::Done)
                })
                .await
            }
            Request::Reboot { reason } => self.reboot(reason).await,
            Request::Kexec(k) => self.kexec(k).await,
            Request::InstallSlot {
                slot: s,
                file,
                sha256,
            } => {
                blocking(move || {
                    let bytes = read_staged(&c.staging, &file, &sha256.0)?;
                    let slots = Slots::new(&c.data_dir);
                    let path = slots.binary(slot(s));
                    if std::fs::read(&path).is_ok_and(|b| b == bytes) {
                        return Ok(Reply::Written { changed: false });
                    }
                    slots
                        .write_slot(slot(s), &bytes)
                        .map_err(|e| failed(bcd_sys::error::chain(&e)))?;
                    info!(slot = s.name(), "release installed");
                    Ok(Reply::Written { changed: true })
                })
                .await
            }
            Request::SwitchSlot { slot: s, sha256 } => {
                blocking(move || {
                    let slots = Slots::new(&c.data_dir);
                    let path = slots.binary(slot(s));
                    let bytes = std::fs::read(&path).map_err(|e| {
                        HelperError::invalid(format!("slot {} has no binary ({e})", s.name()))
                    })?;
                    check_sha256(&path, &bytes, &sha256.0)?;
                    let changed = slots.link().ok() != Some(slot(s));
                    slots
                        .point(slot(s))
                        .map_err(|e| failed(bcd_sys::error::chain(&e)))?;
                    info!(slot = s.name(), "current points at the slot");
                    Ok(Reply::Written { changed })
                })
                .await
            }
            Request::RollBack => {
                blocking(move || {
                    let (message, swapped) = crate::upgrade::rollback(
                        &c.data_dir,
                        false,
                        Duration::from_millis(crate::upgrade::HELPER_GRACE_MS),
                    )
                    .map_err(|e| failed(bcd_sys::error::chain(&e)))?;
                    Ok(Reply::RolledBack { swapped, message })
                })
                .await
            }
            Request::RestartDaemon => self.restart_daemon().await,
            Request::Tpm(command) => {
                let mut link = match conn.tpm.take() {
                    Some(l) => l,
                    None => {
                        let endpoint = c.tpm.clone();
                        blocking(move || {
                            bcd_tpm::transport::Connection::open(&endpoint).map_err(|e| {
                                HelperError::unavailable(format!(
                                    "the TPM at {endpoint} cannot be opened: {e}"
                                ))
                            })
                        })
                        .await?
                    }
                };
                let (link, response) = tokio::task::spawn_blocking(move || {
                    let r = link.transceive(command.bytes());
                    (link, r)
                })
                .await
                .map_err(|e| failed(format!("the TPM command did not finish: {e}")))?;
                match response {
                    Ok(r) => {
                        conn.tpm = Some(link);
                        Ok(Reply::Tpm(r))
                    }
                    // The TPM connection is gone, and its handles with it.
                    Err(e) => Err(HelperError::unavailable(format!("the TPM: {e}"))),
                }
            }
        }
    }
}

/// How often the watchdog looks.
pub const WATCHDOG_EVERY: Duration = Duration::from_secs(10);

/// One watchdog look: swaps back an upgrade still unconfirmed
/// [`HELPER_GRACE_MS`](crate::upgrade::HELPER_GRACE_MS) past its deadline,
/// whatever the new binary does, then restarts the daemon: through
/// systemd's manager where it runs, else by SIGTERM to the daemon (its
/// supervisor starts the previous release). Returns what it did, if
/// anything.
pub async fn watchdog_tick(handler: &AgentHandler, grace: Duration) -> Option<String> {
    let c = handler.config.clone();
    let data_dir = c.data_dir.clone();
    let rolled =
        tokio::task::spawn_blocking(move || crate::upgrade::rollback(&data_dir, true, grace))
            .await
            .ok()?;
    let (line, swapped) = match rolled {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %bcd_sys::error::chain(&e), "watchdog: cannot read the update state");
            return None;
        }
    };
    if !swapped {
        return None;
    }
    warn!("watchdog: {line}; restarting the daemon");
    let restarted = match handler.systemd().await {
        Ok(Some(systemd)) => systemd
            .restart_unit(&c.unit, Duration::from_secs(60))
            .await
            .map(|()| format!("restarted {}", c.unit))
            .map_err(|e| bcd_sys::error::chain(&e)),
        Ok(None) => match rustix::process::Pid::from_raw(handler.last_peer()) {
            Some(pid) => rustix::process::kill_process(pid, rustix::process::Signal::TERM)
                .map(|()| format!("sent SIGTERM to the daemon (pid {})", pid.as_raw_nonzero()))
                .map_err(|e| format!("cannot signal the daemon: {e}")),
            None => Err("no daemon has connected yet".to_string()),
        },
        Err(e) => Err(e.message),
    };
    match restarted {
        Ok(how) => Some(format!("{line}; {how}")),
        Err(e) => {
            warn!(error = %e, "watchdog: swapped back, but cannot restart the daemon");
            Some(format!("{line}; not restarted: {e}"))
        }
    }
}

/// Runs [`watchdog_tick`] every [`WATCHDOG_EVERY`], forever.
pub async fn watchdog(handler: AgentHandler, grace: Duration) {
    let mut every = tokio::time::interval(WATCHDOG_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        watchdog_tick(&handler, grace).await;
    }
}
