//! GELU recognition, per device, after fold: the elementwise chains that exporters write
//! for GELU become one `gelu` node, which the epilogue pass can then fold into the matmul
//! before it, where the chain was five to eight passes over the matmul's result (torch
//! exports `nn.GELU` and transformers' activations as arithmetic: BERT's encoders, GPT-2).
//!
//! Two forms, each a product of `x`, one half and `1 + f` (in any order and grouping of the
//! two multiplications, `0.5·x` included):
//! - erf: `f = erf(x / √2)` (or `erf(x · 1/√2)`), `gelu(x)`;
//! - tanh: `f = tanh(√(2/π) · (x + 0.044715 · x³))`, `x³` as `pow(x, 3)` or `x · x · x`,
//!   `gelu(x) {approximate = "tanh"}`.
//!
//! Each constant is one f32 element within `TOLERANCE` of its value (exporters round them
//! differently). Every value inside the chain must have exactly its one use in it and be
//! no output; `x` may have other uses. The `gelu` node takes the name of the chain's last
//! node. When `x` is a `reshape` read by the chain alone, as GPT-2's `c_fc` writes it
//! (`reshape(addmm(..))`), the gelu is taken of the reshape's operand and the reshape
//! follows it: then nothing stands between the matmul and its activation.

use std::collections::{HashMap, HashSet};

use meshc_ir::verify::Info;
use meshc_ir::{Attr, DType, Graph, Node, Op};

use super::fold::Folded;

/// Relative difference allowed between a constant and the value the form needs.
const TOLERANCE: f64 = 1e-5;

/// A chain found: its members (dropped) and what replaces its last node.
struct Chain {
    members: Vec<usize>,
    last: usize,
    nodes: Vec<Node>,
}

/// The graph `g` (verified as `info`, its constants `folded`) with every GELU chain
/// replaced by one `gelu` node; `None` when there is none.
pub fn recognise(g: &Graph, info: &Info, folded: &Folded) -> Option<Graph> {
    let mut used = super::names(g);
    let m = Matcher { g, info, folded, reads: super::Reads::new(g) };
    let mut taken = vec![false; g.nodes.len()];
    let mut chains = Vec::new();
    for &i in &info.order {
        let op = g.nodes[i].op;
        if op != Op::Erf && op != Op::Tanh {
            continue;
        }
        if let Some(c) = m.chain(i, &mut used) {
            if c.members.iter().all(|&k| !taken[k]) {
                c.members.iter().for_each(|&k| taken[k] = true);
                chains.push(c);
            }
        }
    }
    if chains.is_empty() {
        return None;
    }
    let mut replacing: HashMap<usize, Vec<Node>> = chains.into_iter().map(|c| (c.last, c.nodes)).collect();
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for (i, n) in g.nodes.iter().enumerate() {
        match replacing.remove(&i) {
            Some(new) => nodes.extend(new),
            None if !taken[i] => nodes.push(n.clone()),
            None => {}
        }
    }
    Some(Graph { nodes, ..g.clone() })
}

struct Matcher<'g> {
    g: &'g Graph,
    info: &'g Info,
    folded: &'g Folded<'g>,
    reads: super::Reads<'g>,
}

impl<'g> Matcher<'g> {
    /// The node computing `name` when it is a member a chain may drop.
    fn inner(&self, name: &str) -> Option<usize> {
        self.reads.inner(name, self.folded)
    }

    /// Whether `name` is a one-element f32 constant within `TOLERANCE` of `want`.
    fn is(&self, name: &str, want: f64) -> bool {
        let t = &self.info.types[name];
        if t.dtype != DType::F32 || t.numel() != 1 || !self.folded.has(name) {
            return false;
        }
        let Ok(v) = self.folded.value(self.g, name) else { return false };
        v.as_f32().is_some_and(|v| (f64::from(v[0]) - want).abs() <= TOLERANCE * want.abs())
    }

    /// The operands of node `i` if it is `op`, in both orders for a commutative one.
    fn operands(&self, i: usize, op: Op) -> Vec<(&'g str, &'g str)> {
        let n = &self.g.nodes[i];
        if n.op != op || n.inputs.len() != 2 {
            return Vec::new();
        }
        let (a, b) = (n.inputs[0].as_str(), n.inputs[1].as_str());
        match op {
            Op::Add | Op::Mul => vec![(a, b), (b, a)],
            _ => vec![(a, b)],
        }
    }

    /// `x` and the members when `name` is `x / √2` or `x · (1/√2)`.
    fn erf_argument(&self, name: &str) -> Option<(&'g str, Vec<usize>)> {
        let d = self.inner(name)?;
        let div = self.operands(d, Op::Div).into_iter().find(|&(_, c)| self.is(c, std::f64::consts::SQRT_2));
        let mul = || self.operands(d, Op::Mul).into_iter().find(|&(_, c)| self.is(c, std::f64::consts::FRAC_1_SQRT_2));
        let (x, _) = div.or_else(mul)?;
        Some((x, vec![d]))
    }

    /// `x` and the members when `name` is `√(2/π) · (x + 0.044715 · x³)`.
    fn tanh_argument(&self, name: &str) -> Option<(&'g str, Vec<usize>)> {
        let scale = (2.0 / std::f64::consts::PI).sqrt();
        let m2 = self.inner(name)?;
        let (sum, _) = self.operands(m2, Op::Mul).into_iter().find(|&(_, c)| self.is(c, scale))?;
        let s = self.inner(sum)?;
        for (x, term) in self.operands(s, Op::Add) {
            let Some(m1) = self.inner(term) else { continue };
            let Some((cube, _)) = self.operands(m1, Op::Mul).into_iter().find(|&(_, c)| self.is(c, 0.044715)) else {
                continue;
            };
            if let Some(mut members) = self.cube(cube, x) {
                members.extend([m2, s, m1]);
                return Some((x, members));
            }
        }
        None
    }

    /// The members when `name` is `x³`: `pow(x, 3)` or `x · x · x`.
    fn cube(&self, name: &str, x: &str) -> Option<Vec<usize>> {
        let c = self.inner(name)?;
        if self.operands(c, Op::Pow).into_iter().any(|(b, e)| b == x && self.is(e, 3.0)) {
            return Some(vec![c]);
        }
        let (sq, _) = self.operands(c, Op::Mul).into_iter().find(|&(_, y)| y == x)?;
        let s = self.inner(sq)?;
        self.operands(s, Op::Mul).into_iter().any(|(a, b)| a == x && b == x).then(|| vec![c, s])
    }

    /// The last node and the members when `one_plus` (`1 + f`, read once) is multiplied by
    /// `x` and one half, in either order and grouping.
    fn product(&self, one_plus: &str, x: &str) -> Option<(usize, Vec<usize>)> {
        let m1 = self.reads.reader(one_plus)?;
        for (_, y) in self.operands(m1, Op::Mul).into_iter().filter(|&(a, _)| a == one_plus) {
            let half = |i: usize, other: &str| {
                self.operands(i, Op::Mul).into_iter().any(|(a, c)| a == other && self.is(c, 0.5))
            };
            let then = |by: &dyn Fn(&str) -> bool| -> Option<(usize, Vec<usize>)> {
                let m = self.g.nodes[m1].name.as_str();
                self.inner(m)?;
                let o = self.reads.reader(m)?;
                self.operands(o, Op::Mul).into_iter().any(|(a, b)| a == m && by(b)).then(|| (o, vec![m1]))
            };
            // (1 + f)·x, then ·0.5.
            if y == x {
                if let Some(found) = then(&|b| self.is(b, 0.5)) {
                    return Some(found);
                }
            }
            // (1 + f)·0.5, then ·x.
            if self.is(y, 0.5) {
                if let Some(found) = then(&|b| b == x) {
                    return Some(found);
                }
            }
            // (1 + f)·(0.5·x).
            if let Some(p) = self.inner(y).filter(|&p| half(p, x)) {
                return Some((m1, vec![p]));
            }
        }
        None
    }

    /// The chain around the `erf` or `tanh` node `i`.
    fn chain(&self, i: usize, used: &mut HashSet<String>) -> Option<Chain> {
        let f = &self.g.nodes[i];
        let (x, mut members) = match f.op {
            Op::Erf => self.erf_argument(&f.inputs[0])?,
            _ => self.tanh_argument(&f.inputs[0])?,
        };
        if self.info.types[x].dtype != DType::F32 {
            return None;
        }
        self.inner(&f.name)?;
        let a = self.reads.reader(&f.name)?;
        self.operands(a, Op::Add).into_iter().find(|&(y, c)| y == f.name && self.is(c, 1.0))?;
        self.inner(&self.g.nodes[a].name)?;
        let (last, more) = self.product(&self.g.nodes[a].name, x)?;
        // A constant of higher rank than x broadcasts the chain's result beyond x's shape,
        // which gelu(x) keeps.
        if self.info.types[&self.g.nodes[last].name].shape != self.info.types[x].shape {
            return None;
        }
        members.extend([i, a, last]);
        members.extend(more);

        let out = &self.g.nodes[last];
        let mut gelu = Node { name: out.name.clone(), op: Op::Gelu, inputs: vec![x.to_string()], ..out.clone() };
        gelu.attrs.clear();
        if f.op == Op::Tanh {
            gelu.attrs.insert("approximate".into(), Attr::Str("tanh".into()));
        }
        // Before a reshape that only the chain reads, so the activation follows what
        // produced the reshape's operand.
        let reads = |k: &usize| self.g.nodes[*k].inputs.iter().filter(|y| *y == x).count();
        let in_chain = members.iter().map(reads).sum::<usize>();
        let reshape = (self.reads.producer.get(x).copied())
            .filter(|&r| self.g.nodes[r].op == Op::Reshape && self.reads.count(x) == in_chain)
            .filter(|_| !self.reads.is_output(x) && !self.folded.has(x));
        let nodes = match reshape {
            None => vec![gelu],
            Some(r) => {
                let rn = &self.g.nodes[r];
                let name = super::fresh(used, &rn.inputs[0], "gelu");
                used.insert(name.clone());
                let y = rn.inputs[0].clone();
                let inner =
                    Node { name: name.clone(), inputs: vec![y], dtype: None, shape: None, dims: None, ..gelu.clone() };
                // The reshape's declared dims name what inference cannot (a split product).
                let after = Node {
                    name: out.name.clone(),
                    inputs: vec![name],
                    dtype: rn.dtype.or(out.dtype),
                    shape: rn.shape.clone().or_else(|| out.shape.clone()),
                    dims: rn.dims.clone().or_else(|| out.dims.clone()),
                    ..rn.clone()
                };
                members.push(r);
                vec![inner, after]
            }
        };
        Some(Chain { members, last, nodes })
    }
}
