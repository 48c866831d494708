//! Micro-batching for the `place` pass (GPipe-style pipelining, `"microbatches": M` in the
//! placement): the graph is unrolled into M copies, each on one M-th of the batch, so that
//! the stages work on different micro-batches at once.
//!
//! The batch is the dimension named `batch` (dim names, docs/design.md §3, inferred for every
//! tensor): every input and node must carry it, with a size M divides, and no node may mix
//! the batch (reduce, normalize, scan, slice, concatenate or gather along it, or pair one
//! operand's batch with another's). Copy k of node `n` is `n.mbK` on the k-th block of the
//! batch; inputs are sliced (`x.mbK`, placed with `x`) and each output is concatenated back
//! under its own name (placed with it). Params are shared.
//! Nodes are listed micro-batch by micro-batch, so each stage runs its part of micro-batch
//! 0, sends it on, runs its part of micro-batch 1, ... — the GPipe schedule, which the
//! global order of the `sendrecv` pass keeps.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use meshc_ir::attrs;
use meshc_ir::infer::norm_axis;
use meshc_ir::verify::{verify, Info};
use meshc_ir::{binary_ops, ternary_ops, unary_ops, Attr, Graph, Node, Op};

use crate::passes::layout::corresponding_dims;

/// The dim named `batch` of tensor `t`, if any.
fn batch_dim(info: &Info, t: &str) -> Option<usize> {
    info.dims.get(t)?.iter().position(|d| d.as_deref() == Some("batch"))
}

/// Whether `n` combines elements of its operand `i` along dim `d` although
/// `corresponding_dims` pairs `d` with a result dim: the normalizations, whose result along
/// their axes depends on the whole of it. Every other op's pairs already leave out the dims
/// it combines along (reduced, contracted, scanned, gathered, sliced, concatenated, padded).
fn combines_along(n: &Node, i: usize, d: usize, info: &Info) -> bool {
    let rank = info.types[&n.inputs[i]].shape.len();
    match n.op {
        Op::Softmax => norm_axis(attrs::Softmax::of(n).axis, rank).ok() == Some(d),
        // Scale and bias (operands 1, 2) are applied element by element.
        Op::LayerNorm => i == 0 && norm_axis(attrs::LayerNorm::of(n).axis, rank).is_ok_and(|a| d >= a),
        unary_ops!() | binary_ops!() | ternary_ops!() => false,
        Op::MatMul | Op::Einsum | Op::Attention => false,
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => false,
        Op::Reshape | Op::Transpose | Op::BroadcastTo | Op::BroadcastLike | Op::Concat | Op::Slice | Op::Gather => {
            false
        }
        Op::ScatterElements | Op::Pad | Op::Conv | Op::MaxPool | Op::AvgPool | Op::CumSum => false,
        Op::DynamicSlice | Op::DynamicUpdateSlice | Op::Iota => false,
        Op::Send | Op::Recv | Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::AllToAll => false,
    }
}

fn copy_name(t: &str, k: usize) -> String {
    format!("{t}.mb{k}")
}

/// Unrolls `g` into `m` micro-batches; `stage_of` (of `g`'s inputs and nodes) is extended
/// to the new nodes. Returns the unrolled graph, verified.
pub fn unroll(g: &Graph, info: &Info, m: usize, stage_of: &mut BTreeMap<String, usize>) -> Result<(Graph, Info)> {
    let is_param = |t: &str| g.params.iter().any(|p| p.name == t);
    let batch = |t: &str| -> Result<usize> {
        let d = batch_dim(info, t).ok_or_else(|| {
            anyhow!(
                "microbatches: '{t}' has no dimension named 'batch' (micro-batching splits the batch of every tensor)"
            )
        })?;
        let n = info.types[t].shape[d];
        if !n.is_multiple_of(m) {
            bail!("microbatches: the batch of '{t}' (size {n}) does not divide into {m} micro-batches");
        }
        Ok(d)
    };
    let mut out =
        Graph { name: g.name.clone(), inputs: g.inputs.clone(), params: g.params.clone(), ..Graph::default() };
    for i in &g.inputs {
        let d = batch(&i.name)?;
        let block = i.ty.shape[d] / m;
        for k in 0..m {
            let mut s = Node::new(copy_name(&i.name, k), Op::Slice, &[i.name.as_str()]);
            s.attrs.insert("axes".into(), Attr::List(vec![Attr::Int(d as i64)]));
            s.attrs.insert("starts".into(), Attr::List(vec![Attr::Int((k * block) as i64)]));
            s.attrs.insert("ends".into(), Attr::List(vec![Attr::Int(((k + 1) * block) as i64)]));
            stage_of.insert(s.name.clone(), stage_of[&i.name]);
            out.nodes.push(s);
        }
    }
    for &idx in &info.order {
        let n = &g.nodes[idx];
        let out_batch = batch(&n.name)?;
        for (i, t) in n.inputs.iter().enumerate().filter(|(_, t)| !is_param(t)) {
            let b = batch(t)?;
            // Copy k reads block k of every operand's batch and writes block k of the
            // result's: sound only when the operand's batch is the result's batch, dim for
            // dim, and the op does not combine elements along it.
            if !corresponding_dims(n, i, info).contains(&(b, out_batch)) || combines_along(n, i, b, info) {
                bail!("microbatches: node '{}' ({}) works across the batch", n.name, n.op);
            }
        }
    }
    for k in 0..m {
        for &idx in &info.order {
            let n = &g.nodes[idx];
            let mut c = n.clone();
            c.name = copy_name(&n.name, k);
            c.shape = None;
            c.loc = None;
            for i in &mut c.inputs {
                if !is_param(i) {
                    *i = copy_name(i, k);
                }
            }
            if matches!(n.op, Op::Reshape | Op::BroadcastTo) {
                let d = batch_dim(info, &n.name).expect("checked");
                let mut a = attrs::Shape::of(n);
                if let Some(x) = a.shape.get_mut(d).filter(|x| **x != -1) {
                    *x /= m as i64;
                }
                c.attrs = a.to_attrs();
            }
            stage_of.insert(c.name.clone(), stage_of[&n.name]);
            out.nodes.push(c);
        }
    }
    for o in &g.outputs {
        if is_param(&o.name) || g.inputs.iter().any(|i| i.name == o.name) {
            bail!("microbatches: output '{}' is not computed by a node", o.name);
        }
        let d = batch(&o.name)?;
        let parts: Vec<String> = (0..m).map(|k| copy_name(&o.name, k)).collect();
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let mut c = Node::new(o.name.clone(), Op::Concat, &refs);
        c.attrs.insert("axis".into(), Attr::Int(d as i64));
        out.nodes.push(c);
    }
    out.outputs = g.outputs.clone();
    // The originals are gone: their names now denote the concatenated outputs (placed with
    // the originals) or nothing.
    for n in &g.nodes {
        if !g.outputs.iter().any(|o| o.name == n.name) {
            stage_of.remove(&n.name);
        }
    }
    let uinfo = verify(&out).map_err(|e| anyhow!("microbatches: the unrolled graph does not verify: {e}"))?;
    Ok((out, uinfo))
}
