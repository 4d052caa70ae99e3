use bc_store::releases::NewRelease;
use bc_store::{Refusal, TxError};

use super::{Fixture, T0};

fn release(sequence: u64) -> NewRelease {
    NewRelease {
        sequence,
        version: format!("0.{sequence}.0"),
        target: "x86_64-unknown-linux-musl".into(),
        size: 4,
        sha256: "ab".repeat(32),
        key_id: "k1".into(),
        signed_manifest: b"{}".to_vec(),
        binary: b"\x7fELF".to_vec(),
    }
}

pub async fn a_release_registers_once(f: Fixture) {
    let s = &f.store;
    let row = s.register_release(&release(2)).await.unwrap();
    assert_eq!((row.sequence, row.version.as_str()), (2, "0.2.0"));
    assert_eq!(row.registered_at_ms, T0);
    s.register_release(&release(3)).await.unwrap();
    let err = s.register_release(&release(2)).await.unwrap_err();
    assert!(
        matches!(err, TxError::Refused(Refusal::Conflict(ref m)) if m.contains("higher --sequence")),
        "{err:?}"
    );
    let files = s.release(2).await.unwrap().unwrap();
    assert_eq!(files.binary, b"\x7fELF");
    assert_eq!(s.release(9).await.unwrap(), None);
    let seqs: Vec<u64> = s
        .list_releases()
        .await
        .unwrap()
        .iter()
        .map(|r| r.sequence)
        .collect();
    assert_eq!(seqs, [3, 2], "newest first");
}
