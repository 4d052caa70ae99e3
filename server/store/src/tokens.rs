//! Join tokens and operator credentials.
//!
//! The store keeps a token's secret only as its SHA-256. A join spends one
//! use of a token, creates the node and records its first certificate in
//! one transaction; [`admit`] decides whether the token may be spent.
//!
//! A machine that joined before may prove it still holds the key of its
//! node's current certificate ([`PreviousProof`]): the join then re-enrols
//! that node instead of creating another, in one transaction too (the
//! token spent, the same node id at the next identity generation, every
//! earlier certificate revoked with a worker-signed statement, the new one
//! recorded, a fleet event kept); [`judge_proof`] decides whether the proof
//! holds. A refused proof, like any refused join, spends nothing.

use crate::id::{NodeId, OperatorId, TokenId};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Refusal;
use crate::nodes::IssuedCert;

/// A join token to create.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub id: TokenId,
    pub secret_sha256: String,
    pub ttl: Duration,
    pub uses: u32,
    pub description: String,
    /// The pool its nodes join (`None`: none).
    pub pool: Option<String>,
}

/// A join token as an operator sees it: never its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: TokenId,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub uses_total: i64,
    pub uses_left: i64,
    pub description: String,
    pub pool: Option<String>,
    /// The MAC the boot endpoint minted it for (one use, short-lived).
    pub minted_for_mac: Option<String>,
}

/// The most tokens one listing returns, newest first.
pub const LIST_LIMIT: i64 = 1_000;

/// The columns [`TokenInfo`] is read from, in its order.
pub const TOKEN_INFO_COLUMNS: &str =
    "id, created_at, expires_at, uses_total, uses_left, description, pool, minted_for_mac";

/// A node's request to join with a token.
#[derive(Debug, Clone)]
pub struct JoinInput {
    pub token_id: TokenId,
    pub secret_sha256: String,
    pub hostname: String,
    pub ramdisk: bool,
    /// The MAC addresses the node reported (colon-separated, lowercase;
    /// the caller parsed them): each now names this node for the boot
    /// endpoint.
    pub macs: Vec<String>,
}

/// A node that joined (or renewed): its id, the certificate recorded for
/// it, the store's time of the transaction, and what the store knows the
/// node took on (its replay floors: a node that joins again as itself
/// starts above them).
#[derive(Debug, Clone)]
pub struct Joined {
    pub node_id: NodeId,
    pub cert: IssuedCert,
    pub now_ms: i64,
    /// The highest command sequence the store issued the node.
    pub command_seq_floor: u64,
    /// The node's spec generation.
    pub spec_generation_floor: u64,
    /// The node's identity generation: 1 at its first join, one more at
    /// each re-enrolment.
    pub identity_generation: u64,
}

impl Joined {
    /// A node created by this join, at identity generation 1. Its floors
    /// are zero: nothing was issued to an id that did not exist (a node's
    /// row is never removed, so an id is never made twice).
    pub fn new_node(node_id: NodeId, cert: IssuedCert, now_ms: i64) -> Joined {
        Joined {
            node_id,
            cert,
            now_ms,
            command_seq_floor: 0,
            spec_generation_floor: 0,
            identity_generation: 1,
        }
    }
}

/// Checks a signature against a stored certificate: that the certificate
/// is one the fleet CA issued (a row whoever can write the store planted
/// proves nothing) and that its key made the signature.
pub type CheckProof = Arc<dyn Fn(&[u8], &[u8], &[u8]) -> bool + Send + Sync>;

/// A joining machine's proof that it holds the key of an existing node.
#[derive(Clone)]
pub struct PreviousProof {
    pub node_id: NodeId,
    /// What the old key signed (`bcd_proto::reenrol::statement` of the node
    /// id, the token id and the request's CSR).
    pub message: Vec<u8>,
    pub signature: Vec<u8>,
    /// Checks a signature against a certificate of the node's.
    pub verify: CheckProof,
}

impl std::fmt::Debug for PreviousProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreviousProof")
            .field("node_id", &self.node_id)
            .field("message", &self.message.len())
            .field("signature", &self.signature.len())
            .finish_non_exhaustive()
    }
}

/// The node a proof names, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenNode {
    pub deleted: bool,
    pub identity_generation: i64,
}

/// The fleet event a re-enrolment records.
pub const REENROLLED_EVENT: &str = "node.re-enrolled";

/// Whether `proof` re-enrols `node` (`None`: no such node), whose unrevoked
/// certificates are `certs` (DER): the node must exist and not be deleted,
/// and the signature must be by the key of one of those certificates.
/// Returns the identity generation the node moves to.
pub fn judge_proof(
    node: Option<&ProvenNode>,
    certs: &[Vec<u8>],
    proof: &PreviousProof,
) -> Result<u64, Refusal> {
    let refuse = |why: &str| Refusal::NotReenrolled(proof.node_id.to_string(), why.to_string());
    let Some(node) = node else {
        return Err(refuse("there is no such node"));
    };
    if node.deleted {
        return Err(refuse("it was deleted"));
    }
    if certs.is_empty() {
        return Err(refuse("it has no unrevoked certificate"));
    }
    if !certs
        .iter()
        .any(|der| (proof.verify)(der, &proof.message, &proof.signature))
    {
        return Err(refuse(
            "the proof is not signed by the key of its current certificate",
        ));
    }
    Ok(node.identity_generation.max(0) as u64 + 1)
}

/// Builds the joining node's certificate once the token (and a
/// re-enrolment's proof) is known good:
/// gets the new node id and the store's now. Runs inside the join's
/// transaction; a refusal from it leaves nothing behind.
pub type IssueCert = Box<dyn FnOnce(&str, i64) -> Result<IssuedCert, Refusal> + Send>;

/// A token as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub secret_sha256: String,
    pub expires_at_ms: i64,
    pub uses_left: i64,
}

/// Whether a join may spend one use of `token` (`None`: no such token).
/// A wrong secret reads as an unknown token, so a guesser learns nothing.
pub fn admit(token: Option<&TokenRow>, secret_sha256: &str, now_ms: i64) -> Result<(), Refusal> {
    let Some(t) = token else {
        return Err(Refusal::UnknownToken);
    };
    if t.secret_sha256 != secret_sha256 {
        return Err(Refusal::UnknownToken);
    }
    if t.expires_at_ms < now_ms {
        return Err(Refusal::ExpiredToken);
    }
    if t.uses_left <= 0 {
        return Err(Refusal::UsedToken);
    }
    Ok(())
}

/// What the fleet event of a re-enrolment says.
pub fn reenrol_detail(generation: u64, revoked: &[String], token_id: &str) -> String {
    format!(
        "re-enrolled with token {token_id}: identity generation {generation}, revoked {}",
        if revoked.is_empty() {
            "nothing".to_string()
        } else {
            revoked.join(", ")
        }
    )
}

/// What the fleet event of a node reclaimed by its TPM's EK says.
pub fn reclaim_detail(generation: u64, revoked: &[String], token_id: &str) -> String {
    format!(
        "reclaimed by its TPM's EK with token {token_id}: identity generation {generation}, \
         revoked {}",
        if revoked.is_empty() {
            "nothing".to_string()
        } else {
            revoked.join(", ")
        }
    )
}

/// The fleet event's detail of a join with no token that reclaimed the
/// node bound to the EK (a diskless node's every boot).
pub fn reattest_detail(generation: u64, revoked: &[String], _token_id: &str) -> String {
    format!(
        "re-attested by its TPM's EK with no token: identity generation {generation}, revoked \
         {}",
        if revoked.is_empty() {
            "nothing".to_string()
        } else {
            revoked.join(", ")
        }
    )
}

/// A fresh join token's id (16 hex digits) and secret (32 hex digits).
pub fn new_token_secret() -> (String, String) {
    (
        format!("{:016x}", rand::random::<u64>()),
        format!("{:032x}", rand::random::<u128>()),
    )
}

/// A fresh node id: `nd-` and 12 hex digits.
pub fn new_node_id() -> NodeId {
    NodeId::from(format!("nd-{:012x}", rand::random::<u64>() >> 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(expires_at_ms: i64, uses_left: i64) -> TokenRow {
        TokenRow {
            secret_sha256: "h".into(),
            expires_at_ms,
            uses_left,
        }
    }

    #[test]
    fn a_token_is_spent_while_it_has_uses_and_time() {
        assert_eq!(admit(Some(&row(100, 1)), "h", 100), Ok(()));
        assert_eq!(admit(None, "h", 0), Err(Refusal::UnknownToken));
        assert_eq!(
            admit(Some(&row(100, 1)), "wrong", 0),
            Err(Refusal::UnknownToken)
        );
        assert_eq!(
            admit(Some(&row(100, 1)), "h", 101),
            Err(Refusal::ExpiredToken)
        );
        assert_eq!(admit(Some(&row(100, 0)), "h", 0), Err(Refusal::UsedToken));
    }

    fn verify(cert: &[u8], message: &[u8], signature: &[u8]) -> bool {
        signature == [cert, message].concat()
    }

    #[test]
    fn a_proof_re_enrols_only_a_live_node_signed_by_one_of_its_certificates() {
        let proof = |signature: &[u8]| PreviousProof {
            node_id: "nd-1".into(),
            message: b"m".to_vec(),
            signature: signature.to_vec(),
            verify: Arc::new(verify),
        };
        let live = ProvenNode {
            deleted: false,
            identity_generation: 2,
        };
        let certs = vec![b"old".to_vec(), b"new".to_vec()];
        assert_eq!(judge_proof(Some(&live), &certs, &proof(b"oldm")), Ok(3));
        assert_eq!(judge_proof(Some(&live), &certs, &proof(b"newm")), Ok(3));
        let why = |r: Result<u64, Refusal>| match r {
            Err(Refusal::NotReenrolled(node, why)) => {
                assert_eq!(node, "nd-1");
                why
            }
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(
            why(judge_proof(Some(&live), &certs, &proof(b"otherm"))),
            "the proof is not signed by the key of its current certificate"
        );
        assert_eq!(
            why(judge_proof(Some(&live), &[], &proof(b"oldm"))),
            "it has no unrevoked certificate"
        );
        let deleted = ProvenNode {
            deleted: true,
            ..live
        };
        assert_eq!(
            why(judge_proof(Some(&deleted), &certs, &proof(b"oldm"))),
            "it was deleted"
        );
        assert_eq!(
            why(judge_proof(None, &certs, &proof(b"oldm"))),
            "there is no such node"
        );
        let text = Refusal::NotReenrolled("nd-1".into(), "it was deleted".into()).to_string();
        assert!(
            text.contains("bcd join --new-node") && text.contains("nodes delete nd-1"),
            "{text}"
        );
    }

    #[test]
    fn node_ids_have_one_shape() {
        let id = new_node_id();
        assert_eq!(id.len(), 15);
        assert!(id.starts_with("nd-") && id[3..].bytes().all(|b| b.is_ascii_hexdigit()));
    }
}

/// What an operator may do through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OperatorRole {
    /// Lists and reads; changes nothing.
    ReadOnly,
    /// Anything the API offers.
    Admin,
}

impl OperatorRole {
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorRole::ReadOnly => "read-only",
            OperatorRole::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<OperatorRole> {
        match s {
            "read-only" => Some(OperatorRole::ReadOnly),
            "admin" => Some(OperatorRole::Admin),
            _ => None,
        }
    }
}

impl std::fmt::Display for OperatorRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operator to record, with the certificate the operator CA issued it.
#[derive(Debug, Clone)]
pub struct NewOperator {
    pub id: OperatorId,
    pub role: OperatorRole,
    /// SHA-256 of the certificate (DER), hex.
    pub cert_sha256: String,
    pub cert_serial: String,
    pub not_after: i64,
}

/// An operator as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorRow {
    pub id: OperatorId,
    pub role: OperatorRole,
    /// `None` for an operator from before certificates (always revoked).
    pub cert_sha256: Option<String>,
    pub cert_serial: Option<String>,
    pub created_at: i64,
    pub not_after: Option<i64>,
    pub revoked_at: Option<i64>,
    /// The key holder's signed revocation (a worker-signed
    /// `OperatorRevocation`), if revoked since migration 0038.
    pub revocation: Option<Vec<u8>>,
}

/// Signs an operator's revocation: given the row and the store's time of
/// the revocation, the sealed statement to keep beside it.
pub type SealRevocation = Box<dyn FnOnce(&OperatorRow, i64) -> Vec<u8> + Send>;

impl OperatorRow {
    /// Whether this row lets its certificate call the API now.
    pub fn active(&self, now_ms: i64) -> bool {
        self.revoked_at.is_none()
            && self.cert_sha256.is_some()
            && self.not_after.is_some_and(|t| t > now_ms)
    }
}

/// The columns [`OperatorRow`] reads, in order.
pub(crate) const OPERATOR_COLUMNS: &str =
    "id, role, cert_sha256, cert_serial, created_at, not_after, revoked_at, revocation";

pub(crate) fn operator_role(s: &str) -> Result<OperatorRole, crate::error::StoreError> {
    OperatorRole::parse(s)
        .ok_or_else(|| crate::error::StoreError::Corrupt(format!("operator role {s:?}")))
}

pub(crate) fn operator_exists(id: &str) -> Refusal {
    Refusal::Conflict(format!(
        "an operator named {id} already exists (better-compute operators list): choose another \
         name"
    ))
}

pub(crate) fn no_operator(id: &str) -> Refusal {
    Refusal::NotFound(format!(
        "no operator {id}: see better-compute operators list"
    ))
}
