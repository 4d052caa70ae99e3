use super::*;
use proptest::prelude::*;

use crate::request::{self, Request};

// A real ed25519 public key (ssh-keygen), as the access converger's tests
// use.
const ED25519: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

fn refused<T: std::fmt::Debug>(r: Result<T, Invalid>) -> String {
    r.expect_err("refused").0
}

#[test]
fn allocation_ids_are_safe_file_names() {
    for good in ["job-a", "a", "A.b_c-9", &"x".repeat(64)] {
        assert_eq!(AllocationId::parse(good).unwrap().as_str(), good);
    }
    assert_eq!(
        AllocationId::parse("job-a").unwrap().env_file_name(),
        "job-a.env"
    );
    for bad in [
        "",
        ".",
        "..",
        ".hidden",
        "a..b",
        "a/b",
        "../etc/passwd",
        "a b",
        "é",
        "a\0",
        &"x".repeat(65),
    ] {
        let e = refused(AllocationId::parse(bad));
        assert!(e.starts_with("allocation id "), "{bad:?}: {e}");
    }
    // A long refusal quotes a bounded prefix.
    let e = refused(AllocationId::parse(&"/".repeat(1 << 20)));
    assert!(e.len() < 300, "{}", e.len());
    assert!(e.contains("(1048576 bytes)"), "{e}");
}

fn env_request(devices: &[&str], env: &[(&str, &str)]) -> wire::WriteEnvFile {
    wire::WriteEnvFile {
        allocation_id: "job-a".into(),
        devices: devices.iter().map(|d| d.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn an_env_file_renders_as_the_converger_writes_it() {
    let f = EnvFile::parse(env_request(
        &[
            "GPU-00000000-0000-0000-0000-000000000000",
            "GPU-00000001-0000-0000-0000-000000000000",
        ],
        &[("JOB", "job-a"), ("A_FIRST", "x y=z \"q\"")],
    ))
    .unwrap();
    assert_eq!(
        f.render(),
        "# Written by bcd from the node's spec; edits are undone.\n\
         NVIDIA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000,GPU-00000001-0000-0000-0000-000000000000\n\
         CDI_DEVICES=nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000,nvidia.com/gpu=GPU-00000001-0000-0000-0000-000000000000\n\
         A_FIRST=x y=z \"q\"\n\
         JOB=job-a\n"
    );
    assert_eq!(f.allocation().as_str(), "job-a");
    assert_eq!(EnvFile::parse(f.to_wire()).unwrap(), f);
}

#[test]
fn env_files_refuse_bad_keys_values_and_devices() {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&[], &[], "name at least one GPU"),
        (&["0", "0"], &[], "GPU 0 appears twice"),
        (&["GPU 0"], &[], "must be a GPU UUID or index"),
        (&["../0"], &[], "must be a GPU UUID or index"),
        (&["0"], &[("", "x")], "is not an environment variable name"),
        (
            &["0"],
            &[("1A", "x")],
            "is not an environment variable name",
        ),
        (
            &["0"],
            &[("A-B", "x")],
            "is not an environment variable name",
        ),
        (
            &["0"],
            &[("A=B", "x")],
            "is not an environment variable name",
        ),
        (&["0"], &[("NVIDIA_VISIBLE_DEVICES", "all")], "is reserved"),
        (&["0"], &[("CDI_DEVICES", "x")], "is reserved"),
        (
            &["0"],
            &[("NVIDIA_MIG_CONFIG_DEVICES", "all")],
            "is reserved",
        ),
        (
            &["0"],
            &[("LD_PRELOAD", "/tmp/x.so")],
            "steer the dynamic loader",
        ),
        (
            &["0"],
            &[("LD_LIBRARY_PATH", "/tmp")],
            "steer the dynamic loader",
        ),
        (&["0"], &[("A", "x\ny")], "NUL or a line break"),
        (&["0"], &[("A", "x\ry")], "NUL or a line break"),
        (&["0"], &[("A", "x\0")], "NUL or a line break"),
    ];
    for (devices, env, want) in cases {
        let e = refused(EnvFile::parse(env_request(devices, env)));
        assert!(e.contains(want), "{devices:?} {env:?}: {e}");
        assert!(e.starts_with("allocation job-a: "), "{e}");
    }
    let long = "v".repeat(MAX_ENV_VALUE + 1);
    assert!(refused(EnvFile::parse(env_request(&["0"], &[("A", &long)]))).contains("more than"));
    let mut many = env_request(&["0"], &[]);
    for i in 0..=MAX_ENV {
        many.env.insert(format!("K{i}"), String::new());
    }
    assert!(refused(EnvFile::parse(many)).contains("variables, more than"));
    let mut gpus = env_request(&[], &[]);
    gpus.devices = (0..=MAX_DEVICES).map(|i| i.to_string()).collect();
    assert!(refused(EnvFile::parse(gpus)).contains("GPUs, more than"));
    let mut bad_id = env_request(&["0"], &[]);
    bad_id.allocation_id = "../x".into();
    assert!(refused(EnvFile::parse(bad_id)).starts_with("allocation id"));
    // Lowercase and mixed case are fine; the loader's prefix is not.
    EnvFile::parse(env_request(&["0"], &[("ld_preload_note", "x"), ("_A", "")])).unwrap();
}

fn inventory() -> cdi::nvidia::Inventory {
    let node = |i: u32| cdi::nvidia::Node {
        path: format!("/dev/nvidia{i}"),
        major: 195,
        minor: i,
    };
    cdi::nvidia::Inventory {
        gpus: (0..2)
            .map(|i| cdi::nvidia::Gpu {
                index: i,
                uuid: Some(format!("GPU-{i:08x}-0000-0000-0000-000000000000")),
                node: node(i),
            })
            .collect(),
        control_nodes: vec![
            cdi::nvidia::Node {
                path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
            },
            cdi::nvidia::Node {
                path: "/dev/nvidia-caps/nvidia-cap1".into(),
                major: 237,
                minor: 1,
            },
        ],
        driver_files: vec![
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
            "/usr/bin/nvidia-smi".into(),
        ],
    }
}

#[test]
fn the_cdi_spec_bcd_generates_passes() {
    let json = cdi::nvidia::spec(&inventory()).to_json();
    let spec = CdiSpec::parse(json.clone()).unwrap();
    assert_eq!(spec.json(), json.as_slice());
    assert_eq!(spec.spec().kind, "nvidia.com/gpu");
}

#[test]
fn cdi_specs_that_reach_beyond_gpus_are_refused() {
    let base = cdi::nvidia::spec(&inventory());
    let check = |edit: &dyn Fn(&mut cdi::Spec), want: &str| {
        let mut s = base.clone();
        edit(&mut s);
        // Declare what the edited content needs, so only our policy refuses.
        s.cdi_version = s.minimum_version().to_string();
        let e = refused(CdiSpec::parse(s.to_json()));
        assert!(e.contains(want), "{want}: {e}");
        assert!(e.starts_with("CDI spec: "), "{e}");
    };
    check(
        &|s| {
            s.container_edits.hooks.push(cdi::Hook {
                hook_name: "createRuntime".into(),
                path: "/tmp/x".into(),
                ..Default::default()
            })
        },
        "hooks are refused",
    );
    check(
        &|s| {
            s.devices[0].container_edits.hooks.push(cdi::Hook {
                hook_name: "prestart".into(),
                path: "/usr/bin/true".into(),
                ..Default::default()
            })
        },
        "hooks are refused",
    );
    check(
        &|s| s.kind = "example.com/disk".into(),
        "is not nvidia.com/gpu",
    );
    check(
        &|s| s.devices[0].container_edits.device_nodes[0].path = "/dev/sda".into(),
        "is not an NVIDIA device",
    );
    check(
        &|s| s.devices[0].container_edits.device_nodes[0].path = "/dev/nvidia0/../sda".into(),
        "without '.' or '..'",
    );
    check(
        &|s| s.devices[0].container_edits.device_nodes[0].host_path = "/dev/sda".into(),
        "same host path",
    );
    check(
        &|s| s.container_edits.mounts[0].options = vec!["rw".into(), "bind".into()],
        "must be read-only",
    );
    check(
        &|s| s.container_edits.mounts[0].options.push("rw".into()),
        "must be read-only",
    );
    check(
        &|s| s.container_edits.mounts[0].container_path = "/etc/ld.so.preload".into(),
        "at the same path",
    );
    check(
        &|s| {
            let m = &mut s.container_edits.mounts[0];
            m.host_path = "/".into();
            m.container_path = "/".into();
            m.kind = "proc".into();
        },
        "only bind mounts",
    );
    check(
        &|s| s.container_edits.additional_gids.push(0),
        "additional groups",
    );
    check(
        &|s| {
            s.container_edits.net_devices.push(cdi::NetDevice {
                host_interface_name: "eth0".into(),
                name: "eth0".into(),
            })
        },
        "network devices",
    );
    // The cdi crate's own checks come first.
    let e = refused(CdiSpec::parse(b"{not json".to_vec()));
    assert!(e.starts_with("CDI spec: not a CDI spec"), "{e}");
    let mut too_old = base.clone();
    too_old.cdi_version = "0.1.0".into();
    assert!(refused(CdiSpec::parse(too_old.to_json())).contains("cdiVersion"));
    let big = vec![b' '; MAX_CDI_SPEC + 1];
    assert!(refused(CdiSpec::parse(big)).contains("more than"));
}

#[test]
fn keys_users_and_principals_are_checked_as_the_access_converger_does() {
    check_key(ED25519).unwrap();
    check_key("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl")
        .unwrap();
    let cases = [
        ("ssh-ed25519", "is not TYPE BASE64"),
        ("", "is not TYPE BASE64"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "not one sshd accepts"),
        ("ssh-ed25519 !!!", "not valid base64"),
        ("ssh-ed25519 AAAA", "truncated"),
        (
            "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
            "not a ssh-rsa key",
        ),
        (
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a\nssh-rsa AAAA",
            "one line",
        ),
        (
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a\0b",
            "control characters",
        ),
        (
            "command=\"/bin/sh\" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
            "not one sshd accepts",
        ),
    ];
    for (key, want) in cases {
        let e = refused(check_key(key));
        assert!(e.contains(want), "{key:?}: {e}");
    }
    // A length that points past the blob, or at u32::MAX, is refused.
    use base64::Engine;
    let mut blob = 0xffff_ffffu32.to_be_bytes().to_vec();
    blob.extend_from_slice(b"ssh-ed25519");
    let line = format!(
        "ssh-ed25519 {}",
        base64::engine::general_purpose::STANDARD.encode(&blob)
    );
    assert!(refused(check_key(&line)).contains("not a ssh-ed25519 key"));
    let long = format!("{ED25519} {}", "c".repeat(MAX_KEY_LINE));
    assert!(refused(check_key(&long)).contains("more than"));

    check_user("alice").unwrap();
    check_user("_svc-1").unwrap();
    for bad in ["Alice", "1bob", "", "a b", "../etc", "-x", &"x".repeat(33)] {
        assert!(
            refused(check_user(bad)).contains("is not a valid user name"),
            "{bad}"
        );
    }
    check_principal("gpu-admins").unwrap();
    for bad in [
        "",
        "a b",
        "a,b",
        "a\tb",
        "a\u{7}",
        &"p".repeat(MAX_PRINCIPAL + 1),
    ] {
        assert!(
            refused(check_principal(bad)).contains("one word"),
            "{bad:?}"
        );
    }
}

fn sshd(users: Vec<wire::SshUser>, cas: Vec<String>) -> wire::WriteSshd {
    wire::WriteSshd {
        users,
        trusted_user_ca_keys: cas,
    }
}

fn user(name: &str, keys: &[&str], principals: &[&str]) -> wire::SshUser {
    wire::SshUser {
        name: name.into(),
        authorized_keys: keys.iter().map(|k| k.to_string()).collect(),
        principals: principals.iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn sshd_files_are_checked_whole() {
    let ok = SshdFiles::parse(sshd(
        vec![user("alice", &[ED25519], &["alice", "gpu-admins"])],
        vec![ED25519.into()],
    ))
    .unwrap();
    assert_eq!(ok.users()[0].name(), "alice");
    assert_eq!(ok.users()[0].principals(), ["alice", "gpu-admins"]);
    assert!(!ok.is_empty());
    assert_eq!(SshdFiles::parse(ok.to_wire()).unwrap(), ok);
    assert!(SshdFiles::parse(sshd(vec![], vec![])).unwrap().is_empty());

    let cases = [
        (
            sshd(
                vec![user("alice", &[], &[]), user("alice", &[], &[])],
                vec![],
            ),
            "user alice appears twice",
        ),
        (
            sshd(vec![user("Alice", &[], &[])], vec![]),
            "is not a valid user name",
        ),
        (
            sshd(vec![user("bob", &["ssh-ed25519 AAAA"], &[])], vec![]),
            "user bob: the key blob is truncated",
        ),
        (
            sshd(vec![user("bob", &[], &["two words"])], vec![]),
            "user bob: principal",
        ),
        (
            sshd(vec![], vec!["ssh-ed25519 x".into()]),
            "trusted user CA key: ",
        ),
    ];
    for (m, want) in cases {
        let e = refused(SshdFiles::parse(m));
        assert!(e.contains(want), "{want}: {e}");
    }
    let many_users = (0..=MAX_USERS)
        .map(|i| user(&format!("u{i}"), &[], &[]))
        .collect();
    assert!(refused(SshdFiles::parse(sshd(many_users, vec![]))).contains("more than"));
    let keys = vec![ED25519; MAX_KEYS_PER_USER + 1];
    assert!(
        refused(SshdFiles::parse(sshd(vec![user("a", &keys, &[])], vec![])))
            .contains("keys, more than")
    );
    let principals = vec!["p"; MAX_PRINCIPALS_PER_USER + 1];
    assert!(
        refused(SshdFiles::parse(sshd(
            vec![user("a", &[], &principals)],
            vec![]
        )))
        .contains("principals, more than")
    );
    let cas = vec![ED25519.to_string(); MAX_CA_KEYS + 1];
    assert!(refused(SshdFiles::parse(sshd(vec![], cas))).contains("CA keys, more than"));
}

fn rule(protocol: i32, port: u32, source: &str, action: i32) -> wire::FirewallRule {
    wire::FirewallRule {
        protocol,
        port,
        source: source.into(),
        action,
    }
}

const TCP: i32 = wire::Protocol::Tcp as i32;
const UDP: i32 = wire::Protocol::Udp as i32;
const ACCEPT: i32 = wire::Action::Accept as i32;
const DROP: i32 = wire::Action::Drop as i32;

#[test]
fn firewall_rules_are_typed() {
    let rules = check_firewall(&[
        rule(TCP, 22, "10.0.0.0/8", ACCEPT),
        rule(UDP, 65535, "", DROP),
        rule(TCP, 443, "2001:db8::1", ACCEPT),
        rule(TCP, 1, "2001:db8::/32", DROP),
        rule(TCP, 2, "192.0.2.1/32", DROP),
    ])
    .unwrap();
    assert_eq!(rules[0].protocol, Protocol::Tcp);
    assert_eq!(rules[0].port, 22);
    assert_eq!(rules[0].action.as_str(), "accept");
    let src = rules[0].source.as_ref().unwrap();
    assert_eq!((src.as_str(), src.prefix()), ("10.0.0.0/8", Some(8)));
    assert_eq!(src.addr(), "10.0.0.0".parse::<IpAddr>().unwrap());
    assert_eq!(rules[1].source, None);
    assert_eq!(rules[1].protocol.as_str(), "udp");
    assert_eq!(rules[2].source.as_ref().unwrap().prefix(), None);
    for r in &rules {
        assert_eq!(&FirewallRule::parse(&r.to_wire()).unwrap(), r);
    }

    let cases = [
        (rule(0, 22, "", ACCEPT), "must be tcp or udp"),
        (rule(99, 22, "", ACCEPT), "must be tcp or udp"),
        (rule(TCP, 0, "", ACCEPT), "is not a port"),
        (rule(TCP, 65536, "", ACCEPT), "is not a port"),
        (rule(TCP, 22, "", 0), "must be accept or drop"),
        (rule(TCP, 22, "", 7), "must be accept or drop"),
        (
            rule(TCP, 22, "example.com", ACCEPT),
            "not an address or CIDR",
        ),
        (rule(TCP, 22, "10.0.0.0/33", ACCEPT), "bad prefix length"),
        (rule(TCP, 22, "10.0.0.0/+8", ACCEPT), "bad prefix length"),
        (rule(TCP, 22, "10.0.0.0/", ACCEPT), "bad prefix length"),
        (rule(TCP, 22, "10.0.0.0/8/8", ACCEPT), "bad prefix length"),
        (rule(TCP, 22, "::/129", ACCEPT), "bad prefix length"),
        (
            rule(TCP, 22, "10.0.0.0 8", ACCEPT),
            "not an address or CIDR",
        ),
        (
            rule(TCP, 22, "10.0.0.1; flush ruleset", ACCEPT),
            "not an address or CIDR",
        ),
    ];
    for (r, want) in cases {
        let e = refused(check_firewall(&[rule(TCP, 80, "", ACCEPT), r.clone()]));
        assert!(e.starts_with("rule 2: "), "{e}");
        assert!(e.contains(want), "{r:?}: {e}");
    }
    let many = vec![rule(TCP, 22, "", ACCEPT); MAX_RULES + 1];
    assert!(refused(check_firewall(&many)).contains("more than"));
    assert_eq!(check_firewall(&[]).unwrap(), vec![]);
}

#[test]
fn pci_addresses_are_as_sysfs_names_them() {
    for good in [
        "0000:3b:00.0",
        "0000:00:1f.7",
        "10000:e1:00.0",
        "ffffffff:ff:00.1",
    ] {
        assert_eq!(PciAddress::parse(good).unwrap().as_str(), good);
    }
    for bad in [
        "",
        "0000:3B:00.0",
        "0000:3b:20.0",
        "0000:3b:00.8",
        "0000:3b:00",
        "3b:00.0",
        "000:3b:00.0",
        "000000000:3b:00.0",
        "0000:3b:00.0/../../x",
        "0000:3b:0.0",
        "0000:3b:00.00",
        "0000:3b:00.a",
        "0000:g0:00.0",
    ] {
        assert!(
            refused(PciAddress::parse(bad)).contains("is not a PCI address"),
            "{bad:?}"
        );
    }
}

fn pci_device(sysfs: &Path, address: &str, vendor: &str, class: &str) {
    let dir = sysfs.join("bus/pci/devices").join(address);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
    std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
}

#[test]
fn a_gpu_reset_needs_an_nvidia_gpu_present() {
    let d = tempfile::tempdir().unwrap();
    pci_device(d.path(), "0000:3b:00.0", "0x10de", "0x030200");
    pci_device(d.path(), "0000:3c:00.0", "0x10de", "0x030000");
    pci_device(d.path(), "0000:3b:00.1", "0x10de", "0x040300");
    pci_device(d.path(), "0000:00:02.0", "0x8086", "0x030000");
    let at = |a: &str| check_gpu(d.path(), &PciAddress::parse(a).unwrap());
    at("0000:3b:00.0").unwrap();
    at("0000:3c:00.0").unwrap();
    assert!(refused(at("0000:3b:00.1")).contains("is not an NVIDIA GPU"));
    assert_eq!(
        refused(at("0000:00:02.0")),
        "PCI device 0000:00:02.0 is not an NVIDIA GPU (vendor \"0x8086\", class \"0x030000\")"
    );
    assert_eq!(
        refused(at("0000:5e:00.0")),
        format!("no PCI device 0000:5e:00.0 under {}", d.path().display())
    );
}

#[test]
fn staged_files_digests_slots_and_command_lines() {
    StagedFile::parse("vmlinuz-6.1.0").unwrap();
    for bad in [
        "",
        "..",
        ".x",
        "a/b",
        "/boot/vmlinuz",
        "a b",
        &"f".repeat(129),
    ] {
        assert!(
            refused(StagedFile::parse(bad)).starts_with("staged file"),
            "{bad:?}"
        );
    }
    assert_eq!(Sha256::parse("x", &[7; 32]).unwrap().0, [7; 32]);
    assert_eq!(
        Sha256::parse("the kernel", &[0; 31]).unwrap_err().0,
        "the SHA-256 of the kernel has 31 bytes, not 32"
    );
    assert_eq!(format!("{}", Sha256([0xab; 32])), "ab".repeat(32));
    assert_eq!(Slot::parse(wire::Slot::A as i32).unwrap(), Slot::A);
    assert_eq!(Slot::parse(wire::Slot::B as i32).unwrap().name(), "b");
    assert!(refused(Slot::parse(0)).contains("must be a or b"));
    assert!(refused(Slot::parse(3)).contains("must be a or b"));
    check_cmdline("console=ttyS0 root=/dev/ram0 bcd.state=STATE").unwrap();
    check_cmdline("").unwrap();
    assert!(refused(check_cmdline("a\nb")).contains("printable ASCII"));
    assert!(refused(check_cmdline("a\u{e9}")).contains("printable ASCII"));
    assert!(refused(check_cmdline(&"x".repeat(MAX_CMDLINE + 1))).contains("more than"));
    check_reason("operator asked: node.reboot cmd-42").unwrap();
    assert!(check_reason("a\nb").is_err());
    assert!(check_reason(&"r".repeat(MAX_REASON + 1)).is_err());
}

#[test]
fn a_kexec_names_staged_files_with_their_digests() {
    let m = wire::Kexec {
        kernel: "vmlinuz".into(),
        kernel_sha256: vec![1; 32],
        initrd: "initrd.img".into(),
        initrd_sha256: vec![2; 32],
        cmdline: "console=ttyS0".into(),
    };
    let k = Kexec::parse(m.clone()).unwrap();
    assert_eq!(k.kernel.as_str(), "vmlinuz");
    assert_eq!(k.initrd.as_ref().unwrap().1, Sha256([2; 32]));
    assert_eq!(k.to_wire(), m);
    let none = Kexec::parse(wire::Kexec {
        initrd: String::new(),
        initrd_sha256: vec![],
        ..m.clone()
    })
    .unwrap();
    assert_eq!(none.initrd, None);
    let cases = [
        (
            wire::Kexec {
                kernel: "/boot/vmlinuz".into(),
                ..m.clone()
            },
            "kernel: staged file",
        ),
        (
            wire::Kexec {
                kernel_sha256: vec![],
                ..m.clone()
            },
            "the SHA-256 of the kernel has 0 bytes",
        ),
        (
            wire::Kexec {
                initrd: String::new(),
                ..m.clone()
            },
            "an initrd digest without an initrd",
        ),
        (
            wire::Kexec {
                initrd_sha256: vec![],
                ..m.clone()
            },
            "the SHA-256 of the initrd has 0 bytes",
        ),
        (
            wire::Kexec {
                initrd: "../initrd".into(),
                ..m.clone()
            },
            "initrd: staged file",
        ),
        (
            wire::Kexec {
                cmdline: "x\0".into(),
                ..m.clone()
            },
            "printable ASCII",
        ),
    ];
    for (m, want) in cases {
        let e = refused(Kexec::parse(m));
        assert!(e.contains(want), "{want}: {e}");
    }
}

fn marshal<C: tpm2_protocol::frame::TpmFrame>(
    cmd: &C,
    sessions: &[tpm2_protocol::data::TpmsAuthCommand],
) -> Vec<u8> {
    use tpm2_protocol::data::TpmSt;
    let mut buf = vec![0u8; 4096];
    let len = {
        let mut w = tpm2_protocol::TpmWriter::new(&mut buf);
        let tag = if sessions.is_empty() {
            TpmSt::NoSessions
        } else {
            TpmSt::Sessions
        };
        tpm2_protocol::frame::tpm_marshal_command(cmd, tag, sessions, &mut w).unwrap();
        w.len()
    };
    buf.truncate(len);
    buf
}

fn password() -> tpm2_protocol::data::TpmsAuthCommand {
    tpm2_protocol::data::TpmsAuthCommand {
        session_handle: tpm2_protocol::basic::TpmHandle::new(0x4000_0009),
        nonce: Default::default(),
        session_attributes: Default::default(),
        hmac: Default::default(),
    }
}

/// A CreatePrimary header and handle with a body the validator does not
/// read.
fn create_primary(hierarchy: u32) -> Vec<u8> {
    let mut c = Vec::new();
    c.extend_from_slice(&0x8002u16.to_be_bytes());
    c.extend_from_slice(&0u32.to_be_bytes());
    c.extend_from_slice(&0x131u32.to_be_bytes());
    c.extend_from_slice(&hierarchy.to_be_bytes());
    c.extend_from_slice(&[0u8; 40]);
    let len = c.len() as u32;
    c[2..6].copy_from_slice(&len.to_be_bytes());
    c
}

#[test]
fn the_tpm_allow_list_is_the_attestors_commands() {
    use tpm2_protocol::data::TpmCc;
    let expected = [
        (TpmCc::CreatePrimary, "TPM2_CreatePrimary"),
        (TpmCc::ActivateCredential, "TPM2_ActivateCredential"),
        (TpmCc::Certify, "TPM2_Certify"),
        (TpmCc::NvRead, "TPM2_NV_Read"),
        (TpmCc::PolicySecret, "TPM2_PolicySecret"),
        (TpmCc::Sign, "TPM2_Sign"),
        (TpmCc::FlushContext, "TPM2_FlushContext"),
        (TpmCc::NvReadPublic, "TPM2_NV_ReadPublic"),
        (TpmCc::ReadPublic, "TPM2_ReadPublic"),
        (TpmCc::StartAuthSession, "TPM2_StartAuthSession"),
    ];
    let ours: Vec<(u32, &str)> = TPM_COMMANDS.to_vec();
    let theirs: Vec<(u32, &str)> = expected.iter().map(|(c, n)| (c.value(), *n)).collect();
    assert_eq!(ours, theirs);
}

#[test]
fn tpm_commands_are_relayed_only_when_allowed_and_whole() {
    use tpm2_protocol::basic::TpmHandle;
    use tpm2_protocol::frame::{
        TpmClearCommand, TpmFlushContextCommand, TpmGetRandomCommand, TpmReadPublicCommand,
    };
    let read_public = marshal(
        &TpmReadPublicCommand {
            handles: [TpmHandle::new(0x8100_0001)],
        },
        &[],
    );
    let c = TpmCommand::parse(read_public.clone()).unwrap();
    assert_eq!((c.code(), c.name()), (0x173, "TPM2_ReadPublic"));
    assert_eq!(c.bytes(), read_public.as_slice());
    let flush = marshal(
        &TpmFlushContextCommand {
            handles: [],
            flush_handle: TpmHandle::new(0x8000_0000),
        },
        &[],
    );
    assert_eq!(
        TpmCommand::parse(flush).unwrap().name(),
        "TPM2_FlushContext"
    );
    for hierarchy in TPM_PRIMARY_HIERARCHIES {
        TpmCommand::parse(create_primary(*hierarchy)).unwrap();
    }

    let clear = marshal(
        &TpmClearCommand {
            handles: [TpmHandle::new(0x4000_000C)],
        },
        &[password()],
    );
    assert_eq!(
        refused(TpmCommand::parse(clear)),
        "TPM command code 0x00000126 is not one bcd sends"
    );
    let random = marshal(
        &TpmGetRandomCommand {
            handles: [],
            bytes_requested: tpm2_protocol::basic::TpmUint16::from(8),
        },
        &[],
    );
    assert!(refused(TpmCommand::parse(random)).contains("0x0000017b is not one bcd sends"));
    // Platform and null hierarchies are not the attestor's.
    assert!(
        refused(TpmCommand::parse(create_primary(0x4000_000C)))
            .contains("owner and endorsement only")
    );
    assert!(
        refused(TpmCommand::parse(create_primary(0x4000_0007)))
            .contains("owner and endorsement only")
    );
    // The header must describe the bytes.
    let mut longer = read_public.clone();
    longer.push(0);
    assert!(refused(TpmCommand::parse(longer)).contains("header says"));
    let mut tag = read_public.clone();
    tag[1] = 0xc4;
    assert!(refused(TpmCommand::parse(tag)).contains("tag"));
    assert!(refused(TpmCommand::parse(read_public[..9].to_vec())).contains("10 to 4096"));
    assert!(refused(TpmCommand::parse(vec![0; MAX_TPM_COMMAND + 1])).contains("10 to 4096"));
    let mut short = create_primary(0x4000_0001);
    short.truncate(12);
    short[2..6].copy_from_slice(&12u32.to_be_bytes());
    assert!(refused(TpmCommand::parse(short)).contains("without its hierarchy"));
}

fn env_strategy() -> impl Strategy<Value = wire::WriteEnvFile> {
    (
        "[A-Za-z0-9_-][A-Za-z0-9._-]{0,20}",
        prop::collection::vec("GPU-[0-9a-f]{8}|[0-9]{1,2}", 1..4),
        prop::collection::btree_map("[A-Z_][A-Z0-9_]{0,10}", "[ -~]{0,20}", 0..4),
    )
        .prop_map(|(allocation_id, devices, env)| wire::WriteEnvFile {
            allocation_id,
            devices,
            env,
        })
}

fn request_strategy() -> impl Strategy<Value = wire::Request> {
    use wire::request::Kind as W;
    let rule = (
        1i32..=2,
        1u32..=65535,
        "|10\\.0\\.[0-9]\\.0/24|::1",
        1i32..=2,
    )
        .prop_map(|(protocol, port, source, action)| wire::FirewallRule {
            protocol,
            port,
            source,
            action,
        });
    prop_oneof![
        env_strategy().prop_map(W::WriteEnvFile),
        "[a-z0-9_-]{1,30}".prop_map(|a| W::RemoveEnvFile(wire::RemoveEnvFile { allocation_id: a })),
        prop::collection::vec(rule, 0..5)
            .prop_map(|rules| W::ApplyFirewall(wire::ApplyFirewall { rules })),
        Just(W::DeleteFirewall(wire::DeleteFirewall {})),
        "[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]"
            .prop_map(|a| W::ResetGpu(wire::ResetGpu { pci_address: a })),
        "[ -~]{0,40}".prop_map(|reason| W::Reboot(wire::Reboot { reason })),
        (
            1i32..=2,
            "[a-z0-9][a-z0-9._-]{0,20}",
            prop::collection::vec(any::<u8>(), 32)
        )
            .prop_map(|(slot, file, sha256)| W::InstallSlot(wire::InstallSlot {
                slot,
                file,
                sha256
            })),
        (1i32..=2, prop::collection::vec(any::<u8>(), 32))
            .prop_map(|(slot, sha256)| W::SwitchSlot(wire::SwitchSlot { slot, sha256 })),
        Just(W::RollBack(wire::RollBack {})),
        Just(W::RestartDaemon(wire::RestartDaemon {})),
        (
            "[a-z0-9][a-z0-9_-]{0,20}",
            "[a-z0-9][a-z0-9._-]{0,20}",
            prop::collection::vec(any::<u8>(), 0..200)
        )
            .prop_map(
                |(allocation_id, file, value)| W::WriteSecret(wire::WriteSecret {
                    allocation_id,
                    file,
                    value
                })
            ),
        prop::collection::btree_set(("[a-z0-9][a-z0-9_-]{0,10}", "[a-z0-9][a-z_-]{0,10}"), 0..6)
            .prop_map(|keep| W::RetainSecrets(wire::RetainSecrets {
                keep: keep
                    .into_iter()
                    .map(|(allocation_id, file)| wire::SecretFile {
                        allocation_id,
                        file
                    })
                    .collect()
            })),
        (
            0usize..TPM_COMMANDS.len(),
            prop::collection::vec(any::<u8>(), 4..100)
        )
            .prop_map(|(i, rest)| {
                let mut c = vec![0x80, 0x01, 0, 0, 0, 0];
                c.extend_from_slice(&TPM_COMMANDS[i].0.to_be_bytes());
                if TPM_COMMANDS[i].0 == 0x131 {
                    c.extend_from_slice(&0x4000_0001u32.to_be_bytes());
                }
                c.extend_from_slice(&rest);
                let len = c.len() as u32;
                c[2..6].copy_from_slice(&len.to_be_bytes());
                W::TpmCommand(wire::TpmCommand { command: c })
            }),
    ]
    .prop_map(|k| wire::Request { kind: Some(k) })
}

proptest! {
    #[test]
    fn valid_requests_survive_the_wire(r in request_strategy()) {
        let typed = Request::validate(r.clone());
        // Generated allocation ids may start with '-' or hold "..": those
        // are refused, the rest must round-trip.
        if let Ok(typed) = typed {
            let bytes = prost::Message::encode_to_vec(&typed.to_wire());
            prop_assert_eq!(request::decode(&bytes).unwrap(), typed.clone());
            prop_assert_eq!(typed.to_wire(), r);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = request::decode(&bytes);
        let _ = crate::frame::split(&bytes, crate::frame::MAX_FRAME);
    }

    #[test]
    fn any_text_is_checked_without_panicking(s in "\\PC{0,80}") {
        let _ = AllocationId::parse(&s);
        let _ = check_env_key(&s);
        let _ = check_key(&s);
        let _ = check_user(&s);
        let _ = check_principal(&s);
        let _ = PciAddress::parse(&s);
        let _ = Source::parse(&s);
        let _ = StagedFile::parse(&s);
        let _ = check_cmdline(&s);
        // A refusal's text stays bounded whatever the input.
        if let Err(e) = AllocationId::parse(&s.repeat(100)) {
            prop_assert!(e.0.len() < 400);
        }
    }

    #[test]
    fn an_accepted_env_file_renders_one_line_per_entry(m in env_strategy()) {
        if let Ok(f) = EnvFile::parse(m.clone()) {
            let text = f.render();
            prop_assert_eq!(text.lines().count(), 3 + m.env.len());
            for (k, v) in &m.env {
                let line = format!("{k}={v}");
                prop_assert!(text.lines().any(|l| l == line));
            }
        }
    }
}

#[test]
fn secrets_name_safe_files_are_bounded_and_never_shown() {
    let write = |allocation: &str, file: &str, value: Vec<u8>| {
        Request::validate(wire::Request {
            kind: Some(wire::request::Kind::WriteSecret(wire::WriteSecret {
                allocation_id: allocation.into(),
                file: file.into(),
                value,
            })),
        })
    };
    let ok = write("job-a", "db.pw", b"hunter2".to_vec()).unwrap();
    let shown = format!("{ok:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("SecretValue(7 bytes)"), "{shown}");
    for (allocation, file) in [
        ("job-a", "../etc/shadow"),
        ("job-a", ".hidden"),
        ("job-a", "a/b"),
        ("job-a", ""),
        ("../x", "db"),
        ("job-a", &"x".repeat(MAX_SECRET_FILE + 1)),
    ] {
        let e = refused(write(allocation, file, b"v".to_vec()));
        assert!(e.contains("must be 1-"), "{allocation} {file}: {e}");
    }
    let e = refused(write("job-a", "db", vec![0; MAX_SECRET + 1]));
    assert!(e.contains("more than 65536"), "{e}");
    assert!(write("job-a", "db", vec![0; MAX_SECRET]).is_ok());
    let keep = |n: usize| {
        Request::validate(wire::Request {
            kind: Some(wire::request::Kind::RetainSecrets(wire::RetainSecrets {
                keep: (0..n)
                    .map(|i| wire::SecretFile {
                        allocation_id: format!("job-{i}"),
                        file: "db".into(),
                    })
                    .collect(),
            })),
        })
    };
    assert!(keep(MAX_SECRET_FILES).is_ok());
    assert!(refused(keep(MAX_SECRET_FILES + 1)).contains("more than 4096"));
}

#[test]
fn an_empty_request_says_what_to_do() {
    let e = Request::validate(wire::Request { kind: None }).unwrap_err();
    assert!(e.0.contains("restart bcd and bcd-helper"), "{e}");
    let e = request::decode(b"\x0a\x05").unwrap_err();
    assert!(e.0.starts_with("not a helper request"), "{e}");
}
