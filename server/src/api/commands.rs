//! Commands: `RunCommand` (an operator's request parsed into a kind and
//! typed arguments, then created sealed by the worker key), `ListCommands`,
//! `GetCommand`.

use bc_store::{CommandId, ImageId, NodeId};
use std::time::Duration;

use bc_store::Refusal;
use bc_store::commands::{CommandRow, NewCommand};

use crate::evidence::Evidence;
use bcd_core::command::{Kind, MAX_LIFE};
use bcd_proto::v1::{
    self, CommandInfo, ExecArgs, GetCommandRequest, GpuResetArgs, KexecArgs, ListCommandsRequest,
    ListCommandsResponse, NoArgs, RunCommandRequest, UpgradeArgs, command_payload,
};
use tonic::Status;
use tracing::info;

use super::AdminService;
use super::status::{bad_request, refusal, status, unavailable};

/// Default `exec.run` timeout and output bound.
pub const EXEC_TIMEOUT_MS: u64 = 10 * 60 * 1000;
pub const EXEC_MAX_OUTPUT: u32 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "unknown command kind (value {0}): one of {kinds}",
        kinds = bcd_core::command::Kind::names()
    )]
    UnknownKind(i32),
    #[error("exec.run needs a program: commands run NODE exec.run -- PROGRAM [ARGS...]")]
    NoProgram,
    #[error("{0} takes no arguments")]
    NoArgsExpected(&'static str),
    #[error(
        "boot.kexec takes image=ID [cmdline=TEXT] (a registered image, see better-compute images \
         list) or kernel=PATH [initrd=PATH] [cmdline=TEXT] (files already on the node), not {0:?}"
    )]
    BadKexecArg(String),
    #[error(
        "boot.kexec needs image=ID (a registered image, see better-compute images list) or \
         kernel=PATH (a file already on the node)"
    )]
    NoKernel,
    #[error(
        "boot.kexec takes image=ID or kernel=PATH [initrd=PATH], not both: an image brings its \
         own kernel and initrd"
    )]
    ImageAndPaths,
    #[error("gpu.reset takes one GPU: its UUID, index or PCI address")]
    OneGpu,
    #[error(
        "daemon.upgrade takes one release sequence (see better-compute releases list), not {0:?}"
    )]
    BadSequence(String),
}

/// Parses the kind and its arguments; returns the kind, the typed arguments
/// and a one-line summary for listings.
pub fn parse(
    kind: i32,
    args: &[String],
    timeout_ms: u64,
) -> Result<(Kind, command_payload::Args, String), ArgsError> {
    let k = bcd_proto::typed::kind(kind).ok_or(ArgsError::UnknownKind(kind))?;
    match k {
        Kind::ExecRun => {
            let (program, rest) = args.split_first().ok_or(ArgsError::NoProgram)?;
            if program.is_empty() {
                return Err(ArgsError::NoProgram);
            }
            let summary = args.join(" ");
            Ok((
                k,
                command_payload::Args::Exec(ExecArgs {
                    program: program.clone(),
                    args: rest.to_vec(),
                    timeout_ms: if timeout_ms == 0 {
                        EXEC_TIMEOUT_MS
                    } else {
                        timeout_ms
                    },
                    max_output: EXEC_MAX_OUTPUT,
                }),
                summary,
            ))
        }
        Kind::BootKexec => {
            let mut a = KexecArgs::default();
            for arg in args {
                match arg.split_once('=') {
                    Some(("kernel", v)) => a.kernel = v.to_string(),
                    Some(("initrd", v)) => a.initrd = v.to_string(),
                    Some(("cmdline", v)) => a.cmdline = v.to_string(),
                    Some(("image", v)) if !v.is_empty() => a.image_id = v.to_string(),
                    _ => return Err(ArgsError::BadKexecArg(arg.clone())),
                }
            }
            if !a.image_id.is_empty() {
                if !a.kernel.is_empty() || !a.initrd.is_empty() {
                    return Err(ArgsError::ImageAndPaths);
                }
                // `run` resolves the id and names the image in the summary.
                let summary = format!("image {}", a.image_id);
                return Ok((k, command_payload::Args::Kexec(a), summary));
            }
            if a.kernel.is_empty() {
                return Err(ArgsError::NoKernel);
            }
            let summary = a.kernel.clone();
            Ok((k, command_payload::Args::Kexec(a), summary))
        }
        Kind::GpuReset => match args {
            [gpu] if !gpu.is_empty() => Ok((
                k,
                command_payload::Args::GpuReset(GpuResetArgs { gpu: gpu.clone() }),
                gpu.clone(),
            )),
            _ => Err(ArgsError::OneGpu),
        },
        Kind::DaemonUpgrade => match args {
            [seq] => {
                let sequence = seq
                    .strip_prefix("sequence=")
                    .unwrap_or(seq)
                    .parse::<u64>()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| ArgsError::BadSequence(seq.clone()))?;
                Ok((
                    k,
                    command_payload::Args::Upgrade(UpgradeArgs { sequence }),
                    format!("release {sequence}"),
                ))
            }
            _ => Err(ArgsError::BadSequence(args.join(" "))),
        },
        Kind::NodeReboot | Kind::InventoryRefresh | Kind::DaemonRollback => {
            if !args.is_empty() {
                return Err(ArgsError::NoArgsExpected(k.name()));
            }
            Ok((k, command_payload::Args::None(NoArgs {}), String::new()))
        }
    }
}

/// Default deadline of a command.
pub const DEFAULT_NOT_AFTER: Duration = Duration::from_secs(3600);

/// The deadline a request asks for, or why it may not have it: a command
/// lives at most `bcd_core::command::MAX_LIFE` (nodes refuse a longer one).
pub fn not_after(requested_ms: u64) -> Result<Duration, String> {
    if requested_ms == 0 {
        return Ok(DEFAULT_NOT_AFTER);
    }
    let d = Duration::from_millis(requested_ms);
    if d > MAX_LIFE {
        return Err(format!(
            "a command may live at most 24 hours (nodes refuse a longer one), not {}: give \
             --not-after 24h or less",
            humantime::format_duration(Duration::from_secs(d.as_secs()))
        ));
    }
    Ok(d)
}

/// A command as the API shows it, with what its result rests on.
pub fn info(c: CommandRow, evidence: &Evidence) -> CommandInfo {
    let kind = c
        .kind
        .known()
        .map_or(0, |k| v1::CommandKind::from(k) as i32);
    let state = c
        .state
        .known()
        .map_or(0, |s| v1::CommandState::from(s) as i32);
    let (evidence, evidence_detail) = evidence.to_wire();
    CommandInfo {
        command_id: c.id.into_string(),
        node_id: c.node_id.into_string(),
        seq: c.seq,
        kind,
        summary: c.summary,
        state,
        reason: c.reason,
        exit_code: c.exit_code.unwrap_or(0),
        has_exit_code: c.exit_code.is_some(),
        output: c.output,
        output_truncated: c.output_truncated,
        created_at_ms: c.created_at_ms,
        not_after_ms: c.not_after_ms,
        result_at_ms: c.result_at_ms.unwrap_or(0),
        epoch: c.epoch,
        evidence: evidence as i32,
        evidence_detail,
    }
}

/// Judges each row's result against its node's certificates (read once
/// per node).
pub async fn judged(svc: &AdminService, rows: Vec<CommandRow>) -> Result<Vec<CommandInfo>, Status> {
    let mut certs: std::collections::HashMap<NodeId, Vec<Vec<u8>>> = Default::default();
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let evidence = if row.state.known().is_some_and(|s| s.is_terminal()) {
            if !certs.contains_key(&row.node_id) {
                let found = svc
                    .store
                    .node_certificates(&row.node_id)
                    .await
                    .map_err(unavailable)?;
                certs.insert(row.node_id.clone(), found);
            }
            crate::evidence::judge(&row, &certs[&row.node_id], &svc.ca_der)
        } else {
            Evidence::Unfinished
        };
        out.push(info(row, &evidence));
    }
    Ok(out)
}

/// `RunCommand`.
pub async fn run(svc: &AdminService, r: RunCommandRequest) -> Result<CommandInfo, Status> {
    let (kind, mut args, mut summary) =
        parse(r.kind, &r.args, r.timeout_ms).map_err(|e| bad_request(e.to_string()))?;
    if let command_payload::Args::Kexec(k) = &mut args
        && !k.image_id.is_empty()
    {
        let (id, name) = kexec_image(svc, &k.image_id).await?;
        summary = format!("image {name} ({})", &id[..16]);
        k.image_id = id;
    }
    let not_after = not_after(r.not_after_ms).map_err(bad_request)?;
    let new = NewCommand {
        node_id: NodeId::from(r.node_id),
        kind,
        summary,
        not_after,
        min_generation: r.min_generation,
        idempotency_key: (!r.idempotency_key.is_empty()).then_some(r.idempotency_key),
    };
    let (row, created) = crate::pki::seal::create_command(&svc.store, &svc.worker_key, &new, args)
        .await
        .map_err(status)?;
    if created {
        info!(cmd = %row.id, node = %row.node_id, kind = %row.kind, seq = row.seq, "command created");
        svc.wake(&row.node_id);
    }
    Ok(info(row, &Evidence::Unfinished))
}

/// The image `boot.kexec image=WHAT` names (an id, a unique id prefix or a
/// name), checked as the node will check it: registered, and signed by an
/// image key this server still holds (a node learns the server's keys at
/// join). Its whole id and name.
async fn kexec_image(svc: &AdminService, what: &str) -> Result<(String, String), Status> {
    if svc.image_keys.is_empty() {
        return Err(refusal(Refusal::Conflict(
            "this server has no image key, so no node can verify an image: start it with \
             --image-pubkey HEX (from images keygen), and join the nodes again"
                .into(),
        )));
    }
    let id = svc.store.resolve_image(what).await.map_err(status)?;
    let (_, signed) = svc
        .store
        .image(&ImageId::from(&id))
        .await
        .map_err(unavailable)?
        .ok_or_else(|| refusal(bc_store::images::no_such_image(what)))?;
    let manifest = image::SignedManifest::parse(&signed)
        .and_then(|s| s.verify(&svc.image_keys))
        .map_err(|e| {
            refusal(Refusal::Conflict(format!(
                "image {id} no longer verifies against this server's image keys ({e}): \
                 register an image signed with a current key"
            )))
        })?;
    Ok((id.into_string(), manifest.name))
}

/// `ListCommands`.
pub async fn list(
    svc: &AdminService,
    r: ListCommandsRequest,
) -> Result<ListCommandsResponse, Status> {
    let node = (!r.node_id.is_empty()).then(|| NodeId::from(r.node_id));
    let limit = if r.limit == 0 {
        100
    } else {
        r.limit.min(10_000)
    };
    let rows = svc
        .store
        .list_commands(node.as_ref(), limit)
        .await
        .map_err(unavailable)?;
    Ok(ListCommandsResponse {
        commands: judged(svc, rows).await?,
    })
}

/// `GetCommand`.
pub async fn get(svc: &AdminService, r: GetCommandRequest) -> Result<CommandInfo, Status> {
    let id = r.command_id;
    let row = svc
        .store
        .get_command(&CommandId::from(&id))
        .await
        .map_err(unavailable)?;
    let row = row.ok_or_else(|| {
        refusal(Refusal::NotFound(format!(
            "no command {id}: see better-compute commands list"
        )))
    })?;
    Ok(judged(svc, vec![row]).await?.remove(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_unknown_kind_text_lists_every_kind_the_wire_has() {
        let text = ArgsError::UnknownKind(99).to_string();
        let mut listed = 0;
        for v in 0..256 {
            if let Some(k) = bcd_proto::typed::kind(v) {
                assert!(bcd_core::command::Kind::ALL.contains(&k), "{k:?}");
                assert!(text.contains(k.name()), "{text}");
                listed += 1;
            }
        }
        assert_eq!(listed, bcd_core::command::Kind::ALL.len());
    }

    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn kind_of(name: &str) -> i32 {
        bcd_proto::typed::parse::<v1::CommandKind>(name).map_or(99, |k| k as i32)
    }

    #[test]
    fn a_command_lives_a_day_at_most() {
        assert_eq!(not_after(0), Ok(DEFAULT_NOT_AFTER));
        assert_eq!(not_after(MAX_LIFE.as_millis() as u64), Ok(MAX_LIFE));
        let e = not_after(MAX_LIFE.as_millis() as u64 + 1).unwrap_err();
        assert!(
            e.contains("at most 24 hours") && e.contains("--not-after 24h"),
            "{e}"
        );
    }

    #[test]
    fn parses_each_kind_and_refuses_bad_arguments() {
        let (k, a, summary) = parse(kind_of("exec.run"), &s(&["/bin/echo", "hi"]), 0).unwrap();
        assert_eq!(k, Kind::ExecRun);
        assert_eq!(summary, "/bin/echo hi");
        let command_payload::Args::Exec(e) = a else {
            panic!()
        };
        assert_eq!(
            (e.timeout_ms, e.max_output),
            (EXEC_TIMEOUT_MS, EXEC_MAX_OUTPUT)
        );
        assert_eq!(
            parse(kind_of("exec.run"), &[], 0).unwrap_err(),
            ArgsError::NoProgram
        );
        assert_eq!(
            parse(kind_of("node.reboot"), &s(&["now"]), 0).unwrap_err(),
            ArgsError::NoArgsExpected("node.reboot")
        );
        assert!(
            parse(
                kind_of("boot.kexec"),
                &s(&["kernel=/k", "initrd=/i", "cmdline=a b"]),
                0
            )
            .is_ok()
        );
        assert_eq!(
            parse(kind_of("boot.kexec"), &s(&["initrd=/i"]), 0).unwrap_err(),
            ArgsError::NoKernel
        );
        assert!(matches!(
            parse(kind_of("boot.kexec"), &s(&["kernel"]), 0),
            Err(ArgsError::BadKexecArg(_))
        ));
        let (_, a, summary) = parse(
            kind_of("boot.kexec"),
            &s(&["image=gpu-node", "cmdline=bcd.log=debug"]),
            0,
        )
        .unwrap();
        assert_eq!(summary, "image gpu-node");
        let command_payload::Args::Kexec(k) = a else {
            panic!()
        };
        assert_eq!(
            (k.image_id.as_str(), k.cmdline.as_str(), k.kernel.as_str()),
            ("gpu-node", "bcd.log=debug", "")
        );
        assert_eq!(
            parse(kind_of("boot.kexec"), &s(&["image=x", "kernel=/k"]), 0).unwrap_err(),
            ArgsError::ImageAndPaths
        );
        assert!(matches!(
            parse(kind_of("boot.kexec"), &s(&["image="]), 0),
            Err(ArgsError::BadKexecArg(_))
        ));
        assert!(matches!(
            parse(kind_of("rm.rf"), &[], 0),
            Err(ArgsError::UnknownKind(_))
        ));
        assert!(parse(kind_of("inventory.refresh"), &[], 0).is_ok());
        assert!(parse(kind_of("gpu.reset"), &s(&["0000:17:00.0"]), 0).is_ok());
        assert_eq!(
            parse(kind_of("gpu.reset"), &[], 0).unwrap_err(),
            ArgsError::OneGpu
        );
        let (_, a, summary) = parse(kind_of("daemon.upgrade"), &s(&["sequence=7"]), 0).unwrap();
        assert_eq!(summary, "release 7");
        assert!(matches!(
            a,
            command_payload::Args::Upgrade(UpgradeArgs { sequence: 7 })
        ));
        assert!(parse(kind_of("daemon.upgrade"), &s(&["7"]), 0).is_ok());
        for bad in [&[][..], &["0"], &["x"], &["1", "2"]] {
            assert!(matches!(
                parse(kind_of("daemon.upgrade"), &s(bad), 0),
                Err(ArgsError::BadSequence(_))
            ));
        }
        assert!(parse(kind_of("daemon.rollback"), &[], 0).is_ok());
    }
}
