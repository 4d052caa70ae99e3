//! The control plane's metrics, in the Prometheus text format (OpenMetrics,
//! by the `prometheus-client` crate), served at `/metrics` on the HTTP
//! listener (`serve --http-listen`, see [`crate::http`]).
//!
//! One [`ServerMetrics`] per process, handed to the gateway, the
//! controllers and the admission bucket, which set what they see:
//! sessions this gateway holds, Hello transactions and refusals by reason,
//! TLS handshakes admitted and refused, node handshakes full and resumed,
//! commands by state (read from the store every few seconds by
//! [`refresh_commands`], not per scrape),
//! dispatch latency, liveness transitions, store latency per call, and the
//! clock offset the gateway lease renewal measures. This module names no
//! other of the server's modules.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_store::GatewayStore;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// What `/metrics` answers with.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How often [`refresh_commands`] reads the command counts.
pub const COMMANDS_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToLabels {
    pub to: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub call: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GatewayLabels {
    pub gateway: String,
}

fn store_histogram() -> Histogram {
    // 0.5 ms to about 12 s.
    Histogram::new(exponential_buckets(0.0005, 2.5, 12))
}

/// Every metric of one control-plane process.
#[derive(Debug)]
pub struct ServerMetrics {
    registry: Registry,
    pub gateway: Family<GatewayLabels, Gauge>,
    pub sessions: Gauge,
    pub fenced: Gauge,
    pub hellos: Family<OutcomeLabels, Counter>,
    pub hello_refusals: Family<ReasonLabels, Counter>,
    pub handshakes: Family<OutcomeLabels, Counter>,
    pub over_address_cap: Counter,
    pub tls_sessions: Family<KindLabels, Counter>,
    pub commands: Family<StateLabels, Gauge>,
    pub dispatch_latency: Histogram,
    pub liveness: Family<ToLabels, Counter>,
    pub store_latency: Family<CallLabels, Histogram>,
    pub clock_offset_seconds: Gauge<f64, AtomicU64>,
    pub absorbs_per_s: Gauge,
    pub fleet_absorbs_per_s: Gauge,
    /// The command states seen at the last refresh (a state that empties
    /// goes back to 0 rather than keeping its last count).
    seen_states: Mutex<Vec<String>>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics::new()
    }
}

impl ServerMetrics {
    pub fn new() -> ServerMetrics {
        let mut registry = Registry::with_prefix("bc");
        let m = ServerMetrics {
            registry: Registry::default(),
            gateway: Family::default(),
            sessions: Gauge::default(),
            fenced: Gauge::default(),
            hellos: Family::default(),
            hello_refusals: Family::default(),
            handshakes: Family::default(),
            over_address_cap: Counter::default(),
            tls_sessions: Family::default(),
            commands: Family::default(),
            dispatch_latency: Histogram::new(exponential_buckets(0.005, 2.5, 14)),
            liveness: Family::default(),
            store_latency: Family::new_with_constructor(store_histogram),
            clock_offset_seconds: Gauge::default(),
            absorbs_per_s: Gauge::default(),
            fleet_absorbs_per_s: Gauge::default(),
            seen_states: Mutex::new(Vec::new()),
        };
        registry.register(
            "gateway",
            "1, labelled with this process's gateway id",
            m.gateway.clone(),
        );
        registry.register(
            "gateway_sessions",
            "Node sessions this gateway holds now",
            m.sessions.clone(),
        );
        registry.register(
            "gateway_fenced",
            "1 while this gateway does not hold its lease and refuses sessions",
            m.fenced.clone(),
        );
        registry.register(
            "hellos",
            "Hellos handled, by outcome (welcomed, refused)",
            m.hellos.clone(),
        );
        registry.register(
            "hello_refusals",
            "Hellos refused, by reason",
            m.hello_refusals.clone(),
        );
        registry.register(
            "handshakes",
            "TLS connections the handshake buckets admitted or refused before their handshake (refused: the shared bucket; address_rate: the source address's own)",
            m.handshakes.clone(),
        );
        registry.register(
            "connections_over_address_cap",
            "TCP connections closed as they arrived: their source address already held --max-connections-per-address",
            m.over_address_cap.clone(),
        );
        registry.register(
            "tls_sessions",
            "Gateway TLS handshakes with a node certificate, by kind (full, resumed)",
            m.tls_sessions.clone(),
        );
        registry.register(
            "commands",
            "Commands in the store by state (read every 5 s)",
            m.commands.clone(),
        );
        registry.register(
            "dispatch_latency_seconds",
            "From a command's creation to its first dispatch to the node, on the store's clock",
            m.dispatch_latency.clone(),
        );
        registry.register(
            "liveness_transitions",
            "Node liveness transitions this process made, by the state entered",
            m.liveness.clone(),
        );
        registry.register(
            "store_latency_seconds",
            "Store calls of the gateway and the controllers, by call",
            m.store_latency.clone(),
        );
        registry.register(
            "clock_offset_seconds",
            "This host's clock minus the store's, measured at each gateway lease renewal (ClockSkew above 1 s)",
            m.clock_offset_seconds.clone(),
        );
        registry.register(
            "gateway_absorbs_hellos_per_second",
            "The most Hellos this gateway committed in one second of the last five minutes, floored at what its handshake rate admits (reported on its lease)",
            m.absorbs_per_s.clone(),
        );
        registry.register(
            "fleet_absorbs_hellos_per_second",
            "What the live gateways reported they absorb together: the first-redial window is the connected fleet over it",
            m.fleet_absorbs_per_s.clone(),
        );
        ServerMetrics { registry, ..m }
    }

    /// Labels the process with its gateway id.
    pub fn set_gateway(&self, id: &str) {
        self.gateway
            .get_or_create(&GatewayLabels {
                gateway: id.to_string(),
            })
            .set(1);
    }

    pub fn hello_welcomed(&self) {
        self.hellos
            .get_or_create(&OutcomeLabels {
                outcome: "welcomed".into(),
            })
            .inc();
    }

    pub fn hello_refused(&self, reason: &str) {
        self.hellos
            .get_or_create(&OutcomeLabels {
                outcome: "refused".into(),
            })
            .inc();
        self.hello_refusals
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A connection's outcome before its handshake: `admitted`, `refused`
    /// (the shared bucket was empty) or `address_rate` (its source address
    /// was over --handshake-rate-per-address).
    pub fn handshake(&self, outcome: &'static str) {
        self.handshakes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .inc();
    }

    /// A handshake that presented a node certificate: a full one, or one
    /// that resumed an earlier session with a ticket.
    pub fn tls_session(&self, resumed: bool) {
        self.tls_sessions
            .get_or_create(&KindLabels {
                kind: if resumed { "resumed" } else { "full" }.into(),
            })
            .inc();
    }

    pub fn transition(&self, to: &str, n: usize) {
        if n > 0 {
            self.liveness
                .get_or_create(&ToLabels { to: to.to_string() })
                .inc_by(n as u64);
        }
    }

    pub fn dispatched_after(&self, waited_ms: i64) {
        self.dispatch_latency
            .observe(waited_ms.max(0) as f64 / 1000.0);
    }

    pub fn store_call(&self, call: &str, took: Duration) {
        self.store_latency
            .get_or_create(&CallLabels {
                call: call.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Runs one store call and records how long it took.
    pub async fn timed<T>(&self, call: &str, f: impl Future<Output = T>) -> T {
        let start = crate::clock::mono();
        let out = f.await;
        self.store_call(call, start.elapsed());
        out
    }

    /// The command counts, replacing the last ones.
    pub fn set_commands(&self, states: &[(String, u64)]) {
        let mut seen = self.seen_states.lock().unwrap_or_else(|p| p.into_inner());
        for s in seen.iter() {
            if !states.iter().any(|(name, _)| name == s) {
                self.commands
                    .get_or_create(&StateLabels { state: s.clone() })
                    .set(0);
            }
        }
        for (state, n) in states {
            self.commands
                .get_or_create(&StateLabels {
                    state: state.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
            if !seen.contains(state) {
                seen.push(state.clone());
            }
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Reads the command counts every [`COMMANDS_EVERY`] for as long as it
/// runs (one cheap grouped read, whatever the scrape rate).
pub async fn refresh_commands(store: GatewayStore, metrics: Arc<ServerMetrics>) {
    let mut tick = tokio::time::interval(COMMANDS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match metrics
            .timed("command_states", store.command_states())
            .await
        {
            Ok(states) => metrics.set_commands(&states),
            Err(e) => tracing::debug!(error = %e, "metrics: cannot count commands"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_and_moves() {
        let m = ServerMetrics::new();
        m.set_gateway("gw-1");
        m.sessions.set(2);
        m.hello_welcomed();
        m.hello_refused("fenced");
        m.handshake("admitted");
        m.handshake("refused");
        m.tls_session(false);
        m.tls_session(true);
        m.tls_session(true);
        m.transition("unreachable", 3);
        m.transition("disconnected", 0);
        m.dispatched_after(1_500);
        m.store_call("hello", Duration::from_millis(2));
        m.clock_offset_seconds.set(-0.25);
        m.set_commands(&[("pending".into(), 4), ("succeeded".into(), 7)]);
        m.set_commands(&[("succeeded".into(), 8)]);
        let text = m.encode();
        for line in [
            "bc_gateway{gateway=\"gw-1\"} 1",
            "bc_gateway_sessions 2",
            "bc_hellos_total{outcome=\"welcomed\"} 1",
            "bc_hellos_total{outcome=\"refused\"} 1",
            "bc_hello_refusals_total{reason=\"fenced\"} 1",
            "bc_handshakes_total{outcome=\"admitted\"} 1",
            "bc_handshakes_total{outcome=\"refused\"} 1",
            "bc_tls_sessions_total{kind=\"full\"} 1",
            "bc_tls_sessions_total{kind=\"resumed\"} 2",
            "bc_liveness_transitions_total{to=\"unreachable\"} 3",
            "bc_dispatch_latency_seconds_count 1",
            "bc_dispatch_latency_seconds_sum 1.5",
            "bc_store_latency_seconds_count{call=\"hello\"} 1",
            "bc_clock_offset_seconds -0.25",
            "bc_commands{state=\"pending\"} 0",
            "bc_commands{state=\"succeeded\"} 8",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(
            !text.contains("to=\"disconnected\""),
            "no series for nothing"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
