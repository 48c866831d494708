//! The library GEMM path (docs/design.md §4.5): a matmul served by a high-performance
//! GEMM linked into the runner instead of generated code, with the same numpy semantics
//! as the Cranelift kernel (shared shape planning: `crate::kernels::matmul_shape::MatmulShape`), and
//! `prefer_library`, the default choice between the two paths.
//!
//! The library is the `gemm` crate, built with its AVX-512 kernels (`x86-v4`; chosen at run
//! time, so the runner still works on CPUs without AVX-512). Measured against
//! `matrixmultiply` 0.3 (which has AVX-512 kernels too) on the development machine (Xeon,
//! Sapphire Rapids class, 2 cores, shared with other jobs: best of 4–6 runs), GFLOP/s for
//! `[n,n] @ [n,n]`:
//!
//! ```text
//!           1 thread                 2 threads
//! n      gemm  matrixmultiply     gemm  matrixmultiply
//! 256    127         105          220         170
//! 512    125          99          227         190
//! 1024   119          98          226         182
//! 2048   122          90          241         186
//! ```
//!
//! (numpy 2.4 / OpenBLAS 0.3.31 `a @ b` on the same machine: ~120 on 1 thread, ~236 on 2 at
//! n = 2048.)
//!
//! A weight the compiler stored in panels (`crate::kernels::panels`: every f32, unpruned constant
//! that only library matmuls read) takes `matmul_panels`, whose own kernels read the
//! panels as they are: no run packs a weight. What stays here serves products of two run-time
//! values, pruned weights (`matmul_masked`) and half-precision ones (`matmul_half`).
//!
//! Products of at most `small_m::MAX_M` rows take `small_m` instead (with AVX2 or AVX-512): the
//! gemm crate's threads split blocks of rows, and a short product is a single block, so it
//! ran on one core however many it was given. Longer ones are split by rows, or by columns
//! when they have more (a convolution's; a batch of many matrices by matrices) over
//! `crate::kernels::pool`, each part a single-threaded gemm call.

use std::sync::Arc;

use anyhow::{bail, Result};
use meshc_ir::{DType, TensorType};

use crate::format::epilogue::{operands, Step};
use crate::format::mask::Mask;
use crate::format::program::{Buffer, Elem, Matmul, Storage, Transposed};
use crate::kernels::call::{f32_buffer, Kept, LibraryCall, Planned};
use crate::kernels::epilogue::{Bound, Epilogue};
use crate::kernels::matmul_shape::MatmulShape;
use crate::kernels::small_m;

/// Multiply-adds per matrix below which a second thread costs more than it saves (from
/// `cargo bench --bench gemm`: 128×128×128 runs in ~40 µs on 1 or 2 threads alike,
/// 4096×64×64 in 340 µs on 1 and 190 µs on 2).
const PARALLEL_MIN_MACS: usize = 1 << 22;

/// How many threads a library call runs on.
#[derive(Clone, Copy, Debug)]
pub enum Threads {
    /// Exactly this many (1: the calling thread only).
    Exactly(usize),
    /// As many as the work gains from (`PARALLEL_MIN_MACS`), up to this many.
    UpTo(usize),
}

impl Threads {
    /// The threads for a product of `macs` multiply-adds.
    pub fn pick(self, macs: usize) -> usize {
        match self {
            Threads::Exactly(n) => n.max(1),
            Threads::UpTo(n) if macs >= PARALLEL_MIN_MACS => n.max(1),
            Threads::UpTo(_) => 1,
        }
    }

    /// The threads for a small-M product (`small_m`) of `macs` multiply-adds: its fork is
    /// one rayon scope, cheaper than the general GEMM's.
    fn pick_small_m(self, macs: usize) -> usize {
        match self {
            Threads::Exactly(n) => n.max(1),
            Threads::UpTo(n) if macs >= SMALL_M_PARALLEL_MIN_MACS => n.max(1),
            Threads::UpTo(_) => 1,
        }
    }
}

/// Multiply-adds of a small-M product below which its second thread costs more than it
/// saves.
const SMALL_M_PARALLEL_MIN_MACS: usize = 1 << 18;

/// Rows of a part of a split general GEMM, at least (but for a product with fewer rows
/// than threads × this): fewer rows than the kernel's blocking waste its tiles.
const MIN_PART_ROWS: usize = 128;

/// Columns of a part of a general GEMM split by columns, at least (less `PART_COLS_ALIGN`): as
/// `MIN_PART_ROWS`, a part wide enough for the kernel's blocks; and wider than 64, where the
/// gemm crate takes another depth blocking for small products, which would round differently.
const MIN_PART_COLS: usize = 256;

/// Columns a part of a general GEMM split by columns starts at a multiple of: whole
/// vectors of the result (64 bytes) in every part.
const PART_COLS_ALIGN: usize = 16;

/// `out = a @ b` (numpy `matmul`, f32, batch dims broadcast) on `threads`, then `ep`
/// (`crate::kernels::epilogue`) on each block of the result as it is finished.
#[allow(clippy::too_many_arguments)]
pub fn matmul(a: &[f32], b: &[f32], out: &mut [f32], s: &MatmulShape, threads: Threads, ep: &Bound) -> Result<()> {
    check_lengths([a.len(), b.len(), out.len()], s.spans()?)?;
    if small_m::serves(s.m) {
        small_m::matmul(a, b, out, s, threads.pick_small_m(macs(s)), ep);
    } else {
        general(a, b, out, s, Transposed::default(), threads.pick(macs(s)), ep);
    }
    Ok(())
}

/// The multiply-adds of a product.
fn macs(s: &MatmulShape) -> usize {
    s.k.saturating_mul(s.m).saturating_mul(s.n).saturating_mul(s.batch_count())
}

/// `out = a @ b` (numpy `matmul`, f32) with `b` a weight stored in panels
/// (`crate::kernels::panels`: `panels::packed_len(k, n)` elements per matrix of `b`), on
/// `threads`: no packing at run time; then `ep` on each tile as it is finished.
pub fn matmul_panels(
    a: &[f32],
    panels: &[f32],
    out: &mut [f32],
    s: &MatmulShape,
    threads: Threads,
    ep: &Bound,
) -> Result<()> {
    let [a_len, b_len, out_len] = s.spans()?;
    check_lengths([a.len(), panels.len(), out.len()], [a_len, crate::kernels::panels::span(s, b_len)?, out_len])?;
    let macs = macs(s);
    let threads = if s.m <= crate::kernels::panels::SMALL_M { threads.pick_small_m(macs) } else { threads.pick(macs) };
    crate::kernels::panels::matmul(a, panels, out, s, threads, ep);
    Ok(())
}

/// `out = a @ b` (numpy `matmul`, f32) with `a` and/or `b` stored transposed (their last two
/// dims swapped), on `threads`, then `ep` on each block of rows: the gemm crate reads any
/// strides as it packs, so a transpose before a GEMM costs no pass over memory. `s` is
/// `MatmulShape::unfolded`: a matrix stored transposed has no consecutive rows to fold.
pub fn matmul_transposed(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    s: &MatmulShape,
    transposed: Transposed,
    threads: Threads,
    ep: &Bound,
) -> Result<()> {
    check_lengths([a.len(), b.len(), out.len()], s.spans()?)?;
    general(a, b, out, s, transposed, threads.pick(macs(s)), ep);
    Ok(())
}

/// `out = a @ b` for the plan `s` by the gemm crate on `threads` cores, `a` and `b` stored
/// as `transposed` says, then `ep` on each part's block; the caller checked the slices'
/// lengths against the shapes.
#[allow(clippy::too_many_arguments)]
fn general(a: &[f32], b: &[f32], out: &mut [f32], s: &MatmulShape, transposed: Transposed, threads: usize, ep: &Bound) {
    let (m, k, n) = (s.m, s.k, s.n);
    // (offset of row r, row stride, column stride) of each operand as stored.
    let a_at = |r: usize| if transposed.a { (r, 1, m) } else { (r * k, k, 1) };
    let (b_rs, b_cs) = if transposed.b { (1, k) } else { (n, 1) };
    let count = s.batch_count();
    for (ao, bo, oo) in s.batch_offsets() {
        assert!(ao + m * k <= a.len() && bo + k * n <= b.len() && oo + m * n <= out.len());
    }
    // The cores split every matrix (by rows or by columns, below), each part running the
    // GEMM on its block on the pool (`crate::kernels::pool`, whose fork/join costs no system
    // call). (The gemm crate's own threading splits blocks of rows, but not fewer than its
    // block, so a short product ran on one core whatever it was given.)
    //
    // A batch of at least as many matrices as parts is split by matrices instead, each
    // computed whole by one call: split by rows, attention's 32·12 products of 128 rows
    // were two calls each, each packing its own `b` and paying the call's dispatch.
    let (a, b, c) = (a.as_ptr() as usize, b.as_ptr() as usize, out.as_mut_ptr() as usize);
    let wanted = crate::kernels::pool::PARTS_PER_THREAD * threads;
    if threads > 1 && count >= wanted {
        crate::kernels::pool::split(wanted, &|p| {
            for (ao, bo, oo) in (count * p / wanted..count * (p + 1) / wanted).map(|i| s.batch_offset(i)) {
                // SAFETY: whole matrices inside the slices (asserted above), `c` aliases
                // neither operand, and the parts write disjoint matrices.
                unsafe {
                    let (_, a_rs, a_cs) = a_at(0);
                    let (a, b, c) = ((a as *const f32).add(ao), (b as *const f32).add(bo), (c as *mut f32).add(oo));
                    gemm_strided((m, n, k), (c, n), (a, a_rs, a_cs), (b, b_rs, b_cs), false, gemm::Parallelism::None);
                    ep.apply(c, n, (oo / n.max(1), m), 0..n);
                }
            }
        });
        return;
    }
    // Split by rows, a part packs all of `b` for itself (k·n against the
    // (≥ MIN_PART_ROWS)·k·n multiply-adds of its rows) and every part streams it from
    // memory; split by columns, a part packs only its columns of `b`, and it is the smaller
    // `a` that every part reads whole. So a product of fewer rows than columns (a
    // convolution: out channels × the positions of its image) splits by columns, each part
    // keeping every row so the kernel's tiles stay full. Part boundaries fall on multiples
    // of `PART_COLS_ALIGN`, which keeps the gemm crate's vector tail of a one-row product
    // on the same columns. An element's contraction runs over all of `k` in one call, and
    // the crate blocks `k` by `k` alone once both sides of a part exceed 64 (its small-size
    // path blocks it otherwise), which parts of at least two rows and `MIN_PART_COLS`
    // columns do. A one-row part narrow enough (with `b` transposed, the crate's product of
    // at most 256 elements) takes another path than the whole row does, so one row splits
    // by rows, that is not at all. A row split can still give parts of at most 64 rows of a
    // product of at most 64 columns, whose bits then differ from one thread's.
    let by_columns = threads > 1 && m >= 2 && m < n && n >= threads * MIN_PART_COLS;
    let parts = match (threads > 1, by_columns) {
        (false, _) => 1,
        (true, false) => wanted.min(m / MIN_PART_ROWS).max(threads).min(m.max(1)),
        (true, true) => wanted.min(n / MIN_PART_COLS),
    };
    let col = |p: usize| if p == parts { n } else { n * p / parts / PART_COLS_ALIGN * PART_COLS_ALIGN };
    crate::kernels::pool::split(parts, &|p| {
        let ((r0, r1), (c0, c1)) =
            if by_columns { ((0, m), (col(p), col(p + 1))) } else { ((m * p / parts, m * (p + 1) / parts), (0, n)) };
        if r0 == r1 || c0 == c1 {
            return;
        }
        for (ao, bo, oo) in s.batch_offsets() {
            // SAFETY: rows r0..r1 × columns c0..c1 of whole matrices inside the slices
            // (asserted above), `c` aliases neither operand, and the parts write disjoint
            // blocks.
            unsafe {
                let (a_off, a_rs, a_cs) = a_at(r0);
                let a = (a as *const f32).add(ao + a_off);
                let b = (b as *const f32).add(bo + c0 * b_cs);
                let row = (c as *mut f32).add(oo + r0 * n);
                let (rows, cols) = (r1 - r0, c1 - c0);
                gemm_strided(
                    (rows, cols, k),
                    (row.add(c0), n),
                    (a, a_rs, a_cs),
                    (b, b_rs, b_cs),
                    false,
                    gemm::Parallelism::None,
                );
                ep.apply(row, n, (oo / n.max(1) + r0, rows), c0..c1);
            }
        }
    });
}

/// `c = a @ b`, or `c += a @ b` with `accumulate`, for row-major matrices given by their
/// first element and row stride: `c` m×n, `a` m×k, `b` k×n.
///
/// # Safety
/// The pointers must address matrices of those shapes and strides, and `c` must alias
/// neither `a` nor `b`.
unsafe fn gemm_rows(
    mnk: (usize, usize, usize),
    c: (*mut f32, usize),
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: as the caller promises.
    unsafe { gemm_strided(mnk, c, (a, lda, 1), (b, ldb, 1), accumulate, parallelism) }
}

/// `gemm_rows` with `a` and `b` given as (first element, row stride, column stride).
///
/// # Safety
/// As `gemm_rows`.
unsafe fn gemm_strided(
    (m, n, k): (usize, usize, usize),
    (c, ldc): (*mut f32, usize),
    (a, a_rs, a_cs): (*const f32, usize, usize),
    (b, b_rs, b_cs): (*const f32, usize, usize),
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    // SAFETY: as the caller promises; gemm reads `c` only when it accumulates.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a,
            a_cs as isize,
            a_rs as isize,
            b,
            b_cs as isize,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Rows of a half-precision `b` widened at a time: 256 rows of a 4096-wide weight are a
/// 4 MiB f32 block, which the GEMM then packs as it would any f32 operand.
const HALF_ROWS: usize = 256;

thread_local! {
    /// The widened block of `matmul_half`, kept between calls (a fresh one each call
    /// would be page-faulted in each time).
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `matmul` with `b` stored as f16 or bf16 bits (`Elem`). A product of few rows is the
/// small-M GEMM's, which widens `b` in registers (`small_m::serves_half`); otherwise
/// `HALF_ROWS` rows of b at a time are widened (exactly) into an f32 block and their
/// product is accumulated into the result, so a half weight costs a conversion per block,
/// never a whole f32 copy; then `ep` on each matrix.
pub fn matmul_half(
    a: &[f32],
    (b, elem): (&[u16], Elem),
    out: &mut [f32],
    s: &MatmulShape,
    threads: Threads,
    ep: &Bound,
) -> Result<()> {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    check_lengths([a.len(), b.len(), out.len()], s.spans()?)?;
    if s.m == 0 || s.n == 0 {
        return Ok(());
    }
    if small_m::serves_half(s.m, elem) {
        small_m::matmul_half(a, (b, elem, small_m::Stored::RowMajor), out, s, threads.pick_small_m(macs(s)), ep);
        return Ok(());
    }
    let threads = threads.pick(macs(s));
    let parallelism = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    let (m, k, n) = (s.m, s.k, s.n);
    WIDENED.with_borrow_mut(|block| {
        block.resize(HALF_ROWS.min(k) * n, 0.0);
        for (ao, bo, oo) in s.batch_offsets() {
            let c = &mut out[oo..oo + m * n];
            if k == 0 {
                c.fill(0.0);
            }
            for k0 in (0..k).step_by(HALF_ROWS) {
                let rows = HALF_ROWS.min(k - k0);
                let bits = &b[bo + k0 * n..bo + (k0 + rows) * n];
                let wide = &mut block[..rows * n];
                match elem {
                    Elem::F16 => bits.reinterpret_cast::<half::f16>().convert_to_f32_slice(wide),
                    Elem::Bf16 => bits.reinterpret_cast::<half::bf16>().convert_to_f32_slice(wide),
                    Elem::F32 => unreachable!("f32 operands take `matmul`"),
                }
                // SAFETY: `c` is the m×n result, `a[ao + k0..]` with row stride k holds the
                // m×rows columns of a this block multiplies, `wide` the rows×n block; `c`
                // aliases neither.
                unsafe {
                    let a = a[ao + k0..].as_ptr();
                    gemm_rows((m, n, rows), (c.as_mut_ptr(), n), (a, k), (wide.as_ptr(), n), k0 > 0, parallelism);
                }
            }
            // SAFETY: `c` is the m×n matrix at row oo / n of the result.
            unsafe { ep.apply(c.as_mut_ptr(), n, (oo / n, m), 0..n) };
        }
    });
    Ok(())
}

/// Checks that each slice holds the elements the product reaches (`MatmulShape::spans`).
fn check_lengths(lens: [usize; 3], spans: [usize; 3]) -> Result<()> {
    for ((what, len), span) in ["operand a", "operand b", "result"].into_iter().zip(lens).zip(spans) {
        if len < span {
            bail!("matmul: {what} has {len} elements, fewer than the {span} the product reaches");
        }
    }
    Ok(())
}

/// `matmul` with `b` pruned by `mask` (conditional execution, docs/design.md §4.3): the result is
/// zeroed, then one GEMM runs per (kept column run, kept row run) of the mask on strided
/// views of the operands, so pruned columns and rows of `b` cost nothing. `threads` are
/// picked for the work the mask leaves. Threads split the rows of the result (each runs
/// every pair on its rows) over the runner's pool (`crate::kernels::pool`; it spawned a scoped
/// thread per part before, tens of µs per call): one fork per matrix instead of one per
/// GEMM call, which matters with many short runs. Then `ep` on each part's rows.
pub fn matmul_masked(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    s: &MatmulShape,
    mask: &Mask,
    threads: Threads,
    ep: &Bound,
) -> Result<()> {
    check_lengths([a.len(), b.len(), out.len()], s.spans()?)?;
    let (m, k, n) = (s.m, s.k, s.n);
    if (mask.rows, mask.cols) != (k, n) {
        bail!("matmul: a mask of {}x{} matrices on an operand b of {k}x{n} matrices", mask.rows, mask.cols);
    }
    let threads = threads.pick(((m * k * n) as f64 * mask.kept_fraction()) as usize);
    out.fill(0.0);
    if m == 0 || n == 0 {
        return Ok(());
    }
    let rows_per = m.div_ceil(threads.max(1));
    let parts = m.div_ceil(rows_per);
    // The result as an address: the parts share it, each writing only its own rows.
    let c = out.as_mut_ptr() as usize;
    for (ao, bo, oo) in s.batch_offsets() {
        assert!(ao + m * k <= a.len() && bo + k * n <= b.len() && oo + m * n <= out.len());
        let b = &b[bo..bo + k * n];
        crate::kernels::pool::split(parts, &|t| {
            let (r0, r1) = (t * rows_per, m.min((t + 1) * rows_per));
            // SAFETY: rows r0..r1 of this matrix of the result (inside `out`, asserted
            // above), written by this part alone.
            let c = unsafe { std::slice::from_raw_parts_mut((c as *mut f32).add(oo + r0 * n), (r1 - r0) * n) };
            masked_rows(&a[ao + r0 * k..ao + r1 * k], b, c, (k, n), mask);
            // SAFETY: `c` holds these rows of the result, this part's alone.
            unsafe { ep.apply(c.as_mut_ptr(), n, (oo / n + r0, r1 - r0), 0..n) };
        });
    }
    Ok(())
}

/// `c = a @ b` on the kept runs of `mask`, on the calling thread: `a` holds whole rows of
/// `k`, `c` the same number of whole rows of `n`, `b` the `k × n` matrix; `c` is zero.
fn masked_rows(a: &[f32], b: &[f32], c: &mut [f32], (k, n): (usize, usize), mask: &Mask) {
    let m = c.len() / n;
    for &(c0, cols) in &mask.col_runs {
        for (r, &(k0, depth)) in mask.row_runs.iter().enumerate() {
            // The runs lie inside the k×n matrix (checked by the caller and `Mask::decode`).
            assert!(c0 + cols <= n && k0 + depth <= k && a.len() == m * k && b.len() == k * n);
            // SAFETY: the views at these offsets, with these strides, are the m×depth,
            // depth×cols and m×cols sub-matrices of `a`, `b` and `c` (bounds asserted
            // above), and `c` does not alias `a` or `b`.
            unsafe {
                let (c, a, b) = (c.as_mut_ptr().add(c0), a.as_ptr().add(k0), b.as_ptr().add(k0 * n + c0));
                gemm_rows((m, cols, depth), (c, n), (a, k), (b, n), r > 0, gemm::Parallelism::None);
            }
        }
    }
}

/// Multiply-adds per matrix up to which the generated kernel beats the library: there the
/// library's per-call dispatch (~0.5 µs) costs more than the whole product.
const KERNEL_MAX_MACS: usize = 12 * 12 * 12;

/// Whether a matmul of these operands should be served by the library rather than by the
/// generated kernel: the faster path for the shape. From `cargo bench --bench gemm`
/// (µs per call, kernel vs library on 1 thread): 8×8×8 0.32 vs 0.60, 12×12×12 0.33 vs 0.57,
/// 8×16×16 0.69 vs 0.32, 16×16×16 0.91 vs 0.39, 64×64×64 21 vs 4.6, 1×1024×1024 1540 vs
/// 178, 4096×64×64 1220 vs 260; 1024³ 27–35 GFLOP/s vs 112–123. So the library wins on
/// every shape but the tiniest: by ~4× on big squares (AVX-512 against 128-bit vectors) and
/// by up to 30× on skinny ones (a side below 12 wastes most of the kernel's 12×4 tiles).
pub fn prefer_library(a: &TensorType, b: &TensorType) -> bool {
    let f32s = a.dtype == DType::F32 && b.dtype == DType::F32;
    let macs = |s: MatmulShape| s.m.checked_mul(s.k).and_then(|x| x.checked_mul(s.n));
    f32s && MatmulShape::infer(&a.shape, &b.shape).is_ok_and(|(s, _)| macs(s).is_none_or(|x| x > KERNEL_MAX_MACS))
}

/// The library matmul of a program step: buffers result, `a`, `b`, then the epilogue's
/// operands; `b` row-major as `b_elem` (pruned if it has a mask), f32 in panels, or either
/// operand stored transposed.
impl LibraryCall for Matmul {
    fn buffers(&self) -> usize {
        3 + operands(&self.epilogue).count()
    }

    fn plan(&self, buffers: &[&Buffer], kept: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let Matmul { a, b, out, b_elem, panels, epilogue, transposed } = self;
        let shape = match transposed.is_none() {
            true => MatmulShape::new(a, b, out),
            false => MatmulShape::unfolded(a, b, out),
        }
        .map_err(|e| e.to_string())?;
        check_epilogue(epilogue, false, (a, b, out), buffers, 3)?;
        let b_panels = [crate::kernels::panels::packed_elems(b).unwrap_or(usize::MAX)];
        let b_stored = if *panels { &b_panels[..] } else { b };
        let mut lens = [0; 3];
        for (i, s, elem) in [(0, &out[..], Elem::F32), (1, a, Elem::F32), (2, b_stored, *b_elem)] {
            let bytes = buffers[i].bytes;
            let need = s.iter().try_fold(elem.size(), |n, &d| n.checked_mul(d));
            match need {
                Some(n) if bytes >= n => lens[i] = n / elem.size(),
                _ => return Err(format!("buffer {i} holds {bytes} bytes, too few for {elem:?}{s:?}")),
            }
            // The library reads its operands as slices of their element type.
            let Some(offset) = buffers[i].storage.offset() else {
                return Err(format!("buffer {i} is the size table"));
            };
            if !offset.is_multiple_of(elem.size()) {
                return Err(format!("buffer {i} at offset {offset} is not aligned for {elem:?}"));
            }
        }
        let pruned = buffers[2].mask.is_some();
        if !b_elem.is_f32() && pruned {
            return Err("a pruned weight is f32, not a half type".to_string());
        }
        if *panels && pruned {
            return Err("weights in panels are unpruned".to_string());
        }
        // Their copies out of the panels are kept (`Unpacked`): no step may write them.
        if *panels && !matches!(buffers[2].storage, Storage::Weights { .. }) {
            return Err("weights in panels lie in the artifact's weights".to_string());
        }
        if pruned && (b.len() < 2 || !matches!(buffers[2].storage, Storage::Weights { .. })) {
            return Err("a pruned operand b is a weight matrix".to_string());
        }
        let matrices = (!transposed.a || a.len() >= 2) && (!transposed.b || b.len() >= 2);
        if !transposed.is_none() && (*panels || !b_elem.is_f32() || pruned || !matrices) {
            return Err("only f32 matrices that are not weights are stored transposed".to_string());
        }
        let path = match (*panels, pruned, *b_elem) {
            // A half weight in panels, for a product of few rows (the small-M GEMM's).
            (true, _, half @ (Elem::Bf16 | Elem::F16)) if b.len() >= 2 => {
                let (k, n) = (b[b.len() - 2], b[b.len() - 1]);
                Path::HalfPanels { elem: half, dims: (b[..b.len() - 2].iter().product(), k, n), kept: kept.clone() }
            }
            (true, _, Elem::Bf16 | Elem::F16) => return Err("half weights in panels are matrices".to_string()),
            // A weight in panels for a program over symbolic rows, at many rows.
            (true, ..) if shape.m >= UNPACK_M && b.len() >= 2 => {
                let (k, n) = (b[b.len() - 2], b[b.len() - 1]);
                Path::Unpacked { dims: (b[..b.len() - 2].iter().product(), k, n), kept: kept.clone() }
            }
            (true, ..) => Path::Panels,
            (_, true, _) => Path::Masked,
            (_, _, Elem::F32) if transposed.is_none() => Path::Plain,
            (_, _, Elem::F32) => Path::Transposed(*transposed),
            (_, _, half) => Path::Half(half),
        };
        let [out, a, b] = lens;
        Ok(Box::new(MatmulPlan { shape, path, epilogue: Epilogue::new(epilogue, &self.out), lens: (a, b, out) }))
    }
}

/// Rows from which a product with a weight in panels copies the weight out row-major and
/// runs `matmul`: the rows from which a static program keeps its weights row-major
/// (`panels::SMALL_M`). Only a program over symbolic dims has such products. The copy is
/// made once for the step (`Kept`), so only the kernels' speed decides: at 256 rows the
/// panels' kernels took ~14% more samples than the row-major GEMM (MiniLM-L3 at 4×64), at
/// 1024 ~10% more. A weight then lives twice, in panels and row-major, once a call has
/// had that many rows.
const UNPACK_M: usize = crate::kernels::panels::SMALL_M + 1;

/// Checks the epilogue of a matmul of `integer` operands `a` × `b` → `out` (its steps'
/// order, and each operand's buffer, from buffer `first` on).
pub(crate) fn check_epilogue(
    steps: &[Step],
    integer: bool,
    (a, b, out): (&[usize], &[usize], &[usize]),
    buffers: &[&Buffer],
    first: usize,
) -> Result<(), String> {
    meshc_ir::ops::check_epilogue_conversion(steps.iter().map(Step::name), integer)?;
    if !steps.is_empty() && (a.len() < 2 || b.len() < 2) {
        return Err("an epilogue follows a product of matrices".to_string());
    }
    for (i, shape) in (first..).zip(operands(steps)) {
        meshc_ir::ops::check_epilogue_operand(shape, out)?;
        f32_buffer(buffers, i, shape)?;
    }
    Ok(())
}

/// Which GEMM serves a planned matmul.
enum Path {
    /// `matmul_panels`.
    Panels,
    /// `matmul`, on the weight's `(count, k, n)` panels copied out row-major, once for the
    /// step (`Kept`). (Copied on every call, the copy took ~5% of MiniLM-L3's samples at
    /// 8×128, on one thread while the other waited; kept per shape, a session serving many
    /// shapes would hold a copy of each weight per shape.)
    Unpacked { dims: (usize, usize, usize), kept: Arc<Kept> },
    /// `matmul_masked`, with the mask of operand b.
    Masked,
    /// `matmul`.
    Plain,
    /// `matmul_transposed`.
    Transposed(Transposed),
    /// `matmul_half`, b stored as this half type.
    Half(Elem),
    /// The small-M GEMM on b stored as this half type in `(count, k, n)` panels; where it
    /// does not serve the call (an ISA below AVX2, f16 below AVX-512), `matmul_half` on b
    /// copied out row-major, once for the step (`Kept`).
    HalfPanels { elem: Elem, dims: (usize, usize, usize), kept: Arc<Kept> },
}

/// A library matmul as its load planned it: the loop nest, the GEMM, the prepared
/// epilogue, and the elements of a, b (as stored) and the result.
struct MatmulPlan {
    shape: MatmulShape,
    path: Path,
    epilogue: Epilogue,
    lens: (usize, usize, usize),
}

impl Planned for MatmulPlan {
    unsafe fn call<'m>(
        &self,
        args: &[*mut u8],
        mask: &dyn Fn(usize) -> Option<&'m Mask>,
        threads: usize,
    ) -> Result<()> {
        let threads = Threads::UpTo(threads);
        let (s, (a_len, b_len, out_len)) = (&self.shape, self.lens);
        // SAFETY: `plan` accepted each epilogue operand's buffer for its shape and that
        // shape against the result; the buffers outlive the call.
        let ep = unsafe { self.epilogue.bind(&args[3..]) };
        // SAFETY (every slice below): the buffers hold at least these elements (f32; `b` as
        // its stored type), as `plan` accepted, and the result aliases no operand.
        let (o, x) = unsafe {
            (
                std::slice::from_raw_parts_mut(args[0] as *mut f32, out_len),
                std::slice::from_raw_parts(args[1] as *const f32, a_len),
            )
        };
        // SAFETY: as above, for a `b` stored as f32.
        let f32s = || unsafe { std::slice::from_raw_parts(args[2] as *const f32, b_len) };
        match &self.path {
            Path::Panels => matmul_panels(x, f32s(), o, s, threads, &ep),
            Path::Unpacked { dims, kept } => kept.f32s.with(f32s(), *dims, |rows| matmul(x, rows, o, s, threads, &ep)),
            Path::Masked => match mask(2) {
                Some(m) => matmul_masked(x, f32s(), o, s, m, threads, &ep),
                None => bail!("matmul: the mask of pruned operand b is missing"),
            },
            Path::Plain => matmul(x, f32s(), o, s, threads, &ep),
            Path::Transposed(t) => matmul_transposed(x, f32s(), o, s, *t, threads, &ep),
            Path::Half(half) => {
                // SAFETY: as above, for a `b` stored as 16-bit halves.
                let y = unsafe { std::slice::from_raw_parts(args[2] as *const u16, b_len) };
                matmul_half(x, (y, *half), o, s, threads, &ep)
            }
            Path::HalfPanels { elem, dims, kept } => {
                // SAFETY: as above, for a `b` stored as 16-bit halves in panels.
                let y = unsafe { std::slice::from_raw_parts(args[2] as *const u16, b_len) };
                let [a_len, b_len, out_len] = s.spans()?;
                check_lengths([x.len(), y.len(), o.len()], [a_len, crate::kernels::panels::span(s, b_len)?, out_len])?;
                if small_m::serves_half(s.m, *elem) {
                    let t = threads.pick_small_m(macs(s));
                    small_m::matmul_half(x, (y, *elem, small_m::Stored::Panels), o, s, t, &ep);
                    return Ok(());
                }
                kept.halves.with(y, *dims, |rows| matmul_half(x, (rows, *elem), o, s, threads, &ep))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul_shape::testing::{assert_close, oracle};

    /// `matmul` (which picks the path) and the general GEMM path itself (which the small-M
    /// path takes most of these shapes from; `small_m` has its own tests), on 1 to 3 threads.
    fn check(a_shape: &[usize], b_shape: &[usize]) {
        let (a, b, want) = oracle(a_shape, b_shape, 11);
        let (x, y) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let s = MatmulShape::new(a_shape, b_shape, &want.shape).unwrap();
        for threads in [1, 2, 3] {
            let what = format!("{a_shape:?} @ {b_shape:?}, {threads} threads");
            let mut out = vec![f32::NAN; want.numel()];
            matmul(x, y, &mut out, &s, Threads::Exactly(threads), &Bound::none()).unwrap();
            assert_close(&out, want.as_f32().unwrap(), &what);
            let mut out = vec![f32::NAN; want.numel()];
            general(x, y, &mut out, &s, Transposed::default(), threads, &Bound::none());
            assert_close(&out, want.as_f32().unwrap(), &format!("{what}, general path"));
        }
    }

    /// Operands stored transposed (their last two dims swapped, as a folded `transpose`
    /// leaves them) give the product of the operands themselves: a, b or both, batched and
    /// broadcast, row counts the pool splits and does not, empty dims, 1 to 3 threads.
    #[test]
    fn transposed_operands_give_the_product_of_the_operands() {
        let swap = |x: &[f32], shape: &[usize]| -> Vec<f32> {
            let (r, c) = (shape[shape.len() - 2], shape[shape.len() - 1]);
            let mut t = vec![0.0; x.len()];
            for (src, dst) in x.chunks((r * c).max(1)).zip(t.chunks_mut((r * c).max(1))) {
                for i in 0..r {
                    for j in 0..c {
                        dst[j * r + i] = src[i * c + j];
                    }
                }
            }
            t
        };
        let shapes: [(&[usize], &[usize]); 7] = [
            (&[5, 7], &[7, 3]),
            (&[300, 70], &[70, 260]),
            (&[2, 3, 40], &[40, 9]),
            (&[3, 1, 6, 5], &[2, 5, 4]),
            // Enough matrices that 2 or 3 threads split the batch, not the rows.
            (&[24, 9, 7], &[24, 7, 5]),
            (&[4, 0], &[0, 6]),
            (&[0, 5], &[5, 2]),
        ];
        for (a_shape, b_shape) in shapes {
            let (a, b, want) = oracle(a_shape, b_shape, 7);
            let (x, y) = (a.as_f32().unwrap(), b.as_f32().unwrap());
            for (ta, tb) in [(true, false), (false, true), (true, true)] {
                let xs = if ta { swap(x, a_shape) } else { x.to_vec() };
                let ys = if tb { swap(y, b_shape) } else { y.to_vec() };
                for threads in [1, 2, 3] {
                    let what = format!("{a_shape:?}{ta} @ {b_shape:?}{tb}, {threads} threads");
                    let mut out = vec![f32::NAN; want.numel()];
                    let t = Transposed { a: ta, b: tb };
                    let (th, ep) = (Threads::Exactly(threads), &Bound::none());
                    let s = MatmulShape::unfolded(a_shape, b_shape, &want.shape).unwrap();
                    matmul_transposed(&xs, &ys, &mut out, &s, t, th, ep).unwrap();
                    assert_close(&out, want.as_f32().unwrap(), &what);
                }
            }
        }
    }

    /// The thread count does not change a bit of the result (README: `--threads`): every
    /// row or column block of a split general GEMM, and every strip of a small-M one, is
    /// computed as alone. Convolution shapes (few rows, many columns, deep: the general
    /// path split by columns, its depth blocked) through `matmul` and through the general
    /// path itself, which `matmul` keeps from the short ones; each against the oracle.
    /// One row against a transposed `b` of a few strips more than threads × 256 columns: a
    /// column split would give parts the gemm crate computes another way than the row.
    #[test]
    fn one_row_of_a_transposed_product_keeps_its_bits_on_any_threads() {
        let (k, n) = (4096, 1040);
        let (a, b, want) = oracle(&[1, k], &[k, n], 3);
        let y = b.as_f32().unwrap();
        let yt: Vec<f32> = (0..n * k).map(|i| y[(i % k) * n + i / k]).collect();
        let s = MatmulShape::unfolded(&[1, k], &[k, n], &want.shape).unwrap();
        let run = |threads| {
            let mut out = vec![f32::NAN; n];
            let t = Transposed { a: false, b: true };
            matmul_transposed(a.as_f32().unwrap(), &yt, &mut out, &s, t, Threads::Exactly(threads), &Bound::none())
                .unwrap();
            assert_close(&out, want.as_f32().unwrap(), &format!("{threads} threads"));
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let one = run(1);
        for threads in 2..=4 {
            assert!(run(threads) == one, "{threads} threads differ from 1");
        }
    }

    #[test]
    fn threads_do_not_change_the_bits() {
        let shapes: [(&[usize], &[usize]); 7] = [
            (&[700, 300], &[300, 70]),
            (&[2, 13, 384], &[384, 100]),
            (&[3, 4, 70, 8], &[3, 4, 8, 90]),
            (&[32, 288], &[288, 6400]),
            (&[16, 144], &[144, 25600]),
            (&[96, 576], &[576, 1600]),
            (&[1, 600], &[600, 1000]),
        ];
        for (a_shape, b_shape) in shapes {
            let (a, b, want) = oracle(a_shape, b_shape, 5);
            let (x, y) = (a.as_f32().unwrap(), b.as_f32().unwrap());
            let s = MatmulShape::new(a_shape, b_shape, &want.shape).unwrap();
            let run = |threads, general_path: bool| {
                let mut out = vec![f32::NAN; want.numel()];
                if general_path {
                    general(x, y, &mut out, &s, Transposed::default(), threads, &Bound::none());
                } else {
                    matmul(x, y, &mut out, &s, Threads::Exactly(threads), &Bound::none()).unwrap();
                }
                assert_close(&out, want.as_f32().unwrap(), &format!("{a_shape:?} @ {b_shape:?}, {threads} threads"));
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            for general_path in [false, true] {
                let one = run(1, general_path);
                for threads in [2, 3] {
                    let what = format!("{a_shape:?} @ {b_shape:?} (general path: {general_path})");
                    assert!(run(threads, general_path) == one, "{what}: {threads} threads differ from 1");
                }
            }
        }
    }

    /// A weight stored as f16 or bf16, widened a block of rows at a time, gives the f32
    /// product with the rounded weight: one block, several (the last partial), batches,
    /// broadcast, and empty shapes.
    #[test]
    fn half_weights_match_the_product_of_their_f32_values() {
        use meshc_ir::{DType, Data, Tensor};
        let shapes: [(&[usize], &[usize]); 6] = [
            (&[5, 7], &[7, 3]),
            (&[9, 600], &[600, 33]),
            (&[2, 3, 300], &[300, 4]),
            (&[4, 0], &[0, 6]),
            (&[0, 5], &[5, 2]),
            (&[3], &[3, 520]),
        ];
        for (dtype, elem) in [(DType::F16, Elem::F16), (DType::BF16, Elem::Bf16)] {
            for (a_shape, b_shape) in shapes {
                let (a, b, _) = oracle(a_shape, b_shape, 5);
                let half = Tensor::new(b.shape.clone(), Data::from_f64(dtype, b.data.iter_f64()));
                let wide = Tensor::new(b.shape.clone(), Data::from_f64(DType::F32, half.data.iter_f64()));
                let want = crate::kernels::matmul_shape::testing::product(&a, &wide);
                let bits: Vec<u16> =
                    half.to_le_bytes().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                for threads in [1, 2] {
                    let mut out = vec![f32::NAN; want.numel()];
                    let x = a.as_f32().unwrap();
                    let t = Threads::Exactly(threads);
                    let s = MatmulShape::new(a_shape, b_shape, &want.shape).unwrap();
                    matmul_half(x, (&bits, elem), &mut out, &s, t, &Bound::none()).unwrap();
                    assert_close(&out, want.as_f32().unwrap(), &format!("{a_shape:?} @ {dtype}{b_shape:?}"));
                }
            }
        }
    }

    #[test]
    fn matches_the_interpreter() {
        for (a, b) in [
            (&[1usize, 1][..], &[1usize, 1][..]),
            (&[7, 13], &[13, 5]),
            (&[65, 33], &[33, 129]),
            (&[150, 300], &[300, 70]),
            (&[700, 20], &[20, 9]),
            (&[3, 300, 8], &[8, 40]),
            (&[4, 5, 70, 8], &[4, 5, 8, 90]),
            (&[1], &[1]),
            (&[17], &[17, 3]),
            (&[4, 17], &[17]),
            (&[5], &[2, 5, 3]),
            (&[2, 1, 3, 4], &[3, 4, 5]),
            (&[3, 4], &[2, 4, 5]),
            (&[2, 3, 4], &[4, 5]),
            (&[4, 1, 2, 3], &[1, 5, 3, 2]),
            (&[3, 0], &[0, 4]),
            (&[0, 3], &[3, 4]),
        ] {
            check(a, b);
        }
    }

    /// A weight in panels gives the product at few rows (the panels' kernels) and at many
    /// (copied out row-major first, `UNPACK_M`), batched or not, again on a second call (from
    /// the copy kept), and for another weight at another address.
    #[test]
    fn weights_in_panels_give_the_product_at_few_and_many_rows() {
        use crate::format::program::Storage;
        for (a_shape, b_shape) in
            [(&[3usize, 40][..], &[40usize, 70][..]), (&[600, 40], &[40, 70]), (&[2, 600, 8], &[2, 8, 33])]
        {
            let (a, b, want) = oracle(a_shape, b_shape, 5);
            let (k, n) = (b_shape[b_shape.len() - 2], b_shape[b_shape.len() - 1]);
            let count = b_shape[..b_shape.len() - 2].iter().product();
            let bytes: Vec<u8> = b.as_f32().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect();
            let packed: Vec<f32> = crate::kernels::panels::pack_bytes(&bytes, count, k, n)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let call = Matmul {
                a: a_shape.to_vec(),
                b: b_shape.to_vec(),
                out: want.shape.clone(),
                b_elem: Elem::F32,
                panels: true,
                epilogue: Vec::new(),
                transposed: Transposed::default(),
            };
            let buf = |bytes: usize, storage| Buffer { name: String::new(), bytes, storage, mask: None };
            let arena = || Storage::Arena { offset: 0 };
            let bufs = [
                buf(want.numel() * 4, arena()),
                buf(a.numel() * 4, arena()),
                buf(packed.len() * 4, Storage::Weights { offset: 0 }),
            ];
            let plan = call.plan(&[&bufs[0], &bufs[1], &bufs[2]], &Default::default()).unwrap();
            for _ in 0..2 {
                let mut out = vec![f32::NAN; want.numel()];
                let args =
                    [out.as_mut_ptr() as *mut u8, a.as_f32().unwrap().as_ptr() as *mut u8, packed.as_ptr() as *mut u8];
                // SAFETY: the buffers the plan was made for; the result apart from the operands.
                unsafe { plan.call(&args, &|_| None, 2) }.unwrap();
                assert_close(&out, want.as_f32().unwrap(), &format!("{a_shape:?} @ {b_shape:?} in panels"));
            }
            // Weights in panels are read-only (their copy is kept): not in the arena.
            let in_arena = [&bufs[0], &bufs[1], &buf(packed.len() * 4, arena())];
            assert!(call.plan(&in_arena, &Default::default()).err().unwrap().contains("in the artifact's weights"));
            // Another weight at another address: the copy kept from the first is not reused.
            let negated: Vec<f32> = packed.iter().map(|v| -v).collect();
            let mut out = vec![f32::NAN; want.numel()];
            let args =
                [out.as_mut_ptr() as *mut u8, a.as_f32().unwrap().as_ptr() as *mut u8, negated.as_ptr() as *mut u8];
            // SAFETY: as above.
            unsafe { plan.call(&args, &|_| None, 2) }.unwrap();
            let minus: Vec<f32> = want.as_f32().unwrap().iter().map(|v| -v).collect();
            assert_close(&out, &minus, &format!("{a_shape:?} @ {b_shape:?}, another weight"));
        }
    }

    /// The masked GEMM equals the interpreter's matmul with the pruned columns and rows of
    /// `b` zeroed, on 1 to 3 threads (rows split unevenly), batched or not.
    #[test]
    fn masked_matches_the_interpreter_on_the_pruned_weight() {
        use meshc_ir::interp::eval_node;
        use meshc_ir::{Node, Op, Tensor};
        for (a_shape, b_shape) in
            [(&[37usize, 41][..], &[41usize, 29][..]), (&[2, 7, 41], &[41, 29]), (&[2, 7, 41], &[2, 41, 29])]
        {
            let (a, b, _) = oracle(a_shape, b_shape, 5);
            let (k, n) = (41, 29);
            let col_keep: Vec<bool> = (0..n).map(|c| c % 7 < 4).collect();
            let row_keep: Vec<bool> = (0..k).map(|r| !(10..20).contains(&r) && r != 40).collect();
            let mask = Mask::new(&col_keep, &row_keep, 1);
            let pruned: Vec<f32> = (b.as_f32().unwrap().iter().enumerate())
                .map(|(i, &x)| if col_keep[i % n] && row_keep[(i / n) % k] { x } else { 0.0 })
                .collect();
            let pruned = Tensor::f32(b_shape.to_vec(), pruned);
            let node = Node::new("mm", Op::MatMul, &["a", "b"]);
            let (_, out_shape) = MatmulShape::infer(a_shape, b_shape).unwrap();
            let ty = TensorType::new(DType::F32, out_shape.clone());
            let want = eval_node(&node, &[&a, &pruned], &ty).unwrap();
            for threads in [1, 2, 3] {
                let mut out = vec![f32::NAN; want.numel()];
                let (x, y) = (a.as_f32().unwrap(), b.as_f32().unwrap());
                let t = Threads::Exactly(threads);
                let s = MatmulShape::new(a_shape, b_shape, &out_shape).unwrap();
                matmul_masked(x, y, &mut out, &s, &mask, t, &Bound::none()).unwrap();
                assert_close(&out, want.as_f32().unwrap(), &format!("{a_shape:?} @ {b_shape:?}, {threads} threads"));
            }
        }
        let mut out = vec![0.0; 4];
        let wrong = Mask::new(&[true, false], &[true; 4], 1);
        let s = MatmulShape::new(&[2, 3], &[3, 2], &[2, 2]).unwrap();
        let e =
            matmul_masked(&[0.0; 6], &[0.0; 6], &mut out, &s, &wrong, Threads::UpTo(1), &Bound::none()).unwrap_err();
        assert!(e.to_string().contains("a mask of 4x2 matrices on an operand b of 3x2 matrices"), "{e}");
    }

    #[test]
    fn checks_lengths() {
        let mut out = vec![0.0; 4];
        let s = MatmulShape::new(&[2, 3], &[3, 2], &[2, 2]).unwrap();
        assert!(matmul(&[0.0; 6], &[0.0; 6], &mut out, &s, Threads::UpTo(1), &Bound::none()).is_ok());
        let e = matmul(&[0.0; 5], &[0.0; 6], &mut out, &s, Threads::UpTo(1), &Bound::none()).unwrap_err();
        assert!(e.to_string().contains("operand a has 5 elements, fewer than the 6 the product reaches"), "{e}");
        let e = matmul(&[0.0; 6], &[0.0; 6], &mut out[..3], &s, Threads::UpTo(1), &Bound::none()).unwrap_err();
        assert!(e.to_string().contains("result has 3 elements"), "{e}");
        // A batch: the spans run from the first matrix to the end of the last one.
        let s = MatmulShape::new(&[3, 2, 4], &[3, 4, 5], &[3, 2, 5]).unwrap();
        assert_eq!(s.spans().unwrap(), [24, 60, 30]);
        let s = MatmulShape::new(&[3, 2, 4], &[4, 5], &[3, 2, 5]).unwrap();
        assert_eq!(s.spans().unwrap(), [24, 20, 30], "a shared b folds into one tall product");
        let s = MatmulShape::new(&[2, 4], &[3, 4, 5], &[3, 2, 5]).unwrap();
        assert_eq!(s.spans().unwrap(), [8, 60, 30], "a broadcast a is read for every matrix");
        let s = MatmulShape::new(&[0, 2, 4], &[4, 5], &[0, 2, 5]).unwrap();
        assert_eq!(s.spans().unwrap()[0], 0);
        // Plans `new` cannot make are refused: strides that overflow, a result whose
        // matrices overlap (the parts would write them at once).
        use crate::kernels::matmul_shape::BatchDim;
        let one = |a_stride, out_stride| MatmulShape {
            m: 1,
            k: 1,
            n: 1,
            batch: vec![BatchDim { size: 2, a_stride, b_stride: 0, out_stride }],
        };
        assert!(one(1, 1).spans().is_ok());
        let e = one(usize::MAX, 1).spans().unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
        let e = one(1, 0).spans().unwrap_err().to_string();
        assert!(e.contains("one after the other"), "{e}");
        let e = matmul(&[], &[0.0], &mut [0.0; 2], &one(usize::MAX, 1), Threads::UpTo(1), &Bound::none()).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
    }

    #[test]
    fn library_serves_all_but_tiny_products() {
        let t = |s: &[usize]| TensorType::new(DType::F32, s.to_vec());
        assert!(!prefer_library(&t(&[8, 8]), &t(&[8, 8])));
        assert!(!prefer_library(&t(&[64, 8, 8]), &t(&[64, 8, 8])), "per-matrix size counts");
        assert!(prefer_library(&t(&[64, 8, 8]), &t(&[8, 8])), "a shared b folds the batch into m");
        assert!(!prefer_library(&t(&[12, 12]), &t(&[12, 12])));
        assert!(prefer_library(&t(&[8, 16]), &t(&[16, 16])));
        assert!(prefer_library(&t(&[1024]), &t(&[1024, 1024])));
        assert!(!prefer_library(&t(&[3, 4]), &t(&[5, 6])), "invalid shapes: the kernel reports the error");
        let i = TensorType::new(DType::I32, vec![64, 64]);
        assert!(!prefer_library(&i, &i));
    }
}
