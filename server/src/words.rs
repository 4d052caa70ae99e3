//! How values are put into words for people: times, ages, enum
//! spellings, a node's state and cordon, a command's state, a node's GPUs.
//! The CLI (`cli`) and the web console (`console`) both print with these,
//! so a page and a table say the same; neither imports the other.

use std::time::Duration;

use bcd_proto::v1::{CommandInfo, CommandState, NodeInfo, NodeState, ResultEvidence};

/// An age for people: seconds, minutes, hours.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

/// A store time (unix ms) in RFC 3339, to the second.
pub fn time(ms: i64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64),
    )
    .to_string()
}

/// An enum field of a wire message as people read it: its one spelling
/// (`bcd_proto::typed`), or the number of a value this CLI does not know.
pub fn spelled<E: bcd_proto::typed::Spelling + TryFrom<i32>>(v: i32) -> String {
    match E::try_from(v) {
        Ok(e) => e.spelling().to_string(),
        Err(_) => v.to_string(),
    }
}

/// A GPU as a node's `gpus` inventory section reports it (the fields
/// `nodes show` prints; others are ignored).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Gpu {
    pub pci_address: String,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub numa_node: Option<i32>,
}

/// The GPUs in a `gpus` section's body, or why it does not read.
pub fn gpus(body: &[u8]) -> Result<Vec<Gpu>, String> {
    serde_json::from_slice(body).map_err(|e| format!("the gpus section does not read: {e}"))
}

/// The state as `nodes list` shows it: `connected`, and `,cordoned` after
/// it when the node is cordoned (or its signed spec does not open, so its
/// cordon is unknown: `,spec-forged`).
pub fn node_state(n: &NodeInfo) -> String {
    let state = spelled::<NodeState>(n.state);
    if !n.intent_error.is_empty() {
        format!("{state},spec-forged")
    } else if n.intent.as_ref().is_some_and(|i| i.cordoned) {
        format!("{state},cordoned")
    } else {
        state
    }
}

/// Since when and why a node is cordoned, or empty.
pub fn cordon(n: &NodeInfo) -> String {
    match &n.intent {
        Some(i) if i.cordoned => format!(
            "since {}{}",
            time(i.cordoned_at_ms),
            if i.cordon_reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", i.cordon_reason)
            }
        ),
        _ => String::new(),
    }
}

/// A command's state as lists print it: FORGED for a result no node
/// signed, whatever the row says.
pub fn command_state(i: &CommandInfo) -> String {
    if i.evidence == ResultEvidence::Forged as i32 {
        "FORGED".to_string()
    } else {
        spelled::<CommandState>(i.state)
    }
}

/// The node state a filter names (`nodes list --state`, the console's
/// `?state=`): connected, disconnected or unreachable.
pub fn node_state_filter(s: &str) -> Option<NodeState> {
    match s.trim().to_ascii_lowercase().as_str() {
        "connected" => Some(NodeState::Connected),
        "disconnected" => Some(NodeState::Disconnected),
        "unreachable" => Some(NodeState::Unreachable),
        _ => None,
    }
}
