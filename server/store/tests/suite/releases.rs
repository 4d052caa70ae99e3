use bc_store::releases::NewRelease;
use bc_store::{Refusal, ReleaseSeq, TxError};

use super::{Fixture, T0};

fn release(sequence: u64) -> NewRelease {
    NewRelease {
        sequence: ReleaseSeq::new(sequence),
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
    assert_eq!((row.sequence.get(), row.version.as_str()), (2, "0.2.0"));
    assert_eq!(row.registered_at_ms, T0);
    s.register_release(&release(3)).await.unwrap();
    let err = s.register_release(&release(2)).await.unwrap_err();
    assert!(
        matches!(err, TxError::Refused(Refusal::Conflict(ref m)) if m.contains("higher --sequence")),
        "{err:?}"
    );
    let files = s.release(ReleaseSeq::new(2)).await.unwrap().unwrap();
    assert_eq!(files.binary, b"\x7fELF");
    assert_eq!(s.release(ReleaseSeq::new(9)).await.unwrap(), None);
    let seqs: Vec<u64> = s
        .list_releases()
        .await
        .unwrap()
        .iter()
        .map(|r| r.sequence.get())
        .collect();
    assert_eq!(seqs, [3, 2], "newest first");
}

pub async fn a_release_reads_in_chunks(f: Fixture) {
    let s = &f.store;
    // Past one SQLite page and one TOAST chunk, an odd length.
    let binary: Vec<u8> = (0..300_001u32).map(|i| (i * 7 % 251) as u8).collect();
    let r = NewRelease {
        size: binary.len() as u64,
        binary: binary.clone(),
        signed_manifest: b"{\"signed\":1}".to_vec(),
        ..release(4)
    };
    s.register_release(&r).await.unwrap();
    let head = s.release_head(ReleaseSeq::new(4)).await.unwrap().unwrap();
    assert_eq!(head.signed_manifest, b"{\"signed\":1}");
    assert_eq!(head.size, 300_001);
    let mut back = Vec::new();
    let mut offset = 0;
    loop {
        let chunk = s
            .release_chunk(ReleaseSeq::new(4), offset, 65_536)
            .await
            .unwrap()
            .unwrap();
        if chunk.is_empty() {
            break;
        }
        assert!(chunk.len() <= 65_536);
        offset += chunk.len() as u64;
        back.extend_from_slice(&chunk);
    }
    assert_eq!(back, binary);
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(4), 299_999, 10)
            .await
            .unwrap()
            .unwrap(),
        binary[299_999..]
    );
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(4), 1_000, 3)
            .await
            .unwrap()
            .unwrap(),
        binary[1_000..1_003]
    );
    let big = bc_store::releases::MAX_CHUNK;
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(4), 0, u32::MAX)
            .await
            .unwrap()
            .unwrap()
            .len(),
        binary.len().min(big as usize),
        "one read is at most MAX_CHUNK"
    );
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(4), 300_001, 10)
            .await
            .unwrap(),
        Some(vec![])
    );
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(4), u64::MAX, 10)
            .await
            .unwrap(),
        Some(vec![])
    );
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(9), 0, 10).await.unwrap(),
        None
    );
    assert_eq!(
        s.release_chunk(ReleaseSeq::new(u64::MAX), 0, 10)
            .await
            .unwrap(),
        None
    );
    assert_eq!(s.release_head(ReleaseSeq::new(9)).await.unwrap(), None);
}
