//! The clone watch, on the key holder (`bc_store::clones`): the sightings
//! gateways recorded at Hellos are believed only once their proofs
//! verify here, under a certificate the fleet CA issued the node with the
//! serial the sighting names. A proved sighting supersedes the node's
//! older certificates; more than `QUARANTINE_AFTER` returns among a
//! certificate's proved sightings, in count order, quarantine the node.
//! A sighting that does not verify is dropped with a
//! `security.hello.forged` event: a gateway wrote it. A verified proof
//! signed by a confirmed release makes the node's unproved Hellos refused
//! from then on (`Backend::require_hello_proofs`): a copy of its key that
//! signs nothing is not let in unseen.

use std::collections::BTreeSet;
use std::sync::Arc;

use bc_store::clones::{self, CLONE_WINDOW_MS, QUARANTINE_AFTER};
use bc_store::sessions::Sighting;
use bc_store::{NodeId, Store, StoreError};
use ring::signature::Ed25519KeyPair;
use tracing::{info, warn};

/// Sightings read in one pass at most.
const BATCH: u32 = 1000;

/// What the watch trusts, and what it has done.
///
/// It reads the sightings it has not marked read (whatever their ids: a
/// row of a huge id or one committed after a higher one is read like any
/// other), looks at each certificate they name, and marks them read.
#[derive(Debug)]
pub struct Watch {
    ca_der: Arc<Vec<u8>>,
    /// Certificates whose node proved it uses them, older ones already
    /// superseded by this process (a write once per certificate, not per
    /// sighting); forgotten past [`REMEMBERED`].
    superseded: BTreeSet<String>,
    /// Certificates whose node this process saw prove a confirmed release
    /// (its unproved Hellos refused since); forgotten past [`REMEMBERED`].
    required: BTreeSet<String>,
}

/// Certificates [`Watch`] remembers having superseded for.
const REMEMBERED: usize = 100_000;

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub verified: usize,
    pub forged: usize,
    pub superseded: Vec<String>,
    pub quarantined: Vec<String>,
}

impl Watch {
    pub fn new(ca_der: Arc<Vec<u8>>) -> Watch {
        Watch {
            ca_der,
            superseded: BTreeSet::new(),
            required: BTreeSet::new(),
        }
    }

    /// One pass over the sightings not yet read.
    pub async fn tick(
        &mut self,
        store: &Store,
        key: &Arc<Ed25519KeyPair>,
    ) -> Result<Pass, StoreError> {
        let mut pass = Pass::default();
        let batch = store.sightings_unwatched(BATCH).await?;
        if batch.is_empty() {
            return Ok(pass);
        }
        let now = store.now().await?;
        let certs: BTreeSet<(NodeId, String)> = batch
            .iter()
            .map(|s| (s.node_id.clone(), s.serial.clone()))
            .collect();
        let mut forged = Vec::new();
        for (node, serial) in certs {
            let ders = store.node_certificates(&node).await?;
            let cert = ders.iter().find(|der| {
                crate::certs::issued_by(der, &self.ca_der)
                    && crate::certs::named(der, "urn:bc:node:").is_some_and(|(n, _)| n == node)
                    && crate::certs::serial_hex(der).is_some_and(|s| s == serial)
            });
            let mut proved = Vec::new();
            let mut confirmed = false;
            for s in store.sightings_of(&serial, now - CLONE_WINDOW_MS).await? {
                match verify(&s, cert.map(Vec::as_slice)) {
                    Ok(p) => {
                        confirmed |= p.release_confirmed;
                        proved.push((s.seq, s.boot_id));
                    }
                    Err(why) => forged.push((s, why)),
                }
            }
            if confirmed && !self.required.contains(&serial) {
                if store.require_hello_proofs(&node, &serial).await? {
                    info!(%node, %serial, "the node proves its Hellos from a confirmed release: unproved ones are refused");
                }
                if self.required.len() >= REMEMBERED {
                    self.required.clear();
                }
                self.required.insert(serial.clone());
            }
            pass.verified += proved.len();
            if proved.is_empty() {
                continue;
            }
            if !self.superseded.contains(&serial) {
                pass.superseded
                    .extend(store.supersede(&node, &serial).await?);
                if self.superseded.len() >= REMEMBERED {
                    self.superseded.clear();
                }
                self.superseded.insert(serial.clone());
            }
            let shown: Vec<(u64, &str)> = proved.iter().map(|(q, b)| (*q, b.as_str())).collect();
            let alternations = clones::alternations(&shown);
            if alternations > QUARANTINE_AFTER {
                let seal = crate::pki::seal::statement_sealer(key.clone());
                if store
                    .quarantine_clone(&node, &serial, alternations, seal)
                    .await
                    .map_err(|e| StoreError::Database(e.to_string().into()))?
                {
                    warn!(%node, %serial, alternations, "cloned identity: the node is quarantined");
                    pass.quarantined.push(node.to_string());
                }
            }
        }
        pass.forged = forged.len();
        if !forged.is_empty() {
            for (s, why) in &forged {
                warn!(node = %s.node_id, serial = %s.serial, %why, "a sighting no node proved: dropped");
            }
            store.drop_forged_sightings(&forged).await?;
        }
        if !pass.superseded.is_empty() {
            info!(serials = ?pass.superseded, "certificates superseded by the ones their nodes use");
        }
        // Read (the forged ones are gone already); a certificate's are read
        // again whenever a new one of it comes.
        let read: Vec<i64> = batch.iter().map(|s| s.id).collect();
        store.mark_sightings_watched(&read).await?;
        Ok(pass)
    }
}

/// Whether `s` carries a proof its node signed under `cert` (the one the
/// fleet CA issued it with the sighting's serial) of what the row says.
fn verify(s: &Sighting, cert: Option<&[u8]>) -> Result<bcd_proto::v1::HelloProof, String> {
    let Some(cert) = cert else {
        return Err(format!(
            "no certificate the fleet CA issued node {} has serial {}",
            s.node_id, s.serial
        ));
    };
    if s.proof.is_empty() {
        return Err("it carries no proof".into());
    }
    let p = bcd_proto::hello::decode(&s.proof).map_err(|e| e.to_string())?;
    let said = (
        p.node_id.as_str(),
        p.cert_serial.as_str(),
        p.boot_id.as_str(),
        p.seq,
    );
    let row = (
        s.node_id.as_str(),
        s.serial.as_str(),
        s.boot_id.as_str(),
        s.seq,
    );
    if said != row {
        return Err(format!(
            "the row says node {} certificate {} boot {} count {}, the node signed node {} \
             certificate {} boot {} count {}",
            row.0, row.1, row.2, row.3, said.0, said.1, said.2, said.3
        ));
    }
    let message = bcd_proto::hello::signed_message(&s.proof);
    if !crate::certs::verify_node_signature(cert, &message, &s.proof_signature) {
        return Err("its signature is not by the certificate's key".into());
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use rcgen::{CertificateParams, KeyPair};
    use std::time::Duration;

    fn issued(dir: &std::path::Path, node: &str, key: &KeyPair) -> Vec<u8> {
        let ca = crate::pki::Ca::load_or_create(dir, &[], 1_800_000_000_000).unwrap();
        let csr = CertificateParams::default().serialize_request(key).unwrap();
        ca.issue_node_cert(
            csr.der(),
            node,
            None,
            1_800_000_000_000,
            Duration::from_secs(86_400),
        )
        .unwrap()
        .der
        .to_vec()
    }

    fn sighting(node: &str, serial: &str, boot: &str, seq: u64, key: &KeyPair) -> Sighting {
        let proof = bcd_proto::v1::HelloProof {
            domain: bcd_proto::hello::DOMAIN.into(),
            node_id: node.into(),
            cert_serial: serial.into(),
            boot_id: boot.into(),
            seq,
            ..Default::default()
        }
        .encode_to_vec();
        let signature =
            rcgen::SigningKey::sign(key, &bcd_proto::hello::signed_message(&proof)).unwrap();
        Sighting {
            id: 1,
            serial: serial.into(),
            node_id: node.into(),
            boot_id: boot.into(),
            at_ms: 0,
            seq,
            proof,
            proof_signature: signature,
        }
    }

    #[test]
    fn only_a_proof_the_node_signed_of_what_the_row_says_holds() {
        let d = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = issued(d.path(), "nd-1", &key);
        let serial = crate::certs::serial_hex(&cert).unwrap();
        let good = sighting("nd-1", &serial, "a", 3, &key);
        assert_eq!(verify(&good, Some(&cert)).map(|p| p.seq), Ok(3));
        assert!(verify(&good, None).unwrap_err().contains("no certificate"));
        // The row moved to another boot or count than the node signed.
        for bad in [
            Sighting {
                boot_id: "b".into(),
                ..good.clone()
            },
            Sighting {
                seq: 4,
                ..good.clone()
            },
        ] {
            assert!(
                verify(&bad, Some(&cert))
                    .unwrap_err()
                    .contains("the row says")
            );
        }
        // Signed by another key; unsigned; no proof at all.
        let other = KeyPair::generate().unwrap();
        let foreign = sighting("nd-1", &serial, "a", 3, &other);
        assert!(
            verify(&foreign, Some(&cert))
                .unwrap_err()
                .contains("signature")
        );
        let unsigned = Sighting {
            proof_signature: vec![],
            ..good.clone()
        };
        assert!(verify(&unsigned, Some(&cert)).is_err());
        let bare = Sighting {
            proof: vec![],
            ..good
        };
        assert_eq!(
            verify(&bare, Some(&cert)).unwrap_err(),
            "it carries no proof"
        );
    }
}
