//! `better-compute commands`.

use std::process::ExitCode;
use std::time::Duration;

use bcd_proto::v1::{
    CommandInfo, CommandKind, CommandState, GetCommandRequest, ListCommandsRequest,
    ListNodesRequest, ResultEvidence, RunCommandRequest,
};
use clap::Subcommand;

use super::output::{self, around, is_terminal, out, spelled};
use super::{Target, dur};
use crate::client::status;
use crate::words::command_state as state_word;

#[derive(Debug, Subcommand)]
pub enum CommandsCommand {
    /// Run a command on a node: exec.run -- PROGRAM [ARGS...], node.reboot,
    /// boot.kexec image=ID [cmdline=TEXT], boot.kexec kernel=PATH
    /// [initrd=PATH] [cmdline=TEXT], inventory.refresh, gpu.reset GPU,
    /// daemon.upgrade SEQUENCE, daemon.rollback.
    ///
    /// boot.kexec image=ID boots a registered image (an id, a unique id
    /// prefix or a name from images list): the node fetches its kernel and
    /// initrd over its own certificate, verifies the signed manifest with
    /// the image keys it learned at join and both files against it, and
    /// boots them with the manifest's command line followed by cmdline=.
    /// boot.kexec kernel=PATH boots files already on the node, unverified,
    /// with cmdline= as the whole command line.
    #[command(
        after_help = "Examples:\n  better-compute commands run nd-1a2b3c4d5e6f exec.run --wait -- /usr/bin/nvidia-smi -L\n  better-compute commands run nd-1a2b3c4d5e6f node.reboot --not-after 10m\n  better-compute commands run nd-1a2b3c4d5e6f daemon.upgrade 7 --idempotency-key upgrade-7\n  better-compute commands run -l pool=a inventory.refresh --wait"
    )]
    Run {
        /// NODE KIND [ARGS]...: the node's id (nodes list shows them), the
        /// command kind (exec.run, node.reboot, boot.kexec,
        /// inventory.refresh, gpu.reset, daemon.upgrade, daemon.rollback)
        /// and its arguments (exec.run: the program and its arguments,
        /// after --). With -l: KIND [ARGS]...
        #[arg(required = true, value_name = "NODE KIND [ARGS]")]
        words: Vec<String>,
        /// Every node whose labels match instead of one: one signed command
        /// per node, and a summary of their results with --wait (exit 0
        /// when every one succeeded).
        #[arg(short = 'l', long = "labels", value_name = "SELECTOR")]
        labels: Option<String>,
        /// The node must start it within this long (a duration such as 10m),
        /// or by this time (RFC 3339); default 1h.
        #[arg(long)]
        not_after: Option<String>,
        /// Refuse to run it before the node applied this spec generation.
        #[arg(long, default_value_t = 0)]
        min_generation: u64,
        /// Repeat-safe submission: the same key returns the first command.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// exec.run: kill the program after this long (default 10m).
        #[arg(long, value_parser = dur)]
        timeout: Option<Duration>,
        /// Wait for the result and print it; the exit code follows the
        /// command's (0 succeeded, 1 failed, 4 expired or rejected, 5 a
        /// result in the store that its node did not sign).
        #[arg(long)]
        wait: bool,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// Recent commands, newest first.
    #[command(
        after_help = "Examples:\n  better-compute commands list\n  better-compute commands list --node nd-0f3a9c1b2c3d --limit 10 --json"
    )]
    List {
        /// Only this node's commands.
        #[arg(long)]
        node: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
    /// One command with its result and output.
    #[command(
        after_help = "Examples:\n  better-compute commands show cmd-3f9a0c1d2e4b5a6f\n  better-compute commands show cmd-3f9a0c1d2e4b5a6f -o json"
    )]
    Show {
        /// The command's id (commands list shows them).
        id: String,
        /// JSON instead of a table (the same as the global `-o json`).
        #[arg(long)]
        json: bool,
    },
}

/// `--not-after`: a duration from now, or an RFC 3339 time.
fn not_after(s: &str) -> anyhow::Result<Duration> {
    if let Ok(d) = humantime::parse_duration(s) {
        anyhow::ensure!(!d.is_zero(), "--not-after must be in the future");
        return Ok(d);
    }
    let t = humantime::parse_rfc3339_weak(s).map_err(|_| {
        anyhow::anyhow!("--not-after takes a duration (10m) or an RFC 3339 time, not {s:?}")
    })?;
    t.duration_since(crate::clock::system_now())
        .map_err(|_| anyhow::anyhow!("--not-after {s} has already passed"))
}

pub async fn run(cmd: CommandsCommand, target: &Target) -> anyhow::Result<ExitCode> {
    let mut c = target.connect().await?;
    match cmd {
        CommandsCommand::Run {
            mut words,
            labels,
            not_after: deadline,
            min_generation,
            idempotency_key,
            timeout,
            wait,
            json,
        } => {
            let deadline = deadline.as_deref().map(not_after).transpose()?;
            let node = match &labels {
                Some(_) => None,
                None if words.len() < 2 => anyhow::bail!(
                    "commands run takes NODE KIND [ARGS]... (or -l SELECTOR KIND [ARGS]...)"
                ),
                None => Some(words.remove(0)),
            };
            let kind = words.remove(0);
            let kind = bcd_proto::typed::parse::<CommandKind>(&kind)
                .filter(|k| *k != CommandKind::Unspecified)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown command kind {kind:?}: one of {}",
                        bcd_core::command::Kind::names()
                    )
                })?;
            let request = RunCommandRequest {
                node_id: node.clone().unwrap_or_default(),
                kind: kind as i32,
                args: words,
                not_after_ms: deadline.map_or(0, |d| d.as_millis() as u64),
                min_generation,
                idempotency_key: idempotency_key.unwrap_or_default(),
                timeout_ms: timeout.map_or(0, |d| d.as_millis() as u64),
            };
            if let Some(selector) = labels {
                return fan_out(&mut c, &selector, request, wait, json).await;
            }
            let mut info = c.run_command(request).await.map_err(status)?.into_inner();
            if !wait {
                if crate::cli::output::json_wanted(json) {
                    output::json_line(&info)?;
                } else {
                    out!("{}", info.command_id);
                }
                return Ok(ExitCode::SUCCESS);
            }
            while !is_terminal(info.state) {
                tokio::time::sleep(WAIT_POLL).await;
                info = c
                    .get_command(GetCommandRequest {
                        command_id: info.command_id.clone(),
                    })
                    .await
                    .map_err(status)?
                    .into_inner();
            }
            if forged(&info) {
                // Nothing of a forged result is shown as the node's.
                if crate::cli::output::json_wanted(json) {
                    output::json_line(&info)?;
                }
                eprintln!(
                    "{} FORGED: {}: see better-compute check",
                    info.command_id, info.evidence_detail
                );
                return Ok(ExitCode::from(5));
            }
            if crate::cli::output::json_wanted(json) {
                output::json_line(&info)?;
            } else {
                output::emit(&String::from_utf8_lossy(&info.output))?;
                eprintln!(
                    "{} {}{}",
                    info.command_id,
                    spelled::<CommandState>(info.state),
                    around(": ", &info.reason, "")
                );
            }
            Ok(output::command_exit(info.state))
        }
        CommandsCommand::List { node, limit, json } => {
            let r = c
                .list_commands(ListCommandsRequest {
                    node_id: node.unwrap_or_default(),
                    limit,
                })
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                output::json(&r.commands)?;
                return Ok(ExitCode::SUCCESS);
            }
            out!(
                "{:<20} {:<16} {:>5} {:<17} {:<10} {}",
                "COMMAND",
                "NODE",
                "SEQ",
                "KIND",
                "STATE",
                "SUMMARY"
            );
            for i in &r.commands {
                out!(
                    "{:<20} {:<16} {:>5} {:<17} {:<10} {}",
                    i.command_id,
                    i.node_id,
                    i.seq,
                    spelled::<CommandKind>(i.kind),
                    state_word(i),
                    i.summary
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        CommandsCommand::Show { id, json } => {
            let i = c
                .get_command(GetCommandRequest { command_id: id })
                .await
                .map_err(status)?
                .into_inner();
            if crate::cli::output::json_wanted(json) {
                output::json(&i)?;
            } else {
                show(&i)?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Whether the key holder found the result no node's.
/// How often a waiting CLI asks for a command's state.
const WAIT_POLL: Duration = Duration::from_millis(50);

/// `commands run -l`: one signed command per node whose labels match
/// (under `KEY:NODE` when an idempotency key is given, so repeating the
/// whole fan-out creates none twice), then, with `--wait`, each one's
/// result and a summary. Exit code: 0 when every one succeeded, 5 when
/// a result is forged, 1 when one failed, 4 when one expired or was
/// rejected.
async fn fan_out(
    c: &mut crate::client::Admin,
    selector: &str,
    request: RunCommandRequest,
    wait: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let nodes = c
        .list_nodes(ListNodesRequest {
            label_selector: selector.to_string(),
            ..Default::default()
        })
        .await
        .map_err(status)?
        .into_inner()
        .nodes;
    anyhow::ensure!(
        !nodes.is_empty(),
        "no node's labels match {selector:?}: see better-compute nodes list -l {selector:?}"
    );
    let mut infos = Vec::with_capacity(nodes.len());
    for n in &nodes {
        let key = &request.idempotency_key;
        let one = RunCommandRequest {
            node_id: n.node_id.clone(),
            idempotency_key: if key.is_empty() {
                String::new()
            } else {
                format!("{key}:{}", n.node_id)
            },
            ..request.clone()
        };
        infos.push(c.run_command(one).await.map_err(status)?.into_inner());
    }
    if wait {
        for info in infos.iter_mut() {
            while !is_terminal(info.state) {
                tokio::time::sleep(WAIT_POLL).await;
                *info = c
                    .get_command(GetCommandRequest {
                        command_id: info.command_id.clone(),
                    })
                    .await
                    .map_err(status)?
                    .into_inner();
            }
        }
    }
    if crate::cli::output::json_wanted(json) {
        for info in &infos {
            output::json_line(info)?;
        }
    } else {
        use output::Align::Left;
        let mut table = output::Table::new(&[
            ("NODE", Left),
            ("COMMAND", Left),
            ("STATE", Left),
            ("REASON", Left),
        ]);
        for i in &infos {
            table.row(vec![
                i.node_id.clone(),
                i.command_id.clone(),
                state_word(i),
                if forged(i) {
                    i.evidence_detail.clone()
                } else {
                    i.reason.clone()
                },
            ]);
        }
        output::emit(&table.render())?;
    }
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for i in &infos {
        *counts.entry(state_word(i)).or_default() += 1;
    }
    eprintln!(
        "{} nodes: {}",
        infos.len(),
        counts
            .iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !wait {
        return Ok(ExitCode::SUCCESS);
    }
    Ok(fan_out_exit(&infos))
}

/// The exit code of a waited fan-out: the worst of its commands'.
fn fan_out_exit(infos: &[CommandInfo]) -> ExitCode {
    if infos.iter().any(forged) {
        return ExitCode::from(5);
    }
    let codes: Vec<ExitCode> = infos
        .iter()
        .map(|i| output::command_exit(i.state))
        .collect();
    for worst in [1u8, 4] {
        if codes.contains(&ExitCode::from(worst)) {
            return ExitCode::from(worst);
        }
    }
    ExitCode::SUCCESS
}

fn forged(i: &CommandInfo) -> bool {
    i.evidence == ResultEvidence::Forged as i32
}

fn show(i: &CommandInfo) -> anyhow::Result<()> {
    out!("command   {}", i.command_id);
    out!("node      {} (seq {})", i.node_id, i.seq);
    out!("kind      {} {}", spelled::<CommandKind>(i.kind), i.summary);
    if forged(i) {
        out!(
            "state     FORGED: {} (the store's row says {}{})",
            i.evidence_detail,
            spelled::<CommandState>(i.state),
            around(": ", &i.reason, "")
        );
        return Ok(());
    }
    out!(
        "state     {}{}",
        spelled::<CommandState>(i.state),
        around(" (", &i.reason, ")")
    );
    match bcd_proto::typed::wire::<ResultEvidence>(i.evidence) {
        Some(ResultEvidence::NodeSigned) => out!("evidence  signed by the node"),
        Some(ResultEvidence::Decided | ResultEvidence::Legacy) => {
            out!("evidence  {}", i.evidence_detail)
        }
        _ => {}
    }
    if i.has_exit_code {
        out!("exit code {}", i.exit_code);
    }
    out!("created   {}", output::time(i.created_at_ms));
    out!("not after {}", output::time(i.not_after_ms));
    if i.result_at_ms != 0 {
        out!("finished  {}", output::time(i.result_at_ms));
    }
    if !i.output.is_empty() {
        out!(
            "output{}:",
            if i.output_truncated {
                " (truncated)"
            } else {
                ""
            }
        );
        output::emit(&String::from_utf8_lossy(&i.output))?;
    }
    Ok(())
}
