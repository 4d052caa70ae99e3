//! The control plane's one clock: every read of the host's clocks in this
//! crate goes through here (clippy's `disallowed-methods` refuses
//! `Instant::now`, `SystemTime::now` and `OffsetDateTime::now_utc`
//! anywhere else; tests and benchmarks are exempt).
//!
//! Decisions do not read it: liveness, leases and fencing run on the
//! store's clock (`compute_now()`, I4), and sans-IO code takes time as a
//! parameter. The wall clock here stamps what a person reads (logs,
//! backups, a CLI's "in 3 s"), measures elapsed time for metrics, and is
//! what the skew probe compares with the store's.
//!
//! A host whose time sync steps its clock is simulated by an offset: `serve
//! --clock-offset-file F` reads the milliseconds in F each second
//! ([`follow_offset_file`]) and every wall-clock read of the process moves
//! by them, so a component that trusted the host clock for a decision would
//! show it in the simulator's invariants. Monotonic time does not move with
//! a stepped wall clock, on a real host or here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds this process's wall clock is stepped by (0 on a real host).
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// The host's wall clock, stepped by the simulated offset.
#[allow(clippy::disallowed_methods)]
pub fn system_now() -> SystemTime {
    stepped(SystemTime::now(), OFFSET_MS.load(Ordering::Relaxed))
}

/// `now` stepped by `offset_ms` (ahead when positive), saturating.
fn stepped(now: SystemTime, offset_ms: i64) -> SystemTime {
    let by = Duration::from_millis(offset_ms.unsigned_abs());
    if offset_ms >= 0 {
        now.checked_add(by).unwrap_or(now)
    } else {
        now.checked_sub(by).unwrap_or(now)
    }
}

/// The wall clock in Unix milliseconds (0 before 1970).
pub fn unix_ms() -> i64 {
    system_now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64)
}

/// The monotonic clock, for timeouts and elapsed times.
#[allow(clippy::disallowed_methods)]
pub fn mono() -> Instant {
    Instant::now()
}

/// The offset now in force, in milliseconds.
pub fn offset_ms() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}

/// Steps this process's wall clock by `ms` (the simulator's clock fault).
pub fn set_offset_ms(ms: i64) {
    OFFSET_MS.store(ms, Ordering::Relaxed);
}

/// Reads the offset from `file` now and then each second, for the life of
/// the process: a missing or unreadable file is no offset.
pub fn follow_offset_file(file: PathBuf) {
    let read = move || {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(0)
    };
    set_offset_ms(read());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            set_offset_ms(read());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_steps_the_wall_clock_either_way() {
        let t = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(stepped(t, 0), t);
        assert_eq!(stepped(t, 2_500), t + Duration::from_millis(2_500));
        assert_eq!(stepped(t, -30_000), t - Duration::from_secs(30));
        let _ = stepped(UNIX_EPOCH, i64::MIN);
        assert!(unix_ms() > 1_577_836_800_000);
    }
}
