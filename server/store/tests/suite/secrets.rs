use std::time::Duration;

use bc_store::secrets::Put;
use bc_store::{Refusal, TxError};

use super::Fixture;

fn sealer(value: &'static str) -> bc_store::secrets::SealSecret {
    Box::new(move |version| Some(format!("{value}@v{version}").into_bytes()))
}

pub async fn secret_versions_are_written_once_and_a_deleted_name_goes_on_counting(f: Fixture) {
    let s = &f.store;
    let first = s
        .put_secret("db", Put::New, "alice", sealer("a"))
        .await
        .unwrap();
    assert_eq!((first.version, first.created_ms), (1, super::T0));
    match s.put_secret("db", Put::New, "alice", sealer("b")).await {
        Err(TxError::Refused(Refusal::Conflict(m))) => {
            assert!(m.contains("better-compute secrets rotate db"), "{m}")
        }
        other => panic!("a live name is not put twice: {other:?}"),
    }
    match s
        .put_secret("nope", Put::Rotate, "alice", sealer("b"))
        .await
    {
        Err(TxError::Refused(Refusal::NotFound(m))) => {
            assert!(m.contains("better-compute secrets put nope"), "{m}")
        }
        other => panic!("an unknown name is not rotated: {other:?}"),
    }
    f.clock.advance(Duration::from_secs(5));
    let second = s
        .put_secret("db", Put::Rotate, "bob", sealer("c"))
        .await
        .unwrap();
    assert_eq!((second.version, second.created_by.as_str()), (2, "bob"));
    // The sealer saw the version the store decided; the first stays.
    assert_eq!(s.secret("db", 1).await.unwrap().unwrap().sealed, b"a@v1");
    assert_eq!(s.secret("db", 2).await.unwrap().unwrap().sealed, b"c@v2");
    assert!(s.secret("db", 3).await.unwrap().is_none());
    s.put_secret("api", Put::New, "alice", sealer("x"))
        .await
        .unwrap();
    let listed = s.list_secrets().await.unwrap();
    let names: Vec<(&str, u64)> = listed
        .iter()
        .map(|l| (l.name.as_str(), l.version))
        .collect();
    assert_eq!(names, [("api", 1), ("db", 2)]);

    let deleted = s.delete_secret("db").await.unwrap();
    assert_eq!(deleted.version, 2);
    assert!(s.secret("db", 1).await.unwrap().is_none(), "wiped");
    assert!(s.secret("db", 2).await.unwrap().is_none(), "wiped");
    assert!(matches!(
        s.delete_secret("db").await,
        Err(TxError::Refused(Refusal::NotFound(_)))
    ));
    assert!(matches!(
        s.put_secret("db", Put::Rotate, "bob", sealer("d")).await,
        Err(TxError::Refused(Refusal::NotFound(_)))
    ));
    let again = s
        .put_secret("db", Put::New, "bob", sealer("e"))
        .await
        .unwrap();
    assert_eq!(again.version, 3, "no version is handed out twice");
    assert_eq!(s.secret("db", 3).await.unwrap().unwrap().sealed, b"e@v3");
}
