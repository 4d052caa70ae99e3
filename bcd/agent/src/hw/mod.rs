//! Hardware and host access behind narrow traits, chosen at construction.
//!
//! The real implementations read the host under a root path (`/` in
//! production, a directory of golden files in tests): the kernel boot id from
//! `/proc`, NVIDIA GPUs from sysfs, the TPM's presence from sysfs and `/dev`.
//! The fakes live in their own crate (`bcd-fakehw`, `bcd/fakehw`), which
//! implements these traits from outside: nothing here knows them, and a
//! `bcd` built without its `fakehw` feature does not contain them.

pub mod inventory;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod show;
pub mod sysfs;
pub mod systemd;

use serde::Serialize;

pub use inventory::{Section, inventory};
pub use sysfs::{RealHost, SysfsGpus, SysfsTpm, SystemPower, real};
pub use systemd::{SystemdPower, power};

/// What the agent reads from the machine it runs on (and the GPU reset,
/// through [`Gpus`]).
pub trait Host: Send + Sync + std::fmt::Debug {
    /// The kernel's boot id: changes at every boot and kexec.
    fn boot_id(&self) -> std::io::Result<String>;
    fn hostname(&self) -> String;
    fn gpus(&self) -> &dyn Gpus;
    fn tpm(&self) -> &dyn Tpm;
    /// The 1, 5 and 15 minute load averages.
    fn load_average(&self) -> Option<[f64; 3]>;
    /// The MAC addresses of the machine's network devices (lowercase,
    /// sorted): the boot endpoint finds the node by them.
    fn macs(&self) -> Vec<String>;
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gpu {
    /// PCI address, `0000:17:00.0`.
    pub pci_address: String,
    pub vendor_id: String,
    pub device_id: String,
    pub class: String,
    pub numa_node: Option<i32>,
    /// From the driver when it is loaded (`GPU-...`).
    pub uuid: Option<String>,
    pub model: Option<String>,
    /// The driver's minor number: the GPU is `/dev/nvidia<minor>`.
    pub minor: Option<u32>,
}

pub trait Gpus: Send + Sync + std::fmt::Debug {
    fn list(&self) -> std::io::Result<Vec<Gpu>>;
    /// The device nodes and driver files a CDI spec for these GPUs needs.
    fn cdi_inventory(&self) -> std::io::Result<cdi::nvidia::Inventory>;
    /// Resets the GPU at a PCI address; says how.
    fn reset(&self, pci_address: &str) -> std::io::Result<&'static str>;
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TpmInfo {
    pub present: bool,
    pub version_major: Option<u32>,
    pub device: Option<String>,
    /// SHA-256 of the endorsement key's public area, where known.
    pub ek_sha256: Option<String>,
}

pub trait Tpm: Send + Sync + std::fmt::Debug {
    fn info(&self) -> TpmInfo;
}

/// Restarting the machine: privileged acts that end this process when they
/// work on real hardware.
pub trait Power: Send + Sync + std::fmt::Debug {
    /// Reboots the machine. On real hardware it does not return when it
    /// works; a fake machine returns `Ok` after its reboot, and the agent
    /// restarts in process.
    fn reboot(&self) -> std::io::Result<()>;
    /// Boots into another kernel; returns like [`Power::reboot`].
    fn kexec(&self, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()>;
}
