//! A/B self-update decisions.
//!
//! bcd keeps two slots (A and B) and a `current` link naming the one that
//! runs. An upgrade writes the new binary to the other slot, records a
//! [`Pending`] upgrade (`upgrade.json`), flips the link and restarts. From
//! then on every decision is taken from where the link points, never from
//! the version a binary claims, so a binary that lies about itself cannot
//! confirm itself or disarm the watchdog:
//!
//! - the new binary confirms once the key holder signed that it heard from
//!   it: at its first Welcome it journals a report naming the upgrade
//!   ([`CONFIRM_EVENT`]), a security event the node keeps until the key
//!   holder's signed receipt, and the receipt confirms (a gateway's Welcome
//!   alone, or a gateway that never passes the report on, confirms
//!   nothing). The release floor rises to its sequence, and every older
//!   binary, the one in the other slot included, is refused from then on;
//! - a new binary not confirmed by the deadline, or that keeps crashing,
//!   is swapped back; the old binary then reports FAILED `update-failed` and
//!   never tries that sequence again;
//! - a helper's watchdog swaps back an upgrade still unconfirmed some time
//!   after its deadline, for a binary that never gets as far as deciding.
//!
//! Times are milliseconds on the boot's monotonic clock: a daemon restart
//! keeps the boot, so the deadline survives it.

use std::collections::BTreeSet;

/// The event a new binary journals at its first Welcome: the key holder's
/// receipt of it confirms the upgrade.
pub const CONFIRM_EVENT: &str = "security.release.running";

/// How long a new binary has to be confirmed.
pub const CONFIRM_WITHIN_MS: u64 = 120_000;
/// How long past the deadline the helper's watchdog waits.
pub const HELPER_GRACE_MS: u64 = 30_000;
/// Starts of an unconfirmed binary before it counts as a crash loop.
pub const MAX_STARTS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Slot {
    A,
    B,
}

impl Slot {
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Slot::A => "a",
            Slot::B => "b",
        }
    }
}

/// An upgrade under way: what `upgrade.json` records before the link flips.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub command_id: String,
    pub from: Slot,
    pub from_sequence: u64,
    pub to: Slot,
    pub to_sequence: u64,
    pub to_version: String,
    /// The release key the new release rotates to, applied when it
    /// confirms (hex; opaque here).
    pub next_key: Option<String>,
    /// Monotonic ms by which the new binary must confirm.
    pub deadline_ms: u64,
    /// Times the new binary has started without confirming.
    pub starts: u32,
}

/// The node's durable update state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateState {
    /// Where the `current` link points.
    pub current: Slot,
    /// The sequence of the binary in each slot, as verified when written.
    pub sequences: [u64; 2],
    /// The version its manifest named, for reports.
    pub versions: [String; 2],
    /// Only rises.
    pub floor: u64,
    /// Sequences that failed to confirm: never tried again.
    pub failed: BTreeSet<u64>,
    pub pending: Option<Pending>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "release sequence {sequence} is at or below the release floor {floor}: roll forward with a newer release"
    )]
    BelowFloor { sequence: u64, floor: u64 },
    #[error("release sequence {0} failed to confirm here before; it is not tried again")]
    FailedBefore(u64),
    #[error("an upgrade to sequence {0} is already in progress")]
    InProgress(u64),
    #[error("release sequence {0} is already running")]
    AlreadyRunning(u64),
}

/// What the daemon does at start, or on a tick, or on a confirmation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to settle.
    Run,
    /// The new binary runs unconfirmed: confirm on the key holder's receipt before
    /// `deadline_ms`.
    AwaitWelcome { deadline_ms: u64 },
    /// Point `current` back at the old slot and restart.
    SwapBack { reason: &'static str },
    /// The upgrade is over: report the command's result.
    Finished {
        command_id: String,
        succeeded: bool,
        reason: &'static str,
    },
}

impl UpdateState {
    pub fn new(current: Slot, sequence: u64, version: &str) -> UpdateState {
        let mut sequences = [0; 2];
        sequences[current as usize] = sequence;
        let mut versions = [String::new(), String::new()];
        versions[current as usize] = version.to_string();
        UpdateState {
            current,
            sequences,
            versions,
            floor: sequence,
            failed: BTreeSet::new(),
            pending: None,
        }
    }

    pub fn running_sequence(&self) -> u64 {
        self.sequences[self.current as usize]
    }

    /// The version of the release `current` points at (as its verified
    /// manifest named it), whatever the running binary says of itself.
    pub fn running_version(&self) -> &str {
        &self.versions[self.current as usize]
    }

    /// Checks a release before anything is written; returns the slot to
    /// write it to.
    pub fn plan(&self, sequence: u64) -> Result<Slot, Refusal> {
        if let Some(p) = &self.pending {
            return Err(Refusal::InProgress(p.to_sequence));
        }
        if sequence == self.running_sequence() {
            return Err(Refusal::AlreadyRunning(sequence));
        }
        if sequence <= self.floor {
            return Err(Refusal::BelowFloor {
                sequence,
                floor: self.floor,
            });
        }
        if self.failed.contains(&sequence) {
            return Err(Refusal::FailedBefore(sequence));
        }
        Ok(self.current.other())
    }

    /// The binary is in the other slot, verified: record the upgrade and
    /// flip the link (the caller persists this state, then flips, then
    /// restarts). The new binary has `confirm_within_ms` (normally
    /// [`CONFIRM_WITHIN_MS`]) to be confirmed.
    pub fn begin(
        &mut self,
        command_id: &str,
        sequence: u64,
        version: &str,
        now_ms: u64,
        confirm_within_ms: u64,
    ) -> Result<Slot, Refusal> {
        let to = self.plan(sequence)?;
        self.sequences[to as usize] = sequence;
        self.versions[to as usize] = version.to_string();
        self.pending = Some(Pending {
            command_id: command_id.to_string(),
            from: self.current,
            from_sequence: self.running_sequence(),
            to,
            to_sequence: sequence,
            to_version: version.to_string(),
            next_key: None,
            deadline_ms: now_ms + confirm_within_ms,
            starts: 0,
        });
        self.current = to;
        Ok(to)
    }

    /// A daemon process starts; `link` is where `current` points now.
    /// Each start of the unconfirmed binary counts towards a crash loop
    /// (the supervisor counts the starts it makes itself, with
    /// [`UpdateState::on_spawn`], and the daemon it started does not count
    /// again).
    pub fn on_start(&mut self, link: Slot, now_ms: u64) -> Decision {
        self.decide_start(link, now_ms, true)
    }

    /// The daemon's start when its supervisor already counted it.
    pub fn on_supervised_start(&mut self, link: Slot, now_ms: u64) -> Decision {
        self.decide_start(link, now_ms, false)
    }

    /// The supervisor is about to start the daemon from `link`: a binary
    /// that dies before it decides anything still counts towards a crash
    /// loop, and one past the deadline is not started at all.
    pub fn on_spawn(&mut self, link: Slot, now_ms: u64) -> Decision {
        match &self.pending {
            Some(p) if link == p.to => self.decide_start(link, now_ms, true),
            // Back on the old slot: the old binary settles and reports the
            // upgrade itself when it runs.
            _ => Decision::Run,
        }
    }

    fn decide_start(&mut self, link: Slot, now_ms: u64, count: bool) -> Decision {
        self.current = link;
        let Some(p) = self.pending.clone() else {
            return Decision::Run;
        };
        if link == p.from {
            // Swapped back: by the watchdog, a crash loop, or the helper.
            self.failed.insert(p.to_sequence);
            self.pending = None;
            return Decision::Finished {
                command_id: p.command_id,
                succeeded: false,
                reason: "update-failed",
            };
        }
        let starts = p.starts + u32::from(count);
        if let Some(pending) = &mut self.pending {
            pending.starts = starts;
        }
        if now_ms >= p.deadline_ms {
            return Decision::SwapBack {
                reason: "not confirmed by the key holder before the deadline",
            };
        }
        if starts > MAX_STARTS {
            return Decision::SwapBack {
                reason: "the new binary keeps crashing",
            };
        }
        Decision::AwaitWelcome {
            deadline_ms: p.deadline_ms,
        }
    }

    /// The daemon's own watchdog, on its timer.
    pub fn on_tick(&self, now_ms: u64) -> Decision {
        match &self.pending {
            Some(p) if self.current == p.to && now_ms >= p.deadline_ms => Decision::SwapBack {
                reason: "not confirmed by the key holder before the deadline",
            },
            _ => Decision::Run,
        }
    }

    /// The helper's watchdog: an upgrade still unconfirmed `grace_ms`
    /// (normally [`HELPER_GRACE_MS`]) past its deadline is swapped back
    /// whatever the new binary does.
    pub fn on_helper_tick(&self, now_ms: u64, grace_ms: u64) -> Decision {
        match &self.pending {
            Some(p) if self.current == p.to && now_ms >= p.deadline_ms + grace_ms => {
                Decision::SwapBack {
                    reason: "unconfirmed past the helper's deadline",
                }
            }
            _ => Decision::Run,
        }
    }

    /// The upgrade the running binary awaits confirmation of, if it is the
    /// new one: its command and the release it installs.
    pub fn awaiting(&self) -> Option<(&str, u64)> {
        self.pending
            .as_ref()
            .filter(|p| self.current == p.to)
            .map(|p| (p.command_id.as_str(), p.to_sequence))
    }

    /// The key holder confirmed it heard from the new binary: it confirms
    /// if it is the new one.
    pub fn on_confirmed(&mut self) -> Decision {
        match self.pending.clone() {
            Some(p) if self.current == p.to => {
                self.floor = self.floor.max(p.to_sequence);
                self.pending = None;
                Decision::Finished {
                    command_id: p.command_id,
                    succeeded: true,
                    reason: "",
                }
            }
            _ => Decision::Run,
        }
    }

    /// Performs a swap back decided above: the link returns to the old slot.
    pub fn swap_back(&mut self) -> Slot {
        if let Some(p) = &self.pending {
            self.current = p.from;
        }
        self.current
    }

    /// An operator aborts the rollout with rollback: an unconfirmed upgrade
    /// is swapped back (the old binary then reports it failed); a confirmed
    /// release is never taken backwards.
    pub fn abort(&self) -> Decision {
        match &self.pending {
            Some(p) if self.current == p.to => Decision::SwapBack {
                reason: "the rollout was aborted with rollback",
            },
            _ => Decision::Run,
        }
    }

    /// Whether a slot may run at all: never a binary below the floor.
    pub fn usable(&self, slot: Slot) -> bool {
        self.sequences[slot as usize] >= self.floor
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn upgraded(now: u64) -> UpdateState {
        let mut s = UpdateState::new(Slot::A, 10, "1.0.0");
        assert_eq!(
            s.begin("cmd-1", 11, "1.1.0", now, CONFIRM_WITHIN_MS),
            Ok(Slot::B)
        );
        s
    }

    #[test]
    fn confirm_raises_the_floor_and_refuses_older_binaries() {
        let mut s = upgraded(0);
        assert_eq!(
            s.on_start(Slot::B, 1_000),
            Decision::AwaitWelcome {
                deadline_ms: 120_000
            }
        );
        assert_eq!(
            s.on_confirmed(),
            Decision::Finished {
                command_id: "cmd-1".into(),
                succeeded: true,
                reason: ""
            }
        );
        assert_eq!(s.floor, 11);
        assert!(
            !s.usable(Slot::A),
            "the old binary in the other slot is refused"
        );
        assert_eq!(
            s.plan(10),
            Err(Refusal::BelowFloor {
                sequence: 10,
                floor: 11
            })
        );
        assert_eq!(s.plan(11), Err(Refusal::AlreadyRunning(11)));
        assert_eq!(s.plan(12), Ok(Slot::A), "roll forward");
        assert_eq!(
            s.on_confirmed(),
            Decision::Run,
            "later confirmations change nothing"
        );
    }

    #[test]
    fn no_welcome_by_the_deadline_swaps_back_and_the_old_binary_reports_failed() {
        let mut s = upgraded(0);
        s.on_start(Slot::B, 1_000);
        assert_eq!(s.on_tick(119_999), Decision::Run);
        assert!(matches!(s.on_tick(120_000), Decision::SwapBack { .. }));
        assert_eq!(s.swap_back(), Slot::A);
        // The old binary starts from the old slot.
        assert_eq!(
            s.on_start(Slot::A, 121_000),
            Decision::Finished {
                command_id: "cmd-1".into(),
                succeeded: false,
                reason: "update-failed"
            }
        );
        assert_eq!(s.floor, 10);
        assert_eq!(
            s.plan(11),
            Err(Refusal::FailedBefore(11)),
            "never tried again"
        );
        assert_eq!(s.on_start(Slot::A, 130_000), Decision::Run, "reported once");
    }

    #[test]
    fn a_crash_loop_swaps_back() {
        let mut s = upgraded(0);
        for i in 0..MAX_STARTS {
            assert!(matches!(
                s.on_start(Slot::B, 1_000 + u64::from(i)),
                Decision::AwaitWelcome { .. }
            ));
        }
        assert!(matches!(
            s.on_start(Slot::B, 2_000),
            Decision::SwapBack { .. }
        ));
    }

    #[test]
    fn a_restart_after_the_deadline_swaps_back() {
        let mut s = upgraded(0);
        assert!(matches!(
            s.on_start(Slot::B, 125_000),
            Decision::SwapBack { .. }
        ));
    }

    #[test]
    fn the_helper_swaps_back_what_never_decides() {
        let mut s = upgraded(0);
        s.on_start(Slot::B, 1_000);
        assert_eq!(s.on_helper_tick(149_999, HELPER_GRACE_MS), Decision::Run);
        assert!(matches!(
            s.on_helper_tick(150_000, HELPER_GRACE_MS),
            Decision::SwapBack { .. }
        ));
    }

    /// A binary that claims any version decides nothing: only the link and
    /// the pending record count. The old slot's binary cannot confirm the
    /// upgrade, and a lie cannot disarm the watchdog.
    #[test]
    fn a_lying_binary_cannot_confirm_or_disarm() {
        let mut s = upgraded(0);
        // The new binary starts (whatever version it claims) and never gets
        // a Welcome: the watchdog fires all the same.
        s.on_start(Slot::B, 1_000);
        assert!(matches!(s.on_tick(120_000), Decision::SwapBack { .. }));
        // A Welcome reaching the old binary (after a swap back) confirms
        // nothing.
        let mut t = upgraded(0);
        t.swap_back();
        assert_eq!(t.on_confirmed(), Decision::Run);
        assert_eq!(t.floor, 10);
    }

    /// A binary that dies before it decides anything: the supervisor's
    /// count of its own spawns ends the loop, and the daemon it starts does
    /// not count the same start twice.
    #[test]
    fn the_supervisor_counts_spawns_of_a_binary_that_never_decides() {
        let mut s = upgraded(0);
        for i in 0..MAX_STARTS {
            assert!(matches!(
                s.on_spawn(Slot::B, 1_000 + u64::from(i)),
                Decision::AwaitWelcome { .. }
            ));
        }
        assert!(matches!(
            s.on_supervised_start(Slot::B, 1_500),
            Decision::AwaitWelcome { .. }
        ));
        assert!(matches!(
            s.on_spawn(Slot::B, 2_000),
            Decision::SwapBack { .. }
        ));
        s.swap_back();
        // The supervisor starts the old binary without settling anything:
        // the old binary reports the failure itself.
        assert_eq!(s.on_spawn(Slot::A, 2_100), Decision::Run);
        assert!(s.pending.is_some());
        assert!(matches!(
            s.on_supervised_start(Slot::A, 2_200),
            Decision::Finished {
                succeeded: false,
                ..
            }
        ));
    }

    #[test]
    fn abort_with_rollback_returns_only_nodes_still_upgrading() {
        let mut s = upgraded(0);
        s.on_start(Slot::B, 1_000);
        assert!(matches!(s.abort(), Decision::SwapBack { .. }));
        s.swap_back();
        assert!(matches!(
            s.on_start(Slot::A, 2_000),
            Decision::Finished {
                succeeded: false,
                reason: "update-failed",
                ..
            }
        ));
        // A confirmed node is never taken backwards.
        let mut c = upgraded(0);
        c.on_start(Slot::B, 1_000);
        c.on_confirmed();
        assert_eq!(c.abort(), Decision::Run);
        assert_eq!(c.current, Slot::B);
        assert_eq!(c.running_version(), "1.1.0");
    }

    #[test]
    fn the_version_reported_is_the_one_the_link_names() {
        let mut s = upgraded(0);
        assert_eq!(s.running_version(), "1.1.0");
        s.swap_back();
        assert_eq!(s.running_version(), "1.0.0");
    }

    #[test]
    fn one_upgrade_at_a_time() {
        let s = upgraded(0);
        assert_eq!(s.plan(12), Err(Refusal::InProgress(11)));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Upgrade(u64),
        Start,
        Welcome,
        Tick(u64),
        Helper(u64),
        SwapBack,
        Spawn,
        Abort,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..40).prop_map(Op::Upgrade),
            Just(Op::Start),
            Just(Op::Welcome),
            (0u64..200_000).prop_map(Op::Tick),
            (0u64..200_000).prop_map(Op::Helper),
            Just(Op::SwapBack),
            Just(Op::Spawn),
            Just(Op::Abort),
        ]
    }

    proptest! {
        /// Whatever happens: the floor never falls, the running binary is
        /// never below the floor, a failed sequence is never started again,
        /// and each upgrade ends with exactly one result.
        #[test]
        fn floor_and_results_hold(ops in prop::collection::vec(op(), 1..100)) {
            let mut s = UpdateState::new(Slot::A, 10, "v10");
            let mut now = 0u64;
            let mut floor = s.floor;
            let mut results = std::collections::BTreeMap::<String, u32>::new();
            let mut n = 0;
            for op in ops {
                now += 500;
                match op {
                    Op::Upgrade(seq) => {
                        let failed_before = s.failed.contains(&seq);
                        n += 1;
                        if s.begin(&format!("c{n}"), seq, "v", now, CONFIRM_WITHIN_MS).is_ok() {
                            prop_assert!(!failed_before && seq > floor);
                        }
                    }
                    Op::Start => {
                        let link = s.current;
                        if let Decision::Finished { command_id, .. } = s.on_start(link, now) {
                            *results.entry(command_id).or_default() += 1;
                        }
                    }
                    Op::Welcome => {
                        if let Decision::Finished { command_id, .. } = s.on_confirmed() {
                            *results.entry(command_id).or_default() += 1;
                        }
                    }
                    Op::Tick(t) | Op::Helper(t) => {
                        let d = if matches!(op, Op::Tick(_)) { s.on_tick(now + t) } else { s.on_helper_tick(now + t, HELPER_GRACE_MS) };
                        if matches!(d, Decision::SwapBack { .. }) {
                            s.swap_back();
                        }
                    }
                    Op::SwapBack => {
                        s.swap_back();
                    }
                    Op::Spawn => {
                        let link = s.current;
                        let d = s.on_spawn(link, now);
                        prop_assert!(!matches!(d, Decision::Finished { .. }), "the supervisor settles nothing");
                        if matches!(d, Decision::SwapBack { .. }) {
                            s.swap_back();
                        }
                    }
                    Op::Abort => {
                        let confirmed = s.pending.is_none();
                        if matches!(s.abort(), Decision::SwapBack { .. }) {
                            prop_assert!(!confirmed);
                            s.swap_back();
                        }
                    }
                }
                prop_assert!(s.floor >= floor);
                floor = s.floor;
                prop_assert!(s.pending.is_some() || s.usable(s.current));
                for n in results.values() {
                    prop_assert_eq!(*n, 1);
                }
            }
        }
    }
}
