//! Session epochs: which session may speak for a node.
//!
//! Every Hello transaction on the server bumps the node's epoch and routes the
//! node to the gateway that ran it. Writes on behalf of a session (dispatch
//! marks, liveness, disconnects) carry the epoch they were made under and
//! change nothing once a newer Hello has run: at most one gateway routes to a
//! node at a time. The server applies these rules inside its transactions;
//! the node applies [`EpochTracker`] to Welcomes.
//!
//! A Welcome is not signed, so the node also bounds how far one may move
//! its epoch: at most [`MAX_JUMP`] above the highest it accepted. The store
//! assigns `max(stored, node's last) + 1`, so an honest epoch is one above
//! what the node reported unless other sessions of the node ran in
//! between; a gateway that offers `u64::MAX` (after which no epoch could
//! ever rise) is refused, and one that inflates the epoch as far as it may
//! needs 2^48 sessions to exhaust it.

/// How far above the highest accepted epoch a Welcome may be.
pub const MAX_JUMP: u64 = 1 << 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    #[error(
        "the Welcome's session epoch {offered} is not above epoch {highest} this node already \
         accepted: a stale or replayed session, refusing it"
    )]
    Stale { offered: u64, highest: u64 },
    #[error(
        "the Welcome's session epoch {offered} is more than 65,536 above epoch {highest} this \
         node accepted last: not an epoch the store assigns, refusing it"
    )]
    TooFar { offered: u64, highest: u64 },
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
        if offered > self.highest.saturating_add(MAX_JUMP) {
            return Err(EpochError::TooFar {
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

    #[test]
    fn a_jump_past_the_bound_is_refused_and_changes_nothing() {
        let mut t = EpochTracker::new(10);
        assert_eq!(
            t.accept(u64::MAX),
            Err(EpochError::TooFar {
                offered: u64::MAX,
                highest: 10
            })
        );
        assert_eq!(t.highest(), 10);
        t.accept(10 + MAX_JUMP).unwrap();
        assert!(matches!(
            t.accept(10 + 2 * MAX_JUMP + 1),
            Err(EpochError::TooFar { .. })
        ));
        // What the store assigns next is always acceptable.
        t.accept(next_epoch(3, t.highest())).unwrap();
        // Near the top, the bound saturates instead of overflowing.
        let mut t = EpochTracker::new(u64::MAX - 1);
        t.accept(u64::MAX).unwrap();
        assert!(matches!(t.accept(u64::MAX), Err(EpochError::Stale { .. })));
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
        fn tracker_accepts_exactly_increasing_epochs_within_the_bound(
            epochs in proptest::collection::vec(prop_oneof![0u64..100, any::<u64>()], 0..100),
        ) {
            let mut t = EpochTracker::new(0);
            let mut highest = 0u64;
            for e in epochs {
                let ok = t.accept(e).is_ok();
                prop_assert_eq!(ok, e > highest && e - highest <= MAX_JUMP);
                if ok {
                    highest = e;
                }
                prop_assert_eq!(t.highest(), highest);
            }
        }
    }
}
