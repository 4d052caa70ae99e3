//! Machines enrolled by their TPM's endorsement key (EK), so they join
//! with no token: one EK by its hash (`ek:<hex>`), or an EK CA whose
//! certificates admit every EK they certify (`ek-ca:<hex>`).
//!
//! A join with no token (`bcd join --attestor tpm`, a diskless node at
//! every boot) proves its EK by credential activation; the store then
//! admits it in this order ([`admit_tokenless`]): the live node already
//! bound to the EK, reclaimed at its next identity generation; else a new
//! node bound to it when the EK is enrolled, or certified by an enrolled
//! EK CA (the join service checked the chain, and names the CA's
//! enrolment). Nothing is spent: no token use is burned, however often
//! the machine boots. Removing an enrolment admits no new node; a node
//! bound to the EK stays bound until `nodes delete` frees it.

use crate::error::Refusal;
use crate::id::{NodeId, TokenId};
use crate::tokens::Joined;

/// The two kinds of enrolment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnrolmentKind {
    /// One EK, by the SHA-256 of its TPMT_PUBLIC.
    Ek,
    /// An EK CA: every EK whose certificate it signed.
    EkCa,
}

impl EnrolmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EnrolmentKind::Ek => "ek",
            EnrolmentKind::EkCa => "ek-ca",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ek" => Some(EnrolmentKind::Ek),
            "ek-ca" => Some(EnrolmentKind::EkCa),
            _ => None,
        }
    }
}

/// An enrolment as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enrolment {
    pub id: String,
    pub kind: EnrolmentKind,
    /// Kind `Ek`: the EK's SHA-256 (hex).
    pub ek_sha256: Option<String>,
    /// Kind `EkCa`: the CA certificate (DER).
    pub ca_der: Option<Vec<u8>>,
    pub subject: String,
    pub description: String,
    pub created_ms: i64,
    /// Kind `Ek`: the live node bound to the EK, if one joined.
    pub node_id: Option<NodeId>,
    /// Kind `EkCa`: the intermediate CAs between the CA (the anchor) and
    /// the EK certificates, DER one after another, as enrolled.
    pub ca_intermediates: Option<Vec<u8>>,
}

/// An enrolment to add.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEnrolment {
    pub kind: EnrolmentKind,
    pub ek_sha256: Option<String>,
    pub ca_der: Option<Vec<u8>>,
    pub ca_intermediates: Option<Vec<u8>>,
    pub subject: String,
    pub description: String,
}

impl NewEnrolment {
    /// One EK by its SHA-256 (64 hex digits, any case).
    pub fn ek(ek_sha256: &str, subject: &str, description: &str) -> Result<Self, Refusal> {
        let hash = ek_sha256.trim().to_ascii_lowercase();
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Refusal::BadRequest(format!(
                "{ek_sha256:?} is not an EK SHA-256: 64 hex digits, as a refused join prints \
                 it"
            )));
        }
        Ok(NewEnrolment {
            kind: EnrolmentKind::Ek,
            ek_sha256: Some(hash),
            ca_der: None,
            ca_intermediates: None,
            subject: subject.to_string(),
            description: description.to_string(),
        })
    }

    /// An EK CA certificate (DER) and the intermediates under it (DER
    /// certificates one after another; empty for none), already checked
    /// to parse.
    pub fn ek_ca(
        ca_der: Vec<u8>,
        intermediates: Vec<u8>,
        subject: &str,
        description: &str,
    ) -> Self {
        NewEnrolment {
            kind: EnrolmentKind::EkCa,
            ek_sha256: None,
            ca_der: Some(ca_der),
            ca_intermediates: (!intermediates.is_empty()).then_some(intermediates),
            subject: subject.to_string(),
            description: description.to_string(),
        }
    }

    /// `ek:<EK SHA-256>` or `ek-ca:<SHA-256 of the CA certificate>`.
    pub fn id(&self) -> String {
        match (self.kind, &self.ek_sha256, &self.ca_der) {
            (EnrolmentKind::Ek, Some(hash), _) => ek_id(hash),
            (_, _, Some(der)) => ca_id(der),
            (kind, _, _) => format!("{}:", kind.as_str()),
        }
    }
}

/// The id of the enrolment of the EK `ek_sha256`.
pub fn ek_id(ek_sha256: &str) -> String {
    format!("ek:{ek_sha256}")
}

/// The id of the enrolment of the EK CA certificate `der`.
pub fn ca_id(der: &[u8]) -> String {
    use sha2::Digest;
    format!("ek-ca:{}", hex::encode(sha2::Sha256::digest(der)))
}

pub fn already_enrolled(id: &str) -> Refusal {
    Refusal::Conflict(format!(
        "{id} is already enrolled: see better-compute machines list"
    ))
}

pub fn no_enrolment(id: &str) -> Refusal {
    Refusal::NotFound(format!(
        "no enrolment {id}: see better-compute machines list"
    ))
}

/// What a join with no token does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenlessJoin {
    /// The live node bound to the EK, at this identity generation.
    Reclaim { node_id: NodeId, generation: u64 },
    /// A new node bound to the EK, admitted by this enrolment (recorded as
    /// the node's join token).
    NewNode { admitted_by: TokenId },
}

/// The live node bound to an EK, as a join with no token finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundNode {
    pub node_id: NodeId,
    pub generation: i64,
    /// Quarantined as a cloned identity.
    pub quarantined: bool,
}

/// What a join with no token came to.
#[derive(Debug, Clone)]
pub enum Enrolled {
    Joined(Joined),
    /// The node bound to the EK has no certificate showing it is the
    /// attested machine ([`ProvesMachine`]): the binding was rewritten.
    /// Recorded as [`EK_BINDING_FORGED`] (committed); nothing else changed.
    Forged {
        node_id: NodeId,
    },
    /// Two machines alternate on the node's TPM identity: the node was
    /// quarantined (its certificates revoked, `duplicate-identity`) by this
    /// join, which the peer is refused with [`Refusal::Quarantined`].
    Quarantined {
        node_id: NodeId,
    },
}

/// Whether a stored certificate (DER) of node `node_id` shows it is the
/// machine that attested: a certificate the fleet CA issued naming the node
/// and the attested AK. Handed in by the join service, which holds the CA.
/// Whoever can write the store can rewrite `nodes.ek_sha256`, but not a
/// certificate, so a reclaim by a TPM's EK stands on what the CA signed.
pub type ProvesMachine = Box<dyn Fn(&str, &[u8]) -> bool + Send>;

/// The fleet event a join with no token is recorded as when the node its
/// EK is bound to has no certificate naming the attested AK.
pub const EK_BINDING_FORGED: &str = "security.ek-binding.forged";

/// What that event says.
pub const EK_BINDING_FORGED_DETAIL: &str = "a join with no token by a TPM whose attestation key \
     no certificate of this node names: its EK binding (nodes.ek_sha256) does not match what the \
     fleet CA certified; nothing was reclaimed";

/// Decides a join with no token of the EK `ek_sha256`: `bound`, the live
/// node bound to it; `enrolled`, whether the EK is enrolled by its hash;
/// `ca`, the enrolment of the EK CA that certified it, if any still
/// enrolled. A quarantined node is refused: only a join with a token
/// (an operator's) reclaims it.
pub fn admit_tokenless(
    ek_sha256: &str,
    bound: Option<BoundNode>,
    enrolled: bool,
    ca: Option<&str>,
) -> Result<TokenlessJoin, Refusal> {
    if let Some(BoundNode {
        node_id,
        generation,
        quarantined,
    }) = bound
    {
        if quarantined {
            return Err(Refusal::Quarantined(node_id.into_string()));
        }
        return Ok(TokenlessJoin::Reclaim {
            node_id,
            generation: generation.max(0) as u64 + 1,
        });
    }
    if enrolled {
        return Ok(TokenlessJoin::NewNode {
            admitted_by: TokenId::from(ek_id(ek_sha256)),
        });
    }
    if let Some(ca) = ca {
        return Ok(TokenlessJoin::NewNode {
            admitted_by: TokenId::from(ca),
        });
    }
    Err(Refusal::NotEnrolled(ek_sha256.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EK: &str = "e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4e4";

    fn bound(quarantined: bool) -> BoundNode {
        BoundNode {
            node_id: "nd-1".into(),
            generation: 3,
            quarantined,
        }
    }

    #[test]
    fn a_quarantined_node_is_not_reclaimed_with_no_token() {
        for enrolled in [false, true] {
            assert_eq!(
                admit_tokenless(EK, Some(bound(true)), enrolled, Some("ek-ca:aa")),
                Err(Refusal::Quarantined("nd-1".into()))
            );
        }
        let text = Refusal::Quarantined("nd-1".into()).to_string();
        assert!(text.contains("--attestor tpm --token TOKEN"), "{text}");
    }

    #[test]
    fn a_bound_ek_is_reclaimed_before_any_enrolment_is_looked_at() {
        for enrolled in [false, true] {
            for ca in [None, Some("ek-ca:aa")] {
                assert_eq!(
                    admit_tokenless(EK, Some(bound(false)), enrolled, ca).unwrap(),
                    TokenlessJoin::Reclaim {
                        node_id: "nd-1".into(),
                        generation: 4
                    }
                );
            }
        }
    }

    #[test]
    fn an_unbound_ek_needs_its_own_enrolment_or_its_cas() {
        assert_eq!(
            admit_tokenless(EK, None, true, Some("ek-ca:aa")).unwrap(),
            TokenlessJoin::NewNode {
                admitted_by: TokenId::from(ek_id(EK))
            }
        );
        assert_eq!(
            admit_tokenless(EK, None, false, Some("ek-ca:aa")).unwrap(),
            TokenlessJoin::NewNode {
                admitted_by: "ek-ca:aa".into()
            }
        );
        let refused = admit_tokenless(EK, None, false, None).unwrap_err();
        assert_eq!(refused, Refusal::NotEnrolled(EK.into()));
        let text = refused.to_string();
        assert!(text.contains(EK), "{text}");
        assert!(
            text.contains(&format!("better-compute machines enroll --ek-sha256 {EK}")),
            "{text}"
        );
    }

    #[test]
    fn an_ek_hash_is_64_hex_digits() {
        let e = NewEnrolment::ek(&EK.to_uppercase(), "", "").unwrap();
        assert_eq!(e.ek_sha256.as_deref(), Some(EK));
        assert_eq!(e.id(), format!("ek:{EK}"));
        for bad in ["", "e4", &format!("{EK}00"), &EK.replace('e', "g")] {
            let err = NewEnrolment::ek(bad, "", "").unwrap_err().to_string();
            assert!(err.contains("64 hex digits"), "{err}");
        }
    }
}
