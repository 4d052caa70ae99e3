//! `better-compute rollouts`.

use bcd_proto::v1::{
    self, ChangeRolloutRequest, GetRolloutRequest, ListRolloutsRequest, RolloutAction, RolloutInfo,
    RolloutNodeStatus, StartRolloutRequest,
};
use clap::Subcommand;

use super::Target;
use super::output::{self, around, out, spelled};
use crate::client::{Admin, status};

#[derive(Debug, Subcommand)]
pub enum RolloutsCommand {
    /// Start rolling release SEQUENCE out.
    #[command(
        after_help = "Examples:\n  better-compute rollouts start 7\n  better-compute rollouts start 7 --selector 'hostname=gpu-a*' --waves 10%,100% --max-failures 2\n  better-compute rollouts start 7 -l pool=a,gpu=h200"
    )]
    Start {
        /// The release's sequence number (releases list shows them).
        sequence: u64,
        /// Which nodes: node=ID, hostname=GLOB, version=V, comma-separated
        /// (all must hold); `all` for every node.
        #[arg(long, default_value = "all")]
        selector: String,
        /// And only nodes whose labels match: key=value, key!=value, key,
        /// !key, comma-separated (nodes list -l shows which).
        #[arg(short = 'l', long = "labels", value_name = "SELECTOR")]
        labels: Option<String>,
        /// Cumulative percentages of the selected nodes.
        #[arg(
            long,
            value_delimiter = ',',
            value_parser = bc_store::rollouts::parse_wave,
            default_value = "1%,10%,50%,100%"
        )]
        waves: Vec<u32>,
        /// Failed upgrades tolerated; one more halts the rollout.
        #[arg(long, default_value_t = 0)]
        max_failures: u32,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// A rollout's progress (the latest one without an ID).
    #[command(
        after_help = "Examples:\n  better-compute rollouts status\n  better-compute rollouts status ro-0a1b2c3d4e5f --watch --nodes"
    )]
    Status {
        /// The rollout's id (rollouts list shows them).
        id: Option<String>,
        /// One line per node.
        #[arg(long)]
        nodes: bool,
        /// Follow it with a progress bar (a line per change when stderr is
        /// not a terminal) until it is no longer running or paused; exit 1
        /// if it halted or was aborted.
        #[arg(long)]
        watch: bool,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Stop issuing upgrades; those under way finish.
    #[command(after_help = "Examples:\n  better-compute rollouts pause ro-0a1b2c3d4e5f")]
    Pause {
        /// The rollout's id.
        id: String,
    },
    /// Go on with a paused or halted rollout.
    #[command(after_help = "Examples:\n  better-compute rollouts resume ro-0a1b2c3d4e5f")]
    Resume {
        /// The rollout's id.
        id: String,
    },
    /// Stop the rollout: upgrades not yet dispatched are cancelled; with
    /// --rollback, nodes still upgrading are swapped back (confirmed nodes
    /// keep the release: roll forward instead).
    #[command(
        after_help = "Examples:\n  better-compute rollouts abort ro-0a1b2c3d4e5f\n  better-compute rollouts abort ro-0a1b2c3d4e5f --rollback"
    )]
    Abort {
        /// The rollout's id.
        id: String,
        /// Swap nodes still upgrading back to the release before.
        #[arg(long)]
        rollback: bool,
    },
}

async fn change(
    c: &mut Admin,
    id: String,
    action: RolloutAction,
    rollback: bool,
) -> anyhow::Result<RolloutInfo> {
    Ok(c.change_rollout(ChangeRolloutRequest {
        id,
        action: action as i32,
        rollback,
    })
    .await
    .map_err(status)?
    .into_inner())
}

pub async fn run(cmd: RolloutsCommand, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    let (info, json, nodes) = match cmd {
        RolloutsCommand::Start {
            sequence,
            selector,
            labels,
            waves,
            max_failures,
            json,
        } => {
            bc_store::rollouts::validate_waves(&waves).map_err(anyhow::Error::msg)?;
            let r = c
                .start_rollout(StartRolloutRequest {
                    sequence,
                    selector,
                    waves,
                    max_failures,
                    label_selector: labels.unwrap_or_default(),
                })
                .await
                .map_err(status)?
                .into_inner();
            (r, json, false)
        }
        RolloutsCommand::Status {
            id,
            nodes,
            watch: following,
            json,
        } => {
            let r = match id {
                Some(id) => c
                    .get_rollout(GetRolloutRequest { id })
                    .await
                    .map_err(status)?
                    .into_inner(),
                None => c
                    .list_rollouts(ListRolloutsRequest {})
                    .await
                    .map_err(status)?
                    .into_inner()
                    .rollouts
                    .into_iter()
                    .next()
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "no rollouts yet: start one with better-compute rollouts start SEQUENCE"
                        )
                    })?,
            };
            if following {
                let r = watch(&mut c, r).await?;
                print(&r, json, nodes)?;
                let state = v1::RolloutState::try_from(r.state).unwrap_or_default();
                anyhow::ensure!(
                    !matches!(state, v1::RolloutState::Halted | v1::RolloutState::Aborted),
                    "rollout {} {}{}",
                    r.id,
                    spelled::<v1::RolloutState>(r.state),
                    around(": ", &r.reason, "")
                );
                return Ok(());
            }
            (r, json, nodes)
        }
        RolloutsCommand::Pause { id } => (
            change(&mut c, id, RolloutAction::Pause, false).await?,
            false,
            false,
        ),
        RolloutsCommand::Resume { id } => (
            change(&mut c, id, RolloutAction::Resume, false).await?,
            false,
            false,
        ),
        RolloutsCommand::Abort { id, rollback } => (
            change(&mut c, id, RolloutAction::Abort, rollback).await?,
            false,
            true,
        ),
    };
    print(&info, json, nodes)
}

/// How often `rollouts status --watch` asks.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Follows a rollout until it is neither running nor paused: a bar of its
/// settled nodes on a terminal, else a line on stderr per change.
async fn watch(c: &mut crate::client::Admin, mut r: RolloutInfo) -> anyhow::Result<RolloutInfo> {
    let bar = indicatif::ProgressBar::new(r.nodes.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} nodes settled  {msg}")
            .expect("the template is valid"),
    );
    let mut last = String::new();
    loop {
        let count = |s: RolloutNodeStatus| r.nodes.iter().filter(|n| n.status == s as i32).count();
        let settled =
            r.nodes.len() - count(RolloutNodeStatus::Waiting) - count(RolloutNodeStatus::Upgrading);
        let line = format!(
            "{} wave {}/{}: confirmed {}, upgrading {}, failed {}, waiting {}",
            spelled::<v1::RolloutState>(r.state),
            r.wave + 1,
            r.waves.len(),
            count(RolloutNodeStatus::Confirmed),
            count(RolloutNodeStatus::Upgrading),
            count(RolloutNodeStatus::Failed),
            count(RolloutNodeStatus::Waiting),
        );
        bar.set_length(r.nodes.len() as u64);
        bar.set_position(settled as u64);
        if bar.is_hidden() {
            if line != last {
                eprintln!("{} {settled}/{} settled, {line}", r.id, r.nodes.len());
            }
        } else {
            bar.set_message(line.clone());
        }
        last = line;
        let state = v1::RolloutState::try_from(r.state).unwrap_or_default();
        if !matches!(state, v1::RolloutState::Running | v1::RolloutState::Paused) {
            bar.finish_and_clear();
            return Ok(r);
        }
        tokio::time::sleep(WATCH_EVERY).await;
        r = c
            .get_rollout(GetRolloutRequest { id: r.id.clone() })
            .await
            .map_err(status)?
            .into_inner();
    }
}

fn print(r: &RolloutInfo, json: bool, nodes: bool) -> anyhow::Result<()> {
    if crate::cli::output::json_wanted(json) {
        return output::json(r);
    }
    let count = |s: RolloutNodeStatus| r.nodes.iter().filter(|n| n.status == s as i32).count();
    let pct = r.waves.get(r.wave as usize).copied().unwrap_or(100);
    out!(
        "rollout {}: release {} ({}) to {} nodes ({}), {}{}",
        r.id,
        r.sequence,
        r.version,
        r.nodes.len(),
        r.selector,
        spelled::<v1::RolloutState>(r.state),
        around(": ", &r.reason, "")
    );
    out!(
        "wave {}/{} ({pct}%); confirmed {}, upgrading {}, failed {} (budget {}), waiting {}, skipped {}, cancelled {}",
        r.wave + 1,
        r.waves.len(),
        count(RolloutNodeStatus::Confirmed),
        count(RolloutNodeStatus::Upgrading),
        count(RolloutNodeStatus::Failed),
        r.max_failures,
        count(RolloutNodeStatus::Waiting),
        count(RolloutNodeStatus::Skipped),
        count(RolloutNodeStatus::Cancelled),
    );
    if nodes {
        out!("{:<16} {:<10} {:<22} REASON", "NODE", "STATUS", "COMMAND");
        for n in &r.nodes {
            out!(
                "{:<16} {:<10} {:<22} {}{}",
                n.node_id,
                spelled::<RolloutNodeStatus>(n.status),
                n.command_id,
                n.reason,
                around(" (rollback ", &n.rollback_command_id, ")")
            );
        }
    }
    Ok(())
}
