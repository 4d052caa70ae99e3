//! systemd over D-Bus against a real `dbus-daemon` on a private bus.
//!
//! logind and systemd cannot run inside a test, so the test serves
//! `org.freedesktop.login1` and `org.freedesktop.systemd1` on the private
//! bus itself, with only what bcd-helper calls: `ListInhibitors` and
//! `Reboot` on the login manager, `Subscribe`, `RestartUnit` and the
//! `JobRemoved` signal on the systemd manager. Everything between them and
//! the helper's code (the bus daemon, its routing, match rules and name
//! ownership, the wire format) is the real thing.
#![allow(clippy::disallowed_methods)]

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bcd_helper::systemd::{DbusError, Down, RebootPolicy, Systemd, WhenBlocked};
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{ObjectPath, OwnedObjectPath};

/// A private bus: `dbus-daemon` with its own configuration in a temporary
/// directory, stopped when dropped.
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
        // Its log (as root without CAP_SYS_RESOURCE it says it cannot raise
        // its fd limit) goes to a file, shown if it fails to start.
        let log = dir.path().join("dbus-daemon.log");
        let mut child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile", "--print-address=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run dbus-daemon ({e}): apt-get install dbus-daemon (scripts/test installs it)"
                )
            });
        // The address is printed once the bus listens.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line.trim().to_string();
        assert!(
            address.starts_with("unix:path="),
            "dbus-daemon printed {address:?}: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Bus {
            child,
            address,
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

type InhibitorRow = (String, String, String, String, u32, u32);

#[derive(Debug, Default)]
struct LoginState {
    inhibitors: Vec<InhibitorRow>,
    listed: u32,
    reboots: Vec<(bool, Instant)>,
}

struct Login1(Arc<Mutex<LoginState>>);

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Login1 {
    fn list_inhibitors(&self) -> Vec<InhibitorRow> {
        let mut s = self.0.lock().unwrap();
        s.listed += 1;
        s.inhibitors.clone()
    }

    fn reboot(&self, interactive: bool) {
        self.0
            .lock()
            .unwrap()
            .reboots
            .push((interactive, Instant::now()));
    }
}

/// How the served manager ends the jobs it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobEnd {
    /// JobRemoved with this result, sent before the method's reply.
    Result(&'static str),
    /// No JobRemoved at all.
    Never,
}

#[derive(Debug)]
struct ManagerState {
    calls: Vec<String>,
    end: JobEnd,
    next_job: u32,
}

struct Manager(Arc<Mutex<ManagerState>>);

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl Manager {
    fn subscribe(&self) -> zbus::fdo::Result<()> {
        let mut s = self.0.lock().unwrap();
        if s.calls.iter().any(|c| c == "Subscribe") {
            return Err(zbus::fdo::Error::Failed("already subscribed".into()));
        }
        s.calls.push("Subscribe".into());
        Ok(())
    }

    async fn restart_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        mode: String,
    ) -> zbus::fdo::Result<OwnedObjectPath> {
        let (id, end) = {
            let mut s = self.0.lock().unwrap();
            s.calls.push(format!("RestartUnit {name} {mode}"));
            s.next_job += 1;
            (s.next_job, s.end)
        };
        let job = OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{id}")).unwrap();
        // Another job's end first: the helper must wait for its own.
        let other = ObjectPath::try_from("/org/freedesktop/systemd1/job/9999").unwrap();
        Manager::job_removed(&emitter, 9999, other, "other.service", "failed").await?;
        if let JobEnd::Result(result) = end {
            Manager::job_removed(&emitter, id, job.as_ref(), &name, result).await?;
        }
        Ok(job)
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

struct Services {
    login: Arc<Mutex<LoginState>>,
    manager: Arc<Mutex<ManagerState>>,
    _conns: Vec<zbus::Connection>,
}

async fn serve(bus: &Bus, end: JobEnd) -> Services {
    let login = Arc::new(Mutex::new(LoginState::default()));
    let manager = Arc::new(Mutex::new(ManagerState {
        calls: Vec::new(),
        end,
        next_job: 100,
    }));
    let logind = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .name("org.freedesktop.login1")
        .unwrap()
        .serve_at("/org/freedesktop/login1", Login1(login.clone()))
        .unwrap()
        .build()
        .await
        .unwrap();
    let systemd = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .name("org.freedesktop.systemd1")
        .unwrap()
        .serve_at("/org/freedesktop/systemd1", Manager(manager.clone()))
        .unwrap()
        .build()
        .await
        .unwrap();
    Services {
        login,
        manager,
        _conns: vec![logind, systemd],
    }
}

fn block(who: &str, what: &str, mode: &str) -> InhibitorRow {
    (
        what.into(),
        who.into(),
        "Firmware update in progress".into(),
        mode.into(),
        0,
        812,
    )
}

fn policy(max_wait: Duration, when_blocked: WhenBlocked) -> RebootPolicy {
    RebootPolicy {
        max_wait,
        poll: Duration::from_millis(20),
        when_blocked,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_goes_through_logind_when_nothing_blocks() {
    let bus = Bus::start();
    let services = serve(&bus, JobEnd::Never).await;
    services.login.lock().unwrap().inhibitors = vec![
        // A delay lock is logind's business, and sleep is not shutdown.
        block("NetworkManager", "sleep", "delay"),
        block("upower", "shutdown", "delay"),
        block("gnome", "sleep:idle", "block"),
    ];
    let systemd = Systemd::connect(&bus.address).await.unwrap();
    assert_eq!(systemd.inhibitors().await.unwrap().len(), 3);
    let r = systemd
        .go_down(
            Down::Reboot,
            &policy(Duration::from_secs(30), WhenBlocked::Fail),
        )
        .await
        .unwrap();
    assert!(r.overriding.is_empty());
    assert!(r.waited < Duration::from_secs(5));
    let s = services.login.lock().unwrap();
    assert_eq!(s.reboots.len(), 1);
    assert!(!s.reboots[0].0, "Reboot(false): never interactive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboot_waits_for_a_block_inhibitor_to_end() {
    let bus = Bus::start();
    let services = serve(&bus, JobEnd::Never).await;
    services.login.lock().unwrap().inhibitors = vec![block("fwupd", "shutdown:sleep", "block")];
    let systemd = Systemd::connect(&bus.address).await.unwrap();
    let reboot = tokio::spawn({
        let systemd = systemd.clone();
        async move {
            systemd
                .go_down(
                    Down::Reboot,
                    &policy(Duration::from_secs(60), WhenBlocked::Fail),
                )
                .await
        }
    });
    // It keeps looking while the lock is held, and does not reboot.
    let deadline = Instant::now() + Duration::from_secs(10);
    while services.login.lock().unwrap().listed < 3 {
        assert!(Instant::now() < deadline, "ListInhibitors was not polled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(services.login.lock().unwrap().reboots.is_empty());
    let released = Instant::now();
    services.login.lock().unwrap().inhibitors.clear();
    let r = tokio::time::timeout(Duration::from_secs(10), reboot)
        .await
        .expect("the reboot went on once the lock ended")
        .unwrap()
        .unwrap();
    assert!(r.overriding.is_empty());
    let s = services.login.lock().unwrap();
    assert_eq!(s.reboots.len(), 1);
    assert!(s.reboots[0].1 >= released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_inhibitor_past_the_bound_fails_the_reboot_or_is_overridden() {
    let bus = Bus::start();
    let services = serve(&bus, JobEnd::Never).await;
    services.login.lock().unwrap().inhibitors = vec![block("fwupd", "shutdown", "block")];
    let systemd = Systemd::connect(&bus.address).await.unwrap();
    let bound = Duration::from_millis(300);
    let started = Instant::now();
    let e = systemd
        .go_down(Down::Reboot, &policy(bound, WhenBlocked::Fail))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(took >= bound && took < Duration::from_secs(5), "{took:?}");
    assert!(matches!(&e, DbusError::Inhibited { blocking, .. } if blocking.len() == 1));
    assert_eq!(
        e.to_string(),
        "the reboot is blocked by fwupd (Firmware update in progress, pid 812) after waiting 0 s: retry once they end, or configure the helper to reboot anyway"
    );
    assert!(services.login.lock().unwrap().reboots.is_empty());

    let r = systemd
        .go_down(Down::Reboot, &policy(bound, WhenBlocked::Proceed))
        .await
        .unwrap();
    assert_eq!(r.overriding.len(), 1);
    assert_eq!(r.overriding[0].who, "fwupd");
    assert!(r.waited >= bound);
    assert_eq!(services.login.lock().unwrap().reboots.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_unit_waits_for_its_own_job() {
    let bus = Bus::start();
    let services = serve(&bus, JobEnd::Result("done")).await;
    let systemd = Systemd::connect(&bus.address).await.unwrap();
    systemd
        .restart_unit("bcd.service", Duration::from_secs(10))
        .await
        .unwrap();
    // Once subscribed, a second restart does not subscribe again.
    systemd
        .restart_unit("bcd.service", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        services.manager.lock().unwrap().calls,
        [
            "Subscribe",
            "RestartUnit bcd.service replace",
            "RestartUnit bcd.service replace"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_endless_job_is_an_error() {
    let bus = Bus::start();
    let services = serve(&bus, JobEnd::Result("failed")).await;
    let systemd = Systemd::connect(&bus.address).await.unwrap();
    let e = systemd
        .restart_unit("bcd.service", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "systemd's job to restart bcd.service ended \"failed\": see journalctl -u bcd.service"
    );
    services.manager.lock().unwrap().end = JobEnd::Never;
    let started = Instant::now();
    let e = systemd
        .restart_unit("bcd.service", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(matches!(e, DbusError::JobTimeout { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_services_and_a_missing_bus_are_errors() {
    // A bus without logind or systemd on it.
    let bus = Bus::start();
    let systemd = Systemd::connect(&bus.address).await.unwrap();
    let e = systemd
        .go_down(Down::Reboot, &RebootPolicy::default())
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("org.freedesktop.login1.Manager.ListInhibitors failed"),
        "{e}"
    );
    let source = std::error::Error::source(&e).unwrap().to_string();
    assert!(source.contains("ServiceUnknown"), "{source}");
    let e = systemd
        .restart_unit("bcd.service", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("Subscribe failed"), "{e}");
    drop(bus);

    // No bus at all.
    let d = tempfile::tempdir().unwrap();
    let address = format!("unix:path={}", d.path().join("none").display());
    let e = Systemd::connect(&address).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("cannot connect to the system bus at {address}")
    );
    assert_eq!(bcd_helper::systemd::detect(Path::new(d.path())), None);
}
