//! `bc-sim`: a whole fleet on one machine, under chaos, with the invariants
//! checked at the end. It is a crate and binary of its own, beside
//! `better-compute`, so the control plane links neither the agent nor the
//! fake hardware.
//!
//! The server side is real: G `better-compute serve` processes (gateways,
//! each with the join service, operator API, liveness and rollout
//! controllers) on one store. The nodes are the real agent code
//! (`bcd_fakehw::sim::Fleet`, fake hardware), each with its own key,
//! certificate, journal and TLS session, in a few agent host processes
//! ([`host`]); each host dials the gateways through its own L4 balancer,
//! which is also where link faults happen ([`proxy`]). A workload
//! of signed commands (each a real program whose side effect lands in the
//! node's `effects` file, counted outside the journal) and GPU assignments
//! runs while the faults of a seeded schedule ([`chaos`]) happen. Then the
//! fleet is given time to settle, and [`better_compute::check`] runs over the store
//! and what the nodes recorded.

pub mod chaos;
pub mod host;
pub mod proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bcd_core::SplitMix64;
use serde::Serialize;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Mutex;

use bc_store::Store;

use better_compute::check;
use chaos::{Fault, Level};
use host::{Hosts, Order};

/// Server timings for short simulated runs: the spec's ratios, five times
/// faster, so liveness transitions happen within the run.
pub const FAST_TIMINGS: &[(&str, &str)] = &[
    ("--heartbeat-interval", "2s"),
    ("--gateway-lease-ttl", "6s"),
    ("--node-lease-ttl", "8s"),
    ("--gateway-loss-grace", "24s"),
    ("--controller-lease-ttl", "3s"),
];

/// The spec's timings (the server's defaults), for large fleets.
pub const SPEC_TIMINGS: &[(&str, &str)] = &[
    ("--heartbeat-interval", "10s"),
    ("--gateway-lease-ttl", "20s"),
    ("--node-lease-ttl", "40s"),
    ("--gateway-loss-grace", "120s"),
    ("--controller-lease-ttl", "15s"),
];

/// What the simulated machines join with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JoinTokens {
    /// A token of its own for each machine, used once, as a rack is
    /// installed (`tokens create --count N`): no token row is shared.
    OneUse,
    /// One token every machine joins with (its row is taken by each join).
    Shared,
}

impl JoinTokens {
    /// The flag's own spelling of this value, as the report says it.
    fn word(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }
}

/// One-use tokens minted at once while the simulator prepares its fleet.
const MINTING_AT_ONCE: usize = 16;

/// Where the simulated machines keep their state (journal, identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeState {
    /// Under the run's directory, on disk: every node's fsyncs share this
    /// machine's one disk, which no fleet of real machines does.
    Disk,
    /// In memory (a directory under /dev/shm), as a diskless ramdisk node
    /// keeps its journal: the control plane is what the run measures.
    Memory,
}

impl NodeState {
    /// The directory the simulated machines keep their state in: `on_disk`
    /// (created), or a new directory under /dev/shm, removed when the
    /// returned value drops.
    pub fn place(self, on_disk: &Path) -> anyhow::Result<NodesDir> {
        match self {
            NodeState::Disk => {
                std::fs::create_dir_all(on_disk)
                    .with_context(|| format!("cannot create {}", on_disk.display()))?;
                Ok(NodesDir::Disk(on_disk.to_path_buf()))
            }
            NodeState::Memory => tempfile::Builder::new()
                .prefix("bc-sim-nodes-")
                .tempdir_in("/dev/shm")
                .map(NodesDir::Memory)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot keep the simulated nodes in memory under /dev/shm ({e}): \
                         run with --node-state disk"
                    )
                }),
        }
    }
}

/// Where [`NodeState::place`] put the simulated machines' state.
#[derive(Debug)]
pub enum NodesDir {
    Disk(PathBuf),
    Memory(tempfile::TempDir),
}

impl NodesDir {
    pub fn path(&self) -> &Path {
        match self {
            NodesDir::Disk(p) => p,
            NodesDir::Memory(t) => t.path(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Timings {
    /// Five times the spec's pace: liveness transitions within a short run.
    Fast,
    /// The spec's: heartbeats every 10 s, 20 s gateway leases.
    Spec,
}

impl Timings {
    pub fn flags(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Timings::Fast => FAST_TIMINGS,
            Timings::Spec => SPEC_TIMINGS,
        }
    }
}

#[derive(Debug, Clone)]
pub struct SimOptions {
    pub nodes: usize,
    pub gateways: usize,
    pub chaos: Level,
    pub seed: u64,
    /// How long faults and the workload run; settling comes after.
    pub duration: Duration,
    /// Where the store and the nodes live; a temporary directory if unset.
    pub data_dir: Option<PathBuf>,
    pub gpus: usize,
    /// Print progress lines.
    pub progress: bool,
    /// Each gateway's TLS handshake bucket (serve --handshake-rate).
    pub handshake_rate: u32,
    pub timings: Timings,
    /// `sqlite` (one file the gateways share), `postgres` (a throw-away
    /// cluster this run starts), or a PostgreSQL address.
    pub store: String,
    pub node_state: NodeState,
    pub join_tokens: JoinTokens,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rehome {
    pub gateway: String,
    pub nodes: usize,
    pub rehomed: usize,
    pub p50_ms: i64,
    pub p99_ms: i64,
    pub max_ms: i64,
    /// Every re-homed node's time from the kill to its new session, in
    /// order (what `scripts/plot-bench` draws as a CDF).
    pub samples_ms: Vec<i64>,
}

/// A gateway whose host clock was stepped off, and whether it said so.
#[derive(Debug, Clone, Serialize)]
pub struct ClockFault {
    pub gateway: String,
    pub offset_ms: i64,
    /// The gateway raised ClockSkew (its log says so).
    pub raised: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub nodes: usize,
    pub gateways: usize,
    /// `sqlite` or `postgres`.
    pub store: String,
    /// Where the simulated machines kept their state: `disk` or `memory`.
    pub node_state: String,
    pub chaos: String,
    pub seed: u64,
    /// What the machines joined with: `one-use` or `shared`.
    pub join_tokens: String,
    /// The fleet powering on: every machine joined through the one key
    /// holder and held its first session (`connect_s`); nodes a second.
    pub power_on_per_s: f64,
    /// Minted one-use tokens still unspent once the fleet connected (at
    /// most the store's list limit; 0 when every machine spent its own).
    pub tokens_unspent: Option<usize>,
    pub connect_s: f64,
    /// Sessions established per second per gateway while the fleet
    /// connected (joins included).
    pub hellos_per_s_per_gateway: f64,
    /// The most Hello transactions one gateway committed in one second.
    pub peak_hellos_per_s: u64,
    /// After every link was reset at once (`--chaos kill`): the time until
    /// every node was connected again.
    pub storm_s: Option<f64>,
    /// Each node's time from the storm's cut to its new session, in order:
    /// the storm's timeline.
    pub storm_samples_ms: Vec<i64>,
    pub connected_at_end: usize,
    /// Nodes the store has connected at the end (its sessions, not the
    /// agents' word): must be every node, as the agents say.
    pub connected_in_store: usize,
    /// Every node connected (each counted once), every command finished and
    /// every spec applied before the settling limit.
    pub settled: bool,
    pub settle_s: f64,
    pub settle_limit_s: f64,
    pub clock_faults: Vec<ClockFault>,
    pub commands: BTreeMap<String, usize>,
    pub commands_issued: usize,
    pub faults: BTreeMap<String, usize>,
    pub rehome: Vec<Rehome>,
    /// Peak resident memory of the agent hosts (agents and balancers) per
    /// node.
    pub peak_kib_per_node: u64,
    pub invariants: Vec<check::Outcome>,
    /// Every gateway killed and started again at the end: what changed and
    /// the invariants checked again.
    pub after_restart: AfterRestart,
    pub ok: bool,
}

/// The restart check at the end of a run: every control-plane process
/// killed (SIGKILL) and started again under its name, each start
/// reconciling; the authoritative state compared, the invariants checked
/// again (`better-compute check --label "after restart"`).
#[derive(Debug, Clone, Serialize)]
pub struct AfterRestart {
    pub gateways_restarted: usize,
    /// Differences in commands, bindings and desired generations.
    pub drift: Vec<String>,
    pub invariants: Vec<check::Outcome>,
}

impl AfterRestart {
    pub fn held(&self) -> bool {
        self.drift.is_empty() && self.invariants.iter().all(|o| o.held())
    }
}

/// One look while the fleet settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    /// Every node connected, no command open, every spec applied.
    Settled,
    Waiting,
    /// The limit passed first: the run fails.
    GaveUp,
}

/// Whether the fleet settled, may still, or did not within `limit`. Time
/// is a parameter.
fn settle_step(
    connected: usize,
    nodes: usize,
    open: usize,
    unapplied: usize,
    elapsed: Duration,
    limit: Duration,
) -> Settle {
    if connected == nodes && open == 0 && unapplied == 0 {
        Settle::Settled
    } else if elapsed > limit {
        Settle::GaveUp
    } else {
        Settle::Waiting
    }
}

/// What must be the same before and after a restart, as lines.
fn authoritative(s: &check::Snapshot) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for c in &s.commands {
        out.insert(format!(
            "command {} of {}: {} {} {:?}",
            c.id, c.node_id, c.state, c.reason, c.exit_code
        ));
    }
    for b in &s.bindings {
        out.insert(format!(
            "binding {}/{}: {} {:?}",
            b.node_id, b.allocation_id, b.state, b.gpus
        ));
    }
    for (node, g) in &s.desired {
        out.insert(format!("node {node}: desired generation {g}"));
    }
    for n in &s.nodes {
        out.insert(format!("node {n}"));
    }
    out
}

struct Gateway {
    name: String,
    child: tokio::process::Child,
}

/// Where a gateway process listens: for nodes, and for operators.
#[derive(Debug, Clone, Copy)]
struct Listening {
    node: SocketAddr,
    api: SocketAddr,
}

/// How a gateway process is started.
#[derive(Debug, Clone)]
struct GatewayConfig {
    handshake_rate: u32,
    timings: Timings,
    /// A PostgreSQL address (through the environment, never the command
    /// line); `None`: the SQLite file in the data directory.
    store: Option<String>,
}

/// How long after `at_ms` a node's last session was established; None
/// while that session is from before (a node still on its old session, or
/// a host that has not reported the new one yet).
fn back_after(established_ms: i64, at_ms: i64) -> Option<i64> {
    (established_ms > at_ms).then(|| established_ms - at_ms)
}

/// When all `nodes` are back (one time each, from [`back_after`]), the
/// last of them.
fn all_back(back_ms: &[i64], nodes: usize) -> Option<i64> {
    (back_ms.len() == nodes).then(|| back_ms.iter().copied().max().unwrap_or(0))
}

/// The file the gateway in `slot` reads its clock offset from.
fn clock_offset_file(dir: &Path, slot: usize) -> PathBuf {
    dir.join(format!("clock-{slot}.offset"))
}

/// The `better-compute` the gateways run: the one beside this binary, as
/// cargo builds them and as a package installs them.
pub fn server_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("where this binary is")?;
    let beside = exe.with_file_name("better-compute");
    anyhow::ensure!(
        beside.exists(),
        "better-compute is not beside {}: the simulator runs real gateways from it; \
         build both (cargo build --profile bench-fast -p better-compute -p bc-sim)",
        exe.display()
    );
    Ok(beside)
}

async fn start_gateway(
    dir: &Path,
    name: &str,
    slot: usize,
    config: &GatewayConfig,
) -> anyhow::Result<(Gateway, Listening)> {
    let exe = server_binary()?;
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("serve").arg("--data-dir").arg(dir).args([
        "--listen",
        "127.0.0.1:0",
        "--api-listen",
        "127.0.0.1:0",
        "--gateway-id",
        name,
        "--http-listen",
        "127.0.0.1:0",
    ]);
    cmd.arg("--clock-offset-file")
        .arg(clock_offset_file(dir, slot));
    if let Some(url) = &config.store {
        cmd.env("BC_STORE", url);
    }
    let (handshake_rate, timings) = (config.handshake_rate, config.timings);
    for (k, v) in timings.flags() {
        cmd.args([k, v]);
    }
    cmd.args(["--handshake-rate", &handshake_rate.to_string()]);
    // Every simulated node reaches the gateway through a balancer on
    // loopback, as behind a layer-4 balancer: one source address.
    cmd.args(["--max-connections-per-address", "20000"]);
    // Each agent host carries many nodes from its one address: an address
    // gets the whole bucket, as a NAT's would.
    cmd.args(["--handshake-rate-per-address", &handshake_rate.to_string()]);
    let mut child = cmd
        .env("BC_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a gateway")?;
    let stdout = child.stdout.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        // `api on ADDR` comes before `listening on ADDR as gateway ID`.
        let mut api = None;
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("api on ") {
                api = Some(rest.trim().parse::<SocketAddr>()?);
            }
            if let Some(rest) = line.strip_prefix("listening on ") {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                let api = api.context("the gateway printed no `api on ADDR`")?;
                return Ok::<_, anyhow::Error>(Listening {
                    node: addr.parse::<SocketAddr>()?,
                    api,
                });
            }
        }
        anyhow::bail!("gateway {name} exited before listening; see {name}.log")
    })
    .await
    .with_context(|| format!("gateway {name} did not start in 30 s"))??;
    // Keep reading stdout so the gateway never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((
        Gateway {
            name: name.to_string(),
            child,
        },
        addr,
    ))
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn node_id_of(dir: &Path) -> Option<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("identity.json")).ok()?).ok()?;
    v["node_id"].as_str().map(String::from)
}

fn mark_of(dir: &Path) -> Option<i64> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("identity.json")).ok()?).ok()?;
    v["server_time_mark_ms"].as_i64()
}

struct Kill {
    gateway: String,
    nodes: usize,
    /// Each re-homed node's first session after the kill, in ms after it.
    latencies: Arc<std::sync::Mutex<Vec<i64>>>,
}

struct World {
    dir: PathBuf,
    store: Store,
    hosts: Arc<Hosts>,
    gateways: Mutex<Vec<Gateway>>,
    /// Gateway name → address, while it is up.
    backends: std::sync::Mutex<BTreeMap<String, SocketAddr>>,
    /// Gateway name → operator API address, while it is up.
    apis: std::sync::Mutex<BTreeMap<String, SocketAddr>>,
    kills: Mutex<Vec<Kill>>,
    restarts: std::sync::atomic::AtomicUsize,
    storm: Mutex<Option<f64>>,
    storm_samples: Mutex<Vec<i64>>,
    node_ids: Vec<String>,
    config: GatewayConfig,
    /// (gateway slot, offset) of each clock fault.
    clock_faults: std::sync::Mutex<Vec<(usize, i64)>>,
    /// The run's own PostgreSQL cluster, whose outages are real: stopped
    /// and started again, or frozen.
    cluster: Option<Arc<std::sync::Mutex<bc_store::postgres::cluster::TempCluster>>>,
}

/// What a store fault does to the run's own PostgreSQL cluster: an outage
/// (4 s or more) stops the server (`pg_ctl stop -m fast`: every session
/// ends, as a restart or failover ends them) and starts it again; a
/// shorter stall freezes its processes (a hung host: nothing answers,
/// nothing ends) and thaws them.
async fn cluster_fault(
    cluster: Arc<std::sync::Mutex<bc_store::postgres::cluster::TempCluster>>,
    d: Duration,
) -> anyhow::Result<()> {
    let outage = d >= Duration::from_secs(4);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = c.lock().expect("cluster");
        if outage { c.stop() } else { c.freeze(true) }
    })
    .await??;
    tokio::time::sleep(d).await;
    tokio::task::spawn_blocking(move || {
        let mut c = cluster.lock().expect("cluster");
        if outage {
            c.start_again()
        } else {
            c.freeze(false)
        }
    })
    .await??;
    Ok(())
}

impl World {
    async fn set_backend(&self, name: &str, listening: Option<Listening>) {
        let addr = listening.map(|l| l.node);
        {
            let mut b = self.backends.lock().expect("backends");
            let mut apis = self.apis.lock().expect("apis");
            match listening {
                Some(l) => {
                    b.insert(name.to_string(), l.node);
                    apis.insert(name.to_string(), l.api)
                }
                None => {
                    b.remove(name);
                    apis.remove(name)
                }
            };
        }
        self.hosts
            .broadcast(Order::Backend {
                name: name.to_string(),
                addr,
            })
            .await;
    }

    /// The operator API on some gateway that is up.
    fn api(&self) -> Option<String> {
        self.apis
            .lock()
            .expect("apis")
            .values()
            .next()
            .map(|a| format!("https://{a}"))
    }

    /// Records how long after `at_ms` each of `nodes` had its first session
    /// (re-home after a kill, and the reconnect storm).
    fn watch_back(&self, nodes: Vec<String>, at_ms: i64, out: Arc<std::sync::Mutex<Vec<i64>>>) {
        let wanted: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
        let mut pending: Vec<usize> = (0..self.node_ids.len())
            .filter(|i| wanted.contains(self.node_ids[*i].as_str()))
            .collect();
        let hosts = self.hosts.clone();
        tokio::spawn(async move {
            let start = better_compute::clock::mono();
            while !pending.is_empty() && start.elapsed() < Duration::from_secs(300) {
                pending.retain(|i| match back_after(hosts.established_ms(*i), at_ms) {
                    Some(ms) => {
                        out.lock().expect("latencies").push(ms);
                        false
                    }
                    None => true,
                });
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }

    async fn apply(self: &Arc<Self>, fault: Fault, rng: &mut SplitMix64) -> anyhow::Result<()> {
        match fault {
            Fault::KillGateway {
                gateway,
                restart_after,
            } => {
                let name = {
                    let mut gws = self.gateways.lock().await;
                    let g = &mut gws[gateway];
                    let nodes = self
                        .store
                        .connected_to(&bc_store::GatewayId::from(&g.name))
                        .await
                        .unwrap_or_default()
                        .into_iter()
                        .map(String::from)
                        .collect::<Vec<_>>();
                    let at_ms = better_compute::clock::unix_ms();
                    // No disconnect writes, no lease release: SIGKILL.
                    let _ = g.child.start_kill();
                    let _ = g.child.wait().await;
                    self.set_backend(&g.name, None).await;
                    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
                    self.kills.lock().await.push(Kill {
                        gateway: g.name.clone(),
                        nodes: nodes.len(),
                        latencies: latencies.clone(),
                    });
                    self.watch_back(nodes, at_ms, latencies);
                    g.name.clone()
                };
                let me = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(restart_after).await;
                    let k = me
                        .restarts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let new = format!("{}-r{k}", name.split("-r").next().unwrap_or(&name));
                    match start_gateway(&me.dir, &new, gateway, &me.config).await {
                        Ok((g, addr)) => {
                            me.set_backend(&new, Some(addr)).await;
                            me.gateways.lock().await[gateway] = g;
                        }
                        Err(e) => eprintln!(
                            "sim: cannot start gateway {new}: {}",
                            bcd_sys::error::chain(e.as_ref())
                        ),
                    }
                });
            }
            Fault::StoreStall(d) => match &self.cluster {
                Some(cluster) => cluster_fault(cluster.clone(), d).await?,
                None => self.store.stall(d).await?,
            },
            Fault::Partition { gateway, for_ } => {
                let name = self.gateways.lock().await[gateway].name.clone();
                self.hosts
                    .broadcast(Order::Partition {
                        name: name.clone(),
                        on: true,
                    })
                    .await;
                let hosts = self.hosts.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(for_).await;
                    hosts.broadcast(Order::Partition { name, on: false }).await;
                });
            }
            Fault::Delay { by, for_ } => {
                self.hosts
                    .broadcast(Order::Delay {
                        ms: by.as_millis() as u64,
                    })
                    .await;
                let hosts = self.hosts.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(for_).await;
                    hosts.broadcast(Order::Delay { ms: 0 }).await;
                });
            }
            Fault::DropLinks(n) => self.hosts.cut(n, false, rng).await,
            Fault::ResetLinks(usize::MAX) => {
                // A reconnect storm: every link at once; time until every
                // node has a session established after the cut, timed as
                // re-home is.
                let at_ms = better_compute::clock::unix_ms();
                self.hosts.cut(usize::MAX, true, rng).await;
                let back = Arc::new(std::sync::Mutex::new(Vec::new()));
                self.watch_back(self.node_ids.clone(), at_ms, back.clone());
                let me = self.clone();
                tokio::spawn(async move {
                    let start = better_compute::clock::mono();
                    while start.elapsed() < Duration::from_secs(120) {
                        let samples = back.lock().expect("latencies").clone();
                        if let Some(ms) = all_back(&samples, me.hosts.nodes) {
                            *me.storm.lock().await = Some(ms as f64 / 1000.0);
                            let mut samples = samples;
                            samples.sort_unstable();
                            *me.storm_samples.lock().await = samples;
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                });
            }
            Fault::ResetLinks(n) => self.hosts.cut(n, true, rng).await,
            Fault::CrashDaemon {
                node,
                restart_after,
            } => {
                self.hosts
                    .to_node(
                        node,
                        Order::Crash {
                            node,
                            restart_after_ms: restart_after.as_millis() as u64,
                        },
                    )
                    .await;
            }
            Fault::LoseJournal(node) => self.hosts.to_node(node, Order::LoseJournal { node }).await,
            Fault::Reboot(node) => self.hosts.to_node(node, Order::Reboot { node }).await,
            Fault::ClockOffset { gateway, by_ms } => {
                std::fs::write(clock_offset_file(&self.dir, gateway), by_ms.to_string())?;
                self.clock_faults
                    .lock()
                    .expect("clock faults")
                    .push((gateway, by_ms));
            }
        }
        Ok(())
    }
}

/// Runs a simulation and returns its report.
pub async fn run(opts: SimOptions) -> anyhow::Result<Report> {
    anyhow::ensure!(opts.nodes > 0, "--nodes must be at least 1");
    anyhow::ensure!(opts.gateways > 0, "--gateways must be at least 1");
    let tmp;
    let dir = match &opts.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new().prefix("bc-sim-").tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let server_dir = dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    let say = |line: String| {
        if opts.progress {
            eprintln!("{line}");
        }
    };

    // The store: SQLite in the server's directory, or PostgreSQL (a
    // throw-away cluster for the run, stopped when the run ends).
    let mut own_cluster = None;
    let (store_kind, pg_url) = match opts.store.as_str() {
        "sqlite" => ("sqlite", None),
        "postgres" | "postgresql" => {
            let cluster = tokio::task::spawn_blocking(|| {
                bc_store::postgres::cluster::TempCluster::start(Default::default())
            })
            .await??;
            let url = cluster.create_database("fleet").await?;
            say(format!(
                "sim: PostgreSQL cluster in {}",
                cluster.dir().display()
            ));
            own_cluster = Some(Arc::new(std::sync::Mutex::new(cluster)));
            ("postgres", Some(url))
        }
        other if bc_store::Location::parse(other).is_postgres() => {
            ("postgres", Some(other.to_string()))
        }
        other => anyhow::bail!(
            "--store takes sqlite, postgres (a throw-away cluster) or a postgres:// address, not {other:?}"
        ),
    };
    let config = GatewayConfig {
        handshake_rate: opts.handshake_rate,
        timings: opts.timings,
        store: pg_url.clone(),
    };
    let location = better_compute::serve::store_location(&server_dir, pg_url.as_deref());

    // The server side: the first gateway creates the CA and the store.
    let mut gateways = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..opts.gateways {
        let name = format!("gw-{i}");
        let (g, addr) = start_gateway(&server_dir, &name, i, &config).await?;
        gateways.push(g);
        addrs.push((name, addr));
    }
    // The first gateway created the store; the simulator reads it too.
    let store = better_compute::serve::open_store(&location).await?;
    let api = format!("https://{}", addrs[0].1.api);
    let mut admin =
        better_compute::client::connect(&server_dir.join("operator.json"), Some(&api)).await?;
    let tokens = mint_tokens(&admin, opts.nodes, opts.join_tokens).await?;

    // The fleet: agent hosts, which start their nodes once they know the
    // gateways.
    let nodes_dir = opts.node_state.place(&dir.join("nodes"))?;
    let hosts =
        Arc::new(Hosts::start(nodes_dir.path(), opts.nodes, opts.seed, opts.gpus, &tokens).await?);
    say(format!(
        "sim: {} gateways, {} nodes in {} agent hosts, chaos {}, seed {}",
        opts.gateways,
        opts.nodes,
        opts.nodes.div_ceil(host::NODES_PER_HOST),
        format!("{:?}", opts.chaos).to_lowercase(),
        opts.seed
    ));
    let world = Arc::new(World {
        dir: server_dir.clone(),
        store: store.clone(),
        hosts: hosts.clone(),
        gateways: Mutex::new(gateways),
        backends: std::sync::Mutex::new(BTreeMap::new()),
        apis: std::sync::Mutex::new(BTreeMap::new()),
        kills: Mutex::new(Vec::new()),
        restarts: std::sync::atomic::AtomicUsize::new(0),
        storm: Mutex::new(None),
        storm_samples: Mutex::new(Vec::new()),
        node_ids: Vec::new(),
        config,
        clock_faults: std::sync::Mutex::new(Vec::new()),
        cluster: own_cluster.clone(),
    });
    let started = better_compute::clock::mono();
    for (name, addr) in &addrs {
        world.set_backend(name, Some(*addr)).await;
    }
    let connect_deadline = Duration::from_secs(60 + opts.nodes as u64 / 50);
    let mut next_progress = better_compute::clock::mono() + Duration::from_secs(1);
    loop {
        let t = hosts.totals();
        if t.connected == opts.nodes {
            break;
        }
        if better_compute::clock::mono() >= next_progress {
            next_progress += Duration::from_secs(1);
            say(format!(
                "sim: {:>4.0}s joining and connecting: {}/{} connected",
                started.elapsed().as_secs_f64(),
                t.connected,
                opts.nodes
            ));
        }
        anyhow::ensure!(
            started.elapsed() < connect_deadline,
            "only {}/{} nodes connected in {:?}; see the logs in {}",
            t.connected,
            opts.nodes,
            connect_deadline,
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let connect_s = started.elapsed().as_secs_f64();
    let hellos = hosts.totals().sessions as f64 / connect_s / opts.gateways as f64;
    let tokens_unspent = match opts.join_tokens {
        JoinTokens::OneUse => Some(
            store
                .list_tokens(false)
                .await?
                .iter()
                .filter(|t| t.description == MINTED_FOR)
                .count(),
        ),
        JoinTokens::Shared => None,
    };
    say(format!(
        "sim: {} nodes connected in {connect_s:.1}s",
        opts.nodes
    ));
    let node_ids: Vec<String> = (0..opts.nodes)
        .map(|i| node_id_of(&hosts.node_dir(i)).unwrap_or_default())
        .collect();
    // The world learns the node ids now that every node joined.
    let world = Arc::new(World {
        node_ids: node_ids.clone(),
        ..Arc::into_inner(world).expect("not shared yet")
    });

    // Chaos and the workload, side by side.
    let schedule = chaos::schedule(
        opts.chaos,
        opts.seed,
        opts.nodes,
        opts.gateways,
        opts.duration,
    );
    let mut faults: BTreeMap<String, usize> = BTreeMap::new();
    for (_, f) in &schedule {
        *faults.entry(f.kind().to_string()).or_default() += 1;
    }
    let chaos_task = {
        let world = world.clone();
        let seed = opts.seed;
        tokio::spawn(async move {
            let mut rng = SplitMix64::new(seed ^ 0x11_4e5);
            let t0 = better_compute::clock::mono();
            for (at, fault) in schedule {
                tokio::time::sleep_until((t0 + at).into()).await;
                let kind = fault.kind();
                if let Err(e) = world.apply(fault, &mut rng).await {
                    eprintln!(
                        "sim: fault {kind} failed: {}",
                        bcd_sys::error::chain(e.as_ref())
                    );
                }
            }
        })
    };
    let mut rng = SplitMix64::new(opts.seed ^ 0x30_7c1d);
    let total_commands = (opts.nodes / 2).max(20);
    let mut issued: BTreeMap<String, (String, usize)> = BTreeMap::new(); // marker → (command id, node)
    let mut counted: BTreeSet<String> = BTreeSet::new();
    let t0 = better_compute::clock::mono();
    let mut next_progress = better_compute::clock::mono();
    let mut marks: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut assigned = 0usize;
    let mut k = 0usize;
    while t0.elapsed() < opts.duration {
        // Spread the commands over the first 80% of the window.
        let due = ((t0.elapsed().as_secs_f64() / (opts.duration.as_secs_f64() * 0.8))
            * total_commands as f64)
            .min(total_commands as f64) as usize;
        while k < due {
            let i = (rng.next_u64() % opts.nodes as u64) as usize;
            let marker = format!("m{k}");
            let effects = hosts.node_dir(i).join("effects");
            let script = format!("echo {marker} >> {}", effects.display());
            let r = admin
                .run_command(bcd_proto::v1::RunCommandRequest {
                    node_id: node_ids[i].clone(),
                    kind: bcd_proto::v1::CommandKind::ExecRun as i32,
                    args: vec!["/bin/sh".into(), "-c".into(), script],
                    not_after_ms: 0,
                    min_generation: 0,
                    idempotency_key: marker.clone(),
                    timeout_ms: 30_000,
                })
                .await;
            match r {
                Ok(c) => {
                    let id = c.into_inner().command_id;
                    counted.insert(id.clone());
                    issued.insert(marker, (id, i));
                }
                // A stalled or restarting gateway: try this one again.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    admin = reconnect(&server_dir, &world).await?;
                    continue;
                }
            }
            k += 1;
        }
        // GPU assignments for a tenth of the nodes, changing under chaos.
        let want = (t0.elapsed().as_secs_f64() / opts.duration.as_secs_f64()
            * (opts.nodes / 10).max(1) as f64) as usize;
        while assigned < want.min(opts.nodes) {
            let i = assigned;
            let r = admin
                .assign_gpus(bcd_proto::v1::AssignGpusRequest {
                    secrets: Vec::new(),
                    node_id: node_ids[i].clone(),
                    allocation_id: format!("alloc-{i}"),
                    gpus: vec!["0".into(), "1".into()],
                    env: Default::default(),
                })
                .await;
            if r.is_err() {
                admin = reconnect(&server_dir, &world).await?;
                break;
            }
            assigned += 1;
        }
        if better_compute::clock::mono() >= next_progress {
            next_progress += Duration::from_secs(1);
            let t = hosts.totals();
            say(format!(
                "sim: {:>4.0}s {:>6}/{} connected, {} commands issued, {} links",
                t0.elapsed().as_secs_f64(),
                t.connected,
                opts.nodes,
                k,
                t.links
            ));
            // Sample the server time marks halfway.
            if marks.is_empty() && t0.elapsed() >= opts.duration / 2 {
                for (i, id) in node_ids.iter().enumerate() {
                    if let Some(m) = mark_of(&hosts.node_dir(i)) {
                        marks.entry(id.clone()).or_default().push(m);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = chaos_task.await;

    // Settle: every node back, every command finished (or a timeout).
    let settle_start = better_compute::clock::mono();
    let settle_limit = Duration::from_secs(60 + opts.nodes as u64 / 100);
    let mut settled = false;
    loop {
        let t = hosts.totals();
        let (open, unapplied) = store
            .settling()
            .await
            .map_or((usize::MAX, usize::MAX), |s| {
                (s.open_commands, s.unapplied_specs)
            });
        if opts.progress && settle_start.elapsed().as_millis() % 1000 < 250 {
            eprintln!(
                "sim: settling: {}/{} connected, {open} commands open, {unapplied} specs not applied",
                t.connected, opts.nodes
            );
        }
        match settle_step(
            t.connected,
            opts.nodes,
            open,
            unapplied,
            settle_start.elapsed(),
            settle_limit,
        ) {
            Settle::Settled => {
                settled = true;
                break;
            }
            Settle::GaveUp => break,
            Settle::Waiting => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let settle_s = settle_start.elapsed().as_secs_f64();
    let connected_at_end = hosts.totals().connected;
    // What the store says of the same moment, before the nodes stop.
    let connected_in_store = store.fleet_size().await?.connected;
    // Which gateways said their clock was off.
    let clock_faults: Vec<ClockFault> = {
        let faults = world.clock_faults.lock().expect("clock faults").clone();
        let logs: Vec<(String, String)> = std::fs::read_dir(&server_dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let gw = name.strip_suffix(".log")?.to_string();
                gw.starts_with("gw-")
                    .then(|| (gw, std::fs::read_to_string(e.path()).unwrap_or_default()))
            })
            .collect();
        faults
            .into_iter()
            .map(|(slot, offset_ms)| {
                let base = format!("gw-{slot}");
                ClockFault {
                    raised: logs.iter().any(|(gw, log)| {
                        (gw == &base || gw.starts_with(&format!("{base}-r")))
                            && log.contains("ClockSkew")
                    }),
                    gateway: base,
                    offset_ms,
                }
            })
            .collect()
    };

    // Re-home latencies.
    let mut rehome = Vec::new();
    for kill in world.kills.lock().await.iter() {
        let mut lat = kill.latencies.lock().expect("latencies").clone();
        lat.sort_unstable();
        rehome.push(Rehome {
            gateway: kill.gateway.clone(),
            nodes: kill.nodes,
            rehomed: lat.len(),
            p50_ms: percentile(&lat, 0.5),
            p99_ms: percentile(&lat, 0.99),
            max_ms: lat.last().copied().unwrap_or(0),
            samples_ms: lat,
        });
    }

    // Stop the nodes (they persist their marks), then check.
    let final_stats = hosts.stop().await;
    for (i, id) in node_ids.iter().enumerate() {
        if let Some(m) = mark_of(&hosts.node_dir(i)) {
            marks.entry(id.clone()).or_default().push(m);
        }
    }
    let mut effects: BTreeMap<String, u32> = BTreeMap::new();
    for i in 0..opts.nodes {
        if let Ok(text) = std::fs::read_to_string(hosts.node_dir(i).join("effects")) {
            for marker in text.lines() {
                if let Some((id, _)) = issued.get(marker.trim()) {
                    *effects.entry(id.clone()).or_default() += 1;
                }
            }
        }
    }
    let flags = opts.timings.flags();
    let timings = check::Timings {
        node_lease_ttl: humantime::parse_duration(flags[2].1)?,
        gateway_loss_grace: humantime::parse_duration(flags[3].1)?,
    };
    let snapshot = check::snapshot(
        &store,
        timings,
        Duration::from_secs(2),
        check::NodeFacts {
            effects,
            counted,
            marks,
        },
        check::fleet_ca(&server_dir).as_deref(),
    )
    .await?;
    let invariants = check::all(&snapshot);
    let after_restart = restart_all(&world, &server_dir, &store, &snapshot).await?;
    let mut commands: BTreeMap<String, usize> = BTreeMap::new();
    for c in &snapshot.commands {
        *commands.entry(c.state.clone()).or_default() += 1;
    }
    for g in world.gateways.lock().await.iter_mut() {
        if let Some(pid) = g.child.id() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).expect("a child's pid is positive"),
                rustix::process::Signal::TERM,
            );
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), g.child.wait()).await;
    }
    let mut report = Report {
        nodes: opts.nodes,
        gateways: opts.gateways,
        store: store_kind.to_string(),
        node_state: format!("{:?}", opts.node_state).to_lowercase(),
        settled,
        settle_limit_s: settle_limit.as_secs_f64(),
        clock_faults,
        chaos: format!("{:?}", opts.chaos).to_lowercase(),
        peak_hellos_per_s: peak_hellos(&snapshot.audit),
        storm_s: *world.storm.lock().await,
        storm_samples_ms: world.storm_samples.lock().await.clone(),
        seed: opts.seed,
        join_tokens: opts.join_tokens.word(),
        power_on_per_s: opts.nodes as f64 / connect_s,
        tokens_unspent,
        connect_s,
        hellos_per_s_per_gateway: hellos,
        connected_at_end,
        connected_in_store,
        settle_s,
        commands_issued: k,
        commands,
        faults,
        rehome,
        peak_kib_per_node: final_stats.peak_rss_kib / opts.nodes as u64,
        invariants,
        after_restart,
        ok: false,
    };
    report.ok = report.failure().is_none();
    Ok(report)
}

/// The description of the tokens the simulator mints.
const MINTED_FOR: &str = "bc sim";

/// The join tokens for `nodes` machines: one each, used once, or one for
/// all of them.
async fn mint_tokens(
    admin: &better_compute::client::Admin,
    nodes: usize,
    kind: JoinTokens,
) -> anyhow::Result<Vec<String>> {
    let (count, uses) = match kind {
        JoinTokens::OneUse => (nodes, 1),
        JoinTokens::Shared => (1, nodes as u32),
    };
    let mut tokens = vec![String::new(); count];
    let mut minting = tokio::task::JoinSet::new();
    for i in 0..count {
        if minting.len() >= MINTING_AT_ONCE
            && let Some(done) = minting.join_next().await
        {
            let (k, token) = done??;
            tokens[k] = token;
        }
        let mut admin = admin.clone();
        minting.spawn(async move {
            let token = admin
                .create_token(bcd_proto::v1::CreateTokenRequest {
                    ttl_ms: 0,
                    uses,
                    description: MINTED_FOR.into(),
                    pool: String::new(),
                })
                .await
                .map_err(better_compute::client::status)?
                .into_inner()
                .token;
            anyhow::Ok((i, token))
        });
    }
    while let Some(done) = minting.join_next().await {
        let (k, token) = done??;
        tokens[k] = token;
    }
    Ok(tokens)
}

/// Kills every gateway and starts it again under its name (each start
/// reconciles the store); then compares and checks again.
async fn restart_all(
    world: &Arc<World>,
    dir: &Path,
    store: &Store,
    before: &check::Snapshot,
) -> anyhow::Result<AfterRestart> {
    let mut gws = world.gateways.lock().await;
    for (slot, g) in gws.iter_mut().enumerate() {
        let _ = g.child.start_kill();
        let _ = g.child.wait().await;
        let (again, addr) = start_gateway(dir, &g.name, slot, &world.config)
            .await
            .with_context(|| format!("cannot start gateway {} again", g.name))?;
        world.set_backend(&g.name, Some(addr)).await;
        *g = again;
    }
    let restarted = gws.len();
    drop(gws);
    let after = check::snapshot(
        store,
        before.timings,
        before.settle,
        before.facts.clone(),
        check::fleet_ca(dir).as_deref(),
    )
    .await?;
    let (was, is) = (authoritative(before), authoritative(&after));
    let drift = was
        .symmetric_difference(&is)
        .map(|line| {
            if was.contains(line) {
                format!("gone after the restart: {line}")
            } else {
                format!("new after the restart: {line}")
            }
        })
        .collect();
    Ok(AfterRestart {
        gateways_restarted: restarted,
        drift,
        invariants: check::all(&after),
    })
}

/// A new operator connection, to a gateway that is up.
async fn reconnect(dir: &Path, world: &World) -> anyhow::Result<better_compute::client::Admin> {
    let deadline = better_compute::clock::mono() + Duration::from_secs(30);
    loop {
        let api = world.api();
        match better_compute::client::connect(&dir.join("operator.json"), api.as_deref()).await {
            Ok(c) => return Ok(c),
            Err(e) if better_compute::clock::mono() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The most routes (Hello transactions) one gateway committed in one
/// second, from the audit history.
fn peak_hellos(audit: &[check::Audit]) -> u64 {
    let mut per_second: BTreeMap<(&str, i64), u64> = BTreeMap::new();
    for a in audit.iter().filter(|a| a.kind == "route") {
        *per_second
            .entry((a.gateway_id.as_str(), a.at.div_euclid(1000)))
            .or_default() += 1;
    }
    per_second.values().copied().max().unwrap_or(0)
}

impl Report {
    /// Why the run failed, worded for the exit: a fleet that did not
    /// settle fails it whatever the checkers found in what did happen; so
    /// does a store that does not agree with the agents on who is
    /// connected, and any invariant violated (before or after the restart).
    pub fn failure(&self) -> Option<String> {
        if !self.settled {
            return Some(format!(
                "the fleet did not settle within {:.0}s: {} of {} connected at the end (see the report)",
                self.settle_limit_s, self.connected_at_end, self.nodes
            ));
        }
        if self.connected_in_store != self.nodes {
            return Some(format!(
                "the store has {} of {} nodes connected where the agents count {} (see the report)",
                self.connected_in_store, self.nodes, self.connected_at_end
            ));
        }
        if !self.invariants.iter().all(|o| o.held()) || !self.after_restart.held() {
            return Some("an invariant was violated (see the report)".into());
        }
        None
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "bc-sim: {} nodes ({} state), {} gateways on {}, chaos {}, seed {}\n",
            self.nodes, self.node_state, self.gateways, self.store, self.chaos, self.seed
        ));
        s.push_str(&format!(
            "  powered on: {} machines joined ({} tokens) and connected in {:.1}s ({:.0} a second, {:.0} Hellos/s per gateway); {} of {} connected at the end, {} in the store (settled in {:.1}s)\n",
            self.nodes,
            self.join_tokens,
            self.connect_s,
            self.power_on_per_s,
            self.hellos_per_s_per_gateway,
            self.connected_at_end,
            self.nodes,
            self.connected_in_store,
            self.settle_s
        ));
        let outcomes: Vec<String> = self
            .commands
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        s.push_str(&format!(
            "  commands: {} issued; {}\n",
            self.commands_issued,
            outcomes.join(", ")
        ));
        if self.faults.is_empty() {
            s.push_str("  faults: none\n");
        } else {
            let f: Vec<String> = self
                .faults
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            s.push_str(&format!("  faults: {}\n", f.join(", ")));
        }
        if self.connected_in_store != self.nodes {
            s.push_str(&format!(
                "  THE STORE DISAGREES: {} of {} nodes connected in its sessions, {} by the agents' count\n",
                self.connected_in_store, self.nodes, self.connected_at_end
            ));
        }
        if !self.settled {
            s.push_str(&format!(
                "  DID NOT SETTLE within {:.0}s: {} of {} connected, or commands or specs still open\n",
                self.settle_limit_s, self.connected_at_end, self.nodes
            ));
        }
        for c in &self.clock_faults {
            s.push_str(&format!(
                "  clock fault: {}'s host clock stepped {:+.1}s; ClockSkew {}\n",
                c.gateway,
                c.offset_ms as f64 / 1000.0,
                if c.raised { "raised" } else { "NOT raised" }
            ));
        }
        for r in &self.rehome {
            s.push_str(&format!(
                "  re-home after killing {}: {}/{} nodes, p50 {} ms, p99 {} ms, max {} ms\n",
                r.gateway, r.rehomed, r.nodes, r.p50_ms, r.p99_ms, r.max_ms
            ));
        }
        s.push_str(&format!(
            "  Hello transactions: at most {} in one second on one gateway\n",
            self.peak_hellos_per_s
        ));
        if let Some(t) = self.storm_s {
            s.push_str(&format!(
                "  reconnect storm (every link reset at once): all {} nodes back in {t:.2}s\n",
                self.nodes
            ));
        }
        s.push_str(&format!(
            "  peak memory: {} KiB per simulated node\n",
            self.peak_kib_per_node
        ));
        s.push_str("  invariants:\n");
        for line in check::render(&self.invariants).lines() {
            s.push_str(&format!("    {line}\n"));
        }
        let r = &self.after_restart;
        s.push_str(&format!(
            "  after restart ({} gateways killed and started again, each reconciling): {}\n",
            r.gateways_restarted,
            if r.drift.is_empty() {
                "no drift in commands, bindings, specs or nodes".to_string()
            } else {
                format!("{} differences", r.drift.len())
            }
        ));
        for line in r.drift.iter().take(10) {
            s.push_str(&format!("    - {line}\n"));
        }
        for line in check::render(&r.invariants).lines() {
            s.push_str(&format!("    {line}\n"));
        }
        match self.failure() {
            None => s.push_str("  every invariant held and the fleet settled\n"),
            Some(why) => s.push_str(&format!("  FAILED: {why}\n")),
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(violations: Vec<String>) -> check::Outcome {
        check::Outcome {
            name: "test",
            title: "a test invariant",
            checked: 1,
            what: "things",
            violations,
        }
    }

    fn settled_report() -> Report {
        Report {
            nodes: 10,
            gateways: 2,
            store: "sqlite".into(),
            node_state: "disk".into(),
            chaos: "none".into(),
            seed: 1,
            join_tokens: "one-use".into(),
            power_on_per_s: 10.0,
            tokens_unspent: Some(0),
            connect_s: 1.0,
            hellos_per_s_per_gateway: 5.0,
            peak_hellos_per_s: 5,
            storm_s: None,
            storm_samples_ms: Vec::new(),
            connected_at_end: 10,
            connected_in_store: 10,
            settled: true,
            settle_s: 0.5,
            settle_limit_s: 60.0,
            clock_faults: vec![],
            commands: BTreeMap::new(),
            commands_issued: 0,
            faults: BTreeMap::new(),
            rehome: vec![],
            peak_kib_per_node: 100,
            invariants: vec![outcome(vec![])],
            after_restart: AfterRestart {
                gateways_restarted: 2,
                drift: vec![],
                invariants: vec![outcome(vec![])],
            },
            ok: true,
        }
    }

    #[test]
    fn the_fleet_settles_only_whole_and_gives_up_past_its_limit() {
        let (s, limit) = (Duration::from_secs, Duration::from_secs(60));
        assert_eq!(settle_step(10, 10, 0, 0, s(0), limit), Settle::Settled);
        assert_eq!(settle_step(10, 10, 0, 0, s(61), limit), Settle::Settled);
        assert_eq!(settle_step(9, 10, 0, 0, s(59), limit), Settle::Waiting);
        assert_eq!(settle_step(10, 10, 1, 0, s(59), limit), Settle::Waiting);
        assert_eq!(settle_step(10, 10, 0, 1, s(59), limit), Settle::Waiting);
        assert_eq!(settle_step(9, 10, 0, 0, s(61), limit), Settle::GaveUp);
        // A store that cannot say counts as open.
        assert_eq!(
            settle_step(10, 10, usize::MAX, usize::MAX, s(61), limit),
            Settle::GaveUp
        );
    }

    #[test]
    fn a_fleet_that_did_not_settle_fails_the_run_whatever_else_held() {
        let r = settled_report();
        assert_eq!(r.failure(), None);
        assert!(
            r.render()
                .contains("every invariant held and the fleet settled")
        );
        let r = Report {
            settled: false,
            connected_at_end: 9,
            ..settled_report()
        };
        let why = r.failure().unwrap();
        assert_eq!(
            why,
            "the fleet did not settle within 60s: 9 of 10 connected at the end (see the report)"
        );
        let text = r.render();
        assert!(
            text.contains("DID NOT SETTLE within 60s: 9 of 10 connected"),
            "{text}"
        );
        assert!(text.contains(&format!("FAILED: {why}")), "{text}");
        // A store that disagrees with the agents fails it too.
        let r = Report {
            connected_in_store: 11,
            ..settled_report()
        };
        assert!(
            r.failure()
                .unwrap()
                .contains("the store has 11 of 10 nodes connected")
        );
        assert!(r.render().contains("THE STORE DISAGREES"));
        // And an invariant violated after the restart.
        let mut r = settled_report();
        r.after_restart.invariants = vec![outcome(vec!["two sessions".into()])];
        assert_eq!(
            r.failure().as_deref(),
            Some("an invariant was violated (see the report)")
        );
    }

    /// A node is back with a session from after the cut, not while its
    /// host still reports it connected on the old one; the storm ends with
    /// the last node back.
    #[test]
    fn the_storm_ends_when_every_node_has_a_session_from_after_the_cut() {
        let cut = 10_000;
        assert_eq!(back_after(9_999, cut), None);
        assert_eq!(back_after(10_000, cut), None, "at the cut is before it");
        assert_eq!(back_after(12_000, cut), Some(2_000));
        assert_eq!(all_back(&[2_000, 400], 3), None);
        assert_eq!(all_back(&[2_000, 400, 1], 3), Some(2_000));
    }
}
