//! The fault schedule: which faults, when, to what, decided up front from
//! the seed, so the same seed gives the same schedule.
//!
//! - `light`: one gateway killed (and a replacement started), a few daemon
//!   crashes, one lost journal, one reboot, a handful of reset links, one
//!   gateway host's clock stepped seconds off.
//! - `heavy`: two gateway kills, a store stall and a longer store outage
//!   (an exclusive lock held on the store, past the gateways' lease
//!   renewal; on the run's own PostgreSQL cluster, the server frozen and
//!   the server stopped and started again), a partition of one gateway (half-open links), link delay,
//!   dropped and reset links, two gateway clocks stepped off, and daemon
//!   crashes, lost journals and reboots on 2% of the nodes each.
//! - `kill`: for measuring: one gateway killed a third of the way in, and a
//!   reconnect storm (every link reset at once) two thirds of the way in;
//!   nothing else.

use std::time::Duration;

use bcd_core::SplitMix64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Level {
    None,
    Light,
    Heavy,
    Kill,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a gateway process: no disconnect writes, no lease release.
    /// A replacement gateway starts `restart_after` later.
    KillGateway {
        gateway: usize,
        restart_after: Duration,
    },
    /// Hold an exclusive lock on the store for this long.
    StoreStall(Duration),
    /// A gateway's links go half-open for this long.
    Partition { gateway: usize, for_: Duration },
    /// Every forwarded chunk waits this long, for `for_`.
    Delay { by: Duration, for_: Duration },
    /// Close this many links from the middle.
    DropLinks(usize),
    /// Reset this many links.
    ResetLinks(usize),
    /// The daemon dies where it stands and starts again `restart_after`
    /// later.
    CrashDaemon {
        node: usize,
        restart_after: Duration,
    },
    /// `sim.loseJournal(node)`.
    LoseJournal(usize),
    /// The machine reboots.
    Reboot(usize),
    /// The clock of a gateway's host steps by this many milliseconds
    /// (ahead when positive): the gateway raises ClockSkew, and nothing
    /// that decides liveness may follow its clock.
    ClockOffset { gateway: usize, by_ms: i64 },
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillGateway { .. } => "gateway kill",
            Fault::StoreStall(d) if *d >= Duration::from_secs(4) => "store outage",
            Fault::StoreStall(_) => "store stall",
            Fault::Partition { .. } => "partition",
            Fault::Delay { .. } => "link delay",
            Fault::DropLinks(_) => "links dropped",
            Fault::ResetLinks(_) => "links reset",
            Fault::CrashDaemon { .. } => "daemon crash",
            Fault::LoseJournal(_) => "journal loss",
            Fault::Reboot(_) => "node reboot",
            Fault::ClockOffset { .. } => "clock offset",
        }
    }
}

/// Faults at offsets from the start of the chaos window.
pub fn schedule(
    level: Level,
    seed: u64,
    nodes: usize,
    gateways: usize,
    window: Duration,
) -> Vec<(Duration, Fault)> {
    let mut rng = SplitMix64::new(seed ^ 0xc4a0_5c4e_d01e);
    let at = |rng: &mut SplitMix64| {
        Duration::from_millis(rng.next_u64() % (window.as_millis().max(1) as u64))
    };
    let node = |rng: &mut SplitMix64| (rng.next_u64() % nodes.max(1) as u64) as usize;
    let gw = |rng: &mut SplitMix64| (rng.next_u64() % gateways.max(1) as u64) as usize;
    let mut out = Vec::new();
    if level == Level::Kill {
        if gateways > 1 {
            out.push((
                window / 3,
                Fault::KillGateway {
                    gateway: gw(&mut rng),
                    restart_after: Duration::from_secs(3),
                },
            ));
        }
        out.push((window * 2 / 3, Fault::ResetLinks(usize::MAX)));
        return out;
    }
    let (kills, per_node_pct, links, stalls) = match level {
        Level::None | Level::Kill => return out,
        Level::Light => (1, 0.005, 5, false),
        Level::Heavy => (2, 0.02, 40, true),
    };
    for _ in 0..kills.min(gateways.saturating_sub(1)) {
        let t = at(&mut rng);
        out.push((
            t,
            Fault::KillGateway {
                gateway: gw(&mut rng),
                restart_after: Duration::from_secs(3),
            },
        ));
    }
    let per_node = ((nodes as f64 * per_node_pct).ceil() as usize).max(1);
    for _ in 0..per_node {
        let t = at(&mut rng);
        let n = node(&mut rng);
        out.push((
            t,
            Fault::CrashDaemon {
                node: n,
                restart_after: Duration::from_millis(200 + rng.next_u64() % 1800),
            },
        ));
        let t = at(&mut rng);
        out.push((t, Fault::LoseJournal(node(&mut rng))));
        let t = at(&mut rng);
        out.push((t, Fault::Reboot(node(&mut rng))));
    }
    let t = at(&mut rng);
    out.push((t, Fault::ResetLinks(links)));
    // A gateway's host clock steps 2 to 30 s ahead or behind (heavy: two).
    for _ in 0..(if stalls { 2 } else { 1 }) {
        let t = at(&mut rng);
        let by_ms = (2_000 + (rng.next_u64() % 28_000) as i64)
            * if rng.next_u64().is_multiple_of(2) {
                1
            } else {
                -1
            };
        out.push((
            t,
            Fault::ClockOffset {
                gateway: gw(&mut rng),
                by_ms,
            },
        ));
    }
    if stalls {
        let t = at(&mut rng);
        out.push((t, Fault::StoreStall(Duration::from_millis(1500))));
        let t = at(&mut rng);
        out.push((t, Fault::StoreStall(Duration::from_secs(5))));
        let t = at(&mut rng);
        out.push((
            t,
            Fault::Partition {
                gateway: gw(&mut rng),
                for_: Duration::from_secs(4),
            },
        ));
        let t = at(&mut rng);
        out.push((
            t,
            Fault::Delay {
                by: Duration::from_millis(50),
                for_: Duration::from_secs(3),
            },
        ));
        let t = at(&mut rng);
        out.push((t, Fault::DropLinks(links)));
    }
    out.sort_by_key(|(t, _)| *t);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let w = Duration::from_secs(30);
        let a = schedule(Level::Heavy, 7, 300, 3, w);
        assert_eq!(a, schedule(Level::Heavy, 7, 300, 3, w));
        assert_ne!(a, schedule(Level::Heavy, 8, 300, 3, w));
        assert!(a.windows(2).all(|p| p[0].0 <= p[1].0));
        assert!(a.iter().all(|(t, _)| *t < w));
        assert!(schedule(Level::None, 7, 300, 3, w).is_empty());
    }

    #[test]
    fn chaos_steps_gateway_clocks_by_seconds() {
        let w = Duration::from_secs(30);
        for (level, n) in [(Level::Light, 1), (Level::Heavy, 2), (Level::Kill, 0)] {
            let offsets: Vec<i64> = schedule(level, 9, 100, 3, w)
                .into_iter()
                .filter_map(|(_, f)| match f {
                    Fault::ClockOffset { by_ms, .. } => Some(by_ms),
                    _ => None,
                })
                .collect();
            assert_eq!(offsets.len(), n, "{level:?}");
            assert!(offsets.iter().all(|o| (2_000..30_000).contains(&o.abs())));
        }
    }

    #[test]
    fn a_lone_gateway_is_never_killed() {
        let s = schedule(Level::Heavy, 1, 10, 1, Duration::from_secs(10));
        assert!(
            !s.iter()
                .any(|(_, f)| matches!(f, Fault::KillGateway { .. }))
        );
    }
}
