//! `better-compute serve`: process assembly. One process runs the gateway
//! and the join service (on the node listener), the operator API (on a
//! listener of its own, with the operator CA's serving certificate and
//! client certificates required), the controllers (each only while it
//! holds that controller's table lease) and (optionally) the boot endpoint
//! on one store; several such processes share a SQLite store file on one
//! host, or a PostgreSQL database from several hosts. This module opens the store,
//! loads the keys, binds the listeners and decides which loops run; the
//! logic lives in the modules it wires together.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bc_store::liveness::LivenessRules;
use bc_store::{GatewayId, GatewayStore, Location, Store, SystemClock};
use bcd_proto::tls;
use bcd_proto::v1::{
    admin_server::AdminServer, gateway_server::GatewayServer,
    gateway_services_server::GatewayServicesServer, join_server::JoinServer,
};
use ring::signature::KeyPair;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::api::auth::{Guarded, operator_credential};
use crate::api::gateway_port::GatewayPort;
use crate::api::join::{CertPolicy, JoinService};
use crate::api::{AdminService, MAX_REQUEST};
use crate::gateway::admission::HandshakeBucket;
use crate::gateway::credential::{self, GatewayCredential, ServingCert, UpstreamLink};
use crate::gateway::port::{GatewayServices, NodeJoin, Upstream};
use crate::gateway::{GatewayService, GatewayState, Timing};
use crate::http::Observed;
use crate::http::ready::Readiness;
use crate::metrics::ServerMetrics;
use crate::pki::{Ca, OperatorCa};

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub data_dir: PathBuf,
    /// The store: SQLite in the data directory, or PostgreSQL.
    pub store: Location,
    pub listen: SocketAddr,
    /// Balancers that send a PROXY protocol v2 header on `listen`.
    pub proxy_protocol_from: Vec<std::net::IpAddr>,
    /// The operator API's listener (the role holding the keys only).
    pub api_listen: SocketAddr,
    /// Extra names (DNS or IP) for the serving certificates.
    pub sans: Vec<String>,
    pub gateway_id: Option<String>,
    pub timing: Timing,
    pub certs: CertPolicy,
    /// ed25519 release public keys (raw 32 bytes each).
    pub release_keys: Vec<Vec<u8>>,
    /// The boot endpoint for netbooting nodes (off without a listen address).
    pub boot: crate::boot::BootOptions,
    /// The simulator's clock fault: milliseconds this process's wall clock
    /// is stepped by, read from this file each second ([`crate::clock`]).
    pub clock_offset_file: Option<PathBuf>,
    /// `/healthz`, `/readyz` and `/metrics` (off with `None`).
    pub http: Option<SocketAddr>,
    /// The web console (off with `None`; the key holder's only).
    pub console: Option<SocketAddr>,
    /// What this process runs.
    pub role: Role,
}

/// What a `serve` process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Everything, holding the keys: the gateway, the join service and
    /// its GatewayServices port, the operator API, the controllers and the
    /// boot endpoint. The keys sit behind the signer boundary: the gateway
    /// code reaches the join service only through its port.
    All,
    /// A gateway only, from a directory with no private key: node sessions
    /// on the store, joins and renewals relayed to the key-holding
    /// process named in the credential, releases from the store, the
    /// keyless controllers (liveness, the command sweeper).
    Gateway { credential: PathBuf },
}

/// The keys this process holds: all of them (and the whole store), or
/// none (and the store as a gateway sees it).
enum Keys {
    Held {
        store: Store,
        ca: Arc<Ca>,
        worker_key: Arc<ring::signature::Ed25519KeyPair>,
        tickets: Arc<crate::pki::tickets::TicketKey>,
    },
    None {
        serving: Arc<ServingCert>,
        link: UpstreamLink,
        ca: rustls_pki_types::CertificateDer<'static>,
    },
}

/// Connections the operator API holds open at once, handshakes included.
pub const MAX_API_CONNECTIONS: usize = 256;

/// The operator API's address when `--api-listen` is not given: the node
/// listener's IP and port + 1; an ephemeral port when that one is.
pub fn default_api_listen(listen: SocketAddr) -> SocketAddr {
    let port = match listen.port() {
        0 | u16::MAX => 0,
        p => p + 1,
    };
    SocketAddr::new(listen.ip(), port)
}

/// Streams one connection may have open at once.
pub const MAX_STREAMS: u32 = 16;

/// How often the key holder reads the sightings gateways recorded (the
/// clone watch, `controllers::clones`): a clone is quarantined, and a
/// renewed-away certificate superseded, within about this long.
pub const CLONE_WATCH_EVERY: Duration = Duration::from_millis(500);

/// The store file in a data directory.
pub fn store_path(data_dir: &Path) -> PathBuf {
    data_dir.join("store.db")
}

/// The store `--store` names (`postgres://...`, `sqlite:PATH`), else the
/// SQLite file in `data_dir`.
pub fn store_location(data_dir: &Path, store: Option<&str>) -> Location {
    store.map_or_else(|| Location::Sqlite(store_path(data_dir)), Location::parse)
}

/// Opens the store (creating or migrating it). Its clock is the host's
/// for SQLite, the database's for PostgreSQL.
pub async fn open_store(location: &Location) -> anyhow::Result<Store> {
    // The location shows without its address: errors never carry one.
    Store::open(location, Arc::new(SystemClock))
        .await
        .with_context(|| format!("cannot open {location}"))
}

/// Opens the store as a gateway: as it is (only the key holder creates
/// and migrates it), at this binary's schema version.
pub async fn open_gateway_store(location: &Location) -> anyhow::Result<GatewayStore> {
    GatewayStore::open(location, Arc::new(SystemClock))
        .await
        .with_context(|| format!("cannot open {location}"))
}

fn prepare(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))
}

/// Records the public keys this process checks releases and images with
/// (`keys.json`), for `better-compute doctor`.
fn record_keys(opts: &ServeOptions) -> anyhow::Result<()> {
    let doc = serde_json::json!({
        "release_pubkeys": opts.release_keys.iter().map(hex::encode).collect::<Vec<_>>(),
        "image_pubkeys": opts.boot.image_keys.iter().map(hex::encode).collect::<Vec<_>>(),
    });
    let path = opts.data_dir.join(crate::doctor::KEYS_FILE);
    let bytes = serde_json::to_vec_pretty(&doc).expect("plain data serializes");
    if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
        bcd_sys::fs::atomic_write(&path, &bytes, 0o644)
            .with_context(|| format!("cannot record the public keys in {}", path.display()))?;
    }
    Ok(())
}

/// Runs until `shutdown` resolves. Prints `api on ADDR` (the operator API,
/// where this process holds the keys), then `listening on ADDR as gateway
/// ID` (the node listener) on stdout once it accepts connections.
pub async fn serve(
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    prepare(&opts.data_dir)?;
    if let Some(file) = &opts.clock_offset_file {
        crate::clock::follow_offset_file(file.clone());
    }
    // Nothing starts on a half-restored control plane.
    crate::backup::journal::check_startable(&opts.data_dir)?;
    // The HTTP listener first: /healthz answers and /readyz says why not
    // while the rest starts.
    let metrics = Arc::new(ServerMetrics::new());
    let readiness = Arc::new(Readiness::new());
    let mut tasks = Vec::new();
    if let Some(listen) = opts.http {
        let listener = crate::http::bind(listen).await?;
        println!("http on {}", listener.local_addr()?);
        tasks.push(tokio::spawn(crate::http::serve(
            listener,
            Observed {
                metrics: metrics.clone(),
                readiness: readiness.clone(),
            },
        )));
    }
    // The key holder opens (creates, migrates) the whole store; a gateway
    // opens it as it is, and sees only what a gateway may do.
    let (full, store) = match &opts.role {
        Role::All => {
            let full = open_store(&opts.store).await?;
            // The reconcile: backups whose process died while writing them fail.
            crate::backup::reconcile(&full).await?;
            let store = full.gateway();
            (Some(full), store)
        }
        Role::Gateway { .. } => (None, open_gateway_store(&opts.store).await?),
    };
    tasks.push(tokio::spawn(crate::http::ready::probe(
        store.clone(),
        Store::schema_target(&opts.store),
        readiness.clone(),
    )));
    tasks.push(tokio::spawn(crate::metrics::refresh_commands(
        store.clone(),
        metrics.clone(),
    )));
    let now = store.now().await?;
    let mut sans = opts.sans.clone();
    if sans.is_empty() {
        sans = vec!["localhost".into(), opts.listen.ip().to_string()];
    }
    // The keys, for the role that holds them; a gateway gets its serving
    // certificate for a key made in memory.
    let keys = match (&opts.role, full) {
        (Role::All, Some(store)) => {
            let ca = Arc::new(Ca::load_or_create(&opts.data_dir, &sans, now).context("fleet CA")?);
            let worker_key = Arc::new(
                crate::pki::worker::load_or_create_worker_key(&opts.data_dir)
                    .context("worker signing key")?,
            );
            let tickets = Arc::new(
                crate::pki::tickets::TicketKey::load_or_create(&opts.data_dir)
                    .context("exec ticket key")?,
            );
            record_keys(&opts)?;
            metrics.ca_expiry.set(ca_expiry_s(&ca.cert));
            tasks.push(tokio::spawn(crate::metrics::refresh_fleet(
                store.clone(),
                metrics.clone(),
            )));
            Keys::Held {
                store,
                ca,
                worker_key,
                tickets,
            }
        }
        (Role::All, None) => unreachable!("the key holder opened the whole store"),
        (Role::Gateway { credential }, _) => {
            let cred = GatewayCredential::read(credential)?;
            let certified =
                credential::certify_at_start(&cred, &opts.sans, Duration::from_secs(60)).await?;
            let serving = ServingCert::new(&certified)?;
            let link = UpstreamLink::new(credential::upstream_channel(&cred, &certified).await?);
            let ca = cred.ca()?;
            tasks.push(tokio::spawn(credential::keep_certified(
                cred,
                opts.sans.clone(),
                certified,
                serving.clone(),
                link.clone(),
            )));
            Keys::None { serving, link, ca }
        }
    };
    let listener = TcpListener::bind(opts.listen)
        .await
        .with_context(|| format!("cannot listen on {}", opts.listen))?;
    let addr = listener.local_addr()?;

    let gateway_id = opts
        .gateway_id
        .clone()
        .unwrap_or_else(|| format!("gw-{:08x}", rand::random::<u32>()));
    let gw = GatewayState::new(
        GatewayId::from(gateway_id.clone()),
        store.clone(),
        opts.timing,
        now,
        metrics.clone(),
    );
    {
        let gw = gw.clone();
        readiness.watch_lease(Box::new(move || !gw.is_fenced()));
    }
    {
        let gw = gw.clone();
        readiness.watch_draining(Box::new(move || gw.is_draining()));
    }
    // Hold the lease before admitting anyone.
    match store
        .renew_lease(&gw.lease_name(), &gateway_id, opts.timing.gateway_lease_ttl)
        .await?
    {
        Some(now) => gw.clock.anchor(now),
        None => anyhow::bail!("gateway id {gateway_id} is held by another live gateway"),
    }
    // The key holder reconciles what a crash may have left before anything
    // else runs (and audits it); a gateway's controllers converge the same
    // on their first pass, under its narrower grants.
    if let Keys::Held { store: full, .. } = &keys {
        let reconciled = full
            .reconcile(&gateway_id, opts.timing.gateway_loss_grace)
            .await
            .context("cannot reconcile the store at start")?;
        info!(
            leases_removed = reconciled.leases_removed.len(),
            derived_fixed = reconciled.derived_fixed.len(),
            routes_to_dead_gateways = reconciled.routes_to_dead_gateways,
            commands_held_by_away_nodes = reconciled.commands_held_by_away_nodes,
            rollouts_running = reconciled.rollouts_running,
            "reconciled"
        );
    }
    let rollouts = Arc::new(tokio::sync::Notify::new());
    let gateway_revocations = Arc::new(tokio::sync::Notify::new());
    let rules = LivenessRules {
        node_lease_ttl: opts.timing.node_lease_ttl,
        gateway_loss_grace: opts.timing.gateway_loss_grace,
        outage_gap: opts.timing.outage_gap,
        outage_hold: opts.timing.outage_hold,
    };
    let leases = crate::controllers::Leases {
        owner: gateway_id.clone(),
        ttl: opts.timing.controller_lease_ttl,
    };
    // Controllers give their leases up on an orderly stop.
    let (stop_controllers, controllers_stop) = tokio::sync::watch::channel(false);
    let mut controllers = vec![
        tokio::spawn(crate::controllers::run_liveness(
            store.clone(),
            rules,
            opts.timing.sweep_every,
            leases.clone(),
            controllers_stop.clone(),
            metrics.clone(),
        )),
        tokio::spawn(crate::controllers::run_sweeper(
            store.clone(),
            opts.timing.sweep_every,
            opts.timing.gateway_loss_grace,
            leases.clone(),
            controllers_stop.clone(),
        )),
    ];
    // The controllers that sign run where the worker key is.
    if let Keys::Held {
        worker_key,
        store: full,
        ca,
        tickets,
    } = &keys
    {
        controllers.extend([
            tokio::spawn(crate::controllers::run_history(
                full.clone(),
                leases.clone(),
                controllers_stop.clone(),
            )),
            tokio::spawn(crate::controllers::run_rollouts(
                full.clone(),
                worker_key.clone(),
                Arc::new(ca.cert.to_vec()),
                gw.clone(),
                rollouts.clone(),
                leases.clone(),
                controllers_stop.clone(),
            )),
            tokio::spawn(crate::controllers::run_clones(
                full.clone(),
                worker_key.clone(),
                Arc::new(ca.cert.to_vec()),
                CLONE_WATCH_EVERY,
                leases.clone(),
                controllers_stop.clone(),
            )),
            tokio::spawn(crate::controllers::run_receipts(
                full.clone(),
                worker_key.clone(),
                Arc::new(ca.cert.to_vec()),
                leases.clone(),
                controllers_stop.clone(),
            )),
            tokio::spawn(crate::controllers::run_gateway_revocations(
                full.clone(),
                worker_key.clone(),
                opts.certs.gateway_revocations_life,
                gateway_revocations.clone(),
                leases.clone(),
                controllers_stop.clone(),
            )),
            tokio::spawn(crate::controllers::run_specs(
                full.clone(),
                worker_key.clone(),
                tickets.clone(),
                gw.clone(),
                leases,
                controllers_stop,
            )),
        ]);
    }
    tasks.extend([
        tokio::spawn(crate::gateway::lease::keep(gw.clone())),
        tokio::spawn(crate::gateway::feeds::liveness(gw.clone())),
        tokio::spawn(crate::gateway::feeds::revocations(
            gw.clone(),
            Duration::from_millis(250),
        )),
        tokio::spawn(crate::gateway::feeds::work(gw.clone())),
        tokio::spawn(crate::gateway::ends::run(gw.clone())),
    ]);

    let config = match &keys {
        Keys::Held { ca, .. } => {
            tls::server_config(ca.serving_chain.clone(), ca.serving_key(), ca.cert.clone())?
        }
        Keys::None { serving, ca, .. } => {
            tls::server_config_resolving(serving.clone(), ca.clone())?
        }
    };
    let incoming = tls::incoming(
        listener,
        config,
        Arc::new(HandshakeBucket::new(
            opts.timing.handshake_rate,
            opts.timing.handshake_rate_per_address,
            metrics.clone(),
        )),
        tls::ConnectionCaps {
            total: opts.timing.max_connections,
            per_address: opts.timing.max_connections_per_address,
            balancers: opts.proxy_protocol_from.clone(),
        },
    );
    let node_join = |services: Arc<dyn GatewayServices>| {
        JoinServer::new(NodeJoin {
            services,
            store: store.clone(),
        })
        .max_encoding_message_size(MAX_REQUEST)
    };
    let mut router = tonic::transport::Server::builder()
        // A node holds one session stream and makes the odd unary call: a
        // connection gets a few streams, not the HTTP/2 default of
        // unlimited.
        .max_concurrent_streams(Some(MAX_STREAMS))
        .http2_keepalive_interval(Some(tls::KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(tls::KEEPALIVE_INTERVAL))
        .add_service(GatewayServer::new(GatewayService { state: gw.clone() }));
    let mut api = None;
    match &keys {
        Keys::Held {
            store,
            ca,
            worker_key,
            tickets,
        } => {
            let mut api_sans = opts.sans.clone();
            if api_sans.is_empty() {
                api_sans = vec!["localhost".into(), opts.api_listen.ip().to_string()];
            }
            let remote_tunnels = Arc::new(crate::api::tunnels::RemoteTunnels::default());
            let operator_ca = Arc::new(
                OperatorCa::load_or_create(&opts.data_dir, &api_sans, now)
                    .context("operator CA")?,
            );
            let api_listener = TcpListener::bind(opts.api_listen).await.with_context(|| {
                format!(
                    "cannot listen on {} for the operator API (choose another with --api-listen)",
                    opts.api_listen
                )
            })?;
            let api_addr = api_listener.local_addr()?;
            let console_listener = match opts.console {
                Some(at) => Some(TcpListener::bind(at).await.with_context(|| {
                    format!(
                        "cannot listen on {at} for the web console (choose another with \
                         --console-listen, or off)"
                    )
                })?),
                None => None,
            };
            let console_url = match &console_listener {
                Some(l) => Some(format!("https://{}/", l.local_addr()?)),
                None => None,
            };
            operator_credential(&opts.data_dir, store, &operator_ca, api_addr).await?;
            let secrets_key = Arc::new(
                crate::pki::secrets::SecretsKey::load_or_create(&opts.data_dir)
                    .context("secrets key")?,
            );
            let join = JoinService {
                secrets_key: secrets_key.clone(),
                tickets: tickets.clone(),
                store: store.clone(),
                ca: ca.clone(),
                policy: opts.certs,
                worker_keys: Arc::new(vec![worker_key.public_key().as_ref().to_vec()]),
                worker_key: worker_key.clone(),
                release_keys: Arc::new(opts.release_keys.clone()),
                image_keys: Arc::new(opts.boot.image_keys.clone()),
                seal: Arc::new(ca.token_seal_key()),
                secret_requests: Arc::default(),
            };
            // The operator certificates this key holder knows revoked: what
            // it remembered, and every signed revocation in the store now.
            let revoked_operators =
                Arc::new(crate::api::revoked_operators::RevokedOperators::open(
                    &opts.data_dir,
                    vec![worker_key.public_key().as_ref().to_vec()],
                )?);
            for row in store.list_operators().await? {
                if let Some(statement) = &row.revocation
                    && let Err(why) = revoked_operators.learn(statement)
                {
                    warn!(operator = %row.id, %why, "an operator row carries a revocation no worker key signed");
                }
            }
            let admin = AdminService {
                store: store.clone(),
                ca_pin: ca.fingerprint(),
                seal_key: ca.token_seal_key().public(),
                ca_der: Arc::new(ca.cert.to_vec()),
                secrets: ca.secret_digest(),
                worker_key: worker_key.clone(),
                ticket_key: tickets.clone(),
                secrets_key,
                release_keys: Arc::new(opts.release_keys.clone()),
                image_keys: Arc::new(opts.boot.image_keys.clone()),
                gateway: Some(gw.clone()),
                tunnels: Some(Arc::new(crate::api::tunnels::Relays {
                    local: Some(gw.clone()),
                    remote: remote_tunnels.clone(),
                })),
                open_tunnels: Arc::default(),
                remote_gateways: remote_tunnels.clone(),
                rollouts,
                gateway_revocations,
                operator_ca: operator_ca.clone(),
                revoked_operators: revoked_operators.clone(),
                console_url: console_url.clone(),
            };
            if let (Some(listener), Some(url)) = (console_listener, &console_url) {
                let config = tls::server_config_browser(
                    operator_ca.serving_chain.clone(),
                    operator_ca.serving_key(),
                    operator_ca.cert.clone(),
                )?;
                let console = Arc::new(crate::console::Console {
                    admin: admin.clone(),
                    keys: vec![worker_key.public_key().as_ref().to_vec()],
                    revoked: revoked_operators.clone(),
                });
                tasks.push(tokio::spawn(crate::console::serve(
                    listener, config, console,
                )));
                println!(
                    "console on {}",
                    url.trim_start_matches("https://").trim_end_matches('/')
                );
                info!(%url, "web console");
            }
            // The operator API: its own listener, the operator CA's serving
            // certificate, a client certificate from the operator CA
            // required. No fleet certificate opens it, and the node
            // listener has no Admin.
            let api_config = tls::server_config_mutual(
                operator_ca.serving_chain.clone(),
                operator_ca.serving_key(),
                operator_ca.cert.clone(),
            )?;
            let api_incoming = tls::incoming(
                api_listener,
                api_config,
                Arc::new(tls::AdmitAll),
                tls::ConnectionCaps {
                    total: MAX_API_CONNECTIONS,
                    per_address: MAX_API_CONNECTIONS,
                    balancers: Vec::new(),
                },
            );
            let (api_stop_tx, api_stop_rx) = tokio::sync::oneshot::channel::<()>();
            let api_server = tonic::transport::Server::builder()
                .max_concurrent_streams(Some(MAX_STREAMS))
                .http2_keepalive_interval(Some(tls::KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(tls::KEEPALIVE_INTERVAL))
                .add_service(Guarded::new(
                    AdminServer::new(admin).max_decoding_message_size(MAX_REQUEST),
                    store.clone(),
                    revoked_operators,
                ))
                .serve_with_incoming_shutdown(api_incoming, async {
                    let _ = api_stop_rx.await;
                });
            api = Some((tokio::spawn(api_server), api_stop_tx));
            println!("api on {api_addr}");
            info!(addr = %api_addr, "operator API");
            if let Some((boot_addr, task)) = crate::boot::start(
                opts.boot.clone(),
                store.clone(),
                (
                    ca.fingerprint(),
                    ca.token_seal_key().public(),
                    ca.secret_digest(),
                ),
            )
            .await?
            {
                println!("boot endpoint on {boot_addr}");
                tasks.push(task);
            }
            router = router
                .add_service(node_join(Arc::new(join.clone())))
                .add_service(GatewayServicesServer::new(GatewayPort {
                    join,
                    tunnels: remote_tunnels,
                }));
            info!(%addr, gateway = %gateway_id, ca = %ca.fingerprint(), "serving");
        }
        Keys::None { link, .. } => {
            tasks.push(tokio::spawn(crate::gateway::tunnels::upstream(
                gw.clone(),
                link.clone(),
            )));
            router = router.add_service(node_join(Arc::new(Upstream { link: link.clone() })));
            info!(%addr, gateway = %gateway_id, "serving as a gateway holding no key");
        }
    }
    println!("listening on {addr} as gateway {gateway_id}");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = router.serve_with_incoming_shutdown(incoming, async {
        let _ = stop_rx.await;
    });
    let server = tokio::spawn(server);
    readiness.started();
    crate::systemd::ready();
    if let Some(watchdog) = crate::systemd::spawn_watchdog() {
        tasks.push(watchdog);
    }
    shutdown.await;
    info!("shutting down");
    crate::systemd::stopping();
    let _ = stop_controllers.send(true);
    for c in controllers {
        let _ = tokio::time::timeout(Duration::from_secs(2), c).await;
    }
    gw.shutdown().await;
    let _ = stop_tx.send(());
    let mut servers = vec![("server", server)];
    if let Some((api_server, api_stop_tx)) = api {
        let _ = api_stop_tx.send(());
        servers.push(("operator API", api_server));
    }
    for (name, server) in servers {
        match tokio::time::timeout(Duration::from_secs(5), server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => warn!(error = %e, "{name} ended with an error"),
            _ => warn!("{name} did not stop within 5s"),
        }
    }
    for t in tasks.drain(..) {
        t.abort();
    }
    Ok(())
}

/// When a certificate runs out, in Unix seconds (0 when it does not parse).
fn ca_expiry_s(der: &[u8]) -> f64 {
    use x509_parser::prelude::FromDer;
    x509_parser::certificate::X509Certificate::from_der(der)
        .map_or(0.0, |(_, c)| c.validity().not_after.timestamp() as f64)
}
