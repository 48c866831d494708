//! ONNX's linear quantization onto meshc's ops (docs/onnx.md), each step exact or rounded
//! where ONNX's reference rounds: DequantizeLinear is `(x − zero point) · scale` in f32,
//! QuantizeLinear `round_half_even(x / scale) + zero point` clamped to the zero point's type
//! and cast into it, DynamicQuantizeLinear the same with the scale and zero point it derives
//! from x's range (ONNX's reference formula), MatMulInteger the i32 product of the operands
//! less their zero points (compiled code runs it as the integer GEMM), QLinearMatMul that
//! product requantized, ConvInteger and QLinearConv the same of a conv (in f32 when every
//! partial sum is provably an integer below 2^24, else refused: the IR's conv is f32).
//! Scales and zero points are per tensor (one value), per
//! axis (a 1-D tensor along `axis`) or blocked (`block_size` slices of `axis` each). A scale
//! known at import must be finite and positive; shapes that do not fit are refused naming
//! the tensor.

use meshc_ir::infer::norm_axis;
use meshc_ir::{Attr, DType, Op, Tensor};

use super::builder::Value;
use super::ops::{cast, i64_table, one, reshape, scalar, Converter, Ctx, R};
use super::ops_math::Steps;
use super::tensors;

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(10, "DequantizeLinear", |b, c| one(dequantize(&mut Steps { b, c }))),
    Converter::since(10, "QuantizeLinear", |b, c| one(quantize(&mut Steps { b, c }))),
    Converter::since(11, "DynamicQuantizeLinear", |b, c| dynamic_quantize(&mut Steps { b, c })),
    Converter::since(10, "MatMulInteger", |b, c| one(matmul_integer(&mut Steps { b, c }))),
    Converter::since(10, "QLinearMatMul", |b, c| one(qlinear_matmul(&mut Steps { b, c }))),
    Converter::since(10, "ConvInteger", |b, c| one(conv_integer(&mut Steps { b, c }))),
    Converter::since(10, "QLinearConv", |b, c| one(qlinear_conv(&mut Steps { b, c }))),
];

/// The ONNX name of input `i`, quoted, for errors.
fn input_name(c: &Ctx, i: usize) -> String {
    let name = c.node.input.get(i).map_or("", String::as_str);
    format!("'{}'", meshc_ir::error::shorten(name))
}

/// The parameter names ONNX gives a quantization op's inputs (x, its scale, its zero point).
fn roles(c: &Ctx) -> [&'static str; 3] {
    match c.node.op_type.as_deref() {
        Some("QuantizeLinear") => ["x", "y_scale", "y_zero_point"],
        _ => ["x", "x_scale", "x_zero_point"],
    }
}

/// The scale (input 1) and zero point (input 2, if given) of a quantization of `x`, shaped to
/// broadcast against it: a scalar per tensor, `[n, 1, …]` per axis, x's shape when blocked.
/// A zero point is cast to `zp_as` (f32 or i32), so that both are ready for arithmetic.
fn scale_and_zero_point(s: &mut Steps, x: &Value, zp_as: DType) -> R<(Value, Option<Value>)> {
    let [_, scale_role, zp_role] = roles(s.c);
    let xs = s.b.ty(x).shape;
    let scale = s.c.arg(1)?.clone();
    let st = s.b.ty(&scale);
    if st.dtype != DType::F32 {
        return Err(format!("{scale_role} {} is {}, not a float", input_name(s.c, 1), st.dtype));
    }
    if let Some(t) = scale.as_const() {
        check_scale(t, &format!("{scale_role} {}", input_name(s.c, 1)))?;
    }
    let zp = s.c.opt(2).cloned();
    if let Some(z) = &zp {
        let zt = s.b.ty(z);
        if zt.shape != st.shape && !(zt.numel() == 1 && st.numel() == 1 && zt.rank() <= 1 && st.rank() <= 1) {
            return Err(format!(
                "{zp_role} {} is {}, {scale_role} {} is {}: they must have the same shape",
                input_name(s.c, 2),
                zt,
                input_name(s.c, 1),
                st
            ));
        }
    }
    let block = s.c.int("block_size", 0);
    let axis = s.c.int("axis", 1);
    let per_tensor = st.numel() == 1 && st.rank() <= 1 && block == 0;
    if s.c.opset < 13 && !per_tensor {
        return Err(format!("{scale_role} {} is {}: before opset 13 it must be a scalar", input_name(s.c, 1), st));
    }
    // Each of scale and zero point gets the same view of x's axis.
    let view = |s: &mut Steps, v: Value, what: &str| -> R<Value> {
        if per_tensor {
            return reshape(s.b, &v, &[], &s.c.part(what));
        }
        let ax = norm_axis(axis, xs.len()).map_err(|e| format!("axis {axis}: {e}"))?;
        let st = s.b.ty(&v).shape;
        if block == 0 {
            if st.len() != 1 || st[0] != xs[ax] {
                return Err(format!(
                    "{scale_role} {} is {}, x is {}: per-axis scales are one per slice of x along axis {axis} ({})",
                    input_name(s.c, 1),
                    meshc_ir::dtype::ShapeDisplay(&st),
                    meshc_ir::dtype::ShapeDisplay(&xs),
                    xs[ax]
                ));
            }
            let mut to = vec![1i64; xs.len() - ax];
            to[0] = xs[ax] as i64;
            return reshape(s.b, &v, &to, &s.c.part(what));
        }
        // Blocked: element i of the axis takes scale i / block (numpy's repeat, cut to x).
        let b = usize::try_from(block)
            .ok()
            .filter(|&b| b > 0)
            .ok_or_else(|| format!("block_size {block} is not positive"))?;
        // Every block holds part of x (ONNX's range of block sizes for a scale this long).
        let fits =
            st.len() == xs.len() && (0..xs.len()).all(|d| st[d] == if d == ax { xs[d].div_ceil(b) } else { xs[d] });
        if !fits {
            return Err(format!(
                "{scale_role} {} is {}, x is {}: blocks of {b} along axis {axis} need x's shape there divided into ceil({}/{b}) blocks",
                input_name(s.c, 1),
                meshc_ir::dtype::ShapeDisplay(&st),
                meshc_ir::dtype::ShapeDisplay(&xs),
                xs[ax]
            ));
        }
        let idx = i64_table("the block index", vec![xs[ax]], |i| (i / b) as i64)?;
        s.op(&format!("{what}_blocks"), Op::Gather, &[&v, &idx], &[("axis", Attr::Int(ax as i64))])
    };
    let scale = view(s, scale, "scale")?;
    let zp = match zp {
        Some(z) => {
            let z = cast(s.b, &z, zp_as, &s.c.part("zero_point_wide"))?;
            Some(view(s, z, "zero_point")?)
        }
        None => None,
    };
    Ok((scale, zp))
}

/// A scale known at import: every element finite and positive (a zero scale divides by zero,
/// a negative one flips the quantized values' order, neither is a quantization).
fn check_scale(t: &Tensor, what: &str) -> R<()> {
    match t.data.iter_f64().enumerate().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
        Some((i, v)) => {
            let at = if t.numel() > 1 { format!(" at element {i}") } else { String::new() };
            Err(format!("{what} holds {v}{at}: a scale must be finite and positive"))
        }
        None => Ok(()),
    }
}

fn dequantize(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    let xt = s.b.ty(x);
    if !matches!(xt.dtype, DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I32) {
        return Err(format!(
            "x {} is {}: DequantizeLinear takes int8, uint8, int16, uint16 or int32",
            input_name(s.c, 0),
            xt.dtype
        ));
    }
    if let Some(z) = s.c.opt(2) {
        if s.b.ty(z).dtype != xt.dtype {
            return Err(format!(
                "x_zero_point {} is {}, x {} is {}: they must have the same type",
                input_name(s.c, 2),
                s.b.ty(z).dtype,
                input_name(s.c, 0),
                xt.dtype
            ));
        }
    }
    let out = s.c.int("output_dtype", 0);
    if out != 0 && tensors::dtype(out as i32)? != DType::F32 {
        return Err(format!("output_dtype {out} is not a float type"));
    }
    let (scale, zp) = scale_and_zero_point(s, x, DType::F32)?;
    // 8- and 16-bit values and their differences are exact in f32; the product rounds once, as
    // ONNX's reference and onnxruntime round it.
    let wide = cast(s.b, x, DType::F32, &s.c.part("wide"))?;
    let centred = match zp {
        Some(z) => s.op0("centred", Op::Sub, &[&wide, &z])?,
        None => wide,
    };
    s.op0("", Op::Mul, &[&centred, &scale])
}

/// The integer type a quantization writes: its zero point's, else `output_dtype`'s, else u8.
fn quantized_type(s: &Steps) -> R<DType> {
    let out = s.c.int("output_dtype", 0);
    let dtype = match s.c.opt(2) {
        Some(z) => s.b.ty(z).dtype,
        None if out != 0 => tensors::dtype(out as i32)?,
        None => DType::U8,
    };
    if out != 0 && tensors::dtype(out as i32)? != dtype {
        return Err(format!("output_dtype {out} is not the type of y_zero_point {} ({dtype})", input_name(s.c, 2)));
    }
    if !matches!(dtype, DType::I8 | DType::U8 | DType::I16 | DType::U16) {
        return Err(format!("quantizing to {dtype} is not supported (int8, uint8, int16, uint16)"));
    }
    Ok(dtype)
}

/// `saturate(round_half_even(x / scale) + zero point)` into `to`: x / scale as ONNX's
/// reference divides (f32), the sum exact below 2^24 (beyond it the clamp gives the bound
/// whatever it rounded to), the cast exact on the clamped integers.
fn quantize_into(s: &mut Steps, x: &Value, scale: &Value, zp: Option<&Value>, to: DType, step: &str) -> R<Value> {
    let (lo, hi) = to.int_range().expect("an integer type");
    let part = |what: &str| if step.is_empty() { what.to_string() } else { format!("{step}_{what}") };
    let scaled = s.op0(&part("scaled"), Op::Div, &[x, scale])?;
    let mut q = s.op0(&part("rounded"), Op::Round, &[&scaled])?;
    if let Some(z) = zp {
        q = s.op0(&part("shifted"), Op::Add, &[&q, z])?;
    }
    let q = s.op0(&part("floor"), Op::Maximum, &[&q, &scalar(DType::F32, lo)])?;
    let q = s.op0(&part("clamped"), Op::Minimum, &[&q, &scalar(DType::F32, hi)])?;
    let name = if step.is_empty() { s.c.out.clone() } else { s.c.part(step) };
    cast(s.b, &q, to, &name)
}

fn quantize(s: &mut Steps) -> R<Value> {
    let x = s.c.arg(0)?;
    let xt = s.b.ty(x);
    if !matches!(xt.dtype, DType::F32 | DType::I32) {
        return Err(format!("x {} is {}: QuantizeLinear takes a float or int32", input_name(s.c, 0), xt.dtype));
    }
    let to = quantized_type(s)?;
    let x = cast(s.b, x, DType::F32, &s.c.part("wide"))?;
    let (scale, zp) = scale_and_zero_point(s, &x, DType::F32)?;
    quantize_into(s, &x, &scale, zp.as_ref(), to, "")
}

/// y, y_scale and y_zero_point as ONNX's reference computes them, in f32: the range of x
/// widened to hold 0, its 255th (1/255 when x is all zeros), the zero point
/// `round(clamp(−min / scale, 0, 255))`, and x quantized with them.
fn dynamic_quantize(s: &mut Steps) -> R<Vec<Value>> {
    let x = s.c.arg(0)?;
    if s.b.ty(x).dtype != DType::F32 {
        return Err(format!("x {} is {}: DynamicQuantizeLinear takes a float", input_name(s.c, 0), s.b.ty(x).dtype));
    }
    let all = [("keepdims", Attr::Bool(false))];
    let zero = scalar(DType::F32, 0.0);
    let top = s.op("max", Op::ReduceMax, &[x], &all)?;
    let negated = s.op0("negated", Op::Neg, &[x])?;
    let bottom = s.op("negated_min", Op::ReduceMax, &[&negated], &all)?;
    let bottom = s.op0("min", Op::Neg, &[&bottom])?;
    let top = s.op0("max0", Op::Maximum, &[&top, &zero])?;
    let bottom = s.op0("min0", Op::Minimum, &[&bottom, &zero])?;
    let range = s.op0("range", Op::Sub, &[&top, &bottom])?;
    let flat = s.op0("flat", Op::Equal, &[&top, &bottom])?;
    let range = s.op("range1", Op::Where, &[&flat, &scalar(DType::F32, 1.0), &range], &[])?;
    let scale = s.op0("y_scale", Op::Div, &[&range, &scalar(DType::F32, 255.0)])?;
    let shift = s.op0("min_scaled", Op::Div, &[&bottom, &scale])?;
    let zp = s.op0("zero_point_raw", Op::Sub, &[&zero, &shift])?;
    let zp = s.op0("zero_point_floor", Op::Maximum, &[&zp, &zero])?;
    let zp = s.op0("zero_point_clamped", Op::Minimum, &[&zp, &scalar(DType::F32, 255.0)])?;
    let zp = s.op0("zero_point_f32", Op::Round, &[&zp])?;
    let y = quantize_into(s, x, &scale, Some(&zp), DType::U8, "")?;
    let zp = cast(s.b, &zp, DType::U8, &s.c.part("y_zero_point"))?;
    Ok(vec![y, scale, zp])
}

/// The largest |v − zero point| an operand of ConvInteger can hold: from its values when
/// they are known at import, else from its type and its zero point when that is known.
fn centred_bound(centred: &Value, dtype: DType, zp: Option<&Value>) -> f64 {
    if let Some(t) = centred.as_const() {
        return t.data.iter_f64().fold(0.0, |m, v| m.max(v.abs()));
    }
    let (lo, hi) = dtype.int_range().expect("an 8-bit type");
    match zp.map(|z| z.as_const()) {
        None => lo.abs().max(hi),
        Some(Some(t)) => t.data.iter_f64().fold(0.0, |m, z| m.max(z - lo).max(hi - z)),
        Some(None) => hi - lo,
    }
}

/// MatMulInteger: (a − a_zero_point) @ (b − b_zero_point) in i32.
fn matmul_integer(s: &mut Steps) -> R<Value> {
    let out = s.c.out.clone();
    integer_product(s, [0, 2, 1, 3], ["A", "a_zero_point", "B", "b_zero_point"], &out)
}

/// QLinearMatMul: the integer product scaled by a_scale · b_scale / y_scale (in f32, as
/// onnxruntime computes it) and quantized with y's zero point, as ONNX's reference writes it:
/// `saturate(round_half_even(C · scale + y_zero_point))`.
fn qlinear_matmul(s: &mut Steps) -> R<Value> {
    let name = s.c.part("product");
    let product = integer_product(s, [0, 2, 3, 5], ["a", "a_zero_point", "b", "b_zero_point"], &name)?;
    let (rows, cols) = product_sides(&s.b.ty(s.c.arg(0)?), &s.b.ty(s.c.arg(3)?));
    let a_scale = float_scale(s, 1, "a_scale")?;
    let a_scale = side_view(s, &a_scale, 1, "a_scale", Side::Rows(rows))?;
    let b_scale = float_scale(s, 4, "b_scale")?;
    let b_scale = side_view(s, &b_scale, 4, "b_scale", Side::Cols(cols))?;
    requantize(s, &product, &a_scale, &b_scale)
}

/// QLinearConv: ConvInteger's exact product plus the i32 bias, requantized as QLinearMatMul
/// (w_scale per tensor or per output channel).
fn qlinear_conv(s: &mut Steps) -> R<Value> {
    let name = s.c.part("product");
    let mut product = integer_conv(s, [0, 2, 3, 5], ["x", "x_zero_point", "w", "w_zero_point"], &name)?;
    let channels = s.b.ty(s.c.arg(3)?).shape[0];
    if let Some(bias) = s.c.opt(8).cloned() {
        let bt = s.b.ty(&bias);
        if bt.dtype != DType::I32 || bt.shape != [channels] {
            return Err(format!(
                "B {} is {bt}: it must be i32[{channels}], one per output channel",
                input_name(s.c, 8)
            ));
        }
        let rank = s.b.ty(&product).rank();
        let bias = reshape(s.b, &bias, &channel_shape(channels, rank, 1), &s.c.part("bias_view"))?;
        product = s.op0("biased", Op::Add, &[&product, &bias])?;
    }
    let x_scale = float_scale(s, 1, "x_scale")?;
    let x_scale = side_view(s, &x_scale, 1, "x_scale", Side::One)?;
    let w_scale = float_scale(s, 4, "w_scale")?;
    let rank = s.b.ty(&product).rank();
    let w_scale = channel_view(s, &w_scale, 4, "w_scale", channels, rank, 1)?;
    requantize(s, &product, &x_scale, &w_scale)
}

/// Scale input `i` (named `role`) of a QLinear op: f32, finite and positive when known.
fn float_scale(s: &mut Steps, i: usize, role: &str) -> R<Value> {
    let v = s.c.arg(i)?.clone();
    if s.b.ty(&v).dtype != DType::F32 {
        return Err(format!("{role} {} is {}, not a float", input_name(s.c, i), s.b.ty(&v).dtype));
    }
    // ONNX's reference scales in the half's precision, meshc in f32: results would differ.
    let half = matches!(v, Value::Const { half: Some(_), .. }) || s.b.half_origin(&v).is_some();
    if half {
        let op = s.c.node.op_type.as_deref().unwrap_or("");
        return Err(format!("{role} {} is a half float: {op} takes f32 scales", input_name(s.c, i)));
    }
    if let Some(t) = v.as_const() {
        check_scale(t, &format!("{role} {}", input_name(s.c, i)))?;
    }
    Ok(v)
}

/// The i32 `product` of two quantized operands, scaled by `in_a · in_b / y_scale` (input 6)
/// in f32, plus y's zero point (input 7; a scalar, whose type the result takes, else the
/// first operand's), rounded half to even, clamped to the type and cast into it.
fn requantize(s: &mut Steps, product: &Value, in_a: &Value, in_b: &Value) -> R<Value> {
    let to = match s.c.opt(7) {
        Some(z) => s.b.ty(z).dtype,
        None => s.b.ty(s.c.arg(0)?).dtype,
    };
    if !to.is_byte() {
        let op = s.c.node.op_type.as_deref().unwrap_or("");
        return Err(format!("y_zero_point {} is {to}: {op} writes int8 or uint8", input_name(s.c, 7)));
    }
    let y_scale = float_scale(s, 6, "y_scale")?;
    let y_scale = side_view(s, &y_scale, 6, "y_scale", Side::One)?;
    let ab = s.op0("scale_in", Op::Mul, &[in_a, in_b])?;
    let scale = s.op0("scale", Op::Div, &[&ab, &y_scale])?;
    let wide = cast(s.b, product, DType::F32, &s.c.part("product_f32"))?;
    let mut q = s.op0("scaled", Op::Mul, &[&wide, &scale])?;
    if let Some(z) = s.c.opt(7).cloned() {
        let z = side_view(s, &z, 7, "y_zero_point", Side::One)?;
        let z = cast(s.b, &z, DType::F32, &s.c.part("y_zero_point_f32"))?;
        q = s.op0("shifted", Op::Add, &[&q, &z])?;
    }
    let q = s.op0("rounded", Op::Round, &[&q])?;
    let (lo, hi) = to.int_range().expect("an integer type");
    let q = s.op0("floor", Op::Maximum, &[&q, &scalar(DType::F32, lo)])?;
    let q = s.op0("clamped", Op::Minimum, &[&q, &scalar(DType::F32, hi)])?;
    cast(s.b, &q, to, &s.c.out)
}

/// ConvInteger: the conv of `x − x_zero_point` (per tensor) and `w − w_zero_point` (per tensor
/// or per output channel), zero-padded after centring as ONNX's reference pads, in i32.
fn conv_integer(s: &mut Steps) -> R<Value> {
    let out = s.c.out.clone();
    integer_conv(s, [0, 2, 1, 3], ["x", "x_zero_point", "w", "w_zero_point"], &out)
}

/// `[1, …, n, …, 1]` of `rank` dims with `n` at `at`: a per-channel value's broadcast shape.
fn channel_shape(n: usize, rank: usize, at: usize) -> Vec<i64> {
    (0..rank).map(|d| if d == at { n as i64 } else { 1 }).collect()
}

/// Input `i` (named `role`): a scalar, or one value per channel viewed along dim `at` of `rank`.
fn channel_view(s: &mut Steps, v: &Value, i: usize, role: &str, n: usize, rank: usize, at: usize) -> R<Value> {
    let t = s.b.ty(v);
    let shape = match (t.numel(), t.rank()) {
        (1, 0 | 1) => vec![],
        (m, 1) if m == n => channel_shape(n, rank, at),
        _ => {
            return Err(format!(
                "{role} {} is {}: it must be a scalar or 1-D, one per output channel ({n})",
                input_name(s.c, i),
                meshc_ir::dtype::ShapeDisplay(&t.shape)
            ))
        }
    };
    reshape(s.b, v, &shape, &s.c.part(&format!("{role}_view")))
}

/// The conv of the 8-bit inputs `at` = [x, x_zp, w, w_zp] (named `names`) less their zero
/// points, i32, named `out`: an f32 conv of exact integers while every partial sum stays below
/// 2^24 (K = input channels per group · kernel size terms), else refused: the IR's conv is f32.
fn integer_conv(s: &mut Steps, at: [usize; 4], names: [&str; 4], out: &str) -> R<Value> {
    let op = s.c.node.op_type.clone().unwrap_or_default();
    let mut centred = Vec::new();
    let mut bounds = [0.0; 2];
    let w_ty = s.b.ty(s.c.arg(at[2])?);
    for j in 0..2 {
        let (vi, zi) = (at[2 * j], at[2 * j + 1]);
        let v = s.c.arg(vi)?.clone();
        let t = s.b.ty(&v);
        if !t.dtype.is_byte() || t.rank() < 3 {
            return Err(format!(
                "{} {} is {t}: {op} takes int8 or uint8 of rank 3 or more",
                names[2 * j],
                input_name(s.c, vi)
            ));
        }
        let wide = cast(s.b, &v, DType::I32, &s.c.part(&format!("{}_wide", names[2 * j])))?;
        let zp = s.c.opt(zi).cloned();
        let c = match &zp {
            None => wide,
            Some(z) => {
                if s.b.ty(z).dtype != t.dtype {
                    return Err(format!(
                        "{} {} is {}, its operand {}: they must have the same type",
                        names[2 * j + 1],
                        input_name(s.c, zi),
                        s.b.ty(z).dtype,
                        t.dtype
                    ));
                }
                let zw = cast(s.b, z, DType::I32, &s.c.part(&format!("{}_wide", names[2 * j + 1])))?;
                let zw = if j == 0 {
                    side_view(s, &zw, zi, names[1], Side::One)?
                } else {
                    channel_view(s, &zw, zi, names[3], w_ty.shape[0], w_ty.rank(), 0)?
                };
                s.op0(&format!("{}_centred", names[2 * j]), Op::Sub, &[&wide, &zw])?
            }
        };
        bounds[j] = centred_bound(&c, t.dtype, zp.as_ref());
        centred.push(c);
    }
    let k: usize = w_ty.shape[1..].iter().product();
    if (k as f64) * bounds[0] * bounds[1] >= (1u64 << 24) as f64 {
        return Err(format!(
            "its sums of {k} products can pass 2^24, beyond which f32 is not exact, and meshc has no integer conv yet"
        ));
    }
    let xf = cast(s.b, &centred[0], DType::F32, &s.c.part("x_f32"))?;
    let wf = cast(s.b, &centred[1], DType::F32, &s.c.part("w_f32"))?;
    let y = super::nn::conv_of(s.b, s.c, &xf, &wf, None, &format!("{out}_f32"))?;
    cast(s.b, &y, DType::I32, out)
}

/// How a product's zero point or scale may vary: over a's rows, over b's columns, or not.
#[derive(Clone, Copy)]
enum Side {
    Rows(usize),
    Cols(usize),
    One,
}

/// The rows of a (1 for a vector) and the columns of b (1 for a vector).
fn product_sides(a: &meshc_ir::TensorType, b: &meshc_ir::TensorType) -> (usize, usize) {
    let rows = if a.rank() > 1 { a.shape[a.rank() - 2] } else { 1 };
    let cols = if b.rank() > 1 { b.shape[b.rank() - 1] } else { 1 };
    (rows, cols)
}

/// Input `i` (a zero point or scale named `role`) viewed to broadcast over the product: a
/// scalar, `[rows, 1]` per row of a, `[cols]` per column of b.
fn side_view(s: &mut Steps, v: &Value, i: usize, role: &str, side: Side) -> R<Value> {
    let t = s.b.ty(v);
    let shape: Vec<i64> = match (t.numel(), t.rank(), side) {
        (1, 0 | 1, _) => vec![],
        (n, 1, Side::Rows(m)) if n == m => vec![n as i64, 1],
        (n, 1, Side::Cols(m)) if n == m => vec![n as i64],
        _ => {
            let what = match side {
                Side::Rows(m) => format!("a scalar or 1-D, one per row of the left operand ({m})"),
                Side::Cols(m) => format!("a scalar or 1-D, one per column of the right operand ({m})"),
                Side::One => "a scalar".to_string(),
            };
            return Err(format!(
                "{role} {} is {}: it must be {what}",
                input_name(s.c, i),
                meshc_ir::dtype::ShapeDisplay(&t.shape)
            ));
        }
    };
    reshape(s.b, v, &shape, &s.c.part(&format!("{role}_view")))
}

/// `(a − a_zero_point) @ (b − b_zero_point)` of the 8-bit inputs `at` = [a, a_zp, b, b_zp]
/// (named `names`), zero points per tensor, per row of a or per column of b; i32, named `out`.
fn integer_product(s: &mut Steps, at: [usize; 4], names: [&str; 4], out: &str) -> R<Value> {
    let (a, b) = (s.c.arg(at[0])?.clone(), s.c.arg(at[2])?.clone());
    let (a_ty, b_ty) = (s.b.ty(&a), s.b.ty(&b));
    let op = s.c.node.op_type.clone().unwrap_or_default();
    for (t, i) in [(&a_ty, 0), (&b_ty, 2)] {
        if !t.dtype.is_byte() {
            return Err(format!("{} {} is {}: {op} takes int8 or uint8", names[i], input_name(s.c, at[i]), t.dtype));
        }
        if t.rank() == 0 {
            return Err(format!("{} {} is a scalar: {op} takes matrices", names[i], input_name(s.c, at[i])));
        }
    }
    let (rows, cols) = product_sides(&a_ty, &b_ty);
    let mut centred = Vec::new();
    for (j, (v, t, side)) in [(&a, &a_ty, Side::Rows(rows)), (&b, &b_ty, Side::Cols(cols))].into_iter().enumerate() {
        let (zi, role) = (at[2 * j + 1], names[2 * j + 1]);
        let zp = s.c.opt(zi).cloned();
        let side_name = ["a", "b"][j];
        let wide = cast(s.b, v, DType::I32, &s.c.part(&format!("{side_name}_wide")))?;
        let c = match &zp {
            None => wide,
            Some(z) => {
                let zt = s.b.ty(z);
                if zt.dtype != t.dtype {
                    return Err(format!(
                        "{role} {} is {}, its operand {}: they must have the same type",
                        input_name(s.c, zi),
                        zt.dtype,
                        t.dtype
                    ));
                }
                let zw = cast(s.b, z, DType::I32, &s.c.part(&format!("{role}_wide")))?;
                let zw = side_view(s, &zw, zi, role, side)?;
                s.op0(&format!("{side_name}_centred"), Op::Sub, &[&wide, &zw])?
            }
        };
        centred.push(c);
    }
    // The i32 matmul, wrapping like ONNX's accumulator: `compile` runs it as the integer
    // GEMM, whose kernels take each row of a and column of b back to 8 bits.
    s.b.node(out, Op::MatMul, &[&centred[0], &centred[1]], &[])
}
