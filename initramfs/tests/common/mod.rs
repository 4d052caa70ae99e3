//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::process::Command;

use initramfs::Archive;

/// Fails the test with the install command when `tool` is missing.
pub fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|out| out.status.success());
    assert!(
        found,
        "{tool} is missing: install it with apt-get install -y {package}"
    );
}

/// A small archive with one entry of every kind.
pub fn sample() -> Archive {
    let mut a = Archive::new();
    a.file("bin/bcd", 0o755, b"#!/bin/sh\necho bcd\n".to_vec())
        .unwrap();
    a.symlink("init", "bin/bcd").unwrap();
    a.symlink("sbin/bcd", "/bin/bcd").unwrap();
    a.dir("etc", 0o755).unwrap();
    a.file(
        "etc/bcd/node.toml",
        0o600,
        b"gateway = \"10.0.2.100:7443\"\n".to_vec(),
    )
    .unwrap();
    a.file("etc/empty", 0o644, Vec::new()).unwrap();
    a.dir("tmp", 0o1777).unwrap();
    a.file("usr/bin/suid", 0o4755, b"x".to_vec()).unwrap();
    a.char_dev("dev/console", 0o600, 5, 1).unwrap();
    a.char_dev("dev/null", 0o666, 1, 3).unwrap();
    a.block_dev("dev/vda", 0o660, 253, 0).unwrap();
    a.fifo("run/fifo", 0o600).unwrap();
    a
}
