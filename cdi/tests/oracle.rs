//! The upstream CDI JSON schema and its examples, vendored in `tests/oracle`
//! (see its README for where they come from and their licence), as the
//! external judge of what we write and parse.

use std::path::PathBuf;

fn oracle_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oracle");
    assert!(
        dir.join("schema.json").exists(),
        "the CDI oracle is missing at {}: it is part of the repository (git checkout it)",
        dir.display()
    );
    dir.canonicalize().unwrap()
}

fn validator() -> jsonschema::Validator {
    let dir = oracle_dir();
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("schema.json")).unwrap()).unwrap();
    jsonschema::options()
        .with_base_uri(format!("file://{}/schema.json", dir.display()))
        .build(&schema)
        .expect("the upstream schema compiles")
}

fn assert_valid(v: &jsonschema::Validator, bytes: &[u8], what: &str) {
    let instance: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    let errors: Vec<String> = v.iter_errors(&instance).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what} fails the CDI schema: {errors:?}");
}

#[test]
fn the_schema_reaches_into_its_definitions() {
    // A device node without a path breaks a rule that lives in defs.json:
    // the validator must have resolved the reference to see it.
    let v = validator();
    let broken = serde_json::json!({
        "cdiVersion": "0.3.0", "kind": "vendor.com/device",
        "devices": [{"name": "d", "containerEdits": {"deviceNodes": [{"major": 1}]}}]
    });
    assert!(!v.is_valid(&broken));
    assert!(cdi::Spec::parse(broken.to_string().as_bytes()).is_err());
}

#[test]
fn specs_we_generate_pass_the_upstream_schema() {
    let v = validator();
    let golden =
        std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/h200x2.json"))
            .unwrap();
    assert_valid(&v, &golden, "the H200 golden spec");
    // Every shape the generator makes: 0 to 8 GPUs, with and without UUIDs,
    // control nodes and driver files.
    for n in 1..=8u32 {
        let inv = cdi::nvidia::Inventory {
            gpus: (0..n)
                .map(|i| cdi::nvidia::Gpu {
                    index: i,
                    uuid: (i % 2 == 0).then(|| format!("GPU-{i:08x}-0000-0000-0000-000000000000")),
                    node: cdi::nvidia::Node {
                        path: format!("/dev/nvidia{i}"),
                        major: 195,
                        minor: i,
                    },
                })
                .collect(),
            control_nodes: vec![cdi::nvidia::Node {
                path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
            }],
            driver_files: if n % 2 == 0 {
                vec!["/usr/bin/nvidia-smi".into()]
            } else {
                vec![]
            },
        };
        let spec = cdi::nvidia::spec(&inv);
        spec.validate().unwrap();
        assert_valid(&v, &spec.to_json(), &format!("the spec for {n} GPUs"));
    }
}

#[test]
fn the_upstream_good_examples_parse_and_the_bad_ones_do_not() {
    let dir = oracle_dir();
    let v = validator();
    let mut good = 0;
    for e in std::fs::read_dir(dir.join("testdata/good")).unwrap() {
        let path = e.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert_valid(&v, &bytes, &path.display().to_string());
        let spec = cdi::Spec::parse(&bytes)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        // What we parse we write back as something the schema accepts.
        assert_valid(&v, &spec.to_json(), "a re-serialized good example");
        good += 1;
    }
    assert!(good >= 2);
    let mut bad = 0;
    for e in std::fs::read_dir(dir.join("testdata/bad")).unwrap() {
        let path = e.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            cdi::Spec::parse(&bytes).is_err(),
            "{} parsed",
            path.display()
        );
        if let Ok(instance) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            assert!(
                !v.is_valid(&instance),
                "the schema accepts {}",
                path.display()
            );
        }
        bad += 1;
    }
    assert!(bad >= 2);
}
