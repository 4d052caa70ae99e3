//! Fleet benchmark: the simulator's `--chaos kill` run on each store, the
//! figures side by side. Prints figures, asserts nothing.
//!
//! For each store (SQLite, PostgreSQL on a throw-away cluster with durable
//! commits): three gateways, N simulated nodes powering on (each joins
//! through the one key holder with a one-use token of its own, then holds
//! its first session: machines a second); one gateway SIGKILLed a
//! third of the way in (re-home p50/p99/max: each of its nodes' first
//! session after the kill), every link reset two thirds of the way in (the
//! reconnect storm: until every node is back), the most Hello
//! transactions one gateway committed in one second, and peak memory per
//! simulated node.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then `target/bench-fast/bench-fleet --nodes 1000` (or `--nodes 10000
//! --duration 60s --timings spec --handshake-rate 5000`); `--save DIR`
//! keeps the reports for `scripts/plot-bench`.
// The flags' doc comments are their `--help` text, shown as written:
// `<store>` there is a placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

use std::process::Command;

use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    #[arg(long, default_value = "30s")]
    duration: String,
    #[arg(long, default_value = "fast")]
    timings: String,
    #[arg(long, default_value_t = 5000)]
    handshake_rate: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stores to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    stores: Vec<String>,
    /// Where the simulated machines keep their state (sim --node-state).
    #[arg(long, default_value = "disk")]
    node_state: String,
    /// What the machines join with (sim --join-tokens): the power-on
    /// figure is a join and a first session per machine.
    #[arg(long, default_value = "one-use")]
    join_tokens: String,
    /// Also write each run's report to DIR/fleet-<store>-<nodes>.json
    /// (what scripts/plot-bench draws; tests/bench/reports keeps them).
    #[arg(long, value_name = "DIR")]
    save: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut reports = Vec::new();
    for store in &args.stores {
        eprintln!("bench-fleet: {} nodes on {store} ...", args.nodes);
        let out = Command::new(bc_tests::bin("bc-sim"))
            .args(["--gateways", "3", "--chaos", "kill", "--json"])
            .args(["--nodes", &args.nodes.to_string()])
            .args(["--duration", &args.duration, "--timings", &args.timings])
            .args(["--handshake-rate", &args.handshake_rate.to_string()])
            .args(["--seed", &args.seed.to_string(), "--store", store])
            .args(["--node-state", &args.node_state])
            .args(["--join-tokens", &args.join_tokens])
            .output()?;
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            anyhow::anyhow!(
                "the {store} run gave no report ({e}): {}",
                bc_tests::stderr(&out)
            )
        })?;
        if let Some(dir) = &args.save {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!("fleet-{store}-{}.json", args.nodes));
            std::fs::write(&path, serde_json::to_vec(&report)?)?;
            eprintln!("bench-fleet: saved {}", path.display());
        }
        reports.push((store.clone(), report));
    }
    println!(
        "bench-fleet: {} nodes ({} state, {} join tokens), 3 gateways, --chaos kill, --timings {}, --handshake-rate {}, seed {}",
        args.nodes, args.node_state, args.join_tokens, args.timings, args.handshake_rate, args.seed
    );
    let cell = |r: &serde_json::Value, f: &dyn Fn(&serde_json::Value) -> Option<String>| {
        f(r).unwrap_or_else(|| "-".into())
    };
    type Row = (
        &'static str,
        Box<dyn Fn(&serde_json::Value) -> Option<String>>,
    );
    let rows: Vec<Row> = vec![
        (
            "power on: join and connect the fleet",
            Box::new(|r| Some(format!("{:.1} s", r["connect_s"].as_f64()?))),
        ),
        (
            "power on: machines joined a second",
            Box::new(|r| Some(format!("{:.0}", r["power_on_per_s"].as_f64()?))),
        ),
        (
            "peak Hello transactions/s, one gateway",
            Box::new(|r| Some(r["peak_hellos_per_s"].as_u64()?.to_string())),
        ),
        (
            "re-home after a gateway kill p50",
            Box::new(|r| Some(format!("{} ms", r["rehome"][0]["p50_ms"].as_i64()?))),
        ),
        (
            "re-home p99",
            Box::new(|r| Some(format!("{} ms", r["rehome"][0]["p99_ms"].as_i64()?))),
        ),
        (
            "re-home max",
            Box::new(|r| Some(format!("{} ms", r["rehome"][0]["max_ms"].as_i64()?))),
        ),
        (
            "nodes re-homed",
            Box::new(|r| {
                Some(format!(
                    "{}/{}",
                    r["rehome"][0]["rehomed"].as_u64()?,
                    r["rehome"][0]["nodes"].as_u64()?
                ))
            }),
        ),
        (
            "reconnect storm (every link reset)",
            Box::new(|r| Some(format!("{:.2} s", r["storm_s"].as_f64()?))),
        ),
        (
            "peak memory per simulated node",
            Box::new(|r| Some(format!("{} KiB", r["peak_kib_per_node"].as_u64()?))),
        ),
        (
            "settled, every invariant held",
            Box::new(|r| Some(r["ok"].as_bool()?.to_string())),
        ),
    ];
    print!("  {:<40}", "");
    for (store, _) in &reports {
        print!(" {store:>12}");
    }
    println!();
    for (title, f) in &rows {
        print!("  {title:<40}");
        for (_, r) in &reports {
            print!(" {:>12}", cell(r, f.as_ref()));
        }
        println!();
    }
    Ok(())
}
