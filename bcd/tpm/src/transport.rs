//! Where the pure-Rust backend sends its command bytes: the kernel's TPM
//! character device (`/dev/tpmrm0`, with the kernel's resource manager) or
//! swtpm's TCP command socket (no resource manager: the backend flushes its
//! own transient objects), or, with the `helper` feature, the privileged
//! `bcd helper` of an unprivileged node, which relays each command to the
//! TPM it opened for this connection (`bcd_helper::TpmSession`).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// The default device: the kernel's resource-managed TPM.
pub const DEFAULT_DEVICE: &str = "/dev/tpmrm0";

/// How long a command may take before the TPM counts as unreachable (RSA
/// primary keys take seconds on slow TPMs).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// A largest TPM response (TPM_MAX_COMMAND_SIZE of common TPMs, with room).
const MAX_RESPONSE: usize = 8192;

/// Where a TPM is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A TPM character device: `/dev/tpmrm0` (resource-managed) or
    /// `/dev/tpm0`.
    Device(PathBuf),
    /// swtpm's command socket (`swtpm socket --server type=tcp,...`).
    Tcp(SocketAddr),
    /// `bcd helper`'s socket: the helper opens the TPM for this connection
    /// and relays the commands its allow-list takes. Handles live as long
    /// as the connection.
    #[cfg(feature = "helper")]
    Helper(PathBuf),
}

impl Endpoint {
    /// Whether the kernel's resource manager flushes what a closed
    /// connection left loaded.
    pub fn has_resource_manager(&self) -> bool {
        match self {
            Endpoint::Device(p) => p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tpmrm")),
            Endpoint::Tcp(_) => false,
            // Whatever the helper opened, the backend flushes its own.
            #[cfg(feature = "helper")]
            Endpoint::Helper(_) => false,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Device(p) => write!(f, "{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "swtpm:{a}"),
            #[cfg(feature = "helper")]
            Endpoint::Helper(p) => write!(f, "bcd-helper at {}", p.display()),
        }
    }
}

/// An open connection to a TPM: the raw command channel the backends use,
/// and what a relay (the helper) forwards commands over.
#[derive(Debug)]
pub enum Connection {
    Device(File),
    Tcp(TcpStream),
    #[cfg(feature = "helper")]
    Helper(bcd_helper::TpmSession),
}

impl Connection {
    pub fn open(endpoint: &Endpoint) -> io::Result<Self> {
        match endpoint {
            Endpoint::Device(path) => Ok(Connection::Device(
                OpenOptions::new().read(true).write(true).open(path)?,
            )),
            Endpoint::Tcp(addr) => {
                let s = TcpStream::connect_timeout(addr, Duration::from_secs(5))?;
                s.set_read_timeout(Some(COMMAND_TIMEOUT))?;
                s.set_write_timeout(Some(COMMAND_TIMEOUT))?;
                s.set_nodelay(true)?;
                Ok(Connection::Tcp(s))
            }
            // The helper's errors start `helper: ` and say what to do; a
            // renewal that fails on them reads `renewal: helper: ...`.
            #[cfg(feature = "helper")]
            Endpoint::Helper(socket) => {
                let mut config = bcd_helper::ClientConfig::new(socket);
                config.request_timeout = COMMAND_TIMEOUT;
                bcd_helper::TpmSession::open(&config)
                    .map(Connection::Helper)
                    .map_err(|e| io::Error::other(e.to_string()))
            }
        }
    }

    /// Sends one command and reads its whole response.
    pub fn transceive(&mut self, command: &[u8]) -> io::Result<Vec<u8>> {
        match self {
            Connection::Device(f) => {
                f.write_all(command)?;
                let mut buf = vec![0u8; MAX_RESPONSE];
                // The driver returns the whole response to one read.
                let n = f.read(&mut buf)?;
                buf.truncate(n);
                check_size(&buf)?;
                Ok(buf)
            }
            Connection::Tcp(s) => {
                s.write_all(command)?;
                let mut header = [0u8; 10];
                s.read_exact(&mut header)?;
                let size =
                    u32::from_be_bytes([header[2], header[3], header[4], header[5]]) as usize;
                if !(10..=MAX_RESPONSE).contains(&size) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("a response of {size} bytes"),
                    ));
                }
                let mut buf = header.to_vec();
                buf.resize(size, 0);
                s.read_exact(&mut buf[10..])?;
                Ok(buf)
            }
            #[cfg(feature = "helper")]
            Connection::Helper(session) => {
                let buf = session
                    .transceive(command)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                check_size(&buf)?;
                Ok(buf)
            }
        }
    }
}

fn check_size(buf: &[u8]) -> io::Result<()> {
    if buf.len() < 10 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a response of {} bytes, shorter than its header", buf.len()),
        ));
    }
    let size = u32::from_be_bytes([buf[2], buf[3], buf[4], buf[5]]) as usize;
    if size != buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a response that says {size} bytes and has {}", buf.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_manager_by_device_name() {
        assert!(Endpoint::Device("/dev/tpmrm0".into()).has_resource_manager());
        assert!(!Endpoint::Device("/dev/tpm0".into()).has_resource_manager());
        assert!(!Endpoint::Tcp("127.0.0.1:2321".parse().unwrap()).has_resource_manager());
    }

    #[test]
    fn a_missing_device_cannot_be_opened() {
        let dir = tempfile::tempdir().unwrap();
        let err = Connection::open(&Endpoint::Device(dir.path().join("tpmrm0"))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn response_sizes_are_checked() {
        assert!(check_size(&[0x80, 1, 0, 0, 0, 10, 0, 0, 0, 0]).is_ok());
        assert!(check_size(&[0x80, 1, 0, 0, 0, 12, 0, 0, 0, 0]).is_err());
        assert!(check_size(&[0x80, 1, 0]).is_err());
    }
}
