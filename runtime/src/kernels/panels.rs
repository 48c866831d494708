//! Prepacked weights: the panel layout a constant matmul operand `b` (k×n) is stored in by
//! the compiler, and the GEMM that reads it. A GEMM library packs `b` into panels on every
//! call; a weight is known at compile time, so the artifact holds it packed once and the
//! run never copies it (at small M that packing cost as much memory traffic as the
//! multiply, and a strip of a row-major `b` wider than a page crossed a page per row, out of
//! reach of the hardware prefetcher).
//!
//! Layout: the columns in strips of `NR` (the last padded with zeros), each strip stored as
//! k consecutive rows of `NR` values, so a strip is one contiguous stream; the matrices of a
//! batched `b` one after the other (`packed_len` elements each).
//!
//! The GEMM holds an `MR × NR` tile of `c` in registers across a slice of the contraction,
//! broadcasting `a`'s elements from a copy of the block's slice of `a` laid out tile by tile
//! (the only packing at run time: a few rows of activations, not the weight): AVX-512 (MR ≤ 12, two
//! vectors a row), AVX2 (MR ≤ 6 on each 16-column half of the strip) or portable code,
//! chosen at run time. Each element of `c` is one chain of fused multiply-adds in `k` order
//! whatever the blocking, the split over threads or the row block it falls in, so the thread
//! count never changes a bit of the result.
//!
//! Splits: up to `SMALL_M` rows a product is split by strips (each core streams its share of
//! the weight once, all rows at a time); longer ones by blocks of rows, each block running
//! `KC`-deep slices of the contraction so a strip's slice stays in L1 while the row tiles
//! of the block pass over it. A part of the strip split runs its strips one after the
//! other, each slice by slice: its share of the weight is read as one stream in memory
//! order, and the kernel prefetches the next slice while the tiles pass over this one. A
//! weight read once per run does not stay in cache between runs (the 2 × 13 encoder's
//! 42 MB against a 32 MB L3), so without that the first tile of each slice waited on
//! memory while the next ones found the slice in L1 (that GEMM time fell by ~10%, `cargo
//! bench --bench models`).

use crate::format::isa::{self, Isa as Level};
use crate::kernels::epilogue::Bound;
use crate::kernels::matmul_shape::MatmulShape;

/// Columns of a strip: two AVX-512 vectors of f32.
pub const NR: usize = 32;

/// The most rows a tile holds (AVX-512: 2·12 accumulators, two loads of `b` and a
/// broadcast fit its 32 registers).
const MR_MAX: usize = 12;

/// Rows per matrix up to which a product is split by strips rather than rows.
pub const SMALL_M: usize = 64;

/// Depth of a contraction slice: a strip's slice (`KC` × `NR` f32, 24 KiB) stays in a 32 KiB
/// L1 beside the tile's rows of `a`.
const KC: usize = 192;

/// Rows of a block of the row split: its `a` slice (`MC` × `KC` f32, 144 KiB) stays in L2
/// while every strip passes over it.
const MC: usize = 192;

/// The most bytes of a block of the result its epilogue runs on at once
/// (`crate::kernels::epilogue`): a block of a small-M product, its rows × a part's strips.
const EPILOGUE_BLOCK_BYTES: usize = 256 << 10;

/// Elements of one packed k×n matrix.
pub fn packed_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * k * NR
}

/// Whether a weight of `n` columns is worth storing in panels: its padding adds at most an
/// eighth to its bytes (a narrow weight, 8 columns padded to 32, would take 4× the memory
/// of the device it lives on, for no speed: the row-major path computes whole vectors too).
pub fn worth_packing(n: usize) -> bool {
    n.div_ceil(NR) * NR * 8 <= n * 9
}

/// Elements of a `b` of this shape in panels (a vector `[k]` is a k×1 matrix); `None` if
/// that overflows.
pub fn packed_elems(b_shape: &[usize]) -> Option<usize> {
    let (k, n, batch) = match b_shape {
        [] => return None,
        [k] => (*k, 1, &[][..]),
        [batch @ .., k, n] => (*k, *n, batch),
    };
    let matrix = n.div_ceil(NR).checked_mul(k)?.checked_mul(NR)?;
    batch.iter().try_fold(matrix, |x, &d| x.checked_mul(d))
}

/// Elements of the panels the product `s` reads: its `b` span `b_span` (`MatmulShape::spans`)
/// in packed matrices.
pub fn span(s: &MatmulShape, b_span: usize) -> anyhow::Result<usize> {
    let matrix = s.k * s.n;
    if matrix == 0 {
        return Ok(0);
    }
    let packed = s.n.div_ceil(NR).checked_mul(s.k).and_then(|x| x.checked_mul(NR));
    packed
        .and_then(|p| (b_span / matrix).checked_mul(p))
        .ok_or_else(|| anyhow::anyhow!("matmul plan: its sizes overflow"))
}

/// The panels of `count` row-major k×n matrices of 4-byte elements given as little-endian
/// bytes (what the compiler writes into the artifact): element for element, zeros in the
/// padding, so equal weights give equal bytes.
pub fn pack_bytes(b: &[u8], count: usize, k: usize, n: usize) -> Vec<u8> {
    pack_elems(b, 4, count, k, n)
}

/// `pack_bytes` for elements of `size` bytes (2: a bf16 or f16 weight, which the small-M
/// GEMM widens as it reads its strips: `crate::kernels::small_m`).
pub fn pack_elems(b: &[u8], size: usize, count: usize, k: usize, n: usize) -> Vec<u8> {
    assert_eq!(b.len(), count * k * n * size, "a packed weight is whole matrices");
    let mut out = vec![0u8; count * packed_len(k, n) * size];
    for m in 0..count {
        let (src, dst) = (&b[m * k * n * size..], &mut out[m * packed_len(k, n) * size..]);
        for s in 0..n.div_ceil(NR) {
            let cols = NR.min(n - s * NR);
            for p in 0..k {
                let from = (p * n + s * NR) * size;
                let to = ((s * k + p) * NR) * size;
                dst[to..to + cols * size].copy_from_slice(&src[from..from + cols * size]);
            }
        }
    }
    out
}

/// `pack_bytes` undone: `count` matrices of `k`×`n` from panels into `out`, row-major.
pub fn unpack<T: Copy>(panels: &[T], count: usize, k: usize, n: usize, out: &mut [T]) {
    for m in 0..count {
        let (src, dst) = (&panels[m * packed_len(k, n)..], &mut out[m * k * n..]);
        for s in 0..n.div_ceil(NR) {
            let cols = NR.min(n - s * NR);
            for p in 0..k {
                let from = (s * k + p) * NR;
                dst[p * n + s * NR..p * n + s * NR + cols].copy_from_slice(&src[from..from + cols]);
            }
        }
    }
}

/// A step's weight in panels copied out row-major, kept with the address it was copied
/// from. A weight in panels lies in the artifact's weights, which no step writes
/// (`exec::validate`), so one copy serves every call and every shape the step is planned
/// for; another address (another weight) is copied again. (A run holds its `Loaded`'s
/// state for its whole length, so calls of one step never overlap: the lock is never
/// waited on.)
#[derive(Default)]
pub struct Unpacked<T>(parking_lot::Mutex<(usize, Vec<T>)>);

impl<T: Copy + Default> Unpacked<T> {
    /// `f` on the `count` `k`×`n` matrices of `panels` row-major.
    pub fn with<R>(&self, panels: &[T], (count, k, n): (usize, usize, usize), f: impl FnOnce(&[T]) -> R) -> R {
        let from = panels.as_ptr() as usize;
        let mut kept = self.0.lock();
        if kept.0 != from {
            // Forgotten first, so that a copy cut short is never taken for whole.
            kept.0 = 0;
            kept.1.resize(count * k * n, T::default());
            unpack(panels, count, k, n, &mut kept.1);
            kept.0 = from;
        }
        f(&kept.1)
    }

    /// The bytes the copy holds.
    pub fn bytes(&self) -> usize {
        self.0.lock().1.capacity() * std::mem::size_of::<T>()
    }
}

/// A tile kernel: `c = a @ panel` (or `c += a @ panel` with `accumulate`) for `MR` rows of
/// `a`, `k` rows of the panel and all `NR` columns of `c` (row stride `ldc`). `a` is packed
/// column by column (element (i, q) at `q · MR + i`; `lda` unused) or, where `PACKED` is
/// false, row-major with row stride `lda`.
type TileFn = unsafe fn(k: usize, a: *const f32, lda: usize, panel: *const f32, c: *mut f32, ldc: usize, acc: bool);

/// The tile kernels of one instruction set, by `a`'s layout: `packed[r - 1]` and
/// `strided[r - 1]` for `r` ≤ `mr` rows.
struct Isa {
    mr: usize,
    packed: &'static [TileFn],
    strided: &'static [TileFn],
}

macro_rules! isa {
    ($f:ident: $($r:literal)*) => {
        Isa {
            mr: [$($r),*].len(),
            packed: &[$($f::<$r, true> as TileFn),*],
            strided: &[$($f::<$r, false> as TileFn),*],
        }
    };
}

#[cfg(target_arch = "x86_64")]
const AVX512: Isa = isa!(tile_avx512: 1 2 3 4 5 6 7 8 9 10 11 12);
#[cfg(target_arch = "x86_64")]
const AVX2: Isa = isa!(tile_avx2: 1 2 3 4 5 6);
const PORTABLE: Isa = isa!(tile_portable: 1 2 3 4);

/// The kernels of `level`.
fn kernels(level: Level) -> &'static Isa {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => &AVX512,
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => &AVX2,
        _ => &PORTABLE,
    }
}

/// The kernels this CPU runs, best first.
#[cfg(test)]
fn available() -> Vec<&'static Isa> {
    Level::ALL.into_iter().rev().filter(|&l| l <= Level::detected()).map(kernels).collect()
}

/// The kernels of the ISA in use (`format::isa`).
fn isa() -> &'static Isa {
    kernels(isa::current())
}

/// `out = a @ b` for the plan `s` with `b` in panels (`packed_len` elements per matrix) on
/// `threads` cores, then `ep` on each tile as it is finished. The caller checked the slices'
/// lengths against the shapes.
pub fn matmul(a: &[f32], panels: &[f32], out: &mut [f32], s: &MatmulShape, threads: usize, ep: &Bound) {
    matmul_on(isa(), a, panels, out, s, threads, ep);
}

/// `matmul` by the kernels of `isa`.
fn matmul_on(isa: &Isa, a: &[f32], panels: &[f32], out: &mut [f32], s: &MatmulShape, threads: usize, ep: &Bound) {
    let (m, k, n) = (s.m, s.k, s.n);
    if m == 0 || n == 0 {
        return;
    }
    let matrix = packed_len(k, n);
    let count = s.batch_count();
    let batch = |i: usize| {
        let (ao, bo, oo) = s.batch_offset(i);
        (ao, bo / (k * n).max(1) * matrix, oo)
    };
    for (ao, po, oo) in (0..count).map(batch) {
        assert!(ao + m * k <= a.len() && po + matrix <= panels.len() && oo + m * n <= out.len());
    }
    let strips = n.div_ceil(NR);
    let (a, p, c) = (a.as_ptr() as usize, panels.as_ptr() as usize, out.as_mut_ptr() as usize);
    // SAFETY (of every `run` below): the offsets address whole matrices inside the slices
    // (asserted above), the rows and strips lie inside them, and the parts of a split write
    // disjoint tiles of `c`.
    let run = |(ao, po, oo): (usize, usize, usize), rows: (usize, usize), strips: (usize, usize)| unsafe {
        let (a, p, c) = ((a as *const f32).add(ao), (p as *const f32).add(po), (c as *mut f32).add(oo));
        block(isa, (k, n), a, p, (c, oo / n), rows, strips, ep);
    };
    if m <= SMALL_M {
        let items = count * strips;
        let parts = if threads > 1 { items.min(crate::kernels::pool::PARTS_PER_THREAD * threads) } else { 1 };
        crate::kernels::pool::split(parts, &|t| {
            let (from, to) = (items * t / parts, items * (t + 1) / parts);
            let mut item = from;
            while item < to {
                // The run of strips of one matrix in this part.
                let (mat, j) = (item / strips, item % strips);
                let end = to.min((mat + 1) * strips);
                run(batch(mat), (0, m), (j, j + end - item));
                item = end;
            }
        });
    } else {
        let mr = isa.mr;
        let tiles = m.div_ceil(mr);
        let parts = if threads > 1 { (crate::kernels::pool::PARTS_PER_THREAD * threads).min(tiles) } else { 1 };
        crate::kernels::pool::split(parts, &|t| {
            let (r0, r1) = ((tiles * t / parts * mr).min(m), (tiles * (t + 1) / parts * mr).min(m));
            for mat in 0..count {
                run(batch(mat), (r0, r1), (0, strips));
            }
        });
    }
}

/// Rows `r0..r1` × strips `s0..s1` of `c = a @ b` for one matrix: `a` m×k, `c` m×n row-major
/// (row `c_row` of the whole result), `b` in panels; then `ep` on each tile.
///
/// # Safety
/// The pointers address matrices of those shapes; the ranges lie inside them.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    isa: &Isa,
    (k, n): (usize, usize),
    a: *const f32,
    p: *const f32,
    (c, c_row): (*mut f32, usize),
    (r0, r1): (usize, usize),
    (s0, s1): (usize, usize),
    ep: &Bound,
) {
    // `a` is copied where the copy serves every strip: a part of a small-M split covers
    // a few, and copying `a` for each cost more than the contention it avoids.
    let pack_a = s0 == 0 && s1 == n.div_ceil(NR);
    // The epilogue runs on each tile as it is finished, or on the whole block of rows ×
    // strips where that stays in L2: longer rows, a tenth of the calls.
    let per_block = (r1 - r0).min(MC) * (s1 - s0) * NR * 4 <= EPILOGUE_BLOCK_BYTES;
    // A partial last strip is computed in here, then its columns copied out.
    let mut spare = [0f32; MR_MAX * NR];
    PACKED_A.with_borrow_mut(|packed| {
        packed.resize(MC * KC, 0.0);
        let packed = packed.as_mut_ptr();
        for i0 in (r0..r1).step_by(MC) {
            let i1 = r1.min(i0 + MC);
            // Row tiles of at most `mr` rows, as even as the count allows: (first row, rows).
            // (On the stack: a call allocates nothing.)
            let count = (i1 - i0).div_ceil(isa.mr);
            let mut all = [(0, 0); MC];
            let tiles = &mut all[..count];
            let mut i = i0;
            for (t, tile) in tiles.iter_mut().enumerate() {
                let rows = (i1 - i).div_ceil(count - t);
                *tile = (i, rows);
                i += rows;
            }
            let tiles = &*tiles;
            // Slice by slice, each over the strips, where `a` is copied (a slice of it
            // serves every strip); strip by strip otherwise, so that the weight is read as
            // one stream in memory order and the tile kernel can fetch the next slice ahead.
            let slices = (0..k.max(1)).step_by(KC);
            let (outer, inner) = match pack_a {
                true => (slices.len(), s1 - s0),
                false => (s1 - s0, slices.len()),
            };
            let order = (0..outer * inner).map(|x| (x / inner, x % inner)).map(|(o, i)| match pack_a {
                true => (o * KC, s0 + i),
                false => (i * KC, s0 + o),
            });
            for (k0, s) in order {
                let depth = KC.min(k - k0);
                // The tiles' rows of this slice of `a`, each tile column by column (one
                // stream for its kernel, where rows of `a` a page apart would contend for
                // the same L1 sets), at `(i - i0) · depth`.
                for &(i, rows) in tiles.iter().filter(|_| pack_a && s == s0) {
                    let to = packed.add((i - i0) * depth);
                    for q in 0..depth {
                        for r in 0..rows {
                            *to.add(q * rows + r) = *a.add((i + r) * k + k0 + q);
                        }
                    }
                }
                let last = k0 + depth >= k;
                let (j, cols) = (s * NR, NR.min(n - s * NR));
                let panel = p.add((s * k + k0) * NR);
                for &(i, rows) in tiles {
                    let row = c.add(i * n);
                    let c = row.add(j);
                    let (a, tile) = match pack_a {
                        true => (packed.add((i - i0) * depth).cast_const(), isa.packed[rows - 1]),
                        false => (a.add(i * k + k0), isa.strided[rows - 1]),
                    };
                    if cols == NR {
                        tile(depth, a, k, panel, c, n, k0 > 0);
                    } else {
                        let spare = spare.as_mut_ptr();
                        for r in 0..rows {
                            std::ptr::copy_nonoverlapping(c.add(r * n), spare.add(r * NR), cols);
                        }
                        tile(depth, a, k, panel, spare, NR, k0 > 0);
                        for r in 0..rows {
                            std::ptr::copy_nonoverlapping(spare.add(r * NR), c.add(r * n), cols);
                        }
                    }
                    if last && !per_block {
                        // The tile is final and in L1.
                        ep.apply(row, n, (c_row + i, rows), j..j + cols);
                    }
                }
            }
            if per_block {
                ep.apply(c.add(i0 * n), n, (c_row + i0, i1 - i0), s0 * NR..n.min(s1 * NR));
            }
        }
    });
}

thread_local! {
    /// A block's slice of `a`, tile by tile (`block`), kept between calls.
    static PACKED_A: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The AVX-512 tile: two vectors a row.
///
/// # Safety
/// As `TileFn`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<const MR: usize, const PACKED: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    p: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // SAFETY: rows i < MR of a and c, k rows of the panel, NR columns.
    unsafe {
        if accumulate {
            for (i, acc) in acc.iter_mut().enumerate() {
                *acc = [_mm512_loadu_ps(c.add(i * ldc)), _mm512_loadu_ps(c.add(i * ldc + 16))];
            }
        }
        for q in 0..k {
            if !PACKED {
                // The next slice in the order `block` runs them (this strip's next, or the
                // next strip's first: both start where this slice ends), into L2 while
                // this one is computed, so that the first tile of a slice does not wait on
                // memory while the others find it in cache. A prefetch never faults, so
                // the last slice's run past the end is harmless.
                let ahead = p.wrapping_add((q + k) * NR);
                _mm_prefetch::<_MM_HINT_T1>(ahead.cast());
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(16).cast());
            }
            let (b0, b1) = (_mm512_loadu_ps(p.add(q * NR)), _mm512_loadu_ps(p.add(q * NR + 16)));
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(if PACKED { q * MR + i } else { i * lda + q }));
                acc[0] = _mm512_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(x, b1, acc[1]);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc), acc[0]);
            _mm512_storeu_ps(c.add(i * ldc + 16), acc[1]);
        }
    }
}

/// The AVX2 tile: each 16-column half of the strip in turn, two vectors a row.
///
/// # Safety
/// As `TileFn`; the CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const MR: usize, const PACKED: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    p: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    for h in [0, 16] {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        // SAFETY: rows i < MR of a and c, k rows of the panel, columns h..h + 16 of NR.
        unsafe {
            if accumulate {
                for (i, acc) in acc.iter_mut().enumerate() {
                    *acc = [_mm256_loadu_ps(c.add(i * ldc + h)), _mm256_loadu_ps(c.add(i * ldc + h + 8))];
                }
            }
            for q in 0..k {
                let (b0, b1) = (_mm256_loadu_ps(p.add(q * NR + h)), _mm256_loadu_ps(p.add(q * NR + h + 8)));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*a.add(if PACKED { q * MR + i } else { i * lda + q }));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(c.add(i * ldc + h), acc[0]);
                _mm256_storeu_ps(c.add(i * ldc + h + 8), acc[1]);
            }
        }
    }
}

/// The tile in plain Rust, for CPUs without AVX2: `mul_add` keeps the one rounding per
/// step of the vector kernels.
///
/// # Safety
/// As `TileFn`.
unsafe fn tile_portable<const MR: usize, const PACKED: bool>(
    k: usize,
    a: *const f32,
    lda: usize,
    p: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[0f32; NR]; MR];
    // SAFETY: rows i < MR of a and c, k rows of the panel, NR columns.
    unsafe {
        if accumulate {
            for (i, acc) in acc.iter_mut().enumerate() {
                acc.copy_from_slice(std::slice::from_raw_parts(c.add(i * ldc), NR));
            }
        }
        for q in 0..k {
            let b = std::slice::from_raw_parts(p.add(q * NR), NR);
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = *a.add(if PACKED { q * MR + i } else { i * lda + q });
                acc.iter_mut().zip(b).for_each(|(y, &b)| *y = x.mul_add(b, *y));
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            std::slice::from_raw_parts_mut(c.add(i * ldc), NR).copy_from_slice(acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul_shape::testing::{assert_close, oracle};

    fn packed(b: &[f32], count: usize, k: usize, n: usize) -> Vec<f32> {
        let bytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        pack_bytes(&bytes, count, k, n).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// Every instruction set this CPU has (each tile height), both splits, full and partial
    /// strips, contractions deeper than a slice, batches and broadcasts, on 1 to 3 threads,
    /// against the interpreter's matmul; and the bits the same on any thread count.
    #[test]
    fn matches_the_interpreter() {
        let mut shapes: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
        for m in [1, 5, 12, 13, 26, 64, 65, 200, 397] {
            for (k, n) in [(1, 1), (7, 31), (33, 65), (400, 100)] {
                shapes.push((vec![m, k], vec![k, n]));
            }
        }
        shapes.extend([
            (vec![2, 13, 24], vec![24, 40]),
            (vec![3, 5, 9], vec![3, 9, 17]),
            (vec![2, 1, 70, 6], vec![3, 6, 33]),
            (vec![9], vec![9, 70]),
            (vec![4, 0], vec![0, 5]),
        ]);
        for (a_shape, b_shape) in shapes {
            let (a, b, want) = oracle(&a_shape, &b_shape, 9);
            let s = MatmulShape::new(&a_shape, &b_shape, &want.shape).unwrap();
            let (k, n) = (s.k, s.n);
            let count = b.numel() / (k * n).max(1);
            let panels = packed(b.as_f32().unwrap(), count, k, n);
            let mut first: Option<Vec<u32>> = None;
            for (isa, threads) in available().into_iter().flat_map(|i| [(i, 1), (i, 2), (i, 3)]) {
                let what = format!("{a_shape:?} @ {b_shape:?}, {} rows a tile, {threads} threads", isa.mr);
                let mut out = vec![f32::NAN; want.numel()];
                matmul_on(isa, a.as_f32().unwrap(), &panels, &mut out, &s, threads, &Bound::none());
                assert_close(&out, want.as_f32().unwrap(), &what);
                let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert!(first.get_or_insert_with(|| bits.clone()) == &bits, "{what}: bits differ from the first");
            }
        }
    }

    /// Every tile of every instruction set this CPU has computes each element as one chain
    /// of fused multiply-adds in k order (from zero, or from `c` when accumulating), leaving
    /// the columns of `c` past the strip alone: the same bits whichever kernel runs.
    #[test]
    fn tiles_are_one_fused_chain_per_element() {
        use crate::kernels::matmul_shape::testing::random;
        let (k, ldc) = (300, 40);
        let (a, p, c0) = (random(1, MR_MAX * k), random(2, k * NR), random(3, MR_MAX * ldc));
        for isa in available() {
            let cases = (1..=isa.mr).flat_map(|r| [(r, false), (r, true)]).flat_map(|c| [(c, true), (c, false)]);
            for ((rows, acc), packed) in cases {
                let mut c = c0.clone();
                let tile = if packed { isa.packed[rows - 1] } else { isa.strided[rows - 1] };
                // SAFETY: the buffers hold k columns of `rows` rows of a (packed, or rows of
                // stride k), k panel rows and `rows` rows of c (stride ldc).
                unsafe { tile(k, a.as_ptr(), k, p.as_ptr(), c.as_mut_ptr(), ldc, acc) };
                for (i, j) in (0..rows).flat_map(|i| (0..ldc).map(move |j| (i, j))) {
                    let want = if j >= NR {
                        c0[i * ldc + j]
                    } else {
                        let from = if acc { c0[i * ldc + j] } else { 0.0 };
                        (0..k).fold(from, |y, q| {
                            a[if packed { q * rows + i } else { i * k + q }].mul_add(p[q * NR + j], y)
                        })
                    };
                    let what =
                        format!("{} rows a tile, rows {rows}, accumulate {acc}, packed {packed}: c[{i}][{j}]", isa.mr);
                    assert_eq!(c[i * ldc + j].to_bits(), want.to_bits(), "{what}");
                }
            }
        }
    }

    #[test]
    fn packing_pads_the_last_strip_with_zeros() {
        let b: Vec<f32> = (0..2 * 3 * 33).map(|v| v as f32 + 1.0).collect();
        let p = packed(&b, 2, 3, 33);
        assert_eq!(p.len(), 2 * packed_len(3, 33));
        assert_eq!(packed_len(3, 33), 2 * 3 * NR);
        // Matrix 1, strip 1 (column 32 only), row 2: b[1][2][32].
        let at = packed_len(3, 33) + (3 + 2) * NR;
        assert_eq!(p[at], b[99 + 2 * 33 + 32]);
        assert!(p[at + 1..at + NR].iter().all(|&v| v == 0.0));
        assert_eq!(p[NR + 5], b[33 + 5], "matrix 0, strip 0, row 1, column 5");
        let mut back = vec![f32::NAN; b.len()];
        unpack(&p, 2, 3, 33, &mut back);
        assert_eq!(back, b, "unpack undoes the packing");
    }
}
