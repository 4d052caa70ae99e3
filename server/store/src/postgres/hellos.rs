//! Hellos grouped into shared transactions, as SQLite's writer groups every
//! write: concurrent Hellos of one process share a transaction and its
//! commit instead of paying a `BEGIN`, a `COMMIT` and a WAL flush each.
//!
//! A few group runners take the Hellos waiting when they are free (no
//! gather delay: a Hello alone runs at once, alone) and run them one after
//! another in one transaction, each inside a savepoint:
//!
//! - each Hello stays one transaction to its caller: it sees the Hellos
//!   before it in its group, and if it fails (a refusal, or an error in the
//!   database) its changes are rolled back to its savepoint, alone;
//! - it is answered only once the group's commit returned, so nothing is
//!   acknowledged to a node before it is durable; a failed commit answers
//!   every Hello of the group with the failure;
//! - the savepoint rides with the Hello's first statements (pipelined, no
//!   round trip of its own), so a group of one costs what a Hello in a
//!   transaction of its own did.
//!
//! Several runners work at once, each on its own connection, so one slow
//! Hello (a row lock waited for) holds back its group only.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{Mutex as AsyncMutex, mpsc, oneshot};

use super::{Pg, Tx};
use crate::clock::Clock;
use crate::error::{StoreError, TxError};
use crate::sessions::{HelloInput, HelloOutcome};

/// Group runners of one process (each holds a pooled connection while it
/// runs a group). Within a group the Hellos run one after another, so more
/// runners mean more Hellos at once and smaller groups: with 64 Hellos in
/// flight, 1, 2, 4 and 8 runners gave 1,041, 1,227, 1,368 and 1,286 Hellos
/// a second (tests/bench/README.md).
pub(super) const RUNNERS: usize = 4;
/// The most Hellos one transaction carries. Each writes in a
/// subtransaction of its own; past 64 of those PostgreSQL's snapshots of
/// every session get slower, so a group stays well under.
pub(super) const MAX_GROUP: usize = 32;
/// Hellos waiting for a runner, at most (a gateway bounds its own running
/// Hellos far below this; past it a caller waits to queue).
const QUEUE: usize = 4096;

type Reply = oneshot::Sender<Result<HelloOutcome, TxError>>;

struct Job {
    hello: HelloInput,
    reply: Reply,
}

/// Where Hellos queue for the runners.
pub(super) struct Groups {
    pool: Pool,
    clock: Option<Arc<dyn Clock>>,
    /// The queue of the runners started last; none until the first Hello,
    /// and started again if they are gone (their runtime ended: a store
    /// opened in one test runtime and used in the next).
    queue: std::sync::Mutex<Option<mpsc::Sender<Job>>>,
}

impl Groups {
    pub(super) fn new(pool: Pool, clock: Option<Arc<dyn Clock>>) -> Groups {
        Groups {
            pool,
            clock,
            queue: std::sync::Mutex::new(None),
        }
    }

    /// Runs `hello` in the next group and answers once its group committed.
    pub(super) async fn hello(&self, hello: &HelloInput) -> Result<HelloOutcome, TxError> {
        let (reply, answer) = oneshot::channel();
        let mut job = Job {
            hello: hello.clone(),
            reply,
        };
        loop {
            let queue = self.queue();
            match queue.send(job).await {
                Ok(()) => break,
                // The runners are gone: start new ones and queue again.
                Err(mpsc::error::SendError(back)) => {
                    job = back;
                    let mut slot = self.queue.lock().expect("queue lock");
                    if slot.as_ref().is_some_and(|q| q.same_channel(&queue)) {
                        *slot = None;
                    }
                }
            }
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the Hello's group runner stopped before answering (the runtime is shutting down)"
                    .into(),
            )
            .into())
        })
    }

    /// The runners' queue, starting them first if there are none.
    fn queue(&self) -> mpsc::Sender<Job> {
        let mut slot = self.queue.lock().expect("queue lock");
        if let Some(q) = slot.as_ref().filter(|q| !q.is_closed()) {
            return q.clone();
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let rx = Arc::new(AsyncMutex::new(rx));
        for _ in 0..RUNNERS {
            tokio::spawn(runner(self.pool.clone(), self.clock.clone(), rx.clone()));
        }
        *slot = Some(tx.clone());
        tx
    }
}

/// Takes the Hellos waiting (at most [`MAX_GROUP`]) and runs them as one
/// group, until the queue is closed.
async fn runner(
    pool: Pool,
    clock: Option<Arc<dyn Clock>>,
    queue: Arc<AsyncMutex<mpsc::Receiver<Job>>>,
) {
    loop {
        let mut group = Vec::new();
        {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            group.push(first);
            while group.len() < MAX_GROUP {
                match queue.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
        }
        run(&pool, clock.as_deref(), group).await;
    }
}

/// One group: a transaction, a savepoint per Hello, one commit.
async fn run(pool: &Pool, clock: Option<&dyn Clock>, group: Vec<Job>) {
    // A caller that gave up (its node went away) is not run for.
    let group: Vec<Job> = group.into_iter().filter(|j| !j.reply.is_closed()).collect();
    if group.is_empty() {
        return;
    }
    let mut conn = match pool.get().await {
        Ok(conn) => conn,
        Err(e) => return fail(group.into_iter().map(|j| j.reply), &StoreError::from(e)),
    };
    let tx = match super::begin_with(&mut conn, clock).await {
        Ok(tx) => tx,
        Err(e) => return fail(group.into_iter().map(|j| j.reply), &e),
    };
    let mut done: Vec<(Reply, HelloOutcome)> = Vec::with_capacity(group.len());
    let mut jobs = group.into_iter();
    let mut first = true;
    while let Some(job) = jobs.next() {
        match one(&tx, &job.hello, first).await {
            Ok(outcome) => done.push((job.reply, outcome)),
            Err(Failed::Hello(e)) => {
                let _ = job.reply.send(Err(e));
            }
            // The transaction cannot go on: nothing of the group is kept.
            Err(Failed::Group(e)) => {
                let _ = job.reply.send(Err(TxError::Store(copy(&e))));
                let waiting = done.into_iter().map(|(r, _)| r);
                return fail(waiting.chain(jobs.map(|j| j.reply)), &e);
            }
        }
        first = false;
    }
    match tx.commit().await {
        Ok(()) => {
            for (reply, outcome) in done {
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(e) => fail(done.into_iter().map(|(r, _)| r), &StoreError::from(e)),
    }
}

enum Failed {
    /// The Hello failed and was rolled back alone.
    Hello(TxError),
    /// Its rollback failed too: the group's transaction is lost.
    Group(StoreError),
}

/// One Hello of a group, inside its savepoint (the last Hello's released
/// in the same message), rolled back to it if it fails.
async fn one(tx: &Tx<'_>, hello: &HelloInput, first: bool) -> Result<HelloOutcome, Failed> {
    let savepoint = if first {
        "SAVEPOINT hello"
    } else {
        "RELEASE SAVEPOINT hello; SAVEPOINT hello"
    };
    // Polled first, so sent first: the savepoint goes out ahead of the
    // Hello's statements, in the same round trip.
    let (saved, out) = futures_util::future::join(
        tx.batch_execute(savepoint),
        crate::sql::sessions::hello(&Pg(tx), hello),
    )
    .await;
    if let Err(e) = saved {
        return Err(Failed::Group(e.into()));
    }
    match out {
        Ok(outcome) => Ok(outcome),
        Err(e) => match tx.batch_execute("ROLLBACK TO SAVEPOINT hello").await {
            Ok(()) => Err(Failed::Hello(e)),
            Err(rollback) => Err(Failed::Group(rollback.into())),
        },
    }
}

/// Answers every one of `replies` with `e`.
fn fail(replies: impl Iterator<Item = Reply>, e: &StoreError) {
    for reply in replies {
        let _ = reply.send(Err(TxError::Store(copy(e))));
    }
}

/// A group's failure, as each of its Hellos reports it.
fn copy(e: &StoreError) -> StoreError {
    StoreError::Database(format!("the Hello's group transaction failed: {e}").into())
}
