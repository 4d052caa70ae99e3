//! The node's journal: an SQLite database in the data directory, opened with
//! WAL and `synchronous=FULL` so that what it records is on disk before bcd
//! acts on it.
//!
//! Each journal has a `journal_id`, sent in every Hello: a new id tells the
//! server the node lost what it had journaled (a ramdisk reboot, a reinstall,
//! corruption). A journal file that does not open as a database is moved
//! aside as `journal.db.corrupt-<unix time>`, never deleted, and a new one is
//! started.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension};

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("cannot open the journal {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot move the corrupt journal {path} aside")]
    MoveAside {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug)]
pub struct Journal {
    conn: Connection,
    journal_id: String,
    path: PathBuf,
}

/// What opening found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    Existing,
    /// No journal file was there.
    New,
    /// The file was not a usable database and was moved to this path.
    Recreated {
        corrupt: PathBuf,
    },
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
";

impl Journal {
    pub fn open(path: &Path) -> Result<(Journal, Opened), JournalError> {
        let existed = path.exists();
        match Self::try_open(path) {
            Ok(j) => Ok((
                j,
                if existed {
                    Opened::Existing
                } else {
                    Opened::New
                },
            )),
            Err(e) if existed && is_corruption(&e) => {
                let unix = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let mut aside = path.as_os_str().to_os_string();
                aside.push(format!(".corrupt-{unix}"));
                let aside = PathBuf::from(aside);
                std::fs::rename(path, &aside).map_err(|source| JournalError::MoveAside {
                    path: path.to_path_buf(),
                    source,
                })?;
                for ext in ["-wal", "-shm"] {
                    let mut side = path.as_os_str().to_os_string();
                    side.push(ext);
                    let side = PathBuf::from(side);
                    if side.exists() {
                        let mut to = aside.as_os_str().to_os_string();
                        to.push(ext);
                        let _ = std::fs::rename(&side, PathBuf::from(to));
                    }
                }
                tracing::warn!(path = %path.display(), aside = %aside.display(), error = %e,
                    "journal did not open; moved it aside and started a new one");
                let j = Self::try_open(path).map_err(|source| JournalError::Open {
                    path: path.to_path_buf(),
                    source,
                })?;
                Ok((j, Opened::Recreated { corrupt: aside }))
            }
            Err(source) => Err(JournalError::Open {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    fn try_open(path: &Path) -> rusqlite::Result<Journal> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "cache_size", -256)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        let existing: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = 'journal_id'", [], |r| {
                r.get(0)
            })
            .optional()?;
        let journal_id = match existing {
            Some(id) => id,
            None => {
                let id = new_id();
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('journal_id', ?1)",
                    [&id],
                )?;
                id
            }
        };
        Ok(Journal {
            conn,
            journal_id,
            path: path.to_path_buf(),
        })
    }

    pub fn journal_id(&self) -> &str {
        &self.journal_id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }
}

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

/// A random 128-bit id as hex.
pub fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_id_is_stable_across_opens() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("journal.db");
        let (j, o) = Journal::open(&p).unwrap();
        assert_eq!(o, Opened::New);
        let id = j.journal_id().to_string();
        drop(j);
        let (j, o) = Journal::open(&p).unwrap();
        assert_eq!(o, Opened::Existing);
        assert_eq!(j.journal_id(), id);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_moved_aside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("journal.db");
        std::fs::write(&p, vec![0x5a; 8192]).unwrap();
        let (j, o) = Journal::open(&p).unwrap();
        let Opened::Recreated { corrupt } = o else {
            panic!("expected the journal to be recreated, got {o:?}");
        };
        assert!(
            corrupt
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("journal.db.corrupt-")
        );
        assert_eq!(
            std::fs::read(&corrupt).unwrap(),
            vec![0x5a; 8192],
            "kept as it was"
        );
        assert_eq!(j.journal_id().len(), 32);
    }
}
