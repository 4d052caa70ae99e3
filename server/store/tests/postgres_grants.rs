//! A gateway's database role on PostgreSQL: the privileges the key holder
//! grants the gateway group, pinned by a golden file read from the
//! catalog, and proven by trying, as a gateway's login role, every write
//! on every table and column of the schema: what the golden file does not
//! grant is refused, the attacks a gateway with store access would try
//! first (a planted certificate, a rewritten spec or EK binding, an
//! operator made admin, a credential of its own, a trigger disabled, audit
//! rows edited) among them.
//!
//! After a deliberate change to `bc_store::postgres::grants`, regenerate
//! the golden file with `BC_UPDATE_GOLDEN=1 cargo test -p bc-store --test
//! postgres_grants` and commit it with the change.

use std::collections::BTreeSet;
use std::sync::Arc;

use bc_store::postgres::cluster::test_database;
use bc_store::postgres::grants;
use bc_store::{GatewayStore, Location, Store, StoreError, SystemClock};

const GOLDEN: &str = "tests/golden/gateway_grants.txt";

async fn client(url: &str) -> tokio_postgres::Client {
    let config = bc_store::postgres::config(url).unwrap();
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// `url` with another user.
fn as_user(url: &str, user: &str) -> String {
    let (base, query) = url.split_once('?').unwrap();
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.starts_with("user="))
        .collect();
    format!("{base}?{}&user={user}", rest.join("&"))
}

/// A migrated store, and a gateway login role in its group: the owner's
/// client, the gateway's client, and the gateway's address.
async fn store_and_gateway(
    prefix: &str,
) -> (
    String,
    tokio_postgres::Client,
    tokio_postgres::Client,
    String,
) {
    let url = test_database(prefix).await.unwrap();
    Store::open_postgres(&url, Arc::new(SystemClock))
        .await
        .unwrap();
    let owner = client(&url).await;
    let database: String = owner
        .query_one("SELECT current_database()::text", &[])
        .await
        .unwrap()
        .get(0);
    let login = grants::login_role(&database, "edge-1");
    let sql = grants::role_sql(
        &database,
        "public",
        &grants::Group::Granted(grants::group_role(&database)),
        "edge-1",
    );
    owner.batch_execute(&sql).await.unwrap();
    let gw_url = as_user(&url, &login);
    let gateway = client(&gw_url).await;
    (database, owner, gateway, gw_url)
}

/// The group's privileges as the catalog holds them.
async fn privileges(owner: &tokio_postgres::Client, group: &str) -> String {
    let mut out = "-- privileges of the gateway group role ({database}_gateway)\n".to_string();
    let sections = [
        (
            "tables and sequences",
            "SELECT c.relname::text, string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = $1::text::regrole
             GROUP BY c.relname ORDER BY 1",
        ),
        (
            "columns",
            "SELECT c.relname || '.' || t.attname,
                    string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type)
             FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid, aclexplode(t.attacl) a
             WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = $1::text::regrole
             GROUP BY c.relname, t.attname ORDER BY 1",
        ),
        (
            "schema",
            "SELECT 'public', concat_ws(', ',
                 CASE WHEN has_schema_privilege($1::text, 'public', 'USAGE') THEN 'USAGE' END,
                 CASE WHEN has_schema_privilege($1::text, 'public', 'CREATE') THEN 'CREATE' END)",
        ),
        (
            "row policies (the owner is not bound by them)",
            "SELECT tablename || '.' || policyname || ' ' || cmd,
                    concat_ws(' ', 'using', coalesce(qual, '-'), 'check', coalesce(with_check, '-'))
             FROM pg_policies WHERE schemaname = 'public' AND $1::text IS NOT NULL ORDER BY 1",
        ),
        (
            "functions running as their owner",
            "SELECT proname::text, array_to_string(proconfig, ', ')
             FROM pg_proc WHERE pronamespace = 'public'::regnamespace AND prosecdef
               AND $1::text IS NOT NULL ORDER BY 1",
        ),
    ];
    for (title, sql) in sections {
        out.push_str(&format!("\n-- {title}\n"));
        for r in owner.query(sql, &[&group]).await.unwrap() {
            let (name, what): (String, String) = (r.get(0), r.get(1));
            out.push_str(&format!("{name}: {what}\n"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_grants_are_pinned_by_their_golden_file() {
    let (database, owner, _, _) = store_and_gateway("grants_golden").await;
    let got = privileges(&owner, &grants::group_role(&database)).await;
    if std::env::var_os("BC_UPDATE_GOLDEN").is_some() {
        std::fs::write(GOLDEN, &got).unwrap();
    }
    let want = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    assert!(
        got == want,
        "the gateway's database privileges changed: if that is intended, regenerate {GOLDEN} \
         with BC_UPDATE_GOLDEN=1 and commit both\n--- got ---\n{got}"
    );
    // Every start grants again, from nothing: nothing stale survives.
    owner
        .batch_execute(&format!(
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
            grants::ident(&grants::group_role(&database))
        ))
        .await
        .unwrap();
    // The same database, opened again by the key holder.
    let again_url = owner_url(&owner).await;
    Store::open_postgres(&again_url, Arc::new(SystemClock))
        .await
        .unwrap();
    assert_eq!(
        privileges(&owner, &grants::group_role(&database)).await,
        want,
        "a key holder start leaves exactly the pinned grants"
    );
}

/// The owner's own address, from its connection's settings.
async fn owner_url(owner: &tokio_postgres::Client) -> String {
    let r = owner
        .query_one(
            "SELECT current_database()::text, current_setting('unix_socket_directories'),
                    current_setting('port'), current_user::text",
            &[],
        )
        .await
        .unwrap();
    let (db, dir, port, user): (String, String, String, String) =
        (r.get(0), r.get(1), r.get(2), r.get(3));
    let dir = dir.split(',').next().unwrap().trim().to_string();
    format!("postgresql:///{db}?host={dir}&port={port}&user={user}")
}

/// Whether `sql` is refused for want of a privilege (42501).
async fn refused(c: &tokio_postgres::Client, sql: &str) -> bool {
    match c.batch_execute(sql).await {
        Ok(()) => false,
        Err(e) => {
            let code = e.code().map(|c| c.code().to_string());
            assert!(
                code.as_deref() == Some("42501"),
                "{sql}: refused for another reason: {e:?}"
            );
            true
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_role_is_refused_every_write_it_is_not_granted() {
    let (database, owner, gw, _) = store_and_gateway("grants_refused").await;
    let group = grants::group_role(&database);
    // What the catalog grants, table-wide and by column.
    let mut granted: BTreeSet<(String, String, String)> = BTreeSet::new();
    for r in owner
        .query(
            "SELECT c.relname::text, '', a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r'
               AND a.grantee = $1::text::regrole
             UNION ALL
             SELECT c.relname::text, t.attname::text, a.privilege_type
             FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid, aclexplode(t.attacl) a
             WHERE c.relnamespace = 'public'::regnamespace AND a.grantee = $1::text::regrole",
            &[&group],
        )
        .await
        .unwrap()
    {
        granted.insert((r.get(0), r.get(1), r.get(2)));
    }
    let may = |table: &str, column: &str, what: &str| {
        granted.contains(&(table.into(), String::new(), what.into()))
            || granted.contains(&(table.into(), column.into(), what.into()))
    };
    let columns = owner
        .query(
            "SELECT table_name::text, column_name::text, is_generated = 'ALWAYS'
             FROM information_schema.columns
             WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
            &[],
        )
        .await
        .unwrap();
    let tables: BTreeSet<String> = columns.iter().map(|r| r.get(0)).collect();
    // Each table's columns a row is inserted with (not the generated ones).
    let written = |table: &str| -> String {
        columns
            .iter()
            .filter(|r| r.get::<_, String>(0) == table && !r.get::<_, bool>(2))
            .map(|r| format!("\"{}\"", r.get::<_, String>(1)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut tried = 0;
    for r in &columns {
        let (table, column, generated): (String, String, bool) = (r.get(0), r.get(1), r.get(2));
        // A generated column is written only with DEFAULT (the database
        // computes it); the privilege is checked all the same.
        let value = if generated {
            "DEFAULT".to_string()
        } else {
            format!("\"{column}\"")
        };
        let sql = format!("UPDATE \"{table}\" SET \"{column}\" = {value} WHERE false");
        assert_eq!(
            refused(&gw, &sql).await,
            !may(&table, &column, "UPDATE"),
            "{sql}"
        );
        tried += 1;
    }
    for table in &tables {
        for (what, sql) in [
            (
                "INSERT",
                format!(
                    "INSERT INTO \"{table}\" ({cols}) SELECT {cols} FROM \"{table}\" WHERE false",
                    cols = written(table)
                ),
            ),
            ("DELETE", format!("DELETE FROM \"{table}\" WHERE false")),
            ("TRUNCATE", format!("TRUNCATE \"{table}\"")),
        ] {
            let allowed = may(table, "", what) && (what != "INSERT" || may(table, "", "SELECT"));
            assert_eq!(refused(&gw, &sql).await, !allowed, "{sql}");
            tried += 1;
        }
    }
    assert!(tried > 100, "the schema was read ({tried} tries)");

    // The attacks, each refused whatever the golden file says.
    for sql in [
        // A spec of its own choosing, re-signed by the worker.
        "UPDATE node_specs SET access = '{}', not_after = 0",
        "UPDATE node_specs SET signed = ''::bytea",
        // A certificate planted for a relayed renewal.
        "INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation, not_before, \
         not_after) VALUES ('x', 'n', 'f', 1, 0, 1)",
        "UPDATE node_certs SET der = ''::bytea",
        "UPDATE nodes SET ek_sha256 = 'mine'",
        "UPDATE operators SET role = 'admin', revoked_at = NULL",
        "INSERT INTO gateway_credentials (name, secret_sha256, created_at) VALUES ('x', 'y', 0)",
        "UPDATE gateway_credentials SET revoked_at = NULL",
        "UPDATE join_tokens SET uses_left = 100",
        "UPDATE commands SET signed = ''::bytea",
        "INSERT INTO commands (id) VALUES ('x')",
        "INSERT INTO audit (at, node_id, kind, gateway_id, detail) VALUES (0, '', 'x', '', '')",
        "UPDATE audit SET hash = ''",
        "DELETE FROM audit",
        "UPDATE audit_head SET hash = ''",
        "DELETE FROM fleet_events",
        "UPDATE machine_enrolments SET ek_sha256 = 'mine'",
        // No DDL, no trigger control.
        "ALTER TABLE commands DISABLE TRIGGER audit_result",
        "ALTER TABLE node_sessions DISABLE TRIGGER ALL",
        "DROP TRIGGER audit_result ON commands",
        "CREATE TABLE gateway_owned (x int)",
        "CREATE FUNCTION compute_now_too() RETURNS bigint LANGUAGE sql AS $$ SELECT 0::bigint $$",
        "ALTER FUNCTION audit_seal() SECURITY INVOKER",
        "SET session_replication_role = replica",
        "ALTER TABLE leases DISABLE ROW LEVEL SECURITY",
        "DROP POLICY leases_insert ON leases",
        // Secrets are not even read.
        "SELECT * FROM join_tokens",
        "SELECT * FROM gateway_credentials",
        "SELECT * FROM operators",
    ] {
        assert!(refused(&gw, sql).await, "a gateway was let run: {sql}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_opens_the_store_only_as_the_key_holder_migrated_it() {
    let (_, owner, _, gw_url) = store_and_gateway("grants_open").await;
    let location = Location::parse(&gw_url);
    // As it is: works under the gateway's grants.
    let store = GatewayStore::open(&location, Arc::new(SystemClock))
        .await
        .unwrap();
    let size = store.fleet_size().await.unwrap();
    assert_eq!(
        size.connected, 0,
        "an empty fleet, read under the gateway's grants"
    );
    // A store the key holder has not migrated yet is refused, with what
    // to do.
    owner
        .batch_execute("UPDATE bc_schema SET version = version - 1")
        .await
        .unwrap();
    let e = GatewayStore::open(&location, Arc::new(SystemClock))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Schema { .. }), "{e:?}");
    assert!(
        e.to_string().contains("only the key holder migrates"),
        "{e}"
    );
}

/// A gateway's role revokes no certificate and quarantines no node (the
/// key holder does both, from proofs it verified), so it can neither take
/// a node out of the fleet by SQL nor undo what the key holder did: a
/// revocation stays (for everyone), and only the key holder, the owner,
/// lifts a quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_role_revokes_nothing_and_lifts_no_quarantine() {
    let (_, owner, gw, _) = store_and_gateway("grants_undo").await;
    owner
        .batch_execute(
            "INSERT INTO nodes (id, hostname, created_at, identity_generation, join_token,
                 quarantined_at) VALUES ('nd-q', 'q', 0, 1, 't', 5);
             INSERT INTO nodes (id, hostname, created_at, identity_generation, join_token)
                 VALUES ('nd-r', 'r', 0, 1, 't');
             INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation,
                 not_before, not_after, revoked_at, revoke_reason)
                 VALUES ('aa', 'nd-q', 'f', 1, 0, 10, 5, 'duplicate-identity');
             INSERT INTO node_certs (serial, node_id, fingerprint, identity_generation,
                 not_before, not_after)
                 VALUES ('bb', 'nd-r', 'g', 1, 0, 10)",
        )
        .await
        .unwrap();
    for sql in [
        "UPDATE nodes SET quarantined_at = NULL WHERE id = 'nd-q'",
        "UPDATE nodes SET quarantined_at = 6 WHERE id = 'nd-q'",
        "UPDATE node_certs SET revoked_at = NULL WHERE serial = 'aa'",
        "UPDATE node_certs SET revoke_reason = 'superseded' WHERE serial = 'aa'",
        // Quarantine as a weapon, and a revocation of a live node.
        "UPDATE nodes SET quarantined_at = 7 WHERE id = 'nd-r'",
        "UPDATE node_certs SET revoked_at = 7, revoke_reason = 'duplicate-identity'
             WHERE serial = 'bb'",
        "UPDATE node_certs SET revoked_at = 7, revoke_reason = 'superseded' WHERE serial = 'bb'",
        // A node whose Hellos must be proved let in unproved (a copy of
        // its key), or one that proves them locked out of an old release.
        "UPDATE nodes SET hello_proofs_since = NULL WHERE id = 'nd-r'",
        "UPDATE nodes SET hello_proofs_since = 7 WHERE id = 'nd-q'",
        // A floor raised to stop a node's upgrades, or marked raised.
        "UPDATE nodes SET release_floor = 1000000 WHERE id = 'nd-r'",
        "UPDATE commands SET floor_judged = TRUE",
    ] {
        assert!(refused(&gw, sql).await, "a gateway was let run: {sql}");
    }
    let live: bool = owner
        .query_one(
            "SELECT revoked_at IS NULL AND (SELECT quarantined_at IS NULL FROM nodes
                 WHERE id = 'nd-r') FROM node_certs WHERE serial = 'bb'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(live);
    // The key holder lifts a quarantine (a re-enrolment does); the
    // revocation stays for it too.
    owner
        .batch_execute("UPDATE nodes SET quarantined_at = NULL WHERE id = 'nd-q'")
        .await
        .unwrap();
    assert!(
        refused(
            &owner,
            "UPDATE node_certs SET revoked_at = NULL WHERE serial = 'aa'"
        )
        .await
    );
}

/// A gateway's role may write a result into a command it relays, and no
/// other ending over a finished one: not journal-lost, not rebooted, not
/// another outcome, not a pending state to send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_role_rewrites_no_finished_ending() {
    let (_, owner, gw, _) = store_and_gateway("grants_endings").await;
    owner
        .batch_execute(
            "INSERT INTO nodes (id, hostname, created_at, identity_generation, join_token)
                 VALUES ('nd-e', 'e', 0, 1, 't');
             INSERT INTO commands (id, node_id, seq, kind, summary, signed, not_after, state,
                 created_at, updated_at, exit_code, result_at)
                 VALUES ('cmd-done', 'nd-e', 1, 'exec.run', 'x', '\\x00', 10, 'succeeded',
                     0, 0, 0, 5),
                        ('cmd-live', 'nd-e', 2, 'exec.run', 'x', '\\x00', 10, 'running',
                     0, 0, NULL, NULL)",
        )
        .await
        .unwrap();
    for sql in [
        "UPDATE commands SET state = 'failed', reason = 'journal-lost' WHERE id = 'cmd-done'",
        "UPDATE commands SET reason = 'rebooted' WHERE id = 'cmd-done'",
        "UPDATE commands SET exit_code = 1 WHERE id = 'cmd-done'",
        "UPDATE commands SET state = 'dispatched' WHERE id = 'cmd-done'",
        "UPDATE commands SET result_payload = '\\x01' WHERE id = 'cmd-done'",
    ] {
        assert!(refused(&gw, sql).await, "a gateway was let run: {sql}");
    }
    // A command in flight still takes its result, once.
    gw.batch_execute(
        "UPDATE commands SET state = 'failed', reason = 'journal-lost', result_at = 6
         WHERE id = 'cmd-live'",
    )
    .await
    .unwrap();
    assert!(
        refused(
            &gw,
            "UPDATE commands SET state = 'succeeded', reason = '' WHERE id = 'cmd-live'"
        )
        .await
    );
    // The owner is held to it too.
    assert!(
        refused(
            &owner,
            "UPDATE commands SET state = 'succeeded' WHERE id = 'cmd-live'"
        )
        .await
    );
}

/// A gateway's role takes its own lease and the keyless controllers', and
/// none of the key holder's: it can neither hold one to stall the key
/// holder's passes nor take, move or drop the one the key holder holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_role_holds_no_lease_of_the_key_holders_controllers() {
    let (_, owner, gw, gw_url) = store_and_gateway("grants_leases").await;
    owner
        .batch_execute(
            "INSERT INTO leases (name, owner, expires_at, renewed_at)
                 VALUES ('controller:specs', 'keyholder', 0, 0)",
        )
        .await
        .unwrap();
    let take = |name: &str| {
        format!(
            "INSERT INTO leases (name, owner, expires_at, renewed_at)
                 VALUES ('{name}', 'edge-1', compute_now() + 60000, compute_now())
             ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,
                 expires_at = excluded.expires_at, renewed_at = excluded.renewed_at
             WHERE leases.expires_at < excluded.renewed_at"
        )
    };
    // The expired one of the key holder's, and free ones.
    for name in [
        "controller:specs",
        "controller:rollouts",
        "controller:history",
    ] {
        assert!(refused(&gw, &take(name)).await, "took {name}");
    }
    // Moved or dropped: the rows are not the role's to touch.
    for sql in [
        "UPDATE leases SET owner = 'edge-1', expires_at = 9e15 WHERE name = 'controller:specs'",
        "DELETE FROM leases WHERE name = 'controller:specs'",
    ] {
        gw.batch_execute(sql).await.unwrap();
    }
    let held: Vec<(String, String, i64)> = owner
        .query(
            "SELECT name, owner, expires_at FROM leases ORDER BY name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        held,
        [("controller:specs".to_string(), "keyholder".to_string(), 0)]
    );
    // What is a gateway's to hold, it holds, through the store as well.
    for name in [
        "gateway:edge-1",
        "controller:liveness",
        "controller:sweeper",
    ] {
        gw.batch_execute(&take(name)).await.unwrap();
    }
    let store = GatewayStore::open(&Location::parse(&gw_url), Arc::new(SystemClock))
        .await
        .unwrap();
    let ttl = std::time::Duration::from_secs(20);
    assert!(
        store
            .renew_lease("controller:sweeper", "edge-1", ttl)
            .await
            .unwrap()
            .is_some()
    );
    let e = store
        .renew_lease("controller:specs", "edge-1", ttl)
        .await
        .expect_err("the key holder's lease, renewed by a gateway");
    assert!(matches!(e, StoreError::Database(_)), "{e:?}");
    assert!(format!("{e:?}").contains("row-level security"), "{e:?}");
    let specs = owner
        .query_one(
            "SELECT owner FROM leases WHERE name = 'controller:specs'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(specs.get::<_, String>(0), "keyholder");
}
