//! Differential fuzzing of the whole pipeline: random valid graphs — every value kind
//! (inputs, params from `init` and inline `value`) in every operand position, repeated
//! uses, outputs that other nodes also read, broadcasting, ranks 0 to 4, sizes that do and
//! do not divide, graphs of params only; elementwise ops (exp, log, sqrt, div and pow
//! behind guards that keep them in their domain), reductions, softmax, layer_norm, matmul,
//! integer matmuls of 8-bit values less a zero point, einsum, data movement (reshape, transpose, slice with any steps, concat, broadcast_to),
//! gather and scatter_elements (every reduction), dynamic_slice and dynamic_update_slice
//! (clamped starts), cumsum (every axis, both flags), iota (every axis), broadcast_like, positions against each other, with i32 and i64 indices, integer arithmetic and mod in i32 and i64, casts,
//! comparisons, logic, floor/ceil/round, and where on a bool input or a computed mask — compiled with both GEMM paths and random stream options, on one device,
//! under random legal layouts on 2 to 8 devices, placed in random stages (micro-batched or
//! not), with failed links or failed devices, on one device compiled once over a
//! symbolic batch and run at a smaller one, and on one device with int8 weights (against
//! the interpreter on the quantize pass's graph, within a step of int8), must give what the reference
//! interpreter gives, and nothing may panic. The only accepted failures are the documented
//! refusals of `REFUSALS`.
//!
//! `make test` runs `DEFAULT_CASES`; `MESHC_FUZZ_CASES=N` runs N (`make fuzz`). A failure
//! prints the minimised graph in the text format, and with `MESHC_FUZZ_SAVE=FILE` writes
//! it there: add it to testdata/regress/ with the fix.

use std::collections::HashMap;

use meshc::compile::{Gemm, Options};
use meshc::passes::streams::Config;
use meshc_ir::{Family, Op, Tensor, TensorType};
use proptest::prelude::*;

const DEFAULT_CASES: u32 = 512;

/// The unary ops the generator draws elsewhere: behind a guard of their domain (`7`) or on
/// other dtypes. Every other op of the unary family is drawn on any f32 value (`unary`), so
/// a new one is fuzzed without an edit here.
const GUARDED_UNARY: &[Op] =
    &[Op::Exp, Op::Log, Op::Sqrt, Op::Rsqrt, Op::Cast, Op::Not, Op::Floor, Op::Ceil, Op::Round];
const BINARY: &[&str] = &["add", "sub", "mul", "maximum", "minimum"];
const DIMS: &[usize] = &[1, 2, 3, 4, 6, 8];

/// The `pick`th of the unary ops drawn on any f32 value.
fn unary(pick: u8) -> &'static str {
    let ops: Vec<Op> =
        Op::ALL.iter().copied().filter(|op| op.family() == Family::Unary && !GUARDED_UNARY.contains(op)).collect();
    ops[pick as usize % ops.len()].name()
}

/// GELU of `x` as torch exports it, named `name`: the last line, and the lines before it
/// (constants and steps); the tanh form when `tanh`.
fn exported_gelu(name: &str, x: &str, tanh: bool) -> (String, Vec<String>) {
    let consts =
        [("half", 0.5), ("one", 1.0), ("sqrt2", std::f64::consts::SQRT_2), ("c1", 0.044715), ("c2", 0.7978846)];
    let mut lines: Vec<String> = consts.iter().map(|(c, v)| format!("param {name}{c}: f32[] = value {v}")).collect();
    let steps: &[&str] = if tanh {
        &[
            "h = mul(X, Nhalf)",
            "s = mul(X, X)",
            "p = mul(Ns, X)",
            "c = mul(Np, Nc1)",
            "u = add(X, Nc)",
            "k = mul(Nu, Nc2)",
            "t = tanh(Nk)",
            "a = add(Nt, None)",
        ]
    } else {
        &["d = div(X, Nsqrt2)", "e = erf(Nd)", "a = add(Ne, None)", "h = mul(X, Nhalf)"]
    };
    lines.extend(steps.iter().map(|l| format!("{name}{}", l.replace('X', x).replace('N', name))));
    (format!("{name} = mul({name}h, {name}a)"), lines)
}

/// What a case is made of; the graph is built from it deterministically, so proptest
/// shrinks the numbers and the graph shrinks with them.
#[derive(Clone, Debug)]
struct Recipe {
    base: Vec<u8>,
    inputs: Vec<u8>,
    params: Vec<(u8, u8)>,
    ops: Vec<(u8, u8, u8, u8)>,
    outputs: u8,
    options: u8,
    /// How the graph is spread (`Spread`), the mesh, and the picks of layouts and stages.
    layout: Option<(u8, u8, Vec<u8>)>,
    /// On one device, over a symbolic batch: the inputs whose first dim is the base's first
    /// carry it as `batch`, the graph is compiled once for `batch=1..N` (N that size) and
    /// run at a smaller batch this number picks, against the interpreter at that batch.
    batch: Option<u8>,
}

fn recipe() -> impl Strategy<Value = Recipe> {
    (
        prop::collection::vec(any::<u8>(), 0..=4),
        prop::collection::vec(any::<u8>(), 0..=2),
        prop::collection::vec((any::<u8>(), any::<u8>()), 0..=3),
        prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>()), 1..=7),
        any::<u8>(),
        any::<u8>(),
        prop::option::weighted(0.5, (any::<u8>(), any::<u8>(), prop::collection::vec(any::<u8>(), 4))),
        prop::option::weighted(0.3, any::<u8>()),
    )
        .prop_map(|(base, inputs, params, ops, outputs, options, layout, batch)| Recipe {
            base,
            inputs,
            params,
            ops,
            outputs,
            options,
            batch: batch.filter(|_| layout.is_none()),
            layout,
        })
}

/// A value's shape: the base shape with the dims `mask` picks set to 1, and the leading
/// `drop` dims left out (both broadcast against the base).
fn derived(base: &[usize], mask: u8, drop: usize) -> Vec<usize> {
    base.iter().enumerate().skip(drop).map(|(d, &n)| if mask >> d & 1 == 1 { 1 } else { n }).collect()
}

/// The value `b` picks among those whose shape broadcasts with `xs` (the first operand is
/// one).
fn partner(values: &[(String, Vec<usize>)], xs: &[usize], b: u8) -> (String, Vec<usize>) {
    let fit: Vec<&(String, Vec<usize>)> = values.iter().filter(|(_, s)| broadcasts(s, xs)).collect();
    fit[b as usize % fit.len()].clone()
}

fn broadcasts(a: &[usize], b: &[usize]) -> bool {
    (1..=a.len().min(b.len())).all(|i| {
        let (p, q) = (a[a.len() - i], b[b.len() - i]);
        p == q || p == 1 || q == 1
    })
}

fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let r = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(r).map_or(1, |j| s[j]);
    (0..r).map(|i| if at(a, i) == 1 { at(b, i) } else { at(a, i) }).collect()
}

fn shape_text(s: &[usize]) -> String {
    let d: Vec<String> = s.iter().map(usize::to_string).collect();
    format!("[{}]", d.join(","))
}

/// The graph of `r` in the text format.
fn graph(r: &Recipe) -> String {
    let mut base: Vec<usize> = r.base.iter().map(|&b| DIMS[b as usize % DIMS.len()]).collect();
    let mut inputs = r.inputs.clone();
    if let Some(pick) = r.batch {
        // Something to scale: a batch of at least 2, and a first input that carries it
        // (no leading dim dropped, none set to 1).
        match base.first_mut() {
            Some(n) if *n >= 2 => {}
            Some(n) => *n = 2 + pick as usize % 7,
            None => base.push(2 + pick as usize % 7),
        }
        match inputs.first_mut() {
            Some(m) => *m &= 0x1e,
            None => inputs.push(0),
        }
    }
    let mut lines = Vec::new();
    let mut values: Vec<(String, Vec<usize>)> = Vec::new();
    for (k, &m) in inputs.iter().enumerate() {
        let s = derived(&base, m, (m >> 5) as usize % (base.len() + 1));
        lines.push(format!("input x{k}: f32{}", shape_text(&s)));
        values.push((format!("x{k}"), s));
    }
    for (k, &(m, how)) in r.params.iter().enumerate() {
        let s = derived(&base, m, (m >> 5) as usize % (base.len() + 1));
        let n: usize = s.iter().product();
        let data = match how % 3 {
            0 => format!("init normal{{seed = {how}, std = 0.5}}"),
            1 => "init ones".to_string(),
            _ if n <= 16 => {
                let v: Vec<String> = (0..n).map(|i| format!("{:.2}", (i as f64 * 0.37 + how as f64).sin())).collect();
                format!("value {}", nest(&v, &s))
            }
            _ => format!("init uniform{{seed = {how}, low = -1.0, high = 1.0}}"),
        };
        lines.push(format!("param p{k}: f32{} = {data}", shape_text(&s)));
        values.push((format!("p{k}"), s));
    }
    if values.is_empty() {
        lines.push(format!("param p: f32{} = init normal{{seed = 7, std = 1.0}}", shape_text(&base)));
        values.push(("p".into(), base.clone()));
    }
    let leaves = values.len();
    let mut nodes = Vec::new();
    for (k, &(op, a, b, arg)) in r.ops.iter().enumerate() {
        let (x, xs) = values[a as usize % values.len()].clone();
        let name = format!("n{k}");
        let (line, shape) = match op % 30 {
            // GELU also as exporters write it, in arithmetic (the gelu pass makes it one op).
            0 if unary(arg) == "gelu" && b & 1 == 1 => {
                let (last, body) = exported_gelu(&name, &x, b & 2 != 0);
                lines.extend(body);
                (last, xs.clone())
            }
            // SiLU as exporters write it, either operand first (the epilogue pass makes it one
            // step of a matmul's epilogue).
            0 if unary(arg) == "sigmoid" && b & 1 == 1 => {
                lines.push(format!("{name}s = sigmoid({x})"));
                let (l, r) = if b & 2 != 0 { (format!("{name}s"), x.clone()) } else { (x.clone(), format!("{name}s")) };
                (format!("{name} = mul({l}, {r})"), xs.clone())
            }
            0 => (format!("{name} = {}({x})", unary(arg)), xs.clone()),
            1 | 2 => {
                let (y, ys) = partner(&values, &xs, b);
                let op = BINARY[arg as usize % BINARY.len()];
                // Either order: params and inputs in every operand position.
                let (l, r) = if arg & 0x80 != 0 { (&y, &x) } else { (&x, &y) };
                (format!("{name} = {op}({l}, {r})"), broadcast(&xs, &ys))
            }
            3 if !xs.is_empty() => {
                let axis = arg as usize % xs.len();
                // (A max over an empty axis is an error.)
                let red = ["reduce_sum", "reduce_mean", "reduce_max"][b as usize % (2 + usize::from(xs[axis] > 0))];
                let mut s = xs.clone();
                s[axis] = 1;
                (format!("{name} = {red}({x}) {{axes = [{axis}], keepdims = true}}"), s)
            }
            4 if !xs.is_empty() => {
                (format!("{name} = softmax({x}) {{axis = {}}}", arg as usize % xs.len()), xs.clone())
            }
            // An integer product as onnxruntime's dynamic quantization writes it: an 8-bit
            // activation less its zero point, by an 8-bit weight, both widened to i32, then
            // the sums to f32 and a scale (the zero_point and epilogue passes fuse it). Of a
            // leaf only, as for the other casts of `8`, scaled exactly.
            8 if !values[a as usize % leaves].1.is_empty() && b % 4 == 3 => {
                let (x, xs) = values[a as usize % leaves].clone();
                let (n, kdim) = (*base.last().unwrap_or(&1), *xs.last().unwrap());
                let (t, zp) = if arg & 1 == 0 { ("u8", i32::from(arg)) } else { ("i8", i32::from(arg) - 128) };
                lines.push(format!("param z{k}: i32[] = value {zp}"));
                lines.push(format!(
                    "param v{k}: f32[{kdim},{n}] = init uniform{{seed = {arg}, low = -127.0, high = 127.0}}"
                ));
                lines.push(format!("param s{k}: f32[] = value 0.001"));
                // Times 256, exact in both: the bytes then span their whole range.
                lines.push(format!("param e{k}: f32[] = value 256.0"));
                lines.push(format!("{name}e = mul({x}, e{k})"));
                lines.push(format!("{name}u = cast({name}e) {{to = \"{t}\"}}"));
                lines.push(format!("{name}c = cast({name}u) {{to = \"i32\"}}"));
                lines.push(format!("{name}a = sub({name}c, z{k})"));
                lines.push(format!("{name}v = cast(v{k}) {{to = \"i8\"}}"));
                lines.push(format!("{name}w = cast({name}v) {{to = \"i32\"}}"));
                lines.push(format!("{name}p = matmul({name}a, {name}w)"));
                lines.push(format!("{name}f = cast({name}p) {{to = \"f32\"}}"));
                let mut s = xs.clone();
                *s.last_mut().unwrap() = n;
                (format!("{name} = mul({name}f, s{k})"), s)
            }
            5 if !xs.is_empty() => {
                // A quarter 32 wide: a whole strip, so the library GEMM's weight goes in
                // panels (runtime/src/kernels/panels.rs; narrower ones stay row-major).
                let n = if b % 4 == 3 { 32 } else { *base.last().unwrap_or(&1) };
                let kdim = *xs.last().unwrap();
                lines.push(format!("param w{k}: f32[{kdim},{n}] = init normal{{seed = {arg}, std = 0.5}}"));
                let mut s = xs.clone();
                *s.last_mut().unwrap() = n;
                (format!("{name} = matmul({x}, w{k})"), s)
            }
            6 if !xs.is_empty() => {
                let d = *xs.last().unwrap();
                lines.push(format!("param g{k}: f32[{d}] = init normal{{seed = {arg}, mean = 1.0, std = 0.2}}"));
                lines.push(format!("param b{k}: f32[{d}] = init normal{{seed = {b}, std = 0.2}}"));
                // An eps of 0.01: a row of (nearly) equal values divides its rounding error
                // by sqrt(eps), and both sides round differently.
                (format!("{name} = layer_norm({x}, g{k}, b{k}) {{axis = -1, eps = 0.01}}"), xs.clone())
            }
            // Ops whose domain or range needs care, behind a guard node: exp of a bounded
            // value, a division by at least 1, square root, its reciprocal and log of at
            // least 1 (exp of a non-negative value). Near 0 they magnify a rounding
            // difference in their operand without bound: a sum over 6 values that cancels to 0 interpreted
            // and to 3e-8 compiled has square roots 0 and 1.7e-4.
            7 => {
                let (guard, op) = match arg % 5 {
                    0 => (format!("tanh({x})"), "exp"),
                    1 => (format!("abs({x})"), "sqrt"),
                    2 => (format!("abs({x})"), "div"),
                    3 => (format!("abs({x})"), "rsqrt"),
                    _ => (format!("abs({x})"), "log"),
                };
                lines.push(format!("{name}g = {guard}"));
                // (exp of a non-negative value is at least 1: a divisor that grows with |x|,
                // like 2|x| would, is 0 where x is, and x/2|x| is then 0.5 on one side and
                // NaN on the other when x cancels to 6e-8 interpreted and to 0 compiled.)
                if op == "exp" {
                    (format!("{name} = exp({name}g)"), xs.clone())
                } else {
                    lines.push(format!("{name}h = exp({name}g)"));
                    let call = match op {
                        "div" => format!("div({x}, {name}h)"),
                        op => format!("{op}({name}h)"),
                    };
                    (format!("{name} = {call}"), xs.clone())
                }
            }
            // Other dtypes: a round trip through an integer (truncation toward zero, then a
            // storage int's wrap, or u64's saturation of a negative value, and its unsigned
            // way back), and where with a bool condition from a graph input.
            // (Of an input or param: after arithmetic, a one-ulp difference between the
            // compiled and interpreted value can truncate to different integers.)
            8 => {
                let (x, xs) = values[a as usize % leaves].clone();
                let int = ["i32", "i8", "u8", "i16", "u16", "u32", "u64"][arg as usize % 7];
                // A negative value cast to u32 wraps to near 2^32, beyond where compiled sin
                // and cos are accurate (docs/ops.md): u32 takes |x| (every_cast tests the wrap).
                let x = if int == "u32" {
                    lines.push(format!("{name}a = abs({x})"));
                    format!("{name}a")
                } else {
                    x
                };
                lines.push(format!("{name}i = cast({x}) {{to = \"{int}\"}}"));
                (format!("{name} = cast({name}i) {{to = \"f32\"}}"), xs)
            }
            9 if !inputs.is_empty() => {
                let (y, ys) = partner(&values, &xs, b);
                let c = format!("c{k}");
                let s = broadcast(&xs, &ys);
                lines.insert(0, format!("input {c}: bool{}", shape_text(&s)));
                (format!("{name} = where({c}, {x}, {y})"), s)
            }
            10 => {
                let n: usize = xs.iter().product();
                let to = reshaped(n, arg);
                let mut text: Vec<String> = to.iter().map(usize::to_string).collect();
                // (A -1 among zero elements is ambiguous.)
                if let (Some(first), true) = (text.first_mut(), b & 1 == 1 && n > 0) {
                    *first = "-1".into();
                }
                (format!("{name} = reshape({x}) {{shape = [{}]}}", text.join(", ")), to)
            }
            11 => {
                let perm = permutation(xs.len(), arg as usize * 31 + b as usize);
                let text: Vec<String> = perm.iter().map(usize::to_string).collect();
                (
                    format!("{name} = transpose({x}) {{perm = [{}]}}", text.join(", ")),
                    perm.iter().map(|&d| xs[d]).collect(),
                )
            }
            12 if !xs.is_empty() => {
                let axis = arg as usize % xs.len();
                let n = xs[axis] as i64;
                let step = [1, 2, -1, -3][b as usize % 4];
                let (start, end) = ((arg >> 2) as i64 % (2 * n + 1) - n, (b >> 2) as i64 % (2 * n + 3) - n - 1);
                let mut s = xs.clone();
                s[axis] = slice_len(n, start, end, step);
                (
                    format!(
                        "{name} = slice({x}) {{starts = [{start}], ends = [{end}], axes = [{axis}], steps = [{step}]}}"
                    ),
                    s,
                )
            }
            13 if !xs.is_empty() => {
                let axis = arg as usize % xs.len();
                let fits = |s: &[usize]| s.len() == xs.len() && (0..s.len()).all(|d| d == axis || s[d] == xs[d]);
                let same: Vec<&(String, Vec<usize>)> = values.iter().filter(|(_, s)| fits(s)).collect();
                let (y, ys) = same[b as usize % same.len()].clone();
                let mut s = xs.clone();
                s[axis] += ys[axis];
                let mut operands = vec![x.clone(), y];
                if arg & 0x80 != 0 {
                    operands.push(x.clone());
                    s[axis] += xs[axis];
                }
                (format!("{name} = concat({}) {{axis = {axis}}}", operands.join(", ")), s)
            }
            14 => {
                let mut to = if broadcasts(&xs, &base) { broadcast(&xs, &base) } else { xs.clone() };
                if arg & 1 == 1 && to.len() < 4 {
                    to.insert(0, DIMS[b as usize % DIMS.len()]);
                }
                (format!("{name} = broadcast_to({x}) {{shape = {}}}", shape_text(&to)), to)
            }
            // Indices in [-n, n) of an inline i32/i64 value, or an integer graph input.
            15 if !xs.is_empty() => {
                let axis = arg as usize % xs.len();
                let n = xs[axis];
                // (No index is in range of an empty axis.)
                let ishape = if n == 0 { vec![0] } else { [vec![], vec![2], vec![2, 3]][b as usize % 3].clone() };
                let dtype = if arg & 0x80 != 0 { "i64" } else { "i32" };
                let i = format!("i{k}");
                if arg & 0x40 != 0 {
                    lines.insert(0, format!("input {i}: {dtype}{}", shape_text(&ishape)));
                } else {
                    let count: usize = ishape.iter().product();
                    let v: Vec<String> = (0..count)
                        .map(|j| ((j * 5 + b as usize) % (2 * n)) as i64 - n as i64)
                        .map(|v| v.to_string())
                        .collect();
                    lines.push(format!("param {i}: {dtype}{} = value {}", shape_text(&ishape), nest(&v, &ishape)));
                }
                let mut s = xs[..axis].to_vec();
                s.extend(&ishape);
                s.extend(&xs[axis + 1..]);
                (format!("{name} = gather({x}, {i}) {{axis = {axis}}}"), s)
            }
            // x's letters, w's `cz`: contracts or keeps x's last letter, may sum out another,
            // and permutes the output. Half the time a third operand `zy` joins: contracted
            // pairwise in the greedy order (`einsum::path`), its `z` summed or kept.
            16 if !xs.is_empty() => {
                let letters: Vec<char> = "abcdefgh".chars().take(xs.len()).collect();
                let (c, n) = (*letters.last().unwrap(), DIMS[b as usize % DIMS.len()]);
                let third = b as usize / DIMS.len();
                lines.push(format!(
                    "param w{k}: f32[{},{n}] = init normal{{seed = {arg}, std = 0.5}}",
                    xs[xs.len() - 1]
                ));
                let mut out: Vec<(char, usize)> = letters.iter().copied().zip(xs.iter().copied()).collect();
                if arg & 1 == 0 {
                    out.pop();
                }
                if arg & 2 != 0 && out.len() > 1 {
                    out.remove(b as usize % out.len());
                }
                let x_letters: String = letters.iter().collect();
                let (mut operands, mut terms) = (format!("{x}, w{k}"), format!("{x_letters},{c}z"));
                if third % 2 == 1 {
                    let m = DIMS[third / 2 % DIMS.len()];
                    lines.push(format!("param v{k}: f32[{n},{m}] = init normal{{seed = {}, std = 0.5}}", arg ^ 0x55));
                    operands.push_str(&format!(", v{k}"));
                    terms.push_str(",zy");
                    out.push(('y', m));
                }
                if third.is_multiple_of(2) || (third / 2 / DIMS.len()).is_multiple_of(2) {
                    out.push(('z', n));
                }
                let out: Vec<(char, usize)> =
                    permutation(out.len(), arg as usize >> 2).iter().map(|&i| out[i]).collect();
                let o_letters: String = out.iter().map(|p| p.0).collect();
                (
                    format!("{name} = einsum({operands}) {{equation = \"{terms}->{o_letters}\"}}"),
                    out.iter().map(|p| p.1).collect(),
                )
            }
            // pow of a base in [1/e, e] to an exponent in (-1, 1).
            17 => {
                let (y, ys) = partner(&values, &xs, b);
                lines.push(format!("{name}t = tanh({x})"));
                lines.push(format!("{name}g = exp({name}t)"));
                lines.push(format!("{name}e = tanh({y})"));
                (format!("{name} = pow({name}g, {name}e)"), broadcast(&xs, &ys))
            }
            // Integer arithmetic (wrapping, so any order agrees) on truncated leaves.
            18 => {
                let ((x, xs), (y, ys)) = (values[a as usize % leaves].clone(), values[b as usize % leaves].clone());
                let dtype = ["i32", "i64"][arg as usize % 2];
                lines.push(format!("{name}i = cast({x}) {{to = \"{dtype}\"}}"));
                lines.push(format!("{name}j = cast({y}) {{to = \"{dtype}\"}}"));
                let op = ["add", "sub", "mul", "maximum", "minimum"][(arg >> 1) as usize % 5];
                lines.push(format!("{name}k = {op}({name}i, {name}j)"));
                let mut s = broadcast(&xs, &ys);
                let last = match (arg >> 4) % 4 {
                    0 if !s.is_empty() => {
                        let red = ["reduce_sum", "reduce_max"][(arg >> 6) as usize % (1 + usize::from(s[0] > 0))];
                        lines.push(format!("{name}r = {red}({name}k) {{axes = [0], keepdims = false}}"));
                        s.remove(0);
                        format!("{name}r")
                    }
                    1 => {
                        lines.push(format!("{name}r = neg({name}k)"));
                        format!("{name}r")
                    }
                    2 => {
                        lines.push(format!("{name}r = abs({name}k)"));
                        format!("{name}r")
                    }
                    _ => format!("{name}k"),
                };
                (format!("{name} = cast({last}) {{to = \"f32\"}}"), s)
            }
            // Comparisons and logic (bools inside fused loops), rounding, and integer mod
            // (zero divisors, both sign rules) and bitwise logic, all on leaves: a computed value may differ
            // by an ulp between the compiled and interpreted graphs, which would flip a
            // comparison or a rounding at a tie.
            19 => {
                let ((x, xs), (y, ys)) = (values[a as usize % leaves].clone(), values[b as usize % leaves].clone());
                let s = broadcast(&xs, &ys);
                if arg & 0x80 != 0 {
                    let dtype = ["i32", "i64"][arg as usize % 2];
                    lines.push(format!("{name}i = cast({x}) {{to = \"{dtype}\"}}"));
                    lines.push(format!("{name}j = cast({y}) {{to = \"{dtype}\"}}"));
                    let fmod = (arg >> 1) & 1 == 1;
                    lines.push(format!("{name}m = mod({name}i, {name}j) {{fmod = {fmod}}}"));
                    // and, or, xor and not are bitwise on integers.
                    let last = match (arg >> 2) % 5 {
                        0 => format!("{name}m"),
                        4 => {
                            lines.push(format!("{name}b = not({name}m)"));
                            format!("{name}b")
                        }
                        k => {
                            let op = ["and", "or", "xor"][k as usize - 1];
                            lines.push(format!("{name}b = {op}({name}m, {name}j)"));
                            format!("{name}b")
                        }
                    };
                    (format!("{name} = cast({last}) {{to = \"f32\"}}"), s)
                } else {
                    const CMP: &[&str] = &["equal", "less", "less_equal", "greater", "greater_equal"];
                    let cmp = CMP[arg as usize % CMP.len()];
                    lines.push(format!("{name}c = {cmp}({x}, {y})"));
                    let logic = match (arg >> 3) % 4 {
                        3 => format!("not({name}c)"),
                        k => {
                            let cmp2 = CMP[(arg >> 5) as usize % CMP.len()];
                            lines.push(format!("{name}e = {cmp2}({y}, {x})"));
                            format!("{}({name}c, {name}e)", ["and", "or", "xor"][k as usize])
                        }
                    };
                    lines.push(format!("{name}l = {logic}"));
                    lines.push(format!("{name}r = {}({x})", ["floor", "ceil", "round"][(arg >> 2) as usize % 3]));
                    (format!("{name} = where({name}l, {name}r, {y})"), s)
                }
            }
            // conv over [N, C, spatial...]: groups 1, 2 or depthwise, strides, pads and
            // dilations small enough that every window fits the padded input.
            20 if (3..=4).contains(&xs.len()) && xs.iter().all(|&d| d > 0) => {
                let c = xs[1];
                let groups = [1, c, if c % 2 == 0 { 2 } else { 1 }][b as usize % 3];
                let m = groups * (1 + (arg as usize >> 7));
                let sp = &xs[2..];
                let mut kernel = Vec::new();
                let (mut strides, mut dil, mut begin, mut end, mut out) = (vec![], vec![], vec![], vec![], vec![]);
                for (d, &n) in sp.iter().enumerate() {
                    let bits = (arg as usize >> (2 * d)) ^ (b as usize >> d);
                    let (pb, pe, st, dl) = (bits % 2, (bits >> 1) % 2, 1 + (bits >> 2) % 2, 1 + (bits >> 3) % 2);
                    let mut ks = 1 + (bits >> 4) % 3;
                    while (ks - 1) * dl + 1 > n + pb + pe {
                        ks -= 1;
                    }
                    out.push((n + pb + pe - (ks - 1) * dl - 1) / st + 1);
                    kernel.push(ks);
                    strides.push(st);
                    dil.push(dl);
                    begin.push(pb);
                    end.push(pe);
                }
                let wshape: Vec<usize> = [m, c / groups].into_iter().chain(kernel.iter().copied()).collect();
                lines.push(format!("param w{k}: f32{} = init normal{{seed = {arg}, std = 0.5}}", shape_text(&wshape)));
                let bias = if arg & 0x40 != 0 {
                    lines.push(format!("param cb{k}: f32[{m}] = init normal{{seed = {b}, std = 0.5}}"));
                    format!(", cb{k}")
                } else {
                    String::new()
                };
                let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
                let pads = [begin, end].concat();
                (
                    format!(
                        "{name} = conv({x}, w{k}{bias}) {{strides = [{}], pads = [{}], dilations = [{}], groups = {groups}}}",
                        list(&strides),
                        list(&pads),
                        list(&dil)
                    ),
                    [vec![xs[0], m], out].concat(),
                )
            }
            // max_pool / avg_pool: pads below the kernel (no window of padding alone),
            // dilation only unpadded, ceil_mode and count_include_pad both ways. A fifth of
            // the dims have a kernel wider than the dim itself, over pads as wide: only the
            // taps that land on the input are read (`Window::pool_taps`).
            21 if (3..=4).contains(&xs.len()) && xs.iter().all(|&d| d > 0) => {
                let max = arg & 1 == 1;
                let ceil = arg & 2 != 0;
                let (mut kernel, mut strides, mut dil, mut begin, mut end, mut out) =
                    (vec![], vec![], vec![], vec![], vec![], vec![]);
                for (d, &n) in xs[2..].iter().enumerate() {
                    let bits = (arg as usize >> (2 + d)) ^ (b as usize >> (2 * d));
                    let wide = (b as usize >> (4 + d)).is_multiple_of(5);
                    let ks = if wide { n + 1 + bits % 3 } else { 1 + bits % 3.min(n) };
                    let (pb, pe) = match wide {
                        // At least ks − n of padding, so that the window fits.
                        true => ((ks - n) / 2 + (bits >> 2) % 2, (ks - n).div_ceil(2) + (bits >> 3) % 2),
                        false => ((bits >> 2) % ks, (bits >> 3) % ks),
                    };
                    let dl = if pb + pe == 0 && ks > 1 && (ks - 1) * 2 < n { 1 + (bits >> 4) % 2 } else { 1 };
                    let st = 1 + (bits >> 5) % 2;
                    let (padded, span) = (n + pb + pe, (ks - 1) * dl + 1);
                    let mut o = (padded - span) / st + 1;
                    if ceil && (padded - span) % st != 0 {
                        o += 1;
                        if (o - 1) * st >= n + pb {
                            o -= 1;
                        }
                    }
                    out.push(o);
                    kernel.push(ks);
                    strides.push(st);
                    dil.push(dl);
                    begin.push(pb);
                    end.push(pe);
                }
                let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
                let pads = [begin, end].concat();
                let (op, extra) = if max {
                    ("max_pool", String::new())
                } else {
                    ("avg_pool", format!(", count_include_pad = {}", b & 1 == 1))
                };
                (
                    format!(
                        "{name} = {op}({x}) {{kernel = [{}], strides = [{}], pads = [{}], dilations = [{}], ceil_mode = {ceil}{extra}}}",
                        list(&kernel),
                        list(&strides),
                        list(&pads),
                        list(&dil)
                    ),
                    [xs[..2].to_vec(), out].concat(),
                )
            }
            // pad in every mode, with crops (negative pads) where the dim allows them.
            22 if !xs.is_empty() => {
                let mode = ["constant", "reflect", "edge", "wrap"][arg as usize % 4];
                let r = xs.len();
                let mut pads = vec![0i64; 2 * r];
                let mut s = xs.clone();
                for d in 0..r {
                    let bits = (b as usize >> d) ^ (arg as usize >> (2 + d));
                    let (mut pb, mut pe) = ((bits % 4) as i64 - 1, ((bits >> 2) % 4) as i64 - 1);
                    if xs[d] == 0 && mode != "constant" {
                        (pb, pe) = (0, 0);
                    }
                    pb = pb.max(-(xs[d] as i64));
                    pe = pe.max(-(xs[d] as i64) - pb);
                    (pads[d], pads[r + d]) = (pb, pe);
                    s[d] = (xs[d] as i64 + pb + pe) as usize;
                }
                let list: Vec<String> = pads.iter().map(i64::to_string).collect();
                let value = (arg as f64 * 0.37).sin();
                (
                    format!(
                        "{name} = pad({x}) {{pads = [{}], mode = \"{mode}\", value = {value:.3}}}",
                        list.join(", ")
                    ),
                    s,
                )
            }
            // scatter_elements of a value whose dims fit in x's off the axis (x itself, a
            // slice, a broadcast partner), at inline i32/i64 indices in [-n, n) with
            // duplicates, with every reduction.
            23 if !xs.is_empty() && xs.iter().all(|&d| d > 0) => {
                let axis = arg as usize % xs.len();
                let n = xs[axis];
                let fits = |s: &[usize]| s.len() == xs.len() && (0..s.len()).all(|d| d == axis || s[d] <= xs[d]);
                let same: Vec<&(String, Vec<usize>)> = values.iter().filter(|(_, s)| fits(s)).collect();
                let (u, us) = same[b as usize % same.len()].clone();
                let dtype = if arg & 0x80 != 0 { "i64" } else { "i32" };
                let count: usize = us.iter().product();
                let v: Vec<String> = (0..count)
                    .map(|j| ((j * 7 + b as usize) % (2 * n)) as i64 - n as i64)
                    .map(|v| v.to_string())
                    .collect();
                lines.push(format!("param s{k}: {dtype}{} = value {}", shape_text(&us), nest(&v, &us)));
                let reduction = ["none", "add", "mul", "max", "min"][(arg >> 2) as usize % 5];
                (
                    format!("{name} = scatter_elements({x}, s{k}, {u}) {{axis = {axis}, reduction = \"{reduction}\"}}"),
                    xs.clone(),
                )
            }
            // cumsum along any axis (negative ones too), inclusive or not, either way.
            24 if !xs.is_empty() => {
                let axis = (arg as usize % xs.len()) as i64 - if arg & 0x80 != 0 { xs.len() as i64 } else { 0 };
                let (exclusive, reverse) = (b & 1 == 1, b & 2 == 2);
                (
                    format!("{name} = cumsum({x}) {{axis = {axis}, exclusive = {exclusive}, reverse = {reverse}}}"),
                    xs.clone(),
                )
            }
            // dynamic_slice of x, or dynamic_update_slice of x by a value that fits it (x
            // itself, a slice, a broadcast partner), along random axes at inline i32/i64
            // starts from before the start to past the end (clamped into x).
            25 if !xs.is_empty() => {
                let rank = xs.len();
                let mut axes: Vec<usize> = (0..rank).filter(|d| (arg >> d) & 1 == 1).collect();
                if axes.is_empty() {
                    axes.push(b as usize % rank);
                }
                let dtype = if arg & 0x80 != 0 { "i64" } else { "i32" };
                let starts: Vec<String> = (axes.iter().enumerate())
                    .map(|(j, &a)| ((b as usize * 3 + j * 5) % (2 * xs[a] + 3)) as i64 - 1)
                    .map(|v| v.to_string())
                    .collect();
                lines.push(format!("param t{k}: {dtype}[{}] = value [{}]", axes.len(), starts.join(", ")));
                let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
                let fits = |s: &[usize]| {
                    s.len() == rank && (0..rank).all(|d| if axes.contains(&d) { s[d] <= xs[d] } else { s[d] == xs[d] })
                };
                let updates: Vec<&(String, Vec<usize>)> = values.iter().filter(|(_, s)| fits(s)).collect();
                match updates.len() {
                    n if b & 1 == 1 && n > 0 => {
                        let (u, _) = updates[(b as usize >> 1) % n].clone();
                        let line =
                            format!("{name} = dynamic_update_slice({x}, {u}, t{k}) {{axes = [{}]}}", list(&axes));
                        (line, xs.clone())
                    }
                    _ => {
                        let mut s = xs.clone();
                        for (j, &a) in axes.iter().enumerate() {
                            s[a] = (b as usize >> 1).wrapping_add(j) % (xs[a] + 1);
                        }
                        let sizes: Vec<usize> = axes.iter().map(|&a| s[a]).collect();
                        let line = format!(
                            "{name} = dynamic_slice({x}, t{k}) {{axes = [{}], sizes = [{}]}}",
                            list(&axes),
                            list(&sizes)
                        );
                        (line, s)
                    }
                }
            }
            // The positions of one of x's axes (over a symbolic batch, the call's count of
            // them), as f32 to meet the other values.
            26 if !xs.is_empty() => {
                let axis = arg as usize % xs.len();
                lines.push(format!("{name}_i = iota({x}) {{axis = {axis}}}"));
                (format!("{name} = cast({name}_i) {{to = \"f32\"}}"), vec![xs[axis]])
            }
            // A value broadcast against x's shape, x's values unread (over a symbolic batch,
            // a constant that follows the call's batch).
            27 => {
                let (y, ys) = partner(&values, &xs, b);
                (format!("{name} = broadcast_like({y}, {x})"), broadcast(&ys, &xs))
            }
            // The positions of x's first axis against each other, `[n, n]`: a column, a row
            // and a where of the two (over a symbolic batch, the column repeats within the
            // result's rows, each of its rows held for a row of the result).
            28 if xs.first().is_some_and(|&n| n > 0) => {
                let n = xs[0];
                lines.push(format!("{name}_i = iota({x}) {{axis = 0}}"));
                lines.push(format!("{name}_r = cast({name}_i) {{to = \"f32\"}}"));
                lines.push(format!("{name}_c = reshape({name}_r) {{shape = [{n}, 1]}}"));
                lines.push(format!("{name}_l = less({name}_c, {name}_r)"));
                (format!("{name} = where({name}_l, {name}_c, {name}_r)"), vec![n, n])
            }
            // A reduction of at least 2^18 elements to few results (which `reduce_split` runs
            // as partials, reduced again): x times a new `[c, 512]` of positive scales (no
            // cancellation along them beyond x's own, which f32 sums of this length would
            // not keep within the comparison's bounds), reduced over those two axes and
            // over some of x's, all of x's that would leave 8 results or more (the whole
            // stays within 8 MB).
            29 if xs.iter().all(|&d| d > 0) => {
                let r = xs.len();
                let (mut axes, mut kept) = (vec![r, r + 1], Vec::new());
                let (mut results, mut reduced) = (1, 1);
                for (i, &d) in xs.iter().enumerate() {
                    if b >> i & 1 == 1 && results * d < 8 {
                        results *= d;
                        kept.push(d);
                    } else {
                        reduced *= d;
                        axes.push(i);
                    }
                }
                axes.sort_unstable();
                let c = 512usize.div_ceil(reduced);
                lines.push(format!("param o{k}: f32[{c},512] = init uniform{{seed = {arg}, low = 0.5, high = 1.5}}"));
                let wide: Vec<String> = xs.iter().chain(&[1, 1]).map(usize::to_string).collect();
                lines.push(format!("{name}r = reshape({x}) {{shape = [{}]}}", wide.join(", ")));
                lines.push(format!("{name}v = mul({name}r, o{k})"));
                let red = ["reduce_sum", "reduce_mean", "reduce_max"][arg as usize % 3];
                let keepdims = b & 0x80 != 0;
                let shape = match keepdims {
                    true => (0..r + 2).map(|d| if axes.contains(&d) { 1 } else { xs[d] }).collect(),
                    false => kept,
                };
                let list: Vec<String> = axes.iter().map(usize::to_string).collect();
                (format!("{name} = {red}({name}v) {{axes = [{}], keepdims = {keepdims}}}", list.join(", ")), shape)
            }
            _ => (format!("{name} = relu({x})"), xs.clone()),
        };
        lines.push(line);
        values.push((name.clone(), shape));
        nodes.push(name);
    }
    let last = nodes.last().expect("at least one op").clone();
    let mut outputs: Vec<String> =
        nodes.iter().enumerate().filter(|(i, _)| r.outputs >> (i % 8) & 1 == 1).map(|(_, n)| n.clone()).collect();
    if !outputs.contains(&last) {
        outputs.push(last);
    }
    if let (Some(_), Some(&n)) = (r.batch, base.first()) {
        for l in lines.iter_mut().filter(|l| l.starts_with("input ")) {
            let dims = l.split_once('[').map_or("", |(_, d)| d.trim_end_matches(']'));
            if dims.split(',').next() == Some(n.to_string().as_str()) {
                let rest = ", _".repeat(dims.matches(',').count());
                l.push_str(&format!(" dims(batch{rest})"));
            }
        }
    }
    format!("graph fuzz {{\n  {}\n  output {}\n}}\n", lines.join("\n  "), outputs.join(", "))
}

/// A shape of `n` elements picked by `arg`: flat, two or three dims from a divisor of `n`,
/// or a scalar.
fn reshaped(n: usize, arg: u8) -> Vec<usize> {
    if n == 0 {
        return [vec![0], vec![3, 0], vec![0, 1, 2]][arg as usize % 3].clone();
    }
    let divisors: Vec<usize> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
    let d = divisors[arg as usize % divisors.len()];
    match (arg >> 4) % 4 {
        _ if n == 1 && arg & 8 != 0 => vec![],
        0 => vec![n],
        1 => vec![d, n / d],
        2 => vec![n / d, 1, d],
        _ => vec![1, d, n / d],
    }
}

/// A permutation of 0..n drawn from `seed`.
fn permutation(n: usize, seed: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut s = seed;
    for i in (1..n).rev() {
        p.swap(i, s % (i + 1));
        s = s / (i + 1) + 7 * i;
    }
    p
}

/// The length of Python's `range(n)[start:end:step]`.
fn slice_len(n: i64, start: i64, end: i64, step: i64) -> usize {
    let bound = |v: i64, lo: i64, hi: i64| (if v < 0 { v + n } else { v }).clamp(lo, hi);
    let (len, by) = if step > 0 {
        (bound(end, 0, n) - bound(start, 0, n), step)
    } else {
        (bound(start, -1, n - 1) - bound(end, -1, n - 1), -step)
    };
    (len.max(0) as usize).div_ceil(by as usize)
}

/// `v` as nested lists of shape `s` (rank 0: the scalar).
fn nest(v: &[String], s: &[usize]) -> String {
    match s.split_first() {
        None => v[0].clone(),
        Some((&n, rest)) => {
            let per = rest.iter().product::<usize>();
            let parts: Vec<String> = (0..n).map(|i| nest(&v[i * per..(i + 1) * per], rest)).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

fn options(o: u8) -> Options {
    let gemm = [Gemm::Auto, Gemm::Cranelift, Gemm::Library][o as usize % 3];
    let streams = Config { single: o & 4 != 0, compute_streams: 1 + (o as usize >> 3) % 3, comm_always: o & 0x20 != 0 };
    Options {
        gemm,
        streams: if streams.single { Config { compute_streams: 1, ..streams } } else { streams },
        ..Options::default()
    }
}

/// How a case spreads its graph over a mesh (picked by the recipe's first layout number).
#[derive(Clone, Copy, PartialEq)]
enum Spread {
    /// Random legal layouts of some values.
    Layouts,
    /// The same, with a failed link: the reductions route around it.
    FailedLink,
    /// Every node in a random stage (a row of the mesh, or the whole mesh), micro-batched
    /// or not.
    Stages,
    /// Everything replicated and one device failed: the others compute without it.
    FailedDevice,
}

fn spread(mode: u8) -> Spread {
    [Spread::Layouts, Spread::FailedLink, Spread::Stages, Spread::FailedDevice][mode as usize % 4]
}

/// A legal layout spec of `g` under `spread` on one of the test meshes, as JSON.
fn spec(g: &meshc_ir::Graph, info: &meshc_ir::verify::Info, mode: u8, mesh_pick: u8, picks: &[u8]) -> String {
    let spread = spread(mode);
    let meshes: Vec<meshc_runtime::format::mesh::Mesh> = crate::common::meshes()
        .into_iter()
        .filter(|m| match spread {
            Spread::Stages => m.shape.len() > 1 && m.shape[0] > 1,
            // A device degraded along all its linked axes counts as failed: with two linked
            // axes, the ends of a failed link keep computing (and the result is exact).
            Spread::FailedLink => m.shape.iter().filter(|&&n| n > 1).count() > 1,
            _ => true,
        })
        .collect();
    let mesh = &meshes[mesh_pick as usize % meshes.len()];
    let pick = |k: usize| picks[k % picks.len()] as usize;
    let mut extra = Vec::new();
    let mut layouts = Vec::new();
    if matches!(spread, Spread::Layouts | Spread::FailedLink) {
        let names = g.inputs.iter().map(|i| &i.name).chain(g.params.iter().map(|p| &p.name));
        for (k, name) in names.chain(g.nodes.iter().map(|n| &n.name)).enumerate() {
            if pick(k).is_multiple_of(3) {
                continue;
            }
            let picks: Vec<u8> =
                (0..4).map(|d| picks[(k + d) % picks.len()].rotate_left(d as u32 + k as u32)).collect();
            let l = crate::common::layout_from(mesh, &info.types[name].shape, &picks);
            let axes: Vec<String> =
                l.iter().map(|a| a.map_or("null".into(), |a| format!("\"{}\"", mesh.entry_name(a)))).collect();
            layouts.push(format!("\"{name}\": [{}]", axes.join(", ")));
        }
    }
    let coords = |d: usize| format!("{:?}", mesh.coords(d));
    let device = pick(0) % mesh.devices();
    match spread {
        Spread::FailedLink => {
            let axis = pick(1) % mesh.shape.len();
            let mut c = mesh.coords(device);
            let mut to = c.clone();
            if c[axis] + 1 < mesh.shape[axis] {
                to[axis] += 1;
            } else if mesh.topology == meshc_runtime::format::mesh::Topology::Torus && mesh.shape[axis] > 2 {
                to[axis] = 0;
            } else if mesh.shape[axis] > 1 {
                c[axis] -= 1;
            }
            if c != to {
                extra.push(format!(r#""degraded": {{"links": [[{c:?}, {to:?}]]}}"#));
            }
        }
        Spread::FailedDevice => extra.push(format!(r#""degraded": {{"nodes": [{}]}}"#, coords(device))),
        Spread::Stages => {
            let rows = mesh.shape[0];
            let rest = ",*".repeat(mesh.shape.len() - 1);
            let mut stages: Vec<Vec<String>> = vec![Vec::new(); rows + 1];
            for (k, n) in g.nodes.iter().enumerate() {
                stages[pick(k * 3 + 1) % (rows + 1)].push(format!("\"{}\"", n.name));
            }
            let entries: Vec<String> = stages
                .iter()
                .enumerate()
                .filter(|(_, nodes)| !nodes.is_empty())
                .map(|(r, nodes)| {
                    let devices = if r == rows { format!("*{rest}") } else { format!("{r}{rest}") };
                    format!(r#"{{"nodes": [{}], "devices": "{devices}"}}"#, nodes.join(", "))
                })
                .collect();
            let microbatches = 1 + pick(2) % 2;
            extra.push(format!(
                r#""placement": {{"stages": [{}], "microbatches": {microbatches}}}"#,
                entries.join(", ")
            ));
        }
        Spread::Layouts => {}
    }
    let shape: Vec<String> = mesh.shape.iter().map(usize::to_string).collect();
    let axes: Vec<String> = mesh.axes.iter().map(|a| format!("\"{a}\"")).collect();
    let topology = if mesh.topology == meshc_runtime::format::mesh::Topology::Torus { "torus" } else { "mesh" };
    extra.insert(0, format!(r#""layouts": {{{}}}"#, layouts.join(", ")));
    format!(
        r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [{}], "axes": [{}], "topology": "{topology}"}}, {}}}"#,
        shape.join(", "),
        axes.join(", "),
        extra.join(", ")
    )
}

/// The documented refusals (docs/layout.md) a random case may meet: a layout that needs a
/// collective of an i32 or bool tensor, micro-batches of a graph that works across the
/// batch or whose batch does not divide, a stage of dead nodes only, a failed link that cuts a device off, and one
/// that degrades every device (a device degraded along all its linked axes counts as
/// failed: on a [2] mesh, the one link).
const REFUSALS: &[&str] = &[
    "collectives carry f32 only",
    "microbatches:",
    "computes nothing any other stage or output needs",
    "cannot reach the others",
    "every device of the",
];

/// Deterministic inputs in [-1, 1).
fn inputs(g: &meshc_ir::Graph) -> HashMap<String, Tensor> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let TensorType { shape, dtype } = &i.ty;
            let n: usize = shape.iter().product();
            let v = (0..n).map(|j| ((j * 7 + k * 13) % 17) as f64 / 8.5 - 1.0);
            (i.name.clone(), Tensor::new(shape.clone(), meshc_ir::Data::from_f64(*dtype, v)))
        })
        .collect()
}

/// Compiles and runs `text` as `meshc run` does, under `spec` when given, and compares every
/// output with the interpreter's.
fn check(r: &Recipe) -> Result<(), String> {
    let text = graph(r);
    let fail = |what: String| format!("{what}\n--- graph\n{text}");
    let g = meshc_ir::text::parse(&text).map_err(|e| fail(format!("the generator wrote an invalid graph: {e}")))?;
    let info = meshc_ir::verify::verify(&g).map_err(|e| fail(format!("the generator wrote an invalid graph: {e}")))?;
    if let Some(pick) = r.batch {
        return check_batch(r, &g, &info, pick).map(|_| ());
    }
    let params = meshc_ir::params::load_all(&g, std::path::Path::new(".")).map_err(|e| fail(format!("params: {e}")))?;
    let x = inputs(&g);
    let mut values = x.clone();
    values.extend(params.clone());
    let want = meshc_ir::interp::run(&g, &info.order, &info.types, values).map_err(|e| fail(format!("interp: {e}")))?;
    let spec_text = r.layout.as_ref().map(|(mode, m, picks)| spec(&g, &info, *mode, *m, picks));
    let spec = match &spec_text {
        Some(t) => Some(meshc::layout::parse(t, "fuzz.json").map_err(|e| fail(format!("layout: {e}\n--- spec\n{t}")))?),
        None => None,
    };
    let with_spec = |msg: String| match &spec_text {
        Some(t) => fail(format!("{msg}\n--- spec\n{t}")),
        None => fail(msg),
    };
    let built =
        meshc::driver::Job::new(&g, &info, &params, &options(r.options)).spec(spec.as_ref()).build(&Default::default());
    let compiled = match built {
        Ok(c) => c,
        Err(e) if REFUSALS.iter().any(|r| format!("{e:#}").contains(r)) => return Ok(()),
        Err(e) => return Err(with_spec(format!("compile: {e:#}"))),
    };
    let got = compiled.load().and_then(|l| l.run(&x)).map_err(|e| with_spec(format!("run: {e:#}")))?;
    same_outputs(&got, &want, r.options).map_err(with_spec)?;
    if r.layout.is_none() && r.options & INT8 != 0 {
        check_int8(r, &g, &info).unwrap_or(Ok(())).map_err(fail)?;
    }
    Ok(())
}

/// The options bit that compiles a one-device case with `--weights-dtype int8`.
const INT8: u8 = 0x80;

/// `check` again with `--weights-dtype int8` (`Recipe::options` has `INT8`), on one device: the
/// compiled program against the interpreter on the graph the quantize pass makes of it;
/// None when that pass changes nothing. A value computed a little differently before it
/// is quantized (a compiled exp against the interpreter's) may round to the next int8
/// step, which moves the products by up to that step: f32 outputs are held to 2% of their
/// largest magnitude, and other outputs (a comparison of a product) are not compared.
fn check_int8(r: &Recipe, g: &meshc_ir::Graph, info: &meshc_ir::verify::Info) -> Option<Result<(), String>> {
    use meshc::passes::fold::WeightsDtype;
    let (q, _) = meshc::passes::quantize::quantize(g, info, &HashMap::new(), WeightsDtype::Int8)?;
    Some((|| {
        let qinfo = meshc_ir::verify::verify(&q).map_err(|e| format!("the quantized graph: {e}"))?;
        let here = std::path::Path::new(".");
        let params = meshc_ir::params::load_all(g, here).map_err(|e| format!("params: {e}"))?;
        let x = inputs(g);
        let mut values = x.clone();
        values.extend(meshc_ir::params::load_all(&q, here).map_err(|e| format!("params: {e}"))?);
        let want = meshc_ir::interp::run(&q, &qinfo.order, &qinfo.types, values).map_err(|e| format!("interp: {e}"))?;
        let opts = Options { weights: WeightsDtype::Int8, ..options(r.options) };
        let compiled = match meshc::driver::Job::new(g, info, &params, &opts).build(&Default::default()) {
            Ok(c) => c,
            Err(e) if REFUSALS.iter().any(|r| format!("{e:#}").contains(r)) => return Ok(()),
            Err(e) => return Err(format!("compile (int8): {e:#}")),
        };
        let got = compiled.load().and_then(|l| l.run(&x)).map_err(|e| format!("run (int8): {e:#}"))?;
        for (name, w) in want.iter().filter(|(_, w)| w.dtype() == meshc_ir::DType::F32) {
            let g = got.get(name).ok_or_else(|| format!("no output '{name}'"))?;
            let (gv, wv) = (g.data.to_f64(), w.data.to_f64());
            let largest = wv.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
            for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
                let close =
                    (a - b).abs() <= 1e-5 + 1e-4 * b.abs() + 2e-2 * largest || a == b || a.is_nan() && b.is_nan();
                if !close {
                    return Err(format!("output '{name}' element {i} (int8): got {a}, interpreter {b}"));
                }
            }
        }
        Ok(())
    })())
}

/// Every output of the interpreter's (`want`) is in `got`, of its type and close to it.
fn same_outputs(
    got: &std::collections::BTreeMap<String, Tensor>,
    want: &std::collections::BTreeMap<String, Tensor>,
    options: u8,
) -> Result<(), String> {
    for (name, w) in want {
        let g = got.get(name).ok_or_else(|| format!("no output '{name}'"))?;
        if g.ty() != w.ty() {
            return Err(format!("output '{name}' is {}, the interpreter's {}", g.ty(), w.ty()));
        }
        if let Some(i) = g.closeness(w).first_bad {
            return Err(format!(
                "output '{name}' element {i}: got {}, interpreter {} (options {options:#x})",
                g.data.to_f64()[i],
                w.data.to_f64()[i],
            ));
        }
    }
    Ok(())
}

/// What compiling over symbolic dims refuses by design (docs/dynamic-shapes.md): steps
/// that cannot scale yet, named.
const SYMBOLIC_REFUSALS: &[&str] = &[
    "is not compiled yet",
    "cannot take a run-time row count yet",
    "compiled code takes symbolic dims only",
    "is not whole rows of",
    // A symbolic dim that is 1 at the size the graph is written at (a strided slice of the
    // batch) cannot be placed in a reshape that expand writes (avg_pool's): refused in one
    // line; sizes other than 1 at the example are placed.
    "so its place in the reshape is ambiguous",
    // A reshape of symbolic dims beside an empty one (a reversed slice emptied a dim, then
    // a reflect pad's reshapes): every run of dims has the product 0, so none is placed.
    "a reshape of symbolic dims with a size-0 dim is not supported",
];

/// `check` over a symbolic batch (`Recipe::batch`): `g`, written at the batch `n` of its
/// inputs' first dims, compiled once for `batch=1..n` and run at a smaller batch, against
/// the interpreter on the graph written at that batch. A graph the symbolic shapes cannot
/// read, or whose params pin the batch, has nothing to compare: whether outputs were
/// compared.
fn check_batch(r: &Recipe, g: &meshc_ir::Graph, info: &meshc_ir::verify::Info, pick: u8) -> Result<bool, String> {
    use meshc_ir::sym::{self, Symbol};
    let text = graph(r);
    let fail = |what: String| format!("{what} (over batch=1..N)\n--- graph\n{text}");
    let carries = |i: &meshc_ir::graph::Input| i.dims.as_ref().is_some_and(|d| d[0].as_deref() == Some("batch"));
    let Some(n) = g.inputs.iter().find(|i| carries(i)).map(|i| i.ty.shape[0]).filter(|&n| n >= 2) else {
        return Ok(false);
    };
    let symbols: sym::Symbols =
        [("batch".to_string(), Symbol { name: "batch".into(), lo: 1, hi: n as i64, multiple_of: 1 })].into();
    let si = match sym::infer_graph(g, info, &symbols) {
        Ok(si) => si,
        Err(e) if e.contains("meshc bug") => return Err(fail(e)),
        Err(_) => return Ok(false),
    };
    let at: sym::Binding = [("batch".to_string(), 1 + (pick as usize % (n - 1)) as i64)].into();
    if si.checks.iter().any(|c| c.kind.holds(&at) == Some(false)) {
        return Ok(false);
    }
    let small = sym::specialise(g, &si, &at).map_err(fail)?;
    let small_info = meshc_ir::verify::verify(&small).map_err(|e| fail(format!("written at {at:?}: {e}")))?;
    let params = meshc_ir::params::load_all(g, std::path::Path::new(".")).map_err(|e| fail(format!("params: {e}")))?;
    let x = inputs(&small);
    let mut values = x.clone();
    values.extend(params.clone());
    // Constant indices in range at the bounds can be out of range at a smaller batch: then
    // the compiled run must refuse the call too.
    let want = meshc_ir::interp::run(&small, &small_info.order, &small_info.types, values);
    let opts = Options { symbols, ..options(r.options) };
    let compiled = match meshc::driver::Job::new(g, info, &params, &opts).build(&Default::default()) {
        Ok(c) => c,
        Err(e) if SYMBOLIC_REFUSALS.iter().chain(REFUSALS).any(|r| format!("{e:#}").contains(r)) => return Ok(false),
        Err(e) => return Err(fail(format!("compile: {e:#}"))),
    };
    let got = compiled.load().and_then(|l| l.run(&x));
    let (got, want) = match (got, want) {
        (Ok(got), Ok(want)) => (got, want),
        (Err(_), Err(_)) => return Ok(false),
        (Err(e), Ok(_)) => return Err(fail(format!("run at {at:?}: {e:#}"))),
        (Ok(_), Err(e)) => return Err(fail(format!("ran at {at:?}, where the interpreter says: {e}"))),
    };
    same_outputs(&got, &want, r.options).map_err(|e| fail(format!("at {at:?}: {e}")))?;
    Ok(true)
}

/// `n` recipes drawn as the fuzzer draws them, the same on every run.
fn drawn(n: usize) -> impl Iterator<Item = Recipe> {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    (0..n).map(move |_| recipe().new_tree(&mut runner).unwrap().current())
}

/// The symbolic-batch cases compare outputs often enough to mean something: of 200 recipes
/// drawn as the fuzzer draws them, on one device over a symbolic batch, each passes and at
/// least 80 run compiled against the interpreter (111 when written; the others are refused
/// by design, pinned by a param, or not read symbolically).
#[test]
fn symbolic_batch_cases_mostly_compare() {
    let mut compared = 0;
    for mut r in drawn(200) {
        (r.layout, r.batch) = (None, Some(r.options));
        let text = graph(&r);
        let g = meshc_ir::text::parse(&text).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        compared += usize::from(check_batch(&r, &g, &info, r.options).unwrap());
    }
    assert!(compared >= 80, "only {compared} of 200 symbolic-batch cases compared outputs");
}

/// The large-reduction form reaches `reduce_split`: of x (a scalar, `[4, 3]`, `[3, 4, 6, 6]`)
/// with each reduction and either keepdims, the compiled program has the split's partial
/// step, and the case compares, alone and spread over a mesh.
#[test]
fn large_reductions_are_split_and_compare() {
    for (base, b, arg) in [(vec![], 0, 0), (vec![3, 2], 0x81, 1), (vec![2, 3, 5, 5], 0x03, 2), (vec![3, 2], 0x02, 5)] {
        let mut r = Recipe {
            base,
            inputs: vec![0],
            params: vec![],
            ops: vec![(29, 0, b, arg)],
            outputs: 0,
            options: 0,
            layout: None,
            batch: None,
        };
        let text = graph(&r);
        assert!(text.contains("n0 = reduce_"), "{text}");
        let g = meshc_ir::text::parse(&text).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        let params = meshc_ir::params::load_all(&g, std::path::Path::new(".")).unwrap();
        let c = meshc::driver::Job::new(&g, &info, &params, &options(0)).build(&Default::default()).unwrap();
        let partial = c.programs.iter().flat_map(|p| &p.steps).any(|s| s.node.starts_with("n0.partial"));
        assert!(partial, "no partial reduction in\n{text}");
        check(&r).unwrap();
        r.layout = Some((0, 3, vec![1, 2, 3, 4]));
        check(&r).unwrap();
    }
}

/// The recipe of a case the fuzzer found over a symbolic batch: constant padding of a dim
/// a dynamic_slice of size 0 emptied, whose fill block (a constant sized at the bounds)
/// pinned the batch, so the call at batch 1 was refused. The generator draws it, and it
/// now compares.
#[test]
fn symbolic_batch_pad_of_an_emptied_dim_compares() {
    let r = Recipe {
        base: vec![1, 1],
        inputs: vec![0],
        params: vec![],
        ops: vec![(25, 0, 6, 0x82), (22, 1, 5, 0)],
        outputs: 0,
        options: 0,
        layout: None,
        batch: Some(0),
    };
    let text = graph(&r);
    for line in [
        "input x0: f32[2,2] dims(batch, _)",
        "n0 = dynamic_slice(x0, t0) {axes = [1], sizes = [0]}",
        "n1 = pad(n0) {pads = [0, 1, 0, -1], mode = \"constant\"",
    ] {
        assert!(text.contains(line), "{line}\n--- graph\n{text}");
    }
    let g = meshc_ir::text::parse(&text).unwrap();
    let info = meshc_ir::verify::verify(&g).unwrap();
    assert_eq!(check_batch(&r, &g, &info, 0), Ok(true), "{text}");
}

/// The int8 cases quantize something often enough to mean something: of 500 recipes drawn
/// as the fuzzer draws them, run on one device with int8 weights, each passes, and at
/// least 10 have a matmul of a constant weight to quantize (12 of 300 when written, 7 of
/// 300 once the generator drew from 30 forms, as the deterministic draws fell).
#[test]
fn int8_cases_mostly_quantize() {
    let mut quantized = 0;
    for mut r in drawn(500) {
        (r.layout, r.batch, r.options) = (None, None, r.options | INT8);
        let text = graph(&r);
        let g = meshc_ir::text::parse(&text).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        if let Some(checked) = check_int8(&r, &g, &info) {
            checked.unwrap_or_else(|e| panic!("{e}\n--- graph\n{text}"));
            quantized += 1;
        }
    }
    assert!(quantized >= 10, "only {quantized} of 500 int8 cases had a weight to quantize");
}

fn cases() -> u32 {
    std::env::var("MESHC_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CASES)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn compiled_runs_equal_the_interpreter(r in recipe()) {
        let result = std::panic::catch_unwind(|| check(&r));
        // Shrinking runs failing cases smaller and smaller: the last one saved is minimal.
        if let (false, Ok(path)) = (matches!(result, Ok(Ok(()))), std::env::var("MESHC_FUZZ_SAVE")) {
            std::fs::write(&path, graph(&r)).expect("MESHC_FUZZ_SAVE is writable");
        }
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => prop_assert!(false, "{}", e),
            Err(_) => prop_assert!(false, "panicked\n--- graph\n{}", graph(&r)),
        }
    }
}

/// Every graph of testdata/regress through the real binary: `run` (compiled in memory,
/// under the spec beside it if any) against `interp`, on the same inputs.
#[test]
fn regression_graphs_run_as_the_interpreter_does() {
    let dir = crate::common::scratch("regress");
    let mut graphs: Vec<_> = std::fs::read_dir("testdata/regress")
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    graphs.sort();
    assert!(graphs.len() >= 4, "{graphs:?}");
    for path in graphs {
        let g = meshc_ir::load::load(&path).unwrap().0;
        let mut args: Vec<String> = Vec::new();
        for (name, t) in inputs(&g) {
            let file = dir.join(format!("{name}.npy"));
            t.write_npy(&file).unwrap();
            args.extend(["--input".into(), format!("{name}={}", file.display())]);
        }
        let spec = path.with_extension("json");
        for (cmd, out) in [("run", "run"), ("interp", "interp")] {
            let mut a = vec![cmd.to_string(), path.display().to_string()];
            a.extend(args.iter().cloned());
            if cmd == "run" && spec.exists() {
                a.extend(["--layout".into(), spec.display().to_string()]);
            }
            a.extend(["--output-dir".into(), dir.join(out).display().to_string()]);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let r = crate::common::meshc(&a);
            assert_eq!(r.status, Some(0), "{}: meshc {cmd}: {}", path.display(), r.stderr);
        }
        for o in &g.outputs {
            let read = |d: &str| Tensor::read_npy(&dir.join(d).join(format!("{}.npy", o.name))).unwrap();
            let (got, want) = (read("run"), read("interp"));
            assert!(got.closeness(&want).first_bad.is_none(), "{}: output {}", path.display(), o.name);
        }
    }
}

/// A valid artifact and its input arguments, to mutate.
struct Base {
    sections: Vec<(meshc_runtime::format::artifact::SectionKind, usize, Vec<u8>)>,
    inputs: Vec<String>,
}

fn bases() -> &'static Vec<Base> {
    static BASES: std::sync::OnceLock<Vec<Base>> = std::sync::OnceLock::new();
    BASES.get_or_init(|| {
        let dir = crate::common::scratch("mutate-base");
        // The last with the library GEMM: its weights in panels.
        let cases = [
            ("testdata/mlp/graph.json", Some("testdata/mlp/layouts/mp-2x4.json"), "cranelift"),
            ("testdata/transformer/graph.json", None, "cranelift"),
            ("testdata/reductions/graph.json", None, "cranelift"),
            ("testdata/mlp/graph.json", None, "library"),
        ];
        let bases = cases
            .iter()
            .enumerate()
            .map(|(k, (graph, layout, gemm))| {
                let art = dir.join(format!("{k}.mshc"));
                let mut args = vec!["compile", graph, "-o", art.to_str().unwrap(), "--gemm", gemm];
                args.extend(layout.iter().flat_map(|l| ["--layout", *l]));
                assert_eq!(crate::common::meshc(&args).status, Some(0), "{args:?}");
                let a = meshc_runtime::format::artifact::Artifact::open(&art).unwrap();
                let sections = a
                    .sections()
                    .iter()
                    .map(|s| (s.kind, s.align as usize, a.section(s.kind).unwrap().to_vec()))
                    .collect();
                let inputs = crate::common::input_args(std::path::Path::new(graph));
                run_artifact(&art, &inputs, &dir.join(format!("{k}-out"))).expect("runs").expect("accepted");
                Base { sections, inputs }
            })
            .collect();
        bases
    })
}

/// Runs an artifact through the binary: Some when it ran, None when it was refused (exit 1,
/// one line); anything else (a crash, a panic) is an error.
fn run_artifact(art: &std::path::Path, inputs: &[String], out: &std::path::Path) -> Result<Option<()>, String> {
    let mut args = vec!["run".to_string(), art.display().to_string(), "--timeout".into(), "2".into()];
    args.extend(inputs.iter().cloned());
    args.extend(["--output-dir".into(), out.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = crate::common::meshc(&args);
    match r.status {
        Some(0) => {}
        Some(1) if r.stderr.lines().count() == 1 && !r.stderr.contains("panicked") => return Ok(None),
        _ => return Err(format!("exit {:?}: {}", r.status, r.stderr)),
    }
    Ok(Some(()))
}

/// Changes one place of a JSON value: the `pick`-th number or array, by `how`.
fn mutate(v: &mut serde_json::Value, pick: &mut usize, how: u64) -> bool {
    use serde_json::Value;
    match v {
        Value::Number(n) => {
            if *pick > 0 {
                *pick -= 1;
                return false;
            }
            let x = n.as_u64().unwrap_or(0);
            let new = [0, 1, 7, 63, 64, x + 1, x.saturating_sub(1), x * 2, 1 << 31, u64::MAX >> 12][how as usize % 10];
            *v = Value::from(new);
            true
        }
        Value::Array(items) => {
            if *pick == 0 && !items.is_empty() {
                match how % 3 {
                    0 => drop(items.remove((how as usize / 3) % items.len())),
                    1 => items.push(items[(how as usize / 3) % items.len()].clone()),
                    _ => {
                        let last = items.len() - 1;
                        items.swap(0, last)
                    }
                }
                return true;
            }
            *pick = pick.saturating_sub(1);
            items.iter_mut().any(|i| mutate(i, pick, how))
        }
        Value::Object(m) => m.values_mut().any(|i| mutate(i, pick, how)),
        _ => false,
    }
}

/// How many numbers and arrays `v` holds: the places `mutate` can pick.
fn places(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    match v {
        Value::Number(_) => 1,
        Value::Array(items) => 1 + items.iter().map(places).sum::<usize>(),
        Value::Object(m) => m.values().map(places).sum(),
        _ => 0,
    }
}

fn mutated_cases() -> u32 {
    std::env::var("MESHC_FUZZ_CASES").ok().and_then(|v| v.parse::<u32>().ok()).map_or(48, |n| n / 20 + 1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: mutated_cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// An artifact whose program or metadata was changed, checksums recomputed (so the
    /// container accepts it), is refused with one line or runs to the end: never a crash.
    #[test]
    fn mutated_programs_are_refused_or_correct(base in 0usize..4, meta in any::<bool>(), pick in any::<u16>(), how in any::<u64>()) {
        use meshc_runtime::format::artifact::{SectionKind, Writer};
        let b = &bases()[base];
        let kind = if meta { SectionKind::Meta } else { SectionKind::Program };
        let mut w = Writer::new();
        let mut changed = false;
        for (k, align, bytes) in &b.sections {
            if *k == kind {
                let mut v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
                let mut p = pick as usize % places(&v);
                changed = mutate(&mut v, &mut p, how);
                if std::env::var("FUZZ_DEBUG").is_ok() {
                    std::fs::write("/tmp/mut-before.json", bytes).unwrap();
                    std::fs::write("/tmp/mut-after.json", serde_json::to_vec_pretty(&v).unwrap()).unwrap();
                }
                w.add_section(*k, *align, serde_json::to_vec(&v).unwrap()).unwrap();
            } else {
                w.add_section(*k, *align, &bytes[..]).unwrap();
            }
        }
        prop_assume!(changed);
        let dir = crate::common::scratch(&format!("mutate-{base}-{pick}-{how}"));
        let art = dir.join("m.mshc");
        std::fs::write(&art, w.to_bytes().unwrap()).unwrap();
        let result = run_artifact(&art, &b.inputs, &dir.join("out"));
        // Refused with one line, or run to the end: a changed program may be another
        // valid program (a step reading another buffer of the right size, a shape permuted
        // over the same bytes) that no runner can tell from the intended one (a signature
        // can); what it must never do is crash, hang or touch memory outside its buffers.
        if let Err(e) = result {
            prop_assert!(false, "{} section, number/array {pick} changed by {how}: {e}", kind.name());
        }
    }
}

/// The generator knows every op a user may write: an op added to the table without a case
/// here fails this test rather than going unfuzzed. (Communication ops are made by
/// lowering, which the layouts of each case exercise; attention and matmul epilogues by
/// compile passes, which run on every case.)
#[test]
fn the_generator_draws_every_op() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRng, TestRunner};
    let rng = TestRng::deterministic_rng(Config::default().rng_algorithm);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4000 {
        let r = recipe().new_tree(&mut runner).expect("a recipe").current();
        let g = meshc_ir::text::parse(&graph(&r)).expect("the generator writes valid text");
        seen.extend(g.nodes.iter().map(|n| n.op));
    }
    let missing: Vec<&str> = meshc_ir::Op::ALL
        .iter()
        .filter(|op| !op.is_communication() && **op != meshc_ir::Op::Attention && !seen.contains(op))
        .map(|op| op.name())
        .collect();
    assert!(missing.is_empty(), "the fuzzer never draws {}", missing.join(", "));
}
