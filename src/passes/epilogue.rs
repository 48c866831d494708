//! Epilogue fusion, per device, after fold: a matmul the library GEMM serves, followed by a
//! chain of elementwise steps — a bias or residual add, a mul or div by a scale, relu, GELU
//! (both forms) — becomes one matmul node that lists the steps in its `epilogue` attribute
//! and takes their operands after `a` and `b` (docs/ops.md). The GEMM applies them to each
//! block of its result right after computing it, while the block is in cache
//! (`meshc_runtime::kernels::epilogue`), where they were separate passes over memory, each its own
//! step with its own fork/join.
//!
//! A chain grows one user at a time (after a result of at least `MIN_COLUMNS` columns): the value so far must have exactly one use, by an
//! elementwise node taking it as its left operand (either operand of add and mul), and be
//! no output; the other operand must broadcast to the matmul's result without growing it.
//! It stops at anything else — a collective included, so the matmul of a split
//! contraction, whose partial sums an all_reduce combines, is never fused with what follows
//! the reduction (a bias must be added once, to the sum). The fused node takes the name of
//! the chain's last node, so its users read it unchanged. The generated matmul kernel
//! (tiny products) takes no epilogue: its chains stay separate steps.
//!
//! An i32 product (the integer GEMM's) takes a chain that starts with its cast to f32 —
//! `to_f32`, then the scales, bias and activation of a dequantization —, applied to each
//! block of its sums as the GEMM finishes it; its result is then f32 and the i32 sums are
//! never written out whole.

use std::collections::HashMap;

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
    let matrix = |name: &str, dtype: DType| info.types[name].dtype == dtype && info.types[name].rank() >= 2;
    // Per fused chain's last node, the fused node; the other members are dropped.
    let mut fused: HashMap<usize, Node> = HashMap::new();
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
        let (mut last, mut steps, mut operands) = (i, Vec::new(), Vec::new());
        loop {
            let cur = g.nodes[last].name.as_str();
            let Some(user) = reads.reader(cur) else { break };
            if reads.is_output(cur) || taken[user] {
                break;
            }
            let u = &g.nodes[user];
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
                    if t.dtype != DType::F32 || meshc_ir::ops::check_epilogue_operand(&t.shape, out).is_err() {
                        break;
                    }
                    operands.push(o.clone());
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
            dropped[last] = true;
            last = user;
        }
        if steps.is_empty() {
            continue;
        }
        for t in [i, last].into_iter().chain((0..g.nodes.len()).filter(|&t| dropped[t])) {
            taken[t] = true;
        }
        let mut node = g.nodes[last].clone();
        node.op = Op::MatMul;
        node.inputs = m.inputs.iter().chain(&operands).cloned().collect();
        node.attrs = [("epilogue".to_string(), Attr::Str(steps.join(",")))].into_iter().collect();
        fused.insert(last, node);
    }
    replaced(g, fused, &dropped)
}

/// `g` with the nodes at the keys of `fused` replaced by its values and the `dropped` ones
/// left out; `None` when nothing is replaced.
pub(super) fn replaced(g: &Graph, mut fused: HashMap<usize, Node>, dropped: &[bool]) -> Option<Graph> {
    if fused.is_empty() {
        return None;
    }
    let nodes = (g.nodes.iter().enumerate())
        .filter(|(i, _)| !dropped[*i])
        .map(|(i, n)| fused.remove(&i).unwrap_or_else(|| n.clone()))
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
