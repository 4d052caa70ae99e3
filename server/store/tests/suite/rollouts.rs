use bc_store::releases::NewRelease;
use bc_store::rollouts::{NewRollout, NodeStatus, RolloutCommand, RolloutState};
use bc_store::{NodeId, Refusal, ReleaseSeq, TxError};
use bcd_core::command::{Kind, Outcome};

use super::commands::{command, result};
use super::{Fixture, T0, joined};

async fn release(f: &Fixture, sequence: u64) {
    f.store
        .register_release(&NewRelease {
            sequence: ReleaseSeq::new(sequence),
            version: format!("0.{sequence}.0"),
            target: "x86_64-unknown-linux-musl".into(),
            size: 1,
            sha256: "ab".repeat(32),
            key_id: "k".into(),
            signed_manifest: vec![],
            binary: vec![0],
        })
        .await
        .unwrap();
}

fn new(sequence: u64, selector: &str) -> NewRollout {
    NewRollout {
        sequence: ReleaseSeq::new(sequence),
        selector: selector.into(),
        waves: vec![50, 100],
        max_failures: 1,
        labels: None,
    }
}

pub async fn a_rollout_fixes_its_nodes_and_follows_their_commands(f: Fixture) {
    let s = &f.store;
    release(&f, 2).await;
    let a = joined(s, 1).await;
    let b = joined(s, 2).await;
    let r = s.start_rollout(&new(2, "all")).await.unwrap();
    assert_eq!(
        (r.state, r.wave, r.version.as_str()),
        (RolloutState::Running, 0, "0.2.0")
    );
    assert_eq!(r.created_at_ms, T0);
    let mut ids: Vec<&NodeId> = vec![&a, &b];
    ids.sort();
    assert_eq!(
        r.nodes
            .iter()
            .map(|n| n.node_id.as_str())
            .collect::<Vec<_>>(),
        ids
    );
    assert!(r.nodes.iter().all(|n| n.status == NodeStatus::Waiting));
    // A node joining later is not part of it.
    joined(s, 3).await;
    let (up, _) = s
        .create_command(
            &command(ids[0], Kind::DaemonUpgrade, "release 2"),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    s.record_rollout_command(&r.id, ids[0], RolloutCommand::Upgrade, &up.id)
        .await
        .unwrap();
    s.skip_rollout_node(&r.id, ids[1], &super::controller(s).await)
        .await
        .unwrap();
    let got = s.rollout(&r.id).await.unwrap().unwrap();
    assert_eq!(got.nodes.len(), 2);
    assert_eq!(got.nodes[0].status, NodeStatus::Upgrading);
    assert_eq!(got.nodes[0].command_state.as_deref(), Some("pending"));
    assert_eq!(got.nodes[1].status, NodeStatus::Skipped);
    let cert = if *ids[0] == a { 1 } else { 2 };
    s.command_result(
        ids[0],
        &result(ids[0], cert, &up.id, Outcome::Succeeded),
        super::verify,
    )
    .await
    .unwrap();
    let got = s.rollout(&r.id).await.unwrap().unwrap();
    assert_eq!(got.nodes[0].status, NodeStatus::Confirmed);
    assert_eq!(
        got.nodes[0].release_floor, 0,
        "until the key holder judged it"
    );
    assert_eq!(s.judge_upgrade_floor(&up.id, true).await.unwrap(), Some(2));
    let got = s.rollout(&r.id).await.unwrap().unwrap();
    assert_eq!(got.nodes[0].release_floor, 2);
    let (back, _) = s
        .create_command(
            &command(ids[0], Kind::DaemonRollback, ""),
            Box::new(|_| vec![]),
        )
        .await
        .unwrap();
    s.record_rollout_command(&r.id, ids[0], RolloutCommand::Rollback, &back.id)
        .await
        .unwrap();
    assert_eq!(
        s.rollout(&r.id).await.unwrap().unwrap().nodes[0]
            .rollback_id
            .as_deref(),
        Some(back.id.as_str())
    );
    // Waves move only forward from where they are, and only when running.
    assert!(
        s.advance_rollout(&r.id, 0, 1, &super::controller(s).await)
            .await
            .unwrap()
    );
    assert!(
        !s.advance_rollout(&r.id, 0, 1, &super::controller(s).await)
            .await
            .unwrap()
    );
    assert!(
        s.set_rollout_state(
            &r.id,
            &[RolloutState::Running],
            RolloutState::Paused,
            "paused"
        )
        .await
        .unwrap()
    );
    assert!(
        !s.advance_rollout(&r.id, 1, 2, &super::controller(s).await)
            .await
            .unwrap()
    );
    assert!(
        !s.set_rollout_state(&r.id, &[RolloutState::Running], RolloutState::Done, "")
            .await
            .unwrap()
    );
    assert!(
        s.set_rollout_state(
            &r.id,
            &[RolloutState::Running, RolloutState::Paused],
            RolloutState::Aborted,
            "aborted by an operator"
        )
        .await
        .unwrap()
    );
    let got = s.rollout(&r.id).await.unwrap().unwrap();
    assert_eq!(
        (got.state, got.wave, got.reason.as_str()),
        (RolloutState::Aborted, 1, "aborted by an operator")
    );
    assert_eq!(s.list_rollouts().await.unwrap(), vec![got]);
    assert_eq!(s.rollout("ro-nope").await.unwrap(), None);
}

pub async fn a_rollout_needs_a_release_and_no_other_active(f: Fixture) {
    let s = &f.store;
    let err = s.start_rollout(&new(3, "")).await.unwrap_err();
    assert!(err.to_string().contains("no release 3"), "{err}");
    release(&f, 3).await;
    let err = s.start_rollout(&new(3, "")).await.unwrap_err();
    assert!(err.to_string().contains("matches no node"), "{err}");
    let n = joined(s, 1).await;
    let err = s.start_rollout(&new(3, "rack=1")).await.unwrap_err();
    assert!(
        matches!(err, TxError::Refused(Refusal::BadRequest(_))),
        "{err}"
    );
    let first = s
        .start_rollout(&new(3, &format!("node={n}")))
        .await
        .unwrap();
    let err = s.start_rollout(&new(3, "")).await.unwrap_err();
    assert!(err.to_string().contains(&first.id), "{err}");
    assert_eq!(
        s.list_rollouts().await.unwrap().len(),
        1,
        "refusals start nothing"
    );
}
