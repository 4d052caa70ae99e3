//! Listening for uevents: a `NETLINK_KOBJECT_UEVENT` socket bound to the
//! kernel's multicast group, read through tokio.
//!
//! The kernel sends every device event to group 1 ([`Group::Kernel`]);
//! udevd re-sends the events it has processed to group 2
//! ([`Group::Udev`]) in its own format. Receiving needs no privilege (the
//! kernel lets any process join these groups); sending to a group needs
//! `CAP_NET_ADMIN` in the network namespace, which is how a test (or a
//! process relaying events) injects one with [`inject`]. The kernel sends
//! device events into every network namespace owned by the initial user
//! namespace, so a rootless container hears none: there the agent relies
//! on its periodic inventory.
//!
//! Anyone with `CAP_NET_ADMIN` can send to the kernel's group, so every
//! datagram is checked against its sender's netlink address: the kernel's
//! is port 0. A monitor opened with [`Accept::Kernel`] (the default for the
//! agent) counts and drops everything else, as udevd does; one opened with
//! [`Accept::Any`] reports who sent each event.
//!
//! When events come faster than they are read, the kernel drops them and
//! the next read fails with `ENOBUFS`: the monitor reports
//! [`Notice::Overflow`], after which the caller must re-read the state it
//! watches, since any event may have been lost.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::io::Errno;
use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, bind, recvfrom, sendto,
    socket_with, sockopt,
};
use tokio::io::unix::AsyncFd;

use crate::uevent::{self, Message, ParseError};

/// The largest datagram read whole. The kernel's are at most 2 KiB of
/// environment plus the header; udevd's are larger but well under this.
pub const RECV_BUFFER: usize = 16 * 1024;
/// The socket receive buffer asked for, so that a burst (every device of a
/// machine at once) fits; the kernel caps it at `net.core.rmem_max`.
pub const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

/// A netlink multicast group of `NETLINK_KOBJECT_UEVENT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The kernel's events (group 1).
    Kernel,
    /// udevd's re-broadcast of processed events (group 2).
    Udev,
}

impl Group {
    fn mask(self) -> u32 {
        match self {
            Group::Kernel => 1,
            Group::Udev => 2,
        }
    }
}

/// Whose datagrams a monitor reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// Only the kernel's (netlink port 0); others are counted and dropped.
    /// On [`Group::Udev`] that is everything: udevd is a process, and this
    /// monitor does not check senders' credentials as libudev does, so the
    /// agent listens to the kernel's group.
    Kernel,
    /// Every sender's, each reported with its [`Sender`].
    Any,
}

/// Who sent a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    Kernel,
    /// A process, by its netlink port id (usually its pid).
    Process(u32),
}

/// What a monitor read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A uevent.
    Event { message: Message, sender: Sender },
    /// The kernel dropped events because the socket's buffer was full:
    /// re-read whatever state the events were watched for.
    Overflow,
    /// A datagram from an accepted sender that is not a uevent.
    Malformed { error: ParseError, sender: Sender },
}

/// Counts since the monitor opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub events: u64,
    pub overflows: u64,
    pub malformed: u64,
    /// Datagrams from senders [`Accept::Kernel`] does not take.
    pub ignored: u64,
}

/// Why the monitor cannot listen.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error(
        "cannot listen for kernel uevents ({what}): device changes are seen only at the next \
         inventory pass; check that this process may open netlink sockets (seccomp or \
         container policy)"
    )]
    Open {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "the kernel uevent monitor needs a tokio runtime with I/O enabled: build the runtime \
         with enable_io()"
    )]
    NoRuntime,
    #[error("reading kernel uevents failed")]
    Receive(#[source] io::Error),
    #[error(
        "cannot send a uevent to netlink group {group:?}: sending needs CAP_NET_ADMIN in this \
         network namespace"
    )]
    Inject {
        group: Group,
        #[source]
        source: io::Error,
    },
}

/// A uevent socket, read with tokio.
#[derive(Debug)]
pub struct Monitor {
    fd: AsyncFd<OwnedFd>,
    accept: Accept,
    buf: Vec<u8>,
    stats: Stats,
}

impl Monitor {
    /// Listens to the kernel's events, from the kernel only: what the agent
    /// uses. Must be called inside a tokio runtime with I/O enabled.
    pub fn kernel() -> Result<Monitor, MonitorError> {
        Monitor::open(Group::Kernel, Accept::Kernel)
    }

    /// Listens to `group`, reporting the datagrams of the senders `accept`
    /// takes. Must be called inside a tokio runtime with I/O enabled.
    pub fn open(group: Group, accept: Accept) -> Result<Monitor, MonitorError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(MonitorError::NoRuntime);
        }
        let open = |what| {
            move |e: Errno| MonitorError::Open {
                what,
                source: e.into(),
            }
        };
        let fd = uevent_socket().map_err(open("socket"))?;
        // A smaller buffer only makes overflows likelier; they are reported.
        let _ = sockopt::set_socket_recv_buffer_size(&fd, SOCKET_BUFFER);
        bind(&fd, &SocketAddrNetlink::new(0, group.mask())).map_err(open("bind"))?;
        // The deprecated constructor is the safe one; its replacement is an
        // unsafe fn (the workspace forbids unsafe) whose one condition, that
        // the descriptor stays open while registered, an OwnedFd moved into
        // the AsyncFd meets by construction.
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd).map_err(|source| MonitorError::Open {
            what: "register with tokio",
            source,
        })?;
        Ok(Monitor {
            fd,
            accept,
            buf: vec![0; RECV_BUFFER],
            stats: Stats::default(),
        })
    }

    /// The next notice. Cancel-safe: a datagram is consumed only by the
    /// call that returns it.
    pub async fn next(&mut self) -> Result<Notice, MonitorError> {
        loop {
            let mut guard = self.fd.readable().await.map_err(MonitorError::Receive)?;
            let buf = &mut self.buf;
            match guard.try_io(|fd| receive(fd.get_ref(), buf)) {
                Ok(Ok(Received::Datagram { len, port })) => {
                    if let Some(notice) = self.notice(len, port) {
                        return Ok(notice);
                    }
                }
                Ok(Ok(Received::Overflow)) => {
                    self.stats.overflows += 1;
                    return Ok(Notice::Overflow);
                }
                Ok(Err(e)) => return Err(MonitorError::Receive(e)),
                // Not readable after all: wait again.
                Err(_would_block) => {}
            }
        }
    }

    /// Counts since the monitor opened.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Turns a received datagram of `len` bytes (of which the buffer holds
    /// at most its size) into a notice, or `None` when it is dropped.
    fn notice(&mut self, len: usize, port: Option<u32>) -> Option<Notice> {
        let sender = match port {
            Some(0) => Sender::Kernel,
            Some(port) => Sender::Process(port),
            // Netlink always gives an address; without one, trust nothing.
            None => Sender::Process(u32::MAX),
        };
        if self.accept == Accept::Kernel && sender != Sender::Kernel {
            self.stats.ignored += 1;
            return None;
        }
        let parsed = if len > self.buf.len() {
            Err(ParseError::Truncated(self.buf.len()))
        } else {
            uevent::parse(&self.buf[..len])
        };
        Some(match parsed {
            Ok(message) => {
                self.stats.events += 1;
                Notice::Event { message, sender }
            }
            Err(error) => {
                self.stats.malformed += 1;
                Notice::Malformed { error, sender }
            }
        })
    }
}

enum Received {
    /// `len` is the datagram's full length, which may exceed the buffer.
    Datagram {
        len: usize,
        port: Option<u32>,
    },
    Overflow,
}

fn uevent_socket() -> Result<OwnedFd, Errno> {
    socket_with(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        Some(netlink::KOBJECT_UEVENT),
    )
}

fn receive(fd: impl AsFd, buf: &mut [u8]) -> io::Result<Received> {
    loop {
        match recvfrom(&fd, &mut *buf, RecvFlags::TRUNC) {
            Ok((_, len, addr)) => {
                let port = addr
                    .and_then(|addr| SocketAddrNetlink::try_from(addr).ok())
                    .map(|addr| addr.pid());
                return Ok(Received::Datagram { len, port });
            }
            Err(Errno::NOBUFS) => return Ok(Received::Overflow),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sends `datagram` (a uevent in either format) to `group` from a socket of
/// this process, as if a device had changed. Needs `CAP_NET_ADMIN`; every
/// listener of the group receives it with this process as the sender.
pub fn inject(datagram: &[u8], group: Group) -> Result<(), MonitorError> {
    let failed = |e: Errno| MonitorError::Inject {
        group,
        source: e.into(),
    };
    let fd = socket_with(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        Some(netlink::KOBJECT_UEVENT),
    )
    .map_err(failed)?;
    sendto(
        &fd,
        datagram,
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, group.mask()),
    )
    .map_err(failed)?;
    Ok(())
}
