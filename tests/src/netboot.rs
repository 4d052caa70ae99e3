//! The netboot harness: real images booted in qemu under TCG.
//!
//! A [`NetFleet`] is a `better-compute serve` with its boot endpoint and an
//! image key; [`NetFleet::build_image`] runs `better-compute images build`
//! on Debian's cloud kernel (`scripts/fetch-kernel` caches it under
//! `target/netboot-cache/`) and the static bcd. A [`Vm`] is one qemu,
//! wrapped in `timeout`, with its serial console in a file, QMP on a unix
//! socket, swtpm as its TPM, and a user-mode network in `restrict=on`
//! mode whose only ways out are `guestfwd`s to the server's loopback ports
//! (`10.0.2.100:7443` the gateway, `10.0.2.100:8080` the boot endpoint).
//! It boots directly (`-kernel`/`-initrd`, fast) or by true PXE (`-boot n`:
//! the NIC's iPXE ROM gets a chain script over qemu's TFTP, which asks the
//! boot endpoint for this MAC's script). A VM is stopped by QMP `quit`,
//! then by PID, when dropped.
//!
//! One VM runs at a time ([`vm_lock`]): each takes a core under TCG.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{FAST, Proc, Server, bin, static_bcd, stderr};

/// The guest's address for the server's services.
pub const GUEST_SERVER_IP: &str = "10.0.2.100";
pub const GUEST_GATEWAY_PORT: u16 = 7443;
pub const GUEST_BOOT_PORT: u16 = 8080;
/// The ext4 label of test state disks.
pub const STATE_LABEL: &str = "bcd-state";
/// Modules for virtio networking and disks, and pvpanic so that a guest
/// kernel panic ends qemu.
pub const MODULES: &[&str] = &["virtio_pci", "virtio_net", "virtio_blk", "pvpanic_mmio"];

/// Serializes VMs: one at a time on a 2-core machine.
pub fn vm_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cached kernel package folder (`scripts/fetch-kernel`), or why it is
/// not there and how to get it. The tests that need it are
/// `#[ignore = "needs ..."]`: `cargo test` lists them as ignored, and
/// `scripts/test` fetches the kernel and runs them.
pub fn kernel() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("BC_NETBOOT_CACHE") {
        Some(d) => PathBuf::from(d).join("kernel"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/netboot-cache/kernel"),
    };
    if dir.join("boot").is_dir() {
        Ok(dir)
    } else {
        Err(format!(
            "the netboot kernel is missing ({}): run scripts/fetch-kernel",
            dir.display()
        ))
    }
}

/// Fails with the install command when a host tool is missing.
pub fn require_tools() {
    for (tool, package) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("swtpm", "swtpm swtpm-tools"),
        ("busybox", "busybox-static"),
        ("mkfs.ext4", "e2fsprogs"),
        ("timeout", "coreutils"),
        ("gzip", "gzip"),
        ("zstd", "zstd"),
        ("cpio", "cpio"),
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{tool} is missing: apt-get install {package} (scripts/test does)"
        );
    }
    assert!(
        Path::new("/usr/sbin/kexec").exists(),
        "kexec is missing: apt-get install kexec-tools (scripts/test does)"
    );
}

/// A server with its boot endpoint and an image key.
#[derive(Debug)]
pub struct NetFleet {
    pub d: tempfile::TempDir,
    pub server: Server,
    pub boot: SocketAddr,
    pub key: PathBuf,
    pub kernel: PathBuf,
}

/// A built image folder and what `images build --json` said.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub id: String,
    pub json: serde_json::Value,
}

impl Image {
    pub fn kernel(&self) -> PathBuf {
        self.dir.join("vmlinuz")
    }
    pub fn initrd(&self) -> PathBuf {
        self.dir.join("initrd.img")
    }
    pub fn cmdline(&self) -> String {
        self.json["cmdline"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    pub fn sha256(&self, part: &str) -> String {
        self.json[part]["sha256"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// The kernel command line images are built with: the serial console, a
/// kernel panic ends the VM, and the server as the guest reaches it.
pub fn base_cmdline() -> String {
    format!("console=ttyS0 panic=-1 bcd.server=https://{GUEST_SERVER_IP}:{GUEST_GATEWAY_PORT}")
}

impl NetFleet {
    /// Starts `better-compute serve` on loopback with [`FAST`] timings, the
    /// boot endpoint and a fresh image key.
    pub fn start(kernel: PathBuf) -> anyhow::Result<NetFleet> {
        let d = tempfile::tempdir()?;
        let key = d.path().join("image.key");
        let out = Command::new(bin("better-compute"))
            .args(["images", "keygen", "--out"])
            .arg(&key)
            .output()?;
        anyhow::ensure!(out.status.success(), "images keygen: {}", stderr(&out));
        let public = String::from_utf8(out.stdout)?.trim().to_string();
        let dir = d.path().join("server");
        std::fs::create_dir_all(&dir)?;
        // Ramdisk nodes under TCG are slow: heartbeats every second.
        let mut args: Vec<String> = Vec::new();
        for pair in FAST.chunks(2) {
            let value = if pair[0] == "--heartbeat-interval" {
                "1s"
            } else {
                pair[1]
            };
            args.extend([pair[0].to_string(), value.to_string()]);
        }
        args.extend([
            "--boot-listen".into(),
            "127.0.0.1:0".into(),
            "--image-pubkey".into(),
            public,
        ]);
        let server = Server::start_on(&dir, ("127.0.0.1:0", "127.0.0.1:0"), args, None)?;
        let boot = server.boot.context("the server printed no boot endpoint")?;
        Ok(NetFleet {
            d,
            server,
            boot,
            key,
            kernel,
        })
    }

    /// `images build` into `<tmp>/<name>` with [`MODULES`], kexec, and
    /// `cmdline`.
    pub fn build_image(&self, name: &str, cmdline: &str) -> Image {
        self.build_image_into(&self.d.path().join(name), name, cmdline)
    }

    pub fn build_image_into(&self, dir: &Path, name: &str, cmdline: &str) -> Image {
        self.build_image_carrying(dir, name, cmdline, &[])
    }

    /// [`NetFleet::build_image_into`], carrying `carry` as drivers that
    /// `bcd init` loads only when a device's modalias asks for them.
    pub fn build_image_carrying(
        &self,
        dir: &Path,
        name: &str,
        cmdline: &str,
        carry: &[&str],
    ) -> Image {
        self.build_image_with(dir, name, cmdline, carry, &[])
    }

    /// An image for machines with a TPM enrolled by their EK: built with
    /// `--tpm-ca-pin`, no token anywhere on its command line.
    pub fn build_tpm_image(&self, name: &str, ca_pin: &str) -> Image {
        let dir = self.d.path().join(name);
        self.build_image_with(&dir, name, &base_cmdline(), &[], &["--tpm-ca-pin", ca_pin])
    }

    fn build_image_with(
        &self,
        dir: &Path,
        name: &str,
        cmdline: &str,
        carry: &[&str],
        extra: &[&str],
    ) -> Image {
        let mut c = Command::new(bin("better-compute"));
        c.args(["images", "build", "--kernel"])
            .arg(&self.kernel)
            .arg("--bcd")
            .arg(static_bcd())
            .args([
                "--program",
                "/usr/sbin/kexec",
                "--name",
                name,
                "--cmdline",
                cmdline,
            ])
            .arg("--key")
            .arg(&self.key)
            .arg("--out")
            .arg(dir)
            .arg("--json");
        c.args(extra);
        for m in MODULES {
            c.args(["--module", m]);
        }
        for m in carry {
            c.args(["--carry", m]);
        }
        let out = c.output().expect("run images build");
        assert!(out.status.success(), "images build: {}", stderr(&out));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("build json");
        Image {
            dir: dir.to_path_buf(),
            id: json["image_id"].as_str().expect("image_id").to_string(),
            json,
        }
    }

    /// Registers an image with the server.
    pub fn register(&self, image: &Image) {
        let out = self.server.cli(&[
            "images",
            "register",
            image.dir.to_str().expect("utf-8 path"),
        ]);
        assert!(out.status.success(), "images register: {}", stderr(&out));
    }

    /// Makes `image` the fleet's default, with `append` on its command line.
    pub fn assign_default(&self, image: &Image, append: &str) {
        let out = self.server.cli(&[
            "images",
            "assign",
            &image.id,
            "--default",
            "--append",
            append,
        ]);
        assert!(out.status.success(), "images assign: {}", stderr(&out));
    }

    /// A TFTP folder with the chain script an operator's DHCP would hand
    /// out: it asks the boot endpoint for this machine's script.
    pub fn tftp_dir(&self) -> PathBuf {
        let dir = self.d.path().join("tftp");
        std::fs::create_dir_all(&dir).expect("tftp dir");
        std::fs::write(
            dir.join("chain.ipxe"),
            format!(
                "#!ipxe\nchain http://{GUEST_SERVER_IP}:{GUEST_BOOT_PORT}/boot/ipxe?mac=${{net0/mac}}\n"
            ),
        )
        .expect("chain script");
        dir
    }

    /// A fresh ext4 state disk labelled [`STATE_LABEL`].
    pub fn state_disk(&self, name: &str) -> PathBuf {
        let path = self.d.path().join(format!("{name}.img"));
        let out = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", STATE_LABEL])
            .arg(&path)
            .arg("16M")
            .output()
            .expect("mkfs.ext4 (e2fsprogs)");
        assert!(out.status.success(), "mkfs.ext4: {}", stderr(&out));
        path
    }

    /// The forwards a guest needs: the gateway and the boot endpoint.
    pub fn forwards(&self) -> Vec<(u16, u16)> {
        vec![
            (GUEST_GATEWAY_PORT, self.server.addr.port()),
            (GUEST_BOOT_PORT, self.boot.port()),
        ]
    }

    /// Waits for a node with `hostname` in `state`; returns its id. Fails
    /// at once, with the console, if the VM's kernel panics.
    pub fn wait_hostname(&self, vm: &Vm, hostname: &str, state: &str, timeout: Duration) -> String {
        vm.wait(timeout, &format!("{hostname} {state}"), || {
            self.server
                .nodes()
                .into_iter()
                .filter(|n| n.hostname == hostname && n.state == state)
                .map(|n| n.node_id)
                .next_back()
        })
    }
}

/// How a VM boots.
#[derive(Debug, Clone)]
pub enum Boot {
    /// `-kernel`/`-initrd`/`-append`.
    Direct {
        kernel: PathBuf,
        initrd: PathBuf,
        append: String,
    },
    /// `-boot n`: iPXE fetches `bootfile` from `tftp` by TFTP.
    Pxe { tftp: PathBuf, bootfile: String },
}

#[derive(Debug, Clone)]
pub struct VmConfig {
    pub boot: Boot,
    /// 52:54:00:xx:xx:xx.
    pub mac: String,
    pub state_disk: Option<PathBuf>,
    /// (guest port on 10.0.2.100, host loopback port).
    pub forwards: Vec<(u16, u16)>,
    pub memory_mib: u32,
    /// The most the VM may run before `timeout` ends it.
    pub limit: Duration,
    /// The NIC's qemu device model (`virtio-net-pci`, `vmxnet3`).
    pub nic: String,
    /// The swtpm state folder (a machine's TPM across VMs, or a copy of
    /// another's); a fresh one in the VM's folder when unset.
    pub tpm_state: Option<PathBuf>,
}

impl VmConfig {
    pub fn new(boot: Boot, mac: &str, forwards: Vec<(u16, u16)>) -> VmConfig {
        VmConfig {
            boot,
            mac: mac.to_string(),
            state_disk: None,
            forwards,
            // kexec_file_load needs room for a second kernel and initrd.
            memory_mib: 512,
            limit: Duration::from_secs(600),
            nic: "virtio-net-pci".into(),
            tpm_state: None,
        }
    }
}

/// The host name `bcd init` gives a node booted from this MAC.
pub fn hostname_for(mac: &str) -> String {
    format!("node-{}", mac.replace(':', ""))
}

/// One qemu (under `timeout`) and its swtpm.
#[derive(Debug)]
pub struct Vm {
    pub dir: tempfile::TempDir,
    pub serial: PathBuf,
    pub qmp: PathBuf,
    pub pidfile: PathBuf,
    pub qemu: Option<Proc>,
    pub swtpm: Option<Proc>,
    pub started: Instant,
}

impl Vm {
    pub fn start(cfg: &VmConfig) -> anyhow::Result<Vm> {
        let dir = tempfile::tempdir()?;
        let serial = dir.path().join("serial.log");
        let qmp = dir.path().join("qmp.sock");
        let pidfile = dir.path().join("qemu.pid");
        let tpm_sock = dir.path().join("swtpm.sock");
        let tpm_state = cfg
            .tpm_state
            .clone()
            .unwrap_or_else(|| dir.path().join("tpm"));
        std::fs::create_dir_all(&tpm_state)?;
        let swtpm_log = dir.path().join("swtpm.log");
        let swtpm = Command::new("swtpm")
            .arg("socket")
            .arg("--tpmstate")
            .arg(format!("dir={}", tpm_state.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", tpm_sock.display()))
            .arg("--tpm2")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&swtpm_log)?)
            .spawn()
            .context("cannot start swtpm (apt-get install swtpm swtpm-tools)")?;
        let mut swtpm = Proc {
            child: swtpm,
            log: swtpm_log,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tpm_sock.exists() {
            if Instant::now() > deadline {
                swtpm.kill();
                bail!("swtpm did not create its socket: {}", swtpm.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }

        let mut netdev = String::from("user,id=n0,restrict=on");
        for (guest, host) in &cfg.forwards {
            netdev.push_str(&format!(
                ",guestfwd=tcp:{GUEST_SERVER_IP}:{guest}-cmd:busybox nc 127.0.0.1 {host}"
            ));
        }
        let mut c = Command::new("timeout");
        c.arg("--kill-after=5")
            .arg(format!("{}", cfg.limit.as_secs()))
            .arg("qemu-system-x86_64")
            .args(["-accel", "tcg", "-smp", "1", "-m"])
            .arg(cfg.memory_mib.to_string())
            .args(["-display", "none", "-monitor", "none", "-serial"])
            .arg(format!("file:{}", serial.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .arg("-pidfile")
            .arg(&pidfile)
            .args(["-device", "pvpanic", "-action", "panic=exit-failure"])
            // SeaBIOS's log, for a boot that never reaches the kernel.
            .arg("-chardev")
            .arg(format!(
                "file,id=fw,path={}",
                dir.path().join("firmware.log").display()
            ))
            .args(["-device", "isa-debugcon,iobase=0x402,chardev=fw"])
            .arg("-chardev")
            .arg(format!("socket,id=chrtpm,path={}", tpm_sock.display()))
            .args(["-tpmdev", "emulator,id=tpm0,chardev=chrtpm"])
            .args(["-device", "tpm-tis,tpmdev=tpm0"]);
        match &cfg.boot {
            Boot::Direct {
                kernel,
                initrd,
                append,
            } => {
                c.arg("-kernel")
                    .arg(kernel)
                    .arg("-initrd")
                    .arg(initrd)
                    .arg("-append")
                    .arg(append);
            }
            Boot::Pxe { tftp, bootfile } => {
                netdev.push_str(&format!(",tftp={},bootfile={bootfile}", tftp.display()));
                c.args(["-boot", "n"]);
            }
        }
        c.arg("-netdev")
            .arg(&netdev)
            .arg("-device")
            .arg(format!("{},netdev=n0,mac={}", cfg.nic, cfg.mac));
        if let Some(disk) = &cfg.state_disk {
            c.arg("-drive")
                .arg(format!("file={},format=raw,if=virtio", disk.display()));
        }
        let log = dir.path().join("qemu.log");
        let started = Instant::now();
        let child = c
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("cannot start qemu (apt-get install qemu-system-x86)")?;
        Ok(Vm {
            dir,
            serial,
            qmp,
            pidfile,
            qemu: Some(Proc { child, log }),
            swtpm: Some(swtpm),
            started,
        })
    }

    /// The serial console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.serial).unwrap_or_default()).to_string()
    }

    /// How many times `needle` is on the console.
    pub fn count(&self, needle: &str) -> usize {
        self.console().matches(needle).count()
    }

    /// Waits until the console holds `needle` `times` times.
    pub fn wait_console(&self, needle: &str, times: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.count(needle) < times {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {needle:?} x{times} on the console:\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls `f` until it returns `Some`; fails with the console's tail
    /// when `timeout` passes or the guest kernel panics (a panicking
    /// ramdisk would otherwise reboot until the timeout).
    pub fn wait<T>(&self, timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f() {
                return v;
            }
            let console = self.console();
            assert!(
                !console.contains("Kernel panic - not syncing"),
                "the guest kernel panicked while waiting for {what}:\n{}",
                self.tail()
            );
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; the console ends:\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of the console, for failure messages.
    pub fn tail(&self) -> String {
        let mut c = self.console();
        if c.trim().is_empty() {
            // No kernel yet: what the firmware did.
            c = format!(
                "(no console output; the firmware's log:)\n{}",
                String::from_utf8_lossy(
                    &std::fs::read(self.dir.path().join("firmware.log")).unwrap_or_default()
                )
            );
        }
        let lines: Vec<&str> = c.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Sends one QMP command; returns its answer.
    pub fn qmp(&self, command: &str) -> anyhow::Result<serde_json::Value> {
        let mut s = UnixStream::connect(&self.qmp)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut r = BufReader::new(s.try_clone()?);
        let mut line = String::new();
        r.read_line(&mut line)?; // greeting
        s.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")?;
        line.clear();
        r.read_line(&mut line)?;
        s.write_all(format!("{{\"execute\":\"{command}\"}}\n").as_bytes())?;
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                return Ok(serde_json::Value::Null);
            }
            let v: serde_json::Value = serde_json::from_str(&line)?;
            if v.get("return").is_some() || v.get("error").is_some() {
                return Ok(v);
            }
        }
    }

    /// QMP `quit`, then SIGKILL by PID if qemu is still there; then swtpm.
    pub fn stop(&mut self) {
        let _ = self.qmp("quit");
        if let Some(mut q) = self.qemu.take()
            && q.wait(Duration::from_secs(5)).is_none()
        {
            let pid = std::fs::read_to_string(&self.pidfile)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            if let Some(pid) = pid.and_then(rustix::process::Pid::from_raw) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            q.kill();
        }
        if let Some(mut t) = self.swtpm.take() {
            t.kill();
        }
    }

    /// Seconds since qemu started.
    pub fn uptime(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lists a cpio archive with GNU cpio (`cpio -t`).
pub fn gnu_cpio_list(archive: &[u8]) -> Vec<String> {
    let mut child = Command::new("cpio")
        .args(["-t", "--quiet"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cpio is missing: apt-get install cpio");
    let mut stdin = child.stdin.take().expect("piped");
    let bytes = archive.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&bytes));
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut out)
        .expect("cpio output");
    let _ = writer.join();
    let status = child.wait().expect("cpio");
    assert!(status.success(), "cpio -t failed");
    out.lines().map(str::to_string).collect()
}

/// Decompresses a gzip or zstd stream (by its magic) with the gzip or
/// zstd program.
pub fn decompress(bytes: &[u8]) -> Vec<u8> {
    let program = if bytes.starts_with(&[0x1f, 0x8b]) {
        "gzip"
    } else if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        "zstd"
    } else {
        return bytes.to_vec();
    };
    let mut child = Command::new(program)
        .args(["-d", "-c", "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} is missing ({e}): apt-get install {program}"));
    let mut stdin = child.stdin.take().expect("piped");
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_end(&mut out)
        .expect("decompressed output");
    let _ = writer.join();
    assert!(
        child.wait().expect(program).success(),
        "{program} -d failed"
    );
    out
}

/// One HTTP/1.1 request to `addr` (`Connection: close`); returns the status
/// code, the header lines and the body.
pub fn http_get(addr: SocketAddr, path: &str, headers: &[&str]) -> (u16, Vec<String>, Vec<u8>) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the boot endpoint");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    (
        status,
        lines.map(str::to_string).collect(),
        raw[split + 4..].to_vec(),
    )
}
