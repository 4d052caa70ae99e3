//! What a node signs, and what is stated about it: results, state reports
//! and inventory apply only as the node's own signed facts (anything else
//! is a `security.*.forged` event and changes nothing), and deleting a node
//! keeps the signed statement of it with its certificates.

use bc_store::NodeId;
use std::time::Duration;

use bc_store::Refusal;
use bc_store::commands::ResultApplied;
use bc_store::inventory::InventoryInput;
use bc_store::nodes::{Signed, StatementKind, StatementSeal};
use bc_store::specs::{FactApplied, SectionReport};
use bcd_core::command::{Kind, Outcome};

use super::commands::{command, result, result_of};
use super::{Fixture, T0, fake_cert, hello, joined, signed, state, verify};

fn inventory(node: &str, epoch: u64) -> InventoryInput {
    InventoryInput {
        node_id: node.into(),
        epoch,
        section: bcd_core::report::InventorySection::Gpus,
        sha256: "abc".into(),
        body: b"[]".to_vec(),
    }
}

fn ready() -> Vec<SectionReport> {
    vec![SectionReport {
        section: "devices".into(),
        status: "READY".into(),
        message: String::new(),
        age_ms: 0,
    }]
}

pub async fn forged_facts_are_recorded_and_applied_nowhere(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let other = joined(s, 2).await;
    let epoch = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap().epoch;
    let (c, _) = s
        .create_command(&command(&node, Kind::ExecRun, "x"), Box::new(|_| vec![]))
        .await
        .unwrap();
    let n: &str = &node;
    let forged = |r: Signed<_>| async move {
        s.command_result(&NodeId::from(n), &r, verify)
            .await
            .unwrap()
    };
    // Signed by a key that is not the node's.
    let by_another_key = result(&node, 9, &c.id, Outcome::Succeeded);
    // Unsigned.
    let unsigned = Signed {
        signature: vec![],
        ..result(&node, 1, &c.id, Outcome::Succeeded)
    };
    // Validly signed by another node, relayed on this node's session.
    let other_nodes = result(&other, 2, &c.id, Outcome::Succeeded);
    // The signed bytes changed after signing (a failure made a success).
    let mut tampered = result(&node, 1, &c.id, Outcome::Failed);
    tampered.fact = Some(result_of(&node, &c.id, Outcome::Succeeded));
    tampered.payload = format!("{:?}", tampered.fact.as_ref().unwrap()).into_bytes();
    // Bytes that do not decode.
    let garbled = Signed {
        fact: None,
        payload: b"\xff".to_vec(),
        signature: vec![1],
    };
    for r in [by_another_key, unsigned, other_nodes, tampered, garbled] {
        assert!(matches!(forged(r).await, ResultApplied::Forged(_)));
    }
    assert_eq!(
        s.get_command(&c.id).await.unwrap().unwrap().state.text(),
        "pending"
    );
    let events = s.fleet_events(&node, 50).await.unwrap();
    let has = |x: &str| events.iter().any(|e| e.contains(x));
    assert!(
        has(&format!(
            "security.result.forged: command {}: the signature is not from a valid certificate",
            c.id
        )),
        "{events:?}"
    );
    assert!(has("unsigned"), "{events:?}");
    assert!(
        has(&format!(
            "a fact about node {other} on node {node}'s session"
        )),
        "{events:?}"
    );
    assert!(
        has("security.result.forged: the payload does not decode"),
        "{events:?}"
    );

    // A forged state report and inventory section.
    assert!(matches!(
        s.put_state_report(&node, &state(&node, 9, epoch, 5, ready()), verify)
            .await
            .unwrap(),
        FactApplied::Forged(_)
    ));
    assert!(matches!(
        s.put_inventory(&node, epoch, &signed(9, inventory(&node, epoch)), verify)
            .await
            .unwrap(),
        FactApplied::Forged(_)
    ));
    let view = s.spec_view(&node).await.unwrap().unwrap();
    assert_eq!((view.applied_generation, view.reported_age_ms), (0, None));
    assert_eq!(
        s.inventory(&node, bcd_core::report::InventorySection::Gpus)
            .await
            .unwrap(),
        None
    );
    let events = s.fleet_events(&node, 50).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("security.state-report.forged:")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("security.inventory.forged: section gpus:")),
        "{events:?}"
    );

    // The node's own facts apply.
    assert_eq!(
        s.command_result(&node, &result(&node, 1, &c.id, Outcome::Failed), verify)
            .await
            .unwrap(),
        ResultApplied::Applied
    );
    assert_eq!(
        s.put_state_report(&node, &state(&node, 1, epoch, 5, ready()), verify)
            .await
            .unwrap(),
        FactApplied::Applied
    );
    assert_eq!(
        s.put_inventory(&node, epoch, &signed(1, inventory(&node, epoch)), verify)
            .await
            .unwrap(),
        FactApplied::Applied
    );
    assert_eq!(
        s.spec_view(&node)
            .await
            .unwrap()
            .unwrap()
            .applied_generation,
        5
    );
    // After a renewal the node signs with its new key; both verify while
    // both certificates are valid.
    s.renew(
        &fake_cert(1).fingerprint,
        Box::new(|_, _, _| Ok(fake_cert(3))),
    )
    .await
    .unwrap();
    assert_eq!(
        s.put_state_report(&node, &state(&node, 3, epoch, 6, ready()), verify)
            .await
            .unwrap(),
        FactApplied::Applied
    );
    assert_eq!(
        s.put_state_report(&node, &state(&node, 1, epoch, 7, ready()), verify)
            .await
            .unwrap(),
        FactApplied::Applied
    );
}

pub async fn a_report_from_an_older_session_changes_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let n: &str = &node;
    let put = |epoch, applied| async move {
        s.put_state_report(
            &NodeId::from(n),
            &state(n, 1, epoch, applied, ready()),
            verify,
        )
        .await
        .unwrap()
    };
    assert_eq!(put(3, 4).await, FactApplied::Applied);
    assert_eq!(put(2, 9).await, FactApplied::Stale);
    assert_eq!(
        s.spec_view(&node)
            .await
            .unwrap()
            .unwrap()
            .applied_generation,
        4
    );
    assert_eq!(put(3, 5).await, FactApplied::Applied);
    assert_eq!(
        put(4, 0).await,
        FactApplied::Applied,
        "a new journal, later"
    );
    assert_eq!(
        s.spec_view(&node)
            .await
            .unwrap()
            .unwrap()
            .applied_generation,
        0
    );
}

pub async fn deleting_a_node_keeps_a_signed_statement_with_its_certificates(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    s.renew(
        &fake_cert(1).fingerprint,
        Box::new(|_, _, _| Ok(fake_cert(2))),
    )
    .await
    .unwrap();
    f.advance(Duration::from_millis(10));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None::<StatementSeal>));
    let keep = seen.clone();
    assert!(
        s.delete_node(
            &node,
            Box::new(move |st| {
                *keep.lock().unwrap() = Some(st.clone());
                format!("signed:{}", st.node_id).into_bytes()
            })
        )
        .await
        .unwrap()
    );
    let st = seen.lock().unwrap().clone().unwrap();
    let mut serials = st.serials.clone();
    serials.sort();
    assert_eq!(
        (
            st.node_id.as_str(),
            st.kind,
            st.reason.as_str(),
            st.issued_at_ms
        ),
        (
            node.as_str(),
            StatementKind::Deleted,
            "node-deleted",
            T0 + 10
        )
    );
    assert_eq!(serials, ["serial1", "serial2"]);
    let statement = Some(format!("signed:{node}").into_bytes());
    for fp in [fake_cert(1).fingerprint, fake_cert(2).fingerprint] {
        assert_eq!(
            s.check_cert(&fp).await.unwrap_err().refusal(),
            Some(&Refusal::DeletedNode(node.to_string(), statement.clone()))
        );
    }
    let revoked = s.revoked_since(T0).await.unwrap();
    assert_eq!(revoked.len(), 2);
    assert!(revoked.iter().all(|r| r.statement == statement));
}

pub async fn a_signed_host_inventory_replaces_the_macs_the_join_reported(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let epoch = s.hello(&hello(&node, 1, "gw", 0)).await.unwrap().epoch;
    let macs = |id: &str| {
        let id = id.to_string();
        async move {
            s.list_nodes()
                .await
                .unwrap()
                .nodes
                .into_iter()
                .find(|n| n.node_id == id)
                .unwrap()
                .macs
        }
    };
    let host = |body: &str| InventoryInput {
        section: bcd_core::report::InventorySection::Host,
        body: body.as_bytes().to_vec(),
        ..inventory(&node, epoch)
    };
    let n: &str = &node;
    let put = |i: InventoryInput, key: u8| async move {
        s.put_inventory(&NodeId::from(n), epoch, &signed(key, i), verify)
            .await
            .unwrap()
    };
    assert_eq!(
        put(
            host(r#"{"hostname":"n","macs":["52:54:00:00:00:02","52-54-00-00-00-01"]}"#),
            1
        )
        .await,
        FactApplied::Applied
    );
    assert_eq!(
        macs(&node).await,
        ["52:54:00:00:00:01", "52:54:00:00:00:02"]
    );
    // Forged by another key, or from an older agent that lists none, or
    // with something that is not a MAC: the MACs stay.
    assert!(matches!(
        put(host(r#"{"macs":["52:54:00:00:00:09"]}"#), 9).await,
        FactApplied::Forged(_)
    ));
    put(host(r#"{"hostname":"n"}"#), 1).await;
    put(host(r#"{"macs":["52:54:00:00:00:09","nonsense"]}"#), 1).await;
    assert_eq!(
        macs(&node).await,
        ["52:54:00:00:00:01", "52:54:00:00:00:02"]
    );
    // A MAC another node reports later names that node.
    let other = joined(s, 2).await;
    let other_epoch = s.hello(&hello(&other, 2, "gw", 0)).await.unwrap().epoch;
    let moved = InventoryInput {
        node_id: other.clone(),
        epoch: other_epoch,
        section: bcd_core::report::InventorySection::Host,
        sha256: "x".into(),
        body: br#"{"macs":["52:54:00:00:00:02"]}"#.to_vec(),
    };
    assert_eq!(
        s.put_inventory(&other, other_epoch, &signed(2, moved), verify)
            .await
            .unwrap(),
        FactApplied::Applied
    );
    assert_eq!(macs(&other).await, ["52:54:00:00:00:02"]);
    assert_eq!(macs(&node).await, ["52:54:00:00:00:01"]);
    // One node read alone is what the list shows of it, its MACs
    // included; an unknown or deleted node is none.
    let listed = s.list_nodes().await.unwrap().nodes;
    for id in [&node, &other] {
        let mut one = s.node(id).await.unwrap().nodes.pop().expect("a live node");
        let mut from_list = listed.iter().find(|n| &n.node_id == id).unwrap().clone();
        // Ages move between the two reads.
        (one.last_seen_age_ms, from_list.last_seen_age_ms) = (0, 0);
        assert_eq!(one, from_list);
    }
    assert!(
        s.node(&NodeId::from("nd-000000000000"))
            .await
            .unwrap()
            .nodes
            .is_empty()
    );
    assert_eq!(s.node(&node).await.unwrap().nodes.len(), 1);
    s.delete_node(&other, Box::new(|_| vec![])).await.unwrap();
    assert!(s.node(&other).await.unwrap().nodes.is_empty());
}
