//! `better-compute check`: the fleet invariants on a store, live or not.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use super::dur;
use super::output;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  better-compute check\n  better-compute --store postgres://bc@db/fleet check --label 'after restart'\n  better-compute check --node-lease-ttl 60s --gateway-loss-grace 5m --json"
)]
pub struct CheckArgs {
    /// The node lease TTL the server runs with (serve --node-lease-ttl).
    #[arg(long, default_value = "40s", value_parser = dur)]
    node_lease_ttl: Duration,
    /// The grace the server runs with (serve --gateway-loss-grace).
    #[arg(long, default_value = "120s", value_parser = dur)]
    gateway_loss_grace: Duration,
    /// Commands younger than this may still be on their way.
    #[arg(long, default_value = "60s", value_parser = dur)]
    settle: Duration,
    /// A label for this check, printed above it (`--label "after
    /// restart"`), so a series of checks reads as one report.
    #[arg(long)]
    label: Option<String>,
    /// JSON instead of a table (the same as the global `-o json`).
    #[arg(long)]
    json: bool,
}

/// The server's store as it is, for reading: nothing created, nothing
/// migrated (a store a newer server wrote is refused, saying so).
pub(super) async fn open_existing(
    data_dir: &Path,
    store: Option<&str>,
) -> anyhow::Result<(bc_store::Store, bc_store::Location)> {
    let location = crate::serve::store_location(data_dir, store);
    if let bc_store::Location::Sqlite(path) = &location {
        anyhow::ensure!(
            path.exists(),
            "no store at {}: pass --data-dir of the server, or its --store",
            path.display()
        );
    }
    let store =
        bc_store::Store::open_existing(&location, std::sync::Arc::new(bc_store::SystemClock))
            .await
            .with_context(|| format!("cannot open {location}"))?;
    Ok((store, location))
}

pub async fn run(a: CheckArgs, data_dir: &Path, store: Option<&str>) -> anyhow::Result<()> {
    let (store, location) = open_existing(data_dir, store).await?;
    let snapshot = crate::check::snapshot(
        &store,
        crate::check::Timings {
            node_lease_ttl: a.node_lease_ttl,
            gateway_loss_grace: a.gateway_loss_grace,
        },
        a.settle,
        crate::check::NodeFacts::default(),
        crate::check::fleet_ca(data_dir).as_deref(),
    )
    .await
    // The database's own words go to the log, not into the error.
    .map_err(|e| crate::backup::store_error(e, &format!("cannot read {location}")))?;
    let outcomes = crate::check::all(&snapshot);
    if crate::cli::output::json_wanted(a.json) {
        match &a.label {
            Some(label) => output::json(&serde_json::json!({
                "label": label,
                "invariants": outcomes,
            }))?,
            None => output::json(&outcomes)?,
        }
    } else {
        let mut text = String::new();
        if let Some(label) = &a.label {
            text.push_str(&format!("== {label}: {} invariants ==\n", outcomes.len()));
        }
        text.push_str(&crate::check::render(&outcomes));
        output::emit(&text)?;
    }
    anyhow::ensure!(
        outcomes.iter().all(|o| o.held()),
        "an invariant was violated"
    );
    Ok(())
}
