//! `better-compute serve`: the gateway, join service, operator API and
//! liveness controller in one process on the embedded store.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bcd_proto::tls;
use bcd_proto::v1::{
    admin_server::AdminServer, gateway_server::GatewayServer, join_server::JoinServer,
};
use ring::signature::KeyPair;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::admin::{AdminService, OperatorAuth};
use crate::ca::Ca;
use crate::files;
use crate::gateway::{GatewayService, GatewayState, Timing};
use crate::joinsvc::{CertPolicy, JoinService};
use crate::store::{LivenessRules, Store};

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Extra names (DNS or IP) for the serving certificate.
    pub sans: Vec<String>,
    pub gateway_id: Option<String>,
    pub timing: Timing,
    pub certs: CertPolicy,
    /// ed25519 release public keys (raw 32 bytes each).
    pub release_keys: Vec<Vec<u8>>,
    /// The boot endpoint for netbooting nodes (off without a listen address).
    pub boot: crate::boot::BootOptions,
}

/// What `operator.json` holds: how the CLI reaches and proves itself to the
/// API. Readable by its owner only.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OperatorCredential {
    pub server: String,
    pub ca_pem: String,
    pub token: String,
}

pub const OPERATOR_FILE: &str = "operator.json";

fn prepare(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))
}

fn pem(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ascii"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Writes the operator credential on first start; afterwards keeps its
/// server address current. Returns the operator token hashes.
fn operator_credential(
    dir: &Path,
    store: &Store,
    ca: &Ca,
    addr: SocketAddr,
) -> anyhow::Result<HashSet<String>> {
    let path = dir.join(OPERATOR_FILE);
    let server = format!("https://{addr}");
    let cred = if path.exists() {
        let mut c: OperatorCredential = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is corrupt", path.display()))?;
        if c.server != server {
            c.server = server;
            files::write_atomic(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
        }
        c
    } else {
        let token = format!(
            "bco1.{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        );
        store.add_operator("admin", &bcd_proto::fingerprint(token.as_bytes()))?;
        let c = OperatorCredential {
            server,
            ca_pem: pem(&ca.cert),
            token,
        };
        files::write_atomic(&path, &serde_json::to_vec_pretty(&c)?, 0o600)?;
        info!(path = %path.display(), "wrote the operator credential");
        c
    };
    let mut hashes = HashSet::new();
    hashes.insert(bcd_proto::fingerprint(cred.token.as_bytes()));
    Ok(hashes)
}

/// Runs until `shutdown` resolves. Prints `listening on ADDR` on stdout once
/// it accepts connections.
pub async fn serve(
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    prepare(&opts.data_dir)?;
    let store = Store::open(&opts.data_dir.join("store.db"))
        .with_context(|| format!("cannot open the store in {}", opts.data_dir.display()))?;
    let now = store.now()?;
    let mut sans = opts.sans.clone();
    if sans.is_empty() {
        sans = vec!["localhost".into(), opts.listen.ip().to_string()];
    }
    let ca = Arc::new(Ca::load_or_create(&opts.data_dir, &sans, now).context("fleet CA")?);
    let worker_key = Arc::new(
        crate::ca::load_or_create_worker_key(&opts.data_dir).context("worker signing key")?,
    );
    let listener = TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let addr = listener.local_addr()?;
    let operators = operator_credential(&opts.data_dir, &store, &ca, addr)?;

    let gateway_id = opts
        .gateway_id
        .clone()
        .unwrap_or_else(|| format!("gw-{:08x}", rand::random::<u32>()));
    let lease_store = Store::open(&opts.data_dir.join("store.db"))
        .context("cannot open the store for the gateway lease")?;
    let gw = GatewayState::new(
        gateway_id.clone(),
        store.clone(),
        lease_store,
        opts.timing,
        now,
    );
    // Hold the lease before admitting anyone.
    match store.renew_lease(&gw.lease_name(), &gateway_id, opts.timing.gateway_lease_ttl)? {
        Some(now) => gw.clock.anchor(now),
        None => anyhow::bail!("gateway id {gateway_id} is held by another live gateway"),
    }
    let rollouts = Arc::new(tokio::sync::Notify::new());
    let mut tasks = vec![
        tokio::spawn(gw.clone().lease_loop()),
        tokio::spawn(gw.clone().liveness_loop()),
        tokio::spawn(gw.clone().revocation_loop(Duration::from_millis(250))),
        tokio::spawn(gw.clone().work_loop()),
        tokio::spawn(liveness_controller(store.clone(), opts.timing)),
        tokio::spawn(rollout_controller(
            store.clone(),
            worker_key.clone(),
            gw.clone(),
            rollouts.clone(),
        )),
    ];

    let config = tls::server_config(ca.serving_chain.clone(), ca.serving_key(), ca.cert.clone())?;
    let incoming = tls::incoming(
        listener,
        config,
        Arc::new(HandshakeBucket::new(opts.timing.handshake_rate)),
    );
    let join = JoinService {
        store: store.clone(),
        ca: ca.clone(),
        policy: opts.certs,
        worker_keys: Arc::new(vec![worker_key.public_key().as_ref().to_vec()]),
        release_keys: Arc::new(opts.release_keys.clone()),
    };
    let admin = AdminService {
        store: store.clone(),
        ca_pin: ca.fingerprint(),
        worker_key: worker_key.clone(),
        release_keys: Arc::new(opts.release_keys.clone()),
        image_keys: Arc::new(opts.boot.image_keys.clone()),
        gateway: Some(gw.clone()),
        rollouts,
    };
    let auth = OperatorAuth {
        token_hashes: Arc::new(operators),
    };
    if let Some((boot_addr, task)) = crate::boot::start(opts.boot.clone(), store.clone()).await? {
        println!("boot endpoint on {boot_addr}");
        tasks.push(task);
    }
    println!("listening on {addr} as gateway {gateway_id}");
    info!(%addr, gateway = %gateway_id, ca = %ca.fingerprint(), "serving");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(tls::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(tls::KEEPALIVE_INTERVAL))
        .add_service(GatewayServer::new(GatewayService { state: gw.clone() }))
        .add_service(JoinServer::new(join).max_encoding_message_size(crate::admin::MAX_REQUEST))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            AdminServer::new(admin).max_decoding_message_size(crate::admin::MAX_REQUEST),
            auth,
        ))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    let server = tokio::spawn(server);
    shutdown.await;
    info!("shutting down");
    gw.shutdown().await;
    let _ = stop_tx.send(());
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "server ended with an error"),
        _ => warn!("server did not stop within 5s"),
    }
    for t in tasks.drain(..) {
        t.abort();
    }
    Ok(())
}

/// A token bucket of TLS handshakes: `rate` a second, bursts up to `rate`.
/// Time is a parameter, so the arithmetic is tested without sleeping.
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

/// The gateway's handshake admission: a connection over the bucket is
/// closed before its handshake; the node backs off and retries.
#[derive(Debug)]
struct HandshakeBucket {
    start: std::time::Instant,
    bucket: std::sync::Mutex<TokenBucket>,
    refused: std::sync::atomic::AtomicU64,
}

impl HandshakeBucket {
    fn new(rate: u32) -> HandshakeBucket {
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

/// The rollout controller: walks running rollouts every second, or at once
/// when an operator starts or changes one.
async fn rollout_controller(
    store: Store,
    key: Arc<ring::signature::Ed25519KeyPair>,
    gw: Arc<GatewayState>,
    wake: Arc<tokio::sync::Notify>,
) {
    loop {
        let k = key.clone();
        match store.run(move |s| crate::rollouts::tick(s, &k)).await {
            Ok(woken) => {
                for n in woken {
                    gw.wake(&n);
                }
            }
            Err(e) => warn!(error = %format!("{e:#}"), "rollout pass failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = wake.notified() => {}
        }
    }
}

/// The liveness controller: sweeps session states on the store's clock.
async fn liveness_controller(store: Store, timing: Timing) {
    let rules = LivenessRules {
        node_lease_ttl: timing.node_lease_ttl,
        gateway_loss_grace: timing.gateway_loss_grace,
        outage_gap: timing.outage_gap,
        outage_hold: timing.outage_hold,
    };
    let mut tick = tokio::time::interval(timing.sweep_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_held = false;
    loop {
        tick.tick().await;
        match store.run(move |s| s.sweep_liveness(&rules)).await {
            Ok(out) => {
                if out.held != was_held {
                    if out.held {
                        warn!("a liveness sweep gap: holding timed transitions");
                    } else {
                        info!("liveness hold over");
                    }
                    was_held = out.held;
                }
                for n in &out.disconnected {
                    info!(node = %n, "node disconnected: its gateway's lease expired");
                }
                for n in &out.unreachable {
                    info!(node = %n, "node unreachable");
                }
            }
            Err(e) => warn!(error = %format!("{e:#}"), "liveness sweep failed"),
        }
        match store.run(|s| s.sweep_commands()).await {
            Ok(expired) => {
                for id in expired {
                    info!(cmd = %id, "command expired before dispatch");
                }
            }
            Err(e) => warn!(error = %format!("{e:#}"), "command sweep failed"),
        }
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
