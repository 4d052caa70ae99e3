//! The dump and the restore (backup sets' records: `crate::sql::backups`).

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::Connection;
use rusqlite::types::{Value as Sql, ValueRef};

use super::{now, user_version};
use crate::backups::{Dump, TableDump, Value, plain_identifier, restore_order};
use crate::error::{Refusal, StoreError, TxError};

/// Every table but SQLite's own, parents first; `sqlite_sequence` (the
/// AUTOINCREMENT positions) last.
fn tables(c: &Connection) -> Result<Vec<String>, StoreError> {
    let names = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")?
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut own = Vec::new();
    let mut sequence = false;
    for n in names {
        if n == "sqlite_sequence" {
            sequence = true;
            continue;
        }
        if n.starts_with("sqlite_") {
            continue;
        }
        let ps = c
            .prepare("SELECT \"table\" FROM pragma_foreign_key_list(?1)")?
            .query_map([&n], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<BTreeSet<_>>>()?;
        parents.insert(n.clone(), ps);
        own.push(n);
    }
    let mut order = restore_order(&own, &parents);
    if sequence {
        order.push("sqlite_sequence".into());
    }
    Ok(order)
}

fn ident(name: &str) -> Result<&str, StoreError> {
    plain_identifier(name).map_err(StoreError::Corrupt)
}

/// Every table, in the caller's read transaction.
pub(super) fn dump(c: &Connection) -> Result<Dump, StoreError> {
    let taken_at = now(c)?;
    let schema_version = user_version(c)?;
    let mut out = Vec::new();
    for name in tables(c)? {
        let mut q = c.prepare(&format!("SELECT * FROM \"{}\"", ident(&name)?))?;
        let columns: Vec<String> = q.column_names().map(String::from).collect();
        let n = columns.len();
        let rows = q
            .query_map([], |r| {
                (0..n)
                    .map(|i| {
                        Ok(match r.get_ref(i)? {
                            ValueRef::Null => Value::Null,
                            ValueRef::Integer(v) => Value::Int(v),
                            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into()),
                            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
                            ValueRef::Real(_) => {
                                return Err(rusqlite::Error::InvalidColumnType(
                                    i,
                                    "a real number (the schema has none)".into(),
                                    rusqlite::types::Type::Real,
                                ));
                            }
                        })
                    })
                    .collect::<rusqlite::Result<Vec<_>>>()
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        out.push(TableDump {
            name,
            columns,
            rows,
        });
    }
    Ok(Dump {
        backend: "sqlite".into(),
        schema_version,
        taken_at,
        tables: out,
        sequences: Vec::new(),
    })
}

/// Replaces every table's rows with the dump's, in the caller's (write)
/// transaction: the triggers are dropped for the writes and created again
/// from their own text, so nothing is audited twice; foreign keys are
/// checked at the commit.
pub(super) fn restore(c: &Connection, d: &Dump) -> Result<(), TxError> {
    if let Some(why) = d.unfit_for("sqlite", user_version(c)?) {
        return Err(Refusal::Conflict(why).into());
    }
    let mine = tables(c)?;
    let theirs: BTreeSet<&str> = d.tables.iter().map(|t| t.name.as_str()).collect();
    for t in &mine {
        if !theirs.contains(t.as_str()) && t != "sqlite_sequence" {
            return Err(Refusal::Conflict(format!(
                "the backup has no table {t}, which this store has: it is not a whole dump"
            ))
            .into());
        }
    }
    c.execute_batch("PRAGMA defer_foreign_keys = ON")?;
    let triggers = c
        .prepare("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")?
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for (name, _) in &triggers {
        c.execute_batch(&format!("DROP TRIGGER \"{}\"", ident(name)?))?;
    }
    for t in mine.iter().rev() {
        c.execute(&format!("DELETE FROM \"{}\"", ident(t)?), [])?;
    }
    for t in &d.tables {
        if !mine.contains(&t.name) {
            return Err(Refusal::Conflict(format!(
                "the backup has a table {}, which this store does not",
                t.name
            ))
            .into());
        }
        if t.name == "sqlite_sequence" {
            // The inserts above moved the positions; the dump's are the ones.
            c.execute("DELETE FROM sqlite_sequence", [])?;
        }
        let cols = t
            .columns
            .iter()
            .map(|c| ident(c).map(|c| format!("\"{c}\"")))
            .collect::<Result<Vec<_>, _>>()?;
        let marks = (1..=cols.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>();
        let mut ins = c.prepare(&format!(
            "INSERT INTO \"{}\" ({}) VALUES ({})",
            ident(&t.name)?,
            cols.join(", "),
            marks.join(", ")
        ))?;
        for row in &t.rows {
            let vals: Vec<Sql> = row
                .iter()
                .map(|v| match v {
                    Value::Null => Sql::Null,
                    Value::Int(i) => Sql::Integer(*i),
                    Value::Bool(b) => Sql::Integer(i64::from(*b)),
                    Value::Text(s) => Sql::Text(s.clone()),
                    Value::Blob(b) => Sql::Blob(b.clone()),
                })
                .collect();
            ins.execute(rusqlite::params_from_iter(vals))?;
        }
    }
    for (_, sql) in &triggers {
        c.execute_batch(sql)?;
    }
    Ok(())
}
