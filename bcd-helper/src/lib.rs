//! The privileged helper of an unprivileged `bcd node`: its protocol, the
//! validation of every request, the socket server and client, and systemd
//! over D-Bus.
//!
//! A node installed unprivileged runs `bcd node` as its own user and
//! `bcd helper` as root. The daemon asks the helper, over a unix stream
//! socket (`/run/bcd/helper.sock` by default), for each act that needs
//! root: writing the CDI spec, an allocation's env file and secrets, the sshd files,
//! table `inet bcd`, a GPU reset, reboot, kexec, the self-update steps and
//! TPM access. This crate owns:
//!
//! - **the protocol** ([`wire`], [`frame`]): protobuf messages (generated
//!   from `proto/helper.proto` by protox and prost-build, no system
//!   `protoc`) in frames of a 4-byte big-endian length and at most
//!   [`frame::MAX_FRAME`] bytes. The first frame each way is a handshake
//!   whose shape never changes: a peer of another [`PROTOCOL_VERSION`] is
//!   refused, both ways, with a text that says to restart both programs;
//! - **validation** ([`validate`], [`request`]): every request is untrusted
//!   input, turned by pure functions into a typed [`Request`] or refused.
//!   A handler cannot be given anything else;
//! - **the server** ([`server`]): a tokio unix listener that checks each
//!   peer's `SO_PEERCRED` against the one configured user (root only when
//!   configured), caps connections, validates, and calls a [`Handler`] one
//!   request at a time per connection under a timeout;
//! - **the client** ([`client`]): the async [`Client`] the daemon uses for
//!   everything but the TPM, and the blocking [`TpmSession`] that relays
//!   TPM commands on a connection of its own. Every failure is a
//!   [`ClientError`] whose text starts `helper: `; none ends the caller;
//! - **systemd over D-Bus** ([`systemd`]): reboot through logind, honouring
//!   block inhibitors for a bounded time, and restarting a unit through the
//!   systemd manager, waiting for its job. Where there is no systemd (a
//!   ramdisk), [`systemd::detect`] says so and the caller takes the direct
//!   path.
//!
//! It must not act: nothing here writes a file, runs `nft` or touches a
//! device. The handler that does is the agent's (`bcd/agent`, the
//! `bcd helper` subcommand), on top of the typed requests; the unprivileged
//! daemon's side of each act lives there too. Neighbours: `cdi` checks the
//! CDI spec a client sends; `bcd/tpm` is the attestor whose commands
//! [`validate::TPM_COMMANDS`] allows; the agent's access converger
//! (`bcd/agent/src/access.rs`) checks keys and names the same way
//! [`validate`] does.
//!
//! Tests: the server and client run over a real socket in a temporary
//! directory, with clients of other uids (threads that drop to them, so the
//! kernel reports them in `SO_PEERCRED`), handshakes of other versions both
//! ways, and frames that are oversized, truncated or not protobuf. The
//! D-Bus code is tested against a real `dbus-daemon` on a private bus the
//! test starts; logind and systemd themselves cannot run in a test, so the
//! test serves `org.freedesktop.login1` and `org.freedesktop.systemd1` on
//! that bus with only the methods and the signal used here, and asserts
//! the calls, the inhibitor wait and its bound, and the errors. The request
//! decoder has a cargo-fuzz target in `fuzz/`, kept out of the workspace.
#![forbid(unsafe_code)]
// Unit tests are exempt from the one-clock rule (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod client;
pub mod error;
pub mod frame;
pub mod request;
pub mod server;
#[cfg(feature = "systemd")]
pub mod systemd;
pub mod validate;

/// The protobuf messages of `proto/helper.proto`.
#[allow(clippy::all, missing_debug_implementations)]
pub mod wire {
    include!(concat!(env!("OUT_DIR"), "/bcd.helper.v1.rs"));
}

pub use client::{BlockingClient, Client, ClientConfig, ClientError, ServerInfo, TpmSession};
pub use error::{ErrorKind, HelperError};
pub use request::{Kind, Reply, ReplyShape, Request};
pub use server::{Handler, Peer, Server, ServerConfig, ServerError};
pub use validate::Invalid;

/// The protocol version this build speaks. A helper and a daemon of
/// different versions refuse each other at the handshake.
pub const PROTOCOL_VERSION: u32 = 1;

/// Where the helper listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/bcd/helper.sock";
