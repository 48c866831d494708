//! Regenerates onnx/src/onnx.rs (included by proto.rs), the prost types of onnx/src/onnx.proto, with a pure-Rust
//! protobuf compiler (protox), so no system `protoc` is needed. Run from the repository
//! root: `cargo run --manifest-path tools/onnx-protogen/Cargo.toml` (`make onnx-proto`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["onnx.proto"], ["onnx/src"])?;
    let out = tempdir()?;
    prost_build::Config::new().out_dir(&out).compile_fds(fds)?;
    let code = std::fs::read_to_string(out.join("onnx.rs"))?;
    // A plain comment: the file is `include!`d by onnx/src/proto.rs, where `//!` cannot stand.
    let header = "// The messages of onnx.proto as prost types, included by proto.rs. Generated: do not edit;\n\
                  // `make onnx-proto` regenerates it from onnx.proto.\n";
    std::fs::write("onnx/src/onnx.rs", format!("{header}{code}"))?;
    std::fs::remove_dir_all(&out)?;
    Ok(())
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("onnx-protogen-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
