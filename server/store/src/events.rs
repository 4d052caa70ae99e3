//! Events nodes send from their journals, and the fleet's own events.
//!
//! Node events are facts: accepted from any epoch, kept per (node, journal
//! id, event id) so a resent event is ignored, with their time derived
//! from the age the node reports. At most [`EVENTS_KEPT_PER_NODE`] are kept
//! per node. Fleet events (`reservation.binding-rejected`, ...) are the
//! server's own records about a node.

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

/// An event as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub journal_id: String,
    pub event_id: u64,
    pub kind: String,
    pub body: Vec<u8>,
    pub at_ms: i64,
}
