//! Many agents on fake hardware in one process, each with its own data directory,
//! key, certificate, journal and TLS session. The agents are the real agent
//! code; only the hardware under them is fake.
//!
//! [`Fleet`] holds a handle per node so a simulator can do to one node what
//! happens to machines: the daemon crashes (its task dies at whatever it
//! was waiting on, with only what it made durable), the journal is lost,
//! the machine reboots. `bcd sim` runs a fleet until stopped;
//! `bc-sim` adds gateways, chaos and the invariant checks.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bcd_proto::token::JoinToken;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use bcd_agent::converge::{DeviceDirs, Nft, SshdDirs};
use bcd_agent::lock::DirLock;
use bcd_agent::node::{self, Stats, Stopped};
use bcd_agent::{identity, join};

use crate::host::FakeHost;

#[derive(Debug, Clone)]
pub struct SimOptions {
    pub nodes: usize,
    /// The first node's number: a fleet split over processes numbers its
    /// nodes (directories, seeds, hostnames) from here.
    pub first: usize,
    pub server: String,
    /// Join tokens: one that every node joins with, or one per node (node
    /// `first + k` joins with the `k`-th), as a rack installed with a
    /// one-use token per machine does.
    pub tokens: Vec<String>,
    pub data_dir: PathBuf,
    pub seed: u64,
    pub gpus: usize,
    pub join_concurrency: usize,
    pub duration: Option<Duration>,
}

/// Lets one process hold a socket and a journal for each of many agents:
/// the open-file limit goes to the hard limit, and for root past it up to
/// the kernel's `fs.nr_open`. Returns the limit now in force.
pub fn raise_fd_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let mut tries = Vec::new();
    if let Some(n) = nr_open {
        tries.push(Rlimit {
            current: Some(n),
            maximum: Some(n),
        });
    }
    if let Some(max) = lim.maximum {
        tries.push(Rlimit {
            current: Some(max),
            maximum: Some(max),
        });
    }
    for t in tries {
        if setrlimit(Resource::Nofile, t).is_ok() {
            return t.current.unwrap_or(u64::MAX);
        }
    }
    tracing::warn!("cannot raise the open-file limit");
    lim.current.unwrap_or(u64::MAX)
}

/// Open files one simulated agent costs: its journal (database, WAL and
/// shared memory), its TLS socket, room for a join or a renewal, and the two
/// sockets of its link through `bc-sim`'s balancer.
pub const FILES_PER_NODE: u64 = 8;

/// The wait after a simulated node's first failed join; it doubles after
/// each next failure up to [`JOIN_RETRY_MAX`] (as `bcd init` waits).
const JOIN_RETRY_FIRST: Duration = Duration::from_secs(1);
const JOIN_RETRY_MAX: Duration = Duration::from_secs(30);

/// One simulated machine.
#[derive(Debug)]
pub struct SimNode {
    pub index: usize,
    pub dir: PathBuf,
    pub host: Arc<FakeHost>,
    pub seed: u64,
    pub stats: Arc<Stats>,
    task: Mutex<Option<JoinHandle<anyhow::Result<()>>>>,
}

impl SimNode {
    /// The node id, once it has joined.
    pub fn node_id(&self) -> Option<String> {
        identity::Identity::load(&self.dir)
            .ok()
            .map(|i| i.file.node_id)
    }
}

/// Totals over the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub connected: usize,
    pub sessions: u64,
    pub dial_failures: u64,
}

#[derive(Debug)]
pub struct Fleet {
    pub nodes: Vec<Arc<SimNode>>,
    server: String,
    /// One token for every node, or one per node.
    tokens: Vec<JoinToken>,
    joins: Arc<Semaphore>,
    stop: watch::Sender<bool>,
}

impl Fleet {
    pub fn new(opts: &SimOptions) -> anyhow::Result<Fleet> {
        let limit = raise_fd_limit();
        let need = opts.nodes as u64 * FILES_PER_NODE + 1024;
        anyhow::ensure!(
            limit >= need,
            "{} simulated nodes need about {need} open files, and this process may open {limit}: \
             raise the limit (ulimit -n {need}, as root or with a higher hard limit)",
            opts.nodes
        );
        join::prepare_dir(&opts.data_dir)?;
        anyhow::ensure!(
            opts.tokens.len() == 1 || opts.tokens.len() >= opts.nodes,
            "{} join tokens for {} simulated nodes: give one token for all of them, or one per node",
            opts.tokens.len(),
            opts.nodes
        );
        let tokens = opts
            .tokens
            .iter()
            .enumerate()
            .map(|(k, t)| {
                JoinToken::parse(t).map_err(|e| anyhow::anyhow!("join token {}: {e}", k + 1))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let nodes = (opts.first..opts.first + opts.nodes)
            .map(|i| {
                let seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
                Arc::new(SimNode {
                    index: i,
                    dir: opts.data_dir.join(format!("node-{i:05}")),
                    host: Arc::new(FakeHost::new(seed, format!("sim-{i:05}"), opts.gpus)),
                    seed,
                    stats: Arc::new(Stats::default()),
                    task: Mutex::new(None),
                })
            })
            .collect();
        Ok(Fleet {
            nodes,
            server: opts.server.clone(),
            tokens,
            joins: Arc::new(Semaphore::new(opts.join_concurrency.max(1))),
            stop: watch::channel(false).0,
        })
    }

    pub fn start_all(&self) {
        for i in 0..self.nodes.len() {
            self.start(i);
        }
    }

    /// Starts node `i`'s daemon (joining first if it has no identity). A
    /// daemon of the node still running is ended first, as a supervisor
    /// ends one before it starts another: one machine never runs two, and
    /// the one that ended no longer counts as connected.
    pub fn start(&self, i: usize) {
        let node = self.nodes[i].clone();
        let token = self.tokens[if self.tokens.len() == 1 { 0 } else { i }].clone();
        let (server, joins) = (self.server.clone(), self.joins.clone());
        let stop = self.stop.subscribe();
        let mut slot = self.nodes[i].task.lock().expect("task lock");
        let old = slot.take();
        let task = tokio::spawn(async move {
            if let Some(old) = old {
                old.abort();
                let _ = old.await;
                node.stats.connected.store(0, Ordering::Relaxed);
            }
            join::prepare_dir(&node.dir)?;
            // As a netbooted machine's init does: a failed join (the
            // gateway closed the connection over its handshake rate, a
            // gateway restarting) is tried again, 1 s after the first
            // failure and twice as long after each next one, up to 30 s.
            let mut backoff = JOIN_RETRY_FIRST;
            while !identity::exists(&node.dir) {
                let joined = {
                    let _permit = joins.acquire().await.expect("semaphore open");
                    // Boxed, as the daemon below: a task keeps room for its
                    // largest await for as long as it lives, and the join's
                    // (about 20 KiB, a TLS handshake) would otherwise stay
                    // with every simulated node after it joined.
                    Box::pin(join::join_with_token(
                        &server,
                        &token,
                        &node.dir,
                        false,
                        node.host.as_ref(),
                        None,
                    ))
                    .await
                };
                if let Err(e) = joined {
                    tracing::warn!(node = i, error = format!("{e:#}"), retry_in = ?backoff,
                        "simulated node's join failed; trying again");
                    let mut halt = stop.clone();
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = halt.wait_for(|s| *s) => return anyhow::Ok(()),
                    }
                    backoff = (backoff * 2).min(JOIN_RETRY_MAX);
                }
            }
            loop {
                // Simulated machines never touch the host's sshd or
                // firewall: their /etc is their own and there is no nft.
                let machine = node::Machine {
                    host: node.host.clone(),
                    power: node.host.clone(),
                    devices: Arc::new(DeviceDirs {
                        cdi_dir: node.dir.join("cdi"),
                        env_dir: node.dir.join("run/env"),
                    }),
                    sshd: Arc::new(SshdDirs {
                        etc_dir: node.dir.join("etc"),
                        sshd: node.dir.join("no-sshd"),
                    }),
                    firewall: Arc::new(Nft {
                        nft: node.dir.join("no-nft"),
                    }),
                };
                let agent = node::open(
                    &node.dir,
                    machine,
                    node.seed ^ bcd_sys::clock::unix_ms() as u64,
                    Some(node.stats.clone()),
                    node::Footprint::SIMULATED,
                )?;
                let mut stop = stop.clone();
                // Boxed: the daemon's state (about 6 KiB) lives only while
                // it runs.
                let stopped = Box::pin(agent.run(async move {
                    let _ = stop.wait_for(|s| *s).await;
                }))
                .await;
                match stopped {
                    Stopped::Shutdown => return anyhow::Ok(()),
                    Stopped::Rebooted | Stopped::Restart => continue,
                    Stopped::Refused(m) | Stopped::JournalFailed(m) | Stopped::BelowFloor(m) => {
                        tracing::error!(node = i, message = %m, "simulated node stopped");
                        return anyhow::Ok(());
                    }
                }
            }
        });
        *slot = Some(task);
    }

    /// The daemon dies where it stands: its task is dropped at the await
    /// it was on, with only what it made durable. Not restarted.
    pub async fn crash(&self, i: usize) {
        let task = self.nodes[i].task.lock().expect("task lock").take();
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
        // A dropped session no longer counts as connected.
        let s = &self.nodes[i].stats;
        s.connected.store(0, Ordering::Relaxed);
    }

    /// `sim.loseJournal(node)`: the daemon dies and its journal is gone;
    /// it starts again with a new one (and its identity).
    pub async fn lose_journal(&self, i: usize) {
        self.crash(i).await;
        let dir = &self.nodes[i].dir;
        for name in ["journal.db", "journal.db-wal", "journal.db-shm"] {
            let _ = std::fs::remove_file(dir.join(name));
        }
        self.start(i);
    }

    /// The machine reboots: the daemon dies, the boot id changes, the
    /// daemon starts again.
    pub async fn reboot(&self, i: usize) {
        self.crash(i).await;
        self.nodes[i].host.reboot();
        self.start(i);
    }

    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for n in &self.nodes {
            // A node counts once however many sessions overlap while one
            // replaces another.
            t.connected += usize::from(n.stats.connected.load(Ordering::Relaxed) > 0);
            t.sessions += n.stats.sessions.load(Ordering::Relaxed);
            t.dial_failures += n.stats.dial_failures.load(Ordering::Relaxed);
        }
        t
    }

    /// Stops every daemon; returns how many ended in an error.
    pub async fn stop(&self) -> usize {
        let _ = self.stop.send(true);
        let mut failed = 0;
        for n in &self.nodes {
            let task = n.task.lock().expect("task lock").take();
            if let Some(t) = task {
                match t.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        failed += 1;
                        eprintln!("error: {e:#}");
                    }
                    Err(e) if e.is_cancelled() => {}
                    Err(e) => {
                        failed += 1;
                        eprintln!("error: a simulated node panicked: {e}");
                    }
                }
            }
        }
        failed
    }
}

/// `bcd sim`: runs a fleet until Ctrl-C or `duration`.
pub async fn run(opts: SimOptions) -> anyhow::Result<()> {
    let fleet = Fleet::new(&opts)?;
    let _lock = DirLock::acquire(&opts.data_dir)?;
    fleet.start_all();
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = opts.duration.map(|d| started + d);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let t = fleet.totals();
                eprintln!(
                    "sim: {:>6}/{} connected, {} sessions, {} failed dials, {:.0}s",
                    t.connected,
                    opts.nodes,
                    t.sessions,
                    t.dial_failures,
                    started.elapsed().as_secs_f64(),
                );
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    break;
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    let failed = fleet.stop().await;
    let t = fleet.totals();
    println!(
        "sim: {} nodes, {} sessions established, {} failed dials, {} nodes failed",
        opts.nodes, t.sessions, t.dial_failures, failed
    );
    if failed > 0 {
        anyhow::bail!("{failed} simulated nodes failed");
    }
    Ok(())
}
