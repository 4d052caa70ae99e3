//! `bcd node` as a process: the machine the agent acts on assembled (its
//! own files, or the privileged helper's), the metrics listener, the
//! agent started and started again after a (fake) reboot, and how it
//! stopped turned into an exit code.
//!
//! Exit codes: 0 stopped as asked, 3 the server refused this node for good
//! (join again), 4 this binary is below the release floor, 75 start again
//! from the `current` slot (to `bcd supervise`); an error is 1.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::helper::{TpmEndpoint, via};
use crate::hw::{Host, Power};
use crate::node::{self, Machine, Stopped};
use crate::{lock, metrics, upgrade};

/// Everything `bcd node` is started with.
#[derive(Debug)]
pub struct DaemonOptions {
    pub data_dir: PathBuf,
    pub dirs: MachineDirs,
    /// What the machine reads, and how it reboots.
    pub host: Arc<dyn Host>,
    pub power: Arc<dyn Power>,
    /// How often the convergers re-check the machine for drift.
    pub converge_every: Duration,
    /// How long a new release has to be confirmed before it is swapped
    /// back.
    pub confirm_within: Duration,
    pub tunnels: node::tunnel::Limits,
    /// The privileged helper's socket: every privileged act goes through
    /// it (the daemon runs unprivileged).
    pub helper: Option<PathBuf>,
    /// Where the daemon leaves files for the helper (default
    /// `<data-dir>/staging`).
    pub helper_staging: Option<PathBuf>,
    /// The TPM of a TPM-held node key (the helper's under `helper`).
    pub tpm: TpmEndpoint,
    pub tpm_backend: bcd_tpm::Backend,
    /// Serve metrics on GET /metrics here.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Whose uevents are taken (the kernel's, but in test builds).
    pub uevents: bcd_udev::Accept,
}

/// A TPM and its backend, checked before anything runs: the backend must
/// be in this build and able to reach the endpoint.
pub fn tpm_at(backend: bcd_tpm::Backend, endpoint: TpmEndpoint) -> anyhow::Result<bcd_tpm::TpmAt> {
    backend
        .check(&endpoint)
        .map_err(|e| anyhow::anyhow!("--tpm-backend {backend}: {e}"))?;
    Ok(bcd_tpm::TpmAt { backend, endpoint })
}

/// A TPM endpoint as the command line names it (`--tpm`, checked as the
/// command line is read): a device path, or `swtpm:HOST:PORT`.
pub fn tpm_endpoint(s: &str) -> Result<TpmEndpoint, String> {
    match s.strip_prefix("swtpm:") {
        Some(addr) => addr.parse().map(TpmEndpoint::Tcp).map_err(|e| {
            format!("{e}: swtpm's command socket is an address and port, e.g. swtpm:127.0.0.1:2321")
        }),
        None if s.is_empty() => {
            Err("give a TPM device (e.g. /dev/tpmrm0) or swtpm:HOST:PORT".to_string())
        }
        None => Ok(TpmEndpoint::Device(s.into())),
    }
}

#[cfg(test)]
mod tpm_endpoint_tests {
    use super::*;

    #[test]
    fn a_tpm_is_a_device_or_an_swtpm_address() {
        assert_eq!(
            tpm_endpoint("/dev/tpmrm0"),
            Ok(TpmEndpoint::Device("/dev/tpmrm0".into()))
        );
        assert_eq!(
            tpm_endpoint("swtpm:127.0.0.1:2321"),
            Ok(TpmEndpoint::Tcp("127.0.0.1:2321".parse().unwrap()))
        );
        for bad in ["", "swtpm:", "swtpm:localhost", "swtpm:127.0.0.1"] {
            let e = tpm_endpoint(bad).unwrap_err();
            assert!(e.contains("swtpm"), "{bad:?}: {e}");
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Runs the daemon until it is stopped, refused, below the floor, or
/// must start again from another binary.
pub async fn run(opts: DaemonOptions) -> anyhow::Result<ExitCode> {
    if upgrade::supervised() {
        // The daemon does not outlive its supervisor.
        upgrade::die_with_parent()?;
    }
    let data_dir = opts.data_dir.clone();
    // With slots set up, only the binary `current` names runs.
    upgrade::hand_over_if_needed(&crate::slots::Slots::new(&data_dir))
        .map_err(anyhow::Error::msg)?;
    let lock = lock::DirLock::acquire(&data_dir)?;
    bcd_sys::fs::remove_stale_temps(&data_dir);
    let staging = opts
        .helper_staging
        .clone()
        .unwrap_or_else(|| data_dir.join("staging"));
    let client = opts.helper.as_ref().map(|socket| {
        Arc::new(bcd_helper::BlockingClient::new(
            bcd_helper::ClientConfig::new(socket),
        ))
    });
    let machine = machine(&opts, client.as_ref(), &staging).await?;
    let node_metrics = match opts.metrics_listen {
        Some(addr) => {
            let listener = metrics::bind(addr).await.map_err(|e| {
                anyhow::anyhow!(
                    "cannot listen for metrics on {addr}: {e}; choose another address with --metrics-listen"
                )
            })?;
            tracing::info!(%addr, "metrics on /metrics");
            let m = Arc::new(metrics::NodeMetrics::new());
            tokio::spawn(metrics::serve(listener, m.clone()));
            Some(m)
        }
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    loop {
        let mut agent = node::open(
            &data_dir,
            machine.clone(),
            rand::random(),
            None,
            node::Footprint::NODE,
        )?;
        if agent.shared.identity.tpm_record().is_some() {
            // A TPM-held key needs its TPM: no start without it.
            let endpoint = match &opts.helper {
                Some(socket) => TpmEndpoint::Helper(socket.clone()),
                None => opts.tpm.clone(),
            };
            let endpoint = tpm_at(opts.tpm_backend, endpoint)?;
            tokio::task::block_in_place(|| agent.shared.identity.attach_tpm(endpoint))
                .map_err(anyhow::Error::msg)?;
        }
        agent.converge_every = opts.converge_every;
        agent.tunnels.limits = opts.tunnels;
        if client.is_none() {
            // A memory-backed directory: an image outgrows a small state
            // partition. Through the helper the daemon keeps its data
            // directory, which it can write.
            agent.commands.kexec_dir = opts.dirs.run_dir.join("kexec");
        }
        // Secrets go to memory only (the node, or the helper, checks the
        // directory is).
        agent.secrets.files = Some(match &client {
            None => Arc::new(node::secrets::MemoryDir(opts.dirs.secrets_dir())),
            Some(client) => Arc::new(via::HelperSecrets {
                client: client.clone(),
            }),
        });
        #[cfg(feature = "failpoints")]
        {
            agent.shared.failpoints =
                crate::failpoints::Failpoints::from_env().map_err(anyhow::Error::msg)?;
        }
        let mut updater = upgrade::Updater::new(&data_dir, opts.confirm_within);
        if let Some(client) = &client {
            updater.acts = Arc::new(via::HelperSlots {
                client: client.clone(),
                slots: crate::slots::Slots::new(&data_dir),
                staging: staging.clone(),
            });
        }
        agent.update = Some(updater);
        agent.shared.metrics = node_metrics.clone();
        agent.uevents = match bcd_udev::Monitor::open(bcd_udev::Group::Kernel, opts.uevents) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(error = %bcd_sys::error::chain(&e), "no uevents");
                None
            }
        };
        let mut stop = stop_rx.clone();
        let stopped = agent
            .run(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await;
        match stopped {
            Stopped::Shutdown => return Ok(ExitCode::SUCCESS),
            Stopped::Refused(message) => {
                eprintln!("error: the server refused this node: {message}");
                return Ok(ExitCode::from(3));
            }
            Stopped::Rebooted => {
                tracing::info!("the machine rebooted; starting the agent again");
            }
            Stopped::Restart => {
                drop(lock);
                return restart(&data_dir, client.as_ref(), stop_rx).await;
            }
            Stopped::BelowFloor(message) => {
                eprintln!("error: {message}");
                return Ok(ExitCode::from(upgrade::EXIT_BELOW_FLOOR));
            }
            Stopped::JournalFailed(e) => {
                anyhow::bail!(
                    "the journal failed ({e}); bcd stops rather than act without it: \
                     check the disk under {}",
                    data_dir.display()
                );
            }
        }
    }
}

/// The machine the agent acts on: its own files, or every privileged act
/// through the helper.
async fn machine(
    opts: &DaemonOptions,
    client: Option<&Arc<bcd_helper::BlockingClient>>,
    staging: &Path,
) -> anyhow::Result<Machine> {
    let (host, power) = (opts.host.clone(), opts.power.clone());
    let Some(client) = client else {
        return Ok(Machine {
            host,
            power,
            devices: Arc::new(opts.dirs.devices()),
            sshd: Arc::new(opts.dirs.sshd()),
            firewall: Arc::new(opts.dirs.nft()),
        });
    };
    let c = client.clone();
    match tokio::task::spawn_blocking(move || c.server_info()).await? {
        Ok(info) => tracing::info!(
            helper = %info.software,
            protocol = info.version,
            "privileged acts go through the helper"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "the helper does not answer yet; privileged acts fail until it does")
        }
    }
    Ok(Machine {
        host: Arc::new(via::HelperHost::new(host.clone(), client.clone())),
        power: Arc::new(via::HelperPower {
            client: client.clone(),
            host,
            staging: staging.to_path_buf(),
            wait: via::REBOOT_WAIT,
        }),
        devices: Arc::new(via::HelperDevices {
            client: client.clone(),
            env_dir: opts.dirs.env_dir(),
        }),
        sshd: Arc::new(via::HelperSshd {
            client: client.clone(),
        }),
        firewall: Arc::new(via::HelperFirewall {
            client: client.clone(),
        }),
    })
}

/// The `current` slot changed. Under `bcd supervise`, exit for it to start
/// the new binary; under systemd, the helper restarts bcd.service through
/// systemd's manager, which stops this process first; elsewhere this
/// process starts the new binary in its place.
async fn restart(
    data_dir: &Path,
    client: Option<&Arc<bcd_helper::BlockingClient>>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<ExitCode> {
    if upgrade::supervised() {
        return Ok(ExitCode::from(upgrade::EXIT_RESTART));
    }
    if let Some(client) = client {
        let c = client.clone();
        let mut stop = stop_rx;
        tokio::select! {
            r = tokio::task::spawn_blocking(move || c.restart_daemon()) => {
                match r? {
                    Ok(()) => return Ok(ExitCode::SUCCESS),
                    Err(e) => tracing::info!(error = %e, "restarting in place"),
                }
            }
            _ = stop.wait_for(|s| *s) => return Ok(ExitCode::SUCCESS),
        }
    }
    let slots = crate::slots::Slots::new(data_dir);
    anyhow::bail!(
        "cannot restart into {}: {}",
        slots.current_binary().display(),
        upgrade::exec_current(&slots)
    );
}

/// Where the convergers write on one machine, and the tools they check
/// with: one set, so `bcd node`, `bcd helper` and `bcd doctor` agree.
#[derive(Debug, Clone)]
pub struct MachineDirs {
    /// The CDI spec for assigned GPUs (`/var/run/cdi`).
    pub cdi_dir: std::path::PathBuf,
    /// Runtime files: per-allocation env files under `env/`, secrets under
    /// [`crate::node::secrets::DIR`] (`/run/bcd`, memory-backed).
    pub run_dir: std::path::PathBuf,
    /// The root of sshd's configuration (`/etc`).
    pub etc_dir: std::path::PathBuf,
    /// The `nft` program.
    pub nft: std::path::PathBuf,
    /// The `sshd` that checks its configuration (`sshd -t`).
    pub sshd: std::path::PathBuf,
}

impl MachineDirs {
    /// Per-allocation env files.
    pub fn env_dir(&self) -> std::path::PathBuf {
        self.run_dir.join("env")
    }

    /// Secrets handed to allocations.
    pub fn secrets_dir(&self) -> std::path::PathBuf {
        self.run_dir.join(crate::node::secrets::DIR)
    }

    /// The CDI spec and env files.
    pub fn devices(&self) -> crate::converge::DeviceDirs {
        crate::converge::DeviceDirs {
            cdi_dir: self.cdi_dir.clone(),
            env_dir: self.env_dir(),
        }
    }

    /// sshd's files.
    pub fn sshd(&self) -> crate::converge::SshdDirs {
        crate::converge::SshdDirs {
            etc_dir: self.etc_dir.clone(),
            sshd: self.sshd.clone(),
        }
    }

    /// The nftables table.
    pub fn nft(&self) -> crate::converge::Nft {
        crate::converge::Nft {
            nft: self.nft.clone(),
        }
    }
}
