//! Shape, dtype and dim-name inference: for one node, given its operands' types, the type
//! of its result — or why the node is ill-formed. Attributes have already been checked
//! against their op's schema (`verify`); this module owns the semantic rules of docs/ops.md.

use crate::attr::Attr;
use crate::attrs::{self, ScatterReduction};
use crate::dtype::{DType, ShapeDisplay, TensorType};
use crate::graph::{Dims, Node};
use crate::ops::Op;

type R<T> = std::result::Result<T, String>;

/// An operand as inference sees it: its type and (if known) its dim names.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub ty: &'a TensorType,
    pub dims: Option<&'a Dims>,
}

/// A node's inferred result.
#[derive(Clone, Debug, PartialEq)]
pub struct Inferred {
    pub ty: TensorType,
    pub dims: Option<Dims>,
}

fn sh(s: &[usize]) -> ShapeDisplay<'_> {
    ShapeDisplay(s)
}

/// Resolves a possibly negative axis against `rank`.
pub fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}

/// Resolves a list of distinct axes.
pub fn norm_axes(axes: &[i64], rank: usize) -> R<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(a, rank)?;
        if out.contains(&a) {
            return Err(format!("axis {a} is listed twice"));
        }
        out.push(a);
    }
    Ok(out)
}

/// numpy broadcasting of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> R<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                let all: Vec<String> = shapes.iter().map(|s| sh(s).to_string()).collect();
                return Err(format!("shapes {} cannot be broadcast together", all.join(" and ")));
            }
        }
    }
    Ok(out)
}

/// The elements of `x[start:end:step]` along an axis of size `n`, with Python's clamping:
/// the first index and the count. i128 keeps extreme starts, ends and steps from overflowing.
pub fn slice_range(start: i64, end: i64, step: i64, n: usize) -> R<(usize, usize)> {
    if step == 0 {
        return Err("slice step of 0".into());
    }
    let (n, step) = (n as i128, step as i128);
    let (lower, upper) = if step > 0 { (0, n) } else { (-1, n - 1) };
    let clamp = |i: i64| {
        let i = i as i128;
        if i < 0 {
            (i + n).max(lower)
        } else {
            i.min(upper)
        }
    };
    let (start, end) = (clamp(start), clamp(end));
    let len = if step > 0 && start < end {
        (end - start - 1) / step + 1
    } else if step < 0 && end < start {
        (start - end - 1) / -step + 1
    } else {
        0
    };
    // With len > 0, start is a valid index.
    Ok(if len > 0 { (start as usize, len as usize) } else { (0, 0) })
}

/// Names the dims of a broadcast result: per result dim, the first operand name aligned to it.
fn broadcast_dims(ops: &[Operand], rank: usize) -> Option<Dims> {
    let mut out: Dims = vec![None; rank];
    let mut any = false;
    for o in ops {
        if let Some(d) = o.dims {
            any = true;
            for (i, name) in d.iter().enumerate() {
                let slot = &mut out[rank - d.len() + i];
                if slot.is_none() {
                    slot.clone_from(name);
                }
            }
        }
    }
    any.then_some(out)
}

fn expect_dtype(o: &Operand, allowed: &[DType], what: &str) -> R<()> {
    if allowed.contains(&o.ty.dtype) {
        return Ok(());
    }
    let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    Err(format!("{what} must be {}, found {}", names.join(" or "), o.ty.dtype))
}

const NUMERIC: &[DType] = &[DType::F32, DType::I32, DType::I64];
const FLOAT: &[DType] = &[DType::F32];
const INDEX: &[DType] = &[DType::I32, DType::I64];
/// and, or, xor, not: logic on bools, bitwise on integers.
const LOGIC: &[DType] = &[DType::Bool, DType::I32, DType::I64];
const EQUATABLE: &[DType] = &[DType::F32, DType::I32, DType::I64, DType::Bool];

fn same_dtype(ops: &[Operand]) -> R<DType> {
    let d = ops[0].ty.dtype;
    match ops.iter().find(|o| o.ty.dtype != d) {
        Some(o) => Err(format!("operand dtypes differ ({d} and {}); insert a cast", o.ty.dtype)),
        None => Ok(d),
    }
}

fn keep(o: &Operand, dtype: DType) -> Inferred {
    Inferred { ty: TensorType::new(dtype, o.ty.shape.clone()), dims: o.dims.cloned() }
}

/// Infers the result of `node` from its operands. Arity and attribute kinds are checked by
/// the caller; everything that depends on operand types is checked here.
pub fn infer(node: &Node, ops: &[Operand]) -> R<Inferred> {
    use Op::*;
    // The verifier checks arity first, but not every caller is the verifier (the ONNX
    // importer infers as it builds): the `expect("arity checked")`s below rest on this.
    if !node.op.arity().accepts(ops.len()) {
        return Err(format!("takes {}, got {}", node.op.arity(), ops.len()));
    }
    let x = ops.first();
    match node.op {
        Add | Sub | Mul | Maximum | Minimum | Div | Pow => {
            let allowed = if node.op == Pow { FLOAT } else { NUMERIC };
            for (i, o) in ops.iter().enumerate() {
                expect_dtype(o, allowed, &format!("operand {i}"))?;
            }
            let dtype = same_dtype(ops)?;
            let shape = broadcast_shapes(&[&ops[0].ty.shape, &ops[1].ty.shape])?;
            let dims = broadcast_dims(ops, shape.len());
            Ok(Inferred { ty: TensorType::new(dtype, shape), dims })
        }
        Equal | Less | LessEqual | Greater | GreaterEqual | And | Or | Xor | Mod => {
            let allowed = match node.op {
                Equal => EQUATABLE,
                And | Or | Xor => LOGIC,
                Mod => INDEX,
                _ => NUMERIC,
            };
            for (i, o) in ops.iter().enumerate() {
                expect_dtype(o, allowed, &format!("operand {i}"))?;
            }
            let dtype = same_dtype(ops)?;
            let shape = broadcast_shapes(&[&ops[0].ty.shape, &ops[1].ty.shape])?;
            let dims = broadcast_dims(ops, shape.len());
            let dtype = if matches!(node.op, Mod | And | Or | Xor) { dtype } else { DType::Bool };
            Ok(Inferred { ty: TensorType::new(dtype, shape), dims })
        }
        Not => {
            let x = x.expect("arity checked");
            expect_dtype(x, LOGIC, "the operand")?;
            Ok(keep(x, x.ty.dtype))
        }
        Floor | Ceil | Round => {
            let x = x.expect("arity checked");
            expect_dtype(x, FLOAT, "the operand")?;
            Ok(keep(x, DType::F32))
        }
        CumSum => {
            let x = x.expect("arity checked");
            expect_dtype(x, NUMERIC, "the operand")?;
            norm_axis(attrs::CumSum::try_of(node)?.axis, x.ty.rank())?;
            Ok(keep(x, x.ty.dtype))
        }
        Neg | Abs | Relu => {
            let x = x.expect("arity checked");
            expect_dtype(x, NUMERIC, "the operand")?;
            Ok(keep(x, x.ty.dtype))
        }
        Exp | Log | Sqrt | Rsqrt | Tanh | Erf | Erfc | Sin | Cos | Sigmoid | Gelu | Softmax => {
            let x = x.expect("arity checked");
            expect_dtype(x, FLOAT, "the operand")?;
            if node.op == Softmax {
                norm_axis(attrs::Softmax::try_of(node)?.axis, x.ty.rank())?;
            }
            Ok(keep(x, DType::F32))
        }
        Cast => Ok(keep(x.expect("arity checked"), attrs::Cast::try_of(node)?.to)),
        Where => {
            expect_dtype(&ops[0], &[DType::Bool], "the condition")?;
            let dtype = same_dtype(&ops[1..])?;
            let shape = broadcast_shapes(&[&ops[0].ty.shape, &ops[1].ty.shape, &ops[2].ty.shape])?;
            let dims = broadcast_dims(ops, shape.len());
            Ok(Inferred { ty: TensorType::new(dtype, shape), dims })
        }
        MatMul => {
            let a = attrs::MatMul::try_of(node)?;
            let (zp, extra) = crate::ops::matmul_operands(&ops[2..], a.a_zero_point);
            let r = match a.a_zero_point {
                true => centred_matmul(&ops[..2], zp)?,
                false => matmul(&ops[..2])?,
            };
            let dtype = epilogue(a.epilogue, extra, &ops[..2], &r.ty)?;
            Ok(Inferred { ty: TensorType::new(dtype, r.ty.shape), dims: r.dims })
        }
        Einsum => einsum(&attrs::Einsum::try_of(node)?.equation, ops),
        Attention => attention(node, ops),
        ReduceSum | ReduceMean | ReduceMax => {
            let x = x.expect("arity checked");
            expect_dtype(x, if node.op == ReduceMean { FLOAT } else { NUMERIC }, "the operand")?;
            let rank = x.ty.rank();
            let attrs::Reduce { axes, keepdims } = attrs::Reduce::try_of(node)?;
            let axes = match axes {
                Some(a) => norm_axes(&a, rank)?,
                None => (0..rank).collect(),
            };
            if node.op == ReduceMax {
                if let Some(&a) = axes.iter().find(|&&a| x.ty.shape[a] == 0) {
                    return Err(format!("reduce_max over axis {a} of size 0 has no identity"));
                }
            }
            let mut shape = Vec::new();
            let mut dims = Vec::new();
            for (i, &d) in x.ty.shape.iter().enumerate() {
                let name = x.dims.and_then(|n| n[i].clone());
                if !axes.contains(&i) {
                    shape.push(d);
                    dims.push(name);
                } else if keepdims {
                    shape.push(1);
                    dims.push(None);
                }
            }
            Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims: x.dims.map(|_| dims) })
        }
        LayerNorm => {
            for (i, o) in ops.iter().enumerate() {
                expect_dtype(o, FLOAT, ["x", "gamma", "beta"][i])?;
            }
            let x = &ops[0];
            let axis = norm_axis(attrs::LayerNorm::try_of(node)?.axis, x.ty.rank())?;
            let want = &x.ty.shape[axis..];
            for (i, name) in [(1, "gamma"), (2, "beta")] {
                if ops[i].ty.shape != want {
                    return Err(format!(
                        "{name} has shape {}, expected {} (x.shape[{axis}:])",
                        sh(&ops[i].ty.shape),
                        sh(want)
                    ));
                }
            }
            Ok(keep(x, DType::F32))
        }
        Reshape => reshape(node, x.expect("arity checked")),
        Transpose => {
            let x = x.expect("arity checked");
            let rank = x.ty.rank();
            let perm = match attrs::Transpose::try_of(node)?.perm {
                Some(p) => {
                    let p = norm_axes(&p, rank).map_err(|e| format!("bad perm: {e}"))?;
                    if p.len() != rank {
                        return Err(format!("perm has {} entries, the operand has rank {rank}", p.len()));
                    }
                    p
                }
                None => (0..rank).rev().collect(),
            };
            let shape = perm.iter().map(|&p| x.ty.shape[p]).collect();
            let dims = x.dims.map(|d| perm.iter().map(|&p| d[p].clone()).collect());
            Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims })
        }
        BroadcastTo => {
            let x = x.expect("arity checked");
            let target = non_negative(&attrs::Shape::try_of(node)?.shape, "shape")?;
            let ok = target.len() >= x.ty.rank()
                && x.ty.shape.iter().zip(&target[target.len() - x.ty.rank()..]).all(|(&a, &b)| a == b || a == 1);
            if !ok {
                return Err(format!("cannot broadcast {} to {}", sh(&x.ty.shape), sh(&target)));
            }
            let dims = broadcast_dims(&[*x], target.len());
            Ok(Inferred { ty: TensorType::new(x.ty.dtype, target), dims })
        }
        BroadcastLike => {
            let shape = broadcast_shapes(&[&ops[0].ty.shape, &ops[1].ty.shape])?;
            let dims = broadcast_dims(ops, shape.len());
            Ok(Inferred { ty: TensorType::new(ops[0].ty.dtype, shape), dims })
        }
        Concat => {
            let dtype = same_dtype(ops)?;
            let first = &ops[0].ty.shape;
            let axis = norm_axis(attrs::Concat::try_of(node)?.axis, first.len())?;
            let mut shape = first.clone();
            for (i, o) in ops.iter().enumerate().skip(1) {
                let s = &o.ty.shape;
                let compatible = s.len() == first.len() && (0..s.len()).all(|d| d == axis || s[d] == first[d]);
                if !compatible {
                    return Err(format!(
                        "operand {i} has shape {}, incompatible with {} for concat along axis {axis}",
                        sh(s),
                        sh(first)
                    ));
                }
                shape[axis] = shape[axis].checked_add(s[axis]).ok_or("concat result is too large")?;
            }
            Ok(Inferred { ty: TensorType::new(dtype, shape), dims: ops[0].dims.cloned() })
        }
        Slice => slice(node, x.expect("arity checked")),
        Gather => {
            let (data, idx) = (&ops[0], &ops[1]);
            expect_dtype(idx, INDEX, "the indices")?;
            let axis = norm_axis(attrs::Gather::try_of(node)?.axis, data.ty.rank())?;
            let ds = &data.ty.shape;
            let shape = [&ds[..axis], &idx.ty.shape[..], &ds[axis + 1..]].concat();
            let dims = (data.dims.is_some() || idx.dims.is_some()).then(|| {
                let dd = |r: std::ops::Range<usize>| r.map(|i| data.dims.and_then(|d| d[i].clone())).collect::<Dims>();
                let id: Dims = idx.dims.cloned().unwrap_or_else(|| vec![None; idx.ty.rank()]);
                [dd(0..axis), id, dd(axis + 1..ds.len())].concat()
            });
            if ds[axis] == 0 && idx.ty.numel() > 0 {
                return Err(format!("gather from axis {axis} of size 0"));
            }
            Ok(Inferred { ty: TensorType::new(data.ty.dtype, shape), dims })
        }
        Iota => {
            let x = x.expect("arity checked");
            let axis = norm_axis(attrs::Iota::try_of(node)?.axis, x.ty.rank())?;
            let dims = x.dims.map(|d| vec![d[axis].clone()]);
            Ok(Inferred { ty: TensorType::new(DType::I64, vec![x.ty.shape[axis]]), dims })
        }
        ScatterElements => {
            let (data, idx, upd) = (&ops[0], &ops[1], &ops[2]);
            expect_dtype(idx, INDEX, "the indices")?;
            let attrs::ScatterElements { axis, reduction } = attrs::ScatterElements::try_of(node)?;
            let axis = norm_axis(axis, data.ty.rank())?;
            let (ds, is) = (&data.ty.shape, &idx.ty.shape);
            if upd.ty.dtype != data.ty.dtype || upd.ty.shape != *is {
                return Err(format!("updates {} must be {} of the indices' shape {}", upd.ty, data.ty.dtype, sh(is)));
            }
            if is.len() != ds.len() || (0..ds.len()).any(|d| d != axis && is[d] > ds[d]) {
                return Err(format!(
                    "indices {} must have data's rank and fit in data {} off axis {axis}",
                    sh(is),
                    sh(ds)
                ));
            }
            if ds[axis] == 0 && idx.ty.numel() > 0 {
                return Err(format!("scatter into axis {axis} of size 0"));
            }
            if reduction != ScatterReduction::None && !matches!(data.ty.dtype, DType::F32 | DType::I32 | DType::I64) {
                return Err(format!(
                    "scatter_elements reduction {reduction} needs f32, i32 or i64, got {}",
                    data.ty.dtype
                ));
            }
            Ok(keep(&ops[0], data.ty.dtype))
        }
        DynamicSlice => {
            let (x, starts) = (&ops[0], &ops[1]);
            let attrs::DynamicSlice { axes, sizes } = attrs::DynamicSlice::try_of(node)?;
            let axes = dynamic_axes(&axes, x, starts)?;
            if sizes.len() != axes.len() {
                return Err(format!("dynamic_slice has {} sizes for {} axes", sizes.len(), axes.len()));
            }
            let mut shape = x.ty.shape.clone();
            for (&a, &size) in axes.iter().zip(&sizes) {
                if size < 0 || size as u64 > shape[a] as u64 {
                    return Err(format!("size {size} along axis {a} does not fit the operand {}", sh(&shape)));
                }
                shape[a] = size as usize;
            }
            Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims: x.dims.cloned() })
        }
        DynamicUpdateSlice => {
            let (x, update, starts) = (&ops[0], &ops[1], &ops[2]);
            let axes = dynamic_axes(&attrs::DynamicUpdateSlice::try_of(node)?.axes, x, starts)?;
            let (xs, us) = (&x.ty.shape, &update.ty.shape);
            let fits = update.ty.dtype == x.ty.dtype
                && us.len() == xs.len()
                && (0..xs.len()).all(|d| if axes.contains(&d) { us[d] <= xs[d] } else { us[d] == xs[d] });
            if !fits {
                return Err(format!(
                    "the update {} must be {} of the operand's shape {} off axes {axes:?}, no larger along them",
                    update.ty,
                    x.ty.dtype,
                    sh(xs)
                ));
            }
            Ok(keep(x, x.ty.dtype))
        }
        Send => Ok(keep(x.expect("arity checked"), x.expect("arity checked").ty.dtype)),
        Recv => {
            let recv = attrs::Recv::try_of(node)?;
            let shape = non_negative(&recv.shape, "shape")?;
            Ok(Inferred { ty: TensorType::new(recv.dtype, shape), dims: None })
        }
        AllReduce | AllGather | ReduceScatter | AllToAll => collective(node, x.expect("arity checked")),
        Conv => conv(node, ops),
        MaxPool | AvgPool => {
            let x = x.expect("arity checked");
            expect_dtype(x, FLOAT, "the operand")?;
            if x.ty.rank() < 3 {
                return Err(format!(
                    "{} wants x of rank >= 3 ([N, C, spatial...]), found rank {}",
                    node.op,
                    x.ty.rank()
                ));
            }
            let win = crate::window::Window::of(node, x.ty.rank() - 2, None)?;
            let shape = [&x.ty.shape[..2], &win.out_sizes(&x.ty.shape[2..])?[..]].concat();
            Ok(Inferred { ty: TensorType::new(DType::F32, shape), dims: window_dims(x) })
        }
        Pad => {
            let x = x.expect("arity checked");
            let (_, shape) = crate::window::pad_shape(node, &x.ty.shape)?;
            let dims =
                x.dims.map(|d| (0..shape.len()).map(|i| d[i].clone().filter(|_| shape[i] == x.ty.shape[i])).collect());
            Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims })
        }
    }
}

/// The names a window op keeps: batch and channel (spatial sizes change).
fn window_dims(x: &Operand) -> Option<Dims> {
    x.dims.map(|d| (0..d.len()).map(|i| if i < 2 { d[i].clone() } else { None }).collect())
}

fn conv(node: &Node, ops: &[Operand]) -> R<Inferred> {
    if ops.len() > 3 {
        return Err(format!("conv takes x, w and an optional bias, got {} operands", ops.len()));
    }
    for (i, o) in ops.iter().enumerate() {
        expect_dtype(o, FLOAT, ["x", "the weight", "the bias"][i])?;
    }
    let (x, w) = (&ops[0].ty.shape, &ops[1].ty.shape);
    let (win, _) = crate::window::conv_window(node, x, w)?;
    if let Some(b) = ops.get(2) {
        if b.ty.shape != [w[0]] {
            return Err(format!(
                "the bias has shape {}, expected [{}] (one per output channel)",
                sh(&b.ty.shape),
                w[0]
            ));
        }
    }
    let shape = [&[x[0], w[0]][..], &win.out_sizes(&x[2..])?[..]].concat();
    let mut dims = window_dims(&ops[0]);
    if let (Some(d), Some(wd)) = (dims.as_mut(), ops[1].dims) {
        d[1].clone_from(&wd[0]);
    }
    Ok(Inferred { ty: TensorType::new(DType::F32, shape), dims })
}

fn non_negative(v: &[i64], what: &str) -> R<Vec<usize>> {
    v.iter().map(|&d| usize::try_from(d).map_err(|_| format!("{what} has a negative entry {d}"))).collect()
}

/// f32 × f32, or i32 × i32 (an integer product, exact, wrapping like every i32 op: ONNX's
/// MatMulInteger accumulates in i32).
fn matmul(ops: &[Operand]) -> R<Inferred> {
    let (a, b) = (&ops[0], &ops[1]);
    expect_dtype(a, &[DType::F32, DType::I32], "lhs")?;
    expect_dtype(b, &[a.ty.dtype], "rhs")?;
    let (sa, sb) = (&a.ty.shape, &b.ty.shape);
    if sa.is_empty() || sb.is_empty() {
        return Err("matmul operands must have rank >= 1".into());
    }
    // numpy: a 1-D lhs is a row vector, a 1-D rhs a column vector; the added dim is dropped.
    let pa: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
    let pb: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
    let (m, k) = (pa[pa.len() - 2], pa[pa.len() - 1]);
    let (k2, n) = (pb[pb.len() - 2], pb[pb.len() - 1]);
    if k != k2 {
        return Err(format!("matmul contracting dims differ: {} x {} ({k} vs {k2})", sh(sa), sh(sb)));
    }
    let batch =
        broadcast_shapes(&[&pa[..pa.len() - 2], &pb[..pb.len() - 2]]).map_err(|e| format!("matmul batch dims: {e}"))?;
    let name = |o: &Operand, i: usize| o.dims.and_then(|d| d[i].clone());
    let mut shape = batch.clone();
    let mut dims: Dims = vec![None; batch.len()];
    // Batch dim names come from the lhs, as docs/design.md §3 says.
    if let Some(d) = a.dims.filter(|_| sa.len() > 2) {
        let off = batch.len() - (sa.len() - 2);
        for i in 0..sa.len() - 2 {
            dims[off + i].clone_from(&d[i]);
        }
    }
    if sa.len() > 1 {
        shape.push(m);
        dims.push(name(a, sa.len() - 2));
    }
    if sb.len() > 1 {
        shape.push(n);
        dims.push(name(b, sb.len() - 1));
    }
    let any = a.dims.is_some() || b.dims.is_some();
    Ok(Inferred { ty: TensorType::new(a.ty.dtype, shape), dims: any.then_some(dims) })
}

/// The product of an 8-bit `a` less its zero point `zp` (an i32 of one element) by an i32
/// `b`: i32, as `matmul` of `cast(a, i32) − zp` and `b`.
fn centred_matmul(ab: &[Operand], zp: Option<&Operand>) -> R<Inferred> {
    let zp = zp.ok_or("matmul with a_zero_point takes the zero point after a and b")?;
    expect_dtype(&ab[0], &[DType::U8, DType::I8], "lhs (with a_zero_point)")?;
    expect_dtype(zp, &[DType::I32], "the zero point")?;
    if zp.ty.numel() != 1 {
        return Err(format!("the zero point of a matmul's a is one element, not {}", sh(&zp.ty.shape)));
    }
    let widened = TensorType::new(DType::I32, ab[0].ty.shape.clone());
    matmul(&[Operand { ty: &widened, ..ab[0] }, ab[1]])
}

/// Checks a matmul's epilogue (`extra`: its operands after `ab` and the zero point) against
/// its product `out`; the result's dtype. An i32 product's epilogue starts with `to_f32`
/// (the steps after it are f32 arithmetic), and only an i32 product's does.
fn epilogue(attr: Option<String>, extra: &[Operand], ab: &[Operand], out: &TensorType) -> R<DType> {
    let steps = match attr {
        Some(s) => crate::ops::epilogue_steps(&s)?,
        None => Vec::new(),
    };
    crate::ops::check_epilogue_conversion(steps.iter().map(|s| s.0), out.dtype == DType::I32)?;
    let converts = !steps.is_empty() && out.dtype == DType::I32;
    let binary = steps.iter().filter(|s| s.1).count();
    if binary != extra.len() {
        return Err(format!("matmul has {} operands after a and b, its epilogue takes {binary}", extra.len()));
    }
    if !steps.is_empty() && ab.iter().any(|o| o.ty.rank() < 2) {
        return Err("an epilogue follows a product of matrices (rank >= 2 each)".into());
    }
    for (i, o) in extra.iter().enumerate() {
        expect_dtype(o, FLOAT, &format!("epilogue operand {i}"))?;
        crate::ops::check_epilogue_operand(&o.ty.shape, &out.shape)?;
    }
    Ok(if converts { DType::F32 } else { out.dtype })
}

/// An `attention` node's result: `matmul(softmax(steps(matmul(q, kt)), -1), v)` of matrices
/// (rank >= 2 each), its steps' operands broadcasting to the scores without growing them and
/// its scale a single element.
fn attention(node: &Node, ops: &[Operand]) -> R<Inferred> {
    let steps = attrs::Attention::try_of(node)?.scores.steps();
    if ops.len() != 3 + steps.len() {
        return Err(format!(
            "attention has {} operands after q, kt and v, its scores take {}",
            ops.len() - 3,
            steps.len()
        ));
    }
    if let Some(k) = ops[..3].iter().position(|o| o.ty.rank() < 2) {
        return Err(format!("attention operand {} must have rank >= 2", ["q", "kt", "v"][k]));
    }
    for (o, what) in ops[..3].iter().zip(["q", "kt", "v"]) {
        expect_dtype(o, FLOAT, what)?;
    }
    let scores = matmul(&ops[..2])?;
    for (o, step) in ops[3..].iter().zip(&steps) {
        expect_dtype(o, FLOAT, &format!("the {step} operand"))?;
        crate::ops::check_epilogue_operand(&o.ty.shape, &scores.ty.shape)?;
        if *step != "add" && o.ty.numel() != 1 {
            return Err(format!("the {step} operand of attention scales: one element, not {}", o.ty));
        }
    }
    matmul(&[Operand { ty: &scores.ty, dims: scores.dims.as_ref() }, ops[2]])
}

/// Parses `"ab,bc->ac"` into operand letter lists and the output letters.
pub fn parse_equation(eq: &str, n_ops: usize) -> R<(Vec<Vec<char>>, Vec<char>)> {
    // Quoted shortened: an equation holding quotes defeats the shortening of quoted names.
    let q = crate::error::shorten(eq);
    let (lhs, out) =
        eq.split_once("->").ok_or_else(|| format!("einsum equation '{q}' needs an explicit '->' output"))?;
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.trim().chars().collect()).collect();
    let out: Vec<char> = out.trim().chars().collect();
    if terms.len() != n_ops {
        return Err(format!(
            "einsum equation '{q}' has {} operand terms but the node has {n_ops} operands",
            terms.len()
        ));
    }
    for t in terms.iter().chain(std::iter::once(&out)) {
        if let Some(c) = t.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(format!("einsum equation '{q}': unsupported character '{c}' (letters only)"));
        }
        for (i, c) in t.iter().enumerate() {
            if t[..i].contains(c) {
                return Err(format!("einsum equation '{q}': letter '{c}' repeats within one term"));
            }
        }
    }
    Ok((terms, out))
}

fn einsum(eq: &str, ops: &[Operand]) -> R<Inferred> {
    let (terms, out) = parse_equation(eq, ops.len())?;
    let mut sizes: Vec<(char, usize, Option<String>)> = Vec::new();
    for (i, (t, o)) in terms.iter().zip(ops).enumerate() {
        expect_dtype(o, FLOAT, &format!("operand {i}"))?;
        if t.len() != o.ty.rank() {
            return Err(format!(
                "einsum term '{}' has {} letters but operand {i} has rank {}",
                t.iter().collect::<String>(),
                t.len(),
                o.ty.rank()
            ));
        }
        for (j, &c) in t.iter().enumerate() {
            let d = o.ty.shape[j];
            let name = o.dims.and_then(|n| n[j].clone());
            match sizes.iter_mut().find(|(l, _, _)| *l == c) {
                Some((_, s, _)) if *s != d => return Err(format!("einsum letter '{c}' has sizes {s} and {d}")),
                Some((_, _, n)) => {
                    if n.is_none() {
                        *n = name;
                    }
                }
                None => sizes.push((c, d, name)),
            }
        }
    }
    let mut shape = Vec::new();
    let mut dims = Vec::new();
    for c in &out {
        let (_, d, n) = sizes
            .iter()
            .find(|(l, _, _)| l == c)
            .ok_or_else(|| format!("einsum output letter '{c}' appears in no operand"))?;
        shape.push(*d);
        dims.push(n.clone());
    }
    let any = ops.iter().any(|o| o.dims.is_some());
    Ok(Inferred { ty: TensorType::new(DType::F32, shape), dims: any.then_some(dims) })
}

fn reshape(node: &Node, x: &Operand) -> R<Inferred> {
    let want = attrs::Shape::try_of(node)?.shape;
    if want.iter().filter(|&&d| d == -1).count() > 1 {
        return Err("reshape shape may contain at most one -1".into());
    }
    if let Some(d) = want.iter().find(|&&d| d < -1) {
        return Err(format!("reshape shape has a negative entry {d}"));
    }
    let n = x.ty.numel();
    let too_large = || format!("reshape target {} is too large", Attr::ints(&want));
    let known =
        want.iter().filter(|&&d| d != -1).try_fold(1usize, |p, &d| p.checked_mul(d as usize)).ok_or_else(too_large)?;
    let shape: Vec<usize> = if want.contains(&-1) {
        if known == 0 || !n.is_multiple_of(known) {
            return Err(format!("cannot reshape {} into {}", sh(&x.ty.shape), Attr::ints(&want)));
        }
        want.iter().map(|&d| if d == -1 { n / known } else { d as usize }).collect()
    } else {
        want.iter().map(|&d| d as usize).collect()
    };
    if shape.iter().try_fold(1usize, |p, &d| p.checked_mul(d)) != Some(n) {
        return Err(format!("cannot reshape {} ({n} elements) into {}", sh(&x.ty.shape), sh(&shape)));
    }
    // Names survive on the leading and trailing dims whose sizes did not change.
    let dims = x.dims.map(|d| {
        let old = &x.ty.shape;
        let mut out: Dims = vec![None; shape.len()];
        let lead = old.iter().zip(&shape).take_while(|(a, b)| a == b).count();
        out[..lead].clone_from_slice(&d[..lead]);
        let trail = old
            .iter()
            .rev()
            .zip(shape.iter().rev())
            .take_while(|(a, b)| a == b)
            .count()
            .min(shape.len() - lead)
            .min(old.len() - lead);
        for i in 0..trail {
            out[shape.len() - 1 - i].clone_from(&d[old.len() - 1 - i]);
        }
        out
    });
    Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims })
}

/// The axes of a dynamic_slice or dynamic_update_slice, checked against its operand `x` and
/// its `starts`: one i32 or i64 start per axis.
fn dynamic_axes(axes: &[i64], x: &Operand, starts: &Operand) -> R<Vec<usize>> {
    expect_dtype(starts, INDEX, "the starts")?;
    let axes = norm_axes(axes, x.ty.rank())?;
    if starts.ty.shape != [axes.len()] {
        return Err(format!("the starts are {}, where the axes {axes:?} need [{}]", starts.ty, axes.len()));
    }
    Ok(axes)
}

/// Where a window of `len` elements along an axis of `n` starts when asked to start at
/// `start`: clamped into `0..=n - len`, so that the window always lies inside (XLA's rule;
/// a negative start is 0).
pub fn dynamic_start(start: i64, len: usize, n: usize) -> usize {
    start.clamp(0, n.saturating_sub(len) as i64) as usize
}

fn slice(node: &Node, x: &Operand) -> R<Inferred> {
    let attrs::Slice { starts, ends, axes, steps } = attrs::Slice::try_of(node)?;
    let rank = x.ty.rank();
    let axes = match axes {
        Some(a) => norm_axes(&a, rank)?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; axes.len()]);
    if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
        return Err(format!(
            "slice needs as many starts, ends and steps as axes (starts {}, ends {}, steps {}, axes {})",
            starts.len(),
            ends.len(),
            steps.len(),
            axes.len()
        ));
    }
    if axes.iter().any(|&a| a >= rank) {
        return Err(format!("slice lists {} axes but the operand has rank {rank}", axes.len()));
    }
    let mut shape = x.ty.shape.clone();
    for (i, &a) in axes.iter().enumerate() {
        shape[a] = slice_range(starts[i], ends[i], steps[i], x.ty.shape[a]).map_err(|e| format!("axis {a}: {e}"))?.1;
    }
    Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims: x.dims.cloned() })
}

/// The group size of a collective, after checking its groups are well formed.
pub fn group_size(node: &Node) -> R<usize> {
    let groups = node.groups()?;
    let n = groups.first().map_or(0, Vec::len);
    if n == 0 {
        return Err("groups must be non-empty lists of device indices".into());
    }
    if groups.iter().any(|g| g.len() != n) {
        return Err("all groups must have the same size".into());
    }
    let mut seen = std::collections::BTreeSet::new();
    for &d in groups.iter().flatten() {
        if d < 0 || !seen.insert(d) {
            return Err(format!("device {d} is negative or appears in more than one group"));
        }
    }
    Ok(n)
}

fn collective(node: &Node, x: &Operand) -> R<Inferred> {
    let n = group_size(node)?;
    let rank = x.ty.rank();
    let mut shape = x.ty.shape.clone();
    // all_gather and all_to_all move elements of any dtype; the reducing ones need numbers.
    if matches!(node.op, Op::AllReduce | Op::ReduceScatter) && !x.ty.dtype.is_numeric() {
        return Err(format!("{} of {} is not supported", node.op, x.ty.dtype.name()));
    }
    match node.op {
        Op::AllReduce => {}
        Op::AllGather => {
            let a = norm_axis(attrs::AllGather::try_of(node)?.axis, rank)?;
            shape[a] = shape[a].checked_mul(n).ok_or("all_gather result is too large")?;
        }
        Op::ReduceScatter => {
            let a = norm_axis(attrs::ReduceScatter::try_of(node)?.axis, rank)?;
            if !shape[a].is_multiple_of(n) {
                return Err(format!("reduce_scatter axis {a} of size {} does not divide by group size {n}", shape[a]));
            }
            shape[a] /= n;
        }
        _ => {
            let a2a = attrs::AllToAll::try_of(node)?;
            let (s, c) = (norm_axis(a2a.split_axis, rank)?, norm_axis(a2a.concat_axis, rank)?);
            if !shape[s].is_multiple_of(n) {
                return Err(format!(
                    "all_to_all split axis {s} of size {} does not divide by group size {n}",
                    shape[s]
                ));
            }
            shape[s] /= n;
            shape[c] = shape[c].checked_mul(n).ok_or("all_to_all result is too large")?;
        }
    }
    let dims = x.dims.cloned();
    Ok(Inferred { ty: TensorType::new(x.ty.dtype, shape), dims })
}
