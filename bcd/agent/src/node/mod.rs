//! `bcd node`: the daemon's tokio shell around `bcd_core::Session`.
//!
//! The shell performs what the core decides: it dials the gateway over
//! mutual TLS, sends Hello and heartbeats, turns server messages and stream
//! ends into events, journals commands before their side effects, converges
//! the machine to the journaled spec, reports, renews the certificate and
//! takes part in self-update. Decisions (when to dial, what to refuse, when
//! the server counts as gone, when to renew and retry, what is worth
//! reporting, which commands run) are `bcd-core`'s.
//!
//! Privileged acts go through the narrow traits of [`Machine`], handed in
//! at construction, never called directly from the loop: hardware reads and
//! GPU resets ([`Host`]), reboot and kexec ([`Power`]), the CDI spec and env
//! files ([`DeviceFiles`]), sshd's files ([`SshdFiles`]) and the nftables
//! table ([`Firewall`]). Self-update's slots come in as an
//! [`Updater`].
//!
//! The agent is split by the state each part owns. What every part uses
//! (the identity, the machine, the journal, failpoints, metrics, the signer
//! and the refusal rate limit) is [`Shared`], borrowed for a step; each
//! part owns the rest of its state and is implemented on it, taking what
//! else it needs as parameters. `impl Agent` is written only here (`run`,
//! beside `open`, which builds the agent) and in `session` (the loop that
//! ties the parts), which `tests/tests/architecture_agent.rs` checks.
//!
//! The children, from the bottom up (each uses only those listed before
//! it):
//! - `conn`: the session stream: dialing, sending, how a stream ends; and
//!   `Link`, the session in progress (epoch, server time, the Hello's
//!   origin), written by the loop alone;
//! - `outbox`: events sent until acknowledged (`Outbox`: what this session
//!   sent), and event receipts;
//! - `trust`: which gateways the node stays on (`Trust`: the signed
//!   gateway revocation list);
//! - `renewal`: certificate renewal attempts (`Renewals`: their jitter);
//! - `tunnel`: tunnels an operator opens (`Tunnels`: how many are open,
//!   where their ends go);
//! - `observe`: what the metrics show (`--metrics-listen`);
//! - `secrets`: the secrets the spec gives allocations (`Secrets`: what
//!   was written, what is fetching);
//! - `state`: desired state, convergence, state reports, bindings,
//!   inventory (`Desired`: the spec and what the server heard);
//! - `results`: command results, journaled then sent;
//! - `update`: self-update glue (stage, switch, settle, confirm), over the
//!   [`Updater`];
//! - `commands`: dispatches judged by the core, side effects, recovery
//!   (`Commands`: where side effects and staged work come back, where
//!   images go);
//! - `uevents`: device changes the kernel announces;
//! - `session`: the loop that ties them to the session state machine.

mod commands;
mod conn;
mod observe;
mod outbox;
mod renewal;
mod results;
pub mod secrets;
mod session;
mod state;
mod trust;
pub mod tunnel;
mod uevents;
mod update;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize};
use std::time::Duration;

use anyhow::Context;
use bcd_core::SessionConfig;
use bcd_proto::v1;
use prost::Message;
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use crate::converge::{DeviceFiles, Firewall, SshdFiles};
use crate::effects::Effect;
use crate::events::{Body, Detail, Refusal, Refused};
use crate::failpoints::Failpoints;
use crate::hw::{Host, Power};
use crate::identity::{self, Identity};
use crate::journal::{self, EventBounds, EventClass, Journal};
use crate::metrics::NodeMetrics;
use crate::upgrade::Updater;

/// Counters a fleet of agents in one process shares (the simulator's
/// progress display reads them).
#[derive(Debug, Default)]
pub struct Stats {
    pub connected: AtomicUsize,
    pub sessions: AtomicU64,
    pub dial_failures: AtomicU64,
    /// Unix milliseconds of the last session established, and its epoch.
    pub established_ms: AtomicI64,
    pub epoch: AtomicU64,
}

/// What one agent keeps in memory between uses. `bcd node` runs one agent
/// on its machine and keeps [`Footprint::NODE`]; `bcd sim` runs thousands
/// in one process and asks for [`Footprint::SIMULATED`]. Neither changes
/// what is journaled, synced or sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// The journal's page cache.
    pub journal: journal::JournalOptions,
    /// The session stream's encode and decode buffers start at this many
    /// bytes, and grow for a larger message.
    pub stream_buffer: usize,
}

impl Footprint {
    /// `bcd node`: tonic's 8 KiB stream buffers.
    pub const NODE: Footprint = Footprint {
        journal: journal::JournalOptions::NODE,
        stream_buffer: 8 * 1024,
    };
    /// An agent among thousands in one process.
    pub const SIMULATED: Footprint = Footprint {
        journal: journal::JournalOptions::SMALL,
        stream_buffer: 1024,
    };
}

/// The machine under the agent: what it reads and the privileged acts it
/// asks for, each behind a narrow trait.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Boot id, host name, GPUs (and their reset), TPM, load.
    pub host: Arc<dyn Host>,
    /// Reboot and kexec.
    pub power: Arc<dyn Power>,
    /// The CDI spec and the per-allocation env files.
    pub devices: Arc<dyn DeviceFiles>,
    /// sshd's files.
    pub sshd: Arc<dyn SshdFiles>,
    /// The node's nftables table.
    pub firewall: Arc<dyn Firewall>,
}

/// What every part of the agent uses: the identity it speaks for, the
/// machine under it, the journal, and the helpers over them that any part
/// calls (the monotonic time, signing with the node key, journaling an
/// event, refusing a gateway's frame). The parts borrow it for the length
/// of a step; it owns no part's state.
#[derive(Debug)]
pub struct Shared {
    /// The node's identity: its certificate, key, floors and time mark.
    pub identity: Identity,
    /// The machine under the agent.
    pub machine: Machine,
    /// The journal of commands, events and the spec.
    pub journal: Journal,
    /// Test builds only (`failpoints` feature): where to die.
    pub failpoints: Failpoints,
    /// What `--metrics-listen` serves (none: metrics off).
    pub metrics: Option<Arc<NodeMetrics>>,
    /// The origin of the monotonic times handed to the core.
    origin: Instant,
    /// The node key, parsed once per key (a renewal replaces it).
    signer: Option<(String, Arc<rcgen::KeyPair>)>,
    /// What a gateway can make the node log or journal, rate-limited.
    warned: Warned,
}

/// The daemon: the shared context and the parts, each owning its state,
/// tied together by the session loop (`session`).
#[derive(Debug)]
pub struct Agent {
    /// What every part uses.
    pub shared: Shared,
    /// This process's id, sent in every Hello.
    pub incarnation_id: String,
    /// The session state machine's timings.
    pub config: SessionConfig,
    /// The seed of the session's jitter.
    pub seed: u64,
    /// Counters a fleet of agents in one process shares, if any.
    pub stats: Option<Arc<Stats>>,
    /// How often the convergers re-check the machine.
    pub converge_every: Duration,
    /// Self-update (none in `bcd sim`, whose agents share one process).
    pub update: Option<Updater>,
    /// Kernel uevents (none: device changes show at the next pass).
    pub uevents: Option<bcd_udev::Monitor>,
    /// What the agent keeps in memory between uses.
    pub footprint: Footprint,
    /// Certificate renewal's retries.
    renewals: renewal::Renewals,
    /// What the stream carried of the journal's events.
    outbox: outbox::Outbox,
    /// The session in progress, as the loop keeps it.
    link: conn::Link,
    /// The spec enforced and what the server heard of it.
    desired: state::Desired,
    /// Commands' channels back to the loop, and where images go.
    pub commands: commands::Commands,
    /// Which gateways it stays on (the signed gateway revocation list).
    trust: trust::Trust,
    /// The tunnels open now, and where their ends are reported.
    pub tunnels: tunnel::Tunnels,
    /// The secrets the spec gives allocations, and where fetches end.
    pub secrets: secrets::Secrets,
}

/// Rate limits for what a peer can trigger: at most one log line and one
/// journaled event per kind a minute, with the count of those held back.
#[derive(Debug, Default)]
struct Warned {
    last: std::collections::HashMap<&'static str, (Duration, u64)>,
}

/// How much of a refused frame's detail is journaled.
const MAX_DETAIL: usize = 4 << 10;

/// Between two reports of the same kind of refused frame.
const WARN_EVERY: Duration = Duration::from_secs(60);

impl Warned {
    /// `Some(held back since the last one)` when `kind` may be reported at
    /// `now`.
    fn allow(&mut self, kind: &'static str, now: Duration) -> Option<u64> {
        match self.last.get_mut(kind) {
            Some((at, held)) if now.saturating_sub(*at) < WARN_EVERY => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                *at = now;
                Some(std::mem::take(held))
            }
            None => {
                self.last.insert(kind, (now, 0));
                Some(0)
            }
        }
    }
}

/// How often the convergers re-check the machine.
const CONVERGE_EVERY: Duration = Duration::from_secs(30);

/// Why the agent stopped.
#[derive(Debug)]
pub enum Stopped {
    /// Shutdown was requested.
    Shutdown,
    /// The server refused this node for good.
    Refused(String),
    /// A command rebooted the (fake) machine: start the agent again.
    Rebooted,
    /// The journal failed; the daemon must not act without it.
    JournalFailed(String),
    /// The `current` slot changed: start again from the binary it names.
    Restart,
    /// This binary is below the release floor and must not run.
    BelowFloor(String),
}

/// What a command staged in the background, or why it could not. Boxed,
/// as [`Done`] is.
type Staged = Box<(String, Result<Stage, String>)>;

/// What the loop finishes for a command that prepared in the background.
#[derive(Debug)]
enum Stage {
    /// A downloaded, verified release written to the inactive slot: switch
    /// to it.
    Release(release::Manifest),
    /// An image fetched and verified for `boot.kexec image=`: load it.
    Image(crate::client::KexecImage),
}

/// A finished side effect on its way back to the loop. Boxed: a channel
/// holds its items in blocks of 32 from the start, and a fleet of agents
/// in one process (`bcd sim`) would keep 32 unboxed effects per agent.
type Done = Box<(String, Effect)>;

impl Agent {
    /// Runs the daemon until `shutdown` completes or it must stop.
    ///
    /// Not an `async fn`: one would keep its arguments (the agent, 1.7 KiB)
    /// beside the inner future that owns them, in every daemon's state for
    /// as long as it runs.
    pub fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> impl std::future::Future<Output = Stopped> {
        let span = info_span!("session", node = %self.shared.identity.file.node_id);
        async move { self.run_loop(shutdown).await }.instrument(span)
    }
}

impl Shared {
    /// The monotonic time handed to the core.
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn worker_keys(&self) -> Vec<Vec<u8>> {
        self.identity
            .file
            .worker_keys
            .iter()
            .filter_map(|k| hex::decode(k).ok())
            .collect()
    }

    /// The identity the session speaks for.
    fn me(&self) -> bcd_core::Me<'_> {
        bcd_core::Me {
            node_id: &self.identity.file.node_id,
            serial: &self.identity.file.cert_serial,
        }
    }

    /// Signs `payload` with the node key the node holds now (so a fact
    /// journaled before a renewal is signed with the renewed key).
    fn sign(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        if self.identity.tpm_record().is_some() {
            return self
                .identity
                .sign(payload)
                .inspect_err(|e| warn!(error = %e, "the TPM did not sign a fact"))
                .ok();
        }
        let pem = &self.identity.key_pem;
        let key = match &self.signer {
            Some((p, k)) if p == pem => k.clone(),
            _ => {
                let k = Arc::new(rcgen::KeyPair::from_pem(pem).ok()?);
                self.signer = Some((pem.clone(), k.clone()));
                k
            }
        };
        rcgen::SigningKey::sign(key.as_ref(), payload).ok()
    }

    /// Journals an event; a journal that cannot take it is logged, not
    /// fatal: events are reports, not decisions.
    fn event(&mut self, body: &impl Body) {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        self.journal_event(body.kind(), body.class(), &bytes);
    }

    /// [`Self::event`] once its body is JSON.
    fn journal_event(&mut self, kind: &str, class: EventClass, body: &[u8]) {
        match self
            .journal
            .push_event(kind, class, body, EventBounds::default())
        {
            Ok(true) => {}
            Ok(false) => debug!(kind, "journal full: metric event dropped"),
            Err(e) => warn!(kind, error = %e, "cannot journal an event"),
        }
    }

    /// A frame a gateway sent that the node refuses: logged and journaled
    /// as a `security.*` event, at most once a minute per kind.
    fn refused_frame<R: Refusal>(&mut self, frame: R) {
        self.refused(R::KIND, serde_json::to_value(frame).unwrap_or_default());
    }

    /// [`Self::refused_frame`] once its frame is JSON: written once for
    /// every kind.
    fn refused(&mut self, kind: &'static str, frame: serde_json::Value) {
        let Some(held_back) = self.warned.allow(kind, self.now()) else {
            return;
        };
        // What a gateway put in a frame is journaled a few KiB at most.
        let text = frame.to_string();
        let detail = if text.len() > MAX_DETAIL {
            Detail::Cut(format!(
                "{}... ({} bytes in all)",
                &text[..text.floor_char_boundary(MAX_DETAIL)],
                text.len()
            ))
        } else {
            Detail::Frame(frame)
        };
        warn!(kind, detail = %text.chars().take(MAX_DETAIL).collect::<String>(), held_back, "refused a frame from the gateway");
        self.journal_event(
            kind,
            EventClass::Transition,
            &serde_json::to_vec(&Refused { detail, held_back }).unwrap_or_default(),
        );
    }
}

/// Opens what `bcd node` needs from the data directory.
pub fn open(
    dir: &Path,
    machine: Machine,
    seed: u64,
    stats: Option<Arc<Stats>>,
    footprint: Footprint,
) -> anyhow::Result<Agent> {
    let identity = Identity::load(dir)?;
    let (journal, opened) = Journal::open_with(&dir.join(identity::JOURNAL), footprint.journal)
        .context("the journal cannot be opened")?;
    if let journal::Opened::Recreated { corrupt } = &opened {
        warn!(aside = %corrupt.display(), "started a new journal; the old one did not open");
    }
    // The spec was verified when it arrived; a journaled one that no longer
    // opens (worker keys changed) is not enforced.
    let keys: Vec<Vec<u8>> = identity
        .file
        .worker_keys
        .iter()
        .filter_map(|k| hex::decode(k).ok())
        .collect();
    let spec = journal
        .spec()
        .context("the journal cannot be read")?
        .and_then(|(_, signed)| bcd_proto::sign::open(&signed, &keys).ok())
        .and_then(|p| v1::NodeSpec::decode(p.as_slice()).ok());
    let trust = trust::Trust::load(dir, &keys, seed);
    Ok(Agent {
        shared: Shared {
            identity,
            machine,
            journal,
            failpoints: Failpoints::none(),
            metrics: None,
            origin: Instant::now(),
            signer: None,
            warned: Warned::default(),
        },
        incarnation_id: journal::new_id(),
        config: SessionConfig::default(),
        seed,
        stats,
        converge_every: CONVERGE_EVERY,
        update: None,
        uevents: None,
        footprint,
        renewals: renewal::Renewals::new(seed),
        outbox: outbox::Outbox::default(),
        link: conn::Link::default(),
        desired: state::Desired::new(spec),
        commands: commands::Commands::new(dir.join(crate::client::KEXEC_DIR)),
        trust,
        tunnels: tunnel::Tunnels::new(),
        secrets: secrets::Secrets::new(None),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_peer_triggers_is_reported_once_a_minute_with_a_count() {
        let mut w = Warned::default();
        let s = Duration::from_secs;
        assert_eq!(w.allow("a", s(0)), Some(0));
        assert_eq!(w.allow("a", s(1)), None);
        assert_eq!(w.allow("a", s(59)), None);
        assert_eq!(w.allow("b", s(59)), Some(0), "kinds are limited apart");
        assert_eq!(w.allow("a", s(60)), Some(2));
        assert_eq!(w.allow("a", s(61)), None);
    }
}
