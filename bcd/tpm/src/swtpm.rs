//! A software TPM (swtpm) in a folder of its own, for tests and benchmarks:
//! its state persists in the folder across restarts, as a machine's TPM
//! does across reboots. Command socket on a loopback TCP port, control
//! channel on the next port (what the tpm2-tss `swtpm` TCTI expects).
//! A missing tool is an error that names the packages to install.
//!
//! A harness for tests and benchmarks, which are exempt from the one-clock
//! rule: its waits read the host's monotonic clock directly.
#![allow(clippy::disallowed_methods)]

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use crate::transport::Endpoint;

/// What to install when a tool is missing.
pub const INSTALL: &str = "apt-get install swtpm swtpm-tools tpm2-tools";

/// swtpm's control command CMD_SHUTDOWN.
const CMD_SHUTDOWN: u32 = 3;

/// Why a software TPM could not be set up or driven.
#[derive(Debug, thiserror::Error)]
pub enum SwtpmError {
    #[error("{tool} is not installed: {INSTALL}")]
    Missing { tool: &'static str },
    #[error("{tool} failed: {detail}")]
    Failed { tool: &'static str, detail: String },
    #[error("swtpm state folder {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn run_tool(tool: &'static str, cmd: &mut Command) -> Result<(), SwtpmError> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            SwtpmError::Missing { tool }
        } else {
            SwtpmError::Failed {
                tool,
                detail: e.to_string(),
            }
        }
    })?;
    if !out.status.success() {
        return Err(SwtpmError::Failed {
            tool,
            detail: format!(
                "{}: {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

/// Manufactures a TPM in `dir` the way a vendor does: `swtpm_setup` creates
/// the RSA 2048 EK, persists it at 0x81010001 and writes an EK certificate
/// (signed by a local CA kept in `dir/ca`) to NV index 0x01c00002.
pub fn manufacture(dir: &Path) -> Result<(), SwtpmError> {
    let io_err = |source| SwtpmError::Io {
        path: dir.to_owned(),
        source,
    };
    let ca = dir.join("ca");
    std::fs::create_dir_all(&ca).map_err(io_err)?;
    let localca = dir.join("swtpm-localca.conf");
    std::fs::write(
        &localca,
        format!(
            "statedir = {ca}\nsigningkey = {ca}/signkey.pem\nissuercert = {ca}/issuercert.pem\ncertserial = {ca}/certserial\n",
            ca = ca.display()
        ),
    )
    .map_err(io_err)?;
    let options = dir.join("swtpm-localca.options");
    std::fs::write(
        &options,
        "--platform-manufacturer better-compute\n--platform-version 1\n--platform-model test\n",
    )
    .map_err(io_err)?;
    let setup = dir.join("swtpm_setup.conf");
    std::fs::write(
        &setup,
        format!(
            "create_certs_tool = swtpm_localca\ncreate_certs_tool_config = {}\ncreate_certs_tool_options = {}\nactive_pcr_banks = sha256\n",
            localca.display(),
            options.display()
        ),
    )
    .map_err(io_err)?;
    run_tool(
        "swtpm_setup",
        Command::new("swtpm_setup")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(dir)
            .arg("--config")
            .arg(&setup)
            .arg("--create-ek-cert")
            .arg("--overwrite"),
    )
}

/// A running swtpm.
#[derive(Debug)]
pub struct Swtpm {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

static NEXT: AtomicU16 = AtomicU16::new(0);

/// Two consecutive free loopback ports (command, control).
fn free_port_pair() -> u16 {
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = 20_000 + ((std::process::id() as u16 % 300) * 64 + n * 2) % 40_000;
        let port = base & !1;
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        if free(port) && free(port + 1) {
            return port;
        }
    }
}

impl Swtpm {
    /// Starts a swtpm on the state in `dir` (a new TPM when the folder is
    /// empty), and waits until it answers.
    pub fn start(dir: &Path) -> Result<Swtpm, SwtpmError> {
        std::fs::create_dir_all(dir).map_err(|source| SwtpmError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port_pair();
            let mut s = Swtpm {
                dir: dir.to_owned(),
                port,
                child: None,
            };
            match s.spawn() {
                Ok(()) => return Ok(s),
                // Another process took the port between the check and swtpm's bind.
                Err(SwtpmError::Failed { detail, .. }) => last = detail,
                Err(e) => return Err(e),
            }
        }
        Err(SwtpmError::Failed {
            tool: "swtpm",
            detail: last,
        })
    }

    fn spawn(&mut self) -> Result<(), SwtpmError> {
        let child = Command::new("swtpm")
            .arg("socket")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(format!("dir={}", self.dir.display()))
            .arg("--server")
            .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", self.port))
            .arg("--ctrl")
            .arg(format!(
                "type=tcp,port={},bindaddr=127.0.0.1",
                self.port + 1
            ))
            .arg("--flags")
            .arg("not-need-init,startup-clear")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    SwtpmError::Missing { tool: "swtpm" }
                } else {
                    SwtpmError::Failed {
                        tool: "swtpm",
                        detail: e.to_string(),
                    }
                }
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                self.child = None;
                return Err(SwtpmError::Failed {
                    tool: "swtpm",
                    detail: format!("{status}: {err}"),
                });
            }
            // The control channel is up once swtpm listens; the command
            // socket opens together with it.
            if TcpStream::connect(self.ctrl_addr()).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(SwtpmError::Failed {
                    tool: "swtpm",
                    detail: "did not listen within 10 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn ctrl_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port + 1))
    }

    /// The command socket's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port))
    }

    /// The endpoint of the pure-Rust backend.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::Tcp(self.addr())
    }

    /// The tpm2-tss TCTI string (`tss` backend, tpm2-tools).
    pub fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Shuts swtpm down through its control channel (the state is saved),
    /// and waits for it to exit.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(mut c) = TcpStream::connect(self.ctrl_addr()) {
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = c.write_all(&CMD_SHUTDOWN.to_be_bytes());
            let mut answer = [0u8; 4];
            let _ = c.read_exact(&mut answer);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops swtpm and starts it again on the same state (a reboot of the
    /// machine): on the same port when it is still free.
    pub fn restart(&mut self) -> Result<(), SwtpmError> {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(SwtpmError::Failed { .. }) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(e),
            }
        }
        let fresh = Swtpm::start(&self.dir)?;
        self.port = fresh.port;
        self.child = fresh.into_child();
        Ok(())
    }

    fn into_child(mut self) -> Option<Child> {
        self.child.take()
    }

    /// TPM2_Clear with the (empty) lockout authorization, through
    /// tpm2-tools: the owner seed changes, the endorsement seed stays. No
    /// other connection may be open.
    pub fn clear(&self) -> Result<(), SwtpmError> {
        run_tool(
            "tpm2_clear",
            Command::new("tpm2_clear")
                .arg("-T")
                .arg(self.tcti())
                .arg("-c")
                .arg("l"),
        )
    }

    /// Defines NV index `index` in the owner hierarchy, readable with the
    /// owner's or its own (empty) authorization, and writes `data` into it
    /// through tpm2-tools: what a manufacturer does for an EK certificate
    /// or a certificate of its chain. No other connection may be open.
    pub fn define_nv(&self, index: u32, data: &[u8]) -> Result<(), SwtpmError> {
        let file = self.dir.join(format!("nv-{index:08x}.bin"));
        std::fs::write(&file, data).map_err(|source| SwtpmError::Io {
            path: file.clone(),
            source,
        })?;
        let index = format!("{index:#010x}");
        let size = data.len().to_string();
        self.tool(
            "tpm2_nvdefine",
            &[
                "-C",
                "o",
                "-s",
                &size,
                "-a",
                "ownerread|ownerwrite|authread|authwrite|no_da",
                &index,
            ],
        )?;
        let file = file.to_string_lossy().into_owned();
        self.tool("tpm2_nvwrite", &["-C", "o", "-i", &file, &index])
    }

    /// Runs a tpm2-tools program against this TPM (the tests' oracle).
    pub fn tool(&self, tool: &'static str, args: &[&str]) -> Result<(), SwtpmError> {
        run_tool(
            tool,
            Command::new(tool).arg("-T").arg(self.tcti()).args(args),
        )
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        self.stop();
    }
}
