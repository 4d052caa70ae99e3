//! Crash injection for tests: `BCD_CRASH_AT=after-accept,mid-effect` makes
//! the daemon abort at those step boundaries of command handling, each time
//! with probability `BCD_CRASH_PROBABILITY` (default 1), drawn from
//! `BCD_CRASH_SEED` (default: random). Without `BCD_CRASH_AT` nothing
//! happens. The abort is real (`std::process::abort`): no destructors, no
//! flushing, as a kill -9 would leave things.

use bcd_core::SplitMix64;

/// The named boundaries, in the order a command passes them.
pub const POINTS: &[&str] = &[
    "after-accept",
    "after-running",
    "mid-effect",
    "after-result",
    "before-ack",
    // Self-update: the link names the new slot, the restart has not
    // happened.
    "after-switch",
];

#[derive(Debug)]
pub struct Crash {
    points: Vec<String>,
    probability: f64,
    rng: SplitMix64,
}

impl Crash {
    pub fn from_env() -> Crash {
        let points = std::env::var("BCD_CRASH_AT")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let probability = std::env::var("BCD_CRASH_PROBABILITY")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.0);
        let seed = std::env::var("BCD_CRASH_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(rand::random);
        Crash {
            points,
            probability,
            rng: SplitMix64::new(seed),
        }
    }

    pub fn none() -> Crash {
        Crash {
            points: Vec::new(),
            probability: 0.0,
            rng: SplitMix64::new(0),
        }
    }

    /// Aborts here if this point is armed and the draw says so.
    pub fn at(&mut self, point: &str) {
        debug_assert!(POINTS.contains(&point), "unknown crash point {point}");
        if self.points.iter().any(|p| p == point) {
            let draw = self.rng.next_u64() as f64 / u64::MAX as f64;
            if draw < self.probability {
                eprintln!("crash injection: aborting at {point}");
                std::process::abort();
            }
        }
    }
}
