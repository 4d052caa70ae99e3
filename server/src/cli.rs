//! The command line: `serve` and the operator verbs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bcd_proto::v1::{CreateTokenRequest, DeleteNodeRequest, ListNodesRequest};
use clap::{Parser, Subcommand};

use crate::client;
use crate::gateway::Timing;
use crate::joinsvc::CertPolicy;
use crate::serve::{self, ServeOptions};

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly
/// instead of panicking.
fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// `println!` that goes through [`emit`].
macro_rules! out {
    ($($arg:tt)*) => {
        emit(&format!("{}\n", format_args!($($arg)*)))?
    };
}

#[derive(Debug, Parser)]
#[command(
    name = "better-compute",
    version,
    about = "The better-compute control plane"
)]
struct Cli {
    /// The server's data directory (store, CA, operator credential).
    #[arg(
        long,
        global = true,
        default_value = "/var/lib/better-compute",
        env = "BC_DATA_DIR"
    )]
    data_dir: PathBuf,
    /// The operator credential; defaults to operator.json in --data-dir.
    #[arg(long, global = true, env = "BC_OPERATOR")]
    operator: Option<PathBuf>,
    /// Override the server address in the operator credential.
    #[arg(long, global = true, env = "BC_SERVER")]
    server: Option<String>,
    #[command(subcommand)]
    command: Command,
}

fn dur(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane: gateway, join service, API and liveness.
    Serve {
        #[arg(long, default_value = "127.0.0.1:7443")]
        listen: std::net::SocketAddr,
        /// Extra DNS names or IPs for the serving certificate.
        #[arg(long = "san")]
        sans: Vec<String>,
        #[arg(long)]
        gateway_id: Option<String>,
        /// How often nodes send heartbeats; three missed close a session.
        #[arg(long, default_value = "10s", value_parser = dur)]
        heartbeat_interval: Duration,
        #[arg(long, default_value = "20s", value_parser = dur)]
        gateway_lease_ttl: Duration,
        #[arg(long, default_value = "40s", value_parser = dur)]
        node_lease_ttl: Duration,
        #[arg(long, default_value = "120s", value_parser = dur)]
        gateway_loss_grace: Duration,
        /// TLS handshakes admitted per second (a token bucket; bursts up to
        /// the same number).
        #[arg(long, default_value_t = 200)]
        handshake_rate: u32,
        /// On shutdown, nodes are told to reconnect at random within this.
        #[arg(long, default_value = "60s", value_parser = dur)]
        drain_within: Duration,
        #[arg(long, default_value = "24h", value_parser = dur)]
        node_cert_ttl: Duration,
        #[arg(long, default_value = "2h", value_parser = dur)]
        ramdisk_cert_ttl: Duration,
        /// A release public key (hex, from releases keygen); repeatable.
        #[arg(long = "release-pubkey")]
        release_pubkeys: Vec<String>,
        #[command(flatten)]
        boot: crate::boot::BootOptions,
    },
    /// Signed releases of bcd.
    Releases {
        #[command(subcommand)]
        command: ReleasesCommand,
    },
    /// Join tokens.
    Tokens {
        #[command(subcommand)]
        command: TokensCommand,
    },
    /// Nodes of the fleet.
    Nodes {
        #[command(subcommand)]
        command: NodesCommand,
    },
    /// Signed commands, run exactly once on a node.
    Commands {
        #[command(subcommand)]
        command: CommandsCommand,
    },
    /// Roll a release out to the fleet in waves.
    Rollouts {
        #[command(subcommand)]
        command: RolloutsCommand,
    },
    /// Netboot images: build, register, and choose what machines boot.
    Images {
        #[command(subcommand)]
        command: crate::images::ImagesCommand,
    },
    /// Run a whole fleet on this machine: real gateways behind a balancer,
    /// fakehw agents, a workload and seeded faults; then check the
    /// invariants. Exits non-zero if one is violated.
    Sim {
        #[arg(long, default_value_t = 200)]
        nodes: usize,
        #[arg(long, default_value_t = 3)]
        gateways: usize,
        #[arg(long, value_enum, default_value = "light")]
        chaos: crate::sim::chaos::Level,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How long the workload and the faults run (settling follows).
        #[arg(long, default_value = "30s", value_parser = dur)]
        duration: Duration,
        /// Keep the run's store and nodes here (a temporary directory
        /// otherwise).
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long, default_value_t = 8)]
        gpus: usize,
        /// Each gateway's TLS handshakes per second (serve --handshake-rate).
        #[arg(long, default_value_t = 200)]
        handshake_rate: u32,
        /// The gateways' heartbeat and lease timings.
        #[arg(long, value_enum, default_value = "fast")]
        timings: crate::sim::Timings,
        /// The report as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// One agent host of `sim` (started by it; orders on stdin).
    #[command(hide = true)]
    SimHost {
        #[command(flatten)]
        opts: crate::sim::host::HostOptions,
    },
    /// Check the fleet invariants (I1–I8) on a store, live or not.
    Check {
        #[arg(long, default_value = "40s", value_parser = dur)]
        node_lease_ttl: Duration,
        #[arg(long, default_value = "120s", value_parser = dur)]
        gateway_loss_grace: Duration,
        /// Commands younger than this may still be on their way.
        #[arg(long, default_value = "60s", value_parser = dur)]
        settle: Duration,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum RolloutsCommand {
    /// Start rolling release SEQUENCE out.
    Start {
        sequence: u64,
        /// Which nodes: node=ID, hostname=GLOB, version=V, comma-separated
        /// (all must hold); `all` for every node.
        #[arg(long, default_value = "all")]
        selector: String,
        /// Cumulative percentages of the selected nodes.
        #[arg(long, default_value = "1%,10%,50%,100%")]
        waves: String,
        /// Failed upgrades tolerated; one more halts the rollout.
        #[arg(long, default_value_t = 0)]
        max_failures: u32,
        #[arg(long)]
        json: bool,
    },
    /// A rollout's progress (the latest one without an ID).
    Status {
        id: Option<String>,
        /// One line per node.
        #[arg(long)]
        nodes: bool,
        #[arg(long)]
        json: bool,
    },
    /// Stop issuing upgrades; those under way finish.
    Pause { id: String },
    /// Go on with a paused or halted rollout.
    Resume { id: String },
    /// Stop the rollout: upgrades not yet dispatched are cancelled; with
    /// --rollback, nodes still upgrading are swapped back (confirmed nodes
    /// keep the release: roll forward instead).
    Abort {
        id: String,
        #[arg(long)]
        rollback: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ReleasesCommand {
    /// Make a release key pair: KEY (pkcs8, mode 0600) and KEY.pub (hex).
    Keygen {
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a bcd binary's manifest, offline, with a release key file.
    Sign {
        #[arg(long)]
        key: PathBuf,
        #[arg(long)]
        binary: PathBuf,
        #[arg(long)]
        version: String,
        /// Must be above every sequence registered before.
        #[arg(long)]
        sequence: u64,
        #[arg(long, default_value = "x86_64-unknown-linux-musl")]
        target: String,
        /// Rotate the release key: nodes that confirm this release trust
        /// the public key in this file (KEY.pub from releases keygen) from
        /// then on, instead of --key's.
        #[arg(long)]
        next_key: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
    },
    /// Upload a signed manifest and its binary to the server.
    Register {
        #[arg(long)]
        manifest: PathBuf,
        #[arg(long)]
        binary: PathBuf,
    },
    /// Registered releases, newest first.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum CommandsCommand {
    /// Run a command on a node: exec.run -- PROGRAM [ARGS...], node.reboot,
    /// boot.kexec kernel=PATH [initrd=PATH] [cmdline=TEXT], inventory.refresh.
    Run {
        node: String,
        kind: String,
        args: Vec<String>,
        /// The node must start it within this long (a duration such as 10m),
        /// or by this time (RFC 3339); default 1h.
        #[arg(long)]
        not_after: Option<String>,
        /// Refuse to run it before the node applied this spec generation.
        #[arg(long, default_value_t = 0)]
        min_generation: u64,
        /// Repeat-safe submission: the same key returns the first command.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// exec.run: kill the program after this long (default 10m).
        #[arg(long, value_parser = dur)]
        timeout: Option<Duration>,
        /// Wait for the result and print it; the exit code follows the
        /// command's (0 succeeded, 1 failed, 4 expired or rejected).
        #[arg(long)]
        wait: bool,
        #[arg(long)]
        json: bool,
    },
    /// Recent commands, newest first.
    List {
        #[arg(long)]
        node: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// One command with its result and output.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

/// `--not-after`: a duration from now, or an RFC 3339 time.
fn not_after(s: &str) -> anyhow::Result<Duration> {
    if let Ok(d) = humantime::parse_duration(s) {
        anyhow::ensure!(!d.is_zero(), "--not-after must be in the future");
        return Ok(d);
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|_| {
        anyhow::anyhow!("--not-after takes a duration (10m) or an RFC 3339 time, not {s:?}")
    })?;
    t.duration_since(std::time::SystemTime::now())
        .map_err(|_| anyhow::anyhow!("--not-after {s} has already passed"))
}

fn command_json(c: &bcd_proto::v1::CommandInfo) -> serde_json::Value {
    serde_json::json!({
        "command_id": c.command_id, "node_id": c.node_id, "seq": c.seq, "kind": c.kind,
        "summary": c.summary, "state": c.state, "reason": c.reason,
        "exit_code": c.has_exit_code.then_some(c.exit_code),
        "output": String::from_utf8_lossy(&c.output), "output_truncated": c.output_truncated,
        "created_at_ms": c.created_at_ms, "not_after_ms": c.not_after_ms,
        "result_at_ms": (c.result_at_ms != 0).then_some(c.result_at_ms), "epoch": c.epoch,
    })
}

fn spec_json(i: &bcd_proto::v1::NodeSpecInfo) -> serde_json::Value {
    serde_json::json!({
        "node_id": i.node_id,
        "desired_generation": i.desired_generation,
        "applied_generation": i.applied_generation,
        "assignments": i.assignments.iter().map(|a| serde_json::json!({
            "allocation_id": a.allocation_id, "gpus": a.gpus,
            "env": a.env.iter().collect::<std::collections::BTreeMap<_, _>>(),
        })).collect::<Vec<_>>(),
        "sections": i.sections.iter().map(|s| serde_json::json!({
            "section": s.section, "status": s.status, "message": s.message, "age_ms": s.age_ms,
        })).collect::<Vec<_>>(),
        "reported_age_ms": (i.reported_age_ms >= 0).then_some(i.reported_age_ms),
        "bindings": i.bindings.iter().map(|b| serde_json::json!({
            "allocation_id": b.allocation_id, "gpu_uuids": b.gpu_uuids, "state": b.state,
            "spec_generation": b.spec_generation,
        })).collect::<Vec<_>>(),
        "events": i.events,
        "access": i.access.as_ref().map(|a| serde_json::json!({
            "users": a.users.iter().map(|u| serde_json::json!({
                "name": u.name, "authorized_keys": u.authorized_keys, "principals": u.principals,
            })).collect::<Vec<_>>(),
            "trusted_user_ca_keys": a.trusted_user_ca_keys,
            "firewall": a.firewall.as_ref().map(|f| f.rules.iter().map(|r| serde_json::json!({
                "protocol": r.protocol, "port": r.port, "source": r.source, "action": r.action,
            })).collect::<Vec<_>>()),
        })),
    })
}

fn print_spec(i: &bcd_proto::v1::NodeSpecInfo, json: bool) -> anyhow::Result<()> {
    if json {
        out!("{}", serde_json::to_string_pretty(&spec_json(i))?);
        return Ok(());
    }
    out!("node       {}", i.node_id);
    out!(
        "generation desired {}, applied {}{}",
        i.desired_generation,
        i.applied_generation,
        if i.reported_age_ms >= 0 {
            format!(" (reported {} ago)", fmt_age(i.reported_age_ms))
        } else {
            " (never reported)".into()
        }
    );
    for a in &i.assignments {
        out!("allocation {}: GPUs {}", a.allocation_id, a.gpus.join(","));
    }
    for b in &i.bindings {
        out!(
            "binding    {} {} (generation {}): {}",
            b.allocation_id,
            b.state,
            b.spec_generation,
            b.gpu_uuids.join(",")
        );
    }
    for e in &i.events {
        out!("event      {e}");
    }
    for s in &i.sections {
        out!(
            "section    {} {}{}",
            s.section,
            s.status,
            around(": ", &s.message, "")
        );
    }
    Ok(())
}

fn is_terminal(state: &str) -> bool {
    matches!(state, "succeeded" | "failed" | "expired" | "rejected")
}

#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Create a join token and print it.
    Create {
        #[arg(long, default_value = "24h", value_parser = dur)]
        ttl: Duration,
        /// How many nodes may join with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        #[arg(long, default_value = "")]
        description: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum NodesCommand {
    /// Show each node's state, epoch, gateway, certificate expiry and last-seen age.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Bind GPUs (UUIDs or indices) to an allocation on a node: the node
    /// writes the CDI spec and the allocation's env file.
    Assign {
        node: String,
        allocation: String,
        #[arg(long, value_delimiter = ',', required = true)]
        gpus: Vec<String>,
        /// Extra environment for the allocation's env file, NAME=VALUE.
        #[arg(long = "env")]
        env: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove an allocation's GPUs from a node's spec.
    Unassign {
        node: String,
        allocation: String,
        #[arg(long)]
        json: bool,
    },
    /// Set who may log in to a node (sshd keys, principals, user CAs) and
    /// its firewall table, from a JSON file: {"users": [{"name", "authorized_keys",
    /// "principals"}], "trusted_user_ca_keys": [...], "firewall": {"rules":
    /// [{"protocol", "port", "source", "action"}]}}.
    Access {
        node: String,
        #[arg(long, required_unless_present = "clear")]
        file: Option<PathBuf>,
        /// No users, no CA keys, no firewall table.
        #[arg(long, conflicts_with = "file")]
        clear: bool,
        #[arg(long)]
        json: bool,
    },
    /// A node's desired spec against what it applied.
    Spec {
        node: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a node: it can no longer connect; its certificates are revoked.
    Delete {
        node: String,
        #[arg(long)]
        yes: bool,
    },
}

fn init_logging(default: tracing::Level) {
    use tracing_subscriber::filter::Targets;
    // `info`, `debug`, `info,bcd_agent=debug`: target=level directives.
    let filter: Targets = std::env::var("BC_LOG")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(default));
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let fmt = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if std::env::var("BC_LOG_FORMAT").as_deref() == Ok("json") {
        fmt.json().finish().with(filter).init();
    } else {
        fmt.finish().with(filter).init();
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// `text` between `before` and `after`, or nothing when it is empty.
fn around(before: &str, text: &str, after: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("{before}{text}{after}")
    }
}

fn fmt_age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}

fn fmt_time(ms: i64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64),
    )
    .to_string()
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let operator = cli
        .operator
        .clone()
        .unwrap_or_else(|| cli.data_dir.join(serve::OPERATOR_FILE));
    let server = cli.server.as_deref();
    match cli.command {
        Command::Sim {
            nodes,
            gateways,
            chaos,
            seed,
            duration,
            dir,
            gpus,
            handshake_rate,
            timings,
            json,
        } => {
            let report = crate::sim::run(crate::sim::SimOptions {
                handshake_rate,
                timings,
                nodes,
                gateways,
                chaos,
                seed,
                duration,
                data_dir: dir,
                gpus,
                progress: !json,
            })
            .await?;
            if json {
                out!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                emit(&report.render())?;
            }
            anyhow::ensure!(report.ok, "an invariant was violated (see the report)");
            Ok(())
        }
        Command::SimHost { opts } => crate::sim::host::run_host(opts).await,
        Command::Check {
            node_lease_ttl,
            gateway_loss_grace,
            settle,
            json,
        } => {
            let store = cli.data_dir.join("store.db");
            anyhow::ensure!(
                store.exists(),
                "no store at {}: pass --data-dir of the server",
                store.display()
            );
            let snapshot = crate::check::snapshot(
                &store,
                crate::check::Timings {
                    node_lease_ttl,
                    gateway_loss_grace,
                },
                settle,
                crate::check::NodeFacts::default(),
            )
            .with_context(|| format!("cannot read {}", store.display()))?;
            let outcomes = crate::check::all(&snapshot);
            if json {
                out!("{}", serde_json::to_string_pretty(&outcomes)?);
            } else {
                emit(&crate::check::render(&outcomes))?;
            }
            anyhow::ensure!(
                outcomes.iter().all(|o| o.held()),
                "an invariant was violated"
            );
            Ok(())
        }
        Command::Serve {
            listen,
            sans,
            gateway_id,
            heartbeat_interval,
            gateway_lease_ttl,
            node_lease_ttl,
            gateway_loss_grace,
            handshake_rate,
            drain_within,
            node_cert_ttl,
            ramdisk_cert_ttl,
            release_pubkeys,
            boot,
        } => {
            let release_keys = release_pubkeys
                .iter()
                .map(|k| {
                    hex::decode(k.trim())
                        .ok()
                        .filter(|b| b.len() == 32)
                        .ok_or_else(|| {
                            anyhow::anyhow!("--release-pubkey takes 64 hex digits, not {k:?}")
                        })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let timing = Timing {
                heartbeat: heartbeat_interval,
                gateway_lease_ttl,
                node_lease_ttl,
                gateway_loss_grace,
                handshake_rate,
                drain_within,
                ..Timing::default()
            };
            serve::serve(
                ServeOptions {
                    data_dir: cli.data_dir,
                    listen,
                    sans,
                    gateway_id,
                    timing,
                    certs: CertPolicy {
                        node_ttl: node_cert_ttl,
                        ramdisk_ttl: ramdisk_cert_ttl,
                    },
                    release_keys,
                    boot,
                },
                shutdown_signal(),
            )
            .await
        }
        Command::Tokens {
            command:
                TokensCommand::Create {
                    ttl,
                    uses,
                    description,
                    json,
                },
        } => {
            let mut c = client::connect(&operator, server).await?;
            let r = c
                .create_token(CreateTokenRequest {
                    ttl_ms: ttl.as_millis() as u64,
                    uses,
                    description,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            if json {
                out!(
                    "{}",
                    serde_json::json!({
                        "token": r.token, "token_id": r.token_id,
                        "expires_at_ms": r.expires_at_ms, "uses": r.uses,
                    })
                );
            } else {
                out!("{}", r.token);
                eprintln!(
                    "token {} for {} node(s), expires {}",
                    r.token_id,
                    r.uses,
                    fmt_time(r.expires_at_ms)
                );
            }
            Ok(())
        }
        Command::Nodes {
            command: NodesCommand::List { json },
        } => {
            let mut c = client::connect(&operator, server).await?;
            let r = c
                .list_nodes(ListNodesRequest {})
                .await
                .map_err(client::status)?
                .into_inner();
            if json {
                let nodes: Vec<_> = r
                    .nodes
                    .iter()
                    .map(|n| {
                        serde_json::json!({
                            "node_id": n.node_id, "hostname": n.hostname, "state": n.state,
                            "epoch": n.epoch, "gateway": n.gateway_id,
                            "cert_not_after_ms": n.cert_not_after_ms,
                            "last_seen_age_ms": n.last_seen_age_ms, "boot_id": n.boot_id,
                            "journal_id": n.journal_id, "incarnation_id": n.incarnation_id,
                            "agent_version": n.agent_version, "release_floor": n.release_floor, "conditions": n.conditions,
                            "taints": n.taints,
                        })
                    })
                    .collect();
                out!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "server_time_ms": r.server_time_ms, "nodes": nodes,
                    }))?
                );
            } else {
                out!(
                    "{:<16} {:<20} {:<13} {:>6} {:<12} {:<21} {:>9}  {:<12} {:>5}",
                    "NODE",
                    "HOSTNAME",
                    "STATE",
                    "EPOCH",
                    "GATEWAY",
                    "CERT EXPIRES",
                    "LAST SEEN",
                    "VERSION",
                    "FLOOR"
                );
                for n in &r.nodes {
                    out!(
                        "{:<16} {:<20} {:<13} {:>6} {:<12} {:<21} {:>9}  {:<12} {:>5}",
                        n.node_id,
                        n.hostname,
                        n.state,
                        n.epoch,
                        n.gateway_id,
                        fmt_time(n.cert_not_after_ms),
                        fmt_age(n.last_seen_age_ms),
                        n.agent_version,
                        n.release_floor
                    );
                }
            }
            Ok(())
        }
        Command::Releases { command } => match command {
            ReleasesCommand::Keygen { out } => {
                let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(
                    &ring::rand::SystemRandom::new(),
                )
                .map_err(|_| anyhow::anyhow!("cannot generate a key"))?;
                let key = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
                    .map_err(|_| anyhow::anyhow!("cannot read the generated key"))?;
                use ring::signature::KeyPair;
                let public = hex::encode(key.public_key().as_ref());
                crate::files::write_atomic(&out, pkcs8.as_ref(), 0o600)?;
                let mut pub_path = out.clone().into_os_string();
                pub_path.push(".pub");
                crate::files::write_atomic(
                    std::path::Path::new(&pub_path),
                    format!("{public}\n").as_bytes(),
                    0o644,
                )?;
                out!("{public}");
                Ok(())
            }
            ReleasesCommand::Sign {
                key,
                binary,
                version,
                sequence,
                target,
                next_key,
                out,
            } => {
                let next_key = next_key
                    .map(|p| -> anyhow::Result<String> {
                        let text = std::fs::read_to_string(&p)
                            .with_context(|| format!("cannot read {}", p.display()))?;
                        release::parse_public_key(&text)
                            .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                        Ok(text.trim().to_string())
                    })
                    .transpose()?;
                let pkcs8 = std::fs::read(&key)
                    .with_context(|| format!("cannot read {}", key.display()))?;
                let key = ring::signature::Ed25519KeyPair::from_pkcs8(&pkcs8).map_err(|_| {
                    anyhow::anyhow!("{} is not an ed25519 release key", key.display())
                })?;
                let bin = std::fs::read(&binary)
                    .with_context(|| format!("cannot read {}", binary.display()))?;
                let mut manifest = release::manifest_for(&bin, &version, sequence, &target);
                manifest.next_key = next_key;
                manifest
                    .check(&bin)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", binary.display()))?;
                let signed = release::sign(&manifest, &key);
                crate::files::write_atomic(&out, &signed.to_json(), 0o644)?;
                out!(
                    "signed {version} (sequence {sequence}, {} bytes, sha256 {})",
                    manifest.size,
                    manifest.sha256
                );
                Ok(())
            }
            ReleasesCommand::Register { manifest, binary } => {
                let signed_manifest = std::fs::read(&manifest)
                    .with_context(|| format!("cannot read {}", manifest.display()))?;
                let path = binary;
                let binary = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                // The request carries the binary: keep it under the API's
                // message limit (a release is the static bcd, a few MB).
                let limit = crate::admin::MAX_REQUEST - (1 << 20);
                anyhow::ensure!(
                    binary.len() < limit,
                    "{} is {} MiB; a release may be at most {} MiB: register the stripped static build \
                     (cargo build -p bcd --release --target x86_64-unknown-linux-musl)",
                    path.display(),
                    binary.len() >> 20,
                    limit >> 20
                );
                let mut c = client::connect(&operator, server).await?;
                let r = c
                    .register_release(bcd_proto::v1::RegisterReleaseRequest {
                        signed_manifest,
                        binary,
                    })
                    .await
                    .map_err(client::status)?
                    .into_inner();
                out!("registered {} (sequence {})", r.version, r.sequence);
                Ok(())
            }
            ReleasesCommand::List { json } => {
                let mut c = client::connect(&operator, server).await?;
                let r = c
                    .list_releases(bcd_proto::v1::ListReleasesRequest {})
                    .await
                    .map_err(client::status)?
                    .into_inner();
                if json {
                    let v: Vec<_> = r
                        .releases
                        .iter()
                        .map(|x| {
                            serde_json::json!({
                                "version": x.version, "sequence": x.sequence, "target": x.target,
                                "size": x.size, "sha256": x.sha256, "key_id": x.key_id,
                                "registered_at_ms": x.registered_at_ms,
                            })
                        })
                        .collect();
                    out!("{}", serde_json::to_string_pretty(&v)?);
                } else {
                    out!(
                        "{:>8} {:<12} {:<28} {:>10} REGISTERED",
                        "SEQUENCE",
                        "VERSION",
                        "TARGET",
                        "SIZE"
                    );
                    for x in &r.releases {
                        out!(
                            "{:>8} {:<12} {:<28} {:>10} {}",
                            x.sequence,
                            x.version,
                            x.target,
                            x.size,
                            fmt_time(x.registered_at_ms)
                        );
                    }
                }
                Ok(())
            }
        },
        Command::Images { command } => crate::images::run(command, &operator, server).await,
        Command::Rollouts { command } => {
            let mut c = client::connect(&operator, server).await?;
            let (info, json, nodes) = match command {
                RolloutsCommand::Start {
                    sequence,
                    selector,
                    waves,
                    max_failures,
                    json,
                } => {
                    let waves = crate::rollouts::parse_waves(&waves).map_err(anyhow::Error::msg)?;
                    let r = c
                        .start_rollout(bcd_proto::v1::StartRolloutRequest {
                            sequence,
                            selector,
                            waves,
                            max_failures,
                        })
                        .await
                        .map_err(client::status)?
                        .into_inner();
                    (r, json, false)
                }
                RolloutsCommand::Status { id, nodes, json } => {
                    let r = match id {
                        Some(id) => c
                            .get_rollout(bcd_proto::v1::GetRolloutRequest { id })
                            .await
                            .map_err(client::status)?
                            .into_inner(),
                        None => c
                            .list_rollouts(bcd_proto::v1::ListRolloutsRequest {})
                            .await
                            .map_err(client::status)?
                            .into_inner()
                            .rollouts
                            .into_iter()
                            .next()
                            .ok_or_else(|| {
                                anyhow::anyhow!(
                                    "no rollouts yet: start one with better-compute rollouts start SEQUENCE"
                                )
                            })?,
                    };
                    (r, json, nodes)
                }
                RolloutsCommand::Pause { id } => (
                    change_rollout(&mut c, id, "pause", false).await?,
                    false,
                    false,
                ),
                RolloutsCommand::Resume { id } => (
                    change_rollout(&mut c, id, "resume", false).await?,
                    false,
                    false,
                ),
                RolloutsCommand::Abort { id, rollback } => (
                    change_rollout(&mut c, id, "abort", rollback).await?,
                    false,
                    true,
                ),
            };
            print_rollout(&info, json, nodes)?;
            Ok(())
        }
        Command::Commands { command } => {
            let mut c = client::connect(&operator, server).await?;
            match command {
                CommandsCommand::Run {
                    node,
                    kind,
                    args,
                    not_after: deadline,
                    min_generation,
                    idempotency_key,
                    timeout,
                    wait,
                    json,
                } => {
                    let deadline = deadline.as_deref().map(not_after).transpose()?;
                    let mut info = c
                        .run_command(bcd_proto::v1::RunCommandRequest {
                            node_id: node,
                            kind,
                            args,
                            not_after_ms: deadline.map_or(0, |d| d.as_millis() as u64),
                            min_generation,
                            idempotency_key: idempotency_key.unwrap_or_default(),
                            timeout_ms: timeout.map_or(0, |d| d.as_millis() as u64),
                        })
                        .await
                        .map_err(client::status)?
                        .into_inner();
                    if !wait {
                        if json {
                            out!("{}", command_json(&info));
                        } else {
                            out!("{}", info.command_id);
                        }
                        return Ok(());
                    }
                    while !is_terminal(&info.state) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        info = c
                            .get_command(bcd_proto::v1::GetCommandRequest {
                                command_id: info.command_id.clone(),
                            })
                            .await
                            .map_err(client::status)?
                            .into_inner();
                    }
                    if json {
                        out!("{}", command_json(&info));
                    } else {
                        emit(&String::from_utf8_lossy(&info.output))?;
                        eprintln!(
                            "{} {}{}{}",
                            info.command_id,
                            info.state,
                            if info.reason.is_empty() { "" } else { ": " },
                            info.reason
                        );
                    }
                    let code = match info.state.as_str() {
                        "succeeded" => 0,
                        "failed" => 1,
                        _ => 4,
                    };
                    if code != 0 {
                        std::process::exit(code);
                    }
                }
                CommandsCommand::List { node, limit, json } => {
                    let r = c
                        .list_commands(bcd_proto::v1::ListCommandsRequest {
                            node_id: node.unwrap_or_default(),
                            limit,
                        })
                        .await
                        .map_err(client::status)?
                        .into_inner();
                    if json {
                        let v: Vec<_> = r.commands.iter().map(command_json).collect();
                        out!("{}", serde_json::to_string_pretty(&v)?);
                    } else {
                        out!(
                            "{:<20} {:<16} {:>5} {:<17} {:<10} {}",
                            "COMMAND",
                            "NODE",
                            "SEQ",
                            "KIND",
                            "STATE",
                            "SUMMARY"
                        );
                        for i in &r.commands {
                            out!(
                                "{:<20} {:<16} {:>5} {:<17} {:<10} {}",
                                i.command_id,
                                i.node_id,
                                i.seq,
                                i.kind,
                                i.state,
                                i.summary
                            );
                        }
                    }
                }
                CommandsCommand::Show { id, json } => {
                    let i = c
                        .get_command(bcd_proto::v1::GetCommandRequest { command_id: id })
                        .await
                        .map_err(client::status)?
                        .into_inner();
                    if json {
                        out!("{}", serde_json::to_string_pretty(&command_json(&i))?);
                    } else {
                        out!("command   {}", i.command_id);
                        out!("node      {} (seq {})", i.node_id, i.seq);
                        out!("kind      {} {}", i.kind, i.summary);
                        out!("state     {}{}", i.state, around(" (", &i.reason, ")"));
                        if i.has_exit_code {
                            out!("exit code {}", i.exit_code);
                        }
                        out!("created   {}", fmt_time(i.created_at_ms));
                        out!("not after {}", fmt_time(i.not_after_ms));
                        if i.result_at_ms != 0 {
                            out!("finished  {}", fmt_time(i.result_at_ms));
                        }
                        if !i.output.is_empty() {
                            out!(
                                "output{}:",
                                if i.output_truncated {
                                    " (truncated)"
                                } else {
                                    ""
                                }
                            );
                            emit(&String::from_utf8_lossy(&i.output))?;
                        }
                    }
                }
            }
            Ok(())
        }
        Command::Nodes {
            command:
                NodesCommand::Assign {
                    node,
                    allocation,
                    gpus,
                    env,
                    json,
                },
        } => {
            let mut vars = std::collections::HashMap::new();
            for e in env {
                let (k, v) = e
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--env takes NAME=VALUE, not {e:?}"))?;
                vars.insert(k.to_string(), v.to_string());
            }
            let mut c = client::connect(&operator, server).await?;
            let info = c
                .assign_gpus(bcd_proto::v1::AssignGpusRequest {
                    node_id: node,
                    allocation_id: allocation,
                    gpus,
                    env: vars,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            print_spec(&info, json)
        }
        Command::Nodes {
            command:
                NodesCommand::Unassign {
                    node,
                    allocation,
                    json,
                },
        } => {
            let mut c = client::connect(&operator, server).await?;
            let info = c
                .unassign(bcd_proto::v1::UnassignRequest {
                    node_id: node,
                    allocation_id: allocation,
                })
                .await
                .map_err(client::status)?
                .into_inner();
            print_spec(&info, json)
        }
        Command::Nodes {
            command:
                NodesCommand::Access {
                    node,
                    file,
                    clear,
                    json,
                },
        } => {
            let access: crate::store::Access = match (file, clear) {
                (_, true) => Default::default(),
                (Some(f), false) => serde_json::from_slice(
                    &std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?,
                )
                .with_context(|| format!("{} is not an access description", f.display()))?,
                (None, false) => anyhow::bail!("nodes access needs --file FILE or --clear"),
            };
            let mut c = client::connect(&operator, server).await?;
            let info = c
                .set_access(bcd_proto::v1::SetAccessRequest {
                    node_id: node,
                    access: Some(crate::specs::access_to_wire(&access)),
                })
                .await
                .map_err(client::status)?
                .into_inner();
            print_spec(&info, json)
        }
        Command::Nodes {
            command: NodesCommand::Spec { node, json },
        } => {
            let mut c = client::connect(&operator, server).await?;
            let info = c
                .get_node_spec(bcd_proto::v1::GetNodeSpecRequest { node_id: node })
                .await
                .map_err(client::status)?
                .into_inner();
            print_spec(&info, json)
        }
        Command::Nodes {
            command: NodesCommand::Delete { node, yes },
        } => {
            if !yes {
                anyhow::bail!(
                    "deleting node {node} revokes its certificates and it cannot reconnect; \
                     confirm with --yes"
                );
            }
            let mut c = client::connect(&operator, server).await?;
            c.delete_node(DeleteNodeRequest {
                node_id: node.clone(),
            })
            .await
            .map_err(client::status)?;
            out!("deleted {node}");
            Ok(())
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // A simulation runs thousands of agents in this process: their
    // per-session lines would drown the progress display.
    init_logging(
        if matches!(cli.command, Command::Sim { .. } | Command::SimHost { .. }) {
            tracing::Level::WARN
        } else {
            tracing::Level::INFO
        },
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)).context("better-compute") {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Skip the context we just added; print the chain once.
            let chain: Vec<String> = e.chain().skip(1).map(|c| c.to_string()).collect();
            eprintln!("error: {}", chain.join(": "));
            ExitCode::FAILURE
        }
    }
}

async fn change_rollout(
    c: &mut client::Admin,
    id: String,
    action: &str,
    rollback: bool,
) -> anyhow::Result<bcd_proto::v1::RolloutInfo> {
    Ok(c.change_rollout(bcd_proto::v1::ChangeRolloutRequest {
        id,
        action: action.to_string(),
        rollback,
    })
    .await
    .map_err(client::status)?
    .into_inner())
}

fn print_rollout(r: &bcd_proto::v1::RolloutInfo, json: bool, nodes: bool) -> anyhow::Result<()> {
    let count = |s: &str| r.nodes.iter().filter(|n| n.status == s).count();
    if json {
        let v = serde_json::json!({
            "id": r.id, "sequence": r.sequence, "version": r.version, "selector": r.selector,
            "waves": r.waves, "max_failures": r.max_failures, "state": r.state, "wave": r.wave,
            "reason": r.reason, "created_at_ms": r.created_at_ms,
            "nodes": r.nodes.iter().map(|n| serde_json::json!({
                "node_id": n.node_id, "position": n.position, "status": n.status,
                "command_id": n.command_id, "reason": n.reason,
                "rollback_command_id": n.rollback_command_id,
            })).collect::<Vec<_>>(),
        });
        out!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let pct = r.waves.get(r.wave as usize).copied().unwrap_or(100);
    out!(
        "rollout {}: release {} ({}) to {} nodes ({}), {}{}",
        r.id,
        r.sequence,
        r.version,
        r.nodes.len(),
        r.selector,
        r.state,
        around(": ", &r.reason, "")
    );
    out!(
        "wave {}/{} ({pct}%); confirmed {}, upgrading {}, failed {} (budget {}), waiting {}, skipped {}, cancelled {}",
        r.wave + 1,
        r.waves.len(),
        count("confirmed"),
        count("upgrading"),
        count("failed"),
        r.max_failures,
        count("waiting"),
        count("skipped"),
        count("cancelled"),
    );
    if nodes {
        out!("{:<16} {:<10} {:<22} REASON", "NODE", "STATUS", "COMMAND");
        for n in &r.nodes {
            out!(
                "{:<16} {:<10} {:<22} {}{}",
                n.node_id,
                n.status,
                n.command_id,
                n.reason,
                around(" (rollback ", &n.rollback_command_id, ")")
            );
        }
    }
    Ok(())
}
