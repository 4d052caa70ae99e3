//! Whether a NodeSpec that verified is enforced.
//!
//! The signature is checked first (by the shell, against the worker keys
//! learned at join); a spec that verifies is still refused when it names
//! another node, when it is older than the one enforced or than the node's
//! *generation floor* (the highest generation it ever took on, kept outside
//! the journal, so a lost journal does not let a gateway replay an old
//! spec), or when it has expired on server time (or carries no expiry):
//! workers sign a fresh generation before a spec runs out, so an expired
//! one can only be a replay. A refused spec changes nothing; the spec held
//! stays enforced, expired or not. The same generation again changes
//! nothing.

/// What to do with a verified spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A newer generation: journal it and converge.
    Apply,
    /// The generation enforced already.
    Same,
    /// Refused; the last good spec stays enforced. The reason is for the
    /// log and the `spec.refused` event.
    Refuse(String),
}

/// A verified spec, as the judge needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Offered<'a> {
    pub node_id: &'a str,
    pub generation: u64,
    /// Server time after which it is refused; 0: none (refused).
    pub not_after_ms: i64,
}

/// What the node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a> {
    pub node_id: &'a str,
    /// The generation enforced (0: none).
    pub current: u64,
    /// The highest generation this node took on, journal or not.
    pub floor: u64,
    /// Server time now; `None` before a Welcome anchored it.
    pub server_now_ms: Option<i64>,
}

/// Judges a verified spec against what the node holds.
pub fn judge(held: Held<'_>, spec: Offered<'_>) -> Verdict {
    let generation = spec.generation;
    if spec.node_id != held.node_id {
        return Verdict::Refuse(format!("it is for node {}", spec.node_id));
    }
    if generation == held.current {
        return Verdict::Same;
    }
    if generation < held.current {
        return Verdict::Refuse(format!(
            "generation {generation} is older than {}",
            held.current
        ));
    }
    if generation < held.floor {
        return Verdict::Refuse(format!(
            "generation {generation} is below {}, the highest this node took on (a replay)",
            held.floor
        ));
    }
    if spec.not_after_ms == 0 {
        return Verdict::Refuse("it carries no expiry".to_string());
    }
    match held.server_now_ms {
        Some(now) if now > spec.not_after_ms => Verdict::Refuse(format!(
            "it expired at {} on server time (now {now}): a replay of an old spec",
            spec.not_after_ms
        )),
        // Before a Welcome there is no server time; specs arrive after it.
        None => Verdict::Refuse("no server time yet".to_string()),
        Some(_) => Verdict::Apply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(current: u64, floor: u64) -> Held<'static> {
        Held {
            node_id: "nd-1",
            current,
            floor,
            server_now_ms: Some(1_000),
        }
    }

    fn spec(node_id: &str, generation: u64) -> Offered<'_> {
        Offered {
            node_id,
            generation,
            not_after_ms: 5_000,
        }
    }

    #[test]
    fn newer_applies_same_is_ignored_older_and_foreign_are_refused() {
        assert_eq!(judge(held(0, 0), spec("nd-1", 1)), Verdict::Apply);
        assert_eq!(judge(held(4, 4), spec("nd-1", 5)), Verdict::Apply);
        assert_eq!(judge(held(4, 4), spec("nd-1", 4)), Verdict::Same);
        assert_eq!(
            judge(held(4, 4), spec("nd-1", 3)),
            Verdict::Refuse("generation 3 is older than 4".into())
        );
        assert_eq!(
            judge(held(4, 4), spec("nd-2", 9)),
            Verdict::Refuse("it is for node nd-2".into())
        );
    }

    #[test]
    fn a_lost_journal_keeps_the_floor() {
        // A new journal holds no spec; the floor remembers generation 6.
        let v = judge(held(0, 6), spec("nd-1", 5));
        assert!(
            matches!(&v, Verdict::Refuse(r) if r.contains("below 6") && r.contains("replay")),
            "{v:?}"
        );
        // The spec of the floor's own generation is the one it took on.
        assert_eq!(judge(held(0, 6), spec("nd-1", 6)), Verdict::Apply);
        assert_eq!(judge(held(0, 6), spec("nd-1", 7)), Verdict::Apply);
    }

    #[test]
    fn an_expired_spec_or_one_without_expiry_is_refused() {
        let expired = Offered {
            not_after_ms: 999,
            ..spec("nd-1", 5)
        };
        assert!(matches!(judge(held(4, 4), expired), Verdict::Refuse(r) if r.contains("expired")));
        let forever = Offered {
            not_after_ms: 0,
            ..spec("nd-1", 5)
        };
        assert_eq!(
            judge(held(4, 4), forever),
            Verdict::Refuse("it carries no expiry".into())
        );
        let no_time = Held {
            server_now_ms: None,
            ..held(4, 4)
        };
        assert!(matches!(
            judge(no_time, spec("nd-1", 5)),
            Verdict::Refuse(_)
        ));
        // Exactly at its end it still applies.
        let edge = Offered {
            not_after_ms: 1_000,
            ..spec("nd-1", 5)
        };
        assert_eq!(judge(held(4, 4), edge), Verdict::Apply);
    }
}
