//! Self-update, the daemon's side of `bcd_core::update`: the slots on disk,
//! the boot's monotonic clock, restarting into the binary `current` names,
//! and `bcd supervise` and `bcd rollback`, which keep an upgrade's promises
//! when the new binary cannot.
//!
//! Every decision is taken from where `slots/current` points and the
//! pending record in `update.json`, never from what a binary says about its
//! own version.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bcd_core::crash_loop::{CrashLoop, is_crash_loop};
use bcd_core::update::{self, Decision, Refusal, Slot, UpdateState};
use tracing::{info, warn};

use crate::slots::{SlotError, Slots};
use bcd_sys::error::chain as error_chain;

/// Exit status of a supervised daemon that asks to be started again from
/// `current` at once (it switched slots). EX_TEMPFAIL.
pub const EXIT_RESTART: u8 = 75;
/// Exit status of a daemon that refuses to run: its binary is below the
/// release floor.
pub const EXIT_BELOW_FLOOR: u8 = 4;
/// Set by `bcd supervise` for the daemon it starts, to the supervisor's
/// PID: the supervisor counts starts and restarts the daemon from
/// `current`.
pub const SUPERVISED_ENV: &str = "BCD_SUPERVISED";
/// Set by `bcd supervise` for the daemon it starts: the daemon's abnormal
/// exits within the crash-loop window before this start.
pub const DAEMON_EXITS_ENV: &str = "BCD_DAEMON_EXITS";

/// The abnormal exits `bcd supervise` counted before this daemon started
/// (0 when not supervised).
pub fn daemon_exits() -> u32 {
    std::env::var(DAEMON_EXITS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The release sequence of this build, when it was built as a release
/// (`BCD_RELEASE_SEQUENCE` at build time); 0 for development builds.
pub fn build_sequence() -> u64 {
    option_env!("BCD_RELEASE_SEQUENCE")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Milliseconds on this boot's clock (CLOCK_BOOTTIME): the same for every
/// process of one boot, so a deadline survives a daemon restart.
pub fn boot_ms() -> u64 {
    bcd_sys::clock::boot_ms()
}

pub fn supervised() -> bool {
    supervisor_pid().is_some()
}

fn supervisor_pid() -> Option<i32> {
    std::env::var(SUPERVISED_ENV).ok()?.parse().ok()
}

/// The privileged steps of a self-update: a verified release binary into
/// a slot, and the `current` link. A node that runs as root takes them
/// itself ([`Slots`]); an unprivileged node asks the helper
/// (`crate::helper::via::HelperSlots`). `update.json` is the daemon's own
/// record and stays its to write.
pub trait SlotActs: Send + Sync + std::fmt::Debug {
    /// Writes `binary` into `slot` (mode 0755, fsynced).
    fn install(&self, slot: Slot, binary: &[u8]) -> Result<(), SlotError>;
    /// Points `current` at `slot`, atomically.
    fn point(&self, slot: Slot) -> Result<(), SlotError>;
}

impl SlotActs for Slots {
    fn install(&self, slot: Slot, binary: &[u8]) -> Result<(), SlotError> {
        self.write_slot(slot, binary)
    }

    fn point(&self, slot: Slot) -> Result<(), SlotError> {
        Slots::point(self, slot)
    }
}

/// The daemon's update state and where it lives.
#[derive(Debug)]
pub struct Updater {
    pub slots: Slots,
    /// Who writes slots and flips the link.
    pub acts: Arc<dyn SlotActs>,
    /// Loaded at start; `None` until the first upgrade sets up the slots.
    pub state: Option<UpdateState>,
    /// How long a new binary has to be confirmed.
    pub confirm_within: Duration,
    /// Started by `bcd supervise` (which counts starts and restarts).
    pub supervised: bool,
    /// Boot-clock deadline for this binary's confirmation, while it is an
    /// unconfirmed upgrade (the daemon's own watchdog swaps it back then).
    pub deadline_ms: Option<u64>,
    /// This process journaled its request for the key holder's
    /// confirmation.
    pub confirmation_asked: bool,
}

/// A release that confirmed.
#[derive(Debug, PartialEq, Eq)]
pub struct Confirmed {
    pub command_id: String,
    pub output: String,
    /// The release key to trust from now on, if the release rotates it.
    pub next_key: Option<String>,
}

/// What the daemon does at its start about an upgrade.
#[derive(Debug, PartialEq, Eq)]
pub enum AtStart {
    Run,
    /// Confirm on the key holder's receipt before this boot-clock deadline.
    AwaitWelcome {
        deadline_ms: u64,
    },
    /// The link went back to the old slot: restart into it.
    Restart,
    /// The upgrade ended; journal its result.
    Finished {
        command_id: String,
        succeeded: bool,
        reason: &'static str,
        output: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    Slots(#[from] SlotError),
    #[error(
        "this binary (slot {slot}, release {sequence}) is below the release floor {floor}: \
         bcd refuses to run it; start the binary in {current} instead"
    )]
    BelowFloor {
        slot: &'static str,
        sequence: u64,
        floor: u64,
        current: String,
    },
}

impl Updater {
    pub fn new(data_dir: &Path, confirm_within: Duration) -> Updater {
        let slots = Slots::new(data_dir);
        Updater {
            acts: Arc::new(slots.clone()),
            slots,
            state: None,
            confirm_within,
            supervised: supervised(),
            deadline_ms: None,
            confirmation_asked: false,
        }
    }

    /// Loads the state (if there are slots) and settles what a previous
    /// process left: the decision at start.
    pub fn start(&mut self, now_ms: u64) -> Result<AtStart, UpgradeError> {
        if !self.slots.exist() {
            return Ok(AtStart::Run);
        }
        let mut state = self.slots.load()?;
        let link = state.current;
        let decision = if self.supervised {
            state.on_supervised_start(link, now_ms)
        } else {
            state.on_start(link, now_ms)
        };
        if !state.usable(link) && state.pending.is_none() {
            return Err(UpgradeError::BelowFloor {
                slot: link.name(),
                sequence: state.sequences[link as usize],
                floor: state.floor,
                current: self.slots.current_binary().display().to_string(),
            });
        }
        let at_start = match decision {
            Decision::Run => AtStart::Run,
            Decision::AwaitWelcome { deadline_ms } => {
                self.slots.save(&state)?;
                AtStart::AwaitWelcome { deadline_ms }
            }
            Decision::SwapBack { reason } => {
                warn!(reason, "swapping back to the previous release");
                self.swap_back(&mut state)?;
                AtStart::Restart
            }
            Decision::Finished {
                command_id,
                succeeded,
                reason,
            } => {
                let output = format!(
                    "release {} did not confirm; back on release {} ({})\n",
                    failed_sequence(&state),
                    state.running_sequence(),
                    state.running_version()
                );
                // Saved once the result is journaled (`settled`).
                AtStart::Finished {
                    command_id,
                    succeeded,
                    reason,
                    output,
                }
            }
        };
        self.state = Some(state);
        Ok(at_start)
    }

    /// The result of a finished upgrade is journaled: persist the state.
    pub fn settled(&self) -> Result<(), SlotError> {
        match &self.state {
            Some(s) => self.slots.save(s),
            None => Ok(()),
        }
    }

    /// The daemon's own watchdog.
    pub fn tick(&mut self, now_ms: u64) -> Result<bool, SlotError> {
        let Some(state) = &mut self.state else {
            return Ok(false);
        };
        if let Decision::SwapBack { reason } = state.on_tick(now_ms) {
            warn!(reason, "swapping back to the previous release");
            let mut s = state.clone();
            self.swap_back(&mut s)?;
            self.state = Some(s);
            return Ok(true);
        }
        Ok(false)
    }

    /// The upgrade this binary awaits the key holder's confirmation of:
    /// the body of the [`bcd_core::update::CONFIRM_EVENT`] it journals, and
    /// that body's SHA-256 (lowercase hex), which the key holder's receipt
    /// names.
    pub fn awaiting(&self) -> Option<(String, String)> {
        let (command_id, sequence) = self.state.as_ref()?.awaiting()?;
        let body = serde_json::to_string(&crate::events::ReleaseRunning {
            command_id: command_id.to_string(),
            release_sequence: sequence,
        })
        .unwrap_or_default();
        let digest = bcd_proto::fingerprint(body.as_bytes());
        Some((body, digest))
    }

    /// The key holder's receipt of the report: the new binary confirms.
    /// Returns the finished upgrade's command id, output, and the release
    /// key it rotates to; the caller journals the result and installs the
    /// key, then calls [`Updater::settled`].
    pub fn confirm(&mut self) -> Option<Confirmed> {
        let state = self.state.as_mut()?;
        let next_key = state.pending.as_ref().and_then(|p| p.next_key.clone());
        match state.on_confirmed() {
            Decision::Finished { command_id, .. } => Some(Confirmed {
                command_id,
                output: format!(
                    "release {} ({}) confirmed; the release floor is {}{}\n",
                    state.running_sequence(),
                    state.running_version(),
                    state.floor,
                    if next_key.is_some() {
                        "; the release key is rotated"
                    } else {
                        ""
                    }
                ),
                next_key,
            }),
            _ => None,
        }
    }

    /// Checks a release before it is downloaded.
    pub fn plan(&self, sequence: u64) -> Result<(), Refusal> {
        let fresh;
        let state = match &self.state {
            Some(s) => s,
            None => {
                fresh = self.initial_state();
                &fresh
            }
        };
        state.plan(sequence).map(|_| ())
    }

    fn initial_state(&self) -> UpdateState {
        UpdateState::new(Slot::A, build_sequence(), env!("CARGO_PKG_VERSION"))
    }

    /// Writes a verified release into the inactive slot, setting up the
    /// slots first (slot A gets the running binary). Blocking; nothing
    /// switches here.
    pub fn write(&self, sequence: u64, binary: &[u8]) -> Result<Slot, String> {
        let state = match &self.state {
            Some(s) => s.clone(),
            None => {
                let me = std::env::current_exe()
                    .and_then(std::fs::read)
                    .map_err(|e| format!("cannot read the running binary to set up slot a: {e}"))?;
                self.init(&me)
                    .map_err(|e| format!("cannot set up the slots: {}", error_chain(&e)))?
            }
        };
        let slot = state.plan(sequence).map_err(|e| e.to_string())?;
        self.acts
            .install(slot, binary)
            .map_err(|e| format!("cannot write slot {}: {}", slot.name(), error_chain(&e)))?;
        Ok(slot)
    }

    /// Sets up slot A with the running binary, as [`Slots::init`] does,
    /// through [`Updater::acts`].
    fn init(&self, me: &[u8]) -> Result<UpdateState, SlotError> {
        if self.slots.exist() {
            return self.slots.load();
        }
        let state = self.initial_state();
        self.acts.install(Slot::A, me)?;
        self.slots.save(&state)?;
        self.acts.point(Slot::A)?;
        Ok(state)
    }

    /// The new binary is in its slot: record the upgrade, flip the link.
    /// The caller restarts.
    pub fn switch(
        &mut self,
        command_id: &str,
        manifest: &release::Manifest,
        now_ms: u64,
    ) -> Result<Slot, String> {
        let mut state = match &self.state {
            Some(s) => s.clone(),
            None => self
                .slots
                .load()
                .map_err(|e| format!("cannot read the slots: {e}"))?,
        };
        if let Some(k) = &manifest.next_key {
            release::parse_public_key(k).map_err(|e| e.to_string())?;
        }
        let to = state
            .begin(
                command_id,
                manifest.sequence,
                &manifest.version,
                now_ms,
                self.confirm_within.as_millis() as u64,
            )
            .map_err(|e| e.to_string())?;
        if let Some(p) = &mut state.pending {
            p.next_key = manifest.next_key.clone();
        }
        self.slots
            .save(&state)
            .map_err(|e| format!("cannot record the upgrade: {e}"))?;
        self.acts
            .point(to)
            .map_err(|e| format!("cannot switch slots: {}", error_chain(&e)))?;
        info!(
            from = state.sequences[to.other() as usize],
            to = manifest.sequence,
            slot = to.name(),
            "switched slots; restarting into the new release"
        );
        self.state = Some(state);
        Ok(to)
    }

    /// `daemon.rollback`: swaps an unconfirmed upgrade back. Returns the
    /// output for the command's result and whether to restart.
    pub fn abort(&mut self) -> Result<(String, bool), SlotError> {
        let Some(state) = &self.state else {
            return Ok(("nothing to roll back: no upgrade here\n".into(), false));
        };
        match state.abort() {
            Decision::SwapBack { .. } => {
                let mut s = state.clone();
                let from = s.running_sequence();
                self.swap_back(&mut s)?;
                let out = format!(
                    "swapped back from release {from} to release {}\n",
                    s.running_sequence()
                );
                self.state = Some(s);
                Ok((out, true))
            }
            _ => Ok((
                format!(
                    "nothing to roll back: release {} is confirmed (roll forward instead)\n",
                    state.running_sequence()
                ),
                false,
            )),
        }
    }

    fn swap_back(&self, state: &mut UpdateState) -> Result<(), SlotError> {
        let slot = state.swap_back();
        self.acts.point(slot)
    }

    /// The running release's version and the floor, for Hello.
    pub fn report(&self) -> (String, u64) {
        match &self.state {
            Some(s) => (s.running_version().to_string(), s.floor),
            None => (env!("CARGO_PKG_VERSION").to_string(), build_sequence()),
        }
    }

    /// The command a pending upgrade belongs to.
    pub fn pending_command(&self) -> Option<&str> {
        self.state
            .as_ref()
            .and_then(|s| s.pending.as_ref())
            .map(|p| p.command_id.as_str())
    }
}

fn failed_sequence(state: &UpdateState) -> u64 {
    // The sequence just added to `failed` is the other slot's.
    state.sequences[state.current.other() as usize]
}

/// Asks the kernel for SIGTERM when the parent (the supervisor) dies.
pub fn die_with_parent() -> std::io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
    // The supervisor may have died before the request.
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get());
    if Some(parent) != supervisor_pid() {
        return Err(std::io::Error::other(
            "the supervisor that started this daemon is gone",
        ));
    }
    Ok(())
}

/// Replaces this process with the binary `current` names, same arguments
/// and environment (same PID, same boot). Returns only on failure.
pub fn exec_current(slots: &Slots) -> std::io::Error {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    std::process::Command::new(slots.current_binary())
        .args(args)
        .exec()
}

/// When the slots exist and this process is not the binary `current`
/// names (an operator or a unit started the installed bcd), hands over to
/// it: the installed binary may be older than the floor.
pub fn hand_over_if_needed(slots: &Slots) -> Result<(), String> {
    if !slots.exist() {
        return Ok(());
    }
    let me = std::env::current_exe().and_then(|p| p.canonicalize());
    let current = slots.current_binary().canonicalize();
    match (me, current) {
        (Ok(me), Ok(current)) if me == current => Ok(()),
        (_, Ok(current)) => {
            info!(binary = %current.display(), "handing over to the current slot");
            Err(format!(
                "cannot start {}: {}",
                current.display(),
                exec_current(slots)
            ))
        }
        (_, Err(e)) => Err(format!(
            "the current slot {} is unusable ({e}): run bcd rollback or reinstall",
            slots.current_binary().display()
        )),
    }
}

/// Options of `bcd supervise`.
#[derive(Debug, Clone)]
pub struct SuperviseOptions {
    pub data_dir: PathBuf,
    /// Arguments for the daemon (`node --data-dir ...`).
    pub args: Vec<OsString>,
    /// Wait before starting a daemon that died.
    pub restart_delay: Duration,
    /// How long past its deadline an unconfirmed upgrade may run before the
    /// supervisor swaps it back.
    pub grace: Duration,
    /// The window abnormal exits are counted in for a crash loop.
    pub crash_loop_window: Duration,
}

/// `bcd supervise`: starts the daemon from `current`, starts it again when
/// it dies (after `restart_delay`; at once when it asks, having switched
/// slots), counts the starts of an unconfirmed binary, and swaps back an
/// upgrade still unconfirmed past its deadline plus `grace`, whatever the
/// new binary does. SIGTERM is passed on to the daemon.
pub async fn supervise(opts: SuperviseOptions) -> anyhow::Result<u8> {
    use tokio::signal::unix::{SignalKind, signal};
    let slots = Slots::new(&opts.data_dir);
    let me = std::env::current_exe()?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut exits = CrashLoop::new(opts.crash_loop_window.as_millis() as u64);
    loop {
        if slots.exist() {
            let mut state = slots.load()?;
            let link = state.current;
            match state.on_spawn(link, boot_ms()) {
                Decision::SwapBack { reason } => {
                    warn!(reason, "swapping back to the previous release");
                    slots.point(state.swap_back())?;
                }
                Decision::AwaitWelcome { .. } => slots.save(&state)?,
                _ => {}
            }
        }
        let exe = if slots.exist() {
            slots.current_binary()
        } else {
            me.clone()
        };
        let recent = exits.recent(boot_ms());
        if is_crash_loop(recent) {
            warn!(
                exits = recent,
                window = ?opts.crash_loop_window,
                "the daemon is in a crash loop; the node reports DaemonCrashLoop"
            );
        }
        info!(binary = %exe.display(), "starting the daemon");
        let mut child = tokio::process::Command::new(&exe)
            .args(&opts.args)
            .env(SUPERVISED_ENV, std::process::id().to_string())
            .env(DAEMON_EXITS_ENV, recent.to_string())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", exe.display()))?;
        let mut watchdog = tokio::time::interval(Duration::from_millis(500));
        let status = loop {
            tokio::select! {
                s = child.wait() => break s?,
                _ = term.recv() => return Ok(stop(&mut child).await),
                _ = int.recv() => return Ok(stop(&mut child).await),
                _ = watchdog.tick() => {
                    if !slots.exist() {
                        continue;
                    }
                    let mut state = match slots.load() {
                        Ok(s) => s,
                        Err(e) => {
                            warn!(error = %e, "cannot read the update state");
                            continue;
                        }
                    };
                    if let Decision::SwapBack { reason } =
                        state.on_helper_tick(boot_ms(), opts.grace.as_millis() as u64)
                    {
                        warn!(reason, "swapping back to the previous release; stopping the daemon");
                        slots.point(state.swap_back())?;
                        let _ = child.kill().await;
                    }
                }
            }
        };
        match status.code() {
            Some(0) => return Ok(0),
            Some(3) => return Ok(3),
            Some(c) if c == i32::from(EXIT_RESTART) => {
                exits.on_exit(boot_ms(), true);
                info!("the daemon switched slots; starting it again");
            }
            _ => {
                exits.on_exit(boot_ms(), false);
                warn!(%status, delay = ?opts.restart_delay, "the daemon died; starting it again");
                tokio::time::sleep(opts.restart_delay).await;
            }
        }
    }
}

async fn stop(child: &mut tokio::process::Child) -> u8 {
    if let Some(pid) = child.id() {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).expect("a child's pid is positive"),
            rustix::process::Signal::TERM,
        );
    }
    match child.wait().await {
        Ok(s) => s.code().map_or(1, |c| c as u8),
        Err(_) => 1,
    }
}

/// `bcd rollback`: swaps an unconfirmed upgrade back now (`overdue`: only
/// one past its deadline plus `grace`, as the watchdog timer does). Returns
/// a line for the operator and whether it swapped.
/// Restarts a systemd unit (`bcd rollback --restart-unit`, after a swap
/// back).
pub fn restart_unit(unit: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("systemctl")
        .args(["restart", unit])
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run systemctl restart {unit}: {e}"))?;
    anyhow::ensure!(status.success(), "systemctl restart {unit}: {status}");
    Ok(())
}

pub fn rollback(
    data_dir: &Path,
    overdue: bool,
    grace: Duration,
) -> Result<(String, bool), SlotError> {
    let slots = Slots::new(data_dir);
    if !slots.exist() {
        return Ok(("no slots here: nothing to roll back".into(), false));
    }
    let mut state = slots.load()?;
    let decision = if overdue {
        state.on_helper_tick(boot_ms(), grace.as_millis() as u64)
    } else {
        state.abort()
    };
    match (decision, &state.pending) {
        (Decision::SwapBack { .. }, Some(p)) => {
            let (from, to) = (p.to_sequence, p.from_sequence);
            slots.point(state.swap_back())?;
            Ok((
                format!("swapped back from release {from} to release {to}"),
                true,
            ))
        }
        _ => Ok((
            format!(
                "nothing to roll back: release {} is {}",
                state.running_sequence(),
                if state.pending.is_some() {
                    "within its deadline"
                } else {
                    "confirmed"
                }
            ),
            false,
        )),
    }
}

pub use update::{CONFIRM_WITHIN_MS, HELPER_GRACE_MS};
