//! Netboot end to end: images built from Debian's cloud kernel and the
//! static bcd, booted in qemu under TCG by true PXE (iPXE, qemu's TFTP,
//! the boot endpoint over HTTP) or directly, joining with a token from the
//! kernel command line, rebooting and kexecing under commands. The real
//! kernel unpacking our cpio is part of every boot here.
//!
//! Needs the kernel cache (`scripts/fetch-kernel`), qemu, swtpm, busybox,
//! kexec-tools and e2fsprogs (`scripts/test` installs them) and the static
//! bcd. One VM at a time. Each test is ignored with what it needs
//! (`#[ignore = "needs ..."]`), so a plain `cargo test` says it did not run
//! them; `scripts/test` runs them (`--include-ignored`), and a missing piece
//! fails them with the command that provides it.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use bc_tests::netboot::{
    self, Boot, GUEST_BOOT_PORT, GUEST_SERVER_IP, NetFleet, STATE_LABEL, Vm, VmConfig,
    base_cmdline, hostname_for, require_tools, vm_lock,
};
use bc_tests::{NodeView, stderr};

/// Boots under TCG take seconds; a node has this long to show up.
const BOOT: Duration = Duration::from_secs(180);

fn fleet() -> NetFleet {
    let kernel = netboot::kernel().unwrap_or_else(|e| panic!("{e}"));
    require_tools();
    NetFleet::start(kernel).expect("server")
}

fn pxe(f: &NetFleet, mac: &str) -> VmConfig {
    VmConfig::new(
        Boot::Pxe {
            tftp: f.tftp_dir(),
            bootfile: "chain.ipxe".into(),
        },
        mac,
        f.forwards(),
    )
}

fn wait_view(
    f: &NetFleet,
    vm: &Vm,
    id: &str,
    what: &str,
    pred: impl Fn(&NodeView) -> bool,
) -> NodeView {
    vm.wait(BOOT, what, || f.server.node(id).filter(|n| pred(n)))
}

#[test]
#[ignore = "needs the netboot kernel (scripts/fetch-kernel) and qemu, minutes under TCG: scripts/test runs it"]
fn pxe_boot_joins_with_a_token_from_the_command_line_and_runs_a_command() {
    let _one = vm_lock();
    let f = fleet();
    let img = f.build_image("pxe", &base_cmdline());
    f.register(&img);
    let token = f.server.token(1);
    f.assign_default(&img, &format!("bcd.token={token}"));

    // The artifacts by hash, whole and in ranges; scripts only for a MAC.
    let kernel = std::fs::read(img.kernel()).unwrap();
    let path = format!("/boot/artifacts/{}", img.sha256("kernel"));
    let (code, _, body) = netboot::http_get(f.boot, &path, &[]);
    assert_eq!((code, body.len()), (200, kernel.len()));
    let (code, headers, body) = netboot::http_get(f.boot, &path, &["Range: bytes=512-1023"]);
    assert_eq!((code, &body[..]), (206, &kernel[512..1024]));
    let want = format!("content-range: bytes 512-1023/{}", kernel.len());
    assert!(
        headers.iter().any(|h| h.to_ascii_lowercase() == want),
        "{headers:?}"
    );
    let (code, _, body) = netboot::http_get(f.boot, &path, &["Range: bytes=-16"]);
    assert_eq!((code, &body[..]), (206, &kernel[kernel.len() - 16..]));
    let (code, _, _) =
        netboot::http_get(f.boot, &path, &[&format!("Range: bytes={}-", kernel.len())]);
    assert_eq!(code, 416);
    assert_eq!(
        netboot::http_get(f.boot, &format!("/boot/artifacts/{}", "0".repeat(64)), &[]).0,
        404
    );
    assert_eq!(netboot::http_get(f.boot, "/boot/ipxe", &[]).0, 400);

    let mac = "52:54:00:bc:00:01";
    let vm = Vm::start(&pxe(&f, mac)).expect("qemu");
    let id = f.wait_hostname(&vm, &hostname_for(mac), "connected", BOOT);
    let console = vm.console();
    assert!(console.contains("bcd init"), "{}", vm.tail());

    // A ramdisk node's certificate lasts at most 2 hours.
    let node = f.server.node(&id).expect("node");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        node.cert_not_after_ms - now_ms <= 2 * 3600 * 1000,
        "certificate until {} is longer than a ramdisk's",
        node.cert_not_after_ms
    );

    // The node runs commands; its kernel command line came from the boot
    // endpoint's script, with the image and the booting MAC.
    let cmd = f
        .server
        .run_command(&id, "exec.run", &["/bin/cat", "/proc/cmdline"]);
    let c = f.server.wait_command(&cmd);
    assert_eq!(c.state, "succeeded", "{c:?}");
    assert!(
        c.output.contains(&format!("bcd.image={}", img.id)),
        "{}",
        c.output
    );
    assert!(c.output.contains(&format!("bcd.mac={mac}")), "{}", c.output);
    assert!(c.output.contains("bcd.token=bct2."), "{}", c.output);

    // swtpm is the guest's TPM.
    let tpm = f
        .server
        .run_command(&id, "exec.run", &["/bin/ls", "/dev/tpmrm0"]);
    assert_eq!(f.server.wait_command(&tpm).state, "succeeded");

    let out = f.server.cli(&["images", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let images: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["image_id"], img.id.as_str());
    assert_eq!(images[0]["assigned_to"], serde_json::json!(["default"]));

    // The boot was recorded for the MAC.
    let out = f.server.cli(&["images", "boots", "--mac", mac, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let boots: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(boots.len(), 1, "{boots:?}");
    assert_eq!(boots[0]["outcome"], "script");
    assert_eq!(boots[0]["image_id"], img.id.as_str());
}

#[test]
#[ignore = "needs the netboot kernel (scripts/fetch-kernel) and qemu, minutes under TCG: scripts/test runs it"]
fn node_reboot_netboots_again_and_returns_as_the_same_node_with_a_new_journal() {
    let _one = vm_lock();
    let f = fleet();
    let img = f.build_image("reboot", &base_cmdline());
    f.register(&img);
    // One use: coming back must not need a second join.
    let token = f.server.token(1);
    f.assign_default(&img, &format!("bcd.token={token} bcd.state={STATE_LABEL}"));

    let mac = "52:54:00:bc:00:02";
    let mut cfg = pxe(&f, mac);
    cfg.state_disk = Some(f.state_disk("state"));
    let vm = Vm::start(&cfg).expect("qemu");
    let id = f.wait_hostname(&vm, &hostname_for(mac), "connected", BOOT);
    let before = f.server.node(&id).expect("node");

    // A command that is not retry-safe, in flight across the reboot.
    let sleeper = f
        .server
        .run_command(&id, "exec.run", &["/bin/sleep", "600"]);
    vm.wait(BOOT, "the node to accept the sleeper", || {
        matches!(
            f.server.command(&sleeper).state.as_str(),
            "acked" | "running"
        )
        .then_some(())
    });
    let reboot = f.server.run_command(&id, "node.reboot", &[]);

    let after = wait_view(&f, &vm, &id, "the node back under a new boot id", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });
    assert_ne!(
        after.journal_id, before.journal_id,
        "the journal lives in tmpfs"
    );
    assert_eq!(
        f.server
            .nodes()
            .iter()
            .filter(|n| n.hostname == hostname_for(mac))
            .count(),
        1,
        "the node came back with its identity, not as a new node"
    );

    let r = f.server.wait_command(&reboot);
    assert_eq!(
        (r.state.as_str(), r.reason.as_str()),
        ("succeeded", "rebooted"),
        "{r:?}"
    );
    let s = f.server.wait_command(&sleeper);
    assert_eq!(
        (s.state.as_str(), s.reason.as_str()),
        ("failed", "journal-lost"),
        "{s:?}"
    );

    // Exactly once: two boots through the boot endpoint, two inits, one
    // reboot command with one terminal result.
    let out = f.server.cli(&["images", "boots", "--mac", mac, "--json"]);
    let boots: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(boots.len(), 2, "{boots:?}");
    assert_eq!(vm.count("bcd init"), 2, "{}", vm.tail());
    let reboots: Vec<_> = f
        .server
        .commands(&id)
        .into_iter()
        .filter(|c| c.kind == "node.reboot")
        .collect();
    assert_eq!(reboots.len(), 1);
    assert_eq!(f.server.command(&reboot).state, "succeeded");
}

#[test]
#[ignore = "needs the netboot kernel (scripts/fetch-kernel) and qemu, minutes under TCG: scripts/test runs it"]
fn boot_kexec_starts_a_second_image_and_the_node_returns() {
    let _one = vm_lock();
    let f = fleet();
    let first = f.build_image("first", &base_cmdline());
    let second = f.build_image("second", &format!("{} bc.second=1", base_cmdline()));
    f.register(&second);
    let token = f.server.token(1);
    let keep = format!("bcd.token={token} bcd.state={STATE_LABEL}");

    let mac = "52:54:00:bc:00:03";
    let mut cfg = VmConfig::new(
        Boot::Direct {
            kernel: first.kernel(),
            initrd: first.initrd(),
            append: format!("{} {keep}", first.cmdline()),
        },
        mac,
        f.forwards(),
    );
    cfg.state_disk = Some(f.state_disk("state"));
    let vm = Vm::start(&cfg).expect("qemu");
    let id = f.wait_hostname(&vm, &hostname_for(mac), "connected", BOOT);
    let before = f.server.node(&id).expect("node");

    // The node fetches the second image from the boot endpoint by hash.
    for (part, to) in [
        ("kernel", "/run/kexec-kernel"),
        ("initrd", "/run/kexec-initrd"),
    ] {
        let url = format!(
            "http://{GUEST_SERVER_IP}:{GUEST_BOOT_PORT}/boot/artifacts/{}",
            second.sha256(part)
        );
        let c = f
            .server
            .run_command(&id, "exec.run", &["/bin/wget", "-q", "-O", to, &url]);
        let c = f.server.wait_command(&c);
        assert_eq!(c.state, "succeeded", "{c:?}");
    }
    let cmdline = format!("cmdline={} {keep}", second.cmdline());
    let kexec = f.server.run_command(
        &id,
        "boot.kexec",
        &[
            "kernel=/run/kexec-kernel",
            "initrd=/run/kexec-initrd",
            &cmdline,
        ],
    );
    let after = wait_view(&f, &vm, &id, "the node back after kexec", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });
    assert_ne!(after.journal_id, before.journal_id);
    let k = f.server.wait_command(&kexec);
    assert_eq!(
        (k.state.as_str(), k.reason.as_str()),
        ("succeeded", "rebooted"),
        "{k:?}"
    );

    let c = f
        .server
        .run_command(&id, "exec.run", &["/bin/cat", "/proc/cmdline"]);
    let c = f.server.wait_command(&c);
    assert!(c.output.contains("bc.second=1"), "{}", c.output);
    assert_eq!(vm.count("bcd init"), 2, "{}", vm.tail());
    assert_eq!(
        f.server
            .commands(&id)
            .iter()
            .filter(|c| c.kind == "boot.kexec")
            .count(),
        1
    );

    // By image id: the node fetches the first image over its certificate,
    // verifies it with the image key it learned at join, and boots it with
    // the manifest's command line and the command's addition.
    f.register(&first);
    let extra = format!("cmdline={keep} bc.by-image=1");
    let kexec = f
        .server
        .run_command(&id, "boot.kexec", &["image=first", &extra]);
    let again = wait_view(&f, &vm, &id, "the node back after kexec by image", |n| {
        n.state == "connected" && n.boot_id != after.boot_id
    });
    let k = f.server.wait_command(&kexec);
    assert_eq!(
        (k.state.as_str(), k.reason.as_str()),
        ("succeeded", "rebooted"),
        "{k:?}"
    );
    assert_ne!(again.boot_id, before.boot_id);
    let c = f
        .server
        .run_command(&id, "exec.run", &["/bin/cat", "/proc/cmdline"]);
    let c = f.server.wait_command(&c);
    assert!(
        c.output.contains("bc.by-image=1") && !c.output.contains("bc.second=1"),
        "{}",
        c.output
    );
    assert!(c.output.contains(first.cmdline().trim()), "{}", c.output);
    assert_eq!(vm.count("bcd init"), 3, "{}", vm.tail());
}

#[test]
#[ignore = "needs the netboot kernel (scripts/fetch-kernel) and qemu, minutes under TCG: scripts/test runs it"]
fn without_a_state_partition_every_boot_joins_as_a_new_node() {
    let _one = vm_lock();
    let f = fleet();
    // The machine's NIC is a vmxnet3, for which the image loads nothing at
    // boot: it carries the driver, and bcd init loads it because the
    // NIC's modalias asks for it.
    let img = f.build_image_carrying(
        &f.d.path().join("volatile"),
        "volatile",
        &base_cmdline(),
        &["vmxnet3"],
    );
    // A pool token: one use per boot.
    let token = f.server.token(2);
    let mac = "52:54:00:bc:00:04";
    let mut cfg = VmConfig::new(
        Boot::Direct {
            kernel: img.kernel(),
            initrd: img.initrd(),
            append: format!("{} bcd.token={token}", img.cmdline()),
        },
        mac,
        f.forwards(),
    );
    cfg.nic = "vmxnet3".into();
    let vm = Vm::start(&cfg).expect("qemu");
    let first = f.wait_hostname(&vm, &hostname_for(mac), "connected", BOOT);
    let console = vm.console();
    let loaded = console
        .lines()
        .find(|l| l.contains("drivers loaded by modalias"))
        .unwrap_or_else(|| panic!("no modalias loading on the console:\n{}", vm.tail()));
    assert!(loaded.contains("vmxnet3"), "{loaded}");
    f.server.run_command(&first, "node.reboot", &[]);
    let second = vm.wait(BOOT, "a second node from the same machine", || {
        f.server.nodes().into_iter().find(|n| {
            n.hostname == hostname_for(mac) && n.node_id != first && n.state == "connected"
        })
    });
    assert_ne!(second.node_id, first);
    wait_view(&f, &vm, &first, "the old node unreachable", |n| {
        n.state == "unreachable"
    });
    assert_eq!(vm.count("bcd init"), 2, "{}", vm.tail());
}

#[test]
#[ignore = "needs the netboot kernel (scripts/fetch-kernel): scripts/test runs it"]
fn images_are_reproducible_and_gnu_cpio_reads_the_initrd() {
    let f = fleet();
    let a = f.build_image_into(&f.d.path().join("a"), "same", &base_cmdline());
    let b = f.build_image_into(&f.d.path().join("b"), "same", &base_cmdline());
    assert_eq!(a.id, b.id);
    for name in ["vmlinuz", "initrd.img", "manifest.json", "boot.ipxe"] {
        let (x, y) = (
            std::fs::read(a.dir.join(name)).unwrap(),
            std::fs::read(b.dir.join(name)).unwrap(),
        );
        assert!(x == y, "{name} differs between two builds");
    }
    let initrd = std::fs::read(a.initrd()).unwrap();
    let listing = netboot::gnu_cpio_list(&netboot::decompress(&initrd));
    let kver = a.json["kernel_version"].as_str().unwrap();
    for want in [
        "init",
        "bin/bcd",
        "bin/busybox",
        "bin/udhcpc",
        "dev/console",
        "etc/bcd/udhcpc.script",
        "usr/sbin/kexec",
        &format!("lib/modules/{kver}/modules.order"),
    ] {
        assert!(
            listing.iter().any(|l| l == want),
            "{want} not in:\n{}",
            listing.join("\n")
        );
    }
    // The manifest names the parts by hash; a changed command line is a
    // different image.
    let c = f.build_image_into(
        &f.d.path().join("c"),
        "same",
        &format!("{} quiet", base_cmdline()),
    );
    assert_ne!(c.id, a.id);
    assert_eq!(c.sha256("initrd"), a.sha256("initrd"));
    let ipxe = std::fs::read_to_string(a.dir.join("boot.ipxe")).unwrap();
    assert!(
        ipxe.starts_with("#!ipxe\n") && ipxe.contains("kernel vmlinuz initrd=initrd.img "),
        "{ipxe}"
    );
}

/// The EK hash a refused join printed on the console, once one did.
fn refused_ek(vm: &Vm) -> Option<String> {
    let console = vm.console();
    let at = console.find("is not enrolled (EK SHA-256 ")?;
    let hash: String = console[at..]
        .trim_start_matches("is not enrolled (EK SHA-256 ")
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (hash.len() == 64).then_some(hash)
}

fn fleet_events(f: &NetFleet, node: &str) -> String {
    let s = f.server.store();
    format!(
        "{:?}",
        s.block(s.store.fleet_events(&bc_store::NodeId::from(node), 100))
            .unwrap()
    )
}

#[test]
#[ignore = "needs the netboot kernel (scripts/fetch-kernel) and qemu, minutes under TCG: scripts/test runs it"]
fn a_tpm_image_with_no_token_attests_at_every_boot_and_a_copied_tpm_is_quarantined() {
    let _one = vm_lock();
    let f = fleet();
    let token = f.server.token(1);
    let pin = token.split('.').nth(3).unwrap().to_string();
    let img = f.build_tpm_image("tpm", &pin);
    assert!(
        img.cmdline().contains("bcd.attestor=tpm"),
        "{}",
        img.cmdline()
    );
    f.register(&img);
    // Nothing appended: no token anywhere the boot network can read.
    f.assign_default(&img, "");
    let mac = "52:54:00:bc:00:07";
    let (code, _, script) = netboot::http_get(f.boot, &format!("/boot/ipxe?mac={mac}"), &[]);
    assert_eq!(code, 200);
    let script = String::from_utf8_lossy(&script).to_string();
    assert!(
        script.contains("bcd.attestor=tpm") && !script.contains("bct"),
        "{script}"
    );

    // Diskless, with its own TPM: refused until enrolled, trying again.
    let tpm_a = f.d.path().join("tpm-a");
    let mut cfg = pxe(&f, mac);
    cfg.tpm_state = Some(tpm_a.clone());
    let vm = Vm::start(&cfg).expect("qemu");
    let hash = vm.wait(BOOT, "a refused join naming the EK", || refused_ek(&vm));
    let out = f.server.cli(&["machines", "enroll", "--ek-sha256", &hash]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = f.wait_hostname(&vm, &hostname_for(mac), "connected", BOOT);
    let before = f.server.node(&id).expect("node");

    // A reboot: the same node under a new boot id, by attestation again.
    let reboot = f.server.run_command(&id, "node.reboot", &[]);
    wait_view(&f, &vm, &id, "the node back under a new boot id", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });
    let r = f.server.wait_command(&reboot);
    assert_eq!(
        (r.state.as_str(), r.reason.as_str()),
        ("succeeded", "rebooted"),
        "{r:?}"
    );
    assert_eq!(f.server.nodes().len(), 1, "one machine, one node");
    assert!(
        fleet_events(&f, &id).contains("re-attested by its TPM's EK with no token"),
        "{}",
        fleet_events(&f, &id)
    );

    // A second machine whose TPM state is a copy of the first's: the two
    // take the node from each other until it is quarantined.
    let tpm_c = f.d.path().join("tpm-c");
    std::fs::create_dir_all(&tpm_c).unwrap();
    for e in std::fs::read_dir(&tpm_a).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() && !e.file_name().to_string_lossy().ends_with(".lock") {
            std::fs::copy(e.path(), tpm_c.join(e.file_name())).unwrap();
        }
    }
    let mac_c = "52:54:00:bc:00:08";
    let mut cfg_c = pxe(&f, mac_c);
    cfg_c.tpm_state = Some(tpm_c);
    let vm_c = Vm::start(&cfg_c).expect("qemu");
    vm_c.wait(BOOT * 2, "the node quarantined", || {
        fleet_events(&f, &id)
            .contains("security.node.quarantined")
            .then_some(())
    });
    let events = fleet_events(&f, &id);
    assert!(
        events.contains("security.node.duplicate-session"),
        "{events}"
    );
    vm_c.wait(BOOT, "the clone told it is quarantined", || {
        (vm_c.count(&format!("node {id} is quarantined"))
            + vm.count(&format!("node {id} is quarantined"))
            > 0)
        .then_some(())
    });
    wait_view(&f, &vm_c, &id, "neither machine holding the node", |n| {
        n.state != "connected"
    });
}
