//! The TPM structures a node sends the server (TPM2B_PUBLIC of its EK, AK
//! and node key; TPMS_ATTEST and TPMT_SIGNATURE of a certification) come
//! from a peer: parsing and verifying them must return an error, never
//! panic, whatever the bytes are.
#![no_main]

use bcd_tpm::public::{EkKind, ak_template};
use bcd_tpm::{CertifyInfo, EcdsaSignature, PublicArea, verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    let (a, b) = data.split_at(split);

    for bytes in [data, a, b] {
        if let Ok(p) = PublicArea::from_tpm2b(bytes) {
            let _ = p.name();
            let _ = p.spki_der();
            let _ = verify::check_ak(&p);
            let _ = verify::check_node_key(&p);
            let _ = verify::make_credential(&p, &p.name(), b"fuzz");
        }
        if let Ok(p) = PublicArea::from_tpmt(bytes) {
            let _ = p.matches_spki(bytes);
        }
        let _ = CertifyInfo::parse(bytes);
        let _ = EcdsaSignature::from_tpmt(bytes);
    }

    // A certification checked against a fixed AK: the attestation and the
    // signature are the peer's.
    if let Ok(ak) = PublicArea::from_tpmt(&ak_template()) {
        let _ = verify::verify_certify(&ak, a, b, &ak.name(), b"nonce");
    }
    if let Ok(ek) = PublicArea::from_tpmt(&EkKind::Rsa2048.template()) {
        let _ = verify::make_credential(&ek, &ek.name(), a);
    }
});
