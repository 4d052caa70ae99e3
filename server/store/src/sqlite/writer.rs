//! Group commit: every write goes through one writer thread, which runs
//! the writes waiting for it in one SQLite transaction, each inside its own
//! savepoint, and commits them with one fsync.
//!
//! A write stays one transaction to its caller: it sees the writes queued
//! before it (as it would have, one transaction after another), its changes
//! are undone alone if it fails (the savepoint), and it is answered only
//! after the commit, so what it reports is durable. If the commit fails,
//! every write in the group is answered with the failure. A write that
//! panics is rolled back alone and answered with an error.
//!
//! With `synchronous=FULL` each commit waits for the disk; grouping is what
//! lets many gateways' sessions (a reconnect storm's Hellos) share those
//! waits instead of queueing behind one another.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, mpsc};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::Kept;
use crate::clock::Clock;
use crate::error::StoreError;

/// The time one write sees: `compute_now()` on the writer's connection
/// answers the time read when the write began, for the whole write, as a
/// PostgreSQL transaction sees one time. A Hello that checks its gateway's
/// lease and routes the node records the route at the time it checked the
/// lease, however long the write itself takes.
#[derive(Debug)]
pub(super) struct Pin {
    clock: Arc<dyn Clock>,
    at: AtomicI64,
}

const UNPINNED: i64 = i64::MIN;

impl Pin {
    pub(super) fn new(clock: Arc<dyn Clock>) -> Pin {
        Pin {
            clock,
            at: AtomicI64::new(UNPINNED),
        }
    }

    /// The pinned time, while a write runs.
    pub(super) fn get(&self) -> Option<i64> {
        Some(self.at.load(Ordering::Relaxed)).filter(|&t| t != UNPINNED)
    }

    fn hold(&self) {
        self.at.store(self.clock.now_ms(), Ordering::Relaxed);
    }

    fn release(&self) {
        self.at.store(UNPINNED, Ordering::Relaxed);
    }
}

/// The most writes one commit carries.
const MAX_GROUP: usize = 64;

/// A write waiting for the writer thread.
trait Job: Send {
    /// Runs the write; false if it failed (its savepoint is rolled back).
    fn run(&mut self, c: &Connection) -> bool;
    /// Answers the caller: `failed` is the group's commit failure, if any.
    fn answer(self: Box<Self>, failed: Option<&StoreError>);
}

struct Write<T, E, F> {
    f: Option<F>,
    out: Option<Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<T, E, F> Job for Write<T, E, F>
where
    T: Send,
    E: From<StoreError> + Send,
    F: FnOnce(&Connection) -> Result<T, E> + Send,
{
    fn run(&mut self, c: &Connection) -> bool {
        let Some(f) = self.f.take() else {
            return false;
        };
        let out = f(c);
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn answer(self: Box<Self>, failed: Option<&StoreError>) {
        let r = match (failed, self.out) {
            (None, Some(out)) => out,
            (Some(e), _) => Err(E::from(StoreError::Database(
                format!("the commit failed: {e}").into(),
            ))),
            (None, None) => Err(E::from(StoreError::Database(
                "the store operation panicked; it changed nothing".into(),
            ))),
        };
        let _ = self.reply.send(r);
    }
}

/// The writer thread's handle.
#[derive(Debug)]
pub(super) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

impl Writer {
    /// Starts the writer thread on `conn`; it ends when the handle is
    /// dropped.
    pub(super) fn start(conn: Connection, pin: Arc<Pin>) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        std::thread::Builder::new()
            .name("bc-store-writer".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP {
                        match rx.try_recv() {
                            Ok(j) => group.push(j),
                            Err(_) => break,
                        }
                    }
                    commit(&conn, &pin, group);
                }
            })?;
        Ok(Writer { jobs: tx })
    }

    /// Runs `f` as one write and answers once it is durable.
    pub(super) async fn write<T, E>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Write {
            f: Some(f),
            out: None,
            reply,
        });
        let stopped = || E::from(StoreError::Database("the store's writer stopped".into()));
        self.jobs.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Runs a group of writes in one transaction, one savepoint each.
fn commit(c: &Connection, pin: &Pin, mut group: Vec<Box<dyn Job>>) {
    let mut failed: Option<StoreError> = run(c, "BEGIN IMMEDIATE").err().map(Into::into);
    for job in group.iter_mut() {
        if failed.is_some() {
            break;
        }
        if let Err(e) = run(c, "SAVEPOINT write") {
            failed = Some(e.into());
            break;
        }
        pin.hold();
        let ok = std::panic::catch_unwind(AssertUnwindSafe(|| job.run(c))).unwrap_or(false);
        pin.release();
        if c.is_autocommit() {
            // The database ended the transaction itself (some I/O and
            // memory errors do): the writes before this one are gone too.
            failed = Some(StoreError::Database(
                "the database rolled the transaction back".into(),
            ));
            break;
        }
        let ended = if ok {
            run(c, "RELEASE write")
        } else {
            run(c, "ROLLBACK TO write").and_then(|()| run(c, "RELEASE write"))
        };
        if let Err(e) = ended {
            failed = Some(e.into());
        }
    }
    if failed.is_none()
        && let Err(e) = run(c, "COMMIT")
    {
        failed = Some(e.into());
    }
    if failed.is_some() && !c.is_autocommit() {
        let _ = run(c, "ROLLBACK");
    }
    for job in group {
        job.answer(failed.as_ref());
    }
}

/// Runs one transaction control statement from the connection's prepared
/// statements (a group commit of one write runs four of these).
fn run(c: &Connection, sql: &str) -> rusqlite::Result<()> {
    c.execute_kept(sql, []).map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    use super::{Pin, Writer};
    use crate::clock::Clock;
    use crate::error::StoreError;

    /// A clock that moves a millisecond every time it is read.
    #[derive(Debug, Default)]
    struct Ticking(AtomicI64);

    impl Clock for Ticking {
        fn now_ms(&self) -> i64 {
            self.0.fetch_add(1, Ordering::Relaxed)
        }
    }

    #[tokio::test]
    async fn a_write_sees_one_time_and_the_next_write_a_later_one() {
        let d = tempfile::tempdir().unwrap();
        let clock: Arc<dyn Clock> = Arc::new(Ticking::default());
        let pin = Arc::new(Pin::new(clock.clone()));
        let conn = super::super::connect_pinned(&d.path().join("s.db"), &clock, Some(pin.clone()))
            .unwrap();
        let writer = Writer::start(conn, pin).unwrap();
        let read_twice = |c: &rusqlite::Connection| -> Result<(i64, i64), StoreError> {
            let t = |c: &rusqlite::Connection| -> rusqlite::Result<i64> {
                c.query_row("SELECT compute_now()", [], |r| r.get(0))
            };
            Ok((t(c)?, t(c)?))
        };
        let (a, b) = writer.write(read_twice).await.unwrap();
        assert_eq!(a, b, "one write, one time");
        let (c, _) = writer.write(read_twice).await.unwrap();
        assert!(c > a, "the clock moves between writes");
        // Outside a write the clock is read as it is.
        assert!(clock.now_ms() > c);
    }
}
