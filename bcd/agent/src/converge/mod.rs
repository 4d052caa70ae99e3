//! Convergers: make the machine what the NodeSpec says, and say how far it
//! got.
//!
//! Each section is split in two. A pure plan checks every GPU reference,
//! user name, key and firewall rule and computes what the machine must
//! hold, touching nothing, so a spec that cannot be applied fails before
//! anything changes and the last good state stays enforced. The act sits
//! behind a narrow trait handed in at construction: [`DeviceFiles`] (the
//! CDI spec and env files), [`SshdFiles`] (sshd's files) and [`Firewall`]
//! (the node's nftables table). The implementations here act on this
//! machine; an unprivileged node can hand in implementations that ask a
//! privileged helper instead.
//!
//! Every pass re-reads the machine and compares, so drift is repaired and
//! a pass with nothing to do changes nothing.

pub mod access;
pub mod devices;

pub use access::{Firewall, Nft, SshdDirs, SshdFiles};
pub use bcd_core::report::Status;
pub use devices::{DeviceDirs, DeviceFiles};

/// How far a pass got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub message: String,
    /// Files, rules or tables were written or removed in this pass.
    pub changed: bool,
}

impl Outcome {
    pub fn ready(changed: bool) -> Outcome {
        Outcome {
            status: Status::Ready,
            message: String::new(),
            changed,
        }
    }

    /// Not converged: `status` is `Progressing` (retried) or `Failed` (the
    /// spec cannot be applied as it is).
    pub fn not(status: Status, message: String) -> Outcome {
        Outcome {
            status,
            message,
            changed: false,
        }
    }
}
