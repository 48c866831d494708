//! Weights in fewer bytes than f32 where the kernels cannot widen them as they pack them
//! (`--weights-dtype`; fold stores bf16/f16 matmul weights, which the GEMMs widen), per
//! device, after expansion and before folding.
//!
//! With `int8`, every f32 `matmul(x, w)` whose weight `w` is a constant becomes a product
//! of 8-bit integers, as onnxruntime's dynamic quantization does but finer grained:
//!
//! - `w` is quantized symmetrically per output column: `ws = max|w[:, n]| / 127` (`[.., 1, N]`)
//!   and `wq = round(w / ws)` in −127..=127. Both are constants, so fold computes them and
//!   the integer GEMM stores `wq` packed as bytes (`meshc_runtime::kernels::igemm`): a
//!   quarter of the f32 bytes.
//! - `x` is quantized per row at run time: `xs = max|x[m, :]| / 127` (`[.., M, 1]`) and
//!   `xq = round(x · 127 / max|x[m, :]|)`, also in −127..=127, so each row spans at most 255
//!   values and the GEMM's u8×i8 inner loop is exact.
//! - `y = f32(xq · wq) · xs · ws`: the i32 product is exact; what is lost is the two
//!   roundings to 8 bits (at most half a step, 1/254 of the row's or column's largest
//!   magnitude, per element), and the sum's rounding to f32 beyond 2^24.
//!
//! Only a weight on the right of a product is quantized: the GEMM of an expanded conv has
//! its weight on the left (`passes::expand`), so convs stay f32. An infinite value makes
//! its row's (or column's) scale infinite and the row's results NaN, where f32 gives
//! ±inf or NaN only where the inf reaches.
//!
//! Running per device after lowering, a weight split by rows is quantized per device
//! with the device's partial `x`, and the f32 partial results are summed as before: no
//! collective changes. A weight (and an activation) read by several matmuls is quantized
//! once (`NAME.int8`, `NAME.scale`); a weight that something else also reads stays in f32
//! for it. A zero row or column is quantized against a floor of `FLOOR` instead of 0, so
//! it gives zeros, not NaN. Weights under a pruning mask keep their masked f32 kernel.
//!
//! Embedding tables, the constant f32 matrices `gather` reads rows of (axis 0), are stored
//! in the same type and widened as their rows are gathered: with `int8` each row is
//! quantized against its own largest magnitude and stored as i8 (`gather` of the rows and
//! of their scales, then `cast · scale`); with `bf16`/`f16` the table is cast to the half
//! type and the gathered rows back to f32. A half table already cast to f32 (a bf16
//! checkpoint) is gathered before the cast with `keep`, `bf16` and `f16` (with `int8` it is
//! quantized, with `f32` widened), and the cast, read by nothing else, is dropped.

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use meshc_ir::params::Params;
use meshc_ir::verify::Info;
use meshc_ir::{Attr, DType, Graph, Node, Op, Param, ParamData, TensorType};

use super::fold::{self, WeightsDtype};
use super::pilot::ParamMask;

/// The largest magnitude of a quantized value: symmetric, so −128 is never used.
const QMAX: f64 = 127.0;

/// The least row or column maximum a scale is computed from: below it (an all-zero row)
/// every value quantizes to 0 instead of 0/0.
const FLOOR: f64 = 1e-30;

/// A weight quantized, and the constants it became.
pub struct Weight {
    pub name: String,
    /// Values in −127..=127, its shape: i32 for a matmul (packed as bytes), i8 for a table.
    pub int8: String,
    /// f32, one per column (`[.., 1, N]`) of a matmul weight, per row (`[V, 1]`) of a table.
    pub scale: String,
    side: Side,
}

/// What the pass does to one node.
enum Rewrite<'g> {
    /// An f32 matmul of a constant weight, made an integer product.
    Matmul,
    /// A gather of rows of a constant f32 table, stored as int8 rows with their scales.
    Int8Table,
    /// A gather of rows of a table stored in this half type (`.0` the table, a half
    /// constant, when it is there already).
    HalfTable(DType, Option<&'g str>),
}

/// The graph `g` (verified as `info`) with its weights stored as `weights` asks, and the
/// matmul weights quantized to int8, in program order; None when nothing changes. `masks`
/// are the pruned params.
pub fn quantize(
    g: &Graph,
    info: &Info,
    masks: &HashMap<String, ParamMask>,
    weights: WeightsDtype,
) -> Option<(Graph, Vec<Weight>)> {
    let constants = fold::constants(g, info);
    let producer: HashMap<&str, &Node> = g.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let masked = |w: &str| !masks.is_empty() && ancestors(&producer, w).iter().any(|p| masks.contains_key(*p));
    let int8 = weights == WeightsDtype::Int8;
    let matmul = |n: &Node| {
        let f32_matrix = |t: &str| info.types[t].dtype == DType::F32 && info.types[t].rank() >= 2;
        n.op == Op::MatMul
            && n.inputs.len() == 2
            && f32_matrix(&n.inputs[0])
            && f32_matrix(&n.inputs[1])
            && !constants.contains(n.inputs[0].as_str())
            && constants.contains(n.inputs[1].as_str())
            && info.types[&n.inputs[1]].shape.iter().rev().nth(1).is_some_and(|&k| k > 0)
            && !masked(&n.inputs[1])
    };
    let rewrite = |n: &'_ Node| -> Option<Rewrite<'_>> {
        if n.op == Op::MatMul {
            return (int8 && matmul(n)).then_some(Rewrite::Matmul);
        }
        let table = n.inputs.first()?;
        let ty = &info.types[table];
        // A row of no elements has no largest magnitude to scale by.
        let rows = ty.rank() == 2 && ty.shape[1] > 0;
        if n.op != Op::Gather || !rows || !constants.contains(table.as_str()) || masked(table) {
            return None;
        }
        let axis = meshc_ir::attrs::Gather::of(n).axis;
        if axis != 0 && axis != -2 {
            return None;
        }
        // A half table behind a cast to f32.
        let half = producer.get(table.as_str()).filter(|c| c.op == Op::Cast).map(|c| c.inputs[0].as_str());
        let half = half.filter(|h| info.types[*h].dtype.is_half() && weights != WeightsDtype::F32);
        match (weights, half) {
            (_, Some(h)) if !int8 => Some(Rewrite::HalfTable(info.types[h].dtype, Some(h))),
            _ if ty.dtype != DType::F32 => None,
            (WeightsDtype::Int8, _) => Some(Rewrite::Int8Table),
            (WeightsDtype::BF16, _) => Some(Rewrite::HalfTable(DType::BF16, None)),
            (WeightsDtype::F16, _) => Some(Rewrite::HalfTable(DType::F16, None)),
            (WeightsDtype::Keep | WeightsDtype::F32, _) => None,
        }
    };
    let rewrites: Vec<Option<Rewrite>> = g.nodes.iter().map(rewrite).collect();
    if rewrites.iter().all(Option::is_none) {
        return None;
    }
    let mut q = Quantizer {
        out: g.clone(),
        names: super::names(g),
        done: HashMap::new(),
        scalars: None,
        halves: HashMap::new(),
        weights: Vec::new(),
    };
    q.out.nodes.clear();
    let to = |dtype: DType| [("to", Attr::Str(dtype.name().into()))];
    for (n, r) in g.nodes.iter().zip(&rewrites) {
        match *r {
            Some(Rewrite::Matmul) => {
                let (xq, xs) = q.quantized(n, &n.inputs[0], Side::Activation);
                let (wq, ws) = q.quantized(n, &n.inputs[1], Side::Columns);
                let acc = q.emit(n, (&n.name, "i32"), Op::MatMul, &[&xq, &wq], &[]);
                let wide = q.emit(n, (&n.name, "f32"), Op::Cast, &[&acc], &to(DType::F32));
                let rows = q.emit(n, (&n.name, "rows"), Op::Mul, &[&wide, &xs], &[]);
                q.push(n, n.name.clone(), Op::Mul, &[&rows, &ws], &[]);
            }
            Some(Rewrite::Int8Table) => {
                let (table, ids) = (&n.inputs[0], &n.inputs[1]);
                let (tq, ts) = q.quantized(n, table, Side::Rows);
                let rows = q.emit(n, (&n.name, "int8"), Op::Gather, &[&tq, ids], &[]);
                let scales = q.emit(n, (&n.name, "scale"), Op::Gather, &[&ts, ids], &[]);
                let wide = q.emit(n, (&n.name, "f32"), Op::Cast, &[&rows], &to(DType::F32));
                q.push(n, n.name.clone(), Op::Mul, &[&wide, &scales], &[]);
            }
            Some(Rewrite::HalfTable(dtype, half)) => {
                let table = match (half, q.halves.get(&(n.inputs[0].clone(), dtype))) {
                    (Some(h), _) => h.to_string(),
                    (None, Some(done)) => done.clone(),
                    (None, None) => {
                        let cast = q.emit(n, (&n.inputs[0], dtype.name()), Op::Cast, &[&n.inputs[0]], &to(dtype));
                        q.halves.insert((n.inputs[0].clone(), dtype), cast.clone());
                        cast
                    }
                };
                let rows = q.emit(n, (&n.name, dtype.name()), Op::Gather, &[&table, &n.inputs[1]], &[]);
                q.push(n, n.name.clone(), Op::Cast, &[&rows], &to(DType::F32));
            }
            None => q.out.nodes.push(n.clone()),
        }
    }
    // A half table's cast to f32 that only its gathers read is read by nothing now: fold
    // would still widen the whole table to compute it.
    let read: HashSet<&str> = q.out.nodes.iter().flat_map(|n| n.inputs.iter().map(String::as_str)).collect();
    let outputs: HashSet<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let orphaned: HashSet<String> = (g.nodes.iter().zip(&rewrites))
        .filter_map(|(n, r)| match r {
            Some(Rewrite::HalfTable(_, Some(_))) => Some(n.inputs[0].clone()),
            _ => None,
        })
        .filter(|cast| !read.contains(cast.as_str()) && !outputs.contains(cast.as_str()))
        .collect();
    q.out.nodes.retain(|n| !orphaned.contains(&n.name));
    Some((q.out, q.weights))
}

/// The names of the params `name` is computed from (itself, if it is one), `producer`
/// giving each node by name.
fn ancestors<'g>(producer: &HashMap<&str, &'g Node>, name: &'g str) -> Vec<&'g str> {
    let (mut stack, mut seen, mut params) = (vec![name], HashSet::new(), Vec::new());
    while let Some(t) = stack.pop() {
        if !seen.insert(t) {
            continue;
        }
        match producer.get(t) {
            Some(n) => stack.extend(n.inputs.iter().map(String::as_str)),
            None => params.push(t),
        }
    }
    params
}

/// The scalar params every quantization divides by.
struct Scalars {
    qmax: String,
    floor: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Side {
    /// Quantized per row (its last axis reduced) as the program runs, to i32.
    Activation,
    /// A matmul weight: quantized per column (the axis before the last reduced), folded,
    /// to i32 (the integer GEMM packs it as bytes).
    Columns,
    /// An embedding table: quantized per row, folded, to i8.
    Rows,
}

impl Side {
    fn axis(self) -> i64 {
        if self == Side::Columns {
            -2
        } else {
            -1
        }
    }
}

struct Quantizer {
    out: Graph,
    names: HashSet<String>,
    /// The quantized value and scale of each operand already quantized, by operand.
    done: HashMap<(String, Side), (String, String)>,
    /// Made with the first quantization.
    scalars: Option<Scalars>,
    /// The half copy of each f32 table already cast, by table and type.
    halves: HashMap<(String, DType), String>,
    /// The weights quantized, in the order they first were.
    weights: Vec<Weight>,
}

impl Quantizer {
    /// A name no tensor has yet, after `base` (`passes::fresh`).
    fn fresh(&mut self, (base, what): (&str, &str)) -> String {
        let name = super::fresh(&self.names, base, what);
        self.names.insert(name.clone());
        name
    }

    fn scalar(&mut self, base: (&str, &str), v: f64) -> String {
        let name = self.fresh(base);
        let ty = TensorType::new(DType::F32, vec![]);
        let data = ParamData::Value(Attr::Float(v));
        self.out.params.push(Param { name: name.clone(), ty, dims: None, data, loc: None });
        name
    }

    /// Appends `op` of `inputs`, named `name` exactly, on the device of `like`.
    fn push(&mut self, like: &Node, name: String, op: Op, inputs: &[&str], attrs: &[(&str, Attr)]) {
        let mut n = Node::new(name, op, inputs);
        n.attrs = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        (n.device, n.loc) = (like.device, like.loc);
        self.out.nodes.push(n);
    }

    /// Appends `op` of `inputs` under a fresh name made from `base`, which it returns.
    fn emit(&mut self, like: &Node, base: (&str, &str), op: Op, inputs: &[&str], attrs: &[(&str, Attr)]) -> String {
        let name = self.fresh(base);
        self.push(like, name.clone(), op, inputs, attrs);
        name
    }

    /// `x` quantized to values in −127..=127 along `side`'s axis (its largest magnitude
    /// maps to ±127), and the f32 scale that maps them back, reduced along it (kept as 1).
    fn quantized(&mut self, like: &Node, x: &str, side: Side) -> (String, String) {
        if let Some(done) = self.done.get(&(x.to_string(), side)) {
            return done.clone();
        }
        let k = match self.scalars.take() {
            Some(k) => k,
            None => Scalars {
                qmax: self.scalar(("quantize", "qmax"), QMAX),
                floor: self.scalar(("quantize", "floor"), FLOOR),
            },
        };
        let reduce = [("axes", Attr::List(vec![Attr::Int(side.axis())])), ("keepdims", Attr::Bool(true))];
        let abs = self.emit(like, (x, "abs"), Op::Abs, &[x], &[]);
        let max = self.emit(like, (x, "absmax"), Op::ReduceMax, &[&abs], &reduce);
        let max = self.emit(like, (x, "range"), Op::Maximum, &[&max, &k.floor], &[]);
        let scale = self.emit(like, (x, "scale"), Op::Div, &[&max, &k.qmax], &[]);
        // The activation is multiplied by the reciprocal, one division per row rather
        // than per element; the weight, folded, is divided exactly.
        let scaled = match side {
            Side::Activation => {
                let inv = self.emit(like, (x, "inv"), Op::Div, &[&k.qmax, &max], &[]);
                self.emit(like, (x, "scaled"), Op::Mul, &[x, &inv], &[])
            }
            Side::Columns | Side::Rows => self.emit(like, (x, "scaled"), Op::Div, &[x, &scale], &[]),
        };
        let rounded = self.emit(like, (x, "rounded"), Op::Round, &[&scaled], &[]);
        let to = if side == Side::Rows { "i8" } else { "i32" };
        let q = self.emit(like, (x, "int8"), Op::Cast, &[&rounded], &[("to", Attr::Str(to.into()))]);
        self.done.insert((x.to_string(), side), (q.clone(), scale.clone()));
        if side != Side::Activation {
            self.weights.push(Weight { name: x.to_string(), int8: q.clone(), scale: scale.clone(), side });
        }
        self.scalars = Some(k);
        (q, scale)
    }
}

/// Each weight `--weights-dtype int8` quantizes in `g` (verified as `info`, its params'
/// values in `params`), with the largest absolute difference between it and its int8
/// values times their scale, in program order: what the conversion costs, before any pass.
pub fn errors(g: &Graph, info: &Info, params: &Params) -> Result<Vec<(String, &'static str, f64)>> {
    let Some((q, weights)) = quantize(g, info, &HashMap::new(), WeightsDtype::Int8) else { return Ok(Vec::new()) };
    let qinfo = meshc_ir::verify::verify(&q)?;
    let originals: HashSet<&str> = weights.iter().map(|w| w.name.as_str()).collect();
    let folded = fold::fold(&q, &qinfo, params, &HashMap::new(), WeightsDtype::Int8, &originals)?;
    let mut out = Vec::new();
    for w in weights {
        let (original, wq, ws) = (folded.value(&q, &w.name)?, folded.value(&q, &w.int8)?, folded.value(&q, &w.scale)?);
        let (k, n) = match original.shape[..] {
            [.., k, n] => (k, n),
            _ => unreachable!("only matrices are quantized"),
        };
        // `ws` holds one scale per column of each matrix, or per row of a table.
        let scales = ws.data.to_f64();
        let scale = |i: usize| if w.side == Side::Rows { scales[i / n] } else { scales[i / (k * n) * n + i % n] };
        let err = (original.data.iter_f64().zip(wq.data.iter_f64()).enumerate())
            .map(|(i, (a, b))| (a - b * scale(i)).abs())
            .fold(0.0, f64::max);
        out.push((w.name, if w.side == Side::Rows { "int8 per row" } else { "int8 per column" }, err));
    }
    Ok(out)
}
