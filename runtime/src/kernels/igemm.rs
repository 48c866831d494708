//! The integer GEMM, the runner's `Library::IntMatmul`: numpy `matmul` of i32 operands,
//! every sum wrapping as ONNX's i32 accumulator does (MatMulInteger, QLinearMatMul), bit
//! for bit the interpreter's result whatever the path, blocking or thread count.
//!
//! The ONNX importer writes the product of 8-bit operands as the i32 matmul of
//! `cast(x, i32) − zero point` (docs/onnx.md): each row of `a` and each column of `b` then
//! spans at most 255 values. So the kernel takes any i32 operands and splits them as
//! `a = u + ra` (per row: `ra` the row's least value, `u` in 0..=255, u8) and `b = w + cb`
//! (per column: `w` in −128..=127, i8), and computes
//!
//! `c = Σ u·w + cb·Σu + ra·(Σw + k·cb)`
//!
//! — the row-sum and column-sum corrections of the zero points — in wrapping i32, which is
//! the exact product modulo 2^32, i.e. what the accumulator gives. The inner loop is then a
//! plain u8×i8 dot product: AVX-512 VNNI's `vpdpbusd` (four products a lane, no
//! saturation), AVX2's `vpmaddwd` on both sides widened to i16 (a pair sum of at most
//! 2·255·128, exact; `vpmaddubsw` would saturate at 2^15), or portable code. AVX2 widens a
//! part's rows and each block of strips once when at least `WIDEN_MIN_ROWS` rows read them
//! (2048³: 0.60× → 0.84× the f32 GEMM), and in the tile otherwise (a decode step's one row). The path follows
//! `format::isa`: `avx512` is VNNI where the CPU has it (else AVX2's), `avx2` and `portable`
//! their own, so `--isa` / `MESHC_ISA` force each. A row of `a` that spans more than 255
//! values (never, from the importer) is computed exactly by a scalar loop; a run-time `b`
//! with a wider column runs the scalar reference.
//!
//! Layout of `b` packed (`pack`: at compile time for a weight, else per call): per matrix,
//! `cb` then the column term `Σw + k·cb`, i32 for each of the columns padded to whole strips
//! of `NR`, then the strips, each its `k` (padded to a multiple of 4) rows in groups of 4:
//! a group is `NR` columns × 4 bytes, the four `w` of one column consecutive, as
//! `vpdpbusd` reads them against four bytes of a row of `u` broadcast. Every matrix is a
//! multiple of 64 bytes, so a 64-byte aligned weight keeps each aligned.
//!
//! Splits: up to `SMALL_M` rows a product is split by strips (each core reads its share of
//! the weight once), longer ones by blocks of rows; within a part, a block of strips that
//! stays in L2 is passed over by every tile of rows, whose `u` stays in L1.

use std::cell::RefCell;
use std::sync::Arc;

use anyhow::{bail, Result};

use crate::format::epilogue::operands;
use crate::format::isa::{self, Isa};
use crate::format::program::{Buffer, Byte, IntMatmul};
use crate::kernels::call::{Kept, LibraryCall, Planned};
use crate::kernels::epilogue::{Bound, Epilogue};
use crate::kernels::library::check_epilogue;
use crate::kernels::matmul_shape::MatmulShape;

/// Columns of a strip: one AVX-512 vector of i32.
pub const NR: usize = 16;

/// Contraction elements a lane takes at once (`vpdpbusd`).
const KG: usize = 4;

/// Bytes of one group of a strip.
const GROUP: usize = NR * KG;

/// Rows per matrix up to which a product is split by strips rather than rows.
const SMALL_M: usize = 64;

/// Bytes of a block of strips every tile of rows passes over while it stays in L2.
const STRIP_BLOCK_BYTES: usize = 384 << 10;

/// Multiply-adds below which a second thread costs more than it saves.
const PARALLEL_MIN_MACS: usize = 1 << 20;

/// The instructions a call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Scalar,
    Avx2,
    Vnni,
}

impl Path {
    /// The path of the ISA in use (`format::isa`).
    pub fn current() -> Path {
        match isa::current() {
            Isa::Avx512 if has_vnni() => Path::Vnni,
            Isa::Avx512 | Isa::Avx2 => Path::Avx2,
            Isa::Portable => Path::Scalar,
        }
    }

    /// Every path this CPU runs.
    pub fn available() -> Vec<Path> {
        let best = Isa::detected();
        let mut paths = vec![Path::Scalar];
        if best >= Isa::Avx2 {
            paths.push(Path::Avx2);
        }
        if best >= Isa::Avx512 && has_vnni() {
            paths.push(Path::Vnni);
        }
        paths
    }

    /// Rows of a tile.
    fn mr(self) -> usize {
        match self {
            Path::Vnni => 8,
            Path::Avx2 | Path::Scalar => 4,
        }
    }
}

fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn k_pad(k: usize) -> usize {
    k.div_ceil(KG) * KG
}

fn strips(n: usize) -> usize {
    n.div_ceil(NR)
}

/// Bytes of one packed k×n matrix.
pub fn packed_bytes(k: usize, n: usize) -> usize {
    strips(n) * NR * (8 + k_pad(k))
}

/// Bytes of a packed `b` of `shape` (its matrices one after the other), if it is a matrix
/// or a batch of them and the size fits.
pub fn packed_span(shape: &[usize]) -> Option<usize> {
    let [batch @ .., k, n] = shape else { return None };
    let count = batch.iter().try_fold(1usize, |x, &d| x.checked_mul(d))?;
    strips(*n).checked_mul(NR)?.checked_mul(k_pad(*k).checked_add(8)?)?.checked_mul(count)
}

/// `count` row-major k×n matrices of `b` packed (the module's layout), or None if a column
/// spans more than 255 values.
pub fn pack(b: &[i32], count: usize, k: usize, n: usize) -> Option<Vec<u8>> {
    let mut out = vec![0; count * packed_bytes(k, n)];
    pack_into(b, count, k, n, &mut out).then_some(out)
}

/// `pack` into `dst` (`count · packed_bytes(k, n)` bytes); false if a column spans more
/// than 255 values.
fn pack_into(b: &[i32], count: usize, k: usize, n: usize, dst: &mut [u8]) -> bool {
    let (sn, kp) = (strips(n), k_pad(k));
    let len = packed_bytes(k, n);
    for i in 0..count {
        let (b, dst) = (&b[i * k * n..][..k * n], &mut dst[i * len..][..len]);
        dst.fill(0);
        let (head, panels) = dst.split_at_mut(sn * NR * 8);
        for j in 0..n {
            let column = (0..k).map(|p| b[p * n + j] as i64);
            let (lo, hi) = column.clone().fold((i64::MAX, i64::MIN), |(l, h), v| (l.min(v), h.max(v)));
            if k > 0 && hi - lo > 255 {
                return false;
            }
            let cb = if k == 0 { 0 } else { lo + 128 };
            let mut sum = 0i64;
            for (p, v) in column.enumerate() {
                let w = v - cb;
                sum += w;
                panels[(j / NR * (kp / KG) + p / KG) * GROUP + j % NR * KG + p % KG] = w as i8 as u8;
            }
            let term = (sum as i32).wrapping_add((k as i32).wrapping_mul(cb as i32));
            head[j * 4..][..4].copy_from_slice(&(cb as i32).to_le_bytes());
            head[(sn * NR + j) * 4..][..4].copy_from_slice(&term.to_le_bytes());
        }
    }
    true
}

/// `count` packed matrices' `b`, per matrix: `cb`, the column term, the strips.
#[derive(Clone, Copy)]
struct Packed<'p> {
    bytes: &'p [u8],
    k: usize,
    n: usize,
}

impl<'p> Packed<'p> {
    /// Matrix `i`: its column offsets, column terms and strips.
    fn matrix(&self, i: usize) -> (&'p [i32], &'p [i32], &'p [u8]) {
        let (sn, len) = (strips(self.n), packed_bytes(self.k, self.n));
        let m = &self.bytes[i * len..][..len];
        let (head, panels) = m.split_at(sn * NR * 8);
        // The head is i32s at the start of a matrix (a multiple of 64 bytes from the start of
        // the buffer, which the plan checked is 4-byte aligned).
        let (pre, head, _) = unsafe { head.align_to::<i32>() };
        assert!(pre.is_empty(), "packed integer weights are 4-byte aligned");
        (&head[..sn * NR], &head[sn * NR..], panels)
    }
}

/// The operand `b` of a call.
#[derive(Clone, Copy)]
pub enum B<'b> {
    /// Packed by `pack` (`packed_bytes` per matrix).
    Packed(&'b [u8]),
    /// Row-major i32.
    Rows(&'b [i32]),
}

/// The operand `a` of a call.
#[derive(Clone, Copy)]
pub enum A<'a> {
    /// i32: each row is split by its own least value (`Rows::fill`).
    Words(&'a [i32]),
    /// 8-bit values (i8 when `signed`, else u8) less the zero point `zp`: every row spans
    /// at most 255 values without a look at them.
    Bytes { data: &'a [u8], signed: bool, zp: i32 },
}

impl<'a> A<'a> {
    fn len(&self) -> usize {
        match self {
            A::Words(a) => a.len(),
            A::Bytes { data, .. } => data.len(),
        }
    }

    /// Elements `range` of it.
    fn part(self, range: std::ops::Range<usize>) -> A<'a> {
        match self {
            A::Words(a) => A::Words(&a[range]),
            A::Bytes { data, signed, zp } => A::Bytes { data: &data[range], signed, zp },
        }
    }

    /// Its values as i32 (for the paths by the definition).
    fn words(self) -> std::borrow::Cow<'a, [i32]> {
        match self {
            A::Words(a) => a.into(),
            A::Bytes { data, signed, zp } => {
                data.iter().map(|&x| if signed { i32::from(x as i8) } else { i32::from(x) }.wrapping_sub(zp)).collect()
            }
        }
    }
}

/// A row-split part's rows of `a`, as the tiles read them.
#[derive(Default)]
struct Rows {
    /// `u`, `k_pad` bytes a row (the padding zero).
    u: Vec<u8>,
    ra: Vec<i32>,
    /// Σu of each row.
    su: Vec<i32>,
    /// Rows spanning more than 255 values, left to `wide_row` (their `u` zero).
    wide: Vec<usize>,
}

impl Rows {
    /// Takes the `rows` rows of `a`, `k` elements each.
    fn fill(&mut self, a: A, rows: usize, k: usize) {
        let kp = k_pad(k);
        self.u.clear();
        self.u.resize(rows * kp, 0);
        self.ra.clear();
        self.su.clear();
        self.wide.clear();
        let a = match a {
            A::Words(a) => a,
            A::Bytes { data, signed, zp } => {
                // An i8 x is the byte x + 128 less 128: a = u + (−128 − zp), u = x ^ 0x80.
                let (flip, base) = if signed { (0x80, -128i32) } else { (0, 0) };
                for r in 0..rows {
                    let u = &mut self.u[r * kp..][..k];
                    for (u, &x) in u.iter_mut().zip(&data[r * k..][..k]) {
                        *u = x ^ flip;
                    }
                    self.ra.push(base.wrapping_sub(zp));
                    self.su.push(u.iter().fold(0i32, |s, &x| s.wrapping_add(i32::from(x))));
                }
                return;
            }
        };
        for r in 0..rows {
            let row = &a[r * k..][..k];
            let (lo, hi) = row.iter().fold((i32::MAX, i32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
            let lo = if k == 0 { 0 } else { lo };
            if hi as i64 - lo as i64 > 255 {
                self.wide.push(r);
                self.ra.push(0);
                self.su.push(0);
                continue;
            }
            let u = &mut self.u[r * kp..][..k];
            for (u, &v) in u.iter_mut().zip(row) {
                *u = (v - lo) as u8;
            }
            self.ra.push(lo);
            // Mod 2^32, as every sum of the kernel (a row of 8.4M 255s passes i32::MAX).
            self.su.push(u.iter().fold(0i32, |s, &x| s.wrapping_add(i32::from(x))));
        }
    }
}

thread_local! {
    /// Each thread's copy of its rows of `a` (kept between calls: fresh each call, it would be
    /// page-faulted in each time).
    static ROWS: RefCell<Rows> = RefCell::new(Rows::default());
    /// The calling thread's copy of every row of a small-M product, which all its parts read.
    static SHARED: RefCell<Vec<Rows>> = const { RefCell::new(Vec::new()) };
    /// The AVX2 path's rows of `u` and block of strips widened to i16 (`block`).
    static WIDE: RefCell<(Vec<i16>, Vec<i16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The multiply-adds of a product.
fn macs(s: &MatmulShape) -> usize {
    s.k.saturating_mul(s.m).saturating_mul(s.n).saturating_mul(s.batch_count())
}

/// `out = a @ b` (numpy `matmul` of i32, wrapping) for the plan `s` on up to `threads`
/// cores, on the path of the ISA in use, then the epilogue `ep` (`out` then holds f32 if it
/// converts the sums). A row-major `b` is packed into `scratch`.
pub fn matmul(
    a: A,
    b: B,
    out: &mut [i32],
    s: &MatmulShape,
    threads: usize,
    scratch: &mut Vec<u8>,
    ep: &Bound,
) -> Result<()> {
    matmul_on(Path::current(), a, b, out, s, threads, scratch, ep)
}

/// `matmul` on `path`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_on(
    path: Path,
    a: A,
    b: B,
    out: &mut [i32],
    s: &MatmulShape,
    threads: usize,
    scratch: &mut Vec<u8>,
    ep: &Bound,
) -> Result<()> {
    let [a_len, b_len, out_len] = s.spans()?;
    let (m, k, n) = (s.m, s.k, s.n);
    let matrix = packed_bytes(k, n);
    let b_count = b_len.checked_div(k * n).unwrap_or(0);
    let packed_len = match b {
        B::Packed(p) => p.len(),
        B::Rows(r) => r.len(),
    };
    let b_need = match b {
        B::Packed(_) => b_count * matrix,
        B::Rows(_) => b_len,
    };
    for (what, len, need) in
        [("operand a", a.len(), a_len), ("operand b", packed_len, b_need), ("result", out.len(), out_len)]
    {
        if len < need {
            bail!("integer matmul: {what} has {len} elements, fewer than the {need} the product reaches");
        }
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Every matrix of the result, whole, through the epilogue: after the paths that do
    // not go by blocks.
    let whole = |out: &mut [i32]| {
        for (mat, (_, _, oo)) in s.batch_offsets().enumerate() {
            // SAFETY: matrix `mat` of the result, whose span was checked above.
            unsafe { ep.apply(out[oo..].as_mut_ptr() as *mut f32, n, (mat * m, m), 0..n) };
        }
    };
    if k == 0 {
        // An empty sum (and no matrix of `b` to address).
        s.batch_offsets().for_each(|(_, _, oo)| out[oo..oo + m * n].fill(0));
        whole(out);
        return Ok(());
    }
    let packed = match b {
        B::Packed(p) => p,
        B::Rows(rows) => {
            // Packed matrices start with i32s: the bytes begin 4-byte aligned, which a
            // Vec<u8> does not promise.
            scratch.resize(b_count * matrix + 3, 0);
            let at = scratch.as_ptr().align_offset(4);
            let bytes = &mut scratch[at..at + b_count * matrix];
            if !pack_into(rows, b_count, k, n, bytes) {
                reference(&a.words(), rows, out, s);
                whole(out);
                return Ok(());
            }
            bytes
        }
    };
    let packed = Packed { bytes: packed, k, n };
    let threads = if macs(s) >= PARALLEL_MIN_MACS { threads.max(1) } else { 1 };
    let count = s.batch_count();
    let batch = |i: usize| {
        let (ao, bo, oo) = s.batch_offset(i);
        (ao, bo.checked_div(k * n).unwrap_or(0), oo)
    };
    let c = out.as_mut_ptr() as usize;
    // Rows r0..r1 × strips s0..s1 of matrix `mat`, those rows of `a` as `rows` holds them.
    let run = |mat: usize, (r0, r1): (usize, usize), strips: (usize, usize), rows: &Rows| {
        let (ao, bi, oo) = batch(mat);
        let a = a.part(ao + r0 * k..ao + r1 * k);
        // SAFETY: rows r0..r1 of result matrix `mat` lie inside `out` (its span checked
        // above), and the parts of a split write disjoint tiles of them; `block` writes only
        // the columns of `strips` of these rows.
        unsafe {
            block(path, packed, bi, rows, a, ((c as *mut i32).add(oo + r0 * n), r1 - r0, mat * m + r0), strips, ep)
        };
    };
    let sn = strips(n);
    if m <= SMALL_M {
        // Every part runs all rows on its strips: the rows are taken to 8 bits once, here.
        SHARED.with_borrow_mut(|shared| {
            if shared.len() < count {
                shared.resize_with(count, Rows::default);
            }
            for (mat, rows) in shared.iter_mut().enumerate().take(count) {
                let ao = s.batch_offset(mat).0;
                rows.fill(a.part(ao..ao + m * k), m, k);
            }
            let shared = &*shared;
            let items = count * sn;
            let parts = if threads > 1 { items.min(crate::kernels::pool::PARTS_PER_THREAD * threads) } else { 1 };
            crate::kernels::pool::split(parts, &|t| {
                let (from, to) = (items * t / parts, items * (t + 1) / parts);
                let mut item = from;
                while item < to {
                    let (mat, j) = (item / sn, item % sn);
                    let end = to.min((mat + 1) * sn);
                    run(mat, (0, m), (j, j + end - item), &shared[mat]);
                    item = end;
                }
            });
        });
    } else {
        let mr = path.mr();
        let tiles = m.div_ceil(mr);
        let parts = if threads > 1 { (crate::kernels::pool::PARTS_PER_THREAD * threads).min(tiles) } else { 1 };
        crate::kernels::pool::split(parts, &|t| {
            let (r0, r1) = ((tiles * t / parts * mr).min(m), (tiles * (t + 1) / parts * mr).min(m));
            for mat in (0..count).filter(|_| r0 < r1) {
                let ao = s.batch_offset(mat).0;
                ROWS.with_borrow_mut(|rows| {
                    rows.fill(a.part(ao + r0 * k..ao + r1 * k), r1 - r0, k);
                    run(mat, (r0, r1), (0, sn), rows);
                });
            }
        });
    }
    Ok(())
}

/// The product by the definition, for a `b` whose columns span more than 8 bits.
fn reference(a: &[i32], b: &[i32], out: &mut [i32], s: &MatmulShape) {
    let (m, k, n) = (s.m, s.k, s.n);
    for (ao, bo, oo) in s.batch_offsets() {
        for i in 0..m {
            let row = &mut out[oo + i * n..][..n];
            row.fill(0);
            for p in 0..k {
                let x = a[ao + i * k + p];
                for (r, &y) in row.iter_mut().zip(&b[bo + p * n..][..n]) {
                    *r = r.wrapping_add(x.wrapping_mul(y));
                }
            }
        }
    }
}

/// Rows `rows` (their `a`, `rows.1` of them, at `c` of the result, row stride n, the first
/// row `row0` of the result counted over all its matrices) × strips `s0..s1` of matrix `bi`
/// of `b`, the epilogue `ep` applied to each block of strips once it is computed.
///
/// # Safety
/// `c` addresses those rows of the result, whose columns of the strips no other thread
/// writes; `ep` is bound to operands that broadcast to the result.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    path: Path,
    b: Packed,
    bi: usize,
    rows: &Rows,
    a: A,
    (c, m, row0): (*mut i32, usize, usize),
    (s0, s1): (usize, usize),
    ep: &Bound,
) {
    let (k, n) = (b.k, b.n);
    let (kp, mr) = (k_pad(k), path.mr());
    let (cb, term, panels) = b.matrix(bi);
    let strip_bytes = kp * NR;
    // AVX2 widens bytes to i16 for `vpmaddwd`: done once for the rows and once per block of
    // strips, not in the inner loop for every tile (a shuffle per vector there, on the
    // port the multiply-adds need), when enough rows share each block. A widened block
    // takes twice the bytes, so it holds half the strips.
    let widened = path == Path::Avx2 && m >= WIDEN_MIN_ROWS;
    let block_bytes = if widened { STRIP_BLOCK_BYTES / 2 } else { STRIP_BLOCK_BYTES };
    let per_block = (block_bytes / strip_bytes.max(1)).max(2);
    let mut wide = WIDE.with(|w| std::mem::take(&mut *w.borrow_mut()));
    if widened {
        widen(&mut wide.0, &rows.u[..m * kp], false);
    }
    for sb in (s0..s1).step_by(per_block) {
        let se = s1.min(sb + per_block);
        if widened {
            widen(&mut wide.1, &panels[sb * strip_bytes..se * strip_bytes], true);
        }
        for r in (0..m).step_by(mr) {
            let rr = mr.min(m - r);
            let mut s = sb;
            while s < se {
                // VNNI takes two strips at a time.
                let ns = if path == Path::Vnni && s + 1 < se { 2 } else { 1 };
                let j = s * NR;
                let t = Tile {
                    a: rows.u[r * kp..].as_ptr(),
                    lda: kp,
                    w: panels[s * strip_bytes..].as_ptr(),
                    strip_bytes,
                    groups: kp / KG,
                    c: unsafe { c.add(r * n + j) },
                    ldc: n,
                    cols: (n - j).min(ns * NR),
                    ra: &rows.ra[r..r + rr],
                    su: &rows.su[r..r + rr],
                    cb: &cb[j..],
                    term: &term[j..],
                    wide: widened.then(|| (wide.0[r * kp..].as_ptr(), wide.1[(s - sb) * strip_bytes..].as_ptr())),
                };
                unsafe { tile(path, rr, ns, &t) };
                s += ns;
            }
        }
        let cols = sb * NR..(se * NR).min(n);
        // SAFETY: as the caller promises.
        unsafe { wide_rows(b, bi, rows, a, c, cols.clone()) };
        // SAFETY: the block's rows and columns, which this call wrote and nobody else does.
        unsafe { ep.apply(c as *mut f32, n, (row0, m), cols) };
    }
    WIDE.with(|w| *w.borrow_mut() = wide);
}

/// Columns `cols` of the rows of `rows.wide` (spanning more than 255 values), by the
/// definition.
///
/// # Safety
/// As `block`'s.
unsafe fn wide_rows(b: Packed, bi: usize, rows: &Rows, a: A, c: *mut i32, cols: std::ops::Range<usize>) {
    let (k, n, kp) = (b.k, b.n, k_pad(b.k));
    let (cb, _, panels) = b.matrix(bi);
    for &r in &rows.wide {
        let A::Words(a) = a else { unreachable!("8-bit rows span at most 255 values") };
        let row = &a[r * k..][..k];
        let sum = row.iter().fold(0i32, |s, &x| s.wrapping_add(x));
        for (j, &cb) in cb.iter().enumerate().take(cols.end).skip(cols.start) {
            // b = w + cb column by column: Σ a·b = Σ a·w + cb·Σ a.
            let (strip, col) = (j / NR, j % NR);
            let mut dot = 0i32;
            for (p, &x) in row.iter().enumerate() {
                let w = panels[(strip * (kp / KG) + p / KG) * GROUP + col * KG + p % KG] as i8 as i32;
                dot = dot.wrapping_add(x.wrapping_mul(w));
            }
            // SAFETY: row r, column j of this part's rows of the result (the caller's promise).
            unsafe { *c.add(r * n + j) = dot.wrapping_add(cb.wrapping_mul(sum)) };
        }
    }
}

/// Rows of a part from which the AVX2 path widens its operands once (`block`) rather than
/// in every tile: below it, each strip is read by too few rows to pay for its i16 copy.
const WIDEN_MIN_ROWS: usize = 16;

/// `bytes` as i16 in `dst`, each value the same: u8 (rows of `u`) or, `signed`, i8 (strips).
fn widen(dst: &mut Vec<i16>, bytes: &[u8], signed: bool) {
    dst.clear();
    dst.extend(bytes.iter().map(|&x| if signed { i16::from(x as i8) } else { i16::from(x) }));
}

/// One tile: rows of `u` × `ns` strips (the columns `cols` of them that exist).
struct Tile<'t> {
    a: *const u8,
    lda: usize,
    w: *const u8,
    strip_bytes: usize,
    groups: usize,
    c: *mut i32,
    ldc: usize,
    cols: usize,
    ra: &'t [i32],
    su: &'t [i32],
    cb: &'t [i32],
    term: &'t [i32],
    /// On the AVX2 path, `a` and `w` widened to i16 (same layout, an element a byte was).
    wide: Option<(*const i16, *const i16)>,
}

impl Tile<'_> {
    /// Element (r, j) of the result from its dot product Σu·w.
    fn correct(&self, r: usize, j: usize, dot: i32) -> i32 {
        dot.wrapping_add(self.cb[j].wrapping_mul(self.su[r])).wrapping_add(self.ra[r].wrapping_mul(self.term[j]))
    }
}

/// Runs tile `t` of `mr` rows and `ns` strips on `path`.
///
/// # Safety
/// The tile's pointers address `mr` rows of `u` of `groups · 4` bytes, `ns` strips, and the
/// `cols` columns of `mr` rows of the result; `wide`'s, as many i16 as those are bytes.
unsafe fn tile(path: Path, mr: usize, ns: usize, t: &Tile) {
    #[cfg(target_arch = "x86_64")]
    macro_rules! vnni_rows {
        ($ns:literal) => {
            match mr {
                1 => tile_vnni::<1, $ns>(t),
                2 => tile_vnni::<2, $ns>(t),
                3 => tile_vnni::<3, $ns>(t),
                4 => tile_vnni::<4, $ns>(t),
                5 => tile_vnni::<5, $ns>(t),
                6 => tile_vnni::<6, $ns>(t),
                7 => tile_vnni::<7, $ns>(t),
                _ => tile_vnni::<8, $ns>(t),
            }
        };
    }
    // SAFETY: as the caller promises; each path runs only where the CPU has it
    // (`Path::current`, `Path::available`).
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Vnni if ns == 1 => vnni_rows!(1),
            #[cfg(target_arch = "x86_64")]
            Path::Vnni => vnni_rows!(2),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => {
                // Two half strips of 8 columns.
                for h in 0..2 {
                    if t.cols > h * 8 {
                        let half = Tile {
                            w: t.w.add(h * 32),
                            c: t.c.add(h * 8),
                            cols: (t.cols - h * 8).min(8),
                            cb: &t.cb[h * 8..],
                            term: &t.term[h * 8..],
                            wide: t.wide.map(|(a, w)| (a, w.add(h * 32))),
                            ..*t
                        };
                        match (mr, half.wide.is_some()) {
                            (1, false) => tile_avx2::<1, false>(&half),
                            (2, false) => tile_avx2::<2, false>(&half),
                            (3, false) => tile_avx2::<3, false>(&half),
                            (_, false) => tile_avx2::<4, false>(&half),
                            (1, true) => tile_avx2::<1, true>(&half),
                            (2, true) => tile_avx2::<2, true>(&half),
                            (3, true) => tile_avx2::<3, true>(&half),
                            (_, true) => tile_avx2::<4, true>(&half),
                        }
                    }
                }
            }
            _ => tile_scalar(mr, t),
        }
    }
}

/// The portable tile: one strip.
unsafe fn tile_scalar(mr: usize, t: &Tile) {
    let mut acc = [[0i32; NR]; 8];
    for g in 0..t.groups {
        // SAFETY: group g of the strip and of each row lie inside them (the caller's promise).
        let w = unsafe { std::slice::from_raw_parts(t.w.add(g * GROUP), GROUP) };
        for (r, acc) in acc.iter_mut().enumerate().take(mr) {
            let u = unsafe { std::slice::from_raw_parts(t.a.add(r * t.lda + g * KG), KG) };
            for (col, acc) in acc.iter_mut().enumerate() {
                let w = &w[col * KG..][..KG];
                let dot: i32 = (0..KG).map(|q| u[q] as i32 * w[q] as i8 as i32).sum();
                *acc = acc.wrapping_add(dot);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(mr) {
        for (j, &dot) in acc.iter().enumerate().take(t.cols.min(NR)) {
            unsafe { *t.c.add(r * t.ldc + j) = t.correct(r, j, dot) };
        }
    }
}

/// The AVX2 tile: `MR` rows × 8 columns (half a strip: 32 bytes of each group, two sets of
/// 4 columns × 4 bytes), both sides widened to i16 and multiplied by `vpmaddwd`, whose lane
/// 2c + h holds column c's products h·2, h·2 + 1 of the group; `vphaddd` adds the pairs.
/// `WIDE`: both sides come widened already (`Tile::wide`), so the loop only loads them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2<const MR: usize, const WIDE: bool>(t: &Tile) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    let (a16, w16) = t.wide.unwrap_or((std::ptr::null(), std::ptr::null()));
    for g in 0..t.groups {
        // SAFETY (of the loads): group g of the half strip and of each row lie inside them,
        // in bytes or, widened, in i16.
        let (w0, w1) = unsafe {
            if WIDE {
                let p = w16.add(g * GROUP);
                (_mm256_loadu_si256(p as *const __m256i), _mm256_loadu_si256(p.add(16) as *const __m256i))
            } else {
                let p = t.w.add(g * GROUP);
                (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i)),
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(16) as *const __m128i)),
                )
            }
        };
        for (r, acc) in acc.iter_mut().enumerate() {
            let u = unsafe {
                if WIDE {
                    // Four i16 of the row, repeated: a broadcast load.
                    _mm256_set1_epi64x((a16.add(r * t.lda + g * KG) as *const i64).read_unaligned())
                } else {
                    _mm256_cvtepu8_epi16(_mm_set1_epi32((t.a.add(r * t.lda + g * KG) as *const i32).read_unaligned()))
                }
            };
            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(u, w0));
            acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(u, w1));
        }
    }
    let cb = load8(t.cb, t.cols);
    let term = load8(t.term, t.cols);
    for (r, acc) in acc.iter().enumerate() {
        // [c0 c1 c4 c5 | c2 c3 c6 c7] into column order.
        let dot = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[0], acc[1]), 0b11_01_10_00);
        let v = _mm256_add_epi32(
            dot,
            _mm256_add_epi32(
                _mm256_mullo_epi32(cb, _mm256_set1_epi32(t.su[r])),
                _mm256_mullo_epi32(term, _mm256_set1_epi32(t.ra[r])),
            ),
        );
        let mut out = [0i32; 8];
        // SAFETY: `out` holds 8 i32; the result row holds `cols` of them from `c`.
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, v);
            std::ptr::copy_nonoverlapping(out.as_ptr(), t.c.add(r * t.ldc), t.cols);
        }
    }
}

/// Eight i32 of `v` (its first `cols`, the rest zero) as a vector.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn load8(v: &[i32], cols: usize) -> std::arch::x86_64::__m256i {
    let mut x = [0i32; 8];
    x[..cols].copy_from_slice(&v[..cols]);
    // SAFETY: `x` holds 8 i32.
    unsafe { std::arch::x86_64::_mm256_loadu_si256(x.as_ptr() as *const _) }
}

/// The VNNI tile: `MR` rows × `NS` strips of 16 columns, one `vpdpbusd` per row and strip
/// per group of 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_vnni<const MR: usize, const NS: usize>(t: &Tile) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_si512(); NS]; MR];
    for g in 0..t.groups {
        let mut w = [_mm512_setzero_si512(); NS];
        for (s, w) in w.iter_mut().enumerate() {
            // SAFETY: group g of strip s lies inside the strips.
            *w = unsafe { _mm512_loadu_si512(t.w.add(s * t.strip_bytes + g * GROUP) as *const _) };
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // SAFETY: group g of row r lies inside the rows.
            let u = _mm512_set1_epi32(unsafe { (t.a.add(r * t.lda + g * KG) as *const i32).read_unaligned() });
            for (acc, &w) in acc.iter_mut().zip(&w) {
                *acc = _mm512_dpbusd_epi32(*acc, u, w);
            }
        }
    }
    for s in 0..NS {
        let cols = t.cols.saturating_sub(s * NR).min(NR);
        if cols == 0 {
            break;
        }
        let mask: __mmask16 = if cols == NR { !0 } else { (1 << cols) - 1 };
        // SAFETY: the column terms are padded to whole strips.
        let (cb, term) = unsafe {
            (
                _mm512_maskz_loadu_epi32(mask, t.cb[s * NR..].as_ptr()),
                _mm512_maskz_loadu_epi32(mask, t.term[s * NR..].as_ptr()),
            )
        };
        for (r, acc) in acc.iter().enumerate() {
            let v = _mm512_add_epi32(
                acc[s],
                _mm512_add_epi32(
                    _mm512_mullo_epi32(cb, _mm512_set1_epi32(t.su[r])),
                    _mm512_mullo_epi32(term, _mm512_set1_epi32(t.ra[r])),
                ),
            );
            // SAFETY: row r of the result holds these `cols` columns.
            unsafe { _mm512_mask_storeu_epi32(t.c.add(r * t.ldc + s * NR), mask, v) };
        }
    }
}

/// The integer library matmul of a program step: buffers result, `a` (i32, or bytes with
/// `a_bytes`), `b` (i32, or packed by `pack` when `panels`), the zero point of a byte `a`,
/// then the epilogue's operands.
impl LibraryCall for IntMatmul {
    fn buffers(&self) -> usize {
        3 + usize::from(self.a_bytes.is_some()) + operands(&self.epilogue).count()
    }

    fn plan(&self, buffers: &[&Buffer], _: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let IntMatmul { a, b, out, panels, a_bytes, epilogue } = self;
        let shape = MatmulShape::new(a, b, out).map_err(|e| e.to_string())?;
        let zp = a_bytes.map(|_| 3);
        check_epilogue(epilogue, true, (a, b, out), buffers, 3 + usize::from(zp.is_some()))?;
        let [a_len, b_len, out_len] = shape.spans().map_err(|e| e.to_string())?;
        let b_bytes = match panels {
            true => packed_span(b).ok_or_else(|| format!("operand b of shape {b:?} is not packed matrices"))?,
            false => b_len.checked_mul(4).ok_or("operand b's size overflows")?,
        };
        let four = |n: usize, what: &str| n.checked_mul(4).ok_or_else(|| format!("{what}'s size overflows"));
        let a_bytes_len = match a_bytes {
            Some(_) => a_len,
            None => four(a_len, "operand a")?,
        };
        let needs =
            [(0, four(out_len, "the result")?, 4), (1, a_bytes_len, if zp.is_some() { 1 } else { 4 }), (2, b_bytes, 4)];
        for (i, need, align) in needs.into_iter().chain(zp.map(|i| (i, 4, 4))) {
            let bytes = buffers[i].bytes;
            if bytes < need {
                return Err(format!(
                    "buffer {i} holds {bytes} bytes, fewer than the {need} the integer matmul reaches"
                ));
            }
            let Some(offset) = buffers[i].storage.offset() else {
                return Err(format!("buffer {i} is the size table"));
            };
            if !offset.is_multiple_of(align) {
                return Err(format!("buffer {i} at offset {offset} is not aligned for its i32s"));
            }
        }
        if buffers[2].mask.is_some() {
            return Err("an integer matmul's operand b is not pruned".to_string());
        }
        let lens = (a_len, if *panels { b_bytes } else { b_len }, out_len);
        let epilogue = Epilogue::new(epilogue, out);
        Ok(Box::new(IntPlan { shape, panels: *panels, a_bytes: *a_bytes, lens, epilogue, scratch: Default::default() }))
    }
}

/// An integer matmul as its load planned it.
struct IntPlan {
    shape: MatmulShape,
    panels: bool,
    a_bytes: Option<Byte>,
    /// Elements of a, b (bytes when packed) and the result.
    lens: (usize, usize, usize),
    epilogue: Epilogue,
    /// A run-time `b` packed (kept for the next call; a call holds it while it runs).
    scratch: parking_lot::Mutex<Vec<u8>>,
}

impl Planned for IntPlan {
    unsafe fn call<'m>(
        &self,
        args: &[*mut u8],
        _: &dyn Fn(usize) -> Option<&'m crate::format::mask::Mask>,
        threads: usize,
    ) -> Result<()> {
        let (a_len, b_len, out_len) = self.lens;
        // SAFETY: the buffers hold at least these elements, aligned, as `plan` accepted,
        // and the result aliases no operand.
        let out = unsafe { std::slice::from_raw_parts_mut(args[0] as *mut i32, out_len) };
        let (a, operands) = match self.a_bytes {
            None => (A::Words(unsafe { std::slice::from_raw_parts(args[1] as *const i32, a_len) }), &args[3..]),
            Some(t) => {
                let data = unsafe { std::slice::from_raw_parts(args[1] as *const u8, a_len) };
                let zp = unsafe { *(args[3] as *const i32) };
                (A::Bytes { data, signed: t == Byte::I8, zp }, &args[4..])
            }
        };
        let b = match self.panels {
            true => B::Packed(unsafe { std::slice::from_raw_parts(args[2] as *const u8, b_len) }),
            false => B::Rows(unsafe { std::slice::from_raw_parts(args[2] as *const i32, b_len) }),
        };
        // SAFETY: `plan` accepted each epilogue operand's buffer for its shape and that
        // shape against the result; the buffers outlive the call.
        let ep = unsafe { self.epilogue.bind(operands) };
        matmul(a, b, out, &self.shape, threads, &mut self.scratch.lock(), &ep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::epilogue::Step;
    use crate::kernels::matmul_shape::testing::product;
    use meshc_ir::{Data, Tensor};
    use proptest::prelude::*;

    /// `x − zp` widened, as the importer writes an 8-bit operand.
    fn centred(x: &[i32], zp: impl Fn(usize) -> i32) -> Vec<i32> {
        x.iter().enumerate().map(|(i, &v)| v - zp(i)).collect()
    }

    /// `a` as u8 and as i8 bytes less a zero point, if it spans at most 255 values.
    fn byte_forms(a: &[i32]) -> Vec<(Vec<u8>, bool, i32)> {
        let (lo, hi) = (a.iter().copied().min().unwrap_or(0), a.iter().copied().max().unwrap_or(0));
        if hi as i64 - lo as i64 > 255 {
            return Vec::new();
        }
        let u8s = a.iter().map(|&v| (v - lo) as u8).collect();
        let i8s = a.iter().map(|&v| (v - lo - 128) as i8 as u8).collect();
        vec![(u8s, false, lo.wrapping_neg()), (i8s, true, lo.wrapping_neg().wrapping_sub(128))]
    }

    /// `a` as the kernel takes it: i32, and as bytes less a zero point (`forms`, its
    /// `byte_forms`).
    fn a_forms<'a>(av: &'a [i32], forms: &'a [(Vec<u8>, bool, i32)]) -> Vec<(A<'a>, &'static str)> {
        let bytes = forms.iter().map(|(data, signed, zp)| {
            (A::Bytes { data, signed: *signed, zp: *zp }, if *signed { "i8 a" } else { "u8 a" })
        });
        std::iter::once((A::Words(av), "i32 a")).chain(bytes).collect()
    }

    /// Runs `a @ b` on every path this CPU has, on 1 and 3 threads, `b` packed and row-major,
    /// `a` as i32 and as bytes, and compares each result bit for bit with the interpreter's;
    /// then with a dequantizing epilogue (`Dequant`) against the interpreter's steps.
    fn check(a: &Tensor, b: &Tensor) {
        let product = product(a, b);
        let (Data::I32(av), Data::I32(bv), Data::I32(want)) = (&a.data, &b.data, &product.data) else { unreachable!() };
        let (s, out_shape) = MatmulShape::infer(&a.shape, &b.shape).unwrap();
        let (k, n) = (s.k, s.n);
        let count = bv.len() / (k * n).max(1);
        let packed = pack(bv, count, k, n).expect("8-bit columns");
        let dq = Dequant::new(&product);
        let forms = byte_forms(av);
        for path in Path::available() {
            for threads in [1, 3] {
                let each =
                    [B::Packed(&packed), B::Rows(bv)].map(|b| a_forms(av, &forms).into_iter().map(move |f| (b, f)));
                for (b, (av, form)) in each.into_iter().flatten() {
                    let what = format!("{path:?} on {threads} threads, {form} {:?} @ {:?}", a.shape, b_shape(&b, &s));
                    let mut out = vec![0x5a5a5a5a; out_shape.iter().product()];
                    matmul_on(path, av, b, &mut out, &s, threads, &mut Vec::new(), &Bound::none()).unwrap();
                    assert!(out == *want, "{what}");
                    dq.check(
                        |ep, out| matmul_on(path, av, b, out, &s, threads, &mut Vec::new(), ep).unwrap(),
                        &mut out,
                        &what,
                    );
                }
            }
        }
    }

    /// An epilogue as the quantize pass makes one — the sums to f32, times a scale per row
    /// and one per column, plus a bias, then GELU — and its value by the interpreter.
    struct Dequant {
        steps: Vec<Step>,
        operands: Vec<Tensor>,
        want: Vec<f32>,
    }

    impl Dequant {
        fn new(product: &Tensor) -> Dequant {
            let shape = &product.shape;
            let (rank, n) = (shape.len(), shape[shape.len() - 1]);
            let mut rows = shape.clone();
            rows[rank - 1] = 1;
            let values = |shape: &[usize], seed: usize, scale: f32| {
                let len = shape.iter().product::<usize>();
                Tensor::f32(
                    shape.to_vec(),
                    (0..len).map(|i| ((i * 7 + seed) % 13) as f32 * scale - 0.3 * scale).collect(),
                )
            };
            let operands = vec![values(&rows, 1, 1e-3), values(&[n], 2, 1e-4), values(&[n], 3, 0.1)];
            let steps = vec![Step::ToF32, Step::Mul(rows), Step::Mul(vec![n]), Step::Add(vec![n]), Step::Gelu];
            let want = crate::kernels::epilogue::testing::oracle(product, &steps, &operands);
            Dequant { steps, operands, want }
        }

        /// Runs `call` with the epilogue bound, and compares `out` (its result) with the
        /// interpreter's.
        fn check(&self, call: impl FnOnce(&Bound, &mut [i32]), out: &mut [i32], what: &str) {
            let shape = &self.operands[0].shape;
            let mut out_shape = shape.clone();
            *out_shape.last_mut().unwrap() = self.operands[1].shape[0];
            let epilogue = Epilogue::new(&self.steps, &out_shape);
            let ptrs: Vec<*mut u8> = self.operands.iter().map(|t| t.as_f32().unwrap().as_ptr() as *mut u8).collect();
            // SAFETY: each operand holds its step's shape, which broadcasts to the result.
            call(&unsafe { epilogue.bind(&ptrs) }, out);
            let got: Vec<f32> = out.iter().map(|x| f32::from_bits(*x as u32)).collect();
            crate::kernels::matmul_shape::testing::assert_close(&got, &self.want, &format!("{what} + dequant"));
        }
    }

    fn b_shape(b: &B, s: &MatmulShape) -> String {
        let kind = if matches!(b, B::Packed(_)) { "packed" } else { "rows" };
        format!("{kind} {}x{}", s.k, s.n)
    }

    /// 8-bit values biased to the ends of the range, where saturation would show.
    fn bytes(signed: bool, len: usize) -> impl Strategy<Value = Vec<i32>> {
        let (lo, hi) = if signed { (-128, 127) } else { (0, 255) };
        proptest::collection::vec(prop_oneof![Just(lo), Just(hi), lo..=hi], len)
    }

    /// An activation (u8 or i8, zero point per tensor or per row, batched or not) and a
    /// weight (i8 or u8, zero point per tensor or per column) as the importer centres them.
    fn operands() -> impl Strategy<Value = (Tensor, Tensor)> {
        ((1usize..40, 0usize..150, 1usize..70), 0usize..3, any::<(bool, bool)>(), any::<(bool, bool)>())
            .prop_flat_map(|((m, k, n), batch, signed, per)| {
                let rows = m * batch.max(1);
                let sides = (bytes(signed.0, rows * k), bytes(signed.1, k * n));
                (Just((m, k, n, batch, per)), sides, bytes(signed.0, rows), bytes(signed.1, n))
            })
            .prop_map(|((m, k, n, batch, per), (x, w), za, zb)| {
                let a = centred(&x, |i| if per.0 { za[i / k.max(1)] } else { za[0] });
                let b = centred(&w, |i| if per.1 { zb[i % n] } else { zb[0] });
                let a_shape = if batch > 0 { vec![batch, m, k] } else { vec![m, k] };
                (Tensor::new(a_shape, Data::I32(a)), Tensor::new(vec![k, n], Data::I32(b)))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Random shapes (k not a multiple of 4, one row, odd widths), zero points and
        /// extreme values against the interpreter's i32 product, on every path.
        #[test]
        fn random_products_match_the_interpreter_bit_for_bit((a, b) in operands()) {
            check(&a, &b);
        }
    }

    #[test]
    fn extremes_wrap_as_the_accumulator_does() {
        // u8 255 × i8 −128 over a long contraction (one 0 and one 127 keep the kernel's `u`
        // and `w` at those ends): past −2^31 the sum wraps, where a saturating add would stick.
        for (m, k, n) in [(1, 70_000, 3), (17, 70_001, 33), (5, 1, 1)] {
            let mut a = vec![255; m * k];
            a[0] = 0;
            let mut b = vec![-128; k * n];
            b[..n].fill(127);
            let want =
                product(&Tensor::new(vec![m, k], Data::I32(a.clone())), &Tensor::new(vec![k, n], Data::I32(b.clone())));
            if k > 1 {
                let Data::I32(w) = &want.data else { unreachable!() };
                assert!(w[n..].iter().all(|&x| x > 0), "the sums wrapped past -2^31");
            }
            check(&Tensor::new(vec![m, k], Data::I32(a)), &Tensor::new(vec![k, n], Data::I32(b)));
        }
    }

    #[test]
    fn an_encoders_shapes_span_several_blocks_of_strips() {
        // MiniLM's projections: 1536 columns are more strips than one L2 block holds.
        for (i, (k, n)) in [(384, 1536), (1536, 384), (384, 1152)].into_iter().enumerate() {
            let m = 70;
            let a: Vec<i32> = ints(i as u64, m * k, 255).into_iter().map(|x| x - 77).collect();
            let b: Vec<i32> = ints(i as u64 + 9, k * n, 255).into_iter().map(|x| x - 128).collect();
            check(&Tensor::new(vec![m, k], Data::I32(a)), &Tensor::new(vec![k, n], Data::I32(b)));
        }
    }

    /// Deterministic pseudo-random integers in 0..=hi.
    fn ints(seed: u64, len: usize, hi: u64) -> Vec<i32> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) % (hi + 1)) as i32
            })
            .collect()
    }

    #[test]
    fn batches_of_weights_and_rows_wider_than_a_byte() {
        // A batch of b matrices (attention-like), and a row of a spanning more than 255
        // values (the scalar row).
        let a: Vec<i32> = (0..2 * 20 * 9).map(|i| (i * 37 % 255) - 100).collect();
        let mut a = a;
        a[9 * 3 + 4] = 100_000;
        let b: Vec<i32> = (0..2 * 9 * 21).map(|i| (i * 53 % 256) - 128).collect();
        check(&Tensor::new(vec![2, 20, 9], Data::I32(a)), &Tensor::new(vec![2, 9, 21], Data::I32(b)));
    }

    /// An artifact's epilogue is checked when it is loaded: `to_f32` first on an integer
    /// product, nowhere on an f32 one.
    #[test]
    fn conversions_out_of_place_are_refused_at_load() {
        use crate::format::program::{Matmul, Storage};
        let buf = Buffer { name: String::new(), bytes: 4096, storage: Storage::Arena { offset: 0 }, mask: None };
        let bufs = [&buf, &buf, &buf, &buf];
        let (a, b, out) = (vec![4, 8], vec![8, 16], vec![4, 16]);
        let int = |epilogue| IntMatmul {
            a: a.clone(),
            b: b.clone(),
            out: out.clone(),
            panels: false,
            a_bytes: None,
            epilogue,
        };
        assert!(int(vec![Step::ToF32, Step::Add(vec![16])]).plan(&bufs, &Default::default()).is_ok());
        for bad in [vec![Step::Add(vec![16])], vec![Step::Relu, Step::ToF32], vec![Step::ToF32, Step::ToF32]] {
            let e =
                int(bad.clone()).plan(&bufs, &Default::default()).err().unwrap_or_else(|| panic!("{bad:?} planned"));
            assert!(e.contains("starts with to_f32"), "{bad:?}: {e}");
        }
        let f32 = Matmul {
            a,
            b,
            out,
            b_elem: crate::format::program::Elem::F32,
            panels: false,
            epilogue: vec![Step::ToF32],
            transposed: Default::default(),
        };
        assert!(f32.plan(&bufs, &Default::default()).err().unwrap().contains("has no to_f32"));
    }

    /// A byte `a` takes its zero point from the buffer after `b` (four bytes, i32-aligned)
    /// and its epilogue's operands from the one after: each checked when it is loaded.
    #[test]
    fn a_byte_operand_and_its_zero_point_are_checked_at_load() {
        use crate::format::program::Storage;
        let at = |offset, bytes| Buffer { name: String::new(), bytes, storage: Storage::Arena { offset }, mask: None };
        let (big, odd, short) = (at(0, 4096), at(1, 4096), at(0, 2));
        let m = IntMatmul {
            a: vec![4, 8],
            b: vec![8, 16],
            out: vec![4, 16],
            panels: false,
            a_bytes: Some(Byte::U8),
            epilogue: vec![Step::ToF32, Step::Add(vec![16])],
        };
        assert_eq!(m.buffers(), 5);
        assert!(m.plan(&[&big, &odd, &big, &big, &big], &Default::default()).is_ok(), "bytes need no alignment");
        let e = m.plan(&[&big, &big, &big, &short, &big], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 3 holds 2 bytes"), "{e}");
        let e = m.plan(&[&big, &big, &big, &odd, &big], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 3 at offset 1"), "{e}");
        let e = m.plan(&[&big, &big, &big, &big, &short], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 4"), "the epilogue's operand follows the zero point: {e}");
    }

    #[test]
    fn a_run_time_b_wider_than_a_byte_takes_the_reference() {
        let a = Tensor::new(vec![3, 4], Data::I32((0..12).collect()));
        let bv: Vec<i32> = (0..20).map(|i| i * 1000 - 7).collect();
        let want = product(&a, &Tensor::new(vec![4, 5], Data::I32(bv.clone())));
        let (s, _) = MatmulShape::infer(&[3, 4], &[4, 5]).unwrap();
        assert!(pack(&bv, 1, 4, 5).is_none());
        let Data::I32(av) = &a.data else { unreachable!() };
        let dq = Dequant::new(&want);
        let forms = byte_forms(av);
        for (path, (av, form)) in
            Path::available().into_iter().flat_map(|p| a_forms(av, &forms).into_iter().map(move |f| (p, f)))
        {
            let mut out = vec![0; 15];
            matmul_on(path, av, B::Rows(&bv), &mut out, &s, 2, &mut Vec::new(), &Bound::none()).unwrap();
            assert_eq!(Data::I32(out.clone()), want.data, "{path:?}, {form}");
            let run = |ep: &Bound, out: &mut [i32]| {
                matmul_on(path, av, B::Rows(&bv), out, &s, 2, &mut Vec::new(), ep).unwrap()
            };
            dq.check(run, &mut out, &format!("reference, {form}"));
        }
    }
}
