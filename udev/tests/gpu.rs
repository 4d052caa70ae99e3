//! On a machine with an NVIDIA GPU: the GPU as sysfs shows it, as its
//! uevents announce it, and as the running kernel's modules.alias names
//! its driver. Run as root on such a machine:
//!
//! ```text
//! cargo test -p bcd-udev --test gpu -- --ignored needs_gpu
//! ```
//!
//! A synthetic `change` is all these tests send the GPU: the kernel
//! announces the device again and changes nothing on it.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bcd_udev::{Aliases, Interest, Monitor, Notice, Sender, interest, sysfs};
use tokio::time::{Instant, timeout_at};

/// The NVIDIA GPUs' PCI functions: `(address, path in /sys/bus/pci/devices)`.
fn gpus() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/bus/pci/devices").unwrap().flatten() {
        let read = |attr: &str| {
            std::fs::read_to_string(entry.path().join(attr))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let class = u32::from_str_radix(read("class").trim_start_matches("0x"), 16).unwrap_or(0);
        if read("vendor") == "0x10de" && bcd_udev::filter::is_gpu_class(class) {
            out.push((
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            ));
        }
    }
    assert!(
        !out.is_empty(),
        "no NVIDIA GPU in /sys/bus/pci/devices: run these tests on a GPU machine"
    );
    out
}

fn attr(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name))
        .unwrap()
        .trim()
        .to_owned()
}

fn driver(dir: &Path) -> Option<String> {
    std::fs::read_link(dir.join("driver"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
}

#[test]
#[ignore = "needs an NVIDIA GPU: cargo test -p bcd-udev --test gpu -- --ignored needs_gpu"]
fn needs_gpu_sysfs_lists_every_gpu_with_its_modalias_and_driver() {
    let devices = sysfs::devices(Path::new("/sys")).unwrap();
    for (address, link) in gpus() {
        let real = std::fs::canonicalize(&link).unwrap();
        let devpath = real.to_str().unwrap().trim_start_matches("/sys").to_owned();
        let device = devices
            .iter()
            .find(|d| d.devpath == devpath)
            .unwrap_or_else(|| panic!("{address} ({devpath}) not found by the walk"));
        assert_eq!(device.modalias, attr(&real, "modalias"));
        assert!(
            device.modalias.starts_with("pci:v000010DEd"),
            "{}",
            device.modalias
        );
        assert_eq!(device.driver, driver(&real), "{address}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and root: cargo test -p bcd-udev --test gpu -- --ignored needs_gpu"]
fn needs_gpu_a_change_on_a_gpu_reaches_the_monitor_as_a_gpu_event() {
    let (address, dir) = gpus().remove(0);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut monitor = Monitor::kernel().unwrap();
            let uuid = format!("{:08x}-0000-4000-8000-000000000001", std::process::id());
            std::fs::write(dir.join("uevent"), format!("change {uuid}"))
                .unwrap_or_else(|e| panic!("cannot write {address}'s uevent ({e}): run as root"));
            let deadline = Instant::now() + Duration::from_secs(5);
            let event = loop {
                match timeout_at(deadline, monitor.next()).await {
                    Ok(Ok(Notice::Event { message, sender }))
                        if message.uevent().get("SYNTH_UUID") == Some(uuid.as_str()) =>
                    {
                        assert_eq!(sender, Sender::Kernel);
                        break message.into_uevent();
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("{e}"),
                    Err(_) => panic!("no uevent for {address} within 5 s"),
                }
            };
            let Some(Interest::Gpu(gpu)) = interest(&event) else {
                panic!("the GPU's own uevent is of no interest: {event:?}");
            };
            assert_eq!(gpu.slot, address);
            assert_eq!(
                format!("0x{:04x}", gpu.device),
                attr(&dir, "device"),
                "device id"
            );
            assert_eq!(format!("0x{:06x}", gpu.class), attr(&dir, "class"));
            assert_eq!(gpu.driver, driver(&dir));
            assert_eq!(
                gpu.modalias.as_deref(),
                Some(attr(&dir, "modalias").as_str())
            );
        });
}

#[test]
#[ignore = "needs an NVIDIA GPU and the running kernel's modules: cargo test -p bcd-udev --test gpu -- --ignored needs_gpu"]
fn needs_gpu_the_running_kernel_names_the_gpu_driver_as_modprobe_does() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();
    let aliases = Aliases::open(Path::new("/"), release)
        .unwrap_or_else(|e| panic!("{e} (is this kernel's module tree installed?)"));
    for (address, dir) in gpus() {
        let modalias = attr(&dir, "modalias");
        let ours: BTreeSet<String> = aliases
            .modules_for(&modalias)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let out = Command::new("modprobe")
            .args(["-R", "--", &modalias])
            .output()
            .unwrap_or_else(|e| panic!("cannot run modprobe ({e}): apt-get install kmod"));
        let theirs: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        // modprobe.d aliases and built-in drivers come on top of ours.
        assert!(ours.is_subset(&theirs), "{address}: {ours:?} vs {theirs:?}");
        if let Some(bound) = driver(&dir) {
            let bound = bound.replace('-', "_");
            assert!(
                theirs.contains(&bound) || !ours.is_empty(),
                "{address}: bound to {bound}, which modprobe does not name"
            );
        }
    }
}
