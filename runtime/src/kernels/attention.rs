//! Fused attention, the runner's `Library::Attention` (`LibraryCall for Attention`): `softmax(scores, -1) @ v` with
//! `scores = q @ kᵀ`, optionally scaled (multiplied or divided by one number) and then
//! masked (a tensor added, broadcast to the scores), without the scores ever reaching
//! memory. Per matrix of the batch and per block of `ROWS` query rows, the block's scores
//! are computed into a scratch block that stays in L1/L2, scaled, masked and exponentiated
//! in place row by row (the max subtracted first, as the interpreter's softmax does: a row
//! that is all −∞ gives NaN there and here, one of −1e9 a uniform distribution), then
//! multiplied by `v` straight into the result, and each result row divided by its row's sum.
//! The blocks are split over the pool's threads (`crate::kernels::pool::split`); each block is
//! computed by the same code whatever the split, so the thread count changes no bit.
//!
//! Both products run on one tile kernel (`MR` rows × up to 32 columns of `c` in registers
//! over the whole contraction, `a` and `b` row-major): AVX-512 or portable code, chosen at
//! run time; the row pass (scale, mask, max, exp, sum) is the same Rust code compiled once
//! for AVX-512 with FMA and once portable.

use std::sync::Arc;

use anyhow::{bail, Result};

use crate::format::mask::Mask;
use crate::format::program::{Attention, Buffer, Scale};
use crate::kernels::call::{f32_buffer, Kept, LibraryCall, Planned};
use crate::kernels::library::Threads;
use crate::kernels::matmul_shape::MatmulShape;
use crate::kernels::vmath::{horner, madd, EXP5, LN2_HI, LN2_LO, MAGIC};

/// Query rows per block: their scores (`ROWS` × S f32) are the scratch block, 16 KiB at
/// S = 128 and 128 KiB at `MAX_KEYS`, in L2 with the block's kᵀ and v while both products
/// pass over it.
const ROWS: usize = 32;

/// The most keys (the scores' last dim) compile fuses attention for: beyond, a block's
/// scores outgrow L2 (and a smaller block re-reads kᵀ and v for fewer rows), and the
/// separate steps stream the scores as well.
pub const MAX_KEYS: usize = 1024;

/// Rows of a tile: 8 × 2 AVX-512 accumulators, two loads of `b` and a broadcast fit the
/// 32 vector registers.
const MR: usize = 8;

/// Columns of a tile: two AVX-512 vectors of f32.
const NR: usize = 32;

/// An attention's shapes checked against each other: `q` `[.., T, D]`, `k` (kᵀ) `[.., D, S]`,
/// `v` `[.., S, Dv]` (batch dims broadcasting, numpy's matmul rules, each rank ≥ 2), the
/// result `out`, and the mask broadcasting to the scores `[.., T, S]` without growing them.
#[derive(Clone, Debug)]
pub struct Shapes {
    t: usize,
    d: usize,
    s: usize,
    dv: usize,
    /// Per matrix of the result: element offsets of its q, kᵀ, v, result and mask matrices.
    entries: Vec<Entry>,
    /// The mask's element strides along a row of scores and along its columns (0 where
    /// it is broadcast).
    mask_strides: (usize, usize),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    q: usize,
    k: usize,
    v: usize,
    out: usize,
    mask: usize,
}

impl Shapes {
    pub fn new(q: &[usize], k: &[usize], v: &[usize], out: &[usize], mask: Option<&[usize]>) -> Result<Shapes> {
        if q.len() < 2 || k.len() < 2 || v.len() < 2 {
            bail!("attention operands are matrices (rank >= 2): q {q:?}, kt {k:?}, v {v:?}");
        }
        let scores = MatmulShape::infer(q, k)?.1;
        let scores_plan = MatmulShape::unfolded(q, k, &scores)?;
        let plan = MatmulShape::unfolded(&scores, v, out)?;
        let (t, d, s, dv) = (scores_plan.m, scores_plan.k, plan.k, plan.n);
        let mask = mask.unwrap_or(&[]);
        meshc_ir::ops::check_epilogue_operand(mask, &scores).map_err(anyhow::Error::msg)?;
        // The mask's strides along each dim of the scores, right-aligned (0: broadcast).
        let mut strides = vec![0; scores.len()];
        let mut step = 1;
        for (i, &m) in mask.iter().enumerate().rev() {
            let at = scores.len() - mask.len() + i;
            strides[at] = if m == 1 { 0 } else { step };
            step *= m;
        }
        let rank = scores.len();
        let mask_strides = (strides[rank - 2], strides[rank - 1]);
        // Each scores matrix's mask offset, in the scores' (row-major) order.
        let batch = &scores[..rank - 2];
        let mut mask_at = vec![0usize];
        for (&n, &st) in batch.iter().zip(&strides) {
            mask_at = mask_at.iter().flat_map(|&o| (0..n).map(move |i| o + i * st)).collect();
        }
        let qk: Vec<(usize, usize, usize)> = scores_plan.batch_offsets().collect();
        let matrix = t * s;
        let entries = plan
            .batch_offsets()
            .map(|(so, vo, oo)| {
                let i = so.checked_div(matrix).unwrap_or(0);
                let (qo, ko) = qk.get(i).map_or((0, 0), |e| (e.0, e.1));
                Entry { q: qo, k: ko, v: vo, out: oo, mask: mask_at.get(i).copied().unwrap_or(0) }
            })
            .collect();
        Ok(Shapes { t, d, s, dv, entries, mask_strides })
    }

    /// Multiply-adds of the two products, for the thread count.
    pub fn macs(&self) -> usize {
        self.entries.len() * self.t * self.s * (self.d + self.dv)
    }
}

/// The row pass and tile kernels of one instruction set.
struct Isa {
    tiles: [Tile; MR],
    row: RowFn,
}

/// `c = a @ b` for `ROWS` ≤ `MR` rows (the table's index + 1) and `cols` ≤ `NR` columns over
/// a contraction of `k`: `a`, `b` and `c` row-major with row strides `lda`, `ldb`, `ldc`.
type Tile =
    unsafe fn(k: usize, a: *const f32, lda: usize, b: *const f32, ldb: usize, c: *mut f32, ldc: usize, cols: usize);

/// A row of scores exponentiated in place (minus its max), its first `keys` scaled and
/// masked first (the rest is padding); returns the sum of the exponentials.
type RowFn = fn(row: &mut [f32], keys: usize, scale: Option<(Scale, f32)>, mask: Option<(&[f32], usize)>) -> f32;

macro_rules! tiles {
    ($f:ident) => {
        [$f::<1>, $f::<2>, $f::<3>, $f::<4>, $f::<5>, $f::<6>, $f::<7>, $f::<8>]
    };
}

#[cfg(target_arch = "x86_64")]
const AVX512: Isa = Isa { tiles: tiles!(tile_avx512), row: row_avx512 };
#[cfg(target_arch = "x86_64")]
const AVX2: Isa = Isa { tiles: tiles!(tile_avx2), row: row_avx2 };
const PORTABLE: Isa = Isa { tiles: tiles!(tile_portable), row: row_pass::<false> };

/// The kernels of the ISA in use (`format::isa`).
fn isa() -> &'static Isa {
    match crate::format::isa::current() {
        #[cfg(target_arch = "x86_64")]
        crate::format::isa::Isa::Avx512 => &AVX512,
        #[cfg(target_arch = "x86_64")]
        crate::format::isa::Isa::Avx2 => &AVX2,
        _ => &PORTABLE,
    }
}

/// `out = softmax(scale(q @ k) + mask, -1) @ v` for `sh` on up to `threads` threads, `scale`
/// the step and its number, `mask` as `sh` was built with. The caller checked the slices'
/// lengths against the shapes.
pub fn attention(
    sh: &Shapes,
    (q, k, v): (&[f32], &[f32], &[f32]),
    scale: Option<(Scale, f32)>,
    mask: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) {
    attention_on(isa(), sh, (q, k, v), scale, mask, out, threads);
}

fn attention_on(
    isa: &Isa,
    sh: &Shapes,
    (q, k, v): (&[f32], &[f32], &[f32]),
    scale: Option<(Scale, f32)>,
    mask: Option<&[f32]>,
    out: &mut [f32],
    threads: usize,
) {
    let Shapes { t, d, s, dv, .. } = *sh;
    let (mask_row, mask_col) = sh.mask_strides;
    for e in &sh.entries {
        assert!(e.q + t * d <= q.len() && e.k + d * s <= k.len() && e.v + s * dv <= v.len());
        assert!(e.out + t * dv <= out.len());
        if let Some(m) = mask {
            assert!(t == 0 || s == 0 || e.mask + (t - 1) * mask_row + (s - 1) * mask_col < m.len());
        }
    }
    if s == 0 {
        // Softmax over no keys gives no weights: the product is empty, its sums 0.
        for e in &sh.entries {
            out[e.out..e.out + t * dv].fill(0.0);
        }
        return;
    }
    if t == 0 || dv == 0 {
        return;
    }
    let blocks = t.div_ceil(ROWS);
    let items = sh.entries.len() * blocks;
    let parts = if threads > 1 { items.min(crate::kernels::pool::PARTS_PER_THREAD * threads) } else { 1 };
    let o = out.as_mut_ptr() as usize;
    // A row of scores is padded to whole vectors with −∞ (whose exponentials are 0), so
    // the row pass has no scalar tail: at 13 keys the tail was all of it, and cost more
    // than both products.
    let sp = s.next_multiple_of(LANES);
    crate::kernels::pool::split(parts, &|p| {
        SCORES.with_borrow_mut(|scores| {
            scores.resize(ROWS * sp, 0.0);
            let mut sums = [0f32; ROWS];
            for item in items * p / parts..items * (p + 1) / parts {
                let (e, r0) = (&sh.entries[item / blocks], item % blocks * ROWS);
                let rows = ROWS.min(t - r0);
                let c = (o as *mut f32).wrapping_add(e.out + r0 * dv);
                let used = mask.map_or(s, |m| live_keys(m, e.mask + r0 * mask_row, (rows, s), (mask_row, mask_col)));
                let su = used.next_multiple_of(LANES);
                // SAFETY: the offsets address whole matrices inside the slices (asserted
                // above); the parts write disjoint row blocks of `out`.
                unsafe {
                    gemm(
                        isa,
                        (rows, d, used),
                        (q.as_ptr().add(e.q + r0 * d), d),
                        (k.as_ptr().add(e.k), s),
                        scores.as_mut_ptr(),
                        su,
                    );
                }
                for (i, sum) in sums[..rows].iter_mut().enumerate() {
                    let row_mask = mask.map(|m| (&m[e.mask + (r0 + i) * mask_row..], mask_col));
                    let row = &mut scores[i * su..(i + 1) * su];
                    row[used..].fill(f32::NEG_INFINITY);
                    *sum = (isa.row)(row, used, scale, row_mask);
                }
                // SAFETY: as above.
                unsafe {
                    gemm(isa, (rows, used, dv), (scores.as_ptr(), su), (v.as_ptr().add(e.v), dv), c, dv);
                    for (i, &sum) in sums[..rows].iter().enumerate() {
                        let row = std::slice::from_raw_parts_mut(c.add(i * dv), dv);
                        row.iter_mut().for_each(|x| *x /= sum);
                    }
                }
            }
        })
    });
}

/// A mask element at or below this hides its key: the score it is added to stays below
/// −9e29 for any score under 1e29, so its exponential, taken after the row's max is
/// subtracted, is exactly 0 whenever the row has a key not hidden. (Masks write −∞ or
/// f32::MIN, as transformers' do; −1e9 or −1e4 are not taken as hidden.)
const HIDDEN: f32 = -1e30;

/// How many leading keys a block of `rows` query rows (its mask from `at`, `strides` along
/// a row of scores and along its columns) reads: up to its last key some row does not hide,
/// when every row has one. Past it the exponentials are all exactly 0 and the products
/// add nothing, so the block skips those keys' kᵀ and v: a decode step whose cache holds
/// 1024 positions, of which the mask leaves the first `pos + 1`, reads only those. A row
/// that hides every key keeps all of them (its softmax is NaN, as the interpreter's).
fn live_keys(mask: &[f32], at: usize, (rows, s): (usize, usize), (row, col): (usize, usize)) -> usize {
    let mut used = 0;
    for r in 0..rows {
        let m = &mask[at + r * row..];
        match (0..s).rev().find(|&j| m[j * col] > HIDDEN) {
            Some(j) => used = used.max(j + 1),
            None => return s,
        }
    }
    used
}

thread_local! {
    /// A block's scores, kept between calls.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `c = a @ b` for `m` × `n` of `c` over a contraction of `k`, by tiles of `isa`.
///
/// # Safety
/// The pointers address row-major matrices of those shapes with those row strides.
unsafe fn gemm(
    isa: &Isa,
    (m, k, n): (usize, usize, usize),
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    c: *mut f32,
    ldc: usize,
) {
    for i in (0..m).step_by(MR) {
        let rows = MR.min(m - i);
        for j in (0..n).step_by(NR) {
            // SAFETY: rows i..i + rows and columns j..j + NR (at most n) lie inside.
            unsafe {
                isa.tiles[rows - 1](k, a.add(i * lda), lda, b.add(j), ldb, c.add(i * ldc + j), ldc, NR.min(n - j))
            }
        }
    }
}

/// The AVX-512 tile: the small-M GEMM's (`crate::kernels::small_m::tile`), two vectors a row, the
/// columns past `cols` masked off.
///
/// # Safety
/// As `Tile`; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx512<const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    // SAFETY: as the caller promises.
    unsafe { crate::kernels::small_m::tile::<R, f32>(k, (a, lda), (b, ldb), (c, ldc), cols) }
}

/// The AVX2 tile: the small-M GEMM's AVX2 tiles (`crate::kernels::small_m::tiles_avx2`), up to
/// 6 rows × 16 columns in registers each. (The portable tile compiled for AVX2 kept `R` × 32
/// accumulators, which spill from AVX2's 16 registers past 3 rows: 2-4x the AVX-512 time.)
///
/// # Safety
/// As `Tile`, on a CPU with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    // SAFETY: as the caller promises.
    unsafe { crate::kernels::small_m::tiles_avx2(R, k, (a, lda), (b, ldb), (c, ldc), cols) }
}

/// The portable tile.
///
/// # Safety
/// As `Tile`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tile_portable<const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    let mut acc = [[0f32; NR]; R];
    // SAFETY: rows i < R of a and c, k rows of b, `cols` columns.
    unsafe {
        for q in 0..k {
            let row = std::slice::from_raw_parts(b.add(q * ldb), cols);
            for (i, acc) in acc.iter_mut().enumerate() {
                let x = *a.add(i * lda + q);
                acc.iter_mut().zip(row).for_each(|(c, &y)| *c += x * y);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            std::ptr::copy_nonoverlapping(acc.as_ptr(), c.add(i * ldc), cols);
        }
    }
}

/// `row_pass` compiled for AVX-512 with FMA.
#[cfg(target_arch = "x86_64")]
fn row_avx512(row: &mut [f32], keys: usize, scale: Option<(Scale, f32)>, mask: Option<(&[f32], usize)>) -> f32 {
    #[target_feature(enable = "avx512f,fma")]
    fn run(row: &mut [f32], keys: usize, scale: Option<(Scale, f32)>, mask: Option<(&[f32], usize)>) -> f32 {
        row_pass::<true>(row, keys, scale, mask)
    }
    // SAFETY: `isa` hands this out only on a CPU with AVX-512F and FMA.
    unsafe { run(row, keys, scale, mask) }
}

/// `row_pass` compiled for AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
fn row_avx2(row: &mut [f32], keys: usize, scale: Option<(Scale, f32)>, mask: Option<(&[f32], usize)>) -> f32 {
    #[target_feature(enable = "avx2,fma")]
    fn run(row: &mut [f32], keys: usize, scale: Option<(Scale, f32)>, mask: Option<(&[f32], usize)>) -> f32 {
        row_pass::<true>(row, keys, scale, mask)
    }
    // SAFETY: `isa` hands this out only on a CPU with AVX2 and FMA.
    unsafe { run(row, keys, scale, mask) }
}

/// Lanes of the row pass's running max and sum: one AVX-512 vector.
const LANES: usize = 16;

/// The row pass (`RowFn`): the scale and the mask, then the max and the exponentials over
/// `LANES` independent lanes so that the loops vectorize.
#[inline(always)]
fn row_pass<const FMA: bool>(
    row: &mut [f32],
    keys: usize,
    scale: Option<(Scale, f32)>,
    mask: Option<(&[f32], usize)>,
) -> f32 {
    let scores = &mut row[..keys];
    match scale {
        None => masked(scores, |x| x, mask),
        Some((Scale::Mul, c)) => masked(scores, |x| x * c, mask),
        Some((Scale::Div, c)) => masked(scores, |x| x / c, mask),
    }
    exp_row::<FMA>(row)
}

/// Scales each score, then adds its mask element: `mask` from the row's first element, and
/// its stride along the row (0: one number for the row).
#[inline(always)]
fn masked(row: &mut [f32], scale: impl Fn(f32) -> f32, mask: Option<(&[f32], usize)>) {
    match mask {
        None => row.iter_mut().for_each(|x| *x = scale(*x)),
        Some((m, 0)) => row.iter_mut().for_each(|x| *x = scale(*x) + m[0]),
        Some((m, _)) => {
            let m = &m[..row.len()];
            row.iter_mut().zip(m).for_each(|(x, &y)| *x = scale(*x) + y)
        }
    }
}

/// Each element replaced by e^(x − the row's max); returns their sum.
#[inline(always)]
fn exp_row<const FMA: bool>(row: &mut [f32]) -> f32 {
    // A NaN score is left to the exponentials: it makes the sum, so the whole row, NaN, as
    // the interpreter's NaN max does.
    let max = |m: f32, x: f32| if x > m { x } else { m };
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let whole = row.len() / LANES * LANES;
    for chunk in row[..whole].chunks_exact(LANES) {
        for (l, &x) in chunk.iter().enumerate() {
            lanes[l] = max(lanes[l], x);
        }
    }
    let top = row[whole..].iter().copied().fold(across(lanes, max), max);
    let mut sums = [0f32; LANES];
    for chunk in row[..whole].chunks_exact_mut(LANES) {
        for (l, x) in chunk.iter_mut().enumerate() {
            *x = exp::<FMA>(*x - top);
            sums[l] += *x;
        }
    }
    let mut sum = across(sums, |a, b| a + b);
    for x in &mut row[whole..] {
        *x = exp::<FMA>(*x - top);
        sum += *x;
    }
    sum
}

/// `f` over the lanes, halving them pairwise: a chain of 15 dependent scalar steps took
/// as long as the rest of the pass over a row of 16 scores.
#[inline(always)]
fn across(mut lanes: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] = f(lanes[i], lanes[i + width]);
        }
        width /= 2;
    }
    lanes[0]
}

/// e^x for x ≤ 0 (a score minus its row's max) or NaN: 2^n · p(r) with x = n·ln2 + r,
/// |r| ≤ ln2/2 (`vmath::EXP5`, relative error 9.2e-8); 0 below −87, where e^x leaves the
/// normal floats (the interpreter's f64 value rounds to at most 1.6e-38 there, and it is
/// divided by a sum of at least 1); NaN stays NaN.
#[inline(always)]
fn exp<const FMA: bool>(x: f32) -> f32 {
    let xc = if x > 0.0 { 0.0 } else { x };
    let xc = if xc < -87.0 { -87.0 } else { xc };
    let magic = MAGIC + 127.0;
    let k = madd::<FMA>(xc, std::f32::consts::LOG2_E, magic);
    let n = -(k - magic);
    let r = if FMA {
        madd::<FMA>(n, std::f32::consts::LN_2, xc)
    } else {
        madd::<FMA>(n, LN2_LO, madd::<FMA>(n, LN2_HI, xc))
    };
    let e = horner::<FMA>(r, &EXP5) * f32::from_bits(k.to_bits() << 23);
    if x < -87.0 {
        0.0
    } else {
        e
    }
}

/// Fused attention of a program step: buffers result, q, kᵀ, v, then the scale's (one f32)
/// and the mask's, all f32.
impl LibraryCall for Attention {
    fn buffers(&self) -> usize {
        4 + usize::from(self.scale.is_some()) + usize::from(self.mask.is_some())
    }

    fn plan(&self, buffers: &[&Buffer], _: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let Attention { q, k, v, out, scale, mask } = self;
        let shapes = Shapes::new(q, k, v, out, mask.as_deref()).map_err(|e| e.to_string())?;
        let scale: Option<&[usize]> = scale.map(|_| &[1][..]);
        let operands = [&out[..], q, k, v].into_iter().chain(scale).chain(mask.as_deref());
        for (i, shape) in operands.enumerate() {
            f32_buffer(buffers, i, shape)?;
        }
        Ok(Box::new(AttentionPlan { call: self.clone(), shapes }))
    }
}

/// A fused attention as its load planned it.
struct AttentionPlan {
    call: Attention,
    shapes: Shapes,
}

impl Planned for AttentionPlan {
    unsafe fn call<'m>(
        &self,
        args: &[*mut u8],
        _mask: &dyn Fn(usize) -> Option<&'m Mask>,
        threads: usize,
    ) -> Result<()> {
        let (Attention { q, k, v, out, scale, mask }, sh) = (&self.call, &self.shapes);
        let len = |s: &[usize]| s.iter().product::<usize>();
        let f32s = |i: usize, n: usize| {
            // SAFETY: `plan` accepted buffer `i` as an aligned f32 tensor of `n` elements;
            // the result aliases no operand.
            unsafe { std::slice::from_raw_parts(args[i] as *const f32, n) }
        };
        let scale = scale.map(|how| (how, f32s(4, 1)[0]));
        let mask = mask.as_ref().map(|m| f32s(4 + usize::from(scale.is_some()), len(m)));
        // SAFETY: as above.
        let o = unsafe { std::slice::from_raw_parts_mut(args[0] as *mut f32, len(out)) };
        let threads = Threads::UpTo(threads).pick(sh.macs());
        attention(sh, (f32s(1, len(q)), f32s(2, len(k)), f32s(3, len(v))), scale, mask, o, threads);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exponential against f64's: relative error within a few ulps over the range it
    /// serves, exactly 0 below it, NaN for NaN.
    #[test]
    fn exp_is_accurate() {
        for fma in [false, true] {
            for i in 0..=87_000 {
                let x = -(i as f32) / 1000.0;
                let got = if fma { exp::<true>(x) } else { exp::<false>(x) } as f64;
                let want = (x as f64).exp();
                assert!(((got - want) / want).abs() < 4e-7, "exp({x}) = {got}, want {want}");
            }
            assert_eq!(exp::<false>(-88.0), 0.0);
            assert_eq!(exp::<true>(f32::NEG_INFINITY), 0.0);
            assert!(exp::<false>(f32::NAN).is_nan() && exp::<true>(f32::NAN).is_nan());
        }
    }

    /// Every instruction set's kernels this CPU runs give the same result as the portable
    /// ones, within rounding (FMA or not), over ragged shapes.
    #[test]
    fn kernels_agree() {
        use crate::format::isa::Isa as Level;
        let mut sets: Vec<&Isa> = vec![&PORTABLE];
        #[cfg(target_arch = "x86_64")]
        {
            if Level::detected() >= Level::Avx2 {
                sets.push(&AVX2);
            }
            if Level::detected() >= Level::Avx512 {
                sets.push(&AVX512);
            }
        }
        let (q, k, v) = (&[2, 37, 19][..], &[2, 19, 45][..], &[2, 45, 50][..]);
        let mut x = 1u32;
        let mut noise = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                    (x >> 8) as f32 / (1 << 24) as f32 - 0.5
                })
                .collect()
        };
        let (qd, kd, vd, md) = (noise(2 * 37 * 19), noise(2 * 19 * 45), noise(2 * 45 * 50), noise(37 * 45));
        let sh = Shapes::new(q, k, v, &[2, 37, 50], Some(&[37, 45])).unwrap();
        let outs: Vec<Vec<f32>> = sets
            .iter()
            .map(|isa| {
                let mut out = vec![0f32; 2 * 37 * 50];
                attention_on(isa, &sh, (&qd, &kd, &vd), Some((Scale::Div, 3.0)), Some(&md), &mut out, 2);
                out
            })
            .collect();
        for other in &outs[1..] {
            for (a, b) in outs[0].iter().zip(other) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }

    /// Keys a mask hides (−∞ or f32::MIN) past every row's last visible one are skipped,
    /// and the result is bit for bit that of the attention without them; a row hiding
    /// every key keeps them all (NaN, as the interpreter gives), and −1e9 hides nothing.
    #[test]
    fn hidden_trailing_keys_are_skipped_exactly() {
        let (t, d, s, dv, live) = (3, 8, 40, 6, 17);
        let wave = |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * f).sin()).collect() };
        let (q, k, v) = (wave(t * d, 0.37), wave(d * s, 0.11), wave(s * dv, 0.23));
        // The first `live` keys seen (row 1 sees only 9 of them), the rest hidden.
        let mut mask = vec![0f32; t * s];
        for (r, row) in mask.chunks_mut(s).enumerate() {
            for (j, m) in row.iter_mut().enumerate() {
                let seen = if r == 1 { 9 } else { live };
                *m = match (j >= seen, j % 2) {
                    (false, _) => 0.0,
                    (true, 0) => f32::NEG_INFINITY,
                    (true, _) => f32::MIN,
                };
            }
        }
        let run = |s: usize, k: &[f32], v: &[f32], mask: &[f32]| {
            let sh = Shapes::new(&[t, d], &[d, s], &[s, dv], &[t, dv], Some(&[t, s])).unwrap();
            let mut out = vec![0f32; t * dv];
            attention_on(isa(), &sh, (&q, k, v), Some((Scale::Mul, 0.5)), Some(mask), &mut out, 1);
            out
        };
        let cut_k: Vec<f32> = k.chunks(s).flat_map(|r| r[..live].to_vec()).collect();
        let cut_mask: Vec<f32> = mask.chunks(s).flat_map(|r| r[..live].to_vec()).collect();
        let want = run(live, &cut_k, &v[..live * dv], &cut_mask);
        let got = run(s, &k, &v, &mask);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(live_keys(&mask, 0, (t, s), (s, 1)), live);
        // Row 1 hiding everything: nothing is skipped; −1e9 hides nothing.
        let mut all = mask.clone();
        all[s..2 * s].fill(f32::NEG_INFINITY);
        assert_eq!(live_keys(&all, 0, (t, s), (s, 1)), s);
        assert!(run(s, &k, &v, &all)[dv..2 * dv].iter().all(|x| x.is_nan()));
        assert_eq!(live_keys(&vec![-1e9; t * s], 0, (t, s), (s, 1)), s);
    }
}
