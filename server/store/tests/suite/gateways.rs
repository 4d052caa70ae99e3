use std::time::Duration;

use bc_store::gateways::{GatewayCert, LISTED_PAST_END_MS, SignedRevocations};
use bc_store::{GatewayId, Refusal, TxError};

use super::Fixture;

pub async fn a_gateway_credential_is_live_once_and_a_revoked_name_starts_over(f: Fixture) {
    let s = &f.store;
    let created = s
        .add_gateway_credential(&GatewayId::from("gw-a"), "h1")
        .await
        .unwrap();
    assert_eq!(created, super::T0, "on the store's clock");
    match s
        .add_gateway_credential(&GatewayId::from("gw-a"), "h2")
        .await
    {
        Err(TxError::Refused(Refusal::Conflict(m))) => {
            assert!(m.contains("better-compute gateways revoke gw-a"), "{m}")
        }
        other => panic!("a live name is not added twice: {other:?}"),
    }
    let c = s
        .gateway_credential(&GatewayId::from("gw-a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.secret_sha256, "h1", "the refused add changed nothing");
    assert!(c.admits(super::T0));

    f.clock.advance(Duration::from_secs(10));
    assert!(
        s.revoke_gateway_credential(&GatewayId::from("gw-a"))
            .await
            .unwrap()
    );
    assert!(
        !s.revoke_gateway_credential(&GatewayId::from("gw-a"))
            .await
            .unwrap(),
        "revoked once"
    );
    assert!(
        !s.revoke_gateway_credential(&GatewayId::from("nope"))
            .await
            .unwrap()
    );
    let c = s
        .gateway_credential(&GatewayId::from("gw-a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.revoked_ms, Some(super::T0 + 10_000));
    assert!(!c.admits(super::T0 + 5_000));

    f.clock.advance(Duration::from_secs(10));
    let again = s
        .add_gateway_credential(&GatewayId::from("gw-a"), "h3")
        .await
        .unwrap();
    assert_eq!(again, super::T0 + 20_000);
    let c = s
        .gateway_credential(&GatewayId::from("gw-a"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((c.secret_sha256.as_str(), c.revoked_ms), ("h3", None));
    assert!(
        !c.admits(super::T0 + 5_000),
        "a certificate from before the name was added again does not count"
    );
    s.add_gateway_credential(&GatewayId::from("gw-b"), "h4")
        .await
        .unwrap();
    let names: Vec<String> = s
        .list_gateway_credentials()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name.into_string())
        .collect();
    assert_eq!(names, ["gw-a", "gw-b"]);
    assert!(
        s.gateway_credential(&GatewayId::from("nope"))
            .await
            .unwrap()
            .is_none()
    );
}

fn cert(name: &str, sha: &str, issued_ms: i64, not_after_ms: i64) -> GatewayCert {
    GatewayCert {
        name: name.into(),
        sha256: sha.into(),
        issued_ms,
        not_after_ms,
    }
}

pub async fn revoked_gateway_certificates_are_listed_until_their_end_and_the_newest_list_is_kept(
    f: Fixture,
) {
    let s = &f.store;
    let day = 24 * 3600 * 1000;
    assert_eq!(s.gateway_revocations().await.unwrap(), None);
    s.add_gateway_credential(&GatewayId::from("gw-a"), "h1")
        .await
        .unwrap();
    s.add_gateway_credential(&GatewayId::from("gw-b"), "h2")
        .await
        .unwrap();
    let a1 = cert("gw-a", "a1", super::T0, super::T0 + 30 * day);
    let b1 = cert("gw-b", "b1", super::T0, super::T0 + 30 * day);
    s.record_gateway_cert(&a1).await.unwrap();
    s.record_gateway_cert(&b1).await.unwrap();
    // Recorded once: the same certificate again changes nothing.
    s.record_gateway_cert(&cert("gw-a", "a1", super::T0 + 5, super::T0 + 9))
        .await
        .unwrap();
    assert!(
        s.revoked_gateway_certs().await.unwrap().is_empty(),
        "live credentials revoke nothing"
    );

    f.clock.advance(Duration::from_secs(10));
    assert!(
        s.revoke_gateway_credential(&GatewayId::from("gw-a"))
            .await
            .unwrap()
    );
    assert_eq!(s.revoked_gateway_certs().await.unwrap(), vec![a1.clone()]);
    // The name added again: its old certificates stay revoked, its new
    // one is live.
    f.clock.advance(Duration::from_secs(10));
    s.add_gateway_credential(&GatewayId::from("gw-a"), "h3")
        .await
        .unwrap();
    let a2 = cert("gw-a", "a2", super::T0 + 20_000, super::T0 + 30 * day);
    s.record_gateway_cert(&a2).await.unwrap();
    assert_eq!(s.revoked_gateway_certs().await.unwrap(), vec![a1.clone()]);

    let first = SignedRevocations {
        issued_ms: super::T0 + 20_000,
        envelope: b"one".to_vec(),
    };
    s.put_gateway_revocations(&first).await.unwrap();
    assert_eq!(s.gateway_revocations().await.unwrap(), Some(first));
    let second = SignedRevocations {
        issued_ms: super::T0 + 21_000,
        envelope: b"two".to_vec(),
    };
    s.put_gateway_revocations(&second).await.unwrap();
    assert_eq!(
        s.gateway_revocations().await.unwrap(),
        Some(second.clone()),
        "one list, the newest"
    );
    // Through the gateway's narrower interface too.
    assert_eq!(
        s.gateway().gateway_revocations().await.unwrap(),
        Some(second)
    );

    // Past its end a certificate stays listed a day (a node checks the end
    // on its own clock, which may lag), then leaves the list, and its
    // record goes.
    f.clock.advance(Duration::from_millis((30 * day) as u64));
    assert_eq!(s.revoked_gateway_certs().await.unwrap().len(), 1);
    // (20 s past its end now.)
    f.clock
        .advance(Duration::from_millis((LISTED_PAST_END_MS - 20_001) as u64));
    assert_eq!(s.revoked_gateway_certs().await.unwrap().len(), 1);
    f.clock.advance(Duration::from_millis(1));
    assert!(s.revoked_gateway_certs().await.unwrap().is_empty());
    f.clock.advance(Duration::from_millis(1));
    s.put_gateway_revocations(&SignedRevocations {
        issued_ms: super::T0 + 31 * day,
        envelope: b"three".to_vec(),
    })
    .await
    .unwrap();
    // A record forgotten is not listed again if its credential goes.
    assert!(
        s.revoke_gateway_credential(&GatewayId::from("gw-b"))
            .await
            .unwrap()
    );
    assert!(s.revoked_gateway_certs().await.unwrap().is_empty());
}
