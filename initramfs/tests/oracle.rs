//! External oracles for the format: GNU cpio lists and unpacks what we
//! write, gzip and zstd unpack what we compress, and golden files pin the
//! exact bytes.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use initramfs::{Archive, Compression, Node, Reader, read, reader};

fn run_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the tool");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn gnu_cpio_lists_every_entry_in_our_order() {
    common::require("cpio", "cpio");
    let archive = common::sample();
    let out = run_with_stdin(
        Command::new("cpio").args(["-t", "--quiet"]),
        &archive.to_bytes(),
    );
    let listed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let ours: Vec<String> = archive.entries().map(|(p, _, _)| p.to_owned()).collect();
    assert_eq!(listed, ours);

    // The verbose listing shows device numbers, owners and modes.
    let out = run_with_stdin(
        Command::new("cpio").args(["-tv", "--quiet", "--numeric-uid-gid"]),
        &archive.to_bytes(),
    );
    let verbose = String::from_utf8(out.stdout).unwrap();
    let line = |name: &str| {
        verbose
            .lines()
            .find(|line| line.ends_with(name))
            .unwrap_or_else(|| panic!("{name} not in {verbose}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let console = line(" dev/console");
    assert_eq!(console[0], "crw-------");
    assert_eq!(&console[2..6], ["0", "0", "5,", "1"]);
    assert_eq!(line(" dev/vda")[0], "brw-rw----");
    assert_eq!(line(" run/fifo")[0], "prw-------");
    assert_eq!(line(" tmp")[0], "drwxrwxrwt");
    assert_eq!(line(" usr/bin/suid")[0], "-rwsr-xr-x");
    let init = verbose.lines().find(|l| l.contains(" init -> ")).unwrap();
    assert!(init.starts_with("lrwxrwxrwx"), "{init}");
    assert!(init.ends_with(" init -> bin/bcd"), "{init}");
}

#[test]
fn gnu_cpio_unpacks_files_modes_and_symlinks() {
    common::require("cpio", "cpio");
    let mut archive = Archive::with_mtime(1_000_000_000);
    archive
        .file("bin/bcd", 0o755, b"#!/bin/sh\necho bcd\n".to_vec())
        .unwrap();
    archive.symlink("init", "bin/bcd").unwrap();
    archive.symlink("lib64/ld.so", "/lib/ld.so").unwrap();
    archive
        .file("etc/bcd/node.toml", 0o600, b"gateway = 1\n".to_vec())
        .unwrap();
    archive.file("etc/empty", 0o644, Vec::new()).unwrap();
    archive.dir("var/empty", 0o700).unwrap();
    archive.file("odd/3", 0o640, b"abc".to_vec()).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let out = run_with_stdin(
        Command::new("cpio")
            .args([
                "-idv",
                "--no-absolute-filenames",
                "--preserve-modification-time",
            ])
            .current_dir(dir.path()),
        &archive.to_bytes(),
    );
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("warning"), "{log}");

    let root = dir.path();
    let mode = |p: &str| {
        fs::symlink_metadata(root.join(p))
            .unwrap()
            .permissions()
            .mode()
    };
    assert_eq!(
        fs::read(root.join("bin/bcd")).unwrap(),
        b"#!/bin/sh\necho bcd\n"
    );
    assert_eq!(mode("bin/bcd"), 0o100_755);
    assert_eq!(
        fs::read(root.join("etc/bcd/node.toml")).unwrap(),
        b"gateway = 1\n"
    );
    assert_eq!(mode("etc/bcd/node.toml"), 0o100_600);
    assert_eq!(fs::read(root.join("etc/empty")).unwrap(), b"");
    assert_eq!(fs::read(root.join("odd/3")).unwrap(), b"abc");
    assert_eq!(mode("odd/3"), 0o100_640);
    assert_eq!(mode("var/empty"), 0o040_700);
    assert_eq!(
        fs::read_link(root.join("init")).unwrap(),
        Path::new("bin/bcd")
    );
    assert_eq!(
        fs::read_link(root.join("lib64/ld.so")).unwrap(),
        Path::new("/lib/ld.so")
    );
    assert_eq!(
        fs::read(root.join("init")).unwrap(),
        b"#!/bin/sh\necho bcd\n"
    );
    let mtime = fs::metadata(root.join("bin/bcd")).unwrap().mtime();
    assert_eq!(mtime, 1_000_000_000);
}

#[test]
fn gnu_cpio_output_reads_back_with_our_reader() {
    common::require("cpio", "cpio");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::write(root.join("bin/tool"), b"tool").unwrap();
    fs::set_permissions(root.join("bin/tool"), fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("tool", root.join("bin/alias")).unwrap();
    for (format, magic) in [("newc", "070701"), ("crc", "070702")] {
        let out = run_with_stdin(
            Command::new("cpio")
                .args(["-o", "--quiet", "-H", format])
                .current_dir(root),
            b"bin\nbin/tool\nbin/alias\n",
        );
        assert!(out.stdout.starts_with(magic.as_bytes()));
        let entries = read(&out.stdout).unwrap();
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["bin", "bin/tool", "bin/alias"], "{format}");
        assert_eq!(entries[1].node, Node::File(b"tool".to_vec()));
        assert_eq!(entries[1].perm, 0o750);
        assert_eq!(entries[2].node, Node::Symlink("tool".into()));
    }
}

#[test]
fn gzip_and_zstd_unpack_our_compressed_archives() {
    let archive = common::sample();
    let plain = archive.to_bytes();
    for (compression, tool, package) in [
        (Compression::Gzip, "gzip", "gzip"),
        (Compression::Zstd, "zstd", "zstd"),
    ] {
        common::require(tool, package);
        let packed = archive.to_compressed(compression).unwrap();
        let out = run_with_stdin(Command::new(tool).args(["-d", "-c"]), &packed);
        assert_eq!(out.stdout, plain, "{tool}");
        // Our reader detects the compression and reads the same entries.
        let segments = Reader::new().read_segments(&packed).unwrap();
        assert_eq!(segments.len(), 1);
        assert_eq!(segments[0].compression, compression);
        assert_eq!(segments[0].entries, read(&plain).unwrap());
        // The tool's own integrity check passes.
        run_with_stdin(Command::new(tool).args(["-t"]), &packed);
    }
}

#[test]
fn compressed_output_made_by_the_tools_reads_back() {
    let plain = common::sample().to_bytes();
    for (tool, package) in [("gzip", "gzip"), ("zstd", "zstd")] {
        common::require(tool, package);
        let out = run_with_stdin(Command::new(tool).args(["-c", "-9"]), &plain);
        let mut image = out.stdout;
        // Another segment after the compressed one, as the kernel allows.
        image.resize(image.len().next_multiple_of(4), 0);
        let mut extra = Archive::new();
        extra.file("etc/extra", 0o644, b"x".to_vec()).unwrap();
        image.extend(extra.to_bytes());
        let entries = read(&image).unwrap();
        assert_eq!(entries.last().unwrap().path, "etc/extra", "{tool}");
        assert_eq!(entries.len(), read(&plain).unwrap().len() + 2);
    }
}

#[test]
fn golden_bytes_and_listing() {
    let archive = common::sample();
    let bytes = archive.to_bytes();
    let listing = reader::listing(&read(&bytes).unwrap());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fs::write(dir.join("sample.cpio"), &bytes).unwrap();
        fs::write(dir.join("sample.listing"), &listing).unwrap();
    }
    let golden = fs::read(dir.join("sample.cpio")).unwrap();
    assert!(
        golden == bytes,
        "the encoding changed; if that is intended, rerun with UPDATE_GOLDEN=1 and review \
         the diff of tests/testdata"
    );
    assert_eq!(
        fs::read_to_string(dir.join("sample.listing")).unwrap(),
        listing
    );
}
