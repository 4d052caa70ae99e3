//! What only the PostgreSQL backend has: its schema, pinned by a golden
//! file read from the database's catalog; migrations run by several
//! processes at once; the refusal of a store from a newer binary; a pool
//! that recovers from a database restart without reopening the store, and
//! errors meanwhile that carry no address; and the lock and idle timeouts
//! that keep a paused holder of a lease from blocking its takeover; Hellos
//! grouped into shared transactions, each undone alone when it fails.
//!
//! After a deliberate schema change (a new migration, for both backends),
//! regenerate the golden file with `BC_UPDATE_GOLDEN=1 cargo test -p
//! bc-store --test postgres_backend` and commit it with the migration.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use bc_store::postgres::cluster::{ClusterOptions, TempCluster, lock_waiters, test_database};
use bc_store::postgres::{IDLE_IN_TRANSACTION_TIMEOUT, LOCK_TIMEOUT, MIGRATIONS, SCHEMA_VERSION};
use bc_store::{ManualClock, Store, StoreError, SystemClock};

const GOLDEN: &str = "tests/golden/schema-postgres.sql";

async fn client(url: &str) -> tokio_postgres::Client {
    let config = bc_store::postgres::config(url).unwrap();
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// Every schema object, sorted, as the catalog describes it.
async fn schema(url: &str) -> String {
    let c = client(url).await;
    let mut out = String::new();
    let version: i64 = c
        .query_one("SELECT version FROM bc_schema", &[])
        .await
        .unwrap()
        .get(0);
    out.push_str(&format!("-- schema version {version}\n"));
    let sections = [
        (
            "columns",
            "SELECT table_name || '.' || column_name, data_type || CASE WHEN is_nullable = 'NO'
                 THEN ' NOT NULL' ELSE '' END || COALESCE(' DEFAULT ' || column_default, '')
             FROM information_schema.columns WHERE table_schema = 'public'
             ORDER BY table_name, ordinal_position",
        ),
        (
            "constraints",
            "SELECT conrelid::regclass::text || ' ' || conname, pg_get_constraintdef(oid)
             FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1",
        ),
        (
            "indexes",
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1",
        ),
        (
            "triggers",
            "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
             ORDER BY 1",
        ),
        (
            "storage",
            "SELECT relname, array_to_string(reloptions, ', ') FROM pg_class
             WHERE relnamespace = 'public'::regnamespace AND reloptions IS NOT NULL
             ORDER BY 1",
        ),
        (
            "functions",
            "SELECT proname, pg_get_functiondef(oid) FROM pg_proc
             WHERE pronamespace = 'public'::regnamespace ORDER BY 1",
        ),
    ];
    for (title, sql) in sections {
        out.push_str(&format!("\n-- {title}\n"));
        for r in c.query(sql, &[]).await.unwrap() {
            let (name, def): (String, String) = (r.get(0), r.get(1));
            out.push_str(&format!("{name}: {}\n", def.trim()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_pinned_by_its_golden_file() {
    assert_eq!(SCHEMA_VERSION as usize, MIGRATIONS.len());
    assert_eq!(
        SCHEMA_VERSION,
        bc_store::sqlite::SCHEMA_VERSION,
        "one schema version means the same schema on both backends: add a migration to each"
    );
    let url = test_database("golden").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(ManualClock::new(0)))
        .await
        .unwrap();
    assert_eq!(s.schema_version().await.unwrap(), SCHEMA_VERSION);
    let got = schema(&url).await;
    if std::env::var_os("BC_UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
    }
    let want = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    assert!(
        got == want,
        "the store schema changed: if that is intended, add a migration (never edit one \
         that shipped), regenerate {GOLDEN} with BC_UPDATE_GOLDEN=1 and commit both\n\
         --- got ---\n{got}"
    );
    let rest = got.replace("compute_now()", "");
    assert!(
        !rest.contains("now()") && !rest.contains("CURRENT_TIMESTAMP"),
        "every stored time comes from compute_now()"
    );
}

/// Every store connection plans a prepared statement once (a generic
/// plan, not one per execution), and the audit sealing trigger's helpers
/// are inlined into the statements that call them rather than parsed and
/// planned again in every transaction that seals a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_and_the_sealing_helpers_are_planned_once_per_connection() {
    let url = test_database("plans").await.unwrap();
    Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    let c = client(&url).await;
    let mode: String = c
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "force_generic_plan");
    for call in [
        "audit_chain_of(node_id, gateway_id)",
        "audit_hash_v2(chain, prev_hash, seq, at, node_id, kind, epoch, gateway_id, value, detail)",
    ] {
        let plan: Vec<String> = c
            .query(&format!("EXPLAIN (VERBOSE) SELECT {call} FROM audit"), &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(
            plan.contains("sha256") && !plan.contains("audit_"),
            "{call} is not inlined:\n{plan}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_opening_one_store_at_once_migrate_it_once() {
    let url = test_database("migrate").await.unwrap();
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { Store::open_postgres(&url, Arc::new(SystemClock)).await })
        })
        .collect();
    for o in opens {
        let s = o.await.unwrap().unwrap();
        assert_eq!(s.schema_version().await.unwrap(), SCHEMA_VERSION);
    }
}

/// A history sealed in the single chain of migration 0013 stays
/// verifiable after migration 0019, in chain 0, and later records go into
/// the chains after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_audit_chain_stays_verifiable_after_the_chains_migration() {
    let url = test_database("chains").await.unwrap();
    let c = client(&url).await;
    let before = MIGRATIONS
        .iter()
        .position(|m| m.contains("audit_chain_of"))
        .unwrap();
    c.batch_execute("CREATE TABLE bc_schema (version BIGINT NOT NULL)")
        .await
        .unwrap();
    for m in &MIGRATIONS[..before] {
        c.batch_execute(m).await.unwrap();
    }
    c.execute(
        "INSERT INTO bc_schema (version) VALUES ($1)",
        &[&(before as i64)],
    )
    .await
    .unwrap();
    for (node, gw) in [("n1", "gw-a"), ("n2", "gw-a"), ("", "gw-b")] {
        c.execute(
            "INSERT INTO audit (at, node_id, kind, gateway_id) VALUES (1, $1, 'route', $2)",
            &[&node, &gw],
        )
        .await
        .unwrap();
    }
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    let snap = s.audit_snapshot().await.unwrap();
    assert_eq!(
        bc_store::audit::verify_chain(&snap.audit, &snap.heads),
        Vec::<String>::new()
    );
    assert_eq!(snap.heads.len(), 17);
    assert_eq!((snap.heads[0].chain, snap.heads[0].seq), (0, 3));
    let placed: Vec<(i64, i64, &str)> = snap
        .audit
        .iter()
        .map(|r| (r.chain, r.seq, r.node_id.as_str()))
        .collect();
    assert_eq!(placed, [(0, 1, "n1"), (0, 2, "n2"), (0, 3, "")]);
    // A lease write goes into its gateway's chain; chain 0 takes no more.
    s.renew_lease("gateway:gw-b", "gw-b", Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let snap = s.audit_snapshot().await.unwrap();
    assert_eq!(
        bc_store::audit::verify_chain(&snap.audit, &snap.heads),
        Vec::<String>::new()
    );
    let last = snap.audit.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.chain, last.seq),
        ("lease", bc_store::audit::chain_of("", "gw-b"), 1)
    );
    assert_eq!(snap.heads[0].seq, 3);
    // Editing a record of chain 0 is still caught.
    c.execute(
        "UPDATE audit SET epoch = 5 WHERE chain = 0 AND seq = 2",
        &[],
    )
    .await
    .unwrap();
    let snap = s.audit_snapshot().await.unwrap();
    let v = bc_store::audit::verify_chain(&snap.audit, &snap.heads);
    assert!(
        v.len() == 1 && v[0].contains("record 2 of chain 0 (route of node 'n2') was edited"),
        "{v:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_a_newer_binary_is_refused() {
    let url = test_database("newer").await.unwrap();
    drop(
        Store::open_postgres(&url, Arc::new(SystemClock))
            .await
            .unwrap(),
    );
    client(&url)
        .await
        .execute(
            "UPDATE bc_schema SET version = $1",
            &[&(i64::from(SCHEMA_VERSION) + 1)],
        )
        .await
        .unwrap();
    match Store::open_postgres(&url, Arc::new(SystemClock)).await {
        Err(e @ StoreError::TooNew { .. }) => {
            assert!(e.to_string().contains("run a newer better-compute"), "{e}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The database's clock is the store's: a store opened with the host's
/// clock reads compute_now() from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_clock_is_the_databases() {
    let url = test_database("clock").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    let db: i64 = client(&url)
        .await
        .query_one(
            "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let store = s.now().await.unwrap();
    assert!((store - db).abs() < 5_000, "store {store}, database {db}");
    let leased = s
        .renew_lease("gateway:g", "g", Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap();
    assert!((leased - db).abs() < 5_000);
}

/// A database restart: calls fail meanwhile with errors that carry no
/// address, and the same store works again once the database is back, with
/// no reopening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_recovers_from_a_database_restart() {
    let mut cluster = TempCluster::start(ClusterOptions {
        durable: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    let url = cluster.create_database("restart").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    s.renew_lease("gateway:g", "g", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert!(s.list_nodes().await.unwrap().nodes.is_empty());
    cluster.stop().unwrap();
    let failed = s.list_nodes().await.unwrap_err();
    let renewal = s
        .renew_lease("gateway:g", "g", Duration::from_secs(60))
        .await
        .unwrap_err();
    for e in [failed.to_string(), renewal.to_string()] {
        let dir = cluster.dir().display().to_string();
        assert!(
            !e.contains(&dir) && !e.contains("postgresql://") && !e.contains("user="),
            "{e}"
        );
    }
    cluster.start_again().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match s.list_nodes().await {
            Ok(list) => {
                assert!(list.nodes.is_empty());
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "the pool did not recover: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        s.renew_lease("gateway:g", "g", Duration::from_secs(60))
            .await
            .unwrap()
            .is_some(),
        "the lease pool recovered too"
    );
}

/// A gateway paused inside a Hello (a zombie) holds its lease row FOR
/// SHARE: a takeover waits for it no longer than the lock timeout, and the
/// database ends the zombie's idle transaction, so another owner takes the
/// lease once it expires instead of waiting for the zombie forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_of_a_lease_cannot_block_its_takeover() {
    let url = test_database("zombie").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    s.renew_lease("gateway:z", "z", Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap();
    let mut zombie = client(&url).await;
    let tx = zombie.transaction().await.unwrap();
    tx.query_one(
        "SELECT expires_at FROM leases WHERE name = 'gateway:z' FOR SHARE",
        &[],
    )
    .await
    .unwrap();
    // The zombie stops here, its transaction open. The lease runs out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The takeover's first try waits on the zombie's lock for the lock
    // timeout, not longer, and fails saying so.
    let start = Instant::now();
    let first = s
        .renew_lease("gateway:z", "newcomer", Duration::from_secs(20))
        .await;
    let waited = start.elapsed();
    let Err(StoreError::Database(e)) = &first else {
        panic!("the first takeover did not wait on the zombie's lock: {first:?}");
    };
    let code = e
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(|e| e.code().cloned());
    assert_eq!(
        code,
        Some(tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
        "{e}"
    );
    assert!(
        waited >= LOCK_TIMEOUT - Duration::from_millis(100)
            && waited < LOCK_TIMEOUT + Duration::from_secs(5),
        "the lock wait ended after {waited:?}, not the lock timeout"
    );
    // Then the database ends the zombie's idle transaction, and the lease
    // is taken.
    let mut taken = None;
    while taken.is_none() {
        // An error is a lock timeout while the zombie still holds it.
        if let Ok(t) = s
            .renew_lease("gateway:z", "newcomer", Duration::from_secs(20))
            .await
        {
            taken = t;
        }
        assert!(
            start.elapsed() < IDLE_IN_TRANSACTION_TIMEOUT + Duration::from_secs(10),
            "the takeover waited {:?}",
            start.elapsed()
        );
    }
    assert!(
        tx.commit().await.is_err(),
        "the zombie's transaction was ended"
    );
    assert!(
        s.renew_lease("gateway:z", "z", Duration::from_secs(20))
            .await
            .unwrap()
            .is_none(),
        "the zombie's own renewal finds another owner"
    );
}

/// Concurrent Hellos share transactions (`hellos.rs`): one that fails in
/// the database mid-group (a NUL byte PostgreSQL refuses in a text column,
/// met by its session write) is rolled back to its savepoint alone, and
/// the Hellos queued beside it commit. Grouping is made certain by holding
/// the gateway's lease row until every Hello is queued or taken and a
/// runner waits on the row (`pg_stat_activity`): none can finish before it
/// is released, so 40 Hellos meet at most four runners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_that_fails_in_a_group_is_undone_alone() {
    use bc_store::sessions::HelloInput;

    let url = test_database("groups").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    s.renew_lease("gateway:gw", "gw", Duration::from_secs(600))
        .await
        .unwrap()
        .unwrap();
    const NODES: usize = 40;
    let mut ids = Vec::new();
    for i in 0..NODES {
        ids.push(bc_store::fixtures::enroll(&s, i).await.unwrap());
    }
    let hello = |i: usize, boot: &str| HelloInput {
        boot_id: boot.into(),
        ..bc_store::fixtures::hello(&ids[i], i, "gw")
    };
    // Each node's stored epoch: a Hello that commits moves it on by one.
    let mut epochs = [0u64; NODES];
    let mut blocker = client(&url).await;
    let blocker_watch = client(&url).await;
    for (round, bad) in [(1, NODES / 2), (2, NODES - 1), (3, 7)] {
        let queued = Arc::new(AtomicUsize::new(0));
        let tx = blocker.transaction().await.unwrap();
        tx.query_one(
            "SELECT 1 FROM leases WHERE name = 'gateway:gw' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
        let tasks: Vec<_> = (0..NODES)
            .map(|i| {
                let (s, h) = (
                    s.clone(),
                    hello(i, if i == bad { "bad\0boot" } else { "boot" }),
                );
                let queued = queued.clone();
                tokio::spawn(async move {
                    // Polled once, a Hello is queued for a runner (its
                    // lease fence is free and the queue far from full).
                    let mut hello = std::pin::pin!(s.hello(&h));
                    let first =
                        std::future::poll_fn(|cx| Poll::Ready(hello.as_mut().poll(cx))).await;
                    queued.fetch_add(1, Ordering::SeqCst);
                    match first {
                        Poll::Ready(out) => out,
                        Poll::Pending => hello.await,
                    }
                })
            })
            .collect();
        // Every runner's first Hello waits on the held row, so the rest
        // queue behind them and go in groups.
        // Once every Hello is queued or taken and a runner waits on the
        // held row, none can finish before it is released: they go in
        // groups (where the bad one lands varies with the round).
        while queued.load(Ordering::SeqCst) < NODES {
            tokio::task::yield_now().await;
        }
        lock_waiters(&blocker_watch, 1).await.unwrap();
        tx.commit().await.unwrap();
        for (i, t) in tasks.into_iter().enumerate() {
            let out = t.await.unwrap();
            if i == bad {
                assert!(out.is_err(), "round {round}: the bad Hello was taken");
                continue;
            }
            let out = out.unwrap_or_else(|e| {
                panic!("round {round}: Hello {i} failed beside the bad one: {e}")
            });
            epochs[i] += 1;
            assert_eq!(out.epoch, epochs[i], "round {round}: node {i}");
        }
    }
    // What each answer said was durable: every node's next epoch follows
    // its last committed one (the bad Hellos left nothing).
    for (i, epoch) in epochs.iter().enumerate() {
        let out = s.hello(&hello(i, "boot")).await.unwrap();
        assert_eq!(out.epoch, epoch + 1, "node {i}");
    }
}

/// A Hello that queued behind another of its node (its row locked, as a
/// group on another gateway holds it until that group commits) judges its
/// gateway's lease when it gets the row, not when it started waiting: a
/// lease that ran out meanwhile fences it. Read before the wait, the time
/// admitted the expired lease and the node was routed by a gateway that
/// no longer held it (invariant I1, seen at 10,000 nodes on PostgreSQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_that_waited_for_its_node_judges_the_lease_after_the_wait() {
    let url = test_database("late_lease").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    let node = bc_store::fixtures::enroll(&s, 0).await.unwrap();
    s.renew_lease("gateway:gw", "gw", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let hello = bc_store::fixtures::hello(&node, 0, "gw");
    // The lease runs out while the Hello waits for the node's row.
    let out = hello_while_the_lease_runs_out(
        &url,
        &s,
        &hello,
        "SELECT 1 FROM nodes WHERE id = $1 FOR NO KEY UPDATE",
    )
    .await;
    match out {
        Err(bc_store::TxError::Refused(bc_store::Refusal::Fenced(g))) => assert_eq!(g, "gw"),
        other => panic!("a Hello routed on a lease that ran out while it waited: {other:?}"),
    }
}

/// A Hello whose session write waits (its node's session row held, here
/// by a test connection) while its gateway's lease runs out is fenced at
/// the write and leaves nothing: the lease is read again once the route
/// is written, so no route is recorded after the lease ended (I1), even
/// when the lease was good when the Hello judged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_whose_write_outlives_the_lease_routes_nothing() {
    let url = test_database("lease_at_write").await.unwrap();
    let s = Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    let node = bc_store::fixtures::enroll(&s, 0).await.unwrap();
    let hello = bc_store::fixtures::hello(&node, 0, "gw");
    s.renew_lease("gateway:gw", "gw", Duration::from_secs(600))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.hello(&hello).await.unwrap().epoch, 1);
    s.renew_lease("gateway:gw", "gw", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    let out = hello_while_the_lease_runs_out(
        &url,
        &s,
        &hello,
        "SELECT 1 FROM node_sessions WHERE node_id = $1 FOR UPDATE",
    )
    .await;
    match out {
        Err(bc_store::TxError::Refused(bc_store::Refusal::Fenced(g))) => assert_eq!(g, "gw"),
        other => panic!("a route was written after the lease ended: {other:?}"),
    }
    // Nothing of it stayed: the next Hello on a renewed lease is epoch 2.
    s.renew_lease("gateway:gw", "gw", Duration::from_secs(600))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.hello(&hello).await.unwrap().epoch, 2);
}

/// Sends `hello` while a test connection holds the node's row that `lock`
/// (one parameter: the node id) locks, lets the gateway's lease run out
/// while the Hello waits on it, then releases it; the Hello's outcome.
async fn hello_while_the_lease_runs_out(
    url: &str,
    s: &Store,
    hello: &bc_store::sessions::HelloInput,
    lock: &str,
) -> Result<bc_store::sessions::HelloOutcome, bc_store::TxError> {
    let mut blocker = client(url).await;
    let watch = client(url).await;
    let tx = blocker.transaction().await.unwrap();
    tx.query_one(lock, &[&hello.node_id]).await.unwrap();
    let waiting = {
        let (s, hello) = (s.clone(), hello.clone());
        tokio::spawn(async move { s.hello(&hello).await })
    };
    lock_waiters(&watch, 1).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let lease = format!("gateway:{}", hello.gateway_id);
    while !watch
        .query_one(
            "SELECT compute_now() > expires_at FROM leases WHERE name = $1",
            &[&lease],
        )
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the lease did not run out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.unwrap();
    waiting.await.unwrap()
}
