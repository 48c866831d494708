//! Attention fusion, per device, after fold and before the epilogue pass: the chain
//! `matmul(q, kt)` → optionally `mul`/`div` by one number → optionally `add` a mask →
//! `softmax` over the last axis → `matmul(probs, v)` becomes one `attention` node
//! (docs/ops.md), which the runner computes block of query rows by block of query rows
//! without writing the scores to memory (`meshc_runtime::kernels::attention`), where the chain was
//! four steps that each wrote and read back every score (a layer of the bench encoder:
//! 13 ms of its 89).
//!
//! The chain fuses when every value in it up to the probabilities has exactly one use and
//! is no output (the fused node computes them nowhere), nothing in it was folded to a
//! constant, its operands are stored as f32 (no absorbed or converted half weight), q, kt
//! and v are matrices (rank ≥ 2), the scale is one element and the mask broadcasts to the
//! scores without growing them, and there are between 1 and `MAX_KEYS` keys. The fused
//! node takes the name of the second matmul, so its users read it unchanged. Running
//! before the epilogue pass, it sees the scale and the mask as separate nodes whatever the
//! GEMM serving the scores would have been.

use std::collections::HashMap;

use anyhow::{bail, Result};
use meshc_ir::attrs;
use meshc_ir::infer::norm_axis;
use meshc_ir::verify::Info;
use meshc_ir::{Attr, DType, Graph, Node, Op};
use meshc_runtime::kernels::attention::MAX_KEYS;

use super::fold::Folded;

/// One chain found: the members it drops and the fused node replacing the last.
struct Chain {
    members: Vec<usize>,
    node: Node,
}

/// The graph `g` (verified as `info`, its constants `folded`) with every fusable attention
/// chain replaced by one `attention` node; `None` when there is none.
pub fn fuse(g: &Graph, info: &Info, folded: &Folded) -> Option<Graph> {
    let m = Matcher { g, info, folded, reads: super::Reads::new(g) };
    let mut fused: HashMap<usize, Vec<Node>> = HashMap::new();
    let mut dropped = vec![false; g.nodes.len()];
    for &i in &info.order {
        if let Some(chain) = m.chain(i) {
            chain.members.iter().for_each(|&k| dropped[k] = true);
            fused.insert(i, vec![chain.node]);
        }
    }
    super::epilogue::replaced(g, fused, &dropped)
}

struct Matcher<'g> {
    g: &'g Graph,
    info: &'g Info,
    folded: &'g Folded<'g>,
    reads: super::Reads<'g>,
}

impl<'g> Matcher<'g> {
    /// The node computing `name` if it is an intermediate of a chain: computed (not a
    /// constant), read once, no output.
    fn inner(&self, name: &str) -> Option<&'g Node> {
        self.reads.inner(name, self.folded).map(|i| &self.g.nodes[i])
    }

    /// Whether `name` is stored as an f32 tensor of rank at least `rank`.
    fn f32_of_rank(&self, name: &str, rank: usize) -> bool {
        let t = self.folded.stored(name, &self.info.types);
        t.dtype == DType::F32 && t.rank() >= rank
    }

    /// The operand that a scale or mask `name` is to the scores `scores`, if it fits:
    /// f32, broadcasting to them without growing them, one element for a scale.
    fn fits(&self, name: &str, scores: &[usize], scale: bool) -> bool {
        let t = self.folded.stored(name, &self.info.types);
        t.dtype == DType::F32
            && meshc_ir::ops::check_epilogue_operand(&t.shape, scores).is_ok()
            && (!scale || t.numel() == 1)
    }

    /// The fused chain ending in node `i`, if it is the `matmul(probs, v)` of one.
    fn chain(&self, i: usize) -> Option<Chain> {
        let out = &self.g.nodes[i];
        if out.op != Op::MatMul || out.inputs.len() != 2 || !out.attrs.is_empty() || self.folded.has(&out.name) {
            return None;
        }
        let (probs, v) = (&out.inputs[0], &out.inputs[1]);
        let softmax = self.inner(probs).filter(|n| n.op == Op::Softmax && probs != v)?;
        let rank = self.info.types[probs].rank();
        if norm_axis(attrs::Softmax::of(softmax).axis, rank) != Ok(rank - 1) || !self.f32_of_rank(v, 2) {
            return None;
        }
        let mut members = vec![self.reads.producer[probs.as_str()]];
        let mut cur = self.inner(&softmax.inputs[0])?;
        let scores = &self.info.types[&softmax.inputs[0]].shape;
        let keys = scores[scores.len() - 1];
        if !(1..=MAX_KEYS).contains(&keys) {
            return None;
        }
        // Back from the softmax: the mask, then the scale, then the product.
        let mut steps: Vec<(&str, &String)> = Vec::new();
        if cur.op == Op::Add {
            let (a, b) = (&cur.inputs[0], &cur.inputs[1]);
            let towards = |x: &String| self.inner(x).is_some_and(|n| matches!(n.op, Op::MatMul | Op::Mul | Op::Div));
            let (chain, mask) = if towards(a) && self.fits(b, scores, false) { (a, b) } else { (b, a) };
            if !self.fits(mask, scores, false) {
                return None;
            }
            steps.push(("add", mask));
            members.push(self.reads.producer[cur.name.as_str()]);
            cur = self.inner(chain)?;
        }
        if matches!(cur.op, Op::Mul | Op::Div) {
            let (a, b) = (&cur.inputs[0], &cur.inputs[1]);
            let product = |x: &String| self.inner(x).is_some_and(|n| n.op == Op::MatMul);
            let (chain, scale) = match cur.op {
                Op::Mul if product(b) && self.fits(a, scores, true) => (b, a),
                _ => (a, b),
            };
            if !self.fits(scale, scores, true) {
                return None;
            }
            steps.push((cur.op.name(), scale));
            members.push(self.reads.producer[cur.name.as_str()]);
            cur = self.inner(chain)?;
        }
        // The steps do not grow the product: the scores the softmax reads have its shape.
        if cur.op != Op::MatMul
            || cur.inputs.len() != 2
            || !cur.attrs.is_empty()
            || self.info.types[&cur.name].shape != *scores
        {
            return None;
        }
        let (q, kt) = (&cur.inputs[0], &cur.inputs[1]);
        if !self.f32_of_rank(q, 2) || !self.f32_of_rank(kt, 2) {
            return None;
        }
        members.push(self.reads.producer[cur.name.as_str()]);
        steps.reverse();
        let mut node = out.clone();
        node.op = Op::Attention;
        node.inputs = [q, kt, v].into_iter().chain(steps.iter().map(|s| s.1)).cloned().collect();
        node.attrs.clear();
        if !steps.is_empty() {
            let names: Vec<&str> = steps.iter().map(|s| s.0).collect();
            node.attrs.insert("scores".into(), Attr::Str(names.join(",")));
        }
        Some(Chain { members, node })
    }
}

/// Refuses a graph that already holds an `attention` node: the pass makes them, and
/// placement, layout and lowering do not know them.
pub fn refuse_fused(g: &Graph) -> Result<()> {
    if let Some(n) = g.nodes.iter().find(|n| n.op == Op::Attention) {
        bail!(
            "node '{}': compile makes attention nodes itself (--dump-after attention shows them); write matmul, softmax and matmul",
            n.name
        );
    }
    Ok(())
}
