//! Inventory from a host tree: the node reads sysfs and /proc under a root
//! of golden files, and a GPU that appears mid-session reaches the store
//! within a pass, as its section's hash changes.
#![allow(clippy::disallowed_methods)]

use bc_store::NodeId;
use std::path::Path;
use std::time::Duration;

use bc_tests::{Node, Server, setup_dirs, wait_for};

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn gpu(root: &Path, addr: &str) {
    write(
        root,
        &format!("sys/bus/pci/devices/{addr}/vendor"),
        "0x10de\n",
    );
    write(
        root,
        &format!("sys/bus/pci/devices/{addr}/device"),
        "0x2335\n",
    );
    write(
        root,
        &format!("sys/bus/pci/devices/{addr}/class"),
        "0x030200\n",
    );
}

fn stored_gpus(server: &Server, node: &str) -> Vec<String> {
    let store = server.store();
    let body = store
        .block(store.store.inventory(
            &NodeId::from(node),
            bcd_core::report::InventorySection::Gpus,
        ))
        .unwrap()
        .map(|row| row.body);
    let v: serde_json::Value = body
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::json!([]));
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| g["pci_address"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_gpu_that_appears_mid_session_reaches_the_store() {
    let (d, server) = setup_dirs();
    let root = d.path().join("host");
    write(
        &root,
        "proc/sys/kernel/random/boot_id",
        "3f1c2b4a-0000-4000-8000-000000000001\n",
    );
    write(&root, "proc/sys/kernel/hostname", "gpu-host\n");
    gpu(&root, "0000:17:00.0");
    let mut node = Node::new(&d.path().join("n"), 0);
    node.host_root = Some(root.clone());
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| {
        n.state == "connected" && n.hostname == "gpu-host"
    });
    wait_for(Duration::from_secs(20), "one GPU in the store", || {
        (stored_gpus(&server, &id) == ["0000:17:00.0"]).then_some(())
    });
    gpu(&root, "0000:2a:00.0");
    wait_for(Duration::from_secs(20), "the new GPU in the store", || {
        (stored_gpus(&server, &id) == ["0000:17:00.0", "0000:2a:00.0"]).then_some(())
    });
}

/// A GPU that appears raises a uevent, and the node takes inventory at
/// once: the server has it within a second, long before the next pass.
/// The uevent is injected on the kernel's netlink group as the kernel
/// would send it (a test build takes uevents from any sender).
#[test]
fn a_gpu_uevent_reaches_the_server_within_a_second() {
    let (d, server) = setup_dirs();
    let root = d.path().join("host");
    write(
        &root,
        "proc/sys/kernel/random/boot_id",
        "3f1c2b4a-0000-4000-8000-000000000002\n",
    );
    write(&root, "proc/sys/kernel/hostname", "uevent-host\n");
    gpu(&root, "0000:17:00.0");
    let mut node = Node::new(&d.path().join("n"), 0);
    node.host_root = Some(root.clone());
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    // The pass would find the GPU only after 10 minutes.
    let log = node.dir.with_extension("uevent.log");
    let child = std::process::Command::new(bc_tests::bin("bcd"))
        .arg("node")
        .arg("--data-dir")
        .arg(&node.dir)
        .arg("--host-root")
        .arg(&root)
        .arg("--cdi-dir")
        .arg(node.dir.join("cdi"))
        .arg("--run-dir")
        .arg(node.dir.join("run"))
        .args(["--converge-every", "600s", "--uevents-from-any-sender"])
        .env("BCD_LOG", "info,bcd_agent=debug")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut proc = bc_tests::Proc { child, log };
    server.wait_node(&id, "connected", |n| n.state == "connected");
    wait_for(Duration::from_secs(20), "one GPU in the store", || {
        (stored_gpus(&server, &id) == ["0000:17:00.0"]).then_some(())
    });

    gpu(&root, "0000:2a:00.0");
    let event = bcd_udev::Uevent::from_properties([
        ("ACTION", "add"),
        ("DEVPATH", "/devices/pci0000:20/0000:20:01.0/0000:2a:00.0"),
        ("SUBSYSTEM", "pci"),
        ("PCI_CLASS", "30200"),
        ("PCI_ID", "10DE:2335"),
        ("PCI_SLOT_NAME", "0000:2a:00.0"),
        (
            "MODALIAS",
            "pci:v000010DEd00002335sv000010DEsd000018BEbc03sc02i00",
        ),
        ("SEQNUM", "4711"),
    ])
    .unwrap();
    let sent = std::time::Instant::now();
    bcd_udev::inject(&event.encode(), bcd_udev::Group::Kernel)
        .expect("injecting a uevent needs CAP_NET_ADMIN: run the tests as root");
    wait_for(Duration::from_secs(5), "the new GPU in the store", || {
        (stored_gpus(&server, &id) == ["0000:17:00.0", "0000:2a:00.0"]).then_some(())
    });
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the inventory took {took:?} to reach the server:\n{}",
        proc.log()
    );
    proc.stop();
}
