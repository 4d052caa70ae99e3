//! Durable file writes and the data directory lock.
//!
//! Every file bcd keeps is written the same way: a temporary file in the same
//! directory, fsynced, renamed over the target, then the directory fsynced.
//! A crash at any point leaves either the old file or the new one, never a
//! half-written one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "another bcd process{holder} holds {path}: stop it first, or give this one another \
         --data-dir"
    )]
    Locked { path: PathBuf, holder: String },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

const TMP_SUFFIX: &str = ".tmp-bcd";

/// Writes `bytes` to `path` atomically with the given mode.
pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    let err = |source| FsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| err(io::Error::other("no file name")))?;
    let mut tmp_name = name.to_os_string();
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

pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes temporary files a crash left behind in `dir`.
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

/// An exclusive lock on a data directory, held for the life of the value.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<DirLock, FsError> {
        let path = dir.join("bcd.lock");
        let lock_err = |source| FsError::Lock {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(lock_err)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let holder = fs::read_to_string(&path)
                    .ok()
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .map(|pid| format!(" (pid {pid})"))
                    .unwrap_or_default();
                return Err(FsError::Locked { path, holder });
            }
            Err(e) => return Err(lock_err(e.into())),
        }
        file.set_len(0).map_err(lock_err)?;
        write!(file, "{}", std::process::id()).map_err(lock_err)?;
        Ok(DirLock { _file: file })
    }
}

/// `<path>.<tag>-<UTC time>`, the name a file is moved aside to.
pub fn aside_name(path: &Path, tag: &str, utc: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{tag}-{utc}"));
    PathBuf::from(name)
}

/// The wall clock in Unix milliseconds (for records and reports, never for
/// protocol decisions, which run on the server's time).
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
    fn failed_write_leaves_the_old_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        atomic_write(&p, b"old", 0o644).unwrap();
        // A directory in the way of the rename makes the write fail.
        let blocked = d.path().join("sub");
        fs::create_dir(&blocked).unwrap();
        fs::create_dir(blocked.join("x")).unwrap();
        assert!(atomic_write(&blocked, b"new", 0o644).is_err());
        assert_eq!(fs::read(&p).unwrap(), b"old");
        remove_stale_temps(d.path());
        assert!(!d.path().join(format!("sub{TMP_SUFFIX}")).exists());
    }

    #[test]
    fn second_lock_on_a_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(d.path()).unwrap();
        let err = DirLock::acquire(d.path()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("another bcd process"), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(first);
        DirLock::acquire(d.path()).unwrap();
    }
}
