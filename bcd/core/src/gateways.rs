//! Which gateways a node stays on: the key holder's signed, short-lived
//! list of revoked gateway certificates ([`RevocationList`]).
//!
//! Every gateway hands its nodes the newest list it has, at the Welcome and
//! whenever a newer one is issued. A node holds the newest it saw (by when
//! it was signed; kept across restarts by the shell) and
//!
//! - leaves a gateway whose certificate the list names, at once, whether it
//!   learnt the list there or through another gateway earlier;
//! - leaves a gateway that lets the held list run out without handing a
//!   newer one: at a point drawn in the list's last fifth, so a fleet whose
//!   key holder is away does not redial all at once. A redial that lands
//!   on a gateway it left so is left again (at most [`MAX_STALE_LEAVES`]
//!   times in all, then it stays: behind a balancer that keeps routing it
//!   there, or with every gateway's list stale because the key holder is
//!   down, staying is all there is), and while no newer list comes it
//!   leaves the gateway it is on again one list's life later (at least
//!   [`MIN_REARM_MS`]): a gateway that withholds lists and holds the route
//!   keeps the node only until then.
//!
//! A node that never saw a list enforces nothing: a fleet whose control
//! plane signs none keeps working.
//!
//! Whether a list ran out is judged on the later of the node's estimate of
//! server time (which a gateway's Welcome anchors) and the list's own
//! signed issue time plus the node's monotonic time since it took the
//! list: a gateway that rewinds its Welcome's time gains nothing. Nothing
//! here reads a clock: server times and the node's monotonic "local" time
//! (ms) are parameters.

use crate::rng::SplitMix64;

/// A gateway certificate the list revokes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedGateway {
    /// The gateway's name, for the log.
    pub name: String,
    /// SHA-256 of the certificate's DER, lowercase hex.
    pub sha256: String,
    /// The certificate's own end.
    pub not_after_ms: i64,
}

/// A signed list of revoked gateway certificates, as verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevocationList {
    /// When the key holder signed it (store time).
    pub issued_ms: i64,
    /// When it goes stale.
    pub not_after_ms: i64,
    pub certs: Vec<RevokedGateway>,
}

impl RevocationList {
    /// How often the key holder signs a list anew: a tenth of its life (at
    /// least 100 ms), as `better-compute serve` does. A list taken is at
    /// most about that old, while the key holder is up.
    pub fn signed_every(&self) -> std::time::Duration {
        let life = self.not_after_ms.saturating_sub(self.issued_ms).max(0) as u64;
        std::time::Duration::from_millis((life / 10).max(100))
    }

    /// The entry naming the certificate of SHA-256 `sha256`, if any.
    pub fn names(&self, sha256: &str) -> Option<&RevokedGateway> {
        self.certs.iter().find(|c| c.sha256 == sha256)
    }
}

/// Why the node leaves the gateway it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leave {
    /// The newest list names the gateway's certificate.
    Revoked { name: String },
    /// The newest list ran out (or is drawn to run out) on this gateway
    /// with no newer one.
    Stale { not_after_ms: i64 },
}

impl std::fmt::Display for Leave {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Leave::Revoked { name } => write!(
                f,
                "the key holder revoked this gateway's certificate (gateway {name})"
            ),
            Leave::Stale { not_after_ms } => write!(
                f,
                "this gateway handed no gateway revocation list newer than the one that \
                 runs out at {not_after_ms}"
            ),
        }
    }
}

/// How many times a node leaves gateways for one stale list.
pub const MAX_STALE_LEAVES: u32 = 3;

/// The least time between two stale leaves under one list.
pub const MIN_REARM_MS: i64 = 60_000;

/// The node's side of gateway revocation; see the module.
#[derive(Debug, Clone)]
pub struct GatewayTrust {
    held: Option<RevocationList>,
    /// When (local ms) `held` was taken: a list kept across a restart
    /// counts as taken at local time 0 (it was signed before this process
    /// started, so its issue time plus the process's time is still a time
    /// that has passed).
    received_local_ms: Option<i64>,
    /// The list the shell last kept on disk: when it was signed and what
    /// it names (sorted).
    kept: Option<(i64, Vec<String>)>,
    /// When a gateway that lets `held` run out is left (server ms).
    leave_at_ms: i64,
    /// Stale leaves under `held` so far, and the gateways left so.
    stale_leaves: u32,
    withheld: Vec<String>,
    rng: SplitMix64,
}

impl GatewayTrust {
    /// `held`: the newest list the node kept, if any.
    pub fn new(held: Option<RevocationList>, seed: u64) -> GatewayTrust {
        let mut t = GatewayTrust {
            held: None,
            received_local_ms: None,
            kept: None,
            leave_at_ms: i64::MAX,
            stale_leaves: 0,
            withheld: Vec::new(),
            rng: SplitMix64::new(seed),
        };
        if let Some(list) = held {
            t.hold(list);
            t.kept_now();
            t.received_local_ms = Some(0);
        }
        t
    }

    /// Whether the held list is worth writing down: it names other
    /// certificates than the one kept, or the kept one is more than half
    /// a life older. A fleet re-signed every minute so writes a few times
    /// a life, and a restart finds a list that still holds unless the
    /// node was down for half a life or more (then its first gateway
    /// hands a newer one with the Welcome).
    pub fn to_keep(&self) -> bool {
        let Some(h) = &self.held else {
            return false;
        };
        match &self.kept {
            None => true,
            Some((issued, names)) => {
                let half_life = h.not_after_ms.saturating_sub(h.issued_ms) / 2;
                *names != Self::names_of(h) || h.issued_ms.saturating_sub(*issued) > half_life
            }
        }
    }

    /// The shell wrote the held list down.
    pub fn kept_now(&mut self) {
        self.kept = self.held.as_ref().map(|h| (h.issued_ms, Self::names_of(h)));
    }

    fn names_of(list: &RevocationList) -> Vec<String> {
        let mut names: Vec<String> = list.certs.iter().map(|c| c.sha256.clone()).collect();
        names.sort();
        names
    }

    pub fn held(&self) -> Option<&RevocationList> {
        self.held.as_ref()
    }

    fn hold(&mut self, list: RevocationList) {
        let life = list.not_after_ms.saturating_sub(list.issued_ms).max(0);
        let fifth = life / 5;
        let draw = self.rng.below_inclusive(fifth as u64) as i64;
        self.leave_at_ms = list
            .not_after_ms
            .saturating_sub(fifth)
            .saturating_add(draw)
            .min(list.not_after_ms);
        self.stale_leaves = 0;
        self.withheld.clear();
        self.held = Some(list);
    }

    /// A gateway just reached, by its certificate's SHA-256: stay, or
    /// leave before anything is sent to it.
    pub fn reached(&mut self, gateway: &str) -> Result<(), Leave> {
        let Some(held) = &self.held else {
            return Ok(());
        };
        if let Some(r) = held.names(gateway) {
            return Err(Leave::Revoked {
                name: r.name.clone(),
            });
        }
        if self.withheld.iter().any(|g| g == gateway) && self.stale_leaves < MAX_STALE_LEAVES {
            self.stale_leaves += 1;
            return Err(Leave::Stale {
                not_after_ms: held.not_after_ms,
            });
        }
        Ok(())
    }

    /// A list that verified, handed by `gateway` at local time
    /// `local_ms`: the first value says it is newer than the one held and
    /// now held (the shell keeps it); the second whether to leave the
    /// gateway.
    pub fn offered(
        &mut self,
        list: RevocationList,
        gateway: &str,
        local_ms: i64,
    ) -> (bool, Result<(), Leave>) {
        let newer = self
            .held
            .as_ref()
            .is_none_or(|h| list.issued_ms > h.issued_ms);
        if newer {
            self.hold(list);
            self.received_local_ms = Some(local_ms);
        }
        let leave = match self.held.as_ref().and_then(|h| h.names(gateway)) {
            Some(r) => Err(Leave::Revoked {
                name: r.name.clone(),
            }),
            None => Ok(()),
        };
        (newer, leave)
    }

    /// The time the held list is judged on (see the module): the later
    /// of `server_now_ms` (the node's estimate, if it has one) and the
    /// list's issue time plus the local time since it was taken.
    fn judged_now(&self, server_now_ms: Option<i64>, local_ms: i64) -> Option<i64> {
        let since_taken = match (&self.held, self.received_local_ms) {
            (Some(h), Some(at)) => Some(h.issued_ms.saturating_add(local_ms.saturating_sub(at))),
            _ => None,
        };
        match (server_now_ms, since_taken) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// On `gateway` at server time `server_now_ms` (local time
    /// `local_ms`): whether the held list ran out here. Once per list;
    /// see the module.
    pub fn due(
        &mut self,
        server_now_ms: Option<i64>,
        local_ms: i64,
        gateway: &str,
    ) -> Result<(), Leave> {
        let now = self.judged_now(server_now_ms, local_ms);
        match &self.held {
            Some(h) if let Some(n) = now.filter(|n| *n >= self.leave_at_ms) => {
                // Again one life later, the redials counted afresh.
                let life = h.not_after_ms.saturating_sub(h.issued_ms);
                self.leave_at_ms = n.saturating_add(life.max(MIN_REARM_MS));
                self.stale_leaves = 1;
                if !self.withheld.iter().any(|g| g == gateway) {
                    self.withheld.push(gateway.to_string());
                }
                Err(Leave::Stale {
                    not_after_ms: h.not_after_ms,
                })
            }
            _ => Ok(()),
        }
    }

    /// When [`GatewayTrust::due`] next says to leave (server ms), if it
    /// can.
    pub fn due_at(&self) -> Option<i64> {
        self.held.is_some().then_some(self.leave_at_ms)
    }

    /// How long (ms) until [`GatewayTrust::due`] says to leave, judged as
    /// it judges; `None` when it will not (or there is no time to judge
    /// on). The shell sleeps this long, then asks.
    pub fn due_in(&self, server_now_ms: Option<i64>, local_ms: i64) -> Option<i64> {
        let at = self.due_at()?;
        let now = self.judged_now(server_now_ms, local_ms)?;
        Some(at.saturating_sub(now).max(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: i64 = 60_000;

    fn list(issued_ms: i64, revoked: &[&str]) -> RevocationList {
        RevocationList {
            issued_ms,
            not_after_ms: issued_ms + 5 * MIN,
            certs: revoked
                .iter()
                .map(|g| RevokedGateway {
                    name: format!("gw-{g}"),
                    sha256: g.to_string(),
                    not_after_ms: issued_ms + 30 * 24 * 60 * MIN,
                })
                .collect(),
        }
    }

    #[test]
    fn a_node_that_never_saw_a_list_stays_anywhere() {
        let mut t = GatewayTrust::new(None, 1);
        assert_eq!(t.reached("a"), Ok(()));
        assert_eq!(t.due(Some(i64::MAX), 0, "a"), Ok(()));
        assert_eq!(t.due_at(), None);
    }

    #[test]
    fn a_revoked_gateway_is_left_where_the_list_arrives_and_refused_after() {
        let mut t = GatewayTrust::new(None, 1);
        // Learnt through another gateway...
        assert_eq!(t.offered(list(1_000, &["a"]), "b", 0), (true, Ok(())));
        // ... the revoked one is left as soon as it is reached.
        assert_eq!(
            t.reached("a"),
            Err(Leave::Revoked {
                name: "gw-a".into()
            })
        );
        assert_eq!(t.reached("b"), Ok(()));
        // A revoked gateway handing the list that names it is left too.
        let mut t = GatewayTrust::new(None, 1);
        let (newer, leave) = t.offered(list(1_000, &["a"]), "a", 0);
        assert!(newer);
        assert!(matches!(leave, Err(Leave::Revoked { .. })));
    }

    #[test]
    fn an_older_list_replaces_nothing_and_does_not_unrevoke() {
        let mut t = GatewayTrust::new(Some(list(2_000, &["a"])), 1);
        // A gateway replays a list from before the revocation.
        assert!(!t.offered(list(1_000, &[]), "a", 0).0);
        assert!(matches!(t.reached("a"), Err(Leave::Revoked { .. })));
        // The same list again is no newer either.
        assert!(!t.offered(list(2_000, &[]), "b", 0).0);
        assert_eq!(t.held().unwrap().issued_ms, 2_000);
    }

    #[test]
    fn a_gateway_that_withholds_newer_lists_is_left_in_the_lists_last_fifth_then_each_life() {
        for seed in 0..200 {
            let mut t = GatewayTrust::new(None, seed);
            let l = list(0, &[]);
            let end = l.not_after_ms;
            let _ = t.offered(l, "a", 0);
            let at = t.due_at().unwrap();
            assert!((end - MIN..=end).contains(&at), "seed {seed}: {at}");
            assert_eq!(t.due(Some(at - 1), 0, "a"), Ok(()));
            assert_eq!(
                t.due(Some(at), 0, "a"),
                Err(Leave::Stale { not_after_ms: end })
            );
            // On the next gateway, with the same list, it stays a life
            // (every gateway's list is stale when the key holder is away)
            // ...
            assert_eq!(t.due_at(), Some(at + 5 * MIN));
            assert_eq!(t.reached("b"), Ok(()));
            assert_eq!(t.due(Some(at + 5 * MIN - 1), 0, "b"), Ok(()));
            // ... a redial back onto the one that withheld is left again,
            // a bounded number of times, then it stays ...
            for _ in 1..MAX_STALE_LEAVES {
                assert!(matches!(t.reached("a"), Err(Leave::Stale { .. })));
            }
            assert_eq!(t.reached("a"), Ok(()), "then it stays");
            // ... and a life later it leaves again, the redials counted
            // afresh: a gateway that withholds lists and holds the route
            // keeps the node a life at a time.
            assert!(t.due(Some(at + 5 * MIN), 0, "a").is_err());
            assert!(matches!(t.reached("a"), Err(Leave::Stale { .. })));
            assert!(matches!(t.reached("b"), Ok(())));
            assert_eq!(t.due_at(), Some(at + 10 * MIN));
        }
    }

    #[test]
    fn a_newer_list_resets_the_stale_leaves() {
        let mut t = GatewayTrust::new(Some(list(0, &[])), 3);
        assert!(t.due(Some(5 * MIN), 0, "a").is_err());
        let (newer, leave) = t.offered(list(6 * MIN, &[]), "b", 0);
        assert!(newer && leave.is_ok());
        assert_eq!(t.reached("a"), Ok(()), "a newer list forgives");
        assert!(t.due_at().unwrap() >= 10 * MIN);
    }

    #[test]
    fn a_gateway_that_rewinds_server_time_does_not_keep_a_list_fresh() {
        let mut t = GatewayTrust::new(None, 5);
        let l = list(0, &[]);
        let end = l.not_after_ms;
        // Taken at local time 1_000.
        let _ = t.offered(l, "a", 1_000);
        let at = t.due_at().unwrap();
        // The gateway's Welcome said a time long past: the list's signed
        // issue time plus the local time since it was taken still runs.
        assert_eq!(t.due(Some(-100 * MIN), 1_000 + at - 1, "a"), Ok(()));
        assert_eq!(t.due_in(Some(-100 * MIN), 1_000 + at - 1), Some(1));
        assert_eq!(
            t.due(Some(-100 * MIN), 1_000 + at, "a"),
            Err(Leave::Stale { not_after_ms: end })
        );
        // With no estimate of server time at all, the same.
        let mut t = GatewayTrust::new(None, 5);
        let _ = t.offered(list(0, &[]), "a", 0);
        assert_eq!(t.due_in(None, 0), t.due_at());
        assert!(t.due(None, at, "a").is_err());
        // A list kept across a restart runs on from local time 0 (the
        // process started after it was signed).
        let mut t = GatewayTrust::new(Some(list(0, &[])), 5);
        assert_eq!(t.due_in(None, 0), t.due_at());
        assert_eq!(t.due(Some(-100 * MIN), at - 1, "a"), Ok(()));
        assert!(t.due(Some(-100 * MIN), at, "a").is_err());
    }

    #[test]
    fn a_list_is_written_down_when_it_names_another_set_or_half_a_life_passed() {
        let mut t = GatewayTrust::new(None, 1);
        assert!(!t.to_keep(), "nothing held");
        let _ = t.offered(list(0, &[]), "b", 0);
        assert!(t.to_keep(), "the first list");
        t.kept_now();
        assert!(!t.to_keep());
        // Re-signed a minute later, the same set: not yet.
        let _ = t.offered(list(MIN, &[]), "b", 0);
        assert!(!t.to_keep());
        // Another set: at once.
        let _ = t.offered(list(2 * MIN, &["a"]), "b", 0);
        assert!(t.to_keep());
        t.kept_now();
        // The same set past half a life (2.5 min of a 5 min life).
        let _ = t.offered(list(4 * MIN, &["a"]), "b", 0);
        assert!(!t.to_keep());
        let _ = t.offered(list(5 * MIN, &["a"]), "b", 0);
        assert!(t.to_keep());
        // A list read back at start counts as kept.
        assert!(!GatewayTrust::new(Some(list(0, &["a"])), 1).to_keep());
    }

    #[test]
    fn a_list_that_ends_before_it_begins_is_stale_at_its_end() {
        let mut t = GatewayTrust::new(None, 9);
        let _ = t.offered(
            RevocationList {
                issued_ms: 10_000,
                not_after_ms: 5_000,
                certs: vec![],
            },
            "a",
            0,
        );
        assert_eq!(t.due_at(), Some(5_000));
    }

    proptest! {
        /// Whatever lists gateways hand, in whatever order, the node holds
        /// the newest (the first of equals) and refuses a gateway exactly
        /// when that list names it: a replayed older list lifts nothing.
        #[test]
        fn the_newest_list_wins_in_any_order(
            lists in proptest::collection::vec((0i64..1_000, proptest::bool::ANY), 1..20),
            seed in 0u64..1_000,
        ) {
            let mut t = GatewayTrust::new(None, seed);
            for (issued, revokes) in &lists {
                let l = list(*issued, if *revokes { &["a"] } else { &[] });
                let _ = t.offered(l, "b", 0);
            }
            let newest = lists.iter().map(|(i, _)| *i).max().unwrap();
            let held = t.held().unwrap();
            prop_assert_eq!(held.issued_ms, newest);
            let first_of_newest = lists.iter().find(|(i, _)| *i == newest).unwrap().1;
            prop_assert_eq!(t.reached("a").is_err(), first_of_newest);
        }
    }
}
