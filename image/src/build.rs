//! Building an image: what goes into the ramdisk, in what order.
//!
//! The ramdisk holds `/init` (a two-line script that execs `bcd init`), the
//! static `bcd` as `/bin/bcd`, busybox with a link for each of its applets
//! (`sh`, `ip`, `udhcpc`, `wget`, ...), the DHCP event script `bcd init`
//! hands to `udhcpc`, dynamic programs with their libraries (`kexec`, for
//! `boot.kexec`), the kernel modules asked for with their dependencies and
//! a load list, the drivers it carries for `bcd init` to load when a
//! device asks for them (with the kernel's `modules.alias` lines for every
//! carried module), extra files, and `/dev/console`, which the kernel needs
//! before `/init` runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use initramfs::{Archive, Compression, Node};
use ring::signature::Ed25519KeyPair;

use crate::kernel::{self, KernelError};
use crate::{
    FORMAT, Fetch, INITRD_FILE, IPXE_FILE, ImageId, KERNEL_FILE, MANIFEST_FILE, Manifest, Part,
    SignedManifest,
};

/// `/init`: the kernel runs it as PID 1; it becomes `bcd init`.
pub const INIT_SCRIPT: &str = "#!/bin/sh\nexec /bin/bcd init\n";

/// The event script `bcd init` gives busybox `udhcpc`: configures the
/// interface, the default route and DNS, and tells init the lease is there.
pub const DHCP_SCRIPT: &str = r#"#!/bin/sh
# udhcpc event script of the bcd ramdisk (bcd init runs udhcpc with it).
# udhcpc sets $interface, $ip, $mask, $router and $dns.
case "$1" in
deconfig)
	ip -4 addr flush dev "$interface"
	ip link set "$interface" up
	rm -f "/run/bcd/net/$interface"
	;;
bound|renew)
	ip -4 addr flush dev "$interface"
	ip -4 addr add "$ip/${mask:-24}" dev "$interface"
	ip link set "$interface" up
	for r in $router; do
		ip -4 route replace default via "$r" dev "$interface"
		break
	done
	if [ -n "$dns" ]; then
		: > /etc/resolv.conf.new
		for d in $dns; do echo "nameserver $d" >> /etc/resolv.conf.new; done
		mv /etc/resolv.conf.new /etc/resolv.conf
	fi
	mkdir -p /run/bcd/net
	echo "$ip" > "/run/bcd/net/$interface"
	;;
esac
exit 0
"#;

/// What an image is built from.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    /// A `.deb`, an unpacked kernel package, or a vmlinuz file.
    pub kernel: PathBuf,
    /// Modules root for a plain vmlinuz file (default `/`).
    pub modules_root: Option<PathBuf>,
    /// The static musl bcd.
    pub bcd: PathBuf,
    /// A static busybox.
    pub busybox: PathBuf,
    /// Dynamic programs to carry with their libraries, as paths on this
    /// machine (they keep their path in the image).
    pub programs: Vec<PathBuf>,
    /// Kernel modules to load at boot, by name; dependencies are added.
    pub modules: Vec<String>,
    /// Drivers to carry without loading them at boot: `bcd init` loads
    /// each when a device's modalias asks for it (one image, machines
    /// with different NICs). Dependencies are added.
    pub carry: Vec<String>,
    /// Extra files: a file on this machine and its absolute path in the
    /// image.
    pub files: Vec<(PathBuf, PathBuf)>,
    pub cmdline: String,
    pub compression: Compression,
}

/// A built image, in memory.
#[derive(Debug, Clone)]
pub struct Built {
    pub id: ImageId,
    pub manifest: Manifest,
    pub signed: SignedManifest,
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
    /// The initrd before compression, for reports.
    pub initrd_unpacked: u64,
    /// Entries of the initrd's archive.
    pub entries: usize,
    /// The script that loads the files beside it.
    pub ipxe: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{0} is not a static program (it needs an interpreter or libraries): build bcd with \
         cargo build -p bcd --release --target x86_64-unknown-linux-musl"
    )]
    NotStatic(PathBuf),
    #[error(
        "{0} has no `bcd init` (an older build?): rebuild it with cargo build -p bcd --release \
         --target x86_64-unknown-linux-musl"
    )]
    NoInit(PathBuf),
    #[error("cannot run {path} {args}: {detail}")]
    Run {
        path: PathBuf,
        args: String,
        detail: String,
    },
    #[error("cannot add {path} to the ramdisk")]
    Elf {
        path: PathBuf,
        #[source]
        source: Box<initramfs::ElfError>,
    },
    #[error("cannot add the kernel modules")]
    Modules(#[source] Box<initramfs::ModuleError>),
    #[error(
        "the kernel's modules.alias is needed to carry drivers (run depmod on its modules folder)"
    )]
    Aliases(#[source] bcd_udev::AliasError),
    #[error("cannot add {path} to the ramdisk")]
    Archive {
        path: String,
        #[source]
        source: initramfs::BuildError,
    },
    #[error("the image path {0} of an extra file must be absolute")]
    RelativeDest(PathBuf),
    #[error("cannot compress the ramdisk")]
    Compress(#[source] std::io::Error),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Fs(#[from] bcd_sys::fs::FsError),
}

/// Steps of a build, for a progress display.
pub const STEPS: usize = 8;

/// Told about each step as it starts.
pub trait Progress {
    fn step(&mut self, index: usize, what: &str);
}

impl<F: FnMut(usize, &str)> Progress for F {
    fn step(&mut self, index: usize, what: &str) {
        self(index, what)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, BuildError> {
    std::fs::read(path).map_err(|source| BuildError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn output(path: &Path, args: &[&str]) -> Result<String, BuildError> {
    let err = |detail: String| BuildError::Run {
        path: path.to_path_buf(),
        args: args.join(" "),
        detail,
    };
    let out = Command::new(path)
        .args(args)
        .output()
        .map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    String::from_utf8(out.stdout).map_err(|_| err("output is not UTF-8".into()))
}

fn add(archive: &mut Archive, path: &str, perm: u32, node: Node) -> Result<(), BuildError> {
    archive
        .add(path, perm, node)
        .map_err(|source| BuildError::Archive {
            path: path.to_string(),
            source,
        })
}

/// Builds the image and signs its manifest with `key`.
pub fn build(
    spec: &Spec,
    key: &Ed25519KeyPair,
    progress: &mut dyn Progress,
) -> Result<Built, BuildError> {
    let root = Path::new("/");
    progress.step(0, "reading the kernel");
    let kernel = kernel::open(&spec.kernel, spec.modules_root.as_deref())?;

    progress.step(1, "adding bcd");
    let mut archive = Archive::new();
    for dir in [
        "proc", "sys", "dev", "run", "tmp", "etc", "etc/bcd", "var", "var/lib", "root", "bin",
        "sbin", "usr", "usr/bin", "usr/sbin",
    ] {
        add(&mut archive, dir, 0o755, Node::Dir)?;
    }
    add(
        &mut archive,
        "dev/console",
        0o600,
        Node::CharDev { major: 5, minor: 1 },
    )?;
    add(&mut archive, "init", 0o755, Node::File(INIT_SCRIPT.into()))?;
    add(
        &mut archive,
        "etc/bcd/udhcpc.script",
        0o755,
        Node::File(DHCP_SCRIPT.into()),
    )?;
    let closure =
        initramfs::elf::closure(root, &absolute(&spec.bcd)).map_err(|source| BuildError::Elf {
            path: spec.bcd.clone(),
            source: Box::new(source),
        })?;
    if !closure.is_empty() {
        return Err(BuildError::NotStatic(spec.bcd.clone()));
    }
    // A bcd without `init` would leave the kernel without a PID 1.
    output(&spec.bcd, &["init", "--help"]).map_err(|_| BuildError::NoInit(spec.bcd.clone()))?;
    let said = output(&spec.bcd, &["version"])?;
    // The first line: later ones list what the build has (TPM backends).
    let bcd_version = said
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .trim_start_matches("bcd ")
        .to_string();
    add(&mut archive, "bin/bcd", 0o755, Node::File(read(&spec.bcd)?))?;

    progress.step(2, "adding busybox");
    add(
        &mut archive,
        "bin/busybox",
        0o755,
        Node::File(read(&spec.busybox)?),
    )?;
    let applets = output(&spec.busybox, &["--list"])?;
    let mut applets: Vec<&str> = applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && !a.contains('/') && *a != "busybox")
        .collect();
    applets.sort_unstable();
    for a in applets {
        let path = format!("bin/{a}");
        if !archive.contains(&path) {
            add(&mut archive, &path, 0o777, Node::Symlink("busybox".into()))?;
        }
    }

    progress.step(3, "adding programs and their libraries");
    for p in &spec.programs {
        initramfs::add_program(&mut archive, root, &absolute(p)).map_err(|source| {
            BuildError::Elf {
                path: p.clone(),
                source: Box::new(source),
            }
        })?;
    }

    progress.step(4, "adding kernel modules");
    let plan = if spec.modules.is_empty() && spec.carry.is_empty() {
        initramfs::LoadPlan::default()
    } else {
        add_modules(&mut archive, &kernel, spec)?
    };

    progress.step(5, "adding extra files");
    for (src, dest) in &spec.files {
        if !dest.is_absolute() {
            return Err(BuildError::RelativeDest(dest.clone()));
        }
        let perm = std::fs::metadata(src)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777)
            .map_err(|source| BuildError::Read {
                path: src.clone(),
                source,
            })?;
        let rel = dest.strip_prefix("/").unwrap_or(dest).display().to_string();
        add(&mut archive, &rel, perm, Node::File(read(src)?))?;
    }

    progress.step(6, "compressing the ramdisk");
    let entries = archive.len();
    let unpacked = archive.to_bytes();
    let initrd = spec
        .compression
        .compress(&unpacked)
        .map_err(BuildError::Compress)?;

    progress.step(7, "signing the manifest");
    let manifest = Manifest {
        format: FORMAT,
        name: spec.name.clone(),
        kernel_version: kernel.release.clone(),
        bcd_version,
        cmdline: spec.cmdline.clone(),
        kernel: Part::of(KERNEL_FILE, &kernel.image),
        initrd: Part::of(INITRD_FILE, &initrd),
        modules: plan.modules.iter().map(|m| m.name.clone()).collect(),
    };
    let signed = crate::sign(&manifest, key);
    let id = signed.id().expect("a manifest just signed decodes");
    let ipxe = crate::ipxe_script(&manifest, &id, &Fetch::Beside, "");
    Ok(Built {
        id,
        manifest,
        signed,
        kernel: kernel.image,
        initrd,
        initrd_unpacked: unpacked.len() as u64,
        entries,
        ipxe,
    })
}

/// The modules to load at boot and the drivers to carry, with their
/// dependencies, `modules.dep`, `modules.order` (boot only) and the
/// `modules.alias` lines of every module carried. Returns every module
/// the image holds.
fn add_modules(
    archive: &mut Archive,
    kernel: &kernel::Kernel,
    spec: &Spec,
) -> Result<initramfs::LoadPlan, BuildError> {
    let modules_err = |e| BuildError::Modules(Box::new(e));
    let modules =
        initramfs::Modules::open(&kernel.modules_root, &kernel.release).map_err(modules_err)?;
    let at_boot = modules.resolve(&spec.modules).map_err(modules_err)?;
    let all: Vec<&str> = spec
        .modules
        .iter()
        .chain(&spec.carry)
        .map(String::as_str)
        .collect();
    let carried = modules.resolve(&all).map_err(modules_err)?;
    modules
        .add_carried(archive, &kernel.modules_root, &carried, &at_boot)
        .map_err(modules_err)?;
    let mut aliases = match bcd_udev::Aliases::open(&kernel.modules_root, &kernel.release) {
        Ok(a) => a,
        // Without drivers to carry, an image needs no alias list.
        Err(bcd_udev::AliasError::Missing { .. }) if spec.carry.is_empty() => return Ok(carried),
        Err(e) => return Err(BuildError::Aliases(e)),
    };
    let names: std::collections::BTreeSet<&str> =
        carried.modules.iter().map(|m| m.name.as_str()).collect();
    aliases.retain(|a| names.contains(a.module.replace('-', "_").as_str()));
    let path = format!("lib/modules/{}/modules.alias", kernel.release);
    add(
        archive,
        &path,
        0o644,
        Node::File(aliases.to_text().into_bytes()),
    )?;
    Ok(carried)
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

impl Built {
    /// Writes the image's four files into `dir` (created if missing).
    pub fn write(&self, dir: &Path) -> Result<(), BuildError> {
        let err = |path: PathBuf| move |source| BuildError::Write { path, source };
        std::fs::create_dir_all(dir).map_err(err(dir.to_path_buf()))?;
        for (name, bytes) in [
            (KERNEL_FILE, &self.kernel[..]),
            (INITRD_FILE, &self.initrd[..]),
            (MANIFEST_FILE, &self.signed.to_json()[..]),
            (IPXE_FILE, self.ipxe.as_bytes()),
        ] {
            let path = dir.join(name);
            bcd_sys::fs::atomic_write(&path, bytes, 0o644)?;
        }
        Ok(())
    }
}

/// The files `images register` uploads from a built image's folder. The
/// server verifies them.
#[derive(Debug, Clone)]
pub struct Files {
    /// `manifest.json`, the signed manifest as written.
    pub manifest: Vec<u8>,
    pub kernel: Vec<u8>,
    pub initrd: Vec<u8>,
}

pub fn load(dir: &Path) -> Result<Files, BuildError> {
    Ok(Files {
        manifest: read(&dir.join(MANIFEST_FILE))?,
        kernel: read(&dir.join(KERNEL_FILE))?,
        initrd: read(&dir.join(INITRD_FILE))?,
    })
}
