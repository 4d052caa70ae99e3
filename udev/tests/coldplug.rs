//! Coldplug against golden machines: sysfs trees in `tests/data/<machine>/sys`
//! and one image's modules in `tests/data/image` (see `tests/data/README.md`).
//!
//! A machine's tree holds every device it shows once its drivers are
//! loaded. The test starts from a copy without the devices a driver adds
//! (virtio devices behind `virtio_pci`, auxiliary devices behind
//! `mlx5_core`), and its loader plays the kernel: loading such a driver
//! puts them back, so the next round finds them.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use bcd_udev::coldplug::{self, Report};
use bcd_udev::{Aliases, sysfs};
use initramfs::Modules;

const KVER: &str = "6.1.0-57-cloud-amd64";

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn image() -> (Aliases, Modules) {
    let root = data("image");
    (
        Aliases::open(&root, KVER).unwrap(),
        Modules::open(&root, KVER).unwrap(),
    )
}

/// Copies a tree, links as links.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        let target = to.join(entry.file_name());
        if kind.is_symlink() {
            symlink(fs::read_link(entry.path()).unwrap(), &target).unwrap();
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Which driver adds which child devices, by the start of their names.
const ADDED_BY: &[(&str, &str)] = &[("virtio_pci", "virtio"), ("mlx5_core", "mlx5_core.")];

/// A machine booting: its tree without the devices drivers add, and a
/// loader that records what it loads and adds them back.
struct Machine {
    _dir: tempfile::TempDir,
    sys: PathBuf,
    /// Devices held back, by the driver that adds them: (golden, copy).
    held: BTreeMap<&'static str, Vec<(PathBuf, PathBuf)>>,
    loaded: Vec<String>,
}

impl Machine {
    fn boot(name: &str) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let golden = data(name).join("sys");
        let sys = dir.path().join("sys");
        copy_tree(&golden, &sys);
        let mut held: BTreeMap<&'static str, Vec<(PathBuf, PathBuf)>> = BTreeMap::new();
        for device in sysfs::devices(&sys).unwrap() {
            let leaf = device.devpath.rsplit('/').next().unwrap().to_owned();
            for (driver, prefix) in ADDED_BY {
                if leaf.starts_with(prefix) {
                    let copy = sys.join(device.devpath.trim_start_matches('/'));
                    let original = golden.join(device.devpath.trim_start_matches('/'));
                    fs::remove_dir_all(&copy).unwrap();
                    held.entry(driver).or_default().push((original, copy));
                }
            }
        }
        Machine {
            _dir: dir,
            sys,
            held,
            loaded: Vec::new(),
        }
    }

    fn load(&mut self, name: &str) -> io::Result<()> {
        self.loaded.push(name.to_owned());
        for (original, copy) in self.held.remove(name).unwrap_or_default() {
            copy_tree(&original, &copy);
        }
        Ok(())
    }

    fn coldplug(&mut self) -> Report {
        let (aliases, modules) = image();
        let sys = self.sys.clone();
        coldplug::run(&sys, &aliases, &modules, |m| self.load(&m.name)).unwrap()
    }
}

fn keys<V>(map: &BTreeMap<String, V>) -> Vec<&str> {
    map.keys().map(String::as_str).collect()
}

#[test]
fn a_virtio_vm_gets_its_disk_and_nic_drivers() {
    let mut vm = Machine::boot("vm-virtio");
    let report = vm.coldplug();
    assert_eq!(
        vm.loaded,
        [
            // Round 1: the PCI functions, all virtio.
            "virtio_ring",
            "virtio",
            "virtio_pci_modern_dev",
            "virtio_pci_legacy_dev",
            "virtio_pci",
            // Round 2: the virtio devices virtio_pci added.
            "virtio_blk",
            "failover",
            "net_failover",
            "virtio_net",
        ]
    );
    assert_eq!(report.loaded, vm.loaded);
    assert_eq!(report.rounds, 3, "the third round finds nothing new");
    assert!(report.failed.is_empty());
    assert!(report.unresolved.is_empty());
    // The balloon, vsock and entropy devices' drivers are not in the image.
    assert_eq!(
        keys(&report.not_carried),
        ["virtio_balloon", "virtio_rng", "vmw_vsock_virtio_transport"]
    );
    assert_eq!(
        report.not_carried["virtio_rng"],
        ["/devices/pci0000:00/0000:00:05.0/virtio4"]
    );
    assert_eq!(report.devices, 27);
    assert_eq!(
        report.matched, 10,
        "five PCI functions, five virtio devices"
    );
}

#[test]
fn the_same_image_drives_a_vm_with_another_nic() {
    let mut vm = Machine::boot("vm-vmxnet3");
    let report = vm.coldplug();
    assert_eq!(
        vm.loaded,
        [
            // Round 1: pvpanic (ACPI), then the PCI functions in address
            // order: the NIC at 00:02.0, the disk's virtio at 00:03.0.
            "pvpanic",
            "pvpanic_mmio",
            "vmxnet3",
            "virtio_ring",
            "virtio",
            "virtio_pci_modern_dev",
            "virtio_pci_legacy_dev",
            "virtio_pci",
            // Round 2.
            "virtio_blk",
        ]
    );
    assert_eq!(keys(&report.not_carried), ["button"]);
    assert_eq!(
        report.not_carried["button"],
        ["/devices/LNXSYSTM:00/LNXPWRBN:00"]
    );
    assert!(!vm.loaded.iter().any(|m| m == "virtio_net"));
}

#[test]
fn a_gpu_node_loads_its_nic_and_leaves_the_gpu_alone() {
    let mut node = Machine::boot("gpu-node");
    let report = node.coldplug();
    // The ConnectX-7, then (round 2) its auxiliary devices: the Ethernet
    // one is mlx5_core's own; the RDMA one wants mlx5_ib, not carried.
    assert_eq!(node.loaded, ["pci_hyperv_intf", "mlxfw", "mlx5_core"]);
    assert_eq!(report.rounds, 2);
    assert_eq!(keys(&report.not_carried), ["button", "mlx5_ib"]);
    assert_eq!(
        report.not_carried["mlx5_ib"],
        ["/devices/pci0000:15/0000:15:01.0/0000:16:00.0/mlx5_core.rdma.0"]
    );
    // The H100, the NVMe drive (nvme is built into this kernel, and its
    // aliases are not in modules.alias) and the TPM match nothing here.
    let (aliases, _) = image();
    let gpu = sysfs::devices(&node.sys)
        .unwrap()
        .into_iter()
        .find(|d| d.devpath.ends_with("0000:17:00.0"))
        .unwrap();
    assert!(aliases.modules_for(&gpu.modalias).is_empty());
}

#[test]
fn a_missing_module_list_or_alias_file_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let err = Aliases::open(dir.path(), KVER).unwrap_err();
    assert!(err.to_string().contains("depmod"), "{err}");
    let vm = Machine::boot("vm-virtio");
    let (aliases, modules) = image();
    let err = coldplug::run(&dir.path().join("nosys"), &aliases, &modules, |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("is sysfs mounted"), "{err}");
    // A loader that fails is reported per module and nothing is retried.
    let mut calls = 0;
    let report = coldplug::run(&vm.sys, &aliases, &modules, |_| {
        calls += 1;
        Err(io::Error::from_raw_os_error(8))
    })
    .unwrap();
    assert_eq!(report.failed.len(), 5, "virtio_pci and its dependencies");
    assert_eq!(calls, 5);
    assert!(report.loaded.is_empty());
}
