//! Reverse-mode differentiation as a graph transform: `grad(graph, loss, wrt)` returns the
//! graph with gradient nodes appended and an output `grad.P` for every differentiated
//! param P (the gradient of the scalar `loss` with respect to P).
//!
//! Every node between the chosen params and the loss is differentiated exactly once: its
//! gradient is the sum of the contributions of its consumers, added left to right in the
//! order the consumers are visited (reverse topological order, then operand order), so the
//! same graph always gives the same nodes and the same bits. A node with several
//! contributions gets its sum named `grad.NAME`; other new nodes are `bwd.NODE.K`, and the
//! constants they need are scalar params `bwd_const.K`.
//!
//! Everything is built from ops of the op set, so the gradient graph goes through the
//! verifier, the interpreter, layouts and codegen like any other. Some rules need a
//! construction rather than one op:
//! - masks (`a > b`, for relu, abs, maximum, minimum, reduce_max, max_pool) are
//!   `cast(relu(a - b), bool)`: the f32 difference of two distinct f32 values is never
//!   zero (gradual underflow);
//! - gather's gradient is a scatter-add (`scatter_elements` with reduction `add`) of the
//!   output gradient into zeros; reflect, edge and wrap padding are a gather per padded
//!   dim with a constant index map, and take the same rule;
//! - conv, max_pool and avg_pool go through im2col, a gather with a constant `[taps,
//!   outputs]` table as compile expands them: conv's weight gradient contracts the output
//!   gradient with the gathered input, and every input gradient is a gradient per tap
//!   brought back onto the input positions by col2im, a gather with the inverse table
//!   (each tap and input position fix at most one output) and a sum over the taps;
//! - the gradient of a strided or reversed slice is the output gradient spread out with
//!   zeros by reshape + concat (and reversed back by a slice of step -1).
//!
//! A mean's gradient divides by a count of the elements averaged (a reduce_sum of ones
//! shaped and laid out like the operand), not by a constant, so that on a degraded mesh,
//! where the forward mean leaves out the degraded devices' shards, the step is that of
//! the healthy shards' data.
//!
//! Ties follow JAX: `maximum`/`minimum` give each operand half the gradient where they
//! are equal, `reduce_max` splits it evenly among the maxima, `relu` and `abs` give 0 at 0.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::attr::Attr;
use crate::attrs::{self, GeluApprox, PadMode};
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::graph::{Graph, Node, Output, Param, ParamData};
use crate::infer::{self, norm_axes, norm_axis, slice_range, Operand};
use crate::ops::Op;
use crate::verify::Info;
use crate::window::{self, Tap, Window};

/// The name of the output that holds the gradient of `param`.
pub fn grad_name(param: &str) -> String {
    format!("grad.{param}")
}

/// The params (or inputs) `patterns` select, in the graph's order: each pattern is a name
/// or a glob with `*` and `?`; none means every f32 param. A pattern that selects nothing,
/// or a selected tensor that is not f32/f16/bf16, is an error.
pub fn select_wrt(g: &Graph, patterns: &[String]) -> Result<Vec<String>> {
    let candidates: Vec<(&str, DType)> = g
        .params
        .iter()
        .map(|p| (p.name.as_str(), p.ty.dtype))
        .chain(g.inputs.iter().map(|i| (i.name.as_str(), i.ty.dtype)))
        .collect();
    if patterns.is_empty() {
        return Ok(g.params.iter().filter(|p| p.ty.dtype == DType::F32).map(|p| p.name.clone()).collect());
    }
    let mut chosen = Vec::new();
    for pat in patterns {
        let hits: Vec<_> = candidates.iter().filter(|(n, _)| glob(pat, n)).collect();
        if hits.is_empty() {
            return Err(Error::new(format!("--wrt '{pat}' matches no param or input of the graph")));
        }
        for &&(name, dtype) in &hits {
            if !is_float(dtype) {
                return Err(Error::new(format!("--wrt '{pat}': '{name}' is {dtype}, not a float tensor")));
            }
            if !chosen.iter().any(|c| c == name) {
                chosen.push(name.to_string());
            }
        }
    }
    // The graph's order, whatever order the patterns came in.
    Ok(candidates.iter().filter(|(n, _)| chosen.iter().any(|c| c == n)).map(|(n, _)| n.to_string()).collect())
}

/// `*` matches any run of characters, `?` any one character.
fn glob(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    // Classic two-pointer match with backtracking to the last star.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Appends the gradient of the scalar f32 `loss` with respect to each of `wrt` (params or
/// inputs, as `select_wrt` gives them) to a copy of `g`, whose verifier result is `info`.
pub fn grad(g: &Graph, info: &Info, loss: &str, wrt: &[String]) -> Result<Graph> {
    let loss_ty = info.types.get(loss).ok_or_else(|| {
        // Scalar f32 tensors first: the loss is one of them.
        let scalars = info.types.iter().filter(|(_, t)| t.shape.is_empty() && t.dtype == DType::F32);
        let hint = crate::suggest::did_you_mean(loss, scalars.map(|(n, _)| n.as_str()));
        Error::new(format!("--loss '{loss}' is not a tensor of the graph{hint}"))
    })?;
    if *loss_ty != TensorType::new(DType::F32, vec![]) {
        return Err(Error::new(format!("--loss '{loss}' is {loss_ty}; the loss must be a scalar f32[]")));
    }

    // Tensors whose value depends on a differentiated param through float values.
    let mut depends: HashSet<String> = wrt.iter().cloned().collect();
    // Tensors the loss is computed from.
    let mut feeds_loss: HashSet<&str> = HashSet::from([loss]);
    for &i in info.order.iter().rev() {
        let n = &g.nodes[i];
        if feeds_loss.contains(n.name.as_str()) {
            feeds_loss.extend(n.inputs.iter().map(String::as_str));
        }
    }
    for &i in &info.order {
        let n = &g.nodes[i];
        let Some(from) = n.inputs.iter().find(|x| depends.contains(*x)) else { continue };
        // Piecewise constant: a zero gradient, as JAX's (a where's condition passes none).
        if !feeds_loss.contains(n.name.as_str()) || piecewise_constant(n.op) {
            continue;
        }
        if let Some(why) = not_differentiable(n, &info.types[&n.name]) {
            return Err(Error::at(
                n.loc,
                format!("node '{}': {why} is not differentiable, and the loss depends on '{from}' through it", n.name),
            ));
        }
        depends.insert(n.name.clone());
    }

    let mut b = Builder::new(g, info);
    let mut contribs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let one = b.constant(1.0)?;
    contribs.insert(loss.to_string(), vec![one]);
    for &i in info.order.iter().rev() {
        let n = &g.nodes[i];
        if !depends.contains(&n.name) {
            continue;
        }
        let Some(parts) = contribs.remove(&n.name) else { continue };
        let gy = b.sum(&n.name, parts)?;
        b.scope = n.name.clone();
        for (k, x) in n.inputs.iter().enumerate() {
            if depends.contains(x) {
                let d = b.contribution(n, k, &gy)?;
                contribs.entry(x.clone()).or_default().push(d);
            }
        }
    }

    let mut out = g.clone();
    let mut wanted = Vec::new();
    for w in wrt {
        let ty = b.ty(w).clone();
        b.scope = w.clone();
        let total = match contribs.remove(w) {
            Some(parts) => b.sum(w, parts)?,
            None => b.zeros(&ty.shape)?,
        };
        let name = grad_name(w);
        if total != name {
            b.reserve(&name)?;
            let shape = ty.shape.iter().map(|&d| d as i64).collect::<Vec<_>>();
            b.push(Node::new(&name, Op::Reshape, &[&total]).with_attr("shape", Attr::ints(&shape)))?;
        }
        wanted.push(name);
    }
    out.params.extend(b.params);
    out.nodes.extend(b.nodes);
    out.outputs.extend(wanted.into_iter().map(Output::new));
    Ok(out)
}

/// Ops whose result is constant wherever it is continuous: comparisons and logic (whose
/// bool result only selects), floor, ceil and round, and iota (which reads only a size).
/// Their operands get no gradient.
fn piecewise_constant(op: Op) -> bool {
    use Op::*;
    matches!(op, Equal | Less | LessEqual | Greater | GreaterEqual | And | Or | Xor | Not | Floor | Ceil | Round | Iota)
}

/// Why `n`, which consumes a differentiated value, cannot pass a gradient back, if so.
fn not_differentiable(n: &Node, out: &TensorType) -> Option<String> {
    if n.op.is_communication() {
        return Some(format!("{} (differentiate before lowering)", n.op));
    }
    if !is_float(out.dtype) {
        return Some(format!("{} to {}", n.op, out.dtype));
    }
    None
}

/// Appends nodes and constants, inferring each new node's type as it goes.
struct Builder {
    types: HashMap<String, TensorType>,
    taken: HashSet<String>,
    nodes: Vec<Node>,
    params: Vec<Param>,
    consts: BTreeMap<u32, String>,
    /// The forward node whose gradient is being built: names new nodes `bwd.SCOPE.K`.
    scope: String,
    next: HashMap<String, usize>,
}

type Shape = Vec<usize>;

fn ints(v: &[usize]) -> Attr {
    Attr::ints(&v.iter().map(|&d| d as i64).collect::<Vec<_>>())
}

impl Builder {
    fn new(g: &Graph, info: &Info) -> Builder {
        let taken = info.types.keys().cloned().collect();
        Builder {
            types: info.types.clone(),
            taken,
            nodes: Vec::new(),
            params: Vec::new(),
            consts: BTreeMap::new(),
            scope: g.name.clone(),
            next: HashMap::new(),
        }
    }

    fn ty(&self, name: &str) -> &TensorType {
        &self.types[name]
    }

    fn shape(&self, name: &str) -> Shape {
        self.types[name].shape.clone()
    }

    fn reserve(&mut self, name: &str) -> Result<()> {
        if !self.taken.insert(name.to_string()) {
            return Err(Error::new(format!(
                "the gradient graph needs the name '{name}', which the graph already uses; rename that tensor"
            )));
        }
        Ok(())
    }

    fn fresh(&mut self, prefix: &str) -> Result<String> {
        let k = self.next.entry(prefix.to_string()).or_default();
        let name = format!("{prefix}.{k}");
        *k += 1;
        self.reserve(&name)?;
        Ok(name)
    }

    fn push(&mut self, node: Node) -> Result<String> {
        let operands: Vec<Operand> = node.inputs.iter().map(|i| Operand { ty: &self.types[i], dims: None }).collect();
        let inf = infer::infer(&node, &operands)
            .map_err(|e| Error::new(format!("gradient node '{}' ({}): {e}", node.name, node.op)))?;
        self.types.insert(node.name.clone(), inf.ty);
        let name = node.name.clone();
        self.nodes.push(node);
        Ok(name)
    }

    fn op(&mut self, op: Op, inputs: &[&str], attrs: &[(&str, Attr)]) -> Result<String> {
        let name = self.fresh(&format!("bwd.{}", self.scope))?;
        let mut node = Node::new(name, op, inputs);
        for (k, v) in attrs {
            node.attrs.insert(k.to_string(), v.clone());
        }
        self.push(node)
    }

    fn param(&mut self, prefix: &str, ty: TensorType, value: Attr) -> Result<String> {
        let name = self.fresh(prefix)?;
        self.types.insert(name.clone(), ty.clone());
        self.params.push(Param { name: name.clone(), ty, dims: None, data: ParamData::Value(value), loc: None });
        Ok(name)
    }

    /// A scalar f32 constant, one param per distinct value.
    fn constant(&mut self, v: f32) -> Result<String> {
        if let Some(n) = self.consts.get(&v.to_bits()) {
            return Ok(n.clone());
        }
        let name = self.param("bwd_const", TensorType::new(DType::F32, vec![]), Attr::Float(v as f64))?;
        self.consts.insert(v.to_bits(), name.clone());
        Ok(name)
    }

    fn zeros(&mut self, shape: &[usize]) -> Result<String> {
        let zero = self.constant(0.0)?;
        self.op(Op::BroadcastTo, &[&zero], &[("shape", ints(shape))])
    }

    fn bin(&mut self, op: Op, a: &str, b: &str) -> Result<String> {
        self.op(op, &[a, b], &[])
    }

    fn un(&mut self, op: Op, a: &str) -> Result<String> {
        self.op(op, &[a], &[])
    }

    fn mul_const(&mut self, a: &str, c: f32) -> Result<String> {
        let c = self.constant(c)?;
        self.bin(Op::Mul, a, &c)
    }

    fn reshape(&mut self, a: &str, shape: &[usize]) -> Result<String> {
        if self.ty(a).shape == shape {
            return Ok(a.to_string());
        }
        self.op(Op::Reshape, &[a], &[("shape", ints(shape))])
    }

    /// `a > b` elementwise (with broadcasting), as a bool mask.
    fn greater(&mut self, a: &str, b: &str) -> Result<String> {
        let d = self.bin(Op::Sub, a, b)?;
        self.positive(&d)
    }

    /// `x > 0` (NaN counts as true).
    fn positive(&mut self, x: &str) -> Result<String> {
        let r = self.un(Op::Relu, x)?;
        self.op(Op::Cast, &[&r], &[("to", Attr::Str("bool".into()))])
    }

    fn select(&mut self, cond: &str, a: &str, b: &str) -> Result<String> {
        self.op(Op::Where, &[cond, a, b], &[])
    }

    /// Sums the contributions to `of`'s gradient left to right; the total of several is
    /// named `grad.OF`.
    fn sum(&mut self, of: &str, parts: Vec<String>) -> Result<String> {
        let mut it = parts.into_iter();
        let mut acc = it.next().expect("a gradient has at least one contribution");
        let mut rest = it.peekable();
        while let Some(p) = rest.next() {
            let name = if rest.peek().is_none() {
                let n = grad_name(of);
                self.reserve(&n)?;
                n
            } else {
                self.fresh(&format!("bwd.{of}.acc"))?
            };
            acc = self.push(Node::new(name, Op::Add, &[&acc, &p]))?;
        }
        Ok(acc)
    }

    /// Sums `d` (a gradient of a broadcast result) down to `shape`, the operand's shape.
    fn unbroadcast(&mut self, d: &str, shape: &[usize]) -> Result<String> {
        let have = self.shape(d);
        if have == shape {
            return Ok(d.to_string());
        }
        let lead = have.len() - shape.len();
        let axes: Vec<usize> =
            (0..have.len()).filter(|&i| i < lead || (shape[i - lead] == 1 && have[i] != 1)).collect();
        let s = if axes.is_empty() {
            d.to_string()
        } else {
            self.op(Op::ReduceSum, &[d], &[("axes", ints(&axes)), ("keepdims", Attr::Bool(false))])?
        };
        self.reshape(&s, shape)
    }

    /// `d` (of the shape `x` had after reducing `axes` without keepdims) broadcast back.
    fn unreduce(&mut self, d: &str, x_shape: &[usize], axes: &[usize]) -> Result<String> {
        let kept: Vec<usize> =
            x_shape.iter().enumerate().map(|(i, &n)| if axes.contains(&i) { 1 } else { n }).collect();
        let d = self.reshape(d, &kept)?;
        if kept == x_shape {
            return Ok(d);
        }
        self.op(Op::BroadcastTo, &[&d], &[("shape", ints(x_shape))])
    }

    fn reduce_keep(&mut self, op: Op, x: &str, axes: &[usize]) -> Result<String> {
        self.op(op, &[x], &[("axes", ints(axes)), ("keepdims", Attr::Bool(true))])
    }

    /// The contribution of node `n`'s result gradient `gy` to the gradient of its operand `k`.
    fn contribution(&mut self, n: &Node, k: usize, gy: &str) -> Result<String> {
        use Op::*;
        let x = n.inputs[k].as_str();
        let y = n.name.as_str();
        let x_shape = self.shape(x);
        let fail = |msg: &str| Error::at(n.loc, format!("node '{}': {msg}", n.name));
        let d = match n.op {
            Add => gy.to_string(),
            Sub if k == 0 => gy.to_string(),
            Sub => self.un(Neg, gy)?,
            Mul => self.bin(Mul, gy, &n.inputs[1 - k])?,
            Div if k == 0 => self.bin(Div, gy, &n.inputs[1])?,
            Div => {
                let gyy = self.bin(Mul, gy, y)?;
                let q = self.bin(Div, &gyy, &n.inputs[1])?;
                self.un(Neg, &q)?
            }
            Pow if k == 0 => {
                // d(a^b)/da = b·a^(b-1)
                let one = self.constant(1.0)?;
                let bm1 = self.bin(Sub, &n.inputs[1], &one)?;
                let p = self.bin(Pow, &n.inputs[0], &bm1)?;
                let bp = self.bin(Mul, &n.inputs[1], &p)?;
                self.bin(Mul, gy, &bp)?
            }
            Pow => {
                // d(a^b)/db = a^b·log(a)
                let l = self.un(Log, &n.inputs[0])?;
                let yl = self.bin(Mul, y, &l)?;
                self.bin(Mul, gy, &yl)?
            }
            Maximum | Minimum => {
                let (a, b) = (&n.inputs[0], &n.inputs[1]);
                // For maximum operand 0 wins where a > b; for minimum where b > a.
                let (mine, theirs) = if (n.op == Maximum) == (k == 0) { (a, b) } else { (b, a) };
                let wins = self.greater(mine, theirs)?;
                let loses = self.greater(theirs, mine)?;
                let zero = self.constant(0.0)?;
                let half = self.mul_const(gy, 0.5)?;
                let tie = self.select(&loses, &zero, &half)?;
                self.select(&wins, gy, &tie)?
            }
            Neg => self.un(Neg, gy)?,
            Abs => {
                let zero = self.constant(0.0)?;
                let pos = self.positive(x)?;
                let nx = self.un(Neg, x)?;
                let neg = self.positive(&nx)?;
                let ng = self.un(Neg, gy)?;
                let inner = self.select(&pos, gy, &zero)?;
                self.select(&neg, &ng, &inner)?
            }
            Relu => {
                let zero = self.constant(0.0)?;
                let pos = self.op(Cast, &[y], &[("to", Attr::Str("bool".into()))])?;
                self.select(&pos, gy, &zero)?
            }
            Exp => self.bin(Mul, gy, y)?,
            Log => self.bin(Div, gy, x)?,
            Sqrt => {
                let h = self.mul_const(gy, 0.5)?;
                self.bin(Div, &h, y)?
            }
            Rsqrt => {
                // d(x^-1/2)/dx = -½·y³
                let y2 = self.bin(Mul, y, y)?;
                let y3 = self.bin(Mul, &y2, y)?;
                let c = self.mul_const(&y3, -0.5)?;
                self.bin(Mul, gy, &c)?
            }
            Tanh => {
                let one = self.constant(1.0)?;
                let y2 = self.bin(Mul, y, y)?;
                let s = self.bin(Sub, &one, &y2)?;
                self.bin(Mul, gy, &s)?
            }
            Sin => {
                let c = self.un(Cos, x)?;
                self.bin(Mul, gy, &c)?
            }
            Cos => {
                let s = self.un(Sin, x)?;
                let ns = self.un(Neg, &s)?;
                self.bin(Mul, gy, &ns)?
            }
            Sigmoid => {
                let one = self.constant(1.0)?;
                let s = self.bin(Sub, &one, y)?;
                let ys = self.bin(Mul, y, &s)?;
                self.bin(Mul, gy, &ys)?
            }
            // d erf/dx = 2/√π·e^(−x²), and erfc = 1 − erf.
            Erf | Erfc => {
                let x2 = self.bin(Mul, x, x)?;
                let nx2 = self.un(Neg, &x2)?;
                let e = self.un(Exp, &nx2)?;
                let k = std::f64::consts::FRAC_2_SQRT_PI * if n.op == Erfc { -1.0 } else { 1.0 };
                let d = self.mul_const(&e, k as f32)?;
                self.bin(Mul, gy, &d)?
            }
            Gelu => {
                let d = match attrs::Gelu::of(n).approximate {
                    GeluApprox::Tanh => self.gelu_tanh_slope(x)?,
                    GeluApprox::None => self.gelu_slope(x)?,
                };
                self.bin(Mul, gy, &d)?
            }
            Cast => {
                let from = self.ty(x).dtype;
                if from == self.ty(y).dtype {
                    gy.to_string()
                } else {
                    self.op(Cast, &[gy], &[("to", Attr::Str(from.name().into()))])?
                }
            }
            Where if k == 0 => return Err(fail("the condition of where has no gradient")),
            Where => {
                let zero = self.constant(0.0)?;
                let zero = if self.ty(gy).dtype == DType::F32 {
                    zero
                } else {
                    let dt = self.ty(gy).dtype.name();
                    self.op(Cast, &[&zero], &[("to", Attr::Str(dt.into()))])?
                };
                if k == 1 {
                    self.select(&n.inputs[0], gy, &zero)?
                } else {
                    self.select(&n.inputs[0], &zero, gy)?
                }
            }
            MatMul => self.matmul(n, k, gy)?,
            Einsum => self.einsum(n, k, gy)?,
            ReduceSum | ReduceMean | ReduceMax => {
                let axes = match attrs::Reduce::of(n).axes {
                    Some(a) => norm_axes(&a, x_shape.len()).map_err(|e| fail(&e))?,
                    None => (0..x_shape.len()).collect(),
                };
                let g = self.unreduce(gy, &x_shape, &axes)?;
                match n.op {
                    ReduceSum => g,
                    ReduceMean if axes.is_empty() => g,
                    ReduceMean => {
                        // g / (the number of elements averaged), counted by a reduce_sum
                        // of ones laid out like x rather than taken from the shape: on a
                        // degraded mesh the forward mean averages the healthy shards only,
                        // and so does this count.
                        let present = self.op(Cast, &[x], &[("to", Attr::Str("bool".into()))])?;
                        let one = self.constant(1.0)?;
                        let ones = self.select(&present, &one, &one)?;
                        let count = self.reduce_keep(ReduceSum, &ones, &axes)?;
                        self.bin(Div, &g, &count)?
                    }
                    _ if axes.is_empty() => g,
                    _ => {
                        // Evenly among the maxima: ind = (x >= max), d = g·ind / Σind.
                        let m = self.unreduce(y, &x_shape, &axes)?;
                        let below = self.greater(&m, x)?;
                        let (zero, one) = (self.constant(0.0)?, self.constant(1.0)?);
                        let ind = self.select(&below, &zero, &one)?;
                        let count = self.reduce_keep(ReduceSum, &ind, &axes)?;
                        let share = self.bin(Div, &ind, &count)?;
                        self.bin(Mul, &g, &share)?
                    }
                }
            }
            Softmax => {
                let axis = norm_axis(attrs::Softmax::of(n).axis, x_shape.len()).map_err(|e| fail(&e))?;
                let gyy = self.bin(Mul, gy, y)?;
                let s = self.reduce_keep(ReduceSum, &gyy, &[axis])?;
                let c = self.bin(Sub, gy, &s)?;
                self.bin(Mul, y, &c)?
            }
            LayerNorm => self.layer_norm(n, k, gy)?,
            Reshape => self.reshape(gy, &x_shape)?,
            Transpose => {
                let rank = x_shape.len();
                let perm = match attrs::Transpose::of(n).perm {
                    Some(p) => {
                        p.iter().map(|&a| norm_axis(a, rank)).collect::<Result<Vec<_>, _>>().map_err(|e| fail(&e))?
                    }
                    None => (0..rank).rev().collect(),
                };
                let mut inv = vec![0; rank];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                self.op(Transpose, &[gy], &[("perm", ints(&inv))])?
            }
            BroadcastTo => gy.to_string(),
            // `like` gives only its shape.
            BroadcastLike if k == 1 => self.zeros(&x_shape)?,
            BroadcastLike => gy.to_string(),
            Concat => {
                let axis = norm_axis(attrs::Concat::of(n).axis, x_shape.len()).map_err(|e| fail(&e))?;
                let start: usize = n.inputs[..k].iter().map(|o| self.shape(o)[axis]).sum();
                let end = start + x_shape[axis];
                let a = [("starts", ints(&[start])), ("ends", ints(&[end])), ("axes", ints(&[axis]))];
                self.op(Slice, &[gy], &a)?
            }
            Slice => self.slice(n, gy)?,
            // y = pad(x, p) with a constant: x's gradient is gy with the pads taken back
            // (a pad cropped, a crop filled with zeros).
            Pad if attrs::Pad::of(n).mode == PadMode::Constant => {
                let pads: Vec<i64> = attrs::Pad::of(n).pads.iter().map(|p| -p).collect();
                self.op(Pad, &[gy], &[("pads", Attr::ints(&pads))])?
            }
            Pad => self.pad(n, gy)?,
            Gather if k == 0 => {
                let axis = norm_axis(attrs::Gather::of(n).axis, x_shape.len()).map_err(|e| fail(&e))?;
                self.gather(gy, &n.inputs[1], &x_shape, axis)?
            }
            Gather => return Err(fail("the indices of gather have no gradient")),
            // The window read goes back where it was read from, into zeros; the starts are
            // clamped the same way by both ops, so it lands where it came from.
            DynamicSlice if k == 0 => {
                let axes = Attr::ints(&attrs::DynamicSlice::of(n).axes);
                let zeros = self.zeros(&x_shape)?;
                self.op(DynamicUpdateSlice, &[&zeros, gy, &n.inputs[1]], &[("axes", axes)])?
            }
            // The elements the update overwrote pass no gradient to x; the update's is the
            // window of gy it was written to.
            DynamicUpdateSlice if k < 2 => {
                let axes = attrs::DynamicUpdateSlice::of(n).axes;
                let starts = &n.inputs[2];
                let update = self.shape(&n.inputs[1]);
                match k {
                    0 => {
                        let zeros = self.zeros(&update)?;
                        self.op(DynamicUpdateSlice, &[gy, &zeros, starts], &[("axes", Attr::ints(&axes))])?
                    }
                    _ => {
                        let rank = update.len();
                        let sizes = axes
                            .iter()
                            .map(|&a| norm_axis(a, rank).map(|a| update[a]))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| fail(&e))?;
                        self.op(DynamicSlice, &[gy, starts], &[("axes", Attr::ints(&axes)), ("sizes", ints(&sizes))])?
                    }
                }
            }
            DynamicSlice | DynamicUpdateSlice => return Err(fail("the starts of a dynamic slice have no gradient")),
            Conv if k == 2 => {
                let axes: Vec<usize> = (0..self.shape(gy).len()).filter(|&d| d != 1).collect();
                self.op(ReduceSum, &[gy], &[("axes", ints(&axes)), ("keepdims", Attr::Bool(false))])?
            }
            Conv => self.conv(n, k, gy).map_err(|e| fail(&e.msg))?,
            MaxPool | AvgPool => self.pool(n, gy).map_err(|e| fail(&e.msg))?,
            // Piecewise-constant ops pass no gradient and never get here; the others have
            // none: integer remainders, scatters, the fused attention (a compile pass makes
            // it after differentiation) and communication (lowering inserts it).
            // y_j = Σ_{i≤j} x_i (i<j exclusive), so dx_i = Σ_{j≥i} gy_j (j>i): the same
            // cumsum of gy, run the other way.
            CumSum => {
                let a = attrs::CumSum::of(n);
                let flipped = [
                    ("axis", Attr::Int(a.axis)),
                    ("exclusive", Attr::Bool(a.exclusive)),
                    ("reverse", Attr::Bool(!a.reverse)),
                ];
                self.op(CumSum, &[gy], &flipped)?
            }
            Mod | ScatterElements | Attention | Equal | Less | LessEqual | Greater | GreaterEqual | And | Or | Xor
            | Not | Floor | Ceil | Round | Iota | Send | Recv | AllReduce | AllGather | ReduceScatter | AllToAll => {
                return Err(fail(&format!("{} has no gradient", n.op)))
            }
        };
        self.unbroadcast(&d, &x_shape)
    }

    /// d gelu(x)/dx = Φ(x) + x·φ(x).
    fn gelu_slope(&mut self, x: &str) -> Result<String> {
        let xs = self.mul_const(x, std::f64::consts::FRAC_1_SQRT_2 as f32)?;
        let e = self.un(Op::Erf, &xs)?;
        let one = self.constant(1.0)?;
        let e1 = self.bin(Op::Add, &one, &e)?;
        let cdf = self.mul_const(&e1, 0.5)?;
        let x2 = self.bin(Op::Mul, x, x)?;
        let h = self.mul_const(&x2, -0.5)?;
        let ex = self.un(Op::Exp, &h)?;
        let pdf = self.mul_const(&ex, (1.0 / (2.0 * std::f64::consts::PI).sqrt()) as f32)?;
        let xpdf = self.bin(Op::Mul, x, &pdf)?;
        self.bin(Op::Add, &cdf, &xpdf)
    }

    /// gelu_tanh(x) = ½x(1+t), t = tanh(c(x + 0.044715x³)):
    /// slope ½(1+t) + ½x(1-t²)·c(1 + 3·0.044715x²).
    fn gelu_tanh_slope(&mut self, x: &str) -> Result<String> {
        let c = (2.0 / std::f64::consts::PI).sqrt() as f32;
        let one = self.constant(1.0)?;
        let x2 = self.bin(Op::Mul, x, x)?;
        let x3 = self.bin(Op::Mul, &x2, x)?;
        let k3 = self.mul_const(&x3, 0.044715)?;
        let inner = self.bin(Op::Add, x, &k3)?;
        let u = self.mul_const(&inner, c)?;
        let t = self.un(Op::Tanh, &u)?;
        let t1 = self.bin(Op::Add, &one, &t)?;
        let left = self.mul_const(&t1, 0.5)?;
        let t2 = self.bin(Op::Mul, &t, &t)?;
        let sech2 = self.bin(Op::Sub, &one, &t2)?;
        let k2 = self.mul_const(&x2, 3.0 * 0.044715)?;
        let du = self.bin(Op::Add, &one, &k2)?;
        let du = self.mul_const(&du, c)?;
        let hx = self.mul_const(x, 0.5)?;
        let r = self.bin(Op::Mul, &hx, &sech2)?;
        let right = self.bin(Op::Mul, &r, &du)?;
        self.bin(Op::Add, &left, &right)
    }

    /// numpy matmul: 1-D operands are promoted to matrices, batch dims broadcast (summed
    /// back by `unbroadcast` in the caller).
    fn matmul(&mut self, n: &Node, k: usize, gy: &str) -> Result<String> {
        let (a, b) = (n.inputs[0].as_str(), n.inputs[1].as_str());
        let (sa, sb) = (self.shape(a), self.shape(b));
        let a2: Shape = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
        let b2: Shape = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
        let mut g2 = self.shape(gy);
        if sa.len() == 1 {
            g2.insert(g2.len() - usize::from(sb.len() != 1), 1);
        }
        if sb.len() == 1 {
            g2.push(1);
        }
        let g = self.reshape(gy, &g2)?;
        let swap = |r: usize| -> Vec<usize> {
            let mut p: Vec<usize> = (0..r).collect();
            p.swap(r - 2, r - 1);
            p
        };
        let d = if k == 0 {
            let b = self.reshape(b, &b2)?;
            let bt = self.op(Op::Transpose, &[&b], &[("perm", ints(&swap(b2.len())))])?;
            let d = self.bin(Op::MatMul, &g, &bt)?;
            self.unbroadcast(&d, &a2)?
        } else if b2.len() == 2 && a2.len() > 2 {
            // A matrix applied to a batch (a weight): one einsum contracts every batch dim
            // at once. As a batched matmul then a sum over the batch, a batch split over two
            // mesh axes would be reduced in two stages, and on a degraded mesh the second
            // stage's groups miss the degraded devices' rows' partial sums of the first.
            let a = self.reshape(a, &a2)?;
            let batch: String = ('a'..='z').filter(|c| !"kmn".contains(*c)).take(a2.len() - 2).collect();
            let eq = format!("{batch}mk,{batch}mn->kn");
            self.op(Op::Einsum, &[&a, &g], &[("equation", Attr::Str(eq))])?
        } else {
            let a = self.reshape(a, &a2)?;
            let at = self.op(Op::Transpose, &[&a], &[("perm", ints(&swap(a2.len())))])?;
            let d = self.bin(Op::MatMul, &at, &g)?;
            self.unbroadcast(&d, &b2)?
        };
        self.reshape(&d, if k == 0 { &sa } else { &sb })
    }

    /// The gradient of operand k of an einsum is an einsum of the output gradient with
    /// the other operands; letters only operand k has are a broadcast of the result.
    fn einsum(&mut self, n: &Node, k: usize, gy: &str) -> Result<String> {
        let eq = attrs::Einsum::of(n).equation;
        let (terms, out) = infer::parse_equation(&eq, n.inputs.len())
            .map_err(|e| Error::at(n.loc, format!("node '{}': {e}", n.name)))?;
        let mut operands = vec![gy.to_string()];
        let mut lhs: Vec<String> = vec![out.iter().collect()];
        for (i, t) in terms.iter().enumerate() {
            if i != k {
                operands.push(n.inputs[i].clone());
                lhs.push(t.iter().collect());
            }
        }
        let mine = &terms[k];
        let seen: HashSet<char> = lhs.iter().flat_map(|s| s.chars()).collect();
        let kept: Vec<char> = mine.iter().copied().filter(|c| seen.contains(c)).collect();
        let eq = format!("{}->{}", lhs.join(","), kept.iter().collect::<String>());
        let refs: Vec<&str> = operands.iter().map(String::as_str).collect();
        let d = self.op(Op::Einsum, &refs, &[("equation", Attr::Str(eq))])?;
        if kept.len() == mine.len() {
            return Ok(d);
        }
        let x_shape = self.shape(&n.inputs[k]);
        let axes: Vec<usize> = (0..mine.len()).filter(|&i| !seen.contains(&mine[i])).collect();
        self.unreduce(&d, &x_shape, &axes)
    }

    /// layer_norm over dims `axis..`: with x̂ = (x-μ)·r, r = 1/√(var+eps),
    /// dx = r·(dx̂ - mean(dx̂) - x̂·mean(dx̂·x̂)), dx̂ = g·γ, dγ = Σ g·x̂, dβ = Σ g.
    fn layer_norm(&mut self, n: &Node, k: usize, gy: &str) -> Result<String> {
        let x = n.inputs[0].as_str();
        let shape = self.shape(x);
        let attrs::LayerNorm { axis, eps } = attrs::LayerNorm::of(n);
        let axis = norm_axis(axis, shape.len()).map_err(|e| Error::at(n.loc, format!("node '{}': {e}", n.name)))?;
        let norm: Vec<usize> = (axis..shape.len()).collect();
        let lead: Vec<usize> = (0..axis).collect();
        if k == 2 {
            return self.unbroadcast(gy, &shape[axis..]);
        }
        let mu = self.reduce_keep(Op::ReduceMean, x, &norm)?;
        let xc = self.bin(Op::Sub, x, &mu)?;
        let sq = self.bin(Op::Mul, &xc, &xc)?;
        let var = self.reduce_keep(Op::ReduceMean, &sq, &norm)?;
        let eps = self.constant(eps as f32)?;
        let ve = self.bin(Op::Add, &var, &eps)?;
        let r = self.un(Op::Rsqrt, &ve)?;
        let xhat = self.bin(Op::Mul, &xc, &r)?;
        if k == 1 {
            let gx = self.bin(Op::Mul, gy, &xhat)?;
            if lead.is_empty() {
                return Ok(gx);
            }
            return self.op(Op::ReduceSum, &[&gx], &[("axes", ints(&lead)), ("keepdims", Attr::Bool(false))]);
        }
        let dxhat = self.bin(Op::Mul, gy, &n.inputs[1])?;
        let m1 = self.reduce_keep(Op::ReduceMean, &dxhat, &norm)?;
        let dx_x = self.bin(Op::Mul, &dxhat, &xhat)?;
        let m2 = self.reduce_keep(Op::ReduceMean, &dx_x, &norm)?;
        let t = self.bin(Op::Mul, &xhat, &m2)?;
        let c = self.bin(Op::Sub, &dxhat, &m1)?;
        let c = self.bin(Op::Sub, &c, &t)?;
        self.bin(Op::Mul, &r, &c)
    }

    /// The gradient of a slice: per sliced axis, the output gradient put back at the
    /// positions the slice read, zeros elsewhere.
    fn slice(&mut self, n: &Node, gy: &str) -> Result<String> {
        let fail = |e: String| Error::at(n.loc, format!("node '{}': {e}", n.name));
        let x_shape = self.shape(&n.inputs[0]);
        let rank = x_shape.len();
        let attrs::Slice { starts, ends, axes, steps } = attrs::Slice::of(n);
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        let mut g = gy.to_string();
        for j in 0..starts.len() {
            let axis = norm_axis(axes[j], rank).map_err(fail)?;
            let size = x_shape[axis];
            let (start, len) = slice_range(starts[j], ends[j], steps[j], size).map_err(fail)?;
            let mut shape = self.shape(&g);
            if len == 0 {
                shape[axis] = size;
                g = self.zeros(&shape)?;
                continue;
            }
            let (mut first, step) = (start, steps[j].unsigned_abs() as usize);
            if steps[j] < 0 {
                let rev = [
                    ("starts", Attr::ints(&[-1])),
                    ("ends", Attr::ints(&[-(len as i64) - 1])),
                    ("axes", ints(&[axis])),
                    ("steps", Attr::ints(&[-1])),
                ];
                g = self.op(Op::Slice, &[&g], &rev)?;
                first = start - step * (len - 1);
            }
            if step > 1 {
                // [.., len, ..] → [.., len, 1, ..] ++ zeros [.., len, step-1, ..] → [.., len·step, ..]
                let mut col = shape.clone();
                col.insert(axis + 1, 1);
                let gc = self.reshape(&g, &col)?;
                col[axis + 1] = step - 1;
                let z = self.zeros(&col)?;
                let cat = self.op(Op::Concat, &[&gc, &z], &[("axis", Attr::Int(axis as i64 + 1))])?;
                shape[axis] = len * step;
                g = self.reshape(&cat, &shape)?;
                if first + len * step > size {
                    let keep = size - first;
                    let a = [("starts", ints(&[0])), ("ends", ints(&[keep])), ("axes", ints(&[axis]))];
                    g = self.op(Op::Slice, &[&g], &a)?;
                    shape[axis] = keep;
                }
            }
            let after = size - first - shape[axis];
            let mut parts = Vec::new();
            for (width, is_g) in [(first, false), (shape[axis], true), (after, false)] {
                if is_g {
                    parts.push(g.clone());
                } else if width > 0 {
                    let mut zs = shape.clone();
                    zs[axis] = width;
                    parts.push(self.zeros(&zs)?);
                }
            }
            if parts.len() > 1 {
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                g = self.op(Op::Concat, &refs, &[("axis", Attr::Int(axis as i64))])?;
            }
        }
        Ok(g)
    }

    /// The gradient of `data` (of shape `d_shape`) in `y = gather(data, idx) {axis}`: the
    /// output gradient scatter-added at the indices into zeros, as one `scatter_elements`
    /// with reduction `add` over `[before axis, indices, after axis]` (memory of the size of
    /// `data` and of `gy`, where a one-hot contraction would take data's axis times the
    /// number of indices).
    fn gather(&mut self, gy: &str, idx: &str, d_shape: &[usize], axis: usize) -> Result<String> {
        let pre: usize = d_shape[..axis].iter().product();
        let post: usize = d_shape[axis + 1..].iter().product();
        let count: usize = self.shape(idx).iter().product();
        let g = self.reshape(gy, &[pre, count, post])?;
        let i = self.reshape(idx, &[1, count, 1])?;
        let i =
            if pre * post == 1 { i } else { self.op(Op::BroadcastTo, &[&i], &[("shape", ints(&[pre, count, post]))])? };
        let zeros = self.zeros(&[pre, d_shape[axis], post])?;
        let a = [("axis", Attr::Int(1)), ("reduction", Attr::Str("add".into()))];
        let s = self.op(Op::ScatterElements, &[&zeros, &i, &g], &a)?;
        self.reshape(&s, d_shape)
    }

    /// An i64 constant `[values.len()]` reshaped to `shape`.
    fn index_table(&mut self, values: &[usize], shape: &[usize]) -> Result<String> {
        let ty = TensorType::new(DType::I64, vec![values.len()]);
        let value = Attr::List(values.iter().map(|&v| Attr::Int(v as i64)).collect());
        let t = self.param("bwd_index", ty, value)?;
        self.reshape(&t, shape)
    }

    /// An f32 constant `[values.len()]` reshaped to `shape`.
    fn f32_table(&mut self, values: &[f32], shape: &[usize]) -> Result<String> {
        let ty = TensorType::new(DType::F32, vec![values.len()]);
        let value = Attr::List(values.iter().map(|&v| Attr::Float(v as f64)).collect());
        let t = self.param("bwd_table", ty, value)?;
        self.reshape(&t, shape)
    }

    /// Reflect, edge and wrap padding read every output element from one input element
    /// (`window::pad_source`): per padded dim a gather with a constant index map, whose
    /// gradient is a scatter-add of gy along that dim.
    fn pad(&mut self, n: &Node, gy: &str) -> Result<String> {
        let x_shape = self.shape(&n.inputs[0]);
        let mode = attrs::Pad::of(n).mode;
        let (pads, _) =
            window::pad_shape(n, &x_shape).map_err(|e| Error::at(n.loc, format!("node '{}': {e}", n.name)))?;
        let rank = x_shape.len();
        let mut g = gy.to_string();
        for d in (0..rank).filter(|&d| pads[d] != 0 || pads[rank + d] != 0) {
            let out = self.shape(&g)[d];
            let map: Option<Vec<usize>> = (0..out).map(|o| window::pad_source(mode, x_shape[d], pads[d], o)).collect();
            let map = map.expect("every mode but constant reads each element from the input");
            let idx = self.index_table(&map, &[out])?;
            let mut shape = self.shape(&g);
            shape[d] = x_shape[d];
            g = self.gather(&g, &idx, &shape, d)?;
        }
        Ok(g)
    }

    /// The window of conv or pool node `n` over the spatial dims of its input: the window,
    /// the input's and the result's spatial sizes, the taps per output and their table
    /// (`Window::taps`, or for a pool `Window::pool_taps`).
    fn window(&self, n: &Node) -> Result<(Window, Shape, Shape, usize, Vec<Tap>)> {
        let x = self.shape(&n.inputs[0]);
        let win = if n.op == Op::Conv {
            window::conv_window(n, &x, &self.shape(&n.inputs[1])).map(|w| w.0)
        } else {
            Window::of(n, x.len().saturating_sub(2), None)
        };
        let win = win.map_err(Error::new)?;
        let sp = x[2..].to_vec();
        let out = win.out_sizes(&sp).map_err(Error::new)?;
        let (n_k, taps) = match n.op {
            Op::Conv => (win.kernel.iter().product(), win.taps(&sp, &out).map_err(Error::new)?),
            _ => win.pool_taps(&sp, &out).map_err(Error::new)?,
        };
        Ok((win, sp, out, n_k, taps))
    }

    /// im2col: `x` viewed as `lead ++ [positions]` gathered into `lead ++ [taps, outputs]`
    /// (a tap that lands on padding reads 0).
    fn im2col(&mut self, x: &str, lead: &[usize], taps: &[Tap], n_k: usize, n_out: usize) -> Result<String> {
        let n_in: usize = self.shape(x)[lead.len()..].iter().product();
        let xf = self.reshape(x, &[lead, &[n_in]].concat())?;
        let src = if taps.iter().all(|t| matches!(t, Tap::Real(_))) {
            xf
        } else {
            let zero = self.zeros(&[lead, &[1]].concat())?;
            self.op(Op::Concat, &[&xf, &zero], &[("axis", Attr::Int(lead.len() as i64))])?
        };
        let table: Vec<usize> = (0..n_k * n_out)
            .map(|j| match taps[(j % n_out) * n_k + j / n_out] {
                Tap::Real(i) => i,
                _ => n_in,
            })
            .collect();
        let idx = self.index_table(&table, &[n_k, n_out])?;
        self.op(Op::Gather, &[&src, &idx], &[("axis", Attr::Int(lead.len() as i64))])
    }

    /// col2im, im2col's gradient: `d` (`lead ++ [taps, outputs]`) summed back onto the
    /// input positions its taps read, `lead ++ [positions]`. A tap and an input position
    /// fix the output position (if any), so this is a gather with a constant table from
    /// `[taps, positions]` into `d` flattened (an extra zero where no output reads the
    /// position) and a sum over the taps: no scatter, the same order of adds every time.
    fn col2im(&mut self, d: &str, lead: &[usize], taps: &[Tap], n_in: usize) -> Result<String> {
        let (n_k, n_out) = (self.shape(d)[lead.len()], self.shape(d)[lead.len() + 1]);
        let flat = self.reshape(d, &[lead, &[n_k * n_out]].concat())?;
        let zero = self.zeros(&[lead, &[1]].concat())?;
        let src = self.op(Op::Concat, &[&flat, &zero], &[("axis", Attr::Int(lead.len() as i64))])?;
        let mut table = vec![n_k * n_out; n_k * n_in];
        for (j, t) in taps.iter().enumerate() {
            if let Tap::Real(i) = t {
                let (o, k) = (j / n_k, j % n_k);
                table[k * n_in + i] = k * n_out + o;
            }
        }
        let idx = self.index_table(&table, &[n_k, n_in])?;
        let g = self.op(Op::Gather, &[&src, &idx], &[("axis", Attr::Int(lead.len() as i64))])?;
        self.op(Op::ReduceSum, &[&g], &[("axes", ints(&[lead.len()])), ("keepdims", Attr::Bool(false))])
    }

    /// conv's gradients through im2col: with x's channels as `[G, C/G]` and the weight as
    /// `[G, M/G, C/G, taps]`, the input's is col2im of gy contracted with the weight, the
    /// weight's gy contracted with im2col of x (over the batch and the outputs).
    fn conv(&mut self, n: &Node, k: usize, gy: &str) -> Result<String> {
        let (x, w) = (n.inputs[0].as_str(), n.inputs[1].as_str());
        let (xs, ws) = (self.shape(x), self.shape(w));
        let (_, groups) = window::conv_window(n, &xs, &ws).map_err(Error::new)?;
        let (_, sp, out, n_k, taps) = self.window(n)?;
        let (n_in, n_out): (usize, usize) = (sp.iter().product(), out.iter().product());
        let (cg, mg) = (xs[1] / groups, ws[0] / groups);
        let lead = [xs[0], groups, cg];
        let g4 = self.reshape(gy, &[xs[0], groups, mg, n_out])?;
        let eq = |e: &str| [("equation", Attr::Str(e.into()))];
        if k == 0 {
            let w4 = self.reshape(w, &[groups, mg, cg, n_k])?;
            let dcols = self.op(Op::Einsum, &[&g4, &w4], &eq("ngmo,gmck->ngcko"))?;
            let dx = self.col2im(&dcols, &lead, &taps, n_in)?;
            return self.reshape(&dx, &xs);
        }
        let x4 = self.reshape(x, &[&lead[..], &[n_in]].concat())?;
        let cols = self.im2col(&x4, &lead, &taps, n_k, n_out)?;
        let dw = self.op(Op::Einsum, &[&cols, &g4], &eq("ngcko,ngmo->gmck"))?;
        self.reshape(&dw, &ws)
    }

    /// max_pool and avg_pool: gy spread over each window's taps, then col2im. max_pool
    /// gives a window's gradient to its maximum (split evenly among equal maxima, as
    /// reduce_max), avg_pool to every element it averaged, divided by the window's count
    /// (pads counted with count_include_pad, as the forward op).
    fn pool(&mut self, n: &Node, gy: &str) -> Result<String> {
        let x = n.inputs[0].as_str();
        let xs = self.shape(x);
        let (win, sp, out, n_k, taps) = self.window(n)?;
        let (n_in, n_out): (usize, usize) = (sp.iter().product(), out.iter().product());
        let lead = [xs[0], xs[1]];
        let cols_shape = [xs[0], xs[1], n_k, n_out];
        let g4 = self.reshape(gy, &[xs[0], xs[1], 1, n_out])?;
        let dcols = if n.op == Op::MaxPool {
            let cols = self.im2col(x, &lead, &taps, n_k, n_out)?;
            let y4 = self.reshape(&n.name, &[xs[0], xs[1], 1, n_out])?;
            let below = self.greater(&y4, &cols)?;
            let real: Vec<f32> = (0..n_k * n_out)
                .map(|j| f32::from(u8::from(matches!(taps[(j % n_out) * n_k + j / n_out], Tap::Real(_)))))
                .collect();
            let real = self.f32_table(&real, &[n_k, n_out])?;
            let zero = self.constant(0.0)?;
            let ind = self.select(&below, &zero, &real)?;
            let count = self.reduce_keep(Op::ReduceSum, &ind, &[2])?;
            // A window with no real element (all padding) passes nothing, not 0/0.
            let one = self.constant(1.0)?;
            let count = self.bin(Op::Maximum, &count, &one)?;
            let share = self.bin(Op::Div, &ind, &count)?;
            self.bin(Op::Mul, &g4, &share)?
        } else {
            let include_pad = attrs::AvgPool::of(n).count_include_pad;
            let counts: Vec<f32> = (0..n_out).map(|o| win.counted(&sp, &out, o, include_pad).max(1) as f32).collect();
            let counts = self.f32_table(&counts, &[1, 1, 1, n_out])?;
            let share = self.bin(Op::Div, &g4, &counts)?;
            self.op(Op::BroadcastTo, &[&share], &[("shape", ints(&cols_shape))])?
        };
        let dx = self.col2im(&dcols, &lead, &taps, n_in)?;
        self.reshape(&dx, &xs)
    }
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs() {
        assert!(glob("w*", "w1"));
        assert!(glob("*", ""));
        assert!(glob("attn.*.w?", "attn.q.wk"));
        assert!(!glob("attn.*.w?", "attn.q.wkk"));
        assert!(glob("*b*b", "abcbb"));
        assert!(!glob("w1", "w12"));
    }
}
