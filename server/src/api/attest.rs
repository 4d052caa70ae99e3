//! The join service's half of a join by TPM attestation
//! (`bcd_proto::attest`): the stateless challenge of `BeginAttestation`,
//! and the checks an attested join passes before the store binds the node
//! to its EK. Any process holding the fleet CA answers either call: the
//! challenge's secret is a MAC under [`crate::pki::Ca::challenge_key`].

use bcd_proto::attest::{self, Ticket};
use bcd_proto::v1::{AttestationChallenge, AttestationRequest, KeyCertification, TpmAttestation};
use bcd_tpm::PublicArea;
use bcd_tpm::verify::{self, VerifyError};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// The largest EK certificate taken (they are 1 to 2 KiB).
const MAX_EK_CERT: usize = 8192;
/// The largest TPMT_PUBLIC taken (an RSA 4096 key with a policy is under
/// 700 bytes).
const MAX_PUBLIC: usize = 1024;
/// The largest TPMS_ATTEST and TPMT_SIGNATURE taken.
const MAX_ATTEST: usize = 1024;

/// Why an attestation is refused. The messages go to the node.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttestError {
    #[error("{0}")]
    Bad(String),
    #[error(
        "the attestation challenge expired (it is good for 60 s of server time): join again, \
         bcd join --attestor tpm begins a new one"
    )]
    Expired,
    #[error(
        "the TPM did not activate the credential of this challenge: the AK is not in the TPM that \
         holds this EK"
    )]
    WrongSecret,
    #[error("the node key's certification does not verify against the attested AK: {0}")]
    Certification(String),
}

fn bad(message: impl Into<String>) -> AttestError {
    AttestError::Bad(message.into())
}

fn public(what: &str, bytes: &[u8]) -> Result<PublicArea, AttestError> {
    if bytes.is_empty() || bytes.len() > MAX_PUBLIC {
        return Err(bad(format!(
            "the {what} public area is missing or over {MAX_PUBLIC} bytes"
        )));
    }
    PublicArea::from_tpmt(bytes).map_err(|e| bad(format!("the {what} public area: {e}")))
}

/// An EK certificate a node sent must hold that EK's key.
fn check_ek_certificate(ek: &PublicArea, der: &[u8]) -> Result<(), AttestError> {
    use x509_parser::prelude::FromDer;
    if der.len() > MAX_EK_CERT {
        return Err(bad(format!(
            "the EK certificate is over {MAX_EK_CERT} bytes"
        )));
    }
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| bad(format!("the EK certificate does not parse: {e}")))?;
    if !ek.matches_spki(cert.tbs_certificate.subject_pki.raw) {
        return Err(bad(
            "the EK certificate is for another key than the EK the node sent",
        ));
    }
    Ok(())
}

/// The EK an EK certificate certifies, as its TPM presents it: the TCG
/// default template of the key's type (RSA 2048, ECC P-256) with the
/// certificate's key as its unique field. Its SHA-256 is what nodes bind
/// to (`ek_sha256`), so an operator enrols a machine by its certificate.
pub fn ek_from_certificate(der: &[u8]) -> Result<PublicArea, AttestError> {
    use bcd_tpm::EkKind;
    use x509_parser::prelude::FromDer;
    use x509_parser::public_key::PublicKey;
    if der.len() > MAX_EK_CERT {
        return Err(bad(format!(
            "the EK certificate is over {MAX_EK_CERT} bytes"
        )));
    }
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| bad(format!("the EK certificate does not parse: {e}")))?;
    let spki = &cert.tbs_certificate.subject_pki;
    let not_default = || {
        bad(
            "the EK certificate's key is not an RSA 2048 or ECC P-256 key of the TCG default EK \
             templates: enrol the machine by its EK SHA-256 instead (a refused join prints it)",
        )
    };
    let tpmt = match spki.parsed().map_err(|_| not_default())? {
        PublicKey::RSA(rsa) => {
            let start = rsa.modulus.iter().position(|b| *b != 0).unwrap_or(0);
            let modulus = &rsa.modulus[start..];
            let exponent = rsa.try_exponent().map_err(|_| not_default())?;
            if modulus.len() != 256 || exponent != 65537 {
                return Err(not_default());
            }
            let mut t = EkKind::Rsa2048.template();
            let at = t.len() - 256;
            t[at..].copy_from_slice(modulus);
            t
        }
        PublicKey::EC(point) => {
            let p = point.data();
            if p.len() != 65 || p[0] != 0x04 {
                return Err(not_default());
            }
            let mut t = EkKind::EccP256.template();
            let at = t.len() - 68;
            t.truncate(at);
            for half in [&p[1..33], &p[33..]] {
                t.extend_from_slice(&32u16.to_be_bytes());
                t.extend_from_slice(half);
            }
            t
        }
        _ => return Err(not_default()),
    };
    let ek = PublicArea::from_tpmt(&tpmt).map_err(|_| not_default())?;
    // The area holds exactly the certificate's key, or it is not an EK we
    // can name.
    if !ek.matches_spki(spki.raw) {
        return Err(not_default());
    }
    Ok(ek)
}

/// The SHA-256 (hex) of an EK's TPMT_PUBLIC: what a node binds to.
pub fn ek_hash(ek: &PublicArea) -> String {
    hex::encode(ek_sha256(ek))
}

/// The subject of a certificate, as an operator reads it.
pub fn certificate_subject(der: &[u8]) -> Result<String, AttestError> {
    use x509_parser::prelude::FromDer;
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
        .map_err(|e| bad(format!("the certificate does not parse: {e}")))?;
    Ok(cert.subject().to_string())
}

/// The most intermediates between an EK certificate and its enrolled CA.
pub const MAX_INTERMEDIATES: usize = 4;
/// The largest chain certificate a node's TPM may send (an NV index holds
/// a few KiB at most).
pub const MAX_CHAIN_CERT: usize = 8 << 10;

/// DER certificates one after another (as enrolled intermediates are
/// kept): each one's bytes, or why they do not parse.
pub fn certificates(mut der: &[u8]) -> Result<Vec<&[u8]>, AttestError> {
    use x509_parser::prelude::FromDer;
    let mut out = Vec::new();
    while !der.is_empty() {
        let (rest, _) = x509_parser::certificate::X509Certificate::from_der(der)
            .map_err(|e| bad(format!("certificate {} does not parse: {e}", out.len() + 1)))?;
        let (one, rest) = der.split_at(der.len() - rest.len());
        out.push(one);
        der = rest;
    }
    Ok(out)
}

/// Whether `ca` may sign certificates: basic constraints say CA, and a
/// key usage, if there is one, allows certificate signing.
fn is_ca(ca: &x509_parser::certificate::X509Certificate<'_>) -> bool {
    let basic = matches!(ca.basic_constraints(), Ok(Some(b)) if b.value.ca);
    let usage = match ca.key_usage() {
        Ok(Some(k)) => k.value.key_cert_sign(),
        Ok(None) => true,
        Err(_) => false,
    };
    basic && usage
}

/// Whether `by` signed `cert`: its subject is `cert`'s issuer and its key
/// verifies `cert`'s signature.
fn issued(
    by: &x509_parser::certificate::X509Certificate<'_>,
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> bool {
    by.subject().as_raw() == cert.issuer().as_raw()
        && cert.verify_signature(Some(by.public_key())).is_ok()
}

/// Which enrolled EK CA certified the EK certificate `der`, if one did.
/// `cas` holds each enrolment's id, CA certificate (the anchor, DER) and
/// intermediates (DER one after another, as enrolled). The anchor signed
/// the EK certificate, or signed an intermediate that did, through at
/// most [`MAX_INTERMEDIATES`] intermediates; each intermediate is a CA,
/// and every certificate on the path is valid at `now_ms`. An enrolled
/// EK CA is trusted as an anchor whatever it is: an operator enrols the
/// root or the intermediate that signs the EK certificates.
///
/// The chain certificates the node's TPM holds (`sent`, DER each) stand
/// beside each enrolment's own intermediates. They are the node's word:
/// they only let the path reach an enrolled anchor, which is what is
/// trusted, and one that does not parse or is not a CA is passed over.
pub fn ek_certified_by<'a>(
    der: &[u8],
    cas: impl IntoIterator<Item = (&'a str, &'a [u8], &'a [u8])>,
    sent: &[Vec<u8>],
    now_ms: i64,
) -> Result<Option<&'a str>, AttestError> {
    use x509_parser::certificate::X509Certificate;
    use x509_parser::prelude::FromDer;
    use x509_parser::time::ASN1Time;
    let (_, cert) = X509Certificate::from_der(der)
        .map_err(|e| bad(format!("the EK certificate does not parse: {e}")))?;
    let at = ASN1Time::from_timestamp(now_ms.div_euclid(1000))
        .map_err(|_| bad("the server's clock is out of range"))?;
    for (id, ca_der, intermediates) in cas {
        let Ok((_, ca)) = X509Certificate::from_der(ca_der) else {
            continue;
        };
        // Enrolled intermediates that do not parse or are not CAs sign
        // nothing.
        let between: Vec<X509Certificate<'_>> = certificates(intermediates)
            .unwrap_or_default()
            .into_iter()
            .chain(sent.iter().take(MAX_INTERMEDIATES).map(Vec::as_slice))
            .filter_map(|d| X509Certificate::from_der(d).ok().map(|(_, c)| c))
            .filter(is_ca)
            .collect();
        let mut path: Vec<&X509Certificate<'_>> = vec![&cert];
        let mut used = vec![false; between.len()];
        loop {
            let last = *path.last().expect("the path starts at the EK certificate");
            if issued(&ca, last) {
                if !ca.validity().is_valid_at(at)
                    || path.iter().any(|c| !c.validity().is_valid_at(at))
                {
                    return Err(bad(format!(
                        "the EK certificate, an intermediate above it or its CA ({id}) is not \
                         valid now: enrol the machine by its EK SHA-256 instead, or enrol a \
                         current EK CA"
                    )));
                }
                return Ok(Some(id));
            }
            if path.len() > MAX_INTERMEDIATES {
                break;
            }
            let Some(i) = (0..between.len()).find(|&i| !used[i] && issued(&between[i], last))
            else {
                break;
            };
            used[i] = true;
            path.push(&between[i]);
        }
    }
    Ok(None)
}

/// Answers `BeginAttestation` at server time `now_ms`: a ticket for this
/// EK and AK, and a credential of the ticket's secret that only the TPM
/// holding the EK can activate, and only for the AK.
pub fn challenge(
    key: &hmac::Key,
    r: &AttestationRequest,
    now_ms: i64,
) -> Result<AttestationChallenge, AttestError> {
    if r.version != attest::VERSION {
        return Err(bad(format!(
            "attestation request version {} is not this server's {}: use a bcd of this server's \
             release",
            r.version,
            attest::VERSION
        )));
    }
    let ek = public("EK", &r.ek_public)?;
    let ak = public("AK", &r.ak_public)?;
    verify::check_ak(&ak).map_err(|e| bad(e.to_string()))?;
    if !r.ek_certificate.is_empty() {
        check_ek_certificate(&ek, &r.ek_certificate)?;
    }
    let mut nonce = [0u8; 16];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| bad("no randomness on the server"))?;
    let ticket = Ticket {
        issued_ms: now_ms,
        nonce,
        ek_sha256: ek_sha256(&ek),
        ak_name: ak.name().as_bytes().to_vec(),
    }
    .encode();
    let secret = attest::secret(key, &ticket);
    let credential = verify::make_credential(&ek, &ak.name(), &secret).map_err(|e| match e {
        VerifyError::Unsupported(m) => bad(format!("cannot make a credential for this EK: {m}")),
        other => bad(format!("cannot make a credential for this EK: {other}")),
    })?;
    Ok(AttestationChallenge {
        version: attest::VERSION,
        credential_blob: credential.blob,
        encrypted_secret: credential.secret,
        ticket,
    })
}

fn ek_sha256(ek: &PublicArea) -> [u8; 32] {
    ring::digest::digest(&ring::digest::SHA256, ek.tpmt_bytes())
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// What a verified attestation establishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attested {
    /// The EK's SHA-256, hex: what the store binds the node to.
    pub ek_sha256: String,
    /// The AK's TPM name: what the certificate names.
    pub ak_name: Vec<u8>,
}

/// Checks an attested join at server time `now_ms`: the ticket is this
/// fleet's and fresh, the node activated its credential (the AK is in the
/// EK's TPM), the AK is a restricted signing key whose name the ticket
/// holds, and it certified the node key over the ticket and `csr_der`,
/// whose key is that node key (the CA checks the CSR's signature when it
/// issues).
pub fn verify_join(
    key: &hmac::Key,
    t: &TpmAttestation,
    csr_der: &[u8],
    now_ms: i64,
) -> Result<Attested, AttestError> {
    attest::check_version(t).map_err(|e| bad(e.to_string()))?;
    let ticket = Ticket::decode(&t.ticket).map_err(|e| bad(e.to_string()))?;
    if !attest::secret_matches(key, &t.ticket, &t.activated_secret) {
        return Err(AttestError::WrongSecret);
    }
    // Only the fleet's key made that secret: the ticket's fields are ours.
    if !ticket.fresh(now_ms) {
        return Err(AttestError::Expired);
    }
    let ak = public("AK", &t.ak_public)?;
    if ak.name().as_bytes() != ticket.ak_name.as_slice() {
        return Err(AttestError::Certification(
            "the AK is not the one the challenge was made for".into(),
        ));
    }
    verify::check_ak(&ak).map_err(|e| bad(e.to_string()))?;
    let node_key = public("node key", &t.node_key_public)?;
    verify::check_node_key(&node_key).map_err(|e| bad(e.to_string()))?;
    if t.certify_attest.len() > MAX_ATTEST || t.certify_signature.len() > MAX_ATTEST {
        return Err(bad(format!("the certification is over {MAX_ATTEST} bytes")));
    }
    let qualifying = attest::qualifying_data(&t.ticket, csr_der);
    verify::verify_certify(
        &ak,
        &t.certify_attest,
        &t.certify_signature,
        &node_key.name(),
        &qualifying,
    )
    .map_err(|e| AttestError::Certification(e.to_string()))?;
    let csr_key = csr_public_key(csr_der)?;
    if !node_key.matches_spki(&csr_key) {
        return Err(bad(
            "the certificate request is for another key than the certified node key",
        ));
    }
    Ok(Attested {
        ek_sha256: hex::encode(ticket.ek_sha256),
        ak_name: ticket.ak_name,
    })
}

/// Checks a renewal's next key for a certificate that names the AK
/// `ak_name`: that AK (a restricted signing key) certified the next key
/// over the renewal's proof statement, and the CSR is for that key.
pub fn verify_next_key(
    ak_name: &[u8],
    k: &KeyCertification,
    renew_statement: &[u8],
    csr_der: &[u8],
) -> Result<(), AttestError> {
    if k.version != attest::VERSION {
        return Err(bad(format!(
            "key certification version {} is not this server's {}",
            k.version,
            attest::VERSION
        )));
    }
    let ak = public("AK", &k.ak_public)?;
    if ak.name().as_bytes() != ak_name {
        return Err(AttestError::Certification(
            "the AK is not the one the certificate names".into(),
        ));
    }
    verify::check_ak(&ak).map_err(|e| bad(e.to_string()))?;
    let key = public("next key", &k.key_public)?;
    verify::check_node_key(&key).map_err(|e| bad(e.to_string()))?;
    if k.certify_attest.len() > MAX_ATTEST || k.certify_signature.len() > MAX_ATTEST {
        return Err(bad(format!("the certification is over {MAX_ATTEST} bytes")));
    }
    verify::verify_certify(
        &ak,
        &k.certify_attest,
        &k.certify_signature,
        &key.name(),
        &attest::renewal_qualifying_data(renew_statement),
    )
    .map_err(|e| AttestError::Certification(e.to_string()))?;
    if !key.matches_spki(&csr_public_key(csr_der)?) {
        return Err(bad(
            "the certificate request is for another key than the certified next key",
        ));
    }
    Ok(())
}

/// The SubjectPublicKeyInfo (DER) of a PKCS#10 request.
fn csr_public_key(csr_der: &[u8]) -> Result<Vec<u8>, AttestError> {
    use x509_parser::prelude::FromDer;
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
        .map_err(|e| bad(format!("the certificate request does not parse: {e}")))?;
    Ok(csr.certification_request_info.subject_pki.raw.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bcd_tpm::swtpm::Swtpm;
    use bcd_tpm::{EkKind, NodeKeyRecord, ProtocolTpm, Tpm};
    use std::cell::RefCell;

    const NOW: i64 = 1_790_000_000_000;

    /// A machine with a software TPM.
    struct Machine {
        tpm: ProtocolTpm,
        _swtpm: Swtpm,
        _dir: tempfile::TempDir,
    }

    fn machine() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let swtpm = Swtpm::start(dir.path()).unwrap();
        let tpm = ProtocolTpm::open(swtpm.endpoint()).unwrap();
        Machine {
            tpm,
            _swtpm: swtpm,
            _dir: dir,
        }
    }

    /// The node key as rcgen signs a CSR with it.
    struct TpmKey<'a> {
        tpm: RefCell<&'a mut ProtocolTpm>,
        record: NodeKeyRecord,
        point: [u8; 65],
    }

    impl rcgen::PublicKeyData for TpmKey<'_> {
        fn der_bytes(&self) -> &[u8] {
            &self.point
        }
        fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
            &rcgen::PKCS_ECDSA_P256_SHA256
        }
    }

    impl rcgen::SigningKey for TpmKey<'_> {
        fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
            let digest = ring::digest::digest(&ring::digest::SHA256, msg);
            let sig = self
                .tpm
                .borrow_mut()
                .sign(&self.record, digest.as_ref().try_into().unwrap())
                .map_err(|_| rcgen::Error::RingUnspecified)?;
            Ok(sig.to_der())
        }
    }

    fn request(m: &mut Machine) -> AttestationRequest {
        AttestationRequest {
            version: 1,
            ek_public: m
                .tpm
                .ek_public(EkKind::EccP256)
                .unwrap()
                .tpmt_bytes()
                .to_vec(),
            ek_certificate: vec![],
            ak_public: m.tpm.ak_public().unwrap().tpmt_bytes().to_vec(),
        }
    }

    /// The node's side: activates the challenge, certifies a fresh node key
    /// with `certifier`'s AK (the node's own unless given) and signs a CSR.
    fn respond(
        m: &mut Machine,
        c: &AttestationChallenge,
        certifier: Option<&mut Machine>,
    ) -> (TpmAttestation, Vec<u8>) {
        let secret = m
            .tpm
            .activate_credential(EkKind::EccP256, &c.credential_blob, &c.encrypted_secret)
            .unwrap();
        let record = NodeKeyRecord::generate().unwrap();
        let certifier = certifier.unwrap_or(m);
        let node_key = certifier.tpm.node_key_public(&record).unwrap();
        let csr = {
            let key = TpmKey {
                tpm: RefCell::new(&mut certifier.tpm),
                record: record.clone(),
                point: node_key.p256_point().unwrap(),
            };
            rcgen::CertificateParams::new(Vec::<String>::new())
                .unwrap()
                .serialize_request(&key)
                .unwrap()
                .der()
                .to_vec()
        };
        let qd = attest::qualifying_data(&c.ticket, &csr);
        let cert = certifier.tpm.certify(&record, &qd).unwrap();
        let ak_public = certifier.tpm.ak_public().unwrap().tpmt_bytes().to_vec();
        (
            TpmAttestation {
                version: 1,
                ticket: c.ticket.clone(),
                activated_secret: secret,
                ak_public,
                node_key_public: node_key.tpmt_bytes().to_vec(),
                certify_attest: cert.attest,
                certify_signature: cert.signature,
                ek_certificate: vec![],
                ek_chain: vec![],
            },
            csr,
        )
    }

    fn key() -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, b"the fleet's challenge key")
    }

    #[test]
    fn an_attestation_verifies_and_names_the_ek_and_ak() {
        let mut m = machine();
        let r = request(&mut m);
        let c = challenge(&key(), &r, NOW).unwrap();
        let (t, csr) = respond(&mut m, &c, None);
        let a = verify_join(&key(), &t, &csr, NOW + 59_000).unwrap();
        let ak = PublicArea::from_tpmt(&r.ak_public).unwrap();
        assert_eq!(a.ak_name, ak.name().as_bytes());
        assert_eq!(
            a.ek_sha256,
            hex::encode(ring::digest::digest(&ring::digest::SHA256, &r.ek_public))
        );
        // Another CSR than the certified one is refused.
        let other = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let err = verify_join(&key(), &t, other.der(), NOW).unwrap_err();
        assert!(
            matches!(&err, AttestError::Certification(m) if m.contains("qualifying data")),
            "{err}"
        );
    }

    #[test]
    fn a_wrong_secret_or_another_fleets_key_is_refused() {
        let mut m = machine();
        let r = request(&mut m);
        let c = challenge(&key(), &r, NOW).unwrap();
        let (mut t, csr) = respond(&mut m, &c, None);
        let other_fleet = hmac::Key::new(hmac::HMAC_SHA256, b"another fleet");
        assert_eq!(
            verify_join(&other_fleet, &t, &csr, NOW),
            Err(AttestError::WrongSecret)
        );
        t.activated_secret[0] ^= 1;
        assert_eq!(
            verify_join(&key(), &t, &csr, NOW),
            Err(AttestError::WrongSecret)
        );
        // A ticket edited to name another EK no longer matches its secret.
        t.activated_secret[0] ^= 1;
        t.ticket[30] ^= 1;
        assert_eq!(
            verify_join(&key(), &t, &csr, NOW),
            Err(AttestError::WrongSecret)
        );
    }

    #[test]
    fn a_credential_for_another_tpm_does_not_activate() {
        let mut m = machine();
        let mut other = machine();
        // The challenge is made for the other machine's EK.
        let r = request(&mut other);
        let c = challenge(&key(), &r, NOW).unwrap();
        assert!(
            m.tpm
                .activate_credential(EkKind::EccP256, &c.credential_blob, &c.encrypted_secret)
                .is_err()
        );
    }

    #[test]
    fn a_certification_by_another_ak_is_refused() {
        let mut m = machine();
        let mut other = machine();
        let r = request(&mut m);
        let c = challenge(&key(), &r, NOW).unwrap();
        // The node key is the other TPM's, certified by the other AK.
        let (mut t, csr) = respond(&mut m, &c, Some(&mut other));
        let err = verify_join(&key(), &t, &csr, NOW).unwrap_err();
        assert!(
            matches!(&err, AttestError::Certification(m) if m.contains("not the one the challenge")),
            "{err}"
        );
        // Presented as the attested AK's, its signature does not verify.
        t.ak_public = r.ak_public.clone();
        let err = verify_join(&key(), &t, &csr, NOW).unwrap_err();
        assert!(
            matches!(&err, AttestError::Certification(m) if m.contains("signature")),
            "{err}"
        );
    }

    #[test]
    fn an_expired_challenge_is_refused() {
        let mut m = machine();
        let r = request(&mut m);
        let c = challenge(&key(), &r, NOW).unwrap();
        let (t, csr) = respond(&mut m, &c, None);
        assert_eq!(
            verify_join(&key(), &t, &csr, NOW + 60_001),
            Err(AttestError::Expired)
        );
        assert!(verify_join(&key(), &t, &csr, NOW + 60_000).is_ok());
    }

    /// A renewal's next key certified by `certifier`'s AK over `statement`.
    fn next_key(certifier: &mut Machine, statement: &[u8]) -> (KeyCertification, Vec<u8>) {
        let record = NodeKeyRecord::generate().unwrap();
        let key = certifier.tpm.node_key_public(&record).unwrap();
        let csr = {
            let signer = TpmKey {
                tpm: RefCell::new(&mut certifier.tpm),
                record: record.clone(),
                point: key.p256_point().unwrap(),
            };
            rcgen::CertificateParams::new(Vec::<String>::new())
                .unwrap()
                .serialize_request(&signer)
                .unwrap()
                .der()
                .to_vec()
        };
        let cert = certifier
            .tpm
            .certify(&record, &attest::renewal_qualifying_data(statement))
            .unwrap();
        (
            KeyCertification {
                version: 1,
                ak_public: certifier.tpm.ak_public().unwrap().tpmt_bytes().to_vec(),
                key_public: key.tpmt_bytes().to_vec(),
                certify_attest: cert.attest,
                certify_signature: cert.signature,
            },
            csr,
        )
    }

    #[test]
    fn a_next_key_verifies_only_when_the_certificates_ak_certified_it() {
        let mut m = machine();
        let mut other = machine();
        let ak_name = m.tpm.ak_public().unwrap().name().as_bytes().to_vec();
        let statement = bcd_proto::renew::statement("nd-1", NOW, b"csr");
        let (k, csr) = next_key(&mut m, &statement);
        verify_next_key(&ak_name, &k, &statement, &csr).unwrap();
        // Over another statement (another time): refused.
        let later = bcd_proto::renew::statement("nd-1", NOW + 1, b"csr");
        let err = verify_next_key(&ak_name, &k, &later, &csr).unwrap_err();
        assert!(err.to_string().contains("qualifying data"), "{err}");
        // Certified by another TPM's AK.
        let (k2, csr2) = next_key(&mut other, &statement);
        let err = verify_next_key(&ak_name, &k2, &statement, &csr2).unwrap_err();
        assert!(
            err.to_string()
                .contains("not the one the certificate names"),
            "{err}"
        );
        // Another CSR than the certified key's.
        let err = verify_next_key(&ak_name, &k, &statement, &csr2).unwrap_err();
        assert!(err.to_string().contains("another key"), "{err}");
    }

    /// A manufactured TPM (swtpm_setup: a persistent RSA EK and its
    /// certificate in NV): the certificate's key is the EK's, and the
    /// credential made for the RSA EK activates.
    #[test]
    fn an_rsa_ek_with_its_certificate_attests() {
        let dir = tempfile::tempdir().unwrap();
        bcd_tpm::swtpm::manufacture(dir.path()).unwrap();
        let swtpm = Swtpm::start(dir.path()).unwrap();
        let mut tpm = ProtocolTpm::open(swtpm.endpoint()).unwrap();
        let cert = tpm
            .ek_certificate(EkKind::Rsa2048)
            .unwrap()
            .expect("swtpm_setup wrote an EK certificate");
        let mut r = AttestationRequest {
            version: 1,
            ek_public: tpm
                .ek_public(EkKind::Rsa2048)
                .unwrap()
                .tpmt_bytes()
                .to_vec(),
            ek_certificate: cert,
            ak_public: tpm.ak_public().unwrap().tpmt_bytes().to_vec(),
        };
        let c = challenge(&key(), &r, NOW).unwrap();
        let secret = tpm
            .activate_credential(EkKind::Rsa2048, &c.credential_blob, &c.encrypted_secret)
            .unwrap();
        assert!(attest::secret_matches(&key(), &c.ticket, &secret));
        // The certificate of another EK is refused.
        r.ek_public = tpm
            .ek_public(EkKind::EccP256)
            .unwrap()
            .tpmt_bytes()
            .to_vec();
        let err = challenge(&key(), &r, NOW).unwrap_err().to_string();
        assert!(err.contains("another key than the EK"), "{err}");
    }

    /// An EK CA of our own (ECDSA P-256), and a certificate it signs for
    /// the key `spki_der`.
    fn ek_ca() -> (Vec<u8>, impl Fn(&[u8]) -> Vec<u8>) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "test EK CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap().der().to_vec();
        let issuer = Issuer::new(params, key);
        let sign = move |spki_der: &[u8]| {
            let public = rcgen::SubjectPublicKeyInfo::from_der(spki_der).unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, "EK");
            p.signed_by(&public, &issuer).unwrap().der().to_vec()
        };
        (ca, sign)
    }

    #[test]
    fn an_ek_certificate_names_the_ek_its_tpm_presents() {
        let mut m = machine();
        let (_, sign) = ek_ca();
        for kind in [EkKind::EccP256, EkKind::Rsa2048] {
            let ek = m.tpm.ek_public(kind).unwrap();
            let cert = sign(&ek.spki_der().unwrap());
            let named = ek_from_certificate(&cert).unwrap();
            assert_eq!(named.tpmt_bytes(), ek.tpmt_bytes(), "{kind}");
            assert_eq!(ek_hash(&named), hex::encode(ek_sha256(&ek)));
        }
        // A key of no default EK template (P-384) names no EK.
        let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let err = ek_from_certificate(&sign(&rcgen::PublicKeyData::subject_public_key_info(&p384)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("enrol the machine by its EK SHA-256"), "{err}");
        let not_ek = ek_from_certificate(b"\x30\x03\x02\x01\x00").unwrap_err();
        assert!(not_ek.to_string().contains("does not parse"), "{not_ek}");
    }

    #[test]
    fn an_ek_certificate_is_admitted_only_by_the_ca_that_signed_it() {
        let mut m = machine();
        let (ca, sign) = ek_ca();
        let (other_ca, _) = ek_ca();
        let ek = m.tpm.ek_public(EkKind::EccP256).unwrap();
        let cert = sign(&ek.spki_der().unwrap());
        let cas = [
            ("ek-ca:other", other_ca.as_slice(), &[][..]),
            ("ek-ca:ours", ca.as_slice(), &[][..]),
        ];
        assert_eq!(
            ek_certified_by(&cert, cas, &[], NOW).unwrap(),
            Some("ek-ca:ours")
        );
        assert_eq!(ek_certified_by(&cert, [cas[0]], &[], NOW).unwrap(), None);
        assert_eq!(ek_certified_by(&cert, [], &[], NOW).unwrap(), None);
        // Garbage among the enrolled CAs is skipped, not trusted.
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:junk", &b"junk"[..], &b"junk"[..])],
                &[],
                NOW
            )
            .unwrap(),
            None
        );
        // Outside the certificates' life: refused with what to do.
        let late = ek_certified_by(&cert, cas, &[], 0).unwrap_err();
        assert!(late.to_string().contains("not valid now"), "{late}");
    }

    /// A root's DER, an intermediate's DER, and a signer `F` of EK
    /// certificates by the intermediate.
    type Chain<F> = (Vec<u8>, Vec<u8>, F);

    /// A root, an intermediate it signed (a CA when `ca`), and a signer of
    /// EK certificates by the intermediate.
    fn ek_chain(ca: bool) -> Chain<impl Fn(&[u8]) -> Vec<u8>> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let params = |cn: &str, ca: bool| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            if ca {
                p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            }
            p
        };
        let root_key = KeyPair::generate().unwrap();
        let root_params = params("test EK root", true);
        let root = root_params.self_signed(&root_key).unwrap().der().to_vec();
        let root = (root, Issuer::new(root_params, root_key));
        let key = KeyPair::generate().unwrap();
        let inter_params = params("test EK intermediate", ca);
        let inter = inter_params
            .signed_by(&key, &root.1)
            .unwrap()
            .der()
            .to_vec();
        let issuer = Issuer::new(inter_params, key);
        let sign = move |spki_der: &[u8]| {
            let public = rcgen::SubjectPublicKeyInfo::from_der(spki_der).unwrap();
            params("EK", false)
                .signed_by(&public, &issuer)
                .unwrap()
                .der()
                .to_vec()
        };
        (root.0, inter, sign)
    }

    #[test]
    fn an_ek_ca_admits_through_the_intermediates_enrolled_with_it() {
        let mut m = machine();
        let ek = m
            .tpm
            .ek_public(EkKind::EccP256)
            .unwrap()
            .spki_der()
            .unwrap();
        let (root, inter, sign) = ek_chain(true);
        let cert = sign(&ek);
        // The root alone did not sign the EK certificate.
        assert_eq!(
            ek_certified_by(&cert, [("ek-ca:root", root.as_slice(), &[][..])], &[], NOW).unwrap(),
            None
        );
        // With the intermediate enrolled under it, it did; the
        // intermediate enrolled as an anchor admits it too.
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:root", root.as_slice(), inter.as_slice())],
                &[],
                NOW
            )
            .unwrap(),
            Some("ek-ca:root")
        );
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:inter", inter.as_slice(), &[][..])],
                &[],
                NOW
            )
            .unwrap(),
            Some("ek-ca:inter")
        );
        // Junk and unrelated certificates among the intermediates are
        // passed over.
        let (other_root, other_inter, _) = ek_chain(true);
        let mixed = [
            other_root.as_slice(),
            other_inter.as_slice(),
            inter.as_slice(),
        ]
        .concat();
        assert_eq!(certificates(&mixed).unwrap().len(), 3);
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:root", root.as_slice(), mixed.as_slice())],
                &[],
                NOW
            )
            .unwrap(),
            Some("ek-ca:root")
        );
        assert!(certificates(&[inter.as_slice(), b"junk"].concat()).is_err());
        // An intermediate of another root leads nowhere.
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:other", other_root.as_slice(), inter.as_slice())],
                &[],
                NOW
            )
            .unwrap(),
            None
        );
        // Outside the path's life: refused with what to do.
        let late = ek_certified_by(
            &cert,
            [("ek-ca:root", root.as_slice(), inter.as_slice())],
            &[],
            0,
        )
        .unwrap_err();
        assert!(late.to_string().contains("not valid now"), "{late}");
        // The node's TPM may hold the intermediate itself: the root alone
        // admits through it, another root does not, and junk beside it is
        // passed over.
        let sent = [b"junk".to_vec(), inter.clone()];
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:root", root.as_slice(), &[][..])],
                &sent,
                NOW
            )
            .unwrap(),
            Some("ek-ca:root")
        );
        assert_eq!(
            ek_certified_by(
                &cert,
                [("ek-ca:other", other_root.as_slice(), &[][..])],
                &sent,
                NOW
            )
            .unwrap(),
            None
        );
        // An intermediate that is not a CA signs no EK certificate.
        let (root, leaf, sign) = ek_chain(false);
        assert_eq!(
            ek_certified_by(
                &sign(&ek),
                [("ek-ca:root", root.as_slice(), leaf.as_slice())],
                &[],
                NOW
            )
            .unwrap(),
            None
        );
    }

    proptest::proptest! {
        /// EK certificates come from nodes: any bytes, or a real one with
        /// a byte changed, are read without a panic, and a changed one is
        /// never admitted by the CA.
        #[test]
        fn ek_certificates_from_peers_never_panic(
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            at in proptest::prelude::any::<usize>(),
            flip in 1u8..=255,
        ) {
            let _ = ek_from_certificate(&junk);
            let _ = ek_certified_by(
                &junk,
                [("ek-ca:junk", junk.as_slice(), junk.as_slice())],
                std::slice::from_ref(&junk),
                NOW,
            );
            let _ = certificates(&junk);
            thread_local! {
                static SIGNED: (Vec<u8>, Vec<u8>) = {
                    let (ca, sign) = ek_ca();
                    let key = rcgen::KeyPair::generate().unwrap();
                    (ca, sign(&rcgen::PublicKeyData::subject_public_key_info(&key)))
                };
            }
            SIGNED.with(|(ca, cert)| {
                let mut changed = cert.clone();
                let i = at % changed.len();
                changed[i] ^= flip;
                let _ = ek_from_certificate(&changed);
                // The signed part: after the outer SEQUENCE's header. A
                // change outside it (the outer encoding) names the same key.
                let signed = {
                    use x509_parser::prelude::FromDer;
                    let (_, c) = x509_parser::certificate::X509Certificate::from_der(cert).unwrap();
                    let start = c.tbs_certificate.as_ref().as_ptr() as usize - cert.as_ptr() as usize;
                    start..start + c.tbs_certificate.as_ref().len()
                };
                let by = ek_certified_by(&changed, [("ek-ca:ours", ca.as_slice(), &[][..])], &[], NOW);
                if signed.contains(&i) {
                    assert!(
                        !matches!(by, Ok(Some(_))),
                        "a changed certificate is not admitted (byte {i})"
                    );
                }
            });
        }
    }

    #[test]
    fn requests_that_are_not_a_tpms_are_refused() {
        let mut m = machine();
        let mut r = request(&mut m);
        r.version = 2;
        assert!(
            challenge(&key(), &r, NOW)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
        let mut r = request(&mut m);
        // The EK is no AK.
        r.ak_public = r.ek_public.clone();
        assert!(challenge(&key(), &r, NOW).is_err());
        let mut r = request(&mut m);
        r.ek_certificate = vec![0x30, 0x03, 0x02, 0x01, 0x01];
        let err = challenge(&key(), &r, NOW).unwrap_err().to_string();
        assert!(err.contains("EK certificate does not parse"), "{err}");
    }
}
