//! Which uevents the node agent cares about, and when to act on them.
//!
//! [`interest`] picks out NVIDIA GPUs (PCI functions of vendor `0x10de`
//! whose class is VGA `0x0300` or 3D controller `0x0302`, the same rule as
//! the agent's sysfs inventory) appearing, going away, or having their
//! driver bound or unbound, and the TPM's character devices (`tpm*`,
//! `tpmrm*`) appearing or going away. `change` counts too: it is what
//! `udevadm trigger` and PCI error recovery send, so an operator can ask
//! for a new inventory with `udevadm trigger --action=change --tag-match=bcd`.
//!
//! [`Debounce`] turns a burst of such events (a driver binding eight GPUs
//! sends eight `bind` events, and as many `add` events for their functions)
//! into one re-inventory, at most [`Debounce::max_delay`] after the first
//! event. It is plain data: the caller passes the time in.

use std::time::{Duration, Instant};

use crate::uevent::{Action, Uevent};

/// NVIDIA's PCI vendor id.
pub const NVIDIA_VENDOR: u16 = 0x10de;

/// An event the agent acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interest {
    Gpu(GpuEvent),
    Tpm(TpmEvent),
}

/// A GPU's PCI function changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuEvent {
    /// `add`, `remove`, `bind`, `unbind` or `change`.
    pub action: Action,
    /// The PCI address, `0000:17:00.0` (`PCI_SLOT_NAME`).
    pub slot: String,
    /// The device id from `PCI_ID` (`10DE:2330` gives `0x2330`).
    pub device: u16,
    /// The class code from `PCI_CLASS`, e.g. `0x030200`.
    pub class: u32,
    /// The driver, on events sent while one is bound (`bind`, and `add`
    /// or `change` of a bound function).
    pub driver: Option<String>,
    pub modalias: Option<String>,
    pub devpath: String,
}

/// A TPM character device appeared or went away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmEvent {
    /// `add`, `remove` or `change`.
    pub action: Action,
    /// `tpm0`, `tpmrm0`, ... (`DEVNAME`, else the devpath's last part).
    pub name: String,
    /// `tpm` or `tpmrm`.
    pub subsystem: String,
    pub devpath: String,
}

/// What `event` means to the agent, if anything.
pub fn interest(event: &Uevent) -> Option<Interest> {
    let action = event.action();
    match event.subsystem()? {
        "pci" => {
            if !matches!(
                action,
                Action::Add | Action::Remove | Action::Bind | Action::Unbind | Action::Change
            ) {
                return None;
            }
            let (vendor, device) = pci_id(event.get("PCI_ID")?)?;
            let class = u32::from_str_radix(event.get("PCI_CLASS")?, 16).ok()?;
            if vendor != NVIDIA_VENDOR || !is_gpu_class(class) {
                return None;
            }
            Some(Interest::Gpu(GpuEvent {
                action: action.clone(),
                slot: event
                    .get("PCI_SLOT_NAME")
                    .map(str::to_owned)
                    .unwrap_or_else(|| last_part(event.devpath())),
                device,
                class,
                driver: event.driver().map(str::to_owned),
                modalias: event.modalias().map(str::to_owned),
                devpath: event.devpath().to_owned(),
            }))
        }
        subsystem @ ("tpm" | "tpmrm") => {
            if !matches!(action, Action::Add | Action::Remove | Action::Change) {
                return None;
            }
            Some(Interest::Tpm(TpmEvent {
                action: action.clone(),
                name: event
                    .get("DEVNAME")
                    .map(|name| name.trim_start_matches("/dev/").to_owned())
                    .unwrap_or_else(|| last_part(event.devpath())),
                subsystem: subsystem.to_owned(),
                devpath: event.devpath().to_owned(),
            }))
        }
        _ => None,
    }
}

/// VGA (`0x0300xx`) or 3D controller (`0x0302xx`).
pub fn is_gpu_class(class: u32) -> bool {
    matches!(class >> 8, 0x0300 | 0x0302)
}

/// `10DE:2330` → `(0x10de, 0x2330)`.
fn pci_id(text: &str) -> Option<(u16, u16)> {
    let (vendor, device) = text.split_once(':')?;
    Some((
        u16::from_str_radix(vendor, 16).ok()?,
        u16::from_str_radix(device, 16).ok()?,
    ))
}

fn last_part(devpath: &str) -> String {
    devpath.rsplit('/').next().unwrap_or(devpath).to_owned()
}

/// Coalesces bursts of events into one action: due [`Debounce::quiet`]
/// after the last event, and never later than [`Debounce::max_delay`]
/// after the first event of the burst.
#[derive(Debug, Clone)]
pub struct Debounce {
    quiet: Duration,
    max_delay: Duration,
    /// The first and the last event of the burst not yet acted on.
    pending: Option<(Instant, Instant)>,
}

impl Default for Debounce {
    /// 100 ms of quiet, at most 500 ms: a re-inventory well within a second
    /// of the first event.
    fn default() -> Self {
        Debounce::new(Duration::from_millis(100), Duration::from_millis(500))
    }
}

impl Debounce {
    /// `quiet` is capped at `max_delay`.
    pub fn new(quiet: Duration, max_delay: Duration) -> Debounce {
        Debounce {
            quiet: quiet.min(max_delay),
            max_delay,
            pending: None,
        }
    }

    pub fn quiet(&self) -> Duration {
        self.quiet
    }

    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// Notes an event at `now`.
    pub fn event(&mut self, now: Instant) {
        self.pending = Some(match self.pending {
            Some((first, last)) => (first, last.max(now)),
            None => (now, now),
        });
    }

    /// When to act, if an event is pending.
    pub fn deadline(&self) -> Option<Instant> {
        let (first, last) = self.pending?;
        Some((last + self.quiet).min(first + self.max_delay))
    }

    /// True once at the deadline (or after it): the caller acts, and the
    /// next event starts a new burst.
    pub fn fire(&mut self, now: Instant) -> bool {
        match self.deadline() {
            Some(deadline) if now >= deadline => {
                self.pending = None;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(props: &[(&str, &str)]) -> Uevent {
        Uevent::from_properties(props.iter().copied()).unwrap()
    }

    fn gpu(action: &str, class: &str, extra: &[(&str, &str)]) -> Uevent {
        let mut props = vec![
            ("ACTION", action),
            ("DEVPATH", "/devices/pci0000:16/0000:16:02.0/0000:17:00.0"),
            ("SUBSYSTEM", "pci"),
            ("PCI_CLASS", class),
            ("PCI_ID", "10DE:2330"),
            ("PCI_SUBSYS_ID", "10DE:16C1"),
            ("PCI_SLOT_NAME", "0000:17:00.0"),
            (
                "MODALIAS",
                "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00",
            ),
            ("SEQNUM", "5120"),
        ];
        props.extend_from_slice(extra);
        event(&props)
    }

    #[test]
    fn nvidia_gpus_are_of_interest() {
        let Some(Interest::Gpu(g)) = interest(&gpu("bind", "30200", &[("DRIVER", "nvidia")]))
        else {
            panic!("a GPU bind is of interest");
        };
        assert_eq!(
            g,
            GpuEvent {
                action: Action::Bind,
                slot: "0000:17:00.0".into(),
                device: 0x2330,
                class: 0x030200,
                driver: Some("nvidia".into()),
                modalias: Some("pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00".into()),
                devpath: "/devices/pci0000:16/0000:16:02.0/0000:17:00.0".into(),
            }
        );
        for action in ["add", "remove", "unbind", "change"] {
            assert!(
                matches!(
                    interest(&gpu(action, "30000", &[])),
                    Some(Interest::Gpu(GpuEvent { driver: None, .. }))
                ),
                "{action}"
            );
        }
    }

    #[test]
    fn other_devices_and_actions_are_not() {
        // The GPU's audio function, an NVSwitch bridge, an Intel GPU.
        assert_eq!(interest(&gpu("add", "40300", &[])), None);
        assert_eq!(interest(&gpu("add", "68000", &[])), None);
        let mut intel = gpu("add", "30000", &[]);
        intel = event(
            &intel
                .properties()
                .map(|(k, v)| {
                    if k == "PCI_ID" {
                        (k, "8086:56C0")
                    } else {
                        (k, v)
                    }
                })
                .collect::<Vec<_>>(),
        );
        assert_eq!(interest(&intel), None);
        assert_eq!(interest(&gpu("move", "30200", &[])), None);
        assert_eq!(interest(&gpu("online", "30200", &[])), None);
        // Broken fields are no interest rather than a panic.
        assert_eq!(
            interest(&event(&[
                ("ACTION", "add"),
                ("DEVPATH", "/devices/x"),
                ("SUBSYSTEM", "pci"),
                ("PCI_ID", "10DE"),
                ("PCI_CLASS", "30200"),
            ])),
            None
        );
        assert_eq!(
            interest(&event(&[
                ("ACTION", "add"),
                ("DEVPATH", "/devices/virtual/net/lo"),
                ("SUBSYSTEM", "net"),
            ])),
            None
        );
        assert_eq!(
            interest(&event(&[("ACTION", "add"), ("DEVPATH", "/devices/x")])),
            None
        );
    }

    #[test]
    fn tpm_devices_are_of_interest() {
        let tpmrm = event(&[
            ("ACTION", "add"),
            (
                "DEVPATH",
                "/devices/LNXSYSTM:00/LNXSYBUS:00/MSFT0101:00/tpmrm/tpmrm0",
            ),
            ("SUBSYSTEM", "tpmrm"),
            ("MAJOR", "253"),
            ("MINOR", "65536"),
            ("DEVNAME", "tpmrm0"),
            ("SEQNUM", "2001"),
        ]);
        assert_eq!(
            interest(&tpmrm),
            Some(Interest::Tpm(TpmEvent {
                action: Action::Add,
                name: "tpmrm0".into(),
                subsystem: "tpmrm".into(),
                devpath: "/devices/LNXSYSTM:00/LNXSYBUS:00/MSFT0101:00/tpmrm/tpmrm0".into(),
            }))
        );
        let tpm = event(&[
            ("ACTION", "remove"),
            ("DEVPATH", "/devices/platform/tpm_tis/tpm/tpm0"),
            ("SUBSYSTEM", "tpm"),
        ]);
        assert!(matches!(
            interest(&tpm),
            Some(Interest::Tpm(TpmEvent { action: Action::Remove, ref name, .. })) if name == "tpm0"
        ));
        let bound = event(&[
            ("ACTION", "bind"),
            ("DEVPATH", "/devices/platform/tpm_tis/tpm/tpm0"),
            ("SUBSYSTEM", "tpm"),
        ]);
        assert_eq!(interest(&bound), None);
    }

    #[test]
    fn a_burst_fires_once_after_quiet_and_within_the_limit() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut d = Debounce::default();
        assert_eq!(d.deadline(), None);
        assert!(!d.fire(ms(0)));

        d.event(ms(0));
        assert_eq!(d.deadline(), Some(ms(100)));
        d.event(ms(60));
        assert_eq!(d.deadline(), Some(ms(160)));
        assert!(!d.fire(ms(159)));
        assert!(d.fire(ms(160)));
        assert!(!d.fire(ms(161)), "fires once");
        assert_eq!(d.deadline(), None);

        // A steady stream of events every 50 ms still fires at 500 ms.
        for n in (1000..2000).step_by(50) {
            d.event(ms(n));
            if d.fire(ms(n)) {
                assert_eq!(n, 1500);
                return;
            }
        }
        panic!("a steady stream must fire within max_delay");
    }

    #[test]
    fn quiet_is_capped_by_the_limit() {
        let t0 = Instant::now();
        let mut d = Debounce::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(d.quiet(), Duration::from_secs(1));
        d.event(t0);
        assert_eq!(d.deadline(), Some(t0 + Duration::from_secs(1)));
        // An event from the past (clocks read by different tasks) does not
        // move the deadline back.
        d.event(t0 + Duration::from_millis(300));
        d.event(t0);
        assert_eq!(d.deadline(), Some(t0 + Duration::from_secs(1)));
    }
}
