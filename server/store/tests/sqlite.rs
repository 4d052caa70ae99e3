//! The store suite against the SQLite backend.

#[macro_use]
mod suite;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bc_store::{Clock, ManualClock, Store};

async fn sqlite() -> suite::Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let clock = ManualClock::new(suite::T0);
    let store = Store::open_sqlite(&path, Arc::new(clock.clone()))
        .await
        .unwrap();
    let c = clock.clone();
    let reopen = Box::new(move || {
        let (path, clock) = (path.clone(), c.clone());
        Box::pin(async move { Store::open_sqlite(&path, Arc::new(clock)).await.unwrap() })
            as Pin<Box<dyn Future<Output = Store> + Send>>
    });
    let db = dir.path().join("store.db");
    let c = clock.clone();
    let tamper: suite::Tamper = Box::new(move |sql| {
        let (db, clock) = (db.clone(), c.clone());
        Box::pin(async move {
            let c = rusqlite::Connection::open(&db).unwrap();
            bc_store::sqlite::audit_functions(&c).unwrap();
            // The audit trigger stamps its records with the store's clock.
            c.create_scalar_function(
                "compute_now",
                0,
                rusqlite::functions::FunctionFlags::SQLITE_UTF8,
                move |_| Ok(clock.now_ms()),
            )
            .unwrap();
            c.execute_batch(&sql).map_err(|e| e.to_string())
        })
    });
    let db = dir.path().join("store.db");
    let hold: suite::Hold = Box::new(move |sql| {
        let db = db.clone();
        Box::pin(async move {
            let (ready, held) = tokio::sync::oneshot::channel::<()>();
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            std::thread::spawn(move || {
                let c = rusqlite::Connection::open(&db).unwrap();
                c.execute_batch(&format!("BEGIN IMMEDIATE; {sql}"))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                let _ = ready.send(());
                let _ = released.blocking_recv();
                c.execute_batch("COMMIT").unwrap();
            });
            held.await.unwrap();
            release
        })
    });
    // SQLite's writers wait for the lock in a busy handler nothing outside
    // the process sees: a pause stands in for seeing them wait.
    let waiting: suite::Waiting = Box::new(|_| {
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(300)))
            as Pin<Box<dyn Future<Output = ()> + Send>>
    });
    suite::Fixture::new(store, clock, (reopen, tamper, hold, waiting), Box::new(dir)).await
}

store_suite!(sqlite);
