//! `better-compute serve`.

use std::path::PathBuf;
use std::time::Duration;

use super::dur;
use crate::api::join::CertPolicy;
use crate::gateway::Timing;
use crate::serve::{Role, ServeOptions};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    /// Everything in one process, holding the keys.
    All,
    /// A gateway only, holding no key (needs --credential).
    Gateway,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute serve --listen 0.0.0.0:7443 --api-listen 10.0.0.5:7444\n  better-compute serve --config /etc/better-compute/serve.toml\n  better-compute --store postgres://bc@db/bc serve --role gateway --credential edge-1.json"
)]
pub struct ServeArgs {
    /// A TOML file of serve's flags (`handshake-rate = 500`): the keys are
    /// the flags' long names; the command line and `BC_*` variables
    /// override it; an unknown key is an error.
    #[arg(long, env = crate::cli::config::CONFIG_VAR)]
    config: Option<PathBuf>,
    /// What this process runs.
    #[arg(long, value_enum, default_value_t = RoleArg::All)]
    role: RoleArg,
    /// For --role gateway: the credential from `better-compute gateways add`.
    #[arg(long, required_if_eq("role", "gateway"))]
    credential: Option<PathBuf>,
    /// Where nodes connect: the gateway and the join service.
    #[arg(long, default_value = "127.0.0.1:7443")]
    listen: std::net::SocketAddr,
    /// Where operators connect: the Admin API, with client certificates
    /// from the operator CA. By default the --listen IP, its port + 1
    /// (127.0.0.1:7444); an ephemeral port when --listen's is 0.
    #[arg(long)]
    api_listen: Option<std::net::SocketAddr>,
    /// Extra DNS names or IPs for the serving certificates (the gateway's
    /// and the API's).
    #[arg(long = "san")]
    sans: Vec<String>,
    /// This process's gateway id in the store (one per live process; a
    /// random `gw-XXXXXXXX` by default). Give each of several processes
    /// its own, kept across restarts, so logs, metrics and the store name
    /// it the same way.
    #[arg(long)]
    gateway_id: Option<String>,
    /// How often nodes send heartbeats; three missed close a session.
    #[arg(long, default_value = "10s", value_parser = dur)]
    heartbeat_interval: Duration,
    /// How long this gateway's lease lasts unrenewed; it fences at half of it.
    #[arg(long, default_value = "20s", value_parser = dur)]
    gateway_lease_ttl: Duration,
    /// How long a node without heartbeats stays connected.
    #[arg(long, default_value = "40s", value_parser = dur)]
    node_lease_ttl: Duration,
    /// How long nodes of a lost gateway have to reconnect before they are marked unreachable.
    #[arg(long, default_value = "120s", value_parser = dur)]
    gateway_loss_grace: Duration,
    /// TLS handshakes admitted per second (a token bucket; bursts up to
    /// the same number).
    #[arg(long, default_value_t = 200)]
    handshake_rate: u32,
    /// Of those, how many one source address gets a second (its own
    /// bucket, bursts up to the same number; an IPv6 address counts with
    /// its /64): a flood from one address leaves the rest of the bucket to
    /// everyone else. Refusals are counted in `handshakes_total` with
    /// `outcome="address_rate"`. Behind a NAT or a balancer that does not
    /// pass the client's address (see --proxy-protocol-from), raise it to
    /// --handshake-rate.
    #[arg(long, default_value_t = crate::gateway::admission::DEFAULT_HANDSHAKE_RATE_PER_ADDRESS)]
    handshake_rate_per_address: u32,
    /// The address of a layer-4 load balancer in front of this gateway that
    /// sends a PROXY protocol v2 header (HAProxy's `send-proxy-v2`, an AWS
    /// NLB's proxy protocol v2) ahead of each connection; repeat it, or
    /// separate addresses with commas, for several. A connection from one
    /// of them must start with the header, and the client's address in it
    /// is the one the per-address caps and rates count; a connection from
    /// any other address is read as plain TLS.
    #[arg(long, value_delimiter = ',', value_name = "ADDRESS")]
    proxy_protocol_from: Vec<std::net::IpAddr>,
    /// Hello transactions a second this gateway takes: with the handshake
    /// rate, it sizes the window nodes spread their first redial over.
    #[arg(long, default_value_t = 2000)]
    hello_capacity: u32,
    /// Hello transactions this gateway runs at once; more wait their turn
    /// for up to 5 s and are then refused busy (the node backs off).
    #[arg(long, default_value_t = crate::gateway::DEFAULT_MAX_PENDING_HELLOS as u32, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_pending_hellos: u32,
    /// Connections this process holds open at once, TLS handshakes
    /// included (each node holds one); more are closed as they arrive.
    #[arg(long, default_value_t = 20_000)]
    max_connections: usize,
    /// Of those, how many one source address holds (an IPv6 address counts
    /// with its /64); more are closed as they arrive and counted in the
    /// `connections_over_address_cap` metric. Behind a layer-4 load
    /// balancer that does not pass the client's address on, every node
    /// arrives from the balancer's few addresses: set this to
    /// --max-connections there.
    #[arg(long, default_value_t = crate::gateway::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    max_connections_per_address: usize,
    /// On shutdown, nodes are told to reconnect at random within this.
    #[arg(long, default_value = "60s", value_parser = dur)]
    drain_within: Duration,
    /// The controllers' table leases: one process at a time runs each of
    /// the liveness controller, the command sweeper and rollouts.
    #[arg(long, default_value = "15s", value_parser = dur)]
    controller_lease_ttl: Duration,
    /// How long a node certificate is valid (renewed at two thirds).
    #[arg(long, default_value = "24h", value_parser = dur)]
    node_cert_ttl: Duration,
    /// How long a ramdisk node's certificate is valid (it joins again at every boot).
    #[arg(long, default_value = "2h", value_parser = dur)]
    ramdisk_cert_ttl: Duration,
    /// How long a signed list of revoked gateway certificates holds: a
    /// node leaves a gateway that hands it no newer list within this (the
    /// key holder signs one every tenth of it). For the process that holds
    /// the fleet CA.
    #[arg(long, default_value = "10m", value_parser = dur)]
    gateway_revocations_life: Duration,
    /// The x509pop attestor: a node whose certificate ran out while it was
    /// offline renews by proving the old certificate's key, within 7 days
    /// of its end and unless it was revoked (without it, such a node joins
    /// again with a token). For the process that holds the fleet CA.
    #[arg(long)]
    x509pop: bool,
    /// A release public key (hex, from releases keygen); repeatable.
    #[arg(long = "release-pubkey")]
    release_pubkeys: Vec<String>,
    /// `/healthz`, `/readyz` and `/metrics` over plain HTTP on this
    /// address (loopback by default; `off` for none).
    #[arg(long, default_value = crate::http::DEFAULT_LISTEN, env = "BC_HTTP_LISTEN")]
    http_listen: String,
    /// The read-only web console over HTTPS on this address (`off` by
    /// default), for the role holding the keys: sign in with a token from
    /// `better-compute operators login`, or a browser's operator
    /// certificate.
    #[arg(long, default_value = "off", value_name = "ADDR")]
    console_listen: String,
    #[command(flatten)]
    boot: crate::boot::BootOptions,
    /// For the simulator's clock faults: a file holding how many
    /// milliseconds this process's own clock is off.
    #[arg(long, hide = true)]
    clock_offset_file: Option<PathBuf>,
}

pub async fn run(a: ServeArgs, data_dir: PathBuf, store: Option<String>) -> anyhow::Result<()> {
    let release_keys = a
        .release_pubkeys
        .iter()
        .map(|k| {
            hex::decode(k.trim())
                .ok()
                .filter(|b| b.len() == 32)
                .ok_or_else(|| anyhow::anyhow!("--release-pubkey takes 64 hex digits, not {k:?}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let http = crate::http::parse_listen(&a.http_listen).map_err(anyhow::Error::msg)?;
    let console = crate::console::parse_listen(&a.console_listen).map_err(anyhow::Error::msg)?;
    let role = match (a.role, a.credential) {
        (RoleArg::All, None) => Role::All,
        (RoleArg::All, Some(_)) => {
            anyhow::bail!("--credential is for --role gateway; the default role holds the keys")
        }
        (RoleArg::Gateway, Some(_)) if a.api_listen.is_some() => anyhow::bail!(
            "--api-listen is for the role holding the keys: a gateway serves no operator API"
        ),
        (RoleArg::Gateway, Some(_)) if console.is_some() => anyhow::bail!(
            "--console-listen is for the role holding the keys: a gateway serves no console"
        ),
        (RoleArg::Gateway, Some(credential)) => Role::Gateway { credential },
        (RoleArg::Gateway, None) => anyhow::bail!(
            "--role gateway needs --credential FILE (from better-compute gateways add)"
        ),
    };
    let timing = Timing {
        heartbeat: a.heartbeat_interval,
        gateway_lease_ttl: a.gateway_lease_ttl,
        node_lease_ttl: a.node_lease_ttl,
        gateway_loss_grace: a.gateway_loss_grace,
        handshake_rate: a.handshake_rate,
        handshake_rate_per_address: a.handshake_rate_per_address,
        drain_within: a.drain_within,
        controller_lease_ttl: a.controller_lease_ttl,
        hello_capacity: a.hello_capacity,
        max_pending_hellos: a.max_pending_hellos as usize,
        max_connections: a.max_connections,
        max_connections_per_address: a.max_connections_per_address,
        ..Timing::default()
    };
    crate::serve::serve(
        ServeOptions {
            store: crate::serve::store_location(&data_dir, store.as_deref()),
            data_dir,
            api_listen: a
                .api_listen
                .unwrap_or_else(|| crate::serve::default_api_listen(a.listen)),
            listen: a.listen,
            proxy_protocol_from: a.proxy_protocol_from,
            sans: a.sans,
            gateway_id: a.gateway_id,
            timing,
            certs: CertPolicy {
                node_ttl: a.node_cert_ttl,
                ramdisk_ttl: a.ramdisk_cert_ttl,
                x509pop: a.x509pop,
                gateway_revocations_life: a.gateway_revocations_life,
            },
            release_keys,
            boot: a.boot,
            clock_offset_file: a.clock_offset_file,
            http,
            console,
            role,
        },
        super::shutdown_signal(),
    )
    .await
}
