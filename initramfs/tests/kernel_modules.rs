//! Kernel modules from a modules tree into an archive: a fake tree built
//! here, and real trees (the machine's, and the fetched netboot kernel's).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use initramfs::modules::{self, ModuleError, Modules};
use initramfs::{Archive, Node, read};

const KVER: &str = "6.1.0-99-cloud-amd64";

const MODULES_DEP: &str = "\
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko.zst: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko
kernel/drivers/misc/pvpanic/pvpanic.ko:
kernel/drivers/misc/pvpanic/pvpanic-mmio.ko: kernel/drivers/misc/pvpanic/pvpanic.ko
kernel/drivers/net/e1000/e1000.ko:
";

/// A merged-/usr tree (`/lib -> usr/lib`) with a modules directory whose
/// module files hold their own path as content.
fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let modules = root.join("usr/lib/modules").join(KVER);
    fs::create_dir_all(&modules).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    fs::write(modules.join("modules.dep"), MODULES_DEP).unwrap();
    fs::write(
        modules.join("modules.builtin"),
        "kernel/drivers/tty/serial/8250/8250.ko\n",
    )
    .unwrap();
    for line in MODULES_DEP.lines() {
        let path = line.split(':').next().unwrap();
        let file = modules.join(path);
        fs::create_dir_all(file.parent().unwrap()).unwrap();
        fs::write(&file, path).unwrap();
    }
    dir
}

#[test]
fn requested_modules_arrive_with_dependencies_and_load_list() {
    let dir = tree();
    let root = dir.path();
    let mut archive = Archive::new();
    let plan = modules::add_modules(
        &mut archive,
        root,
        KVER,
        &["virtio-pci", "virtio_net", "pvpanic_mmio", "8250"],
    )
    .unwrap();
    let names: Vec<&str> = plan.modules.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "virtio_ring",
            "virtio",
            "virtio_pci_modern_dev",
            "virtio_pci_legacy_dev",
            "virtio_pci",
            "failover",
            "net_failover",
            "virtio_net",
            "pvpanic",
            "pvpanic_mmio"
        ]
    );
    assert_eq!(plan.builtin, ["8250"]);

    let entries = read(&archive.to_bytes()).unwrap();
    let file = |path: &str| {
        entries
            .iter()
            .find(|e| e.path == path)
            .map(|e| e.node.clone())
            .unwrap_or_else(|| panic!("{path} not in the archive"))
    };
    let dir = format!("lib/modules/{KVER}");
    assert_eq!(
        file(&format!("{dir}/kernel/drivers/net/virtio_net.ko.zst")),
        Node::File(b"kernel/drivers/net/virtio_net.ko.zst".to_vec()),
        "compressed modules are copied as they are"
    );
    let Node::File(order) = file(&format!("{dir}/modules.order")) else {
        panic!("modules.order is no file");
    };
    let order = String::from_utf8(order).unwrap();
    assert_eq!(order.lines().count(), 10);
    assert_eq!(
        order.lines().next(),
        Some("kernel/drivers/virtio/virtio_ring.ko")
    );
    assert_eq!(
        order.lines().last(),
        Some("kernel/drivers/misc/pvpanic/pvpanic-mmio.ko")
    );
    let Node::File(dep) = file(&format!("{dir}/modules.dep")) else {
        panic!("modules.dep is no file");
    };
    let dep = String::from_utf8(dep).unwrap();
    assert!(!dep.contains("e1000"), "only the chosen modules: {dep}");
    assert!(dep.contains(
        "kernel/drivers/misc/pvpanic/pvpanic-mmio.ko: kernel/drivers/misc/pvpanic/pvpanic.ko\n"
    ));
    // The subset parses again and resolves the same way.
    let again = Modules::parse(KVER, &dep, None).unwrap();
    assert_eq!(again.resolve(&["virtio_net"]).unwrap().modules.len(), 3);
    assert!(matches!(
        file(&format!("{dir}/modules.builtin")),
        Node::File(ref text) if text.starts_with(b"kernel/drivers/tty")
    ));
    // Through the /lib symlink of the tree, /lib is a real directory here.
    assert_eq!(archive.get("lib"), Some((0o755, &Node::Dir)));
    assert!(!entries.iter().any(|e| e.path.contains("e1000")));
}

#[test]
fn missing_modules_and_missing_modules_dep_say_what_to_do() {
    let dir = tree();
    let root = dir.path();
    let err =
        modules::add_modules(&mut Archive::new(), root, KVER, &["virtio_net", "vfio"]).unwrap_err();
    assert!(
        matches!(&err, ModuleError::NotFound { names, .. } if names == &["vfio"]),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("module vfio not found for kernel")
    );

    fs::remove_file(root.join("usr/lib/modules").join(KVER).join("modules.dep")).unwrap();
    let err = Modules::open(root, KVER).unwrap_err();
    assert!(matches!(err, ModuleError::NoModulesDep { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("depmod -b {} {KVER}", root.display()))
    );

    let err = Modules::open(root, "5.10.0-other").unwrap_err();
    assert!(matches!(err, ModuleError::NoModulesDep { .. }), "{err}");
}

#[test]
fn a_module_file_missing_from_the_tree_is_named() {
    let dir = tree();
    let root = dir.path();
    let file = root
        .join("usr/lib/modules")
        .join(KVER)
        .join("kernel/net/core/failover.ko");
    fs::remove_file(file).unwrap();
    let err = modules::add_modules(&mut Archive::new(), root, KVER, &["virtio_net"]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("/lib/modules/{KVER}/kernel/net/core/failover.ko")),
        "{text}"
    );
}

/// Real trees: the machine's own under `/lib/modules`, and the Debian
/// kernel `scripts/fetch-kernel` unpacks for the netboot tests (its cache:
/// `BC_NETBOOT_CACHE`, or `target/netboot-cache`). At least one must be
/// there: containers and CI machines often have no modules of their own,
/// which is why this needs the fetched kernel.
#[test]
#[ignore = "needs a real kernel module tree: run scripts/fetch-kernel (scripts/test does, then runs it)"]
fn real_module_trees_resolve() {
    let cache = std::env::var_os("BC_NETBOOT_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/netboot-cache"));
    let mut roots: Vec<std::path::PathBuf> = vec!["/".into()];
    roots.push(cache.join("kernel"));
    let mut trees = Vec::new();
    for root in roots {
        let Ok(dirs) = fs::read_dir(root.join("lib/modules")) else {
            continue;
        };
        for dir in dirs {
            let dir = dir.unwrap().path();
            if dir.join("modules.dep").exists() {
                trees.push((root.clone(), dir));
            }
        }
    }
    assert!(
        !trees.is_empty(),
        "no kernel module tree in /lib/modules or {}: run scripts/fetch-kernel (or apt-get \
         install linux-image-amd64)",
        cache.join("kernel").display()
    );
    let mut checked = 0;
    for (root, dir) in trees {
        let kver = dir.file_name().unwrap().to_str().unwrap().to_owned();
        let dep = fs::read_to_string(dir.join("modules.dep")).unwrap();
        let modules = Modules::open(&root, &kver).unwrap();
        // The module with the most dependencies exercises the ordering most.
        let line = dep
            .lines()
            .max_by_key(|line| line.split_whitespace().count())
            .expect("modules.dep lists modules");
        let path = line.split(':').next().unwrap();
        let name = modules::module_name(path);
        let plan = modules.resolve(&[name.as_str()]).unwrap();
        assert_eq!(plan.modules.last().unwrap().path, path);
        for (i, module) in plan.modules.iter().enumerate() {
            for dep in &module.deps {
                assert!(
                    plan.modules[..i].iter().any(|m| &m.path == dep),
                    "{dep} must load before {}",
                    module.path
                );
            }
        }
        let mut archive = Archive::new();
        modules.add_to(&mut archive, &root, &plan).unwrap();
        assert!(archive.contains(format!("lib/modules/{kver}/{path}")));
        checked += 1;
    }
    eprintln!("checked {checked} real module trees");
}
