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
use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::error::StoreError;

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
    pub(super) fn start(conn: Connection) -> std::io::Result<Writer> {
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
                    commit(&conn, group);
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
fn commit(c: &Connection, mut group: Vec<Box<dyn Job>>) {
    let mut failed: Option<StoreError> = c.execute_batch("BEGIN IMMEDIATE").err().map(Into::into);
    for job in group.iter_mut() {
        if failed.is_some() {
            break;
        }
        if let Err(e) = c.execute_batch("SAVEPOINT write") {
            failed = Some(e.into());
            break;
        }
        let ok = std::panic::catch_unwind(AssertUnwindSafe(|| job.run(c))).unwrap_or(false);
        if c.is_autocommit() {
            // The database ended the transaction itself (some I/O and
            // memory errors do): the writes before this one are gone too.
            failed = Some(StoreError::Database(
                "the database rolled the transaction back".into(),
            ));
            break;
        }
        let end = if ok {
            "RELEASE write"
        } else {
            "ROLLBACK TO write; RELEASE write"
        };
        if let Err(e) = c.execute_batch(end) {
            failed = Some(e.into());
        }
    }
    if failed.is_none()
        && let Err(e) = c.execute_batch("COMMIT")
    {
        failed = Some(e.into());
    }
    if failed.is_some() && !c.is_autocommit() {
        let _ = c.execute_batch("ROLLBACK");
    }
    for job in group {
        job.answer(failed.as_ref());
    }
}
