//! A machine made of files for `--host-root`: the boot id, the host name,
//! NVIDIA GPUs in sysfs with their driver's `/proc` information, and their
//! device nodes (real character devices: the tests run as root).

use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct HostTree {
    pub root: PathBuf,
}

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
    std::fs::write(p, content).expect("write");
}

fn mknod(path: &Path, major: u32, minor: u32) {
    let _ = std::fs::remove_file(path);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(major, minor),
    )
    .unwrap_or_else(|e| panic!("mknod {} (the tests run as root): {e}", path.display()));
}

impl HostTree {
    /// A machine named `hostname` with no GPU yet.
    pub fn new(root: &Path, hostname: &str) -> HostTree {
        write(
            root,
            "proc/sys/kernel/random/boot_id",
            "3f1c2b4a-0000-4000-8000-000000000001\n",
        );
        write(root, "proc/sys/kernel/hostname", &format!("{hostname}\n"));
        std::fs::create_dir_all(root.join("dev")).expect("dev");
        mknod(&root.join("dev/nvidiactl"), 195, 255);
        HostTree {
            root: root.to_path_buf(),
        }
    }

    pub fn boot_id(&self) -> String {
        std::fs::read_to_string(self.root.join("proc/sys/kernel/random/boot_id"))
            .expect("boot id")
            .trim()
            .to_string()
    }

    /// The UUID a GPU of this tree gets for a minor number.
    pub fn uuid(minor: u32) -> String {
        format!("GPU-{minor:08x}-1111-2222-3333-444444444444")
    }

    /// An NVIDIA GPU at `addr` with the driver loaded: `/dev/nvidia<minor>`,
    /// and a function reset file.
    pub fn gpu(&self, addr: &str, minor: u32) {
        let dev = format!("sys/bus/pci/devices/{addr}");
        write(&self.root, &format!("{dev}/vendor"), "0x10de\n");
        write(&self.root, &format!("{dev}/device"), "0x2335\n");
        write(&self.root, &format!("{dev}/class"), "0x030200\n");
        write(&self.root, &format!("{dev}/reset"), "");
        write(
            &self.root,
            &format!("proc/driver/nvidia/gpus/{addr}/information"),
            &format!(
                "Model: \t\t NVIDIA H200\nGPU UUID: \t {}\nDevice Minor: \t {minor}\n",
                Self::uuid(minor)
            ),
        );
        mknod(&self.root.join(format!("dev/nvidia{minor}")), 195, minor);
    }

    /// The GPU at `addr` is gone (its device node too).
    pub fn remove_gpu(&self, addr: &str, minor: u32) {
        let _ = std::fs::remove_dir_all(self.root.join("sys/bus/pci/devices").join(addr));
        let _ = std::fs::remove_dir_all(self.root.join("proc/driver/nvidia/gpus").join(addr));
        let _ = std::fs::remove_file(self.root.join(format!("dev/nvidia{minor}")));
    }

    /// What a function reset wrote: "1" after a reset.
    pub fn reset_file(&self, addr: &str) -> String {
        std::fs::read_to_string(self.root.join(format!("sys/bus/pci/devices/{addr}/reset")))
            .unwrap_or_default()
    }
}
