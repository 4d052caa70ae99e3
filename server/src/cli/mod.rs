//! The command line: `serve` and the operator verbs, one file per verb.
//!
//! This module is the clap tree and the dispatch; each verb's file holds
//! its arguments and what it does; [`output`] is the one place output is
//! formatted (tables, `--json`, exit codes).

mod audit;
mod backup;
mod check;
mod commands;
mod config;
mod doctor;
mod events;
mod exec;
mod gateways;
mod images;
mod machines;
mod nodes;
mod operators;
pub mod output;
mod port_forward;
mod releases;
mod rollouts;
mod secrets;
mod serve;
mod shell;
mod ticket_keys;
mod tokens;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

/// Where `add` writes a credential file (mode 0600), and whether it may
/// replace one: shared by `gateways add` and `operators add`.
#[derive(Debug, clap::Args)]
struct CredentialOut {
    /// The credential file to write.
    #[arg(long)]
    out: PathBuf,
    /// Replace --out if it exists.
    #[arg(long)]
    force: bool,
}

impl CredentialOut {
    /// Refuses an existing file without --force, before anything is added.
    fn check(&self) -> anyhow::Result<()> {
        if self.out.exists() && !self.force {
            anyhow::bail!(
                "{} already exists: choose another --out, or pass --force to replace it",
                self.out.display()
            );
        }
        Ok(())
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "better-compute",
    version,
    about = "The better-compute control plane"
)]
struct Cli {
    /// The server's data directory (store, CA, operator credential).
    #[arg(
        long,
        global = true,
        default_value = "/var/lib/better-compute",
        env = "BC_DATA_DIR"
    )]
    data_dir: PathBuf,
    /// The operator credential (a client certificate for the operator
    /// API); defaults to operator.json in --data-dir.
    #[arg(long, global = true, env = "BC_OPERATOR")]
    operator: Option<PathBuf>,
    /// Override the operator API's address in the operator credential.
    #[arg(long, global = true, env = "BC_SERVER")]
    server: Option<String>,
    /// The store `serve` and `check` use: `postgres://USER@HOST/DATABASE`
    /// (several gateway hosts), or `sqlite:PATH`; the SQLite file store.db
    /// in --data-dir by default.
    #[arg(long, global = true, env = "BC_STORE", hide_env_values = true)]
    store: Option<String>,
    /// How verbs print: `table` for people, `wide` for the table with more
    /// columns (`nodes list`), `json` for scripts (the same as a verb's own
    /// `--json`).
    #[arg(
        short = 'o',
        long,
        global = true,
        value_enum,
        default_value_t = output::Format::Table,
        env = "BC_OUTPUT"
    )]
    output: output::Format,
    #[command(subcommand)]
    command: Command,
}

fn dur(s: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(s)
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane: gateway, join service, API and liveness.
    Serve(Box<serve::ServeArgs>),
    /// Signed releases of bcd.
    Releases {
        #[command(subcommand)]
        command: releases::ReleasesCommand,
    },
    /// Secrets the broker hands to nodes, encrypted to each node.
    Secrets {
        #[command(subcommand)]
        command: secrets::SecretsCommand,
    },
    /// The keys that sign exec tickets and secret deliveries.
    TicketKeys {
        #[command(subcommand)]
        command: ticket_keys::TicketKeysCommand,
    },
    /// Credentials of gateway processes that hold no key.
    Gateways {
        #[command(subcommand)]
        command: gateways::GatewaysCommand,
    },
    /// Machines with a TPM, enrolled by their EK: they join with no token.
    Machines {
        #[command(subcommand)]
        command: machines::MachinesCommand,
    },
    /// The fleet's events (security.*, reservation.*, node.*), oldest
    /// first; --follow keeps printing them as they come.
    Events(events::EventsArgs),
    /// Join tokens.
    Tokens {
        #[command(subcommand)]
        command: tokens::TokensCommand,
    },
    /// Nodes of the fleet.
    Nodes {
        #[command(subcommand)]
        command: nodes::NodesCommand,
    },
    /// Run a command on a node, its input, output and exit code streamed
    /// through the gateway holding the node's session, sealed end to end
    /// between this CLI and the node under a ticket the key holder signs:
    /// exec NODE [--user U] -- CMD [ARGS...].
    Exec(exec::ExecArgs),
    /// Reach a TCP port on a node's loopback from a port here, through the
    /// gateway holding its session, each connection its own sealed tunnel:
    /// port-forward NODE [LOCAL:]REMOTE.
    PortForward(port_forward::PortForwardArgs),
    /// Signed commands, run exactly once on a node.
    Commands {
        #[command(subcommand)]
        command: commands::CommandsCommand,
    },
    /// Operators of the API: add (a client certificate from the operator
    /// CA), list, revoke.
    Operators {
        #[command(subcommand)]
        command: operators::OperatorsCommand,
    },
    /// Roll a release out to the fleet in waves.
    Rollouts {
        #[command(subcommand)]
        command: rollouts::RolloutsCommand,
    },
    /// Netboot images: build, register, and choose what machines boot.
    Images {
        #[command(subcommand)]
        command: images::ImagesCommand,
    },
    /// Backup sets of the store and keys, and restores.
    Backup {
        #[command(subcommand)]
        command: backup::BackupCommand,
    },
    /// Check the fleet invariants (I1–I8, backup states) on a store, live
    /// or not.
    Check(check::CheckArgs),
    /// The store's hash-chained audit history: list it, verify its chains,
    /// export it for another tool to verify. Reads the store as it is.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// Check this control plane's host: CA and serving certificate, the
    /// store, leases, clock, releases and images. Read-only; exit 0 all
    /// ok, 1 a failure, 2 warnings only.
    Doctor(doctor::DoctorArgs),
    /// Print the shell completion script: `better-compute completions
    /// bash > /etc/bash_completion.d/better-compute`.
    Completions(shell::CompletionsArgs),
    /// Write the manual pages (one per command and subcommand) to a
    /// directory.
    Man(shell::ManArgs),
}

/// Where an operator verb finds the server.
#[derive(Debug, Clone)]
struct Target {
    operator: PathBuf,
    server: Option<String>,
}

impl Target {
    async fn connect(&self) -> anyhow::Result<crate::client::Admin> {
        crate::client::connect(&self.operator, self.server.as_deref()).await
    }
}

/// The log set-up of the control plane's binaries: `BC_LOG` filters
/// (`info`, `debug`, `info,bc_store=debug`), `BC_LOG_FORMAT=json` for JSON
/// lines; `default` where `BC_LOG` is unset.
pub fn init_logging(default: tracing::Level) {
    bcd_sys::log::init(bcd_sys::log::LogConfig {
        // `info`, `debug`, `info,bc_store=debug`: target=level directives.
        filter_var: "BC_LOG",
        format_var: "BC_LOG_FORMAT",
        default,
        // The connection pool logs the driver's words about each broken
        // connection; the store says what failed, with the database's code
        // (`bc_store::error::describe`), once.
        capped: &[("deadpool", tracing::Level::ERROR)],
    });
}

/// Resolves at SIGTERM or SIGINT. The SIGTERM handler is installed when
/// this is called, not when it is first awaited: a SIGTERM that comes
/// while the process is still starting ends it in order too (its lease
/// released) rather than by the signal's default action.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let target = Target {
        operator: cli
            .operator
            .clone()
            .unwrap_or_else(|| cli.data_dir.join(crate::api::auth::OPERATOR_FILE)),
        server: cli.server.clone(),
    };
    let done = ExitCode::SUCCESS;
    match cli.command {
        Command::Serve(args) => serve::run(*args, cli.data_dir, cli.store)
            .await
            .map(|()| done),
        Command::Check(args) => check::run(args, &cli.data_dir, cli.store.as_deref())
            .await
            .map(|()| done),
        Command::Audit { command } => audit::run(command, &cli.data_dir, cli.store.as_deref())
            .await
            .map(|()| done),
        Command::Backup { command } => backup::run(command, &cli.data_dir, cli.store.as_deref())
            .await
            .map(|()| done),
        Command::Doctor(args) => doctor::run(args, &cli.data_dir, cli.store.as_deref()).await,
        Command::Tokens { command } => tokens::run(command, &target).await.map(|()| done),
        Command::Events(args) => events::run(args, &target).await.map(|()| done),
        Command::Machines { command } => machines::run(command, &target).await.map(|()| done),
        Command::Gateways { command } => gateways::run(command, &target).await.map(|()| done),
        Command::Secrets { command } => secrets::run(command, &target).await.map(|()| done),
        Command::TicketKeys { command } => ticket_keys::run(command, &target).await.map(|()| done),
        Command::Nodes { command } => nodes::run(command, &target).await.map(|()| done),
        Command::Commands { command } => commands::run(command, &target).await,
        Command::Exec(args) => exec::run(args, &target).await,
        Command::PortForward(args) => port_forward::run(args, &target).await.map(|()| done),
        Command::Releases { command } => releases::run(command, &target).await.map(|()| done),
        Command::Rollouts { command } => rollouts::run(command, &target).await.map(|()| done),
        Command::Images { command } => images::run(command, &target).await.map(|()| done),
        Command::Operators { command } => operators::run(command, &target).await.map(|()| done),
        Command::Completions(args) => shell::completions(args, command()).map(|()| done),
        Command::Man(args) => shell::man(args, command()).map(|_| done),
    }
}

/// The command line as parsed: `Cli`'s tree with a variable for every
/// flag of `serve` ([`config::with_env`]).
fn command() -> clap::Command {
    config::with_env(Cli::command())
}

/// Parses the command line; for `serve`, with what `--config` (or
/// `BC_CONFIG`) adds under the flags and variables given.
fn parse() -> Result<Cli, ExitCode> {
    use clap::FromArgMatches;
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut cmd = command();
    let exit = |e: clap::Error| -> ExitCode {
        let _ = e.print();
        ExitCode::from(e.exit_code().clamp(0, 255) as u8)
    };
    let mut matches = cmd.try_get_matches_from_mut(&argv).map_err(exit)?;
    if let Some(("serve", sm)) = matches.subcommand()
        && let Some(file) = sm.get_one::<PathBuf>("config")
    {
        let serve = cmd.find_subcommand("serve").expect("serve").clone();
        match config::flags_from_file(&serve, sm, file) {
            Ok(extra) => argv.extend(extra),
            Err(e) => {
                eprintln!("error: {}", bcd_sys::error::chain(e.as_ref()));
                return Err(ExitCode::from(2));
            }
        }
        matches = command().try_get_matches_from(&argv).map_err(exit)?;
    }
    Cli::from_arg_matches(&matches).map_err(exit)
}

pub fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    output::set_format(cli.output);
    init_logging(tracing::Level::INFO);
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
    let result = rt.block_on(run(cli));
    // A read of standard input still blocked in its thread (exec's input
    // once the command ended) must not hold the exit.
    rt.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", bcd_sys::error::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every argument an operator can give says what it is in `--help`,
    /// and every verb that changes the fleet or reads it shows an example.
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.is_hide_set() || sub.get_name() == "help" {
                    continue;
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::command(), "better-compute", &mut missing);
        assert!(
            missing.is_empty(),
            "arguments without help:\n{}",
            missing.join("\n")
        );
    }
}
