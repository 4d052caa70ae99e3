//! Cross-check of the two backends on one swtpm state: the same EKs, AK
//! and node keys, certifications and signatures that verify the same way,
//! and one credential that both activate.
#![cfg(feature = "tss")]

use bcd_tpm::swtpm::{self, Swtpm};
use bcd_tpm::verify;
use bcd_tpm::{
    Certification, CertifyInfo, EcdsaSignature, EkKind, NodeKeyRecord, ProtocolTpm, PublicArea,
    Tpm, TssTpm,
};

const MESSAGE: &[u8] = b"a CSR signed by the node key";

fn sha256(m: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, m).as_ref());
    out
}

struct Seen {
    ek_rsa: PublicArea,
    ek_ecc: PublicArea,
    ek_cert: Option<Vec<u8>>,
    ek_chain: Vec<Vec<u8>>,
    ak: PublicArea,
    node: PublicArea,
    certification: Certification,
    signature: EcdsaSignature,
    activated: Vec<u8>,
}

fn observe(tpm: &mut dyn Tpm, rec: &NodeKeyRecord, credential: &verify::Credential) -> Seen {
    Seen {
        ek_rsa: tpm.ek_public(EkKind::Rsa2048).unwrap(),
        ek_ecc: tpm.ek_public(EkKind::EccP256).unwrap(),
        ek_cert: tpm.ek_certificate(EkKind::Rsa2048).unwrap(),
        ek_chain: tpm.ek_chain().unwrap(),
        ak: tpm.ak_public().unwrap(),
        node: tpm.node_key_public(rec).unwrap(),
        certification: tpm.certify(rec, b"cross-check nonce").unwrap(),
        signature: tpm.sign(rec, &sha256(MESSAGE)).unwrap(),
        activated: tpm
            .activate_credential(EkKind::Rsa2048, &credential.blob, &credential.secret)
            .unwrap(),
    }
}

#[test]
fn both_backends_see_the_same_tpm() {
    let dir = tempfile::tempdir().unwrap();
    swtpm::manufacture(dir.path()).unwrap();
    let s = Swtpm::start(dir.path()).unwrap();
    s.define_nv(bcd_tpm::EK_CHAIN_FIRST_INDEX, b"a chain certificate")
        .unwrap();
    let rec = NodeKeyRecord::generate().unwrap();

    // The server's credential, made once from what the first backend reports.
    let credential = {
        let mut t = ProtocolTpm::open(s.endpoint()).unwrap();
        let ek = t.ek_public(EkKind::Rsa2048).unwrap();
        let ak = t.ak_public().unwrap();
        verify::make_credential(&ek, &ak.name(), b"one credential for both").unwrap()
    };

    // swtpm serves one connection at a time: one backend after the other.
    let a = observe(
        &mut ProtocolTpm::open(s.endpoint()).unwrap(),
        &rec,
        &credential,
    );
    let b = observe(&mut TssTpm::open(&s.tcti()).unwrap(), &rec, &credential);

    assert_eq!(a.ek_rsa, b.ek_rsa);
    assert_eq!(a.ek_ecc, b.ek_ecc);
    assert_eq!(a.ek_cert, b.ek_cert);
    assert!(a.ek_cert.is_some());
    assert_eq!(a.ek_chain, b.ek_chain);
    assert_eq!(a.ek_chain, [b"a chain certificate".to_vec()]);
    assert_eq!(a.ak, b.ak);
    assert_eq!(a.ak.name(), b.ak.name());
    assert_eq!(a.node, b.node);
    assert_eq!(a.activated, b"one credential for both");
    assert_eq!(b.activated, b"one credential for both");

    // Each certification verifies against the other backend's AK and key.
    let from_a = verify::verify_certify(
        &b.ak,
        &a.certification.attest,
        &a.certification.signature,
        &b.node.name(),
        b"cross-check nonce",
    )
    .unwrap();
    let from_b = verify::verify_certify(
        &a.ak,
        &b.certification.attest,
        &b.certification.signature,
        &a.node.name(),
        b"cross-check nonce",
    )
    .unwrap();
    assert_eq!(from_a.name, from_b.name);
    assert_eq!(from_a.qualified_signer, from_b.qualified_signer);
    assert_eq!(
        CertifyInfo::parse(&a.certification.attest)
            .unwrap()
            .qualified_name,
        CertifyInfo::parse(&b.certification.attest)
            .unwrap()
            .qualified_name
    );
    // The TPM's clock moves between the two, so the statements differ.
    assert_ne!(a.certification.attest, b.certification.attest);

    // ECDSA signatures are randomized; both verify against either public.
    for sig in [&a.signature, &b.signature] {
        for key in [&a.node, &b.node] {
            assert!(verify::verify_signature(key, MESSAGE, &sig.to_der()));
        }
    }
    assert_ne!(a.signature, b.signature);
}
