//! `bench-netboot`: the ramdisk's size, how long an image takes to build,
//! and the time from qemu's start to the node connected in `nodes list`,
//! for a direct boot (`-kernel`/`-initrd`) and a true PXE boot (iPXE,
//! TFTP chain script, the boot endpoint over HTTP). qemu runs under TCG,
//! one VM at a time. Needs `scripts/fetch-kernel`, the static bcd and the
//! tools `scripts/test` installs.
//!
//! ```sh
//! cargo build --profile bench-fast --workspace --all-features
//! cargo build -p bcd --release --target x86_64-unknown-linux-musl
//! target/bench-fast/bench-netboot --runs 3
//! ```
#![allow(clippy::disallowed_methods)]

use std::time::Instant;

use bc_tests::netboot::{self, Boot, NetFleet, Vm, VmConfig, base_cmdline, hostname_for};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Netboot figures: initrd size, build time, boot to connected")]
struct Args {
    /// Boots of each kind; medians are printed.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    let kernel = netboot::kernel().map_err(anyhow::Error::msg)?;
    netboot::require_tools();
    let f = NetFleet::start(kernel)?;

    let mut builds = Vec::new();
    let mut img = None;
    for i in 0..args.runs {
        let started = Instant::now();
        let built = f.build_image_into(
            &f.d.path().join(format!("build-{i}")),
            "bench",
            &base_cmdline(),
        );
        builds.push(started.elapsed().as_secs_f64());
        img = Some(built);
    }
    let img = img.expect("at least one build");
    f.register(&img);
    let initrd = img.json["initrd"]["size"].as_u64().unwrap_or(0);
    let unpacked = img.json["initrd"]["unpacked"].as_u64().unwrap_or(0);
    println!(
        "initrd: {:.2} MiB gzip ({:.2} MiB unpacked, {} entries); kernel {:.2} MiB",
        initrd as f64 / 1048576.0,
        unpacked as f64 / 1048576.0,
        img.json["initrd"]["entries"],
        img.json["kernel"]["size"].as_u64().unwrap_or(0) as f64 / 1048576.0,
    );
    println!(
        "image build (images build, incl. process start): median {:.2} s over {} runs",
        median(builds.clone()),
        builds.len()
    );

    let mut direct = Vec::new();
    let mut pxe = Vec::new();
    for run in 0..args.runs {
        for kind in ["direct", "pxe"] {
            let mac = format!(
                "52:54:00:be:{:02x}:{:02x}",
                run,
                if kind == "direct" { 1 } else { 2 }
            );
            let token = f.server.token(1);
            let boot = if kind == "direct" {
                Boot::Direct {
                    kernel: img.kernel(),
                    initrd: img.initrd(),
                    append: format!("{} bcd.token={token}", img.cmdline()),
                }
            } else {
                f.assign_default(&img, &format!("bcd.token={token}"));
                Boot::Pxe {
                    tftp: f.tftp_dir(),
                    bootfile: "chain.ipxe".into(),
                }
            };
            let mut vm = Vm::start(&VmConfig::new(boot, &mac, f.forwards()))?;
            f.wait_hostname(
                &vm,
                &hostname_for(&mac),
                "connected",
                std::time::Duration::from_secs(180),
            );
            let s = vm.uptime();
            println!("run {run}: {kind} boot → connected in {s:.2} s");
            if kind == "direct" {
                direct.push(s);
            } else {
                pxe.push(s);
            }
            vm.stop();
        }
    }
    println!(
        "qemu start → node connected (TCG, 1 vCPU, cloud kernel): direct median {:.2} s, PXE median {:.2} s ({} runs each)",
        median(direct),
        median(pxe),
        args.runs
    );
    Ok(())
}
