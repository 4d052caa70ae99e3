//! Crash-loop detection for `bcd supervise`: the daemon's abnormal exits
//! within a sliding window. Three within the window is a crash loop; the
//! count a daemon starts with (its supervisor passes it) goes to the server
//! in its Hello, which shows the node's `DaemonCrashLoop` condition while
//! the count is at the threshold and clears it at the first Hello below.
//! Sans-IO: time is the boot clock, in milliseconds, passed in.

use std::collections::VecDeque;

/// Abnormal exits within the window that make a crash loop.
pub const CRASH_LOOP_EXITS: u32 = 3;
/// The window a crash loop's exits fall in, by default.
pub const CRASH_LOOP_WINDOW_MS: u64 = 10 * 60 * 1000;

/// Whether a daemon that started after `recent_exits` abnormal exits (in
/// the window) is in a crash loop.
pub fn is_crash_loop(recent_exits: u32) -> bool {
    recent_exits >= CRASH_LOOP_EXITS
}

/// The abnormal exits a supervisor saw, within its window.
#[derive(Debug, Clone)]
pub struct CrashLoop {
    window_ms: u64,
    exits: VecDeque<u64>,
}

impl CrashLoop {
    pub fn new(window_ms: u64) -> CrashLoop {
        CrashLoop {
            window_ms,
            exits: VecDeque::new(),
        }
    }

    /// The daemon exited at `now_ms`: `clean` for an exit it chose (a stop,
    /// a restart into another slot), which never counts.
    pub fn on_exit(&mut self, now_ms: u64, clean: bool) {
        if !clean {
            self.exits.push_back(now_ms);
        }
        self.prune(now_ms);
    }

    /// Abnormal exits within the window ending at `now_ms`.
    pub fn recent(&mut self, now_ms: u64) -> u32 {
        self.prune(now_ms);
        self.exits.len().min(u32::MAX as usize) as u32
    }

    fn prune(&mut self, now_ms: u64) {
        while self
            .exits
            .front()
            .is_some_and(|t| now_ms.saturating_sub(*t) > self.window_ms)
        {
            self.exits.pop_front();
        }
        // Bounded whatever the window: only the count matters past the
        // threshold, and a few more keep it from flapping.
        while self.exits.len() > 64 {
            self.exits.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_abnormal_exits_in_the_window_are_a_loop_and_it_ends_as_they_age() {
        let mut c = CrashLoop::new(10_000);
        c.on_exit(1_000, false);
        c.on_exit(2_000, true);
        c.on_exit(3_000, false);
        assert_eq!(c.recent(3_000), 2);
        assert!(!is_crash_loop(c.recent(3_000)));
        c.on_exit(4_000, false);
        assert!(is_crash_loop(c.recent(4_000)));
        // The first exit leaves the window at 11,001.
        assert!(is_crash_loop(c.recent(11_000)));
        assert_eq!(c.recent(11_001), 2);
        assert!(!is_crash_loop(c.recent(11_001)));
        assert_eq!(c.recent(14_001), 0);
    }

    #[test]
    fn clean_exits_never_count_and_the_record_stays_bounded() {
        let mut c = CrashLoop::new(u64::MAX);
        for t in 0..100 {
            c.on_exit(t, true);
        }
        assert_eq!(c.recent(100), 0);
        for t in 0..1_000 {
            c.on_exit(t, false);
        }
        assert_eq!(c.recent(1_000), 64);
    }

    #[test]
    fn a_clock_that_goes_back_drops_nothing_early() {
        let mut c = CrashLoop::new(10_000);
        c.on_exit(50_000, false);
        assert_eq!(c.recent(1_000), 1);
    }
}
