//! Times the TPM attestor's round trips on swtpm, per backend: a join (open
//! the TPM, EK and its certificate, AK, the server's MakeCredential,
//! ActivateCredential, a new node key, TPM2_Certify, the server's
//! verification) and a renewal (a new node key certified by the AK), on a
//! TPM opened for it (cold) and on one the daemon keeps open (warm).
//!
//! `bcd-tpm-bench [ITERATIONS]` (default 15); prints medians, p90 and
//! minimum in milliseconds.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use bcd_tpm::swtpm::{self, Swtpm};
use bcd_tpm::{EkKind, Error, NodeKeyRecord, ProtocolTpm, Tpm, verify};

type Open = fn(&Swtpm) -> Result<Box<dyn Tpm>, Error>;

fn protocol(s: &Swtpm) -> Result<Box<dyn Tpm>, Error> {
    Ok(Box::new(ProtocolTpm::open(s.endpoint())?))
}

#[cfg(feature = "tss")]
fn tss(s: &Swtpm) -> Result<Box<dyn Tpm>, Error> {
    Ok(Box::new(bcd_tpm::TssTpm::open(&s.tcti())?))
}

fn join(open: Open, s: &Swtpm, kind: EkKind) -> anyhow::Result<()> {
    let mut tpm = open(s)?;
    let ek = tpm.ek_public(kind)?;
    let _certificate = tpm.ek_certificate(kind)?;
    let ak = tpm.ak_public()?;
    let credential = verify::make_credential(&ek, &ak.name(), b"join nonce, 32 bytes at most....")?;
    let nonce = tpm.activate_credential(kind, &credential.blob, &credential.secret)?;
    let record = NodeKeyRecord::generate().map_err(|_| anyhow::anyhow!("no randomness"))?;
    let key = tpm.node_key_public(&record)?;
    let cert = tpm.certify(&record, &nonce)?;
    verify::verify_certify(&ak, &cert.attest, &cert.signature, &key.name(), &nonce)?;
    Ok(())
}

fn renew(tpm: &mut dyn Tpm) -> anyhow::Result<()> {
    let ak = tpm.ak_public()?;
    let record = NodeKeyRecord::generate().map_err(|_| anyhow::anyhow!("no randomness"))?;
    let key = tpm.node_key_public(&record)?;
    let cert = tpm.certify(&record, b"renewal nonce")?;
    verify::verify_certify(
        &ak,
        &cert.attest,
        &cert.signature,
        &key.name(),
        b"renewal nonce",
    )?;
    Ok(())
}

fn time(
    iterations: usize,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Duration>> {
    f()?; // warm-up: page in the binary and swtpm's state
    let mut out = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let t = Instant::now();
        f()?;
        out.push(t.elapsed());
    }
    out.sort();
    Ok(out)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn report(backend: &str, ek: &str, figure: &str, times: &[Duration]) {
    let p = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "{backend:<14} {ek:<14} {figure:<14} {:>8} {:>8} {:>8}",
        ms(p(0.5)),
        ms(p(0.9)),
        ms(times[0])
    );
}

fn main() -> anyhow::Result<()> {
    let iterations: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 15,
    };
    let dir = tempfile::tempdir()?;
    // A manufactured TPM: persistent RSA EK with its certificate (as
    // platforms ship), no persistent ECC EK (derived on each join).
    swtpm::manufacture(dir.path())?;
    let s = Swtpm::start(dir.path())?;
    // A TPM without a persistent EK: the RSA EK is derived on each join
    // (the slow case: an RSA key generation in the TPM).
    let bare_dir = tempfile::tempdir()?;
    let bare = Swtpm::start(bare_dir.path())?;

    let backends: Vec<(&str, Open)> = vec![
        ("tpm2-protocol", protocol),
        #[cfg(feature = "tss")]
        ("tss-esapi", tss),
    ];

    println!("swtpm, {iterations} iterations; milliseconds");
    println!(
        "{:<14} {:<14} {:<14} {:>8} {:>8} {:>8}",
        "backend", "EK", "figure", "median", "p90", "min"
    );
    for (name, open) in backends {
        for (tpm, kind, label) in [
            (&s, EkKind::Rsa2048, "RSA persistent"),
            (&bare, EkKind::Rsa2048, "RSA derived"),
            (&s, EkKind::EccP256, "ECC derived"),
        ] {
            report(
                name,
                label,
                "join",
                &time(iterations, || join(open, tpm, kind))?,
            );
        }
        let cold = time(iterations, || renew(open(&s)?.as_mut()))?;
        report(name, "-", "renew (cold)", &cold);
        let mut held = open(&s)?;
        let warm = time(iterations, || renew(held.as_mut()))?;
        report(name, "-", "renew (warm)", &warm);
    }
    Ok(())
}
