//! The node's journal: an SQLite database in the data directory, opened with
//! WAL and `synchronous=FULL` so that what it records is on disk before bcd
//! acts on it.
//!
//! Each journal has a `journal_id`, sent in every Hello: a new id tells the
//! server the node lost what it had journaled (a ramdisk reboot, a reinstall,
//! corruption). A journal file that does not open as a database is moved
//! aside as `journal.db.corrupt-<unix time>`, never deleted, and a new one is
//! started.
//!
//! # Schema versions
//!
//! The schema version is SQLite's `user_version`: 0 for journals written
//! before versions were kept, then one numbered migration per version
//! (`migrations/`), applied in order at open. A journal from a newer bcd
//! is refused ([`JournalError::Newer`]) and left where it is: it is not
//! corrupt, and moving it aside would lose what it holds.
//!
//! # Closed when idle
//!
//! A journal opened with [`JournalOptions::close_idle`] closes its SQLite
//! connection once it has not been used for that long
//! ([`Journal::close_idle`], called by whoever owns it) and opens it again
//! at the next read or write. Closing the last connection checkpoints the
//! WAL into the database file, so nothing journaled is lost or left
//! unsynced; what goes is the connection's memory, its page cache and the
//! mapped WAL index. The reads a session makes after every server message
//! and at every new session are answered from what the journal knows
//! without asking SQLite when they can be (the highest event id, the
//! applied generation, whether any command is unacknowledged), so an idle
//! node's journal stays closed between its minute metrics, and a fleet
//! reconnecting at once does not open every journal together.

use std::cell::{Cell, RefCell, RefMut};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use bcd_core::command::Journaled;
use rusqlite::{Connection, OptionalExtension, params};

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
    #[error(
        "the journal {path} has schema version {version}, written by a newer bcd (this one knows \
         up to {known}): run that release of bcd or a newer one, or move the journal aside to \
         start a new one (the server then fails its in-flight commands as journal-lost)"
    )]
    Newer {
        path: PathBuf,
        version: u32,
        known: u32,
    },
}

/// Why a journal did not open.
#[derive(Debug)]
enum OpenFailure {
    Sqlite(rusqlite::Error),
    /// Its schema is newer than this bcd knows.
    Newer(u32),
}

impl From<rusqlite::Error> for OpenFailure {
    fn from(e: rusqlite::Error) -> Self {
        OpenFailure::Sqlite(e)
    }
}

#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    options: JournalOptions,
    /// None while closed for idleness.
    conn: RefCell<Option<Connection>>,
    /// When the connection was last asked for.
    last_used: Cell<Instant>,
    journal_id: String,
    /// No event in the journal has a higher id (ids only grow).
    last_event: Cell<u64>,
    /// The `applied_generation` meta value, which only this journal writes.
    applied_generation: Cell<u64>,
    /// Commands not acknowledged (what [`Journal::open_entries`] returns).
    unacked: Cell<u64>,
}

/// How much memory an open journal keeps: its SQLite page cache, and
/// whether its connection stays open when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalOptions {
    /// `PRAGMA cache_size`: pages when positive, KiB when negative. Set
    /// first, so no more than it asks for is cached from the start (the
    /// build allocates pages one at a time: `.cargo/config.toml`).
    pub cache_size: i64,
    /// Close the connection after this long unused (see the module's
    /// documentation); None keeps it open.
    pub close_idle: Option<Duration>,
}

impl JournalOptions {
    /// `bcd node`: at most 64 KiB of pages, more than a journal's working
    /// set, and the connection kept open.
    pub const NODE: JournalOptions = JournalOptions {
        cache_size: -64,
        close_idle: None,
    };
    /// One of thousands of journals in one process (`bcd sim`): two
    /// pages, and closed after two idle seconds. A read past the pages is a
    /// `pread` served by the OS page cache; what is written and when it is
    /// synced does not change.
    pub const SMALL: JournalOptions = JournalOptions {
        cache_size: 2,
        close_idle: Some(Duration::from_secs(2)),
    };
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

/// The journal's schema, one migration per version: migration `n` takes a
/// journal at `user_version` `n - 1` to `n`, in one transaction. Append
/// only: a migration that shipped is never edited (its SQL is pinned by
/// `testdata/journal/`).
const MIGRATIONS: &[&str] = &[include_str!("migrations/0001_initial.sql")];

/// Exec tickets spent and not yet forgotten, at most.
pub const MAX_SPENT_TICKETS: i64 = 4096;

/// The schema version this bcd writes (and the newest it opens).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// What kind of event: metrics may be dropped when the journal is full,
/// results and transitions never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventClass {
    Metric,
    Result,
    Transition,
}

impl EventClass {
    fn name(self) -> &'static str {
        match self {
            EventClass::Metric => "metric",
            EventClass::Result => "result",
            EventClass::Transition => "transition",
        }
    }
}

/// Bounds on unacknowledged events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventBounds {
    pub max_bytes: u64,
    pub max_count: u64,
}

impl Default for EventBounds {
    fn default() -> Self {
        EventBounds {
            max_bytes: 64 << 20,
            max_count: 10_000,
        }
    }
}

/// An event waiting for the server's acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub id: u64,
    pub kind: String,
    pub body: Vec<u8>,
    pub created_ms: i64,
}

/// Acknowledged security events kept, waiting for receipts, at most.
#[cfg(not(test))]
const KEEP_SECURITY: i64 = 1_000;
#[cfg(test)]
const KEEP_SECURITY: i64 = 5;

/// The largest event body a gateway stores (`gateway::session`).
const MAX_STORED_BODY: i64 = 64 << 10;

/// Settled results kept for answering late replays; older ones go.
const KEEP_ACKED: i64 = 1000;

/// Results a gateway acknowledged that no receipt settled yet, kept at
/// most (the oldest go past it): bounded only so that a control plane from
/// before receipts does not grow the journal without end. A gateway cannot
/// push one out: it would take this many commands the key holder signed.
#[cfg(not(test))]
const KEEP_UNSETTLED: i64 = 10_000;
#[cfg(test)]
const KEEP_UNSETTLED: i64 = 20;

/// `commands.acked`: not acknowledged.
const UNACKED: i64 = 0;
/// Settled: the key holder's receipt says the store holds the result (or
/// it was acknowledged before receipts existed). A release before
/// receipts reads every non-zero value as acknowledged.
const SETTLED: i64 = 1;
/// A gateway acknowledged it (unsigned): not sent again in the session,
/// kept and sent again in the next until a receipt settles it.
const ACKED_UNSETTLED: i64 = 2;

/// One journaled command, for recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub id: String,
    pub seq: u64,
    pub kind: String,
    pub payload: Vec<u8>,
    pub state: Journaled,
    pub result: Option<Vec<u8>>,
}

fn now_ms() -> i64 {
    bcd_sys::clock::unix_ms()
}

impl Journal {
    pub fn open(path: &Path) -> Result<(Journal, Opened), JournalError> {
        Self::open_with(path, JournalOptions::NODE)
    }

    /// [`Journal::open`] with the memory `options` ask for.
    pub fn open_with(
        path: &Path,
        options: JournalOptions,
    ) -> Result<(Journal, Opened), JournalError> {
        let existed = path.exists();
        let open_err = |e: OpenFailure| match e {
            OpenFailure::Sqlite(source) => JournalError::Open {
                path: path.to_path_buf(),
                source,
            },
            OpenFailure::Newer(version) => JournalError::Newer {
                path: path.to_path_buf(),
                version,
                known: SCHEMA_VERSION,
            },
        };
        match Self::try_open(path, options) {
            Ok(j) => Ok((
                j,
                if existed {
                    Opened::Existing
                } else {
                    Opened::New
                },
            )),
            Err(OpenFailure::Sqlite(e)) if existed && is_corruption(&e) => {
                let unix = bcd_sys::clock::system_now()
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
                let j = Self::try_open(path, options).map_err(open_err)?;
                Ok((j, Opened::Recreated { corrupt: aside }))
            }
            Err(e) => Err(open_err(e)),
        }
    }

    fn try_open(path: &Path, options: JournalOptions) -> Result<Journal, OpenFailure> {
        let mut conn = connect(path, options)?;
        migrate(&mut conn)?;
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
        let last_event: i64 =
            conn.query_row("SELECT COALESCE(MAX(id), 0) FROM events", [], |r| r.get(0))?;
        let applied_generation = read_applied_generation(&conn)?;
        let unacked: i64 =
            conn.query_row("SELECT COUNT(*) FROM commands WHERE acked = 0", [], |r| {
                r.get(0)
            })?;
        Ok(Journal {
            path: path.to_path_buf(),
            options,
            conn: RefCell::new(Some(conn)),
            last_used: Cell::new(bcd_sys::clock::mono()),
            journal_id,
            last_event: Cell::new(last_event as u64),
            applied_generation: Cell::new(applied_generation),
            unacked: Cell::new(unacked as u64),
        })
    }

    /// The connection, opened again if it was closed for idleness.
    fn conn(&self) -> rusqlite::Result<RefMut<'_, Connection>> {
        self.last_used.set(bcd_sys::clock::mono());
        let mut slot = self.conn.borrow_mut();
        if slot.is_none() {
            *slot = Some(connect(&self.path, self.options)?);
        }
        Ok(RefMut::map(slot, |c| c.as_mut().expect("opened above")))
    }

    /// When the connection is due to close for idleness: None when it is
    /// closed or kept open.
    pub fn idle_deadline(&self) -> Option<Instant> {
        let idle = self.options.close_idle?;
        self.conn
            .borrow()
            .is_some()
            .then(|| self.last_used.get() + idle)
    }

    /// Closes the connection if it has been idle for
    /// [`JournalOptions::close_idle`] at `now`; says whether it did. A
    /// connection that does not close (a statement still running) stays
    /// open for the next call.
    pub fn close_idle(&self, now: Instant) -> bool {
        match self.idle_deadline() {
            Some(due) if now >= due => {}
            _ => return false,
        }
        let Some(conn) = self.conn.borrow_mut().take() else {
            return false;
        };
        match conn.close() {
            Ok(()) => true,
            Err((conn, e)) => {
                tracing::debug!(error = %e, "the idle journal did not close; it stays open");
                *self.conn.borrow_mut() = Some(conn);
                false
            }
        }
    }

    /// Whether the connection is open (closed only for idleness).
    #[cfg(test)]
    fn is_open(&self) -> bool {
        self.conn.borrow().is_some()
    }

    pub fn journal_id(&self) -> &str {
        &self.journal_id
    }

    /// The schema version of the open journal, and its schema (for the
    /// golden file and `bcd doctor`).
    pub fn schema(&self) -> rusqlite::Result<(u32, String)> {
        let conn = self.conn()?;
        let version = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        Ok((version, schema_text(&conn)?))
    }

    /// The signed NodeSpec this node enforces, with its generation.
    pub fn spec(&self) -> rusqlite::Result<Option<(u64, Vec<u8>)>> {
        self.conn()?
            .query_row(
                "SELECT generation, signed FROM spec WHERE id = 1",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
            )
            .optional()
    }

    pub fn set_spec(&self, generation: u64, signed: &[u8]) -> rusqlite::Result<()> {
        self.conn()?.execute(
            "INSERT INTO spec (id, generation, signed) VALUES (1, ?1, ?2)
             ON CONFLICT (id) DO UPDATE SET generation = excluded.generation, signed = excluded.signed",
            params![generation as i64, signed],
        )?;
        Ok(())
    }

    /// The highest spec generation applied in full (0: none).
    /// (Read when the journal opened, and kept as it is written.)
    pub fn applied_generation(&self) -> rusqlite::Result<u64> {
        Ok(self.applied_generation.get())
    }

    pub fn set_applied_generation(&self, generation: u64) -> rusqlite::Result<()> {
        self.conn()?.execute(
            "INSERT INTO meta (key, value) VALUES ('applied_generation', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [generation.to_string()],
        )?;
        self.applied_generation.set(generation);
        Ok(())
    }

    /// Spends an exec ticket's `jti`: true when it was not spent before
    /// (it is now, kept until `keep_until_ms`), false when it was. Spent
    /// tickets whose keep time passed `now_ms` are forgotten first; at
    /// most [`MAX_SPENT_TICKETS`] are kept, so a flood of tickets opens
    /// nothing once that many are live (`Err(None)`).
    ///
    /// Kept as `ticket:<jti>` keys of the `meta` table rather than in a
    /// table of their own: a release swapped back to reads this journal
    /// as it is (a newer schema version it would refuse), and it keeps
    /// or ignores keys it does not know.
    pub fn spend_ticket(
        &self,
        jti: &str,
        keep_until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, Option<rusqlite::Error>> {
        let conn = self.conn().map_err(Some)?;
        let tx = conn.unchecked_transaction().map_err(Some)?;
        tx.execute(
            "DELETE FROM meta WHERE key >= 'ticket:' AND key < 'ticket;'
             AND CAST(value AS INTEGER) < ?1",
            [now_ms],
        )
        .map_err(Some)?;
        let live: i64 = tx
            .query_row(
                "SELECT count(*) FROM meta WHERE key >= 'ticket:' AND key < 'ticket;'",
                [],
                |r| r.get(0),
            )
            .map_err(Some)?;
        let added = tx
            .execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![format!("ticket:{jti}"), keep_until_ms.to_string()],
            )
            .map_err(Some)?;
        if added == 1 && live >= MAX_SPENT_TICKETS {
            return Err(None);
        }
        tx.commit().map_err(Some)?;
        Ok(added == 1)
    }

    /// The highest command sequence this journal accepted.
    pub fn highest_seq(&self) -> rusqlite::Result<u64> {
        let v: Option<String> = self
            .conn()?
            .query_row(
                "SELECT value FROM meta WHERE key = 'highest_seq'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
    }

    pub fn command(&self, id: &str) -> rusqlite::Result<Option<Entry>> {
        self.conn()?
            .query_row(
                "SELECT id, seq, kind, payload, state, boot_id, result, acked FROM commands WHERE id = ?1",
                [id],
                read_entry,
            )
            .optional()
    }

    /// Durably records a command as accepted, before anything else happens.
    pub fn accept(&self, id: &str, seq: u64, kind: &str, payload: &[u8]) -> rusqlite::Result<()> {
        let conn = self.conn()?;
        let tx = conn.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO commands (id, seq, kind, payload, state, updated_at)
             VALUES (?1, ?2, ?3, ?4, 'accepted', ?5)",
            params![id, seq as i64, kind, payload, now_ms()],
        )?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('highest_seq', ?1)
             ON CONFLICT (key) DO UPDATE SET value = MAX(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))",
            [seq.to_string()],
        )?;
        tx.commit()?;
        self.unacked.set(self.unacked.get() + 1);
        Ok(())
    }

    /// Durably records that the side effect is about to start.
    pub fn set_running(&self, id: &str, boot_id: &str) -> rusqlite::Result<()> {
        self.conn()?.execute(
            "UPDATE commands SET state = 'running', boot_id = ?2, updated_at = ?3 WHERE id = ?1",
            params![id, boot_id, now_ms()],
        )?;
        Ok(())
    }

    /// Durably records the result (an encoded `CommandResult`).
    pub fn finish(&self, id: &str, result: &[u8]) -> rusqlite::Result<()> {
        self.conn()?.execute(
            "UPDATE commands SET state = 'done', result = ?2, updated_at = ?3 WHERE id = ?1",
            params![id, result, now_ms()],
        )?;
        Ok(())
    }

    /// A gateway says the server has the result: stop sending it in this
    /// session. It is kept, and sent again in the next session, until a
    /// receipt settles it ([`Journal::settle`]).
    pub fn mark_acked(&self, id: &str) -> rusqlite::Result<()> {
        let conn = self.conn()?;
        let tx = conn.unchecked_transaction()?;
        let acked = tx.execute(
            "UPDATE commands SET acked = ?2 WHERE id = ?1 AND state = 'done' AND acked = ?3",
            params![id, ACKED_UNSETTLED, UNACKED],
        )?;
        trim(&tx, ACKED_UNSETTLED, KEEP_UNSETTLED)?;
        tx.commit()?;
        self.unacked
            .set(self.unacked.get().saturating_sub(acked as u64));
        Ok(())
    }

    /// The key holder's receipt says the store holds the result: settled,
    /// kept a while for late replays, then forgotten. False when the
    /// journal holds no finished command `id` to settle.
    pub fn settle(&self, id: &str) -> rusqlite::Result<bool> {
        let conn = self.conn()?;
        let tx = conn.unchecked_transaction()?;
        let was: Option<i64> = tx
            .query_row(
                "SELECT acked FROM commands WHERE id = ?1 AND state = 'done'",
                [id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(was) = was else {
            return Ok(false);
        };
        tx.execute(
            "UPDATE commands SET acked = ?2 WHERE id = ?1",
            params![id, SETTLED],
        )?;
        trim(&tx, SETTLED, KEEP_ACKED)?;
        tx.commit()?;
        if was == UNACKED {
            self.unacked.set(self.unacked.get().saturating_sub(1));
        }
        Ok(true)
    }

    /// Results a gateway acknowledged that no receipt has settled, in
    /// sequence order: sent again at each new session.
    pub fn unsettled_results(&self) -> rusqlite::Result<Vec<Entry>> {
        let conn = self.conn()?;
        let mut q = conn.prepare(
            "SELECT id, seq, kind, payload, state, boot_id, result, acked FROM commands
             WHERE acked = ?1 AND state = 'done' ORDER BY seq",
        )?;
        q.query_map([ACKED_UNSETTLED], read_entry)?.collect()
    }

    /// Journals an event. When the bounds are reached, the oldest metric
    /// events make room; a metric that still does not fit is dropped
    /// (returns false); results and transitions are always kept.
    pub fn push_event(
        &self,
        kind: &str,
        class: EventClass,
        body: &[u8],
        bounds: EventBounds,
    ) -> rusqlite::Result<bool> {
        let conn = self.conn()?;
        let tx = conn.unchecked_transaction()?;
        let (mut count, mut bytes): (u64, u64) = tx.query_row(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM events",
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )?;
        let size = body.len() as u64 + kind.len() as u64;
        while count + 1 > bounds.max_count || bytes + size > bounds.max_bytes {
            let oldest: Option<(i64, i64)> = tx
                .query_row(
                    "SELECT id, size FROM events WHERE class = 'metric' ORDER BY id LIMIT 1",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            match oldest {
                Some((id, sz)) => {
                    tx.execute("DELETE FROM events WHERE id = ?1", [id])?;
                    count -= 1;
                    bytes -= sz as u64;
                }
                None if class == EventClass::Metric => return Ok(false),
                None => break,
            }
        }
        tx.execute(
            "INSERT INTO events (kind, class, body, size, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![kind, class.name(), body, size as i64, now_ms()],
        )?;
        let id = tx.last_insert_rowid() as u64;
        tx.commit()?;
        self.last_event.set(self.last_event.get().max(id));
        Ok(true)
    }

    /// Unacknowledged events after `after`, oldest first.
    pub fn events_after(&self, after: u64, limit: usize) -> rusqlite::Result<Vec<StoredEvent>> {
        // Nothing above the highest id there is: answered without SQLite.
        if after >= self.last_event.get() {
            return Ok(Vec::new());
        }
        let conn = self.conn()?;
        let mut q = conn.prepare_cached(
            "SELECT id, kind, body, created_ms FROM events WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?;
        q.query_map(params![after as i64, limit as i64], |r| {
            Ok(StoredEvent {
                id: r.get::<_, i64>(0)? as u64,
                kind: r.get(1)?,
                body: r.get(2)?,
                created_ms: r.get(3)?,
            })
        })?
        .collect()
    }

    /// The server stored every event up to `up_to`.
    /// A gateway acknowledged events up to `up_to`: they go, but for
    /// security events (kind `security.*`), kept until the key holder's
    /// receipt says the store keeps them where no gateway can delete them
    /// ([`Journal::settle_event`]): the acknowledgement is unsigned, and a
    /// gateway must not erase the node's record of what it forged.
    ///
    /// Security events a gateway acknowledged are kept up to
    /// `KEEP_SECURITY` (the newest; a control plane from before receipts
    /// sends none), and one over the 64 KiB a gateway stores goes with the
    /// acknowledgement (no gateway stores it, so no receipt comes).
    pub fn ack_events(&self, up_to: u64) -> rusqlite::Result<()> {
        let up_to = up_to.min(i64::MAX as u64) as i64;
        let conn = self.conn()?;
        let tx = conn.unchecked_transaction()?;
        tx.execute(
            "DELETE FROM events WHERE id <= ?1
                 AND (kind NOT LIKE 'security.%' OR length(body) > ?2)",
            params![up_to, MAX_STORED_BODY],
        )?;
        tx.execute(
            "DELETE FROM events WHERE id <= ?1 AND kind LIKE 'security.%' AND id NOT IN (
                 SELECT id FROM events WHERE kind LIKE 'security.%'
                 ORDER BY id DESC LIMIT ?2)",
            params![up_to, KEEP_SECURITY],
        )?;
        tx.commit()
    }

    /// The key holder's receipt for security event `id`: it goes when the
    /// journal holds it with this kind and a body of SHA-256
    /// `body_sha256`. `None` when the journal holds no event `id`;
    /// `Some(false)` when it holds another (nothing goes).
    pub fn settle_event(
        &self,
        id: u64,
        kind: &str,
        body_sha256: &str,
    ) -> rusqlite::Result<Option<bool>> {
        let conn = self.conn()?;
        let held: Option<(String, Vec<u8>)> = conn
            .query_row(
                "SELECT kind, body FROM events WHERE id = ?1",
                [id as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((held_kind, body)) = held else {
            return Ok(None);
        };
        if held_kind != kind || bcd_proto::fingerprint(&body) != body_sha256 {
            return Ok(Some(false));
        }
        conn.execute("DELETE FROM events WHERE id = ?1", [id as i64])?;
        Ok(Some(true))
    }

    /// What waits for the server: unacknowledged events and results.
    pub fn backlog(&self) -> rusqlite::Result<(u64, u64)> {
        let conn = self.conn()?;
        let events: i64 = conn.query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))?;
        let results: i64 = conn.query_row(
            "SELECT COUNT(*) FROM commands WHERE state = 'done' AND acked = 0",
            [],
            |r| r.get(0),
        )?;
        Ok((events as u64, results as u64))
    }

    /// Every command not acknowledged, in sequence order.
    pub fn open_entries(&self) -> rusqlite::Result<Vec<Entry>> {
        if self.unacked.get() == 0 {
            return Ok(Vec::new());
        }
        let conn = self.conn()?;
        let mut q = conn.prepare(
            "SELECT id, seq, kind, payload, state, boot_id, result, acked FROM commands
             WHERE acked = 0 ORDER BY seq",
        )?;
        q.query_map([], read_entry)?.collect()
    }
}

/// A connection to the journal at `path` as `options` ask: the page cache
/// bounded first, WAL, every commit synced.
fn connect(path: &Path, options: JournalOptions) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    // First: it bounds the page cache from the first page read.
    conn.pragma_update(None, "cache_size", options.cache_size)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

fn read_applied_generation(conn: &Connection) -> rusqlite::Result<u64> {
    let v: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'applied_generation'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    Ok(v.and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// Brings the schema to [`SCHEMA_VERSION`], one migration per transaction.
fn migrate(conn: &mut Connection) -> Result<(), OpenFailure> {
    let version: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(OpenFailure::Newer(version));
    }
    for (done, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", done as u32 + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// The schema as SQLite holds it, one statement per object in a stable
/// order: what the golden file pins.
pub fn schema_text(conn: &Connection) -> rusqlite::Result<String> {
    let mut q = conn.prepare(
        "SELECT type, name, sql FROM sqlite_master
         WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY type, name",
    )?;
    let rows = q.query_map([], |r| {
        Ok(format!(
            "-- {} {}\n{};\n",
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?
        ))
    })?;
    let mut out = String::new();
    for row in rows {
        out.push_str(&row?);
    }
    Ok(out)
}

/// Keeps the newest `keep` commands whose `acked` is `value`.
fn trim(conn: &Connection, value: i64, keep: i64) -> rusqlite::Result<()> {
    conn.execute(
        "DELETE FROM commands WHERE acked = ?1 AND seq <
             (SELECT seq FROM commands WHERE acked = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
        params![value, keep - 1],
    )?;
    Ok(())
}

fn read_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    let state: String = r.get(4)?;
    let acked = r.get::<_, i64>(7)? != UNACKED;
    Ok(Entry {
        id: r.get(0)?,
        seq: r.get::<_, i64>(1)? as u64,
        kind: r.get(2)?,
        payload: r.get(3)?,
        state: match state.as_str() {
            "accepted" => Journaled::Accepted,
            "running" => Journaled::Running { boot_id: r.get(5)? },
            _ => Journaled::Done { acked },
        },
        result: r.get(6)?,
    })
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
    fn a_spent_ticket_stays_spent_across_a_restart_until_its_keep_time() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("journal.db");
        {
            let (j, _) = Journal::open(&p).unwrap();
            assert_eq!(j.spend_ticket("jti-1", 1_000, 0), Ok(true));
            assert_eq!(j.spend_ticket("jti-1", 1_000, 10), Ok(false));
        }
        let (j, _) = Journal::open(&p).unwrap();
        assert_eq!(
            j.spend_ticket("jti-1", 1_000, 999),
            Ok(false),
            "across a restart"
        );
        // Past its keep time it is forgotten (the ticket itself expired
        // minutes before).
        assert_eq!(j.spend_ticket("jti-1", 3_000, 1_001), Ok(true));
        // At most MAX_SPENT_TICKETS live at once: the next is refused and
        // nothing is recorded for it.
        for i in 1..MAX_SPENT_TICKETS {
            assert_eq!(j.spend_ticket(&format!("f-{i}"), 10_000, 2_000), Ok(true));
        }
        assert!(matches!(
            j.spend_ticket("one-more", 10_000, 2_000),
            Err(None)
        ));
        assert!(matches!(
            j.spend_ticket("one-more", 10_000, 2_000),
            Err(None)
        ));
        assert_eq!(j.spend_ticket("one-more", 20_000, 10_001), Ok(true));
    }

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
    fn command_lifecycle_survives_reopening() {
        for options in [JournalOptions::NODE, JournalOptions::SMALL] {
            command_lifecycle(options);
        }
    }

    #[test]
    fn a_small_cache_changes_the_cache_and_nothing_that_makes_a_write_durable() {
        let d = tempfile::tempdir().unwrap();
        for (name, options) in [
            ("node.db", JournalOptions::NODE),
            ("small.db", JournalOptions::SMALL),
        ] {
            let (j, _) = Journal::open_with(&d.path().join(name), options).unwrap();
            // Again after closing for idleness, where that applies.
            for reopened in [false, true] {
                if reopened {
                    j.close_idle(Instant::now() + Duration::from_secs(3600));
                }
                let conn = j.conn().unwrap();
                let pragma =
                    |p: &str| -> i64 { conn.pragma_query_value(None, p, |r| r.get(0)).unwrap() };
                assert_eq!(pragma("cache_size"), options.cache_size, "{name}");
                assert_eq!(pragma("synchronous"), 2, "{name}: FULL");
                let mode: String = conn
                    .pragma_query_value(None, "journal_mode", |r| r.get(0))
                    .unwrap();
                assert_eq!(mode, "wal", "{name}");
            }
        }
    }

    fn command_lifecycle(options: JournalOptions) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("journal.db");
        let (j, _) = Journal::open_with(&p, options).unwrap();
        j.accept("c1", 1, "exec.run", b"p1").unwrap();
        j.accept("c2", 2, "exec.run", b"p2").unwrap();
        j.set_running("c1", "boot-a").unwrap();
        j.set_running("c2", "boot-a").unwrap();
        j.finish("c2", b"result").unwrap();
        assert!(
            j.accept("c1", 1, "exec.run", b"p1").is_err(),
            "an id is accepted once"
        );
        drop(j);
        let (j, _) = Journal::open_with(&p, options).unwrap();
        assert_eq!(j.highest_seq().unwrap(), 2);
        let e = j.open_entries().unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            e[0].state,
            Journaled::Running {
                boot_id: "boot-a".into()
            }
        );
        assert_eq!(e[1].state, Journaled::Done { acked: false });
        assert_eq!(e[1].result.as_deref(), Some(&b"result"[..]));
        j.mark_acked("c2").unwrap();
        assert_eq!(j.open_entries().unwrap().len(), 1);
        assert_eq!(
            j.command("c2").unwrap().unwrap().state,
            Journaled::Done { acked: true }
        );
        assert_eq!(j.command("nope").unwrap(), None);
    }

    #[test]
    fn full_journal_drops_oldest_metrics_and_never_results_or_transitions() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&d.path().join("journal.db")).unwrap();
        let b = EventBounds {
            max_bytes: 1 << 20,
            max_count: 5,
        };
        for i in 0..3 {
            assert!(
                j.push_event("m", EventClass::Metric, format!("{i}").as_bytes(), b)
                    .unwrap()
            );
        }
        for _ in 0..2 {
            assert!(j.push_event("t", EventClass::Transition, b"x", b).unwrap());
        }
        // Full: a new metric pushes out the oldest metric.
        assert!(j.push_event("m", EventClass::Metric, b"3", b).unwrap());
        let bodies: Vec<Vec<u8>> = j
            .events_after(0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.body)
            .collect();
        assert_eq!(
            bodies,
            vec![
                b"1".to_vec(),
                b"2".to_vec(),
                b"x".to_vec(),
                b"x".to_vec(),
                b"3".to_vec()
            ]
        );
        // Results always get in, at the cost of metrics.
        for _ in 0..3 {
            assert!(j.push_event("r", EventClass::Result, b"r", b).unwrap());
        }
        let classes: Vec<String> = j
            .events_after(0, 100)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(classes, ["t", "t", "r", "r", "r"]);
        // No metric left to drop: a new metric is refused, a result is kept
        // beyond the bound.
        assert!(!j.push_event("m", EventClass::Metric, b"4", b).unwrap());
        assert!(j.push_event("r", EventClass::Result, b"r", b).unwrap());
        assert_eq!(j.events_after(0, 100).unwrap().len(), 6);
        // Bytes bound too.
        let d2 = tempfile::tempdir().unwrap();
        let (j2, _) = Journal::open(&d2.path().join("journal.db")).unwrap();
        let small = EventBounds {
            max_bytes: 10,
            max_count: 100,
        };
        assert!(
            j2.push_event("m", EventClass::Metric, b"12345678", small)
                .unwrap()
        );
        assert!(
            j2.push_event("m", EventClass::Metric, b"abcdefgh", small)
                .unwrap()
        );
        let left = j2.events_after(0, 10).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].body, b"abcdefgh");
        // Acks remove; ids keep growing.
        let last = j.events_after(0, 100).unwrap().last().unwrap().id;
        j.ack_events(last).unwrap();
        assert!(j.events_after(0, 100).unwrap().is_empty());
        j.push_event("t", EventClass::Transition, b"y", b).unwrap();
        assert!(j.events_after(0, 100).unwrap()[0].id > last);
    }

    #[test]
    fn an_acknowledgement_erases_no_security_event_a_receipt_settles_it() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&d.path().join("journal.db")).unwrap();
        let b = EventBounds::default();
        j.push_event("node.load", EventClass::Metric, b"1", b)
            .unwrap();
        j.push_event(
            "security.command.refused",
            EventClass::Transition,
            b"forged",
            b,
        )
        .unwrap();
        j.push_event("command.finished", EventClass::Transition, b"c1", b)
            .unwrap();
        let all = j.events_after(0, 10).unwrap();
        let security = all[1].id;
        // A gateway acknowledges everything: the security event stays.
        j.ack_events(all[2].id).unwrap();
        let left = j.events_after(0, 10).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].kind, "security.command.refused");
        // A receipt for another body, another kind or another event
        // settles nothing.
        let sha = bcd_proto::fingerprint(b"forged");
        assert_eq!(
            j.settle_event(
                security,
                "security.command.refused",
                &bcd_proto::fingerprint(b"x")
            )
            .unwrap(),
            Some(false)
        );
        assert_eq!(
            j.settle_event(security, "security.other", &sha).unwrap(),
            Some(false)
        );
        assert_eq!(
            j.settle_event(security + 9, "security.command.refused", &sha)
                .unwrap(),
            None
        );
        assert_eq!(j.events_after(0, 10).unwrap().len(), 1);
        // The key holder's receipt for what the node journaled settles it.
        assert_eq!(
            j.settle_event(security, "security.command.refused", &sha)
                .unwrap(),
            Some(true)
        );
        assert!(j.events_after(0, 10).unwrap().is_empty());
    }

    #[test]
    fn acknowledged_security_events_are_kept_within_bounds() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&d.path().join("journal.db")).unwrap();
        let b = EventBounds::default();
        let huge = vec![b'x'; MAX_STORED_BODY as usize + 1];
        j.push_event("security.huge", EventClass::Transition, &huge, b)
            .unwrap();
        for i in 0..(KEEP_SECURITY + 3) {
            j.push_event("security.k", EventClass::Transition, &[i as u8], b)
                .unwrap();
        }
        j.ack_events(u64::MAX).unwrap();
        let left = j.events_after(0, 100).unwrap();
        assert_eq!(left.len() as i64, KEEP_SECURITY, "the newest kept");
        assert!(
            left.iter().all(|e| e.kind == "security.k"),
            "no gateway stores the huge one"
        );
        assert_eq!(left.last().unwrap().body, [(KEEP_SECURITY + 2) as u8]);
    }

    #[test]
    fn an_idle_journal_closes_and_opens_again_losing_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("journal.db");
        let (j, _) = Journal::open_with(&p, JournalOptions::SMALL).unwrap();
        let idle = JournalOptions::SMALL.close_idle.unwrap();
        j.accept("c1", 1, "exec.run", b"p1").unwrap();
        j.set_applied_generation(7).unwrap();
        j.push_event("t", EventClass::Transition, b"x", EventBounds::default())
            .unwrap();
        let used = Instant::now();
        let due = j.idle_deadline().expect("open, and closed when idle");
        assert!(due >= used && due <= used + idle + Duration::from_secs(1));
        assert!(
            !j.close_idle(due - Duration::from_millis(1)),
            "not idle yet"
        );
        assert!(j.is_open());
        assert!(j.close_idle(due));
        assert!(!j.is_open());
        assert_eq!(j.idle_deadline(), None);
        let wal = d.path().join("journal.db-wal");
        assert!(
            !wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0,
            "closing checkpointed the WAL into the database"
        );
        // Answered from memory: the connection stays closed.
        assert_eq!(j.applied_generation().unwrap(), 7);
        let last = 1;
        assert!(j.events_after(last, 10).unwrap().is_empty());
        assert!(!j.is_open());
        // Anything else opens it again, and finds everything.
        assert_eq!(j.highest_seq().unwrap(), 1);
        assert!(j.is_open());
        assert_eq!(j.events_after(0, 10).unwrap().len(), 1);
        j.finish("c1", b"r").unwrap();
        assert!(j.close_idle(Instant::now() + idle));
        drop(j);
        let (j, _) = Journal::open_with(&p, JournalOptions::NODE).unwrap();
        assert_eq!(j.idle_deadline(), None, "a node's journal stays open");
        assert!(!j.close_idle(Instant::now() + Duration::from_secs(3600)));
        assert_eq!(j.applied_generation().unwrap(), 7);
        assert_eq!(
            j.open_entries().unwrap()[0].result.as_deref(),
            Some(&b"r"[..])
        );
        assert_eq!(j.events_after(0, 10).unwrap()[0].body, b"x");
    }

    /// The reads answered without SQLite agree with SQLite, whatever was
    /// pushed, acknowledged or trimmed, and across closing and reopening.
    #[test]
    fn reads_answered_from_memory_agree_with_the_database() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("journal.db");
        let (mut j, _) = Journal::open_with(&p, JournalOptions::SMALL).unwrap();
        let bounds = EventBounds {
            max_bytes: 1 << 20,
            max_count: 4,
        };
        let mut rng = bcd_core::rng::SplitMix64::new(0x5eed);
        let mut seq = 0u64;
        for step in 0..600u64 {
            match rng.next_u64() % 9 {
                6 => {
                    seq += 1;
                    j.accept(&format!("c{seq}"), seq, "exec.run", b"").unwrap();
                }
                7 if seq > 0 => {
                    let id = format!("c{}", 1 + rng.next_u64() % seq);
                    j.finish(&id, b"r").unwrap();
                }
                8 if seq > 0 => {
                    // Twice sometimes, and for commands not done: an ack
                    // changes only a done, unacknowledged command.
                    let id = format!("c{}", 1 + rng.next_u64() % seq);
                    j.mark_acked(&id).unwrap();
                    if rng.next_u64().is_multiple_of(2) {
                        j.mark_acked(&id).unwrap();
                    }
                }
                7 | 8 => {}
                0 | 1 => {
                    let class = if rng.next_u64().is_multiple_of(2) {
                        EventClass::Metric
                    } else {
                        EventClass::Transition
                    };
                    j.push_event("k", class, b"b", bounds).unwrap();
                }
                2 => {
                    let up_to = rng.next_u64() % (j.last_event.get() + 2);
                    j.ack_events(up_to).unwrap();
                }
                3 => j.set_applied_generation(step).unwrap(),
                4 => {
                    j.close_idle(Instant::now() + Duration::from_secs(10));
                }
                _ => {
                    drop(j);
                    j = Journal::open_with(&p, JournalOptions::SMALL).unwrap().0;
                }
            }
            let sql = connect(&p, JournalOptions::NODE).unwrap();
            let max: i64 = sql
                .query_row("SELECT COALESCE(MAX(id), 0) FROM events", [], |r| r.get(0))
                .unwrap();
            assert!(j.last_event.get() >= max as u64, "step {step}");
            for after in 0..=j.last_event.get() + 1 {
                let n: i64 = sql
                    .query_row(
                        "SELECT COUNT(*) FROM events WHERE id > ?1",
                        [after as i64],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert_eq!(
                    j.events_after(after, 1000).unwrap().len() as i64,
                    n,
                    "step {step}"
                );
            }
            assert_eq!(
                j.applied_generation().unwrap(),
                read_applied_generation(&sql).unwrap(),
                "step {step}"
            );
            let unacked: i64 = sql
                .query_row("SELECT COUNT(*) FROM commands WHERE acked = 0", [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(
                j.open_entries().unwrap().len() as i64,
                unacked,
                "step {step}"
            );
        }
    }

    #[test]
    fn an_acknowledgement_forgets_nothing_until_a_receipt_settles_it() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&d.path().join("journal.db")).unwrap();
        // A gateway acknowledges results it may never have stored: each is
        // kept, not sent again in the session, and listed for the next.
        for i in 1..=3u64 {
            let id = format!("c{i}");
            j.accept(&id, i, "exec.run", b"").unwrap();
            j.finish(&id, b"r").unwrap();
            j.mark_acked(&id).unwrap();
        }
        assert!(
            j.open_entries().unwrap().is_empty(),
            "none is unacknowledged"
        );
        let ids = |v: Vec<Entry>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(j.unsettled_results().unwrap()), ["c1", "c2", "c3"]);
        assert!(j.settle("c2").unwrap());
        assert_eq!(ids(j.unsettled_results().unwrap()), ["c1", "c3"]);
        assert_eq!(
            j.command("c2").unwrap().unwrap().state,
            Journaled::Done { acked: true }
        );
        // A receipt for what the journal does not hold, or has not
        // finished, settles nothing.
        assert!(!j.settle("nope").unwrap());
        j.accept("c4", 4, "exec.run", b"").unwrap();
        assert!(!j.settle("c4").unwrap());
        // A receipt may come before the gateway's acknowledgement.
        j.finish("c4", b"r").unwrap();
        assert_eq!(j.open_entries().unwrap().len(), 1);
        assert!(j.settle("c4").unwrap());
        assert!(j.open_entries().unwrap().is_empty());
        assert_eq!(j.backlog().unwrap().1, 0);
        // However many later results gateways acknowledge, none is
        // forgotten unsettled short of the bound.
        for i in 5..(5 + KEEP_UNSETTLED as u64 - 2) {
            let id = format!("c{i}");
            j.accept(&id, i, "exec.run", b"").unwrap();
            j.finish(&id, b"r").unwrap();
            j.mark_acked(&id).unwrap();
        }
        assert!(j.command("c1").unwrap().is_some(), "kept until settled");
        assert_eq!(j.unsettled_results().unwrap().len() as i64, KEEP_UNSETTLED);
    }

    #[test]
    fn old_settled_results_are_trimmed() {
        let d = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&d.path().join("journal.db")).unwrap();
        for i in 1..=(KEEP_ACKED as u64 + 10) {
            let id = format!("c{i}");
            j.accept(&id, i, "exec.run", b"").unwrap();
            j.finish(&id, b"r").unwrap();
            j.mark_acked(&id).unwrap();
            assert!(j.settle(&id).unwrap());
        }
        let n: i64 = j
            .conn()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM commands", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, KEEP_ACKED);
        assert_eq!(j.highest_seq().unwrap(), KEEP_ACKED as u64 + 10);
        assert!(j.command("c1").unwrap().is_none());
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
