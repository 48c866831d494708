//! The library kernels the runner calls instead of generated code, and what they share with
//! the compiler's code generation: the library GEMM (`library`, `small_m`, `panels` for
//! prepacked weights), its shape planning (`matmul_shape`), matmul epilogues (`epilogue`),
//! fused attention (`attention`), f32 math (`vmath`) and the fork/join of a step over the
//! cores (`pool`).

pub mod attention;
pub mod epilogue;
pub mod library;
pub mod matmul_shape;
pub mod panels;
pub mod pool;
pub mod small_m;
pub mod vmath;
