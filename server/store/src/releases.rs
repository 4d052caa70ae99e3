//! Signed releases of bcd, once per sequence.
//!
//! The caller verifies a release (signature, hash, target) before it is
//! registered; the store keeps the signed manifest and the binary as given
//! and refuses a sequence registered before.

use crate::error::Refusal;
use crate::id::ReleaseSeq;

/// A verified release to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRelease {
    pub sequence: ReleaseSeq,
    pub version: String,
    pub target: String,
    pub size: u64,
    pub sha256: String,
    pub key_id: String,
    pub signed_manifest: Vec<u8>,
    pub binary: Vec<u8>,
}

/// A registered release, without its binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRow {
    pub version: String,
    pub sequence: ReleaseSeq,
    pub target: String,
    pub size: u64,
    pub sha256: String,
    pub key_id: String,
    pub registered_at_ms: i64,
}

/// A release's signed manifest and its binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseFiles {
    pub signed_manifest: Vec<u8>,
    pub binary: Vec<u8>,
}

/// A release's signed manifest and the length of its stored binary: what
/// a streamed download starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseHead {
    pub signed_manifest: Vec<u8>,
    pub size: u64,
}

/// The most bytes one [`GatewayBackend::release_chunk`](crate::GatewayBackend::release_chunk)
/// call reads.
pub const MAX_CHUNK: u32 = 4 << 20;

pub fn already_registered(sequence: ReleaseSeq) -> Refusal {
    Refusal::Conflict(format!(
        "release sequence {sequence} is already registered: sign the new release with a higher --sequence"
    ))
}
