//! The store's clock: `compute_now()` in every query and trigger reads it.
//!
//! Production stores read the host's clock ([`SystemClock`]) with SQLite
//! and the database's own clock with PostgreSQL; tests hand in a
//! [`ManualClock`] and move time themselves, so nothing in a store test
//! sleeps to let time pass.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Unix milliseconds, as the store records every time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> i64;

    /// Whether this is the host's own wall clock. A database with a clock
    /// of its own (PostgreSQL) keeps to that instead: only an injected
    /// clock (tests) overrides it.
    fn is_host_clock(&self) -> bool {
        false
    }
}

/// The host's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    // The store's one read of the host's clock (see clippy.toml).
    #[allow(clippy::disallowed_methods)]
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64)
    }

    fn is_host_clock(&self) -> bool {
        true
    }
}

/// A clock that moves only when told to. Clones share the time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(start_ms)))
    }

    pub fn set(&self, ms: i64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(ms(by), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A duration in the store's unit, saturating.
pub fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let c = ManualClock::new(1_000);
        let other = c.clone();
        assert_eq!(c.now_ms(), 1_000);
        c.advance(Duration::from_millis(250));
        assert_eq!(other.now_ms(), 1_250);
        other.set(5);
        assert_eq!(c.now_ms(), 5);
    }

    #[test]
    fn the_system_clock_is_unix_milliseconds() {
        // After 2020-01-01 and before 2200.
        let now = SystemClock.now_ms();
        assert!(now > 1_577_836_800_000 && now < 7_258_118_400_000, "{now}");
    }
}
