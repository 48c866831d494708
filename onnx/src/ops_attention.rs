//! ONNX Attention (opsets 23 to 25) as meshc ops, following ONNX's reference step by
//! step: 3-D inputs split into heads, the past key/value concatenated before the new ones,
//! grouped-query heads repeated (each KV head for `q_heads / kv_heads` query heads in a
//! row), Q and K each scaled by √scale, an optional softcap, then an additive bias: the
//! mask (bool: −inf where false; shorter than the keys: padded as masked), the causal
//! frontier and the sliding window (key j for query i by the distance i + offset − j,
//! offset being the past length or, with `nonpad_kv_seqlen`, that length − q per batch, at
//! run time) and the padding keys; softmax, rows whose bias is −inf throughout set to 0,
//! then the product with V. Refused with one line: half inputs (ONNX computes in their
//! precision) and a softmax precision other than float.

use meshc_ir::{Attr, DType, Data, Op, Tensor};

use super::builder::{Builder, Value};
use super::ops::{reshape, table, Converter, Ctx};
use super::ops_math::{float_only, Steps};

type R<T> = std::result::Result<T, String>;

/// ONNX's FLOAT and DOUBLE dtype codes: the softmax precisions computed here in f32 (its
/// own for f32 inputs; a half input's softmax is as precise as or more than asked).
const PRECISIONS: [i64; 2] = [1, 11];

fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

fn perm(p: &[i64]) -> [(&'static str, Attr); 1] {
    [("perm", Attr::ints(p))]
}

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] =
    &[Converter::new("Attention", attention), Converter::new("LinearAttention", linear_attention)];

/// Y, present_key, present_value and (when asked for) qk_matmul_output.
fn attention(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let mut s = Steps { b, c };
    let (q, k, v) = (c.arg(0)?, c.arg(1)?, c.arg(2)?);
    for (x, what) in [(q, "Q"), (k, "K"), (v, "V")] {
        float_only(s.b, x, what)?;
    }
    if [q, k, v].iter().any(|x| s.b.half_origin(x).is_some()) {
        // ONNX computes it in the half precision: its products and softmax round to it.
        return Err("Attention on f16/bf16 inputs is not supported (meshc computes in f32)".into());
    }
    if let Some(p) = c.attr("softmax_precision").and_then(|a| a.i).filter(|p| !PRECISIONS.contains(p)) {
        return Err(format!("softmax_precision {p} is not supported (float)"));
    }
    let rank = s.b.ty(q).shape.len();
    if rank != 3 && rank != 4 || [k, v].iter().any(|x| s.b.ty(x).shape.len() != rank) {
        return Err("Q, K and V must all be 3-D or all 4-D".into());
    }
    let (q, k, v) = if rank == 3 {
        let qh = c.int("q_num_heads", 0);
        let kvh = c.int("kv_num_heads", 0);
        if qh <= 0 || kvh <= 0 {
            return Err("3-D inputs need q_num_heads and kv_num_heads".into());
        }
        (
            heads(&mut s, q, qh as usize, "q")?,
            heads(&mut s, k, kvh as usize, "k")?,
            heads(&mut s, v, kvh as usize, "v")?,
        )
    } else {
        (q.clone(), k.clone(), v.clone())
    };
    let (k, v, past) = match (c.opt(4), c.opt(5)) {
        (None, None) => (k, v, 0),
        (Some(pk), Some(pv)) => {
            let past = s.b.ty(pk).shape.get(2).copied().ok_or("past_key must be 4-D")?;
            let axis = [("axis", Attr::Int(2))];
            let name =
                |i: usize, what: &str| c.node.output.get(i).filter(|n| !n.is_empty()).cloned().unwrap_or(c.part(what));
            let (nk, nv) = (name(1, "present_key"), name(2, "present_value"));
            (s.b.node(&nk, Op::Concat, &[pk, &k], &axis)?, s.b.node(&nv, Op::Concat, &[pv, &v], &axis)?, past)
        }
        _ => return Err("past_key and past_value must be given together".into()),
    };
    let (qs, ks, vs) = (s.b.ty(&q).shape, s.b.ty(&k).shape, s.b.ty(&v).shape);
    let (qh, kh) = (qs[1], ks[1]);
    if vs[1] != kh || kh == 0 || !qh.is_multiple_of(kh) || ks[3] != qs[3] {
        return Err(format!("Q {qs:?}, K {ks:?} and V {vs:?} do not make attention heads"));
    }
    let (kr, vr) = (repeat_heads(&mut s, &k, qh / kh, "k")?, repeat_heads(&mut s, &v, qh / kh, "v")?);
    let scale = c.attr("scale").and_then(|a| a.f).map_or(1.0 / (qs[3] as f64).sqrt(), f64::from);
    let root = s.k(&q, f64::from(scale.sqrt() as f32));
    let q_scaled = s.op0("q_scaled", Op::Mul, &[&q, &root])?;
    let k_scaled = s.op0("k_scaled", Op::Mul, &[&kr, &root])?;
    let kt = s.op("k_t", Op::Transpose, &[&k_scaled], &perm(&[0, 1, 3, 2]))?;
    let mut qk = s.op0("qk", Op::MatMul, &[&q_scaled, &kt])?;
    if let Some(cap) = c.attr("softcap").and_then(|a| a.f).filter(|&f| f > 0.0) {
        let cap = s.k(&qk, cap.into());
        let d = s.op0("capped", Op::Div, &[&qk, &cap])?;
        let t = s.op0("capped_tanh", Op::Tanh, &[&d])?;
        qk = s.op0("softcapped", Op::Mul, &[&t, &cap])?;
    }
    let bias = bias(&mut s, qs[2], ks[2], past)?;
    let logits = match &bias {
        Some(bias) => s.op0("biased", Op::Add, &[&qk, bias])?,
        None => qk.clone(),
    };
    let mut probs = s.op("probs", Op::Softmax, &[&logits], &[("axis", Attr::Int(-1))])?;
    if let Some(bias) = &bias {
        probs = guard_masked_rows(&mut s, bias, &probs)?;
    }
    let y = s.op0(if rank == 3 { "y_heads" } else { "" }, Op::MatMul, &[&probs, &vr])?;
    let y = if rank == 3 {
        let t = s.op("y_t", Op::Transpose, &[&y], &perm(&[0, 2, 1, 3]))?;
        let ts = s.b.ty(&t).shape;
        reshape(s.b, &t, &[ts[0] as i64, ts[1] as i64, (ts[2] * ts[3]) as i64], &c.out)?
    } else {
        y
    };
    let mut outs = vec![y, k, v];
    if c.node.output.get(3).is_some_and(|n| !n.is_empty()) {
        outs.push(match c.int("qk_matmul_output_mode", 0) {
            0 | 1 => qk,
            2 => logits,
            3 => probs,
            m => return Err(format!("qk_matmul_output_mode {m} is not 0 to 3")),
        });
    }
    Ok(outs)
}

/// [B, S, H·D] as [B, H, S, D].
fn heads(s: &mut Steps, x: &Value, h: usize, what: &str) -> R<Value> {
    let shape = s.b.ty(x).shape;
    if !shape[2].is_multiple_of(h) {
        return Err(format!("{what}'s hidden size {} is not a multiple of {h} heads", shape[2]));
    }
    let split = reshape(
        s.b,
        x,
        &[shape[0] as i64, shape[1] as i64, h as i64, (shape[2] / h) as i64],
        &s.c.part(&format!("{what}_split")),
    )?;
    s.op(&format!("{what}_heads"), Op::Transpose, &[&split], &perm(&[0, 2, 1, 3]))
}

/// [B, H, S, D] with each head repeated `reps` times in a row: [B, H·reps, S, D].
fn repeat_heads(s: &mut Steps, x: &Value, reps: usize, what: &str) -> R<Value> {
    if reps == 1 {
        return Ok(x.clone());
    }
    let sh = s.b.ty(x).shape;
    let one = reshape(
        s.b,
        x,
        &[sh[0] as i64, sh[1] as i64, 1, sh[2] as i64, sh[3] as i64],
        &s.c.part(&format!("{what}_one")),
    )?;
    let to = dims(&[sh[0], sh[1], reps, sh[2], sh[3]]);
    let wide = s.op(&format!("{what}_repeated"), Op::BroadcastTo, &[&one], &[("shape", Attr::ints(&to))])?;
    reshape(s.b, &wide, &dims(&[sh[0], sh[1] * reps, sh[2], sh[3]]), &s.c.part(&format!("{what}_groups")))
}

/// The additive bias of the mask input and the causal frontier, `None` without either.
fn bias(s: &mut Steps, sq: usize, skv: usize, past: usize) -> R<Option<Value>> {
    let c = s.c;
    let causal = c.int("is_causal", 0) != 0;
    let mask = match c.opt(3) {
        None => None,
        Some(m) => {
            let t = s.b.ty(m);
            let last = *t.shape.last().ok_or("attn_mask is a scalar")?;
            if last > skv {
                return Err(format!("attn_mask covers {last} keys, there are {skv}"));
            }
            let mut m = m.clone();
            if last < skv {
                let mut pshape = t.shape.clone();
                *pshape.last_mut().expect("not a scalar") = skv - last;
                let fill = if t.dtype == DType::Bool { 0.0 } else { f64::NEG_INFINITY };
                let pad = table("the mask's padding", t.dtype, pshape, |_| fill)?;
                let axis = [("axis", Attr::Int(t.shape.len() as i64 - 1))];
                m = s.op("mask_padded", Op::Concat, &[&m, &pad], &axis)?;
            }
            Some(match t.dtype {
                DType::Bool => {
                    let (zero, ninf) = (
                        Value::computed(Tensor::f32(vec![], vec![0.0])),
                        Value::computed(Tensor::f32(vec![], vec![f32::NEG_INFINITY])),
                    );
                    s.op0("mask_bias", Op::Where, &[&m, &zero, &ninf])?
                }
                DType::F32 => m,
                other => return Err(format!("attn_mask of {other} is not supported (bool or float)")),
            })
        }
    };
    let mut bias = mask;
    let (left, right) = (c.int("left_window_size", -1), c.int("right_window_size", -1));
    if left < -1 || right < -1 {
        return Err(format!("window sizes {left} and {right} must be -1 or at least 0"));
    }
    // The number of keys before query 0: the past length, or per batch (external cache)
    // nonpad_kv_seqlen − q, known only at run time ([B, 1, 1, 1]).
    let nonpad = match c.opt(6) {
        None => None,
        Some(_) if past > 0 => return Err("nonpad_kv_seqlen cannot be combined with past_key".into()),
        Some(n) => {
            let t = s.b.ty(n);
            if !t.dtype.is_int() || t.shape.len() != 1 {
                return Err(format!("nonpad_kv_seqlen must be 1-D integers, found {t}"));
            }
            Some(reshape(s.b, n, &[t.shape[0] as i64, 1, 1, 1], &c.part("nonpad"))?)
        }
    };
    let offset = match &nonpad {
        None => Value::computed(Tensor::new(vec![], Data::I64(vec![past as i64]))),
        Some(n) => s.op0("offset", Op::Sub, &[n, &s.k(n, sq as f64)])?,
    };
    // Query i sits at position i + offset; key j is at distance diff = i + offset − j.
    let i_minus_j = table("the table of distances", s.b.ty(&offset).dtype, vec![sq, skv], |p| {
        ((p / skv) as f64) - ((p % skv) as f64)
    })?;
    let diff = s.op0("distance", Op::Add, &[&i_minus_j, &offset])?;
    let mut allowed: Vec<(&str, Value)> = Vec::new();
    // The causal frontier, then the sliding window from `left` keys before the query's
    // position to `right` after it (−1: unbounded).
    for (on, step, op, bound) in [
        (causal, "causal", Op::GreaterEqual, 0),
        (left >= 0, "window_left", Op::LessEqual, left),
        (right >= 0, "window_right", Op::GreaterEqual, -right),
    ] {
        if on {
            let k = s.k(&diff, bound as f64);
            allowed.push((step, s.op0(&format!("{step}_allowed"), op, &[&diff, &k])?));
        }
    }
    if let Some(n) = &nonpad {
        // Keys past a batch's length are padding.
        let keys = table("the key positions", s.b.ty(n).dtype, vec![skv], |j| j as f64)?;
        allowed.push(("padding", s.op0("padding_allowed", Op::Less, &[&keys, n])?));
    }
    let (zero, ninf) = (
        Value::computed(Tensor::f32(vec![], vec![0.0])),
        Value::computed(Tensor::f32(vec![], vec![f32::NEG_INFINITY])),
    );
    for (step, ok) in allowed {
        let f = s.op0(&format!("{step}_bias"), Op::Where, &[&ok, &zero, &ninf])?;
        bias = Some(match bias {
            Some(m) => s.op0(step, Op::Add, &[&m, &f])?,
            None => f,
        });
    }
    Ok(bias)
}

/// Zero rows of `probs` whose bias is −inf throughout (their softmax is 0/0).
fn guard_masked_rows(s: &mut Steps, bias: &Value, probs: &Value) -> R<Value> {
    let attrs = [("axes", Attr::ints(&[-1])), ("keepdims", Attr::Bool(true))];
    let top = s.op("bias_max", Op::ReduceMax, &[bias], &attrs)?;
    let ninf = s.k(bias, f64::NEG_INFINITY);
    let masked = s.op0("row_masked", Op::Equal, &[&top, &ninf])?;
    if masked.as_const().is_some_and(|t| t.data.iter_f64().all(|x| x == 0.0)) {
        return Ok(probs.clone());
    }
    let zero = s.k(probs, 0.0);
    s.op0("probs_guarded", Op::Where, &[&masked, &zero, probs])
}

/// LinearAttention (opset 27) as ONNX's reference steps it, unrolled over the sequence (its
/// length is known at import; each step is a few small ops on the `[B, H_kv, d_k, d_v]`
/// state): the state decayed by exp(decay) (`gated`), the value corrected by
/// β·(v − kᵀS) (`delta`), k ⊗ v added, and each query head reading its KV head's state
/// (grouped: query head h reads KV head h / (H_q / H_kv)), times the scale (1/√d_k unless
/// given). Output `[B, T, H_q·d_v]` and the last state; `chunk_size` only tunes kernels.
fn linear_attention(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let mut s = Steps { b, c };
    let (q, k, v) = (c.arg(0)?, c.arg(1)?, c.arg(2)?);
    let mut shapes = Vec::new();
    for (x, what) in [(q, "query"), (k, "key"), (v, "value")] {
        float_only(s.b, x, what)?;
        shapes.push(s.b.ty(x).shape);
    }
    let (hq, hkv) = (c.int("q_num_heads", 0), c.int("kv_num_heads", 0));
    if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
        return Err(format!("q_num_heads {hq} is not a positive multiple of kv_num_heads {hkv}"));
    }
    let (hq, hkv) = (hq as usize, hkv as usize);
    let (gating, delta) = match c.string("update_rule", "gated_delta").as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        other => return Err(format!("update_rule '{other}' is not linear, gated, delta or gated_delta")),
    };
    let (decay, beta) = (c.opt(4), c.opt(5));
    if gating != decay.is_some() || delta != beta.is_some() {
        return Err("decay must be given exactly for the gated rules and beta exactly for the delta ones".into());
    }
    let (bt, t) = (shapes[0].first().copied().unwrap_or(0), shapes[0].get(1).copied().unwrap_or(0));
    let fits = |sh: &Vec<usize>, h: usize| sh.len() == 3 && sh[0] == bt && sh[1] == t && sh[2].is_multiple_of(h);
    if !fits(&shapes[0], hq) || !fits(&shapes[1], hkv) || !fits(&shapes[2], hkv) || t == 0 {
        return Err(format!(
            "query, key and value of shapes {shapes:?} are not [B, T, H·d] over a sequence for the heads"
        ));
    }
    let (dk, dv) = (shapes[0][2] / hq, shapes[2][2] / hkv);
    if shapes[1][2] / hkv != dk {
        return Err(format!("key's head size {} is not query's {dk}", shapes[1][2] / hkv));
    }
    let group = hq / hkv;
    let (q4, k4, v4) = (heads(&mut s, q, hq, "query")?, heads(&mut s, k, hkv, "key")?, heads(&mut s, v, hkv, "value")?);
    // Per KV head and step, [B, H_kv, T, 1] or [B, H_kv, T, d_k] (decay) and
    // [B, H_kv or 1, T, 1] (beta).
    let per_step = |s: &mut Steps, x: &Value, last: usize, what: &str| {
        let split = reshape(s.b, x, &dims(&[bt, t, last, 1]), &s.c.part(&format!("{what}_split")))?;
        s.op(&format!("{what}_heads"), Op::Transpose, &[&split], &perm(&[0, 2, 1, 3]))
    };
    let growth = match decay {
        Some(g) => {
            let last = s.b.ty(g).shape.get(2).copied().unwrap_or(0);
            let g4 = match s.b.ty(g).shape.len() == 3 {
                true if last == hkv => per_step(&mut s, g, hkv, "decay")?,
                true if last == hkv * dk => heads(&mut s, g, hkv, "decay")?,
                _ => {
                    return Err(format!("decay of shape {:?} is not [B, T, H_kv] or [B, T, H_kv·d_k]", s.b.ty(g).shape))
                }
            };
            Some(s.op0("decay_factor", Op::Exp, &[&g4])?)
        }
        None => None,
    };
    let beta4 = match beta {
        Some(x) => {
            let sh = s.b.ty(x).shape;
            if sh.len() != 3 || sh[0] != bt || sh[1] != t || !(sh[2] == hkv || sh[2] == 1) {
                return Err(format!("beta of shape {sh:?} is not [B, T, H_kv] or [B, T, 1]"));
            }
            Some(per_step(&mut s, x, sh[2], "beta")?)
        }
        None => None,
    };
    let state_shape = [bt, hkv, dk, dv];
    let mut state = match c.opt(3) {
        Some(p) if s.b.ty(p).shape != state_shape => {
            return Err(format!("past_state of shape {:?} is not {state_shape:?}", s.b.ty(p).shape))
        }
        Some(p) => p.clone(),
        None => table("the initial state", DType::F32, state_shape.to_vec(), |_| 0.0)?,
    };
    let scale = match c.float("scale", 0.0) {
        0.0 => 1.0 / (dk as f64).sqrt(),
        given => given.into(),
    };
    let at = |x: &Value, s: &mut Steps, i: usize, what: &str| {
        let bounds =
            [("starts", Attr::ints(&[i as i64])), ("ends", Attr::ints(&[i as i64 + 1])), ("axes", Attr::ints(&[2]))];
        s.op(&format!("t{i}_{what}"), Op::Slice, &[x], &bounds)
    };
    let mut outs = Vec::new();
    for i in 0..t {
        let name = |what: &str| format!("t{i}_{what}");
        let (qt, kt) = (at(&q4, &mut s, i, "query")?, at(&k4, &mut s, i, "key")?);
        let mut vt = at(&v4, &mut s, i, "value")?;
        if let Some(e) = &growth {
            // [B, H_kv, 1, d_k or 1] as a column over the state's d_k rows.
            let et = at(e, &mut s, i, "decay")?;
            let col = s.op(&name("decay_column"), Op::Transpose, &[&et], &perm(&[0, 1, 3, 2]))?;
            state = s.op0(&name("decayed"), Op::Mul, &[&state, &col])?;
        }
        if let Some(bv) = &beta4 {
            let read = s.op0(&name("retrieved"), Op::MatMul, &[&kt, &state])?;
            let diff = s.op0(&name("value_error"), Op::Sub, &[&vt, &read])?;
            let bt_ = at(bv, &mut s, i, "beta")?;
            vt = s.op0(&name("corrected"), Op::Mul, &[&bt_, &diff])?;
        }
        let kcol = s.op(&name("key_column"), Op::Transpose, &[&kt], &perm(&[0, 1, 3, 2]))?;
        let outer = s.op0(&name("outer"), Op::Mul, &[&kcol, &vt])?;
        let last = i + 1 == t;
        let state_name = match (last, c.node.output.get(1).filter(|o| !o.is_empty())) {
            (true, Some(o)) => o.clone(),
            _ => c.part(&name("state")),
        };
        state = s.b.node(&state_name, Op::Add, &[&state, &outer], &[])?;
        let qg = reshape(s.b, &qt, &dims(&[bt, hkv, group, dk]), &c.part(&name("query_groups")))?;
        let read = s.op0(&name("read"), Op::MatMul, &[&qg, &state])?;
        let scaled = s.op0(&name("scaled"), Op::Mul, &[&read, &s.k(&read, scale)])?;
        outs.push(reshape(s.b, &scaled, &dims(&[bt, hq, 1, dv]), &c.part(&name("output")))?);
    }
    let all = s.op("outputs", Op::Concat, &outs.iter().collect::<Vec<_>>(), &[("axis", Attr::Int(2))])?;
    let seq = s.op("outputs_by_step", Op::Transpose, &[&all], &perm(&[0, 2, 1, 3]))?;
    Ok(vec![reshape(s.b, &seq, &dims(&[bt, t, hq * dv]), &c.out)?, state])
}

#[cfg(test)]
mod tests {
    use meshc_ir::Tensor;

    use crate::dispatch::tests::{attr_f, attr_i, eval_outputs, f32s};
    use crate::proto::AttributeProto;

    /// One head of one dim over two steps, by hand: q = [1, 2], k = [3, 4], v = [5, 6].
    #[test]
    fn linear_attention_follows_the_recurrence() {
        let seq = |a: f32, b: f32| Tensor::f32(vec![1, 2, 1], vec![a, b]);
        let (q, k, v) = (seq(1.0, 2.0), seq(3.0, 4.0), seq(5.0, 6.0));
        let rule = |r: &str| AttributeProto {
            name: Some("update_rule".into()),
            s: Some(r.as_bytes().to_vec()),
            ..Default::default()
        };
        let attrs = |r: &str| vec![attr_i("q_num_heads", 1), attr_i("kv_num_heads", 1), attr_f("scale", 1.0), rule(r)];
        // S = 15, then 15 + 24 = 39; each output q·S.
        let y = eval_outputs("LinearAttention", 27, vec![q.clone(), k.clone(), v.clone()], attrs("linear"), 2).unwrap();
        assert_eq!((f32s(&y[0]), f32s(&y[1])), (vec![15.0, 78.0], vec![39.0]));
        // Decayed by e^0 then e^ln2; the second value corrected to ½·(6 − 4·30) = −57:
        // S = 30 + 4·(−57) = −198.
        let (none, decay, beta) = (Tensor::f32(vec![1, 1, 1, 1], vec![0.0]), seq(0.0, 2f32.ln()), seq(1.0, 0.5));
        let y = eval_outputs("LinearAttention", 27, vec![q, k, v, none, decay, beta], attrs("gated_delta"), 2).unwrap();
        let (out, state) = (f32s(&y[0]), f32s(&y[1]));
        assert!(
            out[0] == 15.0 && (out[1] + 396.0).abs() < 1e-3 && (state[0] + 198.0).abs() < 1e-3,
            "{out:?} {state:?}"
        );
    }
}
