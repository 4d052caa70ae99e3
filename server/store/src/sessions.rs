//! Node sessions: the Hello transaction and what a session writes.
//!
//! A Hello checks the node's certificate, checks that the gateway holds its
//! lease (the routing transaction's fence), bumps the epoch
//! (`bcd_core::epoch::next_epoch`), routes the node to the gateway, clears
//! the unreachable marks, names the inventory sections the store lacks, and
//! settles every in-flight command as `bcd_core::command::on_hello`
//! decides. Writes on behalf of a session carry its epoch and change
//! nothing once a newer Hello ran (`bcd_core::epoch::write_applies`).

use crate::id::{CommandId, GatewayId, NodeId};
use std::time::Duration;

use bcd_core::command::{HelloDecision, Kind, NodeReport, Outcome, ServerState};

use crate::commands::Dispatch;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloInput {
    pub node_id: NodeId,
    pub cert_fingerprint: String,
    pub cert_serial: String,
    pub gateway_id: GatewayId,
    pub incarnation_id: String,
    pub boot_id: String,
    pub journal_id: String,
    pub agent_version: String,
    pub last_epoch: u64,
    /// (section, SHA-256) of the node's inventory.
    pub inventory_hashes: Vec<(String, String)>,
    /// Command ids the node's journal holds running, and done.
    pub journal_running: Vec<CommandId>,
    pub journal_done: Vec<CommandId>,
    /// Abnormal exits of the daemon its supervisor counted before this
    /// start: at the crash-loop threshold the node shows
    /// `DaemonCrashLoop` until a Hello below it.
    pub daemon_exits: u32,
    /// The node's signed proof of this Hello, when the gateway verified it
    /// against the session's certificate and it says what the Hello says
    /// (`bcd_proto::hello`); a Hello without one records no sighting.
    pub proof: Option<HelloProved>,
}

/// A Hello proof as the node signed it (over `bcd_proto::hello::signed_message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloProved {
    /// The count it carries.
    pub seq: u64,
    /// The highest command sequence the node started, as it signed it:
    /// a command above it never started, and is sent again whatever its
    /// kind (a new journal cannot deduplicate it, but there is nothing to).
    pub command_floor: u64,
    /// The node runs a confirmed release (no swap back to one from before
    /// proofs is possible): once the key holder verified such a proof, the
    /// node's unproved Hellos are refused ([`crate::clones`]).
    pub release_confirmed: bool,
    pub payload: Vec<u8>,
    pub signature: Vec<u8>,
}

/// A boot a certificate was presented from, as a gateway recorded it (see
/// [`crate::clones`]): nothing in it is believed before its proof is
/// verified, and its `at` never.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    pub id: i64,
    pub serial: String,
    pub node_id: NodeId,
    pub boot_id: String,
    pub at_ms: i64,
    /// The count the proof carries, as the gateway recorded it.
    pub seq: u64,
    pub proof: Vec<u8>,
    pub proof_signature: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloOutcome {
    pub epoch: u64,
    pub server_time_ms: i64,
    pub inventory_wanted: Vec<String>,
    /// In-flight commands to send again, in sequence order.
    pub replay: Vec<Dispatch>,
    /// Commands the Hello finished (self-terminating after a new boot,
    /// journal lost).
    pub finished: Vec<Finished>,
    /// When the session's certificate expires; the gateway closes the
    /// session then.
    pub cert_not_after_ms: i64,
    /// The highest proof count the store holds for the node, this Hello's
    /// included (the Welcome's `hello_seq_seen`).
    pub hello_seq_seen: u64,
    /// Commands wait for the node (pending), as the Hello read them.
    pub commands_pending: bool,
    /// The node's desired-state generation as the Hello read it (0: none).
    pub spec_generation: u64,
}

/// What a Hello reads to tell whether work waits for the node: whether a
/// command is pending, and its spec's generation (`$1`/`?1`: the node).
pub const HELLO_WORK: &str = "SELECT EXISTS (SELECT 1 FROM commands WHERE node_id = $1 AND state = 'pending'), \
     COALESCE((SELECT generation FROM node_specs WHERE node_id = $1), 0)";

impl HelloOutcome {
    /// Whether the new session has something to send at once, its node
    /// having applied `applied_generation`: else it waits to be woken.
    pub fn work_waits(&self, applied_generation: u64) -> bool {
        self.commands_pending || self.spec_generation > applied_generation
    }
}

/// A command a Hello finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub id: CommandId,
    /// How it ended (the state it is in now is that outcome's).
    pub outcome: Outcome,
    pub reason: String,
}

/// Where a node is routed and in what state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub epoch: u64,
    pub gateway_id: GatewayId,
    pub state: String,
}

/// A gateway's report for one of its sessions: the node was last heard
/// `age` ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub node_id: NodeId,
    pub epoch: u64,
    pub age: Duration,
}

/// A session that ended, as its gateway writes it: the node was last heard
/// `seen_age` ago and the session ended `ended_age` ago (a gateway writes
/// the sessions that ended meanwhile together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub node_id: NodeId,
    pub epoch: u64,
    pub seen_age: Duration,
    pub ended_age: Duration,
    /// Why: `stream-ended`, `missed-heartbeats`, `drained`, ...
    pub cause: String,
}

impl Ended {
    /// A session its gateway closes as it stops (cause `gateway-shutdown`).
    pub fn at_shutdown(s: &SessionKey) -> Ended {
        Ended {
            node_id: s.node_id.clone(),
            epoch: s.epoch,
            seen_age: Duration::ZERO,
            ended_age: Duration::ZERO,
            cause: "gateway-shutdown".into(),
        }
    }
}

/// The fleet as a gateway sizes its nodes' first redial window by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetSize {
    pub connected: usize,
    pub gateways: usize,
    /// The Hellos a second the live gateways reported they absorb,
    /// together (0 while none has reported).
    pub absorbs_per_s: u64,
}

/// A session a gateway holds, by node and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionKey {
    pub node_id: NodeId,
    pub epoch: u64,
}

/// Whether a gateway whose lease runs until `lease_expires_ms` (`None`:
/// it holds none) may route a node at `now_ms`.
pub fn lease_admits(lease_expires_ms: Option<i64>, now_ms: i64) -> bool {
    lease_expires_ms.is_some_and(|expires| expires >= now_ms)
}

/// The sections of the node's inventory whose hash the store does not
/// have (`known` gives the stored hash of a section).
pub fn inventory_wanted(
    hashes: &[(String, String)],
    mut known: impl FnMut(&str) -> Option<String>,
) -> Vec<String> {
    hashes
        .iter()
        .filter(|(section, sha)| known(section).as_deref() != Some(sha.as_str()))
        .map(|(section, _)| section.clone())
        .collect()
}

/// An in-flight command as the Hello transaction reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    pub id: CommandId,
    pub seq: u64,
    pub kind: String,
    pub state: String,
    pub signed: Vec<u8>,
}

/// What the Hello does with each in-flight command (in sequence order).
/// Rows whose kind or state this binary does not know are left alone.
pub fn settle_in_flight(
    in_flight: Vec<InFlight>,
    h: &HelloInput,
    new_journal: bool,
    new_boot: bool,
) -> Vec<(InFlight, HelloDecision)> {
    in_flight
        .into_iter()
        .filter_map(|c| {
            let (kind, state) = (Kind::parse(&c.kind)?, ServerState::parse(&c.state)?);
            let report = if h.journal_done.contains(&c.id) {
                NodeReport::Done
            } else if h.journal_running.contains(&c.id) {
                NodeReport::Running
            } else {
                NodeReport::Unknown
            };
            let decision = match (
                bcd_core::command::on_hello(kind, state, report, new_journal, new_boot),
                &h.proof,
            ) {
                // The node signed that it never started it: a Hello ends
                // nothing it did not begin.
                (HelloDecision::Finish(..), Some(p)) if c.seq > p.command_floor => {
                    HelloDecision::Replay
                }
                (d, _) => d,
            };
            Some((c, decision))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_core::command::Outcome;

    #[test]
    fn only_a_live_lease_routes() {
        assert!(lease_admits(Some(10), 10));
        assert!(!lease_admits(Some(9), 10));
        assert!(!lease_admits(None, 0));
    }

    #[test]
    fn sections_with_a_new_hash_are_wanted() {
        let hashes = vec![
            ("gpus".to_string(), "a".to_string()),
            ("os".into(), "b".into()),
        ];
        let wanted = inventory_wanted(&hashes, |s| (s == "gpus").then(|| "a".to_string()));
        assert_eq!(wanted, vec!["os".to_string()]);
    }

    fn hello(running: &[&str], done: &[&str]) -> HelloInput {
        HelloInput {
            node_id: "n".into(),
            cert_fingerprint: String::new(),
            cert_serial: String::new(),
            gateway_id: "gw".into(),
            incarnation_id: String::new(),
            boot_id: String::new(),
            journal_id: String::new(),
            agent_version: String::new(),
            last_epoch: 0,
            inventory_hashes: vec![],
            journal_running: running.iter().map(|&s| CommandId::from(s)).collect(),
            journal_done: done.iter().map(|&s| CommandId::from(s)).collect(),
            daemon_exits: 0,
            proof: None,
        }
    }

    fn cmd(id: &str, kind: &str, state: &str) -> InFlight {
        InFlight {
            id: id.into(),
            seq: 1,
            kind: kind.into(),
            state: state.into(),
            signed: vec![],
        }
    }

    #[test]
    fn in_flight_commands_follow_the_shared_hello_rules() {
        let h = hello(&["b"], &["c"]);
        let got = settle_in_flight(
            vec![
                cmd("a", "exec.run", "dispatched"),
                cmd("b", "exec.run", "running"),
                cmd("c", "exec.run", "running"),
                cmd("d", "exec.run", "frobnicated"),
                cmd("e", "node.reboot", "running"),
            ],
            &h,
            false,
            true,
        );
        let decisions: Vec<(&str, HelloDecision)> = got
            .iter()
            .map(|(c, d)| (c.id.as_str(), d.clone()))
            .collect();
        assert_eq!(decisions.len(), 4, "an unknown state is left alone");
        assert_eq!(decisions[0], ("a", HelloDecision::Replay));
        assert_eq!(decisions[1], ("b", HelloDecision::KeepRunning));
        assert_eq!(decisions[2], ("c", HelloDecision::AwaitResult));
        assert!(matches!(
            decisions[3],
            ("e", HelloDecision::Finish(Outcome::Succeeded, _))
        ));
    }

    #[test]
    fn a_command_above_the_proved_floor_is_sent_again_not_ended() {
        let mut h = hello(&[], &[]);
        h.proof = Some(HelloProved {
            seq: 1,
            command_floor: 4,
            release_confirmed: false,
            payload: vec![],
            signature: vec![],
        });
        let at = |id: &str, kind: &str, seq: u64| InFlight {
            seq,
            ..cmd(id, kind, "acked")
        };
        let got = settle_in_flight(
            vec![
                at("started", "exec.run", 4),
                at("never", "exec.run", 5),
                at("reboot", "node.reboot", 6),
            ],
            &h,
            true,
            true,
        );
        let decisions: Vec<(&str, HelloDecision)> = got
            .iter()
            .map(|(c, d)| (c.id.as_str(), d.clone()))
            .collect();
        assert!(matches!(
            decisions[0],
            ("started", HelloDecision::Finish(Outcome::Failed, _))
        ));
        assert_eq!(decisions[1], ("never", HelloDecision::Replay));
        assert_eq!(decisions[2], ("reboot", HelloDecision::Replay));
        // Without a proof, as before: ended.
        h.proof = None;
        let got = settle_in_flight(vec![at("never", "exec.run", 5)], &h, true, true);
        assert!(matches!(got[0].1, HelloDecision::Finish(..)));
    }
}
