use bc_store::NodeId;
use bc_store::bindings::{BindingInput, BindingOutcome, BindingReport};
use bc_store::nodes::IssuedCert;

use super::{Fixture, fake_cert, joined_with, sign, verify};

fn report(session: &str, node: &str, alloc: &str, nonce: &str, key: Option<&[u8]>) -> BindingInput {
    let payload = format!("{node}/{alloc}/{nonce}").into_bytes();
    BindingInput {
        session_node: session.into(),
        report: Some(BindingReport {
            node_id: node.into(),
            allocation_id: alloc.into(),
            gpu_uuids: vec!["GPU-2".into(), "GPU-1".into()],
            spec_generation: 4,
            nonce: nonce.into(),
        }),
        signature: key.map(|k| sign(k, &payload)).unwrap_or_default(),
        payload,
    }
}

async fn node_with_der(f: &Fixture, der: &[u8]) -> NodeId {
    joined_with(
        &f.store,
        IssuedCert {
            der: der.to_vec(),
            ..fake_cert(1)
        },
    )
    .await
}

pub async fn only_the_nodes_current_key_binds_and_replays_are_refused(f: Fixture) {
    let s = &f.store;
    let key: &[u8] = b"node-cert";
    let n = node_with_der(&f, key).await;
    let r = |alloc: &str, nonce: &str, k: Option<&[u8]>| report(&n, &n, alloc, nonce, k);
    assert_eq!(
        s.record_binding(&r("job-a", "n0", Some(key)), verify)
            .await
            .unwrap(),
        BindingOutcome::Accepted
    );
    let b = s.bindings(&n).await.unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(
        (
            b[0].allocation_id.as_str(),
            b[0].state.as_str(),
            b[0].spec_generation
        ),
        ("job-a", "active", 4)
    );
    assert_eq!(
        b[0].gpus,
        vec!["GPU-1".to_string(), "GPU-2".into()],
        "sorted"
    );
    for (input, reason) in [
        (r("job-b", "n1", None), "allocation job-b: unsigned report"),
        (
            r("job-c", "n2", Some(b"other-key")),
            "allocation job-c: signature is not from the node's current certificate",
        ),
        (
            r("job-a", "n0", Some(key)),
            "allocation job-a: replayed report",
        ),
        (
            report(&n, "nd-other", "job-d", "n3", Some(key)),
            "allocation job-d: report for node nd-other on node",
        ),
    ] {
        match s.record_binding(&input, verify).await.unwrap() {
            BindingOutcome::Rejected(got) => assert!(got.starts_with(reason), "{got}"),
            other => panic!("{reason}: {other:?}"),
        }
    }
    let mut malformed = r("job-e", "n4", Some(key));
    malformed.report = None;
    assert_eq!(
        s.record_binding(&malformed, verify).await.unwrap(),
        BindingOutcome::Rejected("malformed binding report".into())
    );
    let events = s.fleet_events(&n, 20).await.unwrap();
    assert_eq!(events.len(), 5, "{events:?}");
    assert_eq!(
        events[0], "reservation.binding-rejected: malformed binding report",
        "newest first"
    );
    assert!(
        events
            .iter()
            .all(|e| e.starts_with("reservation.binding-rejected: "))
    );
    assert_eq!(s.fleet_events(&n, 2).await.unwrap().len(), 2);
    assert_eq!(s.bindings(&n).await.unwrap().len(), 1, "nothing else bound");
}

pub async fn a_forged_report_marks_an_active_binding_lost(f: Fixture) {
    let s = &f.store;
    let key: &[u8] = b"node-cert";
    let n = node_with_der(&f, key).await;
    s.record_binding(&report(&n, &n, "job-a", "n0", Some(key)), verify)
        .await
        .unwrap();
    let out = s
        .record_binding(&report(&n, &n, "job-a", "n1", Some(b"forger")), verify)
        .await
        .unwrap();
    assert!(
        matches!(out, BindingOutcome::MarkedLost(ref r) if r.starts_with("allocation job-a")),
        "{out:?}"
    );
    assert_eq!(
        s.bindings(&n).await.unwrap()[0].state,
        "lost",
        "not replaced"
    );
    let events = s.fleet_events(&n, 10).await.unwrap();
    assert!(
        events[0].starts_with("reservation.binding-lost: allocation job-a"),
        "{events:?}"
    );
    // The node itself binds it again.
    assert_eq!(
        s.record_binding(&report(&n, &n, "job-a", "n2", Some(key)), verify)
            .await
            .unwrap(),
        BindingOutcome::Accepted
    );
    assert_eq!(s.bindings(&n).await.unwrap()[0].state, "active");
    // A node without a valid certificate binds nothing.
    s.delete_node(&n, Box::new(|_| vec![])).await.unwrap();
    assert!(matches!(
        s.record_binding(&report(&n, &n, "job-z", "n3", Some(key)), verify).await.unwrap(),
        BindingOutcome::Rejected(r) if r.ends_with("the node has no current certificate")
    ));
}
