//! Generates the wire types from `proto/bcd.proto` with the pure-Rust protox
//! compiler, so building needs no system `protoc`.
//!
//! With the `serde` feature the types also derive `serde::Serialize`; the
//! descriptor set decides how each field renders (see `src/json.rs`), so a
//! new `bytes`, `map` or enum field gets the same treatment without a
//! change here.

use protox::prost_reflect::prost_types::DescriptorProto;
use protox::prost_reflect::prost_types::field_descriptor_proto::{Label, Type};
use tonic_prost_build::Builder;

/// `bytes` fields rendered as text: what people read.
const TEXT: &[&str] = &[".bcd.v1.CommandInfo.output"];

/// Rendered as the operator spells it on the command line: `default`,
/// `mac:52:54:00:12:34:56`.
const IMAGE_TARGET: &str = ".bcd.v1.ImageTarget";

fn serde_attr(with: &str) -> String {
    format!("#[cfg_attr(feature = \"serde\", serde(serialize_with = \"{with}\"))]")
}

/// `.bcd.v1.CommandKind` -> `crate::v1::CommandKind` (every enum of the
/// protocol is declared at the top level of its file).
fn rust_type(type_name: &str) -> String {
    let name = type_name.rsplit('.').next().unwrap_or(type_name);
    format!("crate::v1::{name}")
}

fn json_fields(mut config: Builder, scope: &str, m: &DescriptorProto) -> Builder {
    let path = format!("{scope}.{}", m.name());
    let is_map = |type_name: &str| {
        m.nested_type.iter().any(|n| {
            n.options.as_ref().is_some_and(|o| o.map_entry())
                && type_name == format!("{path}.{}", n.name())
        })
    };
    for f in &m.field {
        let field = format!("{path}.{}", f.name());
        let with = match (f.r#type(), f.label()) {
            (Type::Bytes, Label::Repeated) => Some("crate::json::hex_list".to_string()),
            (Type::Bytes, _) if TEXT.contains(&field.as_str()) => {
                Some("crate::json::text".to_string())
            }
            (Type::Bytes, _) => Some("crate::json::hex".to_string()),
            (Type::Message, Label::Repeated) if is_map(f.type_name()) => {
                Some("crate::json::sorted_map".to_string())
            }
            (Type::Enum, Label::Repeated) => Some(format!(
                "crate::json::enumeration_list::<{}, _>",
                rust_type(f.type_name())
            )),
            (Type::Enum, _) => Some(format!(
                "crate::json::enumeration::<{}, _>",
                rust_type(f.type_name())
            )),
            (Type::Message, Label::Repeated) if f.type_name() == IMAGE_TARGET => {
                Some("crate::json::image_targets".to_string())
            }
            (Type::Message, _) if f.type_name() == IMAGE_TARGET => {
                Some("crate::json::image_target".to_string())
            }
            _ => None,
        };
        if let Some(with) = with {
            config = config.field_attribute(&field, serde_attr(&with));
        }
    }
    for nested in &m.nested_type {
        if !nested.options.as_ref().is_some_and(|o| o.map_entry()) {
            config = json_fields(config, &path, nested);
        }
    }
    config
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/bcd.proto");
    let fds = protox::compile(["bcd.proto"], ["proto"])?;
    let mut config = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Signed labels encode in key order: the same intent, the same bytes.
        .btree_map(".bcd.v1.NodeIntent.labels")
        .type_attribute(
            ".bcd",
            "#[cfg_attr(feature = \"serde\", derive(::serde::Serialize))]",
        );
    for file in &fds.file {
        let scope = format!(".{}", file.package());
        for m in &file.message_type {
            config = json_fields(config, &scope, m);
        }
    }
    config.compile_fds(fds)?;
    Ok(())
}
