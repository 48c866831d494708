//! ONNX's trigonometric and hyperbolic ops other than Sin and Cos, spelled with meshc's
//! elementwise ops (docs/onnx.md): each formula is the one whose rounding stays relative
//! where the result is small (near 0 for Sinh, Asinh, Atanh, Atan; near 1 for Acosh; near
//! ±1 for Asin and Acos), as the test data and any model near those points need, rather
//! than the textbook one that cancels there.

use std::f64::consts::{FRAC_PI_2, FRAC_PI_4, LN_2};

use meshc_ir::Op;

use super::builder::{Builder, Value};
use super::ops::{one, Converter, Ctx};
use super::ops_math::{float_only, Steps};

type R<T> = std::result::Result<T, String>;

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(7, "Tan", |b, c| trig(b, c, tan)),
    Converter::since(7, "Atan", |b, c| trig(b, c, |s, x| atan(s, x, ""))),
    Converter::since(7, "Asin", |b, c| trig(b, c, asin)),
    Converter::since(7, "Acos", |b, c| trig(b, c, acos)),
    Converter::since(9, "Sinh", |b, c| trig(b, c, sinh)),
    Converter::since(9, "Cosh", |b, c| trig(b, c, |s, x| cosh(s, x, ""))),
    Converter::since(9, "Asinh", |b, c| trig(b, c, asinh)),
    Converter::since(9, "Acosh", |b, c| trig(b, c, acosh)),
    Converter::since(9, "Atanh", |b, c| trig(b, c, atanh)),
];

/// One of this module's formulas of input 0, f32 (a half widened to f32).
fn trig(b: &mut Builder, c: &Ctx, f: fn(&mut Steps, &Value) -> R<Value>) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    float_only(b, x, c.node.op_type.as_deref().unwrap_or(""))?;
    one(f(&mut Steps { b, c }, x))
}

/// The name of part `what` of a step named `at` (the node's output when empty).
fn part(at: &str, what: &str) -> String {
    if at.is_empty() {
        what.to_string()
    } else {
        format!("{at}.{what}")
    }
}

fn tan(s: &mut Steps, x: &Value) -> R<Value> {
    let sin = s.op0("sin", Op::Sin, &[x])?;
    let cos = s.op0("cos", Op::Cos, &[x])?;
    s.op0("", Op::Div, &[&sin, &cos])
}

/// Cephes' atanf: |x| reduced to at most tan(π/8) (by −1/|x| above tan(3π/8), by
/// (|x|−1)/(|x|+1) above tan(π/8)), an odd polynomial of degree 9 plus the reduction's
/// offset, then x's sign; within 2 ulp, ±π/2 at ±inf, NaN for NaN.
fn atan(s: &mut Steps, x: &Value, at: &str) -> R<Value> {
    let n = |what: &str| part(at, what);
    let a = s.op0(&n("abs"), Op::Abs, &[x])?;
    let big = s.op0(&n("big"), Op::Greater, &[&a, &s.k(x, 2.414_213_562_373_095)])?;
    let mid = s.op0(&n("mid"), Op::Greater, &[&a, &s.k(x, 0.414_213_562_373_095)])?;
    let inv = s.op0(&n("inv"), Op::Div, &[&s.k(x, -1.0), &a])?;
    let am1 = s.op0(&n("minus_one"), Op::Sub, &[&a, &s.k(x, 1.0)])?;
    let ap1 = s.op0(&n("plus_one"), Op::Add, &[&a, &s.k(x, 1.0)])?;
    let red = s.op0(&n("moved"), Op::Div, &[&am1, &ap1])?;
    let t_mid = s.op0(&n("t_mid"), Op::Where, &[&mid, &red, &a])?;
    let t = s.op0(&n("t"), Op::Where, &[&big, &inv, &t_mid])?;
    let off_mid = s.op0(&n("offset_mid"), Op::Where, &[&mid, &s.k(x, FRAC_PI_4), &s.k(x, 0.0)])?;
    let off = s.op0(&n("offset"), Op::Where, &[&big, &s.k(x, FRAC_PI_2), &off_mid])?;
    let z = s.op0(&n("square"), Op::Mul, &[&t, &t])?;
    let mut p = s.k(x, 8.053_744_495_38e-2);
    for (i, c) in [-1.387_768_560_32e-1, 1.997_771_064_78e-1, -3.333_294_915_39e-1].into_iter().enumerate() {
        let pz = s.op0(&n(&format!("horner{i}")), Op::Mul, &[&p, &z])?;
        p = s.op0(&n(&format!("coef{i}")), Op::Add, &[&pz, &s.k(x, c)])?;
    }
    let pz = s.op0(&n("poly_z"), Op::Mul, &[&p, &z])?;
    let pzt = s.op0(&n("poly"), Op::Mul, &[&pz, &t])?;
    let y0 = s.op0(&n("odd"), Op::Add, &[&pzt, &t])?;
    let y = s.op0(&n("magnitude"), Op::Add, &[&y0, &off])?;
    let neg = s.op0(&n("negative"), Op::Less, &[x, &s.k(x, 0.0)])?;
    let ny = s.op0(&n("negated"), Op::Neg, &[&y])?;
    s.op0(at, Op::Where, &[&neg, &ny, &y])
}

/// `(1 − x)(1 + x)`: 1 − x² without its cancellation near ±1.
fn one_minus_square(s: &mut Steps, x: &Value) -> R<Value> {
    let lo = s.op0("one_minus", Op::Sub, &[&s.k(x, 1.0), x])?;
    let hi = s.op0("one_plus", Op::Add, &[&s.k(x, 1.0), x])?;
    s.op0("one_minus_square", Op::Mul, &[&lo, &hi])
}

/// atan(x / √((1 − x)(1 + x))): ±π/2 at ±1, NaN beyond.
fn asin(s: &mut Steps, x: &Value) -> R<Value> {
    let d = one_minus_square(s, x)?;
    let r = s.op0("root", Op::Sqrt, &[&d])?;
    let q = s.op0("ratio", Op::Div, &[x, &r])?;
    atan(s, &q, "")
}

/// 2·atan(√((1 − x)/(1 + x))): relative near x = 1, where π/2 − asin(x) would cancel; π at −1.
fn acos(s: &mut Steps, x: &Value) -> R<Value> {
    let lo = s.op0("one_minus", Op::Sub, &[&s.k(x, 1.0), x])?;
    let hi = s.op0("one_plus", Op::Add, &[&s.k(x, 1.0), x])?;
    let q = s.op0("ratio", Op::Div, &[&lo, &hi])?;
    let r = s.op0("root", Op::Sqrt, &[&q])?;
    let h = atan(s, &r, "half")?;
    s.op0("", Op::Add, &[&h, &h])
}

/// (eˣ + e⁻ˣ)/2.
fn cosh(s: &mut Steps, x: &Value, at: &str) -> R<Value> {
    let e = s.op0(&part(at, "exp"), Op::Exp, &[x])?;
    let nx = s.op0(&part(at, "neg"), Op::Neg, &[x])?;
    let en = s.op0(&part(at, "exp_neg"), Op::Exp, &[&nx])?;
    let sum = s.op0(&part(at, "sum"), Op::Add, &[&e, &en])?;
    s.op0(at, Op::Mul, &[&sum, &s.k(x, 0.5)])
}

/// tanh(x)·cosh(x): relative near 0, where (eˣ − e⁻ˣ)/2 cancels.
fn sinh(s: &mut Steps, x: &Value) -> R<Value> {
    let t = s.op0("tanh", Op::Tanh, &[x])?;
    let c = cosh(s, x, "cosh")?;
    s.op0("", Op::Mul, &[&t, &c])
}

/// log(1 + u) relative for small u (Goldberg's `log(w)·u/(w − 1)`, w = 1 + u), u itself
/// where w rounds to 1, and log(w) where w − 1 is infinite.
fn log1p(s: &mut Steps, u: &Value, at: &str) -> R<Value> {
    let n = |what: &str| part(at, what);
    let one = s.k(u, 1.0);
    let w = s.op0(&n("w"), Op::Add, &[&one, u])?;
    let l = s.op0(&n("log"), Op::Log, &[&w])?;
    let d = s.op0(&n("rounded"), Op::Sub, &[&w, &one])?;
    let q = s.op0(&n("ratio"), Op::Div, &[u, &d])?;
    let finite = s.op0(&n("finite"), Op::Less, &[&d, &s.k(u, f64::INFINITY)])?;
    let q = s.op0(&n("ratio_or_one"), Op::Where, &[&finite, &q, &one])?;
    let lq = s.op0(&n("scaled"), Op::Mul, &[&l, &q])?;
    let tiny = s.op0(&n("tiny"), Op::Equal, &[&d, &s.k(u, 0.0)])?;
    s.op0(at, Op::Where, &[&tiny, u, &lq])
}

/// sign(x)·log1p(|x| + x²/(1 + √(1 + x²))), and log|x| + ln 2 past 2^28, where x² would
/// overflow (and 1 is below |x|'s ulp).
fn asinh(s: &mut Steps, x: &Value) -> R<Value> {
    let a = s.op0("abs", Op::Abs, &[x])?;
    let sq = s.op0("square", Op::Mul, &[&a, &a])?;
    let sq1 = s.op0("square_plus_one", Op::Add, &[&sq, &s.k(x, 1.0)])?;
    let r = s.op0("root", Op::Sqrt, &[&sq1])?;
    let r1 = s.op0("root_plus_one", Op::Add, &[&r, &s.k(x, 1.0)])?;
    let q = s.op0("ratio", Op::Div, &[&sq, &r1])?;
    let u = s.op0("u", Op::Add, &[&a, &q])?;
    let small = log1p(s, &u, "log1p")?;
    let la = s.op0("log_abs", Op::Log, &[&a])?;
    let large = s.op0("large", Op::Add, &[&la, &s.k(x, LN_2)])?;
    let is_large = s.op0("is_large", Op::Greater, &[&a, &s.k(x, 268_435_456.0)])?;
    let y = s.op0("magnitude", Op::Where, &[&is_large, &large, &small])?;
    let neg = s.op0("negative", Op::Less, &[x, &s.k(x, 0.0)])?;
    let ny = s.op0("negated", Op::Neg, &[&y])?;
    s.op0("", Op::Where, &[&neg, &ny, &y])
}

/// log1p(t + √(t·(t + 2))) with t = x − 1 (exact for x in [1, 2]), and log x + ln 2 past
/// 2^28; NaN below 1.
fn acosh(s: &mut Steps, x: &Value) -> R<Value> {
    let t = s.op0("t", Op::Sub, &[x, &s.k(x, 1.0)])?;
    let t2 = s.op0("t_plus_two", Op::Add, &[&t, &s.k(x, 2.0)])?;
    let p = s.op0("product", Op::Mul, &[&t, &t2])?;
    let r = s.op0("root", Op::Sqrt, &[&p])?;
    let u = s.op0("u", Op::Add, &[&t, &r])?;
    let small = log1p(s, &u, "log1p")?;
    let lx = s.op0("log_x", Op::Log, &[x])?;
    let large = s.op0("large", Op::Add, &[&lx, &s.k(x, LN_2)])?;
    let is_large = s.op0("is_large", Op::Greater, &[x, &s.k(x, 268_435_456.0)])?;
    s.op0("", Op::Where, &[&is_large, &large, &small])
}

/// sign(x)·½·log1p(2|x|/(1 − |x|)) (of |x|: near −1, 1 + 2x/(1 − x) would cancel): ±inf
/// at ±1, NaN beyond.
fn atanh(s: &mut Steps, x: &Value) -> R<Value> {
    let a = s.op0("abs", Op::Abs, &[x])?;
    let lo = s.op0("one_minus", Op::Sub, &[&s.k(x, 1.0), &a])?;
    let a2 = s.op0("twice", Op::Add, &[&a, &a])?;
    let u = s.op0("u", Op::Div, &[&a2, &lo])?;
    let l = log1p(s, &u, "log1p")?;
    let y = s.op0("magnitude", Op::Mul, &[&l, &s.k(x, 0.5)])?;
    let neg = s.op0("negative", Op::Less, &[x, &s.k(x, 0.0)])?;
    let ny = s.op0("negated", Op::Neg, &[&y])?;
    s.op0("", Op::Where, &[&neg, &ny, &y])
}
