//! The small-M GEMM of the library path: `c = a @ b` for products of at most `MAX_M` rows
//! (short sequences, small batches, decode), where a general GEMM's packing of `b` into
//! panels costs as much memory traffic as the multiply itself and its blocking leaves one
//! core idle. Here every byte of `b` is read straight from its row-major storage, once per
//! block of up to `MR_MAX` rows of `a` (all of `a` fits the L2 cache, and each 32-column
//! strip of `b` does too, so the rereads of a strip hit L2), `a` is never copied (its
//! elements are broadcast from memory), and the cores split the columns: the parts of the
//! split (`crate::kernels::pool`) are contiguous runs of the 32-wide strips of every matrix of the batch.
//!
//! The AVX-512 micro-kernel holds an `MR × 32` tile of `c` in registers (`MR` ≤ 12: 24
//! accumulators, two loads of `b` and a broadcast of the 32 registers) across the whole
//! contraction; the AVX2 one an `MR × 16` tile (`MR` ≤ 6: 12 accumulators, two loads and a
//! broadcast of the 16 registers), two of them side by side covering a strip. A partial
//! last strip uses masked loads and stores. The path runs where the ISA in use
//! (`format::isa`) is AVX2 or AVX-512; below that `serves` says no and the general GEMM
//! takes the product.

use crate::format::isa::{self, Isa};
use crate::kernels::epilogue::Bound;
use crate::kernels::matmul_shape::MatmulShape;

/// Rows per matrix up to which this path serves a product.
pub const MAX_M: usize = 64;

/// Columns of a strip: two AVX-512 vectors of f32.
const NR: usize = 32;

/// A tile kernel: `c = a @ b` for `R` rows (the table's index + 1) and `cols` ≤ `width`
/// columns, as `tile`.
type TileFn = unsafe fn(usize, (*const f32, usize), (*const f32, usize), (*mut f32, usize), usize);

/// The tile kernels of one ISA: up to `tiles.len()` rows × `width` columns a call.
struct Kernels {
    width: usize,
    tiles: &'static [TileFn],
}

macro_rules! kernels {
    ($f:ident, $width:literal: $($r:literal)*) => {
        Kernels { width: $width, tiles: &[$($f::<$r> as TileFn),*] }
    };
}

/// 2·12 accumulators + 2 loads + a broadcast fit AVX-512's 32 registers.
#[cfg(target_arch = "x86_64")]
const AVX512: Kernels = kernels!(tile, 32: 1 2 3 4 5 6 7 8 9 10 11 12);
/// 2·6 accumulators + 2 loads + a broadcast fit AVX2's 16 registers.
#[cfg(target_arch = "x86_64")]
const AVX2: Kernels = kernels!(tile_avx2, 16: 1 2 3 4 5 6);

/// Whether this path serves a product of `m` rows per matrix with the ISA in use.
pub fn serves(m: usize) -> bool {
    m <= MAX_M && isa::current() >= Isa::Avx2
}

/// The kernels of `level`, which is AVX2 or better (`serves`): AVX2's below AVX-512, on a
/// CPU that has AVX2 (`format::isa` forces no ISA above the CPU's).
#[cfg(target_arch = "x86_64")]
fn kernels(level: Isa) -> &'static Kernels {
    match level {
        Isa::Avx512 => &AVX512,
        _ => &AVX2,
    }
}

/// `out = a @ b` for the plan `s` (every batch matrix), on `threads` cores: the parts are
/// contiguous shares of the (matrix, strip) pairs. The caller checked the slices' lengths
/// against the shapes and that `serves(s.m)`. `ep` runs on each strip as it is finished.
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], s: &MatmulShape, threads: usize, ep: &Bound) {
    matmul_on(isa::current(), a, b, out, s, threads, ep)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn matmul_on(level: Isa, a: &[f32], b: &[f32], out: &mut [f32], s: &MatmulShape, threads: usize, ep: &Bound) {
    // The kernels' ISA must be one this CPU runs (a caller that skipped `serves`).
    assert!(Isa::Avx2 <= level && level <= Isa::detected(), "small-M GEMM on {level:?}");
    let (m, k, n) = (s.m, s.k, s.n);
    if m == 0 || n == 0 {
        return;
    }
    for (ao, bo, oo) in s.batch_offsets() {
        assert!(ao + m * k <= a.len() && bo + k * n <= b.len() && oo + m * n <= out.len());
    }
    let strips = n.div_ceil(NR);
    let items = s.batch_count() * strips;
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
            let (ao, bo, oo) = s.batch_offset(mat);
            // SAFETY: the offsets address whole matrices inside the slices (asserted
            // above); the strips lie inside the n columns; the CPU has the kernels' ISA
            // (`serves`, `kernels`); each part writes only its own strips of its own matrix.
            unsafe {
                let c = (c as *mut f32).add(oo);
                for j in (s0..s0 + end - item).map(|s| s * NR) {
                    strip(level, m, k, (n, j), a.as_ptr().add(ao), b.as_ptr().add(bo), c);
                }
                ep.apply(c, n, (oo / n, m), s0 * NR..n.min((s0 + end - item) * NR));
            }
            item = end;
        }
    });
}

/// Columns `j..j + NR` (clipped to `n`) of `c = a @ b` for row-major `a` (m×k), `b` (k×n)
/// and `c` (m×n) with the kernels of `level`: tiles as wide as they take, row blocks of as
/// many rows as they take, as even as the count allows.
///
/// # Safety
/// The pointers address matrices of those shapes; `j < n`; the CPU has AVX2 and FMA, and
/// AVX-512F where `level` is AVX-512.
#[cfg(target_arch = "x86_64")]
unsafe fn strip(level: Isa, m: usize, k: usize, (n, j): (usize, usize), a: *const f32, b: *const f32, c: *mut f32) {
    let kern = kernels(level);
    let mr = kern.tiles.len();
    let blocks = m.div_ceil(mr);
    let cols = NR.min(n - j);
    for j in (j..j + cols).step_by(kern.width) {
        let width = kern.width.min(n - j);
        let mut i = 0;
        for blk in 0..blocks {
            let rows = (m - i).div_ceil(blocks - blk);
            // SAFETY: rows i..i + rows of a and c, columns j..j + width of b and c; the
            // CPU has the kernels' ISA (the caller's promise).
            unsafe { kern.tiles[rows - 1](k, (a.add(i * k), k), (b.add(j), n), (c.add(i * n + j), n), width) };
            i += rows;
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn strip(_: Isa, _: usize, _: usize, _: (usize, usize), _: *const f32, _: *const f32, _: *mut f32) {
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

/// `c = a @ b` for a `rows × cols` tile (`cols` ≤ 32) with the AVX2 kernels: `tile`'s
/// contract, as tiles of up to 6 rows × 16 columns. Fused attention's AVX2 path runs its two
/// products on it.
///
/// # Safety
/// As `tile`, on a CPU with AVX2 and FMA; `rows` ≥ 1.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiles_avx2(
    rows: usize,
    k: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    cols: usize,
) {
    let kern = &AVX2;
    let mr = kern.tiles.len();
    for j in (0..cols).step_by(kern.width) {
        let width = kern.width.min(cols - j);
        let mut i = 0;
        while i < rows {
            let r = mr.min(rows - i);
            // SAFETY: rows i..i + r and columns j..j + width of the caller's tile.
            unsafe { kern.tiles[r - 1](k, (a.add(i * lda), lda), (b.add(j), ldb), (c.add(i * ldc + j), ldc), width) };
            i += r;
        }
    }
}

/// `c = a @ b` for an `MR × cols` tile (`cols` ≤ 16) in AVX2 registers, as `tile`. A whole
/// tile loads and stores without masks: AVX2's masked moves cost more than plain ones (on
/// AMD's cores, several times more), and nearly every tile is whole.
///
/// # Safety
/// The pointers address those tiles; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const MR: usize>(
    k: usize,
    a: (*const f32, usize),
    b: (*const f32, usize),
    c: (*mut f32, usize),
    cols: usize,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match cols == 16 {
            true => tile_avx2_on::<MR, true>(k, a, b, c, cols),
            false => tile_avx2_on::<MR, false>(k, a, b, c, cols),
        }
    }
}

/// `tile_avx2`, its loads and stores masked to `cols` unless `WHOLE` (`cols` is 16).
///
/// # Safety
/// As `tile_avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_on<const MR: usize, const WHOLE: bool>(
    k: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    cols: usize,
) {
    use std::arch::x86_64::*;
    // The lanes of each half of the tile that lie inside the matrix: all ones (-1) in the
    // lanes to load and store.
    let mask = |from: usize| -> __m256i {
        let lanes = cols.saturating_sub(from).min(8) as i32;
        _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
    };
    let (m0, m1) = (mask(0), mask(8));
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // SAFETY: rows p < k and i < MR lie inside; masked loads and stores touch only the
    // tile's columns (a masked lane does not fault), so the half past `cols` may lie
    // outside, its address formed by wrapping arithmetic.
    unsafe {
        for p in 0..k {
            let (row, next) = (b.add(p * ldb), b.add(p * ldb).wrapping_add(8));
            let (b0, b1) = match WHOLE {
                true => (_mm256_loadu_ps(row), _mm256_loadu_ps(next)),
                false => (_mm256_maskload_ps(row, m0), _mm256_maskload_ps(next, m1)),
            };
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*a.add(i * lda + p));
                acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let (row, next) = (c.add(i * ldc), c.add(i * ldc).wrapping_add(8));
            match WHOLE {
                true => {
                    _mm256_storeu_ps(row, acc[0]);
                    _mm256_storeu_ps(next, acc[1]);
                }
                false => {
                    _mm256_maskstore_ps(row, m0, acc[0]);
                    _mm256_maskstore_ps(next, m1, acc[1]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul_shape::testing::{assert_close, oracle};

    /// Every row-block split (1 to 64 rows), full and partial strips, k of 1 and more,
    /// batches and broadcasts, on 1 to 3 threads, with the kernels of every ISA the CPU has
    /// (AVX2 and AVX-512), against the interpreter's matmul.
    #[test]
    fn matches_the_interpreter() {
        let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512].into_iter().filter(|&l| l <= Isa::detected()).collect();
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
            for (&level, threads) in levels.iter().flat_map(|l| [(l, 1), (l, 2), (l, 3)]) {
                let mut out = vec![f32::NAN; want.numel()];
                matmul_on(level, a.as_f32().unwrap(), b.as_f32().unwrap(), &mut out, &s, threads, &Bound::none());
                let what = format!("{a_shape:?} @ {b_shape:?}, {level:?}, {threads} threads");
                assert_close(&out, want.as_f32().unwrap(), &what);
            }
        }
    }
}
