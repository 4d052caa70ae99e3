//! Backup sets and the store's dump.
//!
//! A backup set is a row of `backups`: CREATING while its process writes
//! it, then COMPLETE (restore eligible) or FAILED with a reason. Only
//! CREATING moves, and only once; a FAILED set never becomes eligible
//! (every update is `WHERE state = 'CREATING'`). Triggers audit each state
//! a set takes (kind `backup`).
//!
//! A [`Dump`] is every table of the store read in one consistent read
//! transaction (SQLite: one WAL snapshot; PostgreSQL: one repeatable-read
//! snapshot), with the store's sequences: what `backup create` writes out
//! while the control plane runs. [`crate::Backend::restore`] writes a dump
//! back into a stopped store of the same backend and schema version in one
//! transaction, with the store's triggers off so the history is the dump's,
//! not a replay of it.
//!
//! [`interrupted`] is the start-up decision: a CREATING set whose process
//! is gone is moved to FAILED with [`MANIFEST_INCOMPLETE`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::leases::LeaseRow;

pub const CREATING: &str = "CREATING";
pub const COMPLETE: &str = "COMPLETE";
pub const FAILED: &str = "FAILED";
/// Every state a set may be in.
pub const STATES: [&str; 3] = [CREATING, COMPLETE, FAILED];
/// The reason of a set whose process died before its manifest was
/// written and the set recorded complete.
pub const MANIFEST_INCOMPLETE: &str = "MANIFEST_INCOMPLETE";

/// The reason a restored control plane gives the set it was restored
/// from: its dump holds the set as CREATING (the dump was read while the
/// set was written), so here it can never be restore eligible.
pub const RESTORED_FROM_THIS_SET: &str = "RESTORED_FROM_THIS_SET";

/// The lease a backup's process renews while it writes the set.
pub fn backup_lease(id: &str) -> String {
    format!("backup:{id}")
}

/// A set about to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBackup {
    pub id: String,
    /// Where its files go (a directory on `host`).
    pub location: String,
    /// The host writing it: its name and boot id.
    pub host: String,
    /// The process writing it: `PID:START` (its start time in clock ticks
    /// since boot, so a reused pid is not taken for it).
    pub process: String,
}

/// One row of `backups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupRow {
    pub id: String,
    pub state: String,
    pub reason: String,
    pub restore_eligible: bool,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub location: String,
    pub host: String,
    pub process: String,
    pub files: u64,
    pub bytes: u64,
}

/// Whether a set's process is gone, so the set can never complete: it is
/// CREATING, and its lease has lapsed (or was never taken), or its process
/// ran on this host (`here`) and `alive` says it is not running any more.
/// `lease` is the set's lease row, if there is one.
pub fn interrupted(
    row: &BackupRow,
    now: i64,
    lease: Option<&LeaseRow>,
    here: &str,
    alive: impl Fn(&str) -> bool,
) -> bool {
    if row.state != CREATING {
        return false;
    }
    let lapsed = lease.is_none_or(|l| !l.live(now));
    lapsed || (row.host == here && !alive(&row.process))
}

/// One value of a dumped row, as JSON: `null`, a number, a string,
/// `true`/`false`, or `{"hex": "..."}` for bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Bool(bool),
    Text(String),
    Blob(Vec<u8>),
}

impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_none(),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Text(t) => s.serialize_str(t),
            Value::Blob(b) => {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("hex", &hex::encode(b))?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Null => Ok(Value::Null),
            serde_json::Value::Bool(b) => Ok(Value::Bool(b)),
            serde_json::Value::Number(n) => n
                .as_i64()
                .map(Value::Int)
                .ok_or_else(|| D::Error::custom(format!("{n} is not a 64-bit integer"))),
            serde_json::Value::String(s) => Ok(Value::Text(s)),
            serde_json::Value::Object(m) if m.len() == 1 => match m.get("hex") {
                Some(serde_json::Value::String(h)) => hex::decode(h)
                    .map(Value::Blob)
                    .map_err(|e| D::Error::custom(format!("bytes that are not hex: {e}"))),
                _ => Err(D::Error::custom("an object value is {\"hex\": ...}")),
            },
            other => Err(D::Error::custom(format!("not a column value: {other}"))),
        }
    }
}

/// One table of a dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableDump {
    pub name: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

/// A sequence's position (PostgreSQL; SQLite keeps its own in the table
/// `sqlite_sequence`, dumped as a table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceDump {
    pub name: String,
    pub last_value: i64,
    pub is_called: bool,
}

/// Every table of a store, read in one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    /// `sqlite` or `postgres`: a dump restores into its own backend.
    pub backend: String,
    pub schema_version: u32,
    /// `compute_now()` in the dump's transaction.
    pub taken_at: i64,
    /// Parents before the tables whose foreign keys name them.
    pub tables: Vec<TableDump>,
    pub sequences: Vec<SequenceDump>,
}

impl Dump {
    /// Why this dump cannot be restored into a store of `backend` at
    /// `schema_version`, if it cannot.
    pub fn unfit_for(&self, backend: &str, schema_version: u32) -> Option<String> {
        if self.backend != backend {
            return Some(format!(
                "the backup is of a {} store and cannot be restored into a {backend} store: \
                 restore it with --store naming a {} store",
                self.backend, self.backend
            ));
        }
        if self.schema_version != schema_version {
            return Some(format!(
                "the backup was written at store schema version {} and this store is at {}: \
                 restore it with the better-compute release that wrote it, then upgrade",
                self.schema_version, schema_version
            ));
        }
        None
    }
}

/// `tables` ordered so that each comes after every table its foreign
/// keys name (`parents`: table → the tables it references); ties by name.
/// A cycle (none in this schema) keeps the remaining tables by name.
pub fn restore_order(
    tables: &[String],
    parents: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut left: BTreeSet<&String> = tables.iter().collect();
    let mut out: Vec<String> = Vec::with_capacity(tables.len());
    while !left.is_empty() {
        let ready: Vec<&String> = left
            .iter()
            .copied()
            .filter(|t| {
                parents
                    .get(*t)
                    .is_none_or(|ps| ps.iter().all(|p| p == *t || !left.contains(p)))
            })
            .collect();
        let take = if ready.is_empty() {
            left.iter().copied().collect()
        } else {
            ready
        };
        for t in take {
            left.remove(t);
            out.push(t.clone());
        }
    }
    out
}

/// An identifier the dump names, checked before it goes into SQL text:
/// table, column and sequence names are plain lowercase words.
pub fn plain_identifier(name: &str) -> Result<&str, String> {
    if !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        Ok(name)
    } else {
        Err(format!(
            "the dump names {name:?}, which is not a table or column name"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str, host: &str) -> BackupRow {
        BackupRow {
            id: "b1".into(),
            state: state.into(),
            reason: String::new(),
            restore_eligible: false,
            created_at: 0,
            finished_at: None,
            location: "/x".into(),
            host: host.into(),
            process: "7:100".into(),
            files: 0,
            bytes: 0,
        }
    }

    fn lease(expires: i64) -> LeaseRow {
        LeaseRow {
            name: backup_lease("b1"),
            owner: "7:100".into(),
            expires_at_ms: expires,
            renewed_at_ms: 0,
        }
    }

    #[test]
    fn a_creating_set_is_interrupted_when_its_process_or_lease_is_gone() {
        let here = "host-a boot-1";
        let r = row(CREATING, here);
        // Its process runs here, its lease is live: still being written.
        assert!(!interrupted(&r, 10, Some(&lease(20)), here, |_| true));
        // Its process is gone from this host.
        assert!(interrupted(&r, 10, Some(&lease(20)), here, |_| false));
        // Another host's process: only its lease tells.
        let there = row(CREATING, "host-b boot-9");
        assert!(!interrupted(&there, 10, Some(&lease(20)), here, |_| false));
        assert!(interrupted(&there, 21, Some(&lease(20)), here, |_| true));
        assert!(interrupted(&there, 10, None, here, |_| true));
        // Settled sets never move.
        for s in [COMPLETE, FAILED] {
            assert!(!interrupted(&row(s, here), 99, None, here, |_| false));
        }
    }

    #[test]
    fn values_round_trip_through_json() {
        let vals = vec![
            Value::Null,
            Value::Int(i64::MIN),
            Value::Int(i64::MAX),
            Value::Bool(true),
            Value::Text("{\"hex\":\"00\"}".into()),
            Value::Blob(vec![0, 1, 254, 255]),
        ];
        let text = serde_json::to_string(&vals).unwrap();
        assert_eq!(
            text,
            r#"[null,-9223372036854775808,9223372036854775807,true,"{\"hex\":\"00\"}",{"hex":"0001feff"}]"#
        );
        assert_eq!(serde_json::from_str::<Vec<Value>>(&text).unwrap(), vals);
        assert!(serde_json::from_str::<Value>("1.5").is_err());
        assert!(serde_json::from_str::<Value>(r#"{"hex":"zz"}"#).is_err());
    }

    #[test]
    fn parents_restore_before_children() {
        let tables: Vec<String> = ["rollout_nodes", "nodes", "rollouts", "releases", "audit"]
            .map(String::from)
            .to_vec();
        let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        parents.insert("rollout_nodes".into(), ["rollouts".into()].into());
        parents.insert("rollouts".into(), ["releases".into()].into());
        parents.insert("nodes".into(), ["nodes".into()].into());
        assert_eq!(
            restore_order(&tables, &parents),
            ["audit", "nodes", "releases", "rollouts", "rollout_nodes"]
        );
    }

    #[test]
    fn a_dump_restores_only_into_its_backend_and_version() {
        let d = Dump {
            backend: "sqlite".into(),
            schema_version: 13,
            taken_at: 0,
            tables: vec![],
            sequences: vec![],
        };
        assert_eq!(d.unfit_for("sqlite", 13), None);
        assert!(d.unfit_for("postgres", 13).unwrap().contains("--store"));
        assert!(d.unfit_for("sqlite", 14).unwrap().contains("version 13"));
        assert!(plain_identifier("node_specs").is_ok());
        assert!(plain_identifier("x\"; DROP").is_err());
    }
}
