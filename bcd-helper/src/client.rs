//! The daemon's side: [`Client`] for every request but the TPM's, and
//! [`TpmSession`] for the TPM.
//!
//! A [`Client`] connects at its first request, keeps the connection, and
//! makes a new one at the next request after the old one closed (the
//! helper restarted, or closed it as idle): a closed connection is found
//! before a request is sent on it, never after. A request that fails is
//! never sent again by the client: the caller decides, as it would for the
//! direct operation. Every error is a [`ClientError`] whose text starts
//! `helper: `; a helper that is down fails the request at once.
//!
//! TPM handles live as long as the helper's connection to the TPM, which
//! lives as long as the client's connection to the helper. So TPM commands
//! go over a [`TpmSession`], a blocking connection of its own that never
//! reconnects: once it breaks, every call fails, and the caller opens a
//! new session and forgets its handles (as it does when the TPM device
//! itself goes away).

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::UnixStream;

use crate::error::{ErrorKind, HelperError};
use crate::frame::{self, FrameError};
use crate::request::{Kind, Reply, Request};
use crate::validate::{Invalid, Slot};
use crate::{PROTOCOL_VERSION, wire};

/// Where the helper is and how long to wait for it.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub socket: PathBuf,
    /// Connecting and the handshake together.
    pub connect_timeout: Duration,
    /// One request's answer; longer than the helper's own request timeout,
    /// so the helper's timeout error arrives first.
    pub request_timeout: Duration,
    /// Who is asking, for the helper's log: `bcd 0.1.0`.
    pub software: String,
}

impl ClientConfig {
    pub fn new(socket: impl Into<PathBuf>) -> ClientConfig {
        ClientConfig {
            socket: socket.into(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(310),
            software: format!("bcd {}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// What the helper said of itself in the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub version: u32,
    pub software: String,
}

/// A request through the helper that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "helper: cannot reach bcd-helper at {}: {source}; is bcd-helper.service running?",
        socket.display()
    )]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("helper: bcd-helper at {} did not answer the handshake within {:?}", socket.display(), within)]
    HandshakeTimeout { socket: PathBuf, within: Duration },
    #[error("helper: bcd-helper refused the connection: {0}")]
    Refused(String),
    #[error(
        "helper: bcd-helper speaks protocol version {theirs}, this bcd speaks {ours}: restart bcd and bcd-helper after replacing the binary"
    )]
    Version { ours: u32, theirs: u32 },
    #[error("helper: no answer to {kind} within {within:?}")]
    Timeout { kind: Kind, within: Duration },
    #[error("helper: the connection to bcd-helper broke during {kind}: {source}")]
    Broken {
        kind: Kind,
        #[source]
        source: FrameError,
    },
    #[error("helper: bcd-helper's answer is not the protocol: {0}")]
    Protocol(String),
    #[error("helper: {0}")]
    Invalid(#[from] Invalid),
    #[error("helper: {kind}: {error}")]
    Helper { kind: Kind, error: HelperError },
    #[error("helper: the TPM session ended ({0}); open a new one")]
    SessionEnded(String),
}

impl ClientError {
    /// The request itself is refused (by this side or the helper), so
    /// sending it again cannot help; every other error may pass.
    pub fn is_invalid(&self) -> bool {
        matches!(
            self,
            ClientError::Invalid(_)
                | ClientError::Helper {
                    error: HelperError {
                        kind: ErrorKind::Invalid,
                        ..
                    },
                    ..
                }
        )
    }
}

fn hello(config: &ClientConfig) -> wire::Hello {
    wire::Hello {
        version: PROTOCOL_VERSION,
        software: config.software.clone(),
    }
}

fn check_hello_reply(body: &[u8]) -> Result<ServerInfo, ClientError> {
    let reply: wire::HelloReply = frame::decode("HelloReply", body)
        .map_err(|e| ClientError::Protocol(bcd_sys::error::chain(&e)))?;
    if !reply.refused.is_empty() {
        return Err(ClientError::Refused(reply.refused));
    }
    if reply.version != PROTOCOL_VERSION {
        return Err(ClientError::Version {
            ours: PROTOCOL_VERSION,
            theirs: reply.version,
        });
    }
    Ok(ServerInfo {
        version: reply.version,
        software: reply.software,
    })
}

/// The reply of a response to a request of `kind`.
fn reply_of(kind: Kind, body: &[u8]) -> Result<Reply, ClientError> {
    use wire::response::Result as W;
    let response: wire::Response = frame::decode("Response", body)
        .map_err(|e| ClientError::Protocol(bcd_sys::error::chain(&e)))?;
    let reply = match response.result {
        Some(W::Failure(f)) => {
            return Err(ClientError::Helper {
                kind,
                error: HelperError::from_wire(f),
            });
        }
        Some(W::Done(_)) => Reply::Done,
        Some(W::Written(w)) => Reply::Written { changed: w.changed },
        Some(W::TpmResponse(t)) => Reply::Tpm(t.response),
        Some(W::RolledBack(r)) => Reply::RolledBack {
            swapped: r.swapped,
            message: r.message,
        },
        None => return Err(ClientError::Protocol(format!("an empty answer to {kind}"))),
    };
    if reply.shape() != kind.reply_shape() {
        return Err(ClientError::Protocol(format!(
            "a {:?} answer to {kind}",
            reply.shape()
        )));
    }
    Ok(reply)
}

/// Whether a kept connection was closed by the helper: a peek that does not
/// wait. Between requests nothing may arrive, so data is as bad as EOF.
fn still_open(stream: &impl AsFd) -> bool {
    let mut b = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    matches!(
        rustix::net::recv(
            stream,
            &mut b[..],
            rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT,
        ),
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR)
    )
}

#[derive(Debug)]
struct Connection {
    stream: UnixStream,
    info: ServerInfo,
}

/// The daemon's connection to the helper. Requests are sent one at a time;
/// callers on several tasks wait their turn.
#[derive(Debug)]
pub struct Client {
    config: ClientConfig,
    conn: tokio::sync::Mutex<Option<Connection>>,
}

impl Client {
    /// A client that connects at its first request.
    pub fn new(config: ClientConfig) -> Client {
        Client {
            config,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    async fn connect(&self) -> Result<Connection, ClientError> {
        let socket = &self.config.socket;
        let within = self.config.connect_timeout;
        let unreachable = |source| ClientError::Unreachable {
            socket: socket.clone(),
            source,
        };
        let handshake = async {
            let mut stream = UnixStream::connect(socket).await.map_err(unreachable)?;
            let f = frame::encode(&hello(&self.config))
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            // A helper that refuses may close before reading the Hello; its
            // reply is still there to read.
            let _ = frame::write(&mut stream, &f).await;
            let body = frame::read(&mut stream, frame::MAX_HELLO, within)
                .await
                .map_err(|e| match e {
                    FrameError::Io(source) => unreachable(source),
                    e => ClientError::Protocol(format!("no handshake: {e}")),
                })?;
            let info = check_hello_reply(&body)?;
            Ok(Connection { stream, info })
        };
        tokio::time::timeout(within, handshake).await.map_err(|_| {
            ClientError::HandshakeTimeout {
                socket: socket.clone(),
                within,
            }
        })?
    }

    /// Connects if needed and says what the helper is (`bcd doctor`).
    pub async fn server_info(&self) -> Result<ServerInfo, ClientError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref().filter(|c| still_open(&c.stream)) {
            return Ok(c.info.clone());
        }
        let c = self.connect().await?;
        let info = c.info.clone();
        *guard = Some(c);
        Ok(info)
    }

    /// Sends one request and reads its reply. The request is checked here
    /// first, as the helper will check it, so an invalid one never leaves.
    pub async fn call(&self, request: wire::Request) -> Result<Reply, ClientError> {
        let kind = Request::validate(request.clone())?.kind();
        let f = frame::encode(&request)
            .map_err(|e| ClientError::Invalid(Invalid(format!("the {kind} request: {e}"))))?;
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_some_and(|c| !still_open(&c.stream)) {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(self.connect().await?);
        }
        let conn = guard.as_mut().expect("connected above");
        let within = self.config.request_timeout;
        let exchange = async {
            frame::write(&mut conn.stream, &f).await?;
            frame::read(&mut conn.stream, frame::MAX_FRAME, within).await
        };
        let body = match tokio::time::timeout(within, exchange).await {
            Ok(Ok(body)) => body,
            Ok(Err(source)) => {
                *guard = None;
                return Err(ClientError::Broken { kind, source });
            }
            Err(_) => {
                *guard = None;
                return Err(ClientError::Timeout { kind, within });
            }
        };
        reply_of(kind, &body).inspect_err(|e| {
            if matches!(e, ClientError::Protocol(_)) {
                *guard = None;
            }
        })
    }

    async fn written(&self, kind: wire::request::Kind) -> Result<bool, ClientError> {
        match self.call(wire::Request { kind: Some(kind) }).await? {
            Reply::Written { changed } => Ok(changed),
            other => Err(unexpected(other)),
        }
    }

    async fn done(&self, kind: wire::request::Kind) -> Result<(), ClientError> {
        match self.call(wire::Request { kind: Some(kind) }).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Writes the `nvidia.com/gpu` CDI spec; says whether it changed.
    pub async fn write_cdi_spec(&self, json: Vec<u8>) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteCdiSpec(wire::WriteCdiSpec {
            json,
        }))
        .await
    }

    /// Removes the CDI spec; says whether it was there.
    pub async fn remove_cdi_spec(&self) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::RemoveCdiSpec(wire::RemoveCdiSpec {}))
            .await
    }

    pub async fn write_env_file(&self, m: wire::WriteEnvFile) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteEnvFile(m)).await
    }

    pub async fn remove_env_file(&self, allocation_id: &str) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::RemoveEnvFile(wire::RemoveEnvFile {
            allocation_id: allocation_id.into(),
        }))
        .await
    }

    /// Writes one secret's value for an allocation (0400, memory-backed
    /// only).
    pub async fn write_secret(&self, m: wire::WriteSecret) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteSecret(m)).await
    }

    /// Removes every secret file but these; says whether any went.
    pub async fn retain_secrets(&self, keep: Vec<wire::SecretFile>) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::RetainSecrets(wire::RetainSecrets {
            keep,
        }))
        .await
    }

    /// Writes the sshd files (none: removes them).
    pub async fn write_sshd(&self, m: wire::WriteSshd) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteSshd(m)).await
    }

    pub async fn apply_firewall(
        &self,
        rules: Vec<wire::FirewallRule>,
    ) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::ApplyFirewall(wire::ApplyFirewall {
            rules,
        }))
        .await
    }

    pub async fn delete_firewall(&self) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::DeleteFirewall(wire::DeleteFirewall {}))
            .await
    }

    pub async fn reset_gpu(&self, pci_address: &str) -> Result<(), ClientError> {
        self.done(wire::request::Kind::ResetGpu(wire::ResetGpu {
            pci_address: pci_address.into(),
        }))
        .await
    }

    pub async fn reboot(&self, reason: &str) -> Result<(), ClientError> {
        self.done(wire::request::Kind::Reboot(wire::Reboot {
            reason: reason.into(),
        }))
        .await
    }

    pub async fn kexec(&self, m: wire::Kexec) -> Result<(), ClientError> {
        self.done(wire::request::Kind::Kexec(m)).await
    }

    pub async fn install_slot(
        &self,
        slot: Slot,
        file: &str,
        sha256: [u8; 32],
    ) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::InstallSlot(wire::InstallSlot {
            slot: slot.to_wire(),
            file: file.into(),
            sha256: sha256.to_vec(),
        }))
        .await
    }

    pub async fn switch_slot(&self, slot: Slot, sha256: [u8; 32]) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::SwitchSlot(wire::SwitchSlot {
            slot: slot.to_wire(),
            sha256: sha256.to_vec(),
        }))
        .await
    }

    /// Swaps an unconfirmed upgrade back: whether it swapped, and a line
    /// for the operator.
    pub async fn roll_back(&self) -> Result<(bool, String), ClientError> {
        match self
            .call(wire::Request {
                kind: Some(wire::request::Kind::RollBack(wire::RollBack {})),
            })
            .await?
        {
            Reply::RolledBack { swapped, message } => Ok((swapped, message)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn restart_daemon(&self) -> Result<(), ClientError> {
        self.done(wire::request::Kind::RestartDaemon(wire::RestartDaemon {}))
            .await
    }
}

/// Connects and shakes hands on a blocking socket, whose read and write
/// timeouts are the request timeout afterwards.
fn connect_blocking(
    config: &ClientConfig,
) -> Result<(std::os::unix::net::UnixStream, ServerInfo), ClientError> {
    let socket = &config.socket;
    let unreachable = |source| ClientError::Unreachable {
        socket: socket.clone(),
        source,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(config.connect_timeout))
        .and_then(|()| stream.set_write_timeout(Some(config.connect_timeout)))
        .map_err(unreachable)?;
    let f = frame::encode(&hello(config)).map_err(|e| ClientError::Protocol(e.to_string()))?;
    // A helper that refuses may close before reading the Hello; its reply
    // is still there to read.
    let _ = frame::write_blocking(&mut stream, &f);
    let body = frame::read_blocking(&mut stream, frame::MAX_HELLO).map_err(|e| match e {
        FrameError::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::HandshakeTimeout {
                socket: socket.clone(),
                within: config.connect_timeout,
            }
        }
        FrameError::Io(source) => unreachable(source),
        e => ClientError::Protocol(format!("no handshake: {e}")),
    })?;
    let info = check_hello_reply(&body)?;
    stream
        .set_read_timeout(Some(config.request_timeout))
        .and_then(|()| stream.set_write_timeout(Some(config.request_timeout)))
        .map_err(unreachable)?;
    Ok((stream, info))
}

fn timed_out(e: &FrameError) -> bool {
    matches!(e, FrameError::Io(io) if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// The daemon's connection to the helper for callers that are not async:
/// the agent's machine traits, which the direct implementations satisfy
/// with blocking system calls too. It behaves as [`Client`] does: it
/// connects at its first request, keeps the connection, makes a new one at
/// the next request after the helper closed it, never sends a failed
/// request again, and every error starts `helper: `. Callers on several
/// threads wait their turn.
#[derive(Debug)]
pub struct BlockingClient {
    config: ClientConfig,
    conn: std::sync::Mutex<Option<(std::os::unix::net::UnixStream, ServerInfo)>>,
}

impl BlockingClient {
    pub fn new(config: ClientConfig) -> BlockingClient {
        BlockingClient {
            config,
            conn: std::sync::Mutex::new(None),
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Connects if needed and says what the helper is.
    pub fn server_info(&self) -> Result<ServerInfo, ClientError> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, info)) = guard.as_ref().filter(|(s, _)| still_open(s)) {
            return Ok(info.clone());
        }
        let (stream, info) = connect_blocking(&self.config)?;
        *guard = Some((stream, info.clone()));
        Ok(info)
    }

    /// Sends one request and reads its reply; the request is checked here
    /// first, as the helper will check it.
    pub fn call(&self, request: wire::Request) -> Result<Reply, ClientError> {
        let kind = Request::validate(request.clone())?.kind();
        let f = frame::encode(&request)
            .map_err(|e| ClientError::Invalid(Invalid(format!("the {kind} request: {e}"))))?;
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_some_and(|(s, _)| !still_open(s)) {
            *guard = None;
        }
        if guard.is_none() {
            *guard = Some(connect_blocking(&self.config)?);
        }
        let (stream, _) = guard.as_mut().expect("connected above");
        let exchange = frame::write_blocking(stream, &f)
            .and_then(|()| frame::read_blocking(stream, frame::MAX_FRAME));
        let body = match exchange {
            Ok(body) => body,
            Err(e) => {
                *guard = None;
                return Err(if timed_out(&e) {
                    ClientError::Timeout {
                        kind,
                        within: self.config.request_timeout,
                    }
                } else {
                    ClientError::Broken { kind, source: e }
                });
            }
        };
        reply_of(kind, &body).inspect_err(|e| {
            if matches!(e, ClientError::Protocol(_)) {
                *guard = None;
            }
        })
    }

    fn written(&self, kind: wire::request::Kind) -> Result<bool, ClientError> {
        match self.call(wire::Request { kind: Some(kind) })? {
            Reply::Written { changed } => Ok(changed),
            other => Err(unexpected(other)),
        }
    }

    fn done(&self, kind: wire::request::Kind) -> Result<(), ClientError> {
        match self.call(wire::Request { kind: Some(kind) })? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub fn write_cdi_spec(&self, json: Vec<u8>) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteCdiSpec(wire::WriteCdiSpec {
            json,
        }))
    }

    pub fn remove_cdi_spec(&self) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::RemoveCdiSpec(wire::RemoveCdiSpec {}))
    }

    pub fn write_env_file(&self, m: wire::WriteEnvFile) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteEnvFile(m))
    }

    pub fn remove_env_file(&self, allocation_id: &str) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::RemoveEnvFile(wire::RemoveEnvFile {
            allocation_id: allocation_id.into(),
        }))
    }

    pub fn write_secret(&self, m: wire::WriteSecret) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteSecret(m))
    }

    pub fn retain_secrets(&self, keep: Vec<wire::SecretFile>) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::RetainSecrets(wire::RetainSecrets {
            keep,
        }))
    }

    pub fn write_sshd(&self, m: wire::WriteSshd) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::WriteSshd(m))
    }

    pub fn apply_firewall(&self, rules: Vec<wire::FirewallRule>) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::ApplyFirewall(wire::ApplyFirewall {
            rules,
        }))
    }

    pub fn delete_firewall(&self) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::DeleteFirewall(wire::DeleteFirewall {}))
    }

    pub fn reset_gpu(&self, pci_address: &str) -> Result<(), ClientError> {
        self.done(wire::request::Kind::ResetGpu(wire::ResetGpu {
            pci_address: pci_address.into(),
        }))
    }

    pub fn reboot(&self, reason: &str) -> Result<(), ClientError> {
        self.done(wire::request::Kind::Reboot(wire::Reboot {
            reason: reason.into(),
        }))
    }

    pub fn kexec(&self, m: wire::Kexec) -> Result<(), ClientError> {
        self.done(wire::request::Kind::Kexec(m))
    }

    pub fn install_slot(
        &self,
        slot: Slot,
        file: &str,
        sha256: [u8; 32],
    ) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::InstallSlot(wire::InstallSlot {
            slot: slot.to_wire(),
            file: file.into(),
            sha256: sha256.to_vec(),
        }))
    }

    pub fn switch_slot(&self, slot: Slot, sha256: [u8; 32]) -> Result<bool, ClientError> {
        self.written(wire::request::Kind::SwitchSlot(wire::SwitchSlot {
            slot: slot.to_wire(),
            sha256: sha256.to_vec(),
        }))
    }

    pub fn roll_back(&self) -> Result<(bool, String), ClientError> {
        match self.call(wire::Request {
            kind: Some(wire::request::Kind::RollBack(wire::RollBack {})),
        })? {
            Reply::RolledBack { swapped, message } => Ok((swapped, message)),
            other => Err(unexpected(other)),
        }
    }

    pub fn restart_daemon(&self) -> Result<(), ClientError> {
        self.done(wire::request::Kind::RestartDaemon(wire::RestartDaemon {}))
    }
}

fn unexpected(reply: Reply) -> ClientError {
    ClientError::Protocol(format!("an unexpected {:?} answer", reply.shape()))
}

/// A blocking connection of its own for TPM commands: the helper keeps the
/// TPM open for it, so handles made on it stay valid until it ends. It
/// never reconnects.
#[derive(Debug)]
pub struct TpmSession {
    stream: std::os::unix::net::UnixStream,
    info: ServerInfo,
    request_timeout: Duration,
    ended: Option<String>,
}

impl TpmSession {
    /// Connects and shakes hands (blocking).
    pub fn open(config: &ClientConfig) -> Result<TpmSession, ClientError> {
        let (stream, info) = connect_blocking(config)?;
        Ok(TpmSession {
            stream,
            info,
            request_timeout: config.request_timeout,
            ended: None,
        })
    }

    pub fn server_info(&self) -> &ServerInfo {
        &self.info
    }

    /// Relays one TPM command; returns the TPM's whole response (whatever
    /// its response code: reading it is the caller's).
    pub fn transceive(&mut self, command: &[u8]) -> Result<Vec<u8>, ClientError> {
        if let Some(why) = &self.ended {
            return Err(ClientError::SessionEnded(why.clone()));
        }
        let request = wire::Request {
            kind: Some(wire::request::Kind::TpmCommand(wire::TpmCommand {
                command: command.to_vec(),
            })),
        };
        Request::validate(request.clone())?;
        let f = frame::encode(&request).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let exchange = frame::write_blocking(&mut self.stream, &f)
            .and_then(|()| frame::read_blocking(&mut self.stream, frame::MAX_FRAME));
        let body = match exchange {
            Ok(b) => b,
            Err(e) => {
                let timed_out = timed_out(&e);
                self.ended = Some(e.to_string());
                return Err(if timed_out {
                    ClientError::Timeout {
                        kind: Kind::Tpm,
                        within: self.request_timeout,
                    }
                } else {
                    ClientError::Broken {
                        kind: Kind::Tpm,
                        source: e,
                    }
                });
            }
        };
        match reply_of(Kind::Tpm, &body) {
            Ok(Reply::Tpm(response)) => Ok(response),
            Ok(other) => {
                self.ended = Some("the helper answered out of turn".into());
                Err(unexpected(other))
            }
            Err(e) => {
                if matches!(e, ClientError::Protocol(_)) {
                    self.ended = Some(e.to_string());
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_starts_with_helper() {
        let kind = Kind::WriteCdiSpec;
        let errors = [
            ClientError::Unreachable {
                socket: "/run/bcd/helper.sock".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
            ClientError::HandshakeTimeout {
                socket: "/s".into(),
                within: Duration::from_secs(2),
            },
            ClientError::Refused("no".into()),
            ClientError::Version { ours: 1, theirs: 2 },
            ClientError::Timeout {
                kind,
                within: Duration::from_secs(1),
            },
            ClientError::Broken {
                kind,
                source: FrameError::Closed,
            },
            ClientError::Protocol("x".into()),
            ClientError::Invalid(Invalid("x".into())),
            ClientError::Helper {
                kind,
                error: HelperError::failed("nft refused the table"),
            },
            ClientError::SessionEnded("x".into()),
        ];
        for e in errors {
            assert!(e.to_string().starts_with("helper: "), "{e}");
        }
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_refused() {
        let done = frame::encode(&Reply::Done.to_wire()).unwrap();
        assert!(matches!(
            reply_of(Kind::WriteCdiSpec, &done[4..]),
            Err(ClientError::Protocol(_))
        ));
        assert_eq!(reply_of(Kind::Reboot, &done[4..]).unwrap(), Reply::Done);
        let empty = frame::encode(&wire::Response { result: None }).unwrap();
        assert!(matches!(
            reply_of(Kind::Reboot, &empty[4..]),
            Err(ClientError::Protocol(_))
        ));
        assert!(matches!(
            reply_of(Kind::Reboot, b"\xff\xff"),
            Err(ClientError::Protocol(_))
        ));
    }

    #[test]
    fn the_client_refuses_a_helper_of_another_version() {
        let reply = wire::HelloReply {
            version: PROTOCOL_VERSION + 1,
            software: "bcd-helper 9".into(),
            refused: String::new(),
        };
        let f = frame::encode(&reply).unwrap();
        let e = check_hello_reply(&f[4..]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "helper: bcd-helper speaks protocol version {}, this bcd speaks {PROTOCOL_VERSION}: restart bcd and bcd-helper after replacing the binary",
                PROTOCOL_VERSION + 1
            )
        );
    }
}
