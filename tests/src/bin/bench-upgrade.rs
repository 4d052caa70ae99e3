//! Self-update benchmark: prints figures, asserts nothing.
//!
//! One static `bcd node` under `bcd supervise`, one server on loopback:
//!
//! - `daemon.upgrade` to confirmed: from the store creating the command to
//!   the store committing SUCCEEDED (download and verify 4–5 MB, write the
//!   slot, switch, restart, TLS, Hello, Welcome), on the store's clock;
//! - a release that crashes at start: from the switch (the link names the
//!   new slot) to the link naming the old slot again, and to the old
//!   version's FAILED `update-failed` in the store. The supervisor starts a
//!   dead daemon again after `--restart-delay` and gives up on the new
//!   release after three starts, so this is about 3 × the delay.
//!
//! Needs the static bcd and gcc. Build first:
//! `cargo build --profile bench-fast --workspace --all-features` and
//! `cargo build -p bcd --release --target x86_64-unknown-linux-musl`, then
//! run `target/bench-fast/bench-upgrade --upgrades 10`.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use bc_tests::{fleet, wait_for};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 10)]
    upgrades: u64,
    /// The supervisor's restart delay (bcd supervise defaults to 5s).
    #[arg(long, default_value = "1s")]
    restart_delay: String,
}

/// How long a command took on the store's clock (creation to result), and
/// its state.
fn store_ms(server: &bc_tests::Server, cmd: &str) -> (i64, String) {
    let store = server.store();
    let c = store
        .block(store.store.get_command(&bc_store::CommandId::from(cmd)))
        .expect("the store")
        .expect("the command");
    (
        c.result_at_ms.unwrap_or(0) - c.created_at_ms,
        c.state.to_string(),
    )
}

fn link(dir: &std::path::Path) -> String {
    std::fs::read_link(dir.join("slots/current"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let f = fleet();
    let mut node = f.node("n1");
    let id = node.id();
    node.supervise(&["--restart-delay", &args.restart_delay], &[]);
    f.server
        .wait_node(&id, "connected", |n| n.state == "connected");

    let mut times = Vec::new();
    for seq in 2..2 + args.upgrades {
        f.release(
            &f.bcd_release(&format!("r{seq}")),
            &format!("1.{seq}.0"),
            seq,
        );
        let cmd = f
            .server
            .run_command(&id, "daemon.upgrade", &[&seq.to_string()]);
        let (ms, state) = wait_for(Duration::from_secs(120), "the upgrade", || {
            Some(store_ms(&f.server, &cmd)).filter(|(_, s)| {
                s != "pending" && s != "dispatched" && s != "acked" && s != "running"
            })
        });
        anyhow::ensure!(
            state == "succeeded",
            "upgrade to {seq}: {state}\n{}",
            node.proc().log()
        );
        times.push(ms);
    }
    times.sort();
    println!(
        "daemon.upgrade to confirmed ({} upgrades, static bcd {} KB): p50 {} ms, max {} ms",
        times.len(),
        std::fs::metadata(bc_tests::static_bcd())?.len() / 1024,
        times[times.len() / 2],
        times[times.len() - 1]
    );

    let crasher = f.c_program(
        "crasher",
        "#include <stdlib.h>\nint main(void) { abort(); }\n",
    );
    let bad = 2 + args.upgrades;
    f.release(&crasher, "bad", bad);
    let before = link(&node.dir);
    let cmd = f
        .server
        .run_command(&id, "daemon.upgrade", &[&bad.to_string()]);
    wait_for(Duration::from_secs(60), "the switch", || {
        (link(&node.dir) != before).then_some(())
    });
    let switched = Instant::now();
    wait_for(Duration::from_secs(120), "the swap back", || {
        (link(&node.dir) == before).then_some(())
    });
    let back = switched.elapsed();
    let (_, state) = wait_for(Duration::from_secs(120), "the failure report", || {
        Some(store_ms(&f.server, &cmd)).filter(|(_, s)| s == "failed" || s == "succeeded")
    });
    let reported = switched.elapsed();
    anyhow::ensure!(state == "failed", "the bad release: {state}");
    println!(
        "crash at start (restart delay {}): switch to old slot again {} ms, to update-failed in the store {} ms",
        args.restart_delay,
        back.as_millis(),
        reported.as_millis()
    );
    Ok(())
}
