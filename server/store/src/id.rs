//! The fleet's identifiers, one type each: a node's id cannot be passed
//! where a gateway's is asked for, nor a command's where a token's is, nor
//! a release's sequence where a number of another kind is.
//!
//! Each is what the store keeps and the wire carries, unchanged
//! (`#[serde(transparent)]`, bound and read as the column's text, or for
//! [`ReleaseSeq`] its number): typing them changes no row, file or message.
//! An id is made from text where it comes in (a certificate, a request, a
//! row) with `From`; it reads as `&str` (`as_str`, `Deref`) where it goes
//! out (a statement's text, a log line, a message). The store's operations
//! and the bodies they run take each id by its type
//! (`tests/tests/architecture.rs` checks both), so an argument of one kind
//! given for another does not compile there.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

macro_rules! ids {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[derive(serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id's text, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                $name(text)
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                $name(text.to_owned())
            }
        }

        impl From<&String> for $name {
            fn from(text: &String) -> Self {
                $name(text.clone())
            }
        }

        impl From<&$name> for $name {
            fn from(id: &$name) -> Self {
                id.clone()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl rusqlite::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                self.0.to_sql()
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                String::column_result(value).map($name)
            }
        }

        impl tokio_postgres::types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.0.to_sql(ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <String as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }

        impl<'a> tokio_postgres::types::FromSql<'a> for $name {
            fn from_sql(
                ty: &tokio_postgres::types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                String::from_sql(ty, raw).map($name)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <String as tokio_postgres::types::FromSql>::accepts(ty)
            }
        }
    )+};
}

ids! {
    /// A node: the id its certificates name (`nd-<hex>`), given at its
    /// first join and kept through re-enrolments.
    NodeId;
    /// A gateway: the name its certificate and credential carry, which
    /// sessions and leases are routed by.
    GatewayId;
    /// A command: its id as the key holder minted it, which the node's
    /// result and the seal name.
    CommandId;
    /// An operator: the id an operator certificate names.
    OperatorId;
    /// A join token: its public id (never its secret).
    TokenId;
    /// A boot image: the digest-derived id `image register` gives it.
    ImageId;
}

/// A release: its sequence, which its signed manifest carries and which
/// only grows from one release to the next (the store keeps one release
/// per sequence). Kept in a `BIGINT` column; a sequence past `i64::MAX`
/// binds as `i64::MAX`, which no manifest reaches.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct ReleaseSeq(u64);

impl ReleaseSeq {
    /// The release of sequence `n`.
    pub const fn new(n: u64) -> ReleaseSeq {
        ReleaseSeq(n)
    }

    /// The sequence as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The value its column holds.
    fn column(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }
}

impl From<u64> for ReleaseSeq {
    fn from(n: u64) -> Self {
        ReleaseSeq(n)
    }
}

impl PartialEq<u64> for ReleaseSeq {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

impl PartialEq<ReleaseSeq> for u64 {
    fn eq(&self, other: &ReleaseSeq) -> bool {
        *self == other.0
    }
}

impl fmt::Display for ReleaseSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for ReleaseSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl rusqlite::ToSql for ReleaseSeq {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::from(self.column()))
    }
}

impl rusqlite::types::FromSql for ReleaseSeq {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let n = i64::column_result(value)?;
        u64::try_from(n)
            .map(ReleaseSeq)
            .map_err(|_| rusqlite::types::FromSqlError::OutOfRange(n))
    }
}

impl tokio_postgres::types::ToSql for ReleaseSeq {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.column().to_sql(ty, out)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <i64 as tokio_postgres::types::ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

impl<'a> tokio_postgres::types::FromSql<'a> for ReleaseSeq {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let n = i64::from_sql(ty, raw)?;
        Ok(ReleaseSeq(u64::try_from(n).map_err(|_| {
            format!("a release sequence is never negative: {n}")
        })?))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <i64 as tokio_postgres::types::FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An id serializes as its bare text, so typing the ids changed no
    /// JSON the store or the API writes.
    #[test]
    fn an_id_serializes_as_its_text() {
        let id = NodeId::from("nd-0a1b");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"nd-0a1b\"");
        let back: NodeId = serde_json::from_str("\"nd-0a1b\"").unwrap();
        assert_eq!(back, id);
        assert_eq!(format!("{id} {id:?}"), "nd-0a1b \"nd-0a1b\"");
    }

    /// A release's sequence binds as its column's number, clamped to it.
    #[test]
    fn a_release_sequence_binds_as_its_number() {
        assert_eq!(ReleaseSeq::new(7).column(), 7);
        assert_eq!(ReleaseSeq::new(u64::MAX).column(), i64::MAX);
        assert_eq!(serde_json::to_string(&ReleaseSeq::new(7)).unwrap(), "7");
    }

    /// A negative sequence in the column is no release's: an error, not a
    /// wrapped number.
    #[test]
    fn a_negative_sequence_reads_as_an_error() {
        use rusqlite::types::{FromSql, ValueRef};
        assert_eq!(ReleaseSeq::column_result(ValueRef::Integer(7)).unwrap(), 7);
        assert!(ReleaseSeq::column_result(ValueRef::Integer(-1)).is_err());
    }

    /// A map keyed by an id is looked up by text.
    #[test]
    fn an_id_keyed_map_is_read_by_text() {
        let mut seen = std::collections::HashMap::new();
        seen.insert(GatewayId::from("gw-0"), 1);
        assert_eq!(seen.get("gw-0"), Some(&1));
    }
}
