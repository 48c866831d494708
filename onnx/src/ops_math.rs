//! ONNX comparison, logic and rounding ops onto meshc's ops of the same name, and
//! the ONNX ops meshc spells as a few of its own (docs/onnx.md): activations from
//! arithmetic, `where` and comparisons; ReduceL1/L2/LogSum/LogSumExp from sums; ArgMax,
//! ArgMin and Hardmax from a max, an equality and an index constant; Trilu and EyeLike
//! from constant masks; CumSum as the IR's cumsum; RMS, Lp and mean-variance normalisation. Each decomposition
//! computes what ONNX's reference does, with the same formula where precision could differ.

use meshc_ir::budget;
use meshc_ir::infer::norm_axis;
use meshc_ir::{Attr, DType, Op};

use super::builder::{Builder, Value};
use super::ops::{
    cast, empty_reduction, i64_table, log_softmax_of, narrow, one, reduce_attrs, reshape, scalar, table, widen_ints,
    Converter, Ctx,
};
use super::tensors;

type R<T> = std::result::Result<T, String>;

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(7, "Equal", |b, c| compare(b, c, Op::Equal)),
    Converter::since(7, "Less", |b, c| compare(b, c, Op::Less)),
    Converter::since(12, "LessOrEqual", |b, c| compare(b, c, Op::LessEqual)),
    Converter::since(7, "Greater", |b, c| compare(b, c, Op::Greater)),
    Converter::since(12, "GreaterOrEqual", |b, c| compare(b, c, Op::GreaterEqual)),
    Converter::since(7, "And", |b, c| compare(b, c, Op::And)),
    Converter::since(7, "Or", |b, c| compare(b, c, Op::Or)),
    Converter::since(7, "Xor", |b, c| compare(b, c, Op::Xor)),
    Converter::since(1, "Not", |b, c| on_x(b, c, |s, x| s.op0("", Op::Not, &[x]))),
    Converter::since(6, "Floor", |b, c| on_x(b, c, |s, x| s.op0("", Op::Floor, &[x]))),
    Converter::since(6, "Ceil", |b, c| on_x(b, c, |s, x| s.op0("", Op::Ceil, &[x]))),
    Converter::since(11, "Round", |b, c| on_x(b, c, |s, x| s.op0("", Op::Round, &[x]))),
    Converter::new("CastLike", |b, c| on_x(b, c, cast_like)),
    Converter::since(9, "Sign", |b, c| on_x(b, c, sign)),
    Converter::since(9, "IsNaN", |b, c| {
        on_x(b, c, |s, x| {
            let same = s.op0("same", Op::Equal, &[x, x])?;
            s.op0("", Op::Not, &[&same])
        })
    }),
    Converter::since(10, "IsInf", |b, c| on_x(b, c, is_inf)),
    Converter::since(1, "Softplus", |b, c| activation(b, c, |s, x| softplus(s, x, ""))),
    Converter::since(6, "LeakyRelu", |b, c| activation(b, c, leaky_relu)),
    Converter::since(7, "PRelu", |b, c| activation(b, c, leaky_relu)),
    Converter::since(6, "Elu", |b, c| activation(b, c, elu)),
    Converter::since(6, "Selu", |b, c| activation(b, c, selu)),
    Converter::since(12, "Celu", |b, c| activation(b, c, celu)),
    Converter::since(6, "HardSigmoid", |b, c| activation(b, c, hard_sigmoid)),
    Converter::new("HardSwish", |b, c| activation(b, c, hard_sigmoid)),
    Converter::new("Swish", |b, c| activation(b, c, swish)),
    Converter::new("SwiGLU", |b, c| activation(b, c, swiglu)),
    Converter::new("Mish", |b, c| activation(b, c, mish)),
    Converter::since(1, "Softsign", |b, c| activation(b, c, |s, x| softsign(s, x, ""))),
    Converter::since(10, "ThresholdedRelu", |b, c| activation(b, c, thresholded_relu)),
    Converter::since(9, "Shrink", |b, c| activation(b, c, shrink)),
    Converter::since(1, "ReduceL1", |b, c| on_x(b, c, |s, x| reduce(s, "ReduceL1", x))),
    Converter::since(1, "ReduceL2", |b, c| on_x(b, c, |s, x| reduce(s, "ReduceL2", x))),
    Converter::since(1, "ReduceLogSum", |b, c| on_x(b, c, |s, x| reduce(s, "ReduceLogSum", x))),
    Converter::since(1, "ReduceLogSumExp", |b, c| on_x(b, c, |s, x| reduce(s, "ReduceLogSumExp", x))),
    Converter::since(1, "ArgMax", |b, c| on_x(b, c, |s, x| arg_extreme(s, false, x))),
    Converter::since(1, "ArgMin", |b, c| on_x(b, c, |s, x| arg_extreme(s, true, x))),
    Converter::since(10, "TopK", |b, c| top_k(&mut Steps { b, c })),
    // Before 13 (ops_legacy), Hardmax sees its input as a matrix.
    Converter::new("Hardmax", hardmax),
    Converter::new("Trilu", |b, c| on_x(b, c, trilu)),
    Converter::since(9, "EyeLike", |b, c| on_x(b, c, eye_like)),
    Converter::since(11, "CumSum", |b, c| on_x(b, c, cumsum)),
    Converter::new("CumProd", |b, c| on_x(b, c, cumprod)),
    Converter::new("RMSNormalization", |b, c| on_x(b, c, |s, x| normalisation(s, "RMSNormalization", x))),
    Converter::since(1, "LpNormalization", |b, c| on_x(b, c, |s, x| normalisation(s, "LpNormalization", x))),
    Converter::since(9, "MeanVarianceNormalization", |b, c| {
        on_x(b, c, |s, x| normalisation(s, "MeanVarianceNormalization", x))
    }),
    Converter::since(12, "NegativeLogLikelihoodLoss", |b, c| loss(&mut Steps { b, c }, false)),
    Converter::since(12, "SoftmaxCrossEntropyLoss", |b, c| loss(&mut Steps { b, c }, true)),
];

/// Emits the nodes of one decomposition: every step is named after the ONNX output
/// (`out.step`), the last one after the output itself.
pub(super) struct Steps<'b, 'c, 'n> {
    pub b: &'b mut Builder,
    pub c: &'c Ctx<'n>,
}

impl Steps<'_, '_, '_> {
    pub fn op(&mut self, step: &str, op: Op, args: &[&Value], attrs: &[(&str, Attr)]) -> R<Value> {
        let name = if step.is_empty() { self.c.out.clone() } else { self.c.part(step) };
        self.b.node(&name, op, args, attrs)
    }

    pub fn op0(&mut self, step: &str, op: Op, args: &[&Value]) -> R<Value> {
        self.op(step, op, args, &[])
    }

    /// A scalar of `like`'s dtype.
    pub fn k(&self, like: &Value, v: f64) -> Value {
        scalar(self.b.ty(like).dtype, v)
    }

    fn float(&self, name: &str, default: f32) -> f64 {
        self.c.float(name, default).into()
    }

    pub fn op_type(&self) -> &str {
        self.c.node.op_type.as_deref().unwrap_or("")
    }
}

pub(super) fn float_only(b: &Builder, x: &Value, what: &str) -> R<()> {
    match b.ty(x).dtype {
        DType::F32 => Ok(()),
        other => Err(format!("{what} of {other} is not supported (f32, or a half widened to f32)")),
    }
}

/// A decomposition of input 0 (every op of this module reads one) into the node's output.
fn on_x(b: &mut Builder, c: &Ctx, f: impl FnOnce(&mut Steps, &Value) -> R<Value>) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    one(f(&mut Steps { b, c }, x))
}

/// A comparison or logic op; the storage ints are compared on their values widened
/// (`widen_ints`; And, Or and Xor take bools only).
fn compare(b: &mut Builder, c: &Ctx, op: Op) -> R<Vec<Value>> {
    let (args, _) = widen_ints(b, c, &[c.arg(0)?, c.arg(1)?], true)?;
    one(b.node(&c.out, op, &[&args[0], &args[1]], &[]))
}

/// An activation of f32 (ONNX's formula, attribute defaults included).
fn activation(b: &mut Builder, c: &Ctx, f: fn(&mut Steps, &Value) -> R<Value>) -> R<Vec<Value>> {
    on_x(b, c, |s, x| {
        float_only(s.b, x, s.c.node.op_type.as_deref().unwrap_or(""))?;
        f(s, x)
    })
}

fn cast_like(s: &mut Steps, x: &Value) -> R<Value> {
    // A half input is widened on entry: its type is still the half.
    let like = s.c.arg(1)?;
    let to = s.b.half_origin(like).unwrap_or(s.b.ty(like).dtype);
    cast(s.b, x, to, &s.c.out)
}

/// x itself where it is neither positive nor negative: 0 stays 0, NaN stays NaN.
fn sign(s: &mut Steps, x: &Value) -> R<Value> {
    let (zero, one, minus) = (s.k(x, 0.0), s.k(x, 1.0), s.k(x, -1.0));
    let pos = s.op0("pos", Op::Greater, &[x, &zero])?;
    let neg = s.op0("neg", Op::Less, &[x, &zero])?;
    let m = s.op0("minus", Op::Where, &[&neg, &minus, x])?;
    s.op0("", Op::Where, &[&pos, &one, &m])
}

fn is_inf(s: &mut Steps, x: &Value) -> R<Value> {
    float_only(s.b, x, "IsInf")?;
    let (pos, neg) = (s.c.int("detect_positive", 1) != 0, s.c.int("detect_negative", 1) != 0);
    let mut hits = Vec::new();
    for (on, v, what) in [(pos, f64::INFINITY, "pos"), (neg, f64::NEG_INFINITY, "neg")] {
        if on {
            let inf = s.k(x, v);
            hits.push(s.op0(what, Op::Equal, &[x, &inf])?);
        }
    }
    match hits.as_slice() {
        [] => table("the result", DType::Bool, s.b.ty(x).shape, |_| 0.0),
        [h] => Ok(h.clone()),
        [p, n, ..] => s.op0("", Op::Or, &[p, n]),
    }
}

/// The name of part `what` of a decomposition whose parts are named after `at` (the node's
/// output when empty): the activations of recurrent layers (ops_rnn) are these formulas too.
fn part_of(at: &str, what: &str) -> String {
    if at.is_empty() {
        what.to_string()
    } else {
        format!("{at}.{what}")
    }
}

/// LeakyRelu, and PRelu with its slope as input 1.
fn leaky_relu(s: &mut Steps, x: &Value) -> R<Value> {
    let slope = if s.op_type() == "PRelu" { s.c.arg(1)?.clone() } else { s.k(x, s.float("alpha", 0.01)) };
    leaky_relu_of(s, x, &slope, "")
}

pub(super) fn leaky_relu_of(s: &mut Steps, x: &Value, slope: &Value, step: &str) -> R<Value> {
    let neg = s.op0(&part_of(step, "neg"), Op::Less, &[x, &s.k(x, 0.0)])?;
    let scaled = s.op0(&part_of(step, "scaled"), Op::Mul, &[slope, x])?;
    s.op0(step, Op::Where, &[&neg, &scaled, x])
}

fn elu(s: &mut Steps, x: &Value) -> R<Value> {
    let alpha = s.k(x, s.float("alpha", 1.0));
    elu_of(s, x, &alpha, "")
}

pub(super) fn elu_of(s: &mut Steps, x: &Value, alpha: &Value, step: &str) -> R<Value> {
    let neg = s.op0(&part_of(step, "neg"), Op::Less, &[x, &s.k(x, 0.0)])?;
    let e = s.op0(&part_of(step, "exp"), Op::Exp, &[x])?;
    let em1 = s.op0(&part_of(step, "expm1"), Op::Sub, &[&e, &s.k(x, 1.0)])?;
    let scaled = s.op0(&part_of(step, "scaled"), Op::Mul, &[alpha, &em1])?;
    s.op0(step, Op::Where, &[&neg, &scaled, x])
}

fn selu(s: &mut Steps, x: &Value) -> R<Value> {
    let (alpha, gamma) = (s.float("alpha", 1.673_263_2), s.float("gamma", 1.050_701));
    let (alpha, gamma) = (s.k(x, alpha), s.k(x, gamma));
    let le = s.op0("le0", Op::LessEqual, &[x, &s.k(x, 0.0)])?;
    let e = s.op0("exp", Op::Exp, &[x])?;
    let ae = s.op0("alpha_exp", Op::Mul, &[&alpha, &e])?;
    let neg = s.op0("negative", Op::Sub, &[&ae, &alpha])?;
    let w = s.op0("select", Op::Where, &[&le, &neg, x])?;
    s.op0("", Op::Mul, &[&gamma, &w])
}

fn celu(s: &mut Steps, x: &Value) -> R<Value> {
    let (alpha, zero) = (s.k(x, s.float("alpha", 1.0)), s.k(x, 0.0));
    let pos = s.op0("pos", Op::Maximum, &[x, &zero])?;
    let d = s.op0("scaled", Op::Div, &[x, &alpha])?;
    let e = s.op0("exp", Op::Exp, &[&d])?;
    let em1 = s.op0("expm1", Op::Sub, &[&e, &s.k(x, 1.0)])?;
    let a = s.op0("alpha_expm1", Op::Mul, &[&alpha, &em1])?;
    let neg = s.op0("neg", Op::Minimum, &[&a, &zero])?;
    s.op0("", Op::Add, &[&pos, &neg])
}

/// HardSigmoid, and HardSwish: x times the hard sigmoid of alpha 1/6 and beta 0.5.
fn hard_sigmoid(s: &mut Steps, x: &Value) -> R<Value> {
    let swish = s.op_type() == "HardSwish";
    let (alpha, beta) = if swish { (1.0 / 6.0, 0.5) } else { (s.float("alpha", 0.2), s.float("beta", 0.5)) };
    if !swish {
        return hard_sigmoid_of(s, x, alpha, beta, "", "");
    }
    let hs = hard_sigmoid_of(s, x, alpha, beta, "", "hard_sigmoid")?;
    s.op0("", Op::Mul, &[x, &hs])
}

/// max(min(alpha·x + beta, 1), 0) named `step`, its parts after `at`.
pub(super) fn hard_sigmoid_of(s: &mut Steps, x: &Value, alpha: f64, beta: f64, at: &str, step: &str) -> R<Value> {
    let (alpha, beta) = (s.k(x, alpha), s.k(x, beta));
    let ax = s.op0(&part_of(at, "ax"), Op::Mul, &[&alpha, x])?;
    let lin = s.op0(&part_of(at, "linear"), Op::Add, &[&ax, &beta])?;
    let lo = s.op0(&part_of(at, "upper"), Op::Minimum, &[&lin, &s.k(x, 1.0)])?;
    s.op0(step, Op::Maximum, &[&lo, &s.k(x, 0.0)])
}

fn swish(s: &mut Steps, x: &Value) -> R<Value> {
    let alpha = s.k(x, s.float("alpha", 1.0));
    let ax = s.op0("ax", Op::Mul, &[&alpha, x])?;
    let sg = s.op0("sigmoid", Op::Sigmoid, &[&ax])?;
    s.op0("", Op::Mul, &[x, &sg])
}

/// Swish of the gate x times the value, both of one shape (ONNX's SwiGLU does not broadcast).
fn swiglu(s: &mut Steps, x: &Value) -> R<Value> {
    let v = s.c.arg(1)?;
    let (xs, vs) = (s.b.ty(x).shape, s.b.ty(v).shape);
    if xs != vs {
        return Err(format!("A of shape {xs:?} and B of shape {vs:?} differ (SwiGLU does not broadcast)"));
    }
    let alpha = s.k(x, s.float("alpha", 1.0));
    let ax = s.op0("ax", Op::Mul, &[&alpha, x])?;
    let sg = s.op0("sigmoid", Op::Sigmoid, &[&ax])?;
    let sw = s.op0("swish", Op::Mul, &[x, &sg])?;
    s.op0("", Op::Mul, &[&sw, v])
}

fn mish(s: &mut Steps, x: &Value) -> R<Value> {
    let sp = softplus(s, x, "softplus")?;
    let t = s.op0("tanh", Op::Tanh, &[&sp])?;
    s.op0("", Op::Mul, &[x, &t])
}

pub(super) fn softsign(s: &mut Steps, x: &Value, step: &str) -> R<Value> {
    let a = s.op0(&part_of(step, "abs"), Op::Abs, &[x])?;
    let d = s.op0(&part_of(step, "denominator"), Op::Add, &[&s.k(x, 1.0), &a])?;
    s.op0(step, Op::Div, &[x, &d])
}

fn thresholded_relu(s: &mut Steps, x: &Value) -> R<Value> {
    let alpha = s.k(x, s.float("alpha", 1.0));
    thresholded_relu_of(s, x, &alpha, "")
}

pub(super) fn thresholded_relu_of(s: &mut Steps, x: &Value, alpha: &Value, step: &str) -> R<Value> {
    let over = s.op0(&part_of(step, "over"), Op::Greater, &[x, alpha])?;
    s.op0(step, Op::Where, &[&over, x, &s.k(x, 0.0)])
}

/// x + bias below −lambd, x − bias above lambd, 0 between.
fn shrink(s: &mut Steps, x: &Value) -> R<Value> {
    let (lambd, bias) = (s.float("lambd", 0.5), s.float("bias", 0.0));
    let (lo, hi, bias) = (s.k(x, -lambd), s.k(x, lambd), s.k(x, bias));
    let below = s.op0("below", Op::Less, &[x, &lo])?;
    let above = s.op0("above", Op::Greater, &[x, &hi])?;
    let up = s.op0("plus_bias", Op::Add, &[x, &bias])?;
    let down = s.op0("minus_bias", Op::Sub, &[x, &bias])?;
    let mid = s.op0("upper", Op::Where, &[&above, &down, &s.k(x, 0.0)])?;
    s.op0("", Op::Where, &[&below, &up, &mid])
}

/// ln(exp(x) + 1), ONNX's formula, as onnxruntime computes it: max(x, 0) + log1p(exp(−|x|)).
/// The exp of a non-positive number cannot overflow (the formula as written is inf above
/// ~88, where softplus is x), and log1p(u) is Goldberg's `u · log(w) / (w − 1)` with
/// `w = 1 + u`, exact to a few ulps, or u itself where w rounds to 1 (so a large negative
/// x gives exp(x), not 0).
pub(super) fn softplus(s: &mut Steps, x: &Value, step: &str) -> R<Value> {
    let name = |what: &str| part_of(step, what);
    let (zero, one) = (s.k(x, 0.0), s.k(x, 1.0));
    let pos = s.op0(&name("pos"), Op::Maximum, &[x, &zero])?;
    let a = s.op0(&name("abs"), Op::Abs, &[x])?;
    let na = s.op0(&name("neg_abs"), Op::Neg, &[&a])?;
    let u = s.op0(&name("exp"), Op::Exp, &[&na])?;
    let w = s.op0(&name("one_plus"), Op::Add, &[&one, &u])?;
    let l = s.op0(&name("log"), Op::Log, &[&w])?;
    let wm1 = s.op0(&name("rounded"), Op::Sub, &[&w, &one])?;
    let q = s.op0(&name("ratio"), Op::Div, &[&u, &wm1])?;
    let lq = s.op0(&name("log1p_of"), Op::Mul, &[&l, &q])?;
    let tiny = s.op0(&name("tiny"), Op::Equal, &[&w, &one])?;
    let log1p = s.op0(&name("log1p"), Op::Where, &[&tiny, &u, &lq])?;
    s.op0(step, Op::Add, &[&pos, &log1p])
}

/// Sums of |x|, x², x, exp(x) (the last shifted by the max, so it cannot overflow), then
/// the root or log. With `noop_with_empty_axes` and no axes, the input as it is.
fn reduce(s: &mut Steps, op_type: &str, x: &Value) -> R<Value> {
    let Some(attrs) = reduce_attrs(s.c, op_type)? else { return Ok(x.clone()) };
    float_only(s.b, x, op_type)?;
    match op_type {
        "ReduceL1" => {
            let a = s.op0("abs", Op::Abs, &[x])?;
            s.op("", Op::ReduceSum, &[&a], &attrs)
        }
        "ReduceL2" => {
            let sq = s.op0("square", Op::Mul, &[x, x])?;
            let sum = s.op("sum", Op::ReduceSum, &[&sq], &attrs)?;
            s.op0("", Op::Sqrt, &[&sum])
        }
        "ReduceLogSum" => {
            let sum = s.op("sum", Op::ReduceSum, &[x], &attrs)?;
            s.op0("", Op::Log, &[&sum])
        }
        _ => {
            // The log of an empty sum, as ReduceLogSum gives it (the max has no identity).
            if let Some(shape) = empty_reduction(&s.b.ty(x).shape, &attrs)? {
                return table("the reduction of no elements", DType::F32, shape, |_| f64::NEG_INFINITY);
            }
            let keep: Vec<(&str, Attr)> = attrs
                .iter()
                .map(|(k, v)| if *k == "keepdims" { (*k, Attr::Bool(true)) } else { (*k, v.clone()) })
                .collect();
            let m = s.op("max", Op::ReduceMax, &[x], &keep)?;
            // An infinite max (all −inf, or a +inf) would make x − max NaN: shift by 0 then.
            let finite = finite_or_zero(s, &m)?;
            let d = s.op0("shifted", Op::Sub, &[x, &finite])?;
            let e = s.op0("exp", Op::Exp, &[&d])?;
            let sum = s.op("sum", Op::ReduceSum, &[&e], &attrs)?;
            let l = s.op0("log", Op::Log, &[&sum])?;
            let shape: Vec<i64> = s.b.ty(&l).shape.iter().map(|&d| d as i64).collect();
            let shift = reshape(s.b, &finite, &shape, &s.c.part("max_shape"))?;
            s.op0("", Op::Add, &[&l, &shift])
        }
    }
}

/// `m` where it is finite, else 0.
fn finite_or_zero(s: &mut Steps, m: &Value) -> R<Value> {
    let a = s.op0("max_abs", Op::Abs, &[m])?;
    let inf = s.k(m, f64::INFINITY);
    let fin = s.op0("max_finite", Op::Less, &[&a, &inf])?;
    let zero = s.k(m, 0.0);
    s.op0("max_shift", Op::Where, &[&fin, m, &zero])
}

/// `0, 1, …, n−1` along `axis` of a rank-`rank` tensor (size 1 elsewhere), i64.
fn iota(n: usize, axis: usize, rank: usize, reverse: bool) -> R<Value> {
    let mut shape = vec![1; rank];
    shape[axis] = n;
    i64_table("the index range", shape, |i| if reverse { (n - 1 - i) as i64 } else { i as i64 })
}

/// The axis attribute of `s`'s node against `x`'s rank.
fn axis_of(s: &Steps, x: &Value, default: i64) -> R<(usize, Vec<usize>)> {
    let shape = s.b.ty(x).shape;
    Ok((norm_axis(s.c.int("axis", default), shape.len())?, shape))
}

/// The first (or with `select_last_index` the last) index of the max (min) along `axis`, i64.
/// A max over values holding NaN is NaN and NaN equals nothing: the NaNs are the hits then,
/// as numpy's argmax returns the first NaN. A min of integers is taken as the max of
/// −1 − x, which (unlike −x) cannot overflow.
fn arg_extreme(s: &mut Steps, min: bool, x: &Value) -> R<Value> {
    let (axis, shape) = axis_of(s, x, 0)?;
    let float = s.b.ty(x).dtype == DType::F32;
    let v = match (min, float) {
        (false, _) => x.clone(),
        (true, true) => s.op0("neg", Op::Neg, &[x])?,
        (true, false) => {
            let m1 = s.k(x, -1.0);
            s.op0("flipped", Op::Sub, &[&m1, x])?
        }
    };
    let hit = hits_of_max(s, &v, axis, float)?;
    let last = s.c.int("select_last_index", 0) != 0;
    let idx = iota(shape[axis], axis, shape.len(), !last)?;
    let none = scalar(DType::I64, -1.0);
    let cand = s.op0("candidates", Op::Where, &[&hit, &idx, &none])?;
    let keepdims = s.c.int("keepdims", 1) != 0;
    let attrs = [("axes", Attr::ints(&[axis as i64])), ("keepdims", Attr::Bool(keepdims))];
    if last {
        return s.op("", Op::ReduceMax, &[&cand], &attrs);
    }
    let r = s.op("reversed", Op::ReduceMax, &[&cand], &attrs)?;
    let top = scalar(DType::I64, shape[axis] as f64 - 1.0);
    s.op0("", Op::Sub, &[&top, &r])
}

/// TopK by ranks, which need no sort: along the axis (moved last), element j's rank is the
/// number of elements that precede it — greater (smaller with `largest` 0), or equal at a
/// lower index, NaN counting as greater than any number (numpy's order, which ONNX's
/// reference sorts by) — so the ranks are a permutation, and the r-th output is the one
/// element of rank r: its index the sum of j where the rank is r, its value the max of x
/// there (every other position filled with the type's lowest value). The comparison of
/// every pair costs n² per row, checked against the memory budget; `sorted` 0 leaves the
/// order open, and these are sorted. K must be known at import time.
fn top_k(s: &mut Steps) -> R<Vec<Value>> {
    let x = s.c.arg(0)?;
    let (axis, shape) = axis_of(s, x, -1)?;
    let (wide, byte) = widen_ints(s.b, s.c, &[x], true)?;
    let x = &wide[0];
    let dtype = s.b.ty(x).dtype;
    let float = dtype == DType::F32;
    if !float && !dtype.is_int() {
        return Err(format!("TopK of {dtype} is not supported (f32 and the integers)"));
    }
    let n = shape[axis];
    let k = match s.c.const_ints(1)?.as_slice() {
        [k] if (0..=n as i64).contains(k) => *k as usize,
        other => return Err(format!("K {other:?} is not one count in 0..={n}")),
    };
    let rank = shape.len();
    let mut pairs = shape.clone();
    pairs[axis] = n;
    pairs.push(n);
    budget::check_shape("TopK's comparison of every pair", &pairs, 8)?;
    // The axis last: `[rest..., n]`.
    let mut perm: Vec<i64> = (0..rank as i64).filter(|&d| d != axis as i64).collect();
    perm.push(axis as i64);
    let last = s.op("axis_last", Op::Transpose, &[x], &[("perm", Attr::ints(&perm))])?;
    let lead: Vec<i64> = perm[..rank - 1].iter().map(|&d| shape[d as usize] as i64).collect();
    let view = |s: &mut Steps, v: &Value, tail: [i64; 2], what: &str| {
        let mut to = lead.clone();
        to.extend(tail);
        reshape(s.b, v, &to, &s.c.part(what))
    };
    let n_ = n as i64;
    let a = view(s, &last, [n_, 1], "element")?;
    let b = view(s, &last, [1, n_], "other")?;
    let largest = s.c.int("largest", 1) != 0;
    let ahead = s.op0("ahead", if largest { Op::Greater } else { Op::Less }, &[&b, &a])?;
    let equal = s.op0("equal", Op::Equal, &[&b, &a])?;
    let (ahead, equal) = if float {
        let nan = |s: &mut Steps, v: &Value, what: &str| {
            let same = s.op0(&format!("{what}_same"), Op::Equal, &[v, v])?;
            s.op0(&format!("{what}_nan"), Op::Not, &[&same])
        };
        let (a_nan, b_nan) = (nan(s, &a, "element")?, nan(s, &b, "other")?);
        let (hi, lo) = if largest { (&b_nan, &a_nan) } else { (&a_nan, &b_nan) };
        let not_lo = s.op0("not_nan_behind", Op::Not, &[lo])?;
        let nan_ahead = s.op0("nan_ahead", Op::And, &[hi, &not_lo])?;
        let both = s.op0("both_nan", Op::And, &[&a_nan, &b_nan])?;
        (s.op0("ahead_or_nan", Op::Or, &[&ahead, &nan_ahead])?, s.op0("equal_or_nan", Op::Or, &[&equal, &both])?)
    } else {
        (ahead, equal)
    };
    let before = table("the lower indices", DType::Bool, vec![n, n], |e| f64::from(u8::from(e % n < e / n)))?;
    let tie = s.op0("tie_before", Op::And, &[&equal, &before])?;
    let precedes = s.op0("precedes", Op::Or, &[&ahead, &tie])?;
    let count = cast(s.b, &precedes, DType::I64, &s.c.part("precedes_count"))?;
    let sum = [("axes", Attr::ints(&[-1])), ("keepdims", Attr::Bool(false))];
    let ranks = s.op("rank", Op::ReduceSum, &[&count], &sum)?;
    let ranks = view(s, &ranks, [1, n_], "rank_row")?;
    let r = i64_table("the ranks kept", vec![k, 1], |i| i as i64)?;
    let at = s.op0("at_rank", Op::Equal, &[&ranks, &r])?;
    let j = i64_table("the index range", vec![n], |i| i as i64)?;
    let picked = s.op0("picked_index", Op::Where, &[&at, &j, &scalar(DType::I64, 0.0)])?;
    let idx = s.op("indices_last", Op::ReduceSum, &[&picked], &sum)?;
    let lowest = dtype.int_range().map_or(f64::NEG_INFINITY, |(lo, _)| lo);
    let picked = s.op0("picked_value", Op::Where, &[&at, &b, &scalar(dtype, lowest)])?;
    let vals = s.op("values_last", Op::ReduceMax, &[&picked], &sum)?;
    // Back from `[rest..., k]`: the axis to its place.
    let mut back = vec![0i64; rank];
    for (i, &d) in perm.iter().enumerate() {
        back[d as usize] = i as i64;
    }
    let back = [("perm", Attr::ints(&back))];
    let name = |i: usize, what: &str| match s.c.node.output.get(i).filter(|o| !o.is_empty()) {
        Some(o) => o.clone(),
        None => s.c.part(what),
    };
    let (values, indices) = (name(0, "values"), name(1, "indices"));
    let wide_values = if byte.is_some() { s.c.part("wide_values") } else { values.clone() };
    let vals = s.b.node(&wide_values, Op::Transpose, &[&vals], &back)?;
    let vals = narrow(s.b, &vals, byte, &values)?;
    Ok(vec![vals, s.b.node(&indices, Op::Transpose, &[&idx], &back)?])
}

/// Where `v` equals its max along `axis` (or is NaN, for floats), as bools.
fn hits_of_max(s: &mut Steps, v: &Value, axis: usize, float: bool) -> R<Value> {
    let attrs = [("axes", Attr::ints(&[axis as i64])), ("keepdims", Attr::Bool(true))];
    let m = s.op("max", Op::ReduceMax, &[v], &attrs)?;
    let eq = s.op0("is_max", Op::Equal, &[v, &m])?;
    if !float {
        return Ok(eq);
    }
    let same = s.op0("not_nan", Op::Equal, &[v, v])?;
    let nan = s.op0("nan", Op::Not, &[&same])?;
    s.op0("hit", Op::Or, &[&eq, &nan])
}

/// 1 at the first max along `axis`, 0 elsewhere.
pub(super) fn hardmax(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    on_x(b, c, |s, x| {
        let (axis, shape) = axis_of(s, x, -1)?;
        float_only(s.b, x, "Hardmax")?;
        let hit = hits_of_max(s, x, axis, true)?;
        let idx = iota(shape[axis], axis, shape.len(), true)?;
        let none = scalar(DType::I64, -1.0);
        let cand = s.op0("candidates", Op::Where, &[&hit, &idx, &none])?;
        let attrs = [("axes", Attr::ints(&[axis as i64])), ("keepdims", Attr::Bool(true))];
        let first = s.op("first", Op::ReduceMax, &[&cand], &attrs)?;
        let at = s.op0("at_first", Op::Equal, &[&idx, &first])?;
        cast(s.b, &at, DType::F32, &s.c.out)
    })
}

/// A bool constant of `shape` whose element at (i, j) of its two last dims is `f(i, j)`.
fn mask(shape: &[usize], f: impl Fn(i64, i64) -> bool) -> R<Value> {
    let (n, m) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let mut mshape = vec![1; shape.len() - 2];
    mshape.extend([n, m]);
    table("the mask", DType::Bool, mshape, |k| f64::from(u8::from(f((k / m) as i64, (k % m) as i64))))
}

/// The optional scalar input `i` (an integer known at import time), else `default`.
fn const_scalar(s: &Steps, i: usize, default: i64) -> R<i64> {
    match s.c.opt(i) {
        None => Ok(default),
        Some(_) => match s.c.const_ints(i)?.as_slice() {
            [k] => Ok(*k),
            other => Err(format!("input {i} must be one integer, found {} values", other.len())),
        },
    }
}

/// Trilu: the elements on and above (upper) or below (lower) diagonal k, zeros elsewhere.
fn trilu(s: &mut Steps, x: &Value) -> R<Value> {
    let shape = s.b.ty(x).shape;
    if shape.len() < 2 {
        return Err(format!("the input has rank {}, Trilu needs at least 2", shape.len()));
    }
    let k = const_scalar(s, 1, 0)?;
    let upper = s.c.int("upper", 1) != 0;
    let keep = mask(&shape, |i, j| if upper { j - i >= k } else { j - i <= k })?;
    let zero = s.k(x, 0.0);
    s.op0("", Op::Where, &[&keep, x, &zero])
}

/// EyeLike: ones on diagonal k of a 2-D tensor of `x`'s shape, a constant.
fn eye_like(s: &mut Steps, x: &Value) -> R<Value> {
    let shape = s.b.ty(x).shape;
    if shape.len() != 2 {
        return Err(format!("the input has rank {}, EyeLike needs 2", shape.len()));
    }
    let dtype = match s.c.attr("dtype").and_then(|a| a.i) {
        Some(d) => tensors::dtype(d as i32)?,
        None => s.b.ty(x).dtype,
    };
    let k = s.c.int("k", 0);
    let m = shape[1];
    table("the constant", dtype, shape, |p| if (p % m) as i64 - (p / m) as i64 == k { 1.0 } else { 0.0 })
}

/// CumSum as the IR's `cumsum`, whose kernel sums each line left to right (onnxruntime's
/// order); the axis must be a constant.
fn cumsum(s: &mut Steps, x: &Value) -> R<Value> {
    let axis = scan_axis(s, x)?;
    let (exclusive, reverse) = (s.c.int("exclusive", 0) != 0, s.c.int("reverse", 0) != 0);
    let attrs = [("axis", Attr::Int(axis)), ("exclusive", Attr::Bool(exclusive)), ("reverse", Attr::Bool(reverse))];
    s.op("", Op::CumSum, &[x], &attrs)
}

/// The axis input (1) of a scan (CumSum, CumProd) of `x`, which must fold.
fn scan_axis(s: &mut Steps, x: &Value) -> R<i64> {
    let rank = s.b.ty(x).shape.len();
    if rank == 0 {
        return Err(format!("the input is a scalar, {} needs an axis", s.op_type()));
    }
    let axis = const_scalar(s, 1, i64::MIN)?;
    if axis == i64::MIN {
        return Err("it needs an axis".into());
    }
    norm_axis(axis, rank)?;
    Ok(axis)
}

/// CumProd by doubling (Hillis–Steele): once each element holds the product of the 2^i
/// elements ending at it, one product with itself shifted by 2^i along the axis (ones
/// shifted in) doubles that, so ⌈log2 n⌉ products give every prefix product. `exclusive`
/// shifts x by one first, `reverse` works on the axis reversed. Exact and wrapping for
/// integers; floats round in another order than a running product.
fn cumprod(s: &mut Steps, x: &Value) -> R<Value> {
    let axis = norm_axis(scan_axis(s, x)?, s.b.ty(x).shape.len())?;
    let (exclusive, reverse) = (s.c.int("exclusive", 0) != 0, s.c.int("reverse", 0) != 0);
    let shape = s.b.ty(x).shape;
    let n = shape[axis] as i64;
    if n == 0 {
        return Ok(x.clone());
    }
    let flip = |s: &mut Steps, v: &Value, what: &str| {
        let attrs = [
            ("starts", Attr::ints(&[-1])),
            ("ends", Attr::ints(&[-n - 1])),
            ("axes", Attr::ints(&[axis as i64])),
            ("steps", Attr::ints(&[-1])),
        ];
        s.op(what, Op::Slice, &[v], &attrs)
    };
    // v moved `by` along the axis, ones shifted in at its start.
    let shifted = |s: &mut Steps, v: &Value, by: i64, what: &str| {
        let mut ones_shape = shape.clone();
        ones_shape[axis] = by.min(n) as usize;
        let ones = table("the ones shifted in", s.b.ty(v).dtype, ones_shape, |_| 1.0)?;
        if by >= n {
            return Ok(ones);
        }
        let bounds =
            [("starts", Attr::ints(&[0])), ("ends", Attr::ints(&[n - by])), ("axes", Attr::ints(&[axis as i64]))];
        let kept = s.op(&format!("{what}_kept"), Op::Slice, &[v], &bounds)?;
        s.op(what, Op::Concat, &[&ones, &kept], &[("axis", Attr::Int(axis as i64))])
    };
    let mut v = if reverse { flip(s, x, "reversed")? } else { x.clone() };
    if exclusive {
        v = shifted(s, &v, 1, "exclusive")?;
    }
    let mut by = 1;
    while by < n {
        let moved = shifted(s, &v, by, &format!("shift{by}"))?;
        let name = if by * 2 >= n && !reverse { String::new() } else { format!("product{by}") };
        v = s.op0(&name, Op::Mul, &[&v, &moved])?;
        by *= 2;
    }
    if reverse {
        return flip(s, &v, "");
    }
    Ok(v)
}

/// RMSNormalization (x / √(mean(x²) + ε) · scale over the dims from `axis` on),
/// LpNormalization (x / ‖x‖ₚ along `axis`, p 1 or 2) and MeanVarianceNormalization
/// ((x − mean) / (√(mean(x²) − mean²) + 1e-9) over `axes`, as ONNX's reference writes it).
fn normalisation(s: &mut Steps, op_type: &str, x: &Value) -> R<Value> {
    float_only(s.b, x, op_type)?;
    let shape = s.b.ty(x).shape;
    let rank = shape.len();
    let keep = |axes: Vec<usize>| {
        [("axes", Attr::ints(&axes.iter().map(|&a| a as i64).collect::<Vec<_>>())), ("keepdims", Attr::Bool(true))]
    };
    match op_type {
        "RMSNormalization" => {
            let axis = norm_axis(s.c.int("axis", -1), rank)?;
            let attrs = keep((axis..rank).collect());
            let sq = s.op0("square", Op::Mul, &[x, x])?;
            let ms = s.op("mean_square", Op::ReduceMean, &[&sq], &attrs)?;
            let eps = s.k(x, s.float("epsilon", 1e-5));
            let ve = s.op0("plus_eps", Op::Add, &[&ms, &eps])?;
            let r = s.op0("rms_inv", Op::Rsqrt, &[&ve])?;
            let n = s.op0("normed", Op::Mul, &[x, &r])?;
            s.op0("", Op::Mul, &[&n, s.c.arg(1)?])
        }
        "LpNormalization" => {
            let axis = norm_axis(s.c.int("axis", -1), rank)?;
            let attrs = keep(vec![axis]);
            let norm = match s.c.int("p", 2) {
                1 => {
                    let a = s.op0("abs", Op::Abs, &[x])?;
                    s.op("norm", Op::ReduceSum, &[&a], &attrs)?
                }
                2 => {
                    let sq = s.op0("square", Op::Mul, &[x, x])?;
                    let sum = s.op("sum_square", Op::ReduceSum, &[&sq], &attrs)?;
                    s.op0("norm", Op::Sqrt, &[&sum])?
                }
                p => return Err(format!("p = {p} is not supported (1 or 2)")),
            };
            // A zero norm gives 0, not 0/0 (ONNX's reference).
            let zero = s.k(x, 0.0);
            let is_zero = s.op0("norm_zero", Op::Equal, &[&norm, &zero])?;
            let q = s.op0("quotient", Op::Div, &[x, &norm])?;
            s.op0("", Op::Where, &[&is_zero, &zero, &q])
        }
        _ => {
            let axes = match s.c.ints("axes") {
                Some(a) => a.iter().map(|&a| norm_axis(a, rank)).collect::<R<Vec<_>>>()?,
                None => [0, 2, 3].into_iter().filter(|&a| a < rank).collect(),
            };
            let attrs = keep(axes);
            let mean = s.op("mean", Op::ReduceMean, &[x], &attrs)?;
            let sq = s.op0("square", Op::Mul, &[x, x])?;
            let msq = s.op("mean_square", Op::ReduceMean, &[&sq], &attrs)?;
            let m2 = s.op0("mean_squared", Op::Mul, &[&mean, &mean])?;
            let var = s.op0("variance", Op::Sub, &[&msq, &m2])?;
            let std = s.op0("std", Op::Sqrt, &[&var])?;
            let eps = s.k(x, 1e-9);
            let d = s.op0("std_eps", Op::Add, &[&std, &eps])?;
            let centred = s.op0("centred", Op::Sub, &[x, &mean])?;
            s.op0("", Op::Div, &[&centred, &d])
        }
    }
}

/// NegativeLogLikelihoodLoss of log-probabilities [N, C, d…] at integer targets [N, d…], or
/// SoftmaxCrossEntropyLoss (the same of `log(softmax(scores, axis 1))`, which is its second
/// output): the class is picked by `equal(class index, target)` and a sum over C (exact:
/// the other terms are zeros), weighted by `weight[target]`; a target equal to
/// `ignore_index` (or outside 0..C) weighs 0. `mean` divides by the sum of the weights.
fn loss(s: &mut Steps, softmax: bool) -> R<Vec<Value>> {
    let c = s.c;
    let x = c.arg(0)?;
    float_only(s.b, x, "the input")?;
    let shape = s.b.ty(x).shape;
    if shape.len() < 2 {
        return Err(format!("the input has rank {}, at least 2 needed ([N, C, ...])", shape.len()));
    }
    let target = c.arg(1)?;
    let tt = s.b.ty(target);
    if !tt.dtype.is_int() {
        return Err(format!("the target is {}, not an integer", tt.dtype));
    }
    let mut tshape = shape.clone();
    tshape.remove(1);
    if tt.shape != tshape {
        return Err(format!("the target has shape {:?}, the input {:?} wants {tshape:?}", tt.shape, shape));
    }
    let reduction = c.string("reduction", "mean");
    if !["none", "sum", "mean"].contains(&reduction.as_str()) {
        return Err(format!("reduction '{reduction}' is not none, sum or mean"));
    }
    let logp = if softmax {
        let name = c.node.output.get(1).filter(|n| !n.is_empty()).cloned().unwrap_or_else(|| c.part("log_prob"));
        log_softmax_of(s.b, c, x, 1, &name)?
    } else {
        x.clone()
    };
    let mut view: Vec<i64> = tshape.iter().map(|&d| d as i64).collect();
    view.insert(1, 1);
    let t = reshape(s.b, target, &view, &c.part("target_view"))?;
    let classes = {
        let mut ishape = vec![1; shape.len()];
        ishape[1] = shape[1];
        table("the class numbers", tt.dtype, ishape, |i| i as f64)?
    };
    let mut hit = s.op0("hit", Op::Equal, &[&t, &classes])?;
    if let Some(ignore) = c.attr("ignore_index").and_then(|a| a.i) {
        let ig = scalar(tt.dtype, ignore as f64);
        let ignored = s.op0("ignored", Op::Equal, &[&t, &ig])?;
        let kept = s.op0("kept", Op::Not, &[&ignored])?;
        hit = s.op0("counted", Op::And, &[&hit, &kept])?;
    }
    let zero = s.k(x, 0.0);
    let weight = match c.opt(2) {
        Some(w) => {
            let mut wshape = vec![1i64; shape.len()];
            wshape[1] = shape[1] as i64;
            reshape(s.b, w, &wshape, &c.part("weight_view"))?
        }
        None => s.k(x, 1.0),
    };
    let w = s.op0("weights", Op::Where, &[&hit, &weight, &zero])?;
    // Selected after the product: a −inf log-probability of another class must not meet a 0.
    let prod = s.op0("products", Op::Mul, &[&weight, &logp])?;
    let wl = s.op0("weighted", Op::Where, &[&hit, &prod, &zero])?;
    let over_c = [("axes", Attr::ints(&[1])), ("keepdims", Attr::Bool(false))];
    let picked = s.op("picked", Op::ReduceSum, &[&wl], &over_c)?;
    let out = match reduction.as_str() {
        "none" => s.op0("", Op::Neg, &[&picked])?,
        "sum" => {
            let total = s.op("total", Op::ReduceSum, &[&picked], &[("keepdims", Attr::Bool(false))])?;
            s.op0("", Op::Neg, &[&total])?
        }
        _ => {
            let total = s.op("total", Op::ReduceSum, &[&picked], &[("keepdims", Attr::Bool(false))])?;
            let wsum = s.op("weight_sum", Op::ReduceSum, &[&w], &[("keepdims", Attr::Bool(false))])?;
            let neg = s.op0("neg_total", Op::Neg, &[&total])?;
            s.op0("", Op::Div, &[&neg, &wsum])?
        }
    };
    Ok(if softmax { vec![out, logp] } else { vec![out] })
}
