//! Full-jitter exponential back-off for redialing the gateway.
//!
//! Attempt `n` (from 0) waits a uniformly random time in
//! `0..=min(cap, base * 2^n)`. With the defaults that is 0–1 s, then 0–2 s,
//! doubling up to 0–60 s. Full jitter spreads a reconnect storm evenly over
//! the window instead of letting every node retry at the same instant.

use std::time::Duration;

use crate::rng::SplitMix64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    /// The first window, when the server sized it (see [`Backoff::set_base`]).
    base: Option<Duration>,
    attempt: u32,
}

impl Backoff {
    pub fn new(config: BackoffConfig) -> Self {
        Backoff {
            config,
            base: None,
            attempt: 0,
        }
    }

    /// Sets the first window (later ones double from it, up to the cap):
    /// the server's, which knows how many nodes its gateways can take at
    /// once; `None` or zero: the configured base.
    pub fn set_base(&mut self, base: Option<Duration>) {
        self.base = base
            .filter(|b| !b.is_zero())
            .map(|b| b.clamp(Duration::from_millis(1), self.config.cap));
    }

    /// The upper bound of the window for the next attempt.
    pub fn window(&self) -> Duration {
        let base = self.base.unwrap_or(self.config.base).as_millis() as u64;
        let cap = self.config.cap.as_millis() as u64;
        let shift = self.attempt.min(63);
        let grown = base.checked_shl(shift).filter(|v| v >> shift == base);
        Duration::from_millis(grown.map_or(cap, |g| g.min(cap)))
    }

    /// The delay before the next attempt; advances the attempt counter.
    pub fn next_delay(&mut self, rng: &mut SplitMix64) -> Duration {
        let window = self.window().as_millis() as u64;
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(rng.below_inclusive(window))
    }

    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// A session was established: the next failure starts from the base
    /// window again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn windows_double_from_one_second_to_sixty() {
        let mut b = Backoff::new(BackoffConfig::default());
        let mut rng = SplitMix64::new(1);
        let mut windows = Vec::new();
        for _ in 0..10 {
            windows.push(b.window().as_secs());
            b.next_delay(&mut rng);
        }
        assert_eq!(windows, [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]);
        b.reset();
        assert_eq!(b.window(), Duration::from_secs(1));
    }

    #[test]
    fn jitter_covers_the_window() {
        // Full jitter: across many draws the delays reach both ends of the
        // window and its middle, rather than clustering at the bound.
        let mut rng = SplitMix64::new(42);
        let cfg = BackoffConfig::default();
        let mut buckets = [0u32; 10];
        for _ in 0..10_000 {
            let mut b = Backoff::new(cfg);
            let d = b.next_delay(&mut rng).as_millis() as usize;
            buckets[(d * 10 / 1001).min(9)] += 1;
        }
        for (i, n) in buckets.iter().enumerate() {
            assert!((800..1200).contains(n), "bucket {i} has {n} of 10000");
        }
    }

    proptest! {
        #[test]
        fn delay_never_exceeds_window_or_cap(
            seed: u64,
            base_ms in 1u64..5_000,
            cap_ms in 1u64..600_000,
            attempts in 1usize..200,
        ) {
            let cfg = BackoffConfig {
                base: Duration::from_millis(base_ms),
                cap: Duration::from_millis(cap_ms.max(base_ms)),
            };
            let mut b = Backoff::new(cfg);
            let mut rng = SplitMix64::new(seed);
            let mut last_window = Duration::ZERO;
            for _ in 0..attempts {
                let window = b.window();
                prop_assert!(window >= last_window, "windows never shrink");
                prop_assert!(window <= cfg.cap);
                let d = b.next_delay(&mut rng);
                prop_assert!(d <= window);
                last_window = window;
            }
        }

        #[test]
        fn window_is_base_times_two_to_the_attempt_until_capped(
            base_ms in 1u64..2_000,
            cap_ms in 2_000u64..120_000,
            n in 0u32..80,
        ) {
            let cfg = BackoffConfig {
                base: Duration::from_millis(base_ms),
                cap: Duration::from_millis(cap_ms),
            };
            let mut b = Backoff::new(cfg);
            let mut rng = SplitMix64::new(0);
            for _ in 0..n {
                b.next_delay(&mut rng);
            }
            let expected = (u128::from(base_ms) << n).min(u128::from(cap_ms)) as u64;
            prop_assert_eq!(b.window(), Duration::from_millis(expected));
        }

        #[test]
        fn same_seed_same_schedule(seed: u64) {
            let run = |seed| {
                let mut b = Backoff::new(BackoffConfig::default());
                let mut rng = SplitMix64::new(seed);
                (0..20).map(|_| b.next_delay(&mut rng)).collect::<Vec<_>>()
            };
            prop_assert_eq!(run(seed), run(seed));
        }
    }

    #[test]
    fn a_server_sized_first_window_doubles_from_there() {
        let mut b = Backoff::new(BackoffConfig::default());
        b.set_base(Some(Duration::from_millis(150)));
        assert_eq!(b.window(), Duration::from_millis(150));
        let mut rng = SplitMix64::new(1);
        assert!(b.next_delay(&mut rng) <= Duration::from_millis(150));
        assert_eq!(b.window(), Duration::from_millis(300));
        b.set_base(Some(Duration::from_secs(3600)));
        assert_eq!(b.window(), Duration::from_secs(60), "never past the cap");
        b.set_base(None);
        b.reset();
        assert_eq!(
            b.window(),
            Duration::from_secs(1),
            "the configured base again"
        );
    }
}
