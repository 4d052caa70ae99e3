//! GPUs through NVML (`libnvidia-ml`, loaded at run time): the fields
//! sysfs has, with the UUID, model and minor number from the driver
//! itself. Device nodes and reset stay with sysfs.

use std::path::PathBuf;

use super::sysfs::{SysfsGpus, nvidia_cdi_inventory, sysfs_pci_address};
use super::{Gpu, Gpus};

pub struct NvmlGpus {
    nvml: nvml_wrapper::Nvml,
    sysfs: SysfsGpus,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpus").finish_non_exhaustive()
    }
}

impl NvmlGpus {
    pub fn new(root: impl Into<PathBuf>) -> Result<NvmlGpus, String> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| {
            format!("NVML is not usable here ({e}); is the NVIDIA driver installed?")
        })?;
        Ok(NvmlGpus {
            nvml,
            sysfs: SysfsGpus::new(root),
        })
    }
}

fn io(e: nvml_wrapper::error::NvmlError) -> std::io::Error {
    std::io::Error::other(format!("NVML: {e}"))
}

impl Gpus for NvmlGpus {
    fn list(&self) -> std::io::Result<Vec<Gpu>> {
        let mut gpus = self.sysfs.list()?;
        for i in 0..self.nvml.device_count().map_err(io)? {
            let d = self.nvml.device_by_index(i).map_err(io)?;
            let pci = sysfs_pci_address(&d.pci_info().map_err(io)?.bus_id);
            if let Some(g) = gpus.iter_mut().find(|g| g.pci_address == pci) {
                g.uuid = d.uuid().ok().or(g.uuid.take());
                g.model = d.name().ok().or(g.model.take());
                g.minor = d.minor_number().ok().or(g.minor);
            }
        }
        Ok(gpus)
    }

    fn cdi_inventory(&self) -> std::io::Result<cdi::nvidia::Inventory> {
        nvidia_cdi_inventory(&self.sysfs.root, &self.list()?)
    }

    fn reset(&self, pci_address: &str) -> std::io::Result<&'static str> {
        self.sysfs.reset(pci_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the NVIDIA driver is installed NVML must see every GPU sysfs
    /// sees; elsewhere it must say why it cannot be used.
    #[test]
    fn nvml_lists_what_sysfs_lists_or_says_why_not() {
        match NvmlGpus::new("/") {
            Ok(g) => {
                let sysfs = SysfsGpus::new("/").list().unwrap();
                let nvml = g.list().unwrap();
                assert_eq!(nvml.len(), sysfs.len());
                assert!(
                    nvml.iter()
                        .all(|g| g.uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")))
                );
            }
            Err(e) => assert!(e.contains("NVML is not usable here"), "{e}"),
        }
    }
}
