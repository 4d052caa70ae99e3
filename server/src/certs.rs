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
