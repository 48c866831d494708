//! The library kernels the runner calls instead of generated code (each through `call`'s
//! `LibraryCall`, implemented next to it), and what they share with
//! the compiler's code generation: the library GEMM (`library`, `small_m`, `panels` for
//! prepacked weights), the integer GEMM of 8-bit products (`igemm`), its shape planning (`matmul_shape`), matmul epilogues (`epilogue`),
//! fused attention (`attention`), a transpose, a reduction, a softmax and a concat of run-time
//! shape (`transpose`, `reduce`, `softmax`, `concat`), f32 math (`vmath`) and the fork/join of a step over the
//! cores (`pool`).

pub mod attention;
pub mod call;
pub mod concat;
pub mod epilogue;
pub mod igemm;
pub mod library;
pub mod matmul_shape;
pub mod panels;
pub mod pool;
pub mod reduce;
pub mod small_m;
pub mod softmax;
pub mod transpose;
pub mod vmath;

use crate::format::program::Library;
use crate::kernels::call::LibraryCall;

/// The kernel that runs library call `l`.
pub fn library_call(l: &Library) -> &dyn LibraryCall {
    match l {
        Library::Matmul(m) => m,
        Library::IntMatmul(m) => m,
        Library::Attention(a) => a,
        Library::Transpose(t) => t,
        Library::Reduce(r) => r,
        Library::Softmax(s) => s,
        Library::Concat(c) => c,
    }
}
