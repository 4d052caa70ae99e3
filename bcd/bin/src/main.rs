//! `bcd`: the better-compute node daemon, one static multi-call binary.
//!
//! Subcommands are thin: the logic lives in the `bcd-agent` library
//! (`bcd/agent`), in `bcd-core` (decisions) and `bcd-proto` (wire). Exit
//! codes: 0 success, 1 error, 2 usage, 3 the server refused this node for
//! good (deleted or revoked: join again), 4 this binary is below the release
//! floor, 75 restart from the `current` slot (to `bcd supervise`).
//!
//! Build flavours are cargo features of this package, none on by default: a
//! release has real hardware only. `fakehw` adds `bcd sim` and `--fake-hw`
//! (the `bcd-fakehw` crate), `failpoints` arms the agent's failpoints from
//! `BCD_CRASH_AT`, `nvml` reads GPU fields through NVML (glibc builds).
#![forbid(unsafe_code)]
// The flags' doc comments are their `--help` text, shown as written:
// `<data-dir>` there is a placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

use bcd_agent::daemon::{self, MachineDirs, tpm_at, tpm_endpoint};
use bcd_agent::{doctor, helper, hw, join, metrics, node, upgrade};
#[cfg(feature = "fakehw")]
use bcd_fakehw::sim;
use bcd_tpm::Endpoint as TpmEndpoint;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bcd", version, about = "The better-compute node daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the convergers write on this machine, and the tools they check
/// with: one set, so `bcd node`, `bcd helper` and `bcd doctor` agree on
/// every default.
#[derive(Debug, clap::Args)]
struct MachineFiles {
    /// Where the CDI spec for assigned GPUs goes.
    #[arg(long, default_value = "/var/run/cdi", env = "BCD_CDI_DIR")]
    cdi_dir: PathBuf,
    /// Runtime files (per-allocation env files under env/, secrets under
    /// secrets/: a memory-backed directory).
    #[arg(long, default_value = "/run/bcd", env = "BCD_RUN_DIR")]
    run_dir: PathBuf,
    /// Root of the sshd configuration the access converger writes.
    #[arg(long, default_value = "/etc", env = "BCD_ETC_DIR")]
    etc_dir: PathBuf,
    /// The nft program for the node's firewall table.
    #[arg(long, default_value = "nft")]
    nft: PathBuf,
    /// The sshd used to check the configuration (`sshd -t`).
    #[arg(long, default_value = "/usr/sbin/sshd")]
    sshd: PathBuf,
}

impl MachineFiles {
    fn dirs(&self) -> MachineDirs {
        MachineDirs {
            cdi_dir: self.cdi_dir.clone(),
            run_dir: self.run_dir.clone(),
            etc_dir: self.etc_dir.clone(),
            nft: self.nft.clone(),
            sshd: self.sshd.clone(),
        }
    }
}

#[derive(Debug, clap::Args)]
struct HwArgs {
    /// Root of the host's /proc, /sys and /dev (tests point it at a tree of
    /// golden files).
    #[arg(long, default_value = "/", env = "BCD_HOST_ROOT")]
    host_root: PathBuf,
    /// Use fake hardware (GPUs, TPM, boot id) seeded with this number.
    #[cfg(feature = "fakehw")]
    #[arg(long, env = "BCD_FAKE_HW")]
    fake_hw: Option<u64>,
    /// Fake GPUs per fake machine.
    #[cfg(feature = "fakehw")]
    #[arg(long, default_value_t = 8)]
    fake_gpus: usize,
    /// Test builds: the fake machine appends each kexec it is asked for
    /// (the SHA-256 of the kernel and initrd, the command line) to this
    /// file.
    #[cfg(feature = "fakehw")]
    #[arg(long, env = "BCD_FAKE_KEXEC_LOG", hide = true)]
    fake_kexec_log: Option<PathBuf>,
    /// Read GPU fields through NVML (libnvidia-ml) as well as sysfs.
    #[cfg(feature = "nvml")]
    #[arg(long)]
    nvml: bool,
}

impl HwArgs {
    fn host(&self) -> Arc<dyn hw::Host> {
        self.machine().0
    }

    /// The host to read and the power to reboot it with: the fake machine
    /// when asked for (fakehw builds), this one otherwise.
    fn machine(&self) -> (Arc<dyn hw::Host>, Arc<dyn hw::Power>) {
        #[cfg(feature = "fakehw")]
        if let Some(seed) = self.fake_hw {
            let name = format!("fake-{seed}");
            let mut fake = bcd_fakehw::FakeHost::new(seed, name, self.fake_gpus);
            if let Some(log) = &self.fake_kexec_log {
                fake = fake.with_kexec_log(log.clone());
            }
            let fake = Arc::new(fake);
            return (fake.clone(), fake);
        }
        // Through logind and systemd where they run; a ramdisk's raw calls.
        (
            self.real_host(),
            hw::power(std::path::Path::new("/"), Default::default()),
        )
    }

    fn real_host(&self) -> Arc<dyn hw::Host> {
        #[cfg(feature = "nvml")]
        if self.nvml {
            match hw::nvml::NvmlGpus::new(&self.host_root) {
                Ok(g) => return Arc::new(hw::RealHost::with_gpus(&self.host_root, Box::new(g))),
                Err(e) => tracing::warn!(error = %e, "using sysfs for GPUs"),
            }
        }
        hw::real(&self.host_root)
    }
}

/// The shells `bcd completions` writes for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CompletionShell {
    Bash,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Join a fleet: create the node key, prove the token, store the
    /// certificate and the fleet CA.
    Join {
        /// The server, https://HOST:PORT.
        #[arg(long, env = "BCD_SERVER")]
        server: Option<String>,
        /// A join token from `better-compute tokens create`.
        #[arg(long, env = "BCD_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// With --attestor tpm and no token: the fleet CA's pin (64 hex
        /// digits, as `better-compute machines enroll` prints it). The
        /// machine's TPM must be enrolled by its EK, or bound to a node by
        /// an earlier join.
        #[arg(long, env = "BCD_CA_PIN")]
        ca_pin: Option<String>,
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        /// Move the current identity and journal aside first (needs --yes).
        #[arg(long)]
        reset: bool,
        #[arg(long)]
        yes: bool,
        /// This node boots from a ramdisk (shorter certificates).
        #[arg(long)]
        ramdisk: bool,
        /// Join as a new node even when the key of an earlier identity is
        /// on disk (by default the join proves it and re-enrols that node).
        #[arg(long)]
        new_node: bool,
        /// How this machine proves itself: `token` (a node key in
        /// node.key), or `tpm` (the node key made in the TPM and certified
        /// by its attestation key; the certificate names that key, and a
        /// later attested join of this TPM reclaims the node, with no token
        /// once bound).
        #[arg(long, value_enum, default_value = "token")]
        attestor: Attestor,
        /// The TPM for --attestor tpm: a device (/dev/tpmrm0), or
        /// swtpm:HOST:PORT.
        #[arg(long, default_value = "/dev/tpmrm0", env = "BCD_TPM", value_parser = tpm_endpoint)]
        tpm: TpmEndpoint,
        #[command(flatten)]
        tpm_backend: TpmBackendArg,
        #[command(flatten)]
        hw: HwArgs,
    },
    /// Run the daemon: keep a session with the fleet.
    Node {
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        #[command(flatten)]
        files: MachineFiles,
        /// How often the convergers re-check the machine for drift.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        converge_every: std::time::Duration,
        /// How long a new release has to be confirmed (the key holder's
        /// receipt of its report at the first Welcome) before it is swapped
        /// back.
        #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
        confirm_within: std::time::Duration,
        /// An exec or port-forward tunnel that moves no byte either way
        /// for this long is closed.
        #[arg(long, default_value = "30m", env = "BCD_TUNNEL_IDLE", value_parser = humantime::parse_duration)]
        tunnel_idle: std::time::Duration,
        /// A tunnel is closed this long after it opened, busy or not
        /// (the operator opens a new one with a new ticket).
        #[arg(long, default_value = "12h", env = "BCD_TUNNEL_LIFETIME", value_parser = humantime::parse_duration)]
        tunnel_lifetime: std::time::Duration,
        /// Run unprivileged: ask the privileged `bcd helper` listening on
        /// this socket for every privileged act (/run/bcd/helper.sock).
        #[arg(long, env = "BCD_HELPER")]
        helper: Option<PathBuf>,
        /// Where this daemon leaves files for the helper to install
        /// (default: <data-dir>/staging; the helper's --staging).
        #[arg(long)]
        helper_staging: Option<PathBuf>,
        /// The TPM holding a node key joined with --attestor tpm: a device
        /// (/dev/tpmrm0), or swtpm:HOST:PORT. Under --helper, the helper's
        /// TPM is used instead.
        #[arg(long, default_value = "/dev/tpmrm0", env = "BCD_TPM", value_parser = tpm_endpoint)]
        tpm: TpmEndpoint,
        #[command(flatten)]
        tpm_backend: TpmBackendArg,
        /// Serve metrics (Prometheus text format) on GET /metrics at this
        /// address; loopback port 9464 when given without one. Off unless
        /// given.
        #[arg(long, num_args = 0..=1, default_missing_value = metrics::DEFAULT_LISTEN)]
        metrics_listen: Option<std::net::SocketAddr>,
        /// Test builds: take uevents from any sender, so a test can inject
        /// them (the release takes the kernel's only).
        #[cfg(feature = "fakehw")]
        #[arg(long, hide = true)]
        uevents_from_any_sender: bool,
        #[command(flatten)]
        hw: HwArgs,
    },
    /// The privileged helper of an unprivileged `bcd node` (runs as root):
    /// writes the CDI spec, env files, secrets, sshd files and the nftables table,
    /// resets GPUs, reboots (through logind under systemd), kexecs,
    /// installs and switches self-update slots, relays TPM commands; and
    /// swaps back an upgrade that never confirmed.
    Helper {
        /// The user `bcd node` runs as (a name or a uid): the only one
        /// served.
        #[arg(long)]
        user: String,
        /// Serve root too (so `bcd doctor` run as root can check it).
        #[arg(long)]
        allow_root: bool,
        #[arg(long, default_value = bcd_agent::helper::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// The node's data directory (its self-update slots).
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        /// Where the daemon leaves files to install (default:
        /// <data-dir>/staging).
        #[arg(long)]
        staging: Option<PathBuf>,
        /// Root's own directory for the copies it checks before use.
        #[arg(long, default_value = "/run/bcd-helper")]
        private_dir: PathBuf,
        #[command(flatten)]
        files: MachineFiles,
        /// The TPM: a device (/dev/tpmrm0), or swtpm:HOST:PORT.
        #[arg(long, default_value = "/dev/tpmrm0", value_parser = tpm_endpoint)]
        tpm: TpmEndpoint,
        /// The system bus of logind and systemd; detected when not given
        /// (none where systemd does not run: the direct path).
        #[arg(long)]
        system_bus: Option<String>,
        /// How long a reboot waits for logind's block inhibitors.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        reboot_wait: std::time::Duration,
        /// Reboot through block inhibitors still held after --reboot-wait.
        #[arg(long)]
        reboot_anyway: bool,
        /// The unit the watchdog restarts after swapping back.
        #[arg(long, default_value = "bcd.service")]
        unit: String,
        /// How long past its deadline an unconfirmed upgrade may run.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        grace: std::time::Duration,
        #[arg(long, default_value = "/etc/passwd", hide = true)]
        passwd: PathBuf,
        /// Test builds: reboot and kexec write a new boot id under
        /// --host-root instead of restarting this machine (never through
        /// logind).
        #[cfg(feature = "fakehw")]
        #[arg(long, hide = true)]
        fake_power: bool,
        #[command(flatten)]
        hw: HwArgs,
    },
    /// Check this node and say what to do: identity, certificate, clock,
    /// journal, slots, helper, GPUs, CDI spec, env files, sshd, firewall,
    /// udev rules, gateway. Read-only. Exit 0 all ok, 1 a failure, 2
    /// warnings only.
    Doctor {
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        #[command(flatten)]
        files: MachineFiles,
        /// The helper's socket when bcd node runs under one; checked at
        /// its default path when that exists.
        #[arg(long, env = "BCD_HELPER")]
        helper: Option<PathBuf>,
        #[arg(long, default_value = bcd_agent::helper::UDEV_RULES_DIR)]
        udev_rules_dir: PathBuf,
        #[arg(long, default_value = "/run/udev/control", hide = true)]
        udevd: PathBuf,
        /// The TPM holding a node key joined with --attestor tpm: a device
        /// (/dev/tpmrm0), or swtpm:HOST:PORT. With a helper, the helper's
        /// TPM is checked instead.
        #[arg(long, default_value = "/dev/tpmrm0", env = "BCD_TPM", value_parser = tpm_endpoint)]
        tpm: TpmEndpoint,
        #[command(flatten)]
        tpm_backend: TpmBackendArg,
        /// How long the gateway may take to answer.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        hw: HwArgs,
    },
    /// Run the daemon and keep it running: start it from the `current`
    /// slot, start it again when it dies, and swap an upgrade back when the
    /// new release cannot (the init of ramdisks runs this).
    Supervise {
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        /// Wait before starting a daemon that died.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        restart_delay: std::time::Duration,
        /// How long past its deadline an unconfirmed release may run.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        grace: std::time::Duration,
        /// Three abnormal exits of the daemon within this window are a crash
        /// loop: logged, and shown as the node's DaemonCrashLoop condition.
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        crash_loop_window: std::time::Duration,
        /// The daemon's arguments, after `--` (e.g. `-- node --data-dir ...`).
        #[arg(last = true, required = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Swap an unconfirmed upgrade back to the previous release (systemd's
    /// bcd-rollback.service runs this after a crash loop).
    Rollback {
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        /// Only an upgrade past its deadline plus --grace (the watchdog).
        #[arg(long)]
        overdue: bool,
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        grace: std::time::Duration,
        /// Restart this systemd unit after swapping back.
        #[arg(long)]
        restart_unit: Option<String>,
    },
    /// Run many simulated nodes (fake hardware, real agents) in one process.
    #[cfg(feature = "fakehw")]
    Sim {
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, env = "BCD_SERVER")]
        server: String,
        /// A token with at least as many uses as nodes that have not joined.
        #[arg(
            long,
            env = "BCD_TOKEN",
            hide_env_values = true,
            required_unless_present = "tokens_file"
        )]
        token: Option<String>,
        /// A file of join tokens, one per line, one per node (node k joins
        /// with line k), as `better-compute tokens create --count N`
        /// prints them: a rack installed with a one-use token per machine.
        #[arg(long, conflicts_with = "token")]
        tokens_file: Option<PathBuf>,
        #[arg(long, default_value = "./bcd-sim")]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 8)]
        gpus: usize,
        #[arg(long, default_value_t = 32)]
        join_concurrency: usize,
        /// Stop after this long (e.g. 30s); without it, run until Ctrl-C.
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<std::time::Duration>,
    },
    /// Show this machine's GPUs as bcd sees them (sysfs, /proc, /dev), or
    /// with --cdi the nvidia.com/gpu CDI spec it would write for them.
    Gpus {
        #[arg(long)]
        json: bool,
        #[arg(long)]
        cdi: bool,
        #[command(flatten)]
        hw: HwArgs,
    },
    /// PID 1 of a netbooted ramdisk: mounts, modules, DHCP, the identity
    /// store (bcd.state=LABEL), join, then supervise -- node; reads its
    /// settings from the kernel command line (bcd.server=, bcd.token=).
    Init,
    /// Print the version and build flavour.
    Version,
    /// Print the shell completion script: `bcd completions bash >
    /// /etc/bash_completion.d/bcd` (bash only: the static binary keeps to
    /// its size budget; `better-compute completions` has every shell).
    Completions { shell: CompletionShell },
    /// How a tunnel's command starts under a terminal (the node runs it):
    /// a session of its own with its standard input as the controlling
    /// terminal, then the command.
    #[command(hide = true)]
    TtyExec {
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

/// How `bcd join` proves the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Attestor {
    /// The join token alone; the node key is a file.
    Token,
    /// The TPM's EK and AK (the join token binds the EK at first join).
    Tpm,
}

/// Which TPM backend talks to the TPM (`bcd join`, `bcd node`, `bcd
/// doctor`).
#[derive(Debug, clap::Args)]
struct TpmBackendArg {
    /// The TPM backend: `protocol` (pure Rust, in every build) or `tss`
    /// (the C TPM software stack through tss-esapi: glibc builds with the
    /// `tss` feature only; not through --helper).
    #[arg(
        long = "tpm-backend",
        env = "BCD_TPM_BACKEND",
        default_value = "protocol",
        value_parser = clap::builder::PossibleValuesParser::new(["protocol", "tss"])
            .map(|s| s.parse::<bcd_tpm::Backend>().expect("one of the possible values")),
    )]
    backend: bcd_tpm::Backend,
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Join {
            server,
            token,
            ca_pin,
            data_dir,
            reset,
            yes,
            ramdisk,
            new_node,
            attestor,
            tpm,
            tpm_backend,
            hw,
        } => {
            let tpm = match attestor {
                Attestor::Token => None,
                Attestor::Tpm => Some(tpm_at(tpm_backend.backend, tpm)?),
            };
            let opts = join::JoinOptions {
                server,
                token,
                data_dir,
                reset,
                yes,
                ramdisk,
                new_node,
                tpm,
                ca_pin,
            };
            print!("{}", join::run(&opts, hw.host().as_ref()).await?.summary());
            Ok(ExitCode::SUCCESS)
        }
        Command::Node {
            data_dir,
            files,
            converge_every,
            confirm_within,
            tunnel_idle,
            tunnel_lifetime,
            helper,
            helper_staging,
            tpm,
            tpm_backend,
            metrics_listen,
            #[cfg(feature = "fakehw")]
            uevents_from_any_sender,
            hw,
        } => {
            let (host, power) = hw.machine();
            #[cfg(feature = "fakehw")]
            let uevents = if uevents_from_any_sender {
                bcd_udev::Accept::Any
            } else {
                bcd_udev::Accept::Kernel
            };
            #[cfg(not(feature = "fakehw"))]
            let uevents = bcd_udev::Accept::Kernel;
            daemon::run(daemon::DaemonOptions {
                data_dir,
                dirs: files.dirs(),
                host,
                power,
                converge_every,
                confirm_within,
                tunnels: node::tunnel::Limits {
                    idle: tunnel_idle,
                    lifetime: tunnel_lifetime,
                },
                helper,
                helper_staging,
                tpm,
                tpm_backend: tpm_backend.backend,
                metrics_listen,
                uevents,
            })
            .await
        }
        Command::Helper {
            user,
            allow_root,
            socket,
            data_dir,
            staging,
            private_dir,
            files,
            tpm,
            system_bus,
            reboot_wait,
            reboot_anyway,
            unit,
            grace,
            passwd,
            #[cfg(feature = "fakehw")]
            fake_power,
            hw,
        } => {
            let user = helper::lookup_user(&passwd, &user)?;
            let dirs = files.dirs();
            let (host, power) = hw.machine();
            #[cfg(feature = "fakehw")]
            let power: Arc<dyn hw::Power> = if fake_power {
                Arc::new(bcd_fakehw::TreePower {
                    root: hw.host_root.clone(),
                })
            } else {
                power
            };
            let system_bus =
                system_bus.or_else(|| bcd_helper::systemd::detect(std::path::Path::new("/")));
            let handler = helper::AgentHandler::new(helper::HandlerConfig {
                staging: staging.unwrap_or_else(|| data_dir.join("staging")),
                data_dir,
                private: private_dir,
                devices: dirs.devices(),
                secrets: dirs.secrets_dir(),
                sshd: dirs.sshd(),
                nft: dirs.nft(),
                host,
                power,
                system_bus,
                reboot: bcd_helper::systemd::RebootPolicy {
                    max_wait: reboot_wait,
                    when_blocked: if reboot_anyway {
                        bcd_helper::systemd::WhenBlocked::Proceed
                    } else {
                        bcd_helper::systemd::WhenBlocked::Fail
                    },
                    ..Default::default()
                },
                unit,
                tpm,
            });
            helper::serve(
                helper::ServeOptions {
                    user,
                    allow_root,
                    socket,
                    grace,
                    sysfs_root: hw.host_root.join("sys"),
                },
                handler,
                daemon::shutdown_signal(),
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor {
            data_dir,
            files,
            helper,
            udev_rules_dir,
            udevd,
            tpm,
            tpm_backend,
            timeout,
            json,
            hw,
        } => {
            let dirs = files.dirs();
            let helper = helper.or_else(|| {
                let default = PathBuf::from(bcd_agent::helper::DEFAULT_SOCKET);
                default.exists().then_some(default)
            });
            let report = doctor::run(&doctor::Options {
                data_dir,
                devices: dirs.devices(),
                sshd: dirs.sshd(),
                nft: dirs.nft(),
                host: hw.host(),
                helper,
                udev_rules_dir,
                udevd,
                // Not checked up front: an unusable backend is the
                // identity check's failure, with the others still run.
                tpm: bcd_tpm::TpmAt {
                    backend: tpm_backend.backend,
                    endpoint: tpm,
                },
                gateway_timeout: timeout,
                now_ms: bcd_sys::clock::unix_ms(),
                boot_ms: upgrade::boot_ms(),
            })
            .await;
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            Ok(ExitCode::from(report.exit_code()))
        }
        #[cfg(feature = "fakehw")]
        Command::Sim {
            nodes,
            server,
            token,
            tokens_file,
            data_dir,
            seed,
            gpus,
            join_concurrency,
            duration,
        } => {
            let tokens = match (token, tokens_file) {
                (Some(token), _) => vec![token],
                (None, Some(file)) => std::fs::read_to_string(&file)
                    .map_err(|e| {
                        anyhow::anyhow!("cannot read the tokens file {}: {e}", file.display())
                    })?
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
                (None, None) => anyhow::bail!("give --token or --tokens-file"),
            };
            sim::run(sim::SimOptions {
                nodes,
                first: 0,
                server,
                tokens,
                data_dir,
                seed,
                gpus,
                join_concurrency,
                duration,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Supervise {
            data_dir,
            restart_delay,
            grace,
            crash_loop_window,
            args,
        } => {
            let code = upgrade::supervise(upgrade::SuperviseOptions {
                data_dir,
                args,
                restart_delay,
                grace,
                crash_loop_window,
            })
            .await?;
            Ok(ExitCode::from(code))
        }
        Command::Rollback {
            data_dir,
            overdue,
            grace,
            restart_unit,
        } => {
            let (line, swapped) = upgrade::rollback(&data_dir, overdue, grace)?;
            println!("{line}");
            if swapped && let Some(unit) = restart_unit {
                upgrade::restart_unit(&unit)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gpus { json, cdi, hw } => {
            let how = match (cdi, json) {
                (true, _) => hw::show::Show::Cdi,
                (false, true) => hw::show::Show::Json,
                (false, false) => hw::show::Show::Table,
            };
            print!("{}", hw::show::gpus(hw.host().as_ref(), how)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Init => match bcd_agent::init::run()? {},
        // Run before the runtime starts (see `main`).
        Command::TtyExec { argv } => Err(bcd_agent::node::tunnel::tty_exec(&argv).into()),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            let CompletionShell::Bash = shell;
            clap_complete::generate(
                clap_complete::shells::Bash,
                &mut Cli::command(),
                "bcd",
                &mut script,
            );
            use std::io::Write;
            match std::io::stdout().lock().write_all(&script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Version => {
            println!("bcd {} ({})", env!("CARGO_PKG_VERSION"), flavour());
            let backends: Vec<&str> = bcd_tpm::Backend::built()
                .into_iter()
                .map(|b| b.as_str())
                .collect();
            println!("TPM backends: {}", backends.join(", "));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// What this build carries beyond real hardware: `real hardware` for a
/// release, otherwise the test and laptop features it was built with.
fn flavour() -> String {
    let extras: Vec<&str> = [
        (cfg!(feature = "fakehw"), "fakehw"),
        (cfg!(feature = "failpoints"), "failpoints"),
        (cfg!(feature = "nvml"), "nvml"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if extras.is_empty() {
        "real hardware".to_string()
    } else {
        format!("real hardware with {}", extras.join(", "))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::TtyExec { argv } = &cli.command {
        let e = bcd_agent::node::tunnel::tty_exec(argv);
        eprintln!("error: {}: {e}", argv[0]);
        return ExitCode::from(127);
    }
    bcd_sys::log::init(bcd_sys::log::LogConfig::BCD);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", bcd_sys::error::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
