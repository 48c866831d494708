//! ONNX ops onto meshc's op set (docs/onnx.md lists them): one ONNX node becomes zero or
//! more meshc nodes through the `Builder`, which folds what is known at import time. Each
//! mapping carries the ONNX semantics meshc spells differently: reductions with no axes
//! reduce all of them, Reshape's 0 copies the input dim, Gemm is matmul + add with
//! transposes, Clip is maximum/minimum, shape inputs must be known at import time.

use meshc_ir::budget;
use meshc_ir::dtype::ShapeDisplay;
use meshc_ir::infer::{broadcast_shapes, norm_axis};
use meshc_ir::{Attr, DType, Data, Op, Tensor};

use super::builder::{Builder, SizeOf, Value};
use super::proto::{AttributeProto, NodeProto};
use super::tensors;

pub(crate) type R<T> = std::result::Result<T, String>;

/// The first opset whose meaning every converter implements for its op: from it on, an op
/// is read with its newest version's meaning (the versions after it add element types and
/// new ops, not new meanings); before it, only from the opset its converter names.
pub const CURRENT: i64 = 13;

/// A converter: the values of one ONNX node's outputs, in order, built through the `Builder`.
pub type Convert = fn(&mut Builder, &Ctx) -> R<Vec<Value>>;

/// The converter of ONNX op type `op` at the opsets `first..=last` of the default domain.
/// Each ops module lists its converters in a table (`CONVERTERS`); `dispatch` merges them.
pub struct Converter {
    pub op: &'static str,
    pub first: i64,
    pub last: i64,
    pub convert: Convert,
}

impl Converter {
    /// `op` with its newest version's meaning, from opset 13 on (older versions are not read).
    pub const fn new(op: &'static str, convert: Convert) -> Converter {
        Converter { op, first: CURRENT, last: i64::MAX, convert }
    }

    /// `op` from opset `first` on: the oldest whose version means what `convert` implements
    /// (from ONNX's Changelog; the versions between it and 13 differ only in the element
    /// types they allow, or in attributes the converters read, as `Ctx::ints_input_or_attr`).
    pub const fn since(first: i64, op: &'static str, convert: Convert) -> Converter {
        Converter { op, first, last: i64::MAX, convert }
    }

    /// `op` at opsets `first` to `last` only: the versions before one that changed its meaning.
    pub const fn between(first: i64, last: i64, op: &'static str, convert: Convert) -> Converter {
        Converter { op, first, last, convert }
    }
}

/// One ONNX node: its attributes, its (optional) inputs and the name its meshc nodes are
/// named after (the node's own name, or its first output's when it has none).
pub struct Ctx<'a> {
    pub node: &'a NodeProto,
    pub args: Vec<Option<Value>>,
    pub opset: i64,
    pub out: String,
}

impl Ctx<'_> {
    pub(super) fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name.as_deref() == Some(name))
    }

    pub(super) fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).and_then(|a| a.i).unwrap_or(default)
    }

    pub(super) fn float(&self, name: &str, default: f32) -> f32 {
        self.attr(name).and_then(|a| a.f).unwrap_or(default)
    }

    pub(super) fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }

    pub(super) fn string(&self, name: &str, default: &str) -> String {
        self.attr(name).and_then(|a| a.s.as_ref()).map_or(default.to_string(), |s| String::from_utf8_lossy(s).into())
    }

    pub(super) fn opt(&self, i: usize) -> Option<&Value> {
        self.args.get(i).and_then(Option::as_ref)
    }

    pub(super) fn arg(&self, i: usize) -> R<&Value> {
        self.opt(i).ok_or_else(|| format!("input {i} is missing"))
    }

    /// Every input, none of which may be missing (the variadic ops).
    pub(super) fn all_args(&self) -> R<Vec<&Value>> {
        (0..self.args.len()).map(|i| self.arg(i)).collect()
    }

    /// Input `i` as integers, which meshc needs at import time (a shape, axes, bounds).
    pub(super) fn const_ints(&self, i: usize) -> R<Vec<i64>> {
        let v = self.arg(i)?;
        let t = v.as_const().ok_or_else(|| {
            format!("input {i} must be known at import time (computed from shapes and constants only)")
        })?;
        match &t.data {
            Data::I64(v) => Ok(v.clone()),
            Data::I32(v) => Ok(v.iter().map(|&x| x.into()).collect()),
            other => Err(format!("input {i} must hold integers, found {}", other.dtype())),
        }
    }

    /// Input `i` if given (`None` when absent or empty), else attribute `name` (opsets before
    /// the attribute became an input).
    pub(super) fn ints_input_or_attr(&self, i: usize, name: &str) -> R<Option<Vec<i64>>> {
        match self.opt(i) {
            Some(_) => self.const_ints(i).map(Some),
            None => Ok(self.ints(name)),
        }
    }

    /// The name of helper node `what` of this ONNX node.
    pub(super) fn part(&self, what: &str) -> String {
        format!("{}.{what}", self.out)
    }
}

/// This module's converters (docs/onnx.md): arithmetic, activations of one meshc op, shapes,
/// reductions, layer norm and the ops that fold to constants.
pub const CONVERTERS: &[Converter] = &[
    Converter::since(6, "Neg", |b, c| unary(b, c, Op::Neg)),
    Converter::since(6, "Abs", |b, c| unary(b, c, Op::Abs)),
    Converter::since(6, "Exp", |b, c| unary(b, c, Op::Exp)),
    Converter::since(6, "Log", |b, c| unary(b, c, Op::Log)),
    Converter::since(6, "Sqrt", |b, c| unary(b, c, Op::Sqrt)),
    Converter::since(6, "Tanh", |b, c| unary(b, c, Op::Tanh)),
    Converter::since(9, "Erf", |b, c| unary(b, c, Op::Erf)),
    Converter::since(7, "Sin", |b, c| unary(b, c, Op::Sin)),
    Converter::since(7, "Cos", |b, c| unary(b, c, Op::Cos)),
    Converter::since(6, "Sigmoid", |b, c| unary(b, c, Op::Sigmoid)),
    Converter::since(6, "Relu", |b, c| unary(b, c, Op::Relu)),
    Converter::since(7, "Add", |b, c| nary(b, c, Op::Add)),
    Converter::since(8, "Sum", |b, c| nary(b, c, Op::Add)),
    Converter::since(7, "Sub", |b, c| nary(b, c, Op::Sub)),
    Converter::since(7, "Mul", |b, c| nary(b, c, Op::Mul)),
    Converter::since(7, "Div", |b, c| nary(b, c, Op::Div)),
    Converter::since(7, "Pow", pow),
    Converter::since(8, "Max", |b, c| nary(b, c, Op::Maximum)),
    Converter::since(8, "Min", |b, c| nary(b, c, Op::Minimum)),
    Converter::since(8, "Mean", mean),
    Converter::since(6, "Reciprocal", |b, c| {
        let x = c.arg(0)?;
        one(b.node(&c.out, Op::Div, &[&scalar(b.ty(x).dtype, 1.0), x], &[]))
    }),
    Converter::since(1, "Identity", |_, c| Ok(vec![c.arg(0)?.clone()])),
    Converter::since(7, "Dropout", dropout),
    Converter::new("Gelu", |b, c| {
        let approx = c.string("approximate", "none");
        one(b.node(&c.out, Op::Gelu, &[c.arg(0)?], &[("approximate", Attr::Str(approx))]))
    }),
    // Before 13 (ops_legacy), Softmax and LogSoftmax see their input as a matrix.
    Converter::new("Softmax", softmax),
    Converter::new("LogSoftmax", log_softmax),
    Converter::since(6, "Cast", |b, c| {
        let code = c.int("to", 0) as i32;
        let to = tensors::dtype(code)?;
        // meshc computes in f32, but a cast to a half rounds (and overflows) as the half
        // would: to the half and back.
        let x = match tensors::storage_dtype(code) {
            Ok(half) if half.is_half() && b.ty(c.arg(0)?).dtype != half => cast(b, c.arg(0)?, half, &c.part("half"))?,
            _ => c.arg(0)?.clone(),
        };
        one(cast(b, &x, to, &c.out))
    }),
    Converter::since(9, "Where", |b, c| one(b.node(&c.out, Op::Where, &[c.arg(0)?, c.arg(1)?, c.arg(2)?], &[]))),
    // Before 11 (ops_legacy), the bounds are attributes.
    Converter::since(11, "Clip", clip),
    Converter::since(9, "MatMul", |b, c| one(b.node(&c.out, Op::MatMul, &[c.arg(0)?, c.arg(1)?], &[]))),
    Converter::since(7, "Gemm", |b, c| one(gemm(b, c))),
    Converter::since(12, "Einsum", |b, c| {
        let eq: String = c.string("equation", "").chars().filter(|ch| !ch.is_whitespace()).collect();
        one(b.node(&c.out, Op::Einsum, &c.all_args()?, &[("equation", Attr::Str(eq))]))
    }),
    Converter::since(1, "ReduceSum", |b, c| reduce(b, c, "ReduceSum")),
    Converter::since(1, "ReduceMean", |b, c| reduce(b, c, "ReduceMean")),
    Converter::since(1, "ReduceMax", |b, c| reduce(b, c, "ReduceMax")),
    Converter::since(1, "ReduceMin", |b, c| reduce(b, c, "ReduceMin")),
    Converter::since(1, "ReduceSumSquare", |b, c| reduce(b, c, "ReduceSumSquare")),
    Converter::new("LayerNormalization", layer_norm),
    Converter::since(5, "Reshape", reshape_op),
    Converter::since(1, "Flatten", flatten),
    Converter::since(1, "Squeeze", squeeze),
    Converter::since(1, "Unsqueeze", unsqueeze),
    Converter::since(1, "Transpose", |b, c| {
        let attrs: Vec<(&str, Attr)> = c.ints("perm").map(|p| ("perm", Attr::ints(&p))).into_iter().collect();
        one(b.node(&c.out, Op::Transpose, &[c.arg(0)?], &attrs))
    }),
    Converter::since(4, "Concat", |b, c| {
        one(b.node(&c.out, Op::Concat, &c.all_args()?, &[("axis", Attr::Int(c.int("axis", 0)))]))
    }),
    // Before 10 (ops_legacy), starts, ends and axes are attributes.
    Converter::since(10, "Slice", slice),
    Converter::since(1, "Gather", |b, c| {
        one(b.node(&c.out, Op::Gather, &[c.arg(0)?, c.arg(1)?], &[("axis", Attr::Int(c.int("axis", 0)))]))
    }),
    Converter::since(8, "Expand", expand),
    Converter::since(2, "Split", split),
    Converter::since(1, "Shape", |b, c| {
        let shape = b.ty(c.arg(0)?).shape;
        let r = shape.len() as i64;
        let clamp = |i: i64| (if i < 0 { i + r } else { i }).clamp(0, r) as usize;
        let (start, end) = (clamp(c.int("start", 0)), clamp(c.int("end", r)));
        let dims: Vec<i64> = shape[start..end.max(start)].iter().map(|&d| d as i64).collect();
        let t = Tensor::new(vec![dims.len()], Data::I64(dims));
        Ok(vec![match c.arg(0)? {
            Value::Tensor(x) if b.sizes => {
                Value::sized(t, (start..end.max(start)).map(|d| Some((x.clone(), d))).collect())
            }
            _ => Value::computed(t),
        }])
    }),
    Converter::since(1, "Size", |b, c| {
        Ok(vec![Value::computed(Tensor::new(vec![], Data::I64(vec![b.ty(c.arg(0)?).numel() as i64])))])
    }),
    Converter::since(9, "ConstantOfShape", constant_of_shape),
    Converter::since(11, "Range", |b, c| one(range(b, c))),
    Converter::since(9, "Constant", |_, c| Ok(vec![Value::named(constant(c)?, &c.out)])),
];

/// A converter's one output.
pub(super) fn one(v: R<Value>) -> R<Vec<Value>> {
    v.map(|v| vec![v])
}

pub(super) fn scalar(dtype: DType, v: f64) -> Value {
    Value::computed(Tensor::new(vec![], Data::from_f64(dtype, [v])))
}

/// A constant the import computes, `what`, of `dtype` and `shape`, element i being `f(i)`:
/// its size is checked against the memory budget (`meshc_ir::budget`) before it is built.
pub(super) fn table(what: &str, dtype: DType, shape: Vec<usize>, f: impl FnMut(usize) -> f64) -> R<Value> {
    let n = budget::check_shape(format_args!("{what} {}", ShapeDisplay(&shape)), &shape, dtype.size_bytes())?;
    Ok(Value::computed(Tensor::new(shape, Data::from_f64(dtype, (0..n).map(f)))))
}

/// `table` of i64, exact beyond f64's integers.
pub(super) fn i64_table(what: &str, shape: Vec<usize>, f: impl FnMut(usize) -> i64) -> R<Value> {
    let n = budget::check_shape(format_args!("{what} {}", ShapeDisplay(&shape)), &shape, 8)?;
    Ok(Value::computed(Tensor::new(shape, Data::I64((0..n).map(f).collect()))))
}

fn unary(b: &mut Builder, c: &Ctx, op: Op) -> R<Vec<Value>> {
    one(b.node(&c.out, op, &[c.arg(0)?], &[]))
}

fn mean(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let sum = nary_named(b, c, Op::Add, &c.part("sum"))?.remove(0);
    let n = scalar(b.ty(&sum).dtype, c.args.len() as f64);
    one(b.node(&c.out, Op::Div, &[&sum, &n], &[]))
}

fn dropout(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    // Training mode drops at random (unless the ratio is 0): not an identity.
    let training = match c.opt(2) {
        None => false,
        Some(v) => v.as_const().ok_or("training_mode must be known at import time")?.data.iter_f64().any(|x| x != 0.0),
    };
    let ratio_zero = c.opt(1).and_then(Value::as_const).is_some_and(|r| r.data.iter_f64().all(|x| x == 0.0));
    if training && !ratio_zero {
        return Err("training mode (random dropping) is not supported (inference only)".into());
    }
    let x = c.arg(0)?;
    if c.node.output.get(1).is_none_or(|m| m.is_empty()) {
        return Ok(vec![x.clone()]);
    }
    // Nothing is dropped: the mask keeps every element (bool from opset 10, of x's type before).
    let ty = b.ty(x);
    let dtype = if c.opset < 10 { ty.dtype } else { DType::Bool };
    Ok(vec![x.clone(), table("the Dropout mask", dtype, ty.shape, |_| 1.0)?])
}

pub(super) fn softmax(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    one(b.node(&c.out, Op::Softmax, &[c.arg(0)?], &[("axis", Attr::Int(c.int("axis", -1)))]))
}

pub(super) fn log_softmax(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    one(log_softmax_of(b, c, c.arg(0)?, c.int("axis", -1), &c.out))
}

/// `x − max − log(Σ exp(x − max))` along `axis`, named `name`: as onnxruntime computes
/// it, finite where log(softmax(x)) underflows to −inf (`[1000, 0, −1000]` gives
/// `[0, −1000, −2000]`). The steps are named after node `c`'s output.
pub(super) fn log_softmax_of(b: &mut Builder, c: &Ctx, x: &Value, axis: i64, name: &str) -> R<Value> {
    let axis = norm_axis(axis, b.ty(x).shape.len())? as i64;
    let keep = [("axes", Attr::ints(&[axis])), ("keepdims", Attr::Bool(true))];
    let max = b.node(&c.part("max"), Op::ReduceMax, &[x], &keep)?;
    let shifted = b.node(&c.part("shifted"), Op::Sub, &[x, &max], &[])?;
    let e = b.node(&c.part("exp"), Op::Exp, &[&shifted], &[])?;
    let sum = b.node(&c.part("sum"), Op::ReduceSum, &[&e], &keep)?;
    let log_sum = b.node(&c.part("log_sum"), Op::Log, &[&sum], &[])?;
    b.node(name, Op::Sub, &[&shifted, &log_sum], &[])
}

pub(super) fn clip(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let given: Vec<&Value> = (0..3).filter_map(|i| c.opt(i)).collect();
    let (wide, byte) = widen_ints(b, c, &given, true)?;
    let mut bounds = wide[1..].iter();
    let mut x = wide[0].clone();
    for (i, op, what) in [(1, Op::Maximum, "min"), (2, Op::Minimum, "max")] {
        if c.opt(i).is_some() {
            let bound = bounds.next().ok_or("a bound is missing")?;
            let last = (c.opt(2).is_none() || i == 2) && byte.is_none();
            x = b.node(&if last { c.out.clone() } else { c.part(what) }, op, &[&x, bound], &[])?;
        }
    }
    Ok(vec![narrow(b, &x, byte, &c.out)?])
}

fn reshape_op(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let mut target = c.const_ints(1)?;
    if c.int("allowzero", 0) == 0 {
        for (i, d) in target.iter_mut().enumerate().filter(|(_, d)| **d == 0) {
            *d = *shape.get(i).ok_or("a 0 in the shape has no input dim to copy")? as i64;
        }
    }
    one(reshape(b, x, &target, &c.out))
}

fn flatten(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axis = c.int("axis", 1);
    let axis = if axis < 0 { axis + shape.len() as i64 } else { axis };
    if !(0..=shape.len() as i64).contains(&axis) {
        return Err(format!("axis {} is out of range for rank {}", c.int("axis", 1), shape.len()));
    }
    let (lead, rest) = shape.split_at(axis as usize);
    let target = [lead.iter().product::<usize>() as i64, rest.iter().product::<usize>() as i64];
    one(reshape(b, x, &target, &c.out))
}

fn squeeze(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axes = match c.ints_input_or_attr(1, "axes")? {
        Some(a) => a.iter().map(|&a| norm_axis(a, shape.len())).collect::<R<Vec<_>>>()?,
        None => (0..shape.len()).filter(|&i| shape[i] == 1).collect(),
    };
    if let Some(&a) = axes.iter().find(|&&a| shape[a] != 1) {
        return Err(format!("axis {a} has size {}, not 1", shape[a]));
    }
    let target: Vec<i64> = (0..shape.len()).filter(|i| !axes.contains(i)).map(|i| shape[i] as i64).collect();
    one(reshape(b, x, &target, &c.out))
}

fn unsqueeze(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axes = c.ints_input_or_attr(1, "axes")?.ok_or("it needs axes")?;
    let rank = shape.len() + axes.len();
    let axes = axes.iter().map(|&a| norm_axis(a, rank)).collect::<R<Vec<_>>>()?;
    let mut dims = shape.iter();
    let target: Vec<i64> =
        (0..rank).map(|i| if axes.contains(&i) { 1 } else { dims.next().map_or(1, |&d| d as i64) }).collect();
    one(reshape(b, x, &target, &c.out))
}

/// meshc's slice clamps as Python does, ONNX's Slice as Python does too but for one case:
/// with a negative step, a start before −dim is clamped to the first element (ONNX clamps
/// starts to [0, dim − 1] then), where Python's slicing takes nothing. Such a start is
/// written as 0.
pub(super) fn slice(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let mut starts = c.const_ints(1)?;
    let (axes, steps) =
        (c.opt(3).map(|_| c.const_ints(3)).transpose()?, c.opt(4).map(|_| c.const_ints(4)).transpose()?);
    for (k, start) in starts.iter_mut().enumerate() {
        let axis = axes.as_ref().map_or(Some(k as i64), |a| a.get(k).copied());
        let step = steps.as_ref().map_or(Some(1), |s| s.get(k).copied());
        // A bad axis or a missing step is meshc's slice's to refuse.
        let dim = axis.and_then(|a| norm_axis(a, shape.len()).ok()).map(|a| shape[a] as i64);
        if let (Some(dim), Some(step)) = (dim, step) {
            if step < 0 && *start < -dim {
                *start = 0;
            }
        }
    }
    let ends = c.const_ints(2)?;
    let mut attrs = vec![("starts", Attr::ints(&starts)), ("ends", Attr::ints(&ends))];
    let all_axes = axes.clone().unwrap_or_else(|| (0..starts.len() as i64).collect());
    let all_steps = steps.clone().unwrap_or_else(|| vec![1; starts.len()]);
    attrs.extend(axes.map(|a| ("axes", Attr::ints(&a))));
    attrs.extend(steps.map(|s| ("steps", Attr::ints(&s))));
    // An end that is a tensor's size, cutting a dim longer than it (a position table cut to
    // the sequence), is that many positions of the tensor's dim gathered: a cut at the
    // number would hold at the example sizes only.
    let cut = |k: usize| -> Option<(SizeOf, usize)> {
        let size = c.arg(2).ok()?.sizes()?.get(k)?.clone()?;
        let axis = norm_axis(*all_axes.get(k)?, shape.len()).ok()?;
        let plain = c.arg(1).ok()?.sizes().and_then(|s| s.get(k)?.clone()).is_none();
        (plain && starts[k] >= 0 && *all_steps.get(k)? > 0 && ends[k] < shape[axis] as i64).then_some((size, axis))
    };
    let cuts: Vec<(usize, SizeOf, usize)> =
        (0..starts.len().min(ends.len())).filter_map(|k| cut(k).map(|(s, a)| (k, s, a))).collect();
    if cuts.is_empty() {
        return one(b.node(&c.out, Op::Slice, &[x], &attrs));
    }
    let mut x = x.clone();
    for (k, (t, d), axis) in &cuts {
        let idx = positions(b, &c.out, t, *d, starts[*k], all_steps[*k])?;
        x = b.node(&c.out, Op::Gather, &[&x, &idx], &[("axis", Attr::Int(*axis as i64))])?;
    }
    let rest: Vec<usize> = (0..starts.len()).filter(|k| !cuts.iter().any(|c| c.0 == *k)).collect();
    if rest.is_empty() {
        return Ok(vec![x]);
    }
    let pick = |v: &[i64]| rest.iter().map(|&k| v.get(k).copied().unwrap_or(0)).collect::<Vec<i64>>();
    let attrs = [
        ("starts", Attr::ints(&pick(&starts))),
        ("ends", Attr::ints(&pick(&ends))),
        ("axes", Attr::ints(&pick(&all_axes))),
        ("steps", Attr::ints(&pick(&all_steps))),
    ];
    one(b.node(&c.out, Op::Slice, &[&x], &attrs))
}

/// The positions `start, start + step, ...` before the size of dim `d` of tensor `t`, as
/// i64: an iota of that dim, sliced when it does not start at 0 one by one.
fn positions(b: &mut Builder, name: &str, t: &str, d: usize, start: i64, step: i64) -> R<Value> {
    let iota = b.node(name, Op::Iota, &[&Value::Tensor(t.to_string())], &[("axis", Attr::Int(d as i64))])?;
    if (start, step) == (0, 1) {
        return Ok(iota);
    }
    let attrs = [("starts", Attr::ints(&[start])), ("ends", Attr::ints(&[i64::MAX])), ("steps", Attr::ints(&[step]))];
    b.node(name, Op::Slice, &[&iota], &attrs)
}

/// The tensor whose whole shape operand `k` is (`Shape(t)`, element by element, in an
/// import with ranged dims), if it is one: a constant of that shape is a `broadcast_like`
/// of `t`, whose size follows the symbols, where a constant of the numbers would hold at
/// the example sizes only.
fn shape_of(b: &Builder, c: &Ctx, k: usize) -> Option<String> {
    let sizes = c.arg(k).ok()?.sizes()?;
    let (t, _) = sizes.first()?.clone()?;
    let whole = sizes.iter().enumerate().all(|(d, s)| s.as_ref().is_some_and(|(u, e)| *u == t && *e == d));
    (whole && b.ty(&Value::Tensor(t.clone())).shape.len() == sizes.len()).then_some(t)
}

fn expand(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    if let Some(t) = shape_of(b, c, 1) {
        return one(b.node(&c.out, Op::BroadcastLike, &[x, &Value::Tensor(t)], &[]));
    }
    let shape = b.ty(x).shape;
    let want = c.const_ints(1)?;
    let want: Vec<usize> = want
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("shape {want:?} has a negative size")))
        .collect::<R<_>>()?;
    let result = broadcast_shapes(&[&shape, &want])?;
    if result == shape {
        return Ok(vec![x.clone()]);
    }
    let target: Vec<i64> = result.iter().map(|&d| d as i64).collect();
    one(b.node(&c.out, Op::BroadcastTo, &[x], &[("shape", Attr::ints(&target))]))
}

fn constant_of_shape(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let shape = tensors::shape(&c.const_ints(0)?, 8)?;
    let fill = match c.attr("value").and_then(|a| a.t.as_ref()) {
        Some(t) => tensors::tensor(t)?,
        None => Tensor::f32(vec![1], vec![0.0]),
    };
    let v = *fill.data.to_f64().first().ok_or("its value is empty")?;
    if let Some(t) = shape_of(b, c, 0) {
        let one_value = table("the constant", fill.dtype(), vec![], |_| v)?;
        return one(b.node(&c.out, Op::BroadcastLike, &[&one_value, &Value::Tensor(t)], &[]));
    }
    Ok(vec![table("the constant", fill.dtype(), shape, |_| v)?])
}

/// `op` folded over all inputs (the n-ary Max/Min/Sum, and the binary ops). Operands of
/// different dtypes are ONNX's Pow with an integer exponent: it is cast to the base's type.
/// Integer Div is meshc's exact integer div (a zero divisor fails the run, as in onnxruntime).
fn nary(b: &mut Builder, c: &Ctx, op: Op) -> R<Vec<Value>> {
    nary_named(b, c, op, &c.out)
}

/// `nary` with its result named `last` (an op built on it keeps the ONNX name).
fn nary_named(b: &mut Builder, c: &Ctx, op: Op, last: &str) -> R<Vec<Value>> {
    if op == Op::Div {
        no_u64(b, c.arg(0)?, "Div")?;
    }
    // Pow's exponent may be of any type: it is cast to the base's (f32) below.
    let (args, byte) = match op {
        Op::Pow => (c.all_args()?.into_iter().cloned().collect(), None),
        _ => widen_ints(b, c, &c.all_args()?, matches!(op, Op::Maximum | Op::Minimum))?,
    };
    let n = args.len();
    let mut acc = args[0].clone();
    for (i, rhs) in args.iter().enumerate().skip(1) {
        let name = if i + 1 == n && byte.is_none() { last.to_string() } else { c.part(&format!("acc{i}")) };
        let mut rhs = rhs.clone();
        let dtype = b.ty(&acc).dtype;
        if b.ty(&rhs).dtype != dtype && op == Op::Pow {
            rhs = cast(b, &rhs, dtype, &c.part("exponent"))?;
        }
        acc = b.node(&name, op, &[&acc, &rhs], &[])?;
    }
    Ok(vec![narrow(b, &acc, byte, last)?])
}

/// ONNX's arithmetic, comparisons and Clip take the integers meshc stores but does not
/// compute on (`DType::is_stored_int`): their wide type holds the 8- and 16-bit ones' and
/// u32's sums, differences, products and quotients exactly, and a cast back wraps as
/// ONNX's arithmetic does (`127 + 1` is −128 in int8), so the op runs on its operands
/// widened. A u64 in i64 keeps its bits, which is exact for the ops that wrap; for an
/// `ordered` op (a comparison, max, min) its top bit is flipped as well, which orders the
/// i64s as the u64s (0 becomes i64's least, 2^64 − 1 its greatest). Returns the operands
/// and, when input 0 is a storage int, what `narrow` needs to cast the result back.
pub(super) fn widen_ints(b: &mut Builder, c: &Ctx, args: &[&Value], ordered: bool) -> R<(Vec<Value>, Option<Stored>)> {
    // Widened, an int8 operand beside an f32 one would be refused as i32: say what was given.
    let types: Vec<DType> = args.iter().map(|x| b.ty(x).dtype).collect();
    if let Some(k) = types.iter().position(|d| *d != types[0]).filter(|_| types.iter().any(|d| d.is_stored_int())) {
        return Err(format!(
            "operands of different types ({} and {}): ONNX takes one type for them",
            types[0], types[k]
        ));
    }
    let stored = types
        .first()
        .filter(|d| d.is_stored_int())
        .map(|&dtype| Stored { dtype, biased: ordered && dtype == DType::U64 });
    let wide = args
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let dtype = b.ty(x).dtype;
            if !dtype.is_stored_int() {
                return Ok((*x).clone());
            }
            let w = cast(b, x, dtype.wide(), &c.part(&format!("wide{i}")))?;
            match stored.is_some_and(|s| s.biased) {
                true => flip_top_bit(b, &w, &c.part(&format!("ordered{i}"))),
                false => Ok(w),
            }
        })
        .collect::<R<_>>()?;
    Ok((wide, stored))
}

/// A storage int `widen_ints` widened: its type, and whether its top bit was flipped.
#[derive(Clone, Copy)]
pub(super) struct Stored {
    pub dtype: DType,
    biased: bool,
}

/// `x` (i64) with its top bit flipped: a wrapping add of i64's least value.
fn flip_top_bit(b: &mut Builder, x: &Value, name: &str) -> R<Value> {
    b.node(name, Op::Add, &[x, &scalar(DType::I64, i64::MIN as f64)], &[])
}

/// The result `r` of an op on `widen_ints`' operands, cast back to their `stored` type
/// under `name` (or `r` itself when there was none to widen).
pub(super) fn narrow(b: &mut Builder, r: &Value, stored: Option<Stored>, name: &str) -> R<Value> {
    match stored {
        Some(Stored { dtype, biased: true }) => {
            let bits = flip_top_bit(b, r, &format!("{name}_bits"))?;
            cast(b, &bits, dtype, name)
        }
        Some(Stored { dtype, .. }) => cast(b, r, dtype, name),
        None => Ok(r.clone()),
    }
}

/// Refuses a u64 operand for an op whose i64 form differs from the u64 one for values from
/// 2^63 on (a quotient, a remainder, a right shift).
pub(super) fn no_u64(b: &Builder, x: &Value, what: &str) -> R<()> {
    match b.ty(x).dtype {
        DType::U64 => Err(format!("{what} of uint64 is not supported (meshc computes it on int64)")),
        _ => Ok(()),
    }
}

/// `Pow`, by a constant 2 or 3 as products: GPT-2's tanh GELU cubes every activation with
/// `pow(x, 3.0)`, and the general pow (exp of b·ln|a|, with the sign of odd integer
/// powers) made that GELU the prefill's costliest step (57 of 250 ms for GPT-2 small at
/// 128 tokens). x·x·x is within 2 ulp of x³.
fn pow(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?.clone();
    let times = match c.arg(1)?.as_const().map(|t| (t.numel(), t.data.to_f64())) {
        Some((1, v))
            if matches!(b.ty(&x).dtype, DType::F32 | DType::F16 | DType::BF16) && (v[0] == 2.0 || v[0] == 3.0) =>
        {
            v[0] as usize
        }
        _ => return nary(b, c, Op::Pow),
    };
    let name = if times == 2 { c.out.clone() } else { c.part("square") };
    let square = b.node(&name, Op::Mul, &[&x, &x], &[])?;
    match times {
        2 => Ok(vec![square]),
        _ => Ok(vec![b.node(&c.out, Op::Mul, &[&square, &x], &[])?]),
    }
}

pub(super) fn cast(b: &mut Builder, x: &Value, to: DType, name: &str) -> R<Value> {
    if b.ty(x).dtype == to {
        return Ok(x.clone());
    }
    b.node(name, Op::Cast, &[x], &[("to", Attr::Str(to.name().into()))])
}

pub(super) fn reshape(b: &mut Builder, x: &Value, target: &[i64], name: &str) -> R<Value> {
    let shape: Vec<i64> = b.ty(x).shape.iter().map(|&d| d as i64).collect();
    if shape == target {
        return Ok(x.clone());
    }
    b.node(name, Op::Reshape, &[x], &[("shape", Attr::ints(target))])
}

/// `alpha * A' @ B' + beta * C`, with A', B' transposed when asked.
fn gemm(b: &mut Builder, c: &Ctx) -> R<Value> {
    let mut ab = [c.arg(0)?.clone(), c.arg(1)?.clone()];
    for (i, flag) in ["transA", "transB"].iter().enumerate() {
        if c.int(flag, 0) != 0 {
            ab[i] = b.node(&c.part(&format!("{}_t", ["a", "b"][i])), Op::Transpose, &[&ab[i]], &[])?;
        }
    }
    let (alpha, beta) = (c.float("alpha", 1.0), c.float("beta", 1.0));
    let bias = c.opt(2);
    let last = |step: &str| if step == "bias" || bias.is_none() { c.out.clone() } else { c.part(step) };
    let mut y =
        b.node(&if alpha == 1.0 { last("matmul") } else { c.part("matmul") }, Op::MatMul, &[&ab[0], &ab[1]], &[])?;
    if alpha != 1.0 {
        y = b.node(&last("alpha"), Op::Mul, &[&y, &scalar(DType::F32, alpha.into())], &[])?;
    }
    if let Some(bias) = bias {
        let bias = if beta == 1.0 {
            bias.clone()
        } else {
            b.node(&c.part("beta"), Op::Mul, &[bias, &scalar(DType::F32, beta.into())], &[])?
        };
        y = b.node(&c.out, Op::Add, &[&y, &bias], &[])?;
    }
    Ok(y)
}

/// ONNX reductions: `keepdims` defaults to true, and no (or empty) axes mean every axis
/// unless `noop_with_empty_axes`, where meshc's empty list means none. Axes are an input
/// from opset 13 for ReduceSum and from 18 for the others.
fn reduce(b: &mut Builder, c: &Ctx, op_type: &str) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let Some(attrs) = reduce_attrs(c, op_type)? else { return Ok(vec![x.clone()]) };
    let dtype = b.ty(x).dtype;
    let extreme = matches!(op_type, "ReduceMax" | "ReduceMin");
    if extreme {
        // ONNX's max (min) of no elements is the lowest (highest) value of the type, where
        // meshc's reduce_max refuses an empty axis: a constant of the result's shape.
        if let Some(shape) = empty_reduction(&b.ty(x).shape, &attrs)? {
            let max = op_type == "ReduceMax";
            let what = "the reduction of no elements";
            return one(match dtype {
                DType::F32 => table(what, dtype, shape, |_| if max { f64::NEG_INFINITY } else { f64::INFINITY }),
                DType::Bool => table(what, dtype, shape, |_| if max { 0.0 } else { 1.0 }),
                DType::I32 => table(what, dtype, shape, |_| if max { i32::MIN } else { i32::MAX }.into()),
                DType::I64 => i64_table(what, shape, |_| if max { i64::MIN } else { i64::MAX }),
                other => Err(format!("{op_type} of {other} over no elements is not supported")),
            });
        }
        // Of bools, the max is any and the min all: the same on 0/1 as i32.
        if dtype == DType::Bool {
            let ints = cast(b, x, DType::I32, &c.part("int"))?;
            let r = reduce_node(b, c, &ints, op_type, &attrs, &c.part("int_result"))?;
            return one(cast(b, &r, DType::Bool, &c.out));
        }
    }
    one(reduce_node(b, c, x, op_type, &attrs, &c.out))
}

/// The result's shape of a reduction with `attrs` (`reduce_attrs`') of `shape`, when an
/// axis it reduces is empty; `None` when none is.
pub(super) fn empty_reduction(shape: &[usize], attrs: &[(&str, Attr)]) -> R<Option<Vec<usize>>> {
    let keep = attrs.iter().any(|(n, a)| *n == "keepdims" && matches!(a, Attr::Bool(true)));
    let axes: Vec<usize> = match attrs.iter().find(|(n, _)| *n == "axes") {
        Some((_, Attr::List(l))) => l
            .iter()
            .map(|a| match a {
                Attr::Int(i) => norm_axis(*i, shape.len()),
                other => Err(format!("axis {other:?} is not an integer")),
            })
            .collect::<R<_>>()?,
        _ => (0..shape.len()).collect(),
    };
    if !axes.iter().any(|&a| shape[a] == 0) {
        return Ok(None);
    }
    let kept = |(i, &d): (usize, &usize)| if axes.contains(&i) { keep.then_some(1) } else { Some(d) };
    Ok(Some(shape.iter().enumerate().filter_map(kept).collect()))
}

/// Reduction `op_type` of `x` with `attrs`, named `name`.
fn reduce_node(b: &mut Builder, c: &Ctx, x: &Value, op_type: &str, attrs: &[(&str, Attr)], name: &str) -> R<Value> {
    let v = match op_type {
        "ReduceSum" => b.node(name, Op::ReduceSum, &[x], attrs)?,
        "ReduceMean" => b.node(name, Op::ReduceMean, &[x], attrs)?,
        "ReduceMax" => b.node(name, Op::ReduceMax, &[x], attrs)?,
        "ReduceSumSquare" => {
            let sq = b.node(&c.part("square"), Op::Mul, &[x, x], &[])?;
            b.node(name, Op::ReduceSum, &[&sq], attrs)?
        }
        _ => {
            // The min is the max of an order-reversing map: −x for floats, −1 − x for
            // integers (which, unlike −x, cannot overflow at the smallest integer).
            let dtype = b.ty(x).dtype;
            let flip = |b: &mut Builder, v: &Value, name: &str| match dtype {
                DType::F32 => b.node(name, Op::Neg, &[v], &[]),
                _ => b.node(name, Op::Sub, &[&scalar(dtype, -1.0), v], &[]),
            };
            let neg = flip(b, x, &c.part("neg"))?;
            let max = b.node(&c.part("max"), Op::ReduceMax, &[&neg], attrs)?;
            flip(b, &max, name)?
        }
    };
    Ok(v)
}

/// The attributes of a meshc reduction for ONNX reduction `c` (`None`: reduce nothing,
/// with `noop_with_empty_axes` and no axes).
pub(super) fn reduce_attrs(c: &Ctx, op_type: &str) -> R<Option<Vec<(&'static str, Attr)>>> {
    let axes_input = c.opset >= if op_type == "ReduceSum" { 13 } else { 18 };
    let axes = if axes_input { c.opt(1).map(|_| c.const_ints(1)).transpose()? } else { c.ints("axes") };
    let axes = axes.filter(|a| !a.is_empty());
    if axes.is_none() && c.int("noop_with_empty_axes", 0) != 0 {
        return Ok(None);
    }
    let mut attrs = vec![("keepdims", Attr::Bool(c.int("keepdims", 1) != 0))];
    attrs.extend(axes.map(|a| ("axes", Attr::ints(&a))));
    Ok(Some(attrs))
}

/// LayerNormalization's Y, and its Mean and InvStdDev (over the dims from `axis` on, kept
/// as size 1) when asked for; scale and bias broadcast to `x.shape[axis:]` as meshc wants
/// them, a missing bias is zeros.
fn layer_norm(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let y = layer_norm_y(b, c)?;
    let wanted = |i: usize| c.node.output.get(i).is_some_and(|o| !o.is_empty());
    if !wanted(1) && !wanted(2) {
        return Ok(vec![y]);
    }
    let rank = b.ty(x).shape.len();
    let axis = norm_axis(c.int("axis", -1), rank)?;
    let axes: Vec<i64> = (axis as i64..rank as i64).collect();
    let attrs = [("axes", Attr::ints(&axes)), ("keepdims", Attr::Bool(true))];
    let name = |i: usize, step: &str| if wanted(i) { c.node.output[i].clone() } else { c.part(step) };
    let mean = b.node(&name(1, "mean"), Op::ReduceMean, &[x], &attrs)?;
    let d = b.node(&c.part("centred"), Op::Sub, &[x, &mean], &[])?;
    let sq = b.node(&c.part("square"), Op::Mul, &[&d, &d], &[])?;
    let var = b.node(&c.part("var"), Op::ReduceMean, &[&sq], &attrs)?;
    let eps = scalar(DType::F32, c.float("epsilon", 1e-5).into());
    let ve = b.node(&c.part("var_eps"), Op::Add, &[&var, &eps], &[])?;
    let inv = b.node(&name(2, "inv_std_dev"), Op::Rsqrt, &[&ve], &[])?;
    Ok(vec![y, mean, inv])
}

fn layer_norm_y(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axis = norm_axis(c.int("axis", -1), shape.len())?;
    let norm: Vec<i64> = shape[axis..].iter().map(|&d| d as i64).collect();
    let zeros = Value::computed(Tensor::new(vec![], Data::F32(vec![0.0])));
    let mut gb = [c.arg(1)?.clone(), c.opt(2).cloned().unwrap_or(zeros)];
    for (i, what) in ["scale", "bias"].iter().enumerate() {
        if b.ty(&gb[i]).shape != shape[axis..] {
            gb[i] = b.node(&c.part(what), Op::BroadcastTo, &[&gb[i]], &[("shape", Attr::ints(&norm))])?;
        }
    }
    let attrs = [("axis", Attr::Int(axis as i64)), ("eps", Attr::Float(c.float("epsilon", 1e-5).into()))];
    b.node(&c.out, Op::LayerNorm, &[x, &gb[0], &gb[1]], &attrs)
}

/// Split into slices: sizes from the `split` input (opset 13) or attribute, else equal
/// parts, one per output (the last smaller with `num_outputs`, opset 18).
fn split(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axis = norm_axis(c.int("axis", 0), shape.len())?;
    let n = c.node.output.len().max(1);
    let sizes = match c.ints_input_or_attr(1, "split")? {
        Some(s) => s,
        None => {
            let part = shape[axis].div_ceil(n) as i64;
            (0..n as i64).map(|i| part.min(shape[axis] as i64 - i * part).max(0)).collect()
        }
    };
    if sizes.len() != n || sizes.iter().sum::<i64>() != shape[axis] as i64 {
        return Err(format!("split sizes {sizes:?} do not cut an axis of {} into {n} outputs", shape[axis]));
    }
    let mut start = 0;
    let mut outs = Vec::new();
    for (size, name) in sizes.iter().zip(&c.node.output) {
        let attrs = [
            ("starts", Attr::ints(&[start])),
            ("ends", Attr::ints(&[start + size])),
            ("axes", Attr::ints(&[axis as i64])),
        ];
        outs.push(b.node(if name.is_empty() { &c.out } else { name }, Op::Slice, &[x], &attrs)?);
        start += size;
    }
    Ok(outs)
}

/// Range of scalar constants: `max(ceil((limit - start) / delta), 0)` elements. A limit
/// that is a tensor's size, with a whole start from 0 and a whole step from 1, is positions
/// of the tensor's dim (`positions`), cast to the range's type.
fn range(b: &mut Builder, c: &Ctx) -> R<Value> {
    let scalar = |i: usize| -> R<Tensor> {
        let t = c.arg(i)?.as_const().ok_or_else(|| format!("input {i} must be known at import time"))?;
        if t.numel() != 1 {
            return Err(format!("input {i} must be a scalar"));
        }
        Ok(t.clone())
    };
    let (start, limit, delta) = (scalar(0)?, scalar(1)?, scalar(2)?);
    let dtype = start.dtype();
    let [s, l, d] = [&start, &limit, &delta].map(|t| t.data.to_f64()[0]);
    if d == 0.0 {
        return Err("delta is 0".into());
    }
    let plain = |i: usize| c.arg(i).ok().and_then(Value::sizes).is_none();
    let whole = |v: f64| v.fract() == 0.0 && (0.0..=i64::MAX as f64).contains(&v);
    if let Some(Some((t, dim))) = c.arg(1)?.sizes().map(|s| s[0].clone()) {
        if plain(0) && plain(2) && whole(s) && whole(d) && d >= 1.0 {
            let at = positions(b, &c.out, &t, dim, s as i64, d as i64)?;
            return match dtype {
                DType::I64 => Ok(at),
                _ => b.node(&c.out, Op::Cast, &[&at], &[("to", Attr::Str(dtype.name().into()))]),
            };
        }
    }
    let n = ((l - s) / d).ceil().max(0.0);
    if n.is_nan() || n > budget::CEILING as f64 {
        return Err(format!("start {s}, limit {l} and delta {d} give {n} elements"));
    }
    table("the range", dtype, vec![n as usize], |i| s + i as f64 * d)
}

/// A Constant node's value, from whichever of its attributes is given.
fn constant(c: &Ctx) -> R<Tensor> {
    if let Some(t) = c.attr("value").and_then(|a| a.t.as_ref()) {
        return tensors::tensor(t);
    }
    if let Some(a) = c.attr("value_float").and_then(|a| a.f) {
        return Ok(Tensor::f32(vec![], vec![a]));
    }
    if let Some(a) = c.attr("value_int").and_then(|a| a.i) {
        return Ok(Tensor::new(vec![], Data::I64(vec![a])));
    }
    if let Some(a) = c.attr("value_floats") {
        return Ok(Tensor::f32(vec![a.floats.len()], a.floats.clone()));
    }
    if let Some(a) = c.attr("value_ints") {
        return Ok(Tensor::new(vec![a.ints.len()], Data::I64(a.ints.clone())));
    }
    Err("only tensor, float and int values are supported".into())
}
