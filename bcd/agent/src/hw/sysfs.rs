//! The real machine, read under a root path (`/` in production, a tree of
//! golden files in tests): the boot id and host name from `/proc`, NVIDIA
//! GPUs from sysfs (with UUID and model from the driver's `/proc` files),
//! their device nodes and driver files, and the TPM's presence.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Gpu, Gpus, Host, Power, Tpm, TpmInfo};

/// Driver binaries mounted into containers when present.
const DRIVER_BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Driver libraries (by name prefix, versioned files only) mounted when
/// present: the compute set.
const DRIVER_LIBRARIES: &[&str] = &[
    "libnvidia-ml.so.",
    "libcuda.so.",
    "libcudadebugger.so.",
    "libnvidia-ptxjitcompiler.so.",
    "libnvidia-nvvm.so.",
    "libnvidia-cfg.so.",
    "libnvidia-opencl.so.",
    "libnvidia-gpucomp.so.",
    "libnvidia-allocator.so.",
];

const LIBRARY_DIRS: &[&str] = &["usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib"];

/// A character device's numbers, if `path` is one.
fn char_device(path: &Path) -> Option<(u32, u32)> {
    let st = rustix::fs::stat(path).ok()?;
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    (kind == rustix::fs::FileType::CharacterDevice)
        .then(|| (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)))
}

/// Device nodes and driver files under `root`, for the GPUs in `gpus`.
pub fn nvidia_cdi_inventory(root: &Path, gpus: &[Gpu]) -> std::io::Result<cdi::nvidia::Inventory> {
    let dev = root.join("dev");
    let mut inv = cdi::nvidia::Inventory::default();
    let node = |name: &str| {
        let p = dev.join(name);
        char_device(&p).map(|(major, minor)| cdi::nvidia::Node {
            path: format!("/dev/{name}"),
            major,
            minor,
        })
    };
    if let Ok(entries) = fs::read_dir(&dev) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(rest) = name.strip_prefix("nvidia") else {
                continue;
            };
            let Some(n) = node(&name) else {
                continue;
            };
            if let Ok(index) = rest.parse::<u32>() {
                inv.gpus.push(cdi::nvidia::Gpu {
                    index,
                    uuid: gpus
                        .iter()
                        .find(|g| g.minor == Some(index))
                        .and_then(|g| g.uuid.clone()),
                    node: n,
                });
            } else if rest == "ctl" || rest.starts_with("-uvm") || rest == "-modeset" {
                inv.control_nodes.push(n);
            }
        }
    }
    if let Ok(caps) = fs::read_dir(dev.join("nvidia-caps")) {
        for e in caps.flatten() {
            let name = format!("nvidia-caps/{}", e.file_name().to_string_lossy());
            if let Some(n) = node(&name) {
                inv.control_nodes.push(n);
            }
        }
    }
    for b in DRIVER_BINARIES {
        for d in ["usr/bin", "usr/sbin"] {
            if root.join(d).join(b).is_file() {
                inv.driver_files.push(format!("/{d}/{b}"));
            }
        }
    }
    for d in LIBRARY_DIRS {
        if let Ok(entries) = fs::read_dir(root.join(d)) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let versioned = DRIVER_LIBRARIES.iter().any(|p| {
                    name.strip_prefix(p).is_some_and(|v| {
                        v.chars().next().is_some_and(|c| c.is_ascii_digit()) && v.contains('.')
                    })
                });
                if versioned && e.path().is_file() {
                    inv.driver_files.push(format!("/{d}/{name}"));
                }
            }
        }
    }
    inv.gpus.sort_by_key(|g| g.index);
    inv.control_nodes.sort_by(|a, b| a.path.cmp(&b.path));
    inv.driver_files.sort();
    Ok(inv)
}

/// The machine bcd runs on, read under `root`.
#[derive(Debug)]
pub struct RealHost {
    root: PathBuf,
    gpus: Box<dyn Gpus>,
    tpm: SysfsTpm,
}

impl RealHost {
    pub fn new(root: impl Into<PathBuf>) -> RealHost {
        let root = root.into();
        RealHost::with_gpus(root.clone(), Box::new(SysfsGpus { root }))
    }

    /// A host whose GPUs come from another backend (NVML).
    pub fn with_gpus(root: impl Into<PathBuf>, gpus: Box<dyn Gpus>) -> RealHost {
        let root = root.into();
        RealHost {
            gpus,
            tpm: SysfsTpm { root: root.clone() },
            root,
        }
    }
}

fn read_trim(path: &Path) -> std::io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_string())
}

impl Host for RealHost {
    fn boot_id(&self) -> std::io::Result<String> {
        read_trim(&self.root.join("proc/sys/kernel/random/boot_id"))
    }

    fn hostname(&self) -> String {
        read_trim(&self.root.join("proc/sys/kernel/hostname"))
            .or_else(|_| read_trim(&self.root.join("etc/hostname")))
            .unwrap_or_else(|_| "localhost".to_string())
    }

    fn gpus(&self) -> &dyn Gpus {
        self.gpus.as_ref()
    }

    fn tpm(&self) -> &dyn Tpm {
        &self.tpm
    }

    fn load_average(&self) -> Option<[f64; 3]> {
        let s = fs::read_to_string(self.root.join("proc/loadavg")).ok()?;
        let mut it = s.split_whitespace().map(|v| v.parse::<f64>().ok());
        Some([it.next()??, it.next()??, it.next()??])
    }

    /// `/sys/class/net/*/address` of devices with a `device` link (no
    /// loopback, bridge or other virtual device), all-zero ones skipped.
    fn macs(&self) -> Vec<String> {
        let mut macs: Vec<String> = fs::read_dir(self.root.join("sys/class/net"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("device").exists())
            .filter_map(|e| read_trim(&e.path().join("address")).ok())
            .filter(|a| a.len() == 17 && a.bytes().any(|b| b != b'0' && b != b':'))
            .map(|a| a.to_ascii_lowercase())
            .collect();
        macs.sort();
        macs.dedup();
        macs
    }
}

/// NVIDIA GPUs from sysfs: PCI functions of vendor 0x10de whose class is VGA
/// (0x0300) or 3D controller (0x0302); UUID and model from the driver's
/// `/proc/driver/nvidia/gpus/<address>/information` when it is loaded.
#[derive(Debug)]
pub struct SysfsGpus {
    pub(super) root: PathBuf,
}

impl SysfsGpus {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SysfsGpus { root: root.into() }
    }
}

impl Gpus for SysfsGpus {
    fn list(&self) -> std::io::Result<Vec<Gpu>> {
        let devices = self.root.join("sys/bus/pci/devices");
        let entries = match fs::read_dir(&devices) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut gpus = Vec::new();
        for entry in entries {
            let entry = entry?;
            let dir = entry.path();
            let vendor = read_trim(&dir.join("vendor")).unwrap_or_default();
            let class = read_trim(&dir.join("class")).unwrap_or_default();
            if vendor != "0x10de" || !(class.starts_with("0x0300") || class.starts_with("0x0302")) {
                continue;
            }
            let address = entry.file_name().to_string_lossy().to_string();
            let info = fs::read_to_string(
                self.root
                    .join("proc/driver/nvidia/gpus")
                    .join(&address)
                    .join("information"),
            )
            .unwrap_or_default();
            let field = |name: &str| {
                info.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == name).then(|| v.trim().to_string())
                })
            };
            gpus.push(Gpu {
                vendor_id: vendor,
                device_id: read_trim(&dir.join("device")).unwrap_or_default(),
                class,
                numa_node: read_trim(&dir.join("numa_node"))
                    .ok()
                    .and_then(|s| s.parse().ok()),
                uuid: field("GPU UUID"),
                minor: field("Device Minor").and_then(|m| m.parse().ok()),
                model: field("Model"),
                pci_address: address,
            });
        }
        gpus.sort();
        Ok(gpus)
    }

    fn cdi_inventory(&self) -> std::io::Result<cdi::nvidia::Inventory> {
        nvidia_cdi_inventory(&self.root, &self.list()?)
    }

    /// A PCI function reset through sysfs when the device offers one;
    /// otherwise unbind from the driver and bind again.
    fn reset(&self, pci_address: &str) -> std::io::Result<&'static str> {
        if pci_address.contains('/') || pci_address.starts_with('.') {
            return Err(std::io::Error::other("not a PCI address"));
        }
        let dev = self.root.join("sys/bus/pci/devices").join(pci_address);
        if !dev.exists() {
            return Err(std::io::Error::other(format!(
                "no PCI device {pci_address}"
            )));
        }
        let reset = dev.join("reset");
        if reset.exists() {
            fs::write(&reset, "1")?;
            return Ok("function reset");
        }
        let driver = fs::read_link(dev.join("driver"))
            .map_err(|e| std::io::Error::other(format!("no reset and no driver bound: {e}")))?;
        let driver_dir = dev.join(&driver);
        fs::write(driver_dir.join("unbind"), pci_address)?;
        fs::write(driver_dir.join("bind"), pci_address)?;
        Ok("unbind and bind")
    }
}

/// `00000000:17:00.0` (NVML) → `0000:17:00.0` (sysfs).
pub fn sysfs_pci_address(bus_id: &str) -> String {
    let lower = bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

/// Whether the kernel exposes a TPM, from sysfs and /dev.
#[derive(Debug)]
pub struct SysfsTpm {
    root: PathBuf,
}

impl Tpm for SysfsTpm {
    fn info(&self) -> TpmInfo {
        let class = self.root.join("sys/class/tpm/tpm0");
        let present = class.exists();
        let device = ["dev/tpmrm0", "dev/tpm0"]
            .iter()
            .find(|d| self.root.join(d).exists())
            .map(|d| format!("/{d}"));
        TpmInfo {
            present,
            version_major: read_trim(&class.join("tpm_version_major"))
                .ok()
                .and_then(|s| s.parse().ok()),
            device: if present { device } else { None },
            ek_sha256: None,
        }
    }
}

/// Reboot and kexec of this machine by the raw calls (root,
/// CAP_SYS_BOOT): where no systemd runs (a ramdisk with `bcd init` as PID
/// 1); elsewhere [`super::systemd::SystemdPower`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemPower;

impl Power for SystemPower {
    fn reboot(&self) -> std::io::Result<()> {
        rustix::fs::sync();
        rustix::system::reboot(rustix::system::RebootCommand::Restart)?;
        Ok(())
    }

    fn kexec(&self, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()> {
        kexec_load(Path::new(KEXEC), kernel, initrd, cmdline)?;
        rustix::fs::sync();
        let status = std::process::Command::new(KEXEC).arg("-e").status()?;
        Err(std::io::Error::other(format!(
            "kexec -e returned: {status}"
        )))
    }
}

/// kexec-tools, as Debian and the ramdisk install it.
pub const KEXEC: &str = "kexec";

/// Loads `kernel` (with `initrd`, if any, and `cmdline`) for the next
/// kexec with kexec-tools' `tool` (`kexec_file_load`, so a kernel the
/// machine's signing policy refuses is refused here).
pub fn kexec_load(tool: &Path, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()> {
    let mut load = std::process::Command::new(tool);
    load.args(["--kexec-file-syscall", "-l", kernel]);
    if !initrd.is_empty() {
        load.arg(format!("--initrd={initrd}"));
    }
    load.arg(format!("--command-line={cmdline}"));
    let status = load.status()?;
    if !status.success() {
        return Err(std::io::Error::other(format!("kexec -l failed: {status}")));
    }
    Ok(())
}

pub fn real(root: impl Into<PathBuf>) -> Arc<dyn Host> {
    Arc::new(RealHost::new(root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::inventory;

    fn write(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    /// A golden sysfs/proc tree: two NVIDIA GPUs (one with the driver
    /// loaded), an NVIDIA audio function and an Intel NIC that must be
    /// skipped, and a TPM 2.0.
    fn golden() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        for (addr, vendor, device, class) in [
            ("0000:17:00.0", "0x10de", "0x2335", "0x030200"),
            ("0000:2a:00.0", "0x10de", "0x2335", "0x030000"),
            ("0000:17:00.1", "0x10de", "0x22a3", "0x040300"),
            ("0000:03:00.0", "0x8086", "0x1521", "0x020000"),
        ] {
            write(
                r,
                &format!("sys/bus/pci/devices/{addr}/vendor"),
                &format!("{vendor}\n"),
            );
            write(
                r,
                &format!("sys/bus/pci/devices/{addr}/device"),
                &format!("{device}\n"),
            );
            write(
                r,
                &format!("sys/bus/pci/devices/{addr}/class"),
                &format!("{class}\n"),
            );
            write(r, &format!("sys/bus/pci/devices/{addr}/numa_node"), "1\n");
        }
        write(
            r,
            "proc/driver/nvidia/gpus/0000:17:00.0/information",
            "Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\nGPU UUID: \t GPU-4b6e0c3a-1f2d-4e5f-8a9b-0c1d2e3f4a5b\n",
        );
        write(
            r,
            "proc/sys/kernel/random/boot_id",
            "0f8e2c1a-3b4d-4e5f-9a8b-7c6d5e4f3a2b\n",
        );
        write(r, "proc/sys/kernel/hostname", "gpu-node-07\n");
        write(r, "sys/class/tpm/tpm0/tpm_version_major", "2\n");
        write(r, "dev/tpmrm0", "");
        write(r, "proc/loadavg", "0.52 0.58 0.59 1/467 12345\n");
        // A NIC, a second NIC with no address yet, loopback and a bridge.
        write(r, "sys/class/net/eno1/address", "3C:EC:EF:01:02:03\n");
        write(r, "sys/class/net/eno1/device/vendor", "0x8086\n");
        write(r, "sys/class/net/eno2/address", "00:00:00:00:00:00\n");
        write(r, "sys/class/net/eno2/device/vendor", "0x8086\n");
        write(r, "sys/class/net/lo/address", "00:00:00:00:00:00\n");
        write(r, "sys/class/net/br0/address", "52:54:00:aa:bb:cc\n");
        d
    }

    #[test]
    fn reads_gpus_boot_id_and_tpm_from_a_golden_tree() {
        let d = golden();
        let host = RealHost::new(d.path());
        assert_eq!(
            host.boot_id().unwrap(),
            "0f8e2c1a-3b4d-4e5f-9a8b-7c6d5e4f3a2b"
        );
        assert_eq!(host.hostname(), "gpu-node-07");
        let gpus = host.gpus().list().unwrap();
        assert_eq!(
            gpus.iter()
                .map(|g| g.pci_address.as_str())
                .collect::<Vec<_>>(),
            ["0000:17:00.0", "0000:2a:00.0"]
        );
        assert_eq!(gpus[0].model.as_deref(), Some("NVIDIA H200"));
        assert_eq!(
            gpus[0].uuid.as_deref(),
            Some("GPU-4b6e0c3a-1f2d-4e5f-8a9b-0c1d2e3f4a5b")
        );
        assert_eq!(gpus[1].uuid, None, "driver not loaded for this one");
        assert_eq!(gpus[0].numa_node, Some(1));
        let tpm = host.tpm().info();
        assert!(tpm.present);
        assert_eq!(tpm.version_major, Some(2));
        assert_eq!(tpm.device.as_deref(), Some("/dev/tpmrm0"));
        assert_eq!(host.load_average(), Some([0.52, 0.58, 0.59]));
        assert_eq!(host.macs(), ["3c:ec:ef:01:02:03"], "physical NICs only");
        assert!(RealHost::new("/nonexistent").macs().is_empty());
    }

    #[test]
    fn inventory_hash_changes_with_the_gpus() {
        let d = golden();
        let before = inventory(&RealHost::new(d.path()));
        fs::remove_dir_all(d.path().join("sys/bus/pci/devices/0000:2a:00.0")).unwrap();
        let after = inventory(&RealHost::new(d.path()));
        assert_eq!(before[0], after[0], "host section unchanged");
        assert_ne!(before[1].sha256, after[1].sha256);
        assert_eq!(before[2], after[2]);
    }

    /// Real device nodes (made with mknod, as root) in a golden tree: the
    /// inventory carries their majors and minors, matches UUIDs by the
    /// driver's minor, and finds the driver files present.
    #[test]
    fn cdi_inventory_reads_device_numbers_and_driver_files() {
        let d = golden();
        let r = d.path();
        write(
            r,
            "proc/driver/nvidia/gpus/0000:17:00.0/information",
            "Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-4b6e0c3a-1f2d-4e5f-8a9b-0c1d2e3f4a5b\nDevice Minor: \t 0\n",
        );
        fs::create_dir_all(r.join("dev/nvidia-caps")).unwrap();
        let mknod = |rel: &str, major: u32, minor: u32| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                r.join(rel),
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o600),
                rustix::fs::makedev(major, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {rel} (the tests run as root): {e}"));
        };
        mknod("dev/nvidia0", 195, 0);
        mknod("dev/nvidia1", 195, 1);
        mknod("dev/nvidiactl", 195, 255);
        mknod("dev/nvidia-uvm", 509, 0);
        mknod("dev/nvidia-caps/nvidia-cap1", 238, 1);
        write(r, "dev/nvidia9", "not a device");
        write(r, "usr/bin/nvidia-smi", "");
        write(r, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", "");
        write(r, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "");
        write(r, "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "");
        write(r, "usr/lib/x86_64-linux-gnu/libc.so.6", "");
        let inv = RealHost::new(r).gpus().cdi_inventory().unwrap();
        assert_eq!(
            inv.gpus
                .iter()
                .map(|g| (g.index, g.uuid.as_deref(), g.node.major, g.node.minor))
                .collect::<Vec<_>>(),
            [
                (0, Some("GPU-4b6e0c3a-1f2d-4e5f-8a9b-0c1d2e3f4a5b"), 195, 0),
                (1, None, 195, 1)
            ]
        );
        assert_eq!(
            inv.control_nodes
                .iter()
                .map(|n| n.path.as_str())
                .collect::<Vec<_>>(),
            [
                "/dev/nvidia-caps/nvidia-cap1",
                "/dev/nvidia-uvm",
                "/dev/nvidiactl"
            ]
        );
        assert_eq!(
            inv.driver_files,
            [
                "/usr/bin/nvidia-smi",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15"
            ]
        );
        let spec = cdi::nvidia::spec(&inv);
        spec.validate().unwrap();
        assert_eq!(spec.devices.len(), 4, "0, 1, the UUID of 0, all");
    }

    #[test]
    fn reset_uses_the_function_reset_or_rebinds_the_driver() {
        let d = golden();
        let r = d.path();
        let host = RealHost::new(r);
        write(r, "sys/bus/pci/devices/0000:17:00.0/reset", "");
        assert_eq!(host.gpus().reset("0000:17:00.0").unwrap(), "function reset");
        assert_eq!(
            fs::read_to_string(r.join("sys/bus/pci/devices/0000:17:00.0/reset")).unwrap(),
            "1"
        );
        // No reset file: unbind and bind through the bound driver.
        fs::create_dir_all(r.join("sys/bus/pci/drivers/nvidia")).unwrap();
        std::os::unix::fs::symlink(
            "../../drivers/nvidia",
            r.join("sys/bus/pci/devices/0000:2a:00.0/driver"),
        )
        .unwrap();
        assert_eq!(
            host.gpus().reset("0000:2a:00.0").unwrap(),
            "unbind and bind"
        );
        assert_eq!(
            fs::read_to_string(r.join("sys/bus/pci/drivers/nvidia/bind")).unwrap(),
            "0000:2a:00.0"
        );
        assert_eq!(
            fs::read_to_string(r.join("sys/bus/pci/drivers/nvidia/unbind")).unwrap(),
            "0000:2a:00.0"
        );
        assert!(host.gpus().reset("0000:99:00.0").is_err());
        assert!(host.gpus().reset("../../etc").is_err());
    }

    #[test]
    fn nvml_bus_ids_map_to_sysfs_addresses() {
        assert_eq!(sysfs_pci_address("00000000:17:00.0"), "0000:17:00.0");
        assert_eq!(sysfs_pci_address("0000:2A:00.0"), "0000:2a:00.0");
    }

    #[test]
    fn a_machine_without_pci_has_no_gpus() {
        let d = tempfile::tempdir().unwrap();
        assert!(SysfsGpus::new(d.path()).list().unwrap().is_empty());
    }
}
