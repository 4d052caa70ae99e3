//! Fence benchmark: prints figures, asserts nothing.
//!
//! One gateway at the default timings (a 20 s lease renewed every 5 s) on a
//! PostgreSQL cluster of its own, `--nodes` simulated nodes connected with
//! a command running on each; then the database hangs (every backend
//! frozen) or stops. Prints, for each run, the time from the failure to the
//! gateway's fence, and the worst of each kind, against the spec's 10 s.
//!
//! Build first: `cargo build --profile bench-fast --workspace --all-features`,
//! then run `target/bench-fast/bench-fence`.
#![allow(clippy::disallowed_methods)]

use bc_tests::fence::{Failure, fence_time};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    /// Runs of each kind of failure.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Simulated nodes connected to the gateway.
    #[arg(long, default_value_t = 20)]
    nodes: usize,
}

fn main() {
    let args = Args::parse();
    println!(
        "bench-fence: one gateway at the default timings (20 s lease, renewed every 5 s), {} nodes, {} runs each",
        args.nodes, args.runs
    );
    for failure in [Failure::Hung, Failure::Stopped] {
        let mut times = Vec::new();
        for run in 1..=args.runs {
            let t = fence_time(failure, args.nodes);
            println!(
                "  {} database, run {run}: fenced {:.1} s after the failure",
                failure.name(),
                t.as_secs_f64()
            );
            times.push(t);
        }
        let worst = times.iter().max().copied().unwrap_or_default();
        println!(
            "{} database: worst {:.1} s of {} runs (spec: 10 s after the last renewal that answered)",
            failure.name(),
            worst.as_secs_f64(),
            times.len()
        );
    }
}
