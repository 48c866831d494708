//! meshc: the passes, Cranelift code generation, the artifact and the runner. The graph IR
//! itself lives in the `meshc-ir` crate; the `meshc` binary (src/main.rs) is the CLI.

pub mod artifact;
pub mod codegen;
pub mod compile;
pub mod degraded;
pub mod driver;
pub mod exchange;
pub mod fabric;
pub mod layout;
pub mod library;
pub mod mask;
pub mod mesh;
pub mod mesh_interp;
pub mod passes;
pub mod program;
pub mod runner;
pub mod trace;
