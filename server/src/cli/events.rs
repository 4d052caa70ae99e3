//! `better-compute events`.

use std::time::Duration;

use bcd_proto::v1::{FleetEvent, ListEventsRequest};
use clap::Args;

use super::output::{self, out};
use super::{Target, dur};

/// How often `--follow` asks for new events.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  better-compute events --kind 'security.*' --since 1h\n  better-compute events --node nd-0f3a9c1b2c3d --follow\n  better-compute events --since 7d --limit 100 --json"
)]
pub struct EventsArgs {
    /// Only this node's events.
    #[arg(long)]
    node: Option<String>,
    /// Only kinds matching this glob (`security.*`, `reservation.*`).
    #[arg(long, value_name = "GLOB")]
    kind: Option<String>,
    /// Only events this recent (`1h`, `30m`, `7d`).
    #[arg(long, default_value = "24h", value_parser = dur)]
    since: Duration,
    /// At most this many (the newest ones), up to 10,000.
    #[arg(long, default_value_t = 1_000)]
    limit: u32,
    /// Keep printing events as they come, until interrupted.
    #[arg(long, short = 'f')]
    follow: bool,
    /// One JSON object per event.
    #[arg(long)]
    json: bool,
}

pub async fn run(a: EventsArgs, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    let mut request = ListEventsRequest {
        node_id: a.node.unwrap_or_default(),
        kind: a.kind.unwrap_or_default(),
        after_id: 0,
        within_ms: a.since.as_millis().min(u128::from(u64::MAX)) as u64,
        limit: a.limit,
    };
    if !crate::cli::output::json_wanted(a.json) {
        out!("{:<20} {:<34} {:<18} DETAIL", "TIME", "KIND", "NODE");
    }
    loop {
        let events = c
            .list_events(request.clone())
            .await
            .map_err(crate::client::status)?
            .into_inner()
            .events;
        for e in &events {
            print(e, a.json)?;
        }
        if let Some(last) = events.last() {
            request.after_id = last.id;
        }
        if !a.follow {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

fn print(e: &FleetEvent, json: bool) -> anyhow::Result<()> {
    if crate::cli::output::json_wanted(json) {
        return output::json_line(e);
    }
    out!(
        "{:<20} {:<34} {:<18} {}",
        output::time(e.at_ms),
        e.kind,
        e.node_id,
        e.detail
    );
    Ok(())
}
