//! The pilot pass (docs/design.md §4.3): run a simplified copy of the graph on pilot
//! inputs, give every block of output features of every prunable weight a priority, and
//! turn the priorities into pruning masks, then prune the graph's params by them (`apply`):
//! the masks travel into the artifact next to their weights (`meshc_runtime::format::mask`), where the
//! matmul kernels read them and skip the pruned work.
//!
//! It runs on the single-device (global) graph, before lowering: priorities are a property
//! of the computation, not of how it is split, and a mask is later sliced with its weight.
//!
//! **Simplified graph.** Same nodes; either every f32 param rounded to `bits:N` mantissa bits
//! (round to nearest, ties to even; `bits:23` is the identity), or `exponent`: sign and
//! power of two only (the mantissa is truncated, so subnormals become zero), or
//! `downsample:AXIS:F`: params unchanged, every pilot input of rank > AXIS averaged over
//! groups of F along AXIS (rank kept). Downsampling is allowed only where the graph still
//! verifies with the smaller inputs — in practice a batch-like axis that no reshape or
//! weight pins; otherwise it is refused with the verifier's reason.
//!
//! **Prunable weights.** A param that is the right operand `W` (`[.., K, N]`) of a matmul,
//! or the 2-letter operand `kn` of a two-operand einsum `..k,kn->..n` (`k` contracted, `n`
//! the result's last letter). Its output features are the N columns, in blocks of `block`.
//!
//! **Priority.** Every f32 value `v` gets a sensitivity `s_v[i]` per index `i` of its last
//! axis: how much the graph outputs move per unit of magnitude in column `i`. Outputs have
//! `s = 1`; going backwards, each consumer `c` of `v` adds to `s_v`:
//! - `c = v·W` (matmul-like, `v` the left operand): `s_v[k] += Σ_n |W[k,n]| s_c[n]` (the
//!   L1 norm of W's row k weighted by what the result's columns are worth; batch dims of W
//!   summed);
//! - `c` elementwise with the same last axis as `v`: `s_v[i] += s_c[i] · g[i]`, the gain
//!   `g[i] = mean|c[..,i]| / mean|v[..,i]|` (0 where v's column is 0), so a ReLU that kills
//!   a column passes nothing back;
//! - any other consumer (reshape, reduction, softmax, a broadcast operand, ...): the column
//!   correspondence is lost, so every column gets the whole-tensor version,
//!   `s_v[i] += mean(s_c) · mean|c| / mean|v|`.
//!
//! The priority of block j of a prunable `W` used by `c = x·W` is, summed over pilot runs,
//! `Σ_{n in block j} Σ_rows |c[..,n]| · s_c[n]`: the block's activation magnitude times what
//! its consumers do with it. For `y = relu(x·W1)·W2` this is exactly
//! `Σ_batch |relu(h)[:, block j]| · ‖W2[k, :]‖₁` summed over the block's rows k of W2.
//!
//! **Masks.** `keep F` keeps the `ceil(F · blocks)` highest-priority blocks (ties: lower
//! block first); `threshold T` keeps the blocks whose priority exceeds `T ×` the weight's
//! largest (so `T = 0` drops exactly the blocks that never contribute). The FLOPs a mask
//! would skip, in `--dump-after pilot`, are those of the dropped columns in the weight's
//! own matmul; what the artifact skips, reported by `compile` and `inspect`, also counts
//! the rows of the next weight that pruning removes (`apply`).
//!
//! **Pruning** (`apply`, documented there) turns the masks into the pruned graph's params
//! and the masks of its matmul weights, which `compile` stores and the kernels read.

use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::attrs;
use meshc_ir::verify::Info;
use meshc_ir::{Data, Graph, Node, Op, Tensor};

/// Default block of output features: 4 micro-panels of the matmul kernel (its NR is one
/// f32x4 vector, 4 columns; codegen's matmul tests check that the two agree), so a dropped
/// block skips whole micro-panels and one 64-byte cache line of every weight row (16 f32).
pub const DEFAULT_BLOCK: usize = 16;

/// How the simplified graph is derived.
#[derive(Clone, Debug, PartialEq)]
pub enum Simplify {
    /// Keep this many mantissa bits (0..=23) of every f32 param, rounding to nearest.
    Bits(u32),
    /// Sign and power of two only.
    Exponent,
    /// Average pilot inputs over groups of `factor` along `axis`.
    Downsample { axis: usize, factor: usize },
}

impl Simplify {
    /// Parses `bits:N`, `exponent` or `downsample:AXIS:F`.
    pub fn parse(s: &str) -> Result<Simplify> {
        let bad = || anyhow!("--pilot-simplify '{s}': expected bits:N (0..=23), exponent or downsample:AXIS:F");
        let parts: Vec<&str> = s.split(':').collect();
        match parts.as_slice() {
            ["exponent"] => Ok(Simplify::Exponent),
            ["bits", n] => match n.parse() {
                Ok(n) if n <= 23 => Ok(Simplify::Bits(n)),
                _ => Err(bad()),
            },
            ["downsample", a, f] => match (a.parse(), f.parse()) {
                (Ok(axis), Ok(factor)) if factor >= 1 => Ok(Simplify::Downsample { axis, factor }),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }

    fn name(&self) -> String {
        match self {
            Simplify::Bits(n) => format!("bits:{n}"),
            Simplify::Exponent => "exponent".into(),
            Simplify::Downsample { axis, factor } => format!("downsample:{axis}:{factor}"),
        }
    }
}

/// Which blocks survive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Select {
    /// Keep this fraction (0 < F <= 1) of each weight's blocks.
    Keep(f64),
    /// Keep the blocks above this fraction of the weight's largest priority.
    Threshold(f64),
}

/// Everything the pass needs besides the graph.
#[derive(Clone, Debug)]
pub struct Config {
    /// Pilot runs: each maps every graph input to a value.
    pub runs: Vec<HashMap<String, Tensor>>,
    pub simplify: Simplify,
    pub block: usize,
    pub select: Select,
}

/// The pass's result for one prunable use of a weight.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightMask {
    pub weight: String,
    pub node: String,
    /// Columns of the weight (output features).
    pub columns: usize,
    /// Priority of each block, in block order.
    pub priorities: Vec<f64>,
    /// Whether each block is kept.
    pub keep: Vec<bool>,
    /// FLOPs of the weight's matmul, and those of the dropped blocks.
    pub flops: u64,
    pub flops_skipped: u64,
}

/// The mask of one pruned matmul weight `[.., K, N]`: which of its columns (output
/// features) and which of its rows (contracted features) survive.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamMask {
    pub col_keep: Vec<bool>,
    pub row_keep: Vec<bool>,
    /// The pilot's block of output features (reported with the mask).
    pub block: usize,
}

/// The pruned graph: its params, and the masks of its matmul weights.
#[derive(Clone, Debug, Default)]
pub struct Pruned {
    pub params: HashMap<String, Tensor>,
    /// By param name.
    pub masks: HashMap<String, ParamMask>,
    /// What was pruned, one line per action, for `--dump-after pilot`.
    pub log: Vec<String>,
}

/// Prunes the params of `g` (verified as `info`) by `masks`, the pilot's result.
///
/// **What pruning a block of output features means.** A dropped feature is removed from
/// the network, as structured pruning does: its column of `W` (in `c = x·W`) is zeroed;
/// then, following `c` forward through elementwise ops whose last axis is still the
/// feature axis, every per-feature param on the way (a bias `[.., N]` used nowhere else)
/// has the feature's entry zeroed, as long as the feature's value stays exactly zero
/// (checked by evaluating the op with the interpreter on zeros: true of `relu(c + b)`,
/// `gelu`, `c * s`, not of `sigmoid`); and where such a value is the left operand of a
/// matmul with a weight `W2` used nowhere else, the feature's rows of `W2` are zeroed and
/// marked skipped. The result is an ordinary graph: the reference interpreter on these
/// params is the oracle of the masked kernels. A weight whose columns reach a graph output
/// without a matmul contracting them is not pruned (those columns are results, e.g.
/// logits or class probabilities). Only
/// `matmul` weights used by one node are pruned (an einsum's or a shared weight's mask is reported, not applied); a weight with
/// nothing dropped gets no mask, so `keep 1.0` leaves the graph untouched.
pub fn apply(
    g: &Graph,
    info: &Info,
    params: &HashMap<String, Tensor>,
    masks: &[WeightMask],
    block: usize,
) -> Result<Pruned> {
    let mut uses: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for (pos, inp) in n.inputs.iter().enumerate() {
            uses.entry(inp.as_str()).or_default().push((i, pos));
        }
    }
    let single_use = |name: &str| params.contains_key(name) && uses.get(name).is_some_and(|u| u.len() == 1);
    let index: HashMap<&str, usize> = g.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut out = Pruned { params: params.clone(), ..Pruned::default() };
    let matrix = |name: &str| -> Option<(usize, usize)> {
        let s = &info.types[name].shape;
        (s.len() >= 2 && info.types[name].dtype == meshc_ir::DType::F32).then(|| (s[s.len() - 2], s[s.len() - 1]))
    };
    for m in masks {
        if m.keep.iter().all(|&k| k) {
            continue;
        }
        let node = &g.nodes[index[m.node.as_str()]];
        let Some((k, n)) = matrix(&m.weight).filter(|_| node.op == Op::MatMul && single_use(&m.weight)) else {
            out.log.push(format!("{} in {}: not pruned (only a matmul weight used once is)", m.weight, m.node));
            continue;
        };
        if feeds_output(g, &uses, &m.node, n, info) {
            out.log.push(format!("{} in {}: not pruned (its columns are graph outputs)", m.weight, m.node));
            continue;
        }
        let col_keep: Vec<bool> = (0..n).map(|c| m.keep[c / block]).collect();
        let dropped: Vec<usize> = (0..n).filter(|&c| !col_keep[c]).collect();
        let mask = out.masks.entry(m.weight.clone()).or_insert_with(|| ParamMask {
            col_keep: vec![true; n],
            row_keep: vec![true; k],
            block,
        });
        mask.col_keep = col_keep;
        zero_last_axis(out.params.get_mut(&m.weight).expect("a param"), &dropped, 1);
        out.log.push(format!("{} in {}: {} of {n} columns pruned", m.weight, m.node, dropped.len()));
        // Follow the dropped features forward while they stay exactly zero.
        let mut chain = vec![m.node.clone()];
        let mut seen = vec![m.node.clone()];
        while let Some(v) = chain.pop() {
            for &(u, pos) in uses.get(v.as_str()).map_or(&[][..], Vec::as_slice) {
                let user = &g.nodes[u];
                if user.op == Op::MatMul && pos == 0 {
                    let w2 = &user.inputs[1];
                    if matrix(w2).is_some_and(|(k2, _)| k2 == n) && single_use(w2) {
                        let (k2, n2) = matrix(w2).expect("a matrix");
                        let mask = out.masks.entry(w2.clone()).or_insert_with(|| ParamMask {
                            col_keep: vec![true; n2],
                            row_keep: vec![true; k2],
                            block,
                        });
                        dropped.iter().for_each(|&r| mask.row_keep[r] = false);
                        zero_last_axis(out.params.get_mut(w2).expect("a param"), &dropped, n2);
                        out.log.push(format!(
                            "{w2} in {}: {} of {k2} rows pruned (zero features of {v})",
                            user.name,
                            dropped.len()
                        ));
                    }
                } else if !seen.contains(&user.name)
                    && zero_preserving(user, info, &seen, &dropped, n, &mut out, &single_use)?
                {
                    seen.push(user.name.clone());
                    chain.push(user.name.clone());
                }
            }
        }
    }
    Ok(out)
}

/// Whether `node`'s columns reach a graph output without being contracted away: through
/// any ops that keep a last axis of `n` (a bias, a softmax over classes, ...) other than
/// a matmul that contracts them. They are then results (a classifier's logits or
/// probabilities), not features to remove.
fn feeds_output(g: &Graph, uses: &HashMap<&str, Vec<(usize, usize)>>, node: &str, n: usize, info: &Info) -> bool {
    let rank = |name: &str| info.types.get(name).map_or(0, |t| t.shape.len());
    let mut stack = vec![node.to_string()];
    let mut seen = vec![node.to_string()];
    while let Some(v) = stack.pop() {
        if g.outputs.iter().any(|o| o.name == v) {
            return true;
        }
        for &(u, pos) in uses.get(v.as_str()).map_or(&[][..], Vec::as_slice) {
            let user = &g.nodes[u];
            let contracts = matmul_like(user, rank).is_some_and(|(l, _)| l == pos);
            if !contracts && info.types[&user.name].shape.last() == Some(&n) && !seen.contains(&user.name) {
                seen.push(user.name.clone());
                stack.push(user.name.clone());
            }
        }
    }
    false
}

/// Zeroes, in every matrix of `t`, the entries at positions `at` of the axis whose elements
/// are `stride` apart (`stride` 1: columns of the last axis; `n`: rows of `[.., K, n]`).
fn zero_last_axis(t: &mut Tensor, at: &[usize], stride: usize) {
    let Data::F32(v) = &mut t.data else { return };
    let cols = *t.shape.last().unwrap_or(&1);
    let axis = if stride == 1 { cols } else { t.shape[t.shape.len() - 2] };
    let span = axis * stride;
    for chunk in v.chunks_mut(span.max(1)) {
        for &i in at {
            chunk[i * stride..(i + 1) * stride].fill(0.0);
        }
    }
}

/// Whether elementwise `user` keeps the `dropped` features exactly zero when its operands
/// in `chain` are zero there; if so, the per-feature params it reads get those entries
/// zeroed in `out`.
fn zero_preserving(
    user: &Node,
    info: &Info,
    chain: &[String],
    dropped: &[usize],
    n: usize,
    out: &mut Pruned,
    single_use: &dyn Fn(&str) -> bool,
) -> Result<bool> {
    let ty = &info.types[&user.name];
    if !user.op.is_elementwise() || user.op.is_communication() || ty.shape.last() != Some(&n) {
        return Ok(false);
    }
    let mut args = Vec::new();
    let mut features = Vec::new();
    for a in &user.inputs {
        let t = &info.types[a];
        if chain.contains(a) {
            if t.shape.last() != Some(&n) {
                return Ok(false);
            }
            args.push(Tensor::zeros(t));
        } else if let Some(p) = out.params.get(a) {
            let mut p = p.clone();
            if t.shape.last() == Some(&n) {
                if !single_use(a) {
                    return Ok(false);
                }
                zero_last_axis(&mut p, dropped, 1);
                features.push((a.clone(), p.clone()));
            }
            args.push(p);
        } else {
            return Ok(false);
        }
    }
    let refs: Vec<&Tensor> = args.iter().collect();
    let r = meshc_ir::interp::eval_node(user, &refs, ty).map_err(|e| anyhow!("pilot: {e}"))?;
    let mut is_dropped = vec![false; n];
    dropped.iter().for_each(|&d| is_dropped[d] = true);
    if !r.data.to_f64().iter().enumerate().all(|(i, &x)| x == 0.0 || !is_dropped[i % n]) {
        return Ok(false);
    }
    for (name, p) in features {
        out.log.push(format!("{name} in {}: {} of {n} entries pruned", user.name, dropped.len()));
        out.params.insert(name, p);
    }
    Ok(true)
}

/// Rounds `x` to `bits` mantissa bits, to nearest with ties to even.
pub fn round_mantissa(x: f32, bits: u32) -> f32 {
    let drop = 23 - bits.min(23);
    if drop == 0 || !x.is_finite() {
        return x;
    }
    let b = x.to_bits();
    let lsb = (b >> drop) & 1;
    // Adding half an ulp (minus one unless the kept part is odd) then truncating rounds to
    // nearest even; a carry into the exponent is the correct rounding up.
    let rounded = (b + (1 << (drop - 1)) - 1 + lsb) & !((1u32 << drop) - 1);
    f32::from_bits(rounded)
}

/// Sign and power of two of `x`: the mantissa bits cleared.
pub fn exponent_only(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits(x.to_bits() & 0xff80_0000)
}

/// The simplified params: every f32 param rounded as `s` says (unchanged for downsampling).
pub fn simplify_params(params: &HashMap<String, Tensor>, s: &Simplify) -> HashMap<String, Tensor> {
    let f: fn(f32, u32) -> f32 = match s {
        Simplify::Bits(_) => round_mantissa,
        Simplify::Exponent => |x, _| exponent_only(x),
        Simplify::Downsample { .. } => return params.clone(),
    };
    let bits = if let Simplify::Bits(n) = s { *n } else { 0 };
    (params.iter())
        .map(|(name, t)| {
            let t = match &t.data {
                Data::F32(v) => Tensor::f32(t.shape.clone(), v.iter().map(|&x| f(x, bits)).collect()),
                _ => t.clone(),
            };
            (name.clone(), t)
        })
        .collect()
}

/// `t` averaged over groups of `factor` along `axis` (rank kept).
fn downsample(t: &Tensor, axis: usize, factor: usize) -> Result<Tensor> {
    let n = t.shape[axis];
    if !n.is_multiple_of(factor) {
        bail!("axis {axis} has size {n}, not a multiple of {factor}");
    }
    let v = t.data.to_f64();
    let inner: usize = t.shape[axis + 1..].iter().product();
    let outer: usize = t.shape[..axis].iter().product();
    let m = n / factor;
    let mut out = vec![0.0; outer * m * inner];
    for o in 0..outer {
        for i in 0..n {
            for k in 0..inner {
                out[(o * m + i / factor) * inner + k] += v[(o * n + i) * inner + k] / factor as f64;
            }
        }
    }
    let mut shape = t.shape.clone();
    shape[axis] = m;
    Ok(Tensor::new(shape, Data::from_f64(t.dtype(), out)))
}

/// The matmul-like nodes: `(left operand, right operand)` positions when `n` computes
/// `left[.., K] · right[.., K, N]` with its last axis the N columns.
fn matmul_like(n: &Node, ranks: impl Fn(&str) -> usize) -> Option<(usize, usize)> {
    match n.op {
        Op::MatMul if n.inputs.len() == 2 && ranks(&n.inputs[1]) >= 2 && ranks(&n.inputs[0]) >= 1 => Some((0, 1)),
        Op::Einsum if n.inputs.len() == 2 => {
            let eq: String = attrs::Einsum::of(n).equation.chars().filter(|c| !c.is_whitespace()).collect();
            let (lhs, out) = eq.split_once("->")?;
            let (a, b) = lhs.split_once(',')?;
            let (b, o): (Vec<char>, Vec<char>) = (b.chars().collect(), out.chars().collect());
            let ok = b.len() == 2
                && a.ends_with(b[0])
                && o.last() == Some(&b[1])
                && !out.contains(b[0])
                && !a.contains(b[1])
                && b[0] != b[1];
            ok.then_some((0, 1))
        }
        _ => None,
    }
}

/// Mean |value| per index of the last axis (a scalar is one column).
fn column_means(t: &[f64], cols: usize) -> Vec<f64> {
    let mut m = vec![0.0; cols];
    for (i, x) in t.iter().enumerate() {
        m[i % cols] += x.abs();
    }
    let rows = (t.len() / cols).max(1) as f64;
    m.iter().map(|s| s / rows).collect()
}

fn ratio(num: f64, den: f64) -> f64 {
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// Runs the pilot pass on the verified graph `g` with its params' values.
pub fn run(g: &Graph, info: &Info, params: &HashMap<String, Tensor>, cfg: &Config) -> Result<Vec<WeightMask>> {
    if cfg.block == 0 {
        bail!("pilot: the block size must be at least 1");
    }
    let simple_params = simplify_params(params, &cfg.simplify);
    let (graph, pinfo) = match cfg.simplify {
        Simplify::Downsample { axis, factor } => {
            // An axis no input has would leave every input as it is: the pilot run would
            // not be the simplified one the user asked for.
            if !g.inputs.iter().any(|i| i.ty.shape.len() > axis) {
                let ranks: Vec<String> =
                    g.inputs.iter().map(|i| format!("'{}' rank {}", i.name, i.ty.shape.len())).collect();
                bail!("pilot: downsample:{axis}:{factor}: no input has an axis {axis} ({})", ranks.join(", "));
            }
            let mut g2 = g.clone();
            // A size that is not a multiple of F is refused when the input is downsampled.
            for i in g2.inputs.iter_mut().filter(|i| i.ty.shape.len() > axis) {
                i.ty.shape[axis] /= factor;
            }
            let info2 = meshc_ir::verify::verify(&g2).map_err(|e| {
                anyhow!("pilot: downsample:{axis}:{factor}: the graph does not accept the smaller inputs: {e}")
            })?;
            (g2, info2)
        }
        _ => (g.clone(), info.clone()),
    };
    let rank = |name: &str| pinfo.types.get(name).map_or(0, |t| t.shape.len());
    let prunable: Vec<(usize, String)> = (pinfo.order.iter())
        .filter_map(|&i| {
            let n = &graph.nodes[i];
            let (_, r) = matmul_like(n, rank)?;
            simple_params.contains_key(&n.inputs[r]).then(|| (i, n.inputs[r].clone()))
        })
        .collect();
    let mut priorities: HashMap<usize, Vec<f64>> = HashMap::new();
    for (r, inputs) in cfg.runs.iter().enumerate() {
        let mut values = simple_params.clone();
        for i in &graph.inputs {
            let t = inputs.get(&i.name).ok_or_else(|| anyhow!("pilot run {r}: no value for input '{}'", i.name))?;
            let t = match cfg.simplify {
                Simplify::Downsample { axis, factor } if t.shape.len() > axis => {
                    downsample(t, axis, factor).with_context(|| format!("pilot: downsample input '{}'", i.name))?
                }
                _ => t.clone(),
            };
            values.insert(i.name.clone(), t);
        }
        for &i in &pinfo.order {
            let n = &graph.nodes[i];
            let args: Vec<&Tensor> = n.inputs.iter().map(|a| &values[a]).collect();
            let out =
                meshc_ir::interp::eval_node(n, &args, &pinfo.types[&n.name]).map_err(|e| anyhow!("pilot: {e}"))?;
            values.insert(n.name.clone(), out);
        }
        let sens = sensitivities(&graph, &pinfo, &values);
        for (i, _) in &prunable {
            let n = &graph.nodes[*i];
            let c = &values[&n.name];
            let cols = *c.shape.last().expect("a matmul result has rank >= 1");
            let mag = column_means(&c.data.to_f64(), cols);
            let rows = (c.numel() / cols) as f64;
            let p = priorities.entry(*i).or_insert_with(|| vec![0.0; cols.div_ceil(cfg.block)]);
            for (col, (m, s)) in mag.iter().zip(&sens[&n.name]).enumerate() {
                p[col / cfg.block] += m * rows * s;
            }
        }
    }
    Ok(prunable
        .into_iter()
        .map(|(i, weight)| {
            let n = &g.nodes[i];
            let pr = priorities.remove(&i).unwrap_or_default();
            let keep = select(&pr, cfg.select);
            // FLOPs on the original graph: 2·(rows of the result)·K per column.
            let w = &info.types[&weight].shape;
            let (k, columns) = (w[w.len() - 2], w[w.len() - 1]);
            let rows = info.types[&n.name].shape.iter().product::<usize>() / columns.max(1);
            let per_col = 2 * (rows * k) as u64;
            let dropped: usize = (keep.iter().enumerate())
                .filter(|(_, k)| !**k)
                .map(|(b, _)| (columns - b * cfg.block).min(cfg.block))
                .sum();
            WeightMask {
                weight,
                node: n.name.clone(),
                columns,
                priorities: pr,
                keep,
                flops: per_col * columns as u64,
                flops_skipped: per_col * dropped as u64,
            }
        })
        .collect())
}

/// The sensitivity of every f32 value per index of its last axis (see the module doc).
fn sensitivities(g: &Graph, info: &Info, values: &HashMap<String, Tensor>) -> HashMap<String, Vec<f64>> {
    let cols = |name: &str| values[name].shape.last().copied().unwrap_or(1).max(1);
    let is_f32 = |name: &str| values[name].dtype() == meshc_ir::DType::F32;
    let mut s: HashMap<String, Vec<f64>> = HashMap::new();
    for o in &g.outputs {
        if is_f32(&o.name) {
            s.insert(o.name.clone(), vec![1.0; cols(&o.name)]);
        }
    }
    let rank = |name: &str| values[name].shape.len();
    for &i in info.order.iter().rev() {
        let c = &g.nodes[i];
        let Some(sc) = s.get(&c.name).cloned() else { continue };
        let cv = values[&c.name].data.to_f64();
        let mm = matmul_like(c, rank);
        for (pos, v) in c.inputs.iter().enumerate() {
            if !is_f32(v) {
                continue;
            }
            let vv = values[v].data.to_f64();
            let nv = cols(v);
            let add: Vec<f64> = match mm {
                Some((l, r)) if pos == l => {
                    // s_v[k] = Σ_n |W[b,k,n]| s_c[n], batch dims of W summed.
                    let w = values[&c.inputs[r]].data.to_f64();
                    let n = sc.len();
                    let mut a = vec![0.0; nv];
                    for (j, x) in w.iter().enumerate() {
                        a[(j / n) % nv] += x.abs() * sc[j % n];
                    }
                    a
                }
                _ if c.op.is_elementwise() && nv == sc.len() && rank(v) >= 1 => {
                    let (mc, mv) = (column_means(&cv, sc.len()), column_means(&vv, nv));
                    (0..nv).map(|j| sc[j] * ratio(mc[j], mv[j])).collect()
                }
                _ => {
                    let mean = |x: &[f64]| x.iter().map(|y| y.abs()).sum::<f64>() / x.len().max(1) as f64;
                    vec![mean(&sc) * ratio(mean(&cv), mean(&vv)); nv]
                }
            };
            let e = s.entry(v.clone()).or_insert_with(|| vec![0.0; nv]);
            e.iter_mut().zip(add).for_each(|(x, a)| *x += a);
        }
    }
    s
}

/// The kept blocks for `priorities` under `sel`.
pub fn select(priorities: &[f64], sel: Select) -> Vec<bool> {
    match sel {
        Select::Keep(f) => {
            let n = ((f * priorities.len() as f64).ceil() as usize).min(priorities.len());
            let mut order: Vec<usize> = (0..priorities.len()).collect();
            order.sort_by(|&a, &b| priorities[b].total_cmp(&priorities[a]).then(a.cmp(&b)));
            let mut keep = vec![false; priorities.len()];
            order[..n].iter().for_each(|&b| keep[b] = true);
            keep
        }
        Select::Threshold(t) => {
            let max = priorities.iter().copied().fold(0.0, f64::max);
            priorities.iter().map(|&p| p > t * max).collect()
        }
    }
}

/// The text of `--dump-after pilot`.
pub fn dump(cfg: &Config, masks: &[WeightMask]) -> String {
    let mut s = String::new();
    let sel = match cfg.select {
        Select::Keep(f) => format!("keep {f}"),
        Select::Threshold(t) => format!("threshold {t}"),
    };
    let _ = writeln!(
        s,
        "# pilot: masks computed and applied: the artifact computes the pruned graph, skipping the pruned blocks"
    );
    let _ = writeln!(
        s,
        "# simplify {}, {} pilot run(s), blocks of {} output columns, {sel}",
        cfg.simplify.name(),
        cfg.runs.len(),
        cfg.block
    );
    let (mut total, mut skipped) = (0u64, 0u64);
    for m in masks {
        let _ = writeln!(s, "weight {} in {}: {} columns, {} blocks", m.weight, m.node, m.columns, m.priorities.len());
        let mut order: Vec<usize> = (0..m.priorities.len()).collect();
        order.sort_by(|&a, &b| m.priorities[b].total_cmp(&m.priorities[a]).then(a.cmp(&b)));
        let sorted: Vec<String> = order.iter().map(|&b| format!("{b}:{:.4e}", m.priorities[b])).collect();
        let _ = writeln!(s, "  priorities (block:priority, highest first) {}", sorted.join(" "));
        let kept: Vec<String> = (0..m.keep.len()).filter(|&b| m.keep[b]).map(|b| b.to_string()).collect();
        let _ = writeln!(s, "  kept {} of {}: [{}]", kept.len(), m.keep.len(), kept.join(", "));
        let _ = writeln!(s, "  flops skipped {} of {}", m.flops_skipped, m.flops);
        total += m.flops;
        skipped += m.flops_skipped;
    }
    let pct = if total == 0 { 0.0 } else { 100.0 * skipped as f64 / total as f64 };
    let _ = writeln!(s, "total flops skipped {skipped} of {total} prunable ({pct:.1}%)");
    s
}

/// The pruning `apply` did, for `--dump-after pilot`.
pub fn dump_pruned(p: &Pruned) -> String {
    let mut s = String::from("pruned:\n");
    for l in &p.log {
        let _ = writeln!(s, "  {l}");
    }
    if p.log.is_empty() {
        s.push_str("  nothing (every block kept)\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_23_is_identity_and_rounding_is_to_nearest_even() {
        for x in [0.0f32, -0.0, 1.0, -3.7, 1e-40, 123456.78, f32::MAX, f32::MIN_POSITIVE] {
            assert_eq!(round_mantissa(x, 23).to_bits(), x.to_bits());
        }
        assert_eq!(round_mantissa(1.25, 1), 1.0); // tie: 1.01b -> 1.0b (even)
        assert_eq!(round_mantissa(1.75, 1), 2.0); // tie: 1.11b -> 10.0b (even, carries)
        assert_eq!(round_mantissa(1.3, 1), 1.5);
        assert_eq!(round_mantissa(-1.3, 0), -1.0);
    }

    #[test]
    fn exponent_only_is_exact_on_powers_of_two() {
        for e in -126..=127 {
            let x = 2f32.powi(e);
            assert_eq!(exponent_only(x), x);
            assert_eq!(exponent_only(-x), -x);
        }
        assert_eq!(exponent_only(3.9), 2.0);
        assert_eq!(exponent_only(-0.7), -0.5);
        assert_eq!(exponent_only(0.0), 0.0);
    }

    #[test]
    fn keep_and_threshold() {
        let p = [3.0, 0.0, 5.0, 0.0, 1.0];
        assert_eq!(select(&p, Select::Keep(1.0)), vec![true; 5]);
        assert_eq!(select(&p, Select::Keep(0.4)), vec![true, false, true, false, false]);
        // Ties among zeros: the lower block is kept first.
        assert_eq!(select(&p, Select::Keep(0.8)), vec![true, true, true, false, true]);
        assert_eq!(select(&p, Select::Threshold(0.0)), vec![true, false, true, false, true]);
    }

    #[test]
    fn parse_simplify() {
        assert_eq!(Simplify::parse("bits:7").unwrap(), Simplify::Bits(7));
        assert_eq!(Simplify::parse("exponent").unwrap(), Simplify::Exponent);
        assert_eq!(Simplify::parse("downsample:0:2").unwrap(), Simplify::Downsample { axis: 0, factor: 2 });
        for bad in ["bits:24", "bits", "downsample:0:0", "exp", "downsample:x:2"] {
            assert!(Simplify::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn downsample_averages_groups() {
        let t = Tensor::f32(vec![4, 2], vec![1., 2., 3., 4., 5., 6., 7., 8.]);
        assert_eq!(downsample(&t, 0, 2).unwrap(), Tensor::f32(vec![2, 2], vec![2., 3., 6., 7.]));
        assert!(downsample(&t, 1, 3).is_err());
    }
}
