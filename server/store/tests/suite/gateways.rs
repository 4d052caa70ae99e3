use std::time::Duration;

use bc_store::{Refusal, TxError};

use super::Fixture;

pub async fn a_gateway_credential_is_live_once_and_a_revoked_name_starts_over(f: Fixture) {
    let s = &f.store;
    let created = s.add_gateway_credential("gw-a", "h1").await.unwrap();
    assert_eq!(created, super::T0, "on the store's clock");
    match s.add_gateway_credential("gw-a", "h2").await {
        Err(TxError::Refused(Refusal::Conflict(m))) => {
            assert!(m.contains("better-compute gateways revoke gw-a"), "{m}")
        }
        other => panic!("a live name is not added twice: {other:?}"),
    }
    let c = s.gateway_credential("gw-a").await.unwrap().unwrap();
    assert_eq!(c.secret_sha256, "h1", "the refused add changed nothing");
    assert!(c.admits(super::T0));

    f.clock.advance(Duration::from_secs(10));
    assert!(s.revoke_gateway_credential("gw-a").await.unwrap());
    assert!(
        !s.revoke_gateway_credential("gw-a").await.unwrap(),
        "revoked once"
    );
    assert!(!s.revoke_gateway_credential("nope").await.unwrap());
    let c = s.gateway_credential("gw-a").await.unwrap().unwrap();
    assert_eq!(c.revoked_ms, Some(super::T0 + 10_000));
    assert!(!c.admits(super::T0 + 5_000));

    f.clock.advance(Duration::from_secs(10));
    let again = s.add_gateway_credential("gw-a", "h3").await.unwrap();
    assert_eq!(again, super::T0 + 20_000);
    let c = s.gateway_credential("gw-a").await.unwrap().unwrap();
    assert_eq!((c.secret_sha256.as_str(), c.revoked_ms), ("h3", None));
    assert!(
        !c.admits(super::T0 + 5_000),
        "a certificate from before the name was added again does not count"
    );
    s.add_gateway_credential("gw-b", "h4").await.unwrap();
    let names: Vec<String> = s
        .list_gateway_credentials()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["gw-a", "gw-b"]);
    assert!(s.gateway_credential("nope").await.unwrap().is_none());
}
