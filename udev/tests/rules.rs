//! The udev rules: their syntax by a reader of our own, and the real udev's
//! verdict.
//!
//! Debian 12's systemd 252 has no `udevadm verify` (systemd 253 added it).
//! `udevadm test` reads every rules file and reports each line it cannot
//! use (`FILE:LINE Invalid key ...`, `Unknown group ...`) before it runs
//! the rules for one device; it reads only the system's rules directories,
//! so the test gives it ours in a private mount namespace (`unshare -m`,
//! root), over an empty `/etc/udev/rules.d`, with a `/run` of its own for
//! the device database it writes. Needs `udevadm` (Debian
//! `udev`), `unshare` (`util-linux`), root, and the group `tss` that the
//! rules name (Debian `tpm-udev`, or `groupadd -r tss`).

use std::path::Path;
use std::process::Command;

use bcd_udev::rules::{FILES, INSTALL_DIR};

/// Keys that only compare, keys that only assign, and keys that do both.
const MATCH_KEYS: &[&str] = &[
    "ACTION",
    "DEVPATH",
    "KERNEL",
    "KERNELS",
    "SUBSYSTEM",
    "SUBSYSTEMS",
    "DRIVER",
    "DRIVERS",
    "ATTRS",
    "TAGS",
    "TEST",
    "PROGRAM",
    "RESULT",
    "CONST",
];
const ASSIGN_KEYS: &[&str] = &[
    "OWNER", "GROUP", "MODE", "RUN", "LABEL", "GOTO", "OPTIONS", "SECLABEL",
];
const BOTH_KEYS: &[&str] = &["NAME", "SYMLINK", "ATTR", "SYSCTL", "ENV", "TAG", "IMPORT"];
/// Keys that take `{argument}`.
const WITH_ARGUMENT: &[&str] = &[
    "ATTR", "ATTRS", "SYSCTL", "ENV", "CONST", "TEST", "RUN", "IMPORT", "SECLABEL",
];

/// One `KEY{arg}OP"value"` of a rule.
#[derive(Debug, PartialEq)]
struct Token {
    key: String,
    op: String,
    value: String,
}

/// Reads one rule line as udev does: comma-separated `KEY[{arg}]OP"value"`
/// tokens, with known keys, operators that fit them and quoted values.
fn parse_rule(line: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let key_end = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .ok_or("a key without an operator")?;
        let key = &rest[..key_end];
        rest = &rest[key_end..];
        if let Some(after) = rest.strip_prefix('{') {
            let close = after.find('}').ok_or("an unclosed {")?;
            if !WITH_ARGUMENT.contains(&key) {
                return Err(format!("{key} takes no {{argument}}"));
            }
            rest = &after[close + 1..];
        } else if WITH_ARGUMENT.contains(&key) && !matches!(key, "RUN" | "IMPORT" | "TEST") {
            return Err(format!("{key} needs an {{argument}}"));
        }
        let op = ["==", "!=", "+=", "-=", ":=", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .ok_or_else(|| format!("no operator after {key}"))?;
        rest = &rest[op.len()..];
        let is_match = matches!(op, "==" | "!=");
        let allowed = if MATCH_KEYS.contains(&key) {
            is_match
        } else if ASSIGN_KEYS.contains(&key) {
            !is_match
        } else if BOTH_KEYS.contains(&key) {
            true
        } else {
            return Err(format!("unknown key {key}"));
        };
        if !allowed {
            return Err(format!("{key} does not take {op}"));
        }
        let body = rest
            .strip_prefix('"')
            .ok_or_else(|| format!("the value of {key} is not quoted"))?;
        let close = body
            .find('"')
            .ok_or_else(|| format!("the value of {key} is not closed"))?;
        tokens.push(Token {
            key: key.to_owned(),
            op: op.to_owned(),
            value: body[..close].to_owned(),
        });
        rest = body[close + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
            if rest.is_empty() {
                return Err("a trailing comma".into());
            }
        } else if !rest.is_empty() {
            return Err(format!("no comma before {rest:?}"));
        }
    }
    if !tokens.iter().any(|t| t.op == "==" || t.op == "!=") {
        return Err("a rule that matches nothing applies to every device".into());
    }
    if tokens.iter().all(|t| t.op == "==" || t.op == "!=") {
        return Err("a rule that assigns nothing does nothing".into());
    }
    Ok(tokens)
}

/// The rules of a file: comment and blank lines skipped, `\` continuations
/// joined.
fn rules(text: &str) -> Result<Vec<Vec<Token>>, String> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if pending.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        out.push(parse_rule(&pending).map_err(|e| format!("line {}: {e}", index + 1))?);
        pending.clear();
    }
    if !pending.is_empty() {
        return Err("the last line continues into nothing".into());
    }
    Ok(out)
}

#[test]
fn the_reader_knows_bad_rules() {
    for bad in [
        "KERNEL==\"x\"",
        "GROUP=\"tss\"",
        "KERNEL==\"x\" GROUP=\"tss\"",
        "KERNEL==\"x\", GROUP=\"tss\",",
        "KERNEL==\"x\", BOGUS=\"y\"",
        "KERNEL==\"x\", GROUP==\"tss\"",
        "KERNEL=\"x\", GROUP=\"tss\"",
        "KERNEL==x, GROUP=\"tss\"",
        "ATTR==\"x\", GROUP=\"tss\"",
        "KERNEL{a}==\"x\", GROUP=\"tss\"",
        "KERNEL==\"x, GROUP=\"tss\"",
    ] {
        assert!(parse_rule(bad).is_err(), "{bad}");
    }
    let ok = parse_rule("SUBSYSTEM==\"pci\", ATTR{vendor}==\"0x10de\", TAG+=\"bcd\"").unwrap();
    assert_eq!(ok.len(), 3);
    assert_eq!(
        ok[2],
        Token {
            key: "TAG".into(),
            op: "+=".into(),
            value: "bcd".into()
        }
    );
}

#[test]
fn our_rules_read_cleanly_and_say_what_they_promise() {
    assert_eq!(INSTALL_DIR, "/usr/lib/udev/rules.d");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        on_disk,
        FILES.iter().map(|f| f.name).collect::<Vec<_>>(),
        "every file in udev/rules is built in"
    );
    let file = &FILES[0];
    let parsed = rules(file.text).unwrap_or_else(|e| panic!("{}: {e}", file.name));
    let find = |subsystem: &str| {
        parsed
            .iter()
            .find(|r| {
                r.iter()
                    .any(|t| t.key == "SUBSYSTEM" && t.op == "==" && t.value == subsystem)
            })
            .unwrap_or_else(|| panic!("no rule for {subsystem}"))
    };
    let has = |rule: &[Token], key: &str, op: &str, value: &str| {
        rule.iter()
            .any(|t| t.key == key && t.op == op && t.value == value)
    };
    let tpmrm = find("tpmrm");
    assert!(has(tpmrm, "GROUP", "=", "tss"));
    assert!(has(tpmrm, "MODE", "=", "0660"));
    assert!(has(tpmrm, "TAG", "+=", "bcd"));
    let gpu = find("pci");
    assert!(has(gpu, "ATTR", "==", "0x10de"));
    assert!(has(gpu, "TAG", "+=", "bcd"));
    // The class pattern takes what the agent counts as a GPU, and no more.
    let class = &gpu
        .iter()
        .find(|t| t.value.starts_with("0x030"))
        .unwrap()
        .value;
    for (attr, gpu_class) in [
        ("0x030000", true),
        ("0x030200", true),
        ("0x030100", false),
        ("0x040300", false),
        ("0x068000", false),
    ] {
        assert_eq!(bcd_udev::fnmatch(class, attr), gpu_class, "{attr}");
        let value = u32::from_str_radix(&attr[2..], 16).unwrap();
        assert_eq!(bcd_udev::filter::is_gpu_class(value), gpu_class, "{attr}");
    }
}

/// `udevadm test` with our rules installed, on a device of this machine.
fn udevadm_test(rules: &[(&str, &str)], devpath: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in rules {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let script = format!(
        "mount -t tmpfs tmpfs /etc/udev/rules.d && cp {}/* /etc/udev/rules.d/ && \
         mount -t tmpfs tmpfs /run && \
         exec udevadm test --action=add --resolve-names=early {devpath}",
        dir.path().display()
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap_or_else(|e| panic!("cannot run unshare ({e}): apt-get install util-linux"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "udevadm test failed (needs root for a private mount namespace, and udevadm: \
         apt-get install udev):\n{text}"
    );
    text
}

/// The lines udev wrote about a rules file, but for reading it.
fn complaints<'a>(output: &'a str, name: &str) -> Vec<&'a str> {
    output
        .lines()
        .filter(|l| l.contains(name) && !l.starts_with("Reading rules file"))
        .collect()
}

#[test]
fn udev_reads_our_rules_without_a_complaint() {
    let groups = std::fs::read_to_string("/etc/group").unwrap();
    assert!(
        groups.lines().any(|l| l.starts_with("tss:")),
        "the rules name the group tss: apt-get install tpm-udev (or groupadd -r tss)"
    );
    let files: Vec<(&str, &str)> = FILES.iter().map(|f| (f.name, f.text)).collect();
    let out = udevadm_test(&files, "/sys/devices/virtual/net/lo");
    assert!(
        out.contains(&format!(
            "Reading rules file: /etc/udev/rules.d/{}",
            FILES[0].name
        )),
        "udev did not read our rules:\n{out}"
    );
    assert_eq!(complaints(&out, FILES[0].name), Vec::<&str>::new());

    // The oracle sees bad lines, so its silence means something.
    let out = udevadm_test(
        &[(
            "60-broken.rules",
            "KERNEL==\"lo\", BOGUS=\"1\"\nKERNEL==\"lo\", GROUP=\"no-such-group-bcd\"\n",
        )],
        "/sys/devices/virtual/net/lo",
    );
    let complaints = complaints(&out, "60-broken.rules");
    assert_eq!(complaints.len(), 2, "{out}");
}

#[test]
fn udev_applies_the_pci_rule_to_a_device_of_this_machine() {
    // The GPU rule, pointed at a PCI function that this machine has: its
    // vendor and class in place of NVIDIA's, the rest as written.
    let Some(function) = std::fs::read_dir("/sys/bus/pci/devices")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
    else {
        panic!("this test needs a PCI device in /sys/bus/pci/devices");
    };
    let read = |attr: &str| {
        std::fs::read_to_string(function.path().join(attr))
            .unwrap()
            .trim()
            .to_owned()
    };
    let (vendor, class) = (read("vendor"), read("class"));
    let text = FILES[0].text;
    let rule = text
        .lines()
        .find(|l| l.contains("ATTR{vendor}==\"0x10de\""))
        .unwrap();
    let pattern = format!("{}??", &class[..6]);
    let retargeted = rule
        .replace("0x10de", &vendor)
        .replace("0x030[02]??", &pattern);
    assert_ne!(retargeted, rule);
    let devpath = std::fs::canonicalize(function.path()).unwrap();
    let out = udevadm_test(&[("60-bcd.rules", &retargeted)], devpath.to_str().unwrap());
    assert!(out.lines().any(|l| l == "CURRENT_TAGS=:bcd:"), "{out}");
    // As written, the rule leaves a device of another vendor untagged
    // (unless this machine's first PCI function is an NVIDIA GPU).
    if vendor != "0x10de" {
        let out = udevadm_test(&[("60-bcd.rules", text)], devpath.to_str().unwrap());
        assert!(!out.contains(":bcd:"), "{out}");
    }
}
