//! What `bcd init` would load on this machine, without loading anything,
//! and how long deciding takes:
//!
//! ```text
//! cargo run --release -p bcd-udev --example coldplug-plan -- ROOT KVER [SYS]
//! ```
//!
//! ROOT holds `lib/modules/KVER` (`/`, or an unpacked image); SYS is the
//! sysfs root (default `/sys`). Prints one round: each device with the
//! modules its modalias names, the modules to load in order, and those the
//! modules directory does not have.
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::time::Instant;

use bcd_udev::{Aliases, Coldplug, sysfs};
use initramfs::Modules;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, kver, rest @ ..] = args.as_slice() else {
        return Err("usage: coldplug-plan ROOT KVER [SYS]".into());
    };
    let root = PathBuf::from(root);
    let sys = PathBuf::from(rest.first().map_or("/sys", String::as_str));

    let t = Instant::now();
    let aliases = Aliases::open(&root, kver)?;
    let t_aliases = t.elapsed();
    let t = Instant::now();
    let modules = Modules::open(&root, kver)?;
    let t_modules = t.elapsed();
    let t = Instant::now();
    let devices = sysfs::devices(&sys)?;
    let t_devices = t.elapsed();
    let t = Instant::now();
    let round = Coldplug::new(&aliases, &modules).round(&devices);
    let t_round = t.elapsed();
    // Matching alone, repeated for a steadier figure.
    let t = Instant::now();
    let reps = 200;
    let mut hits = 0;
    for _ in 0..reps {
        for d in &devices {
            hits += aliases.modules_for(&d.modalias).len();
        }
    }
    let per_device = t.elapsed() / (reps * devices.len().max(1) as u32);

    for m in &round.matches {
        println!("{}  {}  -> {}", m.devpath, m.modalias, m.modules.join(" "));
    }
    println!();
    for module in &round.load {
        println!("load {}", module.path);
    }
    for (name, devpaths) in &round.not_carried {
        println!("not carried: {name} (for {})", devpaths.join(", "));
    }
    for (name, error) in &round.unresolved {
        println!("unresolved: {name}: {error}");
    }
    println!();
    println!(
        "{} aliases read in {t_aliases:?}; modules.dep in {t_modules:?}; {} devices walked in \
         {t_devices:?}; a round decided in {t_round:?}; one device matched in {per_device:?} \
         ({hits} matches)",
        aliases.len(),
        devices.len(),
    );
    Ok(())
}
