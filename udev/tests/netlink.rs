//! The monitor on a real `NETLINK_KOBJECT_UEVENT` socket.
//!
//! The kernel sends a uevent when `change` (or `add`) is written to a
//! device's `uevent` file in sysfs, with an optional UUID and arguments:
//! `change <uuid> KEY=VALUE` arrives with `SYNTH_UUID=<uuid>` and
//! `SYNTH_ARG_KEY=VALUE`, which lets each test find its own event among
//! whatever else the machine sends. Writing needs root; the loopback
//! interface (`/sys/class/net/lo`) exists in every network namespace and a
//! `change` there does nothing but send the event.
//!
//! Injecting a datagram from a second socket needs `CAP_NET_ADMIN`.
//!
//! The tests share the kernel's multicast group, and one of them floods it,
//! so they take turns.
#![allow(clippy::disallowed_methods)]

use std::sync::Mutex;
use std::time::Duration;

use bcd_udev::{
    Accept, Action, Group, Interest, Message, Monitor, Notice, Sender, Uevent, inject, interest,
};
use tokio::time::{Instant, timeout_at};

static TURN: Mutex<()> = Mutex::new(());

const LOOPBACK_UEVENT: &str = "/sys/class/net/lo/uevent";
/// Generous: the kernel delivers in microseconds.
const DEADLINE: Duration = Duration::from_secs(5);

/// Runs `test` on a runtime of its own, in turn with the other tests.
fn in_turn(test: impl std::future::Future<Output = ()>) {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}

/// A UUID for this test's synthetic event.
fn uuid(tag: u16) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        std::process::id(),
        tag,
        (nanos >> 48) & 0xfff,
        (nanos >> 36) & 0xfff,
        nanos & 0xffff_ffff_ffff
    )
}

/// Asks the kernel for a `change` event on the loopback interface.
fn synthesize(uuid: &str, arg: &str) {
    if let Err(e) = std::fs::write(LOOPBACK_UEVENT, format!("change {uuid} {arg}")) {
        panic!(
            "cannot write {LOOPBACK_UEVENT} ({e}): this test needs root and sysfs mounted \
             read-write"
        );
    }
}

/// Reads notices until `want` accepts one; `None` at the deadline.
async fn try_wait_for(
    monitor: &mut Monitor,
    deadline: Instant,
    mut want: impl FnMut(&Notice) -> bool,
) -> Option<Notice> {
    loop {
        match timeout_at(deadline, monitor.next()).await {
            Ok(Ok(notice)) if want(&notice) => return Some(notice),
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => panic!("the monitor failed: {e}"),
            Err(_) => return None,
        }
    }
}

/// Reads notices until `want` accepts one, or fails after [`DEADLINE`].
async fn wait_for(monitor: &mut Monitor, what: &str, want: impl FnMut(&Notice) -> bool) -> Notice {
    match try_wait_for(monitor, Instant::now() + DEADLINE, want).await {
        Some(notice) => notice,
        None => panic!(
            "no {what} within {DEADLINE:?} (monitor stats: {:?})",
            monitor.stats()
        ),
    }
}

fn synthetic(uuid: &str) -> impl FnMut(&Notice) -> bool + '_ {
    move |n| {
        matches!(n, Notice::Event { message, .. }
            if message.uevent().get("SYNTH_UUID") == Some(uuid))
    }
}

#[test]
fn a_kernel_uevent_reaches_the_monitor() {
    in_turn(async {
        let mut monitor = Monitor::kernel().unwrap();
        let id = uuid(1);
        synthesize(&id, "BCDTEST=kernel");
        let Notice::Event { message, sender } =
            wait_for(&mut monitor, "the synthetic event", synthetic(&id)).await
        else {
            unreachable!()
        };
        assert_eq!(sender, Sender::Kernel);
        let Message::Kernel(event) = message else {
            panic!("the kernel's format was expected: {message:?}");
        };
        assert_eq!(event.action(), &Action::Change);
        assert_eq!(event.devpath(), "/devices/virtual/net/lo");
        assert_eq!(event.subsystem(), Some("net"));
        assert_eq!(event.get("INTERFACE"), Some("lo"));
        assert_eq!(event.get("SYNTH_ARG_BCDTEST"), Some("kernel"));
        assert!(event.seqnum().is_some());
        assert_eq!(interest(&event), None, "the loopback is no GPU");
        assert!(monitor.stats().events >= 1);
    });
}

/// An NVIDIA GPU appearing, as the kernel would announce it.
fn gpu_add() -> Uevent {
    Uevent::from_properties([
        ("ACTION", "add"),
        ("DEVPATH", "/devices/bcd-udev-test/0000:17:00.0"),
        ("SUBSYSTEM", "pci"),
        ("PCI_CLASS", "30200"),
        ("PCI_ID", "10DE:2330"),
        ("PCI_SUBSYS_ID", "10DE:16C1"),
        ("PCI_SLOT_NAME", "0000:17:00.0"),
        (
            "MODALIAS",
            "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00",
        ),
        ("SEQNUM", "1"),
    ])
    .unwrap()
}

#[test]
fn an_injected_gpu_event_is_reported_with_its_sender_or_dropped() {
    in_turn(async {
        let mut any = Monitor::open(Group::Kernel, Accept::Any).unwrap();
        let mut kernel_only = Monitor::kernel().unwrap();
        let event = gpu_add();
        inject(&event.encode(), Group::Kernel).unwrap();

        let notice = wait_for(
            &mut any,
            "the injected GPU event",
            |n| matches!(n, Notice::Event { message, .. } if message.uevent() == &event),
        )
        .await;
        let Notice::Event { sender, message } = notice else {
            unreachable!()
        };
        assert!(
            matches!(sender, Sender::Process(port) if port != 0),
            "{sender:?}"
        );
        let Some(Interest::Gpu(gpu)) = interest(message.uevent()) else {
            panic!("an NVIDIA GPU add is of interest");
        };
        assert_eq!(gpu.action, Action::Add);
        assert_eq!(gpu.slot, "0000:17:00.0");
        assert_eq!(gpu.device, 0x2330);

        // The monitor that takes only the kernel's word drops it: the next
        // thing it reports is the kernel's own event, sent after it.
        let id = uuid(2);
        synthesize(&id, "BCDTEST=afterinjection");
        let first = wait_for(&mut kernel_only, "any notice", |_| true).await;
        let Notice::Event { sender, message } = &first else {
            panic!("expected the synthetic event, got {first:?}");
        };
        assert_eq!(*sender, Sender::Kernel);
        assert_ne!(message.uevent(), &event);
        // Other kernel events may come first on a busy machine; ours must come.
        if message.uevent().get("SYNTH_UUID") != Some(id.as_str()) {
            wait_for(&mut kernel_only, "the synthetic event", synthetic(&id)).await;
        }
        assert!(
            kernel_only.stats().ignored >= 1,
            "{:?}",
            kernel_only.stats()
        );
    });
}

#[test]
fn udevd_format_is_read_on_the_udev_group() {
    in_turn(async {
        let mut monitor = Monitor::open(Group::Udev, Accept::Any).unwrap();
        let event = gpu_add();
        inject(&event.encode_udev(), Group::Udev).unwrap();
        let notice = wait_for(
            &mut monitor,
            "the udev-format event",
            |n| matches!(n, Notice::Event { message, .. } if message.uevent() == &event),
        )
        .await;
        assert!(matches!(
            notice,
            Notice::Event {
                message: Message::Udev(_),
                ..
            }
        ));
    });
}

#[test]
fn malformed_datagrams_are_reported_not_fatal() {
    in_turn(async {
        let mut monitor = Monitor::open(Group::Kernel, Accept::Any).unwrap();
        let marker = format!("bcd-udev-garbage-{}", uuid(3));
        inject(marker.as_bytes(), Group::Kernel).unwrap();
        let notice = wait_for(
            &mut monitor,
            "the malformed datagram",
            |n| matches!(n, Notice::Malformed { error, .. } if error.to_string().contains(&marker)),
        )
        .await;
        assert!(matches!(
            notice,
            Notice::Malformed {
                sender: Sender::Process(_),
                ..
            }
        ));
        // The monitor still works.
        let id = uuid(4);
        synthesize(&id, "BCDTEST=aftergarbage");
        wait_for(&mut monitor, "the synthetic event", synthetic(&id)).await;
        assert!(monitor.stats().malformed >= 1);
    });
}

#[test]
fn an_overflowing_socket_says_events_were_lost() {
    in_turn(async {
        let mut monitor = Monitor::open(Group::Kernel, Accept::Any).unwrap();
        // Far more than the socket buffer holds (at most 4 MiB asked for,
        // capped by net.core.rmem_max), without reading.
        let big = Uevent::from_properties(
            gpu_add()
                .properties()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .chain([("BCD_FILL".to_owned(), "x".repeat(1500))]),
        )
        .unwrap()
        .encode();
        for _ in 0..12_000 {
            inject(&big, Group::Kernel).unwrap();
        }
        let notice = wait_for(&mut monitor, "an overflow", |n| {
            matches!(n, Notice::Overflow)
        })
        .await;
        assert_eq!(notice, Notice::Overflow);
        assert_eq!(monitor.stats().overflows, 1);
        // Reading goes on after it. The buffer is still full of what was
        // injected, so a new event is lost until that has been read: ask
        // again until one arrives.
        let deadline = Instant::now() + DEADLINE;
        for attempt in 5u16.. {
            let id = uuid(attempt);
            synthesize(&id, "BCDTEST=afteroverflow");
            let next = (Instant::now() + Duration::from_millis(500)).min(deadline);
            if try_wait_for(&mut monitor, next, synthetic(&id))
                .await
                .is_some()
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no event after the overflow within {DEADLINE:?}: {:?}",
                monitor.stats()
            );
        }
    });
}

#[test]
fn opening_outside_a_runtime_is_an_error_not_a_panic() {
    let err = Monitor::kernel().unwrap_err();
    assert!(err.to_string().contains("enable_io"), "{err}");
}
