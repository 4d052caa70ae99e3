//! `bcd init`: PID 1 of a netbooted ramdisk.
//!
//! The image's `/init` execs `bcd init`, which mounts `/proc`, `/sys`,
//! `/dev` and `/run`, loads the modules the image lists
//! (`/lib/modules/<release>/modules.order`), then, as the ramdisk's device
//! manager, the drivers its devices ask for (each device's modalias
//! against the image's `modules.alias`, from the modules it carries),
//! names the host, runs busybox
//! `udhcpc` on the Ethernet interfaces with our event script
//! (`/etc/bcd/udhcpc.script`), reads its settings from the kernel command
//! line ([`cmdline`]), opens the data directory where the identity lives
//! ([`IdentityStore`]), joins when there is no identity yet (`bcd join
//! --ramdisk`: certificates of at most 2 hours), and then runs `bcd
//! supervise -- node`, which restarts the daemon after 5 s when it dies.
//!
//! PID 1 itself does nothing that can fail for good: every child it starts
//! (DHCP clients, the join, the supervisor) is started again when it dies,
//! every process that ends up re-parented to it is reaped, and it never
//! exits, so no fault of the daemon panics the kernel.
//!
//! The journal always lives in tmpfs: every boot starts a new one (the
//! spec's journal loss). The identity survives a reboot only where the
//! [`IdentityStore`] keeps it: on a state partition found by label
//! (`bcd.state=LABEL`), where the journal is a link into `/run`; a ramdisk
//! without one joins as a new node at every boot.

pub mod cmdline;
pub mod label;

use std::collections::HashMap;
use std::convert::Infallible;
use std::os::unix::fs::{DirBuilderExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::mount::{MountFlags, mount};
use tracing::{error, info, warn};

use crate::identity::{self, JOURNAL};

/// Wait before starting a child that died, the daemon's supervisor
/// included.
pub const RESTART_DELAY: Duration = Duration::from_secs(5);
/// Where the data directory is in the ramdisk.
pub const DATA_DIR: &str = "/var/lib/bcd";
/// The journal's home: tmpfs.
pub const VOLATILE_DIR: &str = "/run/bcd/volatile";
/// The DHCP event script writes `<iface>` here when it has an address.
pub const NET_DIR: &str = "/run/bcd/net";
/// The image's udhcpc event script.
pub const DHCP_SCRIPT: &str = "/etc/bcd/udhcpc.script";
/// How long the network gets before the node starts anyway (the daemon
/// redials with back-off).
const NETWORK_WAIT: Duration = Duration::from_secs(30);
/// How long network interfaces get to appear after the modules load.
const IFACE_WAIT: Duration = Duration::from_secs(10);
/// Between two reaping passes.
const TICK: Duration = Duration::from_millis(50);
/// The exit status with which the daemon says the server refused it for good.
const EXIT_REFUSED: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error(
        "bcd init runs only as PID 1 of a ramdisk (it mounts /proc, /sys and /dev and never \
         exits); on an installed machine run bcd supervise -- node, or the systemd units"
    )]
    NotPid1,
    #[error(
        "no filesystem labelled {label:?} yet (bcd.state={label}): attach the state disk, or \
         make one with mkfs.ext4 -L {label} DEVICE"
    )]
    NoStatePartition { label: String },
    #[error(
        "{count} filesystems are labelled {label:?} ({devices}): bcd.state must name exactly one"
    )]
    AmbiguousState {
        label: String,
        count: usize,
        devices: String,
    },
    #[error("cannot mount {device} on {at}")]
    Mount {
        device: PathBuf,
        at: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> InitError + '_ {
    move |source| InitError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a ramdisk node keeps its identity across reboots. A TPM-backed
/// store is the other implementation this trait is for.
pub trait IdentityStore: std::fmt::Debug {
    /// Finds and prepares what holds the data directory, and returns the
    /// directory, ready for `bcd join` and `bcd node`.
    fn open(&self) -> Result<PathBuf, InitError>;
    /// Whether an identity kept here outlives a reboot.
    fn persistent(&self) -> bool;
}

/// Identity on an ext2/3/4 filesystem found by its label; the journal is a
/// link into tmpfs.
#[derive(Debug, Clone)]
pub struct StatePartition {
    pub label: String,
    /// Roots of sysfs and devtmpfs (`/sys`, `/dev`).
    pub sys: PathBuf,
    pub dev: PathBuf,
    /// Where the partition is mounted: the data directory.
    pub mount_at: PathBuf,
    /// Where the journal really lives.
    pub volatile: PathBuf,
}

impl IdentityStore for StatePartition {
    fn open(&self) -> Result<PathBuf, InitError> {
        let found = label::find(&self.sys, &self.dev, &self.label);
        let device = match found.as_slice() {
            [] => {
                return Err(InitError::NoStatePartition {
                    label: self.label.clone(),
                });
            }
            [one] => one.clone(),
            many => {
                return Err(InitError::AmbiguousState {
                    label: self.label.clone(),
                    count: many.len(),
                    devices: many
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        };
        mkdir(&self.mount_at, 0o700)?;
        mount(
            &device,
            &self.mount_at,
            "ext4",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        )
        .map_err(|e| InitError::Mount {
            device: device.clone(),
            at: self.mount_at.clone(),
            source: e.into(),
        })?;
        info!(device = %device.display(), label = %self.label, "mounted the state partition");
        link_journal(&self.mount_at, &self.volatile)?;
        Ok(self.mount_at.clone())
    }

    fn persistent(&self) -> bool {
        true
    }
}

/// Identity in tmpfs: gone at every reboot, so the node joins again.
#[derive(Debug, Clone)]
pub struct Volatile {
    pub dir: PathBuf,
}

impl IdentityStore for Volatile {
    fn open(&self) -> Result<PathBuf, InitError> {
        mkdir(&self.dir, 0o700)?;
        Ok(self.dir.clone())
    }

    fn persistent(&self) -> bool {
        false
    }
}

fn mkdir(path: &Path, mode: u32) -> Result<(), InitError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io_at(path))
}

/// Makes `<data_dir>/journal.db` a link to the same name in `volatile`, so
/// the journal (and SQLite's `-wal` and `-shm` beside it) lives in tmpfs
/// while the identity stays in `data_dir`. A journal file found in
/// `data_dir` itself is moved aside, never deleted.
pub fn link_journal(data_dir: &Path, volatile: &Path) -> Result<(), InitError> {
    mkdir(volatile, 0o700)?;
    let link = data_dir.join(JOURNAL);
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::remove_file(&link).map_err(io_at(&link))?;
        }
        Ok(_) => {
            let stamp = identity::utc_stamp(bcd_sys::clock::system_now());
            for suffix in ["", "-wal", "-shm"] {
                let path = data_dir.join(format!("{JOURNAL}{suffix}"));
                if path.exists() {
                    let aside = bcd_sys::fs::aside_name(&path, "disk", &stamp);
                    std::fs::rename(&path, &aside).map_err(io_at(&path))?;
                    warn!(aside = %aside.display(), "moved a journal on the state partition aside");
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_at(&link)(e)),
    }
    symlink(volatile.join(JOURNAL), &link).map_err(io_at(&link))?;
    bcd_sys::fs::sync_dir(data_dir).map_err(io_at(data_dir))
}

/// The store the command line asks for.
pub fn identity_store(cfg: &cmdline::Config) -> Box<dyn IdentityStore> {
    match &cfg.state {
        Some(label) => Box::new(StatePartition {
            label: label.clone(),
            sys: "/sys".into(),
            dev: "/dev".into(),
            mount_at: DATA_DIR.into(),
            volatile: VOLATILE_DIR.into(),
        }),
        None => Box::new(Volatile {
            dir: DATA_DIR.into(),
        }),
    }
}

/// The Ethernet interfaces under `<sys>/class/net` (ARPHRD_ETHER), sorted,
/// with their MAC addresses.
pub fn ethernet_interfaces(sys: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(sys.join("class/net")) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let dir = e.path();
            let kind = std::fs::read_to_string(dir.join("type")).ok()?;
            (kind.trim() == "1").then_some(())?;
            let mac = std::fs::read_to_string(dir.join("address")).ok()?;
            Some((name, mac.trim().to_string()))
        })
        .filter(|(name, _)| name != "lo")
        .collect();
    out.sort();
    out
}

/// The host name of a ramdisk that was given none: `node-` and the MAC.
pub fn hostname_for(mac: &str) -> String {
    let hex: String = mac.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    format!("node-{}", hex.to_ascii_lowercase())
}

/// Loads one module, `rel` relative to the modules directory `dir`
/// (`finit_module`; a compressed one is decompressed by the kernel). One
/// already loaded counts as loaded.
pub fn load_one(dir: &Path, rel: &str) -> std::io::Result<()> {
    let path = dir.join(rel);
    // MODULE_INIT_COMPRESSED_FILE: the kernel decompresses.
    let flags = if [".xz", ".zst", ".gz"].iter().any(|s| rel.ends_with(s)) {
        4
    } else {
        0
    };
    let file = std::fs::File::open(&path)?;
    match rustix::system::finit_module(&file, c"", flags) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The modules listed in `<root>/lib/modules/<release>/modules.order`,
/// loaded in order; returns how many loaded. Built-in and already loaded
/// ones count as loaded.
pub fn load_modules(root: &Path, release: &str) -> usize {
    let dir = root.join("lib/modules").join(release);
    let Ok(order) = std::fs::read_to_string(dir.join("modules.order")) else {
        info!(dir = %dir.display(), "no module list in the image");
        return 0;
    };
    let mut loaded = 0;
    for rel in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match load_one(&dir, rel) {
            Ok(()) => loaded += 1,
            Err(e) => warn!(module = %rel, error = %e, "cannot load a module"),
        }
    }
    loaded
}

/// The device manager of a ramdisk: loads the driver each device under
/// `<sys>` asks for (its modalias against the image's `modules.alias`),
/// from the modules the image carries under `<root>/lib/modules/<release>`,
/// round after round while loading drivers makes new devices. `load`
/// loads one module (relative path); tests hand in their own. Returns
/// the report, or why there was nothing to match against.
pub fn load_by_modalias(
    root: &Path,
    sys: &Path,
    release: &str,
    load: impl FnMut(&initramfs::Module) -> std::io::Result<()>,
) -> Result<bcd_udev::Report, String> {
    let aliases = bcd_udev::Aliases::open(root, release).map_err(|e| bcd_sys::error::chain(&e))?;
    let modules = initramfs::Modules::open(root, release).map_err(|e| bcd_sys::error::chain(&e))?;
    bcd_udev::coldplug::run(sys, &aliases, &modules, load).map_err(|e| bcd_sys::error::chain(&e))
}

/// Logs what [`load_by_modalias`] did.
fn report_coldplug(report: &Result<bcd_udev::Report, String>) {
    match report {
        Err(e) => info!(error = %e, "no driver loading by modalias"),
        Ok(r) => {
            info!(
                loaded = r.loaded.len(),
                modules = %r.loaded.join(" "),
                devices = r.devices,
                matched = r.matched,
                rounds = r.rounds,
                "drivers loaded by modalias"
            );
            for (module, error) in &r.failed {
                warn!(%module, %error, "cannot load a driver");
            }
            for (module, devices) in &r.not_carried {
                for device in devices {
                    warn!(%module, %device, "no driver in the image for {device} ({module})");
                }
            }
        }
    }
}

/// What a child of PID 1 is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Role {
    Dhcp(String),
    Join,
    Supervisor,
}

/// PID 1's children, and the reaping of everything else.
#[derive(Debug)]
struct Pid1 {
    exe: PathBuf,
    cfg: cmdline::Config,
    hostname: String,
    running: HashMap<i32, Role>,
    /// Children that ended since the last look, with their exit code.
    ended: Vec<(Role, Option<i32>)>,
    /// Children to start again at a time.
    restarts: Vec<(Instant, Role)>,
    data_dir: PathBuf,
}

impl Pid1 {
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", "/")
            .env("TERM", "linux");
        if let Some(log) = &self.cfg.log {
            c.env("BCD_LOG", log);
        }
        c
    }

    fn spawn(&mut self, role: Role) {
        let mut c = match &role {
            Role::Dhcp(iface) => {
                let mut c = self.command("/bin/udhcpc");
                c.args(["-f", "-i", iface, "-s", DHCP_SCRIPT, "-x"])
                    .arg(format!("hostname:{}", self.hostname));
                c
            }
            Role::Join => {
                let mut c = self.command(&self.exe);
                c.arg("join")
                    .arg("--ramdisk")
                    .arg("--data-dir")
                    .arg(&self.data_dir);
                if let Some(s) = &self.cfg.server {
                    c.env("BCD_SERVER", s);
                }
                if let Some(t) = &self.cfg.token {
                    c.env("BCD_TOKEN", t);
                }
                if self.cfg.tpm() {
                    c.args(["--attestor", "tpm"]);
                    if let Some(p) = &self.cfg.ca_pin {
                        c.env("BCD_CA_PIN", p);
                    }
                }
                c
            }
            Role::Supervisor => {
                let mut c = self.command(&self.exe);
                c.arg("supervise")
                    .arg("--data-dir")
                    .arg(&self.data_dir)
                    .arg("--restart-delay")
                    .arg(format!("{}s", RESTART_DELAY.as_secs()))
                    .args(["--", "node", "--data-dir"])
                    .arg(&self.data_dir)
                    .args(["--cdi-dir", "/run/cdi", "--run-dir", "/run/bcd"]);
                c
            }
        };
        match c.spawn() {
            Ok(child) => {
                info!(role = ?role, pid = child.id(), "started");
                self.running.insert(child.id() as i32, role);
            }
            Err(e) => {
                error!(role = ?role, error = %e, "cannot start; trying again in 5 s");
                self.restarts
                    .push((bcd_sys::clock::mono() + RESTART_DELAY, role));
            }
        }
    }

    /// Reaps every child that ended, ours or re-parented.
    fn reap(&mut self) {
        use rustix::process::{WaitOptions, wait};
        while let Ok(Some((pid, status))) = wait(WaitOptions::NOHANG) {
            if let Some(role) = self.running.remove(&pid.as_raw_nonzero().get()) {
                let code = status.exit_status();
                match &role {
                    Role::Dhcp(iface) => {
                        warn!(%iface, ?code, "udhcpc ended; starting it again in 5 s");
                        self.restarts
                            .push((bcd_sys::clock::mono() + RESTART_DELAY, role.clone()));
                    }
                    _ => self.ended.push((role, code)),
                }
            }
        }
    }

    /// Reaps and restarts for `d`.
    fn pump(&mut self, d: Duration) {
        let until = bcd_sys::clock::mono() + d;
        loop {
            self.reap();
            let now = bcd_sys::clock::mono();
            let (due, later): (Vec<_>, Vec<_>) =
                self.restarts.drain(..).partition(|(at, _)| *at <= now);
            self.restarts = later;
            for (_, role) in due {
                self.spawn(role);
            }
            if now >= until {
                return;
            }
            std::thread::sleep(TICK.min(until - now));
        }
    }

    /// Pumps until `role` ends; returns its exit code.
    fn wait_for(&mut self, role: &Role) -> Option<i32> {
        loop {
            if let Some(i) = self.ended.iter().position(|(r, _)| r == role) {
                return self.ended.remove(i).1;
            }
            self.pump(TICK);
        }
    }

    /// Pumps until `ready` holds or `limit` passes.
    fn pump_until(&mut self, limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
        let until = bcd_sys::clock::mono() + limit;
        while bcd_sys::clock::mono() < until {
            if ready() {
                return true;
            }
            self.pump(TICK);
        }
        ready()
    }

    /// Never returns: only reaps.
    fn idle(&mut self) -> ! {
        loop {
            self.pump(Duration::from_secs(3600));
        }
    }
}

fn early_mounts() {
    let fs: [(&str, &str, &str, MountFlags, Option<&std::ffi::CStr>); 5] = [
        (
            "proc",
            "/proc",
            "proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        ),
        (
            "sysfs",
            "/sys",
            "sysfs",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        ),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MountFlags::NOSUID,
            Some(c"mode=0755"),
        ),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(c"mode=0755"),
        ),
        (
            "tmpfs",
            "/tmp",
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(c"mode=1777"),
        ),
    ];
    for (source, target, kind, flags, data) in fs {
        if let Err(e) = mkdir(Path::new(target), 0o755) {
            error!(error = %e, "cannot create a mount point");
        }
        match mount(source, target, kind, flags, data) {
            Ok(()) | Err(rustix::io::Errno::BUSY) => {}
            Err(e) => error!(%target, error = %e, "cannot mount"),
        }
    }
}

/// `bcd init`. Returns only when this process is not PID 1.
pub fn run() -> Result<Infallible, InitError> {
    if !rustix::process::getpid().is_init() {
        return Err(InitError::NotPid1);
    }
    early_mounts();
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/bin/bcd"));
    let line = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let cfg = match cmdline::parse(&line) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            // Keep what can be used: the settings before the bad one do not
            // matter more than a node that boots and says what is wrong.
            cmdline::Config::default()
        }
    };
    info!(version = env!("CARGO_PKG_VERSION"), config = %cfg, "bcd init");
    for u in &cfg.unknown {
        warn!(parameter = %u, "unknown kernel command line parameter; ignored");
    }

    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let loaded = load_modules(Path::new("/"), &release);
    info!(loaded, %release, "modules loaded");
    // Then the drivers the hardware asks for, so one image boots machines
    // with different NICs.
    let dir = Path::new("/lib/modules").join(&release);
    let report = load_by_modalias(Path::new("/"), Path::new("/sys"), &release, |m| {
        load_one(&dir, &m.path)
    });
    report_coldplug(&report);

    let mut pid1 = Pid1 {
        exe,
        cfg: cfg.clone(),
        hostname: String::new(),
        running: HashMap::new(),
        ended: Vec::new(),
        restarts: Vec::new(),
        data_dir: DATA_DIR.into(),
    };

    // The network: every Ethernet interface (or the one named), DHCP on each.
    let sys = Path::new("/sys");
    let wanted = |list: &[(String, String)]| -> Vec<(String, String)> {
        list.iter()
            .filter(|(n, _)| cfg.iface.as_ref().is_none_or(|w| w == n))
            .cloned()
            .collect()
    };
    let mut ifaces = Vec::new();
    pid1.pump_until(IFACE_WAIT, || {
        ifaces = wanted(&ethernet_interfaces(sys));
        !ifaces.is_empty()
    });
    let hostname = cfg.hostname.clone().unwrap_or_else(|| {
        ifaces
            .first()
            .map(|(_, mac)| hostname_for(mac))
            .unwrap_or_else(|| "node".into())
    });
    if let Err(e) = rustix::system::sethostname(hostname.as_bytes()) {
        warn!(error = %e, "cannot set the host name");
    }
    pid1.hostname = hostname.clone();
    let _ = pid1
        .command("/bin/ip")
        .args(["link", "set", "lo", "up"])
        .status();
    if let Err(e) = mkdir(Path::new(NET_DIR), 0o755) {
        error!(error = %e, "cannot create the network status directory");
    }
    if ifaces.is_empty() {
        error!(
            "no Ethernet interface appeared: check that the image carries the network driver \
             (images build --module)"
        );
    }
    for (iface, _) in &ifaces {
        pid1.spawn(Role::Dhcp(iface.clone()));
    }
    let up = pid1.pump_until(NETWORK_WAIT, || {
        std::fs::read_dir(NET_DIR).is_ok_and(|mut d| d.next().is_some())
    });
    if up {
        info!(%hostname, "network up");
    } else {
        warn!("no DHCP lease yet; starting anyway (the daemon redials)");
    }

    // Where the identity lives.
    let store = identity_store(&cfg);
    let mut last_said = None::<Instant>;
    let data_dir = loop {
        match store.open() {
            Ok(d) => break d,
            Err(e) => {
                if last_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    error!("{e}");
                    last_said = Some(bcd_sys::clock::mono());
                }
                pid1.pump(Duration::from_secs(1));
            }
        }
    };
    pid1.data_dir = data_dir.clone();
    info!(data_dir = %data_dir.display(), persistent = store.persistent(), "identity store ready");

    loop {
        join_until_joined(&mut pid1, &cfg, &data_dir);
        // The daemon, under the supervisor; the supervisor under PID 1.
        loop {
            pid1.spawn(Role::Supervisor);
            match pid1.wait_for(&Role::Supervisor) {
                Some(EXIT_REFUSED) if cfg.tpm() => {
                    // The machine's TPM is its identity: the node it is
                    // bound to is got back by attesting again (a deleted
                    // one's machine joins as a new node only if enrolled).
                    warn!(
                        "the server refused this node's certificate for good (revoked or \
                         deleted); joining again by TPM attestation in 5 s"
                    );
                    if let Err(e) = identity::reset(&data_dir) {
                        error!("cannot move the refused identity aside: {e:#}");
                        pid1.idle();
                    }
                    pid1.pump(RESTART_DELAY);
                    break;
                }
                Some(EXIT_REFUSED) => {
                    error!(
                        "the server refused this node for good (deleted or revoked); reboot it to \
                         join again with a token, or remove bcd.state's identity"
                    );
                    pid1.idle();
                }
                code => {
                    warn!(?code, "the supervisor ended; starting it again in 5 s");
                    pid1.pump(RESTART_DELAY);
                }
            }
        }
    }
}

/// Joins while the node has no identity, backing off 1 s to 30 s between
/// tries; idles when the command line cannot make a join.
fn join_until_joined(pid1: &mut Pid1, cfg: &cmdline::Config, data_dir: &Path) {
    let mut backoff = Duration::from_secs(1);
    while !identity::exists(data_dir) {
        let admitted = cfg.token.is_some() || (cfg.tpm() && cfg.ca_pin.is_some());
        if cfg.server.is_none() || !admitted {
            error!(
                "this node has no identity and the kernel command line has no bcd.server= with \
                 bcd.token= (better-compute tokens create --uses N makes a token for N boots) \
                 or, for a machine with a TPM enrolled by its EK, bcd.attestor=tpm and \
                 bcd.ca_pin=: add them"
            );
            pid1.idle();
        }
        pid1.spawn(Role::Join);
        match pid1.wait_for(&Role::Join) {
            Some(0) => info!("joined"),
            code => {
                warn!(?code, retry_in = ?backoff, "join failed; trying again");
                pid1.pump(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device manager's wiring: a NIC whose driver the image carries
    /// but does not list is loaded, with its dependency first; a device
    /// whose driver the image lacks is reported, not loaded.
    #[test]
    fn drivers_are_loaded_by_modalias_from_the_image() {
        let d = tempfile::tempdir().unwrap();
        let (root, sys) = (d.path().join("root"), d.path().join("sys"));
        let dir = root.join("lib/modules/6.1.0-test");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("modules.dep"),
            "kernel/drivers/net/vmxnet3/vmxnet3.ko.xz: kernel/net/core/page_pool.ko.xz\n\
             kernel/net/core/page_pool.ko.xz:\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("modules.alias"),
            "alias pci:v000015ADd000007B0sv*sd*bc*sc*i* vmxnet3\n\
             alias pci:v00008086d0000100Esv*sd*bc*sc*i* e1000\n",
        )
        .unwrap();
        std::fs::write(dir.join("modules.order"), "").unwrap();
        for (dev, alias) in [
            (
                "0000:00:03.0",
                "pci:v000015ADd000007B0sv000015ADsd000007B0bc02sc00i01",
            ),
            (
                "0000:00:04.0",
                "pci:v00008086d0000100Esv00008086sd0000001Ebc02sc00i00",
            ),
        ] {
            let p = sys.join("devices/pci0000:00").join(dev);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("modalias"), format!("{alias}\n")).unwrap();
        }
        let mut loaded = Vec::new();
        let report = load_by_modalias(&root, &sys, "6.1.0-test", |m| {
            loaded.push(m.path.clone());
            Ok(())
        })
        .unwrap();
        assert_eq!(
            loaded,
            [
                "kernel/net/core/page_pool.ko.xz",
                "kernel/drivers/net/vmxnet3/vmxnet3.ko.xz"
            ]
        );
        assert_eq!(report.loaded, ["page_pool", "vmxnet3"]);
        assert_eq!(
            report.not_carried.get("e1000").map(Vec::len),
            Some(1),
            "{report:?}"
        );
        // An image without modules.alias: nothing to match, said so.
        std::fs::remove_file(dir.join("modules.alias")).unwrap();
        let e = load_by_modalias(&root, &sys, "6.1.0-test", |_| Ok(())).unwrap_err();
        assert!(e.contains("modules.alias"), "{e}");
    }

    #[test]
    fn the_journal_is_a_link_into_tmpfs_and_a_disk_journal_goes_aside() {
        let d = tempfile::tempdir().unwrap();
        let (data, volatile) = (d.path().join("data"), d.path().join("run/volatile"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join(JOURNAL), b"old").unwrap();
        std::fs::write(data.join("journal.db-wal"), b"old wal").unwrap();
        link_journal(&data, &volatile).unwrap();
        let names: Vec<String> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("journal.db.disk-")),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n.starts_with("journal.db-wal.disk-")),
            "{names:?}"
        );
        assert_eq!(
            std::fs::read_link(data.join(JOURNAL)).unwrap(),
            volatile.join(JOURNAL)
        );

        // SQLite follows the link: the database and its WAL are in tmpfs.
        let (journal, _) = crate::journal::Journal::open(&data.join(JOURNAL)).unwrap();
        assert!(volatile.join(JOURNAL).exists());
        drop(journal);
        assert!(
            std::fs::symlink_metadata(data.join(JOURNAL))
                .unwrap()
                .file_type()
                .is_symlink()
        );

        // The next boot: the link is made again, nothing else moves.
        link_journal(&data, &volatile).unwrap();
        assert_eq!(std::fs::read_dir(&data).unwrap().count(), names.len());
    }

    #[test]
    fn volatile_store_makes_its_directory() {
        let d = tempfile::tempdir().unwrap();
        let store = Volatile {
            dir: d.path().join("a/b"),
        };
        assert_eq!(store.open().unwrap(), d.path().join("a/b"));
        assert!(!store.persistent());
    }

    #[test]
    fn a_missing_state_partition_says_how_to_make_one() {
        let d = tempfile::tempdir().unwrap();
        let store = StatePartition {
            label: "bcd-state".into(),
            sys: d.path().join("sys"),
            dev: d.path().join("dev"),
            mount_at: d.path().join("data"),
            volatile: d.path().join("run"),
        };
        let e = store.open().unwrap_err().to_string();
        assert!(e.contains("mkfs.ext4 -L bcd-state"), "{e}");
    }

    #[test]
    fn lists_ethernet_interfaces_with_their_macs() {
        let d = tempfile::tempdir().unwrap();
        for (name, kind, mac) in [
            ("lo", "772", "00:00:00:00:00:00"),
            ("eth1", "1", "52:54:00:12:34:57"),
            ("eth0", "1", "52:54:00:12:34:56"),
            ("ib0", "32", "80:00:00:00"),
        ] {
            let dir = d.path().join("class/net").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(dir.join("address"), format!("{mac}\n")).unwrap();
        }
        let got = ethernet_interfaces(d.path());
        assert_eq!(
            got,
            vec![
                ("eth0".to_string(), "52:54:00:12:34:56".to_string()),
                ("eth1".to_string(), "52:54:00:12:34:57".to_string())
            ]
        );
        assert_eq!(hostname_for(&got[0].1), "node-525400123456");
        assert!(cmdline::valid_hostname(&hostname_for(&got[0].1)));
    }

    #[test]
    fn loads_nothing_without_a_module_list() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load_modules(d.path(), "6.1.0-test"), 0);
    }
}
