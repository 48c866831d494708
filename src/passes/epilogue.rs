//! Epilogue fusion, per device, after fold: a matmul the library GEMM serves, followed by a
//! chain of elementwise steps — a bias or residual add, a mul or div by a scale, relu, GELU
//! (both forms), SiLU (`mul(x, sigmoid(x))`, as exporters write it) — becomes one matmul node that lists the steps in its `epilogue` attribute
//! and takes their operands after `a` and `b` (docs/ops.md). The GEMM applies them to each
//! block of its result right after computing it, while the block is in cache
//! (`meshc_runtime::kernels::epilogue`), where they were separate passes over memory, each its own
//! step with its own fork/join.
//!
//! A chain grows one user at a time (after a result of at least `MIN_COLUMNS` columns): the value so far must have exactly one use, by an
//! elementwise node taking it as its left operand (either operand of add and mul), and be
//! no output (or, for SiLU, be read by exactly its sigmoid and the mul, the sigmoid by the
//! mul alone); the other operand must broadcast to the matmul's result without growing it.
//! The chain also goes on through a reshape: a conv's GEMM product `[N, G, M/G, outputs]`
//! is reshaped into its `[N, M, spatial]` result before its bias, activation and residual.
//! An operand after a reshape is viewed in the product's shape (a reshape of it), which
//! takes one that varies along a run of dims whose bounds fall on the product's dims (a
//! per-channel bias, a residual of the result's shape, a scalar).
//! It stops at anything else — a collective included, so the matmul of a split
//! contraction, whose partial sums an all_reduce combines, is never fused with what follows
//! the reduction (a bias must be added once, to the sum). The fused node takes the name of
//! the chain's last node, so its users read it unchanged (after a reshape of it when the
//! chain went through one: the fused node is then `LAST.epilogue`). The generated matmul kernel
//! (tiny products) takes no epilogue: its chains stay separate steps.
//!
//! An i32 product (the integer GEMM's) takes a chain that starts with its cast to f32 —
//! `to_f32`, then the scales, bias and activation of a dequantization —, applied to each
//! block of its sums as the GEMM finishes it; its result is then f32 and the i32 sums are
//! never written out whole.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Result};
use meshc_ir::verify::Info;
use meshc_ir::{Attr, DType, Graph, Node, Op};

use super::fold::Folded;

/// Columns a result needs for its chain to join the matmul: the epilogue runs step by step
/// over each row of a block, so short rows pay its per-row overhead on few elements. (The
/// 2 × 13 encoder's attention scores, 24 products with rows of 13: with their scale and
/// mask fused, a call took 27.6 µs against 8.3 µs without, on a busy machine, where the
/// separate loop over their 4 K elements takes a few µs; `cargo bench --bench models`.)
pub const MIN_COLUMNS: usize = 32;

/// The graph `g` (verified as `info`, its constants `folded`) with every fusable chain
/// after a matmul for which `library` holds folded into that matmul; `None` when there is
/// none.
pub fn fuse(g: &Graph, info: &Info, folded: &Folded, library: impl Fn(&Node) -> bool) -> Option<Graph> {
    let reads = super::Reads::new(g);
    let mut used = super::names(g);
    let matrix = |name: &str, dtype: DType| info.types[name].dtype == dtype && info.types[name].rank() >= 2;
    // Per fused chain's last node, the nodes replacing it; the other members are dropped.
    let mut fused: HashMap<usize, Vec<Node>> = HashMap::new();
    let mut dropped = vec![false; g.nodes.len()];
    // The members of the chains so far: a node joins one chain at most (`add(mm1, mm2)`
    // follows both matmuls, and only the first takes it).
    let mut taken = vec![false; g.nodes.len()];
    for &i in &info.order {
        let m = &g.nodes[i];
        if m.op != Op::MatMul || m.inputs.len() != 2 || folded.has(&m.name) {
            continue;
        }
        // The integer GEMM serves every i32 product.
        let integer = m.inputs.iter().all(|x| matrix(x, DType::I32));
        if !integer && (!m.inputs.iter().all(|x| matrix(x, DType::F32)) || !library(m)) {
            continue;
        }
        let out = &info.types[&m.name].shape;
        if out[out.len() - 1] < MIN_COLUMNS {
            continue;
        }
        // The chain so far: its last node, steps, operands (each with the shape it is
        // viewed as in the product's shape, when a reshape came before its step) and the
        // nodes it drops.
        let (mut last, mut steps, mut operands, mut members) = (i, Vec::new(), Vec::new(), Vec::new());
        // The chain as of its last step: reshapes after it stay as they are.
        let mut kept = (i, 0);
        loop {
            let cur = g.nodes[last].name.as_str();
            if reads.is_output(cur) {
                break;
            }
            if let Some((sigmoid, user)) = silu(g, &reads, cur).filter(|&(s, u)| !taken[s] && !taken[u]) {
                if integer && steps.is_empty() {
                    break;
                }
                steps.push("silu");
                members.extend([last, sigmoid]);
                last = user;
                kept = (last, members.len());
                continue;
            }
            let Some(user) = reads.reader(cur) else { break };
            if taken[user] {
                break;
            }
            let u = &g.nodes[user];
            // A reshape (a conv's product back to its [N, M, spatial] result) keeps the
            // elements where they are: the chain goes on through it, and the fused node is
            // reshaped after.
            if u.op == Op::Reshape && u.inputs.len() == 1 {
                members.push(last);
                last = user;
                continue;
            }
            let other = |k: usize| &u.inputs[k];
            // An i32 product's chain starts with its conversion to f32.
            let converts = integer && u.op == Op::Cast && meshc_ir::attrs::Cast::of(u).to == DType::F32;
            if integer && steps.is_empty() != converts {
                break;
            }
            let step = match u.op {
                Op::Cast if converts => None,
                Op::Add | Op::Mul if u.inputs[0] == cur && u.inputs[1] != cur => Some((other(1), u.op)),
                Op::Add | Op::Mul if u.inputs[1] == cur && u.inputs[0] != cur => Some((other(0), u.op)),
                Op::Div if u.inputs[0] == cur && u.inputs[1] != cur => Some((other(1), u.op)),
                Op::Relu | Op::Gelu => None,
                _ => break,
            };
            let name = match (u.op, step) {
                (_, Some((o, op))) => {
                    let t = &info.types[o];
                    let at = &info.types[cur].shape;
                    let viewed = match at == out {
                        true => Some(None),
                        false => viewed_as(&t.shape, at, out).map(Some),
                    };
                    let Some(viewed) = viewed else { break };
                    let shape = viewed.as_ref().unwrap_or(&t.shape);
                    if t.dtype != DType::F32 || meshc_ir::ops::check_epilogue_operand(shape, out).is_err() {
                        break;
                    }
                    operands.push((o.clone(), viewed));
                    op.name()
                }
                (Op::Cast, _) => "to_f32",
                (Op::Relu, _) => "relu",
                _ => match meshc_ir::attrs::Gelu::of(u).approximate {
                    meshc_ir::attrs::GeluApprox::Tanh => "gelu_tanh",
                    meshc_ir::attrs::GeluApprox::None => "gelu",
                },
            };
            steps.push(name);
            members.push(last);
            last = user;
            kept = (last, members.len());
        }
        if steps.is_empty() {
            continue;
        }
        (last, _) = kept;
        members.truncate(kept.1);
        for &t in &members {
            dropped[t] = true;
        }
        for t in [i, last].into_iter().chain((0..g.nodes.len()).filter(|&t| dropped[t])) {
            taken[t] = true;
        }
        let chain = Chain { inputs: &m.inputs, operands: &operands, steps: &steps, out };
        fused.insert(last, chain.nodes(&g.nodes[last], &info.types[&g.nodes[last].name].shape, &mut used));
    }
    replaced(g, fused, &dropped)
}

/// A chain to fuse: the matmul's `inputs`, the `steps` and their `operands` (each with
/// the shape it is viewed as, if any), the product's shape `out`.
struct Chain<'c> {
    inputs: &'c [String],
    operands: &'c [(String, Option<Vec<usize>>)],
    steps: &'c [&'c str],
    out: &'c [usize],
}

impl Chain<'_> {
    /// The nodes replacing the chain that ends in `last` (of shape `shape`): the operands'
    /// views, and the matmul, named `last` when its product has `last`'s shape, else
    /// reshaped into it by a node named `last`.
    fn nodes(&self, last: &Node, shape: &[usize], used: &mut HashSet<String>) -> Vec<Node> {
        let reshape = |name: &str, x: &str, shape: &[usize]| {
            let mut n = Node::new(name.to_string(), Op::Reshape, &[x]);
            n.attrs.insert("shape".into(), Attr::List(shape.iter().map(|&d| Attr::Int(d as i64)).collect()));
            n.device = last.device;
            n
        };
        let mut fresh = |base: &str, what: &str| {
            let name = super::fresh(used, base, what);
            used.insert(name.clone());
            name
        };
        let mut nodes = Vec::new();
        let mut node = last.clone();
        node.op = Op::MatMul;
        node.inputs = self.inputs.to_vec();
        for (o, viewed) in self.operands {
            match viewed {
                None => node.inputs.push(o.clone()),
                Some(s) => {
                    let view = reshape(&fresh(o, "view"), o, s);
                    node.inputs.push(view.name.clone());
                    nodes.push(view);
                }
            }
        }
        node.attrs = [("epilogue".to_string(), Attr::Str(self.steps.join(",")))].into_iter().collect();
        if shape == self.out {
            nodes.push(node);
            return nodes;
        }
        let mut back = last.clone();
        node.name = fresh(&last.name, "epilogue");
        (node.shape, node.dims) = (None, None);
        (back.op, back.inputs, back.attrs) = (Op::Reshape, vec![node.name.clone()], reshape("", "", shape).attrs);
        nodes.push(node);
        nodes.push(back);
        nodes
    }
}

/// The shape an operand of shape `operand`, broadcast to `at`, has when `at` is viewed as
/// `out` (same elements, another shape): the operand must vary along one run of `at`'s dims
/// (dense there, broadcast elsewhere) whose bounds fall on dim boundaries of `out`; `None`
/// otherwise. Its value at a flat index f is then its element (f / inner) mod block, inner
/// and block products of dims that both shapes have.
fn viewed_as(operand: &[usize], at: &[usize], out: &[usize]) -> Option<Vec<usize>> {
    // (An empty result has no dim boundaries to tell apart by their products.)
    if operand.len() > at.len() || at.contains(&0) {
        return None;
    }
    let padded: Vec<usize> = std::iter::repeat_n(1, at.len() - operand.len()).chain(operand.iter().copied()).collect();
    let varies: Vec<usize> = (0..at.len()).filter(|&d| padded[d] != 1).collect();
    let (lo, hi) = match (varies.first(), varies.last()) {
        (Some(&i), Some(&j)) => (i, j + 1),
        _ => return Some(Vec::new()),
    };
    if (lo..hi).any(|d| padded[d] != at[d]) {
        return None;
    }
    let before: usize = at[..lo].iter().product();
    let through: usize = at[..hi].iter().product();
    let prefix = |n: usize| (0..=out.len()).find(|&k| out[..k].iter().product::<usize>() == n);
    let (k, l) = (prefix(before)?, prefix(through)?);
    (k <= l).then(|| out[k..l].iter().copied().chain(std::iter::repeat_n(1, out.len() - l)).collect())
}

/// The sigmoid and the mul of `mul(x, sigmoid(x))` (either operand order) when they are
/// `x`'s only readers and the mul the sigmoid's only one.
fn silu(g: &Graph, reads: &super::Reads, x: &str) -> Option<(usize, usize)> {
    let &[a, b] = reads.readers.get(x)?.as_slice() else { return None };
    let (s, m) = [(a, b), (b, a)].into_iter().find(|&(s, _)| g.nodes[s].op == Op::Sigmoid)?;
    let (sig, mul) = (g.nodes[s].name.as_str(), &g.nodes[m]);
    let operands = [mul.inputs[0].as_str(), mul.inputs.get(1).map_or("", String::as_str)];
    let reads_both = mul.op == Op::Mul && (operands == [x, sig] || operands == [sig, x]);
    (reads_both && reads.reader(sig) == Some(m) && !reads.is_output(sig)).then_some((s, m))
}

/// `g` with the nodes at the keys of `fused` replaced by its values and the `dropped` ones
/// left out; `None` when nothing is replaced.
pub(super) fn replaced(g: &Graph, mut fused: HashMap<usize, Vec<Node>>, dropped: &[bool]) -> Option<Graph> {
    if fused.is_empty() {
        return None;
    }
    let nodes = (g.nodes.iter().enumerate())
        .filter(|(i, _)| !dropped[*i])
        .flat_map(|(i, n)| fused.remove(&i).unwrap_or_else(|| vec![n.clone()]))
        .collect();
    Some(Graph { nodes, ..g.clone() })
}

/// Refuses a graph that already holds a matmul with an epilogue or a zero point: the
/// passes make them from the elementwise ops, and placement, layout and lowering know
/// matmuls of two operands.
pub fn refuse_fused(g: &Graph) -> Result<()> {
    for n in g.nodes.iter().filter(|n| n.op == Op::MatMul) {
        let a = meshc_ir::attrs::MatMul::of(n);
        let (what, pass) = match (a.epilogue.is_some(), a.a_zero_point) {
            (true, _) => ("epilogues", "epilogue"),
            (_, true) => ("zero points", "zero_point"),
            _ => continue,
        };
        bail!(
            "node '{}': compile makes matmul {what} itself (--dump-after {pass} shows them); write the elementwise ops instead",
            n.name
        );
    }
    Ok(())
}
