use std::time::Duration;

use bc_store::specs::{Access, AccessUser, Assignment, LIFETIME, RESIGN_WITHIN, SectionReport};
use bc_store::{GatewayId, NodeId, Refusal, TxError};

use super::{Fixture, T0, joined, open_spec, seal_spec, state, verify};

fn assignment(id: &str, gpus: &[&str]) -> Assignment {
    Assignment {
        allocation_id: id.into(),
        gpus: gpus.iter().map(|g| g.to_string()).collect(),
        env: [("A".to_string(), "1".to_string())].into(),
        secrets: Vec::new(),
    }
}

pub async fn spec_changes_are_sealed_and_refusals_change_nothing(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    assert_eq!(s.signed_spec(&node).await.unwrap(), None);
    let (generation, body) = s
        .update_spec(
            &node,
            Box::new(|b| {
                b.assignments.push(assignment("job-a", &["0"]));
                Ok(())
            }),
            open_spec(&node),
            {
                let sealed = seal_spec(&node);
                Box::new(move |seal, body| {
                    assert_eq!((seal.generation, seal.issued_at_ms), (1, T0));
                    assert_eq!(seal.not_after_ms, T0 + LIFETIME.as_millis() as i64);
                    sealed(seal, body)
                })
            },
        )
        .await
        .unwrap();
    assert_eq!((generation, body.assignments.len()), (1, 1));
    let (stored_generation, signed) = s.signed_spec(&node).await.unwrap().unwrap();
    assert_eq!(stored_generation, 1);
    assert_eq!(open_spec(&node)(&signed).unwrap().body, body);
    // A refused change leaves generation and body alone.
    let err = s
        .update_spec(
            &node,
            Box::new(|b| {
                b.assignments.clear();
                Err(Refusal::BadRequest("no".into()))
            }),
            open_spec(&node),
            Box::new(|_, _| panic!("a refused change is not sealed")),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, TxError::Refused(Refusal::BadRequest(_))));
    // Access edits keep the assignments.
    f.advance(Duration::from_millis(5));
    let (generation, _) = s
        .update_spec(
            &node,
            Box::new(|b| {
                b.access = Access {
                    users: vec![AccessUser {
                        name: "ops".into(),
                        authorized_keys: vec!["ssh-ed25519 AAAA ops".into()],
                        principals: vec![],
                    }],
                    ..Access::default()
                };
                Ok(())
            }),
            open_spec(&node),
            seal_spec(&node),
        )
        .await
        .unwrap();
    assert_eq!(generation, 2);
    let view = s.spec_view(&node).await.unwrap().unwrap();
    assert_eq!(view.desired_generation, 2);
    assert_eq!(view.assignments, vec![assignment("job-a", &["0"])]);
    assert_eq!(view.access.users[0].name, "ops");
    assert_eq!((view.applied_generation, view.reported_age_ms), (0, None));
    assert_eq!(view.now_ms, T0 + 5);
    // Work for the node's gateway: a spec changed since a given time.
    let e = s
        .hello(&super::hello(&node, 1, "gw", 0))
        .await
        .unwrap()
        .epoch;
    assert!(e > 0);
    assert_eq!(
        s.nodes_with_work(&GatewayId::from("gw"), T0 + 5)
            .await
            .unwrap(),
        vec![node.clone()]
    );
    assert!(
        s.nodes_with_work(&GatewayId::from("gw"), T0 + 6)
            .await
            .unwrap()
            .is_empty()
    );
    // Whatever the stamps say, the generation of each connected node.
    assert_eq!(
        s.spec_generations(&GatewayId::from("gw")).await.unwrap(),
        vec![(node.clone(), 2)]
    );
    assert!(
        s.spec_generations(&GatewayId::from("gw-other"))
            .await
            .unwrap()
            .is_empty()
    );
    // No spec for a node that does not exist.
    let err = s
        .update_spec(
            &NodeId::from("nd-nope"),
            Box::new(|_| Ok(())),
            open_spec("nd-nope"),
            seal_spec("nd-nope"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.refusal(), Some(&Refusal::NoSuchNode("nd-nope".into())));
    assert_eq!(s.spec_view(&NodeId::from("nd-nope")).await.unwrap(), None);
}

pub async fn state_reports_move_the_applied_generation_forward_or_to_zero(f: Fixture) {
    let s = &f.store;
    let node = joined(s, 1).await;
    let report = |age_ms| {
        vec![SectionReport {
            section: "devices".into(),
            status: "READY".into(),
            message: "ok".into(),
            age_ms,
        }]
    };
    s.put_state_report(&node, &state(&node, 1, 1, 3, report(1_000)), verify)
        .await
        .unwrap();
    s.put_state_report(&node, &state(&node, 1, 1, 2, report(0)), verify)
        .await
        .unwrap();
    f.advance(Duration::from_secs(2));
    let view = s.spec_view(&node).await.unwrap().unwrap();
    assert_eq!(
        view.applied_generation, 3,
        "a late report does not move it back"
    );
    assert_eq!(view.reported_age_ms, Some(2_000));
    assert_eq!(
        view.sections[0].since_ms, T0,
        "the latest report's section time"
    );
    s.put_state_report(&node, &state(&node, 1, 1, 0, report(0)), verify)
        .await
        .unwrap();
    assert_eq!(
        s.spec_view(&node)
            .await
            .unwrap()
            .unwrap()
            .applied_generation,
        0,
        "a new journal starts again"
    );
}

pub async fn expiring_specs_are_found_for_signing_again(f: Fixture) {
    let s = &f.store;
    let (a, b) = (joined(s, 1).await, joined(s, 2).await);
    for n in [&a, &b] {
        s.update_spec(n, Box::new(|_| Ok(())), open_spec(n), seal_spec(n))
            .await
            .unwrap();
    }
    assert!(s.specs_expiring(RESIGN_WITHIN).await.unwrap().is_empty());
    f.advance(LIFETIME - RESIGN_WITHIN + Duration::from_millis(1));
    let mut due = s.specs_expiring(RESIGN_WITHIN).await.unwrap();
    due.sort();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(due, both);
    // Signed again (a new generation of the same body), it is not due.
    let (generation, _) = s
        .update_spec(&a, Box::new(|_| Ok(())), open_spec(&a), seal_spec(&a))
        .await
        .unwrap();
    assert_eq!(generation, 2);
    assert_eq!(
        s.specs_expiring(RESIGN_WITHIN).await.unwrap(),
        vec![b.clone()]
    );
    // Every live node's signed spec, in node order (what selectors open).
    let signed = s.signed_specs().await.unwrap();
    assert_eq!(
        signed.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        both
    );
    for (n, bytes) in &signed {
        assert_eq!(
            Some(bytes),
            s.signed_spec(&NodeId::from(n))
                .await
                .unwrap()
                .map(|(_, b)| b)
                .as_ref()
        );
    }
    // A deleted node's spec is nobody's business.
    s.delete_node(&b, Box::new(|_| vec![])).await.unwrap();
    assert!(s.specs_expiring(RESIGN_WITHIN).await.unwrap().is_empty());
    assert_eq!(
        s.signed_specs()
            .await
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>(),
        vec![a.clone()]
    );
}

/// Whoever can write the store rewrites a node's spec row: the unsigned
/// columns (root with a key of theirs, the GPUs gone, due at once), then
/// the signed bytes (another node's spec). A change, the spec controller's
/// included, starts from what the worker signed: the first rewrite signs
/// nothing of its own, the second is recorded and refused.
pub async fn a_rewritten_spec_row_signs_nothing(f: Fixture) {
    let s = &f.store;
    let (node, other) = (joined(s, 1).await, joined(s, 2).await);
    let ops = Access {
        users: vec![AccessUser {
            name: "ops".into(),
            authorized_keys: vec!["ssh-ed25519 AAAA ops".into()],
            principals: vec![],
        }],
        ..Access::default()
    };
    let granted = ops.clone();
    s.update_spec(
        &node,
        Box::new(move |b| {
            b.assignments.push(assignment("job-a", &["0"]));
            b.access = granted;
            Ok(())
        }),
        open_spec(&node),
        seal_spec(&node),
    )
    .await
    .unwrap();
    s.update_spec(
        &other,
        Box::new(|_| Ok(())),
        open_spec(&other),
        seal_spec(&other),
    )
    .await
    .unwrap();

    f.tamper(&format!(
        "UPDATE node_specs SET access = '{{\"users\":[{{\"name\":\"root\",\"authorized_keys\":\
         [\"ssh-ed25519 AAAA attacker\"],\"principals\":[]}}],\"trusted_user_ca_keys\":[],\
         \"firewall\":null}}', assignments = '[]', not_after = 0 WHERE node_id = '{node}'"
    ))
    .await;
    assert_eq!(
        s.specs_expiring(RESIGN_WITHIN).await.unwrap(),
        vec![node.clone()]
    );
    let (generation, body) = s
        .update_spec(
            &node,
            Box::new(|_| Ok(())),
            open_spec(&node),
            seal_spec(&node),
        )
        .await
        .unwrap();
    assert_eq!(generation, 2);
    assert_eq!(
        body.access, ops,
        "the signed access, not the rewritten column"
    );
    assert_eq!(body.assignments, vec![assignment("job-a", &["0"])]);
    let (_, signed) = s.signed_spec(&node).await.unwrap().unwrap();
    let resigned = open_spec(&node)(&signed).unwrap();
    assert_eq!((resigned.generation, &resigned.body), (2, &body));

    // Another node's signed spec planted in its place: recorded, refused,
    // nothing signed; the stored spec is what it was.
    f.tamper(&format!(
        "UPDATE node_specs SET signed = (SELECT signed FROM node_specs WHERE node_id = \
         '{other}') WHERE node_id = '{node}'"
    ))
    .await;
    let err = s
        .update_spec(
            &node,
            Box::new(|b| {
                b.access = Access::default();
                Ok(())
            }),
            open_spec(&node),
            Box::new(|_, _| panic!("nothing is signed from a planted spec")),
        )
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err.refusal(), Some(Refusal::Conflict(_))),
        "{text}"
    );
    assert!(text.contains("not one a worker key signed"), "{text}");
    assert!(text.contains(&format!("sealed for node {other}")), "{text}");
    assert_eq!(s.signed_spec(&node).await.unwrap().unwrap().0, 2);
    let events = s.fleet_events(&node, 10).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with(bc_store::specs::SPEC_FORGED) && e.contains(other.as_str())),
        "{events:?}"
    );
}
