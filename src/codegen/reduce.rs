//! Reduction kernels — reduce_sum / reduce_mean / reduce_max, softmax, layer_norm — and the
//! f32x4 helpers einsum shares (partial vectors, chunked loops, sums of runs).
//!
//! f32 kernels visit the reduced elements as f32x4 vectors through a [`Walk`]: loops
//! around a contiguous run. Two shapes of walk cover every case:
//! - *row*: the innermost dim is reduced, so each result reduces contiguous runs (times any
//!   outer reduced dims). A run's vectors are spread over `U` accumulators, combined across
//!   lanes at the end (reduce over trailing axes, softmax over the last axis, layer_norm).
//! - *columns*: the innermost dim is kept, so `CHUNK` neighbouring results are reduced side
//!   by side, one per lane, each walking the reduced dims (reduce over axis 0 of [N, C],
//!   softmax over a middle axis).
//!
//! A run whose length is not a multiple of 4 ends in a partial vector (lanes loaded one by
//! one, unused lanes masked to the reduction's identity), so there is no separate scalar
//! path to keep in step. Sums fold a partial sum into the total every `BLOCK` vectors per
//! lane (a blocked sum), which keeps long f32 reductions close to the interpreter's f64
//! result. Integer reductions are plain scalar loops (wrapping sums are exact in any
//! order).

use anyhow::{anyhow, bail, Result};
use cranelift_codegen::ir::{types, ConstantData, Function, InstBuilder, Type, Value};
use cranelift_frontend::Variable;
use meshc_ir::attrs;
use meshc_ir::infer::{norm_axes, norm_axis};
use meshc_ir::{DType, Node, Op, TensorType};

use super::emit::{build_kernel, mem, KernelBuilder, F32X4, LANES};
use super::math::Math;
use super::nest::{collapse, contiguous_strides, for_nest, for_parts, Dim};
use super::{parts_for, Generated, Target};

/// Vectors per chunk: independent accumulators, enough to cover the latency of a vector add.
const U: usize = 4;
/// f32 elements per chunk.
pub(crate) const CHUNK: usize = U * LANES;
/// Vector adds per lane between folds of a partial sum into its total.
const BLOCK: usize = 32;
const F32: i64 = 4;

pub fn kernel(target: &Target, name: &str, node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Generated> {
    with_prologue(target, name, node, inputs, out, &[])
}

/// The kernel of the reduction `node`, which (a reduce_* of f32) applies the one-operand
/// ops of `prologue` (`passes::fuse::PROLOGUE_OPS`), in order, to each element it loads.
pub fn with_prologue(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
    prologue: &[Op],
) -> Result<Generated> {
    let x = inputs.first().ok_or_else(|| anyhow!("{} needs an operand", node.op))?;
    if !matches!(node.op, Op::ReduceSum | Op::ReduceMax) && x.dtype != DType::F32 {
        bail!("{} of {} is not supported", node.op, x.dtype);
    }
    if matches!(node.op, Op::Softmax | Op::LayerNorm) && out.shape != x.shape {
        bail!("{} result {out} does not match its operand {x}", node.op);
    }
    let (func, parts) = match node.op {
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => reduce(target, name, node, x, out, prologue)?,
        _ if !prologue.is_empty() => bail!("{} takes no prologue", node.op),
        Op::Softmax => softmax(target, name, node, x)?,
        Op::LayerNorm => layer_norm(target, name, node, inputs)?,
        other => bail!("{other} is not a reduction"),
    };
    Ok(Generated { func, scratch: 0, parts })
}

#[derive(Clone, Copy, PartialEq)]
enum Combine {
    Sum,
    /// NaN-propagating, like the interpreter's reduce_max.
    Max,
}

impl Combine {
    fn apply(self, kb: &mut KernelBuilder, target: &Target, a: Value, b: Value) -> Value {
        let ty = kb.b.func.dfg.value_type(a);
        match (self, ty.lane_type().is_float()) {
            (Combine::Sum, true) => kb.b.ins().fadd(a, b),
            // One maxps plus a NaN patch; Cranelift's own `fmax` takes about eight instructions.
            (Combine::Max, true) => Math::new(&mut kb.b, ty, target).maximum(a, b),
            (Combine::Sum, false) => kb.b.ins().iadd(a, b),
            (Combine::Max, false) => kb.b.ins().smax(a, b),
        }
    }

    fn identity(self) -> f32 {
        match self {
            Combine::Sum => 0.0,
            Combine::Max => f32::NEG_INFINITY,
        }
    }
}

/// How one group of reductions visits its f32 elements: `loops` (trip count, byte stride;
/// outermost first) around a contiguous `run` of elements, visited as vectors.
struct Walk {
    loops: Vec<(usize, i64)>,
    run: usize,
}

/// One visited vector: its byte offset from the walk's start, its accumulator slot (its
/// place within a chunk of the run) and how many of its lanes hold elements.
struct At {
    off: Value,
    slot: usize,
    width: usize,
}

type Flush<'a> = Option<&'a mut dyn FnMut(&mut KernelBuilder)>;

impl Walk {
    /// Accumulator slots in use (at least one, so an empty walk still yields a result).
    fn slots(&self) -> usize {
        self.run.div_ceil(LANES).clamp(1, U)
    }

    /// Calls `body` at every vector. With `flush`, the innermost loop longer than a block
    /// runs in blocks and calls `flush` after each.
    fn visit(&self, kb: &mut KernelBuilder, mut flush: Flush, body: &mut dyn FnMut(&mut KernelBuilder, &At)) {
        let trips: Vec<usize> = self.loops.iter().map(|l| l.0).chain([self.run / CHUNK]).collect();
        let blocked = trips.iter().rposition(|&n| n > BLOCK);
        let start = kb.iconst(0);
        self.visit_level(kb, 0, start, blocked, &mut flush, body);
    }

    fn visit_level(
        &self,
        kb: &mut KernelBuilder,
        level: usize,
        off: Value,
        blocked: Option<usize>,
        flush: &mut Flush,
        body: &mut dyn FnMut(&mut KernelBuilder, &At),
    ) {
        let flush_here = if blocked == Some(level) { flush.take() } else { None };
        if let Some(&(n, stride)) = self.loops.get(level) {
            for_blocks(kb, n, flush_here, &mut |kb, i| {
                let off = kb.addr(off, i, stride);
                self.visit_level(kb, level + 1, off, blocked, flush, body);
            });
            return;
        }
        let full = self.run / CHUNK;
        if full > 0 {
            for_blocks(kb, full, flush_here, &mut |kb, j| {
                let base = kb.addr(off, j, CHUNK as i64 * F32);
                for slot in 0..U {
                    let off = kb.b.ins().iadd_imm_s(base, (slot * LANES) as i64 * F32);
                    body(kb, &At { off, slot, width: LANES });
                }
            });
        }
        for (slot, first) in (full * CHUNK..self.run).step_by(LANES).enumerate() {
            let off = kb.b.ins().iadd_imm_s(off, first as i64 * F32);
            body(kb, &At { off, slot, width: (self.run - first).min(LANES) });
        }
    }
}

/// `for i in 0..n { body(i) }`; with `flush`, as blocks of `BLOCK` iterations, each
/// followed by `flush`.
fn for_blocks(kb: &mut KernelBuilder, n: usize, flush: Flush, body: &mut dyn FnMut(&mut KernelBuilder, Value)) {
    match flush {
        _ if n == 1 => {
            let i = kb.iconst(0);
            body(kb, i)
        }
        Some(flush) if n > BLOCK => {
            let blocks = (n - n % BLOCK) as i64;
            kb.for_const(0, blocks, BLOCK as i64, |kb, start| {
                kb.for_const(0, BLOCK as i64, 1, |kb, j| {
                    let i = kb.b.ins().iadd(start, j);
                    body(kb, i)
                });
                flush(kb);
            });
            if !n.is_multiple_of(BLOCK) {
                kb.for_const(blocks, n as i64, 1, |kb, i| body(kb, i));
            }
        }
        _ => kb.for_const(0, n as i64, 1, |kb, i| body(kb, i)),
    }
}

/// Reduces over the walk, lane by lane, the vectors `value` gives (it may also store, as
/// softmax does with its exponentials); one result vector per slot.
fn fold(
    kb: &mut KernelBuilder,
    target: &Target,
    walk: &Walk,
    op: Combine,
    value: &mut dyn FnMut(&mut KernelBuilder, &At) -> Value,
) -> Vec<Value> {
    let identity = kb.splat(op.identity());
    let accumulators = |kb: &mut KernelBuilder| -> Vec<Variable> {
        let vars: Vec<Variable> = (0..walk.slots()).map(|_| kb.b.declare_var(F32X4)).collect();
        for &v in &vars {
            kb.b.def_var(v, identity);
        }
        vars
    };
    let part = accumulators(kb);
    // A max is exact in any order: only sums keep a separate total.
    let total = (op == Combine::Sum).then(|| accumulators(kb));
    let mut flush = |kb: &mut KernelBuilder| {
        for (&t, &p) in total.iter().flatten().zip(&part) {
            let (a, b) = (kb.b.use_var(t), kb.b.use_var(p));
            let s = op.apply(kb, target, a, b);
            kb.b.def_var(t, s);
            kb.b.def_var(p, identity);
        }
    };
    walk.visit(kb, total.is_some().then_some(&mut flush as &mut dyn FnMut(&mut KernelBuilder)), &mut |kb, at| {
        let mut v = value(kb, at);
        if at.width < LANES {
            v = mask_lanes(kb, v, at.width, identity);
        }
        let acc = kb.b.use_var(part[at.slot]);
        let next = op.apply(kb, target, acc, v);
        kb.b.def_var(part[at.slot], next);
    });
    flush(kb);
    total.as_ref().unwrap_or(&part).iter().map(|&v| kb.b.use_var(v)).collect()
}

/// The sum, as a scalar, of the vectors `value(kb, offset, width)` gives along a contiguous
/// run of `n` f32 elements (`offset` in bytes from the run's start).
pub(crate) fn sum_run(
    kb: &mut KernelBuilder,
    target: &Target,
    n: usize,
    value: &mut dyn FnMut(&mut KernelBuilder, Value, usize) -> Value,
) -> Value {
    let walk = Walk { loops: vec![], run: n };
    let slots = fold(kb, target, &walk, Combine::Sum, &mut |kb, at| value(kb, at.off, at.width));
    across_lanes(kb, target, Combine::Sum, &slots)
}

/// `v` with lanes `width..` replaced by those of `fill`.
fn mask_lanes(kb: &mut KernelBuilder, v: Value, width: usize, fill: Value) -> Value {
    let bytes: Vec<u8> = (0..LANES).flat_map(|l| [if l < width { 0xff } else { 0 }; 4]).collect();
    let c = kb.b.func.dfg.constants.insert(ConstantData::from(bytes));
    let mask = kb.b.ins().vconst(F32X4, c);
    kb.b.ins().bitselect(mask, v, fill)
}

/// The slots' lanes combined into one scalar.
fn across_lanes(kb: &mut KernelBuilder, target: &Target, op: Combine, slots: &[Value]) -> Value {
    let mut v = slots[0];
    for &s in &slots[1..] {
        v = op.apply(kb, target, v, s);
    }
    let lanes: Vec<Value> = (0..LANES as u8).map(|l| kb.b.ins().extractlane(v, l)).collect();
    let lo = op.apply(kb, target, lanes[0], lanes[1]);
    let hi = op.apply(kb, target, lanes[2], lanes[3]);
    op.apply(kb, target, lo, hi)
}

/// Per-slot statistics of a fold: a row walk's slots all get the combination of every
/// lane (splatted); a column walk's slots are already per-lane results.
fn stats(kb: &mut KernelBuilder, target: &Target, op: Combine, slots: Vec<Value>, row: bool) -> Vec<Value> {
    if !row {
        return slots;
    }
    let s = across_lanes(kb, target, op, &slots);
    vec![kb.b.ins().splat(F32X4, s); U]
}

/// Loads `width` (1..=4) f32s at `ptr`; lanes past `width` are 0.
pub(crate) fn load_vec(kb: &mut KernelBuilder, ptr: Value, width: usize) -> Value {
    if width == LANES {
        return kb.b.ins().load(F32X4, mem(), ptr, 0);
    }
    let mut v = kb.splat(0.0);
    for l in 0..width {
        let x = kb.b.ins().load(types::F32, mem(), ptr, (l * 4) as i32);
        v = kb.b.ins().insertlane(v, x, l as u8);
    }
    v
}

/// Stores the first `width` (1..=4) lanes of `v` at `ptr`.
pub(crate) fn store_vec(kb: &mut KernelBuilder, v: Value, ptr: Value, width: usize) {
    if width == LANES {
        kb.b.ins().store(mem(), v, ptr, 0);
        return;
    }
    for l in 0..width {
        let x = kb.b.ins().extractlane(v, l as u8);
        kb.b.ins().store(mem(), x, ptr, (l * 4) as i32);
    }
}

/// Covers `n` contiguous elements in chunks: `body(kb, first, len)` per chunk, with
/// `first` its first element's index — a loop over the full chunks, then the rest.
pub(crate) fn for_chunks(kb: &mut KernelBuilder, n: usize, body: &mut dyn FnMut(&mut KernelBuilder, Value, usize)) {
    let full = n - n % CHUNK;
    if full == CHUNK {
        let first = kb.iconst(0);
        body(kb, first, CHUNK);
    } else if full > 0 {
        kb.for_const(0, full as i64, CHUNK as i64, |kb, first| body(kb, first, CHUNK));
    }
    if n > full {
        let first = kb.iconst(full as i64);
        body(kb, first, n - full);
    }
}

/// Byte strides from element strides.
fn in_bytes(dims: &[Dim], esize: i64) -> Vec<Dim> {
    dims.iter().map(|d| d.scaled(esize)).collect()
}

/// `reduce_*`: the input's dims with `[input, result]` element strides (result stride 0 on
/// reduced dims), collapsed; the innermost dim then says row or column walk. The kernel
/// splits the outermost kept dim of its loop nest into parts (none left: no split).
fn reduce(
    target: &Target,
    name: &str,
    node: &Node,
    x: &TensorType,
    out: &TensorType,
    prologue: &[Op],
) -> Result<(Function, usize)> {
    let rank = x.rank();
    let axes = match attrs::Reduce::of(node).axes {
        Some(a) => norm_axes(&a, rank).map_err(anyhow::Error::msg)?,
        None => (0..rank).collect(),
    };
    let op = if node.op == Op::ReduceMax { Combine::Max } else { Combine::Sum };
    let count: usize = axes.iter().map(|&a| x.shape[a]).product();
    if op == Combine::Max && count == 0 {
        bail!("reduce_max over an empty axis");
    }
    let xs = contiguous_strides(&x.shape);
    let mut os = vec![0i64; rank];
    let mut kept = 1;
    for d in (0..rank).rev().filter(|d| !axes.contains(d)) {
        os[d] = kept;
        kept *= x.shape[d] as i64;
    }
    if out.numel() as i64 != kept || out.dtype != x.dtype {
        bail!("reduction result {out} does not match its operand {x}");
    }
    let mut dims = collapse(&(0..rank).map(|d| Dim::new(x.shape[d], &[xs[d], os[d]])).collect::<Vec<_>>());
    if dims.is_empty() {
        // A single element (or a scalar) is a row of one.
        dims.push(Dim::new(1, &[1, 0]));
    }
    // Collapsed to one kept dim (a reduction over no axis), a kernel over symbolic rows
    // has no outer loop to take their count: the dim is cut into its rows.
    if let (Some(hi), [d]) = (super::rows::scaling(), dims.as_slice()) {
        if d.strides[1] != 0 && hi > 1 && d.n.is_multiple_of(hi) {
            let per = d.n / hi;
            let outer: Vec<i64> = d.strides.iter().map(|&s| s * per as i64).collect();
            dims = vec![Dim::new(hi, &outer), Dim::new(per, &d.strides)];
        }
    }
    let mean = (node.op == Op::ReduceMean).then_some(count as f32);
    let empty = out.numel() == 0;
    let ity = match x.dtype {
        DType::F32 => None,
        DType::I32 => Some(types::I32),
        DType::I64 => Some(types::I64),
        other => bail!("{} of {other} is not supported", node.op),
    };
    if ity.is_some() && !prologue.is_empty() {
        bail!("{} of {} takes no prologue", node.op, x.dtype);
    }
    let func = build_kernel(target, name, |kb| match ity {
        _ if empty => {}
        None => reduce_f32(kb, target, op, mean, &dims, prologue),
        Some(ty) => reduce_int(kb, target, op, ty, &dims),
    });
    // The f32 walk handles the innermost dim itself; the integer loops nest every dim.
    let nest = if ity.is_none() { &dims[..dims.len() - 1] } else { &dims[..] };
    let parts = split(nest).0.first().map_or(1, |d| parts_for(x.size_bytes() + out.size_bytes(), d.n));
    Ok((func, parts))
}

/// Kept dims (result stride != 0) and reduced dims of a collapsed reduction.
fn split(dims: &[Dim]) -> (Vec<Dim>, Vec<Dim>) {
    dims.iter().cloned().partition(|d| d.strides[1] != 0)
}

/// `dims` collapsed and non-empty: the last one is contiguous in the input.
fn reduce_f32(kb: &mut KernelBuilder, target: &Target, op: Combine, mean: Option<f32>, dims: &[Dim], prologue: &[Op]) {
    // Lanes past a partial vector's end are masked to the identity after this (`fold`).
    let load = |kb: &mut KernelBuilder, ptr: Value, width: usize| {
        let mut v = load_vec(kb, ptr, width);
        for &op in prologue {
            v = super::elementwise::float_op(&mut Math::new(&mut kb.b, F32X4, target), op, &[v]);
        }
        v
    };
    let (last, outer) = dims.split_last().expect("at least one dim");
    let (kept, red) = split(outer);
    let (dst, src) = (kb.buf(0), kb.buf(1));
    let loops: Vec<(usize, i64)> = red.iter().map(|d| (d.n, d.strides[0] * F32)).collect();
    if last.strides[1] == 0 {
        let walk = Walk { loops, run: last.n };
        for_parts(kb, &in_bytes(&kept, F32), &[src, dst], &mut |kb, p| {
            let slots = fold(kb, target, &walk, op, &mut |kb, at| {
                let a = kb.b.ins().iadd(p[0], at.off);
                load(kb, a, at.width)
            });
            let mut r = across_lanes(kb, target, op, &slots);
            if let Some(count) = mean {
                let c = kb.f32const(count);
                r = kb.b.ins().fdiv(r, c);
            }
            kb.b.ins().store(mem(), r, p[1], 0);
        });
    } else {
        for_parts(kb, &in_bytes(&kept, F32), &[src, dst], &mut |kb, p| {
            for_chunks(kb, last.n, &mut |kb, first, len| {
                let s = kb.addr(p[0], first, F32);
                let d = kb.addr(p[1], first, F32);
                let walk = Walk { loops: loops.clone(), run: len };
                let slots = fold(kb, target, &walk, op, &mut |kb, at| {
                    let a = kb.b.ins().iadd(s, at.off);
                    load(kb, a, at.width)
                });
                for (slot, mut v) in slots.into_iter().enumerate() {
                    if let Some(count) = mean {
                        let c = kb.splat(count);
                        v = kb.b.ins().fdiv(v, c);
                    }
                    let at = kb.b.ins().iadd_imm_s(d, (slot * LANES) as i64 * F32);
                    store_vec(kb, v, at, (len - slot * LANES).min(LANES));
                }
            });
        });
    }
}

/// Integer sum (wrapping) or max: one scalar accumulator per result.
fn reduce_int(kb: &mut KernelBuilder, target: &Target, op: Combine, ty: Type, dims: &[Dim]) {
    let (kept, red) = split(dims);
    let esize = ty.bytes() as i64;
    let identity = match (op, ty == types::I32) {
        (Combine::Sum, _) => 0,
        (Combine::Max, true) => i32::MIN as i64,
        (Combine::Max, false) => i64::MIN,
    };
    let (dst, src) = (kb.buf(0), kb.buf(1));
    let red = in_bytes(&red, esize);
    for_parts(kb, &in_bytes(&kept, esize), &[src, dst], &mut |kb, p| {
        let acc = kb.b.declare_var(ty);
        let init = kb.b.ins().iconst(ty, identity);
        kb.b.def_var(acc, init);
        for_nest(kb, &red, &p[..1], &mut |kb, q| {
            let x = kb.b.ins().load(ty, mem(), q[0], 0);
            let a = kb.b.use_var(acc);
            let next = op.apply(kb, target, a, x);
            kb.b.def_var(acc, next);
        });
        let a = kb.b.use_var(acc);
        kb.b.ins().store(mem(), a, p[1], 0);
    });
}

/// softmax over `axis` of `[outer, n, inner]`: rows when `inner` is 1, columns otherwise.
fn softmax(target: &Target, name: &str, node: &Node, x: &TensorType) -> Result<(Function, usize)> {
    let axis = norm_axis(attrs::Softmax::of(node).axis, x.rank()).map_err(anyhow::Error::msg)?;
    let outer: usize = x.shape[..axis].iter().product();
    let n = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let empty = x.numel() == 0;
    let row = (n * inner) as i64 * F32;
    let func = build_kernel(target, name, |kb| {
        if empty {
            return;
        }
        let (dst, src) = (kb.buf(0), kb.buf(1));
        for_parts(kb, &[Dim::new(outer, &[row, row])], &[src, dst], &mut |kb, p| {
            if inner == 1 {
                softmax_walk(kb, target, &Walk { loops: vec![], run: n }, p[0], p[1], true);
            } else {
                for_chunks(kb, inner, &mut |kb, first, len| {
                    let s = kb.addr(p[0], first, F32);
                    let d = kb.addr(p[1], first, F32);
                    softmax_walk(kb, target, &Walk { loops: vec![(n, inner as i64 * F32)], run: len }, s, d, false);
                });
            }
        });
    });
    Ok((func, parts_for(2 * x.size_bytes(), outer)))
}

/// Three passes: max; exp(x - max) stored and summed; scale by 1/sum.
fn softmax_walk(kb: &mut KernelBuilder, target: &Target, walk: &Walk, src: Value, dst: Value, row: bool) {
    let at_ptr = |kb: &mut KernelBuilder, base: Value, at: &At| kb.b.ins().iadd(base, at.off);
    let max = fold(kb, target, walk, Combine::Max, &mut |kb, at| {
        let a = at_ptr(kb, src, at);
        load_vec(kb, a, at.width)
    });
    let max = stats(kb, target, Combine::Max, max, row);
    let sum = fold(kb, target, walk, Combine::Sum, &mut |kb, at| {
        let a = at_ptr(kb, src, at);
        let x = load_vec(kb, a, at.width);
        let shifted = kb.b.ins().fsub(x, max[at.slot]);
        let e = Math::new(&mut kb.b, F32X4, target).exp(shifted);
        let d = at_ptr(kb, dst, at);
        store_vec(kb, e, d, at.width);
        e
    });
    let one = kb.splat(1.0);
    let inv: Vec<Value> =
        stats(kb, target, Combine::Sum, sum, row).into_iter().map(|s| kb.b.ins().fdiv(one, s)).collect();
    walk.visit(kb, None, &mut |kb, at| {
        let d = at_ptr(kb, dst, at);
        let e = load_vec(kb, d, at.width);
        let y = kb.b.ins().fmul(e, inv[at.slot]);
        store_vec(kb, y, d, at.width);
    });
}

/// layer_norm over the trailing dims from `axis`: each result row is a contiguous run,
/// normalised in two passes (mean, then the mean square of `x - mean`).
fn layer_norm(target: &Target, name: &str, node: &Node, inputs: &[TensorType]) -> Result<(Function, usize)> {
    let [x, gamma, beta] = inputs else { bail!("layer_norm takes x, gamma and beta") };
    let attrs::LayerNorm { axis, eps } = attrs::LayerNorm::of(node);
    let axis = norm_axis(axis, x.rank()).map_err(anyhow::Error::msg)?;
    let outer: usize = x.shape[..axis].iter().product();
    let n: usize = x.shape[axis..].iter().product();
    if gamma.numel() != n || beta.numel() != n || gamma.dtype != DType::F32 || beta.dtype != DType::F32 {
        bail!("layer_norm gamma {gamma} and beta {beta} must be f32 of shape x.shape[{axis}:]");
    }
    let eps = eps as f32;
    let empty = x.numel() == 0;
    let row = n as i64 * F32;
    let func = build_kernel(target, name, |kb| {
        if empty {
            return;
        }
        let (dst, src, g, b) = (kb.buf(0), kb.buf(1), kb.buf(2), kb.buf(3));
        let walk = Walk { loops: vec![], run: n };
        for_parts(kb, &[Dim::new(outer, &[row, row])], &[src, dst], &mut |kb, p| {
            let count = kb.splat(n as f32);
            let load = |kb: &mut KernelBuilder, base: Value, at: &At| {
                let a = kb.b.ins().iadd(base, at.off);
                load_vec(kb, a, at.width)
            };
            let sum = fold(kb, target, &walk, Combine::Sum, &mut |kb, at| load(kb, p[0], at));
            let sum = stats(kb, target, Combine::Sum, sum, true)[0];
            let mean = kb.b.ins().fdiv(sum, count);
            let sq = fold(kb, target, &walk, Combine::Sum, &mut |kb, at| {
                let x = load(kb, p[0], at);
                let c = kb.b.ins().fsub(x, mean);
                kb.b.ins().fmul(c, c)
            });
            let sq = stats(kb, target, Combine::Sum, sq, true)[0];
            let var = kb.b.ins().fdiv(sq, count);
            let eps = kb.splat(eps);
            let var = kb.b.ins().fadd(var, eps);
            let sd = kb.b.ins().sqrt(var);
            let one = kb.splat(1.0);
            let rstd = kb.b.ins().fdiv(one, sd);
            walk.visit(kb, None, &mut |kb, at| {
                let x = load(kb, p[0], at);
                let (gv, bv) = (load(kb, g, at), load(kb, b, at));
                let c = kb.b.ins().fsub(x, mean);
                let c = kb.b.ins().fmul(c, rstd);
                let y = Math::new(&mut kb.b, F32X4, target).madd(c, gv, bv);
                let d = kb.b.ins().iadd(p[1], at.off);
                store_vec(kb, y, d, at.width);
            });
        });
    });
    Ok((func, parts_for(2 * x.size_bytes() + gamma.size_bytes() + beta.size_bytes(), outer)))
}

#[cfg(test)]
mod tests {
    use super::super::emit::testing::check_parts;
    use super::super::movement::testing::{check, ints, node, out_type, random, run_kernel, Gen};
    use super::*;
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Attr, Data, Tensor};

    fn reduce_node(op: Op, axes: Option<&[i64]>, keepdims: bool) -> Node {
        let mut attrs = vec![("keepdims", Attr::Bool(keepdims))];
        attrs.extend(axes.map(|a| ("axes", ints(a))));
        node(op, 1, &attrs)
    }

    #[test]
    fn reductions_over_any_axes() {
        let cases: &[(&[usize], Option<&[i64]>)] = &[
            (&[3, 5, 7], Some(&[0])),
            (&[3, 5, 7], Some(&[1])),
            (&[3, 5, 7], Some(&[2])),
            (&[3, 5, 7], Some(&[-1, 0])),
            (&[3, 5, 7], Some(&[0, 1])),
            (&[3, 5, 7], Some(&[1, 2])),
            (&[3, 5, 7], None),
            (&[3, 5, 7], Some(&[])),
            (&[2, 3, 4, 5], Some(&[1, 3])),
            (&[4, 1, 6, 9], Some(&[0, 2])),
            (&[6, 41, 3], Some(&[0, 2])),
            (&[37, 1], Some(&[0])),
            (&[], None),
            (&[3, 0], Some(&[1])),
            (&[0, 4], Some(&[1])),
        ];
        for (i, &(shape, axes)) in cases.iter().enumerate() {
            for op in [Op::ReduceSum, Op::ReduceMean, Op::ReduceMax] {
                for keepdims in [false, true] {
                    let n = reduce_node(op, axes, keepdims);
                    let empty_max = op == Op::ReduceMax && shape.contains(&0);
                    if !empty_max {
                        check(kernel, &n, &[random(DType::F32, shape, -1.0, 1.0, i as u64)]);
                    }
                    if op != Op::ReduceMean && !empty_max {
                        check(kernel, &n, &[random(DType::I32, shape, -2e9, 2e9, i as u64)]);
                        check(kernel, &n, &[random(DType::I64, shape, -9e18, 9e18, i as u64)]);
                    }
                }
            }
        }
    }

    /// Rows (reduced innermost) and columns (kept innermost) of many lengths, including
    /// ones long enough for blocked sums.
    #[test]
    fn reductions_rows_and_columns() {
        for len in [1, 3, 4, 5, 16, 17, 1000, 2053] {
            for (shape, axis) in [(vec![3, len], 1), (vec![len, 6], 0), (vec![2, len, 5], 1), (vec![len, 19], 0)] {
                for op in [Op::ReduceSum, Op::ReduceMean, Op::ReduceMax] {
                    // Positive values make the sums large, so cancellation cannot hide an
                    // accumulation error behind the absolute tolerance.
                    let x = random(DType::F32, &shape, -0.5, 1.0, len as u64);
                    check(kernel, &reduce_node(op, Some(&[axis]), false), &[x]);
                }
            }
        }
    }

    /// A prologue applies to every element, and the lanes past a partial vector's end
    /// still take the reduction's identity (abs would make a max's −inf fill +inf).
    #[test]
    fn prologues_apply_to_each_element_loaded() {
        fn abs(t: &Target, name: &str, n: &Node, i: &[TensorType], o: &TensorType) -> Result<Generated> {
            with_prologue(t, name, n, i, o, &[Op::Abs])
        }
        fn neg_exp(t: &Target, name: &str, n: &Node, i: &[TensorType], o: &TensorType) -> Result<Generated> {
            with_prologue(t, name, n, i, o, &[Op::Neg, Op::Exp])
        }
        for (gen, ops) in [(abs as Gen, &[Op::Abs][..]), (neg_exp, &[Op::Neg, Op::Exp])] {
            for len in [1, 3, 5, 16, 1000] {
                for (shape, axis) in [(vec![3, len], 1), (vec![len, 6], 0), (vec![2, len, 5], 1)] {
                    let mut x = random(DType::F32, &shape, -3.0, 2.0, len as u64);
                    for &op in ops {
                        x = eval_node(&node(op, 1, &[]), &[&x], &x.ty()).unwrap();
                    }
                    for op in [Op::ReduceSum, Op::ReduceMean, Op::ReduceMax] {
                        let n = reduce_node(op, Some(&[axis]), true);
                        let want = eval_node(&n, &[&x], &out_type(&n, std::slice::from_ref(&x))).unwrap();
                        let raw = random(DType::F32, &shape, -3.0, 2.0, len as u64);
                        for (status, got) in run_kernel(gen, &n, &[raw]) {
                            assert_eq!(status, 0);
                            let (g, w) = (got.data.to_f64(), want.data.to_f64());
                            for (a, b) in g.iter().zip(&w) {
                                assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "{ops:?} {op} {shape:?}: {a} vs {b}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn reduce_max_propagates_nan() {
        let mut x = random(DType::F32, &[3, 9], -1.0, 1.0, 1);
        if let Data::F32(v) = &mut x.data {
            v[4] = f32::NAN;
            v[26] = f32::NAN;
        }
        for axes in [[0], [1]] {
            check(kernel, &reduce_node(Op::ReduceMax, Some(&axes), false), &[x.clone()]);
        }
    }

    /// Values in [-5, 5) with some entries masked to -1e9, as attention masks do.
    fn masked(shape: &[usize], seed: u64) -> Tensor {
        let mut x = random(DType::F32, shape, -5.0, 5.0, seed);
        if let Data::F32(v) = &mut x.data {
            for (k, e) in v.iter_mut().enumerate() {
                if (k * 7 + seed as usize).is_multiple_of(5) {
                    *e = -1e9;
                }
            }
        }
        x
    }

    #[test]
    fn softmax() {
        let cases: &[(&[usize], i64)] = &[
            (&[4, 1], -1),
            (&[4, 3], -1),
            (&[4, 4], -1),
            (&[4, 5], -1),
            (&[3, 1000], -1),
            (&[2, 3, 37], 2),
            (&[2, 7, 5], 1),
            (&[3, 40, 18], 1),
            (&[5, 3], 0),
            (&[2, 6, 1, 3], 1),
        ];
        for (i, &(shape, axis)) in cases.iter().enumerate() {
            check(kernel, &node(Op::Softmax, 1, &[("axis", Attr::Int(axis))]), &[masked(shape, i as u64)]);
        }
        // A fully masked row is uniform, as in the interpreter.
        let x = Tensor::new(vec![2, 6], Data::F32(vec![-1e9; 12]));
        check(kernel, &node(Op::Softmax, 1, &[]), &[x]);
    }

    #[test]
    fn refuses_mismatched_types() {
        let t = Target::by_name("native").unwrap();
        let x = [TensorType::new(DType::F32, vec![3, 4])];
        let wrong = TensorType::new(DType::F32, vec![4, 3]);
        assert!(kernel(&t, "k", &node(Op::Softmax, 1, &[]), &x, &wrong).is_err());
        let sum = reduce_node(Op::ReduceSum, Some(&[0]), false);
        assert!(kernel(&t, "k", &sum, &x, &TensorType::new(DType::F32, vec![3])).is_err());
        assert!(kernel(&t, "k", &sum, &x, &TensorType::new(DType::I32, vec![4])).is_err());
    }

    #[test]
    fn layer_norm() {
        let cases: &[(&[usize], i64)] =
            &[(&[4, 37], -1), (&[3, 4, 6], -2), (&[2, 1000], 1), (&[5, 1], -1), (&[3, 4], 0), (&[7, 3], -1)];
        for (i, &(shape, axis)) in cases.iter().enumerate() {
            let axis_u = norm_axis(axis, shape.len()).unwrap();
            let args = [
                random(DType::F32, shape, -3.0, 5.0, i as u64),
                random(DType::F32, &shape[axis_u..], 0.5, 1.5, 100 + i as u64),
                random(DType::F32, &shape[axis_u..], -1.0, 1.0, 200 + i as u64),
            ];
            let eps = if i % 2 == 0 { vec![] } else { vec![("eps", Attr::Float(1e-3))] };
            let attrs = [vec![("axis", Attr::Int(axis))], eps].concat();
            check(kernel, &node(Op::LayerNorm, 3, &attrs), &args);
        }
    }

    /// softmax (over rows and over a middle axis) and layer_norm split by rows, reductions
    /// by their outermost kept dim: any number of parts writes each element once, as the
    /// whole call does; and only large ones split.
    #[test]
    fn parts_tile_the_results() {
        let t = Target::by_name("native").unwrap();
        let x = |shape: &[usize]| random(DType::F32, shape, -3.0, 5.0, 9);
        let cases = [
            (node(Op::Softmax, 1, &[]), vec![x(&[13, 37])]),
            (node(Op::Softmax, 1, &[("axis", Attr::Int(1))]), vec![x(&[5, 7, 9])]),
            (node(Op::LayerNorm, 3, &[]), vec![x(&[11, 20]), x(&[20]), x(&[20])]),
            (reduce_node(Op::ReduceSum, Some(&[1]), false), vec![x(&[13, 40, 7])]),
            (reduce_node(Op::ReduceMean, Some(&[-1]), true), vec![x(&[9, 3, 50])]),
            (reduce_node(Op::ReduceMax, Some(&[1]), false), vec![random(DType::I32, &[6, 10, 5], -50.0, 50.0, 3)]),
        ];
        for (n, args) in cases {
            let tys: Vec<TensorType> = args.iter().map(Tensor::ty).collect();
            let out = out_type(&n, &args);
            let g = kernel(&t, "k", &n, &tys, &out).unwrap();
            assert_eq!(g.parts, 1, "{}: small", n.op);
            let mut ins: Vec<Vec<u8>> = args.iter().map(Tensor::to_le_bytes).collect();
            check_parts(&t, g.func, out.size_bytes(), &mut ins, &n.op.to_string());
        }
        let parts = |n: &Node, shape: Vec<usize>, out: Vec<usize>| {
            let x = [TensorType::new(DType::F32, shape)];
            kernel(&t, "k", n, &x, &TensorType::new(DType::F32, out)).unwrap().parts
        };
        assert_eq!(parts(&node(Op::Softmax, 1, &[]), vec![1024, 2048], vec![1024, 2048]), 64);
        assert_eq!(parts(&reduce_node(Op::ReduceSum, Some(&[1]), false), vec![64, 8192, 4], vec![64, 4]), 32);
        // Only the innermost dim is kept: the column walk has nothing to split.
        assert_eq!(parts(&reduce_node(Op::ReduceSum, Some(&[0]), false), vec![8192, 256], vec![256]), 1);
    }
}
