//! Admission: how many connections and Hellos a gateway takes on at once.
//!
//! TLS handshakes pass a token bucket (`--handshake-rate`, 200 a second,
//! bursts up to the same number): a connection over it is closed before its
//! handshake and the node backs off. At most `max_pending_hellos` Hello
//! transactions run at once (a semaphore in the gateway's state); more are
//! refused RESOURCE_EXHAUSTED. Without that bound a reconnect storm once
//! queued enough Hellos to starve the gateway's own lease renewal.

use std::time::Duration;

use bcd_proto::tls;
use tracing::warn;

/// The shortest first-redial window the server hands out.
pub const MIN_FIRST_RETRY: Duration = Duration::from_millis(50);
/// The longest: past it the node's own doubling takes over anyway.
pub const MAX_FIRST_RETRY: Duration = Duration::from_secs(30);

/// The window a node draws its first redial from after losing its session
/// (full jitter): long enough that the whole fleet (`connected` nodes)
/// redialing at once arrives no faster than the `gateways` can take them
/// at `per_gateway` Hellos a second each. After one gateway dies its
/// share of the fleet arrives over the others in the same window, well
/// under their capacity; after every link breaks, the fleet arrives at
/// about the gateways' capacity. A node cannot know either number.
pub fn first_retry_window(connected: usize, gateways: usize, per_gateway: u32) -> Duration {
    let capacity = gateways.max(1) as f64 * f64::from(per_gateway.max(1));
    Duration::from_secs_f64(connected as f64 / capacity).clamp(MIN_FIRST_RETRY, MAX_FIRST_RETRY)
}

/// A token bucket: `rate` a second, bursts up to `rate`. Time is a
/// parameter, so the arithmetic is tested without sleeping.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last_ms: u64,
}

impl TokenBucket {
    pub fn new(rate: u32, now_ms: u64) -> TokenBucket {
        TokenBucket {
            rate: f64::from(rate),
            burst: f64::from(rate.max(1)),
            tokens: f64::from(rate.max(1)),
            last_ms: now_ms,
        }
    }

    pub fn take(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = self.last_ms.max(now_ms);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The gateway's handshake admission.
#[derive(Debug)]
pub struct HandshakeBucket {
    start: std::time::Instant,
    bucket: std::sync::Mutex<TokenBucket>,
    refused: std::sync::atomic::AtomicU64,
    metrics: std::sync::Arc<crate::metrics::ServerMetrics>,
}

impl HandshakeBucket {
    pub fn new(
        rate: u32,
        metrics: std::sync::Arc<crate::metrics::ServerMetrics>,
    ) -> HandshakeBucket {
        HandshakeBucket {
            start: std::time::Instant::now(),
            bucket: std::sync::Mutex::new(TokenBucket::new(rate, 0)),
            refused: std::sync::atomic::AtomicU64::new(0),
            metrics,
        }
    }
}

impl tls::Admission for HandshakeBucket {
    fn admit(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64;
        let ok = self
            .bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(now);
        self.metrics.handshake(ok);
        if !ok {
            let n = self
                .refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n.is_multiple_of(1000) {
                warn!(
                    refused = n + 1,
                    "over the handshake rate; closing connections before their handshake"
                );
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::{Duration, TokenBucket, first_retry_window};

    #[test]
    fn the_first_retry_window_spreads_the_fleet_over_what_the_gateways_take() {
        // 1,000 nodes on 3 gateways taking 2,000 Hellos/s each: 1/6 s.
        assert_eq!(
            first_retry_window(1_000, 3, 2_000),
            Duration::from_secs_f64(1_000.0 / 6_000.0)
        );
        // 10,000 nodes behind the default 200/s bucket on 3 gateways.
        assert_eq!(
            first_retry_window(10_000, 3, 200),
            Duration::from_secs_f64(10_000.0 / 600.0)
        );
        assert_eq!(first_retry_window(3, 3, 2_000), Duration::from_millis(50));
        assert_eq!(first_retry_window(1_000_000, 0, 1), Duration::from_secs(30));
    }

    #[test]
    fn the_bucket_admits_a_burst_then_the_rate() {
        let mut b = TokenBucket::new(200, 0);
        let burst = (0..1000).filter(|_| b.take(0)).count();
        assert_eq!(burst, 200);
        assert!(!b.take(0));
        // 10 ms later: two more.
        assert_eq!((0..10).filter(|_| b.take(10)).count(), 2);
        // A long pause refills only up to the burst.
        assert_eq!((0..1000).filter(|_| b.take(60_000)).count(), 200);
        // Time going backwards admits nothing extra.
        assert!(!b.take(1));
    }
}
