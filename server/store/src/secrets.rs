//! The secret broker's values: each version of a secret, sealed under a
//! key only the key holder has (`bcd_proto::secret::at_rest`, bound to the
//! name and version), so whoever reads or writes the store learns no value
//! and cannot move one to another name or version. A version is written
//! once; a rotation adds the next; a deletion wipes every version's value
//! and keeps the name's versions counted, so a name put again never
//! reuses a version a node may have been handed.

/// Seals a value for the version the store decided; `None` when it
/// cannot (the system's random number generator failed).
pub type SealSecret = Box<dyn FnOnce(u64) -> Option<Vec<u8>> + Send>;

/// One version of a secret as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub name: String,
    pub version: u64,
    pub sealed: Vec<u8>,
    pub created_ms: i64,
    pub created_by: String,
}

/// A secret's newest version, without its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSummary {
    pub name: String,
    pub version: u64,
    pub created_ms: i64,
    pub created_by: String,
}

/// What a put asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// A new name (or one deleted before).
    New,
    /// The next version of a secret that exists.
    Rotate,
}

pub(crate) fn unsealed() -> crate::Refusal {
    crate::Refusal::Internal("the secret's value could not be sealed".into())
}

pub(crate) fn exists(name: &str) -> crate::Refusal {
    crate::Refusal::Conflict(format!(
        "secret {name} exists: give it a new value with better-compute secrets rotate {name}"
    ))
}

pub(crate) fn missing(name: &str) -> crate::Refusal {
    crate::Refusal::NotFound(format!(
        "no secret {name}: see better-compute secrets list, or put it with better-compute \
         secrets put {name}"
    ))
}
