//! Data-movement kernels — reshape, transpose, slice, broadcast_to, concat, gather — and
//! einsum, over the strided loop nests of `super::nest`.
//!
//! Every data-movement op except gather is one or more *strided copies*: the result (or,
//! for concat, one operand's slab of it) walked in row-major order while the source pointer
//! advances by per-dim strides — transpose permutes the source strides, slice offsets and
//! scales them (negative for backward steps), broadcast_to zeroes them. Copies move
//! elements of 1, 4 or 8 bytes without looking at them, so one kernel serves every dtype.
//! After size-1 dims are dropped and dims that stay contiguous in both source and
//! destination are merged, the innermost dim decides the inner loop: contiguous on both
//! sides → a byte run moved 16 bytes at a time; source stride 0 → a fill with a splatted
//! element; anything else → element by element.
//!
//! A copy's parts (`Generated::parts`) split the outermost loop of each of its pieces (a
//! transposing copy is cut into tiles and strips, `tiled`), so every part writes its own
//! elements of the result; a piece that is a single run is copied by part 0.

use anyhow::{anyhow, bail, Result};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, InstBuilder, Type, Value};
use meshc_ir::attrs::{self, ScatterReduction as Sr};
use meshc_ir::infer::{norm_axes, norm_axis, parse_equation, slice_range};
use meshc_ir::{DType, Node, Op, TensorType};

use super::emit::{build_kernel, mem, KernelBuilder, F32X4, LANES};
use super::math::Math;
use super::nest::{advance, collapse, contiguous_strides, for_nest, for_parts, Dim};
use super::reduce::{for_chunks, load_vec, store_vec, sum_run};
use super::{parts_for, Generated, Target, STATUS_INDEX_OUT_OF_RANGE};

pub fn kernel(target: &Target, name: &str, node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Generated> {
    let func = match node.op {
        Op::Gather => gather(target, name, node, inputs, out)?,
        Op::ScatterElements => scatter_elements(target, name, node, inputs, out)?,
        Op::DynamicSlice | Op::DynamicUpdateSlice => return dynamic(target, name, node, inputs, out),
        Op::Einsum => einsum(target, name, node, inputs, out)?,
        Op::Iota => iota(target, name, node, inputs, out)?,
        _ => {
            let copies = copies(node, inputs, out)?;
            let esize = out.dtype.size_bytes() as i64;
            let pieces: Vec<(usize, Vec<Piece>)> = copies.iter().map(|c| (c.src_buf, c.pieces())).collect();
            // The parts split each piece's outermost loop, so the longest of those loops
            // bounds how many parts have work.
            let units = pieces.iter().flat_map(|(_, p)| p).map(outer).max().unwrap_or(1);
            let func = build_kernel(target, name, |kb| {
                let dst = kb.buf(0);
                for (src_buf, pieces) in &pieces {
                    let src = kb.buf(*src_buf);
                    for piece in pieces {
                        emit_piece(kb, esize, src, dst, piece);
                    }
                }
            });
            return Ok(Generated { func, scratch: 0, parts: parts_for(2 * out.size_bytes(), units) });
        }
    };
    Ok(Generated { func, scratch: 0, parts: 1 })
}

/// A strided copy from operand buffer `src_buf` into the result; offsets and the
/// `[source, destination]` strides of `dims` are in elements.
struct StridedCopy {
    src_buf: usize,
    src_off: i64,
    dst_off: i64,
    dims: Vec<Dim>,
}

impl StridedCopy {
    /// Whether every element it reads and writes lies inside buffers of `src_len` and
    /// `dst_len` elements.
    fn within(&self, src_len: usize, dst_len: usize) -> bool {
        let inside = |off: i64, len: usize, k: usize| {
            let (lo, hi) = self.dims.iter().fold((off, off), |(lo, hi), d| {
                let span = (d.n as i64 - 1) * d.strides[k];
                (lo + span.min(0), hi + span.max(0))
            });
            lo >= 0 && hi < len as i64
        };
        self.dims.iter().any(|d| d.n == 0) || (inside(self.src_off, src_len, 0) && inside(self.dst_off, dst_len, 1))
    }
}

/// The strided copies an op amounts to, checked to stay inside their buffers.
fn copies(node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Vec<StridedCopy>> {
    let copies = strided_copies(node, inputs, out)?;
    let fits = |c: &StridedCopy| {
        inputs[c.src_buf - 1].dtype == out.dtype && c.within(inputs[c.src_buf - 1].numel(), out.numel())
    };
    if !copies.iter().all(fits) {
        bail!(
            "{} of {} into {out}: the result type does not match the operands",
            node.op,
            inputs.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(copies)
}

fn strided_copies(node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Vec<StridedCopy>> {
    let x = inputs.first().ok_or_else(|| anyhow!("{} needs an operand", node.op))?;
    let (xs, os) = (contiguous_strides(&x.shape), contiguous_strides(&out.shape));
    let rank = x.rank();
    let single = |src_off: i64, dims: Vec<Dim>| vec![StridedCopy { src_buf: 1, src_off, dst_off: 0, dims }];
    Ok(match node.op {
        Op::Reshape => single(0, vec![Dim::new(out.numel(), &[1, 1])]),
        Op::Transpose => {
            let perm = match attrs::Transpose::of(node).perm {
                Some(p) => norm_axes(&p, rank).map_err(anyhow::Error::msg)?,
                None => (0..rank).rev().collect(),
            };
            if perm.len() != rank || out.rank() != rank {
                bail!("transpose perm {perm:?} does not match rank {rank}");
            }
            single(0, perm.iter().enumerate().map(|(d, &p)| Dim::new(out.shape[d], &[xs[p], os[d]])).collect())
        }
        Op::Slice => {
            let slice = attrs::Slice::of(node);
            let (starts, ends, steps) = (&slice.starts, &slice.ends, slice.steps_or_ones());
            let axes = norm_axes(&slice.axes_or_leading(), rank).map_err(anyhow::Error::msg)?;
            if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() || out.rank() != rank
            {
                bail!("slice starts, ends, axes and steps do not match");
            }
            let mut src_strides = xs.clone();
            let mut src_off = 0;
            for (k, &a) in axes.iter().enumerate() {
                let (first, _) = slice_range(starts[k], ends[k], steps[k], x.shape[a]).map_err(anyhow::Error::msg)?;
                src_off += first as i64 * xs[a];
                src_strides[a] = xs[a] * steps[k];
            }
            single(src_off, (0..rank).map(|d| Dim::new(out.shape[d], &[src_strides[d], os[d]])).collect())
        }
        // broadcast_like's second operand gives only the result's shape.
        Op::BroadcastTo | Op::BroadcastLike => {
            let lead = out.rank().checked_sub(rank).ok_or_else(|| anyhow!("{} cannot drop dims", node.op))?;
            let src_stride = |d: usize| if d < lead || x.shape[d - lead] == 1 { 0 } else { xs[d - lead] };
            single(0, (0..out.rank()).map(|d| Dim::new(out.shape[d], &[src_stride(d), os[d]])).collect())
        }
        Op::Concat => {
            let axis = norm_axis(attrs::Concat::of(node).axis, rank).map_err(anyhow::Error::msg)?;
            let mut at = 0;
            let mut copies = Vec::new();
            for (k, t) in inputs.iter().enumerate() {
                let ts = contiguous_strides(&t.shape);
                let dims = (0..rank).map(|d| Dim::new(t.shape[d], &[ts[d], os[d]])).collect();
                copies.push(StridedCopy { src_buf: k + 1, src_off: 0, dst_off: at * os[axis], dims });
                at += t.shape[axis] as i64;
            }
            copies
        }
        other => bail!("{other} is not a data-movement op"),
    })
}

/// The integer (or 16-byte vector) type that moves `bytes` bytes.
fn move_type(bytes: i64) -> Type {
    match bytes {
        1 => types::I8,
        2 => types::I16,
        4 => types::I32,
        8 => types::I64,
        _ => types::I8X16,
    }
}

/// A piece of a copy: source and destination offsets (elements) and its dims.
type Piece = (i64, i64, Vec<Dim>);

/// Iterations of a piece's outermost loop, the one the parts split (1: its only dim is the
/// innermost run, which part 0 copies alone).
fn outer((_, _, dims): &Piece) -> usize {
    if dims.len() > 1 {
        dims[0].n
    } else {
        1
    }
}

impl StridedCopy {
    /// The copy as pieces to emit (`tiled`), offsets included; none if it is empty.
    fn pieces(&self) -> Vec<Piece> {
        if self.dims.iter().any(|d| d.n == 0) {
            return Vec::new();
        }
        let pieces = tiled(collapse(&self.dims));
        pieces.into_iter().map(|(s, d, dims)| (self.src_off + s, self.dst_off + d, dims)).collect()
    }
}

/// One piece, this call's part of it: the parts split its outermost loop (every piece
/// covers its own elements of the result, so the parts of all pieces tile the result).
fn emit_piece(kb: &mut KernelBuilder, esize: i64, src: Value, dst: Value, (src_off, dst_off, dims): &Piece) {
    let src = kb.b.ins().iadd_imm_s(src, src_off * esize);
    let dst = kb.b.ins().iadd_imm_s(dst, dst_off * esize);
    emit_nest(kb, esize, src, dst, dims.clone());
}

/// Side of the square tiles of a transposing copy: 16 elements of 4 bytes are one 64-byte
/// cache line, so a tile reads 16 whole source lines and writes 16 whole destination lines
/// while all of them stay in L1.
const TILE: usize = 16;

/// A copy whose destination runs contiguously while its source jumps (a transpose: the
/// source's contiguous dim is an outer loop) reads one element per cache line, and at
/// strides of a page one per TLB entry: 16 ns an element for a 4096×1024 f32 transpose.
/// Such a copy is cut into `TILE`×`TILE` tiles (the two dims blocked, tiles innermost), plus
/// the strips the tiles leave at the ends of the two dims, as (source offset, destination
/// offset, dims) pieces; any other copy is one piece.
fn tiled(mut dims: Vec<Dim>) -> Vec<(i64, i64, Vec<Dim>)> {
    let t = TILE;
    let inner = dims.last().cloned();
    let partner = dims.iter().rposition(|d| d.strides[0] == 1 && d.n >= t);
    let (Some(inner), Some(o)) = (inner, partner) else { return vec![(0, 0, dims)] };
    let (ss, ds) = (inner.strides[0], inner.strides[1]);
    if ds != 1 || ss == 0 || ss == 1 || inner.n < t {
        return vec![(0, 0, dims)];
    }
    let outer = dims.remove(o);
    dims.pop();
    let (ss_o, ds_o) = (outer.strides[0], outer.strides[1]);
    let (bo, bi) = (outer.n / t * t, inner.n / t * t);
    let with = |tail: &[Dim]| dims.iter().cloned().chain(tail.iter().cloned()).collect::<Vec<_>>();
    let ti = t as i64;
    let mut pieces = vec![(
        0,
        0,
        with(&[
            Dim::new(bo / t, &[ti * ss_o, ti * ds_o]),
            Dim::new(bi / t, &[ti * ss, ti]),
            Dim::new(t, &[ss_o, ds_o]),
            Dim::new(t, &[ss, 1]),
        ]),
    )];
    if outer.n > bo {
        pieces.push((
            bo as i64 * ss_o,
            bo as i64 * ds_o,
            with(&[Dim::new(outer.n - bo, &[ss_o, ds_o]), inner.clone()]),
        ));
    }
    if inner.n > bi {
        pieces.push((
            bi as i64 * ss,
            bi as i64,
            with(&[Dim::new(bo, &[ss_o, ds_o]), Dim::new(inner.n - bi, &[ss, 1])]),
        ));
    }
    pieces
}

/// The loops of one piece of a copy, `src` and `dst` at its first element: the outer dims
/// as a nest cut into the kernel's parts, the innermost as `inner_copy`.
fn emit_nest(kb: &mut KernelBuilder, esize: i64, src: Value, dst: Value, mut dims: Vec<Dim>) {
    let mut inner = dims.pop().unwrap_or_else(|| Dim::new(1, &[1, 1]));
    // A copy collapsed to one dim has no outer loop to take a run-time row count: over
    // symbolic rows it is cut into its rows, each a run.
    if let Some(hi) = super::rows::scaling().filter(|&hi| dims.is_empty() && hi > 1 && inner.n.is_multiple_of(hi)) {
        let per = inner.n / hi;
        dims.push(Dim::new(hi, &inner.strides.iter().map(|&s| s * per as i64).collect::<Vec<_>>()));
        inner.n = per;
    }
    let outer: Vec<Dim> = dims.iter().map(|d| d.scaled(esize)).collect();
    let mut body = inner_copy(esize, inner);
    if outer.is_empty() {
        let first = kb.b.ins().icmp_imm_u(IntCC::Equal, kb.part, 0);
        kb.when(first, |kb| body(kb, &[src, dst]));
    } else {
        for_parts(kb, &outer, &[src, dst], &mut body);
    }
}

/// The innermost loop of a copy (`[source, destination]` pointers, strides in elements): a
/// byte run, a fill with one element, or element by element.
fn inner_copy(esize: i64, inner: Dim) -> impl FnMut(&mut KernelBuilder, &[Value]) {
    let n = inner.n as i64;
    let (ss, ds) = (inner.strides[0], inner.strides[1]);
    move |kb: &mut KernelBuilder, p: &[Value]| match (ss, ds) {
        (1, 1) => copy_run(kb, p[1], p[0], n * esize),
        (0, 1) => fill_run(kb, p[1], p[0], esize, n),
        _ => {
            let ty = move_type(esize);
            kb.for_const(0, n, 1, |kb, i| {
                let s = advance(kb, p[0], i, ss * esize);
                let d = advance(kb, p[1], i, ds * esize);
                let v = kb.b.ins().load(ty, mem(), s, 0);
                kb.b.ins().store(mem(), v, d, 0);
            });
        }
    }
}

/// dynamic_slice and dynamic_update_slice: a window of the operand at run-time starts,
/// each clamped into the operand as the interpreter does (`infer::dynamic_start`). The
/// dims before the first windowed axis are rows, cut into the kernel's parts (and the
/// call's rows over symbolic dims); the window's offset inside a row is the same for every
/// row. An update copies each of its rows of the operand to the result, unless the result
/// is the operand's own memory (the buffer plan may give it the operand's slot: it is in
/// place at operand 1), then writes the update's rows over it: a part touches only its
/// own rows, so no part overwrites another's window.
fn dynamic(target: &Target, name: &str, node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Generated> {
    let update = node.op == Op::DynamicUpdateSlice;
    let (x, starts) = (&inputs[0], inputs.last().expect("arity checked"));
    let axes = match node.op {
        Op::DynamicSlice => attrs::DynamicSlice::of(node).axes,
        _ => attrs::DynamicUpdateSlice::of(node).axes,
    };
    let axes = norm_axes(&axes, x.rank()).map_err(anyhow::Error::msg)?;
    // The window: the result of a slice, the update of an update.
    let window = if update { &inputs[1] } else { out };
    let fits = window.rank() == x.rank()
        && window.dtype == x.dtype
        && (!update || out == x)
        && (0..x.rank()).all(|d| {
            if axes.contains(&d) {
                window.shape[d] <= x.shape[d]
            } else {
                window.shape[d] == x.shape[d]
            }
        });
    if !fits || starts.shape != [axes.len()] {
        bail!("{} of {x} with starts {starts} into {out}: the types do not fit", node.op);
    }
    let ix = Indices::new(node.op, starts, 0)?;
    let esize = x.dtype.size_bytes() as i64;
    let lead = axes.iter().copied().min().unwrap_or(x.rank());
    let rows: usize = x.shape[..lead].iter().product();
    let (x_row, w_row) =
        (x.shape[lead..].iter().product::<usize>() as i64, window.shape[lead..].iter().product::<usize>() as i64);
    let (xs, ws) = (contiguous_strides(&x.shape), contiguous_strides(&window.shape));
    // The window's dims inside one row, with [source, destination] strides.
    let strides = |d: usize| if update { [ws[d], xs[d]] } else { [xs[d], ws[d]] };
    let mut dims = collapse(&(lead..x.rank()).map(|d| Dim::new(window.shape[d], &strides(d))).collect::<Vec<_>>());
    let empty = window.numel() == 0;
    let inner = dims.pop().unwrap_or_else(|| Dim::new(1, &[1, 1]));
    let nest: Vec<Dim> = dims.iter().map(|d| d.scaled(esize)).collect();
    let func = build_kernel(target, name, |kb| {
        let dst = kb.buf(0);
        let src = kb.buf(1);
        let (win, sp) = if update { (kb.buf(2), kb.buf(3)) } else { (dst, kb.buf(2)) };
        let mut offset = kb.iconst(0);
        for (k, &a) in axes.iter().enumerate() {
            let at = kb.b.ins().iadd_imm_s(sp, k as i64 * ix.size);
            let s = ix.load(kb, at);
            let (lo, hi) = (kb.iconst(0), kb.iconst((x.shape[a] - window.shape[a]) as i64));
            let s = kb.b.ins().smax(s, lo);
            let s = kb.b.ins().smin(s, hi);
            let bytes = kb.b.ins().imul_imm_s(s, xs[a] * esize);
            offset = kb.b.ins().iadd(offset, bytes);
        }
        let elsewhere = kb.b.ins().icmp(IntCC::NotEqual, dst, src);
        let rows_dim = [Dim::new(rows, &[x_row * esize, w_row * esize])];
        let mut row = |kb: &mut KernelBuilder, p: &[Value]| {
            // p: the row of x, and of the window (the result of a slice, the update).
            let (xr, wr) = (p[0], p[1]);
            let pair = if update {
                let moved = kb.b.ins().isub(xr, src);
                let dr = kb.b.ins().iadd(dst, moved);
                kb.when(elsewhere, |kb| copy_run(kb, dr, xr, x_row * esize));
                [wr, kb.b.ins().iadd(dr, offset)]
            } else {
                [kb.b.ins().iadd(xr, offset), wr]
            };
            if !empty {
                for_nest(kb, &nest, &pair, &mut inner_copy(esize, inner.clone()));
            }
        };
        for_parts(kb, &rows_dim, &[src, win], &mut row);
    });
    // An update that is not in place copies all of x: its parts are sized by that copy.
    let moved = if update { out.size_bytes() } else { window.size_bytes() };
    Ok(Generated { func, scratch: 0, parts: parts_for(2 * moved, rows) })
}

/// Stores `bytes` bytes at `dst` as pieces of `width` bytes (`piece(kb, base, offset)`
/// gives the piece at byte `base + offset`, `base` a loop value): a loop of four 16-byte
/// pieces, then single pieces, the last one ending exactly at `bytes` (overlapping the
/// previous piece rather than running past the end). `width` must not exceed `bytes`;
/// every offset is a multiple of the gcd of `width` and `bytes`.
fn store_run(
    kb: &mut KernelBuilder,
    dst: Value,
    bytes: i64,
    width: i64,
    piece: &mut dyn FnMut(&mut KernelBuilder, Value, i64) -> Value,
) {
    let unrolled = if width == 16 { 4 * width } else { width };
    let looped = bytes / unrolled * unrolled;
    if looped > unrolled {
        kb.for_const(0, looped, unrolled, |kb, i| {
            for k in 0..unrolled / width {
                let v = piece(kb, i, k * width);
                let d = kb.b.ins().iadd(dst, i);
                kb.b.ins().store(mem(), v, d, (k * width) as i32);
            }
        });
    }
    let zero = kb.iconst(0);
    let mut at = if looped > unrolled { looped } else { 0 };
    while at < bytes {
        let off = at.min(bytes - width);
        let v = piece(kb, zero, off);
        kb.b.ins().store(mem(), v, dst, off as i32);
        at = off + width;
    }
}

/// Copies `bytes` bytes from `src` to `dst` (distinct buffers).
fn copy_run(kb: &mut KernelBuilder, dst: Value, src: Value, bytes: i64) {
    let width = [16, 8, 4, 2, 1].into_iter().find(|&w| w <= bytes).unwrap_or(1);
    let ty = move_type(width);
    store_run(kb, dst, bytes, width, &mut |kb, i, off| {
        let s = kb.b.ins().iadd(src, i);
        kb.b.ins().load(ty, mem(), s, off as i32)
    });
}

/// Fills `n` elements of `esize` bytes at `dst` with the element at `src`.
fn fill_run(kb: &mut KernelBuilder, dst: Value, src: Value, esize: i64, n: i64) {
    let ty = move_type(esize);
    let elem = kb.b.ins().load(ty, mem(), src, 0);
    if n * esize < 16 {
        store_run(kb, dst, n * esize, esize, &mut |_, _, _| elem);
    } else {
        let vty = ty.by(16 / esize as u32).expect("16-byte vector");
        let splat = kb.b.ins().splat(vty, elem);
        store_run(kb, dst, n * esize, 16, &mut |_, _, _| splat);
    }
}

/// numpy `take`: validates every index first (so a bad index fails the kernel even when
/// the result is empty, as in the interpreter), then copies one `data` run per index.
/// The i32 or i64 indices of a gather or scatter along an axis of size `n`.
struct Indices {
    ty: Type,
    /// Bytes per index.
    size: i64,
    n: i64,
}

impl Indices {
    fn new(op: Op, idx: &TensorType, n: i64) -> Result<Indices> {
        let ty = match idx.dtype {
            DType::I32 => types::I32,
            DType::I64 => types::I64,
            other => bail!("{op} indices must be i32 or i64, got {other}"),
        };
        Ok(Indices { ty, size: idx.dtype.size_bytes() as i64, n })
    }

    /// The index at `at`, pointer-sized.
    fn load(&self, kb: &mut KernelBuilder, at: Value) -> Value {
        let i = kb.b.ins().load(self.ty, mem(), at, 0);
        if self.ty == kb.ptr {
            i
        } else {
            kb.b.ins().sextend(kb.ptr, i)
        }
    }

    /// Fails the kernel unless each of the `count` indices at `ip` lies in [-n, n): exactly
    /// when i + n, as unsigned, is below 2n.
    fn check_all(&self, kb: &mut KernelBuilder, ip: Value, count: Value) {
        let zero = kb.iconst(0);
        kb.for_range(zero, count, 1, |kb, j| {
            let at = kb.addr(ip, j, self.size);
            let i = self.load(kb, at);
            let shifted = kb.b.ins().iadd_imm_s(i, self.n);
            let bad = kb.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, shifted, 2 * self.n);
            kb.fail_if(bad, STATUS_INDEX_OUT_OF_RANGE);
        });
    }

    /// A checked index with a negative one counted from the end.
    fn wrap(&self, kb: &mut KernelBuilder, i: Value) -> Value {
        let wrapped = kb.b.ins().iadd_imm_s(i, self.n);
        let negative = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, i, 0);
        kb.b.ins().select(negative, wrapped, i)
    }
}

/// The indices a gather of single elements from many rows copies, row by row, at a time.
const GATHER_BLOCK: i64 = 256;

fn gather(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
) -> Result<cranelift_codegen::ir::Function> {
    let [data, idx] = inputs else { bail!("gather takes data and indices") };
    let axis = norm_axis(attrs::Gather::of(node).axis, data.rank()).map_err(anyhow::Error::msg)?;
    let esize = data.dtype.size_bytes() as i64;
    let n = data.shape[axis] as i64;
    let ix = Indices::new(node.op, idx, n)?;
    let outer: usize = data.shape[..axis].iter().product();
    let inner: usize = data.shape[axis + 1..].iter().product();
    let run = inner as i64 * esize;
    let count = idx.numel() as i64;
    if out.numel() != outer * idx.numel() * inner || out.dtype != data.dtype {
        bail!("gather result {out} does not match its operands");
    }
    Ok(build_kernel(target, name, |kb| {
        let (dst, src, ip) = (kb.buf(0), kb.buf(1), kb.buf(2));
        // Over symbolic rows that are the indices' leading dims, only the call's indices are
        // read: the rest of their buffer holds no index.
        let scaled = match outer {
            1 => super::rows::outer(kb, count as usize),
            _ => None,
        };
        let counted = scaled.unwrap_or_else(|| kb.iconst(count));
        ix.check_all(kb, ip, counted);
        if run == 0 {
            return;
        }
        // Over symbolic rows that are the data's leading dims (im2col's gathers over a
        // symbolic batch), only the call's rows of the data are gathered: blocks of
        // `per` rows, one block per row of the step.
        let per = super::rows::scaling().filter(|_| outer > 1).map_or(outer, |hi| (outer / hi).max(1));
        let data_rows = match outer {
            1 => None,
            _ => super::rows::outer(kb, outer),
        };
        let source = |kb: &mut KernelBuilder, j: Value| {
            let at = kb.addr(ip, j, ix.size);
            let i = ix.load(kb, at);
            ix.wrap(kb, i)
        };
        if inner == 1 && per >= 2 {
            // Single elements from many rows (im2col's gathers), a block of indices at a
            // time, each row copying the block's elements before the next row starts: the
            // block's indices stay in L1 for every row, and one row's stores stream
            // sequentially. Serving every row per index instead keeps `per` store streams
            // open whose strides are often multiples of 4 KiB (a 160×160 map's columns:
            // 9 taps × 25600 × 4 bytes), so they evict each other from one L1 set; a
            // 16-channel 3×3 im2col took 30 ms that way.
            let block = |kb: &mut KernelBuilder, src: Value, dst: Value| {
                kb.for_const(0, count, GATHER_BLOCK, |kb, jb| {
                    let end = kb.b.ins().iadd_imm_s(jb, GATHER_BLOCK);
                    let last = kb.iconst(count);
                    let end = kb.b.ins().smin(end, last);
                    kb.for_const(0, per as i64, 1, |kb, o| {
                        let s = kb.addr(src, o, n * esize);
                        let d = kb.addr(dst, o, count * esize);
                        kb.for_range(jb, end, 1, |kb, j| {
                            let i = source(kb, j);
                            let from = kb.addr(s, i, esize);
                            let to = kb.addr(d, j, esize);
                            let v = kb.b.ins().load(move_type(esize), mem(), from, 0);
                            kb.b.ins().store(mem(), v, to, 0);
                        });
                    });
                });
            };
            match data_rows {
                Some(rows) => {
                    let zero = kb.iconst(0);
                    kb.for_range(zero, rows, per as i64, |kb, o| {
                        let s = kb.addr(src, o, n * esize);
                        let d = kb.addr(dst, o, count * esize);
                        block(kb, s, d);
                    });
                }
                None => block(kb, src, dst),
            }
            return;
        }
        let mut row = |kb: &mut KernelBuilder, p: &[Value]| {
            let zero = kb.iconst(0);
            kb.for_range(zero, counted, 1, |kb, j| {
                let i = source(kb, j);
                let s = kb.addr(p[0], i, run);
                let d = kb.addr(p[1], j, run);
                copy_run(kb, d, s, run);
            });
        };
        match data_rows {
            Some(rows) => {
                let zero = kb.iconst(0);
                kb.for_range(zero, rows, 1, |kb, o| {
                    let s = kb.addr(src, o, n * run);
                    let d = kb.addr(dst, o, count * run);
                    row(kb, &[s, d]);
                });
            }
            None => for_nest(kb, &[Dim::new(outer, &[n * run, count * run])], &[src, dst], &mut row),
        }
    }))
}

/// An arithmetic run of a constant index table: `len` elements written from position `dst`
/// on, read from `src` on, `step` apart (0: one element repeated, as padding's).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Run {
    dst: i64,
    src: i64,
    len: i64,
    step: i64,
}

/// `reps` repetitions of the runs `members`, the k-th written `k·dst_step` further on and
/// each member reading `k` times its own source step further on: the runs of an im2col
/// table's tap over one output row, repeated down the rows.
#[derive(Debug, PartialEq)]
struct Group {
    reps: i64,
    dst_step: i64,
    members: Vec<(Run, i64)>,
}

/// The most runs a repeated group of `table_groups` takes (an im2col row: the left pad,
/// the input, the right pad).
const GROUP_PERIOD: usize = 4;

/// The most runs a gather of a constant table emits as code; a table that needs more (no
/// pattern) keeps the kernel that reads it.
const TABLE_RUNS: usize = 512;

/// `table` as maximal arithmetic runs of at least three elements (shorter ones as single
/// elements), in order.
fn table_runs(table: &[i64]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut j = 0;
    while j < table.len() {
        let (mut len, mut step) = (1, 0);
        if j + 1 < table.len() {
            step = table[j + 1] - table[j];
            len = 2;
            while j + len < table.len() && table[j + len] - table[j + len - 1] == step {
                len += 1;
            }
            if len < 3 {
                (len, step) = (1, 0);
            }
        }
        runs.push(Run { dst: j as i64, src: table[j], len: len as i64, step });
        j += len;
    }
    runs
}

/// How many times the first `p` runs of `runs` repeat from its start, each repetition the
/// same lengths and steps, shifted by the same distances.
fn repeats(runs: &[Run], p: usize) -> usize {
    let same = |k: usize| {
        (0..p).all(|i| {
            let (a, b, first) = (runs[(k - 1) * p + i], runs[k * p + i], runs[i]);
            b.len == first.len
                && b.step == first.step
                && b.dst - a.dst == runs[p].dst - runs[0].dst
                && b.src - a.src == runs[p + i].src - runs[i].src
        })
    };
    let mut k = 1;
    while (k + 1) * p <= runs.len() && same(k) {
        k += 1;
    }
    k
}

/// `runs` as repeated groups, each taking the period that covers the most runs.
fn table_groups(runs: &[Run]) -> Vec<Group> {
    let mut groups = Vec::new();
    let mut r = 0;
    while r < runs.len() {
        let rest = &runs[r..];
        let (reps, p) = (1..=GROUP_PERIOD.min(rest.len()))
            .map(|p| (repeats(rest, p), p))
            .max_by_key(|&(reps, p)| (reps * p, std::cmp::Reverse(p)))
            .expect("a run is left");
        let shift = |i: usize| if reps > 1 { rest[p + i].src - rest[i].src } else { 0 };
        groups.push(Group {
            reps: reps as i64,
            dst_step: if reps > 1 { rest[p].dst - rest[0].dst } else { 0 },
            members: (0..p).map(|i| (rest[i], shift(i))).collect(),
        });
        r += reps * p;
    }
    groups
}

/// A gather of single elements whose indices are the constant `table` (im2col's, pad's and
/// pool's tables), as copies of the table's runs — contiguous runs 16 bytes at a time,
/// padding as fills — written into the code, which never reads the table: a scalar load
/// of an index, its check and one element per index took most of a CNN's im2col time.
/// The rows of the data split into parts. `None` where the generic kernel is kept: a
/// symbolic program, elements wider than one value, an index out of range (which the
/// generic kernel reports when it runs) or a table without a pattern.
pub fn gather_table(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
    table: &[i64],
) -> Result<Option<Generated>> {
    let [data, idx] = inputs else { bail!("gather takes data and indices") };
    let axis = norm_axis(attrs::Gather::of(node).axis, data.rank()).map_err(anyhow::Error::msg)?;
    let esize = data.dtype.size_bytes() as i64;
    let n = data.shape[axis] as i64;
    let outer: usize = data.shape[..axis].iter().product();
    let inner: usize = data.shape[axis + 1..].iter().product();
    let count = idx.numel();
    if super::rows::scaling().is_some() || inner != 1 || table.len() != count || out.numel() != outer * count {
        return Ok(None);
    }
    if !matches!(esize, 1 | 2 | 4 | 8) || table.iter().any(|&i| i < -n || i >= n) {
        return Ok(None);
    }
    let table: Vec<i64> = table.iter().map(|&i| if i < 0 { i + n } else { i }).collect();
    let groups = table_groups(&table_runs(&table));
    if groups.iter().map(|g| g.members.len()).sum::<usize>() > TABLE_RUNS {
        return Ok(None);
    }
    let func = build_kernel(target, name, |kb| {
        let (dst, src) = (kb.buf(0), kb.buf(1));
        let rows = kb.iconst(outer as i64);
        let (start, end) = kb.part_range(rows);
        kb.for_range(start, end, 1, |kb, o| {
            let s = kb.addr(src, o, n * esize);
            let d = kb.addr(dst, o, count as i64 * esize);
            for g in &groups {
                let repetition = |kb: &mut KernelBuilder, k: Option<Value>| {
                    for &(run, shift) in &g.members {
                        let (mut to, mut from) = (d, s);
                        if let Some(k) = k {
                            to = kb.addr(to, k, g.dst_step * esize);
                            from = kb.addr(from, k, shift * esize);
                        }
                        let to = kb.b.ins().iadd_imm_s(to, run.dst * esize);
                        let from = kb.b.ins().iadd_imm_s(from, run.src * esize);
                        copy_table_run(kb, to, from, run, esize);
                    }
                };
                match g.reps {
                    1 => repetition(kb, None),
                    reps => kb.for_const(0, reps, 1, |kb, k| repetition(kb, Some(k))),
                }
            }
        });
    });
    Ok(Some(Generated { func, scratch: 0, parts: parts_for(2 * out.size_bytes(), outer) }))
}

/// Copies the `run` of a constant gather table from `src` (its first source element) to
/// `dst`.
fn copy_table_run(kb: &mut KernelBuilder, dst: Value, src: Value, run: Run, esize: i64) {
    match run.step {
        1 => copy_run(kb, dst, src, run.len * esize),
        0 => fill_run(kb, dst, src, esize, run.len),
        step => {
            let ty = move_type(esize);
            kb.for_const(0, run.len, 1, |kb, i| {
                let from = kb.addr(src, i, step * esize);
                let to = kb.addr(dst, i, esize);
                let v = kb.b.ins().load(ty, mem(), from, 0);
                kb.b.ins().store(mem(), v, to, 0);
            });
        }
    }
}

/// iota: the positions `0..n` of the operand's axis, whose elements it never reads. Over
/// symbolic rows (the axis a symbol sizes) it writes the call's count of them.
fn iota(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
) -> Result<cranelift_codegen::ir::Function> {
    let x = inputs.first().ok_or_else(|| anyhow!("iota needs an operand"))?;
    let n = x.shape[norm_axis(attrs::Iota::of(node).axis, x.rank()).map_err(anyhow::Error::msg)?];
    if out.shape != [n] || out.dtype != DType::I64 {
        bail!("iota result {out} does not match its operand {x}");
    }
    Ok(build_kernel(target, name, |kb| {
        let dst = kb.buf(0);
        let count = super::rows::outer(kb, n).unwrap_or_else(|| kb.iconst(n as i64));
        let zero = kb.iconst(0);
        kb.for_range(zero, count, 1, |kb, i| {
            let at = kb.addr(dst, i, 8);
            let v = if kb.ptr == types::I64 { i } else { kb.b.ins().sextend(types::I64, i) };
            kb.b.ins().store(mem(), v, at, 0);
        });
    }))
}

/// scatter_elements: every index checked first (an out-of-range one fails before anything is
/// written), data copied to the result, then the updates applied one by one in row-major
/// order of the indices, so a later duplicate wins or combines last, as in the interpreter.
fn scatter_elements(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
) -> Result<cranelift_codegen::ir::Function> {
    let [data, idx, upd] = inputs else { bail!("scatter_elements takes data, indices and updates") };
    let attrs::ScatterElements { axis, reduction } = attrs::ScatterElements::of(node);
    let axis = norm_axis(axis, data.rank()).map_err(anyhow::Error::msg)?;
    let fits = idx.rank() == data.rank() && (0..data.rank()).all(|d| d == axis || idx.shape[d] <= data.shape[d]);
    if out != data || upd.dtype != data.dtype || upd.shape != idx.shape || !fits {
        bail!("scatter_elements of {data}, {idx}, {upd} into {out}: the types do not match");
    }
    let (ty, float) = match (data.dtype, reduction) {
        (_, Sr::None) => (move_type(data.dtype.size_bytes() as i64), false),
        (DType::F32, _) => (types::F32, true),
        (DType::I32, _) => (types::I32, false),
        (DType::I64, _) => (types::I64, false),
        (other, r) => bail!("scatter_elements reduction {r} is not defined for {other}"),
    };
    let esize = data.dtype.size_bytes() as i64;
    let ix = Indices::new(node.op, idx, data.shape[axis] as i64)?;
    let isize = ix.size;
    let (istrides, dstrides) = (contiguous_strides(&idx.shape), contiguous_strides(&data.shape));
    // Per dim of the indices: their stride, the updates' (the same, in elements) and the
    // result's, which is 0 along the axis: there the index itself picks the element.
    let dims: Vec<Dim> = (0..idx.rank())
        .map(|d| {
            let at = if d == axis { 0 } else { dstrides[d] * esize };
            Dim::new(idx.shape[d], &[istrides[d] * isize, istrides[d] * esize, at])
        })
        .collect();
    let dims = collapse(&dims);
    let (count, axis_stride) = (idx.numel() as i64, dstrides[axis] * esize);
    Ok(build_kernel(target, name, |kb| {
        let (dst, src, ip, up) = (kb.buf(0), kb.buf(1), kb.buf(2), kb.buf(3));
        let counted = kb.iconst(count);
        ix.check_all(kb, ip, counted);
        copy_run(kb, dst, src, data.numel() as i64 * esize);
        for_nest(kb, &dims, &[ip, up, dst], &mut |kb, p| {
            let i = ix.load(kb, p[0]);
            let i = ix.wrap(kb, i);
            let at = kb.addr(p[2], i, axis_stride);
            let u = kb.b.ins().load(ty, mem(), p[1], 0);
            let v = match reduction {
                Sr::None => u,
                _ => {
                    let old = kb.b.ins().load(ty, mem(), at, 0);
                    match (reduction, float) {
                        (Sr::None, _) => unreachable!("no reduction stores the update"),
                        (Sr::Add, true) => kb.b.ins().fadd(old, u),
                        (Sr::Add, false) => kb.b.ins().iadd(old, u),
                        (Sr::Mul, true) => kb.b.ins().fmul(old, u),
                        (Sr::Mul, false) => kb.b.ins().imul(old, u),
                        (Sr::Max, true) => Math::new(&mut kb.b, types::F32, target).maximum(old, u),
                        (Sr::Max, false) => kb.b.ins().smax(old, u),
                        (Sr::Min, true) => Math::new(&mut kb.b, types::F32, target).minimum(old, u),
                        (Sr::Min, false) => kb.b.ins().smin(old, u),
                    }
                }
            };
            kb.b.ins().store(mem(), v, at, 0);
        });
    }))
}

/// einsum as a loop nest: output letters outside, summed letters inside, one accumulator
/// per output element. When the last output letter is contiguous (or absent) in every
/// operand, it is vectorised: `CHUNK` output elements at a time, in f32x4 accumulators
/// (`bij,bjk->bik`). Else, when the last summed letter is, each output element is a
/// vectorised dot product (`bqd,bkd->bqk`). Otherwise each output element is a scalar
/// sum, accumulated in f64 like the interpreter.
fn einsum(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
) -> Result<cranelift_codegen::ir::Function> {
    let (terms, out_letters) =
        parse_equation(&attrs::Einsum::of(node).equation, inputs.len()).map_err(anyhow::Error::msg)?;
    // Per letter: its size and its element stride in [result, operand 0, operand 1, ...].
    let mut letters: Vec<(char, Dim)> = Vec::new();
    for (k, (term, t)) in terms.iter().zip(inputs).enumerate() {
        if term.len() != t.rank() || t.dtype != DType::F32 {
            bail!("einsum operand {k} ({t}) does not match term '{}'", term.iter().collect::<String>());
        }
        let ts = contiguous_strides(&t.shape);
        for (d, &c) in term.iter().enumerate() {
            let slot = match letters.iter().position(|(l, _)| *l == c) {
                Some(p) => p,
                None => {
                    letters.push((c, Dim { n: t.shape[d], strides: vec![0; inputs.len() + 1] }));
                    letters.len() - 1
                }
            };
            if letters[slot].1.n != t.shape[d] {
                bail!("einsum letter '{c}' has sizes {} and {}", letters[slot].1.n, t.shape[d]);
            }
            letters[slot].1.strides[k + 1] = ts[d];
        }
    }
    let os = contiguous_strides(&out.shape);
    let mut outer = Vec::new();
    for (d, c) in out_letters.iter().enumerate() {
        let (_, dim) = letters
            .iter_mut()
            .find(|(l, _)| l == c)
            .ok_or_else(|| anyhow!("einsum output letter '{c}' is in no operand"))?;
        dim.strides[0] = os[d];
        outer.push(dim.clone());
    }
    // Summed letters advance only the operands' pointers.
    let summed: Vec<Dim> =
        letters.iter().filter(|(c, _)| !out_letters.contains(c)).map(|(_, d)| Dim::new(d.n, &d.strides[1..])).collect();
    if out.shape != outer.iter().map(|d| d.n).collect::<Vec<_>>() {
        bail!("einsum result {out} does not match the equation");
    }
    // Empty dims need no care: a loop over 0 leaves the sums at 0 or runs nothing.
    let mut outer = collapse(&outer);
    let mut summed = collapse(&summed);
    // Vectorise along the last output letter if every operand walks it contiguously (or
    // not at all); failing that, along the last summed letter (each result a dot product).
    let vector = pop_contiguous(&mut outer);
    let dot = if vector.is_none() { pop_contiguous(&mut summed) } else { None };
    let outer: Vec<Dim> = outer.iter().map(|d| d.scaled(4)).collect();
    let summed: Vec<Dim> = summed.iter().map(|d| d.scaled(4)).collect();
    Ok(build_kernel(target, name, |kb| {
        let ptrs: Vec<Value> = (0..=inputs.len()).map(|i| kb.buf(i)).collect();
        for_nest(kb, &outer, &ptrs, &mut |kb, p| match (&vector, &dot) {
            (Some(v), _) => for_chunks(kb, v.n, &mut |kb, first, len| {
                let at: Vec<Value> = p.iter().zip(&v.strides).map(|(&q, &s)| advance(kb, q, first, 4 * s)).collect();
                einsum_chunk(kb, target, &at, &v.strides[1..], &summed, len);
            }),
            (None, Some(d)) => einsum_dot(kb, target, p, &d.strides, &summed, d.n),
            (None, None) => einsum_scalar(kb, p, &summed),
        });
    }))
}

/// Removes and returns the last dim if it is worth vectorising: at least a vector long,
/// with every stride 0 or 1.
fn pop_contiguous(dims: &mut Vec<Dim>) -> Option<Dim> {
    let last = dims.last().filter(|d| d.n >= LANES && d.strides.iter().all(|&s| s == 0 || s == 1))?.clone();
    dims.pop();
    Some(last)
}

/// Per operand, along the vectorised letter: its element splatted if it stays put
/// (stride 0), else `None` (it is loaded a vector at a time).
fn fixed_factors(kb: &mut KernelBuilder, q: &[Value], strides: &[i64]) -> Vec<Option<Value>> {
    q.iter()
        .zip(strides)
        .map(|(&ptr, &s)| {
            (s == 0).then(|| {
                let x = kb.b.ins().load(types::F32, mem(), ptr, 0);
                kb.b.ins().splat(F32X4, x)
            })
        })
        .collect()
}

/// The operands' factors for the `width` elements `off` bytes along the vectorised letter.
fn factors(kb: &mut KernelBuilder, q: &[Value], fixed: &[Option<Value>], off: Value, width: usize) -> Vec<Value> {
    q.iter()
        .zip(fixed)
        .map(|(&ptr, f)| match f {
            Some(v) => *v,
            None => {
                let at = kb.b.ins().iadd(ptr, off);
                load_vec(kb, at, width)
            }
        })
        .collect()
}

/// One chunk of `len` (<= CHUNK) contiguous output elements, one f32x4 accumulator per
/// vector; `strides` (0 or 1, per operand) say which operands walk along with the chunk.
fn einsum_chunk(kb: &mut KernelBuilder, target: &Target, p: &[Value], strides: &[i64], summed: &[Dim], len: usize) {
    let vectors: Vec<usize> = (0..len.div_ceil(LANES)).map(|s| (len - s * LANES).min(LANES)).collect();
    let zero = kb.splat(0.0);
    let acc: Vec<_> = vectors.iter().map(|_| kb.b.declare_var(F32X4)).collect();
    for &a in &acc {
        kb.b.def_var(a, zero);
    }
    for_nest(kb, summed, &p[1..], &mut |kb, q| {
        let fixed = fixed_factors(kb, q, strides);
        for (slot, (&a, &width)) in acc.iter().zip(&vectors).enumerate() {
            let off = kb.iconst((slot * LANES * 4) as i64);
            let mut f = factors(kb, q, &fixed, off, width);
            let last = f.pop().expect("einsum has an operand");
            let sum = kb.b.use_var(a);
            let next = match f.split_first() {
                None => kb.b.ins().fadd(sum, last),
                Some((&first, rest)) => {
                    let prod = rest.iter().fold(first, |x, &y| kb.b.ins().fmul(x, y));
                    Math::new(&mut kb.b, F32X4, target).madd(prod, last, sum)
                }
            };
            kb.b.def_var(a, next);
        }
    });
    for (slot, (&a, &width)) in acc.iter().zip(&vectors).enumerate() {
        let v = kb.b.use_var(a);
        let at = kb.b.ins().iadd_imm_s(p[0], (slot * LANES * 4) as i64);
        store_vec(kb, v, at, width);
    }
}

/// One output element: for each point of the outer `summed` letters, the dot product of
/// the operands' contiguous runs of `n` elements along the last summed letter.
fn einsum_dot(kb: &mut KernelBuilder, target: &Target, p: &[Value], strides: &[i64], summed: &[Dim], n: usize) {
    let acc = kb.b.declare_var(types::F32);
    let zero = kb.f32const(0.0);
    kb.b.def_var(acc, zero);
    for_nest(kb, summed, &p[1..], &mut |kb, q| {
        let fixed = fixed_factors(kb, q, strides);
        let dot = sum_run(kb, target, n, &mut |kb, off, width| {
            let f = factors(kb, q, &fixed, off, width);
            f[1..].iter().fold(f[0], |x, &y| kb.b.ins().fmul(x, y))
        });
        let sum = kb.b.use_var(acc);
        let next = kb.b.ins().fadd(sum, dot);
        kb.b.def_var(acc, next);
    });
    let sum = kb.b.use_var(acc);
    kb.b.ins().store(mem(), sum, p[0], 0);
}

/// One output element: the f64 sum over `summed` of the f64 product of the operands.
fn einsum_scalar(kb: &mut KernelBuilder, p: &[Value], summed: &[Dim]) {
    let acc = kb.b.declare_var(types::F64);
    let zero = kb.b.ins().f64const(0.0);
    kb.b.def_var(acc, zero);
    for_nest(kb, summed, &p[1..], &mut |kb, q| {
        let mut prod = None;
        for &ptr in q {
            let x = kb.b.ins().load(types::F32, mem(), ptr, 0);
            let x = kb.b.ins().fpromote(types::F64, x);
            prod = Some(match prod {
                None => x,
                Some(y) => kb.b.ins().fmul(y, x),
            });
        }
        let sum = kb.b.use_var(acc);
        let next = kb.b.ins().fadd(sum, prod.expect("einsum has an operand"));
        kb.b.def_var(acc, next);
    });
    let sum = kb.b.use_var(acc);
    let r = kb.b.ins().fdemote(types::F32, sum);
    kb.b.ins().store(mem(), r, p[0], 0);
}

/// Test support shared with the reduction tests: runs a kernel generator on random or
/// given operands and compares it with the interpreter.
#[cfg(test)]
pub(crate) mod testing {
    use super::super::emit::testing::run;
    use super::super::{Generated, Target};
    use meshc_ir::infer::{infer, Operand};
    use meshc_ir::init::uniform01;
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Attr, DType, Data, Node, Op, Tensor, TensorType};

    pub type Gen = fn(&Target, &str, &Node, &[TensorType], &TensorType) -> anyhow::Result<Generated>;

    /// Filler after every buffer: a kernel must leave it alone.
    const GUARD: u8 = 0xA5;

    pub fn node(op: Op, operands: usize, attrs: &[(&str, Attr)]) -> Node {
        let names: Vec<String> = (0..operands).map(|i| format!("x{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        attrs.iter().fold(Node::new("k", op, &names), |n, (k, v)| n.with_attr(k, v.clone()))
    }

    pub fn ints(v: &[i64]) -> Attr {
        Attr::ints(v)
    }

    /// Deterministic values of `dtype` in [lo, hi) (ints rounded down; bools from the sign
    /// about the middle).
    pub fn random(dtype: DType, shape: &[usize], lo: f64, hi: f64, seed: u64) -> Tensor {
        let n = shape.iter().product::<usize>() as u64;
        let v = (0..n).map(|k| lo + (hi - lo) * uniform01(seed, k));
        let data = match dtype {
            DType::F32 => Data::from_f64(dtype, v),
            DType::Bool => Data::Bool(v.map(|x| x > (lo + hi) / 2.0).collect()),
            _ => Data::from_f64(dtype, v.map(f64::floor)),
        };
        Tensor::new(shape.to_vec(), data)
    }

    /// A 64-byte-aligned buffer of exactly `bytes.len()` bytes followed by a guard zone.
    struct Buf {
        store: Vec<u8>,
        at: usize,
        len: usize,
    }

    impl Buf {
        fn new(bytes: &[u8]) -> Buf {
            let mut store = vec![GUARD; bytes.len() + 128];
            let at = store.as_ptr().align_offset(64);
            store[at..at + bytes.len()].copy_from_slice(bytes);
            Buf { store, at, len: bytes.len() }
        }

        fn data(&self) -> &[u8] {
            &self.store[self.at..self.at + self.len]
        }

        fn guard_intact(&self) -> bool {
            self.store[self.at + self.len..].iter().all(|&b| b == GUARD)
        }
    }

    pub fn out_type(n: &Node, args: &[Tensor]) -> TensorType {
        let tys: Vec<TensorType> = args.iter().map(Tensor::ty).collect();
        let ops: Vec<Operand> = tys.iter().map(|ty| Operand { ty, dims: None }).collect();
        infer(n, &ops).expect("test node is well-formed").ty
    }

    /// Compiles the kernel for the host and for x86-64-v2 (no AVX, no FMA), runs each on
    /// `args`, and returns each run's status and result.
    pub fn run_kernel(gen: Gen, n: &Node, args: &[Tensor]) -> Vec<(u32, Tensor)> {
        let out = out_type(n, args);
        let tys: Vec<TensorType> = args.iter().map(Tensor::ty).collect();
        ["native", "x86-64-v2"]
            .iter()
            .map(|t| {
                let target = Target::by_name(t).unwrap();
                let g = gen(&target, "k", n, &tys, &out).unwrap_or_else(|e| panic!("{} {:?}: {e}", n.op, n.attrs));
                let mut bufs: Vec<Buf> = std::iter::once(vec![0u8; out.size_bytes()])
                    .chain(args.iter().map(Tensor::to_le_bytes))
                    .map(|b| Buf::new(&b))
                    .collect();
                let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b.store[b.at..]).collect();
                let status = run(&target, g.func, &mut slices);
                assert!(bufs.iter().all(Buf::guard_intact), "{} {:?} on {t}: wrote past a buffer", n.op, n.attrs);
                for (b, a) in bufs[1..].iter().zip(args) {
                    assert_eq!(b.data(), a.to_le_bytes(), "{} {:?} on {t}: changed an operand", n.op, n.attrs);
                }
                (status, Tensor::from_le_bytes(&out, bufs[0].data()))
            })
            .collect()
    }

    /// Checks the kernel against the interpreter: f32 within 1e-5 + 1e-4·|want| (NaN where
    /// the interpreter has NaN), other dtypes exactly.
    pub fn check(gen: Gen, n: &Node, args: &[Tensor]) {
        let refs: Vec<&Tensor> = args.iter().collect();
        let want = eval_node(n, &refs, &out_type(n, args)).expect("interpreter");
        for (status, got) in run_kernel(gen, n, args) {
            let what =
                format!("{} {:?} on {:?}", n.op, n.attrs, args.iter().map(|a| a.ty().to_string()).collect::<Vec<_>>());
            assert_eq!(status, 0, "{what}");
            match (&got.data, &want.data) {
                (Data::F32(g), Data::F32(w)) => {
                    for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
                        let ok = if w.is_nan() { g.is_nan() } else { (g - w).abs() <= 1e-5 + 1e-4 * w.abs() || g == w };
                        assert!(ok, "{what}: element {i} is {g}, want {w}");
                    }
                }
                _ => assert_eq!(got, want, "{what}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::STATUS_INDEX_OUT_OF_RANGE;
    use super::testing::{check, ints, node, out_type, random, run_kernel};
    use super::*;
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Attr, Data, Tensor};

    fn each_dtype(seed: u64, shape: &[usize], mut f: impl FnMut(Tensor)) {
        for (k, d) in DType::ALL.into_iter().enumerate() {
            f(random(d, shape, -1000.0, 1000.0, seed + k as u64));
        }
    }

    #[test]
    fn transpose() {
        let cases: &[(&[usize], Option<&[i64]>)] = &[
            (&[5, 7], None),
            (&[2, 3, 4, 5], Some(&[0, 2, 1, 3])),
            (&[2, 3, 4, 8], Some(&[3, 1, 0, 2])),
            (&[3, 1, 17], Some(&[1, 2, 0])),
            (&[4, 5, 6], Some(&[0, 1, 2])),
            (&[], None),
            // Tiled: whole tiles only, strips along both dims, batched, and a tile partner
            // that is not the next-to-last dim.
            (&[32, 48], None),
            (&[37, 21], None),
            (&[2, 20, 33], Some(&[0, 2, 1])),
            (&[18, 3, 40], Some(&[2, 1, 0])),
        ];
        for (i, &(shape, perm)) in cases.iter().enumerate() {
            let attrs: Vec<(&str, Attr)> = perm.map(|p| ("perm", ints(p))).into_iter().collect();
            each_dtype(i as u64 * 10, shape, |x| check(kernel, &node(Op::Transpose, 1, &attrs), &[x]));
        }
    }

    /// Called as any number of parts, a copy writes every element of the result exactly
    /// once, with the bits of the whole call: tiled transposes with their strips, a
    /// transpose whose only dim is a run, slices, concat, broadcasts.
    #[test]
    fn copies_split_into_parts() {
        use crate::codegen::emit::testing::check_parts;
        let target = Target::by_name("native").unwrap();
        let f32s = |shapes: &[&[usize]]| -> Vec<Tensor> {
            shapes.iter().enumerate().map(|(k, s)| random(DType::F32, s, -50.0, 50.0, 7 + k as u64)).collect()
        };
        let cases: Vec<(Node, Vec<Tensor>)> = vec![
            (node(Op::Transpose, 1, &[]), f32s(&[&[37, 21]])),
            (node(Op::Transpose, 1, &[("perm", ints(&[0, 2, 3, 1]))]), f32s(&[&[2, 13, 12, 32]])),
            (node(Op::Transpose, 1, &[("perm", ints(&[0, 2, 1, 3]))]), f32s(&[&[2, 13, 12, 32]])),
            (node(Op::Transpose, 1, &[("perm", ints(&[1, 0]))]), f32s(&[&[1, 40]])),
            (node(Op::Slice, 1, &[("starts", ints(&[1, 3])), ("ends", ints(&[3, 37]))]), f32s(&[&[4, 40]])),
            (node(Op::Concat, 3, &[("axis", Attr::Int(1))]), f32s(&[&[2, 3, 5], &[2, 1, 5], &[2, 4, 5]])),
            (node(Op::BroadcastTo, 1, &[("shape", ints(&[4, 3, 5]))]), f32s(&[&[5]])),
            (
                node(Op::DynamicSlice, 2, &[("axes", ints(&[2])), ("sizes", ints(&[3]))]),
                vec![random(DType::F32, &[5, 3, 7], -9.0, 9.0, 3), index(DType::I64, &[1], &[2])],
            ),
            (
                node(Op::DynamicUpdateSlice, 3, &[("axes", ints(&[1]))]),
                vec![
                    random(DType::F32, &[6, 9, 2], -9.0, 9.0, 4),
                    random(DType::F32, &[6, 4, 2], -9.0, 9.0, 5),
                    index(DType::I32, &[1], &[3]),
                ],
            ),
        ];
        for (n, args) in cases {
            let out = testing::out_type(&n, &args);
            let tys: Vec<TensorType> = args.iter().map(Tensor::ty).collect();
            let g = kernel(&target, "k", &n, &tys, &out).unwrap();
            let mut ins: Vec<Vec<u8>> = args.iter().map(Tensor::to_le_bytes).collect();
            check_parts(&target, g.func, out.size_bytes(), &mut ins, &format!("{} {:?}", n.op, n.attrs));
        }
    }

    #[test]
    fn slice() {
        type Case<'a> = (&'a [usize], &'a [i64], &'a [i64], Option<&'a [i64]>, Option<&'a [i64]>);
        let cases: &[Case] = &[
            (&[4, 40], &[1, 3], &[3, 37], None, None),
            (&[6, 7], &[5, -1], &[-100, 0], None, Some(&[-2, -3])),
            (&[6, 7], &[-1], &[-8], Some(&[1]), Some(&[-1])),
            (&[3, 4, 9], &[0, 8], &[100, 0], Some(&[0, 2]), Some(&[1, -1])),
            (&[3, 4, 9], &[2], &[2], Some(&[1]), None),
            (&[10], &[1], &[9], None, Some(&[3])),
            (&[2, 50], &[0], &[1], None, None),
        ];
        for (i, &(shape, starts, ends, axes, steps)) in cases.iter().enumerate() {
            let mut attrs = vec![("starts", ints(starts)), ("ends", ints(ends))];
            attrs.extend(axes.map(|a| ("axes", ints(a))));
            attrs.extend(steps.map(|s| ("steps", ints(s))));
            each_dtype(i as u64 * 10, shape, |x| check(kernel, &node(Op::Slice, 1, &attrs), &[x]));
        }
    }

    #[test]
    fn concat() {
        let cases: &[(i64, &[&[usize]])] = &[
            (1, &[&[2, 3, 5], &[2, 1, 5], &[2, 4, 5]]),
            (0, &[&[3, 7], &[1, 7], &[2, 7]]),
            (-1, &[&[3, 2], &[3, 5], &[3, 0], &[3, 9]]),
            (2, &[&[2, 2, 1], &[2, 2, 3]]),
        ];
        for (i, &(axis, shapes)) in cases.iter().enumerate() {
            for d in DType::ALL {
                let args: Vec<Tensor> =
                    shapes.iter().enumerate().map(|(k, s)| random(d, s, -50.0, 50.0, (i * 10 + k) as u64)).collect();
                check(kernel, &node(Op::Concat, args.len(), &[("axis", Attr::Int(axis))]), &args);
            }
        }
    }

    #[test]
    fn broadcast_and_reshape() {
        let cases: &[(&[usize], &[i64])] = &[
            (&[3, 1], &[2, 3, 5]),
            (&[5], &[4, 3, 5]),
            (&[1, 3, 1], &[2, 3, 4]),
            (&[1], &[37]),
            (&[2, 1, 6], &[2, 3, 6]),
            (&[], &[3, 2]),
        ];
        for (i, &(from, to)) in cases.iter().enumerate() {
            each_dtype(i as u64, from, |x| check(kernel, &node(Op::BroadcastTo, 1, &[("shape", ints(to))]), &[x]));
        }
        // broadcast_like reads only its second operand's shape.
        for (i, &(from, to)) in cases.iter().enumerate() {
            let like = random(DType::F32, &to.iter().map(|&d| d as usize).collect::<Vec<_>>(), 0.0, 1.0, 5);
            each_dtype(i as u64, from, |x| check(kernel, &node(Op::BroadcastLike, 2, &[]), &[x, like.clone()]));
        }
        each_dtype(1, &[3, 4, 5], |x| check(kernel, &node(Op::Reshape, 1, &[("shape", ints(&[5, -1]))]), &[x]));
        each_dtype(2, &[7], |x| check(kernel, &node(Op::Reshape, 1, &[("shape", ints(&[7, 1]))]), &[x]));
        each_dtype(3, &[200, 3], |x| check(kernel, &node(Op::Reshape, 1, &[("shape", ints(&[600]))]), &[x]));
    }

    fn index(dtype: DType, shape: &[usize], v: &[i64]) -> Tensor {
        let data = match dtype {
            DType::I32 => Data::I32(v.iter().map(|&i| i as i32).collect()),
            _ => Data::I64(v.to_vec()),
        };
        Tensor::new(shape.to_vec(), data)
    }

    #[test]
    fn dynamic_slices() {
        // (operand, axes, window, starts): clamped past either end, several axes, an empty
        // window, a window of the whole axis, the innermost axis and the outermost.
        type Case<'a> = (&'a [usize], &'a [i64], &'a [usize], &'a [i64]);
        let cases: &[Case] = &[
            (&[4, 6, 5], &[1], &[4, 3, 5], &[2]),
            (&[4, 6, 5], &[1], &[4, 3, 5], &[5]),
            (&[4, 6, 5], &[-2], &[4, 3, 5], &[-3]),
            (&[4, 6, 5], &[0, 2], &[2, 6, 1], &[3, 4]),
            (&[4, 6, 5], &[2], &[4, 6, 0], &[1]),
            (&[4, 6, 5], &[1], &[4, 6, 5], &[1]),
            (&[7], &[0], &[3], &[i64::MAX]),
        ];
        for (i, &(shape, axes, window, starts)) in cases.iter().enumerate() {
            let picked = norm_axes(axes, shape.len()).unwrap();
            let sizes: Vec<i64> = picked.iter().map(|&a| window[a] as i64).collect();
            for id in [DType::I32, DType::I64] {
                let s = index(id, &[starts.len()], starts);
                each_dtype(i as u64, shape, |x| {
                    let n = node(Op::DynamicSlice, 2, &[("axes", ints(axes)), ("sizes", ints(&sizes))]);
                    check(kernel, &n, &[x.clone(), s.clone()]);
                    let u = random(x.dtype(), window, -5.0, 5.0, 99 + i as u64);
                    check(kernel, &node(Op::DynamicUpdateSlice, 3, &[("axes", ints(axes))]), &[x, u, s.clone()]);
                });
            }
        }
    }

    /// With its result in its operand's memory (the buffer plan's in-place slot), an update
    /// writes only the window, whichever of several parts runs it.
    #[test]
    fn dynamic_update_in_place() {
        let target = Target::by_name("native").unwrap();
        let (x, u) = (random(DType::F32, &[4, 9, 3], -9.0, 9.0, 1), random(DType::F32, &[4, 2, 3], -9.0, 9.0, 2));
        let s = index(DType::I64, &[1], &[6]);
        let n = node(Op::DynamicUpdateSlice, 3, &[("axes", ints(&[1]))]);
        let want = eval_node(&n, &[&x, &u, &s], &x.ty()).unwrap();
        let tys: Vec<TensorType> = [&x, &u, &s].iter().map(|t| t.ty()).collect();
        let g = kernel(&target, "k", &n, &tys, &x.ty()).unwrap();
        let code = crate::codegen::module::jit(&target, g.func).unwrap();
        let call = crate::codegen::KernelTable::get(&code, 0).unwrap();
        for parts in [1, 3] {
            let (mut xb, mut ub, mut sb) = (x.to_le_bytes(), u.to_le_bytes(), s.to_le_bytes());
            let ptrs = [xb.as_mut_ptr(), xb.as_mut_ptr(), ub.as_mut_ptr(), sb.as_mut_ptr()];
            for part in 0..parts {
                // SAFETY: compiled for this host, with the buffers its types give.
                assert_eq!(unsafe { call(ptrs.as_ptr(), part, parts) }, 0);
            }
            assert_eq!(Tensor::from_le_bytes(&x.ty(), &xb), want, "{parts} parts");
        }
    }

    #[test]
    fn scatter_elements() {
        // (data shape, axis, indices shape, indices): duplicates, negatives, indices smaller
        // than data off the axis, rank 1 to 3, an empty index list.
        type Case<'a> = (&'a [usize], i64, &'a [usize], &'a [i64]);
        let cases: &[Case] = &[
            (&[5], 0, &[4], &[1, -1, 1, 0]),
            (&[3, 4], 0, &[2, 3], &[1, 0, 2, -1, 2, 1]),
            (&[3, 4], 1, &[2, 2], &[3, 3, -4, 0]),
            (&[2, 5, 3], 1, &[2, 3, 2], &[4, 0, -1, 2, 2, 2, 0, 1, 3, -5, 4, 4]),
            (&[2, 3], -1, &[0, 3], &[]),
        ];
        let red = |r: &str| ("reduction", Attr::Str(r.into()));
        for (i, &(shape, axis, ishape, idx)) in cases.iter().enumerate() {
            for id in [DType::I32, DType::I64] {
                let ax = ("axis", Attr::Int(axis));
                each_dtype(i as u64, shape, |x| {
                    let u = random(x.dtype(), ishape, -1000.0, 1000.0, 40 + i as u64);
                    check(
                        kernel,
                        &node(Op::ScatterElements, 3, std::slice::from_ref(&ax)),
                        &[x, index(id, ishape, idx), u],
                    );
                });
                for r in ["add", "mul", "max", "min"] {
                    for dt in [DType::F32, DType::I32, DType::I64] {
                        let x = random(dt, shape, -1000.0, 1000.0, i as u64);
                        let u = random(dt, ishape, -1000.0, 1000.0, 40 + i as u64);
                        let n = node(Op::ScatterElements, 3, &[ax.clone(), red(r)]);
                        check(kernel, &n, &[x, index(id, ishape, idx), u]);
                    }
                }
            }
        }
        // Out of range either way: the status, whatever else the kernel would write.
        for idx in [&[0, 5, 1][..], &[-6, 0, 0]] {
            for id in [DType::I32, DType::I64] {
                let args = [
                    random(DType::F32, &[5, 2], 0.0, 1.0, 9),
                    index(id, &[3, 1], idx),
                    random(DType::F32, &[3, 1], 0.0, 1.0, 8),
                ];
                for (status, _) in run_kernel(kernel, &node(Op::ScatterElements, 3, &[]), &args) {
                    assert_eq!(status, STATUS_INDEX_OUT_OF_RANGE, "{idx:?}");
                }
            }
        }
    }

    #[test]
    fn iota() {
        for (shape, axis) in [(&[5, 3][..], 0), (&[5, 3], -1), (&[2, 0, 7], 2), (&[33], 0), (&[1, 2, 3], 1)] {
            let x = random(DType::F32, shape, 0.0, 1.0, 3);
            check(kernel, &node(Op::Iota, 1, &[("axis", Attr::Int(axis))]), &[x]);
        }
    }

    #[test]
    fn gather() {
        // (data shape, axis, indices shape, indices)
        type Case<'a> = (&'a [usize], i64, &'a [usize], &'a [i64]);
        let cases: &[Case] = &[
            (&[5, 6], 0, &[2, 3], &[0, 4, -1, 2, -5, 3]),
            (&[4, 5], 1, &[4], &[-1, 0, -5, 3]),
            (&[3, 5, 4], 1, &[2, 2], &[4, -2, 0, 1]),
            (&[3, 5, 4], -1, &[], &[2]),
            (&[10, 33], 0, &[3], &[9, 0, 9]),
            (&[3, 2, 7], 2, &[2, 5], &[6, 0, -1, 3, -7, 2, 2, 5, 1, -3]),
            (&[2, 3], 0, &[0], &[]),
        ];
        for (i, &(shape, axis, ishape, idx)) in cases.iter().enumerate() {
            for id in [DType::I32, DType::I64] {
                each_dtype(i as u64, shape, |x| {
                    check(kernel, &node(Op::Gather, 2, &[("axis", Attr::Int(axis))]), &[x, index(id, ishape, idx)])
                });
            }
        }
        // Out of range, either way, whatever else the kernel would copy.
        for (shape, ishape, idx) in
            [(&[5, 2][..], &[3][..], &[0, 5, 1][..]), (&[5, 2], &[2], &[-6, 0]), (&[0, 2], &[1], &[0])]
        {
            for id in [DType::I32, DType::I64] {
                let args = [random(DType::F32, shape, 0.0, 1.0, 9), index(id, ishape, idx)];
                let n = node(Op::Gather, 2, &[]);
                let tys: Vec<_> = args.iter().map(Tensor::ty).collect();
                let out = TensorType::new(DType::F32, [ishape, &shape[1..]].concat());
                if shape[0] == 0 {
                    // Inference already refuses a gather from an empty axis.
                    assert!(kernel(&crate::codegen::Target::by_name("native").unwrap(), "k", &n, &tys, &out).is_ok());
                    continue;
                }
                for (status, _) in run_kernel(kernel, &n, &args) {
                    assert_eq!(status, STATUS_INDEX_OUT_OF_RANGE, "{idx:?}");
                }
            }
        }
    }

    thread_local! {
        static TABLE: std::cell::RefCell<Vec<i64>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// `gather_table` on the indices in `TABLE`, which must take its copies.
    fn tabled(target: &Target, name: &str, n: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Generated> {
        let table = TABLE.with(|t| t.borrow().clone());
        Ok(gather_table(target, name, n, inputs, out, &table)?.expect("a table with a pattern"))
    }

    /// An im2col table over a `h × w` map (`n_in` = h·w is the pad element's index): `k × k`
    /// taps, stride, dilation and pad as a conv's.
    fn im2col(h: i64, w: i64, k: i64, stride: i64, dilation: i64, pad: i64) -> Vec<i64> {
        let out = |x: i64| (x + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
        let (oh, ow) = (out(h), out(w));
        let mut t = Vec::new();
        for (ki, kj) in (0..k).flat_map(|i| (0..k).map(move |j| (i, j))) {
            for (y, x) in (0..oh).flat_map(|y| (0..ow).map(move |x| (y, x))) {
                let (r, c) = (y * stride + ki * dilation - pad, x * stride + kj * dilation - pad);
                t.push(if (0..h).contains(&r) && (0..w).contains(&c) { r * w + c } else { h * w });
            }
        }
        t
    }

    #[test]
    fn gather_of_a_constant_table() {
        // (data shape: rows × the gathered axis, indices): im2col's, a reflect pad's
        // (negative steps), an edge pad's (fills), negative indices, a lone element.
        let reflect: Vec<i64> = [3, 2, 1].into_iter().chain(0..10).chain([8, 7]).collect();
        let edge: Vec<i64> = [0, 0, 0].into_iter().chain(0..10).chain([9; 5]).collect();
        let cases: Vec<(Vec<usize>, Vec<i64>)> = vec![
            (vec![2, 3, 7 * 9 + 1], im2col(7, 9, 3, 1, 1, 1)),
            (vec![1, 4, 10 * 10 + 1], im2col(10, 10, 3, 2, 1, 1)),
            (vec![3, 6 * 11 + 1], im2col(6, 11, 3, 1, 2, 2)),
            (vec![5, 17], im2col(1, 16, 5, 3, 1, 2)),
            (vec![4, 10], reflect),
            (vec![3, 10], edge),
            (vec![2, 9], (-9..9).collect()),
            (vec![3, 4], vec![2]),
        ];
        for (shape, idx) in cases {
            let axis = shape.len() as i64 - 1;
            TABLE.with(|t| t.replace(idx.clone()));
            for id in [DType::I32, DType::I64] {
                each_dtype(idx.len() as u64, &shape, |x| {
                    check(
                        tabled,
                        &node(Op::Gather, 2, &[("axis", Attr::Int(axis))]),
                        &[x, index(id, &[idx.len()], &idx)],
                    )
                });
            }
        }
        // Without a pattern, out of range, or of rows wider than one element: the kernel that
        // reads its indices.
        let target = Target::by_name("native").unwrap();
        let scattered: Vec<i64> = (0..4096).map(|j| (j * j * 7 + 3) % 4099).collect();
        for (shape, axis, idx) in
            [(&[2, 4099][..], 1, &scattered[..]), (&[2, 5], 1, &[0, 5, 1]), (&[5, 2], 0, &[0, 1, 2])]
        {
            let args = [random(DType::F32, shape, 0.0, 1.0, 9), index(DType::I64, &[idx.len()], idx)];
            let n = node(Op::Gather, 2, &[("axis", Attr::Int(axis))]);
            let tys: Vec<_> = args.iter().map(Tensor::ty).collect();
            assert!(gather_table(&target, "k", &n, &tys, &out_type(&n, &args), idx).unwrap().is_none());
        }
    }

    #[test]
    fn einsum() {
        let cases: &[(&str, &[&[usize]])] = &[
            ("bij,bjk->bik", &[&[2, 3, 5], &[2, 5, 7]]),
            ("bij,bjk->bik", &[&[2, 4, 33], &[2, 33, 21]]),
            ("ij->ji", &[&[5, 7]]),
            ("ij->i", &[&[7, 1000]]),
            ("ij->j", &[&[300, 9]]),
            ("ij,jk,kl->il", &[&[3, 4], &[4, 5], &[5, 6]]),
            ("i,i->", &[&[37], &[37]]),
            ("ij,ij->ij", &[&[5, 7], &[5, 7]]),
            ("ij,j->ij", &[&[5, 7], &[7]]),
            ("bhqd,bhkd->bhqk", &[&[2, 2, 3, 8], &[2, 2, 5, 8]]),
            ("bqd,bkd->bqk", &[&[2, 3, 37], &[2, 5, 37]]),
            ("ij,j->i", &[&[6, 21], &[21]]),
            ("ijk->i", &[&[4, 3, 10]]),
            ("ikj,kj->i", &[&[3, 5, 6], &[5, 6]]),
            ("ij,jk->i", &[&[3, 9], &[9, 2]]),
            ("bhqk,bhkd->bhqd", &[&[2, 2, 3, 5], &[2, 2, 5, 8]]),
            ("ij,k->ikj", &[&[3, 2], &[4]]),
            ("ij,jk->ik", &[&[3, 0], &[0, 6]]),
        ];
        for (i, &(eq, shapes)) in cases.iter().enumerate() {
            let args: Vec<Tensor> =
                shapes.iter().enumerate().map(|(k, s)| random(DType::F32, s, -1.0, 1.0, (i * 10 + k) as u64)).collect();
            check(kernel, &node(Op::Einsum, args.len(), &[("equation", Attr::Str(eq.into()))]), &args);
        }
    }

    #[test]
    fn refuses_mismatched_types() {
        let t = crate::codegen::Target::by_name("native").unwrap();
        let x = TensorType::new(DType::F32, vec![3, 4]);
        let cases = [
            (node(Op::Reshape, 1, &[("shape", ints(&[13]))]), TensorType::new(DType::F32, vec![13])),
            (node(Op::Transpose, 1, &[]), TensorType::new(DType::F32, vec![4, 4])),
            (
                node(Op::Slice, 1, &[("starts", ints(&[0])), ("ends", ints(&[3]))]),
                TensorType::new(DType::F32, vec![4, 4]),
            ),
            (node(Op::Transpose, 1, &[]), TensorType::new(DType::I64, vec![4, 3])),
            (node(Op::Gather, 2, &[]), TensorType::new(DType::F32, vec![2, 5])),
        ];
        for (n, out) in cases {
            let inputs = [x.clone(), TensorType::new(DType::I32, vec![2])];
            assert!(kernel(&t, "k", &n, &inputs[..n.inputs.len()], &out).is_err(), "{} into {out}", n.op);
        }
    }

    #[test]
    fn collapse_merges_contiguous_dims() {
        let dims = [Dim::new(2, &[12, 12]), Dim::new(1, &[5, 5]), Dim::new(3, &[4, 4]), Dim::new(4, &[1, 1])];
        assert_eq!(collapse(&dims), [Dim::new(24, &[1, 1])]);
        let transposed = [Dim::new(3, &[1, 4]), Dim::new(4, &[3, 1])];
        assert_eq!(collapse(&transposed), transposed);
    }
}
