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

use bcd_agent::converge::{DeviceDirs, Nft, SshdDirs};
use bcd_agent::{hw, join, lock, node, upgrade};
#[cfg(feature = "fakehw")]
use bcd_fakehw::sim;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bcd", version, about = "The better-compute node daemon")]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
            let fake = Arc::new(bcd_fakehw::FakeHost::new(seed, name, self.fake_gpus));
            return (fake.clone(), fake);
        }
        (self.real_host(), Arc::new(hw::SystemPower))
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
        #[command(flatten)]
        hw: HwArgs,
    },
    /// Run the daemon: keep a session with the fleet.
    Node {
        #[arg(long, default_value = "/var/lib/bcd", env = "BCD_DATA_DIR")]
        data_dir: PathBuf,
        /// Where the CDI spec for assigned GPUs goes.
        #[arg(long, default_value = "/var/run/cdi", env = "BCD_CDI_DIR")]
        cdi_dir: PathBuf,
        /// Runtime files (per-allocation env files under env/).
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
        /// How often the convergers re-check the machine for drift.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        converge_every: std::time::Duration,
        /// How long a new release has to get its first Welcome before it
        /// is swapped back.
        #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
        confirm_within: std::time::Duration,
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
        #[arg(long, env = "BCD_TOKEN", hide_env_values = true)]
        token: String,
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
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Join {
            server,
            token,
            data_dir,
            reset,
            yes,
            ramdisk,
            hw,
        } => {
            let opts = join::JoinOptions {
                server,
                token,
                data_dir,
                reset,
                yes,
                ramdisk,
            };
            match join::run(&opts, hw.host().as_ref()).await? {
                join::Joined::Joined(id) => {
                    println!(
                        "joined as node {} (certificate {} valid until {})",
                        id.file.node_id,
                        id.file.cert_serial,
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH
                                + std::time::Duration::from_millis(
                                    id.file.cert_not_after_ms.max(0) as u64
                                )
                        )
                    );
                }
                join::Joined::ResetOnly(moved) => {
                    for m in moved {
                        println!("moved aside: {}", m.display());
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Node {
            data_dir,
            cdi_dir,
            run_dir,
            converge_every,
            confirm_within,
            etc_dir,
            nft,
            sshd,
            hw,
        } => {
            if upgrade::supervised() {
                // The daemon does not outlive its supervisor.
                upgrade::die_with_parent()?;
            }
            // With slots set up, only the binary `current` names runs.
            upgrade::hand_over_if_needed(&bcd_agent::slots::Slots::new(&data_dir))
                .map_err(anyhow::Error::msg)?;
            let lock = lock::DirLock::acquire(&data_dir)?;
            bcd_sys::fs::remove_stale_temps(&data_dir);
            let (host, power) = hw.machine();
            let machine = node::Machine {
                host,
                power,
                devices: Arc::new(DeviceDirs {
                    cdi_dir,
                    env_dir: run_dir.join("env"),
                }),
                sshd: Arc::new(SshdDirs { etc_dir, sshd }),
                firewall: Arc::new(Nft { nft }),
            };
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                shutdown_signal().await;
                let _ = stop_tx.send(true);
            });
            loop {
                let mut agent = node::open(&data_dir, machine.clone(), rand::random(), None)?;
                agent.converge_every = converge_every;
                #[cfg(feature = "failpoints")]
                {
                    agent.failpoints = bcd_agent::failpoints::Failpoints::from_env()
                        .map_err(anyhow::Error::msg)?;
                }
                agent.update = Some(upgrade::Updater::new(&data_dir, confirm_within));
                let mut stop = stop_rx.clone();
                let stopped = agent
                    .run(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await;
                match stopped {
                    node::Stopped::Shutdown => return Ok(ExitCode::SUCCESS),
                    node::Stopped::Refused(message) => {
                        eprintln!("error: the server refused this node: {message}");
                        return Ok(ExitCode::from(3));
                    }
                    node::Stopped::Rebooted => {
                        tracing::info!("the machine rebooted; starting the agent again");
                    }
                    node::Stopped::Restart => {
                        drop(lock);
                        if upgrade::supervised() {
                            return Ok(ExitCode::from(upgrade::EXIT_RESTART));
                        }
                        let slots = bcd_agent::slots::Slots::new(&data_dir);
                        anyhow::bail!(
                            "cannot restart into {}: {}",
                            slots.current_binary().display(),
                            upgrade::exec_current(&slots)
                        );
                    }
                    node::Stopped::BelowFloor(message) => {
                        eprintln!("error: {message}");
                        return Ok(ExitCode::from(upgrade::EXIT_BELOW_FLOOR));
                    }
                    node::Stopped::JournalFailed(e) => {
                        anyhow::bail!(
                            "the journal failed ({e}); bcd stops rather than act without it: \
                             check the disk under {}",
                            data_dir.display()
                        );
                    }
                }
            }
        }
        #[cfg(feature = "fakehw")]
        Command::Sim {
            nodes,
            server,
            token,
            data_dir,
            seed,
            gpus,
            join_concurrency,
            duration,
        } => {
            sim::run(sim::SimOptions {
                nodes,
                first: 0,
                server,
                token,
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
            args,
        } => {
            let code = upgrade::supervise(upgrade::SuperviseOptions {
                data_dir,
                args,
                restart_delay,
                grace,
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
                let status = std::process::Command::new("systemctl")
                    .args(["restart", &unit])
                    .status()
                    .map_err(|e| anyhow::anyhow!("cannot run systemctl restart {unit}: {e}"))?;
                anyhow::ensure!(status.success(), "systemctl restart {unit}: {status}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Gpus { json, cdi, hw } => {
            let host = hw.host();
            let gpus = host.gpus().list()?;
            let inv = host.gpus().cdi_inventory()?;
            if cdi {
                let spec = cdi::nvidia::spec(&inv);
                spec.validate()
                    .map_err(|e| anyhow::anyhow!("no CDI spec for this machine: {e}"))?;
                print!("{}", String::from_utf8_lossy(&spec.to_json()));
            } else if json {
                let nodes: Vec<_> = inv
                    .gpus
                    .iter()
                    .map(|g| serde_json::json!({"index": g.index, "uuid": g.uuid, "path": g.node.path, "major": g.node.major, "minor": g.node.minor}))
                    .collect();
                let control: Vec<_> = inv
                    .control_nodes
                    .iter()
                    .map(
                        |n| serde_json::json!({"path": n.path, "major": n.major, "minor": n.minor}),
                    )
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "gpus": gpus, "device_nodes": nodes, "control_nodes": control,
                        "driver_files": inv.driver_files,
                    }))?
                );
            } else {
                println!(
                    "{:<14} {:<8} {:<42} {:<34} NODE",
                    "PCI", "DEVICE", "UUID", "MODEL"
                );
                for g in &gpus {
                    let node = g
                        .minor
                        .and_then(|m| inv.gpus.iter().find(|n| n.index == m))
                        .map(|n| format!("{} ({}:{})", n.node.path, n.node.major, n.node.minor))
                        .unwrap_or_else(|| "-".into());
                    println!(
                        "{:<14} {:<8} {:<42} {:<34} {}",
                        g.pci_address,
                        g.device_id,
                        g.uuid.as_deref().unwrap_or("-"),
                        g.model.as_deref().unwrap_or("-"),
                        node
                    );
                }
                if gpus.is_empty() {
                    println!("(no NVIDIA GPUs on this machine)");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Init => match bcd_agent::init::run()? {},
        Command::Version => {
            println!("bcd {} ({})", env!("CARGO_PKG_VERSION"), flavour());
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
