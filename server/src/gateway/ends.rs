//! Sessions that ended, written to the store together.
//!
//! A session that ends queues its disconnect here and is gone; one task
//! writes whatever has queued in one transaction (at most [`BATCH`]), so a
//! reconnect storm that ends thousands of sessions at once costs the store
//! a few transactions rather than one each, competing with the Hellos that
//! follow. The write is epoch-fenced like any session write: a node that
//! has meanwhile said Hello again (here or elsewhere) is not touched, and
//! ages are taken when the batch is written, so the store's clock still
//! decides when the node was last seen and when its session ended.

use bc_store::NodeId;
use std::sync::Mutex;
use std::time::Duration;

use bc_store::sessions::Ended;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::GatewayState;

/// The most ended sessions one transaction writes.
pub const BATCH: usize = 256;

/// One ended session, waiting.
#[derive(Debug)]
struct Queued {
    node_id: String,
    epoch: u64,
    last_heard: Instant,
    ended: Instant,
    cause: &'static str,
}

/// The queue of a gateway's ended sessions.
#[derive(Debug, Default)]
pub struct Ends {
    queue: Mutex<Vec<Queued>>,
    ready: Notify,
}

impl Ends {
    /// Queues the end of `node`'s session under `epoch`; the node was last
    /// heard `seen_age` ago.
    pub fn push(&self, node_id: &str, epoch: u64, seen_age: Duration, cause: &'static str) {
        let now = Instant::now();
        self.lock().push(Queued {
            node_id: node_id.to_string(),
            epoch,
            last_heard: now.checked_sub(seen_age).unwrap_or(now),
            ended: now,
            cause,
        });
        self.ready.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to [`BATCH`] queued ends, oldest first, with their ages now.
    fn take(&self) -> Vec<Ended> {
        let now = Instant::now();
        let mut queue = self.lock();
        let n = queue.len().min(BATCH);
        queue
            .drain(..n)
            .map(|q| Ended {
                node_id: NodeId::from(q.node_id),
                epoch: q.epoch,
                seen_age: now.duration_since(q.last_heard),
                ended_age: now.duration_since(q.ended),
                cause: q.cause.to_string(),
            })
            .collect()
    }
}

/// Writes everything queued so far (a shutdown calls it before it releases
/// the lease). A batch the store refuses is logged and dropped: the
/// liveness controller finds those nodes silent as it would after a crash.
pub async fn write(state: &GatewayState) {
    loop {
        let batch = state.ends.take();
        if batch.is_empty() {
            return;
        }
        match state
            .metrics
            .timed("disconnect", state.store.disconnect(&batch))
            .await
        {
            Ok(applied) => {
                state.metrics.transition("disconnected", applied.len());
                for e in &batch {
                    if applied
                        .iter()
                        .any(|k| k.node_id == e.node_id && k.epoch == e.epoch)
                    {
                        info!(node = %e.node_id, epoch = e.epoch, cause = %e.cause, "session ended");
                    } else {
                        debug!(node = %e.node_id, epoch = e.epoch, cause = %e.cause,
                            "session ended; a newer session owns the node");
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, sessions = batch.len(), "cannot record the disconnects")
            }
        }
    }
}

/// The writer: wakes when a session ends and writes what queued meanwhile.
pub async fn run(state: std::sync::Arc<GatewayState>) {
    loop {
        state.ends.ready.notified().await;
        write(&state).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_the_oldest_ends_with_their_ages_at_the_write() {
        let ends = Ends::default();
        for i in 0..(BATCH + 5) {
            ends.push(
                &format!("n{i}"),
                i as u64,
                Duration::from_secs(2),
                "stream-ended",
            );
        }
        let first = ends.take();
        assert_eq!(first.len(), BATCH);
        assert_eq!(first[0].node_id, "n0");
        assert!(first.iter().all(|e| e.seen_age >= Duration::from_secs(2)));
        assert!(first.iter().all(|e| e.ended_age <= e.seen_age));
        assert_eq!(first[0].cause, "stream-ended");
        let rest = ends.take();
        assert_eq!(rest.len(), 5);
        assert_eq!(rest[0].node_id, format!("n{BATCH}"));
        assert!(ends.take().is_empty());
    }
}
