//! meshc: the compiler — the layout spec, the passes, Cranelift code generation and the
//! compile pipeline. The graph IR lives in `meshc-ir`; the artifact format and everything
//! that runs an artifact live in `meshc-runtime`, which knows nothing of this crate; the ONNX
//! frontend is `meshc-onnx`. The `meshc` binary (src/main.rs) is the CLI.

pub mod artifact;
pub mod attribution;
pub mod codegen;
pub mod command;
pub mod compile;
pub mod degrade;
pub mod dot;
pub mod driver;
pub mod explain;
pub mod layout;
pub mod mesh_interp;
pub mod passes;
pub mod pipeline;
pub mod sizes;
pub mod train;
