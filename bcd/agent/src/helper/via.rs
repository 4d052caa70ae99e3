//! The daemon's side: `node::Machine`'s traits and the self-update's
//! [`SlotActs`] implemented by asking the helper ([`bcd_helper::BlockingClient`]).
//!
//! Every error starts `helper: ` and ends no daemon. A request the helper
//! (or this side) refuses as invalid cannot succeed by being sent again,
//! so a section it belongs to is `Failed`; every other error (the helper
//! is down, the act failed) leaves the section `Progressing`, retried at
//! the next pass. A GPU reset, reboot or kexec that fails through the
//! helper fails its command as it would without root.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bcd_core::update::Slot;
use bcd_helper::{BlockingClient, ClientError, wire};
use bcd_proto::v1::{self, FirewallRule};

use crate::converge::access::{SshdPlan, StepError};
use crate::converge::devices::{DevicePlan, env_files_in};
use crate::converge::{DeviceFiles, Firewall, SshdFiles, Status};
use crate::hw::{Gpu, Gpus, Host, Power, Tpm};
use crate::slots::{SlotError, Slots};
use crate::upgrade::SlotActs;

/// How long a reboot or kexec the helper accepted may take to end this
/// boot before it counts as failed.
pub const REBOOT_WAIT: Duration = Duration::from_secs(300);

fn step(e: ClientError) -> StepError {
    let status = if e.is_invalid() {
        Status::Failed
    } else {
        Status::Progressing
    };
    (status, e.to_string())
}

fn io(e: ClientError) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Leaves `bytes` in the staging directory under `name` for the helper,
/// readable by it, and returns their SHA-256.
fn stage(staging: &Path, name: &str, bytes: &[u8]) -> std::io::Result<[u8; 32]> {
    std::fs::create_dir_all(staging)?;
    bcd_sys::fs::atomic_write(&staging.join(name), bytes, 0o644)
        .map_err(|e| std::io::Error::other(bcd_sys::error::chain(&e)))?;
    Ok(sha256(bytes))
}

/// The CDI spec and env files, written by the helper.
#[derive(Debug)]
pub struct HelperDevices {
    pub client: Arc<BlockingClient>,
    /// The env files' directory, read here to find files to remove.
    pub env_dir: PathBuf,
}

impl DeviceFiles for HelperDevices {
    fn apply(&self, plan: &DevicePlan) -> Result<bool, StepError> {
        let mut changed = match &plan.cdi_spec {
            Some(json) => self.client.write_cdi_spec(json.clone()),
            None => self.client.remove_cdi_spec(),
        }
        .map_err(step)?;
        for (id, file) in &plan.env_files {
            changed |= self
                .client
                .write_env_file(wire::WriteEnvFile {
                    allocation_id: id.clone(),
                    devices: file.devices.clone(),
                    env: file
                        .env
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
                .map_err(step)?;
        }
        for id in env_files_in(&self.env_dir) {
            if !plan.env_files.contains_key(&id) {
                changed |= self.client.remove_env_file(&id).map_err(step)?;
            }
        }
        Ok(changed)
    }
}

/// Secrets, written by the helper into its memory-backed directory
/// (`<run dir>/secrets`, root's, which the daemon cannot read).
#[derive(Debug)]
pub struct HelperSecrets {
    pub client: Arc<BlockingClient>,
}

impl crate::node::secrets::SecretFiles for HelperSecrets {
    fn retain(&self, keep: &[crate::node::secrets::Want]) -> Result<bool, StepError> {
        self.client
            .retain_secrets(
                keep.iter()
                    .map(|w| wire::SecretFile {
                        allocation_id: w.allocation.clone(),
                        file: w.file.clone(),
                    })
                    .collect(),
            )
            .map_err(step)
    }

    fn write(&self, want: &crate::node::secrets::Want, value: &[u8]) -> Result<(), String> {
        self.client
            .write_secret(wire::WriteSecret {
                allocation_id: want.allocation.clone(),
                file: want.file.clone(),
                value: value.to_vec(),
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn holds(&self, _: &crate::node::secrets::Want) -> bool {
        true
    }
}

/// sshd's files, written by the helper.
#[derive(Debug)]
pub struct HelperSshd {
    pub client: Arc<BlockingClient>,
}

fn lines(s: &str) -> Vec<String> {
    s.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

impl SshdFiles for HelperSshd {
    fn apply(&self, plan: &SshdPlan) -> Result<bool, StepError> {
        let m = wire::WriteSshd {
            users: plan
                .users
                .iter()
                .map(|u| wire::SshUser {
                    name: u.name.clone(),
                    authorized_keys: lines(&u.authorized_keys),
                    principals: lines(&u.principals),
                })
                .collect(),
            trusted_user_ca_keys: lines(&plan.trusted_user_ca_keys),
        };
        self.client.write_sshd(m).map_err(step)
    }
}

/// Table `inet bcd`, made by the helper.
#[derive(Debug)]
pub struct HelperFirewall {
    pub client: Arc<BlockingClient>,
}

/// A spec's rule on the helper's wire.
pub fn wire_rule(r: &FirewallRule) -> wire::FirewallRule {
    wire::FirewallRule {
        protocol: match v1::FirewallProtocol::try_from(r.protocol) {
            Ok(v1::FirewallProtocol::Tcp) => wire::Protocol::Tcp,
            Ok(v1::FirewallProtocol::Udp) => wire::Protocol::Udp,
            Ok(v1::FirewallProtocol::Unspecified) | Err(_) => wire::Protocol::Unspecified,
        } as i32,
        port: r.port,
        source: r.source.clone(),
        action: match v1::FirewallAction::try_from(r.action) {
            Ok(v1::FirewallAction::Accept) => wire::Action::Accept,
            Ok(v1::FirewallAction::Drop) => wire::Action::Drop,
            Ok(v1::FirewallAction::Unspecified) | Err(_) => wire::Action::Unspecified,
        } as i32,
    }
}

impl Firewall for HelperFirewall {
    fn apply(&self, rules: Option<&[FirewallRule]>) -> Result<bool, StepError> {
        match rules {
            Some(rules) => self
                .client
                .apply_firewall(rules.iter().map(wire_rule).collect())
                .map_err(step),
            None => self.client.delete_firewall().map_err(step),
        }
    }
}

/// The machine as the daemon reads it, with GPU resets through the helper.
#[derive(Debug)]
pub struct HelperHost {
    gpus: HelperGpus,
}

#[derive(Debug)]
struct HelperGpus {
    host: Arc<dyn Host>,
    client: Arc<BlockingClient>,
}

impl HelperHost {
    pub fn new(host: Arc<dyn Host>, client: Arc<BlockingClient>) -> HelperHost {
        HelperHost {
            gpus: HelperGpus { host, client },
        }
    }
}

impl Host for HelperHost {
    fn boot_id(&self) -> std::io::Result<String> {
        self.gpus.host.boot_id()
    }

    fn hostname(&self) -> String {
        self.gpus.host.hostname()
    }

    fn gpus(&self) -> &dyn Gpus {
        &self.gpus
    }

    fn tpm(&self) -> &dyn Tpm {
        self.gpus.host.tpm()
    }

    fn load_average(&self) -> Option<[f64; 3]> {
        self.gpus.host.load_average()
    }

    fn macs(&self) -> Vec<String> {
        self.gpus.host.macs()
    }
}

impl Gpus for HelperGpus {
    fn list(&self) -> std::io::Result<Vec<Gpu>> {
        self.host.gpus().list()
    }

    fn cdi_inventory(&self) -> std::io::Result<cdi::nvidia::Inventory> {
        self.host.gpus().cdi_inventory()
    }

    fn reset(&self, pci_address: &str) -> std::io::Result<&'static str> {
        self.client.reset_gpu(pci_address).map_err(io)?;
        Ok("reset by bcd-helper")
    }
}

/// Reboot and kexec through the helper. Once the helper accepted one, the
/// call waits for the boot to end (on a real machine this process ends
/// first) and returns when the boot id changed: a machine that stays up
/// [`REBOOT_WAIT`] after its reboot was accepted fails the command.
#[derive(Debug)]
pub struct HelperPower {
    pub client: Arc<BlockingClient>,
    /// Reads the boot id.
    pub host: Arc<dyn Host>,
    pub staging: PathBuf,
    pub wait: Duration,
}

impl HelperPower {
    fn await_new_boot(&self, before: &str, what: &str) -> std::io::Result<()> {
        let deadline = bcd_sys::clock::mono() + self.wait;
        while bcd_sys::clock::mono() < deadline {
            if self.host.boot_id().is_ok_and(|b| b != before) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(std::io::Error::other(format!(
            "helper: bcd-helper accepted the {what}, but the machine is still up after {} s",
            self.wait.as_secs()
        )))
    }
}

impl Power for HelperPower {
    fn reboot(&self) -> std::io::Result<()> {
        let before = self.host.boot_id()?;
        self.client.reboot("node.reboot").map_err(io)?;
        self.await_new_boot(&before, "reboot")
    }

    fn kexec(&self, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()> {
        let before = self.host.boot_id()?;
        let read = |p: &str| {
            std::fs::read(p).map_err(|e| std::io::Error::other(format!("cannot read {p}: {e}")))
        };
        let kernel_sha = stage(&self.staging, "kexec-kernel", &read(kernel)?)?;
        let (initrd_name, initrd_sha) = if initrd.is_empty() {
            (String::new(), Vec::new())
        } else {
            let h = stage(&self.staging, "kexec-initrd", &read(initrd)?)?;
            ("kexec-initrd".to_string(), h.to_vec())
        };
        self.client
            .kexec(wire::Kexec {
                kernel: "kexec-kernel".into(),
                kernel_sha256: kernel_sha.to_vec(),
                initrd: initrd_name,
                initrd_sha256: initrd_sha,
                cmdline: cmdline.into(),
            })
            .map_err(io)?;
        self.await_new_boot(&before, "kexec")
    }
}

/// Release binaries into slots and the `current` link, by the helper: the
/// binary is staged, and the helper installs it after checking its hash.
#[derive(Debug)]
pub struct HelperSlots {
    pub client: Arc<BlockingClient>,
    pub slots: Slots,
    pub staging: PathBuf,
}

fn helper_slot(slot: Slot) -> bcd_helper::validate::Slot {
    match slot {
        Slot::A => bcd_helper::validate::Slot::A,
        Slot::B => bcd_helper::validate::Slot::B,
    }
}

impl SlotActs for HelperSlots {
    fn install(&self, slot: Slot, binary: &[u8]) -> Result<(), SlotError> {
        // The slots' directory is the daemon's (update.json is its
        // record): made here before the helper makes the slot in it.
        if let Some(dir) = self.slots.binary(slot).parent().and_then(Path::parent) {
            std::fs::create_dir_all(dir).map_err(|source| SlotError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let name = format!("release-{}", slot.name());
        let hash = stage(&self.staging, &name, binary).map_err(|source| SlotError::Io {
            path: self.staging.join(&name),
            source,
        })?;
        let installed = self
            .client
            .install_slot(helper_slot(slot), &name, hash)
            .map_err(|e| SlotError::Helper(e.to_string()));
        let _ = std::fs::remove_file(self.staging.join(&name));
        installed.map(|_| ())
    }

    fn point(&self, slot: Slot) -> Result<(), SlotError> {
        let path = self.slots.binary(slot);
        let bytes = std::fs::read(&path).map_err(|source| SlotError::Io {
            path: path.clone(),
            source,
        })?;
        self.client
            .switch_slot(helper_slot(slot), sha256(&bytes))
            .map(|_| ())
            .map_err(|e| SlotError::Helper(e.to_string()))
    }
}
