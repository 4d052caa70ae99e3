//! Session epochs: which session may speak for a node.
//!
//! Every Hello transaction on the server bumps the node's epoch and routes the
//! node to the gateway that ran it. Writes on behalf of a session (dispatch
//! marks, liveness, disconnects) carry the epoch they were made under and
//! change nothing once a newer Hello has run: at most one gateway routes to a
//! node at a time. The server applies these rules inside its transactions;
//! the node applies [`EpochTracker`] to Welcomes.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    #[error(
        "the Welcome's session epoch {offered} is not above epoch {highest} this node already \
         accepted: a stale or replayed session, refusing it"
    )]
    Stale { offered: u64, highest: u64 },
}

/// The epoch a Hello transaction assigns. It is above the stored epoch and
/// above the highest one the node reports having seen, so epochs keep rising
/// even if the store was restored from an older copy.
pub fn next_epoch(stored: u64, node_last_seen: u64) -> u64 {
    stored.max(node_last_seen).saturating_add(1)
}

/// Whether a write made under `write_epoch` may change a session whose
/// current epoch is `current`. Only the session that is current may write.
pub fn write_applies(current: u64, write_epoch: u64) -> bool {
    current == write_epoch
}

/// The node's view: each accepted Welcome must carry a higher epoch than any
/// before it.
#[derive(Debug, Clone, Default)]
pub struct EpochTracker {
    highest: u64,
}

impl EpochTracker {
    pub fn new(highest: u64) -> Self {
        EpochTracker { highest }
    }

    pub fn highest(&self) -> u64 {
        self.highest
    }

    pub fn accept(&mut self, offered: u64) -> Result<(), EpochError> {
        if offered <= self.highest {
            return Err(EpochError::Stale {
                offered,
                highest: self.highest,
            });
        }
        self.highest = offered;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stale_welcome_is_refused() {
        let mut t = EpochTracker::new(0);
        t.accept(3).unwrap();
        assert_eq!(
            t.accept(3),
            Err(EpochError::Stale {
                offered: 3,
                highest: 3
            })
        );
        assert!(t.accept(2).is_err());
        t.accept(4).unwrap();
        assert_eq!(t.highest(), 4);
    }

    /// A model of the store: several gateways race Hellos and fenced writes
    /// for one node. Whatever the interleaving, epochs only rise, each Hello
    /// gets a distinct epoch, and only writes from the latest Hello apply.
    #[derive(Debug, Clone)]
    enum Op {
        Hello { gateway: u8, node_last: u64 },
        Write { gateway: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3, 0u64..50).prop_map(|(gateway, node_last)| Op::Hello { gateway, node_last }),
            (0u8..3).prop_map(|gateway| Op::Write { gateway }),
        ]
    }

    proptest! {
        #[test]
        fn only_the_latest_session_writes(ops in proptest::collection::vec(op(), 1..200)) {
            let mut stored = 0u64;
            let mut route: Option<u8> = None;
            // The epoch each gateway believes it holds.
            let mut held = [None::<u64>; 3];
            let mut seen = std::collections::BTreeSet::new();
            for op in ops {
                match op {
                    Op::Hello { gateway, node_last } => {
                        let e = next_epoch(stored, node_last);
                        prop_assert!(e > stored && e > node_last);
                        prop_assert!(seen.insert(e), "epoch {} assigned twice", e);
                        stored = e;
                        route = Some(gateway);
                        held[gateway as usize] = Some(e);
                    }
                    Op::Write { gateway } => {
                        if let Some(e) = held[gateway as usize] {
                            let applies = write_applies(stored, e);
                            prop_assert_eq!(applies, route == Some(gateway) && e == stored);
                        }
                    }
                }
            }
        }

        #[test]
        fn tracker_accepts_exactly_increasing_epochs(epochs in proptest::collection::vec(0u64..100, 0..100)) {
            let mut t = EpochTracker::new(0);
            let mut highest = 0;
            for e in epochs {
                let ok = t.accept(e).is_ok();
                prop_assert_eq!(ok, e > highest);
                highest = highest.max(e);
                prop_assert_eq!(t.highest(), highest);
            }
        }
    }
}
