//! Expansion, per device, before folding: the window ops and pad become ops with kernels
//! (docs/ops.md, "How compile runs them"):
//! - `pad`: per padded dim, one `gather` with constant indices (reflect, edge, wrap and
//!   negative pads are all just index maps); the constant mode first appends one slice of
//!   the fill value, which the indices of padding point at.
//! - `conv`: a depthwise conv (groups = input channels, f32, 1-D or 2-D) stays as it is,
//!   for its own kernel (`codegen::conv`); any other is im2col + GEMM. The input, viewed as `[N, G, C/G, positions]` (with one
//!   element of padding appended when a tap lands on a pad), is gathered with a constant
//!   `[taps, outputs]` index table into `[N, G, C/G·taps, outputs]`
//!   and multiplied by the weight viewed as `[G, M/G, C/G·taps]` (a folded reshape), so the
//!   work is one batched matmul on the existing GEMM; a 1×1 stride-1 conv needs no gather.
//! - `max_pool` / `avg_pool`: the same gather (pads, and the end a ceil_mode window runs
//!   past, filled with −inf or 0), then `reduce_max`, or `reduce_sum` divided by a
//!   constant table of per-window counts. Only the taps that land on the input somewhere
//!   are gathered (`Window::pool_taps`): a kernel wider than its input costs no more.
//! - `einsum` of three operands or more: the two-operand einsums of its contraction order
//!   (`meshc_ir::einsum::path`), `NAME.step0`, `NAME.step1`, ...
//!
//! Every table built here is checked against the memory budget (`meshc_ir::budget`).
//!
//! - `add(mul(conv(x, w, b), scale), shift)` with per-channel constants (an inference
//!   BatchNormalization) becomes one conv whose weight is `w·scale` and bias `b·scale +
//!   shift`, when `w` (and `b`) are constants: fold computes them (`--dump-after fold`
//!   lists them), and the conv's result is read by nothing else.
//!
//! New nodes are named after the node they expand (`NAME.cols`, `NAME.gemm`, ...); the
//! last keeps the node's own name, so outputs and later readers are unchanged.

use std::collections::{BTreeMap, HashMap};

use anyhow::{anyhow, Result};
use meshc_ir::attrs::{self, PadMode};
use meshc_ir::infer::parse_equation;
use meshc_ir::infer::Operand;
use meshc_ir::verify::Info;
use meshc_ir::window::{conv_window, numel, pad_shape, pad_source, Tap, Window};
use meshc_ir::{budget, einsum};
use meshc_ir::{Attr, Attrs, DType, Graph, Node, Op, Param, ParamData, TensorType};

use crate::codegen::conv::is_depthwise;

/// Whether `g` has anything to expand.
pub fn needed(g: &Graph) -> bool {
    g.nodes.iter().any(|n| matches!(n.op, Op::Conv | Op::MaxPool | Op::AvgPool | Op::Pad) || many_operands(n))
}

/// An einsum of three operands or more, which becomes pairwise einsums.
fn many_operands(n: &Node) -> bool {
    n.op == Op::Einsum && n.inputs.len() >= 3
}

/// A batch norm to fold into the conv before it: `add(mul(conv, scale), shift)`.
struct BnFold<'g> {
    conv: &'g Node,
    mul: &'g str,
    scale: &'g str,
    shift: &'g str,
}

/// The convs followed by a per-channel mul and add of constants (inference
/// BatchNormalization as the importer writes it), by the add's name. The conv's weight
/// (and bias) must be constants, and neither the conv nor the mul be read elsewhere.
fn bn_folds<'g>(g: &'g Graph, info: &Info) -> HashMap<&'g str, BnFold<'g>> {
    let by_name: HashMap<&str, &Node> = g.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let params: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    // Params and the local slices, reshapes, transposes and casts of them: what fold computes.
    fn constant(t: &str, by_name: &HashMap<&str, &Node>, params: &[&str]) -> bool {
        params.contains(&t)
            || by_name.get(t).is_some_and(|n| {
                matches!(n.op, Op::Slice | Op::Reshape | Op::Transpose | Op::Cast)
                    && n.inputs.iter().all(|i| constant(i, by_name, params))
            })
    }
    let uses = |t: &str| {
        g.nodes.iter().flat_map(|n| &n.inputs).filter(|i| *i == t).count()
            + g.outputs.iter().filter(|o| o.name == t).count()
    };
    let mut folds = HashMap::new();
    for add in g.nodes.iter().filter(|n| n.op == Op::Add) {
        let pick = |n: &'g Node, op: Op| -> Option<(&'g Node, &'g str)> {
            let [a, b] = &n.inputs[..] else { return None };
            [(a, b), (b, a)].into_iter().find_map(|(x, c)| {
                let x = by_name.get(x.as_str()).filter(|x| x.op == op && uses(&x.name) == 1)?;
                Some((*x, c.as_str()))
            })
        };
        let Some((mul, shift)) = pick(add, Op::Mul) else { continue };
        let Some((conv, scale)) = pick(mul, Op::Conv) else { continue };
        let m = info.types[&conv.name].shape[1];
        let rank = info.types[&conv.name].rank();
        let per_channel = |t: &str| {
            let s = &info.types[t].shape;
            s.len() == rank - 1 && s[0] == m && s[1..].iter().all(|&d| d == 1)
        };
        let consts = conv.inputs[1..]
            .iter()
            .chain([&scale.to_string(), &shift.to_string()])
            .all(|t| constant(t, &by_name, &params));
        if consts && per_channel(scale) && per_channel(shift) {
            folds.insert(add.name.as_str(), BnFold { conv, mul: &mul.name, scale, shift });
        }
    }
    folds
}

/// `g` (verified as `info`) with every conv, pool and pad node expanded, and batch norms
/// folded into the convs before them.
pub fn expand(g: &Graph, info: &Info, symbolic: bool) -> Result<Graph> {
    let mut ex = Expander { g: g.clone(), types: info.types.clone(), symbolic };
    ex.g.nodes.clear();
    let folds = bn_folds(g, info);
    // The conv and the mul of a fold are emitted, as one conv, in the add's place.
    let absorbed: Vec<&str> = folds.values().flat_map(|f| [f.conv.name.as_str(), f.mul]).collect();
    for &k in &info.order {
        let n = &g.nodes[k];
        if absorbed.contains(&n.name.as_str()) {
            continue;
        }
        let done = match n.op {
            Op::Add if folds.contains_key(n.name.as_str()) => ex.fold_bn(n, &folds[n.name.as_str()]),
            Op::Conv => ex.conv(n),
            Op::MaxPool | Op::AvgPool => ex.pool(n),
            Op::Pad => ex.pad(n),
            Op::Einsum if many_operands(n) => ex.einsum(n),
            _ => {
                ex.g.nodes.push(n.clone());
                continue;
            }
        };
        done.map_err(|e| anyhow!("node '{}': {e}", n.name))?;
    }
    Ok(ex.g)
}

type R<T> = std::result::Result<T, String>;

/// Checks a table of `entries` this pass builds against the memory budget: each is an
/// index or count, then an `Attr` of the inline value it is stored as.
fn room(what: std::fmt::Arguments, entries: usize) -> R<()> {
    budget::check(what, entries as u128, std::mem::size_of::<i64>() + std::mem::size_of::<Attr>()).map(drop)
}

struct Expander {
    g: Graph,
    types: HashMap<String, TensorType>,
    /// The graph is compiled over symbolic dims (written at their upper bounds).
    symbolic: bool,
}

fn ints(v: impl IntoIterator<Item = i64>) -> Attr {
    Attr::List(v.into_iter().map(Attr::Int).collect())
}

impl Expander {
    fn shape(&self, t: &str) -> Vec<usize> {
        self.types[t].shape.clone()
    }

    /// Appends node `name` (`op` of `inputs`), typed by shape inference, on the device of `like`.
    fn emit(&mut self, like: &Node, name: String, op: Op, inputs: &[&str], attrs: &[(&str, Attr)]) -> R<String> {
        let mut n = Node::new(name.clone(), op, inputs);
        n.attrs = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<Attrs>();
        n.device = like.device;
        let ops: Vec<Operand> = inputs.iter().map(|i| Operand { ty: &self.types[*i], dims: None }).collect();
        let ty = meshc_ir::infer::infer(&n, &ops)?.ty;
        (n.dtype, n.shape) = (Some(ty.dtype), Some(ty.shape.clone()));
        self.types.insert(name.clone(), ty);
        self.g.nodes.push(n);
        Ok(name)
    }

    /// A constant param of `dtype` and `shape` holding `values` inline.
    fn constant(&mut self, name: String, dtype: DType, shape: Vec<usize>, values: Vec<Attr>) -> String {
        let value = if shape.is_empty() { values.into_iter().next().expect("a scalar") } else { Attr::List(values) };
        let ty = TensorType::new(dtype, shape);
        self.types.insert(name.clone(), ty.clone());
        self.g.params.push(Param { name: name.clone(), ty, dims: None, data: ParamData::Value(value), loc: None });
        name
    }

    /// A `[..]`-shaped i64 table, stored as nested lists of `shape`.
    fn table(&mut self, name: String, shape: &[usize], v: &[i64]) -> String {
        fn nest(v: &[i64], shape: &[usize]) -> Vec<Attr> {
            match shape {
                [] | [_] => v.iter().map(|&x| Attr::Int(x)).collect(),
                [_, rest @ ..] => v.chunks(numel(rest).max(1)).map(|c| Attr::List(nest(c, rest))).collect(),
            }
        }
        self.constant(name, DType::I64, shape.to_vec(), nest(v, shape))
    }

    /// A scalar of `dtype` holding `value`: −inf/+inf/NaN, which inline values cannot
    /// hold, are computed as log(0), −log(0) and log(−1).
    fn fill(&mut self, like: &Node, base: String, dtype: DType, value: f64) -> R<String> {
        if value.is_finite() || dtype != DType::F32 {
            let v = if dtype.is_int() || dtype.is_stored_int() {
                Attr::Int(value as i64)
            } else if dtype == DType::Bool {
                Attr::Bool(value != 0.0)
            } else {
                Attr::Float(value)
            };
            return Ok(self.constant(base, dtype, vec![], vec![v]));
        }
        let arg = if value.is_nan() { -1.0 } else { 0.0 };
        let arg = self.constant(format!("{base}.arg"), dtype, vec![], vec![Attr::Float(arg)]);
        let log = self.emit(like, format!("{base}.log"), Op::Log, &[&arg], &[])?;
        if value == f64::INFINITY {
            return self.emit(like, format!("{base}.neg"), Op::Neg, &[&log], &[]);
        }
        Ok(log)
    }

    /// A block of `value`s shaped as `x` with dim `axis` cut to 1, named by `name`. Over
    /// symbolic dims its other dims must follow `x`'s at every size, which a constant's,
    /// sized at the bounds, cannot: it is then built from `x`, every element replaced by
    /// `value` — from `x`'s first slice along `axis`, or, where `x` has none (empty along
    /// `axis`), from its sum along it, whose shape is the block's.
    fn fill_block(
        &mut self,
        like: &Node,
        name: &dyn Fn(&str) -> String,
        x: &str,
        axis: usize,
        value: f64,
    ) -> R<String> {
        let dtype = self.types[x].dtype;
        let fill = self.fill(like, name("value"), dtype, value)?;
        if self.symbolic {
            let block = match self.shape(x)[axis] {
                0 => self.empty_sum(like, name, x, axis)?,
                _ => {
                    let slice = [("starts", ints([0])), ("ends", ints([1])), ("axes", ints([axis as i64]))];
                    self.emit(like, name("first"), Op::Slice, &[x], &slice)?
                }
            };
            let every = self.fill(like, name("every"), DType::Bool, 1.0)?;
            return self.emit(like, name("fill"), Op::Where, &[&every, &fill, &block], &[]);
        }
        let mut one = self.shape(x);
        one[axis] = 1;
        self.emit(like, name("fill"), Op::BroadcastTo, &[&fill], &[("shape", ints(one.iter().map(|&s| s as i64)))])
    }

    /// The sum of `x` along its empty dim `axis`, kept as a dim of 1, in `x`'s dtype: a
    /// tensor shaped as `x`'s block of padding (its values are never read). A dtype
    /// reduce_sum does not take is summed as f32.
    fn empty_sum(&mut self, like: &Node, name: &dyn Fn(&str) -> String, x: &str, axis: usize) -> R<String> {
        let dtype = self.types[x].dtype;
        let summable = matches!(dtype, DType::F32 | DType::I32 | DType::I64);
        let to = |d: DType| [("to", Attr::Str(d.name().to_string()))];
        let x = match summable {
            true => x.to_string(),
            false => self.emit(like, name("wide"), Op::Cast, &[x], &to(DType::F32))?,
        };
        let attrs = [("axes", ints([axis as i64])), ("keepdims", Attr::Bool(true))];
        let sum = self.emit(like, name("sum"), Op::ReduceSum, &[&x], &attrs)?;
        match summable {
            true => Ok(sum),
            false => self.emit(like, name("narrow"), Op::Cast, &[&sum], &to(dtype)),
        }
    }

    /// `x` padded along each dim by `pads` (begins, then ends) in `mode`; the last node
    /// named `last` (or a fresh name when the result feeds further nodes).
    fn padded(&mut self, like: &Node, x: &str, pads: &[i64], mode: PadMode, value: f64, last: &str) -> R<String> {
        let shape = self.shape(x);
        let r = shape.len();
        let dims: Vec<usize> = (0..r).filter(|&d| pads[d] != 0 || pads[r + d] != 0).collect();
        let mut cur = x.to_string();
        for (j, &d) in dims.iter().enumerate() {
            let n = self.shape(&cur)[d];
            let out = (n as i64 + pads[d] + pads[r + d]) as usize;
            let name = |what: &str| {
                if j + 1 == dims.len() && what == "gather" {
                    last.to_string()
                } else {
                    format!("{}.pad{d}.{what}", like.name)
                }
            };
            let mut src = cur.clone();
            if mode == PadMode::Constant {
                let block = self.fill_block(like, &|w| name(w), &cur, d, value)?;
                src = self.emit(like, name("ext"), Op::Concat, &[&cur, &block], &[("axis", Attr::Int(d as i64))])?;
            }
            room(format_args!("the index table of dim {d} padded to {out}"), out)?;
            let idx: Vec<i64> =
                (0..out).map(|o| pad_source(mode, n, pads[d], o).map_or(n as i64, |i| i as i64)).collect();
            let idx = self.table(name("idx"), &[out], &idx);
            cur = self.emit(like, name("gather"), Op::Gather, &[&src, &idx], &[("axis", Attr::Int(d as i64))])?;
        }
        if cur == x {
            cur = self.emit(
                like,
                last.to_string(),
                Op::Reshape,
                &[x],
                &[("shape", ints(shape.iter().map(|&s| s as i64)))],
            )?;
        }
        Ok(cur)
    }

    fn pad(&mut self, n: &Node) -> R<()> {
        let (pads, _) = pad_shape(n, &self.shape(&n.inputs[0]))?;
        let attrs::Pad { mode, value, .. } = attrs::Pad::of(n);
        self.padded(n, &n.inputs[0], &pads, mode, value, &n.name)?;
        Ok(())
    }

    /// `x` gathered by the taps of `win` into `[N, C, taps, outputs]` (or with the channel
    /// dim cut into `groups`: `[N, G, C/G, taps, outputs]`); a tap on padding, or past the
    /// input where a ceil_mode window runs, reads `value`. The spatial dims are gathered as
    /// one flat dim, to which one element of `value` is appended when a tap needs it: one
    /// concat and one gather, where padding dim by dim first cost three steps per dim.
    /// A conv reads every tap of its kernel; a pool only those `Window::pool_taps` gives.
    /// `None` when the gather is the identity (a 1×1, stride-1, unpadded window).
    fn columns(&mut self, n: &Node, win: &Window, value: f64, groups: Option<usize>) -> R<Option<String>> {
        let x = &n.inputs[0];
        let shape = self.shape(x);
        let sp = &shape[2..];
        let out = win.out_sizes(sp)?;
        if numel(&win.kernel) == 1 && win.strides.iter().all(|&s| s == 1) && out == sp {
            return Ok(None);
        }
        let base = |what: &str| format!("{}.{what}", n.name);
        let (n_k, taps) = match n.op {
            Op::Conv => (numel(&win.kernel), win.taps(sp, &out)?),
            _ => win.pool_taps(sp, &out)?,
        };
        let (n_out, n_in) = (numel(&out), numel(sp));
        // Every tap off the input reads the appended element, at index n_in.
        room(format_args!("the index table of {n_k} taps at {n_out} outputs"), n_k * n_out)?;
        let mut idx = vec![n_in as i64; n_k * n_out];
        for (t, tap) in taps.iter().enumerate() {
            if let Tap::Real(i) = tap {
                idx[(t % n_k) * n_out + t / n_k] = *i as i64;
            }
        }
        let view: Vec<usize> = match groups {
            Some(g) => vec![shape[0], g, shape[1] / g, n_in],
            None => vec![shape[0], shape[1], n_in],
        };
        let axis = view.len() - 1;
        let mut src =
            self.emit(n, base("flat"), Op::Reshape, &[x], &[("shape", ints(view.iter().map(|&s| s as i64)))])?;
        if idx.contains(&(n_in as i64)) {
            let block = self.fill_block(n, &base, &src, axis, value)?;
            src = self.emit(n, base("ext"), Op::Concat, &[&src, &block], &[("axis", Attr::Int(axis as i64))])?;
        }
        let idx = self.table(base("taps"), &[n_k, n_out], &idx);
        Ok(Some(self.emit(n, base("cols"), Op::Gather, &[&src, &idx], &[("axis", Attr::Int(axis as i64))])?))
    }

    /// The conv of `bn` with its weight scaled per output channel and its bias scaled and
    /// shifted, named `add` (the node it replaces): fold computes the new weight and bias.
    fn fold_bn(&mut self, add: &Node, bn: &BnFold) -> R<()> {
        let conv = bn.conv;
        let w = self.shape(&conv.inputs[1]);
        let m = w[0] as i64;
        let base = |what: &str| format!("{}.{what}", conv.name);
        let wshape = std::iter::once(m).chain(w[1..].iter().map(|_| 1));
        let s_w = self.emit(conv, base("bn_scale_w"), Op::Reshape, &[bn.scale], &[("shape", ints(wshape))])?;
        let weight = self.emit(conv, base("bn_weight"), Op::Mul, &[&conv.inputs[1], &s_w], &[])?;
        let s = self.emit(conv, base("bn_scale_b"), Op::Reshape, &[bn.scale], &[("shape", ints([m]))])?;
        let t = self.emit(conv, base("bn_shift_b"), Op::Reshape, &[bn.shift], &[("shape", ints([m]))])?;
        let bias = match conv.inputs.get(2) {
            Some(b) => {
                let scaled = self.emit(conv, base("bn_bias_scaled"), Op::Mul, &[b, &s], &[])?;
                self.emit(conv, base("bn_bias"), Op::Add, &[&scaled, &t], &[])?
            }
            None => t,
        };
        let mut folded = conv.clone();
        folded.name.clone_from(&add.name);
        folded.inputs = vec![conv.inputs[0].clone(), weight, bias];
        self.conv(&folded)
    }

    fn conv(&mut self, n: &Node) -> R<()> {
        if is_depthwise(n, &self.types[&n.inputs[0]], &self.types[&n.inputs[1]]) {
            // Code generation has a kernel of its own for these (`codegen::conv`).
            self.g.nodes.push(n.clone());
            return Ok(());
        }
        let (x, w) = (self.shape(&n.inputs[0]), self.shape(&n.inputs[1]));
        let (win, g) = conv_window(n, &x, &w)?;
        let out = win.out_sizes(&x[2..])?;
        let (cg, mg, n_k, n_out) = (x[1] / g, w[0] / g, numel(&win.kernel), numel(&out));
        let base = |what: &str| format!("{}.{what}", n.name);
        let cols = match self.columns(n, &win, 0.0, Some(g))? {
            Some(c) => c,
            None => n.inputs[0].clone(),
        };
        let view = [x[0], g, cg * n_k, n_out].map(|s| s as i64);
        let cols = self.emit(n, base("im2col"), Op::Reshape, &[&cols], &[("shape", ints(view))])?;
        let wv = self.emit(
            n,
            base("wmat"),
            Op::Reshape,
            &[&n.inputs[1]],
            &[("shape", ints([g, mg, cg * n_k].map(|s| s as i64)))],
        )?;
        let y = self.emit(n, base("gemm"), Op::MatMul, &[&wv, &cols], &[])?;
        let result: Vec<i64> = [x[0], w[0]].iter().chain(&out).map(|&s| s as i64).collect();
        let Some(bias) = n.inputs.get(2) else {
            self.emit(n, n.name.clone(), Op::Reshape, &[&y], &[("shape", ints(result))])?;
            return Ok(());
        };
        let y = self.emit(n, base("unbiased"), Op::Reshape, &[&y], &[("shape", ints(result))])?;
        let bshape = std::iter::once(w[0] as i64).chain(out.iter().map(|_| 1));
        let b = self.emit(n, base("bias"), Op::Reshape, &[bias], &[("shape", ints(bshape))])?;
        self.emit(n, n.name.clone(), Op::Add, &[&y, &b], &[])?;
        Ok(())
    }

    /// An einsum of three operands or more as the two-operand einsums of `einsum::path`,
    /// in its order, the last keeping its name: the interpreter contracts in the same order.
    fn einsum(&mut self, n: &Node) -> R<()> {
        let (terms, out) = parse_equation(&attrs::Einsum::of(n).equation, n.inputs.len())?;
        let mut sizes = BTreeMap::new();
        for (t, i) in terms.iter().zip(&n.inputs) {
            sizes.extend(t.iter().copied().zip(self.types[i].shape.iter().copied()));
        }
        let steps = einsum::path(&terms, &out, &sizes);
        let letters = einsum::operand_letters(&terms, &steps);
        let mut names = n.inputs.clone();
        for (k, s) in steps.iter().enumerate() {
            let name = if k + 1 == steps.len() { n.name.clone() } else { format!("{}.step{k}", n.name) };
            let eq = [("equation", Attr::Str(einsum::equation(s, &letters)))];
            let step = self.emit(n, name, Op::Einsum, &[&names[s.a], &names[s.b]], &eq)?;
            names.push(step);
        }
        Ok(())
    }

    fn pool(&mut self, n: &Node) -> R<()> {
        let x = self.shape(&n.inputs[0]);
        let win = Window::of(n, x.len() - 2, None)?;
        let out = win.out_sizes(&x[2..])?;
        let max = n.op == Op::MaxPool;
        let base = |what: &str| format!("{}.{what}", n.name);
        let cols = match self.columns(n, &win, if max { f64::NEG_INFINITY } else { 0.0 }, None)? {
            Some(c) => c,
            None => {
                let view = [x[0], x[1], 1, numel(&out)].map(|s| s as i64);
                self.emit(n, base("cols"), Op::Reshape, &[&n.inputs[0]], &[("shape", ints(view))])?
            }
        };
        let attrs = [("axes", ints([2])), ("keepdims", Attr::Bool(false))];
        let result: Vec<i64> = x[..2].iter().chain(&out).map(|&s| s as i64).collect();
        let pooled = if max {
            self.emit(n, base("max"), Op::ReduceMax, &[&cols], &attrs)?
        } else {
            let sum = self.emit(n, base("sum"), Op::ReduceSum, &[&cols], &attrs)?;
            let include_pad = attrs::AvgPool::of(n).count_include_pad;
            room(format_args!("the table of {} window counts", numel(&out)), numel(&out))?;
            let counts: Vec<Attr> =
                (0..numel(&out)).map(|o| Attr::Float(win.counted(&x[2..], &out, o, include_pad) as f64)).collect();
            let counts = self.constant(base("counts"), DType::F32, vec![numel(&out)], counts);
            self.emit(n, base("mean"), Op::Div, &[&sum, &counts], &[])?
        };
        self.emit(n, n.name.clone(), Op::Reshape, &[&pooled], &[("shape", ints(result))])?;
        Ok(())
    }
}
