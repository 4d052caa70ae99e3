//! The helper's handler with systemd over D-Bus, against a real
//! `dbus-daemon` on a private bus: a reboot goes through logind, the
//! restart through systemd's manager, and the watchdog swaps back an
//! overdue upgrade and restarts bcd.service; without a bus, the direct
//! path. logind and systemd cannot run in a test, so the test serves the
//! two objects on the bus with only the methods the helper calls (as
//! bcd-helper's own tests do); the bus daemon, its routing and the wire
//! format are the real thing. What this cannot show: a real logind
//! rebooting a real machine.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bcd_agent::converge::{DeviceDirs, Nft, SshdDirs};
use bcd_agent::helper::handler::watchdog_tick;
use bcd_agent::helper::{AgentHandler, HandlerConfig};
use bcd_agent::hw::Power;
use bcd_agent::slots::Slots;
use bcd_core::update::Slot;
use bcd_helper::{Handler, Reply, Request};
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{ObjectPath, OwnedObjectPath};

struct Bus {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Bus {
    fn start() -> Bus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("bus.conf");
        std::fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={}/bus</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
  </policy>
</busconfig>
"#,
                dir.path().display()
            ),
        )
        .unwrap();
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run dbus-daemon ({e}): apt-get install dbus-daemon (scripts/test installs it)")
            });
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Bus {
            child,
            address: line.trim().to_string(),
            _dir: dir,
        }
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default)]
struct Calls(Vec<String>);

/// An inhibitor as logind lists it: what, who, why, mode, uid, pid.
type Lock = (String, String, String, String, u32, u32);

struct Login1(Arc<Mutex<Calls>>, Arc<Mutex<Vec<Lock>>>);

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Login1 {
    fn list_inhibitors(&self) -> Vec<Lock> {
        self.0.lock().unwrap().0.push("ListInhibitors".into());
        self.1.lock().unwrap().clone()
    }

    fn reboot(&self, interactive: bool) {
        self.0
            .lock()
            .unwrap()
            .0
            .push(format!("Reboot {interactive}"));
    }
}

struct Manager(Arc<Mutex<Calls>>);

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl Manager {
    fn subscribe(&self) {
        self.0.lock().unwrap().0.push("Subscribe".into());
    }

    async fn restart_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        mode: String,
    ) -> zbus::fdo::Result<OwnedObjectPath> {
        self.0
            .lock()
            .unwrap()
            .0
            .push(format!("RestartUnit {name} {mode}"));
        let job = OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap();
        Manager::job_removed(&emitter, 7, job.as_ref(), &name, "done").await?;
        Ok(job)
    }

    fn start_unit(&self, name: String, mode: String) -> OwnedObjectPath {
        self.0
            .lock()
            .unwrap()
            .0
            .push(format!("StartUnit {name} {mode}"));
        OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/8").unwrap()
    }

    #[zbus(signal)]
    async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;
}

async fn serve(bus: &Bus) -> (Arc<Mutex<Calls>>, Vec<zbus::Connection>) {
    serve_locked(bus, Arc::default()).await
}

/// As [`serve`], with logind listing `locks`.
async fn serve_locked(
    bus: &Bus,
    locks: Arc<Mutex<Vec<Lock>>>,
) -> (Arc<Mutex<Calls>>, Vec<zbus::Connection>) {
    let calls = Arc::new(Mutex::new(Calls::default()));
    let a = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .name("org.freedesktop.login1")
        .unwrap()
        .serve_at("/org/freedesktop/login1", Login1(calls.clone(), locks))
        .unwrap()
        .build()
        .await
        .unwrap();
    let b = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .name("org.freedesktop.systemd1")
        .unwrap()
        .serve_at("/org/freedesktop/systemd1", Manager(calls.clone()))
        .unwrap()
        .build()
        .await
        .unwrap();
    (calls, vec![a, b])
}

/// Counts reboots instead of rebooting.
#[derive(Debug, Default)]
struct CountingPower(Mutex<u32>);

impl Power for CountingPower {
    fn reboot(&self) -> std::io::Result<()> {
        *self.0.lock().unwrap() += 1;
        Ok(())
    }

    fn kexec(&self, _: &str, _: &str, _: &str) -> std::io::Result<()> {
        Err(std::io::Error::other("not here"))
    }
}

fn handler(dir: &Path, bus: Option<String>, power: Arc<CountingPower>) -> AgentHandler {
    AgentHandler::new(HandlerConfig {
        data_dir: dir.join("data"),
        staging: dir.join("staging"),
        private: dir.join("private"),
        devices: DeviceDirs {
            cdi_dir: dir.join("cdi"),
            env_dir: dir.join("env"),
        },
        secrets: dir.join("secrets"),
        sshd: SshdDirs {
            etc_dir: dir.join("etc"),
            sshd: dir.join("no-sshd"),
        },
        nft: Nft {
            nft: dir.join("no-nft"),
        },
        host: bcd_agent::hw::real(dir.join("host")),
        power,
        system_bus: bus,
        reboot: Default::default(),
        unit: "bcd.service".into(),
        tpm: bcd_tpm::Endpoint::Device(dir.join("no-tpm")),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_and_restart_go_through_systemd_where_it_runs() {
    let bus = Bus::start();
    let (calls, _conns) = serve(&bus).await;
    let d = tempfile::tempdir().unwrap();
    let power = Arc::new(CountingPower::default());
    let h = handler(d.path(), Some(bus.address.clone()), power.clone());
    let mut conn = Default::default();
    let r = h
        .handle(
            &mut conn,
            Request::Reboot {
                reason: "node.reboot".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(r, Reply::Done);
    assert_eq!(*power.0.lock().unwrap(), 0, "not the direct path");
    let r = h.handle(&mut conn, Request::RestartDaemon).await.unwrap();
    assert_eq!(r, Reply::Done);
    assert_eq!(
        calls.lock().unwrap().0,
        [
            "ListInhibitors",
            "Reboot false",
            "Subscribe",
            "RestartUnit bcd.service replace"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_systemd_reboot_is_direct_and_restart_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let power = Arc::new(CountingPower::default());
    let h = handler(d.path(), None, power.clone());
    let mut conn = Default::default();
    h.handle(
        &mut conn,
        Request::Reboot {
            reason: "node.reboot".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(*power.0.lock().unwrap(), 1);
    let e = h
        .handle(&mut conn, Request::RestartDaemon)
        .await
        .unwrap_err();
    assert_eq!(e.kind, bcd_helper::ErrorKind::Unavailable);
    assert!(
        e.message.contains("systemd does not manage this machine"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_swaps_back_an_overdue_upgrade_and_restarts_bcd() {
    let bus = Bus::start();
    let (calls, _conns) = serve(&bus).await;
    let d = tempfile::tempdir().unwrap();
    let h = handler(
        d.path(),
        Some(bus.address.clone()),
        Arc::new(CountingPower::default()),
    );
    let grace = Duration::from_millis(1);
    // Nothing to do without slots.
    assert_eq!(watchdog_tick(&h, grace).await, None);
    // Release 2 in slot b, pending, its deadline long past on the boot
    // clock.
    let slots = Slots::new(&d.path().join("data"));
    let mut state = slots.init(b"release 1", 1, "0.1.0").unwrap();
    slots.write_slot(Slot::B, b"release 2").unwrap();
    let to = state.begin("cmd-1", 2, "0.2.0", 0, 1).unwrap();
    slots.save(&state).unwrap();
    slots.point(to).unwrap();
    let said = watchdog_tick(&h, grace).await.expect("it swapped back");
    assert!(
        said.contains("swapped back from release 2 to release 1"),
        "{said}"
    );
    assert!(said.contains("restarted bcd.service"), "{said}");
    assert_eq!(slots.link().unwrap(), Slot::A);
    assert!(
        calls
            .lock()
            .unwrap()
            .0
            .contains(&"RestartUnit bcd.service replace".to_string())
    );
    // Once back, nothing more to do.
    assert_eq!(watchdog_tick(&h, grace).await, None);
}

/// A kexec-tools stand-in that logs its arguments, one call a line.
fn kexec_tool(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let log = dir.join("kexec.log");
    let tool = dir.join("kexec");
    std::fs::write(
        &tool,
        format!("#!/bin/sh\necho \"$*\" >> {}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    (tool, log)
}

/// `bcd node` as root where systemd runs: the reboot is asked of logind
/// and the kexec of systemd (the kernel loaded first, then kexec.target
/// started irreversibly, as `systemctl kexec` does), each after the block
/// inhibitors are gone; one still held after the bounded wait refuses both,
/// names who holds it, and leaves no kernel loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_reboots_through_logind_and_kexecs_through_systemd_after_inhibitors() {
    use bcd_helper::systemd::{RebootPolicy, WhenBlocked};
    let bus = Bus::start();
    let locks: Arc<Mutex<Vec<Lock>>> = Arc::default();
    let (calls, _conns) = serve_locked(&bus, locks.clone()).await;
    let d = tempfile::tempdir().unwrap();
    let (tool, log) = kexec_tool(d.path());
    let policy = RebootPolicy {
        max_wait: Duration::from_millis(600),
        poll: Duration::from_millis(50),
        when_blocked: WhenBlocked::Fail,
    };
    let power = bcd_agent::hw::SystemdPower {
        bus: bus.address.clone(),
        policy,
        kexec_tool: tool,
    };
    let p = power.clone();
    tokio::task::spawn_blocking(move || p.reboot())
        .await
        .unwrap()
        .unwrap();
    let p = power.clone();
    tokio::task::spawn_blocking(move || p.kexec("/boot/k", "/boot/i", "console=ttyS0"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        calls.lock().unwrap().0,
        [
            "ListInhibitors",
            "Reboot false",
            "ListInhibitors",
            "StartUnit kexec.target replace-irreversibly"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "--kexec-file-syscall -l /boot/k --initrd=/boot/i --command-line=console=ttyS0\n"
    );

    // A firmware update holds a block lock on shutdown: both wait, then
    // give up naming it.
    calls.lock().unwrap().0.clear();
    locks.lock().unwrap().push((
        "shutdown:sleep".into(),
        "fwupd".into(),
        "Firmware update in progress".into(),
        "block".into(),
        0,
        4242,
    ));
    let p = power.clone();
    let e = tokio::task::spawn_blocking(move || p.reboot())
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("fwupd"), "{e}");
    let p = power.clone();
    let e = tokio::task::spawn_blocking(move || p.kexec("/boot/k", "", "quiet"))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("fwupd"), "{e}");
    let seen = calls.lock().unwrap().0.clone();
    assert!(seen.len() > 4, "it looked again while waiting: {seen:?}");
    assert!(
        seen.iter().all(|c| c == "ListInhibitors"),
        "nothing went down: {seen:?}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.ends_with("--kexec-file-syscall -l /boot/k --command-line=quiet\n-u\n"),
        "the kernel is unloaded after the refusal: {logged}"
    );

    // The lock released during the wait: the reboot goes on.
    calls.lock().unwrap().0.clear();
    let p = power.clone();
    let rebooting = tokio::task::spawn_blocking(move || p.reboot());
    let looked = || {
        calls
            .lock()
            .unwrap()
            .0
            .iter()
            .filter(|c| *c == "ListInhibitors")
            .count()
    };
    // Released once the reboot has seen it held (and is waiting).
    while looked() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    locks.lock().unwrap().clear();
    rebooting.await.unwrap().unwrap();
    assert!(looked() >= 2, "it looked again after the lock went");
    assert_eq!(calls.lock().unwrap().0.last().unwrap(), "Reboot false");

    // Where systemd does not run (a ramdisk): the raw calls.
    let ramdisk = tempfile::tempdir().unwrap();
    let raw = bcd_agent::hw::power(ramdisk.path(), Default::default());
    assert!(format!("{raw:?}").contains("SystemPower"), "{raw:?}");
}
