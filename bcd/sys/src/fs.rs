//! Durable file writes.
//!
//! Every file that must survive a crash is written the same way: a
//! temporary file in the same directory, fsynced, renamed over the target,
//! then the directory fsynced. A crash at any point leaves either the old
//! file or the new one, never a half-written one, and once the call returns
//! the new one survives a power cut.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The suffix of the temporary file beside a target while it is written.
pub const TMP_SUFFIX: &str = ".tmp-bcd";

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create the directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Writes `bytes` to `path` atomically and durably, with `mode` (applied
/// to a new file; the rename replaces the old one with it).
pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    write_through(path, "", bytes, mode)
}

/// As [`atomic_write`], for a file two writers in this process may write
/// at once: a daemon's write still running on the blocking pool after its
/// task was dropped, and the daemon started in its place. Each writes a
/// temporary file of its own, so neither fails for the other and whichever
/// rename comes last leaves a whole file.
pub fn atomic_write_shared(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let tag = format!(
        ".{}-{}",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    );
    write_through(path, &tag, bytes, mode)
}

/// Writes `<path><tag>.tmp-bcd`, fsyncs it, renames it over `path` and
/// fsyncs the directory.
fn write_through(path: &Path, tag: &str, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    let err = |source| FsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| err(io::Error::other("no file name")))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(tag);
    tmp_name.push(TMP_SUFFIX);
    let tmp = dir.join(tmp_name);
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        err(e)
    })
}

/// Writes `bytes` durably unless the file already holds exactly them,
/// creating its directory if needed; says whether it wrote. A pass that
/// finds everything in place touches nothing.
pub fn write_if_changed(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, FsError> {
    if fs::read(path).is_ok_and(|b| b == bytes) {
        return Ok(false);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|source| FsError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    atomic_write(path, bytes, mode)?;
    Ok(true)
}

/// Removes a file; says whether there was one.
pub fn remove_if_present(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(FsError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// fsyncs a directory, so a rename or a new entry in it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes the temporary files interrupted writes left in `dir`.
pub fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// `<path>.<tag>-<stamp>`: the name a file is moved aside to (never
/// deleted), e.g. `journal.db.reset-20261129T101500Z`.
pub fn aside_name(path: &Path, tag: &str, stamp: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{tag}-{stamp}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        atomic_write(&p, b"one", 0o600).unwrap();
        atomic_write(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn failed_write_leaves_the_old_file_and_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        atomic_write(&p, b"old", 0o644).unwrap();
        // A non-empty directory in the way of the rename makes it fail.
        let blocked = d.path().join("sub");
        fs::create_dir(&blocked).unwrap();
        fs::create_dir(blocked.join("x")).unwrap();
        let e = atomic_write(&blocked, b"new", 0o644).unwrap_err();
        assert!(e.to_string().contains("cannot write"), "{e}");
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert!(!d.path().join(format!("sub{TMP_SUFFIX}")).exists());
        // A crash leaves a temp file behind: it is cleaned up.
        fs::write(d.path().join(format!("g{TMP_SUFFIX}")), b"half").unwrap();
        remove_stale_temps(d.path());
        assert!(!d.path().join(format!("g{TMP_SUFFIX}")).exists());
        assert!(p.exists());
    }

    #[test]
    fn shared_writes_at_once_each_land_whole() {
        // Eight writers of one file at once: every write succeeds, the
        // file is always one writer's whole content, no temp is left.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("identity.json");
        let contents: Vec<Vec<u8>> = (0..8u8)
            .map(|i| vec![b'a' + i; 4096 * (1 + i as usize)])
            .collect();
        std::thread::scope(|s| {
            let (p, all) = (&p, &contents);
            for c in all {
                s.spawn(move || {
                    for _ in 0..50 {
                        atomic_write_shared(p, c, 0o600).unwrap();
                        let now = fs::read(p).unwrap();
                        assert!(all.contains(&now), "a torn file of {} bytes", now.len());
                    }
                });
            }
        });
        assert_eq!(
            fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn write_if_changed_writes_once_and_creates_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b/f");
        assert!(write_if_changed(&p, b"x", 0o644).unwrap());
        let ino = fs::metadata(&p).unwrap().ino();
        assert!(!write_if_changed(&p, b"x", 0o644).unwrap());
        assert_eq!(fs::metadata(&p).unwrap().ino(), ino, "untouched");
        assert!(write_if_changed(&p, b"y", 0o644).unwrap());
        assert!(remove_if_present(&p).unwrap());
        assert!(!remove_if_present(&p).unwrap());
    }

    #[test]
    fn aside_names_keep_the_original_name_first() {
        assert_eq!(
            aside_name(Path::new("/d/journal.db"), "reset", "20261129T101500Z"),
            Path::new("/d/journal.db.reset-20261129T101500Z")
        );
    }
}
