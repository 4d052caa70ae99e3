//! A gateway's database role: what a gateway-only process may read and
//! write in the store, and nothing else.
//!
//! Only the key holder creates and migrates the store, so its database
//! user owns every table. Each gateway connects as a login role of its
//! own, a member of the store's gateway group role ([`group_role`]:
//! `<database>_gateway`), which is granted exactly what
//! [`crate::GatewayBackend`]'s methods read and write ([`GATEWAY`]): session
//! and liveness facts, leases, the fate of commands, node-signed records,
//! and reads of the signed intent it relays. It owns nothing and has no
//! `CREATE` on the schema (no DDL), so it cannot disable a trigger (only an
//! owner can); it has no grant on the audit tables, whose triggers run as
//! their owner (`SECURITY DEFINER`, [`AUDIT_FUNCTIONS`]); and it cannot
//! read or write tokens, operators, gateway credentials, enrolments,
//! rollouts, image assignments, boot records or backups.
//!
//! The key holder applies the grants at every start, after migrating (a
//! new table is nobody's until a line here grants it): it creates the group
//! role when its user may create roles, and otherwise says what to run
//! ([`role_sql`]). `tests/golden/gateway_grants.txt` pins the privileges as
//! the database reports them.

use super::{Tx, query_opt};
use crate::error::StoreError;

/// What the gateway group role may do, table by table. Column lists are
/// the columns its statements write; `UPDATE` on one column also lets it
/// lock rows (`FOR UPDATE`, `FOR SHARE`), as its transactions do.
pub const GATEWAY: &[(&str, &str)] = &[
    ("bc_schema", "SELECT"),
    (
        "nodes",
        "SELECT, UPDATE (agent_version, conditions, taints)",
    ),
    ("node_certs", "SELECT"),
    ("node_sessions", "SELECT, INSERT, UPDATE"),
    (
        "cert_sightings",
        "SELECT, INSERT (serial, boot_id, at, seq, proof, proof_signature), DELETE",
    ),
    ("leases", "SELECT, INSERT, UPDATE, DELETE"),
    ("controller_state", "SELECT, INSERT, UPDATE"),
    (
        "commands",
        "SELECT, UPDATE (state, epoch, reason, exit_code, output, output_truncated, result_at, \
         updated_at, result_payload, result_signature)",
    ),
    (
        "inventory",
        "SELECT, INSERT, UPDATE (sha256, body, updated_at)",
    ),
    ("legacy_results", "SELECT"),
    ("node_events", "SELECT, INSERT, DELETE"),
    (
        "node_security_events",
        "SELECT, INSERT (node_id, journal_id, event_id, kind, body, at)",
    ),
    ("node_specs", "SELECT"),
    (
        "unknown_results",
        "SELECT, INSERT (node_id, command_id, payload, signature, at)",
    ),
    (
        "node_state",
        "SELECT, INSERT, UPDATE (applied_generation, sections, reported_at, report_epoch)",
    ),
    (
        "bindings",
        "SELECT, INSERT, UPDATE (gpus, state, spec_generation, updated_at)",
    ),
    ("binding_nonces", "SELECT, INSERT"),
    ("fleet_events", "INSERT"),
    ("releases", "SELECT"),
    ("images", "SELECT"),
    ("image_artifacts", "SELECT"),
    ("gateway_revocations", "SELECT"),
];

/// Sequences behind the ids of rows a gateway inserts.
pub const SEQUENCES: &[&str] = &["cert_sightings_id_seq", "fleet_events_id_seq"];

/// The audit triggers' functions: they write the audit tables, which no
/// gateway may, so they run as their owner.
pub const AUDIT_FUNCTIONS: &[&str] = &[
    "audit_route",
    "audit_liveness",
    "audit_lease",
    "audit_generation",
    "audit_floor",
    "audit_result",
    "audit_binding",
    "audit_seal",
    "audit_backup",
];

/// The gateway group role of the store in `database`.
pub fn group_role(database: &str) -> String {
    format!("{database}_gateway")
}

/// The login role `gateways add NAME` suggests for gateway `name`.
pub fn login_role(database: &str, name: &str) -> String {
    format!("{database}_gw_{}", name.replace('-', "_"))
}

/// `name` as an SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The statements that grant `group` what a gateway may do in `schema`,
/// and nothing else: what every key holder start runs.
pub fn statements(schema: &str, group: &str) -> Vec<String> {
    let (s, g) = (ident(schema), ident(group));
    let mut out = vec![
        format!("REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {g}"),
        format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {g}"),
        format!("REVOKE ALL ON SCHEMA {s} FROM {g}"),
        format!("GRANT USAGE ON SCHEMA {s} TO {g}"),
    ];
    for (table, privileges) in GATEWAY {
        out.push(format!("GRANT {privileges} ON TABLE {s}.{table} TO {g}"));
    }
    for seq in SEQUENCES {
        out.push(format!("GRANT USAGE ON SEQUENCE {s}.{seq} TO {g}"));
    }
    for f in AUDIT_FUNCTIONS {
        out.push(format!(
            "ALTER FUNCTION {s}.{f}() SECURITY DEFINER SET search_path = {s}, pg_temp"
        ));
    }
    out
}

/// Whether the gateway group role exists (granted), or could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    Granted(String),
    /// The key holder's user may not create roles: someone who may runs
    /// [`role_sql`]'s statements, then the key holder starts again.
    Missing(String),
}

/// The database, the schema, whether the group role exists, and whether
/// this user may create roles.
async fn here(tx: &Tx<'_>) -> Result<(String, String, bool, bool), StoreError> {
    let r = query_opt(
        tx,
        "SELECT current_database()::text, current_schema()::text,
                EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_database() || '_gateway'),
                (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user)",
        &[],
    )
    .await?
    .ok_or_else(|| StoreError::Corrupt("no current database".into()))?;
    let may_create: Option<bool> = r.get(3);
    Ok((r.get(0), r.get(1), r.get(2), may_create == Some(true)))
}

/// Creates the group role if it is missing and this user may, and grants
/// it: run in the transaction that found the schema up to date.
pub(super) async fn apply(tx: &Tx<'_>) -> Result<Group, StoreError> {
    let (database, schema, exists, may_create) = here(tx).await?;
    let group = group_role(&database);
    if !exists {
        if !may_create {
            return Ok(Group::Missing(group));
        }
        tx.batch_execute(&format!("CREATE ROLE {} NOLOGIN", ident(&group)))
            .await?;
    }
    tx.batch_execute(&statements(&schema, &group).join(";\n"))
        .await?;
    Ok(Group::Granted(group))
}

/// [`role_sql`] for this store.
pub(super) async fn role_sql_here(tx: &Tx<'_>, name: &str) -> Result<String, StoreError> {
    let (database, schema, exists, _) = here(tx).await?;
    let group = group_role(&database);
    let group = if exists {
        Group::Granted(group)
    } else {
        Group::Missing(group)
    };
    Ok(role_sql(&database, &schema, &group, name))
}

/// What to run, as a user who may create roles, for gateway `name` to
/// connect with a gateway's privileges: its login role in the group (and
/// the group with its grants first, when `group` is missing).
pub fn role_sql(database: &str, schema: &str, group: &Group, name: &str) -> String {
    let login = login_role(database, name);
    let mut out = String::new();
    if let Group::Missing(g) = group {
        out.push_str(&format!("CREATE ROLE {} NOLOGIN;\n", ident(g)));
        for s in statements(schema, g) {
            out.push_str(&s);
            out.push_str(";\n");
        }
    }
    let g = match group {
        Group::Granted(g) | Group::Missing(g) => g,
    };
    out.push_str(&format!(
        "CREATE ROLE {} LOGIN IN ROLE {};\n",
        ident(&login),
        ident(g)
    ));
    out.push_str(&format!(
        "-- then give it a password (\\password {login}) or a client certificate, and start \
         the gateway with --store postgres://{login}@HOST/{database}\n"
    ));
    out
}
