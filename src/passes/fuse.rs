//! Fusion, per device: elementwise chains whose inner results have no other use join the
//! group of their consumer, and each group becomes one step (one loop over the elements,
//! `codegen::elementwise::fused`). Folded constants are weights their consumers read, not
//! code to fuse.
//!
//! A chain of one-operand f32 ops (`PROLOGUE_OPS`) that only an f32 reduction reads joins
//! the reduction too, as its prologue: applied to each element as it is loaded
//! (`codegen::reduce`), so `reduce_max(abs(x))` — an int8 quantization's row range — reads
//! `x` once and writes nothing but the result. Over symbolic dims a reduction may run as
//! the runner's library call, which has no prologue: there the chain stays a step.

use std::collections::HashMap;
use std::fmt::Write as _;

use meshc_ir::verify::Info;
use meshc_ir::{DType, Graph, Op};

use super::fold::Folded;

/// The groups of one device's program.
pub struct Groups {
    /// Per node (by index), the root of its group: the node whose result the group computes.
    pub root: Vec<usize>,
    /// The roots in program order: one step each.
    pub roots: Vec<usize>,
}

impl Groups {
    /// The members of the group rooted at `r`, in program order.
    pub fn members(&self, info: &Info, r: usize) -> Vec<usize> {
        info.order.iter().copied().filter(|&i| self.root[i] == r).collect()
    }
}

/// The one-operand ops a reduction applies to its elements as it loads them.
pub const PROLOGUE_OPS: &[Op] = &[
    Op::Abs,
    Op::Neg,
    Op::Exp,
    Op::Log,
    Op::Sqrt,
    Op::Rsqrt,
    Op::Tanh,
    Op::Erf,
    Op::Sigmoid,
    Op::Relu,
    Op::Floor,
    Op::Ceil,
    Op::Round,
];

/// The fusion groups of `g` (verified as `info`), whose constants are `folded`; with
/// `prologues`, reductions take the one-operand chains only they read.
pub fn fuse(g: &Graph, info: &Info, folded: &Folded, prologues: bool) -> Groups {
    let index: HashMap<&str, usize> = g.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for inp in &n.inputs {
            if let Some(&p) = index.get(inp.as_str()) {
                if !users[p].contains(&i) {
                    users[p].push(i);
                }
            }
        }
    }
    let is_output: Vec<bool> = g.nodes.iter().map(|n| g.outputs.iter().any(|o| o.name == n.name)).collect();
    let mut root: Vec<usize> = (0..g.nodes.len()).collect();
    // Reverse topological order: a consumer's group is settled before its producers join it.
    for &i in info.order.iter().rev() {
        let n = &g.nodes[i];
        if !n.op.is_elementwise() || n.op.is_communication() || folded.has(&n.name) {
            continue;
        }
        let fusable = !is_output[i] && users[i].len() == 1 && g.nodes[users[i][0]].op.is_elementwise();
        if fusable {
            root[i] = root[users[i][0]];
        }
    }
    for &i in info.order.iter().filter(|_| prologues) {
        let n = &g.nodes[i];
        let f32_of = |t: &str| info.types[t].dtype == DType::F32;
        if !matches!(n.op, Op::ReduceSum | Op::ReduceMean | Op::ReduceMax) || !f32_of(&n.inputs[0]) {
            continue;
        }
        let Some(&p) = index.get(n.inputs[0].as_str()) else { continue };
        let group: Vec<usize> = (0..g.nodes.len()).filter(|&k| root[k] == p).collect();
        let chain = group.iter().all(|&k| {
            let m = &g.nodes[k];
            PROLOGUE_OPS.contains(&m.op) && m.attrs.is_empty() && f32_of(&m.name) && f32_of(&m.inputs[0])
        });
        if chain && !is_output[p] && users[p].len() == 1 && !folded.has(&g.nodes[p].name) {
            group.iter().for_each(|&k| root[k] = i);
        }
    }
    let roots = info.order.iter().copied().filter(|&i| root[i] == i).collect();
    Groups { root, roots }
}

/// The `--dump-after fuse` text: per device, every group of more than one node, by its
/// root, with its members in program order.
pub fn dump(devices: &[(usize, &Graph, &Info, &Groups)]) -> String {
    let mut s = String::new();
    for &(d, g, info, groups) in devices {
        let fused: Vec<Vec<usize>> =
            groups.roots.iter().map(|&r| groups.members(info, r)).filter(|m| m.len() > 1).collect();
        let _ = writeln!(s, "device {d}: {} fused group(s)", fused.len());
        for m in fused {
            let names: Vec<&str> = m.iter().map(|&i| g.nodes[i].name.as_str()).collect();
            let _ = writeln!(s, "  {} <- {}", names[names.len() - 1], names.join(", "));
        }
    }
    s
}
