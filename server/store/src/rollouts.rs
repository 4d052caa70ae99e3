//! Rollouts: a release reaches a selection of nodes in waves.
//!
//! A rollout fixes its nodes when it starts (the selector is evaluated once,
//! [`selects`]) and walks cumulative waves (1%, 10%, 50%, 100% of them by
//! default). Each node gets one `daemon.upgrade`, recorded here; a node's
//! status follows its upgrade command ([`NodeStatus::of_command`]). The
//! controller's decision over these statuses lives with the controller.

use crate::error::Refusal;
use crate::id::{CommandId, NodeId, ReleaseSeq};

pub const DEFAULT_WAVES: [u32; 4] = [1, 10, 50, 100];

/// The reason a cancelled upgrade command carries.
pub const CANCELLED: &str = "rollout-aborted";

/// Where one node of a rollout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    /// Not yet given the upgrade.
    Waiting,
    Upgrading,
    Confirmed,
    Failed,
    /// Already at the release or later.
    Skipped,
    /// Aborted before its upgrade was dispatched.
    Cancelled,
}

impl NodeStatus {
    pub fn name(self) -> &'static str {
        match self {
            NodeStatus::Waiting => "waiting",
            NodeStatus::Upgrading => "upgrading",
            NodeStatus::Confirmed => "confirmed",
            NodeStatus::Failed => "failed",
            NodeStatus::Skipped => "skipped",
            NodeStatus::Cancelled => "cancelled",
        }
    }

    /// From the upgrade command's state.
    pub fn of_command(state: Option<&str>, reason: &str) -> NodeStatus {
        match state {
            None => NodeStatus::Waiting,
            Some("succeeded") => NodeStatus::Confirmed,
            Some("expired") if reason == CANCELLED => NodeStatus::Cancelled,
            Some("failed" | "expired" | "rejected") => NodeStatus::Failed,
            Some(_) => NodeStatus::Upgrading,
        }
    }

    /// Nothing more will happen to the node in this rollout.
    pub fn settled(self) -> bool {
        !matches!(self, NodeStatus::Waiting | NodeStatus::Upgrading)
    }
}

/// A rollout's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutState {
    Running,
    Paused,
    /// Stopped by itself: the failure budget is spent.
    Halted,
    Aborted,
    Done,
}

impl RolloutState {
    pub const ALL: [RolloutState; 5] = [
        RolloutState::Running,
        RolloutState::Paused,
        RolloutState::Halted,
        RolloutState::Aborted,
        RolloutState::Done,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Paused => "paused",
            RolloutState::Halted => "halted",
            RolloutState::Aborted => "aborted",
            RolloutState::Done => "done",
        }
    }

    pub fn parse(s: &str) -> Option<RolloutState> {
        RolloutState::ALL.into_iter().find(|r| r.name() == s)
    }

    /// Running or paused: no second rollout starts meanwhile.
    pub fn active(self) -> bool {
        matches!(self, RolloutState::Running | RolloutState::Paused)
    }
}

/// A rollout to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRollout {
    pub sequence: ReleaseSeq,
    pub selector: String,
    pub waves: Vec<u32>,
    pub max_failures: u32,
    /// A label selector too: its text, and the nodes whose signed labels
    /// match it (the caller opens the signed specs; the store holds no
    /// label it could read).
    pub labels: Option<(String, std::collections::BTreeSet<NodeId>)>,
}

impl NewRollout {
    /// The selector as the rollout records it: its terms, then the label
    /// selector after ` -l `.
    pub fn recorded_selector(&self) -> String {
        match &self.labels {
            Some((text, _)) if self.selector.trim().is_empty() => format!("-l {text}"),
            Some((text, _)) => format!("{} -l {text}", self.selector.trim()),
            None => self.selector.clone(),
        }
    }
}

/// A rollout as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub id: String,
    pub sequence: ReleaseSeq,
    pub version: String,
    pub selector: String,
    pub waves: Vec<u32>,
    pub max_failures: u32,
    pub state: RolloutState,
    pub wave: usize,
    pub reason: String,
    pub created_at_ms: i64,
    pub nodes: Vec<RolloutNode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutNode {
    pub node_id: NodeId,
    pub position: usize,
    pub status: NodeStatus,
    pub command_id: Option<CommandId>,
    pub command_state: Option<String>,
    pub reason: String,
    pub rollback_id: Option<CommandId>,
    pub release_floor: u64,
}

/// Which of a rollout node's commands to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutCommand {
    Upgrade,
    Rollback,
}

/// A fresh rollout id.
pub fn new_rollout_id() -> String {
    format!("ro-{:012x}", rand::random::<u64>() >> 16)
}

/// Parses `1%,10%,50%,100%`: rising percentages ending at 100.
/// One wave of `--waves` (clap splits the list at commas): `10%` or `10`.
pub fn parse_wave(w: &str) -> Result<u32, String> {
    w.trim()
        .strip_suffix('%')
        .unwrap_or(w.trim())
        .parse::<u32>()
        .map_err(|_| format!("{w:?} is not a percentage: e.g. 1%,10%,50%,100%"))
}

pub fn validate_waves(waves: &[u32]) -> Result<(), String> {
    if waves.is_empty() || waves.last() != Some(&100) {
        return Err("the waves must end at 100%: e.g. 1%,10%,50%,100%".into());
    }
    if waves.windows(2).any(|w| w[0] >= w[1]) || waves[0] == 0 {
        return Err("the waves must rise, from above 0% to 100%: e.g. 1%,10%,50%,100%".into());
    }
    Ok(())
}

/// A node as the selector sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub node_id: NodeId,
    pub hostname: String,
    pub version: String,
}

/// Whether a node matches a selector: comma-separated `key=value` terms,
/// all of which must hold (`node=ID`, `hostname=GLOB` with `*`,
/// `version=V`); empty or `all` matches every node.
pub fn selects(selector: &str, node: &Candidate) -> Result<bool, String> {
    let selector = selector.trim();
    if selector.is_empty() || selector == "all" {
        return Ok(true);
    }
    for term in selector.split(',') {
        let (key, value) = term.split_once('=').ok_or_else(|| {
            format!("selector term {term:?} is not key=value (node=, hostname=, version=)")
        })?;
        let hit = match key.trim() {
            "node" => node.node_id == value,
            "hostname" => glob(value, &node.hostname),
            "version" => node.version == value,
            other => {
                return Err(format!(
                    "unknown selector key {other:?}: use node=, hostname= or version="
                ));
            }
        };
        if !hit {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `*` matches any run of characters and `?` any one (the `wildmatch`
/// crate: linear in the name, where a backtracking match of a pattern
/// such as `*a*a*a*b` is exponential).
pub fn glob(pattern: &str, s: &str) -> bool {
    wildmatch::WildMatch::new(pattern).matches(s)
}

/// Decides whether a rollout may start, and with which nodes (in order):
/// the release must exist, no other rollout be active, and the selector
/// match a node.
pub fn plan(
    r: &NewRollout,
    release_known: bool,
    active: Option<&str>,
    candidates: &[Candidate],
) -> Result<Vec<NodeId>, Refusal> {
    validate_waves(&r.waves).map_err(Refusal::BadRequest)?;
    if !release_known {
        return Err(Refusal::NotFound(format!(
            "no release {}: register it first (better-compute releases register)",
            r.sequence
        )));
    }
    if let Some(a) = active {
        return Err(Refusal::Conflict(format!(
            "rollout {a} is still active: let it finish, or abort it first"
        )));
    }
    let mut chosen = Vec::new();
    for c in candidates {
        let labelled = r
            .labels
            .as_ref()
            .is_none_or(|(_, among)| among.contains(&c.node_id));
        if selects(&r.selector, c).map_err(Refusal::BadRequest)? && labelled {
            chosen.push(c.node_id.clone());
        }
    }
    if chosen.is_empty() {
        return Err(Refusal::BadRequest(format!(
            "the selector {:?} matches no node: see better-compute nodes list{}",
            r.recorded_selector(),
            r.labels
                .as_ref()
                .map(|(l, _)| format!(" -l {l}"))
                .unwrap_or_default()
        )));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeStatus::*;

    #[test]
    fn waves_parse_and_must_rise_to_100() {
        assert_eq!(parse_wave("10%"), Ok(10));
        assert_eq!(parse_wave(" 100 "), Ok(100));
        for bad in ["", "%", "x", "10%%", "-5%", "1.5%"] {
            assert!(parse_wave(bad).is_err(), "{bad}");
        }
        assert_eq!(validate_waves(&[1, 10, 50, 100]), Ok(()));
        for bad in [&[][..], &[10, 5, 100], &[1, 50], &[0, 100], &[50, 50, 100]] {
            assert!(validate_waves(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn command_states_map_to_statuses() {
        assert_eq!(NodeStatus::of_command(None, ""), Waiting);
        for s in ["pending", "dispatched", "acked", "running"] {
            assert_eq!(NodeStatus::of_command(Some(s), ""), Upgrading);
        }
        assert_eq!(NodeStatus::of_command(Some("succeeded"), ""), Confirmed);
        assert_eq!(
            NodeStatus::of_command(Some("failed"), "update-failed"),
            Failed
        );
        assert_eq!(
            NodeStatus::of_command(Some("expired"), CANCELLED),
            Cancelled
        );
    }

    #[test]
    fn states_have_names() {
        for s in RolloutState::ALL {
            assert_eq!(RolloutState::parse(s.name()), Some(s));
        }
        assert!(RolloutState::Paused.active() && !RolloutState::Halted.active());
    }

    #[test]
    fn selectors() {
        let n = Candidate {
            node_id: "n1".into(),
            hostname: "gpu-a-07".into(),
            version: "0.1.0".into(),
        };
        assert!(selects("", &n).unwrap());
        assert!(selects("all", &n).unwrap());
        assert!(selects("hostname=gpu-a-*", &n).unwrap());
        assert!(selects("hostname=*-07,version=0.1.0", &n).unwrap());
        assert!(!selects("hostname=gpu-b-*", &n).unwrap());
        assert!(!selects("node=n2", &n).unwrap());
        assert!(selects("rack=1", &n).is_err());
        assert!(selects("hostname", &n).is_err());
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b", "ab-"));
        assert!(glob("gpu-??", "gpu-07") && !glob("gpu-??", "gpu-7"));
        // A pattern that makes a backtracking match take exponential time
        // against a long name answers at once.
        let name = "a".repeat(4_000);
        assert!(!glob(&format!("{}b", "*a".repeat(40)), &name));
    }

    #[test]
    fn a_rollout_needs_a_release_no_other_rollout_and_a_node() {
        let r = NewRollout {
            sequence: ReleaseSeq::new(3),
            selector: "hostname=gpu-*".into(),
            waves: vec![100],
            max_failures: 0,
            labels: None,
        };
        let nodes = [
            Candidate {
                node_id: "n1".into(),
                hostname: "gpu-1".into(),
                version: String::new(),
            },
            Candidate {
                node_id: "n2".into(),
                hostname: "cpu-1".into(),
                version: String::new(),
            },
        ];
        assert_eq!(plan(&r, true, None, &nodes), Ok(vec![NodeId::from("n1")]));
        assert!(
            matches!(plan(&r, false, None, &nodes), Err(Refusal::NotFound(m)) if m.contains("no release 3"))
        );
        assert!(matches!(
            plan(&r, true, Some("ro-1"), &nodes),
            Err(Refusal::Conflict(_))
        ));
        assert!(matches!(
            plan(&r, true, None, &nodes[1..]),
            Err(Refusal::BadRequest(_))
        ));
        let labelled = NewRollout {
            selector: String::new(),
            labels: Some(("pool=a".into(), [NodeId::from("n2")].into())),
            ..r.clone()
        };
        assert_eq!(
            plan(&labelled, true, None, &nodes),
            Ok(vec![NodeId::from("n2")])
        );
        assert_eq!(labelled.recorded_selector(), "-l pool=a");
        let none = NewRollout {
            labels: Some(("pool=a".into(), [NodeId::from("n2")].into())),
            ..r.clone()
        };
        assert!(matches!(
            plan(&none, true, None, &nodes),
            Err(Refusal::BadRequest(m)) if m.contains("-l pool=a")
        ));
        let bad = NewRollout {
            waves: vec![50],
            ..r
        };
        assert!(plan(&bad, true, None, &nodes).is_err());
    }
}
