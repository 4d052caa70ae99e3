//! The node's metrics, in the Prometheus text format (OpenMetrics, by the
//! `prometheus-client` crate), served on `bcd node --metrics-listen` (off
//! unless given; loopback is the default address): session state and
//! reconnects, the journal's backlog, commands run, each section's
//! convergence status, the certificate's life left, the clock offset,
//! re-inventories by cause, and tunnels with the bytes they carried.
//!
//! The session loop sets them ([`NodeMetrics`]); [`serve`] answers `GET
//! /metrics` with one plain HTTP/1.1 exchange per connection, and nothing
//! else (an exporter needs no more, and the static binary carries no HTTP
//! server for it).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where `--metrics-listen` listens when given no address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9464";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    pub kind: String,
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SectionLabels {
    pub section: String,
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `in` (from the operator's CLI) or `out` (to it).
    pub direction: String,
}

/// The statuses a section reports, each a series of its own.
const STATUSES: &[&str] = &["ready", "progressing", "failed"];

/// Every metric of one node.
#[derive(Debug)]
pub struct NodeMetrics {
    registry: Registry,
    pub connected: Gauge,
    pub epoch: Gauge,
    pub sessions: Counter,
    pub reconnects: Counter,
    pub dial_failures: Counter,
    pub unacked_events: Gauge,
    pub unacked_results: Gauge,
    pub commands: Family<CommandLabels, Counter>,
    pub convergence: Family<SectionLabels, Gauge>,
    pub cert_seconds_left: Gauge<f64, AtomicU64>,
    pub clock_offset_seconds: Gauge<f64, AtomicU64>,
    pub inventories: Family<CauseLabels, Counter>,
    pub tunnels: Counter,
    pub tunnel_bytes: Family<DirectionLabels, Counter>,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        NodeMetrics::new()
    }
}

impl NodeMetrics {
    pub fn new() -> NodeMetrics {
        let mut registry = Registry::with_prefix("bcd");
        let m = NodeMetrics {
            registry: Registry::default(),
            connected: Gauge::default(),
            epoch: Gauge::default(),
            sessions: Counter::default(),
            reconnects: Counter::default(),
            dial_failures: Counter::default(),
            unacked_events: Gauge::default(),
            unacked_results: Gauge::default(),
            commands: Family::default(),
            convergence: Family::default(),
            cert_seconds_left: Gauge::default(),
            clock_offset_seconds: Gauge::default(),
            inventories: Family::default(),
            tunnels: Counter::default(),
            tunnel_bytes: Family::default(),
        };
        registry.register(
            "session_connected",
            "1 while the node holds a session with a gateway",
            m.connected.clone(),
        );
        registry.register(
            "session_epoch",
            "The current session's epoch",
            m.epoch.clone(),
        );
        registry.register("sessions", "Sessions established", m.sessions.clone());
        registry.register(
            "reconnects",
            "Sessions established after the first one of this process",
            m.reconnects.clone(),
        );
        registry.register(
            "dial_failures",
            "Dials that failed",
            m.dial_failures.clone(),
        );
        registry.register(
            "journal_unacked_events",
            "Events journaled and not yet acknowledged by the server",
            m.unacked_events.clone(),
        );
        registry.register(
            "journal_unacked_results",
            "Command results journaled and not yet acknowledged by the server",
            m.unacked_results.clone(),
        );
        registry.register(
            "commands",
            "Commands finished, by kind and outcome",
            m.commands.clone(),
        );
        registry.register(
            "convergence",
            "1 for each section's current status (ready, progressing, failed)",
            m.convergence.clone(),
        );
        registry.register(
            "certificate_seconds_left",
            "Seconds until the node certificate expires, on server time",
            m.cert_seconds_left.clone(),
        );
        registry.register(
            "clock_offset_seconds",
            "Server time minus this machine's clock (ClockSkew above 1 s)",
            m.clock_offset_seconds.clone(),
        );
        registry.register(
            "inventories",
            "Inventory passes, by cause (uevent, pass)",
            m.inventories.clone(),
        );
        registry.register(
            "tunnels",
            "Tunnels (exec, port-forward) that ended",
            m.tunnels.clone(),
        );
        registry.register(
            "tunnel_bytes",
            "Record bytes of ended tunnels, in from the operator's CLI and out to it",
            m.tunnel_bytes.clone(),
        );
        let built: Gauge = Gauge::default();
        built.set(1);
        registry
            .sub_registry_with_label(("version".into(), env!("CARGO_PKG_VERSION").into()))
            .register(
                "build_info",
                "1, labelled with this binary's version",
                built,
            );
        NodeMetrics { registry, ..m }
    }

    /// A tunnel ended, having carried these record bytes each way.
    pub fn tunnel_ended(&self, bytes_in: u64, bytes_out: u64) {
        self.tunnels.inc();
        for (direction, bytes) in [("in", bytes_in), ("out", bytes_out)] {
            self.tunnel_bytes
                .get_or_create(&DirectionLabels {
                    direction: direction.into(),
                })
                .inc_by(bytes);
        }
    }

    /// A session was established at `epoch`.
    pub fn established(&self, epoch: u64) {
        if self.sessions.inc() > 0 {
            self.reconnects.inc();
        }
        self.connected.set(1);
        self.epoch.set(epoch as i64);
    }

    /// A section's status now: its series is 1, the others 0.
    pub fn section(&self, section: &str, status: &str) {
        for s in STATUSES {
            self.convergence
                .get_or_create(&SectionLabels {
                    section: section.to_string(),
                    status: s.to_string(),
                })
                .set(i64::from(*s == status));
        }
    }

    pub fn command(&self, kind: &str, outcome: &str) {
        self.commands
            .get_or_create(&CommandLabels {
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn inventory(&self, cause: &str) {
        self.inventories
            .get_or_create(&CauseLabels {
                cause: cause.to_string(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// A request head, at most this long.
const MAX_HEAD: usize = 8192;

async fn answer(mut stream: TcpStream, metrics: Arc<NodeMetrics>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (status, kind, body) = match (parts.next(), parts.next()) {
        (Some("GET"), Some("/metrics")) => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        (Some("GET"), _) => ("404 Not Found", "text/plain", "try /metrics\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// Binds `addr`; the caller runs [`serve`] on the listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers scrapes until the task is dropped; each connection on a task
/// of its own with a 10 s bound.
pub async fn serve(listener: TcpListener, metrics: Arc<NodeMetrics>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let m = metrics.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, m)).await;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_and_moves() {
        let m = NodeMetrics::new();
        m.established(3);
        m.established(4);
        m.command("exec.run", "succeeded");
        m.section("devices", "progressing");
        m.cert_seconds_left.set(3600.5);
        let text = m.encode();
        for line in [
            "bcd_session_connected 1",
            "bcd_session_epoch 4",
            "bcd_sessions_total 2",
            "bcd_reconnects_total 1",
            "bcd_commands_total{kind=\"exec.run\",outcome=\"succeeded\"} 1",
            "bcd_convergence{section=\"devices\",status=\"progressing\"} 1",
            "bcd_convergence{section=\"devices\",status=\"ready\"} 0",
            "bcd_certificate_seconds_left 3600.5",
            concat!(
                "bcd_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"} 1"
            ),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[tokio::test]
    async fn scrapes_are_answered_over_http() {
        let m = Arc::new(NodeMetrics::new());
        m.connected.set(1);
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, m));
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("\r\n\r\n# HELP bcd_session_connected"), "{ok}");
        assert!(get("/").await.starts_with("HTTP/1.1 404"));
    }
}
