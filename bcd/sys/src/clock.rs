//! The host's clocks, for the shells: the node side's one clock module.
//! Decisions take time as a parameter; these are where the shells read it.
//! Clippy's `disallowed-methods` refuses `Instant::now` and
//! `SystemTime::now` anywhere else in library and binary code (tests and
//! benchmarks are exempt). Tokio's `Instant::now` stays allowed: it is the
//! runtime's clock, which tests pause and advance.

/// The wall clock: for records and reports, never for protocol decisions
/// (those run on the server's time).
#[allow(clippy::disallowed_methods)]
pub fn system_now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

/// The wall clock in Unix milliseconds.
pub fn unix_ms() -> i64 {
    system_now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The monotonic clock of this process, for timeouts and elapsed times.
#[allow(clippy::disallowed_methods)]
pub fn mono() -> std::time::Instant {
    std::time::Instant::now()
}

/// Milliseconds on this boot's monotonic clock (`CLOCK_BOOTTIME`): the same
/// for every process of one boot, so a deadline written by one process
/// holds for the next; it counts suspended time too.
pub fn boot_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_monotonic_and_wall_clock_is_after_2020() {
        let a = boot_ms();
        let b = boot_ms();
        assert!(b >= a);
        assert!(unix_ms() > 1_577_836_800_000);
    }
}
