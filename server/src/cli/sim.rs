//! `better-compute sim`.

use std::path::PathBuf;
use std::time::Duration;

use super::dur;
use super::output;

#[derive(Debug, clap::Args)]
pub struct SimArgs {
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    #[arg(long, default_value_t = 3)]
    gateways: usize,
    #[arg(long, value_enum, default_value = "light")]
    chaos: crate::sim::chaos::Level,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long the workload and the faults run (settling follows).
    #[arg(long, default_value = "30s", value_parser = dur)]
    duration: Duration,
    /// Keep the run's store and nodes here (a temporary directory
    /// otherwise).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 8)]
    gpus: usize,
    /// Each gateway's TLS handshakes per second (serve --handshake-rate).
    #[arg(long, default_value_t = 200)]
    handshake_rate: u32,
    /// The gateways' heartbeat and lease timings.
    #[arg(long, value_enum, default_value = "fast")]
    timings: crate::sim::Timings,
    /// Where the simulated machines keep their journal and identity:
    /// `disk` (under the run's directory) or `memory` (/dev/shm, as
    /// diskless nodes do; every node's fsyncs then stop sharing this
    /// machine's one disk).
    #[arg(long, value_enum, default_value = "disk")]
    node_state: crate::sim::NodeState,
    /// The report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// `store` is the global `--store`: `sqlite` (the default), `postgres` (a
/// throw-away cluster for the run) or a postgres:// address.
pub async fn run(a: SimArgs, store: Option<String>) -> anyhow::Result<()> {
    let report = crate::sim::run(crate::sim::SimOptions {
        handshake_rate: a.handshake_rate,
        timings: a.timings,
        nodes: a.nodes,
        gateways: a.gateways,
        chaos: a.chaos,
        seed: a.seed,
        duration: a.duration,
        data_dir: a.dir,
        gpus: a.gpus,
        progress: !crate::cli::output::json_wanted(a.json),
        store: store.unwrap_or_else(|| "sqlite".into()),
        node_state: a.node_state,
    })
    .await?;
    if crate::cli::output::json_wanted(a.json) {
        output::json(&report)?;
    } else {
        output::emit(&report.render())?;
    }
    match report.failure() {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}
