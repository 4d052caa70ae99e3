//! Commands, exactly once: the rules both ends apply.
//!
//! A command is journaled `accepted` (durably) before anything else happens,
//! `running` (with the boot id) immediately before its side effect, and
//! `done` with its result after it; the result stays in the journal until the
//! server acknowledges it. From those three durable states the node decides,
//! after any crash, what a command still needs, and never runs a side effect
//! twice:
//!
//! | journal | on a replayed dispatch | on restart ([`recover`]) |
//! |---|---|---|
//! | none | accept and run (if valid) | — |
//! | accepted | re-attach | run now: the side effect never started |
//! | running | re-attach | self-terminating kind and a new boot: SUCCEEDED `rebooted`; otherwise FAILED `interrupted` |
//! | done | resend the result | resend the result until acknowledged |
//!
//! The server side ([`on_hello`], [`apply_result`]) keeps at most one
//! terminal result per command and decides what a reconnecting node gets
//! replayed.
//!
//! A journal can be lost (a ramdisk boots with a new one), and a gateway can
//! keep a signed dispatch it relayed and send it again. So the node also
//! keeps a *sequence floor* outside the journal (beside its server time
//! mark): the highest sequence it accepted, durable before the side effect
//! starts. A dispatch at or below it is refused unless its kind is
//! retry-safe, and no command lives longer than [`MAX_LIFE`] from its
//! issue, which bounds what a node that lost even its floor could be
//! replayed.

use std::time::Duration;

/// The longest a command may live from its issue to its `not_after`
/// (upgrades included): the API refuses more, and so does the node.
pub const MAX_LIFE: Duration = Duration::from_secs(24 * 3600);

/// What a command does, and the two facts recovery needs about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Run a program with arguments; capture exit code and bounded output.
    ExecRun,
    /// Reboot the machine.
    NodeReboot,
    /// Load a kernel and initrd and jump into it.
    BootKexec,
    /// Re-read the hardware inventory and report what changed.
    InventoryRefresh,
    /// Reset one GPU (PCI function reset, or unbind and bind).
    GpuReset,
    /// Install a signed release in the other slot and restart into it; the
    /// result comes from the update state (`bcd_core::update`), not from
    /// the process that started it.
    DaemonUpgrade,
    /// Swap an unconfirmed upgrade back (a rollout aborted with rollback);
    /// a confirmed release is never taken backwards.
    DaemonRollback,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::ExecRun,
        Kind::NodeReboot,
        Kind::BootKexec,
        Kind::InventoryRefresh,
        Kind::GpuReset,
        Kind::DaemonUpgrade,
        Kind::DaemonRollback,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::ExecRun => "exec.run",
            Kind::NodeReboot => "node.reboot",
            Kind::BootKexec => "boot.kexec",
            Kind::InventoryRefresh => "inventory.refresh",
            Kind::GpuReset => "gpu.reset",
            Kind::DaemonUpgrade => "daemon.upgrade",
            Kind::DaemonRollback => "daemon.rollback",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Every kind's name, comma-separated: what an error text that lists
    /// them says, so a new kind is listed without anyone writing it down.
    pub fn names() -> String {
        Kind::ALL.map(Kind::name).join(", ")
    }

    /// Running it twice does no harm, so after a journal loss the server may
    /// replay it.
    pub fn retry_safe(self) -> bool {
        matches!(self, Kind::InventoryRefresh)
    }

    /// Its side effect ends the process that runs it (a reboot or kexec):
    /// success shows as a new boot.
    pub fn self_terminating(self) -> bool {
        matches!(self, Kind::NodeReboot | Kind::BootKexec)
    }

    /// Its side effect restarts the daemon on the same boot, and the update
    /// state, not the journal, knows how it ended.
    pub fn restarts_daemon(self) -> bool {
        matches!(self, Kind::DaemonUpgrade)
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Succeeded,
    Failed,
    Expired,
    Rejected,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Succeeded => "SUCCEEDED",
            Outcome::Failed => "FAILED",
            Outcome::Expired => "EXPIRED",
            Outcome::Rejected => "REJECTED",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Expired,
            Outcome::Rejected,
        ]
        .into_iter()
        .find(|o| o.name() == s)
    }
}

/// Reasons carried with results.
pub mod reason {
    pub const REBOOTED: &str = "rebooted";
    pub const INTERRUPTED: &str = "interrupted";
    pub const JOURNAL_LOST: &str = "journal-lost";
    pub const EXPIRED: &str = "expired";
    pub const UPDATE_FAILED: &str = "update-failed";
}

/// A command's durable state in the node's journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Journaled {
    Accepted,
    Running { boot_id: String },
    Done { acked: bool },
}

/// Why the node refuses a dispatch it does not already know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("signature: {0}")]
    Signature(String),
    #[error("the command is for node {0}, not this one")]
    WrongNode(String),
    #[error("a command kind this node does not know")]
    UnknownKind,
    #[error("out of order: sequence {seq} after {highest}")]
    OutOfOrder { seq: u64, highest: u64 },
    #[error(
        "replayed: sequence {seq} is at or below {floor}, the highest this node took on \
         (its journal may be new, its floor is not)"
    )]
    Replayed { seq: u64, floor: u64 },
    #[error("lives {life_ms} ms from issue to not_after, longer than the 24 hours a command may")]
    TooLong { life_ms: i64 },
    #[error("expired: not_after {not_after_ms} has passed on server time")]
    Expired { not_after_ms: i64 },
    #[error("below min_generation {min}: applied generation is {applied}")]
    BelowMinGeneration { min: u64, applied: u64 },
}

impl Rejection {
    /// The outcome a rejection is reported with.
    pub fn outcome(&self) -> Outcome {
        match self {
            Rejection::Expired { .. } => Outcome::Expired,
            _ => Outcome::Rejected,
        }
    }
}

/// What the node does with a dispatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnDispatch {
    /// Journal it as accepted, then run it.
    Accept,
    /// Known and not finished: report it running; do not start it again.
    Reattach,
    /// Known and finished: send the journaled result again.
    ResendResult,
    /// Refuse it with a terminal result; nothing runs.
    Reject(Rejection),
}

/// Facts about a dispatch the shell has established.
#[derive(Debug, Clone)]
pub struct DispatchFacts {
    /// `Err` when the signature did not verify against a worker key.
    pub signature: Result<(), String>,
    pub node_id: String,
    /// `None`: a kind this node does not know (or none).
    pub kind: Option<Kind>,
    pub seq: u64,
    pub issued_at_ms: i64,
    pub not_after_ms: i64,
    pub min_generation: u64,
}

/// The node's context for judging a dispatch.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    pub node_id: &'a str,
    /// The highest sequence number this journal has accepted.
    pub highest_seq: u64,
    /// The highest sequence number this node has accepted, kept outside the
    /// journal (it survives a lost journal).
    pub seq_floor: u64,
    /// Server time now, through the Welcome offset; `None` before a Welcome.
    pub server_now_ms: Option<i64>,
    pub applied_generation: u64,
}

pub fn on_dispatch(
    journaled: Option<&Journaled>,
    d: &DispatchFacts,
    node: &NodeView<'_>,
) -> OnDispatch {
    match journaled {
        Some(Journaled::Done { .. }) => return OnDispatch::ResendResult,
        Some(Journaled::Accepted | Journaled::Running { .. }) => return OnDispatch::Reattach,
        None => {}
    }
    if let Err(e) = &d.signature {
        return OnDispatch::Reject(Rejection::Signature(e.clone()));
    }
    if d.node_id != node.node_id {
        return OnDispatch::Reject(Rejection::WrongNode(d.node_id.clone()));
    }
    let Some(kind) = d.kind else {
        return OnDispatch::Reject(Rejection::UnknownKind);
    };
    if d.seq <= node.highest_seq {
        return OnDispatch::Reject(Rejection::OutOfOrder {
            seq: d.seq,
            highest: node.highest_seq,
        });
    }
    // Below the floor: a journal lost since. The server replays only what
    // is retry-safe into a new journal; anything else is a replay.
    if d.seq <= node.seq_floor && !kind.retry_safe() {
        return OnDispatch::Reject(Rejection::Replayed {
            seq: d.seq,
            floor: node.seq_floor,
        });
    }
    let life_ms = d.not_after_ms.saturating_sub(d.issued_at_ms);
    if life_ms > MAX_LIFE.as_millis() as i64 {
        return OnDispatch::Reject(Rejection::TooLong { life_ms });
    }
    // Without a server time there is no dispatch (it arrives after Welcome);
    // an unknown now never expires anything.
    if node.server_now_ms.is_some_and(|now| now > d.not_after_ms) {
        return OnDispatch::Reject(Rejection::Expired {
            not_after_ms: d.not_after_ms,
        });
    }
    if d.min_generation > node.applied_generation {
        return OnDispatch::Reject(Rejection::BelowMinGeneration {
            min: d.min_generation,
            applied: node.applied_generation,
        });
    }
    OnDispatch::Accept
}

/// What a restarted daemon does about one journaled command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Accepted, never started: run it now.
    Run,
    /// Finish it with this outcome and reason, without running anything.
    Finish(Outcome, &'static str),
    /// Its result is journaled and not acknowledged: send it again.
    Resend,
    /// A daemon upgrade under way: the update state settles it (and if the
    /// update state has no record of it, it was interrupted before the
    /// switch).
    Upgrade,
    Nothing,
}

pub fn recover(kind: Option<Kind>, journaled: &Journaled, boot_id: &str) -> Recovery {
    match journaled {
        Journaled::Accepted => Recovery::Run,
        Journaled::Running { .. } if kind.is_some_and(Kind::restarts_daemon) => Recovery::Upgrade,
        Journaled::Running { boot_id: then } => {
            if kind.is_some_and(Kind::self_terminating) && then != boot_id {
                Recovery::Finish(Outcome::Succeeded, reason::REBOOTED)
            } else {
                Recovery::Finish(Outcome::Failed, reason::INTERRUPTED)
            }
        }
        Journaled::Done { acked: false } => Recovery::Resend,
        Journaled::Done { acked: true } => Recovery::Nothing,
    }
}

/// A command's state on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerState {
    Pending,
    Dispatched,
    Acked,
    Running,
    Terminal(Outcome),
}

impl ServerState {
    pub fn name(self) -> &'static str {
        match self {
            ServerState::Pending => "pending",
            ServerState::Dispatched => "dispatched",
            ServerState::Acked => "acked",
            ServerState::Running => "running",
            ServerState::Terminal(Outcome::Succeeded) => "succeeded",
            ServerState::Terminal(Outcome::Failed) => "failed",
            ServerState::Terminal(Outcome::Expired) => "expired",
            ServerState::Terminal(Outcome::Rejected) => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<ServerState> {
        Some(match s {
            "pending" => ServerState::Pending,
            "dispatched" => ServerState::Dispatched,
            "acked" => ServerState::Acked,
            "running" => ServerState::Running,
            "succeeded" => ServerState::Terminal(Outcome::Succeeded),
            "failed" => ServerState::Terminal(Outcome::Failed),
            "expired" => ServerState::Terminal(Outcome::Expired),
            "rejected" => ServerState::Terminal(Outcome::Rejected),
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, ServerState::Terminal(_))
    }

    /// Dispatched to a session and not finished.
    pub fn in_flight(self) -> bool {
        matches!(
            self,
            ServerState::Dispatched | ServerState::Acked | ServerState::Running
        )
    }
}

/// A result arriving at the server: the first terminal result wins, from
/// any epoch (results are facts); later ones change nothing. Returns the new
/// state, or `None` if nothing changes.
pub fn apply_result(current: ServerState, outcome: Outcome) -> Option<ServerState> {
    (!current.is_terminal()).then_some(ServerState::Terminal(outcome))
}

/// What the node reports about a command in its Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeReport {
    /// Not in the node's journal.
    Unknown,
    /// Accepted or running: the node is on it.
    Running,
    /// Finished; the result follows on the stream.
    Done,
}

/// What the Hello transaction does with one in-flight command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloDecision {
    /// Dispatch it again, in sequence order, under the new epoch.
    Replay,
    /// The node is on it: move it to the new epoch without a replay.
    KeepRunning,
    /// Its result is on its way: move it to the new epoch, do not replay.
    AwaitResult,
    /// Finish it now.
    Finish(Outcome, &'static str),
}

/// Decides, at a Hello, what becomes of an in-flight command. `new_journal`:
/// the node's journal id differs from the previous session's;
/// `new_boot`: so does its boot id.
pub fn on_hello(
    kind: Kind,
    state: ServerState,
    report: NodeReport,
    new_journal: bool,
    new_boot: bool,
) -> HelloDecision {
    // A self-terminating command the node took on (it acknowledged it, or
    // its journal still knows it) and a new boot: it did what it was for.
    let taken =
        matches!(state, ServerState::Acked | ServerState::Running) || report != NodeReport::Unknown;
    if kind.self_terminating() && new_boot && taken {
        // It did what it was for; neither side replays it.
        return HelloDecision::Finish(Outcome::Succeeded, reason::REBOOTED);
    }
    match report {
        NodeReport::Done => HelloDecision::AwaitResult,
        NodeReport::Running => HelloDecision::KeepRunning,
        NodeReport::Unknown if new_journal && !kind.retry_safe() => {
            HelloDecision::Finish(Outcome::Failed, reason::JOURNAL_LOST)
        }
        NodeReport::Unknown => HelloDecision::Replay,
    }
}

#[cfg(test)]
mod tests;
