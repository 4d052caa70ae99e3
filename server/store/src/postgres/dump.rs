//! The dump and the restore (backup sets' records: `crate::sql::backups`).

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::types::{ToSql, Type};

use super::{Tx, now, query};
use crate::backups::{Dump, SequenceDump, TableDump, Value, plain_identifier, restore_order};
use crate::error::{Refusal, StoreError, TxError};

fn ident(name: &str) -> Result<&str, StoreError> {
    plain_identifier(name).map_err(StoreError::Corrupt)
}

/// The store's tables (not `bc_schema`, the migrations' own), parents
/// first.
async fn tables(tx: &Tx<'_>) -> Result<Vec<String>, StoreError> {
    let names: Vec<String> = query(
        tx,
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind = 'r' AND c.relname <> 'bc_schema'
         ORDER BY 1",
        &[],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in query(
        tx,
        "SELECT cl.relname::text, pc.relname::text FROM pg_constraint k
             JOIN pg_class cl ON cl.oid = k.conrelid
             JOIN pg_class pc ON pc.oid = k.confrelid
             JOIN pg_namespace n ON n.oid = cl.relnamespace
         WHERE k.contype = 'f' AND n.nspname = current_schema()",
        &[],
    )
    .await?
    {
        parents.entry(r.get(0)).or_default().insert(r.get(1));
    }
    Ok(restore_order(&names, &parents))
}

fn value(r: &tokio_postgres::Row, i: usize) -> Result<Value, StoreError> {
    let ty = r.columns()[i].type_();
    Ok(if *ty == Type::INT8 {
        r.get::<_, Option<i64>>(i).map_or(Value::Null, Value::Int)
    } else if *ty == Type::INT4 {
        r.get::<_, Option<i32>>(i)
            .map_or(Value::Null, |v| Value::Int(v.into()))
    } else if *ty == Type::INT2 {
        r.get::<_, Option<i16>>(i)
            .map_or(Value::Null, |v| Value::Int(v.into()))
    } else if *ty == Type::BOOL {
        r.get::<_, Option<bool>>(i).map_or(Value::Null, Value::Bool)
    } else if *ty == Type::TEXT || *ty == Type::VARCHAR {
        r.get::<_, Option<String>>(i)
            .map_or(Value::Null, Value::Text)
    } else if *ty == Type::BYTEA {
        r.get::<_, Option<Vec<u8>>>(i)
            .map_or(Value::Null, Value::Blob)
    } else {
        return Err(StoreError::Corrupt(format!(
            "column {} has type {ty}, which a dump does not carry",
            r.columns()[i].name()
        )));
    })
}

/// Every table and sequence, in the caller's repeatable-read transaction.
pub(super) async fn dump(tx: &Tx<'_>) -> Result<Dump, StoreError> {
    let taken_at = now(tx).await?;
    let version: i64 = super::query_one(tx, "SELECT version FROM bc_schema", &[])
        .await?
        .get(0);
    let mut out = Vec::new();
    for name in tables(tx).await? {
        // Generated columns are not dumped: the database computes them
        // again as the rows are restored.
        let cols: Vec<String> = query(
            tx,
            "SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped
               AND a.attgenerated = ''
             ORDER BY a.attnum",
            &[&name],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
        let list = cols
            .iter()
            .map(|c| ident(c).map(|c| format!("\"{c}\"")))
            .collect::<Result<Vec<_>, _>>()?
            .join(", ");
        let rows = tx
            .query(&format!("SELECT {list} FROM \"{}\"", ident(&name)?), &[])
            .await?
            .iter()
            .map(|r| (0..cols.len()).map(|i| value(r, i)).collect())
            .collect::<Result<Vec<_>, _>>()?;
        out.push(TableDump {
            name,
            columns: cols,
            rows,
        });
    }
    let mut sequences = Vec::new();
    let names: Vec<String> = query(
        tx,
        "SELECT sequencename::text FROM pg_sequences WHERE schemaname = current_schema()
         ORDER BY 1",
        &[],
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect();
    for name in names {
        let r = tx
            .query_one(
                &format!("SELECT last_value, is_called FROM \"{}\"", ident(&name)?),
                &[],
            )
            .await?;
        sequences.push(SequenceDump {
            name,
            last_value: r.get(0),
            is_called: r.get(1),
        });
    }
    Ok(Dump {
        backend: "postgres".into(),
        schema_version: version.clamp(0, u32::MAX as i64) as u32,
        taken_at,
        tables: out,
        sequences,
    })
}

/// A value as a parameter of type `ty`.
fn param(v: &Value, ty: &Type) -> Result<Box<dyn ToSql + Sync + Send>, StoreError> {
    let wrong = || {
        StoreError::Corrupt(format!(
            "the dump holds {v:?} for a column of type {ty}: it is not this schema's dump"
        ))
    };
    Ok(match (v, ty) {
        (Value::Null, t) if *t == Type::INT8 => Box::new(None::<i64>),
        (Value::Null, t) if *t == Type::INT4 => Box::new(None::<i32>),
        (Value::Null, t) if *t == Type::INT2 => Box::new(None::<i16>),
        (Value::Null, t) if *t == Type::BOOL => Box::new(None::<bool>),
        (Value::Null, t) if *t == Type::BYTEA => Box::new(None::<Vec<u8>>),
        (Value::Null, _) => Box::new(None::<String>),
        (Value::Int(i), t) if *t == Type::INT8 => Box::new(*i),
        (Value::Int(i), t) if *t == Type::INT4 => Box::new(i32::try_from(*i).map_err(|_| wrong())?),
        (Value::Int(i), t) if *t == Type::INT2 => Box::new(i16::try_from(*i).map_err(|_| wrong())?),
        (Value::Bool(b), t) if *t == Type::BOOL => Box::new(*b),
        (Value::Text(s), t) if *t == Type::TEXT || *t == Type::VARCHAR => Box::new(s.clone()),
        (Value::Blob(b), t) if *t == Type::BYTEA => Box::new(b.clone()),
        _ => return Err(wrong()),
    })
}

/// Replaces every table's rows and every sequence's position with the
/// dump's, in the caller's transaction, with the tables' own triggers off
/// for it (so nothing is audited twice).
pub(super) async fn restore(tx: &Tx<'_>, d: &Dump) -> Result<(), TxError> {
    let version: i64 = super::query_one(tx, "SELECT version FROM bc_schema", &[])
        .await?
        .get(0);
    if let Some(why) = d.unfit_for("postgres", version.clamp(0, u32::MAX as i64) as u32) {
        return Err(Refusal::Conflict(why).into());
    }
    let mine = tables(tx).await?;
    let theirs: BTreeSet<&str> = d.tables.iter().map(|t| t.name.as_str()).collect();
    if let Some(t) = mine.iter().find(|t| !theirs.contains(t.as_str())) {
        return Err(Refusal::Conflict(format!(
            "the backup has no table {t}, which this store has: it is not a whole dump"
        ))
        .into());
    }
    if let Some(t) = d.tables.iter().find(|t| !mine.contains(&t.name)) {
        return Err(Refusal::Conflict(format!(
            "the backup has a table {}, which this store does not",
            t.name
        ))
        .into());
    }
    let all = mine
        .iter()
        .map(|t| ident(t).map(|t| format!("\"{t}\"")))
        .collect::<Result<Vec<_>, _>>()?;
    // Triggers off first: none of the store's own may act on the emptying
    // (TRUNCATE fires no row triggers, but a table may guard itself).
    for t in &all {
        tx.batch_execute(&format!("ALTER TABLE {t} DISABLE TRIGGER USER"))
            .await
            .map_err(StoreError::from)?;
    }
    tx.batch_execute(&format!("TRUNCATE {}", all.join(", ")))
        .await
        .map_err(StoreError::from)?;
    for t in &d.tables {
        let cols = t
            .columns
            .iter()
            .map(|c| ident(c).map(|c| format!("\"{c}\"")))
            .collect::<Result<Vec<_>, _>>()?;
        let marks = (1..=cols.len())
            .map(|i| format!("${i}"))
            .collect::<Vec<_>>();
        let st = tx
            .prepare(&format!(
                "INSERT INTO \"{}\" ({}) VALUES ({})",
                ident(&t.name)?,
                cols.join(", "),
                marks.join(", ")
            ))
            .await
            .map_err(StoreError::from)?;
        for row in &t.rows {
            let params = row
                .iter()
                .zip(st.params())
                .map(|(v, ty)| param(v, ty))
                .collect::<Result<Vec<_>, _>>()?;
            let refs: Vec<&(dyn ToSql + Sync)> = params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect();
            tx.execute(&st, &refs).await.map_err(StoreError::from)?;
        }
    }
    for s in &d.sequences {
        let name = ident(&s.name)?;
        tx.execute(
            &format!("SELECT setval('\"{name}\"', $1, $2)"),
            &[&s.last_value, &s.is_called],
        )
        .await
        .map_err(StoreError::from)?;
    }
    for t in &all {
        tx.batch_execute(&format!("ALTER TABLE {t} ENABLE TRIGGER USER"))
            .await
            .map_err(StoreError::from)?;
    }
    Ok(())
}
