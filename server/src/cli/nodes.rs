//! `better-compute nodes`.

use std::path::PathBuf;

use anyhow::Context;
use bcd_proto::v1::{
    AssignGpusRequest, BindingState, CommandInfo, CommandKind, CordonNodeRequest,
    DeleteNodeRequest, FleetEvent, GetNodeInventoryRequest, GetNodeSpecRequest, InventoryKind,
    LabelNodeRequest, ListCommandsRequest, ListEventsRequest, ListNodesRequest, NodeInfo,
    NodeSpecInfo, NodeState, SectionState, SetAccessRequest, StateSection, UnassignRequest,
};
use clap::Subcommand;

use super::Target;
use super::output::{self, around, out, spelled};
use crate::client::status;
use crate::words::{Gpu, cordon as cordon_word, gpus, node_state as state_word};

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// Show each node's state, epoch, gateway, certificate expiry and last-seen age.
    #[command(
        after_help = "Examples:\n  better-compute nodes list\n  better-compute nodes list -l pool=a,gpu!=h100 --state connected\n  better-compute -o wide nodes list --limit 100 --after nd-1a2b3c4d5e6f\n  better-compute -o json nodes list | jq -r '.nodes[].node_id'"
    )]
    List {
        /// Only nodes whose labels match: key=value, key!=value, key, !key,
        /// comma-separated, all of which must hold.
        #[arg(short = 'l', long = "labels", value_name = "SELECTOR")]
        selector: Option<String>,
        /// Only nodes in this state.
        #[arg(long, value_enum)]
        state: Option<StateFilter>,
        /// Only nodes of this pool (the pool their join token named).
        #[arg(long)]
        pool: Option<String>,
        /// At most this many nodes, in id order; the next page's --after is
        /// printed on stderr.
        #[arg(long)]
        limit: Option<u32>,
        /// Only nodes whose id sorts after this one (a page's last).
        #[arg(long, value_name = "NODE")]
        after: Option<String>,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Set or remove a node's labels: KEY=VALUE sets, KEY- removes. Signed
    /// into the node's spec; label selectors (-l) match them.
    #[command(
        after_help = "Examples:\n  better-compute nodes label nd-1a2b3c4d5e6f pool=a gpu=h200\n  better-compute nodes label nd-1a2b3c4d5e6f rack-"
    )]
    Label {
        /// The node's id.
        node: String,
        /// KEY=VALUE to set, KEY- to remove (keys: letters, digits, . _ - /;
        /// values: letters, digits, . _ -; 63 characters each).
        #[arg(required = true, value_name = "KEY=VALUE|KEY-")]
        labels: Vec<String>,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Cordon a node: no new allocation is assigned to it and no rollout
    /// wave upgrades it (its wave waits) until it is uncordoned. What it
    /// runs keeps running.
    #[command(
        after_help = "Examples:\n  better-compute nodes cordon nd-1a2b3c4d5e6f --reason 'fan 3 failing'"
    )]
    Cordon {
        /// The node's id.
        node: String,
        /// Why, shown in nodes list -o wide and nodes show.
        #[arg(long, default_value = "")]
        reason: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Uncordon a node: allocations and rollout waves land on it again.
    #[command(after_help = "Examples:\n  better-compute nodes uncordon nd-0f3a9c1b2c3d")]
    Uncordon {
        /// The node's id.
        node: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Cordon a node, then wait until its allocations are unassigned by
    /// their owners (better-compute nodes unassign). It releases nothing
    /// itself; exits 0 once none is left, 1 at --timeout naming those left.
    #[command(
        after_help = "Examples:\n  better-compute nodes drain nd-1a2b3c4d5e6f --reason 'replace PSU' --timeout 2h"
    )]
    Drain {
        /// The node's id.
        node: String,
        /// Why, as for cordon.
        #[arg(long, default_value = "drain")]
        reason: String,
        /// How long to wait for the allocations to go.
        #[arg(long, default_value = "10m", value_parser = super::dur)]
        timeout: std::time::Duration,
    },
    /// Bind GPUs (UUIDs or indices) to an allocation on a node: the node
    /// writes the CDI spec and the allocation's env file.
    #[command(
        after_help = "Examples:\n  better-compute nodes assign nd-0f3a9c1b2c3d job-17 --gpus 0,1 --env JOB=17\n  better-compute nodes assign nd-0f3a9c1b2c3d job-18 --gpus 2 --secret db-pw=password"
    )]
    Assign {
        /// The node's id (nodes list shows them).
        node: String,
        /// The allocation's id: a name of the workload's choosing, one env file per allocation.
        allocation: String,
        /// The GPUs, comma-separated: UUIDs or indices on the node (--gpus 0,1).
        #[arg(long, value_delimiter = ',', required = true)]
        gpus: Vec<String>,
        /// Extra environment for the allocation's env file, NAME=VALUE.
        #[arg(long = "env")]
        env: Vec<String>,
        /// A secret for the allocation (better-compute secrets put), at its
        /// newest version: the node writes it to
        /// secrets/ALLOCATION/FILE under its run directory, mode 0400
        /// (FILE: the name unless given).
        #[arg(long = "secret", value_name = "NAME[=FILE]")]
        secrets: Vec<String>,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Remove an allocation's GPUs from a node's spec.
    #[command(after_help = "Examples:\n  better-compute nodes unassign nd-0f3a9c1b2c3d job-17")]
    Unassign {
        /// The node's id.
        node: String,
        /// The allocation to release.
        allocation: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Set who may log in to a node (sshd keys, principals, user CAs) and
    /// its firewall table, from a JSON file: {"users": [{"name", "authorized_keys",
    /// "principals"}], "trusted_user_ca_keys": [...], "firewall": {"rules":
    /// [{"protocol", "port", "source", "action"}]}}.
    #[command(
        after_help = "Examples:\n  better-compute nodes access nd-0f3a9c1b2c3d --file access.json\n  better-compute nodes access nd-0f3a9c1b2c3d --clear"
    )]
    Access {
        /// The node's id.
        node: String,
        /// The access spec, a JSON file as above.
        #[arg(long, required_unless_present = "clear")]
        file: Option<PathBuf>,
        /// No users, no CA keys, no firewall table.
        #[arg(long, conflicts_with = "file")]
        clear: bool,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// One node whole: identity, session, certificate, conditions, its
    /// spec against what it applied, its recent commands and events.
    #[command(
        after_help = "Examples:\n  better-compute nodes show nd-1a2b3c4d5e6f\n  better-compute nodes show nd-1a2b3c4d5e6f --recent 50 -o json"
    )]
    Show {
        /// The node's id.
        node: String,
        /// Commands and events shown, the newest.
        #[arg(long, default_value_t = 10)]
        recent: u32,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// A node's desired spec against what it applied.
    #[command(
        after_help = "Examples:\n  better-compute nodes spec nd-0f3a9c1b2c3d\n  better-compute nodes spec nd-0f3a9c1b2c3d --json"
    )]
    Spec {
        /// The node's id.
        node: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Delete a node: it can no longer connect; its certificates are revoked.
    #[command(
        after_help = "Examples:\n  better-compute nodes delete nd-0f3a9c1b2c3d\n  better-compute nodes delete nd-0f3a9c1b2c3d --yes"
    )]
    Delete {
        /// The node's id.
        node: String,
        /// Delete without asking: the node's certificates are revoked and it stops for good.
        #[arg(long)]
        yes: bool,
    },
}

pub async fn run(cmd: NodesCommand, target: &Target) -> anyhow::Result<()> {
    match cmd {
        NodesCommand::List {
            selector,
            state,
            pool,
            limit,
            after,
            json,
        } => {
            let mut c = target.connect().await?;
            let r = c
                .list_nodes(ListNodesRequest {
                    label_selector: selector.unwrap_or_default(),
                    state: state.map_or(NodeState::Unspecified, StateFilter::wire) as i32,
                    pool: pool.unwrap_or_default(),
                    limit: limit.unwrap_or(0),
                    after: after.unwrap_or_default(),
                    node_id: String::new(),
                })
                .await
                .map_err(status)?
                .into_inner();
            if !r.next_after.is_empty() {
                eprintln!("more nodes: --after {}", r.next_after);
            }
            if crate::cli::output::json_wanted(json) {
                return output::json(&r);
            }
            use output::Align::{Left, Right};
            let mut columns = vec![
                ("NODE", Left),
                ("HOSTNAME", Left),
                ("STATE", Left),
                ("EPOCH", Right),
                ("GATEWAY", Left),
                ("CERT EXPIRES", Left),
                ("LAST SEEN", Right),
                ("VERSION", Left),
                ("FLOOR", Right),
                ("POOL", Left),
                ("MACS", Left),
            ];
            let wide = output::wide();
            if wide {
                columns.extend([
                    ("CONDITIONS", Left),
                    ("TAINTS", Left),
                    ("BOOT", Left),
                    ("TPM EK", Left),
                    ("LABELS", Left),
                    ("CORDON", Left),
                ]);
            }
            let mut table = output::Table::new(&columns);
            for n in &r.nodes {
                let mut row = vec![
                    n.node_id.clone(),
                    n.hostname.clone(),
                    state_word(n),
                    n.epoch.to_string(),
                    n.gateway_id.clone(),
                    output::time(n.cert_not_after_ms),
                    output::age(n.last_seen_age_ms),
                    n.agent_version.clone(),
                    n.release_floor.to_string(),
                    n.pool.clone(),
                    n.macs.join(","),
                ];
                if wide {
                    row.extend([
                        n.conditions.join(","),
                        n.taints.join(","),
                        n.boot_id.clone(),
                        output::short(&n.ek_sha256).to_string(),
                        n.intent
                            .as_ref()
                            .map(|i| crate::labels::show(&i.labels))
                            .unwrap_or_default(),
                        cordon_word(n),
                    ]);
                }
                table.row(row);
            }
            output::emit(&table.render())
        }
        NodesCommand::Assign {
            node,
            allocation,
            gpus,
            env,
            secrets,
            json,
        } => {
            let secrets = secrets
                .into_iter()
                .map(|s| {
                    let (name, file) = s.split_once('=').unwrap_or((&s, ""));
                    bcd_proto::v1::SecretRef {
                        name: name.to_string(),
                        version: 0,
                        file: file.to_string(),
                    }
                })
                .collect();
            let mut vars = std::collections::HashMap::new();
            for e in env {
                let (k, v) = e
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--env takes NAME=VALUE, not {e:?}"))?;
                vars.insert(k.to_string(), v.to_string());
            }
            let mut c = target.connect().await?;
            let info = c
                .assign_gpus(AssignGpusRequest {
                    node_id: node,
                    allocation_id: allocation,
                    gpus,
                    env: vars,
                    secrets,
                })
                .await
                .map_err(status)?
                .into_inner();
            print_spec(&info, json)
        }
        NodesCommand::Unassign {
            node,
            allocation,
            json,
        } => {
            let mut c = target.connect().await?;
            let info = c
                .unassign(UnassignRequest {
                    node_id: node,
                    allocation_id: allocation,
                })
                .await
                .map_err(status)?
                .into_inner();
            print_spec(&info, json)
        }
        NodesCommand::Access {
            node,
            file,
            clear,
            json,
        } => {
            let access: bc_store::specs::Access = match (file, clear) {
                (_, true) => Default::default(),
                (Some(f), false) => serde_json::from_slice(
                    &std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?,
                )
                .with_context(|| format!("{} is not an access description", f.display()))?,
                (None, false) => anyhow::bail!("nodes access needs --file FILE or --clear"),
            };
            let mut c = target.connect().await?;
            let info = c
                .set_access(SetAccessRequest {
                    node_id: node,
                    access: Some(crate::pki::seal::access(&access)),
                })
                .await
                .map_err(status)?
                .into_inner();
            print_spec(&info, json)
        }
        NodesCommand::Label { node, labels, json } => {
            let (set, remove) =
                crate::labels::parse_changes(&labels).map_err(anyhow::Error::msg)?;
            let mut c = target.connect().await?;
            let info = c
                .label_node(LabelNodeRequest {
                    node_id: node,
                    set: set.into_iter().collect(),
                    remove,
                })
                .await
                .map_err(status)?
                .into_inner();
            print_spec(&info, json)
        }
        NodesCommand::Cordon { node, reason, json } => {
            let info = cordon(target, &node, true, &reason).await?;
            print_spec(&info, json)
        }
        NodesCommand::Uncordon { node, json } => {
            let info = cordon(target, &node, false, "").await?;
            print_spec(&info, json)
        }
        NodesCommand::Drain {
            node,
            reason,
            timeout,
        } => drain(target, &node, &reason, timeout).await,
        NodesCommand::Show { node, recent, json } => show(&node, recent, json, target).await,
        NodesCommand::Spec { node, json } => {
            let mut c = target.connect().await?;
            let info = c
                .get_node_spec(GetNodeSpecRequest { node_id: node })
                .await
                .map_err(status)?
                .into_inner();
            print_spec(&info, json)
        }
        NodesCommand::Delete { node, yes } => {
            if !yes {
                anyhow::bail!(
                    "deleting node {node} revokes its certificates and it cannot reconnect; \
                     confirm with --yes"
                );
            }
            let mut c = target.connect().await?;
            c.delete_node(DeleteNodeRequest {
                node_id: node.clone(),
            })
            .await
            .map_err(status)?;
            out!("deleted {node}");
            Ok(())
        }
    }
}

/// The states `nodes list --state` keeps.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StateFilter {
    Connected,
    Disconnected,
    Unreachable,
}

impl StateFilter {
    fn wire(self) -> NodeState {
        match self {
            StateFilter::Connected => NodeState::Connected,
            StateFilter::Disconnected => NodeState::Disconnected,
            StateFilter::Unreachable => NodeState::Unreachable,
        }
    }
}

async fn cordon(
    target: &Target,
    node: &str,
    cordon: bool,
    reason: &str,
) -> anyhow::Result<NodeSpecInfo> {
    let mut c = target.connect().await?;
    Ok(c.cordon_node(CordonNodeRequest {
        node_id: node.to_string(),
        cordon,
        reason: reason.to_string(),
    })
    .await
    .map_err(status)?
    .into_inner())
}

/// How often `nodes drain` looks at the node's allocations.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// `nodes drain`: cordons, then waits for the allocations to be unassigned
/// by whoever assigned them (I5: nothing is released here).
async fn drain(
    target: &Target,
    node: &str,
    reason: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<()> {
    cordon(target, node, true, reason).await?;
    out!("cordoned {node}: no new allocation lands on it");
    let mut c = target.connect().await?;
    let started = crate::clock::mono();
    let mut last: Option<Vec<String>> = None;
    loop {
        let spec = c
            .get_node_spec(GetNodeSpecRequest {
                node_id: node.to_string(),
            })
            .await
            .map_err(status)?
            .into_inner();
        let left: Vec<String> = spec
            .assignments
            .iter()
            .map(|a| a.allocation_id.clone())
            .collect();
        if left.is_empty() {
            out!("drained {node}: no allocation is assigned to it");
            return Ok(());
        }
        if last.as_ref() != Some(&left) {
            out!(
                "waiting for {} allocation(s) to be unassigned by their owners: {}",
                left.len(),
                left.join(", ")
            );
            last = Some(left.clone());
        }
        if started.elapsed() >= timeout {
            anyhow::bail!(
                "{node} is cordoned but still holds {}: their owners unassign them \
                 (better-compute nodes unassign {node} ALLOCATION); drain releases nothing itself",
                left.join(", ")
            );
        }
        tokio::time::sleep(DRAIN_POLL.min(timeout.saturating_sub(started.elapsed()))).await;
    }
}

/// `nodes show --json`: the wire messages, as each list prints them.
#[derive(serde::Serialize)]
struct Shown<'a> {
    node: &'a NodeInfo,
    /// The GPUs its last `gpus` inventory section reported.
    gpus: &'a [Gpu],
    spec: &'a NodeSpecInfo,
    commands: &'a [CommandInfo],
    events: &'a [FleetEvent],
}

async fn show(node: &str, recent: u32, json: bool, target: &Target) -> anyhow::Result<()> {
    let mut c = target.connect().await?;
    let nodes = c
        .list_nodes(ListNodesRequest {
            node_id: node.to_string(),
            ..Default::default()
        })
        .await
        .map_err(status)?
        .into_inner()
        .nodes;
    let Some(n) = nodes.into_iter().find(|n| n.node_id == node) else {
        anyhow::bail!("there is no node {node}: `better-compute nodes list` shows the fleet's");
    };
    let spec = c
        .get_node_spec(GetNodeSpecRequest {
            node_id: node.to_string(),
        })
        .await
        .map_err(status)?
        .into_inner();
    let commands = c
        .list_commands(ListCommandsRequest {
            node_id: node.to_string(),
            limit: recent,
        })
        .await
        .map_err(status)?
        .into_inner()
        .commands;
    let events = c
        .list_events(ListEventsRequest {
            node_id: node.to_string(),
            limit: recent.max(1),
            ..Default::default()
        })
        .await
        .map_err(status)?
        .into_inner()
        .events;
    let inventory = c
        .get_node_inventory(GetNodeInventoryRequest {
            node_id: node.to_string(),
        })
        .await
        .map_err(status)?
        .into_inner();
    let gpu_section = inventory
        .sections
        .iter()
        .find(|s| s.section == InventoryKind::Gpus as i32);
    let (listed, unread) = match gpu_section.map(|s| gpus(&s.body)) {
        Some(Ok(g)) => (g, None),
        Some(Err(why)) => (Vec::new(), Some(why)),
        None => (Vec::new(), None),
    };
    if crate::cli::output::json_wanted(json) {
        return output::json(&Shown {
            node: &n,
            gpus: &listed,
            spec: &spec,
            commands: &commands,
            events: &events,
        });
    }
    let dash = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    let one = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    out!("node        {} ({})", n.node_id, n.hostname);
    out!(
        "state       {}, epoch {}, gateway {}, last seen {} ago",
        spelled::<NodeState>(n.state),
        n.epoch,
        one(&n.gateway_id),
        output::age(n.last_seen_age_ms)
    );
    out!(
        "version     {} (release floor {})",
        one(&n.agent_version),
        n.release_floor
    );
    out!("certificate expires {}", output::time(n.cert_not_after_ms));
    if n.ek_sha256.is_empty() {
        out!("tpm ek      - (joined with a token, bound to no endorsement key)");
    } else {
        out!("tpm ek      {} (bound by attestation)", n.ek_sha256);
    }
    out!(
        "boot        {} (journal {}, process {})",
        one(&n.boot_id),
        one(&n.journal_id),
        one(&n.incarnation_id)
    );
    out!(
        "pool        {}",
        if n.pool.is_empty() { "-" } else { &n.pool }
    );
    out!("macs        {}", dash(&n.macs));
    out!(
        "labels      {}",
        n.intent
            .as_ref()
            .map(|i| crate::labels::show(&i.labels))
            .filter(|l| !l.is_empty())
            .unwrap_or_else(|| "-".into())
    );
    if !n.intent_error.is_empty() {
        out!(
            "cordon      unknown: the node's stored spec does not open ({})",
            n.intent_error
        );
    } else {
        out!("cordon      {}", one(&cordon_word(&n)));
    }
    out!("conditions  {}", dash(&n.conditions));
    out!("taints      {}", dash(&n.taints));
    match (gpu_section, &unread) {
        (None, _) => out!("gpus        - (no inventory reported yet)"),
        (Some(_), Some(why)) => out!("gpus        - ({why})"),
        (Some(s), None) => {
            out!(
                "gpus        {} (reported {})",
                listed.len(),
                output::time(s.updated_at_ms)
            );
            for g in &listed {
                out!(
                    "  {:<14} {:<42} {:<24} {}",
                    g.pci_address,
                    g.uuid.as_deref().unwrap_or("-"),
                    g.model.as_deref().unwrap_or("-"),
                    g.numa_node.map_or("-".to_string(), |n| format!("numa {n}"))
                );
            }
        }
    }
    print_spec_lines(&spec)?;
    out!("commands    (newest {recent})");
    for i in &commands {
        out!(
            "  {:<20} {:<17} {:<10} {} {}",
            i.command_id,
            spelled::<CommandKind>(i.kind),
            crate::words::command_state(i),
            output::time(i.created_at_ms),
            i.summary
        );
    }
    out!("events      (newest {})", recent.max(1));
    for e in &events {
        out!("  {} {} {}", output::time(e.at_ms), e.kind, e.detail);
    }
    Ok(())
}

fn print_spec(i: &NodeSpecInfo, json: bool) -> anyhow::Result<()> {
    if crate::cli::output::json_wanted(json) {
        return output::json(i);
    }
    out!("node       {}", i.node_id);
    print_spec_lines(i)
}

/// A spec's generations, allocations, bindings, events and sections.
fn print_spec_lines(i: &NodeSpecInfo) -> anyhow::Result<()> {
    out!(
        "generation desired {}, applied {}{}",
        i.desired_generation,
        i.applied_generation,
        if i.reported_age_ms >= 0 {
            format!(" (reported {} ago)", output::age(i.reported_age_ms))
        } else {
            " (never reported)".into()
        }
    );
    if let Some(intent) = &i.intent {
        if !intent.labels.is_empty() {
            out!("labels     {}", crate::labels::show(&intent.labels));
        }
        if intent.cordoned {
            out!(
                "cordoned   since {}{}",
                output::time(intent.cordoned_at_ms),
                around(" (", &intent.cordon_reason, ")")
            );
        }
    }
    for a in &i.assignments {
        out!("allocation {}: GPUs {}", a.allocation_id, a.gpus.join(","));
        for s in &a.secrets {
            out!(
                "secret     {} v{} -> {}/{}",
                s.name,
                s.version,
                a.allocation_id,
                s.file
            );
        }
    }
    for b in &i.bindings {
        out!(
            "binding    {} {} (generation {}): {}",
            b.allocation_id,
            spelled::<BindingState>(b.state),
            b.spec_generation,
            b.gpu_uuids.join(",")
        );
    }
    for e in &i.events {
        out!("event      {e}");
    }
    for s in &i.sections {
        out!(
            "section    {} {}{}",
            spelled::<StateSection>(s.section),
            spelled::<SectionState>(s.status),
            around(": ", &s.message, "")
        );
    }
    Ok(())
}
