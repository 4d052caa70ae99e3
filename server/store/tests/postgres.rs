//! The store suite against the PostgreSQL backend: a real server (a
//! throw-away cluster, or the one `BC_TEST_POSTGRES` names), a fresh
//! database per test.
#![allow(clippy::disallowed_methods)]

#[macro_use]
mod suite;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bc_store::{ManualClock, Store};

/// A connection of its own to `db`, and the task driving it.
async fn connect(db: &str) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
    let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (client, driver)
}

async fn postgres() -> suite::Fixture {
    let url = bc_store::postgres::cluster::test_database("suite")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let clock = ManualClock::new(suite::T0);
    let store = Store::open_postgres(&url, Arc::new(clock.clone()))
        .await
        .unwrap();
    let c = clock.clone();
    let db = url.clone();
    let held_db = url.clone();
    let waited_db = url.clone();
    let reopen = Box::new(move || {
        let (url, clock) = (url.clone(), c.clone());
        Box::pin(async move { Store::open_postgres(&url, Arc::new(clock)).await.unwrap() })
            as Pin<Box<dyn Future<Output = Store> + Send>>
    });
    let tamper: suite::Tamper = Box::new(move |sql| {
        let db = db.clone();
        Box::pin(async move {
            let (client, driver) = connect(&db).await;
            let done = client.batch_execute(&sql).await.map_err(|e| {
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_string())
            });
            drop(client);
            let _ = driver.await;
            done
        })
    });
    let hold: suite::Hold = Box::new(move |sql| {
        let db = held_db.clone();
        Box::pin(async move {
            let (client, _) = connect(&db).await;
            client
                .batch_execute(&format!("BEGIN; {sql}"))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let (release, released) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(async move {
                let _ = released.await;
                let _ = client.batch_execute("COMMIT").await;
            });
            release
        })
    });
    let waiting: suite::Waiting = Box::new(move |n| {
        let db = waited_db.clone();
        Box::pin(async move {
            let (client, _) = connect(&db).await;
            bc_store::postgres::cluster::lock_waiters(&client, n)
                .await
                .unwrap();
        }) as Pin<Box<dyn Future<Output = ()> + Send>>
    });
    suite::Fixture::new(store, clock, (reopen, tamper, hold, waiting), Box::new(())).await
}

store_suite!(postgres);
