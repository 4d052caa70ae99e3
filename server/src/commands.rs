//! Turning an operator's request into a signed command.

use bcd_core::command::Kind;
use bcd_proto::v1::{
    CommandPayload, ExecArgs, GpuResetArgs, KexecArgs, NoArgs, UpgradeArgs, command_payload,
};

/// Default `exec.run` timeout and output bound.
pub const EXEC_TIMEOUT_MS: u64 = 10 * 60 * 1000;
pub const EXEC_MAX_OUTPUT: u32 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    #[error(
        "unknown command kind {0:?}: one of exec.run, node.reboot, boot.kexec, inventory.refresh, gpu.reset, daemon.upgrade, daemon.rollback"
    )]
    UnknownKind(String),
    #[error("exec.run needs a program: commands run NODE exec.run -- PROGRAM [ARGS...]")]
    NoProgram,
    #[error("{0} takes no arguments")]
    NoArgsExpected(&'static str),
    #[error("boot.kexec takes kernel=PATH [initrd=PATH] [cmdline=TEXT], not {0:?}")]
    BadKexecArg(String),
    #[error("boot.kexec needs kernel=PATH")]
    NoKernel,
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
    kind: &str,
    args: &[String],
    timeout_ms: u64,
) -> Result<(Kind, command_payload::Args, String), ArgsError> {
    let k = Kind::parse(kind).ok_or_else(|| ArgsError::UnknownKind(kind.to_string()))?;
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
                    _ => return Err(ArgsError::BadKexecArg(arg.clone())),
                }
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

/// The payload a worker signs.
#[allow(clippy::too_many_arguments)]
pub fn payload(
    id: &str,
    node_id: &str,
    seq: u64,
    kind: Kind,
    args: command_payload::Args,
    issued_at_ms: i64,
    not_after_ms: i64,
    min_generation: u64,
) -> CommandPayload {
    CommandPayload {
        command_id: id.to_string(),
        node_id: node_id.to_string(),
        seq,
        kind: kind.name().to_string(),
        not_after_ms,
        min_generation,
        issued_at_ms,
        args: Some(args),
    }
}

/// Creates a command and signs its payload with the worker key, in one
/// store transaction. Returns the row and whether it is new (an
/// idempotency key already used returns the existing command).
#[allow(clippy::too_many_arguments)]
pub fn create_signed(
    store: &crate::store::Store,
    key: &ring::signature::Ed25519KeyPair,
    node: &str,
    kind: Kind,
    args: command_payload::Args,
    summary: &str,
    not_after: std::time::Duration,
    min_generation: u64,
    idempotency_key: Option<&str>,
) -> Result<(crate::store::CommandRow, bool), crate::store::TxError> {
    use prost::Message;
    store.create_command(
        &crate::store::NewCommand {
            node_id: node,
            kind,
            summary,
            not_after,
            min_generation,
            idempotency_key,
        },
        |id, seq, now, not_after_ms| {
            let payload = payload(id, node, seq, kind, args, now, not_after_ms, min_generation);
            bcd_proto::sign::seal(key, payload.encode_to_vec())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_each_kind_and_refuses_bad_arguments() {
        let (k, a, summary) = parse("exec.run", &s(&["/bin/echo", "hi"]), 0).unwrap();
        assert_eq!(k, Kind::ExecRun);
        assert_eq!(summary, "/bin/echo hi");
        let command_payload::Args::Exec(e) = a else {
            panic!()
        };
        assert_eq!(
            (e.timeout_ms, e.max_output),
            (EXEC_TIMEOUT_MS, EXEC_MAX_OUTPUT)
        );
        assert_eq!(parse("exec.run", &[], 0).unwrap_err(), ArgsError::NoProgram);
        assert_eq!(
            parse("node.reboot", &s(&["now"]), 0).unwrap_err(),
            ArgsError::NoArgsExpected("node.reboot")
        );
        assert!(
            parse(
                "boot.kexec",
                &s(&["kernel=/k", "initrd=/i", "cmdline=a b"]),
                0
            )
            .is_ok()
        );
        assert_eq!(
            parse("boot.kexec", &s(&["initrd=/i"]), 0).unwrap_err(),
            ArgsError::NoKernel
        );
        assert!(matches!(
            parse("boot.kexec", &s(&["kernel"]), 0),
            Err(ArgsError::BadKexecArg(_))
        ));
        assert!(matches!(
            parse("rm.rf", &[], 0),
            Err(ArgsError::UnknownKind(_))
        ));
        assert!(parse("inventory.refresh", &[], 0).is_ok());
        assert!(parse("gpu.reset", &s(&["0000:17:00.0"]), 0).is_ok());
        assert_eq!(parse("gpu.reset", &[], 0).unwrap_err(), ArgsError::OneGpu);
        let (_, a, summary) = parse("daemon.upgrade", &s(&["sequence=7"]), 0).unwrap();
        assert_eq!(summary, "release 7");
        assert!(matches!(
            a,
            command_payload::Args::Upgrade(UpgradeArgs { sequence: 7 })
        ));
        assert!(parse("daemon.upgrade", &s(&["7"]), 0).is_ok());
        for bad in [&[][..], &["0"], &["x"], &["1", "2"]] {
            assert!(matches!(
                parse("daemon.upgrade", &s(bad), 0),
                Err(ArgsError::BadSequence(_))
            ));
        }
        assert!(parse("daemon.rollback", &[], 0).is_ok());
    }
}
