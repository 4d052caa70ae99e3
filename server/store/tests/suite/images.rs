use std::time::Duration;

use bc_store::ImageId;
use bc_store::Refusal;
use bc_store::images::{BootRecord, NewImage, minted_description};
use bc_store::tokens::{JoinInput, NewToken};

use super::Fixture;

fn image(id: char, name: &str, initrd: &[u8]) -> NewImage {
    NewImage {
        image_id: ImageId::from(id.to_string().repeat(64)),
        name: name.into(),
        key_id: "k".into(),
        kernel_version: "6.1.0-test".into(),
        bcd_version: "bcd 0.1.0".into(),
        cmdline: "console=ttyS0".into(),
        kernel_sha256: "1".repeat(64),
        kernel_size: 6,
        initrd_sha256: format!("{:0>64}", name.len()),
        initrd_size: initrd.len() as u64,
        signed_manifest: format!("{{{id}}}").into_bytes(),
        kernel: b"kernel".to_vec(),
        initrd: initrd.to_vec(),
    }
}

fn boot(mac: &str, image: Option<&str>, outcome: &str) -> BootRecord {
    BootRecord {
        mac: mac.into(),
        image_id: image.map(ImageId::from),
        remote: "127.0.0.1:1".into(),
        outcome: outcome.into(),
    }
}

pub async fn assignments_prefer_the_mac_over_the_default_and_boots_are_kept(f: Fixture) {
    let s = &f.store;
    let (a, b) = (ImageId::from("a".repeat(64)), ImageId::from("b".repeat(64)));
    assert!(
        s.register_image(&image('a', "a", b"initrd-a"))
            .await
            .unwrap()
    );
    assert!(
        !s.register_image(&image('a', "a", b"initrd-a"))
            .await
            .unwrap()
    );
    assert!(
        s.register_image(&image('b', "bb", b"initrd-b"))
            .await
            .unwrap()
    );
    assert_eq!(
        s.image_artifact(&"1".repeat(64)).await.unwrap().unwrap(),
        b"kernel",
        "kept once for both images"
    );
    assert_eq!(s.image_artifact(&"0".repeat(64)).await.unwrap(), None);

    let mac = "52:54:00:12:34:56";
    assert!(s.image_for_mac(mac).await.unwrap().is_none());
    s.assign_image("default", Some(&a), "", None).await.unwrap();
    assert_eq!(s.image_for_mac(mac).await.unwrap().unwrap().image_id, a);
    s.assign_image(&format!("mac:{mac}"), Some(&b), "bcd.state=x", None)
        .await
        .unwrap();
    let got = s.image_for_mac(mac).await.unwrap().unwrap();
    assert_eq!(
        (got.image_id, got.append),
        (b.clone(), "bcd.state=x".to_string())
    );
    assert_eq!(got.signed_manifest, b"{b}");
    assert_eq!(
        s.image_for_mac("52:54:00:00:00:01")
            .await
            .unwrap()
            .unwrap()
            .image_id,
        a
    );
    s.assign_image(&format!("mac:{mac}"), None, "", None)
        .await
        .unwrap();
    assert_eq!(s.image_for_mac(mac).await.unwrap().unwrap().image_id, a);

    let listed = s.list_images().await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].assigned_to, vec!["default".to_string()]);
    assert_eq!(listed[1].initrd_size, 8);

    s.record_boot(&boot(mac, Some(&a), "script")).await.unwrap();
    s.record_boot(&boot(mac, None, "no image")).await.unwrap();
    let boots = s.boots(Some(mac), 10).await.unwrap();
    assert_eq!(boots.len(), 2);
    assert_eq!(
        (boots[0].outcome.as_str(), boots[0].image_id.as_str()),
        ("no image", "")
    );
    assert_eq!(boots[1].image_id, a);
    assert_eq!(s.boots(None, 1).await.unwrap().len(), 1);
    assert!(
        s.boots(Some("52:54:00:00:00:09"), 10)
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn images_resolve_by_id_name_or_prefix(f: Fixture) {
    let s = &f.store;
    s.register_image(&image('a', "a", b"x")).await.unwrap();
    s.register_image(&image('b', "b", b"y")).await.unwrap();
    assert_eq!(s.resolve_image("b").await.unwrap(), "b".repeat(64));
    assert_eq!(s.resolve_image("bbbbbbbb").await.unwrap(), "b".repeat(64));
    assert_eq!(
        s.resolve_image(&"a".repeat(64)).await.unwrap(),
        "a".repeat(64)
    );
    assert_eq!(
        s.image_manifests().await.unwrap(),
        [
            ("a".repeat(64), b"{a}".to_vec()),
            ("b".repeat(64), b"{b}".to_vec())
        ],
        "each image's signed manifest, by id"
    );
    // One image by its whole id, as listed, with its manifest; a prefix or
    // a name is not an id.
    let listed = s.list_images().await.unwrap();
    let (row, manifest) = s
        .image(&ImageId::from("b".repeat(64)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        Some(&row),
        listed.iter().find(|i| i.image_id == "b".repeat(64))
    );
    assert_eq!(manifest, b"{b}");
    for not_an_id in ["bbbbbbbb", "b", &"c".repeat(64)] {
        assert_eq!(
            s.image(&ImageId::from(not_an_id)).await.unwrap(),
            None,
            "{not_an_id}"
        );
    }
    for missing in ["cccccccc", "nope", &"c".repeat(64)] {
        let err = s.resolve_image(missing).await.unwrap_err();
        assert!(
            matches!(err.refusal(), Some(Refusal::NotFound(_))),
            "{missing}: {err:?}"
        );
    }
}

pub async fn an_artifact_reads_in_chunks(f: Fixture) {
    let s = &f.store;
    let initrd: Vec<u8> = (0..300_001u32).map(|i| (i % 251) as u8).collect();
    let img = image('c', "chunked", &initrd);
    let sha = img.initrd_sha256.clone();
    assert!(s.register_image(&img).await.unwrap());
    assert_eq!(s.image_artifact_size(&sha).await.unwrap(), Some(300_001));
    let mut read = Vec::new();
    while (read.len() as u64) < 300_001 {
        let chunk = s
            .image_artifact_chunk(&sha, read.len() as u64, 65_536)
            .await
            .unwrap()
            .unwrap();
        assert!(!chunk.is_empty() && chunk.len() <= 65_536);
        read.extend(chunk);
    }
    assert_eq!(read, initrd);
    assert_eq!(
        s.image_artifact_chunk(&sha, 300_001, 10).await.unwrap(),
        Some(vec![]),
        "past the end: empty"
    );
    assert_eq!(
        s.image_artifact_chunk(&sha, 5, 3).await.unwrap(),
        Some(initrd[5..8].to_vec())
    );
    let missing = "f".repeat(64);
    assert_eq!(s.image_artifact_size(&missing).await.unwrap(), None);
    assert_eq!(s.image_artifact_chunk(&missing, 0, 1).await.unwrap(), None);
}

pub async fn a_mac_boots_its_nodes_then_its_pools_assignment_and_minted_tokens_are_bounded(
    f: Fixture,
) {
    let s = &f.store;
    let (a, b, c) = (
        ImageId::from("a".repeat(64)),
        ImageId::from("b".repeat(64)),
        ImageId::from("c".repeat(64)),
    );
    for (id, name) in [('a', "a"), ('b', "bb"), ('c', "ccc")] {
        s.register_image(&image(id, name, name.as_bytes()))
            .await
            .unwrap();
    }
    let (mac, other_mac) = ("52:54:00:00:00:01", "52:54:00:00:00:02");
    // A node joins with a token of pool gpu and reports two MAC addresses.
    s.create_token(&NewToken {
        pool: Some("gpu".into()),
        ..super::token("pooled", Duration::from_secs(600), 1)
    })
    .await
    .unwrap();
    let node = s
        .join(
            &JoinInput {
                macs: vec![mac.into(), other_mac.into()],
                ..super::join_input("pooled", "h")
            },
            Box::new(|_, _| Ok(super::fake_cert(1))),
        )
        .await
        .unwrap()
        .node_id;
    let listed = s.list_nodes().await.unwrap();
    let row = listed.nodes.iter().find(|n| n.node_id == node).unwrap();
    assert_eq!(row.pool.as_deref(), Some("gpu"));
    assert_eq!(row.macs, [mac, other_mac]);

    let boots = |m: &'static str| async move {
        s.image_for_mac(m)
            .await
            .unwrap()
            .map(|x| (x.target, x.image_id))
    };
    s.assign_image("default", Some(&a), "", None).await.unwrap();
    assert_eq!(boots(mac).await, Some(("default".into(), a.clone())));
    s.assign_image("pool:gpu", Some(&b), "", Some(900_000))
        .await
        .unwrap();
    assert_eq!(boots(mac).await, Some(("pool:gpu".into(), b.clone())));
    assert_eq!(
        s.image_for_mac(mac).await.unwrap().unwrap().mint_ttl_ms,
        Some(900_000)
    );
    assert_eq!(
        boots("52:54:00:00:00:09").await,
        Some(("default".into(), a.clone())),
        "a MAC no node reported boots the default"
    );
    s.assign_image(&format!("node:{node}"), Some(&c), "", None)
        .await
        .unwrap();
    assert_eq!(boots(mac).await, Some((format!("node:{node}"), c.clone())));
    assert_eq!(
        boots(other_mac).await,
        Some((format!("node:{node}"), c.clone()))
    );
    s.assign_image(&format!("mac:{mac}"), Some(&a), "", None)
        .await
        .unwrap();
    assert_eq!(boots(mac).await, Some((format!("mac:{mac}"), a.clone())));
    let listed = s.list_images().await.unwrap();
    assert_eq!(
        listed[0].assigned_to,
        ["default".to_string(), format!("mac:{mac}")]
    );
    assert_eq!(listed[1].assigned_to, ["pool:gpu"]);
    assert_eq!(listed[2].assigned_to, [format!("node:{node}")]);

    // A MAC reported again by another node names that node now.
    s.create_token(&super::token("plain", Duration::from_secs(600), 1))
        .await
        .unwrap();
    let second = s
        .join(
            &JoinInput {
                macs: vec![other_mac.into()],
                ..super::join_input("plain", "h")
            },
            Box::new(|_, _| Ok(super::fake_cert(2))),
        )
        .await
        .unwrap()
        .node_id;
    assert_eq!(boots(other_mac).await, Some(("default".into(), a.clone())));
    let listed = s.list_nodes().await.unwrap();
    let rows = |id: &str| {
        listed
            .nodes
            .iter()
            .find(|n| n.node_id == id)
            .unwrap()
            .clone()
    };
    assert_eq!(rows(&node).macs, [mac]);
    assert_eq!(
        (rows(&second).macs, rows(&second).pool),
        (vec![other_mac.to_string()], None)
    );

    // Minting: only for an allowed MAC, one unspent token per MAC.
    let minted = |id: &str| NewToken {
        description: minted_description("52:54:00:00:00:07"),
        pool: Some("gpu".into()),
        ..super::token(id, Duration::from_secs(60), 1)
    };
    let booting = "52:54:00:00:00:07";
    assert_eq!(
        s.mint_boot_token(booting, &minted("m0")).await.unwrap(),
        None
    );
    let refused = s
        .join(
            &super::join_input("m0", "h"),
            Box::new(|_, _| Ok(super::fake_cert(3))),
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.refusal(),
        Some(&Refusal::UnknownToken),
        "nothing minted"
    );
    s.allow_boot_mac(booting, None).await.unwrap();
    // A MAC no node reported boots the pool its allow-list entry names.
    let fresh = "52:54:00:00:00:08";
    s.allow_boot_mac(fresh, Some("gpu")).await.unwrap();
    assert_eq!(boots(fresh).await, Some(("pool:gpu".into(), b.clone())));
    assert!(s.disallow_boot_mac(fresh).await.unwrap());
    assert_eq!(boots(fresh).await, Some(("default".into(), a.clone())));
    let first = s
        .mint_boot_token(booting, &minted("m1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.pool.as_deref(), first.replaced), (Some("gpu"), 0));
    assert_eq!(first.expires_at_ms, s.now().await.unwrap() + 60_000);
    let again = s
        .mint_boot_token(booting, &minted("m2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.replaced, 1, "the unspent one is replaced, not kept");
    let refused = s
        .join(
            &super::join_input("m1", "h"),
            Box::new(|_, _| Ok(super::fake_cert(4))),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.refusal(), Some(&Refusal::UnknownToken));
    let minted_node = s
        .join(
            &JoinInput {
                macs: vec![booting.into()],
                ..super::join_input("m2", "h")
            },
            Box::new(|_, _| Ok(super::fake_cert(5))),
        )
        .await
        .unwrap()
        .node_id;
    let refused = s
        .join(
            &super::join_input("m2", "h"),
            Box::new(|_, _| Ok(super::fake_cert(6))),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.refusal(), Some(&Refusal::UsedToken), "one use");
    let listed = s.list_nodes().await.unwrap();
    let row = listed
        .nodes
        .iter()
        .find(|n| n.node_id == minted_node)
        .unwrap();
    assert_eq!(row.pool.as_deref(), Some("gpu"));
    assert_eq!(
        boots(booting).await,
        Some(("pool:gpu".into(), b.clone())),
        "the minted node boots its pool's image"
    );
    // A spent token is not replaced; the allow-list's pool wins; the next
    // one expires.
    s.allow_boot_mac(booting, Some("rack-2")).await.unwrap();
    let third = s
        .mint_boot_token(booting, &minted("m3"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((third.pool.as_deref(), third.replaced), (Some("rack-2"), 0));
    f.advance(Duration::from_secs(61));
    let refused = s
        .join(
            &super::join_input("m3", "h"),
            Box::new(|_, _| Ok(super::fake_cert(7))),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.refusal(), Some(&Refusal::ExpiredToken));

    let allowed = s.boot_macs().await.unwrap();
    assert_eq!(allowed.len(), 1);
    assert_eq!(
        (allowed[0].mac.as_str(), allowed[0].pool.as_deref()),
        (booting, Some("rack-2"))
    );
    assert!(s.disallow_boot_mac(booting).await.unwrap());
    assert!(!s.disallow_boot_mac(booting).await.unwrap());
    assert!(s.boot_macs().await.unwrap().is_empty());
    assert_eq!(
        s.mint_boot_token(booting, &minted("m4")).await.unwrap(),
        None
    );
}
