//! Session benchmark: prints figures, asserts nothing.
//!
//! - Hello transactions per second on one gateway, with N simulated nodes
//!   (one `bcd sim` process) reconnecting at once: TLS handshake, Hello
//!   transaction, Welcome. Client and server share this machine's cores.
//! - The store's own Hello transaction rate, in process, without TLS: one
//!   at a time, and 64 at a time (what group commit shares), on SQLite and
//!   on PostgreSQL (a throw-away cluster with durable commits), side by
//!   side.
//! - A fleet powering on: N simulated nodes join and connect, each with a
//!   one-use token of its own (`--join-tokens shared`: one token for all);
//!   joins a second on one key holder.
//! - CPU time the gateway, PostgreSQL (its server and backends) and
//!   `bcd sim` spent on the reconnect storm, per Hello: what one gateway
//!   core can take when the clients are elsewhere. Each store in
//!   `--stores` (both by default) runs in turn, side by side in one table.
//! - Resident memory of one `bcd node`, and of `bcd sim` per simulated node.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then run `target/bench-fast/bench-session --nodes 1000`.
#![allow(clippy::disallowed_methods)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bc_sim::{NodeState, NodesDir};
use bc_store::postgres::cluster::{ClusterOptions, TempCluster};
use bc_store::sessions::HelloInput;
use bc_store::{Location, Store, SystemClock};
use bc_tests::{Node, Server, cpu_secs, rss_kib, wait_for};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Hellos for the in-process store figure.
    #[arg(long, default_value_t = 20_000)]
    store_hellos: usize,
    /// The gateways' stores for the end-to-end figures, each run in turn:
    /// sqlite, postgres, or both.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    stores: Vec<String>,
    /// The gateway's handshake bucket (serve --handshake-rate).
    #[arg(long, default_value_t = 200)]
    handshake_rate: u32,
    /// Where the simulated nodes keep their journals and identities: disk
    /// (under the run's directory) or memory (under /dev/shm, as diskless
    /// nodes do; the simulated nodes' fsyncs and file churn then stay off
    /// the disk the gateway's store commits to).
    #[arg(long, value_enum, default_value = "disk")]
    node_state: NodeState,
    /// How the simulated nodes join: each with a one-use token of its own
    /// (`tokens create --count N`, as a rack powering on), or all with one
    /// shared token (whose row every join then locks).
    #[arg(long, value_enum, default_value = "one-use")]
    join_tokens: JoinTokens,
    /// Print only the in-process store figure and stop.
    #[arg(long)]
    only_store: bool,
}

/// How the simulated nodes join.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum JoinTokens {
    OneUse,
    Shared,
}

/// `bcd sim` of `nodes` nodes joining with `join` (`--token T` or
/// `--tokens-file F`); what it says goes to `dir`.log.
fn sim(server: &Server, join: &[String], dir: &std::path::Path, nodes: usize) -> Child {
    let log = std::fs::File::create(dir.with_extension("log")).expect("bcd sim's log file");
    Command::new(bc_tests::bin("bcd"))
        .args([
            "sim",
            "--nodes",
            &nodes.to_string(),
            "--server",
            &server.url(),
        ])
        .args(join)
        .args(["--join-concurrency", "64", "--duration", "1h"])
        .arg("--data-dir")
        .arg(dir)
        .env("BCD_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start bcd sim")
}

/// Stops the benchmark if `bcd sim` (writing to `dir`.log) has exited (too
/// many nodes for the open-file limit, a bad token), instead of waiting out
/// the timeout for nodes that will never come.
fn running(c: &mut Child, dir: &std::path::Path) {
    if let Ok(Some(status)) = c.try_wait() {
        let log = std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        panic!(
            "bcd sim exited ({status}):\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

fn stop(mut c: Child) {
    let pid = rustix::process::Pid::from_raw(c.id() as i32).expect("pid");
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
    let _ = c.wait();
}

fn connected(server: &Server, min_epoch: u64) -> usize {
    server
        .nodes()
        .iter()
        .filter(|n| n.state == "connected" && n.epoch >= min_epoch)
        .count()
}

/// What one in-process store run measured.
struct StoreRun {
    hellos_per_s: f64,
    /// PostgreSQL only: the cluster's counters over the run, per Hello.
    postgres: Option<PgCost>,
}

/// What a run cost PostgreSQL, per Hello.
struct PgCost {
    /// CPU milliseconds of the server and its backends.
    cpu_ms: f64,
    /// Transactions committed.
    commits: f64,
    /// WAL flushes to disk (`pg_stat_wal.wal_sync`): what group commit saves.
    fsyncs: f64,
}

/// The cluster's commit and WAL-sync counters, from a connection of its own.
async fn pg_counters(url: &str) -> (i64, i64) {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the cluster");
    let task = tokio::spawn(conn);
    let row = c
        .query_one(
            "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                    (SELECT wal_sync FROM pg_stat_wal)",
            &[],
        )
        .await
        .expect("pg_stat_database and pg_stat_wal");
    drop(c);
    let _ = task.await;
    (row.get(0), row.get(1))
}

/// Hello transactions per second through the store interface, in process
/// (no TLS, no gateway), `concurrency` at a time; on PostgreSQL, with what
/// they cost the cluster.
fn store_hellos(
    location: &Location,
    n: usize,
    concurrency: usize,
    cluster: Option<&TempCluster>,
) -> StoreRun {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = Store::open(location, std::sync::Arc::new(SystemClock))
            .await
            .expect("store");
        let nodes = 1000.min(n);
        let mut ids = Vec::new();
        for i in 0..nodes {
            ids.push(bc_store::fixtures::enroll(&s, i).await.expect("join"));
        }
        // The routing transaction checks the gateway's lease.
        s.renew_lease("gateway:gw", "gw", Duration::from_secs(3600))
            .await
            .expect("lease")
            .expect("free lease");
        let hello = move |i: usize| HelloInput {
            inventory_hashes: vec![("gpus".into(), "x".into())],
            ..bc_store::fixtures::hello(&ids[i], i, "gw")
        };
        // `concurrency` workers, each taking the next Hello as soon as its
        // last one committed: always that many in flight, as a gateway's
        // queue keeps them, never waves that wait for their slowest.
        let hello = std::sync::Arc::new(hello);
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let url = match location {
            Location::Postgres(url) => Some(url.as_str()),
            Location::Sqlite(_) => None,
        };
        let before = match (url, cluster) {
            (Some(url), Some(cluster)) => Some((
                pg_counters(url).await,
                cluster.cpu_secs().expect("the cluster's CPU time"),
            )),
            _ => None,
        };
        let start = Instant::now();
        let workers: Vec<_> = (0..concurrency)
            .map(|_| {
                let (s, hello, next) = (s.clone(), hello.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= n {
                            return;
                        }
                        s.hello(&hello(k % nodes)).await.expect("hello");
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.expect("worker");
        }
        let hellos_per_s = n as f64 / start.elapsed().as_secs_f64();
        // The backends write their counters out as their connections end.
        drop(s);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let postgres = match (before, url, cluster) {
            (Some(((commits, syncs), cpu)), Some(url), Some(cluster)) => {
                let (commits_after, syncs_after) = pg_counters(url).await;
                let cpu_after = cluster.cpu_secs().expect("the cluster's CPU time");
                let per = |x: f64| x / n as f64;
                Some(PgCost {
                    cpu_ms: per((cpu_after - cpu) * 1000.0),
                    // The counters' own reading commits once.
                    commits: per((commits_after - commits - 1) as f64),
                    fsyncs: per((syncs_after - syncs) as f64),
                })
            }
            _ => None,
        };
        StoreRun {
            hellos_per_s,
            postgres,
        }
    })
}

/// What one store's end-to-end run measured.
struct StormRow {
    joins_per_s: f64,
    hellos_per_s: f64,
    /// CPU milliseconds per Hello of the gateway, of PostgreSQL's server
    /// and backends, of the `bcd sim` process.
    gateway_ms: f64,
    postgres_ms: Option<f64>,
    sim_ms: f64,
    server_rss: u64,
}

/// A gateway on `store`; N simulated nodes join and connect, disconnect,
/// then all reconnect at once. Returns the gateway, the figures, the
/// reconnected `bcd sim` (still running) and where its nodes
/// keep their state.
fn storm(
    args: &Args,
    cluster: &TempCluster,
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    store: &str,
) -> anyhow::Result<(Server, StormRow, Child, NodesDir)> {
    let n = args.nodes;
    let store_url = match store {
        "sqlite" => None,
        "postgres" => {
            Some(rt.block_on(cluster.create_database(&format!("sessions_{}", std::process::id())))?)
        }
        other => anyhow::bail!("--stores takes sqlite and postgres, not {other:?}"),
    };
    // Every simulated node dials from 127.0.0.1.
    let serve_args = [
        "--handshake-rate",
        &args.handshake_rate.to_string(),
        "--max-connections-per-address",
        "20000",
        "--handshake-rate-per-address",
        &args.handshake_rate.to_string(),
    ];
    let home = dir.join(format!("server-{store}"));
    let server = match &store_url {
        Some(url) => Server::start_postgres(&home, url, &serve_args)?,
        None => Server::start(&home, &serve_args)?,
    };
    let join = match args.join_tokens {
        JoinTokens::Shared => vec!["--token".to_string(), server.token(n as u32 + 1)],
        JoinTokens::OneUse => {
            let out = server.cli(&["tokens", "create", "--count", &n.to_string()]);
            anyhow::ensure!(
                out.status.success(),
                "tokens create --count {n}: {}",
                bc_tests::stderr(&out)
            );
            let file = home.join("join.tokens");
            std::fs::write(&file, &out.stdout)?;
            vec!["--tokens-file".to_string(), file.display().to_string()]
        }
    };
    let sims = args.node_state.place(&home)?;
    let sim_dir = sims.path().join("sim");
    // Sessions counted from the gateway's own figure while they come up:
    // asking the operator API for every node each time would be a client
    // of its own on the same cores.
    let sessions = || server.counter("bc_gateway_sessions") as usize;

    // Phase 1: join everyone and connect.
    let t = Instant::now();
    let mut first = sim(&server, &join, &sim_dir, n);
    wait_for(
        Duration::from_secs(600),
        "every node joined and connected",
        || {
            running(&mut first, &sim_dir);
            (sessions() == n).then_some(())
        },
    );
    assert_eq!(connected(&server, 1), n, "nodes connected in the store");
    let joins_per_s = n as f64 / t.elapsed().as_secs_f64();
    stop(first);
    wait_for(Duration::from_secs(60), "every node disconnected", || {
        (connected(&server, 0) == 0).then_some(())
    });

    // Phase 2: everyone reconnects at once.
    let server_cpu = cpu_secs(server.proc.pid());
    let pg_cpu = store_url.as_ref().map(|_| cluster.cpu_secs()).transpose()?;
    let t = Instant::now();
    let mut second = sim(&server, &join, &sim_dir, n);
    wait_for(Duration::from_secs(600), "every node reconnected", || {
        running(&mut second, &sim_dir);
        (sessions() == n).then_some(())
    });
    let secs = t.elapsed().as_secs_f64();
    let per = |cpu: f64| cpu * 1000.0 / n as f64;
    let gateway_ms = per(cpu_secs(server.proc.pid())
        .zip(server_cpu)
        .map_or(0.0, |(b, a)| b - a));
    let sim_ms = per(cpu_secs(second.id() as i32).unwrap_or(0.0));
    let postgres_ms = pg_cpu
        .zip(pg_cpu.and_then(|_| cluster.cpu_secs().ok()))
        .map(|(before, after)| per(after - before));
    assert_eq!(connected(&server, 2), n, "nodes reconnected in the store");
    let server_rss = rss_kib(server.proc.pid()).unwrap_or(0);
    Ok((
        server,
        StormRow {
            joins_per_s,
            hellos_per_s: n as f64 / secs,
            gateway_ms,
            postgres_ms,
            sim_ms,
            server_rss,
        },
        second,
        sims,
    ))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let n = args.nodes;
    let d = tempfile::tempdir()?;
    println!("bench-session: {n} simulated nodes, one gateway, loopback");

    // The store alone, both backends side by side. PostgreSQL commits
    // durably too (fsync on, synchronous_commit on).
    let cluster = TempCluster::start(ClusterOptions::default())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!("store Hello transactions per second, in process (no TLS), durable commits:");
    println!(
        "  {:<14} {:>10} {:>12}   PostgreSQL per Hello: CPU, commits, WAL fsyncs",
        "", "SQLite", "PostgreSQL"
    );
    for concurrency in [1, 64] {
        let sqlite = store_hellos(
            &Location::Sqlite(d.path().join(format!("hellos-{concurrency}.db"))),
            args.store_hellos,
            concurrency,
            None,
        );
        let url = rt.block_on(cluster.create_database(&format!("hellos_{concurrency}")))?;
        let pg = store_hellos(
            &Location::Postgres(url),
            args.store_hellos,
            concurrency,
            Some(&cluster),
        );
        let cost = pg.postgres.map_or(String::new(), |c| {
            format!("{:.3} ms, {:.3}, {:.3}", c.cpu_ms, c.commits, c.fsyncs)
        });
        println!(
            "  {:<14} {:>10.0} {:>12.0}   {cost}",
            format!("{concurrency} at a time"),
            sqlite.hellos_per_s,
            pg.hellos_per_s
        );
    }

    if args.only_store {
        return Ok(());
    }

    // The end-to-end figures, one store after the other, each on a gateway
    // of its own; the last one's stays up for the figures after.
    let mut rows = Vec::new();
    let mut last = None;
    for store in &args.stores {
        if let Some((server, sim, sims)) = last.take() {
            stop(sim);
            drop((server, sims));
        }
        let (server, row, sim, sims) = storm(&args, &cluster, &rt, d.path(), store)?;
        rows.push((store.clone(), row));
        last = Some((server, sim, sims));
    }
    println!(
        "reconnect storm, {n} Hellos (TLS + Hello transaction + Welcome), one gateway, --handshake-rate {}:",
        args.handshake_rate
    );
    println!(
        "  {:<12} {:>10} {:>11} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "store", "joins/s", "Hellos/s", "gateway", "PostgreSQL", "bcd sim", "per core", "serve RSS"
    );
    for (store, r) in &rows {
        println!(
            "  {:<12} {:>10.0} {:>11.0} {:>7.2} ms {:>9} {:>9.2} ms {:>12.0} {:>6} KiB",
            store,
            r.joins_per_s,
            r.hellos_per_s,
            r.gateway_ms,
            r.postgres_ms
                .map_or("-".to_string(), |ms| format!("{ms:.2} ms")),
            r.sim_ms,
            1000.0 / r.gateway_ms,
            r.server_rss
        );
    }
    println!("  (CPU per Hello of each process; per core: Hellos a second one gateway core takes)");
    let (server, second, sims) = last.ok_or_else(|| anyhow::anyhow!("--stores names no store"))?;
    std::thread::sleep(Duration::from_secs(3));
    let sim_rss = rss_kib(second.id() as i32).unwrap_or(0);
    stop(second);

    // Baseline: the same process with one node.
    let one = sim(
        &server,
        &["--token".to_string(), server.token(1)],
        &sims.path().join("sim1"),
        1,
    );
    wait_for(
        Duration::from_secs(60),
        "the single-node sim connected",
        || {
            (server
                .nodes()
                .iter()
                .filter(|x| x.state == "connected")
                .count()
                == 1)
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    let base = rss_kib(one.id() as i32).unwrap_or(0);
    stop(one);
    println!(
        "bcd sim resident memory: {sim_rss} KiB for {n} nodes, {base} KiB for 1; {:.1} KiB per simulated node (marginal)",
        (sim_rss.saturating_sub(base)) as f64 / (n.max(2) - 1) as f64
    );

    // One real agent process (the static build when present).
    let mut node = Node::new(&d.path().join("single"), 424242);
    let out = node.join(&server.url(), &server.token(1));
    anyhow::ensure!(out.status.success(), "join: {}", bc_tests::stderr(&out));
    let id = node.id();
    let proc = node.start();
    let pid = proc.pid();
    server.wait_node(&id, "single node connected", |v| v.state == "connected");
    std::thread::sleep(Duration::from_secs(5));
    println!(
        "bcd node resident memory, steady ({} build with fakehw): {} KiB",
        bc_tests::bin("bcd")
            .parent()
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default(),
        rss_kib(pid).unwrap_or(0)
    );
    // Revocation: from `nodes delete` (which revokes the certificate) to the
    // node's session closed and the daemon stopped.
    let t = Instant::now();
    let out = server.cli(&["nodes", "delete", &id, "--yes"]);
    anyhow::ensure!(out.status.success(), "delete: {}", bc_tests::stderr(&out));
    let exited = node.proc().wait(Duration::from_secs(30));
    println!(
        "revocation → session closed and bcd node stopped: {} ms{}",
        t.elapsed().as_millis(),
        if exited.is_some() {
            ""
        } else {
            " (did not stop within 30 s)"
        }
    );
    drop(node);

    // The static release agent on this host's real (GPU-less) hardware.
    let musl = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/x86_64-unknown-linux-musl/release/bcd");
    if musl.exists() {
        let dir = d.path().join("static");
        let out = Command::new(&musl)
            .args([
                "join",
                "--server",
                &server.url(),
                "--token",
                &server.token(1),
            ])
            .arg("--data-dir")
            .arg(&dir)
            .output()?;
        anyhow::ensure!(out.status.success(), "join: {}", bc_tests::stderr(&out));
        let mut child = Command::new(&musl)
            .args(["node", "--data-dir"])
            .arg(&dir)
            .env("BCD_LOG", "warn")
            .spawn()?;
        let static_node = Node::new(&dir, 0);
        let id = static_node.id();
        server.wait_node(&id, "static node connected", |v| v.state == "connected");
        std::thread::sleep(Duration::from_secs(5));
        println!(
            "bcd node resident memory, steady (static musl release build): {} KiB; binary {} bytes",
            rss_kib(child.id() as i32).unwrap_or(0),
            std::fs::metadata(&musl)?.len()
        );
        let _ = child.kill();
        let _ = child.wait();
    } else {
        println!(
            "(no static bcd at {}: build it to measure it too)",
            musl.display()
        );
    }
    Ok(())
}
