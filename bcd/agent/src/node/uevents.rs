//! Kernel uevents: a GPU that appears or goes away, or whose driver is
//! bound or unbound, or the TPM's devices, trigger a new inventory at once
//! rather than at the next pass. Bursts become one re-inventory
//! (`bcd_udev::Debounce`: within half a second of the first event).

use bcd_udev::{Debounce, Monitor, MonitorError, Notice};
use tracing::{debug, warn};

/// What to do after a notice.
pub(super) fn on_notice(
    notice: Result<Notice, MonitorError>,
    debounce: &mut Debounce,
    monitor: &mut Option<Monitor>,
) {
    let now = bcd_sys::clock::mono();
    match notice {
        Ok(Notice::Event { message, sender }) => {
            if let Some(interest) = bcd_udev::interest(message.uevent()) {
                debug!(?interest, ?sender, "uevent");
                debounce.event(now);
            }
        }
        // The kernel dropped events: whatever they said, look again.
        Ok(Notice::Overflow) => debounce.event(now),
        Ok(Notice::Malformed { error, sender }) => {
            debug!(%error, ?sender, "a malformed uevent");
        }
        Err(e) => {
            warn!(error = %bcd_sys::error::chain(&e), "uevents stop; the inventory pass still runs");
            *monitor = None;
        }
    }
}

/// Sleeps until the debounce is due; forever when nothing is pending.
pub(super) async fn due(debounce: &Debounce) {
    match debounce.deadline() {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
