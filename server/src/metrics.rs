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

use bc_store::nodes::NodeList;
use bc_store::rollouts::{NodeStatus, Rollout, RolloutState};
use bc_store::{GatewayStore, Store};
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
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
    pub build_info: Family<VersionLabels, Gauge>,
    /// The fleet as the key holder reads it ([`refresh_fleet`]).
    pub nodes: Family<StateLabels, Gauge>,
    pub nodes_unconverged: Gauge,
    pub node_cert_soonest_expiry: Gauge<f64, AtomicU64>,
    pub ca_expiry: Gauge<f64, AtomicU64>,
    pub rollouts: Family<StateLabels, Gauge>,
    pub rollout_nodes: Family<StatusLabels, Gauge>,
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
            build_info: Family::default(),
            nodes: Family::default(),
            nodes_unconverged: Gauge::default(),
            node_cert_soonest_expiry: Gauge::default(),
            ca_expiry: Gauge::default(),
            rollouts: Family::default(),
            rollout_nodes: Family::default(),
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
        registry.register(
            "build_info",
            "1, labelled with this binary's version",
            m.build_info.clone(),
        );
        // Series an alert's rate reads exist from the start, at zero.
        for outcome in ["welcomed", "refused"] {
            m.hellos
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.into(),
                })
                .inc_by(0);
        }
        for reason in ["fenced", "not-hello", "too-many-hellos"] {
            m.hello_refusals
                .get_or_create(&ReasonLabels {
                    reason: reason.into(),
                })
                .inc_by(0);
        }
        m.build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        registry.register(
            "nodes",
            "Live nodes by state (connected, disconnected, unreachable), read by the key holder every 15 s",
            m.nodes.clone(),
        );
        registry.register(
            "nodes_unconverged",
            "Nodes whose applied spec generation is not the desired one (key holder)",
            m.nodes_unconverged.clone(),
        );
        registry.register(
            "node_certificate_soonest_expiry_timestamp_seconds",
            "When the first certificate of a connected node runs out, in Unix seconds; 0: no connected node (key holder)",
            m.node_cert_soonest_expiry.clone(),
        );
        registry.register(
            "fleet_ca_expiry_timestamp_seconds",
            "When the fleet CA's certificate runs out, in Unix seconds (key holder)",
            m.ca_expiry.clone(),
        );
        registry.register(
            "rollouts",
            "Rollouts by state (key holder)",
            m.rollouts.clone(),
        );
        registry.register(
            "rollout_nodes",
            "The nodes of running, paused and halted rollouts by status (key holder)",
            m.rollout_nodes.clone(),
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

/// How often [`refresh_fleet`] reads the fleet.
pub const FLEET_EVERY: Duration = Duration::from_secs(15);

/// The node states the fleet gauges always carry, zero included.
const NODE_STATES: [&str; 3] = ["connected", "disconnected", "unreachable"];
/// The rollout node statuses the gauges always carry.
const ROLLOUT_STATUSES: [NodeStatus; 6] = [
    NodeStatus::Waiting,
    NodeStatus::Upgrading,
    NodeStatus::Confirmed,
    NodeStatus::Failed,
    NodeStatus::Skipped,
    NodeStatus::Cancelled,
];

impl ServerMetrics {
    /// The fleet gauges from one read of the nodes, the settling counts
    /// and the rollouts.
    pub fn set_fleet(&self, nodes: &NodeList, unconverged: usize, rollouts: &[Rollout]) {
        for state in NODE_STATES {
            let n = nodes.nodes.iter().filter(|n| n.state == state).count();
            self.nodes
                .get_or_create(&StateLabels {
                    state: state.to_string(),
                })
                .set(n as i64);
        }
        let soonest = nodes
            .nodes
            .iter()
            .filter(|n| n.state == "connected" && n.cert_not_after_ms > 0)
            .map(|n| n.cert_not_after_ms)
            .min();
        self.node_cert_soonest_expiry
            .set(soonest.map_or(0.0, |ms| ms as f64 / 1000.0));
        self.nodes_unconverged.set(unconverged as i64);
        for state in RolloutState::ALL {
            let n = rollouts.iter().filter(|r| r.state == state).count();
            self.rollouts
                .get_or_create(&StateLabels {
                    state: state.name().to_string(),
                })
                .set(n as i64);
        }
        let open = || {
            rollouts
                .iter()
                .filter(|r| r.state.active() || r.state == RolloutState::Halted)
                .flat_map(|r| r.nodes.iter())
        };
        for status in ROLLOUT_STATUSES {
            let n = open().filter(|n| n.status == status).count();
            self.rollout_nodes
                .get_or_create(&StatusLabels {
                    status: status.name().to_string(),
                })
                .set(n as i64);
        }
    }
}

/// The key holder's fleet gauges, read every [`FLEET_EVERY`]: nodes by
/// state, the soonest certificate expiry of a connected node, nodes not
/// converged, rollouts and their nodes.
pub async fn refresh_fleet(store: Store, metrics: Arc<ServerMetrics>) {
    let mut tick = tokio::time::interval(FLEET_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let read = async {
            let nodes = metrics.timed("list_nodes", store.list_nodes()).await?;
            let settling = metrics.timed("settling", store.settling()).await?;
            let rollouts = metrics
                .timed("list_rollouts", store.list_rollouts())
                .await?;
            Ok::<_, bc_store::StoreError>((nodes, settling, rollouts))
        };
        match read.await {
            Ok((nodes, settling, rollouts)) => {
                metrics.set_fleet(&nodes, settling.unapplied_specs, &rollouts)
            }
            Err(e) => tracing::debug!(error = %e, "metrics: cannot read the fleet"),
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

    #[test]
    fn the_fleet_gauges_count_every_state_zero_included() {
        use bc_store::nodes::NodeRow;
        let node = |id: &str, state: &str, cert: i64| NodeRow {
            node_id: id.into(),
            state: state.into(),
            cert_not_after_ms: cert,
            ..NodeRow::default()
        };
        let m = ServerMetrics::new();
        let nodes = NodeList {
            nodes: vec![
                node("a", "connected", 9_000_000),
                node("b", "connected", 7_000_000),
                node("c", "unreachable", 1_000),
            ],
            now_ms: 0,
        };
        m.set_fleet(&nodes, 2, &[]);
        let text = m.encode();
        for line in [
            "bc_nodes{state=\"connected\"} 2",
            "bc_nodes{state=\"disconnected\"} 0",
            "bc_nodes{state=\"unreachable\"} 1",
            "bc_nodes_unconverged 2",
            "bc_node_certificate_soonest_expiry_timestamp_seconds 7000.0",
            "bc_rollouts{state=\"halted\"} 0",
            "bc_rollout_nodes{status=\"waiting\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(
            text.contains(&format!(
                "bc_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }
}
