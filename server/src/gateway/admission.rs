//! Admission: how many connections and Hellos a gateway takes on at once.
//!
//! TLS handshakes pass a token bucket (`--handshake-rate`, 200 a second,
//! bursts up to the same number): a connection over it is closed before its
//! handshake and the node backs off. An unauthenticated flood can empty
//! that bucket, so addresses that lately completed a handshake with a node
//! certificate have a second bucket of the same rate to themselves
//! ([`Admitter`]): enrolled nodes keep getting in while strangers flood. At most `max_pending_hellos` Hello
//! transactions run at once (a semaphore in the gateway's state); more wait
//! their turn up to `HELLO_QUEUE_WAIT` and are then refused
//! RESOURCE_EXHAUSTED. Without that bound a reconnect storm once
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
/// redialing at once arrives no faster than the gateways admit it: the
/// first `burst` at once (what their full buckets admit from known nodes,
/// [`known_burst`] each), the rest at `absorbs` a second (together,
/// [`fleet_absorbs`]). After one gateway dies its share of the fleet
/// arrives over the others in the same window, well under what they
/// admit; after every link breaks, the fleet arrives at about that. A node
/// cannot know either number. Sized from the rate alone, the window kept a
/// 1,000-node fleet behind the default 200/s buckets of three gateways
/// spread over 1.7 s though their bursts admit all of it at once.
pub fn first_retry_window(connected: usize, absorbs: u32, burst: u64) -> Duration {
    let later = (connected as u64).saturating_sub(burst);
    Duration::from_secs_f64(later as f64 / f64::from(absorbs.max(1)))
        .clamp(MIN_FIRST_RETRY, MAX_FIRST_RETRY)
}

/// The handshakes one gateway admits at once from nodes it knows, before
/// its rate applies: its open bucket's burst and its reserve's (each
/// `handshake_rate`, [`Admitter`]), at most the Hellos it takes in a
/// second (`hello_capacity`), so an admitted burst passes its Hello queue
/// well within the queue's wait.
pub fn known_burst(handshake_rate: u32, hello_capacity: u32) -> u32 {
    handshake_rate.saturating_mul(2).min(hello_capacity)
}

/// The Hellos a second the live gateways absorb together: the sum each
/// reported ([`Absorption::reported`]), or, while none has reported (a
/// store written by an older release), `gateways` times this one's floor.
pub fn fleet_absorbs(reported_sum: u64, gateways: usize, floor: u32) -> u32 {
    if reported_sum > 0 {
        reported_sum.min(u64::from(u32::MAX)) as u32
    } else {
        (gateways.max(1) as u64 * u64::from(floor.max(1))).min(u64::from(u32::MAX)) as u32
    }
}

/// How far back the peak of committed Hellos reaches.
pub const ABSORPTION_WINDOW_S: u64 = 300;

/// What a gateway measured it absorbs: Hellos committed in each whole
/// second of the last [`ABSORPTION_WINDOW_S`], and the busiest of them.
/// Sans-IO: seconds are a parameter.
#[derive(Debug, Clone)]
pub struct Absorption {
    /// `(second, Hellos committed in it)`, one slot per second of the
    /// window, indexed by the second modulo its length.
    slots: Vec<(u64, u32)>,
}

impl Default for Absorption {
    fn default() -> Absorption {
        Absorption {
            slots: vec![(u64::MAX, 0); ABSORPTION_WINDOW_S as usize],
        }
    }
}

impl Absorption {
    /// A Hello committed in `second`.
    pub fn committed(&mut self, second: u64) {
        let slot = &mut self.slots[(second % ABSORPTION_WINDOW_S) as usize];
        if slot.0 != second {
            *slot = (second, 0);
        }
        slot.1 = slot.1.saturating_add(1);
    }

    /// The most Hellos committed in one second of the window ending at
    /// `now` (the second in progress included).
    pub fn peak(&self, now: u64) -> u32 {
        self.slots
            .iter()
            .filter(|(second, _)| *second <= now && now - *second < ABSORPTION_WINDOW_S)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }

    /// What this gateway reports it absorbs a second: the peak, floored at
    /// what its handshake bucket admits (`floor`), since a fleet that
    /// stayed connected measured nothing.
    pub fn reported(&self, now: u64, floor: u32) -> u32 {
        self.peak(now).max(floor)
    }
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

    /// Whether the bucket would be back at its burst by `now_ms`: one
    /// that is full can be forgotten and made again.
    pub fn full(&self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.tokens + elapsed * self.rate >= self.burst
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

/// Addresses remembered as a node's, at most.
pub const MAX_KNOWN: usize = 65_536;
/// How long an address stays known after its last authenticated handshake.
pub const KNOWN_FOR_MS: u64 = 60 * 60 * 1000;

/// The per-address rate a gateway starts with (`--handshake-rate-per-address`):
/// a quarter of the default bucket, so one address, however hard it dials,
/// leaves three quarters of the open bucket to everyone else.
pub const DEFAULT_HANDSHAKE_RATE_PER_ADDRESS: u32 = 50;

/// Addresses given a bucket of their own, at most. Past it (more addresses
/// dialing at once than this within a second or two) a new address is
/// held to the shared buckets alone: the per-address rule is for fairness,
/// and failing open keeps a spray from many addresses from locking out
/// new ones.
pub const MAX_RATED_ADDRESSES: usize = 65_536;

/// Why [`Admitter::admit`] refused a handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The source address is over its own rate.
    AddressRate,
    /// The shared bucket (and the reserve, for a known node) is empty.
    Rate,
}

/// Handshake admission, sans-IO: a bucket per source address
/// (`per_address` a second), then the open bucket for everyone, and a
/// reserve of the same rate for addresses that lately authenticated as a
/// node.
#[derive(Debug, Clone)]
pub struct Admitter {
    open: TokenBucket,
    reserve: TokenBucket,
    known: std::collections::HashMap<std::net::IpAddr, u64>,
    per_address: u32,
    rated: std::collections::HashMap<std::net::IpAddr, TokenBucket>,
}

impl Admitter {
    pub fn new(rate: u32, per_address: u32, now_ms: u64) -> Admitter {
        Admitter {
            open: TokenBucket::new(rate, now_ms),
            reserve: TokenBucket::new(rate, now_ms),
            known: std::collections::HashMap::new(),
            per_address,
            rated: std::collections::HashMap::new(),
        }
    }

    pub fn admit(&mut self, remote: std::net::IpAddr, now_ms: u64) -> Result<(), Refused> {
        let remote = tls::PerAddress::key(remote);
        if !self.take_for(remote, now_ms) {
            return Err(Refused::AddressRate);
        }
        if self.open.take(now_ms) {
            return Ok(());
        }
        let known = self
            .known
            .get(&remote)
            .is_some_and(|at| now_ms.saturating_sub(*at) <= KNOWN_FOR_MS);
        if known && self.reserve.take(now_ms) {
            Ok(())
        } else {
            Err(Refused::Rate)
        }
    }

    /// A token from `remote`'s own bucket.
    fn take_for(&mut self, remote: std::net::IpAddr, now_ms: u64) -> bool {
        if let Some(bucket) = self.rated.get_mut(&remote) {
            return bucket.take(now_ms);
        }
        if self.rated.len() >= MAX_RATED_ADDRESSES {
            // A bucket that has refilled says nothing a new one would not.
            self.rated.retain(|_, b| !b.full(now_ms));
            if self.rated.len() >= MAX_RATED_ADDRESSES {
                return true;
            }
        }
        let mut bucket = TokenBucket::new(self.per_address, now_ms);
        let ok = bucket.take(now_ms);
        self.rated.insert(remote, bucket);
        ok
    }

    pub fn authenticated(&mut self, remote: std::net::IpAddr, now_ms: u64) {
        let remote = tls::PerAddress::key(remote);
        if self.known.len() >= MAX_KNOWN && !self.known.contains_key(&remote) {
            self.known
                .retain(|_, at| now_ms.saturating_sub(*at) <= KNOWN_FOR_MS);
            if self.known.len() >= MAX_KNOWN {
                return;
            }
        }
        self.known.insert(remote, now_ms);
    }
}

/// The gateway's handshake admission.
#[derive(Debug)]
pub struct HandshakeBucket {
    start: std::time::Instant,
    bucket: std::sync::Mutex<Admitter>,
    refused: std::sync::atomic::AtomicU64,
    metrics: std::sync::Arc<crate::metrics::ServerMetrics>,
}

impl HandshakeBucket {
    pub fn new(
        rate: u32,
        per_address: u32,
        metrics: std::sync::Arc<crate::metrics::ServerMetrics>,
    ) -> HandshakeBucket {
        HandshakeBucket {
            start: crate::clock::mono(),
            bucket: std::sync::Mutex::new(Admitter::new(rate, per_address, 0)),
            refused: std::sync::atomic::AtomicU64::new(0),
            metrics,
        }
    }
}

impl tls::Admission for HandshakeBucket {
    fn over_address_cap(&self, _remote: std::net::IpAddr) {
        self.metrics.over_address_cap.inc();
    }

    fn authenticated(&self, remote: std::net::IpAddr, resumed: bool) {
        self.metrics.tls_session(resumed);
        let now = self.start.elapsed().as_millis() as u64;
        self.bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .authenticated(remote, now);
    }

    fn admit(&self, remote: std::net::IpAddr) -> bool {
        let now = self.start.elapsed().as_millis() as u64;
        let outcome = self
            .bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .admit(remote, now);
        self.metrics.handshake(match outcome {
            Ok(()) => "admitted",
            Err(Refused::Rate) => "refused",
            Err(Refused::AddressRate) => "address_rate",
        });
        let Err(why) = outcome else {
            return true;
        };
        let n = self
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n.is_multiple_of(1000) {
            match why {
                Refused::Rate => warn!(
                    refused = n + 1,
                    "over the handshake rate; closing connections before their handshake"
                ),
                Refused::AddressRate => warn!(
                    refused = n + 1,
                    %remote,
                    "an address over --handshake-rate-per-address; closing its connections before their handshake"
                ),
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::{
        ABSORPTION_WINDOW_S, Absorption, Admitter, Duration, KNOWN_FOR_MS, MAX_KNOWN,
        MAX_RATED_ADDRESSES, Refused, TokenBucket, first_retry_window, fleet_absorbs, known_burst,
    };

    #[test]
    fn absorption_is_the_busiest_second_of_the_last_five_minutes_floored() {
        let mut a = Absorption::default();
        assert_eq!(a.peak(0), 0);
        assert_eq!(a.reported(0, 200), 200, "an idle gateway reports its floor");
        for _ in 0..450 {
            a.committed(10);
        }
        for _ in 0..300 {
            a.committed(11);
        }
        assert_eq!(a.peak(11), 450);
        assert_eq!(a.reported(11, 200), 450);
        assert_eq!(a.reported(11, 1_000), 1_000);
        // The busy second ages out of the window; the slot it used is
        // counted afresh when its second comes round again.
        assert_eq!(a.peak(10 + ABSORPTION_WINDOW_S - 1), 450);
        assert_eq!(a.peak(10 + ABSORPTION_WINDOW_S), 300);
        a.committed(10 + ABSORPTION_WINDOW_S);
        assert_eq!(a.peak(10 + ABSORPTION_WINDOW_S), 300);
        assert_eq!(a.peak(11 + ABSORPTION_WINDOW_S), 1);
        // A clock read before a recorded second sees nothing from the future.
        assert_eq!(a.peak(5), 0);
    }

    #[test]
    fn the_fleet_absorbs_what_its_gateways_reported_or_their_floors() {
        assert_eq!(fleet_absorbs(1_300, 3, 200), 1_300);
        assert_eq!(fleet_absorbs(0, 3, 200), 600);
        assert_eq!(fleet_absorbs(0, 0, 200), 200);
        assert_eq!(fleet_absorbs(u64::MAX, 3, 200), u32::MAX);
        // 3,000 nodes over gateways that absorbed 1,500 a second: 2 s,
        // where three floors of 200 would have made it 5 s.
        assert_eq!(
            first_retry_window(3_000, fleet_absorbs(1_500, 3, 200), 0),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn a_flood_from_strangers_leaves_known_nodes_a_bucket_of_their_own() {
        let node: std::net::IpAddr = "10.0.0.7".parse().unwrap();
        let stranger: std::net::IpAddr = "203.0.113.9".parse().unwrap();
        let mut a = Admitter::new(10, 1_000_000, 0);
        a.authenticated(node, 0);
        // The stranger empties the open bucket.
        let admitted = (0..1_000).filter(|_| a.admit(stranger, 0).is_ok()).count();
        assert_eq!(admitted, 10);
        // The node still gets in, at the reserve's rate, and no further.
        assert_eq!((0..100).filter(|_| a.admit(node, 0).is_ok()).count(), 10);
        assert_eq!(a.admit(stranger, 0), Err(Refused::Rate));
        // A second on, both buckets have refilled: the open one first.
        assert!(a.admit(stranger, 1_000).is_ok());
        // An address stays known for an hour after its last handshake.
        let mut a = Admitter::new(1, 1_000_000, 0);
        a.authenticated(node, 0);
        assert!(a.admit(stranger, 0).is_ok());
        assert!(a.admit(node, 0).is_ok(), "the reserve");
        let later = KNOWN_FOR_MS + 5_000;
        assert!(a.admit(stranger, later).is_ok());
        assert!(a.admit(node, later).is_err(), "no longer known");
    }

    #[test]
    fn one_address_gets_its_own_rate_and_leaves_the_rest_to_everyone_else() {
        let flood: std::net::IpAddr = "203.0.113.9".parse().unwrap();
        let mut a = Admitter::new(200, 50, 0);
        let taken = (0..10_000).filter(|_| a.admit(flood, 0).is_ok()).count();
        assert_eq!(taken, 50, "a burst of its own rate");
        assert_eq!(a.admit(flood, 0), Err(Refused::AddressRate));
        // 150 strangers from 150 other addresses all get in in the same
        // millisecond: what the flood left of the open bucket.
        let others = (0..150u8)
            .filter(|i| {
                a.admit(std::net::IpAddr::from([198, 51, 100, *i]), 0)
                    .is_ok()
            })
            .count();
        assert_eq!(others, 150);
        // A second later the flood has 50 more, no more.
        let taken = (0..10_000)
            .filter(|_| a.admit(flood, 1_000).is_ok())
            .count();
        assert_eq!(taken, 50);
        // An IPv6 flood counts by its /64, whatever the low bits.
        let mut a = Admitter::new(200, 5, 0);
        let v6 = (0..100u16)
            .filter(|i| {
                let ip = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, *i);
                a.admit(ip.into(), 0).is_ok()
            })
            .count();
        assert_eq!(v6, 5);
    }

    #[test]
    fn the_rated_addresses_stay_bounded_and_fail_open_past_it() {
        let mut a = Admitter::new(u32::MAX, 1, 0);
        for i in 0..(MAX_RATED_ADDRESSES as u32) {
            assert!(a.admit(std::net::IpAddr::from(i.to_be_bytes()), 0).is_ok());
        }
        assert_eq!(a.rated.len(), MAX_RATED_ADDRESSES);
        // Full: a new address is held to the shared buckets alone.
        let newcomer: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        assert!(a.admit(newcomer, 0).is_ok());
        assert!(a.admit(newcomer, 0).is_ok());
        assert_eq!(a.rated.len(), MAX_RATED_ADDRESSES);
        // A second on, every bucket has refilled and is forgotten.
        assert!(a.admit(newcomer, 1_000).is_ok());
        assert_eq!(a.rated.len(), 1);
        assert!(a.admit(newcomer, 1_000).is_err(), "rated again");
    }

    #[test]
    fn the_known_addresses_stay_bounded() {
        let mut a = Admitter::new(1, 1, 0);
        for i in 0..(MAX_KNOWN as u32 + 10) {
            a.authenticated(std::net::IpAddr::from(i.to_be_bytes()), 0);
        }
        assert_eq!(a.known.len(), MAX_KNOWN);
        // Old ones make room for new ones.
        a.authenticated("192.0.2.1".parse().unwrap(), KNOWN_FOR_MS + 1);
        assert_eq!(a.known.len(), 1);
    }

    #[test]
    fn the_first_retry_window_spreads_the_fleet_over_what_the_gateways_take() {
        // 1,000 nodes on 3 gateways taking 2,000 Hellos/s each: 1/6 s.
        assert_eq!(
            first_retry_window(1_000, 6_000, 0),
            Duration::from_secs_f64(1_000.0 / 6_000.0)
        );
        // 10,000 nodes behind the default 200/s bucket on 3 gateways.
        assert_eq!(
            first_retry_window(10_000, 600, 0),
            Duration::from_secs_f64(10_000.0 / 600.0)
        );
        assert_eq!(first_retry_window(3, 6_000, 0), Duration::from_millis(50));
        assert_eq!(first_retry_window(1_000_000, 1, 0), Duration::from_secs(30));
    }

    #[test]
    fn what_full_buckets_admit_at_once_comes_off_the_window() {
        // The defaults: a 200/s bucket and its reserve, 2,000 Hellos/s.
        let burst = known_burst(200, 2_000);
        assert_eq!(burst, 400);
        // 1,000 nodes on three gateways: their buckets admit all of them
        // at once (1.67 s from the rate alone).
        assert_eq!(
            first_retry_window(1_000, 600, 3 * u64::from(burst)),
            Duration::from_millis(50)
        );
        // 3,000: 1,800 past the bursts at 600 a second.
        assert_eq!(
            first_retry_window(3_000, 600, 3 * u64::from(burst)),
            Duration::from_secs(3)
        );
        // A raised bucket admits at once no more than the Hellos a
        // gateway takes in a second.
        assert_eq!(known_burst(5_000, 2_000), 2_000);
        assert_eq!(
            first_retry_window(10_000, 6_000, 3 * 2_000),
            Duration::from_secs_f64(4_000.0 / 6_000.0)
        );
        assert_eq!(known_burst(u32::MAX, u32::MAX), u32::MAX);
        assert_eq!(
            first_retry_window(10, 1, u64::MAX),
            Duration::from_millis(50)
        );
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
