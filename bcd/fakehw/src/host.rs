//! A fake machine: a seeded number of H100-like GPUs with their device
//! nodes, a TPM with a stable endorsement key hash, a load average, and a
//! boot id that changes when the machine reboots or kexecs.

use std::sync::Mutex;

use bcd_agent::hw::{Gpu, Gpus, Host, Power, Tpm, TpmInfo};

#[derive(Debug)]
pub struct FakeHost {
    seed: u64,
    hostname: String,
    boot: Mutex<u64>,
    gpus: FakeGpus,
    tpm: FakeTpm,
    /// Where each kexec is recorded, if anywhere ([`FakeHost::with_kexec_log`]).
    kexec_log: Option<std::path::PathBuf>,
}

#[derive(Debug)]
pub struct FakeGpus {
    gpus: Vec<Gpu>,
}

#[derive(Debug)]
pub struct FakeTpm {
    ek: String,
}

fn hex64(seed: u64, salt: u64) -> String {
    let mut rng = bcd_core::SplitMix64::new(seed ^ salt.rotate_left(17));
    format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64())
}

impl FakeHost {
    /// A machine named `hostname` with `gpu_count` GPUs; the same seed
    /// gives the same machine.
    pub fn new(seed: u64, hostname: impl Into<String>, gpu_count: usize) -> FakeHost {
        let gpus = (0..gpu_count)
            .map(|i| {
                let u = hex64(seed, 100 + i as u64);
                Gpu {
                    pci_address: format!("0000:{:02x}:00.0", 0x17 + i * 0x10),
                    vendor_id: "0x10de".into(),
                    device_id: "0x2330".into(),
                    class: "0x030200".into(),
                    numa_node: Some((i / 4) as i32),
                    uuid: Some(format!(
                        "GPU-{}-{}-{}-{}-{}",
                        &u[0..8],
                        &u[8..12],
                        &u[12..16],
                        &u[16..20],
                        &u[20..32]
                    )),
                    model: Some("NVIDIA H100 80GB HBM3 (fake)".into()),
                    minor: Some(i as u32),
                }
            })
            .collect();
        FakeHost {
            seed,
            hostname: hostname.into(),
            boot: Mutex::new(0),
            gpus: FakeGpus { gpus },
            tpm: FakeTpm {
                ek: hex64(seed, 7) + &hex64(seed, 8),
            },
            kexec_log: None,
        }
    }

    /// Records each kexec as one line appended to `path`, what a real
    /// kexec would load: `kernel=<SHA-256> initrd=<SHA-256, or -> cmdline=<the
    /// rest of the line>`, the hashes of the files as they are when it is
    /// asked for.
    pub fn with_kexec_log(mut self, path: std::path::PathBuf) -> FakeHost {
        self.kexec_log = Some(path);
        self
    }

    fn record_kexec(&self, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()> {
        use std::io::Write;
        let Some(log) = &self.kexec_log else {
            return Ok(());
        };
        let sha = |path: &str| -> std::io::Result<String> {
            let bytes = std::fs::read(path)?;
            Ok(hex::encode(ring::digest::digest(
                &ring::digest::SHA256,
                &bytes,
            )))
        };
        let kernel = sha(kernel)?;
        let initrd = if initrd.is_empty() {
            "-".to_string()
        } else {
            sha(initrd)?
        };
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        writeln!(f, "kernel={kernel} initrd={initrd} cmdline={cmdline}")
    }

    /// The fake machine reboots: the next boot id differs.
    pub fn reboot(&self) {
        *self.boot.lock().expect("boot lock") += 1;
    }
}

impl Host for FakeHost {
    fn boot_id(&self) -> std::io::Result<String> {
        let boot = *self.boot.lock().expect("boot lock");
        let h = hex64(self.seed, 1_000 + boot);
        Ok(format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        ))
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    fn gpus(&self) -> &dyn Gpus {
        &self.gpus
    }

    fn tpm(&self) -> &dyn Tpm {
        &self.tpm
    }

    fn load_average(&self) -> Option<[f64; 3]> {
        let x = (self.seed % 100) as f64 / 100.0;
        Some([x, x / 2.0, x / 4.0])
    }

    /// One locally administered MAC: `02:bc:` and the seed's low 32 bits.
    fn macs(&self) -> Vec<String> {
        let b = (self.seed as u32).to_be_bytes();
        vec![format!(
            "02:bc:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3]
        )]
    }
}

/// A fake reboot or kexec returns at once with a new boot id; the agent
/// starts again in process.
impl Power for FakeHost {
    fn reboot(&self) -> std::io::Result<()> {
        FakeHost::reboot(self);
        Ok(())
    }

    fn kexec(&self, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()> {
        self.record_kexec(kernel, initrd, cmdline)?;
        FakeHost::reboot(self);
        Ok(())
    }
}

/// Reboot and kexec of a machine read from a host tree (a `RealHost` over
/// a directory of files): a fake reboot writes a new boot id into
/// `<root>/proc/sys/kernel/random/boot_id`, so every process reading the
/// tree (the daemon, through the helper that rebooted it) sees a new boot.
#[derive(Debug, Clone)]
pub struct TreePower {
    pub root: std::path::PathBuf,
}

impl TreePower {
    fn new_boot(&self) -> std::io::Result<()> {
        let path = self.root.join("proc/sys/kernel/random/boot_id");
        let boot = format!("{:032x}", rand_u128());
        let id = format!(
            "{}-{}-{}-{}-{}\n",
            &boot[0..8],
            &boot[8..12],
            &boot[12..16],
            &boot[16..20],
            &boot[20..32]
        );
        std::fs::write(path, id)
    }
}

fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        bcd_sys::clock::system_now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let a = h.finish();
    h.write_u64(a);
    (u128::from(a) << 64) | u128::from(h.finish())
}

impl Power for TreePower {
    fn reboot(&self) -> std::io::Result<()> {
        self.new_boot()
    }

    fn kexec(&self, kernel: &str, _initrd: &str, _cmdline: &str) -> std::io::Result<()> {
        // What a real kexec needs first: the kernel is there to load.
        std::fs::metadata(kernel)?;
        self.new_boot()
    }
}

impl Gpus for FakeGpus {
    fn list(&self) -> std::io::Result<Vec<Gpu>> {
        Ok(self.gpus.clone())
    }

    /// The nodes a real driver would create for these GPUs.
    fn cdi_inventory(&self) -> std::io::Result<cdi::nvidia::Inventory> {
        let node = |path: &str, major, minor| cdi::nvidia::Node {
            path: path.into(),
            major,
            minor,
        };
        Ok(cdi::nvidia::Inventory {
            gpus: self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| cdi::nvidia::Gpu {
                    index: i as u32,
                    uuid: g.uuid.clone(),
                    node: node(&format!("/dev/nvidia{i}"), 195, i as u32),
                })
                .collect(),
            control_nodes: vec![
                node("/dev/nvidia-uvm", 509, 0),
                node("/dev/nvidia-uvm-tools", 509, 1),
                node("/dev/nvidiactl", 195, 255),
            ],
            driver_files: vec![],
        })
    }

    fn reset(&self, pci_address: &str) -> std::io::Result<&'static str> {
        if self.gpus.iter().any(|g| g.pci_address == pci_address) {
            Ok("function reset (fake)")
        } else {
            Err(std::io::Error::other(format!(
                "no PCI device {pci_address}"
            )))
        }
    }
}

impl Tpm for FakeTpm {
    fn info(&self) -> TpmInfo {
        TpmInfo {
            present: true,
            version_major: Some(2),
            device: Some("/dev/tpmrm0".into()),
            ek_sha256: Some(self.ek.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_machine_and_reboot_changes_boot_id() {
        let a = FakeHost::new(5, "n5", 8);
        let b = FakeHost::new(5, "n5", 8);
        assert_eq!(a.gpus().list().unwrap(), b.gpus().list().unwrap());
        assert_eq!(a.gpus().list().unwrap().len(), 8);
        let before = a.boot_id().unwrap();
        assert_eq!(before, b.boot_id().unwrap());
        a.reboot();
        assert_ne!(a.boot_id().unwrap(), before);
        assert_ne!(FakeHost::new(6, "n6", 8).boot_id().unwrap(), before);
        assert_eq!(FakeHost::new(42, "n42", 0).macs(), ["02:bc:00:00:00:2a"]);
    }
}
