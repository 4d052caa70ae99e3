//! Generates the helper's wire types from `proto/helper.proto` with the
//! pure-Rust protox compiler, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/helper.proto");
    let fds = protox::compile(["helper.proto"], ["proto"])?;
    prost_build::Config::new()
        // Maps in a fixed order: an env file renders the same bytes every
        // time.
        .btree_map(["."])
        .compile_fds(fds)?;
    Ok(())
}
