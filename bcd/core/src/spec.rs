//! Whether a NodeSpec that verified is enforced.
//!
//! The signature is checked first (by the shell, against the worker keys
//! learned at join); a spec that verifies is still refused when it names
//! another node or an older generation than the one enforced, so a gateway
//! replaying an old signed spec cannot roll the node back. The same
//! generation again changes nothing.

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

/// Judges a verified spec for `spec_node` at `generation` on node
/// `node_id`, which enforces `current` (0: none).
pub fn judge(node_id: &str, current: u64, spec_node: &str, generation: u64) -> Verdict {
    if spec_node != node_id {
        Verdict::Refuse(format!("it is for node {spec_node}"))
    } else if generation < current {
        Verdict::Refuse(format!("generation {generation} is older than {current}"))
    } else if generation == current {
        Verdict::Same
    } else {
        Verdict::Apply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_applies_same_is_ignored_older_and_foreign_are_refused() {
        assert_eq!(judge("nd-1", 0, "nd-1", 1), Verdict::Apply);
        assert_eq!(judge("nd-1", 4, "nd-1", 5), Verdict::Apply);
        assert_eq!(judge("nd-1", 4, "nd-1", 4), Verdict::Same);
        assert_eq!(
            judge("nd-1", 4, "nd-1", 3),
            Verdict::Refuse("generation 3 is older than 4".into())
        );
        assert_eq!(
            judge("nd-1", 4, "nd-2", 9),
            Verdict::Refuse("it is for node nd-2".into())
        );
    }
}
