//! Device events for bcd: kernel uevents, the agent's interest in them, and
//! loading the drivers a machine's devices ask for.
//!
//! This crate owns three things, each usable alone:
//!
//! - **uevents**: the parser for `NETLINK_KOBJECT_UEVENT` datagrams in the
//!   kernel's format and udevd's re-broadcast format ([`uevent`]), a tokio
//!   [`Monitor`] on the kernel's multicast group that drops what the kernel
//!   did not send, [`interest`] (which events mean a GPU or the TPM
//!   changed) and [`Debounce`] (one re-inventory per burst, within a
//!   second);
//! - **modalias loading** for `bcd init`, the device manager of a ramdisk:
//!   `modules.alias` matching as `modprobe` matches ([`Aliases`]), the
//!   devices present from sysfs ([`sysfs::devices`]) and the rounds that
//!   load each driver the image carries ([`coldplug`]), with dependencies
//!   from `modules.dep` through the `initramfs` crate's [`initramfs::Modules`];
//! - **the udev rules** of a packaged install ([`rules`]; the files live in
//!   `udev/rules/`).
//!
//! It decides nothing about inventory or the session: the agent (`bcd`,
//! `bcd/agent`) owns the re-inventory a [`GpuEvent`] triggers and the
//! `finit_module` calls [`coldplug::run`] asks for. It needs no privilege to
//! listen (sending a uevent with [`inject`] needs `CAP_NET_ADMIN`), reads
//! the host only under root paths it is given (`/sys`, the image root), and
//! holds no unsafe code: netlink goes through rustix.
#![forbid(unsafe_code)]
// Unit tests are exempt from the one-clock rule (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod alias;
pub mod coldplug;
pub mod filter;
pub mod monitor;
pub mod rules;
pub mod sysfs;
pub mod uevent;

pub use alias::{Alias, AliasError, Aliases, fnmatch};
pub use coldplug::{Coldplug, Report, Round};
pub use filter::{Debounce, GpuEvent, Interest, TpmEvent, interest};
pub use monitor::{Accept, Group, Monitor, MonitorError, Notice, Sender, Stats, inject};
pub use sysfs::{Device, SysfsError};
pub use uevent::{Action, Message, ParseError, Uevent, parse};
