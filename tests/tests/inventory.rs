//! Inventory from a host tree: the node reads sysfs and /proc under a root
//! of golden files, and a GPU that appears mid-session reaches the store
//! within a pass, as its section's hash changes.

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
        .block(store.store.inventory(node, "gpus"))
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
