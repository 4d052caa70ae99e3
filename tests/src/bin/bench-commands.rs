//! Command benchmark: prints figures, asserts nothing.
//!
//! - Command round trip on loopback: from the store accepting the command
//!   (`created_at`) to the store committing its result (`result_at`), both on
//!   the store's clock, for `exec.run /bin/true` through one gateway to one
//!   `bcd node` whose journal fsyncs every step (`synchronous=FULL`); once
//!   one at a time through one operator connection (the latency), once back
//!   to back from a CLI process per command (what an operator's script sees,
//!   each CLI start and handshake overlapping the commands before it).
//! - Journal accepts per second: `accept` + `running` + `done` per command
//!   on this machine's disk, each an fsynced SQLite transaction.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then run `target/bench-fast/bench-commands --commands 300`.
#![allow(clippy::disallowed_methods)]

use std::path::Path;
use std::time::{Duration, Instant};

use bc_store::postgres::cluster::{ClusterOptions, TempCluster};

use bc_tests::{Node, Server};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 300)]
    commands: usize,
    #[arg(long, default_value_t = 2000)]
    journal_ops: usize,
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let d = tempfile::tempdir()?;

    // Journal throughput.
    let (j, _) = bcd_agent::journal::Journal::open(&d.path().join("journal.db"))?;
    let t = Instant::now();
    for i in 0..args.journal_ops {
        let id = format!("c{i}");
        j.accept(&id, i as u64 + 1, "exec.run", b"payload")?;
    }
    let accepts = args.journal_ops as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..args.journal_ops {
        let id = format!("c{i}");
        j.set_running(&id, "boot")?;
        j.finish(&id, b"result")?;
    }
    let steps = 2.0 * args.journal_ops as f64 / t.elapsed().as_secs_f64();
    println!(
        "journal (SQLite WAL, synchronous=FULL): {accepts:.0} accepts/s; {steps:.0} running/done writes/s"
    );

    // Round trips, on each store.
    println!("command round trip, submit → result committed (ms on the store clock):");
    round_trips(&args, &d.path().join("sqlite"), "SQLite", None)?;
    let cluster = TempCluster::start(ClusterOptions::default())?;
    let url = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(cluster.create_database("commands"))?;
    round_trips(&args, &d.path().join("postgres"), "PostgreSQL", Some(&url))?;
    Ok(())
}

/// The two round-trip figures through one server on `store` (PostgreSQL
/// at that URL, else SQLite in `dir`).
fn round_trips(args: &Args, dir: &Path, name: &str, store: Option<&str>) -> anyhow::Result<()> {
    let server = match store {
        Some(url) => Server::start_postgres(&dir.join("server"), url, &[])?,
        None => Server::start(&dir.join("server"), &[])?,
    };
    let mut node = Node::new(&dir.join("node"), 7);
    let out = node.join(&server.url(), &server.token(1));
    anyhow::ensure!(out.status.success(), "join: {}", bc_tests::stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");

    // One at a time: each command submitted once the one before it is
    // terminal, through one operator connection held open, so nothing else
    // on this machine (a CLI process starting, its TLS handshake) overlaps
    // the round trip.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut one_at_a_time: Vec<i64> = rt.block_on(async {
        let mut admin = better_compute::client::connect(
            &server.dir.join("operator.json"),
            Some(&server.api_url()),
        )
        .await?;
        let mut rtt = Vec::with_capacity(args.commands);
        for _ in 0..args.commands {
            let info = admin
                .run_command(bcd_proto::v1::RunCommandRequest {
                    node_id: id.clone(),
                    kind: bcd_proto::v1::CommandKind::ExecRun as i32,
                    args: vec!["/bin/true".into()],
                    ..Default::default()
                })
                .await?
                .into_inner();
            let done = loop {
                let c = admin
                    .get_command(bcd_proto::v1::GetCommandRequest {
                        command_id: info.command_id.clone(),
                    })
                    .await?
                    .into_inner();
                if c.result_at_ms > 0 {
                    break c;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            anyhow::ensure!(
                done.state == bcd_proto::v1::CommandState::Succeeded as i32,
                "command {} ended {:?}",
                done.command_id,
                done.state
            );
            rtt.push(done.result_at_ms - done.created_at_ms);
        }
        Ok::<_, anyhow::Error>(rtt)
    })?;
    one_at_a_time.sort_unstable();
    println!(
        "  {name}: one at a time (exec.run /bin/true, {} commands): p50 {} ms, p99 {} ms, max {} ms",
        one_at_a_time.len(),
        percentile(&one_at_a_time, 0.5),
        percentile(&one_at_a_time, 0.99),
        one_at_a_time.last().copied().unwrap_or(0)
    );

    // Back to back: a CLI process per command, as an operator's script
    // submits them, without waiting for results.
    let mut ids = Vec::with_capacity(args.commands);
    for _ in 0..args.commands {
        ids.push(server.run_command(&id, "exec.run", &["/bin/true"]));
    }
    bc_tests::wait_for(Duration::from_secs(300), "every command finished", || {
        let cs = server.commands(&id);
        (cs.len() == 2 * args.commands && cs.iter().all(|c| c.is_terminal())).then_some(())
    });
    let out = server.cli(&[
        "commands", "list", "--node", &id, "--limit", "100000", "--json",
    ]);
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let mut rtt: Vec<i64> = list
        .iter()
        .filter(|c| c["state"] == "succeeded" && ids.iter().any(|i| c["command_id"] == i.as_str()))
        .map(|c| c["result_at_ms"].as_i64().unwrap_or(0) - c["created_at_ms"].as_i64().unwrap_or(0))
        .collect();
    rtt.sort_unstable();
    anyhow::ensure!(!rtt.is_empty(), "no command succeeded");
    println!(
        "  {name}: back to back from the CLI (exec.run /bin/true, {} commands): p50 {} ms, p99 {} ms, max {} ms",
        rtt.len(),
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.99),
        rtt.last().copied().unwrap_or(0)
    );
    Ok(())
}
