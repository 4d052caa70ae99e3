//! Nodes and their certificates.
//!
//! A certificate is valid while its node exists, it is not revoked and it
//! has not run out, all on the store's clock ([`check_cert`]). Deleting a
//! node revokes its certificates; the gateways' revocation feed reads
//! [`Revocation`]s. A node's conditions and taints are lists of names.

use crate::error::Refusal;

/// The certificate a join or renewal issues, decided before it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    pub der: Vec<u8>,
    pub serial: String,
    pub fingerprint: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// Builds a renewing node's next certificate: gets the node id, the
/// store's now and whether the node boots from a ramdisk.
pub type RenewCert = Box<dyn FnOnce(&str, i64, bool) -> Result<IssuedCert, crate::Refusal> + Send>;

/// A certificate as the store keeps it, with its node's deletion time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRow {
    pub node_id: String,
    pub serial: String,
    pub revoked_at_ms: Option<i64>,
    pub revoke_reason: Option<String>,
    pub not_after_ms: i64,
    pub node_deleted_at_ms: Option<i64>,
}

/// A certificate that is valid now: whose it is, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCert {
    pub node_id: String,
    pub serial: String,
    pub not_after_ms: i64,
}

/// Whether the certificate looked up by fingerprint (`None`: unknown) is
/// valid at `now_ms`.
pub fn check_cert(row: Option<CertRow>, now_ms: i64) -> Result<ValidCert, Refusal> {
    let Some(c) = row else {
        return Err(Refusal::UnknownCertificate);
    };
    if c.node_deleted_at_ms.is_some() {
        return Err(Refusal::DeletedNode(c.node_id));
    }
    if c.revoked_at_ms.is_some() {
        return Err(Refusal::Revoked(c.revoke_reason.unwrap_or_default()));
    }
    if c.not_after_ms < now_ms {
        return Err(Refusal::Expired);
    }
    Ok(ValidCert {
        node_id: c.node_id,
        serial: c.serial,
        not_after_ms: c.not_after_ms,
    })
}

/// A revoked certificate, for the gateways' revocation feed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub serial: String,
    pub node_id: String,
    pub reason: String,
    pub at_ms: i64,
}

/// The reason recorded on certificates revoked by deleting their node.
pub const NODE_DELETED: &str = "node-deleted";

/// A node as `nodes list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: String,
    pub hostname: String,
    pub state: String,
    pub epoch: u64,
    pub gateway_id: String,
    pub cert_not_after_ms: i64,
    pub last_seen_age_ms: i64,
    pub boot_id: String,
    pub journal_id: String,
    pub incarnation_id: String,
    pub agent_version: String,
    pub release_floor: u64,
    pub conditions: Vec<String>,
    pub taints: Vec<String>,
}

/// Every node, and the store's time of the reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeList {
    pub nodes: Vec<NodeRow>,
    pub now_ms: i64,
}

pub const CONDITION_UNREACHABLE: &str = "NodeUnreachable";
pub const TAINT_UNREACHABLE: &str = "NoSchedule:node.unreachable";

/// `list` with `item` in it, once.
pub fn with(mut list: Vec<String>, item: &str) -> Vec<String> {
    if !list.iter().any(|x| x == item) {
        list.push(item.to_string());
    }
    list
}

/// `list` without `item`.
pub fn without(mut list: Vec<String>, item: &str) -> Vec<String> {
    list.retain(|x| x != item);
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> CertRow {
        CertRow {
            node_id: "n".into(),
            serial: "s".into(),
            revoked_at_ms: None,
            revoke_reason: None,
            not_after_ms: 100,
            node_deleted_at_ms: None,
        }
    }

    #[test]
    fn a_certificate_is_valid_until_its_end_unless_revoked_or_its_node_deleted() {
        assert_eq!(check_cert(Some(row()), 100).unwrap().serial, "s");
        assert_eq!(check_cert(Some(row()), 101), Err(Refusal::Expired));
        assert_eq!(check_cert(None, 0), Err(Refusal::UnknownCertificate));
        let revoked = CertRow {
            revoked_at_ms: Some(5),
            revoke_reason: Some("duplicate-identity".into()),
            ..row()
        };
        assert_eq!(
            check_cert(Some(revoked), 0),
            Err(Refusal::Revoked("duplicate-identity".into()))
        );
        let deleted = CertRow {
            revoked_at_ms: Some(5),
            node_deleted_at_ms: Some(5),
            ..row()
        };
        assert_eq!(
            check_cert(Some(deleted), 0),
            Err(Refusal::DeletedNode("n".into())),
            "deletion is named before the revocation it caused"
        );
    }

    #[test]
    fn conditions_are_added_once_and_removed() {
        let l = with(vec![], CONDITION_UNREACHABLE);
        let l = with(l, CONDITION_UNREACHABLE);
        assert_eq!(l, vec![CONDITION_UNREACHABLE.to_string()]);
        assert!(without(l, CONDITION_UNREACHABLE).is_empty());
    }
}
