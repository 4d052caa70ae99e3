//! How the wire types render as JSON (the `serde` feature): the operator
//! CLI's `--json` output is the messages themselves. Bytes are hex (keys,
//! signatures and hashes are hex everywhere in this project), a command's
//! output is text (lossy UTF-8: what a person reads), maps are sorted so
//! the output is stable, enums are their spelling (`crate::typed`: the one
//! the CLI prints and the store keeps, a number only for a value this side
//! does not know), image targets are `default` or `mac:...`. `build.rs`
//! attaches these to the fields.

use std::collections::BTreeMap;

use serde::Serializer;

use crate::typed::Spelling;
use crate::v1;

pub fn enumeration<E, S>(v: &i32, s: S) -> Result<S::Ok, S::Error>
where
    E: Spelling + TryFrom<i32>,
    S: Serializer,
{
    match E::try_from(*v) {
        Ok(e) => s.serialize_str(e.spelling()),
        Err(_) => s.serialize_i32(*v),
    }
}

pub fn enumeration_list<E, S>(v: &[i32], s: S) -> Result<S::Ok, S::Error>
where
    E: Spelling + TryFrom<i32>,
    S: Serializer,
{
    s.collect_seq(v.iter().map(|v| match E::try_from(*v) {
        Ok(e) => e.spelling().to_string(),
        Err(_) => v.to_string(),
    }))
}

pub fn image_target<S: Serializer>(t: &Option<v1::ImageTarget>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&crate::typed::image_target(t)),
        None => s.serialize_none(),
    }
}

pub fn image_targets<S: Serializer>(v: &[v1::ImageTarget], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(crate::typed::image_target))
}

pub fn hex<S: Serializer>(b: &impl AsRef<[u8]>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&::hex::encode(b))
}

pub fn hex_list<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(::hex::encode))
}

pub fn text<S: Serializer>(b: &impl AsRef<[u8]>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(b.as_ref()))
}

/// A map in key order, whether prost made it a `HashMap` or a `BTreeMap`.
pub fn sorted_map<'a, M, S: Serializer>(m: &'a M, s: S) -> Result<S::Ok, S::Error>
where
    &'a M: IntoIterator<Item = (&'a String, &'a String)>,
{
    s.collect_map(m.into_iter().collect::<BTreeMap<_, _>>())
}

#[cfg(test)]
mod tests {
    use crate::v1;

    #[test]
    fn messages_render_with_text_output_hex_bytes_and_sorted_maps() {
        let info = v1::CommandInfo {
            command_id: "cmd-1".into(),
            output: b"hi\n".to_vec(),
            exit_code: 3,
            has_exit_code: true,
            ..Default::default()
        };
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(v["output"], "hi\n");
        assert_eq!(
            (v["exit_code"].as_i64(), v["has_exit_code"].as_bool()),
            (Some(3), Some(true))
        );
        let dispatch = v1::CommandDispatch {
            signed: vec![0xab, 0x01],
            ..Default::default()
        };
        assert_eq!(serde_json::to_value(&dispatch).unwrap()["signed"], "ab01");
        let join = v1::JoinResponse {
            worker_keys: vec![vec![1], vec![2]],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&join).unwrap()["worker_keys"],
            serde_json::json!(["01", "02"])
        );
        let a = v1::GpuAssignment {
            allocation_id: "a".into(),
            gpus: vec![],
            env: [("B", "2"), ("A", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            secrets: vec![],
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"allocation_id":"a","gpus":[],"env":{"A":"1","B":"2"},"secrets":[]}"#
        );
        let c = v1::CommandInfo {
            kind: v1::CommandKind::GpuReset as i32,
            state: v1::CommandState::Succeeded as i32,
            ..Default::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            (v["kind"].as_str(), v["state"].as_str()),
            (Some("gpu.reset"), Some("succeeded"))
        );
        let unknown = v1::CommandInfo {
            state: 77,
            ..Default::default()
        };
        assert_eq!(serde_json::to_value(&unknown).unwrap()["state"], 77);
        let image = v1::ImageInfo {
            assigned_to: vec![
                v1::ImageTarget {
                    target: Some(v1::image_target::Target::Default(v1::DefaultTarget {})),
                },
                v1::ImageTarget {
                    target: Some(v1::image_target::Target::Mac("52:54:00:12:34:56".into())),
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&image).unwrap()["assigned_to"],
            serde_json::json!(["default", "mac:52:54:00:12:34:56"])
        );
        let m = v1::NodeMessage {
            msg: Some(v1::node_message::Msg::Heartbeat(v1::Heartbeat { seq: 7 })),
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!({"msg": {"Heartbeat": {"seq": 7}}})
        );
    }
}
