//! Where the kernel and its modules come from: a `vmlinuz` file with a
//! modules root, an unpacked kernel package, or a Debian package file
//! (unpacked with `dpkg-deb -x` and given a `modules.dep` with `depmod
//! -b`, since the package ships none).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The x86 boot protocol's header: `HdrS` at 0x202, and at 0x20e the
/// offset (minus 0x200) of the NUL-terminated version string.
const HDRS_AT: usize = 0x202;
const VERSION_PTR_AT: usize = 0x20e;
const SETUP_BASE: usize = 0x200;

/// The release (`uname -r`) of an x86 bzImage, from its header: the first
/// word of the version string.
pub fn bzimage_release(image: &[u8]) -> Option<String> {
    if image.get(HDRS_AT..HDRS_AT + 4)? != b"HdrS" {
        return None;
    }
    let ptr = u16::from_le_bytes([*image.get(VERSION_PTR_AT)?, *image.get(VERSION_PTR_AT + 1)?]);
    let start = SETUP_BASE.checked_add(ptr as usize)?;
    let rest = image.get(start..)?;
    let end = rest.iter().take(256).position(|&b| b == 0)?;
    let version = std::str::from_utf8(&rest[..end]).ok()?;
    let release = version.split_whitespace().next()?;
    (!release.is_empty()).then(|| release.to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{0} is not an x86 bzImage (no HdrS header with a version): pass a vmlinuz file, an unpacked kernel package or a .deb"
    )]
    NotBzImage(PathBuf),
    #[error(
        "{dir} holds no boot/vmlinuz-*: pass a kernel package (.deb), its unpacked folder, or a vmlinuz file"
    )]
    NoKernel { dir: PathBuf },
    #[error(
        "{dir} holds several kernels ({found}): pass the vmlinuz file itself with --modules-root"
    )]
    SeveralKernels { dir: PathBuf, found: String },
    #[error("{tool} failed on {path}: {detail} (Debian: apt-get install {package})")]
    Tool {
        tool: &'static str,
        package: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("cannot make a temporary folder")]
    Temp(#[source] std::io::Error),
}

/// A kernel ready to go into an image.
#[derive(Debug)]
pub struct Kernel {
    pub image: Vec<u8>,
    pub release: String,
    /// The root under which `lib/modules/<release>` lies.
    pub modules_root: PathBuf,
    /// Keeps an unpacked package alive while the image is built.
    _unpacked: Option<tempfile::TempDir>,
}

fn read(path: &Path) -> Result<Vec<u8>, KernelError> {
    std::fs::read(path).map_err(|source| KernelError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn run(
    tool: &'static str,
    package: &'static str,
    path: &Path,
    args: &[&std::ffi::OsStr],
) -> Result<(), KernelError> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| KernelError::Tool {
            tool,
            package,
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(KernelError::Tool {
            tool,
            package,
            path: path.to_path_buf(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Opens a kernel from `path`: a `.deb`, a folder holding `boot/vmlinuz-*`
/// (an unpacked package or a sysroot), or a vmlinuz file whose modules are
/// under `modules_root` (default `/`).
pub fn open(path: &Path, modules_root: Option<&Path>) -> Result<Kernel, KernelError> {
    if path.is_dir() {
        return open_dir(path, None);
    }
    if path.extension().is_some_and(|e| e == "deb") {
        let dir = tempfile::Builder::new()
            .prefix("bc-kernel-")
            .tempdir()
            .map_err(KernelError::Temp)?;
        run(
            "dpkg-deb",
            "dpkg",
            path,
            &["-x".as_ref(), path.as_os_str(), dir.path().as_os_str()],
        )?;
        let path = dir.path().to_path_buf();
        return open_dir(&path, Some(dir));
    }
    let image = read(path)?;
    let release =
        bzimage_release(&image).ok_or_else(|| KernelError::NotBzImage(path.to_path_buf()))?;
    Ok(Kernel {
        image,
        release,
        modules_root: modules_root.unwrap_or(Path::new("/")).to_path_buf(),
        _unpacked: None,
    })
}

fn open_dir(dir: &Path, unpacked: Option<tempfile::TempDir>) -> Result<Kernel, KernelError> {
    let boot = dir.join("boot");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&boot)
        .map_err(|_| KernelError::NoKernel {
            dir: dir.to_path_buf(),
        })?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .collect();
    found.sort();
    let vmlinuz = match found.as_slice() {
        [] => {
            return Err(KernelError::NoKernel {
                dir: dir.to_path_buf(),
            });
        }
        [one] => one.clone(),
        many => {
            return Err(KernelError::SeveralKernels {
                dir: dir.to_path_buf(),
                found: many
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    };
    let image = read(&vmlinuz)?;
    let release =
        bzimage_release(&image).ok_or_else(|| KernelError::NotBzImage(vmlinuz.clone()))?;
    let modules = dir.join("lib/modules").join(&release);
    if modules.is_dir() && !modules.join("modules.dep").exists() {
        run(
            "depmod",
            "kmod",
            &modules,
            &["-b".as_ref(), dir.as_os_str(), release.as_ref()],
        )?;
    }
    Ok(Kernel {
        image,
        release,
        modules_root: dir.to_path_buf(),
        _unpacked: unpacked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bzimage(version: &str) -> Vec<u8> {
        let mut img = vec![0u8; 0x4000];
        img[HDRS_AT..HDRS_AT + 4].copy_from_slice(b"HdrS");
        let ptr: u16 = 0x3000;
        img[VERSION_PTR_AT..VERSION_PTR_AT + 2].copy_from_slice(&ptr.to_le_bytes());
        let at = SETUP_BASE + ptr as usize;
        img[at..at + version.len()].copy_from_slice(version.as_bytes());
        img
    }

    #[test]
    fn reads_the_release_from_the_header() {
        assert_eq!(
            bzimage_release(&bzimage(
                "6.1.0-57-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP"
            )),
            Some("6.1.0-57-cloud-amd64".into())
        );
        assert_eq!(bzimage_release(&[0u8; 0x300]), None);
        let mut no_nul = bzimage("x");
        no_nul.truncate(SETUP_BASE + 0x3000 + 1);
        assert_eq!(bzimage_release(&no_nul), None);
    }

    #[test]
    fn a_folder_without_a_kernel_says_what_to_pass() {
        let d = tempfile::tempdir().unwrap();
        let e = open(d.path(), None).unwrap_err().to_string();
        assert!(e.contains("holds no boot/vmlinuz-*"), "{e}");
        std::fs::create_dir(d.path().join("boot")).unwrap();
        std::fs::write(
            d.path().join("boot/vmlinuz-6.1.0-test"),
            bzimage("6.1.0-test #1"),
        )
        .unwrap();
        let k = open(d.path(), None).unwrap();
        assert_eq!(k.release, "6.1.0-test");
        let e = open(&d.path().join("boot/missing"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
    }

    proptest! {
        #[test]
        fn any_bytes_are_read_without_panicking(mut head in proptest::collection::vec(any::<u8>(), 0..0x400), ptr in any::<u16>()) {
            let _ = bzimage_release(&head);
            if head.len() >= 0x210 {
                head[HDRS_AT..HDRS_AT + 4].copy_from_slice(b"HdrS");
                head[VERSION_PTR_AT..VERSION_PTR_AT + 2].copy_from_slice(&ptr.to_le_bytes());
                let _ = bzimage_release(&head);
            }
        }
    }
}
