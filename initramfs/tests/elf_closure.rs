//! ELF closures of real programs on this machine, of a copy of them in a
//! sysroot, and of programs built here with RPATH and RUNPATH; the loader
//! itself is the oracle where it can run.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use initramfs::elf::{self, Closure, ElfError};
use initramfs::{Archive, HostFile, Node, add_program, read};

const LD_SO: &str = "/lib64/ld-linux-x86-64.so.2";

fn paths(closure: &Closure) -> Vec<&Path> {
    closure.files.iter().map(HostFile::path).collect()
}

#[test]
fn closure_of_ls_holds_the_loader_and_libc() {
    let closure = elf::closure(Path::new("/"), Path::new("/usr/bin/ls")).unwrap();
    assert_eq!(closure.interpreter.as_deref(), Some(Path::new(LD_SO)));
    let libc = &closure.libraries["libc.so.6"];
    assert!(libc.ends_with("libc.so.6"), "{libc:?}");
    let files = paths(&closure);
    assert!(files.contains(&Path::new(LD_SO)), "{files:?}");
    assert!(files.contains(&libc.as_path()), "{files:?}");
    // Every symlink's target is in the closure too, ending in regular files.
    for file in &closure.files {
        if let HostFile::Symlink { path, target } = file {
            let resolved = path.parent().unwrap().join(target);
            let resolved = normalize(&resolved);
            assert!(
                files.contains(&resolved.as_path()),
                "{path:?} -> {target:?}"
            );
        }
    }
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(p) => out.push(p),
            _ => {}
        }
    }
    out
}

#[test]
fn a_static_program_has_an_empty_closure() {
    // Debian builds ldconfig as a static PIE.
    let closure = elf::closure(Path::new("/"), Path::new("/usr/sbin/ldconfig")).unwrap();
    assert!(closure.is_empty(), "{closure:?}");
    assert_eq!(closure.interpreter, None);
    assert!(closure.libraries.is_empty());
}

#[test]
fn a_script_is_not_an_elf_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("script"), "#!/bin/sh\n").unwrap();
    let err = elf::closure(dir.path(), Path::new("/script")).unwrap_err();
    assert!(matches!(err, ElfError::NotElf { .. }), "{err}");
    assert!(err.to_string().contains("add its interpreter as a program"));
}

/// Extracts `archive` with GNU cpio into a new directory.
fn unpack(archive: &Archive) -> tempfile::TempDir {
    common::require("cpio", "cpio");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("cpio")
        .args(["-id", "--quiet", "--no-absolute-filenames"])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &archive.to_bytes()).unwrap();
    assert!(child.wait().unwrap().success());
    dir
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout == b"0\n")
}

#[test]
fn sh_with_its_closure_runs_from_the_unpacked_archive() {
    let mut archive = Archive::new();
    let closure = add_program(&mut archive, Path::new("/"), Path::new("/bin/sh")).unwrap();
    assert!(closure.libraries.contains_key("libc.so.6"));
    // /bin/sh is a symlink to dash on Debian: both are in the archive.
    assert!(matches!(archive.get("bin/sh"), Some((_, Node::Symlink(_)))));
    assert!(matches!(
        archive.get("lib64/ld-linux-x86-64.so.2"),
        Some((_, Node::Symlink(_)))
    ));
    // Directory symlinks of the host (/lib -> usr/lib) are real directories.
    assert_eq!(archive.get("lib").map(|(_, node)| node), Some(&Node::Dir));
    let entries = read(&archive.to_bytes()).unwrap();
    assert!(entries.iter().any(|e| e.path.ends_with("libc.so.6")));

    let dir = unpack(&archive);
    let root = dir.path();
    // The unpacked tree runs the shell with nothing from the host: in a
    // chroot when we may, else through its own loader with its own libraries.
    let output = if is_root() {
        Command::new("chroot")
            .arg(root)
            .args(["/bin/sh", "-c", "echo closure-ok"])
            .output()
            .unwrap()
    } else {
        Command::new(root.join("lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"))
            .arg("--inhibit-cache")
            .arg("--library-path")
            .arg(root.join("lib/x86_64-linux-gnu"))
            .arg(root.join("bin/sh"))
            .args(["-c", "echo closure-ok"])
            .output()
            .unwrap()
    };
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(output.stdout, b"closure-ok\n");
}

/// Copies a host file into the sysroot at `to`.
fn copy(root: &Path, from: &str, to: &str) {
    let dest = root.join(to.trim_start_matches('/'));
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    fs::copy(from, dest).unwrap();
}

/// A merged-/usr sysroot holding ls and its libraries, with absolute
/// symlinks that would leave the root if followed on the host, a versioned
/// libc behind a symlink and libselinux found through ld.so.conf.d.
fn sysroot() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let gnu = "/usr/lib/x86_64-linux-gnu";
    copy(root, "/usr/bin/ls", "/usr/bin/ls");
    copy(
        root,
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        &format!("{gnu}/ld-linux-x86-64.so.2"),
    );
    copy(
        root,
        "/lib/x86_64-linux-gnu/libc.so.6",
        &format!("{gnu}/libc-2.36.so"),
    );
    symlink(
        "libc-2.36.so",
        root.join("usr/lib/x86_64-linux-gnu/libc.so.6"),
    )
    .unwrap();
    copy(
        root,
        "/lib/x86_64-linux-gnu/libpcre2-8.so.0",
        &format!("{gnu}/libpcre2-8.so.0"),
    );
    copy(
        root,
        "/lib/x86_64-linux-gnu/libselinux.so.1",
        "/opt/selinux/lib/libselinux.so.1",
    );
    fs::create_dir_all(root.join("usr/lib64")).unwrap();
    symlink("usr/bin", root.join("bin")).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    symlink("usr/lib64", root.join("lib64")).unwrap();
    symlink(
        "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        root.join("usr/lib64/ld-linux-x86-64.so.2"),
    )
    .unwrap();
    fs::create_dir_all(root.join("etc/ld.so.conf.d")).unwrap();
    fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    fs::write(
        root.join("etc/ld.so.conf.d/selinux.conf"),
        "/opt/selinux/lib\n",
    )
    .unwrap();
    dir
}

#[test]
fn closure_in_a_sysroot_stays_inside_it() {
    let dir = sysroot();
    let root = dir.path();
    let closure = elf::closure(root, Path::new("/bin/ls")).unwrap();
    assert_eq!(closure.interpreter.as_deref(), Some(Path::new(LD_SO)));
    assert_eq!(
        closure.libraries,
        [
            (
                "ld-linux-x86-64.so.2",
                "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
            ),
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            ("libpcre2-8.so.0", "/lib/x86_64-linux-gnu/libpcre2-8.so.0"),
            ("libselinux.so.1", "/opt/selinux/lib/libselinux.so.1"),
        ]
        .into_iter()
        .map(|(name, path)| (name.to_owned(), PathBuf::from(path)))
        .collect()
    );
    for file in &closure.files {
        if let HostFile::Regular { source, .. } = file {
            assert!(
                source.starts_with(root),
                "{source:?} is outside the sysroot"
            );
        }
    }
    assert!(closure.files.contains(&HostFile::Symlink {
        path: "/lib/x86_64-linux-gnu/libc.so.6".into(),
        target: "libc-2.36.so".into(),
    }));
    assert!(closure.files.contains(&HostFile::Symlink {
        path: LD_SO.into(),
        target: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2".into(),
    }));
    assert!(paths(&closure).contains(&Path::new("/lib/x86_64-linux-gnu/libc-2.36.so")));

    let mut archive = Archive::new();
    add_program(&mut archive, root, Path::new("/bin/ls")).unwrap();
    assert!(matches!(archive.get("bin/ls"), Some((_, Node::File(_)))));
    assert!(matches!(
        archive.get("opt/selinux/lib/libselinux.so.1"),
        Some((_, Node::File(_)))
    ));
}

#[test]
fn a_missing_library_is_named_with_what_needs_it() {
    let dir = sysroot();
    let root = dir.path();
    fs::remove_file(root.join("usr/lib/x86_64-linux-gnu/libpcre2-8.so.0")).unwrap();
    let err = elf::closure(root, Path::new("/usr/bin/ls")).unwrap_err();
    let ElfError::MissingLibrary {
        name, needed_by, ..
    } = &err
    else {
        panic!("{err}");
    };
    assert_eq!(name, "libpcre2-8.so.0");
    assert_eq!(needed_by, Path::new("/opt/selinux/lib/libselinux.so.1"));
    let text = err.to_string();
    assert!(
        text.contains("/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"),
        "{text}"
    );
    assert!(text.contains("install the package that ships it"), "{text}");
}

#[test]
fn a_missing_interpreter_is_named() {
    let dir = sysroot();
    let root = dir.path();
    fs::remove_file(root.join("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")).unwrap();
    let err = elf::closure(root, Path::new("/usr/bin/ls")).unwrap_err();
    assert!(
        matches!(&err, ElfError::MissingInterpreter { interpreter, .. } if interpreter == Path::new(LD_SO)),
        "{err}"
    );
}

/// Builds, under `dir`, libworld and libhello (which needs libworld) in
/// opt/app/lib and two programs in opt/app/bin that need libhello and find
/// it through `$ORIGIN/../lib`: one with DT_RPATH, one with DT_RUNPATH.
fn build_programs(dir: &Path) {
    common::require("cc", "gcc");
    let lib = dir.join("opt/app/lib");
    let bin = dir.join("opt/app/bin");
    fs::create_dir_all(&lib).unwrap();
    fs::create_dir_all(&bin).unwrap();
    fs::write(
        dir.join("world.c"),
        "const char *world(void) { return \"world\"; }\n",
    )
    .unwrap();
    fs::write(
        dir.join("hello.c"),
        "const char *world(void);\nconst char *hello(void) { return world(); }\n",
    )
    .unwrap();
    fs::write(
        dir.join("main.c"),
        "#include <stdio.h>\nconst char *hello(void);\n\
         int main(void) { puts(hello()); return 0; }\n",
    )
    .unwrap();
    let cc = |args: &[&str]| {
        let out = Command::new("cc")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        "opt/app/lib/libworld.so.1",
        "-Wl,-soname,libworld.so.1",
        "world.c",
    ]);
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        "opt/app/lib/libhello.so.1",
        "-Wl,-soname,libhello.so.1",
        "hello.c",
        "opt/app/lib/libworld.so.1",
    ]);
    for (name, tags) in [
        ("app-rpath", "--disable-new-dtags"),
        ("app-runpath", "--enable-new-dtags"),
    ] {
        cc(&[
            "-o",
            &format!("opt/app/bin/{name}"),
            "main.c",
            "opt/app/lib/libhello.so.1",
            &format!("-Wl,{tags},-rpath,$ORIGIN/../lib,-rpath-link,opt/app/lib"),
        ]);
    }
}

#[test]
fn rpath_is_inherited_and_runpath_is_not_as_the_loader_does() {
    let dir = tempfile::tempdir().unwrap();
    build_programs(dir.path());
    let bin = dir.path().join("opt/app/bin");
    let lib = dir.path().join("opt/app/lib");

    // DT_RPATH of the program also serves libhello's need for libworld.
    let run = Command::new(bin.join("app-rpath")).output().unwrap();
    assert_eq!(
        run.stdout,
        b"world\n",
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let closure = elf::closure(Path::new("/"), &bin.join("app-rpath")).unwrap();
    assert_eq!(
        closure.libraries["libhello.so.1"],
        lib.join("libhello.so.1")
    );
    assert_eq!(
        closure.libraries["libworld.so.1"],
        lib.join("libworld.so.1")
    );
    assert!(closure.libraries.contains_key("libc.so.6"));

    // DT_RUNPATH serves only the program's own needs: the loader fails, so
    // must the closure, naming libworld and libhello.
    let run = Command::new(bin.join("app-runpath")).output().unwrap();
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("libworld.so.1"));
    let err = elf::closure(Path::new("/"), &bin.join("app-runpath")).unwrap_err();
    assert!(
        matches!(&err, ElfError::MissingLibrary { name, needed_by, .. }
            if name == "libworld.so.1" && needed_by == &lib.join("libhello.so.1")),
        "{err}"
    );

    // Through a symlink to the program, $ORIGIN is still its real directory.
    let link = dir.path().join("app-link");
    symlink(bin.join("app-rpath"), &link).unwrap();
    let closure = elf::closure(Path::new("/"), &link).unwrap();
    assert_eq!(
        closure.libraries["libhello.so.1"],
        lib.join("libhello.so.1")
    );
}
