//! Reading certificates peers present: public-key checks only, no key of
//! ours. The gateway uses these, so nothing here may reach a private key.

use x509_parser::prelude::FromDer;

/// Whether `signature` (ECDSA P-256, ASN.1 DER) over `message` was made by
/// the key of a node certificate.
pub fn verify_node_signature(cert_der: &[u8], message: &[u8], signature: &[u8]) -> bool {
    let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(cert_der) else {
        return false;
    };
    let key = cert.public_key().subject_public_key.data.as_ref();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_ASN1, key)
        .verify(message, signature)
        .is_ok()
}

/// What a certificate names after `prefix` in its URI subject alternative
/// names (`urn:bc:node:` gives the node id), and its not-before in
/// milliseconds since the epoch. `None` when it does not parse or names no
/// such URI.
pub fn named(cert_der: &[u8], prefix: &str) -> Option<(String, i64)> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(cert_der).ok()?;
    let not_before_ms = cert.validity().not_before.timestamp().checked_mul(1000)?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) => u
            .strip_prefix(prefix)
            .map(|rest| (rest.to_string(), not_before_ms)),
        _ => None,
    })
}

/// Whether the CA certificate `ca_der` issued `cert_der`: its subject is
/// the certificate's issuer and its key verifies the certificate's
/// signature. What backs a renewal or a re-enrolment is checked so, never
/// taken from a row whoever can write the store could have planted.
pub fn issued_by(cert_der: &[u8], ca_der: &[u8]) -> bool {
    use x509_parser::certificate::X509Certificate;
    let (Ok((_, cert)), Ok((_, ca))) = (
        X509Certificate::from_der(cert_der),
        X509Certificate::from_der(ca_der),
    ) else {
        return false;
    };
    ca.subject().as_raw() == cert.issuer().as_raw()
        && cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// A certificate's not-after, in milliseconds since the epoch, as the
/// certificate itself says it (`None`: it does not parse).
pub fn not_after_ms(cert_der: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(cert_der).ok()?;
    cert.validity().not_after.timestamp().checked_mul(1000)
}

/// A certificate's serial as the store names it (lowercase hex of its
/// bytes; `None`: it does not parse).
pub fn serial_hex(cert_der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(cert_der).ok()?;
    Some(hex::encode(cert.raw_serial()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        (params.self_signed(&key).unwrap(), key)
    }

    fn leaf(issuer: &rcgen::Issuer<'_, rcgen::KeyPair>) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            "urn:bc:node:nd-1".to_string().try_into().unwrap(),
        )];
        params.not_after = rcgen::date_time_ymd(2030, 1, 2);
        params.signed_by(&key, issuer).unwrap().der().to_vec()
    }

    #[test]
    fn only_the_ca_that_signed_a_certificate_issued_it() {
        let (fleet, fleet_key) = ca("better-compute fleet CA");
        let fleet_der = fleet.der().to_vec();
        let ours = leaf(&rcgen::Issuer::from_ca_cert_der(fleet.der(), fleet_key).unwrap());
        assert!(issued_by(&ours, &fleet_der));
        assert_eq!(not_after_ms(&ours), Some(1_893_542_400_000));
        // Another CA of the same name, a self-signed certificate naming the
        // node, altered bytes, garbage.
        let (twin, twin_key) = ca("better-compute fleet CA");
        let theirs = leaf(&rcgen::Issuer::from_ca_cert_der(twin.der(), twin_key).unwrap());
        assert!(!issued_by(&theirs, &fleet_der));
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![rcgen::SanType::URI(
            "urn:bc:node:nd-1".to_string().try_into().unwrap(),
        )];
        let selfsigned = params.self_signed(&key).unwrap().der().to_vec();
        assert!(!issued_by(&selfsigned, &fleet_der));
        let mut altered = ours.clone();
        let at = altered.len() / 2;
        altered[at] ^= 1;
        assert!(!issued_by(&altered, &fleet_der));
        assert!(!issued_by(b"not a certificate", &fleet_der));
        assert!(!issued_by(&ours, b"not a certificate"));
    }
}
