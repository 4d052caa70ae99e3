//! Liveness on the store's clock.
//!
//! The liveness controller's sweep: sessions routed to a gateway whose
//! `gateway:<id>` lease expired become `disconnected` (cause
//! [`GATEWAY_LOST`]); `disconnected` nodes unseen for the node lease TTL
//! (plus the gateway-loss grace when their gateway died) become
//! `unreachable`, with a NoSchedule taint and the NodeUnreachable
//! condition. Nothing is released.
//!
//! A sweep that finds the previous one more than `outage_gap` ago (the
//! store or the controller was down) holds every timed transition for
//! `outage_hold`, so ages the gateways could not flush meanwhile do not
//! read as dead nodes.

use std::time::Duration;

use crate::clock::ms;

/// The disconnect cause the sweep records for a lost gateway.
pub const GATEWAY_LOST: &str = "gateway-lost";

/// Liveness timings the sweep applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessRules {
    pub node_lease_ttl: Duration,
    pub gateway_loss_grace: Duration,
    pub outage_gap: Duration,
    pub outage_hold: Duration,
}

/// What a liveness sweep changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    pub disconnected: Vec<String>,
    pub unreachable: Vec<String>,
    pub held: bool,
}

/// Until when timed transitions are held, given the previous sweep's time
/// and hold: a gap over `outage_gap` starts a new hold.
pub fn hold_until(
    last_sweep_ms: Option<i64>,
    held_until_ms: i64,
    now_ms: i64,
    rules: &LivenessRules,
) -> i64 {
    if last_sweep_ms.is_some_and(|last| now_ms - last > ms(rules.outage_gap)) {
        now_ms + ms(rules.outage_hold)
    } else {
        held_until_ms
    }
}

/// Whether a disconnected node last seen at `last_seen_ms`, disconnected
/// for `cause`, is unreachable at `now_ms`.
pub fn unreachable_due(last_seen_ms: i64, cause: &str, now_ms: i64, rules: &LivenessRules) -> bool {
    let grace = if cause == GATEWAY_LOST {
        ms(rules.gateway_loss_grace)
    } else {
        0
    };
    last_seen_ms + ms(rules.node_lease_ttl) + grace < now_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: LivenessRules = LivenessRules {
        node_lease_ttl: Duration::from_secs(40),
        gateway_loss_grace: Duration::from_secs(120),
        outage_gap: Duration::from_secs(20),
        outage_hold: Duration::from_secs(300),
    };

    #[test]
    fn a_gap_in_sweeps_holds_transitions_for_the_hold_time() {
        assert_eq!(hold_until(None, 0, 1_000, &RULES), 0, "the first sweep");
        assert_eq!(
            hold_until(Some(0), 0, 20_000, &RULES),
            0,
            "a gap of exactly 20 s"
        );
        assert_eq!(hold_until(Some(0), 0, 20_001, &RULES), 320_001);
        assert_eq!(
            hold_until(Some(319_000), 320_001, 320_000, &RULES),
            320_001,
            "a running hold is kept"
        );
    }

    #[test]
    fn unreachable_after_the_node_lease_plus_the_grace_for_a_lost_gateway() {
        assert!(!unreachable_due(0, "stream-ended", 40_000, &RULES));
        assert!(unreachable_due(0, "stream-ended", 40_001, &RULES));
        assert!(!unreachable_due(0, GATEWAY_LOST, 160_000, &RULES));
        assert!(unreachable_due(0, GATEWAY_LOST, 160_001, &RULES));
    }
}
