//! The data directory lock: one bcd process per data directory.
//!
//! `bcd.lock` is held with `flock` for the life of the process that uses the
//! directory (and holds its PID, for the message a second process prints).

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
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

/// An exclusive lock on a data directory, held for the life of the value.
#[derive(Debug)]
pub struct DirLock {
    _file: fs::File,
}

impl DirLock {
    pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
        let path = dir.join("bcd.lock");
        let lock_err = |source| LockError::Lock {
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
                return Err(LockError::Locked { path, holder });
            }
            Err(e) => return Err(lock_err(e.into())),
        }
        file.set_len(0).map_err(lock_err)?;
        write!(file, "{}", std::process::id()).map_err(lock_err)?;
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
