//! Compiles `proto/*.proto` with prost. The descriptor set comes from
//! `protox` (pure Rust), so no system `protoc` is needed to build.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/xplane.proto", "proto/clockmesh.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new()
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
