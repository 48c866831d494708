//! Regenerates src/onnx/proto.rs, the prost types of src/onnx/onnx.proto, with a pure-Rust
//! protobuf compiler (protox), so no system `protoc` is needed. Run from the repository
//! root: `cargo run --manifest-path tools/onnx-protogen/Cargo.toml` (`make onnx-proto`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fds = protox::compile(["onnx.proto"], ["src/onnx"])?;
    let out = tempdir()?;
    prost_build::Config::new().out_dir(&out).compile_fds(fds)?;
    let code = std::fs::read_to_string(out.join("onnx.rs"))?;
    let header = "//! The messages of onnx.proto (the ONNX file format) as prost types. Generated: do not\n\
                  //! edit; `make onnx-proto` regenerates it from src/onnx/onnx.proto.\n\n";
    std::fs::write("src/onnx/proto.rs", format!("{header}{code}"))?;
    std::fs::remove_dir_all(&out)?;
    Ok(())
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("onnx-protogen-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
