//! The agent ships as one static executable: no ELF interpreter, no shared
//! libraries, and it runs; and a release carries no fake hardware, no
//! simulator and no failpoints.

use std::process::Command;

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NEEDED: i64 = 1;

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// (has an interpreter, number of DT_NEEDED entries) of a 64-bit
/// little-endian ELF file.
fn linkage(elf: &[u8]) -> (bool, usize) {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    assert_eq!(elf[4], 2, "64-bit");
    assert_eq!(elf[5], 1, "little-endian");
    let phoff = u64_at(elf, 0x20) as usize;
    let phentsize = u16_at(elf, 0x36) as usize;
    let phnum = u16_at(elf, 0x38) as usize;
    let mut interp = false;
    let mut needed = 0;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        match u32_at(elf, ph) {
            PT_INTERP => interp = true,
            PT_DYNAMIC => {
                let off = u64_at(elf, ph + 8) as usize;
                let size = u64_at(elf, ph + 32) as usize;
                for d in (off..off + size).step_by(16) {
                    if u64_at(elf, d) as i64 == DT_NEEDED {
                        needed += 1;
                    }
                }
            }
            _ => {}
        }
    }
    (interp, needed)
}

#[test]
fn the_musl_bcd_is_fully_static_and_runs() {
    let path = bc_tests::static_bcd();
    let elf = std::fs::read(&path).unwrap();
    assert_eq!(
        linkage(&elf),
        (false, 0),
        "{} must be static",
        path.display()
    );
    let out = Command::new(&path).arg("version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("bcd "));
}

/// The release build (`-p bcd`, no features) has real hardware only: `bcd
/// sim` and `--fake-hw` do not exist, `BCD_FAKE_HW` and the failpoints'
/// variables are not read, and none of their code is in the file.
#[test]
fn the_release_bcd_has_no_fake_hardware_no_sim_and_no_failpoints() {
    let path = bc_tests::static_bcd();
    let out = Command::new(&path).arg("version").output().unwrap();
    // Real hardware, and the pure-Rust TPM backend only (no C TPM stack).
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "bcd {} (real hardware)\nTPM backends: protocol",
            env!("CARGO_PKG_VERSION")
        )
    );
    let out = Command::new(&path)
        .args(["sim", "--nodes", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unrecognized subcommand 'sim'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&path)
        .args(["gpus", "--fake-hw", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected argument '--fake-hw'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // With BCD_FAKE_HW set, `bcd gpus` still reads the (golden) host tree.
    let root = tempfile::tempdir().unwrap();
    let out = Command::new(&path)
        .args(["gpus", "--json", "--host-root"])
        .arg(root.path())
        .env("BCD_FAKE_HW", "7")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gpus"], serde_json::json!([]), "no fake GPUs");
    // Nothing of the fakes or the failpoints is in the file.
    let elf = std::fs::read(&path).unwrap();
    for needle in [
        "BCD_FAKE_HW",
        "BCD_CRASH_AT",
        "crash injection",
        "(fake)",
        "simulated node",
    ] {
        assert!(
            !elf.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{} contains {needle:?}",
            path.display()
        );
    }
}

/// The test build the system tests run (`--all-features`) does have them:
/// the check above would see them. It has the tss-esapi TPM backend too.
#[test]
fn the_test_bcd_has_the_fakes_the_release_lacks() {
    let path = bc_tests::bin("bcd");
    let out = Command::new(&path).arg("version").output().unwrap();
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.contains("fakehw, failpoints"), "{version}");
    // --all-features: the tss-esapi backend too.
    assert!(version.contains("TPM backends: protocol, tss"), "{version}");
    let elf = std::fs::read(&path).unwrap();
    for needle in ["BCD_FAKE_HW", "BCD_CRASH_AT", "crash injection", "(fake)"] {
        assert!(
            elf.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "{} lacks {needle:?}",
            path.display()
        );
    }
}

#[test]
fn the_checker_sees_a_dynamic_binary() {
    // The test binary itself is a glibc executable: interpreter and libc.
    let elf = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let (interp, needed) = linkage(&elf);
    assert!(interp && needed > 0);
}
