//! `bc-sim`: run a whole fleet on this machine (real `better-compute`
//! gateways behind a balancer, fakehw agents, a workload and seeded
//! faults), then check the invariants; exits non-zero if one is violated.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use better_compute::cli::output;
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "bc-sim",
    version,
    about = "Run a whole fleet on this machine: real better-compute gateways behind a balancer, fakehw agents, a workload and seeded faults; then check the invariants. Exits non-zero if one is violated.",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  bc-sim                                   200 nodes, 3 gateways, light chaos, 30 s\n  bc-sim --nodes 1000 --chaos heavy --seed 7\n  bc-sim --store postgres --chaos heavy    on a throw-away PostgreSQL cluster\n  bc-sim --nodes 3000 --chaos kill --timings spec --json"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    #[command(flatten)]
    sim: SimArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Sub {
    /// One agent host of the simulation (started by it; orders on stdin).
    #[command(hide = true)]
    Host {
        #[command(flatten)]
        opts: bc_sim::host::HostOptions,
    },
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// Gateway processes (`better-compute serve`) on the one store.
    #[arg(long, default_value_t = 3)]
    gateways: usize,
    /// The fault schedule.
    #[arg(long, value_enum, default_value = "light")]
    chaos: bc_sim::chaos::Level,
    /// The schedule's and the workload's seed: the same seed, the same run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long the workload and the faults run (settling follows).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Keep the run's store and nodes here (a temporary directory
    /// otherwise).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Fake GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Each gateway's TLS handshakes per second (serve --handshake-rate).
    #[arg(long, default_value_t = 200)]
    handshake_rate: u32,
    /// The gateways' heartbeat and lease timings.
    #[arg(long, value_enum, default_value = "fast")]
    timings: bc_sim::Timings,
    /// Where the simulated machines keep their journal and identity:
    /// `disk` (under the run's directory) or `memory` (/dev/shm, as
    /// diskless nodes do; every node's fsyncs then stop sharing this
    /// machine's one disk).
    #[arg(long, value_enum, default_value = "disk")]
    node_state: bc_sim::NodeState,
    /// What the machines join with: `one-use` (a token minted for each,
    /// as a rack is installed) or `shared` (one token for all).
    #[arg(long, value_enum, default_value = "one-use")]
    join_tokens: bc_sim::JoinTokens,
    /// The store: `sqlite` (a file in the run's directory), `postgres` (a
    /// throw-away cluster for the run) or a postgres:// address.
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// The report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

async fn run(a: SimArgs) -> anyhow::Result<()> {
    let report = bc_sim::run(bc_sim::SimOptions {
        handshake_rate: a.handshake_rate,
        timings: a.timings,
        nodes: a.nodes,
        gateways: a.gateways,
        chaos: a.chaos,
        seed: a.seed,
        duration: a.duration,
        data_dir: a.dir,
        gpus: a.gpus,
        progress: !a.json,
        store: a.store,
        node_state: a.node_state,
        join_tokens: a.join_tokens,
    })
    .await?;
    if a.json {
        output::json(&report)?;
    } else {
        output::emit(&report.render())?;
    }
    match report.failure() {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Thousands of agents run in these processes: their per-session lines
    // would drown the progress display.
    better_compute::cli::init_logging(tracing::Level::WARN);
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
    let result = rt.block_on(async move {
        match cli.command {
            Some(Sub::Host { opts }) => bc_sim::host::run_host(opts).await,
            None => run(cli.sim).await,
        }
    });
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", bcd_sys::error::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
