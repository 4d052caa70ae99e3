//! The devices present, from sysfs.
//!
//! Every device the kernel knows is a directory under `/sys/devices`; one
//! that a driver could bind has a `modalias` file, and one bound to a
//! driver has a `driver` link. [`devices`] walks the tree under a sysfs
//! root given as an argument (`/sys`, or a golden tree in tests) without
//! following links, which in sysfs point back up the tree (`subsystem`,
//! `driver`, `firmware_node`, `device`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// How deep the walk goes below `/sys/devices`: deeper than any real
/// topology (a USB device behind hubs behind a PCI bridge is about 15).
pub const MAX_DEPTH: usize = 48;

/// A device that asks for a driver.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Device {
    /// Its path under the sysfs root, as uevents name it:
    /// `/devices/pci0000:00/0000:00:03.0`.
    pub devpath: String,
    /// The contents of its `modalias` file, without the newline.
    pub modalias: String,
    /// The driver bound to it, from its `driver` link.
    pub driver: Option<String>,
}

/// Why the device tree could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the device tree at {path}: is sysfs mounted there?")]
pub struct SysfsError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Every device under `<sys>/devices` with a non-empty `modalias`, sorted
/// by devpath. A directory or file that cannot be read below the top (a
/// device removed during the walk) is passed over.
pub fn devices(sys: &Path) -> Result<Vec<Device>, SysfsError> {
    let top = sys.join("devices");
    let entries = fs::read_dir(&top).map_err(|source| SysfsError {
        path: top.clone(),
        source,
    })?;
    let mut out = Vec::new();
    let mut stack: Vec<(PathBuf, String, usize)> = Vec::new();
    push_children(entries, "/devices", 1, &mut stack);
    while let Some((dir, devpath, depth)) = stack.pop() {
        if let Some(modalias) = read_modalias(&dir) {
            out.push(Device {
                driver: fs::read_link(dir.join("driver")).ok().and_then(|link| {
                    link.file_name()
                        .map(|name| name.to_string_lossy().into_owned())
                }),
                devpath: devpath.clone(),
                modalias,
            });
        }
        if depth < MAX_DEPTH
            && let Ok(entries) = fs::read_dir(&dir)
        {
            push_children(entries, &devpath, depth + 1, &mut stack);
        }
    }
    out.sort();
    Ok(out)
}

/// Pushes the real directories (not links) among `entries`.
fn push_children(
    entries: fs::ReadDir,
    devpath: &str,
    depth: usize,
    stack: &mut Vec<(PathBuf, String, usize)>,
) {
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !kind.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        stack.push((entry.path(), format!("{devpath}/{name}"), depth));
    }
}

fn read_modalias(dir: &Path) -> Option<String> {
    let path = dir.join("modalias");
    // A link named modalias is not the device's own attribute.
    if !fs::symlink_metadata(&path).ok()?.is_file() {
        return None;
    }
    let text = fs::read_to_string(path).ok()?;
    let text = text.trim_end_matches(['\n', '\0']).trim();
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn walks_devices_without_following_links() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path();
        let dev = |path: &str, modalias: Option<&str>| {
            let dir = sys.join(path);
            fs::create_dir_all(&dir).unwrap();
            if let Some(m) = modalias {
                fs::write(dir.join("modalias"), format!("{m}\n")).unwrap();
            }
            dir
        };
        let nic = dev(
            "devices/pci0000:00/0000:00:03.0",
            Some("pci:v00001AF4d00001041sv00001AF4sd00001041bc02sc00i00"),
        );
        dev(
            "devices/pci0000:00/0000:00:03.0/virtio2",
            Some("virtio:d00000001v00001AF4"),
        );
        dev("devices/pci0000:00", None);
        dev("devices/platform/empty", Some(""));
        fs::create_dir_all(sys.join("bus/pci/drivers/virtio-pci")).unwrap();
        symlink("../../../../bus/pci/drivers/virtio-pci", nic.join("driver")).unwrap();
        // A loop through the tree, as sysfs has everywhere.
        symlink("../../../devices", nic.join("subsystem")).unwrap();
        // A modalias that is a link is not the device's.
        let odd = dev("devices/platform/odd", None);
        symlink(
            "../../pci0000:00/0000:00:03.0/modalias",
            odd.join("modalias"),
        )
        .unwrap();

        let found = devices(sys).unwrap();
        assert_eq!(
            found,
            [
                Device {
                    devpath: "/devices/pci0000:00/0000:00:03.0".into(),
                    modalias: "pci:v00001AF4d00001041sv00001AF4sd00001041bc02sc00i00".into(),
                    driver: Some("virtio-pci".into()),
                },
                Device {
                    devpath: "/devices/pci0000:00/0000:00:03.0/virtio2".into(),
                    modalias: "virtio:d00000001v00001AF4".into(),
                    driver: None,
                },
            ]
        );
    }

    #[test]
    fn a_missing_tree_says_so() {
        let root = tempfile::tempdir().unwrap();
        let err = devices(root.path()).unwrap_err();
        assert!(err.to_string().contains("is sysfs mounted"), "{err}");
    }

    #[test]
    fn depth_is_bounded() {
        let root = tempfile::tempdir().unwrap();
        let mut dir = root.path().join("devices");
        for i in 0..MAX_DEPTH + 5 {
            dir = dir.join(format!("d{i}"));
        }
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("modalias"), "deep:x\n").unwrap();
        assert!(devices(root.path()).unwrap().is_empty());
    }
}
