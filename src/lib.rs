//! meshc: the passes, Cranelift code generation, the artifact and the runner. The graph IR
//! itself lives in the `meshc-ir` crate; the `meshc` binary (src/main.rs) is the CLI.

pub mod codegen;
