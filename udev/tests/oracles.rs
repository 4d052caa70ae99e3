//! Matching checked against the programs it imitates: kmod's `modprobe -R`
//! on a real kernel's modules, and glibc's `fnmatch(3)`.
//!
//! Needs `modprobe` (Debian `kmod`), a C compiler (`gcc`) and the netboot
//! kernel cache that `scripts/fetch-kernel` fills (Debian's cloud kernel,
//! with `modules.alias` and the `modules.alias.bin` modprobe reads).

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bcd_udev::{Aliases, fnmatch, sysfs};
use initramfs::Modules;

fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{tool} is missing: apt-get install {package}");
}

/// The cached kernel's root and version.
fn kernel() -> (PathBuf, String) {
    let dir = match std::env::var_os("BC_NETBOOT_CACHE") {
        Some(d) => PathBuf::from(d).join("kernel"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/netboot-cache/kernel"),
    };
    let modules = dir.join("lib/modules");
    let kver = std::fs::read_dir(&modules)
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned());
    let Some(kver) = kver else {
        panic!(
            "the netboot kernel cache is missing ({}): run scripts/fetch-kernel",
            modules.display()
        );
    };
    (dir, kver)
}

/// A modalias that `pattern` matches: each `*` filled with a short run,
/// each `?` with a character, brackets with their first member.
fn instance(pattern: &str, seed: usize) -> String {
    let fills = ["", "0", "X1", "00001AF4", "ab-c"];
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    let mut n = seed;
    while let Some(c) = chars.next() {
        match c {
            '*' => {
                out.push_str(fills[n % fills.len()]);
                n = n / fills.len() + 7;
            }
            '?' => out.push('Q'),
            '[' => {
                let mut first = None;
                for c in chars.by_ref() {
                    if c == ']' && first.is_some() {
                        break;
                    }
                    if first.is_none() && c != '!' && c != '^' {
                        first = Some(c);
                    }
                }
                out.push(first.unwrap_or('['));
            }
            '\\' => out.extend(chars.next()),
            c => out.push(c),
        }
    }
    out
}

fn modprobe_resolve(root: &Path, kver: &str, config: &Path, modalias: &str) -> BTreeSet<String> {
    let out = Command::new("modprobe")
        .arg("-C")
        .arg(config)
        .arg("-d")
        .arg(root)
        .args(["-S", kver, "-R", "--", modalias])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn aliases_resolve_as_modprobe_resolves_them() {
    require("modprobe", "kmod");
    let (root, kver) = kernel();
    let aliases = Aliases::open(&root, &kver).unwrap();
    let modules = Modules::open(&root, &kver).unwrap();
    assert!(aliases.len() > 1000, "{} aliases", aliases.len());
    // No modprobe.d: only the kernel's own aliases.
    let config = tempfile::tempdir().unwrap();

    let mut queries: BTreeSet<String> = BTreeSet::new();
    // One instance of every pattern, and a near miss of every tenth.
    for (i, alias) in aliases.iter().enumerate() {
        let hit = instance(&alias.pattern, i);
        if i % 10 == 0 {
            let mut miss = hit.clone();
            miss.push('Z');
            queries.insert(miss);
            queries.insert(hit.replacen('0', "1", 1));
        }
        queries.insert(hit);
    }
    // The devices of the golden machines and of this one.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for machine in ["vm-virtio", "vm-vmxnet3", "gpu-node"] {
        for d in sysfs::devices(&data.join(machine).join("sys")).unwrap() {
            queries.insert(d.modalias);
        }
    }
    for d in sysfs::devices(Path::new("/sys")).unwrap_or_default() {
        queries.insert(d.modalias);
    }
    queries.insert("platform:intel-spi".into());

    let mut compared = 0;
    let mut matched = 0;
    let mut builtin = 0;
    for q in &queries {
        // modprobe takes a module's own name before any alias; a modalias
        // is never one (it names its bus first: `pci:`, `acpi:`).
        if modules.path_of(q).is_some() {
            continue;
        }
        let ours: BTreeSet<String> = aliases
            .modules_for(q)
            .into_iter()
            .map(str::to_owned)
            .collect();
        let theirs = modprobe_resolve(&root, &kver, config.path(), q);
        compared += 1;
        if ours.is_empty() && !theirs.is_empty() && theirs.iter().all(|m| modules.is_builtin(m)) {
            // Only a built-in driver's alias (modules.builtin.alias.bin,
            // which modprobe reads after modules.alias) matches: nothing to
            // load either way.
            builtin += 1;
            continue;
        }
        assert_eq!(ours, theirs, "modalias {q:?}");
        matched += usize::from(!ours.is_empty());
    }
    eprintln!(
        "{compared} modaliases compared with modprobe -R: {matched} match loadable modules, \
         {builtin} only built-in ones"
    );
    assert!(matched * 2 > compared, "most queries must match something");
}

/// A small C program around glibc's fnmatch: reads `pattern\ttext` lines,
/// prints 1 for a match and 0 otherwise.
const FNMATCH_C: &str = r#"
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        if (!tab) return 2;
        *tab = 0;
        printf("%d\n", fnmatch(line, tab + 1, 0) == 0);
    }
    return 0;
}
"#;

/// A deterministic generator, so that a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize
    }

    fn string(&mut self, alphabet: &[&str], max: usize) -> String {
        let len = self.next() % (max + 1);
        (0..len)
            .map(|_| alphabet[self.next() % alphabet.len()])
            .collect()
    }
}

#[test]
fn wildcards_match_as_glibc_fnmatch() {
    require("cc", "gcc");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fnmatch.c");
    let bin = dir.path().join("fnmatch");
    std::fs::write(&src, FNMATCH_C).unwrap();
    let status = Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap();
    assert!(status.success(), "cc failed to build the fnmatch oracle");

    let pattern_alphabet = [
        "a",
        "b",
        "-",
        "_",
        ":",
        "*",
        "*",
        "?",
        "[",
        "]",
        "!",
        "^",
        "\\",
        "[a-b]",
        "[!a]",
        "[]a]",
        "[[:alpha:]]",
        "[[:digit:]-]",
        "[:",
        "0",
        "9",
        "[^-]",
        "[a-]",
        "[0-9]",
    ];
    let text_alphabet = [
        "a", "b", "-", "_", ":", "[", "]", "!", "^", "\\", "0", "9", "*", "?",
    ];
    let mut rng = Lcg(0x5eed_f0dd_ba11_0001);
    // Odd bracket forms, each checked as written.
    let mut pairs: Vec<(String, String)> = [
        ("[a[:bogus:]]", "a"),
        ("[a[:bogus:]]", "b"),
        ("[!a[:bogus:]]", "a"),
        ("[[:*]", "*"),
        ("[[:*]", "["),
        ("[[:alpha:]", "a"),
        ("[[:zeta:]]", "z"),
        ("[[:ALPHA:]]", "A"),
        ("[z-a]", "m"),
        ("[\\]", "\\"),
        ("\\", "\\"),
        ("[!]", "!"),
    ]
    .iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect();
    for _ in 0..20_000 {
        let pattern = rng.string(&pattern_alphabet, 8);
        let text = rng.string(&text_alphabet, 10);
        pairs.push((pattern, text));
    }
    let mut child = Command::new(&bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = String::new();
    for (p, t) in &pairs {
        input.push_str(&format!("{p}\t{t}\n"));
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success());
    let answers: Vec<bool> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l == "1")
        .collect();
    assert_eq!(answers.len(), pairs.len());
    let mut matches = 0;
    for ((p, t), want) in pairs.iter().zip(answers) {
        assert_eq!(fnmatch(p, t), want, "fnmatch({p:?}, {t:?})");
        matches += usize::from(want);
    }
    assert!(
        matches > 500,
        "only {matches} of the pairs matched: a weak check"
    );
}
