//! The small-M GEMM of the library path: `c = a @ b` for products of at most `MAX_M` rows
//! (short sequences, small batches, decode), where a general GEMM's packing of `b` into
//! panels costs as much memory traffic as the multiply itself and its blocking leaves one
//! core idle. Here every byte of `b` is read straight from its row-major storage, once per
//! block of up to `MR_MAX` rows of `a` (all of `a` fits the L2 cache, and each 32-column
//! strip of `b` does too, so the rereads of a strip hit L2), `a` is never copied (its
//! elements are broadcast from memory), and the cores split the columns: the parts of the
//! split (`crate::kernels::pool`) are contiguous runs of the 32-wide strips of every matrix of the batch.
//!
//! The micro-kernel holds an `MR × 32` tile of `c` in AVX-512 registers (`MR` ≤ 12: 24
//! accumulators, two loads of `b` and a broadcast of the 32 registers) across the whole
//! contraction; a partial last strip uses masked loads and stores. It runs only where the
//! CPU has AVX-512F (detected at run time); elsewhere `serves` says no and the general GEMM
//! (which has AVX2 kernels) takes the product.

use crate::kernels::epilogue::Bound;
use crate::kernels::matmul_shape::MatmulShape;

/// Rows per matrix up to which this path serves a product.
pub const MAX_M: usize = 64;

/// Columns of a strip: two AVX-512 vectors of f32.
const NR: usize = 32;

/// The most rows of `a` a micro-kernel call multiplies: 2·12 accumulators + 2 loads + a
/// broadcast fit AVX-512's 32 registers.
const MR_MAX: usize = 12;

/// Whether this path serves a product of `m` rows per matrix on this CPU.
pub fn serves(m: usize) -> bool {
    m <= MAX_M && avx512()
}

/// Whether the ISA in use (`format::isa`) is AVX-512: there is no other small-M path yet
/// (elsewhere the panel kernels serve small M too).
fn avx512() -> bool {
    crate::format::isa::current() == crate::format::isa::Isa::Avx512
}

/// `out = a @ b` for the plan `s` (every batch matrix), on `threads` cores: the parts are
/// contiguous shares of the (matrix, strip) pairs. The caller checked the slices' lengths
/// against the shapes and that `serves(s.m)`. `ep` runs on each strip as it is finished.
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], s: &MatmulShape, threads: usize, ep: &Bound) {
    let (m, k, n) = (s.m, s.k, s.n);
    if m == 0 || n == 0 {
        return;
    }
    let batches = s.batch_offsets();
    for &(ao, bo, oo) in &batches {
        assert!(ao + m * k <= a.len() && bo + k * n <= b.len() && oo + m * n <= out.len());
    }
    let strips = n.div_ceil(NR);
    let items = batches.len() * strips;
    // The result as an address: the threads share it, each writing only its own strips.
    let c = out.as_mut_ptr() as usize;
    let parts = if threads > 1 { items.min(crate::kernels::pool::PARTS_PER_THREAD * threads) } else { 1 };
    crate::kernels::pool::split(parts, &|t| {
        let (from, to) = (items * t / parts, items * (t + 1) / parts);
        let mut item = from;
        while item < to {
            // The run of strips of one matrix in this part, then its epilogue on the run's
            // columns (rows × a part's strips: in L2) rather than strip by strip.
            let (mat, s0) = (item / strips, item % strips);
            let end = to.min((mat + 1) * strips);
            let (ao, bo, oo) = batches[mat];
            // SAFETY: the offsets address whole matrices inside the slices (asserted
            // above); the strips lie inside the n columns; AVX-512F is present (`serves`);
            // each part writes only its own strips of its own matrix.
            unsafe {
                let c = (c as *mut f32).add(oo);
                for j in (s0..s0 + end - item).map(|s| s * NR) {
                    strip(m, k, (n, j), a.as_ptr().add(ao), b.as_ptr().add(bo), c);
                }
                ep.apply(c, n, (oo / n, m), s0 * NR..n.min((s0 + end - item) * NR));
            }
            item = end;
        }
    });
}

/// Columns `j..j + NR` (clipped to `n`) of `c = a @ b` for row-major `a` (m×k), `b` (k×n)
/// and `c` (m×n): row blocks of at most `MR_MAX`, as even as the count allows.
///
/// # Safety
/// The pointers address matrices of those shapes; `j < n`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
unsafe fn strip(m: usize, k: usize, (n, j): (usize, usize), a: *const f32, b: *const f32, c: *mut f32) {
    let blocks = m.div_ceil(MR_MAX);
    let cols = NR.min(n - j);
    let mut i = 0;
    for blk in 0..blocks {
        let rows = (m - i).div_ceil(blocks - blk);
        // SAFETY: rows i..i + rows of a and c, columns j..j + cols of b and c.
        unsafe {
            let (a, b, c) = (a.add(i * k), b.add(j), c.add(i * n + j));
            macro_rules! tile {
                ($($r:literal)*) => {
                    match rows {
                        $($r => tile::<$r>(k, (a, k), (b, n), (c, n), cols),)*
                        _ => unreachable!("1 to MR_MAX rows"),
                    }
                };
            }
            tile!(1 2 3 4 5 6 7 8 9 10 11 12);
        }
        i += rows;
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn strip(_: usize, _: usize, _: (usize, usize), _: *const f32, _: *const f32, _: *mut f32) {
    unreachable!("`serves` is false off x86-64")
}

/// `c = a @ b` for an `MR × cols` tile (`cols` ≤ 32): `a` MR×k with row stride `lda`, `b`
/// k×cols with row stride `ldb`, `c` with row stride `ldc`. The tile stays in registers
/// across all of k. Fused attention (`crate::kernels::attention`) runs its two products on it too.
///
/// # Safety
/// The pointers address those tiles; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile<const MR: usize>(
    k: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    cols: usize,
) {
    use std::arch::x86_64::*;
    // The lanes of each half of the strip that lie inside the matrix.
    let mask = |from: usize| -> __mmask16 {
        let lanes = cols.saturating_sub(from).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    };
    let (m0, m1) = (mask(0), mask(16));
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // SAFETY: rows p < k and i < MR lie inside; masked loads and stores touch only the
    // tile's columns (a masked lane does not fault), so the half past `cols` may lie
    // outside, its address formed by wrapping arithmetic.
    unsafe {
        for p in 0..k {
            let row = b.add(p * ldb);
            let b0 = _mm512_maskz_loadu_ps(m0, row);
            let b1 = _mm512_maskz_loadu_ps(m1, row.wrapping_add(16));
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(i * lda + p));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let row = c.add(i * ldc);
            _mm512_mask_storeu_ps(row, m0, acc[0]);
            _mm512_mask_storeu_ps(row.wrapping_add(16), m1, acc[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul_shape::testing::{assert_close, oracle};

    /// Every row-block split (1 to 64 rows), full and partial strips, k of 1 and more,
    /// batches and broadcasts, on 1 to 3 threads, against the interpreter's matmul.
    #[test]
    fn matches_the_interpreter() {
        if !serves(1) {
            eprintln!("no AVX-512F here: the small-M path is not used, nothing to test");
            return;
        }
        let mut shapes: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
        for m in [1, 2, 5, 11, 12, 13, 25, 26, 37, 64] {
            for (k, n) in [(1, 1), (7, 31), (16, 32), (33, 65), (40, 100)] {
                shapes.push((vec![m, k], vec![k, n]));
            }
        }
        shapes.extend([
            (vec![2, 13, 24], vec![24, 40]),
            (vec![3, 5, 9], vec![3, 9, 17]),
            (vec![2, 1, 4, 6], vec![3, 6, 33]),
            (vec![9], vec![9, 70]),
            (vec![4, 0], vec![0, 5]),
        ]);
        for (a_shape, b_shape) in shapes {
            let (a, b, want) = oracle(&a_shape, &b_shape, 3);
            let s = MatmulShape::new(&a_shape, &b_shape, &want.shape).unwrap();
            for threads in [1, 2, 3] {
                let mut out = vec![f32::NAN; want.numel()];
                matmul(a.as_f32().unwrap(), b.as_f32().unwrap(), &mut out, &s, threads, &Bound::none());
                assert_close(&out, want.as_f32().unwrap(), &format!("{a_shape:?} @ {b_shape:?}, {threads} threads"));
            }
        }
    }
}
