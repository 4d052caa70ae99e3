use bc_store::Refusal;
use bc_store::images::{BootRecord, NewImage};

use super::Fixture;

fn image(id: char, name: &str, initrd: &[u8]) -> NewImage {
    NewImage {
        image_id: id.to_string().repeat(64),
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
        image_id: image.map(str::to_string),
        remote: "127.0.0.1:1".into(),
        outcome: outcome.into(),
    }
}

pub async fn assignments_prefer_the_mac_over_the_default_and_boots_are_kept(f: Fixture) {
    let s = &f.store;
    let (a, b) = ("a".repeat(64), "b".repeat(64));
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
    s.assign_image("default", Some(&a), "").await.unwrap();
    assert_eq!(s.image_for_mac(mac).await.unwrap().unwrap().image_id, a);
    s.assign_image(&format!("mac:{mac}"), Some(&b), "bcd.state=x")
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
    s.assign_image(&format!("mac:{mac}"), None, "")
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
