use std::time::Duration;

use bc_store::{Refusal, TxError};

use super::{Fixture, fake_cert, join_input, token};

pub async fn tokens_are_single_use_and_expire(f: Fixture) {
    let s = &f.store;
    let expires = s
        .create_token(&token("t1", Duration::from_secs(60), 1))
        .await
        .unwrap();
    assert_eq!(expires, super::T0 + 60_000, "on the store's clock");
    let refuse = |id: &'static str, secret: &'static str| async move {
        match s
            .join(&join_input(id, secret), Box::new(|_, _| Ok(fake_cert(9))))
            .await
        {
            Err(TxError::Refused(r)) => r,
            other => panic!("expected a refusal, got {:?}", other.map(|j| j.node_id)),
        }
    };
    assert_eq!(refuse("t1", "wrong").await, Refusal::UnknownToken);
    assert_eq!(refuse("nope", "h").await, Refusal::UnknownToken);
    let joined = s
        .join(
            &join_input("t1", "h"),
            Box::new(|_, now| {
                assert_eq!(
                    now,
                    super::T0,
                    "the certificate is issued at the store's now"
                );
                Ok(fake_cert(1))
            }),
        )
        .await
        .unwrap();
    assert_eq!(joined.now_ms, super::T0);
    assert_eq!(refuse("t1", "h").await, Refusal::UsedToken);
    s.create_token(&token("t2", Duration::ZERO, 5))
        .await
        .unwrap();
    f.advance(Duration::from_millis(1));
    assert_eq!(refuse("t2", "h").await, Refusal::ExpiredToken);
    // A certificate the CA cannot issue refuses the join, and spends nothing.
    s.create_token(&token("t3", Duration::from_secs(60), 1))
        .await
        .unwrap();
    let err = s
        .join(
            &join_input("t3", "h"),
            Box::new(|_, _| Err(Refusal::BadRequest("bad CSR".into()))),
        )
        .await
        .unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::BadRequest("bad CSR".into())));
    s.join(&join_input("t3", "h"), Box::new(|_, _| Ok(fake_cert(3))))
        .await
        .expect("the refused join spent no use");
    // Refused joins leave no node behind.
    assert_eq!(s.list_nodes().await.unwrap().nodes.len(), 2);
}

pub async fn operators_are_found_by_their_token(f: Fixture) {
    let s = &f.store;
    assert_eq!(s.operator_by_token("h1").await.unwrap(), None);
    s.add_operator("admin", "h1").await.unwrap();
    assert_eq!(
        s.operator_by_token("h1").await.unwrap().as_deref(),
        Some("admin")
    );
    assert!(
        s.add_operator("other", "h1").await.is_err(),
        "one token, one operator"
    );
}
