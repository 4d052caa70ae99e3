//! Command benchmark: prints figures, asserts nothing.
//!
//! - Command round trip on loopback: from the store accepting the command
//!   (`created_at`) to the store committing its result (`result_at`), both on
//!   the store's clock, for `exec.run /bin/true` through one gateway to one
//!   `bcd node` whose journal fsyncs every step (`synchronous=FULL`).
//! - Journal accepts per second: `accept` + `running` + `done` per command
//!   on this machine's disk, each an fsynced SQLite transaction.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then run `target/bench-fast/bench-commands --commands 300`.

use std::time::{Duration, Instant};

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

    // Round trip.
    let server = Server::start(&d.path().join("server"), &[])?;
    let mut node = Node::new(&d.path().join("node"), 7);
    let out = node.join(&server.url(), &server.token(1));
    anyhow::ensure!(out.status.success(), "join: {}", bc_tests::stderr(&out));
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    let mut ids = Vec::with_capacity(args.commands);
    for _ in 0..args.commands {
        ids.push(server.run_command(&id, "exec.run", &["/bin/true"]));
    }
    bc_tests::wait_for(Duration::from_secs(300), "every command finished", || {
        let cs = server.commands(&id);
        (cs.len() == args.commands && cs.iter().all(|c| c.is_terminal())).then_some(())
    });
    let out = server.cli(&[
        "commands", "list", "--node", &id, "--limit", "100000", "--json",
    ]);
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)?;
    let mut rtt: Vec<i64> = list
        .iter()
        .filter(|c| c["state"] == "succeeded")
        .map(|c| c["result_at_ms"].as_i64().unwrap_or(0) - c["created_at_ms"].as_i64().unwrap_or(0))
        .collect();
    rtt.sort_unstable();
    anyhow::ensure!(!rtt.is_empty(), "no command succeeded");
    println!(
        "command round trip, submit → result committed (exec.run /bin/true, {} commands, ms on the store clock): p50 {} ms, p99 {} ms, max {} ms",
        rtt.len(),
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.99),
        rtt.last().copied().unwrap_or(0)
    );
    Ok(())
}
