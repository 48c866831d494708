//! The CNN and data-movement ONNX ops (docs/onnx.md): Conv and the pools onto meshc's
//! window ops, with `auto_pad` resolved into explicit pads; BatchNormalization as one
//! per-channel mul and add (computed at import when its statistics are constants);
//! Instance/GroupNormalization, DepthToSpace and SpaceToDepth decomposed; Pad onto `pad`;
//! and the index-driven ops as gathers with tables computed at import: Resize (each resized
//! axis a gather, or for linear/cubic a gather of the neighbours and a weighted sum, with
//! ONNX's coordinate transformations), Tile, GatherElements (a gather from the flattened
//! data) and OneHot (a gather of the rows of an identity pattern).

use meshc_ir::budget;
use meshc_ir::infer::norm_axis;
use meshc_ir::{Attr, DType, Data, Op, Tensor};

use super::builder::{Builder, Value};
use super::ops::{cast, i64_table, one, reshape, scalar, table, Converter, Ctx, R};

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(1, "Conv", |b, c| one(conv(b, c))),
    Converter::since(8, "MaxPool", |b, c| one(pool(b, c, true))),
    Converter::since(7, "AveragePool", |b, c| one(pool(b, c, false))),
    Converter::since(1, "GlobalAveragePool", |b, c| one(global_pool(b, c, false))),
    Converter::since(1, "GlobalMaxPool", |b, c| one(global_pool(b, c, true))),
    Converter::since(9, "BatchNormalization", batch_norm),
    Converter::since(6, "InstanceNormalization", |b, c| one(instance_norm(b, c))),
    Converter::new("GroupNormalization", |b, c| one(group_norm(b, c))),
    Converter::since(2, "Pad", |b, c| one(pad(b, c))),
    Converter::since(11, "Resize", |b, c| one(resize(b, c))),
    Converter::since(6, "Tile", |b, c| one(tile(b, c))),
    Converter::since(1, "DepthToSpace", |b, c| one(depth_to_space(b, c))),
    Converter::since(1, "SpaceToDepth", |b, c| one(space_to_depth(b, c))),
    Converter::since(11, "GatherElements", |b, c| one(gather_elements(b, c))),
    Converter::since(9, "OneHot", |b, c| one(one_hot(b, c))),
    Converter::new("CausalConvWithState", causal_conv),
    Converter::since(1, "LRN", |b, c| one(lrn(b, c))),
    Converter::since(18, "Col2Im", |b, c| one(col2im(b, c))),
    Converter::since(11, "MaxUnpool", |b, c| one(max_unpool(b, c))),
];

fn ints(v: &[i64]) -> Attr {
    Attr::ints(v)
}

/// Explicit pads (begins, then ends) of a window op, from `pads` or `auto_pad`.
fn window_pads(c: &Ctx, input: &[usize], span: &[usize], strides: &[i64]) -> R<Vec<i64>> {
    let n = input.len();
    match c.string("auto_pad", "NOTSET").as_str() {
        "NOTSET" => {
            let pads = c.ints("pads").unwrap_or_else(|| vec![0; 2 * n]);
            if pads.len() != 2 * n {
                return Err(format!("pads has {} entries, expected {}", pads.len(), 2 * n));
            }
            Ok(pads)
        }
        "VALID" => Ok(vec![0; 2 * n]),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let mut pads = vec![0; 2 * n];
            for d in 0..n {
                let (i, s) = (input[d] as i64, strides[d]);
                let out = (i + s - 1) / s;
                let total = ((out - 1) * s + span[d] as i64 - i).max(0);
                let small = total / 2;
                (pads[d], pads[n + d]) =
                    if mode == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
            }
            Ok(pads)
        }
        other => Err(format!("auto_pad '{other}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")),
    }
}

pub(super) fn ones_or(c: &Ctx, name: &str, n: usize) -> R<Vec<i64>> {
    let v = c.ints(name).unwrap_or_else(|| vec![1; n]);
    if v.len() != n || v.iter().any(|&s| s < 1) {
        return Err(format!("{name} {v:?} must hold {n} positive entries"));
    }
    Ok(v)
}

/// strides, dilations and explicit pads of a window op over `input` spatial sizes.
pub(super) fn window_attrs(c: &Ctx, input: &[usize], kernel: &[usize]) -> R<Vec<(&'static str, Attr)>> {
    let n = input.len();
    let strides = ones_or(c, "strides", n)?;
    let dilations = ones_or(c, "dilations", n)?;
    let span: Vec<usize> = (0..n).map(|d| (kernel[d] - 1) * dilations[d] as usize + 1).collect();
    let pads = window_pads(c, input, &span, &strides)?;
    Ok(vec![("strides", ints(&strides)), ("dilations", ints(&dilations)), ("pads", ints(&pads))])
}

fn conv(b: &mut Builder, c: &Ctx) -> R<Value> {
    conv_of(b, c, c.arg(0)?, c.arg(1)?, c.opt(2), &c.out)
}

/// Conv's attributes (auto_pad, dilations, group, kernel_shape, pads, strides) applied to
/// `x`, `w` and `bias`, named `name`: Conv's, and ConvInteger's of its centred operands.
pub(super) fn conv_of(b: &mut Builder, c: &Ctx, x: &Value, w: &Value, bias: Option<&Value>, name: &str) -> R<Value> {
    let (xs, ws) = (b.ty(x).shape, b.ty(w).shape);
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!(
            "X of rank {} and W of rank {}: expected [N, C, spatial...] and a weight of that rank",
            xs.len(),
            ws.len()
        ));
    }
    if let Some(k) = c.ints("kernel_shape") {
        if k.iter().map(|&d| d as usize).ne(ws[2..].iter().copied()) {
            return Err(format!("kernel_shape {k:?} disagrees with the weight's shape {:?}", ws));
        }
    }
    let mut attrs = window_attrs(c, &xs[2..], &ws[2..])?;
    attrs.push(("groups", Attr::Int(c.int("group", 1))));
    let mut args = vec![x, w];
    args.extend(bias);
    b.node(name, Op::Conv, &args, &attrs)
}

/// CausalConvWithState: the past state (zeros without one) put before the input along the
/// length, a depthwise conv of that without padding (then SiLU, x·sigmoid(x), when asked),
/// and the last k − 1 positions of it as the present state, as ONNX's reference does.
fn causal_conv(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let (x, w) = (c.arg(0)?, c.arg(1)?);
    let (xs, ws) = (b.ty(x).shape, b.ty(w).shape);
    let k = ws.get(2).copied().unwrap_or(0);
    if xs.len() != 3 || ws.len() != 3 || ws[0] != xs[1] || ws[1] != 1 || k == 0 {
        return Err(format!("input of shape {xs:?} and weight of shape {ws:?} are not [N, C, L] and [C, 1, k]"));
    }
    let silu = match c.string("activation", "none").as_str() {
        "none" => false,
        "silu" | "swish" => true,
        other => return Err(format!("activation '{other}' is not none, silu or swish")),
    };
    let (n, ch, len) = (xs[0], xs[1], xs[2]);
    let padded = match c.opt(3) {
        Some(past) if b.ty(past).shape != [n, ch, k - 1] => {
            return Err(format!("past_state of shape {:?} is not [{n}, {ch}, {}]", b.ty(past).shape, k - 1))
        }
        Some(past) => b.node(&c.part("padded"), Op::Concat, &[past, x], &[("axis", Attr::Int(2))])?,
        None if k > 1 => b.node(&c.part("padded"), Op::Pad, &[x], &[("pads", ints(&[0, 0, k as i64 - 1, 0, 0, 0]))])?,
        None => x.clone(),
    };
    let state = match c.node.output.get(1).filter(|o| !o.is_empty()) {
        Some(o) => o.clone(),
        None => c.part("present_state"),
    };
    let present = if k == 1 {
        table("the empty state", b.ty(x).dtype, vec![n, ch, 0], |_| 0.0)?
    } else {
        let bounds = [("starts", ints(&[len as i64])), ("ends", ints(&[(len + k - 1) as i64])), ("axes", ints(&[2]))];
        b.node(&state, Op::Slice, &[&padded], &bounds)?
    };
    let mut args = vec![&padded, w];
    args.extend(c.opt(2));
    let attrs = [("groups", Attr::Int(ch as i64)), ("pads", ints(&[0, 0]))];
    let y = b.node(&if silu { c.part("conv") } else { c.out.clone() }, Op::Conv, &args, &attrs)?;
    if !silu {
        return Ok(vec![y, present]);
    }
    let sg = b.node(&c.part("sigmoid"), Op::Sigmoid, &[&y], &[])?;
    Ok(vec![b.node(&c.out, Op::Mul, &[&y, &sg], &[])?, present])
}

/// LRN: x / (bias + α/size · Σ x²)^β, the sum over the `size` channels around each one
/// (⌊(size − 1)/2⌋ before, the rest after): an average pool of x² over the channels, the
/// pads counting as zeros, so α times it is α/size times the sum.
fn lrn(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let xs = b.ty(x).shape;
    let size = c.int("size", 0);
    if xs.len() < 3 || size < 1 {
        return Err(format!("X of shape {xs:?} with size {size} is not [N, C, spatial...] and a window"));
    }
    let (before, after) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let rest: usize = xs[2..].iter().product();
    let sq = b.node(&c.part("square"), Op::Mul, &[x, x], &[])?;
    let planes = reshape(b, &sq, &[xs[0] as i64, 1, xs[1] as i64, rest as i64], &c.part("channels"))?;
    let attrs =
        [("kernel", ints(&[size, 1])), ("pads", ints(&[before, 0, after, 0])), ("count_include_pad", Attr::Bool(true))];
    let mean = b.node(&c.part("mean_square"), Op::AvgPool, &[&planes], &attrs)?;
    let mean = reshape(b, &mean, &xs.iter().map(|&d| d as i64).collect::<Vec<_>>(), &c.part("mean_square_back"))?;
    let scaled =
        b.node(&c.part("scaled"), Op::Mul, &[&mean, &scalar(DType::F32, c.float("alpha", 1e-4).into())], &[])?;
    let base = b.node(&c.part("base"), Op::Add, &[&scaled, &scalar(DType::F32, c.float("bias", 1.0).into())], &[])?;
    let div = b.node(&c.part("divisor"), Op::Pow, &[&base, &scalar(DType::F32, c.float("beta", 0.75).into())], &[])?;
    b.node(&c.out, Op::Div, &[x, &div], &[])
}

/// Col2Im: each image element is the sum of the column entries that land on it, at most
/// one per block offset (an offset and an element fix the block), so a constant
/// `[positions, block]` table of their flat sources (or of a zero appended, where an
/// offset lands on no block there) is gathered and summed. image_shape and block_shape
/// must be known at import time.
fn col2im(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let xs = b.ty(x).shape;
    let (image, block) = (c.const_ints(1)?, c.const_ints(2)?);
    let k = image.len();
    let defaults = |name: &str, v: i64, n: usize| c.ints(name).filter(|a| !a.is_empty()).unwrap_or(vec![v; n]);
    let (dil, pads, strides) = (defaults("dilations", 1, k), defaults("pads", 0, 2 * k), defaults("strides", 1, k));
    let bad = block.len() != k
        || dil.len() != k
        || pads.len() != 2 * k
        || strides.len() != k
        || image.iter().chain(&block).chain(&dil).chain(&strides).any(|&v| v < 1)
        || pads.iter().any(|&p| p < 0);
    let blocks: Vec<i64> = (0..k.min(block.len()))
        .map(|d| (image[d] + pads[d] + pads[k + d] - dil[d] * (block[d] - 1) - 1).div_euclid(strides[d].max(1)) + 1)
        .collect();
    let (bsize, lsize): (i64, i64) = (block.iter().product(), blocks.iter().product());
    if bad || xs.len() != 3 || blocks.iter().any(|&n| n < 1) || xs[2] as i64 != lsize || xs[1] as i64 % bsize != 0 {
        return Err(format!(
            "input of shape {xs:?} is not [N, C·{bsize}, {lsize}] for image {image:?}, block {block:?}, dilations {dil:?}, pads {pads:?}, strides {strides:?}"
        ));
    }
    let ch = xs[1] as i64 / bsize;
    let positions: i64 = image.iter().product();
    let unravel = |mut i: i64, dims: &[i64]| {
        let mut idx = vec![0; dims.len()];
        for d in (0..dims.len()).rev() {
            idx[d] = i % dims[d];
            i /= dims[d];
        }
        idx
    };
    let table = i64_table("the Col2Im sources", vec![positions as usize, bsize as usize], |e| {
        let (p, bo) = (unravel(e as i64 / bsize, &image), unravel(e as i64 % bsize, &block));
        let mut l = 0;
        for d in 0..k {
            let at = p[d] + pads[d] - bo[d] * dil[d];
            if at < 0 || at % strides[d] != 0 || at / strides[d] >= blocks[d] {
                return bsize * lsize;
            }
            l = l * blocks[d] + at / strides[d];
        }
        (e as i64 % bsize) * lsize + l
    })?;
    let cols = reshape(b, x, &[xs[0] as i64, ch, bsize * lsize], &c.part("columns"))?;
    let padded = b.node(&c.part("with_zero"), Op::Pad, &[&cols], &[("pads", ints(&[0, 0, 0, 0, 0, 1]))])?;
    let taken = b.node(&c.part("sources"), Op::Gather, &[&padded, &table], &[("axis", Attr::Int(2))])?;
    let sum = [("axes", ints(&[-1])), ("keepdims", Attr::Bool(false))];
    let summed = b.node(&c.part("summed"), Op::ReduceSum, &[&taken], &sum)?;
    let mut out = vec![xs[0] as i64, ch];
    out.extend(&image);
    reshape(b, &summed, &out, &c.out)
}

/// MaxUnpool, as ONNX's reference: each x written at its index into zeros of the shape
/// the pool came from (`(in − 1)·stride − pads + kernel`), flattened whole as MaxPool's
/// Indices count (a `scatter_elements`: an index out of range is a run-time error naming
/// the node, a repeated one keeps the last), then zeros appended up to `output_shape`
/// when given (it must fold).
fn max_unpool(b: &mut Builder, c: &Ctx) -> R<Value> {
    let (x, idx) = (c.arg(0)?, c.arg(1)?);
    let xs = b.ty(x).shape;
    let kernel = c.ints("kernel_shape").ok_or("it needs kernel_shape")?;
    let k = kernel.len();
    let strides = c.ints("strides").filter(|v| !v.is_empty()).unwrap_or(vec![1; k]);
    let pads = c.ints("pads").filter(|v| !v.is_empty()).unwrap_or(vec![0; 2 * k]);
    if xs.len() != k + 2 || b.ty(idx).shape != xs || strides.len() != k || pads.len() != 2 * k {
        return Err(format!("X of shape {xs:?}, its indices and kernel_shape {kernel:?} do not fit"));
    }
    let mut shape = xs[..2].iter().map(|&d| d as i64).collect::<Vec<_>>();
    shape.extend((0..k).map(|d| (xs[d + 2] as i64 - 1) * strides[d] - pads[d] - pads[k + d] + kernel[d]));
    if shape.iter().any(|&d| d < 1) {
        return Err(format!("the unpooled shape {shape:?} is empty"));
    }
    let total: i64 = shape.iter().product();
    let zeros = table("the unpooled zeros", b.ty(x).dtype, vec![total as usize], |_| 0.0)?;
    let n = xs.iter().product::<usize>() as i64;
    let flat_x = reshape(b, x, &[n], &c.part("values"))?;
    let flat_i = reshape(b, idx, &[n], &c.part("indices"))?;
    let attrs = [("axis", Attr::Int(0)), ("reduction", Attr::Str("none".into()))];
    let spread = b.node(&c.part("spread"), Op::ScatterElements, &[&zeros, &flat_i, &flat_x], &attrs)?;
    let Some(_) = c.opt(2) else { return reshape(b, &spread, &shape, &c.out) };
    let want = c.const_ints(2)?;
    if want.len() != shape.len() || want.iter().zip(&shape).any(|(w, s)| w < s) {
        return Err(format!("output_shape {want:?} is not at least the unpooled shape {shape:?}"));
    }
    let y = reshape(b, &spread, &shape, &c.part("unpooled"))?;
    let mut grow = vec![0i64; shape.len()];
    grow.extend(want.iter().zip(&shape).map(|(w, s)| w - s));
    b.node(&c.out, Op::Pad, &[&y], &[("pads", ints(&grow))])
}

fn pool(b: &mut Builder, c: &Ctx, max: bool) -> R<Value> {
    if c.node.output.get(1).is_some_and(|o| !o.is_empty()) {
        return Err("its Indices output is not supported".into());
    }
    let x = c.arg(0)?;
    let xs = b.ty(x).shape;
    let kernel = c.ints("kernel_shape").ok_or("it needs kernel_shape")?;
    if xs.len() < 3 || kernel.len() != xs.len() - 2 || kernel.iter().any(|&k| k < 1) {
        return Err(format!("kernel_shape {kernel:?} does not fit X of shape {xs:?}"));
    }
    let k: Vec<usize> = kernel.iter().map(|&k| k as usize).collect();
    let mut attrs = window_attrs(c, &xs[2..], &k)?;
    attrs.push(("kernel", ints(&kernel)));
    attrs.push(("ceil_mode", Attr::Bool(c.int("ceil_mode", 0) != 0)));
    if !max {
        attrs.push(("count_include_pad", Attr::Bool(c.int("count_include_pad", 0) != 0)));
    }
    // The max of int8, uint8, int16 or uint16 values is one of them: f32 holds each exactly.
    let byte = b.ty(x).dtype;
    if max && byte.is_stored_int() && byte.wide() == DType::I32 {
        let wide = cast(b, x, DType::F32, &c.part("wide"))?;
        let m = b.node(&c.part("wide_result"), Op::MaxPool, &[&wide], &attrs)?;
        return cast(b, &m, byte, &c.out);
    }
    b.node(&c.out, if max { Op::MaxPool } else { Op::AvgPool }, &[x], &attrs)
}

fn spatial_axes(rank: usize) -> Vec<i64> {
    (2..rank as i64).collect()
}

fn global_pool(b: &mut Builder, c: &Ctx, max: bool) -> R<Value> {
    let x = c.arg(0)?;
    let rank = b.ty(x).shape.len();
    if rank < 3 {
        return Err(format!("X has rank {rank}, expected [N, C, spatial...]"));
    }
    let attrs = [("axes", ints(&spatial_axes(rank))), ("keepdims", Attr::Bool(true))];
    b.node(&c.out, if max { Op::ReduceMax } else { Op::ReduceMean }, &[x], &attrs)
}

/// `[C, 1, ...]`: a per-channel vector shaped to broadcast against `[N, C, spatial...]`.
fn channel_shape(rank: usize, ch: usize) -> Vec<i64> {
    std::iter::once(ch as i64).chain((2..rank).map(|_| 1)).collect()
}

/// `x * scale + shift` with per-channel `scale` and `shift` (vectors of C).
fn affine(b: &mut Builder, c: &Ctx, x: &Value, scale: &Value, shift: &Value) -> R<Value> {
    let shape = b.ty(x).shape;
    let cs = channel_shape(shape.len(), shape[1]);
    let s = reshape(b, scale, &cs, &c.part("scale_c"))?;
    let t = reshape(b, shift, &cs, &c.part("shift_c"))?;
    let y = b.node(&c.part("scaled"), Op::Mul, &[x, &s], &[])?;
    b.node(&c.out, Op::Add, &[&y, &t], &[])
}

/// BatchNormalization: inference, or with `training_mode` the batch's statistics.
fn batch_norm(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    if c.int("training_mode", 0) != 0 {
        return batch_norm_training(b, c);
    }
    if c.node.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err(
            "the running mean and variance outputs without training_mode (before opset 14) are not supported".into()
        );
    }
    one(batch_norm_inference(b, c))
}

/// Training BatchNormalization (opset 14+), as ONNX's reference: normalised by the batch's
/// mean and biased variance over every axis but the channels, and the running statistics
/// moved toward them, `running · momentum + batch · (1 − momentum)`.
fn batch_norm_training(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    if shape.len() < 2 {
        return Err(format!("X has rank {}, expected [N, C, ...]", shape.len()));
    }
    let axes: Vec<i64> = (0..shape.len() as i64).filter(|&d| d != 1).collect();
    let keep = [("axes", ints(&axes)), ("keepdims", Attr::Bool(true))];
    let mean = b.node(&c.part("batch_mean"), Op::ReduceMean, &[x], &keep)?;
    let d = b.node(&c.part("centred"), Op::Sub, &[x, &mean], &[])?;
    let sq = b.node(&c.part("square"), Op::Mul, &[&d, &d], &[])?;
    let var = b.node(&c.part("batch_var"), Op::ReduceMean, &[&sq], &keep)?;
    let eps = scalar(DType::F32, c.float("epsilon", 1e-5).into());
    let ve = b.node(&c.part("var_eps"), Op::Add, &[&var, &eps], &[])?;
    let r = b.node(&c.part("rstd"), Op::Rsqrt, &[&ve], &[])?;
    let normed = b.node(&c.part("normalised"), Op::Mul, &[&d, &r], &[])?;
    let mut outs = vec![affine(b, c, &normed, c.arg(1)?, c.arg(2)?)?];
    if c.node.output.iter().skip(1).all(|o| o.is_empty()) {
        return Ok(outs);
    }
    let momentum = f64::from(c.float("momentum", 0.9));
    for (i, batch, what) in [(1, &mean, "running_mean"), (2, &var, "running_var")] {
        let name = match c.node.output.get(i).filter(|o| !o.is_empty()) {
            Some(o) => o.clone(),
            None => c.part(what),
        };
        let running =
            b.node(&c.part(&format!("{what}_kept")), Op::Mul, &[c.arg(i + 2)?, &scalar(DType::F32, momentum)], &[])?;
        let flat = reshape(b, batch, &[shape[1] as i64], &c.part(&format!("{what}_batch")))?;
        let moved =
            b.node(&c.part(&format!("{what}_moved")), Op::Mul, &[&flat, &scalar(DType::F32, 1.0 - momentum)], &[])?;
        outs.push(b.node(&name, Op::Add, &[&running, &moved], &[])?);
    }
    Ok(outs)
}

/// Inference BatchNormalization: `x * s + t` with `s = scale / sqrt(var + eps)` and
/// `t = bias - mean * s` per channel, computed at import when all four are constants.
fn batch_norm_inference(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    if shape.len() < 2 {
        return Err(format!("X has rank {}, expected [N, C, ...]", shape.len()));
    }
    let eps = c.float("epsilon", 1e-5) as f64;
    let stats = (1..5).map(|i| c.arg(i).map(|v| v.as_const().cloned())).collect::<R<Vec<_>>>()?;
    if let [Some(scale), Some(bias), Some(mean), Some(var)] = &stats[..] {
        let [scale, bias, mean, var] = [scale, bias, mean, var].map(|t| t.data.to_f64());
        if [&scale, &bias, &mean, &var].iter().any(|v| v.len() != shape[1]) {
            return Err(format!("scale, B, mean and var must hold C = {} values each", shape[1]));
        }
        let s: Vec<f64> = (0..shape[1]).map(|i| scale[i] / (var[i] + eps).sqrt()).collect();
        let t: Vec<f64> = (0..shape[1]).map(|i| bias[i] - mean[i] * s[i]).collect();
        let per = |v: Vec<f64>, what: &str| {
            Value::named(Tensor::new(vec![v.len()], Data::from_f64(DType::F32, v)), &c.part(what))
        };
        return affine(b, c, x, &per(s, "bn_scale"), &per(t, "bn_shift"));
    }
    let (scale, bias, mean, var) = (c.arg(1)?, c.arg(2)?, c.arg(3)?, c.arg(4)?);
    let ve = b.node(&c.part("var_eps"), Op::Add, &[var, &scalar(DType::F32, eps)], &[])?;
    let r = b.node(&c.part("rstd"), Op::Rsqrt, &[&ve], &[])?;
    let s = b.node(&c.part("bn_scale"), Op::Mul, &[scale, &r], &[])?;
    let ms = b.node(&c.part("mean_scaled"), Op::Mul, &[mean, &s], &[])?;
    let t = b.node(&c.part("bn_shift"), Op::Sub, &[bias, &ms], &[])?;
    affine(b, c, x, &s, &t)
}

/// `(x - mean) / sqrt(var + eps)` over `axes` (biased variance).
fn normalise(b: &mut Builder, c: &Ctx, x: &Value, axes: &[i64], eps: f64) -> R<Value> {
    let attrs = [("axes", ints(axes)), ("keepdims", Attr::Bool(true))];
    let mean = b.node(&c.part("mean"), Op::ReduceMean, &[x], &attrs)?;
    let d = b.node(&c.part("centred"), Op::Sub, &[x, &mean], &[])?;
    let sq = b.node(&c.part("square"), Op::Mul, &[&d, &d], &[])?;
    let var = b.node(&c.part("var"), Op::ReduceMean, &[&sq], &attrs)?;
    let ve = b.node(&c.part("var_eps"), Op::Add, &[&var, &scalar(DType::F32, eps)], &[])?;
    let r = b.node(&c.part("rstd"), Op::Rsqrt, &[&ve], &[])?;
    b.node(&c.part("normed"), Op::Mul, &[&d, &r], &[])
}

fn instance_norm(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let rank = b.ty(x).shape.len();
    if rank < 3 {
        return Err(format!("X has rank {rank}, expected [N, C, spatial...]"));
    }
    let n = normalise(b, c, x, &spatial_axes(rank), c.float("epsilon", 1e-5).into())?;
    affine(b, c, &n, c.arg(1)?, c.arg(2)?)
}

/// GroupNormalization: statistics per (sample, group); scale and bias per channel (opset
/// 21) or per group (opset 18, expanded to the group's channels).
fn group_norm(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let g = c.int("num_groups", 0);
    if shape.len() < 2 || g < 1 || !shape[1].is_multiple_of(g as usize) {
        return Err(format!("num_groups {g} does not divide the {} channels of X", shape.get(1).unwrap_or(&0)));
    }
    let (g, ch) = (g as usize, shape[1]);
    let view = reshape(b, x, &[shape[0] as i64, g as i64, -1], &c.part("grouped"))?;
    let n = normalise(b, c, &view, &[2], c.float("epsilon", 1e-5).into())?;
    let full: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let n = reshape(b, &n, &full, &c.part("ungrouped"))?;
    let mut sb = [c.arg(1)?.clone(), c.arg(2)?.clone()];
    for (i, what) in ["scale_ch", "bias_ch"].iter().enumerate() {
        let len = b.ty(&sb[i]).numel();
        if len == g && g != ch {
            let per_group = reshape(b, &sb[i], &[g as i64, 1], &c.part(&format!("{what}_g")))?;
            let each = b.node(
                &c.part(&format!("{what}_b")),
                Op::BroadcastTo,
                &[&per_group],
                &[("shape", ints(&[g as i64, (ch / g) as i64]))],
            )?;
            sb[i] = reshape(b, &each, &[ch as i64], &c.part(what))?;
        } else if len != ch {
            return Err(format!("scale and bias must hold C = {ch} (or num_groups = {g}) values"));
        }
    }
    affine(b, c, &n, &sb[0], &sb[1])
}

fn pad(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let ty = b.ty(x);
    let r = ty.shape.len();
    let (pads, value) = if c.opset < 11 {
        (c.ints("pads").ok_or("it needs pads")?, c.float("value", 0.0) as f64)
    } else {
        let value = match c.opt(2) {
            None => 0.0,
            Some(v) => {
                let t = v.as_const().ok_or("constant_value must be known at import time")?;
                t.data.iter_f64().next().unwrap_or(0.0)
            }
        };
        (c.const_ints(1)?, value)
    };
    let pads = match c.opt(3) {
        None => pads,
        Some(_) => {
            let axes = c.const_ints(3)?;
            if pads.len() != 2 * axes.len() {
                return Err(format!("pads has {} entries for {} axes", pads.len(), axes.len()));
            }
            let mut full = vec![0; 2 * r];
            for (i, &a) in axes.iter().enumerate() {
                let a = norm_axis(a, r)?;
                (full[a], full[r + a]) = (pads[i], pads[axes.len() + i]);
            }
            full
        }
    };
    if pads.len() != 2 * r {
        return Err(format!("pads has {} entries, expected {} for rank {r}", pads.len(), 2 * r));
    }
    if pads.iter().all(|&p| p == 0) {
        return Ok(x.clone());
    }
    let mode = c.string("mode", "constant");
    if mode == "wrap" && pads.iter().any(|&p| p < 0) {
        return crop_then_wrap(b, c, x, &ty.shape, &pads, value);
    }
    let attrs = [("pads", ints(&pads)), ("mode", Attr::Str(mode)), ("value", Attr::Float(value))];
    b.node(&c.out, Op::Pad, &[x], &attrs)
}

/// Wrap padding with negative pads, as onnxruntime does it: the negative pads crop first,
/// and the positive ones repeat what is left (meshc's pad wraps around the whole input).
/// Constant, edge and reflect padding read the same elements either way.
fn crop_then_wrap(b: &mut Builder, c: &Ctx, x: &Value, shape: &[usize], pads: &[i64], value: f64) -> R<Value> {
    let r = shape.len();
    let starts: Vec<i64> = (0..r).map(|d| (-pads[d]).max(0)).collect();
    let ends: Vec<i64> = (0..r).map(|d| shape[d] as i64 - (-pads[r + d]).max(0)).collect();
    let grow: Vec<i64> = pads.iter().map(|&p| p.max(0)).collect();
    let last = grow.iter().all(|&p| p == 0);
    let cropped = b.node(
        &if last { c.out.clone() } else { c.part("cropped") },
        Op::Slice,
        &[x],
        &[("starts", ints(&starts)), ("ends", ints(&ends))],
    )?;
    if last {
        return Ok(cropped);
    }
    let attrs = [("pads", ints(&grow)), ("mode", Attr::Str("wrap".into())), ("value", Attr::Float(value))];
    b.node(&c.out, Op::Pad, &[&cropped], &attrs)
}

fn tile(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let reps = c.const_ints(1)?;
    if reps.len() != shape.len() || reps.iter().any(|&r| r < 0) {
        return Err(format!("repeats {reps:?} must hold {} non-negative entries", shape.len()));
    }
    let axes: Vec<usize> = (0..shape.len()).filter(|&d| reps[d] != 1).collect();
    let mut cur = x.clone();
    for (j, &d) in axes.iter().enumerate() {
        let n = shape[d];
        let out = (n as u128).saturating_mul(reps[d] as u128).min(usize::MAX as u128) as usize;
        let idx = i64_table(&format!("the index table of axis {d}"), vec![out], |i| (i % n.max(1)) as i64)?;
        let name = if j + 1 == axes.len() { c.out.clone() } else { c.part(&format!("tile{d}")) };
        cur = b.node(&name, Op::Gather, &[&cur, &idx], &[("axis", Attr::Int(d as i64))])?;
    }
    Ok(cur)
}

fn block_size(c: &Ctx) -> R<i64> {
    let bs = c.int("blocksize", 0);
    if bs < 1 {
        return Err(format!("blocksize {bs} must be positive"));
    }
    Ok(bs)
}

/// Reshape, transpose, reshape: the rearrangement both DepthToSpace and SpaceToDepth are.
fn rearrange(b: &mut Builder, c: &Ctx, view: &[i64], perm: &[i64], result: &[i64]) -> R<Value> {
    let v = reshape(b, c.arg(0)?, view, &c.part("blocks"))?;
    let t = b.node(&c.part("moved"), Op::Transpose, &[&v], &[("perm", ints(perm))])?;
    reshape(b, &t, result, &c.out)
}

fn nchw(b: &Builder, c: &Ctx) -> R<[i64; 4]> {
    let s = b.ty(c.arg(0)?).shape;
    match s[..] {
        [n, ch, h, w] => Ok([n, ch, h, w].map(|d| d as i64)),
        _ => Err(format!("X has shape {s:?}, expected [N, C, H, W]")),
    }
}

fn depth_to_space(b: &mut Builder, c: &Ctx) -> R<Value> {
    let [n, ch, h, w] = nchw(b, c)?;
    let bs = block_size(c)?;
    if ch % (bs * bs) != 0 {
        return Err(format!("C = {ch} is not a multiple of blocksize² = {}", bs * bs));
    }
    let cc = ch / (bs * bs);
    let result = [n, cc, h * bs, w * bs];
    match c.string("mode", "DCR").as_str() {
        "DCR" => rearrange(b, c, &[n, bs, bs, cc, h, w], &[0, 3, 4, 1, 5, 2], &result),
        "CRD" => rearrange(b, c, &[n, cc, bs, bs, h, w], &[0, 1, 4, 2, 5, 3], &result),
        other => Err(format!("mode '{other}' is not DCR or CRD")),
    }
}

fn space_to_depth(b: &mut Builder, c: &Ctx) -> R<Value> {
    let [n, ch, h, w] = nchw(b, c)?;
    let bs = block_size(c)?;
    if h % bs != 0 || w % bs != 0 {
        return Err(format!("H = {h} and W = {w} must be multiples of blocksize {bs}"));
    }
    let (view, result) = ([n, ch, h / bs, bs, w / bs, bs], [n, ch * bs * bs, h / bs, w / bs]);
    match c.string("mode", "DCR").as_str() {
        "DCR" => rearrange(b, c, &view, &[0, 3, 5, 1, 2, 4], &result),
        "CRD" => rearrange(b, c, &view, &[0, 1, 3, 5, 2, 4], &result),
        other => Err(format!("mode '{other}' is not DCR or CRD")),
    }
}

/// GatherElements as a gather from the flattened data: the flat index of each element is
/// its own coordinates with the axis coordinate replaced by the (normalised) index.
fn gather_elements(b: &mut Builder, c: &Ctx) -> R<Value> {
    let (data, indices) = (c.arg(0)?, c.arg(1)?);
    let (ds, is) = (b.ty(data).shape, b.ty(indices).shape);
    let r = ds.len();
    let axis = norm_axis(c.int("axis", 0), r)?;
    if is.len() != r || (0..r).any(|d| d != axis && is[d] > ds[d]) {
        return Err(format!("indices of shape {is:?} do not fit data of shape {ds:?} along axis {axis}"));
    }
    let mut strides = vec![1usize; r];
    for d in (0..r.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * ds[d + 1];
    }
    // A gather from 0..n both normalises negative indices and checks the range.
    let n = ds[axis];
    let iota = i64_table("the index range", vec![n], |i| i as i64)?;
    let norm = b.node(&c.part("index"), Op::Gather, &[&iota, indices], &[])?;
    let scaled = b.node(&c.part("offset"), Op::Mul, &[&norm, &scalar(DType::I64, strides[axis] as f64)], &[])?;
    let base = i64_table("the table of element offsets", is.clone(), |i| {
        let (mut rest, mut flat) = (i, 0);
        for d in (0..r).rev() {
            if d != axis {
                flat += (rest % is[d]) * strides[d];
            }
            rest /= is[d].max(1);
        }
        flat as i64
    })?;
    let flat = b.node(&c.part("flat_index"), Op::Add, &[&scaled, &base], &[])?;
    let all = reshape(b, data, &[ds.iter().product::<usize>() as i64], &c.part("flat"))?;
    b.node(&c.out, Op::Gather, &[&all, &flat], &[])
}

/// OneHot: row `i` of a `[depth, depth]` table holding `on` on its diagonal and `off`
/// elsewhere, then the new axis moved into place. Indices count from the end when
/// negative; one out of range is a run-time error (ONNX gives a row of `off`).
fn one_hot(b: &mut Builder, c: &Ctx) -> R<Value> {
    let indices = c.arg(0)?;
    let depth = c.arg(1)?.as_const().ok_or("depth must be known at import time")?;
    let depth = *depth.data.to_f64().first().ok_or("depth is empty")?;
    if !(1.0..=budget::CEILING as f64).contains(&depth) {
        return Err(format!("depth {depth} is out of range"));
    }
    let depth = depth as usize;
    let values = c.arg(2)?;
    if b.ty(values).numel() != 2 {
        return Err("values must hold [off, on]".into());
    }
    let mut idx = indices.clone();
    if !matches!(b.ty(indices).dtype, DType::I32 | DType::I64) {
        idx = cast(b, indices, DType::I64, &c.part("index"))?;
    }
    let eye = table("the identity pattern", DType::Bool, vec![depth, depth], |i| {
        f64::from(u8::from(i / depth == i % depth))
    })?;
    let pick = |b: &mut Builder, i: i64, what: &str| {
        let attrs = [("starts", ints(&[i])), ("ends", ints(&[i + 1]))];
        b.node(&c.part(what), Op::Slice, &[values], &attrs)
    };
    let (off, on) = (pick(b, 0, "off")?, pick(b, 1, "on")?);
    let table = b.node(&c.part("table"), Op::Where, &[&eye, &on, &off], &[])?;
    let rank = b.ty(indices).shape.len();
    let axis = norm_axis(c.int("axis", -1), rank + 1)?;
    if axis == rank {
        return b.node(&c.out, Op::Gather, &[&table, &idx], &[]);
    }
    let rows = b.node(&c.part("rows"), Op::Gather, &[&table, &idx], &[])?;
    let perm: Vec<i64> = (0..axis).chain(std::iter::once(rank)).chain(axis..rank).map(|d| d as i64).collect();
    b.node(&c.out, Op::Transpose, &[&rows], &[("perm", ints(&perm))])
}

// ---------------------------------------------------------------------------------------
// Resize
// ---------------------------------------------------------------------------------------

/// How a Resize maps output coordinates to input ones and weighs neighbours.
struct Resize {
    mode: String,
    coord: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
    extrapolation: f64,
}

impl Resize {
    /// The source coordinate of output index `y` along an axis (`None`: extrapolated, for
    /// tf_crop_and_resize outside the input).
    fn source(&self, y: f64, scale: f64, n_in: usize, n_out: usize, roi: (f64, f64)) -> Option<f64> {
        let (inw, outw) = (n_in as f64, scale * n_in as f64);
        Some(match self.coord.as_str() {
            "align_corners" if outw == 1.0 => 0.0,
            "align_corners" => y * (inw - 1.0) / (outw - 1.0),
            "asymmetric" => y / scale,
            "pytorch_half_pixel" if outw == 1.0 => -0.5,
            "half_pixel_symmetric" => {
                let adjustment = n_out as f64 / outw;
                inw / 2.0 * (1.0 - adjustment) + (y + 0.5) / scale - 0.5
            }
            "tf_crop_and_resize" => {
                let x = if outw == 1.0 {
                    (roi.1 - roi.0) * (inw - 1.0) / 2.0
                } else {
                    y * (roi.1 - roi.0) * (inw - 1.0) / (outw - 1.0)
                } + roi.0 * (inw - 1.0);
                return (0.0..=inw - 1.0).contains(&x).then_some(x);
            }
            _ => (y + 0.5) / scale - 0.5,
        })
    }

    /// The weights of the neighbours of a coordinate whose fractional part is `ratio`
    /// (1 at an integer), as ONNX's reference computes them.
    fn coeffs(&self, ratio: f64, scale: f64) -> Vec<f64> {
        let a = self.cubic_a;
        match (self.mode.as_str(), self.antialias) {
            ("nearest", _) => {
                let up = if ratio == 1.0 {
                    true
                } else {
                    match self.nearest.as_str() {
                        "round_prefer_ceil" => ratio >= 0.5,
                        "floor" => false,
                        "ceil" => true,
                        _ => ratio > 0.5,
                    }
                };
                if up {
                    vec![0.0, 1.0]
                } else {
                    vec![1.0, 0.0]
                }
            }
            ("linear", false) => vec![1.0 - ratio, ratio],
            ("linear", true) => {
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..start + 2 - 2 * start)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                let sum: f64 = c.iter().sum();
                c.iter().map(|x| x / sum).collect()
            }
            (_, false) => {
                let (r1, q) = (ratio + 1.0, 1.0 - ratio);
                vec![
                    ((a * r1 - 5.0 * a) * r1 + 8.0 * a) * r1 - 4.0 * a,
                    ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            (_, true) => {
                let s = scale.min(1.0);
                let f = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x.powi(3) - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x.powi(3) - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start).map(|i| f(s * (i as f64 - ratio))).collect();
                let sum: f64 = c.iter().sum();
                c.iter().map(|x| x / sum).collect()
            }
        }
    }

    /// How many neighbours `coeffs` weighs at `scale`: an antialiased downscale by s
    /// reaches 1/s times as far. Exact however small the scale (`coeffs` would allocate it).
    fn width(&self, scale: f64) -> u128 {
        let s = scale.min(1.0);
        match (self.mode.as_str(), self.antialias) {
            ("nearest", _) | ("linear", false) => 2,
            ("linear", true) => 2 * (1.0 / s).ceil() as u128,
            (_, false) => 4,
            (_, true) => 2 * (2.0 / s).ceil() as u128,
        }
    }

    /// Per output index: `n` clamped input indices and their weights, and the value of
    /// an extrapolated index (which then has all-zero weights).
    fn table(&self, scale: f64, n_in: usize, n_out: usize, roi: (f64, f64)) -> (usize, Vec<i64>, Vec<f64>, Vec<f64>) {
        let (mut idx, mut w, mut extra) = (Vec::new(), Vec::new(), Vec::new());
        let mut width = 0;
        for y in 0..n_out {
            let x = self.source(y as f64, scale, n_in, n_out, roi);
            let xo = x.unwrap_or(0.0);
            let ratio = if xo.fract() == 0.0 { 1.0 } else { xo - xo.floor() };
            let mut coeffs = self.coeffs(ratio, scale);
            let n = coeffs.len();
            width = n;
            let pad = n.div_ceil(2) as f64;
            let xp = xo + pad;
            let (p, frac) = (xp.floor(), xp - xp.floor());
            let half = (n / 2) as f64;
            let offset = if n.is_multiple_of(2) {
                if frac == 0.0 {
                    -half
                } else {
                    -half + 1.0
                }
            } else {
                let base = -(((n - 1) / 2) as f64);
                if frac <= 0.5 {
                    base
                } else {
                    base + 1.0
                }
            };
            let start = (p + offset - pad) as i64;
            let raw: Vec<i64> = (0..n as i64).map(|j| start + j).collect();
            if self.exclude_outside {
                for (cf, &i) in coeffs.iter_mut().zip(&raw) {
                    if i < 0 || i >= n_in as i64 {
                        *cf = 0.0;
                    }
                }
                let sum: f64 = coeffs.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                coeffs.iter_mut().for_each(|cf| *cf /= sum);
            }
            if x.is_none() {
                coeffs.iter_mut().for_each(|cf| *cf = 0.0);
            }
            extra.push(if x.is_none() { self.extrapolation } else { 0.0 });
            idx.extend(raw.iter().map(|&i| i.clamp(0, n_in as i64 - 1)));
            w.extend(coeffs);
        }
        (width, idx, w, extra)
    }
}

fn floats(v: &Value, what: &str) -> R<Vec<f64>> {
    let t = v.as_const().ok_or_else(|| format!("{what} must be known at import time"))?;
    Ok(t.data.to_f64())
}

fn resize(b: &mut Builder, c: &Ctx) -> R<Value> {
    let x = c.arg(0)?;
    let ty = b.ty(x);
    if ty.dtype != DType::F32 {
        return Err(format!("X is {}, only f32 is supported", ty.dtype));
    }
    let shape = ty.shape.clone();
    let r = shape.len();
    let rs = Resize {
        mode: c.string("mode", "nearest"),
        coord: c.string("coordinate_transformation_mode", "half_pixel"),
        nearest: c.string("nearest_mode", "round_prefer_floor"),
        cubic_a: c.float("cubic_coeff_a", -0.75).into(),
        exclude_outside: c.int("exclude_outside", 0) != 0,
        antialias: c.int("antialias", 0) != 0,
        extrapolation: c.float("extrapolation_value", 0.0).into(),
    };
    if !["nearest", "linear", "cubic"].contains(&rs.mode.as_str()) {
        return Err(format!("mode '{}' is not nearest, linear or cubic", rs.mode));
    }
    if rs.mode == "nearest" && rs.antialias {
        return Err("antialias is not defined for nearest".into());
    }
    let axes = match c.ints("axes") {
        Some(a) => a.iter().map(|&a| norm_axis(a, r)).collect::<R<Vec<_>>>()?,
        None => (0..r).collect(),
    };
    let present = |i: usize| c.opt(i).filter(|v| b.ty(v).numel() > 0);
    let roi_v = match present(1) {
        Some(v) => floats(v, "roi")?,
        None => vec![],
    };
    let mut roi = vec![(0.0, 1.0); r];
    if roi_v.len() == 2 * axes.len() {
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = (roi_v[i], roi_v[axes.len() + i]);
        }
    }
    let (scales, sizes): (Vec<f64>, Vec<usize>) = match (present(2), present(3)) {
        (Some(s), None) => {
            let s = floats(s, "scales")?;
            if s.len() != axes.len() || s.iter().any(|&v| !v.is_finite() || v <= 0.0) {
                return Err(format!("scales {s:?} must hold {} positive finite values", axes.len()));
            }
            let mut scales = vec![1.0; r];
            for (i, &a) in axes.iter().enumerate() {
                scales[a] = s[i];
            }
            let sizes = (0..r)
                .map(|d| match scales[d] * shape[d] as f64 {
                    n if n <= budget::CEILING as f64 => Ok(n as usize),
                    n => Err(format!("scale {:e} makes axis {d} {:e} elements long", scales[d] as f32, n as f32)),
                })
                .collect::<R<_>>()?;
            (scales, sizes)
        }
        (None, Some(s)) => {
            let s = floats(s, "sizes")?;
            if s.len() != axes.len() || s.iter().any(|&v| v < 0.0) {
                return Err(format!("sizes {s:?} must hold {} non-negative values", axes.len()));
            }
            let mut sizes = shape.clone();
            for (i, &a) in axes.iter().enumerate() {
                sizes[a] = s[i] as usize;
            }
            let mut scales: Vec<f64> = (0..r).map(|d| sizes[d] as f64 / shape[d] as f64).collect();
            let policy = c.string("keep_aspect_ratio_policy", "stretch");
            if policy != "stretch" {
                let picked = axes.iter().map(|&a| scales[a]);
                let s = match policy.as_str() {
                    "not_larger" => picked.fold(f64::INFINITY, f64::min),
                    "not_smaller" => picked.fold(f64::NEG_INFINITY, f64::max),
                    other => return Err(format!("keep_aspect_ratio_policy '{other}' is not supported")),
                };
                for &a in &axes {
                    scales[a] = s;
                    sizes[a] = (s * shape[a] as f64 + 0.5) as usize;
                }
            }
            (scales, sizes)
        }
        _ => return Err("exactly one of scales and sizes must be given".into()),
    };
    let resized: Vec<usize> = axes
        .iter()
        .copied()
        .filter(|&a| !((scales[a] - 1.0).abs() < 1e-9 && sizes[a] == shape[a] && roi[a] == (0.0, 1.0)))
        .collect();
    let mut cur = x.clone();
    for (j, &a) in resized.iter().enumerate() {
        if shape[a] == 0 || sizes[a] == 0 {
            return Err(format!("axis {a} resized from {} to {}: empty tensors are not supported", shape[a], sizes[a]));
        }
        let last = j + 1 == resized.len();
        let name = |what: &str| if last { c.out.clone() } else { c.part(&format!("axis{a}.{what}")) };
        let part = |what: &str| c.part(&format!("axis{a}.{what}"));
        // Per output index and neighbour, an i64 index and an f64 weight (then an f32 one).
        let entries = (sizes[a] as u128).saturating_mul(rs.width(scales[a]));
        budget::check(format_args!("the table of axis {a} resized to {}", sizes[a]), entries, 20)?;
        let (n, idx, w, extra) = rs.table(scales[a], shape[a], sizes[a], roi[a]);
        let out = sizes[a];
        let one_hot = extra.iter().all(|&e| e == 0.0)
            && w.chunks(n).all(|row| row.iter().filter(|&&v| v != 0.0).count() == 1 && row.contains(&1.0));
        if one_hot {
            let picked = i64_table("the index table", vec![out], |y| {
                idx[y * n + w[y * n..][..n].iter().position(|&v| v == 1.0).unwrap_or(0)]
            })?;
            cur = b.node(&name("gather"), Op::Gather, &[&cur, &picked], &[("axis", Attr::Int(a as i64))])?;
            continue;
        }
        let g = b.node(
            &part("neighbours"),
            Op::Gather,
            &[&cur, &Value::computed(Tensor::new(vec![out, n], Data::I64(idx)))],
            &[("axis", Attr::Int(a as i64))],
        )?;
        let wshape: Vec<usize> = [out, n].into_iter().chain((a + 1..r).map(|_| 1)).collect();
        let wt = Value::computed(Tensor::new(wshape, Data::from_f64(DType::F32, w)));
        let weighted = b.node(&part("weighted"), Op::Mul, &[&g, &wt], &[])?;
        let attrs = [("axes", ints(&[a as i64 + 1])), ("keepdims", Attr::Bool(false))];
        if extra.iter().all(|&e| e == 0.0) {
            cur = b.node(&name("sum"), Op::ReduceSum, &[&weighted], &attrs)?;
        } else {
            let sum = b.node(&part("sum"), Op::ReduceSum, &[&weighted], &attrs)?;
            let eshape: Vec<usize> = std::iter::once(out).chain((a + 1..r).map(|_| 1)).collect();
            let e = Value::computed(Tensor::new(eshape, Data::from_f64(DType::F32, extra)));
            cur = b.node(&name("extrapolated"), Op::Add, &[&sum, &e], &[])?;
        }
    }
    Ok(cur)
}
