//! Loading the drivers the hardware asks for, from the modules an image
//! carries: what udevd and `modprobe` do at boot, for a ramdisk that has
//! neither.
//!
//! Each round reads the devices present ([`crate::sysfs::devices`]),
//! matches their modaliases against `modules.alias` ([`Aliases`]), keeps
//! the modules the image carries (its `modules.dep`, read by
//! [`initramfs::Modules`], which lists only those) or has built in, and
//! loads what no earlier round tried, dependencies first. Loading a driver
//! can make new devices appear (`virtio_pci` binds a PCI function and adds
//! a `virtio` device that asks for `virtio_net`), so rounds repeat until
//! one has nothing new to load. A module is tried once: a failure is
//! reported, not retried.
//!
//! [`Coldplug`] decides and holds no I/O; [`run`] reads sysfs and calls
//! the loader it is given (`finit_module` in `bcd init`, a fake in tests).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::path::Path;

use initramfs::{Module, ModuleError, Modules};

use crate::alias::Aliases;
use crate::sysfs::{self, Device, SysfsError};

/// Rounds [`run`] makes at most: each is a layer of buses (PCI, then
/// virtio or USB behind it, then what sits on those).
pub const MAX_ROUNDS: usize = 6;

/// One device and the modules its modalias names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    pub devpath: String,
    pub modalias: String,
    /// Every module `modules.alias` names for it, carried or not.
    pub modules: Vec<String>,
}

/// What one round decided.
#[derive(Debug, Default)]
pub struct Round {
    /// Modules to load now, dependencies first, none tried before.
    pub load: Vec<Module>,
    /// Modules asked for that are built into the kernel.
    pub builtin: Vec<String>,
    /// Modules asked for that the image does not carry, with the devices
    /// that asked: a machine this image was not built for.
    pub not_carried: BTreeMap<String, Vec<String>>,
    /// Modules the image carries but whose dependencies its `modules.dep`
    /// cannot resolve: a broken image.
    pub unresolved: Vec<(String, ModuleError)>,
    /// Every device with at least one matching module.
    pub matches: Vec<Match>,
}

/// The decisions across rounds: which modules have been tried.
#[derive(Debug)]
pub struct Coldplug<'a> {
    aliases: &'a Aliases,
    modules: &'a Modules,
    /// Module names already handled (loaded, tried, built in, missing or
    /// unresolvable): never asked for again.
    seen: HashSet<String>,
    /// Paths of modules already handed out for loading.
    tried: HashSet<String>,
}

impl<'a> Coldplug<'a> {
    pub fn new(aliases: &'a Aliases, modules: &'a Modules) -> Coldplug<'a> {
        Coldplug {
            aliases,
            modules,
            seen: HashSet::new(),
            tried: HashSet::new(),
        }
    }

    /// The modules `devices` ask for that no earlier round handled.
    pub fn round(&mut self, devices: &[Device]) -> Round {
        let mut round = Round::default();
        let mut wanted: Vec<String> = Vec::new();
        for device in devices {
            let modules: Vec<String> = self
                .aliases
                .modules_for(&device.modalias)
                .into_iter()
                .map(str::to_owned)
                .collect();
            if modules.is_empty() {
                continue;
            }
            for name in &modules {
                if self.seen.contains(name) {
                    continue;
                }
                if self.modules.path_of(name).is_none() && !self.modules.is_builtin(name) {
                    round
                        .not_carried
                        .entry(name.clone())
                        .or_default()
                        .push(device.devpath.clone());
                } else if !wanted.contains(name) {
                    wanted.push(name.clone());
                }
            }
            round.matches.push(Match {
                devpath: device.devpath.clone(),
                modalias: device.modalias.clone(),
                modules,
            });
        }
        // One name at a time, so that one broken entry keeps no other
        // driver from loading.
        for name in wanted {
            match self.modules.resolve(&[&name]) {
                Ok(plan) => {
                    round.builtin.extend(plan.builtin);
                    for module in plan.modules {
                        if self.tried.insert(module.path.clone()) {
                            round.load.push(module);
                        }
                    }
                }
                Err(error) => round.unresolved.push((name.clone(), error)),
            }
            self.seen.insert(name);
        }
        self.seen.extend(round.not_carried.keys().cloned());
        round
    }
}

/// What [`run`] did.
#[derive(Debug, Default)]
pub struct Report {
    pub rounds: usize,
    /// Modules loaded (or found loaded already), in the order loaded.
    pub loaded: Vec<String>,
    /// Modules whose load failed, with the loader's error.
    pub failed: Vec<(String, io::Error)>,
    pub builtin: BTreeSet<String>,
    /// Modules asked for that the image does not carry, with the devices.
    pub not_carried: BTreeMap<String, Vec<String>>,
    pub unresolved: Vec<(String, ModuleError)>,
    /// Devices with a modalias, in the last round.
    pub devices: usize,
    /// Devices whose modalias named at least one module, in the last round.
    pub matched: usize,
}

/// Loads the drivers for the devices under the sysfs root `sys`, round by
/// round, at most [`MAX_ROUNDS`]. `load` loads one module and returns
/// `Ok` when it is loaded (already loaded included). Fails only when the
/// device tree cannot be read at all.
pub fn run(
    sys: &Path,
    aliases: &Aliases,
    modules: &Modules,
    mut load: impl FnMut(&Module) -> io::Result<()>,
) -> Result<Report, SysfsError> {
    let mut coldplug = Coldplug::new(aliases, modules);
    let mut report = Report::default();
    while report.rounds < MAX_ROUNDS {
        let devices = sysfs::devices(sys)?;
        let round = coldplug.round(&devices);
        report.rounds += 1;
        report.devices = devices.len();
        report.matched = round.matches.len();
        report.builtin.extend(round.builtin);
        for (name, devpaths) in round.not_carried {
            report.not_carried.entry(name).or_default().extend(devpaths);
        }
        report.unresolved.extend(round.unresolved);
        if round.load.is_empty() {
            break;
        }
        for module in round.load {
            match load(&module) {
                Ok(()) => report.loaded.push(module.name),
                Err(error) => report.failed.push((module.name, error)),
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "\
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/net/broken.ko: kernel/drivers/net/absent.ko
";

    const ALIAS: &str = "\
alias pci:v00001AF4d*sv*sd*bc*sc*i* virtio_pci
alias virtio:d00000001v* virtio_net
alias pci:v00008086d0000100Esv*sd*bc*sc*i* e1000
alias pci:v00008086d0000100Esv*sd*bc*sc*i* broken
alias acpi*:PNP0A03:* pci_root
";

    fn device(devpath: &str, modalias: &str) -> Device {
        Device {
            devpath: devpath.into(),
            modalias: modalias.into(),
            driver: None,
        }
    }

    fn names(modules: &[Module]) -> Vec<&str> {
        modules.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn rounds_load_each_module_once_dependencies_first() {
        let aliases = Aliases::parse(ALIAS).unwrap();
        let modules =
            Modules::parse("6.1.0-test", DEP, Some("kernel/drivers/acpi/pci_root.ko\n")).unwrap();
        let mut c = Coldplug::new(&aliases, &modules);
        let pci = [
            device(
                "/devices/LNXSYSTM:00/LNXSYBUS:00/PNP0A03:00",
                "acpi:PNP0A03:",
            ),
            device(
                "/devices/pci0000:00/0000:00:02.0",
                "pci:v00001AF4d00001041sv00001AF4sd00001041bc02sc00i00",
            ),
            device(
                "/devices/pci0000:00/0000:00:03.0",
                "pci:v00001AF4d00001042sv00001AF4sd00001042bc01sc80i00",
            ),
            device(
                "/devices/pci0000:00/0000:00:04.0",
                "pci:v00008086d0000100Esv00008086sd0000001Ebc02sc00i00",
            ),
            device("/devices/system/cpu", "cpu:type:x86,ven0000"),
        ];
        let first = c.round(&pci);
        assert_eq!(names(&first.load), ["virtio", "virtio_ring", "virtio_pci"]);
        assert_eq!(first.builtin, ["pci_root"]);
        assert_eq!(
            first.not_carried,
            BTreeMap::from([(
                "e1000".to_owned(),
                vec!["/devices/pci0000:00/0000:00:04.0".to_owned()]
            )])
        );
        assert_eq!(first.unresolved.len(), 1);
        assert_eq!(first.unresolved[0].0, "broken");
        assert!(matches!(
            first.unresolved[0].1,
            ModuleError::MissingDependency { .. }
        ));
        assert_eq!(first.matches.len(), 4, "all but the CPU");
        assert_eq!(first.matches[3].modules, ["e1000", "broken"]);

        // virtio_pci bound and added a virtio device.
        let mut more = pci.to_vec();
        more.push(device(
            "/devices/pci0000:00/0000:00:02.0/virtio0",
            "virtio:d00000001v00001AF4",
        ));
        let second = c.round(&more);
        assert_eq!(
            names(&second.load),
            ["failover", "net_failover", "virtio_net"]
        );
        assert!(second.not_carried.is_empty(), "reported once");
        assert!(second.unresolved.is_empty(), "reported once");
        assert!(second.builtin.is_empty());

        let third = c.round(&more);
        assert!(third.load.is_empty());
    }
}
