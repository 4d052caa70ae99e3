//! Desired state end to end: an operator assigns GPUs, the node writes the
//! CDI spec and env files, keeps enforcing them without the server, and
//! reports what it applied.

use bc_store::NodeId;
use std::time::Duration;

use bc_tests::{FAST, Node, Server, section, stderr, wait_for};
use prost::Message;

#[test]
fn assigned_gpus_become_a_cdi_spec_that_survives_a_partition() {
    let d = tempfile::tempdir().unwrap();
    let mut server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 41);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");

    let out = server.cli(&[
        "nodes", "assign", &id, "job-a", "--gpus", "0,1", "--env", "JOB=a",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cdi_file = node.dir.join("cdi/bcd-nvidia-gpu.json");
    let env_file = node.dir.join("run/env/job-a.env");
    let spec = wait_for(Duration::from_secs(20), "the CDI spec on the node", || {
        std::fs::read(&cdi_file)
            .ok()
            .and_then(|b| cdi::Spec::parse(&b).ok())
    });
    assert_eq!(spec.kind, "nvidia.com/gpu");
    assert_eq!(
        spec.devices.len(),
        5,
        "GPUs 0 and 1 by index and UUID, and all"
    );
    // The env file is written in the same pass, just after the CDI spec.
    let env = wait_for(Duration::from_secs(20), "the env file", || {
        std::fs::read_to_string(&env_file).ok()
    });
    assert!(
        env.contains("NVIDIA_VISIBLE_DEVICES=GPU-") && env.contains("JOB=a"),
        "{env}"
    );
    let v = wait_for(
        Duration::from_secs(20),
        "the node to report generation 1",
        || {
            let v = server.spec(&id);
            (v["applied_generation"] == 1).then_some(v)
        },
    );
    assert_eq!(v["desired_generation"], 1);
    assert_eq!(section(&v, "devices")["status"], "READY");

    // A GPU bound to one allocation cannot be bound to another.
    let out = server.cli(&["nodes", "assign", &id, "job-b", "--gpus", "1"]);
    assert!(
        stderr(&out).contains("already assigned to allocation job-a"),
        "{}",
        stderr(&out)
    );

    // Partitioned: the server is gone. The node keeps the spec and repairs
    // drift from its journal, even across its own restart.
    server.proc.kill();
    std::fs::remove_file(&cdi_file).unwrap();
    wait_for(
        Duration::from_secs(20),
        "the CDI spec rewritten offline",
        || cdi_file.exists().then_some(()),
    );
    node.proc().stop();
    std::fs::remove_file(&cdi_file).unwrap();
    std::fs::write(&env_file, "NVIDIA_VISIBLE_DEVICES=all\n").unwrap();
    node.start();
    wait_for(
        Duration::from_secs(20),
        "the spec enforced after a restart, offline",
        || {
            (cdi_file.exists()
                && std::fs::read_to_string(&env_file)
                    .unwrap()
                    .contains("JOB=a"))
            .then_some(())
        },
    );

    // Back: the node reports what it applied.
    server.crash_restart().unwrap();
    server.wait_node(&id, "reconnected", |n| n.state == "connected");
    let v = wait_for(Duration::from_secs(20), "a fresh report", || {
        let v = server.spec(&id);
        // reported_age_ms is -1 until the node reports.
        let age = v["reported_age_ms"].as_i64().unwrap_or(-1);
        (v["applied_generation"] == 1 && (0..5_000).contains(&age)).then_some(v)
    });
    assert_eq!(v["assignments"][0]["gpus"], serde_json::json!(["0", "1"]));

    // A GPU the node does not have: FAILED with the reason, the last good
    // state stays.
    let good = std::fs::read(&cdi_file).unwrap();
    let out = server.cli(&["nodes", "assign", &id, "job-c", "--gpus", "GPU-not-here"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = wait_for(Duration::from_secs(20), "the failure reported", || {
        let v = server.spec(&id);
        (section(&v, "devices")["status"] == "FAILED").then_some(v)
    });
    assert_eq!(
        section(&v, "devices")["message"],
        "allocation job-c: GPU GPU-not-here is not on this node"
    );
    assert_eq!(v["applied_generation"], 1);
    assert_eq!(v["desired_generation"], 2);
    assert_eq!(std::fs::read(&cdi_file).unwrap(), good);

    // Unassigning both returns to READY with no GPU files.
    server.cli(&["nodes", "unassign", &id, "job-c"]);
    server.cli(&["nodes", "unassign", &id, "job-a"]);
    wait_for(Duration::from_secs(20), "the files removed", || {
        (!cdi_file.exists() && !env_file.exists()).then_some(())
    });
    wait_for(Duration::from_secs(20), "generation 4 applied", || {
        (server.spec(&id)["applied_generation"] == 4).then_some(())
    });
}

#[test]
fn a_spec_not_signed_by_a_worker_key_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let server = Server::start(&d.path().join("server"), FAST).unwrap();
    let mut node = Node::new(&d.path().join("n"), 42);
    assert!(node.join(&server.url(), &server.token(1)).status.success());
    let id = node.id();
    node.start();
    server.wait_node(&id, "connected", |n| n.state == "connected");
    server.assign_and_wait(&id, "job-a", "0", 1);
    let store = server.store();
    // What the store's caller says the stored spec holds: these writes
    // come from outside the key holder, which checks nothing of theirs.
    let stored = |generation| -> bc_store::specs::OpenSpec {
        Box::new(move |_| {
            Ok(bc_store::specs::OpenedSpec {
                generation,
                body: Default::default(),
            })
        })
    };

    // A genuine but older spec, replayed under a higher stored generation:
    // the node keeps the newer one it has.
    server.assign_and_wait(&id, "job-b", "1", 2);
    assert!(node.dir.join("run/env/job-b.env").exists());
    let (_, old) = store
        .block(store.store.signed_spec(&NodeId::from(&id)))
        .unwrap()
        .expect("a signed spec");
    assert!(
        server
            .cli(&["nodes", "unassign", &id, "job-b"])
            .status
            .success()
    );
    wait_for(Duration::from_secs(20), "generation 3 applied", || {
        (server.spec(&id)["applied_generation"] == 3).then_some(())
    });
    // The genuine generation-2 bytes, stored again as generation 4.
    let (generation, _) = store
        .block(store.store.update_spec(
            &NodeId::from(&id),
            Box::new(|_| Ok(())),
            stored(3),
            Box::new(move |_, _| old),
        ))
        .unwrap();
    assert_eq!(generation, 4);
    wait_for(
        Duration::from_secs(20),
        "the node to refuse the older spec",
        || {
            node.proc()
                .log()
                .contains("generation 2 is older than 3")
                .then_some(())
        },
    );
    assert!(
        !node.dir.join("run/env/job-b.env").exists(),
        "generation 2 was not re-applied"
    );

    // A forged generation 5, signed by a foreign key, giving the node
    // every GPU: stored through the method that stores every spec.
    let foreign = bc_tests::foreign_worker_key();
    let node_id = id.clone();
    let (generation, _) = store
        .block(store.store.update_spec(
            &NodeId::from(&id),
            Box::new(|_| Ok(())),
            stored(4),
            Box::new(move |seal, _| {
                let forged = bcd_proto::v1::NodeSpec {
                    node_id,
                    generation: seal.generation,
                    issued_at_ms: seal.issued_at_ms,
                    not_after_ms: seal.not_after_ms,
                    devices: Some(bcd_proto::v1::DevicesSpec {
                        assignments: vec![bcd_proto::v1::GpuAssignment {
                            allocation_id: "evil".into(),
                            gpus: (0..8).map(|i| i.to_string()).collect(),
                            env: Default::default(),
                            secrets: vec![],
                        }],
                    }),
                    access: None,
                    ticket_jwks: String::new(),
                    intent: None,
                };
                bcd_proto::sign::seal(&foreign, forged.encode_to_vec())
            }),
        ))
        .unwrap();
    assert_eq!(generation, 5);
    wait_for(
        Duration::from_secs(20),
        "the node to refuse the forged spec",
        || {
            node.proc()
                .log()
                .contains("not signed by a worker key")
                .then_some(())
        },
    );
    assert!(!node.dir.join("run/env/evil.env").exists());
    assert_eq!(server.spec(&id)["applied_generation"], 3);

    // The key holder builds nothing on it either: the operator's next
    // change is refused, saying why and what to do, and the forgery is
    // among the node's events.
    let out = server.cli(&["nodes", "assign", &id, "job-c", "--gpus", "1"]);
    assert!(!out.status.success(), "a change built on a forged spec");
    let text = stderr(&out);
    assert!(text.contains("not one a worker key signed"), "{text}");
    assert!(text.contains("backup restore"), "{text}");
    let events = server.spec(&id)["events"].to_string();
    assert!(events.contains("security.spec.forged"), "{events}");
    assert!(!node.dir.join("run/env/job-c.env").exists());
}
