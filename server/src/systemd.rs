//! Telling systemd how `serve` is doing (`Type=notify`): `READY=1` once
//! the store is reconciled and every listener is up, `WATCHDOG=1` at half
//! the unit's `WatchdogSec=` while the runtime answers, `STOPPING=1` when
//! it begins to drain. Outside systemd (no `NOTIFY_SOCKET`) each is a no-op.
//!
//! The watchdog pings from a task on the runtime: a runtime that stopped
//! scheduling stops the pings and systemd restarts the process. A store
//! that does not answer does not stop them (a restart would not bring it
//! back; the gateway fences itself and `/readyz` says so).

use std::time::Duration;

use sd_notify::NotifyState;
use tracing::warn;

fn notify(state: NotifyState<'_>) {
    if let Err(e) = sd_notify::notify(false, &[state]) {
        warn!(error = %e, "cannot notify systemd");
    }
}

/// Startup is finished: the unit is active.
pub fn ready() {
    notify(NotifyState::Ready);
}

/// The process began to stop.
pub fn stopping() {
    notify(NotifyState::Stopping);
}

/// The watchdog's interval when the unit asks for one (`WATCHDOG_USEC`
/// for this process): pings go at half of it.
pub fn watchdog_every() -> Option<Duration> {
    let mut usec = 0u64;
    (sd_notify::watchdog_enabled(false, &mut usec) && usec > 0)
        .then(|| Duration::from_micros(usec) / 2)
}

/// Pings the watchdog for the life of the runtime, if the unit asks.
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let every = watchdog_every()?;
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            notify(NotifyState::Watchdog);
        }
    }))
}
