//! The wire's enums, and the domain types of `bcd-core` some of them carry,
//! converted in one place with exhaustive matches.
//!
//! Every enum of the protocol has one spelling ([`Spelling`]): what the
//! operator CLI prints, what `--json` renders and what the store keeps.
//! Where `bcd-core` owns the type (command kinds, outcomes, command states,
//! section statuses), the spelling is the core's own name. A wire value a
//! peer sends that is UNSPECIFIED or unknown converts to `None`: the
//! receiver refuses or ignores it, it never becomes a default.

use bcd_core::command::{Kind, Outcome, ServerState};
use bcd_core::report::{InventorySection, StateSection, Status};

use crate::v1;

/// The one spelling of an enum value, for people and the store.
pub trait Spelling: Copy {
    fn spelling(self) -> &'static str;
}

/// A wire enum from its `i32` on the wire; `None` for a value this side
/// does not know.
pub fn wire<E: TryFrom<i32>>(v: i32) -> Option<E> {
    E::try_from(v).ok()
}

impl From<Kind> for v1::CommandKind {
    fn from(k: Kind) -> Self {
        match k {
            Kind::ExecRun => v1::CommandKind::ExecRun,
            Kind::NodeReboot => v1::CommandKind::NodeReboot,
            Kind::BootKexec => v1::CommandKind::BootKexec,
            Kind::InventoryRefresh => v1::CommandKind::InventoryRefresh,
            Kind::GpuReset => v1::CommandKind::GpuReset,
            Kind::DaemonUpgrade => v1::CommandKind::DaemonUpgrade,
            Kind::DaemonRollback => v1::CommandKind::DaemonRollback,
        }
    }
}

/// The kind a wire value names; `None` for UNSPECIFIED or an unknown value.
pub fn kind(v: i32) -> Option<Kind> {
    Some(match wire::<v1::CommandKind>(v)? {
        v1::CommandKind::Unspecified => return None,
        v1::CommandKind::ExecRun => Kind::ExecRun,
        v1::CommandKind::NodeReboot => Kind::NodeReboot,
        v1::CommandKind::BootKexec => Kind::BootKexec,
        v1::CommandKind::InventoryRefresh => Kind::InventoryRefresh,
        v1::CommandKind::GpuReset => Kind::GpuReset,
        v1::CommandKind::DaemonUpgrade => Kind::DaemonUpgrade,
        v1::CommandKind::DaemonRollback => Kind::DaemonRollback,
    })
}

impl Spelling for v1::CommandKind {
    fn spelling(self) -> &'static str {
        kind(self as i32).map_or("unspecified", Kind::name)
    }
}

impl From<Outcome> for v1::Outcome {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Succeeded => v1::Outcome::Succeeded,
            Outcome::Failed => v1::Outcome::Failed,
            Outcome::Expired => v1::Outcome::Expired,
            Outcome::Rejected => v1::Outcome::Rejected,
        }
    }
}

pub fn outcome(v: i32) -> Option<Outcome> {
    Some(match wire::<v1::Outcome>(v)? {
        v1::Outcome::Unspecified => return None,
        v1::Outcome::Succeeded => Outcome::Succeeded,
        v1::Outcome::Failed => Outcome::Failed,
        v1::Outcome::Expired => Outcome::Expired,
        v1::Outcome::Rejected => Outcome::Rejected,
    })
}

impl Spelling for v1::Outcome {
    fn spelling(self) -> &'static str {
        outcome(self as i32).map_or("unspecified", Outcome::name)
    }
}

impl Spelling for v1::ResultEvidence {
    fn spelling(self) -> &'static str {
        match self {
            v1::ResultEvidence::Unspecified => "unspecified",
            v1::ResultEvidence::Unfinished => "unfinished",
            v1::ResultEvidence::NodeSigned => "node-signed",
            v1::ResultEvidence::Decided => "decided",
            v1::ResultEvidence::Forged => "forged",
            v1::ResultEvidence::Legacy => "legacy",
        }
    }
}

impl From<ServerState> for v1::CommandState {
    fn from(s: ServerState) -> Self {
        match s {
            ServerState::Pending => v1::CommandState::Pending,
            ServerState::Dispatched => v1::CommandState::Dispatched,
            ServerState::Acked => v1::CommandState::Acked,
            ServerState::Running => v1::CommandState::Running,
            ServerState::Terminal(Outcome::Succeeded) => v1::CommandState::Succeeded,
            ServerState::Terminal(Outcome::Failed) => v1::CommandState::Failed,
            ServerState::Terminal(Outcome::Expired) => v1::CommandState::Expired,
            ServerState::Terminal(Outcome::Rejected) => v1::CommandState::Rejected,
        }
    }
}

pub fn command_state(v: i32) -> Option<ServerState> {
    Some(match wire::<v1::CommandState>(v)? {
        v1::CommandState::Unspecified => return None,
        v1::CommandState::Pending => ServerState::Pending,
        v1::CommandState::Dispatched => ServerState::Dispatched,
        v1::CommandState::Acked => ServerState::Acked,
        v1::CommandState::Running => ServerState::Running,
        v1::CommandState::Succeeded => ServerState::Terminal(Outcome::Succeeded),
        v1::CommandState::Failed => ServerState::Terminal(Outcome::Failed),
        v1::CommandState::Expired => ServerState::Terminal(Outcome::Expired),
        v1::CommandState::Rejected => ServerState::Terminal(Outcome::Rejected),
    })
}

impl Spelling for v1::CommandState {
    fn spelling(self) -> &'static str {
        command_state(self as i32).map_or("unspecified", ServerState::name)
    }
}

impl From<Status> for v1::SectionState {
    fn from(s: Status) -> Self {
        match s {
            Status::Ready => v1::SectionState::Ready,
            Status::Progressing => v1::SectionState::Progressing,
            Status::Failed => v1::SectionState::Failed,
        }
    }
}

pub fn section_status(v: i32) -> Option<Status> {
    Some(match wire::<v1::SectionState>(v)? {
        v1::SectionState::Unspecified => return None,
        v1::SectionState::Ready => Status::Ready,
        v1::SectionState::Progressing => Status::Progressing,
        v1::SectionState::Failed => Status::Failed,
    })
}

impl Spelling for v1::SectionState {
    fn spelling(self) -> &'static str {
        section_status(self as i32).map_or("unspecified", Status::name)
    }
}

impl From<InventorySection> for v1::InventoryKind {
    fn from(s: InventorySection) -> Self {
        match s {
            InventorySection::Host => v1::InventoryKind::Host,
            InventorySection::Gpus => v1::InventoryKind::Gpus,
            InventorySection::Tpm => v1::InventoryKind::Tpm,
        }
    }
}

/// The inventory section a wire value names; `None` for UNSPECIFIED or an
/// unknown value.
pub fn inventory_section(v: i32) -> Option<InventorySection> {
    Some(match wire::<v1::InventoryKind>(v)? {
        v1::InventoryKind::Unspecified => return None,
        v1::InventoryKind::Host => InventorySection::Host,
        v1::InventoryKind::Gpus => InventorySection::Gpus,
        v1::InventoryKind::Tpm => InventorySection::Tpm,
    })
}

impl Spelling for v1::InventoryKind {
    fn spelling(self) -> &'static str {
        inventory_section(self as i32).map_or("unspecified", InventorySection::name)
    }
}

impl From<StateSection> for v1::StateSection {
    fn from(s: StateSection) -> Self {
        match s {
            StateSection::Access => v1::StateSection::Access,
            StateSection::Devices => v1::StateSection::Devices,
            StateSection::Secrets => v1::StateSection::Secrets,
        }
    }
}

/// A state report's section; `None` for zero or a value this build does
/// not know (the section is not understood).
pub fn state_section(v: i32) -> Option<StateSection> {
    Some(match wire::<v1::StateSection>(v)? {
        v1::StateSection::Unspecified => return None,
        v1::StateSection::Access => StateSection::Access,
        v1::StateSection::Devices => StateSection::Devices,
        v1::StateSection::Secrets => StateSection::Secrets,
    })
}

impl Spelling for v1::StateSection {
    fn spelling(self) -> &'static str {
        state_section(self as i32).map_or("unspecified", StateSection::name)
    }
}

/// Spellings of the enums whose domain type lives outside `bcd-core` (the
/// store, the boot endpoint): the server checks its own names against
/// these, variant by variant.
macro_rules! spelled {
    ($ty:ty { $($variant:ident => $name:literal),* $(,)? }) => {
        impl Spelling for $ty {
            fn spelling(self) -> &'static str {
                match self {
                    $(<$ty>::$variant => $name,)*
                }
            }
        }
    };
}

spelled!(v1::AckState {
    Unspecified => "unspecified",
    Accepted => "accepted",
    Running => "running",
});

spelled!(v1::OperatorRole {
    Unspecified => "unspecified",
    ReadOnly => "read-only",
    Admin => "admin",
});

spelled!(v1::MachineKind {
    Unspecified => "unspecified",
    Ek => "ek",
    EkCa => "ek-ca",
});

spelled!(v1::BindingState {
    Unspecified => "unspecified",
    Active => "active",
    Lost => "lost",
});

spelled!(v1::FirewallProtocol {
    Unspecified => "unspecified",
    Tcp => "tcp",
    Udp => "udp",
});

spelled!(v1::FirewallAction {
    Unspecified => "unspecified",
    Accept => "accept",
    Drop => "drop",
});

spelled!(v1::NodeState {
    Unspecified => "unspecified",
    Connected => "connected",
    Disconnected => "disconnected",
    Unreachable => "unreachable",
});

spelled!(v1::RolloutState {
    Unspecified => "unspecified",
    Running => "running",
    Paused => "paused",
    Halted => "halted",
    Aborted => "aborted",
    Done => "done",
});

spelled!(v1::RolloutNodeStatus {
    Unspecified => "unspecified",
    Waiting => "waiting",
    Upgrading => "upgrading",
    Confirmed => "confirmed",
    Failed => "failed",
    Skipped => "skipped",
    Cancelled => "cancelled",
});

spelled!(v1::RolloutAction {
    Unspecified => "unspecified",
    Pause => "pause",
    Resume => "resume",
    Abort => "abort",
});

spelled!(v1::BootOutcome {
    Unspecified => "unspecified",
    Script => "script",
    NoImage => "no-image",
    Refused => "refused",
});

spelled!(v1::RefusalReason {
    Unspecified => "unspecified",
    UnknownToken => "unknown-token",
    ExpiredToken => "expired-token",
    UsedToken => "used-token",
    NoCertificate => "no-certificate",
    UnknownCertificate => "unknown-certificate",
    NodeDeleted => "node-deleted",
    WrongCertificate => "wrong-certificate",
    CertificateRevoked => "certificate-revoked",
    CertificateExpired => "certificate-expired",
    BadRequest => "bad-request",
    NotFound => "not-found",
    Conflict => "conflict",
    Protocol => "protocol",
    Fenced => "fenced",
    Unavailable => "unavailable",
    Busy => "busy",
    MissedHeartbeats => "missed-heartbeats",
    Superseded => "superseded",
    Internal => "internal",
    OperatorUnauthenticated => "operator-unauthenticated",
    OperatorForbidden => "operator-forbidden",
    NotEnrolled => "not-enrolled",
    Quarantined => "quarantined",
    HelloUnproved => "hello-unproved",
    Draining => "draining",
});

spelled!(v1::ImagePart {
    Unspecified => "unspecified",
    Kernel => "kernel",
    Initrd => "initrd",
});

spelled!(v1::NodeStatementKind {
    Unspecified => "unspecified",
    Deleted => "deleted",
    Revoked => "revoked",
});

/// The value of `E` with spelling `s`, if any (what the CLI parses).
pub fn parse<E>(s: &str) -> Option<E>
where
    E: Spelling + TryFrom<i32>,
{
    // Every enum of the protocol numbers its values from 0 without gaps.
    (0..64)
        .map_while(|i| E::try_from(i).ok())
        .find(|e| e.spelling() == s)
}

/// An image target as the operator spells it: `default` or
/// `mac:52:54:00:12:34:56`.
pub fn image_target(t: &v1::ImageTarget) -> String {
    match &t.target {
        Some(v1::image_target::Target::Default(_)) => "default".to_string(),
        Some(v1::image_target::Target::Mac(m)) => format!("mac:{m}"),
        Some(v1::image_target::Target::Node(n)) => format!("node:{n}"),
        Some(v1::image_target::Target::Pool(p)) => format!("pool:{p}"),
        None => "unspecified".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_types_survive_the_wire_both_ways() {
        for k in Kind::ALL {
            assert_eq!(kind(v1::CommandKind::from(k) as i32), Some(k));
            assert_eq!(v1::CommandKind::from(k).spelling(), k.name());
        }
        assert_eq!(kind(0), None);
        assert_eq!(kind(99), None);
        for o in [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Expired,
            Outcome::Rejected,
        ] {
            assert_eq!(outcome(v1::Outcome::from(o) as i32), Some(o));
            let s = ServerState::Terminal(o);
            assert_eq!(command_state(v1::CommandState::from(s) as i32), Some(s));
        }
        for s in [
            ServerState::Pending,
            ServerState::Dispatched,
            ServerState::Acked,
            ServerState::Running,
        ] {
            assert_eq!(command_state(v1::CommandState::from(s) as i32), Some(s));
            assert_eq!(v1::CommandState::from(s).spelling(), s.name());
        }
        for s in [Status::Ready, Status::Progressing, Status::Failed] {
            assert_eq!(section_status(v1::SectionState::from(s) as i32), Some(s));
        }
        for s in InventorySection::ALL {
            assert_eq!(
                inventory_section(v1::InventoryKind::from(s) as i32),
                Some(s)
            );
        }
        assert_eq!(v1::InventoryKind::Host.spelling(), "host");
        assert_eq!(v1::InventoryKind::Gpus.spelling(), "gpus");
        assert_eq!(v1::InventoryKind::Tpm.spelling(), "tpm");
        for s in StateSection::ALL {
            assert_eq!(state_section(v1::StateSection::from(s) as i32), Some(s));
            assert_eq!(v1::StateSection::from(s).spelling(), s.name());
        }
        assert_eq!(state_section(0), None);
        assert_eq!(state_section(99), None);
        assert_eq!(inventory_section(0), None);
        assert_eq!(inventory_section(99), None);
        assert_eq!(outcome(0), None);
        assert_eq!(command_state(0), None);
        assert_eq!(section_status(0), None);
    }

    #[test]
    fn spellings_parse_back() {
        assert_eq!(
            parse::<v1::CommandKind>("exec.run"),
            Some(v1::CommandKind::ExecRun)
        );
        assert_eq!(
            parse::<v1::RolloutAction>("abort"),
            Some(v1::RolloutAction::Abort)
        );
        assert_eq!(parse::<v1::RolloutAction>("stop"), None);
        assert_eq!(
            parse::<v1::BootOutcome>("no-image"),
            Some(v1::BootOutcome::NoImage)
        );
    }
}
