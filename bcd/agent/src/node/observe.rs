//! What the node's metrics show ([`crate::metrics::NodeMetrics`]), set
//! from the loop: each a small function, called where the thing happens.

use std::time::{Duration, Instant};

use bcd_core::Session;

use super::Shared;
use crate::effects::Effect;

/// How often the journal backlog, certificate life and clock offset are
/// read again (when metrics are on).
pub(super) const OBSERVE_EVERY: Duration = Duration::from_secs(1);

pub(super) fn established(shared: &Shared, epoch: u64) {
    if let Some(m) = &shared.metrics {
        m.established(epoch);
    }
}

pub(super) fn disconnected(shared: &Shared, dial_failed: bool) {
    if let Some(m) = &shared.metrics {
        m.connected.set(0);
        if dial_failed {
            m.dial_failures.inc();
        }
    }
}

pub(super) fn section(shared: &Shared, section: &str, status: &str) {
    if let Some(m) = &shared.metrics {
        m.section(section, status);
    }
}

/// A command's side effect finished.
pub(super) fn command(shared: &Shared, id: &str, effect: &Effect) {
    if let Some(m) = &shared.metrics {
        let kind = shared
            .journal
            .command(id)
            .ok()
            .flatten()
            .map(|e| e.kind)
            .unwrap_or_default();
        m.command(&kind, &effect.outcome.name().to_ascii_lowercase());
    }
}

pub(super) fn tunnel(shared: &Shared, ended: &super::tunnel::Ended) {
    if let Some(m) = &shared.metrics {
        m.tunnel_ended(ended.bytes_in, ended.bytes_out);
    }
}

pub(super) fn inventory(shared: &Shared, cause: &str) {
    if let Some(m) = &shared.metrics {
        m.inventory(cause);
    }
}

/// The gauges read from state: at most every [`OBSERVE_EVERY`].
pub(super) fn gauges(shared: &Shared, session: &Session, last: &mut Option<Instant>) {
    let Some(m) = shared.metrics.clone() else {
        return;
    };
    if last.is_some_and(|l| l.elapsed() < OBSERVE_EVERY) {
        return;
    }
    *last = Some(bcd_sys::clock::mono());
    if let Ok((events, results)) = shared.journal.backlog() {
        m.unacked_events.set(events as i64);
        m.unacked_results.set(results as i64);
    }
    let local = bcd_sys::clock::unix_ms();
    let server = session.clock().server_now(shared.now());
    if let Some(server) = server {
        m.clock_offset_seconds.set((server - local) as f64 / 1000.0);
    }
    let now = server.unwrap_or(local);
    m.cert_seconds_left
        .set((shared.identity.file.cert_not_after_ms - now) as f64 / 1000.0);
}
