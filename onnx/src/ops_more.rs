//! ONNX ops meshc spells as several of its own ops, added to widen what imports
//! (docs/onnx.md): Mod (meshc's mod of integers; of floats, C's fmod and Python's mod from
//! an exact product), CenterCropPad (a slice and a pad), GatherND (a gather from the
//! flattened data at flat indices, each index component normalised and range-checked by a
//! gather from `0..n`), LpPool (a depthwise conv of ones over |x|^p, then the p-th root),
//! ConvTranspose (the input spread by zero insertion, padded, and convolved with the
//! flipped, transposed kernel), RotaryEmbedding (ONNX's reference formula with gathers
//! from the caches), ReduceProd (products of halves, halving), Compress and
//! ReverseSequence (gathers at constant tables), AffineGrid (a constant grid times θᵀ)
//! BitShift (products and floored quotients by powers of 2) and the Bitwise ops (meshc's
//! and, or, xor, not of integers).

use meshc_ir::infer::norm_axis;
use meshc_ir::{Attr, DType, Data, Op, Tensor};

use super::builder::{Builder, Value};
use super::nn::{ones_or, window_attrs};
use super::ops::{
    cast, i64_table, narrow, no_u64, one, reduce_attrs, reshape, scalar, table, widen_ints, Converter, Ctx, R,
};
use super::ops_math::{float_only, Steps};

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(10, "Mod", modulo),
    Converter::new("CenterCropPad", |b, c| one(center_crop_pad(&mut Steps { b, c }))),
    // GatherND-11 is GatherND-12 with batch_dims 0 (the default), and 13 adds bfloat16 only.
    Converter::since(11, "GatherND", |b, c| one(gather_nd(&mut Steps { b, c }))),
    Converter::new("LpPool", |b, c| one(lp_pool(&mut Steps { b, c }))),
    Converter::new("ConvTranspose", |b, c| one(conv_transpose(&mut Steps { b, c }))),
    Converter::new("RotaryEmbedding", |b, c| one(rotary(&mut Steps { b, c }))),
    Converter::since(1, "ReduceProd", |b, c| one(reduce_prod(&mut Steps { b, c }))),
    Converter::since(9, "Compress", |b, c| one(compress(&mut Steps { b, c }))),
    Converter::since(10, "ReverseSequence", |b, c| one(reverse_sequence(&mut Steps { b, c }))),
    Converter::new("AffineGrid", |b, c| one(affine_grid(&mut Steps { b, c }))),
    Converter::since(11, "BitShift", |b, c| one(bit_shift(&mut Steps { b, c }))),
    Converter::since(18, "BitwiseAnd", |b, c| one(bitwise(&mut Steps { b, c }, Op::And))),
    Converter::since(18, "BitwiseOr", |b, c| one(bitwise(&mut Steps { b, c }, Op::Or))),
    Converter::since(18, "BitwiseXor", |b, c| one(bitwise(&mut Steps { b, c }, Op::Xor))),
    Converter::since(18, "BitwiseNot", |b, c| one(bitwise(&mut Steps { b, c }, Op::Not))),
    Converter::new("BitCast", |b, c| one(bit_cast(b, c))),
];

/// The Bitwise ops: meshc's and, or, xor, not, bitwise on i32 and i64; the storage ints are
/// widened and the result cast back (its low bits are the narrow op's, a u64's all of them).
fn bitwise(s: &mut Steps, op: Op) -> R<Value> {
    let dtype = s.b.ty(s.c.arg(0)?).dtype;
    if !dtype.is_int() && !dtype.is_stored_int() {
        return Err(format!("{} of {dtype} is not supported (the integers)", s.op_type()));
    }
    let (args, byte) = widen_ints(s.b, s.c, &s.c.all_args()?, false)?;
    let r = s.op0(if byte.is_some() { "wide_result" } else { "" }, op, &args.iter().collect::<Vec<_>>())?;
    narrow(s.b, &r, byte, &s.c.out)
}

/// BitCast between integers of one width: int8 ↔ uint8, int16 ↔ uint16 and the like are
/// meshc's cast, which wraps and so keeps every bit, and a bool's byte is 0 or 1, its uint8
/// or int8 value. Other pairs (f32 ↔ i32 and the like) need a reinterpretation of bits
/// meshc has no op for.
fn bit_cast(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let from = b.half_origin(x).unwrap_or(b.ty(x).dtype);
    let to = super::tensors::dtype(c.int("to", 0) as i32)?;
    let int = |d: DType| d.is_int() || d.is_stored_int();
    match (from, to) {
        (a, b_) if a == b_ => Ok(x.clone()),
        (DType::Bool, DType::I8 | DType::U8) => cast(b, x, to, &c.out),
        (a, b_) if int(a) && int(b_) && a.size_bytes() == b_.size_bytes() => cast(b, x, to, &c.out),
        _ => Err(format!("BitCast from {from} to {to} is not supported (between integers of one width and from bool)")),
    }
}

/// BitShift as arithmetic on i32 (i64 for int64; the storage ints widened, which keeps every
/// shift's result in its low bits, and cast back, which wraps): a left shift is a
/// product by 2^y (wrapping), a right shift the floor of the quotient by 2^y (arithmetic:
/// a negative x stays negative), 2^y gathered from a constant table. A shift by a negative
/// amount or by the type's width or more gives what the sign fill alone gives (ONNX's
/// opset 28 text): −1 for a right shift of a negative x, else 0, as does a right shift by
/// the wide type's width − 1, whose power is no positive value of it.
fn bit_shift(s: &mut Steps) -> R<Value> {
    let (x, y) = (s.c.arg(0)?, s.c.arg(1)?);
    let dtype = s.b.ty(x).dtype;
    let (bits, wide, wide_bits) = match dtype {
        DType::I8 | DType::U8 => (8, DType::I32, 32),
        DType::I16 | DType::U16 => (16, DType::I32, 32),
        DType::I32 => (32, DType::I32, 32),
        DType::U32 => (32, DType::I64, 64),
        DType::I64 | DType::U64 => (64, DType::I64, 64),
        other => return Err(format!("BitShift of {other} is not supported (the integers)")),
    };
    let left = match s.c.string("direction", "").as_str() {
        "LEFT" => true,
        "RIGHT" => false,
        other => return Err(format!("direction '{other}' is neither LEFT nor RIGHT")),
    };
    // A u64's left shift wraps in i64 as in u64; its right shift is no floored quotient.
    if !left {
        no_u64(s.b, x, "a right BitShift")?;
    }
    let xw = cast(s.b, x, wide, &s.c.part("x_wide"))?;
    let yw = cast(s.b, y, wide, &s.c.part("y_wide"))?;
    let k = |v: f64| scalar(wide, v);
    let lo = s.op0("amount_low", Op::Maximum, &[&yw, &k(0.0)])?;
    let idx = s.op0("amount", Op::Minimum, &[&lo, &k(f64::from(wide_bits - 1))])?;
    let powers = match wide {
        DType::I64 => Tensor::new(vec![64], Data::I64((0..64).map(|i| 1i64.wrapping_shl(i)).collect())),
        _ => Tensor::new(vec![32], Data::I32((0..32).map(|i| 1i32.wrapping_shl(i)).collect())),
    };
    let p = s.op("power", Op::Gather, &[&Value::computed(powers), &idx], &[("axis", Attr::Int(0))])?;
    let nonneg = s.op0("amount_nonneg", Op::GreaterEqual, &[&yw, &k(0.0)])?;
    let top = if left { bits } else { bits.min(wide_bits - 1) };
    let below = s.op0("amount_below", Op::Less, &[&yw, &k(f64::from(top))])?;
    let ok = s.op0("amount_ok", Op::And, &[&nonneg, &below])?;
    let last = if dtype == wide { String::new() } else { "wide_result".to_string() };
    let r = if left {
        let v = s.op0("product", Op::Mul, &[&xw, &p])?;
        s.op0(&last, Op::Where, &[&ok, &v, &k(0.0)])?
    } else {
        let q = s.op0("quotient", Op::Div, &[&xw, &p])?;
        let qp = s.op0("quotient_times", Op::Mul, &[&q, &p])?;
        let rem = s.op0("remainder", Op::Sub, &[&xw, &qp])?;
        let low = s.op0("remainder_neg", Op::Less, &[&rem, &k(0.0)])?;
        let q1 = s.op0("quotient_less", Op::Sub, &[&q, &k(1.0)])?;
        let floor = s.op0("floor", Op::Where, &[&low, &q1, &q])?;
        let neg = s.op0("x_neg", Op::Less, &[&xw, &k(0.0)])?;
        let fill = s.op0("sign_fill", Op::Where, &[&neg, &k(-1.0), &k(0.0)])?;
        s.op0(&last, Op::Where, &[&ok, &floor, &fill])?
    };
    cast(s.b, &r, dtype, &s.c.out)
}

/// Compress: a gather of the positions the condition keeps along the axis (of the flattened
/// input when there is none). The condition decides the result's shape, so it must be
/// known at import time.
fn compress(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    let cond = s.c.arg(1)?.as_const().ok_or("input 1 must be known at import time (it decides the result's shape)")?;
    let keep: Vec<i64> = cond.data.iter_f64().enumerate().filter(|(_, v)| *v != 0.0).map(|(i, _)| i as i64).collect();
    let shape = s.b.ty(x).shape;
    let (data, axis) = match s.c.attr("axis") {
        Some(_) => (x.clone(), norm_axis(s.c.int("axis", 0), shape.len())?),
        None => (reshape(s.b, x, &[shape.iter().product::<usize>() as i64], &s.c.part("flat"))?, 0),
    };
    let n = s.b.ty(&data).shape[axis];
    match keep.last() {
        None => Err("the condition keeps no element (an empty result is not supported)".into()),
        Some(&last) if last >= n as i64 => Err(format!("the condition keeps position {last} of an axis of {n}")),
        Some(_) => {
            let idx = i64_table("the kept positions", vec![keep.len()], |i| keep[i])?;
            s.op("", Op::Gather, &[&data, &idx], &[("axis", Attr::Int(axis as i64))])
        }
    }
}

/// ReverseSequence: a gather from the flattened input at a constant table of the source of
/// every element (the first `sequence_lens[b]` steps of batch b reversed along the time
/// axis, the rest in place). The lengths must be known at import time.
fn reverse_sequence(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    let shape = s.b.ty(x).shape;
    if shape.len() < 2 {
        return Err(format!("the input has rank {}, ReverseSequence needs 2 or more", shape.len()));
    }
    let (t_ax, b_ax) = (norm_axis(s.c.int("time_axis", 0), shape.len())?, norm_axis(s.c.int("batch_axis", 1), 2)?);
    if t_ax > 1 || t_ax == b_ax {
        return Err(format!("time_axis {t_ax} and batch_axis {b_ax} must be 0 and 1 in some order"));
    }
    let lens = s.c.const_ints(1)?;
    if lens.len() != shape[b_ax] || lens.iter().any(|&l| !(0..=shape[t_ax] as i64).contains(&l)) {
        return Err(format!("sequence_lens {lens:?} do not fit {} batches of {} steps", shape[b_ax], shape[t_ax]));
    }
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len() - 1).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let table = i64_table("the table of sources", shape.clone(), |p| {
        let (t, b) = (p / strides[t_ax] % shape[t_ax], p / strides[b_ax] % shape[b_ax]);
        let len = lens[b] as usize;
        if t < len {
            (p - t * strides[t_ax] + (len - 1 - t) * strides[t_ax]) as i64
        } else {
            p as i64
        }
    })?;
    let flat = reshape(s.b, x, &[shape.iter().product::<usize>() as i64], &s.c.part("flat"))?;
    s.op("", Op::Gather, &[&flat, &table], &[("axis", Attr::Int(0))])
}

/// AffineGrid: ONNX's reference formula, the constant grid of normalised coordinates
/// `[x, y, (z,) 1]` of every output position (x along the last dim) times each θᵀ, as one
/// matmul `[P, k+1] × [N, k+1, k]`, viewed as `[N, ..., k]`. The size must be known at
/// import time.
fn affine_grid(s: &mut Steps) -> R<Value> {
    let theta = s.c.arg(0)?;
    float_only(s.b, theta, "AffineGrid")?;
    let ts = s.b.ty(theta).shape;
    let size = s.c.const_ints(1)?;
    let k = ts.get(1).copied().unwrap_or(0);
    if ts.len() != 3 || !(k == 2 || k == 3) || ts[2] != k + 1 || size.len() != k + 2 || size[0] != ts[0] as i64 {
        return Err(format!("theta of shape {ts:?} and size {size:?} are not a 2-D or 3-D AffineGrid"));
    }
    let spatial: Vec<usize> = size[2..]
        .iter()
        .map(|&d| {
            usize::try_from(d).ok().filter(|&d| d > 0).ok_or(format!("size {size:?} has an empty or negative dim"))
        })
        .collect::<R<_>>()?;
    let align = s.c.int("align_corners", 0) != 0;
    let coord = |i: usize, n: usize| match (align, n) {
        (true, 1) => -1.0,
        (true, _) => -1.0 + 2.0 * i as f64 / (n - 1) as f64,
        (false, _) => -1.0 + (2 * i + 1) as f64 / n as f64,
    };
    let points: usize = spatial.iter().product();
    let grid = table("the grid of coordinates", DType::F32, vec![points, k + 1], |e| {
        let (p, j) = (e / (k + 1), e % (k + 1));
        if j == k {
            return 1.0;
        }
        // Coordinate j is that of spatial dim k − 1 − j (x first).
        let d = k - 1 - j;
        let inner: usize = spatial[d + 1..].iter().product();
        coord(p / inner % spatial[d], spatial[d])
    })?;
    let tt = s.op("theta_t", Op::Transpose, &[theta], &[("perm", Attr::ints(&[0, 2, 1]))])?;
    let g = s.op0("grid", Op::MatMul, &[&grid, &tt])?;
    let mut out = vec![ts[0] as i64];
    out.extend(dims(&spatial));
    out.push(k as i64);
    reshape(s.b, &g, &out, &s.c.out)
}

/// Mod: meshc's mod of integers (the storage ints widened, the remainder cast back),
/// `float_mod` of anything else.
fn modulo(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    no_u64(b, c.arg(0)?, "Mod")?;
    let (args, byte) = widen_ints(b, c, &[c.arg(0)?, c.arg(1)?], false)?;
    let mut s = Steps { b, c };
    if !s.b.ty(&args[0]).dtype.is_int() {
        return one(float_mod(&mut s));
    }
    let fmod = [("fmod", Attr::Bool(c.int("fmod", 0) != 0))];
    let r = s.op(if byte.is_some() { "wide_result" } else { "" }, Op::Mod, &[&args[0], &args[1]], &fmod)?;
    one(narrow(s.b, &r, byte, &c.out))
}

pub(super) fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// `x − trunc(x / y)·y` with the product taken exactly (Dekker's two-product: `t·y = p + e`
/// from halves of 12 bits, so `(x − p) − e` is the remainder without rounding), the
/// quotient corrected once: rounding `x / y` up to an integer (a quotient just below one)
/// leaves a remainder of the wrong sign, which one `±|y|` mends. That is C's fmod exactly
/// while |x / y| < 2^24 (every integer quotient is then an f32) and |y| < 2^115 (the
/// halves do not overflow); beyond, the
/// remainder can be off by multiples of y. An infinite divisor leaves a finite x as it is;
/// a zero divisor or an infinite x give NaN. With `fmod` 0, a nonzero remainder of the sign
/// opposite to y's is moved by y (Python's and numpy's mod).
fn float_mod(s: &mut Steps) -> R<Value> {
    let (x, y) = (s.c.arg(0)?, s.c.arg(1)?);
    float_only(s.b, x, "Mod")?;
    let python = s.c.int("fmod", 0) == 0;
    let zero = s.k(x, 0.0);
    let q = s.op0("quotient", Op::Div, &[x, y])?;
    let q_neg = s.op0("quotient_neg", Op::Less, &[&q, &zero])?;
    let up = s.op0("quotient_ceil", Op::Ceil, &[&q])?;
    let down = s.op0("quotient_floor", Op::Floor, &[&q])?;
    let t = s.op0("quotient_trunc", Op::Where, &[&q_neg, &up, &down])?;
    let p = s.op0("multiple", Op::Mul, &[&t, y])?;
    let (th, tl) = split_halves(s, &t, "quotient")?;
    let (yh, yl) = split_halves(s, y, "y")?;
    let hh = s.op0("hh", Op::Mul, &[&th, &yh])?;
    let hl = s.op0("hl", Op::Mul, &[&th, &yl])?;
    let lh = s.op0("lh", Op::Mul, &[&tl, &yh])?;
    let ll = s.op0("ll", Op::Mul, &[&tl, &yl])?;
    let e = s.op0("err_hh", Op::Sub, &[&hh, &p])?;
    let e = s.op0("err_hl", Op::Add, &[&e, &hl])?;
    let e = s.op0("err_lh", Op::Add, &[&e, &lh])?;
    let e = s.op0("err", Op::Add, &[&e, &ll])?;
    let d = s.op0("x_minus_multiple", Op::Sub, &[x, &p])?;
    let r = s.op0("remainder0", Op::Sub, &[&d, &e])?;
    let (overshot, r_neg) = nonzero_against(s, &r, x, "remainder0")?;
    let ay = s.op0("abs_y", Op::Abs, &[y])?;
    let nay = s.op0("neg_abs_y", Op::Neg, &[&ay])?;
    let step = s.op0("step", Op::Where, &[&r_neg, &ay, &nay])?;
    let mended = s.op0("mended", Op::Add, &[&r, &step])?;
    let r = s.op0("remainder1", Op::Where, &[&overshot, &mended, &r])?;
    let inf = s.k(x, f64::INFINITY);
    let y_inf = s.op0("y_inf", Op::Equal, &[&ay, &inf])?;
    let ax = s.op0("abs_x", Op::Abs, &[x])?;
    let x_finite = s.op0("x_finite", Op::Less, &[&ax, &inf])?;
    let keep_x = s.op0("keep_x", Op::And, &[&y_inf, &x_finite])?;
    let f = s.op0(if python { "fmod" } else { "" }, Op::Where, &[&keep_x, x, &r])?;
    if !python {
        return Ok(f);
    }
    let (adjust, _) = nonzero_against(s, &f, y, "fmod")?;
    let moved = s.op0("moved", Op::Add, &[&f, y])?;
    s.op0("", Op::Where, &[&adjust, &moved, &f])
}

/// Each axis of `axes` (all by default) cropped or zero-padded to its size in `shape`,
/// centred; an odd difference puts the extra element at the end, as ONNX's reference.
fn center_crop_pad(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    let xs = s.b.ty(x).shape;
    let r = xs.len();
    let want = s.c.const_ints(1)?;
    let axes = match s.c.ints("axes") {
        Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<R<Vec<_>>>()?,
        None => (0..r).collect(),
    };
    if want.len() != axes.len() || want.iter().any(|&w| w < 0) {
        return Err(format!("shape {want:?} must hold a non-negative size for each of the axes {axes:?}"));
    }
    let (mut starts, mut ends, mut cut) = (vec![], vec![], vec![]);
    let mut pads = vec![0i64; 2 * r];
    for (&a, &w) in axes.iter().zip(&want) {
        let d = xs[a] as i64;
        if w < d {
            starts.push((d - w) / 2);
            ends.push((d - w) / 2 + w);
            cut.push(a as i64);
        } else if w > d {
            pads[a] = (w - d) / 2;
            pads[r + a] = w - d - (w - d) / 2;
        }
    }
    let padded = pads.iter().any(|&p| p != 0);
    let mut y = x.clone();
    if !cut.is_empty() {
        let attrs = [("starts", Attr::ints(&starts)), ("ends", Attr::ints(&ends)), ("axes", Attr::ints(&cut))];
        y = s.op(if padded { "cropped" } else { "" }, Op::Slice, &[&y], &attrs)?;
    }
    if padded {
        let attrs = [("pads", Attr::ints(&pads)), ("mode", Attr::Str("constant".into())), ("value", Attr::Float(0.0))];
        y = s.op("", Op::Pad, &[&y], &attrs)?;
    }
    Ok(y)
}

/// GatherND: the data seen as `[B·n_b·…·n_(b+k−1), rest…]` (B the batch dims' product) and
/// gathered at `L·n_b·…·n_(b+k−1) + Σ index_j · stride_j`, L the linear batch index. Each
/// index component goes through a gather from `0..n`, which counts a negative one from the
/// end and makes one out of range a run-time error.
fn gather_nd(s: &mut Steps) -> R<Value> {
    let (data, indices) = (s.c.arg(0)?, s.c.arg(1)?);
    let (ds, is) = (s.b.ty(data).shape, s.b.ty(indices).shape);
    let bd = usize::try_from(s.c.int("batch_dims", 0)).map_err(|_| "batch_dims is negative".to_string())?;
    let k = *is.last().ok_or("indices is a scalar: GatherND needs rank 1 or more")?;
    if !s.b.ty(indices).dtype.is_int() {
        return Err(format!("indices are {}, not integers", s.b.ty(indices).dtype));
    }
    if k == 0 || bd >= is.len() || bd + k > ds.len() || is[..bd] != ds[..bd] {
        return Err(format!("indices of shape {is:?} do not index data of shape {ds:?} with batch_dims {bd}"));
    }
    let lead = &is[..is.len() - 1];
    let block: usize = ds[bd..bd + k].iter().product();
    let mut flat = flat_offsets(s, indices, &ds[bd..bd + k])?;
    if bd > 0 {
        let mut shape = is[..bd].to_vec();
        shape.extend(std::iter::repeat_n(1, lead.len() - bd));
        let base = i64_table("the table of batch offsets", shape, |l| (l * block) as i64)?;
        flat = s.op0("flat_index", Op::Add, &[&flat, &base])?;
    }
    let mut view = vec![(ds[..bd].iter().product::<usize>() * block) as i64];
    view.extend(dims(&ds[bd + k..]));
    let all = reshape(s.b, data, &view, &s.c.part("blocks"))?;
    s.op("", Op::Gather, &[&all, &flat], &[("axis", Attr::Int(0))])
}

/// The row-major offset over the dims `ds` of each index tuple of `indices` (`[..., k]`, k =
/// `ds.len()`), as i64 of the indices' shape without its last dim; each component is
/// normalised and range-checked by a gather from `0..n` (an index out of range is a run-time
/// error, never a wrong element).
pub(super) fn flat_offsets(s: &mut Steps, indices: &Value, ds: &[usize]) -> R<Value> {
    let is = s.b.ty(indices).shape;
    let lead = &is[..is.len() - 1];
    let mut flat: Option<Value> = None;
    for (j, &n) in ds.iter().enumerate() {
        let attrs = [
            ("starts", Attr::ints(&[j as i64])),
            ("ends", Attr::ints(&[j as i64 + 1])),
            ("axes", Attr::ints(&[is.len() as i64 - 1])),
        ];
        let comp = s.op(&format!("index{j}"), Op::Slice, &[indices], &attrs)?;
        let comp = reshape(s.b, &comp, &dims(lead), &s.c.part(&format!("index{j}_view")))?;
        let iota = i64_table("the index range", vec![n], |i| i as i64)?;
        let norm = s.op(&format!("index{j}_norm"), Op::Gather, &[&iota, &comp], &[])?;
        let stride: usize = ds[j + 1..].iter().product();
        let scaled = s.op0(&format!("offset{j}"), Op::Mul, &[&norm, &scalar_i64(stride)])?;
        flat = Some(match flat {
            None => scaled,
            Some(acc) => s.op0(&format!("offset_to{j}"), Op::Add, &[&acc, &scaled])?,
        });
    }
    flat.ok_or_else(|| "an index tuple of no components".to_string())
}

/// Where `r` is nonzero with the sign opposite to `other`'s, and where `r` is negative.
fn nonzero_against(s: &mut Steps, r: &Value, other: &Value, what: &str) -> R<(Value, Value)> {
    let zero = s.k(r, 0.0);
    let r_neg = s.op0(&format!("{what}_neg"), Op::Less, &[r, &zero])?;
    let other_neg = s.op0(&format!("{what}_other_neg"), Op::Less, &[other, &zero])?;
    let r_zero = s.op0(&format!("{what}_zero"), Op::Equal, &[r, &zero])?;
    let flipped = s.op0(&format!("{what}_flipped"), Op::Xor, &[&r_neg, &other_neg])?;
    let r_nonzero = s.op0(&format!("{what}_nonzero"), Op::Not, &[&r_zero])?;
    Ok((s.op0(&format!("{what}_against"), Op::And, &[&flipped, &r_nonzero])?, r_neg))
}

/// `v` as `hi + lo`, each of at most 12 significant bits (Veltkamp's split).
fn split_halves(s: &mut Steps, v: &Value, what: &str) -> R<(Value, Value)> {
    let c = s.k(v, 4097.0);
    let cv = s.op0(&format!("{what}_scaled"), Op::Mul, &[&c, v])?;
    let d = s.op0(&format!("{what}_scaled_less"), Op::Sub, &[&cv, v])?;
    let hi = s.op0(&format!("{what}_hi"), Op::Sub, &[&cv, &d])?;
    let lo = s.op0(&format!("{what}_lo"), Op::Sub, &[v, &hi])?;
    Ok((hi, lo))
}

fn scalar_i64(v: usize) -> Value {
    Value::computed(Tensor::new(vec![], Data::I64(vec![v as i64])))
}

/// ReduceProd: the reduced axes moved last and flattened into one of n elements, then
/// halved ⌈log2 n⌉ times, the first half times the second (an odd element out carried
/// along): a real product (exact for integers, wrapping as they do), never exp(Σ log).
/// Over no elements the product is 1.
fn reduce_prod(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    let Some(attrs) = reduce_attrs(s.c, "ReduceProd")? else { return Ok(x.clone()) };
    let ty = s.b.ty(x);
    let r = ty.shape.len();
    let keepdims = attrs.iter().any(|(k, v)| *k == "keepdims" && *v == Attr::Bool(true));
    let mut axes = match attrs.iter().find(|(k, _)| *k == "axes").and_then(|(_, v)| v.as_ints()) {
        Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<R<Vec<_>>>()?,
        None => (0..r).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    let kept: Vec<usize> = (0..r).filter(|d| !axes.contains(d)).collect();
    let out: Vec<i64> = (0..r)
        .filter(|d| keepdims || kept.contains(d))
        .map(|d| if kept.contains(&d) { ty.shape[d] as i64 } else { 1 })
        .collect();
    let n: usize = axes.iter().map(|&a| ty.shape[a]).product();
    if n == 0 {
        let numel = out.iter().product::<i64>() as usize;
        let ones = Data::from_f64(ty.dtype, vec![1.0; numel]);
        return Ok(Value::computed(Tensor::new(out.iter().map(|&d| d as usize).collect(), ones)));
    }
    let perm: Vec<i64> = kept.iter().chain(&axes).map(|&d| d as i64).collect();
    let moved = if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
        x.clone()
    } else {
        s.op("moved", Op::Transpose, &[x], &[("perm", Attr::ints(&perm))])?
    };
    let mut view: Vec<i64> = kept.iter().map(|&d| ty.shape[d] as i64).collect();
    view.push(n as i64);
    let last = view.len() as i64 - 1;
    let mut cur = reshape(s.b, &moved, &view, &s.c.part("lines"))?;
    let mut len = n;
    let mut step = 0;
    while len > 1 {
        let half = len / 2;
        let part = |s: &mut Steps, what: &str, from: usize, to: usize| {
            let attrs = [
                ("starts", Attr::ints(&[from as i64])),
                ("ends", Attr::ints(&[to as i64])),
                ("axes", Attr::ints(&[last])),
            ];
            s.op(&format!("{what}{step}"), Op::Slice, &[&cur], &attrs)
        };
        let (a, b) = (part(s, "first", 0, half)?, part(s, "second", half, 2 * half)?);
        let mut p = s.op0(&format!("product{step}"), Op::Mul, &[&a, &b])?;
        if len % 2 == 1 {
            let odd = part(s, "odd", len - 1, len)?;
            p = s.op(&format!("carried{step}"), Op::Concat, &[&p, &odd], &[("axis", Attr::Int(last))])?;
        }
        cur = p;
        len = half + len % 2;
        step += 1;
    }
    reshape(s.b, &cur, &out, &s.c.out)
}

/// `x^p` for the p of LpPool, by multiplication where that is exact.
fn power(s: &mut Steps, x: &Value, p: f64, step: &str) -> R<Value> {
    if p == 1.0 {
        return Ok(x.clone());
    }
    if p == 2.0 {
        return s.op0(step, Op::Mul, &[x, x]);
    }
    let e = s.k(x, p);
    s.op0(step, Op::Pow, &[x, &e])
}

/// LpPool: `(Σ_window |x|^p)^(1/p)`, the window sum a depthwise conv with a kernel of ones
/// (zero padding adds nothing to it), so strides, pads, auto_pad and dilations are conv's.
fn lp_pool(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    float_only(s.b, x, "LpPool")?;
    let xs = s.b.ty(x).shape;
    let kernel = s.c.ints("kernel_shape").ok_or("it needs kernel_shape")?;
    if xs.len() < 3 || kernel.len() != xs.len() - 2 || kernel.iter().any(|&k| k < 1) {
        return Err(format!("kernel_shape {kernel:?} does not fit X of shape {xs:?}"));
    }
    if s.c.int("ceil_mode", 0) != 0 {
        return Err("ceil_mode is not supported".into());
    }
    let p = s.c.int("p", 2);
    if p < 1 {
        return Err(format!("p = {p} must be positive"));
    }
    let k: Vec<usize> = kernel.iter().map(|&k| k as usize).collect();
    let mut attrs = window_attrs(s.c, &xs[2..], &k)?;
    attrs.push(("groups", Attr::Int(xs[1] as i64)));
    let mut wshape = vec![xs[1], 1];
    wshape.extend(&k);
    let n: usize = wshape.iter().product();
    let ones = Value::computed(Tensor::f32(wshape, vec![1.0; n]));
    let a = s.op0("abs", Op::Abs, &[x])?;
    let ap = power(s, &a, p as f64, "power")?;
    let sum = s.op(if p == 1 { "" } else { "window_sum" }, Op::Conv, &[&ap, &ones], &attrs)?;
    match p {
        1 => Ok(sum),
        2 => s.op0("", Op::Sqrt, &[&sum]),
        _ => {
            let e = s.k(&sum, 1.0 / p as f64);
            s.op0("", Op::Pow, &[&sum, &e])
        }
    }
}

/// ConvTranspose as a conv: `y[o] = Σ x[i]·w[t]` over `i·stride + t·dilation − pad_begin = o`
/// is the conv (stride 1) of x spread by `stride − 1` zeros between elements, padded by
/// `(k−1)·dilation − pad_begin` before and to the output size after, with the kernel
/// flipped in space and its in/out channel dims swapped per group. The output size and
/// pads follow ONNX's reference: `output_shape` when given (pads then as given, or from
/// auto_pad), else `stride·(in−1) + output_padding + (k−1)·dilation + 1 − pads`.
fn conv_transpose(s: &mut Steps) -> R<Value> {
    let (x, w) = (s.c.arg(0)?, s.c.arg(1)?);
    float_only(s.b, x, "ConvTranspose")?;
    let (xs, ws) = (s.b.ty(x).shape, s.b.ty(w).shape);
    let n = xs.len().saturating_sub(2);
    let g = s.c.int("group", 1);
    if n == 0 || ws.len() != xs.len() || g < 1 || xs[1] % g as usize != 0 || ws[0] != xs[1] {
        return Err(format!("X of shape {xs:?}, W of shape {ws:?} and group {g} do not fit"));
    }
    let g = g as usize;
    let k: Vec<i64> = dims(&ws[2..]);
    if s.c.ints("kernel_shape").is_some_and(|ks| ks != k) {
        return Err(format!("kernel_shape disagrees with the weight's shape {ws:?}"));
    }
    let strides = ones_or(s.c, "strides", n)?;
    let dil = ones_or(s.c, "dilations", n)?;
    let out_pad = s.c.ints("output_padding").unwrap_or_else(|| vec![0; n]);
    if out_pad.len() != n {
        return Err(format!("output_padding {out_pad:?} must hold {n} entries"));
    }
    let span: Vec<i64> = (0..n).map(|d| (k[d] - 1) * dil[d] + 1).collect();
    let full: Vec<i64> = (0..n).map(|d| strides[d] * (xs[2 + d] as i64 - 1) + out_pad[d] + span[d]).collect();
    let auto_pad = s.c.string("auto_pad", "NOTSET");
    let given_pads = s.c.ints("pads");
    let same = matches!(auto_pad.as_str(), "SAME_UPPER" | "SAME_LOWER");
    let (pad_begin, out): (Vec<i64>, Vec<i64>) = match (given_pads, same) {
        (None, true) => {
            let out =
                s.c.ints("output_shape").unwrap_or_else(|| (0..n).map(|d| xs[2 + d] as i64 * strides[d]).collect());
            if out.len() != n {
                return Err(format!("output_shape {out:?} must hold {n} entries"));
            }
            let begin = (0..n)
                .map(|d| {
                    let total = full[d] - out[d];
                    if auto_pad == "SAME_UPPER" {
                        total / 2
                    } else {
                        total - total / 2
                    }
                })
                .collect();
            (begin, out)
        }
        (pads, _) => {
            if !matches!(auto_pad.as_str(), "NOTSET" | "VALID") && !same {
                return Err(format!("auto_pad '{auto_pad}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"));
            }
            let pads = pads.unwrap_or_else(|| vec![0; 2 * n]);
            if pads.len() != 2 * n {
                return Err(format!("pads has {} entries, expected {}", pads.len(), 2 * n));
            }
            let out = match s.c.ints("output_shape") {
                Some(o) if o.len() == n => o,
                Some(o) => return Err(format!("output_shape {o:?} must hold {n} entries")),
                None => (0..n).map(|d| full[d] - pads[d] - pads[n + d]).collect(),
            };
            (pads[..n].to_vec(), out)
        }
    };
    if out.iter().any(|&o| o < 1) {
        return Err(format!("the output would have spatial size {out:?}"));
    }
    // Zero insertion: each element followed by stride − 1 zeros, along every spatial axis.
    let mut spread = x.clone();
    if strides.iter().any(|&st| st > 1) {
        let mut view = dims(&xs[..2]);
        for d in 0..n {
            view.extend([xs[2 + d] as i64, 1]);
        }
        let v = reshape(s.b, x, &view, &s.c.part("spread_view"))?;
        let mut pads = vec![0i64; 2 * view.len()];
        for d in 0..n {
            pads[view.len() + 3 + 2 * d] = strides[d] - 1;
        }
        let attrs = [("pads", Attr::ints(&pads)), ("mode", Attr::Str("constant".into())), ("value", Attr::Float(0.0))];
        let z = s.op("spread_zeros", Op::Pad, &[&v], &attrs)?;
        let mut shape = dims(&xs[..2]);
        shape.extend((0..n).map(|d| xs[2 + d] as i64 * strides[d]));
        spread = reshape(s.b, &z, &shape, &s.c.part("spread"))?;
    }
    // The spread input is stride·in long (its last stride − 1 zeros included).
    let mut pads = vec![0i64; 2 * (n + 2)];
    for d in 0..n {
        pads[2 + d] = span[d] - 1 - pad_begin[d];
        pads[n + 4 + d] = out[d] - xs[2 + d] as i64 * strides[d] + pad_begin[d];
    }
    if pads.iter().any(|&p| p != 0) {
        let attrs = [("pads", Attr::ints(&pads)), ("mode", Attr::Str("constant".into())), ("value", Attr::Float(0.0))];
        spread = s.op("padded", Op::Pad, &[&spread], &attrs)?;
    }
    let (cin_g, cout_g) = (ws[0] / g, ws[1]);
    let mut grouped = vec![g as i64, cin_g as i64, cout_g as i64];
    grouped.extend(&k);
    let wv = reshape(s.b, w, &grouped, &s.c.part("kernel_groups"))?;
    let mut perm = vec![0i64, 2, 1];
    perm.extend(3..3 + n as i64);
    let wt = s.op("kernel_swapped", Op::Transpose, &[&wv], &[("perm", Attr::ints(&perm))])?;
    let mut conv_w = vec![(g * cout_g) as i64, cin_g as i64];
    conv_w.extend(&k);
    let wt = reshape(s.b, &wt, &conv_w, &s.c.part("kernel_conv"))?;
    let spatial: Vec<i64> = (2..2 + n as i64).collect();
    let flip = [
        ("starts", Attr::ints(&vec![-1; n])),
        ("ends", Attr::ints(&vec![i64::MIN; n])),
        ("axes", Attr::ints(&spatial)),
        ("steps", Attr::ints(&vec![-1; n])),
    ];
    let wf = s.op("kernel_flipped", Op::Slice, &[&wt], &flip)?;
    let attrs = [
        ("strides", Attr::ints(&vec![1; n])),
        ("dilations", Attr::ints(&dil)),
        ("pads", Attr::ints(&vec![0; 2 * n])),
        ("groups", Attr::Int(g as i64)),
    ];
    let mut args = vec![&spread, &wf];
    args.extend(s.c.opt(2));
    s.op("", Op::Conv, &args, &attrs)
}

/// RotaryEmbedding as ONNX's reference computes it, in `[batch, seq, heads, head]` layout:
/// the caches gathered at position_ids (when given), the rotated part split in halves (or
/// even/odd elements when interleaved), `x1·cos − x2·sin` and `x1·sin + x2·cos` put back
/// in place, the rest of each head passed through.
fn rotary(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    float_only(s.b, x, "RotaryEmbedding")?;
    let xs = s.b.ty(x).shape;
    let heads = s.c.int("num_heads", 0);
    let (bsz, seq, h, d) = match xs[..] {
        [bsz, h, seq, d] => (bsz, seq, h, d),
        [bsz, seq, hidden] if heads > 0 && hidden % heads as usize == 0 => {
            (bsz, seq, heads as usize, hidden / heads as usize)
        }
        _ => return Err(format!("input of shape {xs:?}: expected [B, H, S, D], or [B, S, H·D] with num_heads")),
    };
    let rot = match s.c.int("rotary_embedding_dim", 0) {
        0 => d,
        r if r > 0 && r as usize <= d && r % 2 == 0 => r as usize,
        r => return Err(format!("rotary_embedding_dim {r} must be even and at most the head size {d}")),
    };
    let half = rot / 2;
    let bshd = [bsz, seq, h, d].map(|v| v as i64);
    let xv = if xs.len() == 4 {
        s.op("bshd", Op::Transpose, &[x], &[("perm", Attr::ints(&[0, 2, 1, 3]))])?
    } else {
        reshape(s.b, x, &bshd, &s.c.part("bshd"))?
    };
    let mut cs = Vec::new();
    for (i, what) in [(1, "cos"), (2, "sin")] {
        let mut t = s.c.arg(i)?.clone();
        if let Some(pos) = s.c.opt(3) {
            t = s.op(&format!("{what}_at"), Op::Gather, &[&t, pos], &[("axis", Attr::Int(0))])?;
        }
        if s.b.ty(&t).shape != [bsz, seq, half] {
            return Err(format!("the {what} cache gives shape {:?}, not [{bsz}, {seq}, {half}]", s.b.ty(&t).shape));
        }
        cs.push(reshape(s.b, &t, &[bsz as i64, seq as i64, 1, half as i64], &s.c.part(&format!("{what}_heads")))?);
    }
    let slice = |s: &mut Steps, v: &Value, step: &str, from: usize, to: usize, axis: i64| {
        let attrs =
            [("starts", Attr::ints(&[from as i64])), ("ends", Attr::ints(&[to as i64])), ("axes", Attr::ints(&[axis]))];
        s.op(step, Op::Slice, &[v], &attrs)
    };
    let x_rot = if rot < d { slice(s, &xv, "rotated_part", 0, rot, 3)? } else { xv.clone() };
    let interleaved = s.c.int("interleaved", 0) != 0;
    let halves = [bsz, seq, h, half].map(|v| v as i64);
    let (x1, x2) = if interleaved {
        let pairs = reshape(s.b, &x_rot, &[bsz as i64, seq as i64, h as i64, half as i64, 2], &s.c.part("pairs"))?;
        let x1 = slice(s, &pairs, "even", 0, 1, 4)?;
        let x2 = slice(s, &pairs, "odd", 1, 2, 4)?;
        (reshape(s.b, &x1, &halves, &s.c.part("x1"))?, reshape(s.b, &x2, &halves, &s.c.part("x2"))?)
    } else {
        (slice(s, &x_rot, "x1", 0, half, 3)?, slice(s, &x_rot, "x2", half, rot, 3)?)
    };
    let (cos, sin) = (&cs[0], &cs[1]);
    let a = s.op0("x1_cos", Op::Mul, &[cos, &x1])?;
    let bb = s.op0("x2_sin", Op::Mul, &[sin, &x2])?;
    let real = s.op0("real", Op::Sub, &[&a, &bb])?;
    let c2 = s.op0("x1_sin", Op::Mul, &[sin, &x1])?;
    let d2 = s.op0("x2_cos", Op::Mul, &[cos, &x2])?;
    let imag = s.op0("imag", Op::Add, &[&c2, &d2])?;
    let rotated = if interleaved {
        let pair = [bsz as i64, seq as i64, h as i64, half as i64, 1];
        let re = reshape(s.b, &real, &pair, &s.c.part("real_pair"))?;
        let im = reshape(s.b, &imag, &pair, &s.c.part("imag_pair"))?;
        let both = s.op("rotated_pairs", Op::Concat, &[&re, &im], &[("axis", Attr::Int(4))])?;
        reshape(s.b, &both, &[bsz as i64, seq as i64, h as i64, rot as i64], &s.c.part("rotated"))?
    } else {
        s.op("rotated", Op::Concat, &[&real, &imag], &[("axis", Attr::Int(3))])?
    };
    let y = if rot < d {
        let rest = slice(s, &xv, "passed", rot, d, 3)?;
        s.op("joined", Op::Concat, &[&rotated, &rest], &[("axis", Attr::Int(3))])?
    } else {
        rotated
    };
    if xs.len() == 4 {
        s.op("", Op::Transpose, &[&y], &[("perm", Attr::ints(&[0, 2, 1, 3]))])
    } else {
        reshape(s.b, &y, &dims(&xs), &s.c.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::tests::{attr_f, attr_i, attr_ints, attr_str, eval, eval_outputs, f32s};
    use crate::proto::AttributeProto;

    /// Deterministic values in (-1, 1), scaled.
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    #[test]
    fn float_mod_is_c_fmod_exactly_and_python_mod_takes_the_divisors_sign() {
        let n = 4000;
        let x: Vec<f32> = values(n, 1, 1000.0).iter().zip(values(n, 2, 1.0)).map(|(a, b)| a * b.abs()).collect();
        let y: Vec<f32> = values(n, 3, 3.0).iter().map(|v| if *v == 0.0 { 0.5 } else { *v }).collect();
        let (xt, yt) = (Tensor::f32(vec![n], x.clone()), Tensor::f32(vec![n], y.clone()));
        let got = f32s(&eval("Mod", 13, vec![xt.clone(), yt.clone()], vec![attr_i("fmod", 1)]).unwrap());
        for i in 0..n {
            assert_eq!(got[i].to_bits(), (x[i] % y[i]).to_bits(), "fmod({}, {})", x[i], y[i]);
        }
        // Quotients just below an integer: x / y rounds up to it.
        let close = Tensor::f32(vec![3], vec![0.7, 0.3, -0.7]);
        let tenth = Tensor::f32(vec![3], vec![0.1; 3]);
        let got = f32s(&eval("Mod", 13, vec![close, tenth], vec![attr_i("fmod", 1)]).unwrap());
        assert_eq!(got, vec![0.7f32 % 0.1, 0.3f32 % 0.1, -0.7f32 % 0.1]);
        let got = f32s(&eval("Mod", 13, vec![xt, yt], vec![]).unwrap());
        for i in 0..n {
            let r = x[i] % y[i];
            let want = if r != 0.0 && (r < 0.0) != (y[i] < 0.0) { r + y[i] } else { r };
            assert_eq!(got[i], want, "mod({}, {})", x[i], y[i]);
        }
        // ONNX's edge cases (test_mod_float_edge_cases_fmod_0).
        let inf = f32::INFINITY;
        let x = vec![0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, inf, -inf, 1.0, 1.0, f32::NAN, 1.0];
        let y = vec![-2.0, 2.0, 2.0, -2.0, inf, inf, -inf, -inf, 2.0, 2.0, 0.0, -0.0, 2.0, f32::NAN];
        let want = [0.0, 0.0, 0.0, 0.0, inf, 3.0, -1.0, -inf];
        let got = f32s(&eval("Mod", 13, vec![Tensor::f32(vec![14], x), Tensor::f32(vec![14], y)], vec![]).unwrap());
        assert_eq!(got[..8], want);
        assert!(got[8..].iter().all(|v| v.is_nan()), "{got:?}");
    }

    #[test]
    fn reduce_prod_multiplies_over_the_axes_and_gives_one_over_none() {
        let x = Tensor::new(vec![2, 3, 5], Data::I64((1..=30).collect()));
        let y = eval("ReduceProd", 18, vec![x.clone(), Tensor::new(vec![2], Data::I64(vec![0, 2]))], vec![]).unwrap();
        let want: Vec<i64> = (0..3)
            .map(|j| (0..2).flat_map(|i| (0..5).map(move |k| (i * 15 + j * 5 + k + 1) as i64)).product())
            .collect();
        assert_eq!((y.shape.clone(), y.data), (vec![1, 3, 1], Data::I64(want)));
        let y = eval("ReduceProd", 13, vec![x], vec![attr_ints("axes", &[-2]), attr_i("keepdims", 0)]).unwrap();
        assert_eq!(y.shape, vec![2, 5]);
        assert_eq!(y.data.iter_f64().next(), Some(1.0 * 6.0 * 11.0));
        let empty = Tensor::f32(vec![2, 0], vec![]);
        let y = eval("ReduceProd", 13, vec![empty], vec![attr_ints("axes", &[1])]).unwrap();
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 1], vec![1.0, 1.0]));
    }

    #[test]
    fn gather_nd_indexes_with_batch_dims_and_refuses_an_index_out_of_range() {
        let data = Tensor::f32(vec![2, 2, 2], (0..8).map(|v| v as f32).collect());
        let idx = |v: Vec<i64>, shape: Vec<usize>| Tensor::new(shape, Data::I64(v));
        let y = eval("GatherND", 13, vec![data.clone(), idx(vec![1, 0], vec![2, 1])], vec![attr_i("batch_dims", 1)]);
        assert_eq!(f32s(&y.unwrap()), vec![2.0, 3.0, 4.0, 5.0]);
        let y = eval("GatherND", 13, vec![data.clone(), idx(vec![0, 1, -1, 0], vec![2, 2])], vec![]).unwrap();
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2], vec![2.0, 3.0, 4.0, 5.0]));
        // [0, 3] would land inside the flat data as [1, 1]: each component is checked.
        let e = eval("GatherND", 13, vec![data, idx(vec![0, 3], vec![1, 2])], vec![]).unwrap_err();
        assert!(e.contains("gather index 3 out of range"), "{e}");
    }

    #[test]
    fn conv_transpose_matches_its_definition() {
        // Groups, strides, dilations, asymmetric pads and an output padding at once.
        let (cin, g, cout_g, h, w, kh, kw) = (4, 2, 3, 3, 4, 2, 3);
        let (st, dil, pads, out_pad) = ([2i64, 3], [1i64, 2], [1i64, 0, 0, 2], [1i64, 0]);
        let x = values(cin * h * w, 5, 1.0);
        let wt = values(cin * cout_g * kh * kw, 6, 1.0);
        let bias = values(g * cout_g, 7, 1.0);
        let oh = (st[0] * (h as i64 - 1) + out_pad[0] + (kh as i64 - 1) * dil[0] + 1 - pads[0] - pads[2]) as usize;
        let ow = (st[1] * (w as i64 - 1) + out_pad[1] + (kw as i64 - 1) * dil[1] + 1 - pads[1] - pads[3]) as usize;
        let mut want = vec![0f32; g * cout_g * oh * ow];
        for (co, chunk) in want.chunks_mut(oh * ow).enumerate() {
            chunk.iter_mut().for_each(|v| *v = bias[co]);
        }
        let cin_g = cin / g;
        for ci in 0..cin {
            let gi = ci / cin_g;
            for co in 0..cout_g {
                for (i, j, a, b) in grid(h, w, kh, kw) {
                    let o = (
                        i as i64 * st[0] + a as i64 * dil[0] - pads[0],
                        j as i64 * st[1] + b as i64 * dil[1] - pads[1],
                    );
                    if (0..oh as i64).contains(&o.0) && (0..ow as i64).contains(&o.1) {
                        let out = ((gi * cout_g + co) * oh + o.0 as usize) * ow + o.1 as usize;
                        want[out] += x[(ci * h + i) * w + j] * wt[((ci * cout_g + co) * kh + a) * kw + b];
                    }
                }
            }
        }
        let attrs = vec![
            attr_i("group", g as i64),
            attr_ints("strides", &st),
            attr_ints("dilations", &dil),
            attr_ints("pads", &pads),
            attr_ints("output_padding", &out_pad),
        ];
        let inputs = vec![
            Tensor::f32(vec![1, cin, h, w], x),
            Tensor::f32(vec![cin, cout_g, kh, kw], wt),
            Tensor::f32(vec![g * cout_g], bias),
        ];
        let y = eval("ConvTranspose", 22, inputs, attrs).unwrap();
        assert_eq!(y.shape, vec![1, g * cout_g, oh, ow]);
        for (a, b) in f32s(&y).iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    fn grid(h: usize, w: usize, kh: usize, kw: usize) -> Vec<(usize, usize, usize, usize)> {
        let mut v = Vec::new();
        for i in 0..h {
            for j in 0..w {
                for a in 0..kh {
                    for b in 0..kw {
                        v.push((i, j, a, b));
                    }
                }
            }
        }
        v
    }

    #[test]
    fn center_crop_pad_lp_pool_and_rotary_embedding_follow_onnx_reference_formulas() {
        let x = Tensor::f32(vec![5, 2], (0..10).map(|v| v as f32).collect());
        let y = eval("CenterCropPad", 18, vec![x, Tensor::new(vec![2], Data::I64(vec![2, 5]))], vec![]).unwrap();
        // Rows 1..3 kept; columns padded by 1 before and 2 after.
        assert_eq!(y.shape, vec![2, 5]);
        assert_eq!(f32s(&y), vec![0.0, 2.0, 3.0, 0.0, 0.0, 0.0, 4.0, 5.0, 0.0, 0.0]);
        let x = Tensor::f32(vec![1, 1, 4], vec![1.0, -2.0, 3.0, 0.5]);
        let y = eval("LpPool", 18, vec![x], vec![attr_ints("kernel_shape", &[2]), attr_i("p", 3)]).unwrap();
        let want = [9.0f32.cbrt(), 35.0f32.cbrt(), 27.125f32.cbrt()];
        assert!(f32s(&y).iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5), "{y:?}");
        // One head of size 4 rotated in its first 2 dims, interleaved: (x0, x1) by angle θ.
        let x = Tensor::f32(vec![1, 1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
        let (c, s) = (0.6f32, 0.8f32);
        let caches = [Tensor::f32(vec![1, 1, 1], vec![c]), Tensor::f32(vec![1, 1, 1], vec![s])];
        let attrs = vec![attr_i("interleaved", 1), attr_i("rotary_embedding_dim", 2)];
        let y = eval("RotaryEmbedding", 23, vec![x, caches[0].clone(), caches[1].clone()], attrs).unwrap();
        assert_eq!(f32s(&y), vec![c - 2.0 * s, s + 2.0 * c, 3.0, 4.0]);
    }

    #[test]
    fn bit_shift_is_arithmetic_and_sign_fills_out_of_range_amounts() {
        let dir = |d: &str| attr_str("direction", d);
        let i32s = |v: &[i32]| Tensor::new(vec![v.len()], Data::I32(v.to_vec()));
        let x = i32s(&[-7, -7, 7, -7, 1, -1, i32::MIN]);
        let y = i32s(&[1, 31, 31, 32, -1, 40, 31]);
        let right = eval("BitShift", 28, vec![x.clone(), y.clone()], vec![dir("RIGHT")]).unwrap();
        assert_eq!(right.data, Data::I32(vec![-4, -1, 0, -1, 0, -1, -1]));
        let left = eval("BitShift", 28, vec![x, y], vec![dir("LEFT")]).unwrap();
        assert_eq!(left.data, Data::I32(vec![-14, i32::MIN, i32::MIN, 0, 0, 0, 0]));
        // uint8 widened to i32 and wrapped back: 200 << 1 is 144, 200 >> 7 is 1.
        let u8s = |v: &[u8]| Tensor::new(vec![v.len()], Data::U8(v.to_vec()));
        let l = eval("BitShift", 28, vec![u8s(&[200, 200]), u8s(&[1, 8])], vec![dir("LEFT")]).unwrap();
        assert_eq!(l.data, Data::U8(vec![144, 0]));
        let r = eval("BitShift", 28, vec![u8s(&[200, 200]), u8s(&[7, 9])], vec![dir("RIGHT")]).unwrap();
        assert_eq!(r.data, Data::U8(vec![1, 0]));
    }

    #[test]
    fn reverse_sequence_reverses_each_batch_to_its_length() {
        // [batch 2, time 3]: batch 0 reversed over 3 steps, batch 1 over 2.
        let x = Tensor::f32(vec![2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let lens = Tensor::new(vec![2], Data::I64(vec![3, 2]));
        let attrs = vec![attr_i("batch_axis", 0), attr_i("time_axis", 1)];
        let y = eval("ReverseSequence", 10, vec![x, lens], attrs).unwrap();
        assert_eq!(f32s(&y), vec![2.0, 1.0, 0.0, 4.0, 3.0, 5.0]);
    }
    /// int8 and uint8 arithmetic, comparisons, Clip, Mod and MaxPool on values widened to
    /// i32 (f32 for the pool): results wrap back into 8 bits as ONNX's do.
    #[test]
    fn byte_arithmetic_wraps_in_eight_bits() {
        let i8s = |v: &[i8]| Tensor::new(vec![v.len()], Data::I8(v.to_vec()));
        let u8s = |v: &[u8]| Tensor::new(vec![v.len()], Data::U8(v.to_vec()));
        let (a, b) = (i8s(&[127, -128, -7, 100]), i8s(&[1, -1, 2, 3]));
        assert_eq!(
            eval("Add", 14, vec![a.clone(), b.clone()], vec![]).unwrap().data,
            Data::I8(vec![-128, 127, -5, 103])
        );
        assert_eq!(
            eval("Mul", 14, vec![a.clone(), b.clone()], vec![]).unwrap().data,
            Data::I8(vec![127, -128, -14, 44])
        );
        assert_eq!(
            eval("Div", 14, vec![a.clone(), b.clone()], vec![]).unwrap().data,
            Data::I8(vec![127, -128, -3, 33])
        );
        assert_eq!(eval("Mod", 13, vec![a.clone(), b.clone()], vec![]).unwrap().data, Data::I8(vec![0, 0, 1, 1]));
        assert_eq!(
            eval("Less", 13, vec![a.clone(), b.clone()], vec![]).unwrap().data,
            Data::Bool(vec![false, true, true, false])
        );
        let (lo, hi) = (Tensor::new(vec![], Data::I8(vec![-5])), Tensor::new(vec![], Data::I8(vec![50])));
        assert_eq!(eval("Clip", 13, vec![a, lo, hi], vec![]).unwrap().data, Data::I8(vec![50, -5, -5, 50]));
        let sub = eval("Sub", 14, vec![u8s(&[0, 200]), u8s(&[1, 100])], vec![]).unwrap();
        assert_eq!(sub.data, Data::U8(vec![255, 100]));
        let max = eval("Max", 13, vec![u8s(&[0, 200]), u8s(&[255, 100])], vec![]).unwrap();
        assert_eq!(max.data, Data::U8(vec![255, 200]));
        let x = Tensor::new(vec![1, 1, 4], Data::U8(vec![1, 255, 0, 254]));
        let pool = eval("MaxPool", 12, vec![x], vec![attr_ints("kernel_shape", &[2]), attr_ints("strides", &[2])]);
        assert_eq!(pool.unwrap().data, Data::U8(vec![255, 254]));
    }

    /// The 16-bit ints and u32 wrap as ONNX's do; a u64 keeps every bit through add, sub,
    /// mul and a left shift, and compares, maxes and clips unsigned from 2^63 on too; its
    /// quotient, remainder and right shift are refused.
    #[test]
    fn wide_storage_ints_wrap_and_u64_orders_unsigned() {
        let i16s = |v: &[i16]| Tensor::new(vec![v.len()], Data::I16(v.to_vec()));
        let u32s = |v: &[u32]| Tensor::new(vec![v.len()], Data::U32(v.to_vec()));
        let u64s = |v: &[u64]| Tensor::new(vec![v.len()], Data::U64(v.to_vec()));
        let add = eval("Add", 14, vec![i16s(&[32767, -5]), i16s(&[1, 2])], vec![]).unwrap();
        assert_eq!(add.data, Data::I16(vec![-32768, -3]));
        let mul = eval("Mul", 14, vec![u32s(&[u32::MAX, 7]), u32s(&[u32::MAX, 3])], vec![]).unwrap();
        assert_eq!(mul.data, Data::U32(vec![1, 21]));
        let div = eval("Div", 14, vec![u32s(&[u32::MAX, 7]), u32s(&[2, 3])], vec![]).unwrap();
        assert_eq!(div.data, Data::U32(vec![u32::MAX / 2, 2]));
        let (a, b) = (u64s(&[u64::MAX, 1 << 63, 5, 0]), u64s(&[1, 5, 1 << 63, u64::MAX]));
        let sum = eval("Add", 14, vec![a.clone(), b.clone()], vec![]).unwrap();
        assert_eq!(sum.data, Data::U64(vec![0, (1 << 63) + 5, (1 << 63) + 5, u64::MAX]));
        let diff = eval("Sub", 14, vec![a.clone(), b.clone()], vec![]).unwrap();
        assert_eq!(diff.data, Data::U64(vec![u64::MAX - 1, (1 << 63) - 5, 5u64.wrapping_sub(1 << 63), 1]));
        let less = eval("Less", 13, vec![a.clone(), b.clone()], vec![]).unwrap();
        assert_eq!(less.data, Data::Bool(vec![false, false, true, true]));
        let max = eval("Max", 13, vec![a.clone(), b.clone()], vec![]).unwrap();
        assert_eq!(max.data, Data::U64(vec![u64::MAX, 1 << 63, 1 << 63, u64::MAX]));
        let (lo, hi) = (u64s(&[3]), u64s(&[1 << 63]));
        let clip = eval("Clip", 13, vec![a.clone(), lo, hi], vec![]).unwrap();
        assert_eq!(clip.data, Data::U64(vec![1 << 63, 1 << 63, 5, 3]));
        let shl = eval("BitShift", 11, vec![a.clone(), u64s(&[1, 1, 63, 64])], vec![attr_str("direction", "LEFT")]);
        assert_eq!(shl.unwrap().data, Data::U64(vec![u64::MAX - 1, 0, 1 << 63, 0]));
        for (op, attrs) in [("Div", vec![]), ("Mod", vec![]), ("BitShift", vec![attr_str("direction", "RIGHT")])] {
            let err = eval(op, 13, vec![a.clone(), b.clone()], attrs).unwrap_err();
            assert!(err.contains("of uint64 is not supported"), "{op}: {err}");
        }
    }

    /// QuantizeLinear into int16 and uint16 saturates at their ranges; DequantizeLinear
    /// takes them back (their values and differences are exact in f32).
    #[test]
    fn sixteen_bit_quantization_saturates() {
        let x = Tensor::f32(vec![4], vec![0.0, 1000.4, -70000.0, 70000.0]);
        let (scale, zp) = (Tensor::f32(vec![], vec![2.0]), Tensor::new(vec![], Data::I16(vec![0])));
        let q = eval("QuantizeLinear", 21, vec![x, scale, zp], vec![]).unwrap();
        assert_eq!(q.data, Data::I16(vec![0, 500, -32768, 32767]));
        let x = Tensor::f32(vec![2], vec![-300.0, 131000.0]);
        let zp = Tensor::new(vec![], Data::U16(vec![100]));
        let q = eval("QuantizeLinear", 21, vec![x, Tensor::f32(vec![], vec![2.0]), zp.clone()], vec![]).unwrap();
        assert_eq!(q.data, Data::U16(vec![0, 65535]));
        let d = eval("DequantizeLinear", 21, vec![q, Tensor::f32(vec![], vec![0.5]), zp], vec![]).unwrap();
        assert_eq!(f32s(&d), vec![-50.0, 32717.5]);
    }
    /// TopK's order: ties by the lower index, NaN above every number (first when largest,
    /// last when smallest), along any axis; integers too.
    #[test]
    fn top_k_ranks_ties_by_index_and_nan_highest() {
        let nan = f32::NAN;
        let x = Tensor::f32(vec![2, 4], vec![1.0, 3.0, nan, 3.0, -1.0, -1.0, 2.0, -5.0]);
        let k = |v: i64| Tensor::new(vec![1], Data::I64(vec![v]));
        let top = eval_outputs("TopK", 11, vec![x.clone(), k(3)], vec![], 2).unwrap();
        let v = f32s(&top[0]);
        assert!(v[0].is_nan() && v[1..3] == [3.0, 3.0][..] && v[3..] == [2.0, -1.0, -1.0][..], "{v:?}");
        assert_eq!(top[1].data, Data::I64(vec![2, 1, 3, 2, 0, 1]));
        let low = eval_outputs("TopK", 11, vec![x, k(4)], vec![attr_i("largest", 0)], 2).unwrap();
        let v = f32s(&low[0]);
        assert!(v[..3] == [1.0, 3.0, 3.0][..] && v[3].is_nan() && v[4..] == [-5.0, -1.0, -1.0, 2.0][..], "{v:?}");
        assert_eq!(low[1].data, Data::I64(vec![0, 1, 3, 2, 3, 0, 1, 2]));
        let ints = Tensor::new(vec![3, 2], Data::I64(vec![i64::MIN, 7, 5, 7, i64::MAX, 0]));
        let top = eval_outputs("TopK", 11, vec![ints, k(2)], vec![attr_i("axis", 0)], 2).unwrap();
        assert_eq!(top[0].data, Data::I64(vec![i64::MAX, 7, 5, 7]));
        assert_eq!((top[0].shape.clone(), top[1].data.clone()), (vec![2, 2], Data::I64(vec![2, 0, 1, 1])));
    }
    /// CausalConvWithState: zeros (or the past) before the input, a depthwise conv, the last
    /// k − 1 positions as the state; SiLU after when asked.
    #[test]
    fn causal_conv_with_state_convolves_after_the_past() {
        let x = Tensor::f32(vec![1, 1, 3], vec![1.0, 2.0, 3.0]);
        let w = Tensor::f32(vec![1, 1, 2], vec![10.0, 1.0]);
        let y = eval_outputs("CausalConvWithState", 27, vec![x.clone(), w.clone()], vec![], 2).unwrap();
        assert_eq!((f32s(&y[0]), f32s(&y[1])), (vec![1.0, 12.0, 23.0], vec![3.0]));
        let past = Tensor::f32(vec![1, 1, 1], vec![5.0]);
        let bias = Tensor::f32(vec![1], vec![0.5]);
        let silu = AttributeProto { name: Some("activation".into()), s: Some(b"silu".to_vec()), ..Default::default() };
        let y = eval_outputs("CausalConvWithState", 27, vec![x, w, bias, past], vec![silu], 2).unwrap();
        let want: Vec<f32> = [51.5f32, 12.5, 23.5].iter().map(|v| v / (1.0 + (-v).exp())).collect();
        for (got, want) in f32s(&y[0]).iter().zip(want) {
            assert!((got - want).abs() <= 1e-6 * want.abs(), "{got} against {want}");
        }
    }
    /// LRN over three channels of one pixel; Col2Im of a row; BitCast of bytes.
    #[test]
    fn lrn_col2im_and_bit_cast_follow_onnx_reference() {
        let x = Tensor::f32(vec![1, 3, 1, 1], vec![1.0, 2.0, 3.0]);
        let attrs = vec![attr_i("size", 3), attr_f("alpha", 3.0), attr_f("beta", 1.0), attr_f("bias", 1.0)];
        let y = f32s(&eval("LRN", 13, vec![x], attrs).unwrap());
        assert_eq!(y, vec![1.0 / 6.0, 2.0 / 15.0, 3.0 / 14.0]);
        // Blocks of 1×2 over a 1×3 image: pixel w sums the entries (b, l) with b + l = w.
        let cols = Tensor::f32(vec![1, 2, 2], vec![1.0, 2.0, 10.0, 20.0]);
        let shape = |v: &[i64]| Tensor::new(vec![v.len()], Data::I64(v.to_vec()));
        let y = eval("Col2Im", 18, vec![cols, shape(&[1, 3]), shape(&[1, 2])], vec![]).unwrap();
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 1, 1, 3], vec![1.0, 12.0, 20.0]));
        let bytes = Tensor::new(vec![3], Data::I8(vec![-1, -128, 5]));
        let u = eval("BitCast", 26, vec![bytes], vec![attr_i("to", 2)]).unwrap();
        assert_eq!(u.data, Data::U8(vec![255, 128, 5]));
        let e = eval("BitCast", 26, vec![Tensor::f32(vec![1], vec![1.0])], vec![attr_i("to", 6)]).unwrap_err();
        assert!(e.contains("BitCast from f32 to i32 is not supported"), "{e}");
    }
    /// Training BatchNormalization: the batch's mean 2.5 and biased variance 1.25, and
    /// the running statistics moved a tenth of the way toward them.
    #[test]
    fn batch_norm_training_uses_the_batch_statistics() {
        let x = Tensor::f32(vec![2, 1, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let one = |v: f32| Tensor::f32(vec![1], vec![v]);
        let args = vec![x, one(2.0), one(0.5), one(1.0), one(3.0)];
        let y = eval_outputs("BatchNormalization", 15, args, vec![attr_i("training_mode", 1)], 3).unwrap();
        let r = 1.0 / (1.25f32 + 1e-5).sqrt();
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0].iter().map(|v| (v - 2.5) * r * 2.0 + 0.5).collect();
        for (got, want) in f32s(&y[0]).iter().zip(&want) {
            assert!((got - want).abs() < 1e-6, "{got} against {want}");
        }
        let (mean, var) = (f32s(&y[1])[0], f32s(&y[2])[0]);
        assert!((mean - 1.15).abs() < 1e-6 && (var - 2.825).abs() < 1e-6, "{mean} {var}");
    }
    /// CumProd of 1..5 every way, and of int32 along axis 0.
    #[test]
    fn cum_prod_gives_every_prefix_product() {
        let x = Tensor::new(vec![5], Data::I64((1..=5).collect()));
        let axis = Tensor::new(vec![], Data::I64(vec![0]));
        let run = |ex: i64, rev: i64| {
            eval("CumProd", 26, vec![x.clone(), axis.clone()], vec![attr_i("exclusive", ex), attr_i("reverse", rev)])
                .unwrap()
                .data
        };
        assert_eq!(run(0, 0), Data::I64(vec![1, 2, 6, 24, 120]));
        assert_eq!(run(1, 0), Data::I64(vec![1, 1, 2, 6, 24]));
        assert_eq!(run(0, 1), Data::I64(vec![120, 120, 60, 20, 5]));
        assert_eq!(run(1, 1), Data::I64(vec![120, 60, 20, 5, 1]));
        let m = Tensor::new(vec![3, 2], Data::I32(vec![1, 2, 3, 4, 5, 6]));
        let y = eval("CumProd", 26, vec![m, axis], vec![]).unwrap();
        assert_eq!(y.data, Data::I32(vec![1, 2, 3, 8, 15, 48]));
    }
    /// MaxUnpool puts each value at its flat index in zeros, grown to output_shape.
    #[test]
    fn max_unpool_writes_each_value_at_its_index() {
        let x = Tensor::f32(vec![1, 1, 1, 2], vec![5.0, 6.0]);
        let idx = Tensor::new(vec![1, 1, 1, 2], Data::I64(vec![1, 2]));
        let attrs = || vec![attr_ints("kernel_shape", &[1, 2]), attr_ints("strides", &[1, 2])];
        let y = eval("MaxUnpool", 11, vec![x.clone(), idx.clone()], attrs()).unwrap();
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![1, 1, 1, 4], vec![0.0, 5.0, 6.0, 0.0]));
        let out = Tensor::new(vec![4], Data::I64(vec![1, 1, 2, 4]));
        let y = eval("MaxUnpool", 11, vec![x, idx, out], attrs()).unwrap();
        assert_eq!(f32s(&y), vec![0.0, 5.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }
}
