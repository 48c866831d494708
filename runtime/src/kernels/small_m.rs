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
//!
//! `b` may also be a weight stored as bf16 (or f16, with AVX-512) bits (`Weight`): each
//! row of a strip is widened to f32 in registers as it is loaded (exactly: a bf16 is the
//! high half of an f32), so a decode step reads half the bytes of an f32 weight and writes
//! none. `serves_half` says which.

use crate::format::isa::{self, Isa};
use crate::format::program::Elem;
use crate::kernels::epilogue::Bound;
use crate::kernels::matmul_shape::MatmulShape;

/// Rows per matrix up to which this path serves a product.
pub const MAX_M: usize = 64;

/// Columns of a strip: two AVX-512 vectors of f32.
const NR: usize = 32;

/// How many rows of `b` ahead a tile reading panels prefetches.
const PREFETCH_ROWS: usize = 16;

/// A tile kernel: `c = a @ b` for `R` rows (the table's index + 1) and `cols` ≤ `width`
/// columns, as `tile`.
type TileFn<B> = unsafe fn(usize, (*const f32, usize), (*const B, usize), (*mut f32, usize), usize);

/// The tile kernels of one ISA: up to `tiles.len()` rows × `width` columns a call.
pub(crate) struct Kernels<B: 'static> {
    width: usize,
    tiles: &'static [TileFn<B>],
}

/// How `b` is stored: f32, or the 16 bits of a bf16 or an f16, widened to f32 lanes as they
/// are loaded. Each type has its tile kernels for AVX-512 and AVX2 (where it has them).
pub(crate) trait Weight: Copy + Sync + 'static {
    #[cfg(target_arch = "x86_64")]
    const AVX512: Kernels<Self>;
    #[cfg(target_arch = "x86_64")]
    const AVX2: Option<Kernels<Self>>;

    /// 16 elements at `p` as f32 lanes, the lanes of `mask` only (the others 0, their
    /// memory untouched).
    ///
    /// # Safety
    /// The masked lanes lie inside `p`'s allocation; the CPU has AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self, mask: u16) -> std::arch::x86_64::__m512;

    /// 8 elements at `p` as f32 lanes: all when `WHOLE`, else those whose `lanes` entry is
    /// all ones.
    ///
    /// # Safety
    /// The loaded lanes lie inside `p`'s allocation; the CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8<const WHOLE: bool>(p: *const Self, lanes: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256;
}

macro_rules! kernels {
    ($f:ident, $b:ty, $width:literal: $($r:literal)*) => {
        Kernels { width: $width, tiles: &[$($f::<$r, $b> as TileFn<$b>),*] }
    };
}

impl Weight for f32 {
    /// 2·12 accumulators + 2 loads + a broadcast fit AVX-512's 32 registers.
    #[cfg(target_arch = "x86_64")]
    const AVX512: Kernels<f32> = kernels!(tile, f32, 32: 1 2 3 4 5 6 7 8 9 10 11 12);
    /// 2·6 accumulators + 2 loads + a broadcast fit AVX2's 16 registers.
    #[cfg(target_arch = "x86_64")]
    const AVX2: Option<Kernels<f32>> = Some(kernels!(tile_avx2, f32, 16: 1 2 3 4 5 6));

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32, mask: u16) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's promise; a masked-off lane does not fault.
        unsafe { std::arch::x86_64::_mm512_maskz_loadu_ps(mask, p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8<const WHOLE: bool>(p: *const f32, lanes: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's promise; a masked-off lane does not fault.
        unsafe {
            match WHOLE {
                true => _mm256_loadu_ps(p),
                false => _mm256_maskload_ps(p, lanes),
            }
        }
    }
}

/// The bits of a bf16 weight element.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct Bf16(pub u16);

/// The bits of an f16 weight element.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub(crate) struct F16(pub u16);

/// Up to `N` 16-bit elements at `p` (those `take` says), the rest zero: the partial last
/// strip of a half weight, copied element by element (no 16-bit masked load below AVX-512BW).
///
/// # Safety
/// Elements `i` with `take(i)` lie inside `p`'s allocation.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn gather_bits<const N: usize>(p: *const u16, take: impl Fn(usize) -> bool) -> [u16; N] {
    let mut v = [0u16; N];
    for (i, x) in v.iter_mut().enumerate().filter(|(i, _)| take(*i)) {
        // SAFETY: the caller's promise.
        *x = unsafe { p.add(i).read_unaligned() };
    }
    v
}

/// 16 16-bit elements at `p`, those of `mask` only (the others 0): one load for a whole
/// mask, `gather_bits` for the partial last strip.
///
/// # Safety
/// The masked elements lie inside `p`'s allocation; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx")]
unsafe fn bits16(p: *const u16, mask: u16) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::_mm256_loadu_si256;
    // SAFETY: a whole mask reads 16 elements, the caller's promise; else only the masked
    // ones are read.
    unsafe {
        match mask {
            u16::MAX => _mm256_loadu_si256(p.cast()),
            _ => _mm256_loadu_si256(gather_bits::<16>(p, |i| mask >> i & 1 == 1).as_ptr().cast()),
        }
    }
}

impl Weight for Bf16 {
    #[cfg(target_arch = "x86_64")]
    const AVX512: Kernels<Bf16> = kernels!(tile, Bf16, 32: 1 2 3 4 5 6 7 8 9 10 11 12);
    #[cfg(target_arch = "x86_64")]
    const AVX2: Option<Kernels<Bf16>> = Some(kernels!(tile_avx2, Bf16, 16: 1 2 3 4 5 6));

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const Bf16, mask: u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's promise, which `bits16` takes.
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits16(p.cast(), mask)))) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8<const WHOLE: bool>(p: *const Bf16, lanes: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: as `load16`.
        unsafe {
            let bits = match WHOLE {
                true => _mm_loadu_si128(p.cast()),
                false => {
                    let mut take = [0i32; 8];
                    _mm256_storeu_si256(take.as_mut_ptr().cast(), lanes);
                    _mm_loadu_si128(gather_bits::<8>(p.cast(), |i| take[i] != 0).as_ptr().cast())
                }
            };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
        }
    }
}

impl Weight for F16 {
    #[cfg(target_arch = "x86_64")]
    const AVX512: Kernels<F16> = kernels!(tile, F16, 32: 1 2 3 4 5 6 7 8 9 10 11 12);
    /// f16 lanes widen with F16C, which the AVX2 level does not promise.
    #[cfg(target_arch = "x86_64")]
    const AVX2: Option<Kernels<F16>> = None;

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const F16, mask: u16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's promise, which `bits16` takes.
        unsafe { _mm512_cvtph_ps(bits16(p.cast(), mask)) }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn load8<const WHOLE: bool>(_: *const F16, _: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256 {
        unreachable!("f16 has no AVX2 kernels (`Weight::AVX2`)")
    }
}

/// Whether this path serves a product of `m` rows per matrix with the ISA in use.
pub fn serves(m: usize) -> bool {
    m <= MAX_M && isa::current() >= Isa::Avx2
}

/// Whether this path serves a product of `m` rows with `b` stored as `elem` (a half type):
/// bf16 with AVX2 or AVX-512, f16 with AVX-512.
pub fn serves_half(m: usize, elem: Elem) -> bool {
    serves(m) && (elem == Elem::Bf16 || isa::current() >= Isa::Avx512)
}

/// The kernels of `level`, which is AVX2 or better (`serves`): AVX2's below AVX-512, on a
/// CPU that has AVX2 (`format::isa` forces no ISA above the CPU's).
#[cfg(target_arch = "x86_64")]
fn kernels<B: Weight>(level: Isa) -> &'static Kernels<B> {
    match (level, &B::AVX2) {
        (Isa::Avx512, _) => &B::AVX512,
        (_, Some(k)) => k,
        (_, None) => unreachable!("a weight type without AVX2 kernels (`serves_half`)"),
    }
}

/// `out = a @ b` for the plan `s` (every batch matrix), on `threads` cores: the parts are
/// contiguous shares of the (matrix, strip) pairs. The caller checked the slices' lengths
/// against the shapes and that `serves(s.m)`. `ep` runs on each strip as it is finished.
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], s: &MatmulShape, threads: usize, ep: &Bound) {
    matmul_on(isa::current(), a, (b, Stored::RowMajor), out, s, threads, ep)
}

/// How `b` is laid out: row-major, or in the panels of `crate::kernels::panels` (each
/// 32-column strip k contiguous rows, so a strip is one stream in memory).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stored {
    RowMajor,
    Panels,
}

/// `matmul` with `b` the bits of `elem` (bf16 or f16) stored as `stored`, for a product
/// `serves_half` serves.
pub fn matmul_half(
    a: &[f32],
    (b, elem, stored): (&[u16], Elem, Stored),
    out: &mut [f32],
    s: &MatmulShape,
    threads: usize,
    ep: &Bound,
) {
    // SAFETY (both): Bf16 and F16 are transparent u16s.
    match elem {
        Elem::Bf16 => {
            let b = unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<Bf16>(), b.len()) };
            matmul_on(isa::current(), a, (b, stored), out, s, threads, ep)
        }
        Elem::F16 => {
            let b = unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<F16>(), b.len()) };
            matmul_on(isa::current(), a, (b, stored), out, s, threads, ep)
        }
        Elem::F32 => unreachable!("f32 operands take `matmul`"),
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn matmul_on<B: Weight>(
    level: Isa,
    a: &[f32],
    (b, stored): (&[B], Stored),
    out: &mut [f32],
    s: &MatmulShape,
    threads: usize,
    ep: &Bound,
) {
    // The kernels' ISA must be one this CPU runs (a caller that skipped `serves`).
    assert!(Isa::Avx2 <= level && level <= Isa::detected(), "small-M GEMM on {level:?}");
    let (m, k, n) = (s.m, s.k, s.n);
    if m == 0 || n == 0 {
        return;
    }
    // Where matrix `bo / (k·n)` of b starts, and how many elements it has, as stored.
    let matrix = match stored {
        Stored::RowMajor => k * n,
        Stored::Panels => crate::kernels::panels::packed_len(k, n),
    };
    let b_at = |bo: usize| bo / (k * n).max(1) * matrix;
    for (ao, bo, oo) in s.batch_offsets() {
        assert!(ao + m * k <= a.len() && b_at(bo) + matrix <= b.len() && oo + m * n <= out.len());
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
                    strip(level, m, k, (n, j), a.as_ptr().add(ao), (b.as_ptr().add(b_at(bo)), stored), c);
                }
                ep.apply(c, n, (oo / n, m), s0 * NR..n.min((s0 + end - item) * NR));
            }
            item = end;
        }
    });
}

/// Columns `j..j + NR` (clipped to `n`) of `c = a @ b` for row-major `a` (m×k), `b` (k×n,
/// row-major or in panels) and `c` (m×n) with the kernels of `level`: tiles as wide as
/// they take, row blocks of as many rows as they take, as even as the count allows.
///
/// # Safety
/// The pointers address matrices of those shapes; `j < n` and a multiple of `NR`; the CPU
/// has AVX2 and FMA, and AVX-512F where `level` is AVX-512.
#[cfg(target_arch = "x86_64")]
unsafe fn strip<B: Weight>(
    level: Isa,
    m: usize,
    k: usize,
    (n, j): (usize, usize),
    a: *const f32,
    (b, stored): (*const B, Stored),
    c: *mut f32,
) {
    let kern = kernels::<B>(level);
    // Column `j` of b and the stride of its rows: a strip's rows are NR apart in panels.
    let column = |j: usize| match stored {
        // SAFETY (both): inside b, the caller's promise.
        Stored::RowMajor => (unsafe { b.add(j) }, n),
        Stored::Panels => (unsafe { b.add(j / NR * k * NR + j % NR) }, NR),
    };
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
            unsafe { kern.tiles[rows - 1](k, (a.add(i * k), k), column(j), (c.add(i * n + j), n), width) };
            i += rows;
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn strip<B>(_: Isa, _: usize, _: usize, _: (usize, usize), _: *const f32, _: (*const B, Stored), _: *mut f32) {
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
pub(crate) unsafe fn tile<const MR: usize, B: Weight>(
    k: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const B, usize),
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
            // A strip of panels (rows NR apart: one stream) is read at a few operations per
            // byte, faster than the hardware prefetcher brings it: the row PREFETCH_ROWS
            // ahead is asked for (3.1 against 4.7 ms for a 768×50257 bf16 weight at one
            // row; a prefetch past the end touches nothing). A row-major b of exactly NR
            // columns is laid out the same; wider row-major strips, whose rows are a page
            // apart, are left as they were measured.
            if ldb == NR {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(PREFETCH_ROWS * ldb).cast());
            }
            let b0 = B::load16(row, m0);
            let b1 = B::load16(row.wrapping_add(16), m1);
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
    let kern = kernels::<f32>(Isa::Avx2);
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
unsafe fn tile_avx2<const MR: usize, B: Weight>(
    k: usize,
    a: (*const f32, usize),
    b: (*const B, usize),
    c: (*mut f32, usize),
    cols: usize,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match cols == 16 {
            true => tile_avx2_on::<MR, true, B>(k, a, b, c, cols),
            false => tile_avx2_on::<MR, false, B>(k, a, b, c, cols),
        }
    }
}

/// `tile_avx2`, its loads and stores masked to `cols` unless `WHOLE` (`cols` is 16).
///
/// # Safety
/// As `tile_avx2`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2_on<const MR: usize, const WHOLE: bool, B: Weight>(
    k: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const B, usize),
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
            let (b0, b1) = (B::load8::<WHOLE>(row, m0), B::load8::<WHOLE>(next, m1));
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

    /// A weight stored as bf16 (AVX2 and AVX-512) or f16 (AVX-512) bits, widened in
    /// registers, row-major or in panels, gives the bits the f32 kernels give on the same
    /// values widened first: full and partial strips (the partial ones read only their own
    /// elements), several row blocks, batches.
    #[test]
    fn half_weights_widen_in_registers_exactly() {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512].into_iter().filter(|&l| l <= Isa::detected()).collect();
        let shapes = [(vec![1, 40], vec![40, 100]), (vec![13, 33], vec![33, 17]), (vec![2, 3, 9], vec![9, 64])];
        for (a_shape, b_shape) in shapes {
            let (a, b, want) = oracle(&a_shape, &b_shape, 5);
            let s = MatmulShape::new(&a_shape, &b_shape, &want.shape).unwrap();
            let b = b.as_f32().unwrap();
            for elem in [Elem::Bf16, Elem::F16] {
                let mut bits = vec![0u16; b.len()];
                let mut wide = vec![0f32; b.len()];
                match elem {
                    Elem::Bf16 => {
                        bits.reinterpret_cast_mut::<half::bf16>().convert_from_f32_slice(b);
                        bits.reinterpret_cast::<half::bf16>().convert_to_f32_slice(&mut wide);
                    }
                    _ => {
                        bits.reinterpret_cast_mut::<half::f16>().convert_from_f32_slice(b);
                        bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(&mut wide);
                    }
                }
                let (count, k, n) = (b_shape[..b_shape.len() - 2].iter().product(), s.k, s.n);
                let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
                let packed: Vec<u16> = crate::kernels::panels::pack_elems(&bytes, 2, count, k, n)
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                let levels = levels.iter().filter(|&&l| elem == Elem::Bf16 || l == Isa::Avx512);
                for (&level, (bits, stored)) in
                    levels.flat_map(|l| [(l, (&bits, Stored::RowMajor)), (l, (&packed, Stored::Panels))])
                {
                    let a = a.as_f32().unwrap();
                    let mut f32s = vec![f32::NAN; want.numel()];
                    matmul_on(level, a, (&wide, Stored::RowMajor), &mut f32s, &s, 2, &Bound::none());
                    let mut halves = vec![f32::NAN; want.numel()];
                    // SAFETY: Bf16 and F16 are transparent u16s.
                    match elem {
                        Elem::Bf16 => {
                            let b = unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<Bf16>(), bits.len()) };
                            matmul_on(level, a, (b, stored), &mut halves, &s, 2, &Bound::none());
                        }
                        _ => {
                            let b = unsafe { std::slice::from_raw_parts(bits.as_ptr().cast::<F16>(), bits.len()) };
                            matmul_on(level, a, (b, stored), &mut halves, &s, 2, &Bound::none());
                        }
                    }
                    let same = halves.iter().zip(&f32s).all(|(h, f)| h.to_bits() == f.to_bits());
                    assert!(same, "{a_shape:?} @ {b_shape:?} as {elem:?} {stored:?} on {level:?}");
                }
            }
        }
    }

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
                matmul_on(
                    level,
                    a.as_f32().unwrap(),
                    (b.as_f32().unwrap(), Stored::RowMajor),
                    &mut out,
                    &s,
                    threads,
                    &Bound::none(),
                );
                let what = format!("{a_shape:?} @ {b_shape:?}, {level:?}, {threads} threads");
                assert_close(&out, want.as_f32().unwrap(), &what);
            }
        }
    }
}
