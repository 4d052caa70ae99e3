//! Events nodes send from their journals, and the fleet's own events.
//!
//! Node events are facts: accepted from any epoch, kept per (node, journal
//! id, event id) so a resent event is ignored, with their time derived
//! from the age the node reports. At most [`EVENTS_KEPT_PER_NODE`] are kept
//! per node. Fleet events (`reservation.binding-rejected`, ...) are the
//! server's own records about a node.

use crate::id::NodeId;

/// Events kept per node; older ones are trimmed as new ones arrive.
pub const EVENTS_KEPT_PER_NODE: i64 = 10_000;

/// An event as a node sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventInput {
    pub id: u64,
    pub kind: String,
    pub body: Vec<u8>,
    /// How long ago it happened, on the node's clock.
    pub age_ms: u64,
}

/// Whether a node's event is a security event: kept where a gateway
/// cannot delete it, until the key holder's receipt.
pub fn is_security(kind: &str) -> bool {
    kind.starts_with("security.")
}

/// How long a node's receipted security event is kept after its receipt,
/// on the key holder's clock: rows a gateway inserts (with whatever `at`)
/// push none out.
pub const SECURITY_EVENTS_KEPT_MS: i64 = 90 * 24 * 3600 * 1000;

/// What names one of a node's security events as stored (the store keeps
/// several under one id when a gateway planted one): its id, kind and the
/// SHA-256 of its body, lowercase hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub id: u64,
    pub kind: String,
    pub body_sha256: String,
}

impl EventKey {
    pub fn of(e: &EventInput) -> EventKey {
        use sha2::Digest;
        EventKey {
            id: e.id,
            kind: e.kind.clone(),
            body_sha256: hex::encode(sha2::Sha256::digest(&e.body)),
        }
    }
}

/// A node's security event the key holder has not judged for a receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecurityEvent {
    pub node_id: NodeId,
    pub journal_id: String,
    pub event_id: u64,
    pub kind: String,
    pub body: Vec<u8>,
}

/// An event as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub journal_id: String,
    pub event_id: u64,
    pub kind: String,
    pub body: Vec<u8>,
    pub at_ms: i64,
}

/// A fleet event as operators read it (`better-compute events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetEvent {
    /// Rises with every event: where `--follow` goes on from.
    pub id: i64,
    pub at_ms: i64,
    pub kind: String,
    pub node_id: NodeId,
    pub detail: String,
}

/// Which fleet events to read, oldest first: those after `after_id`, at or
/// after `since_ms`, of `node_id` when set, whose kind matches `kind` (a
/// glob: `*` any run of characters, `?` one; empty: any), at most `limit`
/// of them: when more match, the oldest after a position (`after_id` above
/// 0, so a follower misses none) or else the newest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventQuery {
    pub node_id: Option<NodeId>,
    pub kind: String,
    pub after_id: i64,
    pub since_ms: i64,
    pub limit: u32,
}

/// The most events one read answers.
pub const EVENTS_READ_AT_MOST: u32 = 10_000;

/// A kind glob as an SQL `LIKE` pattern with `\` as its escape: `*` is
/// `%`, `?` is `_`, and the pattern characters of the glob's text are
/// escaped.
pub fn like_pattern(glob: &str) -> String {
    if glob.is_empty() {
        return "%".into();
    }
    let mut out = String::with_capacity(glob.len() + 4);
    for c in glob.chars() {
        match c {
            '*' => out.push('%'),
            '?' => out.push('_'),
            '%' | '_' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_glob_becomes_a_like_pattern_with_its_text_escaped() {
        assert_eq!(like_pattern(""), "%");
        assert_eq!(like_pattern("security.*"), "security.%");
        assert_eq!(like_pattern("node.?e"), "node._e");
        assert_eq!(like_pattern("a_b%c\\d"), "a\\_b\\%c\\\\d");
    }
}
