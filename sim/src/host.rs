//! Agent hosts: the simulated fleet runs in a few child processes
//! (`bc-sim host`), each with up to [`NODES_PER_HOST`] agents
//! and its own balancer in front of every gateway, so no process needs more
//! open files than a default limit allows (each agent costs a journal, a TLS
//! socket and the two sockets of its link through the balancer).
//!
//! The parent drives its hosts with one JSON line per order on their stdin
//! ([`Order`]) and reads one JSON line of [`Stats`] from each every 100 ms.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bcd_core::SplitMix64;
use bcd_fakehw::sim::Fleet;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::proxy::Balancer;

/// Agents per host process: 8 open files each stay under 20,000.
pub const NODES_PER_HOST: usize = 2000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Order {
    Backend {
        name: String,
        addr: Option<SocketAddr>,
    },
    Partition {
        name: String,
        on: bool,
    },
    Delay {
        ms: u64,
    },
    /// Cut `n` links (every link with `n` = usize::MAX).
    Cut {
        n: usize,
        reset: bool,
        seed: u64,
    },
    Crash {
        node: usize,
        restart_after_ms: u64,
    },
    LoseJournal {
        node: usize,
    },
    Reboot {
        node: usize,
    },
    Stop,
}

/// What a host reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stats {
    pub connected: usize,
    pub sessions: u64,
    pub dial_failures: u64,
    pub links: usize,
    pub peak_rss_kib: u64,
    /// (node, unix ms of its last session established) for nodes whose
    /// value changed since the last report.
    pub established: Vec<(usize, i64)>,
    /// Set in the last report, after the agents stopped.
    pub stopped: bool,
}

/// The options a host runs with.
#[derive(Debug, Clone, clap::Args)]
pub struct HostOptions {
    /// Where the nodes' directories are.
    #[arg(long)]
    pub dir: PathBuf,
    /// The first node's number, and how many.
    #[arg(long)]
    pub first: usize,
    #[arg(long)]
    pub count: usize,
    #[arg(long)]
    pub seed: u64,
    #[arg(long)]
    pub gpus: usize,
    /// The token every node of this host joins with.
    #[arg(
        long,
        env = "BC_SIM_TOKEN",
        hide_env_values = true,
        required_unless_present = "tokens_file"
    )]
    pub token: Option<String>,
    /// A token for each node of this host, one per line, in order.
    #[arg(long, conflicts_with = "token")]
    pub tokens_file: Option<PathBuf>,
    /// The address this host's links to the gateways come from.
    #[arg(long)]
    pub source: Option<std::net::IpAddr>,
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// The child: `bc-sim host`. Prints the balancer's address,
/// then stats lines until told to stop.
pub async fn run_host(opts: HostOptions) -> anyhow::Result<()> {
    let tokens = match (&opts.tokens_file, &opts.token) {
        (Some(file), _) => std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?
            .lines()
            .map(str::to_string)
            .collect(),
        (None, Some(token)) => vec![token.clone()],
        (None, None) => anyhow::bail!("an agent host needs --token or --tokens-file"),
    };
    let balancer = Balancer::start_from(opts.source).await?;
    let fleet = Arc::new(Fleet::new(&bcd_fakehw::sim::SimOptions {
        nodes: opts.count,
        first: opts.first,
        server: format!("https://{}", balancer.addr),
        tokens,
        data_dir: opts.dir.clone(),
        seed: opts.seed,
        gpus: opts.gpus,
        join_concurrency: 32,
        duration: None,
    })?);
    let mut stdout = tokio::io::stdout();
    stdout
        .write_all(format!("balancer {}\n", balancer.addr).as_bytes())
        .await?;
    stdout.flush().await?;
    let mut started = false;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last: Vec<i64> = vec![0; opts.count];
    let local = |node: usize| node.checked_sub(opts.first).filter(|i| *i < opts.count);
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else { break };
                let order: Order = serde_json::from_str(&line)?;
                match order {
                    Order::Backend { name, addr } => {
                        balancer.set_backend(&name, addr);
                        if !started && addr.is_some() {
                            started = true;
                            fleet.start_all();
                        }
                    }
                    Order::Partition { name, on } => balancer.blackhole(&name, on),
                    Order::Delay { ms } => balancer.set_delay(Duration::from_millis(ms)),
                    Order::Cut { n, reset, seed } => {
                        let mut rng = SplitMix64::new(seed);
                        let mut k = 0usize;
                        let all = n == usize::MAX;
                        balancer.cut(n, reset, |len| {
                            k += 1;
                            if all { (k - 1) % len } else { (rng.next_u64() % len as u64) as usize }
                        });
                    }
                    Order::Crash { node, restart_after_ms } => {
                        if let Some(i) = local(node) {
                            fleet.crash(i).await;
                            let fleet = fleet.clone();
                            tokio::spawn(async move {
                                tokio::time::sleep(Duration::from_millis(restart_after_ms)).await;
                                fleet.start(i);
                            });
                        }
                    }
                    Order::LoseJournal { node } => {
                        if let Some(i) = local(node) {
                            fleet.lose_journal(i).await;
                        }
                    }
                    Order::Reboot { node } => {
                        if let Some(i) = local(node) {
                            fleet.reboot(i).await;
                        }
                    }
                    Order::Stop => break,
                }
            }
            _ = tick.tick() => {
                let stats = report(&fleet, &balancer, &mut last, false);
                stdout.write_all(format!("{}\n", serde_json::to_string(&stats)?).as_bytes()).await?;
                stdout.flush().await?;
            }
        }
    }
    fleet.stop().await;
    let stats = report(&fleet, &balancer, &mut last, true);
    stdout
        .write_all(format!("{}\n", serde_json::to_string(&stats)?).as_bytes())
        .await?;
    stdout.flush().await?;
    Ok(())
}

fn report(fleet: &Fleet, balancer: &Balancer, last: &mut [i64], stopped: bool) -> Stats {
    let t = fleet.totals();
    let mut established = Vec::new();
    for (j, n) in fleet.nodes.iter().enumerate() {
        let e = n
            .stats
            .established_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        if e != last[j] {
            last[j] = e;
            established.push((n.index, e));
        }
    }
    Stats {
        connected: t.connected,
        sessions: t.sessions,
        dial_failures: t.dial_failures,
        links: balancer.links_by_backend().values().sum(),
        peak_rss_kib: peak_rss_kib(),
        established,
        stopped,
    }
}

/// The parent's side: the hosts, their latest stats, and each node's last
/// session time.
#[derive(Debug)]
pub struct Hosts {
    pub nodes: usize,
    per_host: usize,
    dir: PathBuf,
    stdins: Vec<tokio::sync::Mutex<tokio::process::ChildStdin>>,
    children: tokio::sync::Mutex<Vec<tokio::process::Child>>,
    stats: Arc<std::sync::Mutex<Vec<Stats>>>,
    established: Arc<std::sync::Mutex<BTreeMap<usize, i64>>>,
    done: Arc<tokio::sync::Notify>,
}

impl Hosts {
    /// Starts enough hosts for `nodes`; they join once they learn a
    /// backend.
    pub async fn start(
        dir: &Path,
        nodes: usize,
        seed: u64,
        gpus: usize,
        tokens: &[String],
    ) -> anyhow::Result<Hosts> {
        let exe = std::env::current_exe()?;
        let count = nodes.div_ceil(NODES_PER_HOST).max(1);
        let per_host = nodes.div_ceil(count);
        let stats = Arc::new(std::sync::Mutex::new(vec![Stats::default(); count]));
        let established = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let done = Arc::new(tokio::sync::Notify::new());
        let mut stdins = Vec::new();
        let mut children = Vec::new();
        for h in 0..count {
            let first = h * per_host;
            let n = per_host.min(nodes - first);
            let log = std::fs::File::create(dir.join(format!("host-{h}.log")))?;
            let mut cmd = tokio::process::Command::new(&exe);
            cmd.arg("host");
            if let [token] = tokens {
                cmd.env("BC_SIM_TOKEN", token);
            } else {
                // This host's nodes' own tokens, readable by this user alone.
                let file = dir.join(format!("host-{h}.tokens"));
                bcd_sys::fs::atomic_write(
                    &file,
                    tokens[first..first + n].join("\n").as_bytes(),
                    0o600,
                )?;
                cmd.arg("--tokens-file")
                    .arg(&file)
                    .env_remove("BC_SIM_TOKEN");
            }
            let mut child = cmd
                .arg("--dir")
                .arg(dir)
                .args(["--first", &first.to_string(), "--count", &n.to_string()])
                .args(["--seed", &seed.to_string(), "--gpus", &gpus.to_string()])
                .args(["--source", &super::proxy::host_source(h).to_string()])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()?;
            let stdout = child.stdout.take().expect("piped");
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let first_line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .map_err(|_| anyhow::anyhow!("agent host {h} did not start; see host-{h}.log"))??
                .unwrap_or_default();
            anyhow::ensure!(
                first_line.starts_with("balancer "),
                "agent host {h} failed to start; see host-{h}.log in {}",
                dir.display()
            );
            let (stats, established, done) = (stats.clone(), established.clone(), done.clone());
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    let Ok(s) = serde_json::from_str::<Stats>(&line) else {
                        continue;
                    };
                    {
                        let mut e = established.lock().expect("established");
                        for (node, ms) in &s.established {
                            e.insert(*node, *ms);
                        }
                    }
                    let stopped = s.stopped;
                    stats.lock().expect("stats")[h] = s;
                    if stopped {
                        done.notify_waiters();
                    }
                }
            });
            stdins.push(tokio::sync::Mutex::new(
                child.stdin.take().expect("piped stdin"),
            ));
            children.push(child);
        }
        Ok(Hosts {
            nodes,
            per_host,
            dir: dir.to_path_buf(),
            stdins,
            children: tokio::sync::Mutex::new(children),
            stats,
            established,
            done,
        })
    }

    async fn send_to(&self, h: usize, order: &Order) {
        let line = format!("{}\n", serde_json::to_string(order).expect("serializes"));
        let mut stdin = self.stdins[h].lock().await;
        let _ = stdin.write_all(line.as_bytes()).await;
        let _ = stdin.flush().await;
    }

    /// To every host.
    pub async fn broadcast(&self, order: Order) {
        for h in 0..self.stdins.len() {
            self.send_to(h, &order).await;
        }
    }

    /// To the host that runs `node`.
    pub async fn to_node(&self, node: usize, order: Order) {
        self.send_to(node / self.per_host, &order).await;
    }

    /// Cuts about `n` links over the hosts (all with usize::MAX).
    pub async fn cut(&self, n: usize, reset: bool, rng: &mut SplitMix64) {
        let each = if n == usize::MAX {
            usize::MAX
        } else {
            n.div_ceil(self.stdins.len())
        };
        for h in 0..self.stdins.len() {
            let order = Order::Cut {
                n: each,
                reset,
                seed: rng.next_u64(),
            };
            self.send_to(h, &order).await;
        }
    }

    pub fn totals(&self) -> Stats {
        let s = self.stats.lock().expect("stats");
        let mut t = Stats::default();
        for x in s.iter() {
            t.connected += x.connected;
            t.sessions += x.sessions;
            t.dial_failures += x.dial_failures;
            t.links += x.links;
            t.peak_rss_kib += x.peak_rss_kib;
        }
        t
    }

    pub fn established_ms(&self, node: usize) -> i64 {
        self.established
            .lock()
            .expect("established")
            .get(&node)
            .copied()
            .unwrap_or(0)
    }

    pub fn node_dir(&self, node: usize) -> PathBuf {
        self.dir.join(format!("node-{node:05}"))
    }

    /// Stops every agent (they persist their marks), then the hosts.
    pub async fn stop(&self) -> Stats {
        self.broadcast(Order::Stop).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let all = self.stats.lock().expect("stats").iter().all(|s| s.stopped);
            if all || tokio::time::Instant::now() > deadline {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), self.done.notified()).await;
        }
        for c in self.children.lock().await.iter_mut() {
            let _ = tokio::time::timeout(Duration::from_secs(10), c.wait()).await;
        }
        self.totals()
    }
}
