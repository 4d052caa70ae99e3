use std::time::Duration;

use bc_store::{OperatorId, Refusal, TokenId, TxError};

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

pub async fn operators_are_found_by_their_certificate_and_revoked_for_every_process(f: Fixture) {
    use bc_store::tokens::{NewOperator, OperatorRole};
    let s = &f.store;
    let op = |id: &str, role, hash: &str| NewOperator {
        id: id.into(),
        role,
        cert_sha256: hash.into(),
        cert_serial: format!("serial-{hash}"),
        not_after: super::T0 + 86_400_000,
    };
    assert_eq!(s.operator_by_cert("c1").await.unwrap(), None);
    s.add_operator(&op("admin", OperatorRole::Admin, "c1"))
        .await
        .unwrap();
    s.add_operator(&op("viewer", OperatorRole::ReadOnly, "c2"))
        .await
        .unwrap();
    let viewer = s.operator_by_cert("c2").await.unwrap().unwrap();
    assert_eq!(
        (viewer.id.as_str(), viewer.role, viewer.created_at),
        ("viewer", OperatorRole::ReadOnly, super::T0)
    );
    assert!(viewer.active(super::T0));
    assert!(
        !viewer.active(super::T0 + 86_400_000),
        "expired with its certificate"
    );
    match s
        .add_operator(&op("viewer", OperatorRole::Admin, "c3"))
        .await
    {
        Err(TxError::Refused(Refusal::Conflict(m))) => assert!(m.contains("viewer"), "{m}"),
        other => panic!("a second operator of one name: {other:?}"),
    }
    assert!(
        s.add_operator(&op("other", OperatorRole::Admin, "c1"))
            .await
            .is_err(),
        "one certificate, one operator"
    );
    let names: Vec<OperatorId> = s
        .list_operators()
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(names, ["admin", "viewer"]);

    // Revoked through one handle, refused through another (a second
    // process on the same store) at its next look-up.
    let other = f.reopen().await;
    f.advance(Duration::from_secs(5));
    // The statement is sealed from the row and the store's time of the
    // revocation, and kept beside it.
    let seal = || -> bc_store::tokens::SealRevocation {
        Box::new(|row, at| format!("{} {:?} {at}", row.id, row.cert_sha256).into_bytes())
    };
    let revoked = s
        .revoke_operator(&OperatorId::from("viewer"), seal())
        .await
        .unwrap();
    assert_eq!(revoked.revoked_at, Some(super::T0 + 5_000));
    let statement = format!("viewer Some(\"c2\") {}", super::T0 + 5_000).into_bytes();
    assert_eq!(revoked.revocation.as_deref(), Some(statement.as_slice()));
    let seen = other.operator_by_cert("c2").await.unwrap().unwrap();
    assert!(!seen.active(super::T0 + 5_000));
    assert_eq!(seen.revocation.as_deref(), Some(statement.as_slice()));
    f.advance(Duration::from_secs(5));
    let again = s
        .revoke_operator(
            &OperatorId::from("viewer"),
            Box::new(|_, _| panic!("a revoked operator is not sealed again")),
        )
        .await
        .unwrap();
    assert_eq!(
        (again.revoked_at, again.revocation),
        (Some(super::T0 + 5_000), Some(statement)),
        "revoking again changes nothing"
    );
    match s.revoke_operator(&OperatorId::from("nobody"), seal()).await {
        Err(TxError::Refused(Refusal::NotFound(m))) => assert!(m.contains("nobody"), "{m}"),
        other => panic!("revoking an unknown operator: {other:?}"),
    }
    assert!(
        other
            .operator_by_cert("c1")
            .await
            .unwrap()
            .unwrap()
            .active(super::T0 + 10_000)
    );
}

pub async fn tokens_are_listed_without_secrets_and_a_revoked_one_joins_nothing(f: Fixture) {
    let s = &f.store;
    s.create_token(&token("old", Duration::from_secs(60), 2))
        .await
        .unwrap();
    f.advance(Duration::from_millis(5));
    let mut pooled = token("new", Duration::from_secs(600), 3);
    pooled.pool = Some("rack-a".into());
    pooled.description = "rack A".into();
    s.create_token(&pooled).await.unwrap();
    f.advance(Duration::from_millis(5));
    s.create_token(&token("spent", Duration::from_secs(60), 1))
        .await
        .unwrap();
    s.join(&join_input("spent", "h"), Box::new(|_, _| Ok(fake_cert(1))))
        .await
        .unwrap();
    let ids = |v: Vec<bc_store::tokens::TokenInfo>| v.into_iter().map(|t| t.id).collect::<Vec<_>>();
    // Live ones, newest first; every one with `all`.
    assert_eq!(ids(s.list_tokens(false).await.unwrap()), ["new", "old"]);
    assert_eq!(
        ids(s.list_tokens(true).await.unwrap()),
        ["spent", "new", "old"]
    );
    let new = s.list_tokens(false).await.unwrap().remove(0);
    assert_eq!(
        new,
        bc_store::tokens::TokenInfo {
            id: "new".into(),
            created_at_ms: super::T0 + 5,
            expires_at_ms: super::T0 + 5 + 600_000,
            uses_total: 3,
            uses_left: 3,
            description: "rack A".into(),
            pool: Some("rack-a".into()),
            minted_for_mac: None,
        }
    );
    // Revoked: it expired now, it joins nothing, and it is no longer live.
    let revoked = s
        .revoke_token(&TokenId::from("new"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked.expires_at_ms, super::T0 + 10 - 1);
    assert_eq!(revoked.uses_left, 3, "revoking spends nothing");
    f.advance(Duration::from_millis(1));
    match s
        .join(&join_input("new", "h"), Box::new(|_, _| Ok(fake_cert(2))))
        .await
    {
        Err(TxError::Refused(r)) => assert_eq!(r, Refusal::ExpiredToken),
        other => panic!("a revoked token joined: {:?}", other.map(|j| j.node_id)),
    }
    assert_eq!(ids(s.list_tokens(false).await.unwrap()), ["old"]);
    // Again, or after it expired: the expiry stays the earlier one.
    f.advance(Duration::from_secs(120));
    assert_eq!(
        s.revoke_token(&TokenId::from("new"))
            .await
            .unwrap()
            .unwrap()
            .expires_at_ms,
        revoked.expires_at_ms
    );
    let old = s
        .revoke_token(&TokenId::from("old"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.expires_at_ms, super::T0 + 60_000, "already expired");
    assert_eq!(s.revoke_token(&TokenId::from("nope")).await.unwrap(), None);
}
