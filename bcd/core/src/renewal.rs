//! Certificate renewal: when to renew, and when to try again.
//!
//! A node certificate is renewed at 60% of its life, measured on server
//! time (the node's own clock decides nothing). A failed attempt (the
//! server unreachable, a refusal, a TPM that does not answer) is retried
//! with back-off from 30 s to 10 min and full jitter above the floor:
//! attempt `n` (from 0) waits uniformly in `30 s ..= min(10 min, 30 s ·
//! 2^(n+1))`, so nodes that failed together (a server outage) spread their
//! retries instead of returning in step, and none retries sooner than 30 s.
//! A successful renewal resets the back-off.
//!
//! A failure that no retry can mend ([`Failure::Final`]: the TPM derives
//! another attestation key than the one the certificate names) stops the
//! schedule instead: no more attempts in this process, which keeps serving
//! with the current certificate until it runs out (an operator joins the
//! machine again; `bcd doctor` says so). Time is a parameter throughout:
//! nothing here sleeps or reads a clock.

use std::time::Duration;

use crate::rng::SplitMix64;

/// The share of a certificate's life after which it is renewed, percent.
pub const RENEW_AT_PERCENT: i64 = 60;

/// The longest life the fleet CA gives a node certificate; used to date a
/// certificate whose issue time was never recorded.
pub const MAX_CERT_LIFE_MS: i64 = 24 * 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewalConfig {
    /// The shortest wait before a retry.
    pub retry_min: Duration,
    /// The longest.
    pub retry_max: Duration,
}

impl Default for RenewalConfig {
    fn default() -> Self {
        RenewalConfig {
            retry_min: Duration::from_secs(30),
            retry_max: Duration::from_secs(600),
        }
    }
}

/// A certificate's validity, unix milliseconds on the server's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertLife {
    pub issued_ms: i64,
    pub not_after_ms: i64,
}

impl CertLife {
    /// When to renew: at [`RENEW_AT_PERCENT`] of the life.
    pub fn renew_at_ms(&self) -> i64 {
        self.issued_ms + (self.not_after_ms - self.issued_ms) * RENEW_AT_PERCENT / 100
    }
}

/// Whether a failed attempt is worth another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The server or the TPM unreachable, a refusal, anything that may go
    /// differently later: retried with back-off.
    Transient,
    /// Retrying cannot help (another AK in the TPM): no more attempts.
    Final,
}

/// What follows a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Try again after the back-off.
    Retry(Retry),
    /// No more attempts: the schedule stopped after this many failures in
    /// a row (this one included).
    Stopped { attempt: u32 },
}

/// A failed attempt and when the next one is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts failed in a row, this one included.
    pub attempt: u32,
    pub retry_in: Duration,
}

/// The renewal schedule of one process. `now` arguments are its monotonic
/// clock; server times are unix milliseconds on the store's clock.
#[derive(Debug, Clone)]
pub struct Renewal {
    config: RenewalConfig,
    failures: u32,
    /// No attempt before this monotonic time (a retry's back-off).
    not_before: Duration,
    /// A [`Failure::Final`] stopped the schedule.
    stopped: bool,
}

impl Renewal {
    pub fn new(config: RenewalConfig) -> Renewal {
        Renewal {
            config,
            failures: 0,
            not_before: Duration::ZERO,
            stopped: false,
        }
    }

    /// How long from `now` until the next attempt: until the certificate
    /// reaches its renewal point on server time, and not before a retry's
    /// back-off has run out. Zero when an attempt is due; `None` once the
    /// schedule stopped (no attempt is ever due again).
    pub fn wait(&self, now: Duration, server_now_ms: i64, life: CertLife) -> Option<Duration> {
        if self.stopped {
            return None;
        }
        let until_due = Duration::from_millis((life.renew_at_ms() - server_now_ms).max(0) as u64);
        Some(until_due.max(self.not_before.saturating_sub(now)))
    }

    /// An attempt failed at `now`, as `failure` says: the retry after the
    /// back-off, or the end of the schedule.
    pub fn failed(
        &mut self,
        now: Duration,
        failure: Failure,
        rng: &mut SplitMix64,
    ) -> AfterFailure {
        match failure {
            Failure::Transient => AfterFailure::Retry(self.retry(now, rng)),
            Failure::Final => {
                self.failures = self.failures.saturating_add(1);
                self.stopped = true;
                AfterFailure::Stopped {
                    attempt: self.failures,
                }
            }
        }
    }

    /// A failure worth another attempt, at `now`: when to try again.
    fn retry(&mut self, now: Duration, rng: &mut SplitMix64) -> Retry {
        let min = self.config.retry_min.as_millis() as u64;
        let max = (self.config.retry_max.as_millis() as u64).max(min);
        let shift = (self.failures + 1).min(63);
        let window = min
            .checked_shl(shift)
            .filter(|w| w >> shift == min)
            .map_or(max, |w| w.min(max));
        let retry_in = Duration::from_millis(min + rng.below_inclusive(window - min));
        self.failures = self.failures.saturating_add(1);
        self.not_before = now + retry_in;
        Retry {
            attempt: self.failures,
            retry_in,
        }
    }

    /// The certificate was renewed: the next failure starts from the
    /// shortest wait again.
    pub fn renewed(&mut self) {
        self.failures = 0;
        self.not_before = Duration::ZERO;
        self.stopped = false;
    }

    /// Whether a [`Failure::Final`] stopped the schedule.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Attempts failed in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Duration = Duration::from_secs(1);

    fn retry_of(after: AfterFailure) -> Retry {
        match after {
            AfterFailure::Retry(r) => r,
            AfterFailure::Stopped { attempt } => panic!("stopped after {attempt} attempts"),
        }
    }

    fn life() -> CertLife {
        CertLife {
            issued_ms: 1_000_000,
            not_after_ms: 1_000_000 + 10_000_000,
        }
    }

    #[test]
    fn renews_at_sixty_percent_of_the_life_on_server_time() {
        let r = Renewal::new(RenewalConfig::default());
        assert_eq!(life().renew_at_ms(), 7_000_000);
        // The node's own clock (`now`) does not matter, server time does.
        assert_eq!(
            r.wait(Duration::from_secs(99), 6_000_000, life()),
            Some(Duration::from_secs(1_000))
        );
        assert_eq!(
            r.wait(Duration::ZERO, 7_000_000, life()),
            Some(Duration::ZERO)
        );
        assert_eq!(
            r.wait(Duration::ZERO, 9_000_000, life()),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn failures_back_off_from_thirty_seconds_to_ten_minutes_then_reset() {
        let mut r = Renewal::new(RenewalConfig::default());
        let mut rng = SplitMix64::new(3);
        let due = 7_000_000;
        let mut now = Duration::from_secs(100);
        for attempt in 1..=12u32 {
            let retry = retry_of(r.failed(now, Failure::Transient, &mut rng));
            assert_eq!(retry.attempt, attempt);
            let upper = (30 * S * 2u32.pow(attempt.min(6))).min(600 * S);
            assert!(
                retry.retry_in >= 30 * S && retry.retry_in <= upper,
                "attempt {attempt}: {:?} outside 30 s..={upper:?}",
                retry.retry_in
            );
            // Due on server time, but held back by the back-off.
            assert_eq!(r.wait(now, due, life()), Some(retry.retry_in));
            now += retry.retry_in;
            assert_eq!(r.wait(now, due, life()), Some(Duration::ZERO));
        }
        r.renewed();
        assert_eq!(r.failures(), 0);
        assert_eq!(r.wait(now, due, life()), Some(Duration::ZERO));
        let retry = retry_of(r.failed(now, Failure::Transient, &mut rng));
        assert!(retry.retry_in <= 60 * S, "back to the first window");
    }

    #[test]
    fn nodes_failing_together_spread_their_retries() {
        // A server outage fails a thousand nodes at the same instant: their
        // retries cover the window instead of landing in step.
        let mut buckets = [0u32; 10];
        for seed in 0..1_000u64 {
            let mut r = Renewal::new(RenewalConfig::default());
            let mut rng = SplitMix64::new(seed);
            for _ in 0..5 {
                r.failed(Duration::ZERO, Failure::Transient, &mut rng);
            }
            let retry = retry_of(r.failed(Duration::ZERO, Failure::Transient, &mut rng)).retry_in;
            let slot = ((retry.as_millis() as u64 - 30_000) * 10 / 570_001) as usize;
            buckets[slot] += 1;
        }
        for (i, n) in buckets.iter().enumerate() {
            assert!((60..140).contains(n), "bucket {i} has {n} of 1000");
        }
    }

    #[test]
    fn a_final_failure_stops_the_schedule_for_good() {
        let mut r = Renewal::new(RenewalConfig::default());
        let mut rng = SplitMix64::new(5);
        let due = 7_000_000;
        let now = Duration::from_secs(100);
        assert_eq!(
            r.failed(now, Failure::Final, &mut rng),
            AfterFailure::Stopped { attempt: 1 }
        );
        assert!(r.stopped());
        // No attempt is due again, whatever the time on either clock: not
        // after a back-off's longest wait, not past the certificate's end.
        for (later, server_ms) in [
            (now, due),
            (now + Duration::from_secs(600), due + 600_000),
            (now + Duration::from_secs(86_400), life().not_after_ms + 1),
        ] {
            assert_eq!(r.wait(later, server_ms, life()), None);
        }
    }

    #[test]
    fn a_final_failure_after_transient_ones_stops_too() {
        let mut r = Renewal::new(RenewalConfig::default());
        let mut rng = SplitMix64::new(6);
        let mut now = Duration::from_secs(100);
        for _ in 0..3 {
            let retry = retry_of(r.failed(now, Failure::Transient, &mut rng));
            now += retry.retry_in;
            assert_eq!(r.wait(now, 7_000_000, life()), Some(Duration::ZERO));
        }
        // Another AK on the fourth attempt: no retry follows.
        assert_eq!(
            r.failed(now, Failure::Final, &mut rng),
            AfterFailure::Stopped { attempt: 4 }
        );
        assert_eq!(
            r.wait(now + Duration::from_secs(600), 7_000_000, life()),
            None
        );
    }

    #[test]
    fn transient_failures_never_stop_the_schedule() {
        let mut r = Renewal::new(RenewalConfig::default());
        let mut rng = SplitMix64::new(8);
        let mut now = Duration::ZERO;
        for _ in 0..1_000 {
            let retry = retry_of(r.failed(now, Failure::Transient, &mut rng));
            assert!(retry.retry_in <= Duration::from_secs(600));
            now += retry.retry_in;
        }
        assert!(!r.stopped());
        assert_eq!(r.wait(now, 7_000_000, life()), Some(Duration::ZERO));
    }

    proptest! {
        #[test]
        fn retries_stay_within_the_configured_bounds(
            seed: u64,
            min_s in 1u64..120,
            max_s in 1u64..3_600,
            failures in 1usize..100,
        ) {
            let config = RenewalConfig {
                retry_min: Duration::from_secs(min_s),
                retry_max: Duration::from_secs(max_s.max(min_s)),
            };
            let mut r = Renewal::new(config);
            let mut rng = SplitMix64::new(seed);
            for _ in 0..failures {
                let retry = retry_of(r.failed(Duration::ZERO, Failure::Transient, &mut rng));
                prop_assert!(retry.retry_in >= config.retry_min);
                prop_assert!(retry.retry_in <= config.retry_max);
            }
        }
    }
}
