//! The reference interpreter: plain, obviously-correct semantics of every op of
//! `docs/ops.md` over host [`Tensor`]s — the oracle every compiled path is tested against.
//!
//! Numerics: f32 tensors are computed with f64 intermediates and rounded to f32 once per
//! op (elementwise ops per element; matmul, einsum, reductions, softmax and layer_norm
//! accumulate in f64). Integer ops work in their own type with wrapping arithmetic, as
//! numpy does. `maximum`, `minimum`, `relu` and `reduce_max` propagate NaN like numpy.
//!
//! Structure: every op is a short function built from a few shared pieces —
//! [`Strided`] (an odometer over a strided view, used for broadcasting, transpose, slice,
//! broadcast_to and the outer/inner loops of reductions and einsum), [`map2`] (every
//! binary elementwise op), [`reduce`] (the three reductions and the softmax / layer_norm
//! statistics) and the [`Elem`] trait with the `with_elem!` macro, which let the
//! data-movement ops be written once for all four dtypes.
//!
//! Errors never panic: everything surprising becomes `node 'NAME': ...`.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::attrs::{self, GeluApprox, ScatterReduction};
use crate::budget;
use crate::dtype::{DType, ShapeDisplay, TensorType};
use crate::error::{Error, Result};
use crate::graph::{Graph, Node};
use crate::infer::{dynamic_start, norm_axes, norm_axis, slice_range};
use crate::ops::Op;
use crate::tensor::{Data, Tensor};

/// Errors inside an op are plain messages; [`eval_node`] prefixes the node's name.
type R<T> = std::result::Result<T, String>;

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// Evaluates one node given its operand values and its (inferred, verified) result type
/// `out`. The result's type is computed independently and must agree with `out`.
pub fn eval_node(node: &Node, args: &[&Tensor], out: &TensorType) -> Result<Tensor> {
    let fail = |msg: String| Error::at(node.loc, format!("node '{}': {msg}", node.name));
    if node.op.is_communication() {
        return Err(fail(format!("communication op {} cannot run in the single-graph interpreter", node.op)));
    }
    if !node.op.arity().accepts(args.len()) {
        return Err(fail(format!("{} takes {}, got {}", node.op, node.op.arity(), args.len())));
    }
    for (i, a) in args.iter().enumerate() {
        let numel = a.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel != Some(a.data.len()) {
            return Err(fail(format!(
                "operand {i} has shape {} but {} elements",
                ShapeDisplay(&a.shape),
                a.data.len()
            )));
        }
    }
    // Asked before the evaluation, which would abort the process when the system cannot
    // give the memory.
    budget::check_shape(format_args!("its result {out}"), &out.shape, out.dtype.size_bytes()).map_err(fail)?;
    let result = eval(node, args).map_err(fail)?;
    if result.ty() != *out {
        return Err(fail(format!("computed a result of type {} but the inferred type is {out}", result.ty())));
    }
    Ok(result)
}

/// Runs a whole graph. `order` is a topological order of indices into `graph.nodes`,
/// `types` the result type of every node, `values` every input and param. A value is
/// dropped as soon as its last consumer has run (unless it is a graph output). Returns the
/// graph outputs by name.
pub fn run(
    graph: &Graph,
    order: &[usize],
    types: &HashMap<String, TensorType>,
    mut values: HashMap<String, Tensor>,
) -> Result<BTreeMap<String, Tensor>> {
    let outputs: HashSet<&str> = graph.outputs.iter().map(|o| o.name.as_str()).collect();
    // For each value, the position in `order` of the last node that reads it.
    let mut last_use: HashMap<&str, usize> = HashMap::new();
    for (pos, &i) in order.iter().enumerate() {
        let node = graph.nodes.get(i).ok_or_else(|| {
            Error::new(format!("evaluation order names node index {i}, but the graph has {} nodes", graph.nodes.len()))
        })?;
        for input in &node.inputs {
            last_use.insert(input, pos);
        }
    }
    for (pos, &i) in order.iter().enumerate() {
        let node = &graph.nodes[i];
        let fail = |msg: String| Error::at(node.loc, format!("node '{}': {msg}", node.name));
        let out = types.get(&node.name).ok_or_else(|| fail("no inferred result type".into()))?;
        let result = {
            let args = node
                .inputs
                .iter()
                .map(|name| {
                    values.get(name).ok_or_else(|| {
                        fail(format!("operand '{name}' has no value (not an input, param or earlier node)"))
                    })
                })
                .collect::<Result<Vec<&Tensor>>>()?;
            eval_node(node, &args, out)?
        };
        for input in &node.inputs {
            if last_use.get(input.as_str()) == Some(&pos) && !outputs.contains(input.as_str()) {
                values.remove(input);
            }
        }
        // A value nobody reads and nobody asked for is dropped at once.
        if last_use.contains_key(node.name.as_str()) || outputs.contains(node.name.as_str()) {
            values.insert(node.name.clone(), result);
        }
    }
    let mut result = BTreeMap::new();
    for o in &graph.outputs {
        if result.contains_key(&o.name) {
            continue;
        }
        let v = values.remove(&o.name).ok_or_else(|| Error::at(o.loc, format!("output '{}' has no value", o.name)))?;
        result.insert(o.name.clone(), v);
    }
    Ok(result)
}

// ---------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------

fn eval(node: &Node, args: &[&Tensor]) -> R<Tensor> {
    use Op::*;
    let op = node.op;
    match op {
        Add | Sub | Mul | Div | Maximum | Minimum | Pow => binary(op, args[0], args[1]),
        Equal | Less | LessEqual | Greater | GreaterEqual => compare(op, args[0], args[1]),
        And | Or | Xor => logic(op, args[0], args[1]),
        Not => {
            let x = args[0];
            let data = match x.dtype() {
                DType::I32 => Data::I32(elems::<i32>(x)?.iter().map(|v| !v).collect()),
                DType::I64 => Data::I64(elems::<i64>(x)?.iter().map(|v| !v).collect()),
                _ => Data::Bool(elems::<bool>(x)?.iter().map(|b| !b).collect()),
            };
            Ok(Tensor::new(x.shape.clone(), data))
        }
        Mod => modulo(args[0], args[1], attrs::Mod::try_of(node)?.fmod),
        Neg | Abs | Exp | Log | Sqrt | Rsqrt | Tanh | Erf | Erfc | Sin | Cos | Sigmoid | Relu | Gelu | Floor | Ceil
        | Round => {
            let tanh_gelu = op == Gelu && attrs::Gelu::try_of(node)?.approximate == GeluApprox::Tanh;
            unary(op, tanh_gelu, args[0])
        }
        Cast => Ok(Tensor::new(args[0].shape.clone(), cast(&args[0].data, attrs::Cast::try_of(node)?.to))),
        Where => where_(args[0], args[1], args[2]),
        MatMul => {
            let a = attrs::MatMul::try_of(node)?;
            let (zp, extra) = crate::ops::matmul_operands(&args[2..], a.a_zero_point);
            let mut y = match zp {
                Some(zp) => {
                    // The zero point is one element of any shape: a scalar, so `a` keeps its own.
                    let (a, zp) = (
                        Tensor::new(args[0].shape.clone(), cast(&args[0].data, DType::I32)),
                        Tensor::new(vec![], zp.data.clone()),
                    );
                    matmul(&binary(Sub, &a, &zp)?, args[1])?
                }
                None => matmul(args[0], args[1])?,
            };
            let steps = match a.epilogue {
                None => Vec::new(),
                Some(s) => crate::ops::epilogue_steps(&s)?,
            };
            let mut operands = extra.iter();
            let mut next = || operands.next().ok_or_else(|| "an epilogue step lacks its operand".to_string());
            for (name, _) in steps {
                y = match name {
                    "to_f32" => Tensor::new(y.shape.clone(), cast(&y.data, DType::F32)),
                    "add" => binary(Add, &y, next()?)?,
                    "mul" => binary(Mul, &y, next()?)?,
                    "div" => binary(Div, &y, next()?)?,
                    "relu" => unary(Relu, false, &y)?,
                    "gelu" => unary(Gelu, false, &y)?,
                    "gelu_tanh" => unary(Gelu, true, &y)?,
                    "silu" => binary(Mul, &y, &unary(Sigmoid, false, &y)?)?,
                    other => return Err(format!("epilogue step '{other}' has no arithmetic here")),
                };
            }
            Ok(y)
        }
        Einsum => einsum(&attrs::Einsum::try_of(node)?.equation, args),
        Attention => {
            let mut scores = matmul(args[0], args[1])?;
            for (step, y) in attrs::Attention::try_of(node)?.scores.steps().into_iter().zip(&args[3..]) {
                let op = match step {
                    "mul" => Mul,
                    "div" => Div,
                    _ => Add,
                };
                scores = binary(op, &scores, y)?;
            }
            matmul(&softmax(&scores, -1)?, args[2])
        }
        ReduceSum | ReduceMean | ReduceMax => {
            let attrs::Reduce { axes, keepdims } = attrs::Reduce::try_of(node)?;
            let axes = match axes {
                None => (0..args[0].shape.len()).collect(),
                Some(axes) => {
                    let mut axes = norm_axes(&axes, args[0].shape.len())?;
                    axes.sort_unstable();
                    axes
                }
            };
            reduce_op(op, args[0], &axes, keepdims)
        }
        Softmax => softmax(args[0], attrs::Softmax::try_of(node)?.axis),
        LayerNorm => {
            let attrs::LayerNorm { axis, eps } = attrs::LayerNorm::try_of(node)?;
            layer_norm(args[0], args[1], args[2], axis, eps)
        }
        Reshape => reshape(args[0], &attrs::Shape::try_of(node)?.shape),
        Transpose => transpose(args[0], attrs::Transpose::try_of(node)?.perm),
        BroadcastTo => broadcast_to(args[0], &attrs::Shape::try_of(node)?.shape),
        BroadcastLike => {
            let shape = broadcast_shapes(&[&args[0].shape, &args[1].shape])?;
            broadcast_to(args[0], &shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
        }
        Concat => concat(args, attrs::Concat::try_of(node)?.axis),
        Slice => slice(args[0], &attrs::Slice::try_of(node)?),
        Gather => gather(args[0], args[1], attrs::Gather::try_of(node)?.axis),
        Iota => {
            let n = args[0].shape[norm_axis(attrs::Iota::try_of(node)?.axis, args[0].shape.len())?];
            Ok(Tensor::new(vec![n], Data::I64((0..n as i64).collect())))
        }
        ScatterElements => {
            let attrs::ScatterElements { axis, reduction } = attrs::ScatterElements::try_of(node)?;
            scatter_elements(args, axis, reduction)
        }
        DynamicSlice => {
            let attrs::DynamicSlice { axes, sizes } = attrs::DynamicSlice::try_of(node)?;
            let sizes: Vec<usize> = sizes
                .iter()
                .map(|&s| usize::try_from(s).map_err(|_| format!("negative size {s}")))
                .collect::<R<_>>()?;
            let (shape, strides, offset) = dynamic_window(args[0], args[1], &axes, &sizes)?;
            strided_view(args[0], shape, strides, offset)
        }
        DynamicUpdateSlice => {
            let [x, update, starts] = args else {
                return Err("dynamic_update_slice takes x, update and starts".into());
            };
            let axes = attrs::DynamicUpdateSlice::try_of(node)?.axes;
            if update.shape.len() != x.shape.len() {
                return Err(format!("the update {} does not have the rank of {}", update.ty(), x.ty()));
            }
            let sizes: Vec<usize> = norm_axes(&axes, x.shape.len())?.iter().map(|&a| update.shape[a]).collect();
            let (shape, strides, offset) = dynamic_window(x, starts, &axes, &sizes)?;
            if update.shape != shape || update.dtype() != x.dtype() {
                return Err(format!("the update {} does not fit {} at {}", update.ty(), x.ty(), ShapeDisplay(&shape)));
            }
            write_view(x, update, Strided::new(&shape, strides, offset))
        }
        Send | Recv | AllReduce | AllGather | ReduceScatter | AllToAll => {
            Err(format!("communication op {op} cannot run in the single-graph interpreter"))
        }
        Conv => crate::window::conv(node, args[0], args[1], args.get(2).copied()),
        MaxPool | AvgPool => crate::window::pool(node, args[0], op == MaxPool),
        Pad => crate::window::pad(node, args[0]),
        CumSum => cumsum(args[0], attrs::CumSum::try_of(node)?),
    }
}

/// cumsum: running sums along the axis, added one by one in the element type as numpy's
/// cumsum (ONNX's reference) does; the first sum is the first element itself, and
/// `exclusive` shifts them by one (0 first). `reverse` runs from the end. Integers wrap.
fn cumsum(x: &Tensor, a: attrs::CumSum) -> R<Tensor> {
    fn scan<T: Copy + Default>(v: &[T], shape: &[usize], ax: usize, a: &attrs::CumSum, add: fn(T, T) -> T) -> Vec<T> {
        let (n, inner) = (shape[ax], numel(&shape[ax + 1..]));
        let mut out = vec![T::default(); v.len()];
        for o in 0..numel(&shape[..ax]) {
            for i in 0..inner {
                let mut acc = T::default();
                for j in 0..n {
                    let at = (o * n + if a.reverse { n - 1 - j } else { j }) * inner + i;
                    let before = acc;
                    acc = if j == 0 { v[at] } else { add(acc, v[at]) };
                    out[at] = if a.exclusive { before } else { acc };
                }
            }
        }
        out
    }
    let ax = norm_axis(a.axis, x.shape.len())?;
    let s = &x.shape;
    let data = match &x.data {
        Data::F32(v) => Data::F32(scan(v, s, ax, &a, |p, q| p + q)),
        Data::I32(v) => Data::I32(scan(v, s, ax, &a, i32::wrapping_add)),
        Data::I64(v) => Data::I64(scan(v, s, ax, &a, i64::wrapping_add)),
        _ => return Err(undefined(Op::CumSum, x.dtype())),
    };
    Ok(Tensor::new(x.shape.clone(), data))
}

// ---------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------

/// A Rust element type of one of the four dtypes.
trait Elem: Copy + 'static {
    const DTYPE: DType;
    fn slice(d: &Data) -> Option<&[Self]>;
    fn wrap(v: Vec<Self>) -> Data;
}

macro_rules! elem {
    ($t:ty, $variant:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn slice(d: &Data) -> Option<&[$t]> {
                match d {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<$t>) -> Data {
                Data::$variant(v)
            }
        }
    };
}
elem!(f32, F32);
elem!(i32, I32);
elem!(i64, I64);
elem!(bool, Bool);
elem!(half::f16, F16);
elem!(half::bf16, BF16);
elem!(i8, I8);
elem!(u8, U8);
elem!(i16, I16);
elem!(u16, U16);
elem!(u32, U32);
elem!(u64, U64);

/// Integer element types: wrapping arithmetic, like numpy.
trait Int: Elem + Ord {
    const MIN: Self;
    const ZERO: Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wneg(self) -> Self;
    fn wabs(self) -> Self;
    fn wrem(self, o: Self) -> Self;
    fn wdiv(self, o: Self) -> Self;
}

macro_rules! int {
    ($t:ty) => {
        impl Int for $t {
            const MIN: Self = <$t>::MIN;
            const ZERO: Self = 0;
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
            fn wabs(self) -> Self {
                self.wrapping_abs()
            }
            fn wrem(self, o: Self) -> Self {
                self.wrapping_rem(o)
            }
            fn wdiv(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
        }
    };
}
int!(i32);
int!(i64);

/// Runs `$body` with `$T` bound to the element type of `$dtype`.
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr) => {
        with_elem!(@each $dtype, $T, $body; F32 f32, I32 i32, I64 i64, Bool bool, F16 half::f16,
            BF16 half::bf16, I8 i8, U8 u8, I16 i16, U16 u16, U32 u32, U64 u64)
    };
    (@each $dtype:expr, $T:ident, $body:expr; $($variant:ident $t:ty),*) => {
        match $dtype {
            $(DType::$variant => {
                type $T = $t;
                $body
            })*
        }
    };
}

/// The elements of `t`, which must be of dtype `T`.
fn elems<T: Elem>(t: &Tensor) -> R<&[T]> {
    T::slice(&t.data).ok_or_else(|| format!("expected a {} operand, got {}", T::DTYPE, t.dtype()))
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn narrow(v: impl IntoIterator<Item = f64>) -> Vec<f32> {
    v.into_iter().map(|x| x as f32).collect()
}

/// numpy `maximum`: NaN in either operand gives NaN.
fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || a >= b {
        a
    } else {
        b
    }
}

/// numpy `minimum`: NaN in either operand gives NaN.
fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || a <= b {
        a
    } else {
        b
    }
}

// ---------------------------------------------------------------------------------------
// Shapes, broadcasting and strided views
// ---------------------------------------------------------------------------------------

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The element count of a result about to be allocated; refuses sizes that overflow or
/// could never be allocated instead of panicking in the allocator.
/// numpy broadcasting (`infer::broadcast_shapes`), refusing results too large to allocate.
fn broadcast_shapes(shapes: &[&[usize]]) -> R<Vec<usize>> {
    let out = crate::infer::broadcast_shapes(shapes)?;
    result_len(&out)?;
    Ok(out)
}

fn result_len(shape: &[usize]) -> R<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as usize / 8)
        .ok_or_else(|| format!("result shape {} is too large", ShapeDisplay(shape)))
}

/// Row-major strides, in elements.
fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut s = 1isize;
    for d in (0..shape.len()).rev() {
        strides[d] = s;
        s = s.wrapping_mul(shape[d] as isize);
    }
    strides
}

/// Strides that read a contiguous tensor of shape `from` as if it had shape `to` (numpy
/// broadcasting: missing leading dims and size-1 dims repeat, with stride 0).
fn broadcast_strides(from: &[usize], to: &[usize]) -> R<Vec<isize>> {
    let fail = || format!("cannot broadcast shape {} to {}", ShapeDisplay(from), ShapeDisplay(to));
    let lead = to.len().checked_sub(from.len()).ok_or_else(fail)?;
    let own = contiguous_strides(from);
    let mut strides = vec![0isize; to.len()];
    for (i, (&n, &s)) in from.iter().zip(&own).enumerate() {
        if n == to[lead + i] {
            strides[lead + i] = s;
        } else if n != 1 {
            return Err(fail());
        }
    }
    Ok(strides)
}

/// Iterator over the element offsets of a strided view: `shape` walked in row-major
/// order, element `idx` at `offset + Σ idx[d] * strides[d]`.
struct Strided {
    shape: Vec<usize>,
    strides: Vec<isize>,
    index: Vec<usize>,
    offset: isize,
    left: usize,
}

impl Strided {
    fn new(shape: &[usize], strides: Vec<isize>, offset: isize) -> Strided {
        debug_assert_eq!(shape.len(), strides.len());
        Strided { shape: shape.to_vec(), strides, index: vec![0; shape.len()], offset, left: numel(shape) }
    }

    /// Walks a tensor of shape `from` broadcast to `to`.
    fn broadcast(from: &[usize], to: &[usize]) -> R<Strided> {
        Ok(Strided::new(to, broadcast_strides(from, to)?, 0))
    }
}

impl Iterator for Strided {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let current = self.offset as usize;
        // Wrapping: after the last element the odometer may step past huge unused strides.
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            self.offset = self.offset.wrapping_add(self.strides[d]);
            if self.index[d] < self.shape[d] {
                break;
            }
            self.offset = self.offset.wrapping_sub(self.strides[d].wrapping_mul(self.shape[d] as isize));
            self.index[d] = 0;
        }
        Some(current)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// The elements of `v` at the offsets `at`.
fn take<T: Copy>(v: &[T], at: impl Iterator<Item = usize>) -> Vec<T> {
    at.map(|i| v[i]).collect()
}

/// A tensor of shape `shape` read from `x` through a strided view.
fn strided_view(x: &Tensor, shape: Vec<usize>, strides: Vec<isize>, offset: isize) -> R<Tensor> {
    result_len(&shape)?;
    let at = Strided::new(&shape, strides, offset);
    let data = with_elem!(x.dtype(), T => T::wrap(take(elems::<T>(x)?, at)));
    Ok(Tensor::new(shape, data))
}

/// A copy of `x` with the elements of `update` written, in order, at the offsets `at`.
fn write_view(x: &Tensor, update: &Tensor, at: Strided) -> R<Tensor> {
    let data = with_elem!(x.dtype(), T => {
        let (mut v, u) = (elems::<T>(x)?.to_vec(), elems::<T>(update)?);
        for (i, &e) in at.zip(u) {
            v[i] = e;
        }
        T::wrap(v)
    });
    Ok(Tensor::new(x.shape.clone(), data))
}

// ---------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------

/// The one "map over broadcast operands" loop of every binary elementwise op.
fn map2<A: Elem, B: Elem, C>(a: &Tensor, b: &Tensor, shape: &[usize], f: impl Fn(A, B) -> C) -> R<Vec<C>> {
    let (av, bv) = (elems::<A>(a)?, elems::<B>(b)?);
    let ia = Strided::broadcast(&a.shape, shape)?;
    let ib = Strided::broadcast(&b.shape, shape)?;
    Ok(ia.zip(ib).map(|(i, j)| f(av[i], bv[j])).collect())
}

fn undefined(op: Op, dtype: DType) -> String {
    format!("{op} is not defined for {dtype}")
}

fn float_binop(op: Op) -> Option<fn(f64, f64) -> f64> {
    let f: fn(f64, f64) -> f64 = match op {
        Op::Add => |a, b| a + b,
        Op::Sub => |a, b| a - b,
        Op::Mul => |a, b| a * b,
        Op::Div => |a, b| a / b,
        Op::Pow => f64::powf,
        Op::Maximum => max_nan,
        Op::Minimum => min_nan,
        _ => return None,
    };
    Some(f)
}

fn int_binop<T: Int>(op: Op) -> Option<fn(T, T) -> T> {
    let f: fn(T, T) -> T = match op {
        Op::Add => T::wadd,
        Op::Sub => T::wsub,
        Op::Mul => T::wmul,
        Op::Maximum => Ord::max,
        Op::Minimum => Ord::min,
        // Truncating, as C and ONNX divide; MIN / −1 wraps to MIN (numpy's answer). A zero
        // divisor is refused by `binary` before this runs.
        Op::Div => T::wdiv,
        _ => return None,
    };
    Some(f)
}

fn binary(op: Op, a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(format!("{op} operands have different dtypes {} and {}", a.dtype(), b.dtype()));
    }
    fn int<T: Int>(op: Op, a: &Tensor, b: &Tensor, shape: &[usize]) -> R<Data> {
        let f = int_binop::<T>(op).ok_or_else(|| undefined(op, T::DTYPE))?;
        // Every divisor is used unless the result is empty; ONNX (onnxruntime) refuses a
        // zero one, where a machine division would trap.
        if op == Op::Div && shape.iter().all(|&d| d > 0) && elems::<T>(b)?.contains(&T::ZERO) {
            return Err("integer division by zero".into());
        }
        Ok(T::wrap(map2(a, b, shape, f)?))
    }
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let data = match a.dtype() {
        DType::F32 => {
            let f = float_binop(op).ok_or_else(|| undefined(op, DType::F32))?;
            Data::F32(map2(a, b, &shape, |x: f32, y: f32| f(x as f64, y as f64) as f32)?)
        }
        DType::I32 => int::<i32>(op, a, b, &shape)?,
        DType::I64 => int::<i64>(op, a, b, &shape)?,
        other => return Err(undefined(op, other)),
    };
    Ok(Tensor::new(shape, data))
}

/// and, or, xor: logic on bools, bitwise on integers (their dtype's result).
fn logic(op: Op, a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(format!("{op} operands have different dtypes {} and {}", a.dtype(), b.dtype()));
    }
    fn bits<T: Elem + std::ops::BitAnd<Output = T> + std::ops::BitOr<Output = T> + std::ops::BitXor<Output = T>>(
        op: Op,
        a: &Tensor,
        b: &Tensor,
        shape: &[usize],
    ) -> R<Vec<T>> {
        let f: fn(T, T) -> T = match op {
            Op::And => |x, y| x & y,
            Op::Or => |x, y| x | y,
            _ => |x, y| x ^ y,
        };
        map2(a, b, shape, f)
    }
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let data = match a.dtype() {
        DType::Bool => Data::Bool(bits::<bool>(op, a, b, &shape)?),
        DType::I32 => Data::I32(bits::<i32>(op, a, b, &shape)?),
        DType::I64 => Data::I64(bits::<i64>(op, a, b, &shape)?),
        other => return Err(undefined(op, other)),
    };
    Ok(Tensor::new(shape, data))
}

/// Comparisons (any dtype, NaN compares unequal and unordered, as in IEEE and numpy): a
/// bool result.
fn compare(op: Op, a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(format!("{op} operands have different dtypes {} and {}", a.dtype(), b.dtype()));
    }
    fn test<T: PartialOrd>(op: Op, x: T, y: T) -> bool {
        match op {
            Op::Equal => x == y,
            Op::Less => x < y,
            Op::LessEqual => x <= y,
            Op::Greater => x > y,
            Op::GreaterEqual => x >= y,
            _ => unreachable!("not a comparison"),
        }
    }
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let data = with_elem!(a.dtype(), T => map2(a, b, &shape, |x: T, y: T| test(op, x, y))?);
    Ok(Tensor::new(shape, Data::Bool(data)))
}

/// Integer `mod`: the remainder of truncating division takes the sign of the dividend
/// (`fmod`, C's `%`); without `fmod` a nonzero remainder whose sign differs from the
/// divisor's is moved by the divisor (Python's `%`, numpy's `mod`). x mod 0 is 0, as numpy
/// gives it; MIN mod −1 is 0.
fn modulo(a: &Tensor, b: &Tensor, fmod: bool) -> R<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(format!("mod operands have different dtypes {} and {}", a.dtype(), b.dtype()));
    }
    fn int<T: Int>(a: &Tensor, b: &Tensor, shape: &[usize], fmod: bool) -> R<Data> {
        Ok(T::wrap(map2(a, b, shape, |x: T, y: T| {
            if y == T::ZERO {
                return T::ZERO;
            }
            let r = x.wrem(y);
            if !fmod && r != T::ZERO && (r < T::ZERO) != (y < T::ZERO) {
                r.wadd(y)
            } else {
                r
            }
        })?))
    }
    let shape = broadcast_shapes(&[&a.shape, &b.shape])?;
    let data = match a.dtype() {
        DType::I32 => int::<i32>(a, b, &shape, fmod)?,
        DType::I64 => int::<i64>(a, b, &shape, fmod)?,
        other => return Err(undefined(Op::Mod, other)),
    };
    Ok(Tensor::new(shape, data))
}

fn gelu_erf(x: f64) -> f64 {
    x * 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    x * 0.5 * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

fn float_unop(op: Op, tanh_gelu: bool) -> Option<fn(f64) -> f64> {
    let f: fn(f64) -> f64 = match op {
        Op::Neg => |x| -x,
        Op::Abs => f64::abs,
        Op::Exp => f64::exp,
        Op::Log => f64::ln,
        Op::Sqrt => f64::sqrt,
        Op::Rsqrt => |x| 1.0 / x.sqrt(),
        Op::Tanh => f64::tanh,
        Op::Erf => libm::erf,
        // Not 1 − erf(x), which is 0 in f64 beyond x ≈ 6 and loses all digits well before.
        Op::Erfc => libm::erfc,
        Op::Sin => f64::sin,
        Op::Cos => f64::cos,
        Op::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        Op::Relu => |x| max_nan(x, 0.0),
        Op::Floor => f64::floor,
        Op::Ceil => f64::ceil,
        Op::Round => f64::round_ties_even,
        Op::Gelu if tanh_gelu => gelu_tanh,
        Op::Gelu => gelu_erf,
        _ => return None,
    };
    Some(f)
}

fn int_unop<T: Int>(op: Op) -> Option<fn(T) -> T> {
    let f: fn(T) -> T = match op {
        Op::Neg => T::wneg,
        Op::Abs => T::wabs,
        Op::Relu => |x| x.max(T::ZERO),
        _ => return None,
    };
    Some(f)
}

fn unary(op: Op, tanh_gelu: bool, x: &Tensor) -> R<Tensor> {
    fn int<T: Int>(op: Op, x: &Tensor) -> R<Data> {
        let f = int_unop::<T>(op).ok_or_else(|| undefined(op, T::DTYPE))?;
        Ok(T::wrap(elems::<T>(x)?.iter().map(|&v| f(v)).collect()))
    }
    let data = match x.dtype() {
        DType::F32 => {
            let f = float_unop(op, tanh_gelu).ok_or_else(|| undefined(op, DType::F32))?;
            Data::F32(elems::<f32>(x)?.iter().map(|&v| f(v as f64) as f32).collect())
        }
        DType::I32 => int::<i32>(op, x)?,
        DType::I64 => int::<i64>(op, x)?,
        other => return Err(undefined(op, other)),
    };
    Ok(Tensor::new(x.shape.clone(), data))
}

fn conv<A: Copy, B>(v: &[A], f: impl Fn(A) -> B) -> Vec<B> {
    v.iter().map(|&a| f(a)).collect()
}

/// `cast`: each pair converted directly (no detour through f64, which would round twice
/// for large i64 → f32). float → int truncates toward zero (saturating, NaN → 0: Rust `as`;
/// numpy leaves those cases undefined); int → narrower int wraps; nonzero (incl. NaN) →
/// true; bool → 0/1. Into a storage int goes through its wide type (`DType::wide`): a float
/// is truncated to i32 (i64 for u32) and then wrapped like any int (ONNX leaves a float out
/// of the target's range undefined; this is what numpy and onnxruntime give on x86 for
/// floats within i32's range, −1.0 → u8 255, 300.0 → 44), but a float into u64 is truncated
/// and saturated as u64 (2^63 and beyond are in its range). QuantizeLinear, which
/// saturates, is not a cast.
pub(crate) fn cast(x: &Data, to: DType) -> Data {
    use half::{bf16, f16};
    if x.dtype() == to && (to.is_half() || to.is_stored_int()) {
        return x.clone();
    }
    match (x, to) {
        // Widening to f32 (halves), to i32 or i64 (storage ints) is exact; every other cast
        // of them goes on from there. A u64 is unsigned only into a float; into an int or
        // bool its two's-complement i64 wraps and tests alike.
        (Data::F16(v), _) => return cast(&Data::F32(conv(v, f16::to_f32)), to),
        (Data::BF16(v), _) => return cast(&Data::F32(conv(v, bf16::to_f32)), to),
        (Data::I8(v), _) => return cast(&Data::I32(conv(v, i32::from)), to),
        (Data::U8(v), _) => return cast(&Data::I32(conv(v, i32::from)), to),
        (Data::I16(v), _) => return cast(&Data::I32(conv(v, i32::from)), to),
        (Data::U16(v), _) => return cast(&Data::I32(conv(v, i32::from)), to),
        (Data::U32(v), _) => return cast(&Data::I64(conv(v, i64::from)), to),
        (Data::U64(v), DType::F32 | DType::F16 | DType::BF16) => return cast(&Data::F32(conv(v, |a| a as f32)), to),
        (Data::U64(v), _) => return cast(&Data::I64(conv(v, |a| a as i64)), to),
        (Data::F32(v), DType::U64) => return Data::U64(conv(v, |a| a as u64)),
        _ => {}
    }
    if to.is_stored_int() {
        return match cast(x, to.wide()) {
            Data::I32(v) => match to {
                DType::I8 => Data::I8(conv(&v, |a| a as i8)),
                DType::U8 => Data::U8(conv(&v, |a| a as u8)),
                DType::I16 => Data::I16(conv(&v, |a| a as i16)),
                _ => Data::U16(conv(&v, |a| a as u16)),
            },
            Data::I64(v) if to == DType::U32 => Data::U32(conv(&v, |a| a as u32)),
            Data::I64(v) => Data::U64(conv(&v, |a| a as u64)),
            _ => unreachable!("a storage int's wide type is i32 or i64"),
        };
    }
    // Into a half: from f32, one rounding to nearest even. An integer goes through f32 first,
    // as onnxruntime casts it (and compiled code does): exact for f16 (every integer whose
    // f16 is finite is exact in f32), rounded twice for a bf16 of an integer beyond 2^24.
    fn half<T>(x: &Data, from_f32: fn(f32) -> T) -> Vec<T> {
        match x {
            Data::F32(v) => conv(v, from_f32),
            Data::I32(v) => conv(v, |a| from_f32(a as f32)),
            Data::I64(v) => conv(v, |a| from_f32(a as f32)),
            Data::Bool(v) => conv(v, |a| from_f32(a as u8 as f32)),
            _ => unreachable!("widened above"),
        }
    }
    match to {
        DType::F16 => Data::F16(half(x, f16::from_f32)),
        DType::BF16 => Data::BF16(half(x, bf16::from_f32)),
        DType::F32 => Data::F32(match x {
            Data::F32(v) => v.clone(),
            Data::I32(v) => conv(v, |a| a as f32),
            Data::I64(v) => conv(v, |a| a as f32),
            Data::Bool(v) => conv(v, |a| a as u8 as f32),
            _ => unreachable!("widened above"),
        }),
        DType::I32 => Data::I32(match x {
            Data::F32(v) => conv(v, |a| a as i32),
            Data::I32(v) => v.clone(),
            Data::I64(v) => conv(v, |a| a as i32),
            Data::Bool(v) => conv(v, |a| a as i32),
            _ => unreachable!("widened above"),
        }),
        DType::I64 => Data::I64(match x {
            Data::F32(v) => conv(v, |a| a as i64),
            Data::I32(v) => conv(v, |a| a as i64),
            Data::I64(v) => v.clone(),
            Data::Bool(v) => conv(v, |a| a as i64),
            _ => unreachable!("widened above"),
        }),
        DType::Bool => Data::Bool(match x {
            Data::F32(v) => conv(v, |a| a != 0.0),
            Data::I32(v) => conv(v, |a| a != 0),
            Data::I64(v) => conv(v, |a| a != 0),
            Data::Bool(v) => v.clone(),
            _ => unreachable!("widened above"),
        }),
        _ => unreachable!("returned above"),
    }
}

fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.dtype() != b.dtype() {
        return Err(format!("where branches have different dtypes {} and {}", a.dtype(), b.dtype()));
    }
    let shape = broadcast_shapes(&[&cond.shape, &a.shape, &b.shape])?;
    let c = elems::<bool>(cond)?;
    let ic = Strided::broadcast(&cond.shape, &shape)?;
    let (ia, ib) = (Strided::broadcast(&a.shape, &shape)?, Strided::broadcast(&b.shape, &shape)?);
    let data = with_elem!(a.dtype(), T => {
        let (av, bv) = (elems::<T>(a)?, elems::<T>(b)?);
        T::wrap(ic.zip(ia).zip(ib).map(|((k, i), j)| if c[k] { av[i] } else { bv[j] }).collect())
    });
    Ok(Tensor::new(shape, data))
}

// ---------------------------------------------------------------------------------------
// Contractions
// ---------------------------------------------------------------------------------------

/// numpy `matmul`: a 1-D `a` is a row, a 1-D `b` a column, and the added dim is removed;
/// batch dims broadcast.
/// The product's shape and the (a matrix, b matrix) index pairs it is made of, with m, k, n.
type Product = (Vec<usize>, Vec<(usize, usize)>, usize, usize, usize);

fn matmul_shape(a: &Tensor, b: &Tensor) -> R<Product> {
    let (a_batch, m, k) = match a.shape.as_slice() {
        [] => return Err("matmul operand a is a scalar".into()),
        [k] => (&[][..], 1, *k),
        [batch @ .., m, k] => (batch, *m, *k),
    };
    let (b_batch, k2, n) = match b.shape.as_slice() {
        [] => return Err("matmul operand b is a scalar".into()),
        [k] => (&[][..], *k, 1),
        [batch @ .., k, n] => (batch, *k, *n),
    };
    if k != k2 {
        return Err(format!("matmul contraction dims differ: {} @ {}", ShapeDisplay(&a.shape), ShapeDisplay(&b.shape)));
    }
    let mut shape = broadcast_shapes(&[a_batch, b_batch])?;
    let a_mats = Strided::broadcast(a_batch, &shape)?;
    let b_mats = Strided::broadcast(b_batch, &shape)?;
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    result_len(&shape)?;
    Ok((shape, a_mats.zip(b_mats).collect(), m, k, n))
}

fn matmul(a: &Tensor, b: &Tensor) -> R<Tensor> {
    if a.dtype() == DType::I32 {
        return matmul_i32(a, b);
    }
    let (av, bv) = (elems::<f32>(a)?, elems::<f32>(b)?);
    let (shape, mats, m, k, n) = matmul_shape(a, b)?;
    let mut out = Vec::with_capacity(result_len(&shape)?);
    let mut row = vec![0f64; n];
    for (ai, bi) in mats {
        let (am, bm) = (&av[ai * m * k..][..m * k], &bv[bi * k * n..][..k * n]);
        for i in 0..m {
            row.fill(0.0);
            for (p, &x) in am[i * k..][..k].iter().enumerate() {
                for (r, &y) in row.iter_mut().zip(&bm[p * n..][..n]) {
                    *r += x as f64 * y as f64;
                }
            }
            out.extend(narrow(row.iter().copied()));
        }
    }
    Ok(Tensor::f32(shape, out))
}

/// The integer product: exact, accumulated in i32 with wrapping (ONNX's MatMulInteger
/// overflows only in its i32 accumulation; a u8·i8 product of K terms fits while
/// K·255·255 < 2^31).
fn matmul_i32(a: &Tensor, b: &Tensor) -> R<Tensor> {
    let (av, bv) = (elems::<i32>(a)?, elems::<i32>(b)?);
    let (shape, mats, m, k, n) = matmul_shape(a, b)?;
    let mut out = Vec::with_capacity(result_len(&shape)?);
    let mut row = vec![0i32; n];
    for (ai, bi) in mats {
        let (am, bm) = (&av[ai * m * k..][..m * k], &bv[bi * k * n..][..k * n]);
        for i in 0..m {
            row.fill(0);
            for (p, &x) in am[i * k..][..k].iter().enumerate() {
                for (r, &y) in row.iter_mut().zip(&bm[p * n..][..n]) {
                    *r = r.wrapping_add(x.wrapping_mul(y));
                }
            }
            out.extend_from_slice(&row);
        }
    }
    Ok(Tensor::new(shape, Data::I32(out)))
}

/// The letters of one einsum term: ASCII letters, none repeated (surrounding spaces are
/// ignored, as in `infer`).
fn einsum_term(eq: &str, term: &str) -> R<Vec<char>> {
    let term = term.trim();
    let mut letters = Vec::new();
    for c in term.chars() {
        if !c.is_ascii_alphabetic() {
            return Err(format!("einsum equation '{eq}': unexpected character '{c}' (letters only)"));
        }
        if letters.contains(&c) {
            return Err(format!("einsum equation '{eq}': letter '{c}' repeated in term '{term}'"));
        }
        letters.push(c);
    }
    Ok(letters)
}

/// `einsum`: with three operands or more, pairwise contractions in the order of
/// `einsum::path`; else one loop nest (`einsum_nest`).
fn einsum(eq: &str, args: &[&Tensor]) -> R<Tensor> {
    if args.len() < 3 {
        return einsum_nest(eq, args);
    }
    let (terms, out) = crate::infer::parse_equation(eq, args.len())?;
    let sizes = einsum_sizes(&terms, args)?;
    let steps = crate::einsum::path(&terms, &out, &sizes);
    crate::einsum::check_intermediates(&steps, &sizes)?;
    let letters = crate::einsum::operand_letters(&terms, &steps);
    let mut values: Vec<Option<std::borrow::Cow<Tensor>>> =
        args.iter().map(|&a| Some(std::borrow::Cow::Borrowed(a))).collect();
    for s in &steps {
        let (a, b) = (values[s.a].take().expect("used once"), values[s.b].take().expect("used once"));
        values.push(Some(std::borrow::Cow::Owned(einsum_nest(&crate::einsum::equation(s, &letters), &[&a, &b])?)));
    }
    Ok(values.pop().flatten().expect("a last step").into_owned())
}

/// The size of every letter of the einsum `terms` of operands `args`, refusing a term
/// whose length is not its operand's rank and a letter of two sizes.
fn einsum_sizes(terms: &[Vec<char>], args: &[&Tensor]) -> R<BTreeMap<char, usize>> {
    let mut sizes: BTreeMap<char, usize> = BTreeMap::new();
    for (k, (term, x)) in terms.iter().zip(args).enumerate() {
        if term.len() != x.shape.len() {
            return Err(format!(
                "einsum term '{}' has {} letters but operand {k} has shape {}",
                term.iter().collect::<String>(),
                term.len(),
                ShapeDisplay(&x.shape)
            ));
        }
        for (&c, &n) in term.iter().zip(&x.shape) {
            if let Some(m) = sizes.insert(c, n).filter(|&m| m != n) {
                return Err(format!("einsum letter '{c}' has sizes {m} and {n}"));
            }
        }
    }
    Ok(sizes)
}

/// One einsum as a loop nest: every output element is the sum, over the letters absent
/// from the output, of the product of the operands' elements.
fn einsum_nest(eq: &str, args: &[&Tensor]) -> R<Tensor> {
    let (lhs, rhs) =
        eq.split_once("->").ok_or_else(|| format!("einsum equation '{eq}' needs an explicit output ('->')"))?;
    let terms = lhs.split(',').map(|t| einsum_term(eq, t)).collect::<R<Vec<_>>>()?;
    let out_letters = einsum_term(eq, rhs)?;
    if terms.len() != args.len() {
        return Err(format!("einsum equation '{eq}' has {} operand terms but {} operands", terms.len(), args.len()));
    }
    let sizes = einsum_sizes(&terms, args)?;
    // The letters absent from the output, in the order they first appear.
    let mut summed: Vec<char> = Vec::new();
    for &c in terms.iter().flatten() {
        if !out_letters.contains(&c) && !summed.contains(&c) {
            summed.push(c);
        }
    }
    let size_of =
        |c: &char| sizes.get(c).copied().ok_or_else(|| format!("einsum output letter '{c}' is in no operand"));
    let out_shape = out_letters.iter().map(size_of).collect::<R<Vec<_>>>()?;
    let sum_shape = summed.iter().map(size_of).collect::<R<Vec<_>>>()?;
    let (n_out, n_sum) = (result_len(&out_shape)?, result_len(&sum_shape)?);
    // The offset tables below: per operand, one entry per output element and per point of
    // the summation.
    let entries = (n_out as u128 + n_sum as u128) * args.len() as u128;
    budget::check(format_args!("the offset tables of einsum '{eq}'"), entries, 8)?;
    // Per operand: its elements, the offsets of every output position, and the offsets
    // (relative to those) of every point of the summation.
    let mut operands = Vec::new();
    for (term, x) in terms.iter().zip(args) {
        let own = contiguous_strides(&x.shape);
        let stride = |c: &char| term.iter().position(|t| t == c).map_or(0, |d| own[d]);
        let outer: Vec<usize> = Strided::new(&out_shape, out_letters.iter().map(stride).collect(), 0).collect();
        let inner: Vec<usize> = Strided::new(&sum_shape, summed.iter().map(stride).collect(), 0).collect();
        operands.push((elems::<f32>(x)?, outer, inner));
    }
    let out = (0..n_out).map(|o| {
        (0..n_sum)
            .map(|s| operands.iter().map(|(v, outer, inner)| v[outer[o] + inner[s]] as f64).product::<f64>())
            .sum::<f64>()
    });
    Ok(Tensor::f32(out_shape, narrow(out)))
}

// ---------------------------------------------------------------------------------------
// Reductions and normalisations
// ---------------------------------------------------------------------------------------

/// The one reduction skeleton: folds `v` (of `shape`) over the sorted, distinct `axes`,
/// giving one accumulator per position of the remaining dims, in row-major order (the
/// layout of the result with or without keepdims).
fn reduce<T: Copy, A: Copy>(v: &[T], shape: &[usize], axes: &[usize], init: A, f: impl Fn(A, T) -> A) -> Vec<A> {
    let strides = contiguous_strides(shape);
    let pick = |reduced: bool| -> (Vec<usize>, Vec<isize>) {
        (0..shape.len()).filter(|d| axes.contains(d) == reduced).map(|d| (shape[d], strides[d])).unzip()
    };
    let (kept_shape, kept_strides) = pick(false);
    let (red_shape, red_strides) = pick(true);
    let inner: Vec<usize> = Strided::new(&red_shape, red_strides, 0).collect();
    Strided::new(&kept_shape, kept_strides, 0)
        .map(|base| inner.iter().fold(init, |acc, &o| f(acc, v[base + o])))
        .collect()
}

/// `shape` with the reduced `axes` kept as size-1 dims.
fn keepdims_shape(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect()
}

fn reduce_op(op: Op, x: &Tensor, axes: &[usize], keepdims: bool) -> R<Tensor> {
    let shape = if keepdims {
        keepdims_shape(&x.shape, axes)
    } else {
        x.shape.iter().enumerate().filter(|(d, _)| !axes.contains(d)).map(|(_, &n)| n).collect()
    };
    let count: usize = axes.iter().map(|&d| x.shape[d]).product();
    if op == Op::ReduceMax && count == 0 {
        return Err(format!("reduce_max over an empty axis (shape {})", ShapeDisplay(&x.shape)));
    }
    fn int<T: Int>(op: Op, x: &Tensor, axes: &[usize]) -> R<Data> {
        let v = elems::<T>(x)?;
        Ok(T::wrap(match op {
            Op::ReduceSum => reduce(v, &x.shape, axes, T::ZERO, T::wadd),
            Op::ReduceMax => reduce(v, &x.shape, axes, T::MIN, Ord::max),
            _ => return Err(undefined(op, T::DTYPE)),
        }))
    }
    let data = match x.dtype() {
        DType::F32 => {
            let v = elems::<f32>(x)?;
            let sum = || reduce(v, &x.shape, axes, 0.0, |a, x| a + x as f64);
            Data::F32(narrow(match op {
                Op::ReduceSum => sum(),
                Op::ReduceMean => sum().into_iter().map(|s| s / count as f64).collect(),
                _ => reduce(v, &x.shape, axes, f64::NEG_INFINITY, |a, x| max_nan(a, x as f64)),
            }))
        }
        DType::I32 => int::<i32>(op, x, axes)?,
        DType::I64 => int::<i64>(op, x, axes)?,
        other => return Err(undefined(op, other)),
    };
    Ok(Tensor::new(shape, data))
}

/// `exp(x - max) / sum(exp(x - max))` along `axis`, in f64.
fn softmax(x: &Tensor, axis: i64) -> R<Tensor> {
    let xs = widen(elems::<f32>(x)?);
    let axes = [norm_axis(axis, x.shape.len())?];
    let stat_shape = keepdims_shape(&x.shape, &axes);
    let max = reduce(&xs, &x.shape, &axes, f64::NEG_INFINITY, max_nan);
    let e: Vec<f64> = Strided::broadcast(&stat_shape, &x.shape)?.zip(&xs).map(|(j, &v)| (v - max[j]).exp()).collect();
    let sum = reduce(&e, &x.shape, &axes, 0.0, |a, v| a + v);
    let out = Strided::broadcast(&stat_shape, &x.shape)?.zip(&e).map(|(j, &v)| v / sum[j]);
    Ok(Tensor::f32(x.shape.clone(), narrow(out)))
}

/// ONNX LayerNormalization over dims `axis..`: `(x - mean) / sqrt(var + eps) * gamma +
/// beta`, biased variance, two passes in f64.
fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, axis: i64, eps: f64) -> R<Tensor> {
    let xs = widen(elems::<f32>(x)?);
    let (g, b) = (elems::<f32>(gamma)?, elems::<f32>(beta)?);
    let rank = x.shape.len();
    let first = norm_axis(axis, rank)?;
    let norm_shape = &x.shape[first..];
    for (name, t) in [("gamma", gamma), ("beta", beta)] {
        if t.shape != norm_shape {
            return Err(format!(
                "layer_norm {name} has shape {} but must be {}",
                ShapeDisplay(&t.shape),
                ShapeDisplay(norm_shape)
            ));
        }
    }
    let axes: Vec<usize> = (first..rank).collect();
    let n = numel(norm_shape) as f64;
    let stat_shape = keepdims_shape(&x.shape, &axes);
    let stat = || Strided::broadcast(&stat_shape, &x.shape);
    let mean: Vec<f64> = reduce(&xs, &x.shape, &axes, 0.0, |a, v| a + v).into_iter().map(|s| s / n).collect();
    let centered: Vec<f64> = stat()?.zip(&xs).map(|(j, &v)| v - mean[j]).collect();
    // Each square is rounded to f32, as compiled code and ONNX's float32 computation take
    // it: a deviation past √f32::MAX (about 1.8e19) makes the variance infinite and the row
    // normalise to 0, as they give, rather than to the values only f64 could represent.
    let square = |d: f64| f64::from((d as f32) * (d as f32));
    let var: Vec<f64> =
        reduce(&centered, &x.shape, &axes, 0.0, |a, d| a + square(d)).into_iter().map(|s| s / n).collect();
    let affine = Strided::broadcast(norm_shape, &x.shape)?;
    let out =
        stat()?.zip(affine).zip(&centered).map(|((j, i), &d)| d / (var[j] + eps).sqrt() * g[i] as f64 + b[i] as f64);
    Ok(Tensor::f32(x.shape.clone(), narrow(out)))
}

// ---------------------------------------------------------------------------------------
// Data movement
// ---------------------------------------------------------------------------------------

/// Non-negative dims from an attribute.
fn dims_attr(name: &str, v: &[i64]) -> R<Vec<usize>> {
    v.iter().map(|&d| usize::try_from(d).map_err(|_| format!("attribute '{name}' has negative dim {d}"))).collect()
}

fn reshape(x: &Tensor, spec: &[i64]) -> R<Tensor> {
    let fail = || format!("cannot reshape {} elements (shape {}) into {spec:?}", x.numel(), ShapeDisplay(&x.shape));
    let mut unknown = None;
    let mut shape = Vec::with_capacity(spec.len());
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if unknown.replace(i).is_some() {
                return Err(format!("reshape shape {spec:?} has more than one -1"));
            }
            shape.push(1);
        } else {
            shape.push(usize::try_from(d).map_err(|_| format!("reshape shape {spec:?} has negative dim {d}"))?);
        }
    }
    let known = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(fail)?;
    if let Some(i) = unknown {
        if known == 0 || !x.numel().is_multiple_of(known) {
            return Err(fail());
        }
        shape[i] = x.numel() / known;
    } else if known != x.numel() {
        return Err(fail());
    }
    Ok(Tensor::new(shape, x.data.clone()))
}

fn transpose(x: &Tensor, perm: Option<Vec<i64>>) -> R<Tensor> {
    let rank = x.shape.len();
    let perm = match perm {
        None => (0..rank).rev().collect(),
        Some(p) => p.iter().map(|&a| norm_axis(a, rank)).collect::<R<Vec<_>>>()?,
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return Err(format!("transpose perm {perm:?} is not a permutation of the {rank} axes"));
    }
    let own = contiguous_strides(&x.shape);
    strided_view(x, perm.iter().map(|&d| x.shape[d]).collect(), perm.iter().map(|&d| own[d]).collect(), 0)
}

fn broadcast_to(x: &Tensor, shape: &[i64]) -> R<Tensor> {
    let shape = dims_attr("shape", shape)?;
    let strides = broadcast_strides(&x.shape, &shape)?;
    strided_view(x, shape, strides, 0)
}

fn concat(args: &[&Tensor], axis: i64) -> R<Tensor> {
    let first = args[0];
    let ax = norm_axis(axis, first.shape.len())?;
    for (k, a) in args.iter().enumerate() {
        let same = a.shape.len() == first.shape.len()
            && a.shape.iter().zip(&first.shape).enumerate().all(|(d, (x, y))| d == ax || x == y);
        if !same || a.dtype() != first.dtype() {
            return Err(format!("concat operand {k} ({}) does not match operand 0 ({})", a.ty(), first.ty()));
        }
    }
    let mut shape = first.shape.clone();
    shape[ax] = args.iter().map(|a| a.shape[ax]).sum();
    let outer = numel(&first.shape[..ax]);
    let data = with_elem!(first.dtype(), T => {
        let parts = args.iter().map(|a| elems::<T>(a)).collect::<R<Vec<_>>>()?;
        let mut out = Vec::with_capacity(result_len(&shape)?);
        for o in 0..outer {
            for (part, a) in parts.iter().zip(args) {
                let chunk = numel(&a.shape[ax..]);
                out.extend_from_slice(&part[o * chunk..][..chunk]);
            }
        }
        T::wrap(out)
    });
    Ok(Tensor::new(shape, data))
}

fn slice(x: &Tensor, attrs: &attrs::Slice) -> R<Tensor> {
    let (shape, strides, offset) = slice_layout(&x.shape, attrs)?;
    strided_view(x, shape, strides, offset)
}

/// The window of `x` a dynamic_slice reads or a dynamic_update_slice writes: `sizes[i]`
/// elements along `axes[i]` from the run-time start `starts[i]`, clamped to fit. Returned
/// as the view's shape, strides and first element.
fn dynamic_window(x: &Tensor, starts: &Tensor, axes: &[i64], sizes: &[usize]) -> R<(Vec<usize>, Vec<isize>, isize)> {
    let axes = norm_axes(axes, x.shape.len())?;
    let starts: Vec<i64> = match &starts.data {
        Data::I32(v) => v.iter().map(|&i| i as i64).collect(),
        Data::I64(v) => v.clone(),
        other => return Err(format!("the starts must be i32 or i64, got {}", other.dtype())),
    };
    if starts.len() != axes.len() || sizes.len() != axes.len() {
        return Err(format!("{} starts and {} sizes for the axes {axes:?}", starts.len(), sizes.len()));
    }
    let (mut shape, strides) = (x.shape.clone(), contiguous_strides(&x.shape));
    let mut offset = 0isize;
    for ((&a, &start), &size) in axes.iter().zip(&starts).zip(sizes) {
        if size > x.shape[a] {
            return Err(format!("a window of {size} along axis {a} of {}", x.ty()));
        }
        offset += dynamic_start(start, size, x.shape[a]) as isize * strides[a];
        shape[a] = size;
    }
    Ok((shape, strides, offset))
}

/// The element offsets into a contiguous tensor of shape `shape` that the slice `node`
/// reads, in the order of its result: a slice of a weight in a mapped file is copied
/// straight from the mapping by them, without the whole weight becoming a tensor first.
pub fn slice_offsets(node: &Node, shape: &[usize]) -> Result<impl Iterator<Item = usize>> {
    let fail = |msg: String| Error::at(node.loc, format!("node '{}': {msg}", node.name));
    let attrs = attrs::Slice::try_of(node).map_err(fail)?;
    let (shape, strides, offset) = slice_layout(shape, &attrs).map_err(fail)?;
    Ok(Strided::new(&shape, strides, offset))
}

/// The shape, strides and first element of the view a slice takes of a contiguous tensor
/// of shape `shape`.
fn slice_layout(shape: &[usize], attrs: &attrs::Slice) -> R<(Vec<usize>, Vec<isize>, isize)> {
    let rank = shape.len();
    let (starts, ends) = (&attrs.starts, &attrs.ends);
    let axes = attrs.axes.clone().unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = attrs.steps.clone().unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(format!(
            "slice starts, ends, axes and steps have different lengths ({}, {}, {}, {})",
            starts.len(),
            ends.len(),
            axes.len(),
            steps.len()
        ));
    }
    let (in_shape, mut shape) = (shape, shape.to_vec());
    let mut strides = contiguous_strides(in_shape);
    let mut offset = 0isize;
    let mut seen = vec![false; rank];
    for (((&a, &s), &e), &st) in axes.iter().zip(starts).zip(ends).zip(&steps) {
        let d = norm_axis(a, rank)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(format!("slice axes {axes:?} repeat axis {d}"));
        }
        let (first, len) = slice_range(s, e, st, in_shape[d])?;
        offset += first as isize * strides[d];
        // Only walked when len > 1, where step * stride stays inside the tensor.
        strides[d] = strides[d].wrapping_mul(st as isize);
        shape[d] = len;
    }
    Ok((shape, strides, offset))
}

/// numpy `take(data, indices, axis)`; negative indices count from the end.
/// The indices of gather or scatter_elements (`op`) along an axis of size `n`, negative ones
/// wrapped once; one out of range is an error naming it.
fn axis_indices(op: Op, indices: &Tensor, ax: usize, n: usize) -> R<Vec<usize>> {
    let idx: Vec<i64> = match &indices.data {
        Data::I32(v) => v.iter().map(|&i| i as i64).collect(),
        Data::I64(v) => v.clone(),
        other => return Err(format!("{op} indices must be i32 or i64, got {}", other.dtype())),
    };
    idx.iter()
        .map(|&i| {
            let j = if i < 0 { i as i128 + n as i128 } else { i as i128 };
            usize::try_from(j)
                .ok()
                .filter(|&j| j < n)
                .ok_or_else(|| format!("{op} index {i} out of range for axis {ax} of size {n}"))
        })
        .collect()
}

fn gather(data: &Tensor, indices: &Tensor, axis: i64) -> R<Tensor> {
    let ax = norm_axis(axis, data.shape.len())?;
    let n = data.shape[ax];
    let idx = axis_indices(Op::Gather, indices, ax, n)?;
    let shape: Vec<usize> = [&data.shape[..ax], &indices.shape[..], &data.shape[ax + 1..]].concat();
    let outer = numel(&data.shape[..ax]);
    let inner = numel(&data.shape[ax + 1..]);
    let out = with_elem!(data.dtype(), T => {
        let v = elems::<T>(data)?;
        let mut out = Vec::with_capacity(result_len(&shape)?);
        for o in 0..outer {
            for &k in &idx {
                out.extend_from_slice(&v[(o * n + k) * inner..][..inner]);
            }
        }
        T::wrap(out)
    });
    Ok(Tensor::new(shape, out))
}

/// ONNX ScatterElements: a copy of `data` where, for each position `p` of `indices` (in
/// row-major order), the element at `p` with coordinate `axis` replaced by `indices[p]`
/// becomes `updates[p]` (`none`: a later duplicate wins) or that element combined with it.
fn scatter_elements(args: &[&Tensor], axis: i64, reduction: ScatterReduction) -> R<Tensor> {
    let [data, indices, updates] = args else { return Err("scatter_elements takes data, indices and updates".into()) };
    let rank = data.shape.len();
    let ax = norm_axis(axis, rank)?;
    if indices.shape != updates.shape {
        return Err(format!(
            "scatter_elements indices {} and updates {} differ in shape",
            ShapeDisplay(&indices.shape),
            ShapeDisplay(&updates.shape)
        ));
    }
    if indices.shape.len() != rank || (0..rank).any(|d| d != ax && indices.shape[d] > data.shape[d]) {
        return Err(format!(
            "scatter_elements indices {} do not fit data {} off axis {ax}",
            ShapeDisplay(&indices.shape),
            ShapeDisplay(&data.shape)
        ));
    }
    if updates.dtype() != data.dtype() {
        return Err(format!("scatter_elements updates are {}, data {}", updates.dtype(), data.dtype()));
    }
    let idx = axis_indices(Op::ScatterElements, indices, ax, data.shape[ax])?;
    // The flat offset in data of each position of indices, row-major.
    let mut strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * data.shape[d + 1];
    }
    let mut coord = vec![0usize; rank];
    let targets: Vec<usize> = idx
        .iter()
        .map(|&k| {
            let at = (0..rank).map(|d| if d == ax { k } else { coord[d] } * strides[d]).sum();
            for d in (0..rank).rev() {
                coord[d] += 1;
                if coord[d] < indices.shape[d] {
                    break;
                }
                coord[d] = 0;
            }
            at
        })
        .collect();
    fn apply<T: Elem + Copy>(data: &Tensor, updates: &Tensor, targets: &[usize], f: impl Fn(T, T) -> T) -> R<Data> {
        let mut out = elems::<T>(data)?.to_vec();
        for (&t, &u) in targets.iter().zip(elems::<T>(updates)?) {
            out[t] = f(out[t], u);
        }
        Ok(T::wrap(out))
    }
    fn int<T: Int>(op: Op, data: &Tensor, updates: &Tensor, targets: &[usize]) -> R<Data> {
        apply(data, updates, targets, int_binop::<T>(op).ok_or_else(|| undefined(op, T::DTYPE))?)
    }
    let op = match reduction {
        ScatterReduction::None => {
            return Ok(Tensor::new(
                data.shape.clone(),
                with_elem!(data.dtype(), T => apply::<T>(data, updates, &targets, |_, u| u)?),
            ))
        }
        ScatterReduction::Add => Op::Add,
        ScatterReduction::Mul => Op::Mul,
        ScatterReduction::Max => Op::Maximum,
        ScatterReduction::Min => Op::Minimum,
    };
    let out = match data.dtype() {
        DType::F32 => {
            let f = float_binop(op).ok_or_else(|| undefined(op, DType::F32))?;
            apply(data, updates, &targets, |x: f32, y: f32| f(x as f64, y as f64) as f32)?
        }
        DType::I32 => int::<i32>(op, data, updates, &targets)?,
        DType::I64 => int::<i64>(op, data, updates, &targets)?,
        other => return Err(format!("scatter_elements with reduction {reduction} is not defined for {other}")),
    };
    Ok(Tensor::new(data.shape.clone(), out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Attr;
    use crate::graph::Output;

    // ---- helpers -------------------------------------------------------------------

    fn f(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(shape.to_vec(), Data::F32(v.to_vec()))
    }
    /// An f32 tensor from f64 literals (expected values written at full precision).
    fn fd(shape: &[usize], v: &[f64]) -> Tensor {
        f(shape, &narrow(v.iter().copied()))
    }
    fn i32t(shape: &[usize], v: &[i32]) -> Tensor {
        Tensor::new(shape.to_vec(), Data::I32(v.to_vec()))
    }
    fn i64t(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::new(shape.to_vec(), Data::I64(v.to_vec()))
    }
    fn bt(shape: &[usize], v: &[bool]) -> Tensor {
        Tensor::new(shape.to_vec(), Data::Bool(v.to_vec()))
    }
    fn ints(v: &[i64]) -> Attr {
        Attr::ints(v)
    }
    fn s(v: &str) -> Attr {
        Attr::Str(v.into())
    }

    fn node(op: Op, attrs: &[(&str, Attr)]) -> Node {
        let mut n = Node::new("n", op, &[]);
        for (k, v) in attrs {
            n.attrs.insert(k.to_string(), v.clone());
        }
        n
    }

    /// Evaluates without knowing the type in advance (the tests' stand-in for inference).
    fn eval_any(n: &Node, args: &[&Tensor]) -> Tensor {
        eval(n, args).unwrap_or_else(|e| panic!("{}: {e}", n.op))
    }

    fn close(a: f32, b: f32) -> bool {
        (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    fn assert_close(got: &Tensor, want: &Tensor) {
        assert_eq!(got.shape, want.shape, "shape");
        match (&got.data, &want.data) {
            (Data::F32(g), Data::F32(w)) => {
                assert!(g.iter().zip(w).all(|(&g, &w)| close(g, w)), "got {g:?}, want {w:?}")
            }
            _ => assert_eq!(got.data, want.data),
        }
    }

    /// Evaluates `op` with the expected result's type as `out` and compares.
    fn check(op: Op, attrs: &[(&str, Attr)], args: &[&Tensor], want: Tensor) {
        let n = node(op, attrs);
        let got = eval_node(&n, args, &want.ty()).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_close(&got, &want);
    }

    fn error(op: Op, attrs: &[(&str, Attr)], args: &[&Tensor]) -> String {
        let n = node(op, attrs);
        let out = TensorType::new(DType::F32, vec![]);
        eval_node(&n, args, &out).expect_err("expected an error").msg
    }

    fn ramp(shape: &[usize]) -> Tensor {
        f(shape, &(0..numel(shape)).map(|i| i as f32).collect::<Vec<_>>())
    }

    /// Deterministic, irregular values in [-2, 2).
    fn noise(shape: &[usize], seed: u64) -> Tensor {
        let v =
            (0..numel(shape) as u64).map(|k| (crate::init::uniform01(seed, k) * 4.0 - 2.0) as f32).collect::<Vec<_>>();
        f(shape, &v)
    }

    // ---- helpers of the interpreter itself -------------------------------------------

    #[test]
    fn strided_iterator_walks_views() {
        assert_eq!(Strided::new(&[2, 3], vec![3, 1], 0).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(Strided::new(&[3, 2], vec![1, 3], 0).collect::<Vec<_>>(), [0, 3, 1, 4, 2, 5]);
        assert_eq!(Strided::new(&[], vec![], 4).collect::<Vec<_>>(), [4]);
        assert_eq!(Strided::new(&[2, 0], vec![1, 1], 0).count(), 0);
        assert_eq!(Strided::broadcast(&[3], &[2, 3]).unwrap().collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
        assert_eq!(Strided::broadcast(&[2, 1], &[2, 3]).unwrap().collect::<Vec<_>>(), [0, 0, 0, 1, 1, 1]);
        assert_eq!(Strided::broadcast(&[], &[2]).unwrap().collect::<Vec<_>>(), [0, 0]);
        assert!(Strided::broadcast(&[2], &[3]).is_err());
        assert!(Strided::broadcast(&[1, 2], &[2]).is_err());
    }

    #[test]
    fn broadcast_shapes_follow_numpy() {
        assert_eq!(broadcast_shapes(&[&[2, 1], &[1, 3]]).unwrap(), [2, 3]);
        assert_eq!(broadcast_shapes(&[&[4, 1, 5], &[3, 1], &[]]).unwrap(), [4, 3, 5]);
        assert_eq!(broadcast_shapes(&[&[1], &[0]]).unwrap(), [0]);
        assert!(broadcast_shapes(&[&[2], &[3]]).is_err());
        assert!(broadcast_shapes(&[&[0], &[3]]).is_err());
    }

    #[test]
    fn slice_range_follows_python() {
        // Expected values from Python's `list(range(5))[start:end:step]`.
        let cases: &[(i64, i64, i64, &[usize])] = &[
            (-1, -100, -1, &[4, 3, 2, 1, 0]),
            (10, -10, -2, &[4, 2, 0]),
            (1, 3, 1, &[1, 2]),
            (-2, 100, 1, &[3, 4]),
            (3, 1, 1, &[]),
            (0, 5, 2, &[0, 2, 4]),
            (4, 0, -3, &[4, 1]),
            (i64::MIN, i64::MAX, 1, &[0, 1, 2, 3, 4]),
            (i64::MAX, i64::MIN, i64::MIN, &[4]),
        ];
        for &(s, e, st, want) in cases {
            let (first, len) = slice_range(s, e, st, 5).unwrap();
            let got: Vec<usize> = (0..len).map(|k| (first as i128 + k as i128 * st as i128) as usize).collect();
            assert_eq!(got, want, "[{s}:{e}:{st}]");
        }
        assert!(slice_range(0, 1, 0, 5).is_err());
    }

    // ---- elementwise -----------------------------------------------------------------

    #[test]
    fn add_broadcasts() {
        let a = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        check(Op::Add, &[], &[&a, &f(&[3], &[10., 20., 30.])], f(&[2, 3], &[11., 22., 33., 14., 25., 36.]));
        let col = f(&[2, 1], &[1., 2.]);
        let row = f(&[1, 3], &[10., 20., 30.]);
        check(Op::Add, &[], &[&col, &row], f(&[2, 3], &[11., 21., 31., 12., 22., 32.]));
        check(Op::Add, &[], &[&f(&[], &[0.5]), &col], f(&[2, 1], &[1.5, 2.5]));
    }

    #[test]
    fn float_binary_ops() {
        let a = f(&[4], &[1., -2., 3., 0.]);
        let b = f(&[4], &[2., 4., -1., 0.]);
        check(Op::Sub, &[], &[&a, &b], f(&[4], &[-1., -6., 4., 0.]));
        check(Op::Mul, &[], &[&a, &b], f(&[4], &[2., -8., -3., 0.]));
        check(Op::Div, &[], &[&a, &b], f(&[4], &[0.5, -0.5, -3., f32::NAN]));
        check(Op::Div, &[], &[&f(&[2], &[1., -1.]), &f(&[], &[0.])], f(&[2], &[f32::INFINITY, f32::NEG_INFINITY]));
        check(Op::Maximum, &[], &[&a, &b], f(&[4], &[2., 4., 3., 0.]));
        check(Op::Minimum, &[], &[&a, &b], f(&[4], &[1., -2., -1., 0.]));
        check(Op::Pow, &[], &[&f(&[3], &[2., 9., 2.]), &f(&[3], &[3., 0.5, -1.])], f(&[3], &[8., 3., 0.5]));
    }

    #[test]
    fn maximum_minimum_propagate_nan_like_numpy() {
        let a = f(&[3], &[f32::NAN, 1., f32::NAN]);
        let b = f(&[3], &[1., f32::NAN, f32::NAN]);
        let nan = f(&[3], &[f32::NAN; 3]);
        for op in [Op::Maximum, Op::Minimum] {
            check(op, &[], &[&a, &b], nan.clone());
            check(op, &[], &[&b, &a], nan.clone());
        }
    }

    #[test]
    fn integer_binary_ops_wrap() {
        let a = i32t(&[3], &[i32::MAX, -5, 7]);
        check(Op::Add, &[], &[&a, &i32t(&[], &[1])], i32t(&[3], &[i32::MIN, -4, 8]));
        check(Op::Sub, &[], &[&i32t(&[1], &[i32::MIN]), &i32t(&[1], &[1])], i32t(&[1], &[i32::MAX]));
        check(Op::Mul, &[], &[&i64t(&[2], &[i64::MAX, 3]), &i64t(&[2], &[2, -4])], i64t(&[2], &[-2, -12]));
        let b = i64t(&[2, 1], &[0, 10]);
        let c = i64t(&[3], &[-1, 5, 20]);
        check(Op::Maximum, &[], &[&b, &c], i64t(&[2, 3], &[0, 5, 20, 10, 10, 20]));
        check(Op::Minimum, &[], &[&b, &c], i64t(&[2, 3], &[-1, 0, 0, -1, 5, 10]));
    }

    /// Exact, truncating toward zero (C, ONNX), MIN / −1 wrapping; never through a float
    /// (2^40 + 1 is not an f32); a zero divisor is an error, not a trap.
    #[test]
    fn integer_division_truncates_exactly() {
        let a = i64t(&[5], &[1_099_511_627_777, -7, 7, i64::MIN, 5]);
        let b = i64t(&[5], &[3, 2, -2, -1, 5]);
        check(Op::Div, &[], &[&a, &b], i64t(&[5], &[366_503_875_925, -3, -3, i64::MIN, 1]));
        check(Op::Div, &[], &[&i32t(&[2], &[i32::MIN, -9]), &i32t(&[], &[-1])], i32t(&[2], &[i32::MIN, 9]));
        assert_eq!(
            error(Op::Div, &[], &[&i32t(&[2], &[5, 1]), &i32t(&[2], &[1, 0])]),
            "node 'n': integer division by zero"
        );
        check(Op::Div, &[], &[&i32t(&[0], &[]), &i32t(&[], &[0])], i32t(&[0], &[]));
    }

    #[test]
    fn binary_op_errors() {
        let a = i32t(&[1], &[1]);
        assert_eq!(error(Op::Pow, &[], &[&a, &a]), "node 'n': pow is not defined for i32");
        let b = bt(&[1], &[true]);
        assert_eq!(error(Op::Add, &[], &[&b, &b]), "node 'n': add is not defined for bool");
        assert!(error(Op::Add, &[], &[&a, &f(&[1], &[1.])]).contains("different dtypes"));
        assert!(error(Op::Add, &[], &[&f(&[2], &[1., 2.]), &f(&[3], &[1., 2., 3.])])
            .contains("cannot be broadcast together"));
    }

    #[test]
    fn float_unary_ops() {
        let x = f(&[4], &[-1., 0., 1., 2.]);
        let e = std::f64::consts::E;
        check(Op::Neg, &[], &[&x], f(&[4], &[1., -0., -1., -2.]));
        check(Op::Abs, &[], &[&x], f(&[4], &[1., 0., 1., 2.]));
        check(Op::Relu, &[], &[&x], f(&[4], &[0., 0., 1., 2.]));
        check(Op::Exp, &[], &[&x], f(&[4], &[(1.0 / e) as f32, 1., e as f32, (e * e) as f32]));
        check(Op::Log, &[], &[&f(&[4], &[1., 0., -1., 8.])], f(&[4], &[0., f32::NEG_INFINITY, f32::NAN, 8f32.ln()]));
        check(Op::Sqrt, &[], &[&f(&[3], &[4., 2., 0.])], f(&[3], &[2., std::f32::consts::SQRT_2, 0.]));
        check(Op::Rsqrt, &[], &[&f(&[3], &[4., 0.25, 0.])], f(&[3], &[0.5, 2., f32::INFINITY]));
        check(Op::Tanh, &[], &[&x], fd(&[4], &[-0.7615941559557649, 0., 0.7615941559557649, 0.9640275800758169]));
        check(Op::Erf, &[], &[&x], fd(&[4], &[-0.8427007929497149, 0., 0.8427007929497149, 0.9953222650189527]));
        // Python's math.erfc at each point (`[math.erfc(x) for x in xs]`): the tail keeps its
        // relative accuracy where 1 − erf(x) would be 0 (x = 5 and 9 in f32, 9 in f64).
        let xs = [-3., -1., 0., 0.5, 1., 3., 5., 9.];
        let want = [
            1.9999779095030015,
            1.842700792949715,
            1.0,
            0.4795001221869535,
            0.15729920705028513,
            2.2090496998585438e-05,
            1.5374597944280351e-12,
            4.13703174651381e-37,
        ];
        // Relative, not `check`'s absolute 1e-6 for small values, which 0 would pass.
        let got = eval_node(&node(Op::Erfc, &[]), &[&f(&[8], &xs)], &f(&[8], &xs).ty()).unwrap();
        for ((&g, &w), x) in got.as_f32().unwrap().iter().zip(&want).zip(xs) {
            assert!(((g as f64 - w) / w).abs() < 1e-7, "erfc({x}) = {g}, want {w}");
        }
        check(Op::Erfc, &[], &[&f(&[3], &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN])], f(&[3], &[0., 2., f32::NAN]));
        // Python's math.sin and math.cos; 1000 and 3000 radians as rotary embeddings reach them.
        let xs = f(&[6], &[-1., 0., 1., 2., 1000., 3000.]);
        let sin =
            [-0.8414709848078965, 0., 0.8414709848078965, 0.9092974268256817, 0.8268795405320025, 0.21918997428281808];
        let cos =
            [0.5403023058681398, 1., 0.5403023058681398, -0.4161468365471424, 0.5623790762907029, -0.9756821998857504];
        check(Op::Sin, &[], &[&xs], fd(&[6], &sin));
        check(Op::Cos, &[], &[&xs], fd(&[6], &cos));
        let specials = f(&[3], &[f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        check(Op::Sin, &[], &[&specials], f(&[3], &[f32::NAN; 3]));
        check(Op::Cos, &[], &[&specials], f(&[3], &[f32::NAN; 3]));
        check(Op::Sigmoid, &[], &[&x], fd(&[4], &[0.2689414213699951, 0.5, 0.7310585786300049, 0.8807970779778823]));
        check(Op::Sigmoid, &[], &[&f(&[2], &[-1000., 1000.])], f(&[2], &[0., 1.]));
        check(Op::Relu, &[], &[&f(&[1], &[f32::NAN])], f(&[1], &[f32::NAN]));
    }

    #[test]
    fn comparisons_give_bools_and_nan_compares_false() {
        let a = f(&[5], &[1., 2., 3., f32::NAN, -0.]);
        let b = f(&[5], &[2., 2., 2., f32::NAN, 0.]);
        let t = |v: &[bool]| bt(&[5], v);
        check(Op::Equal, &[], &[&a, &b], t(&[false, true, false, false, true]));
        check(Op::Less, &[], &[&a, &b], t(&[true, false, false, false, false]));
        check(Op::LessEqual, &[], &[&a, &b], t(&[true, true, false, false, true]));
        check(Op::Greater, &[], &[&a, &b], t(&[false, false, true, false, false]));
        check(Op::GreaterEqual, &[], &[&a, &b], t(&[false, true, true, false, true]));
        let (x, y) = (i64t(&[2, 1], &[i64::MIN, 7]), i64t(&[2], &[7, i64::MAX]));
        check(Op::Less, &[], &[&x, &y], bt(&[2, 2], &[true, true, false, true]));
        let (p, q) = (bt(&[4], &[false, false, true, true]), bt(&[4], &[false, true, false, true]));
        check(Op::Equal, &[], &[&p, &q], bt(&[4], &[true, false, false, true]));
        check(Op::And, &[], &[&p, &q], bt(&[4], &[false, false, false, true]));
        check(Op::Or, &[], &[&p, &q], bt(&[4], &[false, true, true, true]));
        check(Op::Xor, &[], &[&p, &q], bt(&[4], &[false, true, true, false]));
        check(Op::Not, &[], &[&p], bt(&[4], &[true, true, false, false]));
        // On integers they are bitwise, of the operands' dtype.
        let (m, n) = (i32t(&[3], &[12, -1, 5]), i32t(&[3], &[10, 7, -8]));
        check(Op::And, &[], &[&m, &n], i32t(&[3], &[8, 7, 0]));
        check(Op::Or, &[], &[&m, &n], i32t(&[3], &[14, -1, -3]));
        check(Op::Xor, &[], &[&m, &n], i32t(&[3], &[6, -8, -3]));
        check(Op::Not, &[], &[&m], i32t(&[3], &[-13, 0, -6]));
        check(Op::Not, &[], &[&i64t(&[1], &[i64::MAX])], i64t(&[1], &[i64::MIN]));
        assert!(error(Op::Less, &[], &[&a, &i32t(&[1], &[1])]).contains("different dtypes"));
    }

    #[test]
    fn mod_takes_the_sign_of_the_divisor_or_with_fmod_of_the_dividend() {
        // Expected values: Python's `%` (numpy mod) and C's `%` (math.fmod).
        let a = i32t(&[8], &[7, -7, 7, -7, 0, 5, i32::MIN, 3]);
        let b = i32t(&[8], &[3, 3, -3, -3, 4, 0, -1, 5]);
        check(Op::Mod, &[], &[&a, &b], i32t(&[8], &[1, 2, -2, -1, 0, 0, 0, 3]));
        let fmod = [("fmod", Attr::Bool(true))];
        check(Op::Mod, &fmod, &[&a, &b], i32t(&[8], &[1, -1, 1, -1, 0, 0, 0, 3]));
        let (a, b) = (i64t(&[2], &[-9, i64::MIN]), i64t(&[1], &[4]));
        check(Op::Mod, &[], &[&a, &b], i64t(&[2], &[3, 0]));
        assert!(error(Op::Mod, &[], &[&f(&[1], &[1.]), &f(&[1], &[1.])]).contains("not defined for f32"));
    }

    #[test]
    fn rounding_ops_round_half_to_even() {
        let x = f(&[8], &[0.5, 1.5, 2.5, -0.5, -1.5, 1.2, -1.2, f32::NAN]);
        check(Op::Round, &[], &[&x], f(&[8], &[0., 2., 2., -0., -2., 1., -1., f32::NAN]));
        check(Op::Floor, &[], &[&x], f(&[8], &[0., 1., 2., -1., -2., 1., -2., f32::NAN]));
        check(Op::Ceil, &[], &[&x], f(&[8], &[1., 2., 3., -0., -1., 2., -1., f32::NAN]));
    }

    #[test]
    fn gelu_both_approximations() {
        let x = f(&[4], &[-1., 0., 1., 2.]);
        let exact = fd(&[4], &[-0.15865525393145707, 0., 0.8413447460685429, 1.9544997361036416]);
        check(Op::Gelu, &[], &[&x], exact.clone());
        check(Op::Gelu, &[("approximate", s("none"))], &[&x], exact);
        check(
            Op::Gelu,
            &[("approximate", s("tanh"))],
            &[&x],
            fd(&[4], &[-0.15880800939172324, 0., 0.8411919906082768, 1.954597694087775]),
        );
        assert!(error(Op::Gelu, &[("approximate", s("fast"))], &[&x])
            .contains("attribute 'approximate' must be one of none, tanh"));
    }

    #[test]
    fn integer_unary_ops() {
        let x = i32t(&[4], &[i32::MIN, -3, 0, 5]);
        check(Op::Neg, &[], &[&x], i32t(&[4], &[i32::MIN, 3, 0, -5]));
        check(Op::Abs, &[], &[&x], i32t(&[4], &[i32::MIN, 3, 0, 5]));
        check(Op::Relu, &[], &[&x], i32t(&[4], &[0, 0, 0, 5]));
        check(Op::Neg, &[], &[&i64t(&[1], &[7])], i64t(&[1], &[-7]));
        assert_eq!(error(Op::Exp, &[], &[&x]), "node 'n': exp is not defined for i32");
    }

    #[test]
    fn cast_between_all_dtypes() {
        let to = |d: &str| [("to", s(d))];
        let x = f(&[5], &[-1.7, 0., 2.5, f32::NAN, -0.2]);
        check(Op::Cast, &to("f32"), &[&x], x.clone());
        check(Op::Cast, &to("i32"), &[&x], i32t(&[5], &[-1, 0, 2, 0, 0]));
        check(Op::Cast, &to("i64"), &[&x], i64t(&[5], &[-1, 0, 2, 0, 0]));
        check(Op::Cast, &to("bool"), &[&x], bt(&[5], &[true, false, true, true, true]));
        check(Op::Cast, &to("i32"), &[&f(&[2], &[3e10, -3e10])], i32t(&[2], &[i32::MAX, i32::MIN]));

        let x = i32t(&[3], &[-2, 0, 16_777_217]);
        check(Op::Cast, &to("f32"), &[&x], f(&[3], &[-2., 0., 16_777_216.]));
        check(Op::Cast, &to("i32"), &[&x], x.clone());
        check(Op::Cast, &to("i64"), &[&x], i64t(&[3], &[-2, 0, 16_777_217]));
        check(Op::Cast, &to("bool"), &[&x], bt(&[3], &[true, false, true]));

        // i64 → f32 rounds once (a detour through f64 would give 2^53 + 2^30 rounding twice).
        let big = (1i64 << 53) + (1 << 29) + 1;
        let x = i64t(&[3], &[(1 << 32) + 5, -(1 << 31) - 1, big]);
        check(Op::Cast, &to("f32"), &[&x], f(&[3], &[4_294_967_296., -2_147_483_648., big as f32]));
        assert_eq!(big as f32, 9_007_200_328_482_816.0);
        check(Op::Cast, &to("i32"), &[&x], i32t(&[3], &[5, i32::MAX, (big as i32)]));
        check(Op::Cast, &to("i64"), &[&x], x.clone());
        check(Op::Cast, &to("bool"), &[&i64t(&[2], &[0, -9])], bt(&[2], &[false, true]));

        let x = bt(&[2], &[true, false]);
        check(Op::Cast, &to("f32"), &[&x], f(&[2], &[1., 0.]));
        check(Op::Cast, &to("i32"), &[&x], i32t(&[2], &[1, 0]));
        check(Op::Cast, &to("i64"), &[&x], i64t(&[2], &[1, 0]));
        check(Op::Cast, &to("bool"), &[&x], x.clone());

        assert!(error(Op::Cast, &[], &[&x]).contains("missing required attribute 'to'"));
        assert!(error(Op::Cast, &to("f64"), &[&x]).contains("attribute 'to' must be a dtype"));

        // Into the halves: round to nearest, ties to even; out of range is infinite.
        let x = f(&[5], &[1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -3.0e38, 70000.0, f32::NAN]);
        let bf = cast(&x.data, DType::BF16);
        assert_eq!(bf.to_f64()[..4], [1.0, 1.015625, -1.765625 * 2f64.powi(127), 70144.0]);
        let h = cast(&x.data, DType::F16);
        assert_eq!(h.to_f64()[..4], [1.00390625, 1.01171875, f64::NEG_INFINITY, f64::INFINITY]);
        assert!(h.to_f64()[4].is_nan() && bf.to_f64()[4].is_nan());
        // Out of the halves: exactly, and on to ints and bools from there.
        let back = |d: &Data, to: DType| Tensor::new(vec![5], cast(d, to));
        assert_eq!(back(&h, DType::I32), i32t(&[5], &[1, 1, i32::MIN, i32::MAX, 0]));
        assert_eq!(back(&bf, DType::Bool), bt(&[5], &[true, true, true, true, true]));
        let bits = |d: Data| Tensor::new(vec![5], d).to_le_bytes();
        assert_eq!(bits(cast(&cast(&bf, DType::F32), DType::BF16)), bits(bf));

        // Into i8/u8: truncated toward zero to i32, then wrapped to 8 bits (numpy's and
        // onnxruntime's x86 answers); out of them, exactly.
        let x = f(&[7], &[-1.0, 300.0, 2.9, -2.9, 127.5, -128.7, f32::NAN]);
        let u = Tensor::new(vec![7], cast(&x.data, DType::U8));
        assert_eq!(u, Tensor::new(vec![7], Data::U8(vec![255, 44, 2, 254, 127, 128, 0])));
        let i = Tensor::new(vec![7], cast(&x.data, DType::I8));
        assert_eq!(i, Tensor::new(vec![7], Data::I8(vec![-1, 44, 2, -2, 127, -128, 0])));
        let wide = i64t(&[3], &[200, -200, (1 << 40) + 3]);
        assert_eq!(cast(&wide.data, DType::I8), Data::I8(vec![-56, 56, 3]));
        assert_eq!(cast(&u.data, DType::F32), Data::F32(vec![255., 44., 2., 254., 127., 128., 0.]));
        assert_eq!(cast(&i.data, DType::I64), Data::I64(vec![-1, 44, 2, -2, 127, -128, 0]));
        assert_eq!(cast(&i.data, DType::U8), Data::U8(vec![255, 44, 2, 254, 127, 128, 0]));
        assert_eq!(
            cast(&u.data, DType::BF16),
            cast(&Data::F32(vec![255., 44., 2., 254., 127., 128., 0.]), DType::BF16)
        );

        // Into the 16-bit ints and u32 through their wide type, wrapping; a float into u64
        // truncated and saturated as u64, an int wrapped; out of u64 unsigned into a float
        // and its bits into an int.
        let x = f(&[5], &[-1.0, 70000.9, 1e19, -2.5, f32::NAN]);
        assert_eq!(cast(&x.data, DType::I16), Data::I16(vec![-1, 4464, -1, -2, 0]));
        assert_eq!(cast(&x.data, DType::U16), Data::U16(vec![65535, 4464, 65535, 65534, 0]));
        assert_eq!(cast(&x.data, DType::U32), Data::U32(vec![u32::MAX, 70000, u32::MAX, u32::MAX - 1, 0]));
        let big = 1e19f32 as u64;
        assert_eq!(cast(&x.data, DType::U64), Data::U64(vec![0, 70000, big, 0, 0]));
        assert_eq!(cast(&i64t(&[2], &[-1, 5]).data, DType::U64), Data::U64(vec![u64::MAX, 5]));
        let u = Data::U64(vec![u64::MAX, 1 << 63, 3]);
        assert_eq!(cast(&u, DType::F32), Data::F32(vec![1.8446744e19, 9.223372e18, 3.0]));
        assert_eq!(cast(&u, DType::I64), Data::I64(vec![-1, i64::MIN, 3]));
        assert_eq!(cast(&u, DType::U16), Data::U16(vec![65535, 0, 3]));
        assert_eq!(cast(&u, DType::Bool), Data::Bool(vec![true, true, true]));
        assert_eq!(cast(&Data::U32(vec![u32::MAX]), DType::I32), Data::I32(vec![-1]));
        assert_eq!(cast(&Data::I16(vec![-1]), DType::U32), Data::U32(vec![u32::MAX]));
    }

    #[test]
    fn where_broadcasts_all_three() {
        let c = bt(&[2, 1], &[true, false]);
        let a = i64t(&[3], &[1, 2, 3]);
        let b = i64t(&[], &[-1]);
        check(Op::Where, &[], &[&c, &a, &b], i64t(&[2, 3], &[1, 2, 3, -1, -1, -1]));
        let c = bt(&[3], &[true, false, true]);
        check(Op::Where, &[], &[&c, &f(&[1], &[9.]), &f(&[2, 1], &[0., 1.])], f(&[2, 3], &[9., 0., 9., 9., 1., 9.]));
        let c = bt(&[2], &[false, true]);
        check(Op::Where, &[], &[&c, &bt(&[2], &[true, true]), &bt(&[2], &[false, false])], bt(&[2], &[false, true]));
        assert!(error(Op::Where, &[], &[&c, &f(&[2], &[1., 2.]), &i32t(&[2], &[1, 2])]).contains("different dtypes"));
        assert!(error(Op::Where, &[], &[&f(&[2], &[1., 2.]), &f(&[2], &[1., 2.]), &f(&[2], &[1., 2.])])
            .contains("expected a bool operand, got f32"));
    }

    // ---- contractions ----------------------------------------------------------------

    #[test]
    fn matmul_2d_and_1d() {
        let a = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let b = f(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
        check(Op::MatMul, &[], &[&a, &b], f(&[2, 2], &[58., 64., 139., 154.]));
        let v = f(&[3], &[1., 0., -1.]);
        check(Op::MatMul, &[], &[&a, &v], f(&[2], &[-2., -2.]));
        check(Op::MatMul, &[], &[&f(&[2], &[1., -1.]), &a], f(&[3], &[-3., -3., -3.]));
        check(Op::MatMul, &[], &[&v, &f(&[3], &[2., 5., 3.])], f(&[], &[-1.]));
        // 1-D against a batch: the vector broadcasts over the batch.
        let batch = f(&[2, 2, 3], &[1., 2., 3., 4., 5., 6., 0., 0., 1., 1., 0., 0.]);
        check(Op::MatMul, &[], &[&batch, &v], f(&[2, 2], &[-2., -2., -1., 1.]));
        check(Op::MatMul, &[], &[&f(&[2], &[1., 1.]), &batch], f(&[2, 3], &[5., 7., 9., 1., 0., 1.]));
    }

    /// i32 products are exact and wrap in i32 (the f32 path would round past 2^24).
    #[test]
    fn matmul_of_i32_is_exact_and_wraps() {
        let a = i32t(&[2, 2], &[16_777_217, 1, -255, 255]);
        let b = i32t(&[2, 1], &[1, 1]);
        check(Op::MatMul, &[], &[&a, &b], i32t(&[2, 1], &[16_777_218, 0]));
        let big = i32t(&[1, 2], &[i32::MAX, 1]);
        check(Op::MatMul, &[], &[&big, &b], i32t(&[1, 1], &[i32::MIN]));
        check(Op::MatMul, &[], &[&i32t(&[2], &[3, -4]), &a], i32t(&[2], &[50_332_671, -1017]));
        assert!(error(Op::MatMul, &[], &[&a, &f(&[2, 1], &[1., 1.])]).contains("i32"));
    }

    /// With `a_zero_point`, an 8-bit `a` is widened and less the zero point (one element, of
    /// any rank) before the product; the epilogue's operands follow the zero point.
    #[test]
    fn matmul_of_bytes_less_a_zero_point() {
        let zp = [("a_zero_point", Attr::Bool(true))];
        let b = i32t(&[2, 1], &[1, -2]);
        let u8s = Tensor::new(vec![2, 2], Data::U8(vec![255, 0, 3, 130]));
        check(Op::MatMul, &zp, &[&u8s, &b, &i32t(&[1, 1], &[128])], i32t(&[2, 1], &[127 + 256, -125 - 4]));
        let i8s = Tensor::new(vec![2, 2], Data::I8(vec![-128, 127, 0, -1]));
        check(Op::MatMul, &zp, &[&i8s, &b, &i32t(&[], &[-3])], i32t(&[2, 1], &[-125 - 260, 3 - 4]));
        let dequant = [("a_zero_point", Attr::Bool(true)), ("epilogue", s("to_f32,mul"))];
        let half = f(&[], &[0.5]);
        check(Op::MatMul, &dequant, &[&i8s, &b, &i32t(&[], &[-3]), &half], f(&[2, 1], &[-192.5, -0.5]));
    }

    #[test]
    fn matmul_broadcasts_batch_dims() {
        // a: [2,1,2,2] (two matrices), b: [3,2,2] (three) -> [2,3,2,2], every pairing.
        let a = f(&[2, 1, 2, 2], &[1., 0., 0., 1., 0., 1., 1., 0.]);
        let b = f(&[3, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8., 0., 0., 0., 1.]);
        let want = f(
            &[2, 3, 2, 2],
            &[
                1., 2., 3., 4., 5., 6., 7., 8., 0., 0., 0., 1., // identity @ b
                3., 4., 1., 2., 7., 8., 5., 6., 0., 1., 0., 0., // swap-rows @ b
            ],
        );
        check(Op::MatMul, &[], &[&a, &b], want);
        // A 2-D b broadcasts over a's batch.
        let a = f(&[2, 1, 2], &[1., 2., 3., 4.]);
        let b = f(&[2, 2], &[1., 1., 0., 1.]);
        check(Op::MatMul, &[], &[&a, &b], f(&[2, 1, 2], &[1., 3., 3., 7.]));
        assert!(error(Op::MatMul, &[], &[&a, &f(&[3], &[1., 2., 3.])]).contains("contraction dims differ"));
        assert!(error(Op::MatMul, &[], &[&f(&[3, 2, 2], &[0.; 12]), &f(&[2, 2, 2], &[0.; 8])])
            .contains("cannot be broadcast together"));
    }

    #[test]
    fn matmul_accumulates_in_f64() {
        // In f32, 1e8 + 1 - 1e8 loses the 1; the f64 accumulator keeps it.
        let a = f(&[1, 3], &[1e8, 1., -1e8]);
        let b = f(&[3, 1], &[1., 1., 1.]);
        check(Op::MatMul, &[], &[&a, &b], f(&[1, 1], &[1.]));
    }

    #[test]
    fn einsum_cases() {
        let eq = |e: &str| [("equation", s(e))];
        let m = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        check(Op::Einsum, &eq("ij->ji"), &[&m], f(&[3, 2], &[1., 4., 2., 5., 3., 6.]));
        check(Op::Einsum, &eq("ij->"), &[&m], f(&[], &[21.]));
        check(Op::Einsum, &eq("ij->j"), &[&m], f(&[3], &[5., 7., 9.]));
        // Trace-like: sum_ij A_ij B_ji = trace(A B).
        let n = f(&[3, 2], &[1., 0., 0., 1., 1., 1.]);
        check(Op::Einsum, &eq("ij,ji->"), &[&m, &n], f(&[], &[(1. + 3.) + (5. + 6.)]));
        check(Op::Einsum, &eq("ij,jk->ik"), &[&m, &n], f(&[2, 2], &[4., 5., 10., 11.]));
        check(
            Op::Einsum,
            &eq("i,j->ij"),
            &[&f(&[2], &[1., 2.]), &f(&[3], &[1., 10., 100.])],
            f(&[2, 3], &[1., 10., 100., 2., 20., 200.]),
        );
        // Batched matmul with a transposed output.
        let a = f(&[2, 1, 2], &[1., 2., 3., 4.]);
        let b = f(&[2, 2, 2], &[1., 0., 0., 1., 0., 1., 1., 0.]);
        check(Op::Einsum, &eq("bij,bjk->bik"), &[&a, &b], f(&[2, 1, 2], &[1., 2., 4., 3.]));
        check(Op::Einsum, &eq("bij,bjk->kib"), &[&a, &b], f(&[2, 1, 2], &[1., 4., 2., 3.]));
        check(Op::Einsum, &eq(" bij , bjk -> bik "), &[&a, &b], f(&[2, 1, 2], &[1., 2., 4., 3.]));
        // Three operands.
        let v = f(&[2], &[1., -1.]);
        check(Op::Einsum, &eq("i,ij,j->"), &[&v, &f(&[2, 2], &[1., 2., 3., 4.]), &v], f(&[], &[1. - 2. - 3. + 4.]));
    }

    #[test]
    fn einsum_errors() {
        let eq = |e: &str| [("equation", s(e))];
        let sq = f(&[2, 2], &[1., 2., 3., 4.]);
        assert!(error(Op::Einsum, &eq("ii->"), &[&sq]).contains("letter 'i' repeated"));
        assert!(error(Op::Einsum, &eq("ij"), &[&sq]).contains("explicit output"));
        assert!(error(Op::Einsum, &eq("...ij->ij"), &[&sq]).contains("unexpected character '.'"));
        assert!(error(Op::Einsum, &eq("ij->k"), &[&sq]).contains("output letter 'k' is in no operand"));
        assert!(
            error(Op::Einsum, &eq("ij,jk->ik"), &[&sq, &f(&[3, 1], &[0.; 3])]).contains("letter 'j' has sizes 2 and 3")
        );
        assert!(error(Op::Einsum, &eq("ijk->i"), &[&sq]).contains("has 3 letters"));
        assert!(error(Op::Einsum, &eq("ij,jk->ik"), &[&sq]).contains("2 operand terms but 1 operands"));
    }

    // ---- reductions and normalisations -------------------------------------------------

    #[test]
    fn reduce_sum_axes_and_keepdims() {
        let x = f(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        check(Op::ReduceSum, &[], &[&x], f(&[], &[21.]));
        check(Op::ReduceSum, &[("axes", ints(&[0]))], &[&x], f(&[3], &[5., 7., 9.]));
        check(Op::ReduceSum, &[("axes", ints(&[-1])), ("keepdims", Attr::Bool(true))], &[&x], f(&[2, 1], &[6., 15.]));
        check(Op::ReduceSum, &[("keepdims", Attr::Bool(true))], &[&x], f(&[1, 1], &[21.]));
        check(Op::ReduceSum, &[("axes", ints(&[]))], &[&x], x.clone());
        let y = ramp(&[2, 3, 4]);
        check(Op::ReduceSum, &[("axes", ints(&[2, 0]))], &[&y], f(&[3], &[60., 92., 124.]));
        check(Op::ReduceSum, &[("axes", ints(&[1]))], &[&f(&[2, 0], &[])], f(&[2], &[0., 0.]));
        check(Op::ReduceSum, &[("axes", ints(&[0]))], &[&i32t(&[2], &[i32::MAX, 1])], i32t(&[], &[i32::MIN]));
        check(Op::ReduceSum, &[("axes", ints(&[1]))], &[&i64t(&[2, 2], &[1, 2, 3, 4])], i64t(&[2], &[3, 7]));
        assert!(error(Op::ReduceSum, &[("axes", ints(&[0, -2]))], &[&x]).contains("is listed twice"));
        assert!(error(Op::ReduceSum, &[("axes", ints(&[2]))], &[&x]).contains("axis 2 is out of range for rank 2"));
        assert!(error(Op::ReduceSum, &[], &[&bt(&[1], &[true])]).contains("not defined for bool"));
    }

    #[test]
    fn reduce_mean_and_max() {
        let x = f(&[2, 3], &[1., 2., 3., 4., 5., 9.]);
        check(Op::ReduceMean, &[("axes", ints(&[1]))], &[&x], f(&[2], &[2., 6.]));
        check(
            Op::ReduceMean,
            &[("axes", ints(&[0])), ("keepdims", Attr::Bool(true))],
            &[&x],
            f(&[1, 3], &[2.5, 3.5, 6.]),
        );
        check(Op::ReduceMax, &[("axes", ints(&[-1]))], &[&x], f(&[2], &[3., 9.]));
        check(Op::ReduceMax, &[], &[&f(&[3], &[-5., f32::NEG_INFINITY, -7.])], f(&[], &[-5.]));
        check(
            Op::ReduceMax,
            &[("axes", ints(&[1]))],
            &[&f(&[2, 2], &[f32::NAN, 1., 2., f32::NAN])],
            f(&[2], &[f32::NAN; 2]),
        );
        check(Op::ReduceMax, &[("axes", ints(&[0]))], &[&i32t(&[3, 1], &[-4, 8, 2])], i32t(&[1], &[8]));
        check(Op::ReduceMax, &[("axes", ints(&[0]))], &[&ramp(&[1, 2])], f(&[2], &[0., 1.]));
        assert_eq!(
            error(Op::ReduceMax, &[("axes", ints(&[0]))], &[&f(&[0, 2], &[])]),
            "node 'n': reduce_max over an empty axis (shape [0,2])"
        );
        // Reducing a non-empty axis of an empty tensor is fine.
        check(Op::ReduceMax, &[("axes", ints(&[1]))], &[&f(&[0, 2], &[])], f(&[0], &[]));
        assert_eq!(error(Op::ReduceMean, &[], &[&i32t(&[1], &[1])]), "node 'n': reduce_mean is not defined for i32");
    }

    #[test]
    fn reduce_mean_is_sum_over_count() {
        let x = noise(&[3, 4, 5], 7);
        for axes in [vec![0], vec![1, 2], vec![-1], vec![0, 1, 2]] {
            let n: usize = axes.iter().map(|&a| x.shape[norm_axis(a, 3).unwrap()]).product();
            let sum = eval_any(&node(Op::ReduceSum, &[("axes", ints(&axes))]), &[&x]);
            let mean = eval_any(&node(Op::ReduceMean, &[("axes", ints(&axes))]), &[&x]);
            let want: Vec<f32> = sum.as_f32().unwrap().iter().map(|&s| s / n as f32).collect();
            assert_close(&mean, &f(&sum.shape, &want));
        }
    }

    #[test]
    fn softmax_values() {
        let x = f(&[2, 2], &[0., 3f32.ln(), 5., 5.]);
        check(Op::Softmax, &[], &[&x], f(&[2, 2], &[0.25, 0.75, 0.5, 0.5]));
        check(Op::Softmax, &[("axis", Attr::Int(0))], &[&f(&[2, 1], &[1., 1.])], f(&[2, 1], &[0.5, 0.5]));
        // Subtracting the max keeps large logits finite.
        check(Op::Softmax, &[], &[&f(&[2], &[1000., 1000.])], f(&[2], &[0.5, 0.5]));
        check(
            Op::Softmax,
            &[("axis", Attr::Int(-2))],
            &[&f(&[2, 2], &[0., 1., 2f32.ln(), 1.])],
            f(&[2, 2], &[1. / 3., 0.5, 2. / 3., 0.5]),
        );
        assert!(error(Op::Softmax, &[], &[&f(&[], &[1.])]).contains("out of range for rank 0"));
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let x = noise(&[3, 4, 5], 11);
        for axis in [-1, 0, 1] {
            let y = eval_any(&node(Op::Softmax, &[("axis", Attr::Int(axis))]), &[&x]);
            assert!(y.as_f32().unwrap().iter().all(|&p| p > 0.0 && p < 1.0));
            let sums = eval_any(&node(Op::ReduceSum, &[("axes", ints(&[axis]))]), &[&y]);
            assert!(sums.as_f32().unwrap().iter().all(|&s| (s - 1.0).abs() < 1e-6), "{sums:?}");
        }
    }

    #[test]
    fn layer_norm_of_a_row_whose_squares_overflow_f32_is_zero() {
        // The random-ONNX differential's case 133: onnxruntime and compiled code give 0.
        let x = f(&[4], &[2.1959466e22, 8.319122e-38, 3.4698193e30, 5.503111e-17]);
        let want = f(&[4], &[0.; 4]);
        check(Op::LayerNorm, &[], &[&x, &f(&[4], &[1.; 4]), &f(&[4], &[0.; 4])], want);
    }

    #[test]
    fn layer_norm_last_axis() {
        // Row [1,2,3]: mean 2, var 2/3; row [4,4,4]: var 0, so only eps keeps it finite.
        let x = f(&[2, 3], &[1., 2., 3., 4., 4., 4.]);
        let ones = f(&[3], &[1.; 3]);
        let zeros = f(&[3], &[0.; 3]);
        let r = 1.0 / (2.0f64 / 3.0 + 1e-5).sqrt();
        let want = f(&[2, 3], &[-r as f32, 0., r as f32, 0., 0., 0.]);
        check(Op::LayerNorm, &[], &[&x, &ones, &zeros], want);
        let gamma = f(&[3], &[2., 1., -1.]);
        let beta = f(&[3], &[0.5, 0., 1.]);
        let want = f(&[2, 3], &[(-2. * r + 0.5) as f32, 0., (1. - r) as f32, 0.5, 0., 1.]);
        check(Op::LayerNorm, &[("eps", Attr::Float(1e-5))], &[&x, &gamma, &beta], want);
        let r0 = 1.0 / (2.0f64 / 3.0).sqrt();
        check(
            Op::LayerNorm,
            &[("eps", Attr::Int(0))],
            &[&f(&[3], &[1., 2., 3.]), &ones, &zeros],
            f(&[3], &[-r0 as f32, 0., r0 as f32]),
        );
    }

    #[test]
    fn layer_norm_over_two_trailing_dims() {
        // Each [2,2] block is normalised as a whole: block [0,2;4,6] has mean 3, var 5.
        let x = f(&[2, 2, 2], &[0., 2., 4., 6., 1., 1., 1., 1.]);
        let gamma = f(&[2, 2], &[1., 1., 1., 2.]);
        let beta = f(&[2, 2], &[0., 0., 0., 10.]);
        let eps = 1e-3;
        let r = 1.0 / (5.0f64 + eps).sqrt();
        let want = f(&[2, 2, 2], &[(-3. * r) as f32, (-r) as f32, r as f32, (6. * r + 10.) as f32, 0., 0., 0., 10.]);
        check(Op::LayerNorm, &[("axis", Attr::Int(1)), ("eps", Attr::Float(eps))], &[&x, &gamma, &beta], want.clone());
        check(Op::LayerNorm, &[("axis", Attr::Int(-2)), ("eps", Attr::Float(eps))], &[&x, &gamma, &beta], want);
        assert!(error(Op::LayerNorm, &[("axis", Attr::Int(1))], &[&x, &f(&[2], &[1., 1.]), &beta])
            .contains("gamma has shape [2] but must be [2,2]"));
    }

    #[test]
    fn layer_norm_has_zero_mean_unit_variance() {
        let x = noise(&[4, 3, 8], 3);
        for (axis, gshape) in [(-1i64, vec![8usize]), (1, vec![3, 8])] {
            let g = f(&gshape, &vec![1.; numel(&gshape)]);
            let b = f(&gshape, &vec![0.; numel(&gshape)]);
            let y =
                eval_any(&node(Op::LayerNorm, &[("axis", Attr::Int(axis)), ("eps", Attr::Float(0.))]), &[&x, &g, &b]);
            let axes: Vec<i64> = if axis == 1 { vec![1, 2] } else { vec![2] };
            let mean = eval_any(&node(Op::ReduceMean, &[("axes", ints(&axes))]), &[&y]);
            let sq = eval_any(&node(Op::Mul, &[]), &[&y, &y]);
            let var = eval_any(&node(Op::ReduceMean, &[("axes", ints(&axes))]), &[&sq]);
            assert!(mean.as_f32().unwrap().iter().all(|m| m.abs() < 1e-6), "{mean:?}");
            assert!(var.as_f32().unwrap().iter().all(|v| (v - 1.0).abs() < 1e-5), "{var:?}");
        }
    }

    // ---- data movement ---------------------------------------------------------------

    #[test]
    fn reshape_cases() {
        let x = i32t(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        check(Op::Reshape, &[("shape", ints(&[3, -1]))], &[&x], i32t(&[3, 2], &[1, 2, 3, 4, 5, 6]));
        check(Op::Reshape, &[("shape", ints(&[-1]))], &[&x], i32t(&[6], &[1, 2, 3, 4, 5, 6]));
        check(Op::Reshape, &[("shape", ints(&[1, 6, 1]))], &[&x], i32t(&[1, 6, 1], &[1, 2, 3, 4, 5, 6]));
        check(Op::Reshape, &[("shape", ints(&[]))], &[&f(&[1, 1], &[7.])], f(&[], &[7.]));
        check(Op::Reshape, &[("shape", ints(&[0, 3]))], &[&f(&[3, 0], &[])], f(&[0, 3], &[]));
        assert!(error(Op::Reshape, &[("shape", ints(&[4, -1]))], &[&x]).contains("cannot reshape 6 elements"));
        assert!(error(Op::Reshape, &[("shape", ints(&[-1, -1]))], &[&x]).contains("more than one -1"));
        assert!(error(Op::Reshape, &[("shape", ints(&[0, -1]))], &[&f(&[0], &[])]).contains("cannot reshape"));
        assert!(error(Op::Reshape, &[("shape", ints(&[-2, -3]))], &[&x]).contains("negative dim -2"));
    }

    #[test]
    fn transpose_cases() {
        let x = i32t(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        check(Op::Transpose, &[], &[&x], i32t(&[3, 2], &[1, 4, 2, 5, 3, 6]));
        let y = ramp(&[2, 3, 4]);
        // out[k][i][j] = y[i][j][k] = 12i + 4j + k
        let want: Vec<f32> =
            (0..4).flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f32))).collect();
        check(Op::Transpose, &[("perm", ints(&[2, 0, 1]))], &[&y], f(&[4, 2, 3], &want));
        check(Op::Transpose, &[("perm", ints(&[-1, 0, -2]))], &[&y], f(&[4, 2, 3], &want));
        // Default perm reverses: out[k][j][i] = y[i][j][k].
        let rev: Vec<f32> =
            (0..4).flat_map(|k| (0..3).flat_map(move |j| (0..2).map(move |i| (12 * i + 4 * j + k) as f32))).collect();
        check(Op::Transpose, &[], &[&y], f(&[4, 3, 2], &rev));
        check(Op::Transpose, &[], &[&bt(&[], &[true])], bt(&[], &[true]));
        assert!(error(Op::Transpose, &[("perm", ints(&[0, 0]))], &[&x]).contains("not a permutation"));
        assert!(error(Op::Transpose, &[("perm", ints(&[0]))], &[&x]).contains("not a permutation"));
    }

    #[test]
    fn broadcast_to_cases() {
        check(
            Op::BroadcastTo,
            &[("shape", ints(&[2, 3]))],
            &[&f(&[3], &[1., 2., 3.])],
            f(&[2, 3], &[1., 2., 3., 1., 2., 3.]),
        );
        check(
            Op::BroadcastTo,
            &[("shape", ints(&[2, 2]))],
            &[&bt(&[2, 1], &[true, false])],
            bt(&[2, 2], &[true, true, false, false]),
        );
        check(Op::BroadcastTo, &[("shape", ints(&[3]))], &[&i64t(&[], &[4])], i64t(&[3], &[4, 4, 4]));
        check(Op::BroadcastTo, &[("shape", ints(&[2, 0]))], &[&i64t(&[1], &[4])], i64t(&[2, 0], &[]));
        assert!(error(Op::BroadcastTo, &[("shape", ints(&[2, 4]))], &[&f(&[3], &[1., 2., 3.])])
            .contains("cannot broadcast shape [3] to [2,4]"));
        assert!(error(Op::BroadcastTo, &[("shape", ints(&[3]))], &[&f(&[1, 3], &[1., 2., 3.])])
            .contains("cannot broadcast"));
        assert!(
            error(Op::BroadcastTo, &[("shape", ints(&[1 << 40, 1 << 40]))], &[&f(&[1], &[1.])]).contains("too large")
        );
    }

    #[test]
    fn concat_cases() {
        let a = i64t(&[2, 1], &[1, 2]);
        let b = i64t(&[2, 2], &[3, 4, 5, 6]);
        check(Op::Concat, &[("axis", Attr::Int(-1))], &[&a, &b], i64t(&[2, 3], &[1, 3, 4, 2, 5, 6]));
        let c = f(&[1, 2], &[1., 2.]);
        let d = f(&[2, 2], &[3., 4., 5., 6.]);
        check(Op::Concat, &[("axis", Attr::Int(0))], &[&c, &d, &c], f(&[4, 2], &[1., 2., 3., 4., 5., 6., 1., 2.]));
        check(Op::Concat, &[("axis", Attr::Int(0))], &[&c], c.clone());
        check(Op::Concat, &[("axis", Attr::Int(0))], &[&f(&[0, 2], &[]), &c], c.clone());
        assert!(error(Op::Concat, &[("axis", Attr::Int(0))], &[&a, &b]).contains("does not match operand 0"));
        assert!(error(Op::Concat, &[("axis", Attr::Int(1))], &[&a, &i32t(&[2, 1], &[1, 2])]).contains("does not match"));
        assert!(error(Op::Concat, &[], &[&a]).contains("missing required attribute 'axis'"));
    }

    #[test]
    fn slice_cases() {
        let x = ramp(&[5]);
        fn sl<'a>(st: &[i64], en: &[i64], rest: &[(&'a str, Attr)]) -> Vec<(&'a str, Attr)> {
            let mut a = vec![("starts", ints(st)), ("ends", ints(en))];
            a.extend(rest.iter().cloned());
            a
        }
        check(Op::Slice, &sl(&[1], &[3], &[]), &[&x], f(&[2], &[1., 2.]));
        check(Op::Slice, &sl(&[-2], &[100], &[]), &[&x], f(&[2], &[3., 4.]));
        check(Op::Slice, &sl(&[-1], &[i64::MIN], &[("steps", ints(&[-1]))]), &[&x], f(&[5], &[4., 3., 2., 1., 0.]));
        check(Op::Slice, &sl(&[10], &[-10], &[("steps", ints(&[-2]))]), &[&x], f(&[3], &[4., 2., 0.]));
        check(Op::Slice, &sl(&[3], &[1], &[]), &[&x], f(&[0], &[]));
        // 2-D: columns reversed two at a time on axis 1, rows 0..1 on axis 0.
        let m = i32t(&[2, 4], &[0, 1, 2, 3, 4, 5, 6, 7]);
        check(
            Op::Slice,
            &sl(&[-1, 0], &[i64::MIN, 1], &[("axes", ints(&[-1, 0])), ("steps", ints(&[-2, 1]))]),
            &[&m],
            i32t(&[1, 2], &[3, 1]),
        );
        check(
            Op::Slice,
            &sl(&[1], &[4], &[("axes", ints(&[1])), ("steps", ints(&[2]))]),
            &[&m],
            i32t(&[2, 2], &[1, 3, 5, 7]),
        );
        check(Op::Slice, &sl(&[], &[], &[]), &[&m], m.clone());
        assert!(error(Op::Slice, &sl(&[0], &[1], &[("steps", ints(&[0]))]), &[&x]).contains("step of 0"));
        assert!(error(Op::Slice, &sl(&[0, 0], &[1, 1], &[("axes", ints(&[0, -1]))]), &[&x]).contains("repeat axis 0"));
        assert!(error(Op::Slice, &sl(&[0], &[1, 2], &[]), &[&x]).contains("different lengths"));
    }

    #[test]
    fn gather_cases() {
        let data = i32t(&[3, 2], &[10, 11, 20, 21, 30, 31]);
        let idx = i64t(&[2, 2], &[0, 2, 1, -1]);
        check(Op::Gather, &[], &[&data, &idx], i32t(&[2, 2, 2], &[10, 11, 30, 31, 20, 21, 30, 31]));
        check(Op::Gather, &[("axis", Attr::Int(-1))], &[&data, &i32t(&[1], &[-2])], i32t(&[3, 1], &[10, 20, 30]));
        check(Op::Gather, &[("axis", Attr::Int(1))], &[&data, &i32t(&[], &[1])], i32t(&[3], &[11, 21, 31]));
        // Scalar index on axis 0 drops the axis; an empty index list gives an empty result.
        check(Op::Gather, &[], &[&f(&[2, 2], &[1., 2., 3., 4.]), &i32t(&[], &[1])], f(&[2], &[3., 4.]));
        check(Op::Gather, &[], &[&data, &i32t(&[0], &[])], i32t(&[0, 2], &[]));
        // 3-D data, axis in the middle: out[i][j][k] = data[i][idx[j]][k].
        let d3 = ramp(&[2, 3, 2]);
        check(
            Op::Gather,
            &[("axis", Attr::Int(1))],
            &[&d3, &i64t(&[2], &[2, 0])],
            f(&[2, 2, 2], &[4., 5., 0., 1., 10., 11., 6., 7.]),
        );
    }

    #[test]
    fn iota_counts_the_positions_of_its_axis_whatever_the_values() {
        let x = ramp(&[2, 3, 0]);
        check(Op::Iota, &[("axis", Attr::Int(1))], &[&x], i64t(&[3], &[0, 1, 2]));
        check(Op::Iota, &[("axis", Attr::Int(-3))], &[&x], i64t(&[2], &[0, 1]));
        check(Op::Iota, &[("axis", Attr::Int(2))], &[&x], i64t(&[0], &[]));
        assert!(error(Op::Iota, &[("axis", Attr::Int(3))], &[&x]).contains("axis"));
    }

    #[test]
    fn broadcast_like_takes_the_shape_of_its_second_operand_both_ways() {
        let v = f(&[3], &[1., 2., 3.]);
        check(Op::BroadcastLike, &[], &[&v, &ramp(&[2, 3])], f(&[2, 3], &[1., 2., 3., 1., 2., 3.]));
        check(Op::BroadcastLike, &[], &[&f(&[2, 1], &[5., 6.]), &v], f(&[2, 3], &[5., 5., 5., 6., 6., 6.]));
        check(Op::BroadcastLike, &[], &[&i64t(&[], &[7]), &ramp(&[2, 0])], i64t(&[2, 0], &[]));
        assert!(error(Op::BroadcastLike, &[], &[&v, &ramp(&[2])]).contains("broadcast"));
    }

    #[test]
    fn dynamic_slices_clamp_their_starts() {
        // x = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        let x = f(&[3, 4], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
        let ds = |axes: &[i64], sizes: &[i64]| [("axes", ints(axes)), ("sizes", ints(sizes))];
        check(Op::DynamicSlice, &ds(&[1], &[2]), &[&x, &i64t(&[1], &[1])], f(&[3, 2], &[1., 2., 5., 6., 9., 10.]));
        // Past the end it is moved back to fit, before the start to 0 (i32 starts too).
        check(Op::DynamicSlice, &ds(&[1], &[2]), &[&x, &i64t(&[1], &[7])], f(&[3, 2], &[2., 3., 6., 7., 10., 11.]));
        check(Op::DynamicSlice, &ds(&[0, 1], &[1, 3]), &[&x, &i32t(&[2], &[-5, 1])], f(&[1, 3], &[1., 2., 3.]));
        check(Op::DynamicSlice, &ds(&[-2], &[0]), &[&x, &i64t(&[1], &[2])], f(&[0, 4], &[]));
        let up = |axes: &[i64]| [("axes", ints(axes))];
        let u = f(&[3, 1], &[-1., -2., -3.]);
        let want = f(&[3, 4], &[0., 1., -1., 3., 4., 5., -2., 7., 8., 9., -3., 11.]);
        check(Op::DynamicUpdateSlice, &up(&[1]), &[&x, &u, &i64t(&[1], &[2])], want);
        let want = f(&[3, 4], &[0., 1., 2., -1., 4., 5., 6., -2., 8., 9., 10., -3.]);
        check(Op::DynamicUpdateSlice, &up(&[1]), &[&x, &u, &i64t(&[1], &[9])], want);
        let (b, ub) = (i64t(&[2, 2], &[1, 2, 3, 4]), i64t(&[1, 1], &[9]));
        check(Op::DynamicUpdateSlice, &up(&[0, 1]), &[&b, &ub, &i32t(&[2], &[1, 0])], i64t(&[2, 2], &[1, 2, 9, 4]));
        assert!(error(Op::DynamicSlice, &ds(&[1], &[5]), &[&x, &i64t(&[1], &[0])]).contains("window of 5"));
        assert!(error(Op::DynamicSlice, &ds(&[1], &[2]), &[&x, &f(&[1], &[0.])]).contains("i32 or i64"));
        assert!(error(Op::DynamicUpdateSlice, &up(&[0]), &[&x, &u, &i64t(&[1], &[0])]).contains("does not fit"));
    }

    #[test]
    fn scatter_elements_cases() {
        let sc = |axis: i64, red: &str| [("axis", Attr::Int(axis)), ("reduction", s(red))];
        // ONNX's own examples: axis 0 into zeros, then axis 1 with a negative index.
        let upd = f(&[2, 3], &[1.0, 1.1, 1.2, 2.0, 2.1, 2.2]);
        let want = f(&[3, 3], &[2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2]);
        check(Op::ScatterElements, &[], &[&f(&[3, 3], &[0.; 9]), &i64t(&[2, 3], &[1, 0, 2, 0, 2, 1]), &upd], want);
        let data = f(&[1, 5], &[1., 2., 3., 4., 5.]);
        let want = f(&[1, 5], &[1., 1.1, 2.1, 4., 5.]);
        check(Op::ScatterElements, &sc(1, "none"), &[&data, &i32t(&[1, 2], &[1, -3]), &f(&[1, 2], &[1.1, 2.1])], want);
        // Duplicates: the last in row-major order wins, or all combine in that order.
        let (data, idx, upd) = (f(&[5], &[1., 2., 3., 4., 5.]), i64t(&[2], &[1, 1]), f(&[2], &[1.1, 2.1]));
        for (red, v) in [("none", 2.1), ("add", 5.2), ("mul", 2.0 * 1.1 * 2.1), ("max", 2.1), ("min", 1.1)] {
            check(Op::ScatterElements, &sc(0, red), &[&data, &idx, &upd], fd(&[5], &[1., v, 3., 4., 5.]));
        }
        // Integers, indices smaller than data off the axis, any dtype without a reduction.
        let data = i64t(&[2, 3], &[0; 6]);
        let args = [&data, &i32t(&[1, 2], &[0, -1]), &i64t(&[1, 2], &[7, 9])];
        check(Op::ScatterElements, &sc(0, "add"), &args, i64t(&[2, 3], &[7, 0, 0, 0, 9, 0]));
        let args = [&bt(&[3], &[false; 3]), &i32t(&[2], &[2, 0]), &bt(&[2], &[true, true])];
        check(Op::ScatterElements, &[], &args, bt(&[3], &[true, false, true]));
    }

    #[test]
    fn scatter_elements_errors() {
        let mut g = node(Op::ScatterElements, &[]);
        g.name = "g".into();
        let out = TensorType::new(DType::F32, vec![5]);
        let (data, upd) = (ramp(&[5]), ramp(&[2]));
        let e = eval_node(&g, &[&data, &i32t(&[2], &[0, 5]), &upd], &out).unwrap_err();
        assert_eq!(e.msg, "node 'g': scatter_elements index 5 out of range for axis 0 of size 5");
        let e = eval_node(&g, &[&data, &i64t(&[2], &[-6, 0]), &upd], &out).unwrap_err();
        assert_eq!(e.msg, "node 'g': scatter_elements index -6 out of range for axis 0 of size 5");
        assert!(error(Op::ScatterElements, &[], &[&data, &f(&[2], &[0., 1.]), &upd]).contains("i32 or i64"));
        let args = [&bt(&[3], &[false; 3]), &i32t(&[1], &[0]), &bt(&[1], &[true])];
        assert!(error(Op::ScatterElements, &[("reduction", s("add"))], &args).contains("not defined for bool"));
    }

    #[test]
    fn gather_errors() {
        let data = ramp(&[5]);
        let mut g = node(Op::Gather, &[]);
        g.name = "g".into();
        let out = TensorType::new(DType::F32, vec![1]);
        let e = eval_node(&g, &[&data, &i32t(&[1], &[7])], &out).unwrap_err();
        assert_eq!(e.msg, "node 'g': gather index 7 out of range for axis 0 of size 5");
        let e = eval_node(&g, &[&data, &i64t(&[2], &[0, -6])], &out).unwrap_err();
        assert_eq!(e.msg, "node 'g': gather index -6 out of range for axis 0 of size 5");
        let e = eval_node(&g, &[&data, &i64t(&[1], &[i64::MIN])], &out).unwrap_err();
        assert!(e.msg.contains("out of range"));
        assert!(error(Op::Gather, &[], &[&data, &f(&[1], &[0.])]).contains("indices must be i32 or i64"));
        assert!(error(Op::Gather, &[], &[&f(&[], &[1.]), &i32t(&[1], &[0])]).contains("out of range for rank 0"));
    }

    // ---- node-level errors -----------------------------------------------------------

    #[test]
    fn communication_ops_are_rejected() {
        let mut n = node(Op::AllReduce, &[("groups", Attr::List(vec![ints(&[0, 1])]))]);
        n.name = "x".into();
        let t = f(&[1], &[1.]);
        let e = eval_node(&n, &[&t], &t.ty()).unwrap_err();
        assert_eq!(e.msg, "node 'x': communication op all_reduce cannot run in the single-graph interpreter");
        for op in [Op::Send, Op::AllGather, Op::ReduceScatter, Op::AllToAll] {
            assert!(error(op, &[], &[&t]).contains(&format!("communication op {op} cannot run")));
        }
        assert!(error(Op::Recv, &[], &[]).contains("communication op recv cannot run"));
    }

    #[test]
    fn node_level_checks() {
        let t = f(&[2], &[1., 2.]);
        // Wrong inferred type.
        let e = eval_node(&node(Op::Neg, &[]), &[&t], &TensorType::new(DType::F32, vec![3])).unwrap_err();
        assert_eq!(e.msg, "node 'n': computed a result of type f32[2] but the inferred type is f32[3]");
        // Wrong arity.
        assert_eq!(error(Op::Add, &[], &[&t]), "node 'n': add takes 2 operands, got 1");
        // A tensor whose data does not fill its shape.
        let bad = Tensor { shape: vec![3], data: Data::F32(vec![1.]) };
        assert_eq!(error(Op::Neg, &[], &[&bad]), "node 'n': operand 0 has shape [3] but 1 elements");
        // Attribute of the wrong kind.
        assert!(error(Op::Softmax, &[("axis", s("last"))], &[&t]).contains("attribute 'axis' must be an int"));
        // Errors carry the node's location.
        let mut n = node(Op::Exp, &[]);
        n.loc = Some(crate::Loc { line: 3, col: 5 });
        let e = eval_node(&n, &[&i32t(&[1], &[1])], &t.ty()).unwrap_err();
        assert_eq!(e.to_string(), "3:5: node 'n': exp is not defined for i32");
    }

    // ---- whole graphs ----------------------------------------------------------------

    fn graph_node(name: &str, op: Op, inputs: &[&str], attrs: &[(&str, Attr)]) -> Node {
        let mut n = node(op, attrs);
        n.name = name.into();
        n.inputs = inputs.iter().map(|s| s.to_string()).collect();
        n
    }

    /// Builds the graph and the type table by evaluating once (the stand-in for `infer`).
    fn typed(
        nodes: Vec<Node>,
        outputs: &[&str],
        values: &HashMap<String, Tensor>,
    ) -> (Graph, HashMap<String, TensorType>) {
        let mut vals = values.clone();
        let mut types = HashMap::new();
        for n in &nodes {
            let args: Vec<&Tensor> = n.inputs.iter().map(|i| &vals[i]).collect();
            let v = eval_any(n, &args);
            types.insert(n.name.clone(), v.ty());
            vals.insert(n.name.clone(), v);
        }
        let graph = Graph {
            name: "g".into(),
            nodes,
            outputs: outputs.iter().map(|&o| Output::new(o)).collect(),
            ..Graph::default()
        };
        (graph, types)
    }

    #[test]
    fn run_evaluates_in_order_and_returns_outputs() {
        let values: HashMap<String, Tensor> =
            [("x".to_string(), f(&[2, 2], &[1., -2., 3., -4.])), ("w".to_string(), f(&[2, 2], &[1., 0., 0., 1.]))]
                .into();
        let nodes = vec![
            graph_node("mm", Op::MatMul, &["x", "w"], &[]),
            graph_node("r", Op::Relu, &["mm"], &[]),
            graph_node("dead", Op::Neg, &["mm"], &[]),
            graph_node("s", Op::ReduceSum, &["r"], &[]),
            graph_node("t", Op::Add, &["s", "s"], &[]),
        ];
        let (graph, types) = typed(nodes, &["t", "mm", "x"], &values);
        // Evaluate in a different but still topological order.
        let out = run(&graph, &[0, 2, 1, 3, 4], &types, values.clone()).unwrap();
        assert_eq!(out.keys().collect::<Vec<_>>(), ["mm", "t", "x"]);
        assert_close(&out["t"], &f(&[], &[8.]));
        assert_close(&out["mm"], &values["x"]);
        assert_close(&out["x"], &values["x"]);
    }

    #[test]
    fn run_errors() {
        let values: HashMap<String, Tensor> = [("x".to_string(), f(&[1], &[1.]))].into();
        let (graph, types) = typed(vec![graph_node("y", Op::Neg, &["x"], &[])], &["y"], &values);
        let e = run(&graph, &[0], &types, HashMap::new()).unwrap_err();
        assert!(e.msg.contains("node 'y': operand 'x' has no value"), "{e}");
        assert!(run(&graph, &[1], &types, values.clone()).unwrap_err().msg.contains("node index 1"));
        assert!(run(&graph, &[0], &HashMap::new(), values.clone())
            .unwrap_err()
            .msg
            .contains("no inferred result type"));
        let e = run(&graph, &[], &types, values).unwrap_err();
        assert_eq!(e.msg, "output 'y' has no value");
    }

    /// A pre-norm transformer block (B=2, T=8, D=32, 4 heads, MLP 64): exercises most ops
    /// end to end through `run`, and must be fast even unoptimised.
    #[test]
    fn transformer_block_runs() {
        let (b, t, d, h) = (2usize, 8usize, 32usize, 4usize);
        let hd = d / h;
        let mut values: HashMap<String, Tensor> = HashMap::new();
        values.insert("x".into(), noise(&[b, t, d], 1));
        for (i, (name, shape)) in [
            ("wq", vec![d, d]),
            ("wk", vec![d, d]),
            ("wv", vec![d, d]),
            ("wo", vec![d, d]),
            ("w1", vec![d, 2 * d]),
            ("w2", vec![2 * d, d]),
        ]
        .into_iter()
        .enumerate()
        {
            let w = noise(&shape, 100 + i as u64);
            let scaled: Vec<f32> = w.as_f32().unwrap().iter().map(|v| v * 0.2).collect();
            values.insert(name.into(), f(&shape, &scaled));
        }
        values.insert("g".into(), f(&[d], &vec![1.; d]));
        values.insert("beta".into(), f(&[d], &vec![0.; d]));
        values.insert("scale".into(), f(&[], &[1.0 / (hd as f32).sqrt()]));
        let heads = |name: &str, src: &str| {
            vec![
                graph_node(
                    &format!("{name}_r"),
                    Op::Reshape,
                    &[src],
                    &[("shape", ints(&[b as i64, t as i64, h as i64, hd as i64]))],
                ),
                graph_node(name, Op::Transpose, &[&format!("{name}_r")], &[("perm", ints(&[0, 2, 1, 3]))]),
            ]
        };
        let mut nodes = vec![
            graph_node("ln", Op::LayerNorm, &["x", "g", "beta"], &[]),
            graph_node("q0", Op::MatMul, &["ln", "wq"], &[]),
            graph_node("k0", Op::Einsum, &["ln", "wk"], &[("equation", s("btd,de->bte"))]),
            graph_node("v0", Op::MatMul, &["ln", "wv"], &[]),
        ];
        nodes.extend(heads("q", "q0"));
        nodes.extend(heads("k", "k0"));
        nodes.extend(heads("v", "v0"));
        nodes.extend([
            graph_node("kt", Op::Transpose, &["k"], &[("perm", ints(&[0, 1, 3, 2]))]),
            graph_node("sc0", Op::MatMul, &["q", "kt"], &[]),
            graph_node("sc", Op::Mul, &["sc0", "scale"], &[]),
            graph_node("p", Op::Softmax, &["sc"], &[]),
            graph_node("att", Op::MatMul, &["p", "v"], &[]),
            graph_node("att_t", Op::Transpose, &["att"], &[("perm", ints(&[0, 2, 1, 3]))]),
            graph_node("att_r", Op::Reshape, &["att_t"], &[("shape", ints(&[b as i64, t as i64, -1]))]),
            graph_node("o", Op::MatMul, &["att_r", "wo"], &[]),
            graph_node("res1", Op::Add, &["x", "o"], &[]),
            graph_node("ln2", Op::LayerNorm, &["res1", "g", "beta"], &[]),
            graph_node("h1", Op::MatMul, &["ln2", "w1"], &[]),
            graph_node("a1", Op::Gelu, &["h1"], &[("approximate", s("tanh"))]),
            graph_node("h2", Op::MatMul, &["a1", "w2"], &[]),
            graph_node("y", Op::Add, &["res1", "h2"], &[]),
        ]);
        let (graph, types) = typed(nodes, &["y", "p"], &values);
        let order: Vec<usize> = (0..graph.nodes.len()).collect();
        let out = run(&graph, &order, &types, values).unwrap();
        assert_eq!(out["y"].shape, [b, t, d]);
        assert!(out["y"].as_f32().unwrap().iter().all(|v| v.is_finite()));
        // Attention rows are distributions.
        let sums = eval_any(&node(Op::ReduceSum, &[("axes", ints(&[-1]))]), &[&out["p"]]);
        assert!(sums.as_f32().unwrap().iter().all(|&s| (s - 1.0).abs() < 1e-6));
    }

    #[test]
    fn matmul_einsum_agree_on_a_larger_case() {
        let a = noise(&[64, 256], 5);
        let b = noise(&[256, 64], 6);
        let mm = eval_any(&node(Op::MatMul, &[]), &[&a, &b]);
        let es = eval_any(&node(Op::Einsum, &[("equation", s("ik,kj->ij"))]), &[&a, &b]);
        assert_eq!(mm, es);
        // Spot-check one element against a direct f64 dot product.
        let (av, bv) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let dot: f64 = (0..256).map(|k| av[3 * 256 + k] as f64 * bv[k * 64 + 5] as f64).sum();
        assert_eq!(mm.as_f32().unwrap()[3 * 64 + 5], dot as f32);
    }
}
