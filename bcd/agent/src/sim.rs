//! `bcd sim`: many fakehw agents in one process, each with its own data
//! directory, key, certificate, journal and TLS session. The agents are the
//! real agent code; only the hardware under them is fake.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use bcd_proto::token::JoinToken;
use tokio::sync::{Semaphore, watch};

use crate::fsutil::DirLock;
use crate::hw::fake::FakeHost;
use crate::node::{self, Stats, Stopped};
use crate::{identity, join};

#[derive(Debug, Clone)]
pub struct SimOptions {
    pub nodes: usize,
    pub server: String,
    pub token: String,
    pub data_dir: PathBuf,
    pub seed: u64,
    pub gpus: usize,
    pub join_concurrency: usize,
    pub duration: Option<Duration>,
}

/// Lets one process hold a socket and a journal for each of many agents.
fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    if let Some(max) = lim.maximum {
        lim.current = Some(max);
        if let Err(e) = setrlimit(Resource::Nofile, lim) {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
        }
    }
}

pub async fn run(opts: SimOptions) -> anyhow::Result<()> {
    raise_fd_limit();
    join::prepare_dir(&opts.data_dir)?;
    let _lock = DirLock::acquire(&opts.data_dir)?;
    let token = JoinToken::parse(&opts.token)?;
    let stats = Arc::new(Stats::default());
    let joins = Arc::new(Semaphore::new(opts.join_concurrency.max(1)));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::with_capacity(opts.nodes);
    for i in 0..opts.nodes {
        let dir = opts.data_dir.join(format!("node-{i:05}"));
        let seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        let host = Arc::new(FakeHost::new(seed, format!("sim-{i:05}"), opts.gpus));
        let (server, token, joins, stats) = (
            opts.server.clone(),
            token.clone(),
            joins.clone(),
            stats.clone(),
        );
        let stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            join::prepare_dir(&dir)?;
            if !identity::exists(&dir) {
                let _permit = joins.acquire().await.expect("semaphore open");
                join::join_with_token(&server, &token, &dir, false, host.as_ref())
                    .await
                    .with_context(|| format!("simulated node {i} cannot join"))?;
            }
            loop {
                let paths = crate::converge::Paths {
                    cdi_dir: dir.join("cdi"),
                    env_dir: dir.join("run/env"),
                };
                // Simulated machines never touch the host's sshd or
                // firewall: their /etc is their own and there is no nft.
                let access = crate::access::AccessPaths {
                    etc_dir: dir.join("etc"),
                    nft: dir.join("no-nft"),
                    sshd: dir.join("no-sshd"),
                };
                let agent =
                    node::open(&dir, host.clone(), seed, Some(stats.clone()), paths, access)?;
                let mut stop = stop.clone();
                let stopped = agent
                    .run(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
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
        }));
    }

    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let deadline = opts.duration.map(|d| started + d);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                eprintln!(
                    "sim: {:>6}/{} connected, {} sessions, {} failed dials, {:.0}s",
                    stats.connected.load(Ordering::Relaxed),
                    opts.nodes,
                    stats.sessions.load(Ordering::Relaxed),
                    stats.dial_failures.load(Ordering::Relaxed),
                    started.elapsed().as_secs_f64(),
                );
                if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                    break;
                }
            }
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    let _ = stop_tx.send(true);
    let mut failed = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                failed += 1;
                eprintln!("error: {e:#}");
            }
            Err(e) => {
                failed += 1;
                eprintln!("error: a simulated node panicked: {e}");
            }
        }
    }
    println!(
        "sim: {} nodes, {} sessions established, {} failed dials, {} nodes failed",
        opts.nodes,
        stats.sessions.load(Ordering::Relaxed),
        stats.dial_failures.load(Ordering::Relaxed),
        failed
    );
    if failed > 0 {
        anyhow::bail!("{failed} simulated nodes failed");
    }
    Ok(())
}
