//! Reboot and kexec where systemd runs the machine: the reboot asked of
//! logind and the kexec of systemd's manager (`kexec.target`, as
//! `systemctl kexec` does), both after a bounded wait on block inhibitors
//! (`bcd_helper::systemd`), so services stop in order and an update in
//! progress that holds a lock is not cut off. [`power`] picks this or the
//! raw calls ([`super::SystemPower`]) for the machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bcd_helper::systemd::{Down, RebootPolicy, Systemd};

use super::Power;
use super::sysfs::{KEXEC, SystemPower, kexec_load};

/// Reboot through logind and kexec through systemd, on the bus at `bus`.
#[derive(Debug, Clone)]
pub struct SystemdPower {
    /// The system bus address (`bcd_helper::systemd::detect`).
    pub bus: String,
    pub policy: RebootPolicy,
    /// kexec-tools, which loads the kernel before systemd jumps into it.
    pub kexec_tool: PathBuf,
}

impl SystemdPower {
    pub fn new(bus: String, policy: RebootPolicy) -> SystemdPower {
        SystemdPower {
            bus,
            policy,
            kexec_tool: PathBuf::from(KEXEC),
        }
    }

    /// Asks for `down` on the bus, on the caller's runtime (bcd's is
    /// multi-threaded: a worker hands its other tasks on while this waits,
    /// and a blocking thread just waits). One function for both: each async
    /// call inlined here costs the static binary kilobytes.
    fn on_bus(&self, down: Down) -> std::io::Result<()> {
        let what = match down {
            Down::Reboot => "reboot through logind",
            Down::Kexec => "kexec through systemd",
        };
        let fail = |why: String| std::io::Error::other(format!("{what}: {why}"));
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| fail("no runtime to reach the system bus from".into()))?;
        if runtime.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(fail(
                "bcd's runtime is multi-threaded; this one is not".into(),
            ));
        }
        tokio::task::block_in_place(|| {
            runtime
                .block_on(async {
                    let systemd = Systemd::connect(&self.bus).await?;
                    systemd.go_down(down, &self.policy).await
                })
                .map(|_| ())
                .map_err(|e| fail(bcd_sys::error::chain(&e)))
        })
    }
}

impl Power for SystemdPower {
    fn reboot(&self) -> std::io::Result<()> {
        tracing::info!("rebooting through logind");
        self.on_bus(Down::Reboot)
    }

    fn kexec(&self, kernel: &str, initrd: &str, cmdline: &str) -> std::io::Result<()> {
        kexec_load(&self.kexec_tool, kernel, initrd, cmdline)?;
        tracing::info!(kernel, "kexec through systemd (kexec.target)");
        let r = self.on_bus(Down::Kexec);
        if r.is_err() {
            // Nothing left loaded for a later reboot to jump into.
            let _ = std::process::Command::new(&self.kexec_tool)
                .arg("-u")
                .status();
        }
        r
    }
}

/// The machine's power: through systemd where it runs the machine under
/// `root` with its bus there, the raw calls otherwise (a ramdisk).
pub fn power(root: &Path, policy: RebootPolicy) -> Arc<dyn Power> {
    match bcd_helper::systemd::detect(root) {
        Some(bus) => Arc::new(SystemdPower::new(bus, policy)),
        None => Arc::new(SystemPower),
    }
}
