//! Admission: how many connections and Hellos a gateway takes on at once.
//!
//! TLS handshakes pass a token bucket (`--handshake-rate`, 200 a second,
//! bursts up to the same number): a connection over it is closed before its
//! handshake and the node backs off. At most `max_pending_hellos` Hello
//! transactions run at once (a semaphore in the gateway's state); more are
//! refused RESOURCE_EXHAUSTED. Without that bound a reconnect storm once
//! queued enough Hellos to starve the gateway's own lease renewal.

use bcd_proto::tls;
use tracing::warn;

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
}

impl HandshakeBucket {
    pub fn new(rate: u32) -> HandshakeBucket {
        HandshakeBucket {
            start: std::time::Instant::now(),
            bucket: std::sync::Mutex::new(TokenBucket::new(rate, 0)),
            refused: std::sync::atomic::AtomicU64::new(0),
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
    use super::TokenBucket;

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
