//! `boot.kexec image=ID`, end to end with a fakehw node: the node learns
//! the image keys at join, fetches a registered image's kernel and initrd
//! over its own certificate, verifies the signed manifest and both files,
//! and only then kexecs them (the fake machine records what it was asked
//! to load, by SHA-256, instead of replacing the kernel). An image signed
//! by a key the node did not learn, and a kernel altered in the store,
//! each fail the command with what did not verify, and nothing is loaded.

use std::path::{Path, PathBuf};

use bc_tests::{FAST, Node, Server, stderr};
use ring::signature::{Ed25519KeyPair, KeyPair};

fn key(seed: u8) -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
}

fn public_hex(k: &Ed25519KeyPair) -> String {
    let public: &[u8] = k.public_key().as_ref();
    public.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    image::sha256_hex(bytes)
}

const CMDLINE: &str = "console=ttyS0 bcd.server=https://127.0.0.1:7443";

/// An image folder as `images build` writes it, signed by `k`.
fn image_dir(at: &Path, name: &str, k: &Ed25519KeyPair, kernel: &[u8], initrd: &[u8]) -> PathBuf {
    let dir = at.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let manifest = image::Manifest {
        format: image::FORMAT,
        name: name.to_string(),
        kernel_version: "6.1.0-test".into(),
        bcd_version: "bcd test".into(),
        cmdline: CMDLINE.into(),
        kernel: image::Part::of(image::KERNEL_FILE, kernel),
        initrd: image::Part::of(image::INITRD_FILE, initrd),
        modules: vec![],
    };
    std::fs::write(
        dir.join(image::MANIFEST_FILE),
        image::sign(&manifest, k).to_json(),
    )
    .unwrap();
    std::fs::write(dir.join(image::KERNEL_FILE), kernel).unwrap();
    std::fs::write(dir.join(image::INITRD_FILE), initrd).unwrap();
    dir
}

/// `images register DIR`; the image id.
fn register(server: &Server, dir: &Path) -> String {
    let out = server.cli(&["images", "register", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "images register: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["image_id"].as_str().unwrap().to_string()
}

fn kexecs(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn boot_kexec_loads_only_a_verified_image() {
    let d = tempfile::tempdir().unwrap();
    let (learned, stranger) = (key(1), key(2));
    let mut args: Vec<&str> = FAST.to_vec();
    let learned_hex = public_hex(&learned);
    args.extend(["--image-pubkey", &learned_hex]);
    let mut server = Server::start(&d.path().join("server"), &args).expect("server");
    let mut node = Node::new(&d.path().join("node"), 61);
    let out = node.join(&server.url(), &server.token(1));
    assert!(out.status.success(), "join: {}", stderr(&out));
    // The image key travels signed in the join response and is kept with
    // the identity.
    assert_eq!(
        node.identity()["image_keys"],
        serde_json::json!([learned_hex])
    );
    let log = d.path().join("kexec.log");
    node.env.push((
        "BCD_FAKE_KEXEC_LOG".into(),
        log.to_str().unwrap().to_string(),
    ));
    let id = node.id();
    node.start();
    let before = server.wait_node(&id, "connected", |n| n.state == "connected");

    // A verified image: kexec'd with the manifest's command line and the
    // command's addition.
    let kernel = b"MZ fake kernel \x00\x01\x02".repeat(40_000);
    let initrd = b"070701 fake initrd".repeat(20_000);
    let good = register(
        &server,
        &image_dir(d.path(), "gpu-node", &learned, &kernel, &initrd),
    );
    let cmd = server.run_command(
        &id,
        "boot.kexec",
        &[&format!("image={}", &good[..12]), "cmdline=bcd.log=debug"],
    );
    let c = server.wait_command(&cmd);
    assert_eq!(
        (c.state.as_str(), c.reason.as_str()),
        ("succeeded", "rebooted"),
        "{c:?}"
    );
    assert!(c.summary.contains("gpu-node"), "{}", c.summary);
    assert_eq!(
        kexecs(&log),
        [format!(
            "kernel={} initrd={} cmdline={CMDLINE} bcd.log=debug",
            sha256_hex(&kernel),
            sha256_hex(&initrd)
        )]
    );
    let back = server.wait_node(&id, "back on a new boot", |n| {
        n.state == "connected" && n.boot_id != before.boot_id
    });

    // An image signed by a key the server has now but the node did not
    // learn at join: refused before anything is loaded.
    server.proc.stop();
    let stranger_hex = public_hex(&stranger);
    server
        .args
        .extend(["--image-pubkey".to_string(), stranger_hex]);
    server.start_again().expect("the server starts again");
    server.wait_node(&id, "connected again", |n| n.state == "connected");
    let foreign = register(
        &server,
        &image_dir(
            d.path(),
            "foreign",
            &stranger,
            b"another kernel",
            b"another initrd",
        ),
    );
    let c =
        server.wait_command(&server.run_command(&id, "boot.kexec", &[&format!("image={foreign}")]));
    assert_eq!(c.state, "failed", "{c:?}");
    assert!(
        c.reason.contains(&format!(
            "signed by key {}, which is not an image key this node learned at join",
            release::key_id(stranger.public_key().as_ref())
        )) && c.reason.contains("nothing was loaded"),
        "{}",
        c.reason
    );
    assert_eq!(kexecs(&log).len(), 1, "nothing was loaded");

    // The verified image's kernel altered in the store (same size): the
    // node hashes what it fetched and refuses it.
    let db = rusqlite::Connection::open(server.dir.join("store.db")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let mut tampered = kernel.clone();
    tampered[1000] ^= 0x55;
    let changed = db
        .execute(
            "UPDATE image_artifacts SET bytes = ?1 WHERE sha256 = ?2",
            rusqlite::params![tampered, sha256_hex(&kernel)],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let c =
        server.wait_command(&server.run_command(&id, "boot.kexec", &[&format!("image={good}")]));
    assert_eq!(c.state, "failed", "{c:?}");
    assert!(
        c.reason.contains(&format!(
            "the vmlinuz fetched has SHA-256 {}; the signed manifest says {}: nothing was loaded",
            sha256_hex(&tampered),
            sha256_hex(&kernel)
        )),
        "{}",
        c.reason
    );
    assert_eq!(kexecs(&log).len(), 1, "nothing was loaded");
    assert!(
        !node.dir.join("kexec").exists(),
        "what did not verify is not kept"
    );
    let now = server.node(&id).unwrap();
    assert_eq!(now.boot_id, back.boot_id, "the node did not reboot");

    // The API resolves and checks the image when the command is created.
    let out = server.cli(&["commands", "run", &id, "boot.kexec", "--", "image=nope"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no image"), "{}", stderr(&out));
    let out = server.cli(&[
        "commands",
        "run",
        &id,
        "boot.kexec",
        "--",
        &format!("image={good}"),
        "kernel=/boot/vmlinuz",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not both"), "{}", stderr(&out));
}

/// `images register` streams the image in chunks (`UploadImage`); the
/// server verifies the signed manifest before it keeps a byte and holds
/// each part to the size the manifest signs, so a hostile upload is
/// refused with what was wrong and nothing is registered.
#[test]
fn an_image_upload_is_streamed_and_held_to_its_signed_manifest() {
    use bcd_proto::v1::{ImageUpload, image_upload::Part};
    let d = tempfile::tempdir().unwrap();
    let (learned, stranger) = (key(1), key(2));
    let mut args: Vec<&str> = FAST.to_vec();
    let learned_hex = public_hex(&learned);
    args.extend(["--image-pubkey", &learned_hex]);
    let server = Server::start(&d.path().join("server"), &args).expect("server");
    // Several chunks of each part.
    let kernel = b"MZ kernel \x00\x01".repeat(300_000);
    let initrd = b"070701 initrd".repeat(100_000);
    let id = register(
        &server,
        &image_dir(d.path(), "big", &learned, &kernel, &initrd),
    );
    let out = server.cli(&["images", "list", "--json"]);
    let images: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(images[0]["image_id"], id.as_str());
    assert_eq!(images[0]["kernel_size"], kernel.len() as u64);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let manifest_of = |k: &Ed25519KeyPair, name: &str| {
        std::fs::read(image_dir(d.path(), name, k, &kernel, &initrd).join(image::MANIFEST_FILE))
            .unwrap()
    };
    let upload = |parts: Vec<Part>| {
        rt.block_on(async {
            let mut c = better_compute::client::connect(
                &server.dir.join("operator.json"),
                Some(&server.api_url()),
            )
            .await
            .unwrap();
            let parts = parts
                .into_iter()
                .map(|p| ImageUpload { part: Some(p) })
                .collect::<Vec<_>>();
            c.upload_image(tokio_stream::iter(parts))
                .await
                .map(|r| r.into_inner())
        })
    };
    let fresh = manifest_of(&learned, "fresh");
    let refused = |parts: Vec<Part>, why: &str| {
        let e = upload(parts).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
        assert!(e.message().contains(why), "{why}: {e}");
    };
    refused(
        vec![Part::Kernel(kernel.clone())],
        "starts with its signed manifest",
    );
    refused(
        vec![
            Part::SignedManifest(fresh.clone()),
            Part::Kernel(kernel.clone()),
            Part::Kernel(vec![0]),
        ],
        "more kernel bytes than the signed manifest's",
    );
    refused(
        vec![
            Part::SignedManifest(fresh.clone()),
            Part::Initrd(initrd.clone()),
            Part::Kernel(kernel.clone()),
        ],
        "the kernel's bytes come before the initrd's",
    );
    refused(
        vec![
            Part::SignedManifest(fresh.clone()),
            Part::SignedManifest(fresh.clone()),
        ],
        "one manifest, first",
    );
    let mut altered = kernel.clone();
    altered[5] ^= 1;
    refused(
        vec![
            Part::SignedManifest(fresh.clone()),
            Part::Kernel(altered),
            Part::Initrd(initrd.clone()),
        ],
        "vmlinuz's SHA-256 is",
    );
    refused(
        vec![
            Part::SignedManifest(manifest_of(&stranger, "stranger")),
            Part::Kernel(kernel.clone()),
        ],
        "",
    );
    let out = server.cli(&["images", "list", "--json"]);
    let images: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        images.as_array().unwrap().len(),
        1,
        "nothing more: {images}"
    );
    // Whole, in order: registered.
    let info = upload(vec![
        Part::SignedManifest(fresh),
        Part::Kernel(kernel[..1000].to_vec()),
        Part::Kernel(kernel[1000..].to_vec()),
        Part::Initrd(initrd.clone()),
    ])
    .unwrap();
    assert_eq!(info.name, "fresh");
}
