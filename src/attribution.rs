//! What each communication step the passes insert costs on the mesh: a lowered collective
//! node read as the runtime's `Collective`, and the byte figures of its attribution record
//! (`program::Why`, filled in by `lower` and `sendrecv`) priced by the fabric's own
//! schedules (`traffic::traffic`, `traffic::route`), so that what the compiler says a step costs
//! is what the runner's link counters count.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Context, Result};
use meshc_ir::attrs::{self, ReduceKind};
use meshc_ir::verify::verify;
use meshc_ir::{Graph, Node, Op, TensorType};
use meshc_runtime::comm::traffic;
use meshc_runtime::format::mesh::Mesh;
use meshc_runtime::format::program::{Collective, CollectiveOp, Reduce, Why};

/// The collective a lowered node runs on an operand of local type `operand` (its `id` 0:
/// numbering is the code generator's; so is refusing dtypes the fabric does not carry).
pub fn collective(node: &Node, operand: &TensorType) -> Result<Collective> {
    let axis = |v: i64| -> Result<usize> {
        meshc_ir::infer::norm_axis(v, operand.rank()).map_err(|e| anyhow::anyhow!("node '{}': {e}", node.name))
    };
    let reduce = |r: ReduceKind| {
        Reduce::parse(r.as_str()).with_context(|| format!("node '{}': unknown reduction {r}", node.name))
    };
    let op = match node.op {
        Op::AllReduce => CollectiveOp::AllReduce { reduce: reduce(attrs::AllReduce::of(node).reduce)? },
        Op::AllGather => CollectiveOp::AllGather { axis: axis(attrs::AllGather::of(node).axis)? },
        Op::ReduceScatter => {
            let a = attrs::ReduceScatter::of(node);
            CollectiveOp::ReduceScatter { axis: axis(a.axis)?, reduce: reduce(a.reduce)? }
        }
        Op::AllToAll => {
            let a = attrs::AllToAll::of(node);
            CollectiveOp::AllToAll { split_axis: axis(a.split_axis)?, concat_axis: axis(a.concat_axis)? }
        }
        op => bail!("node '{}': {op} is not supported by the runner yet", node.name),
    };
    let groups: Vec<Vec<usize>> = node
        .groups()
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(|g| g.into_iter().map(|d| d as usize).collect())
        .collect();
    Ok(Collective { op, id: 0, groups, dtype: operand.dtype.name().to_string(), shape: operand.shape.clone() })
}

/// The bytes `step` (a collective or a send of a lowered program whose tensors have the
/// local `types`) puts on each directed link of `mesh`. A recv moves nothing of its own.
pub fn step_traffic(mesh: &Mesh, types: &HashMap<String, TensorType>, step: &Node) -> Result<Vec<(usize, usize, u64)>> {
    let ty = || types.get(&step.inputs[0]).with_context(|| format!("node '{}': an unknown operand", step.name));
    match step.op {
        Op::Send => {
            let ty = ty()?;
            let to = attrs::Send::of(step).to as usize;
            let from = step.device.unwrap_or(0) as usize;
            let bytes = ty.size_bytes() as u64;
            Ok(traffic::route(mesh, from, to).into_iter().map(|(f, t)| (f, t, bytes)).collect())
        }
        op if op.is_communication() && op != Op::Recv => traffic::traffic(mesh, &collective(step, ty()?)?),
        _ => Ok(Vec::new()),
    }
}

/// The key of `n`'s attribution record: a collective's name (alike on every member), or a
/// send's or recv's transfer key (alike on both ends).
pub fn key(n: &Node) -> Option<String> {
    match n.op {
        Op::Send | Op::Recv => Some(n.transfer_key()),
        op if op.is_communication() => Some(n.name.clone()),
        _ => None,
    }
}

/// Fills in the byte figures of the records `why` (by `key`) from the programs `devices` of
/// `mesh`: per step, the most any device sends onto its links and the busiest link.
pub fn price(mesh: &Mesh, devices: &[Graph], why: &mut BTreeMap<String, Why>) -> Result<()> {
    let mut links: HashMap<String, BTreeMap<(usize, usize), u64>> = HashMap::new();
    for (d, g) in devices.iter().enumerate() {
        if !g.nodes.iter().any(|n| key(n).is_some_and(|k| why.contains_key(&k))) {
            continue;
        }
        let info = verify(g).with_context(|| format!("device {d}: the lowered program does not verify"))?;
        for n in &g.nodes {
            let Some(k) = key(n).filter(|k| why.contains_key(k)) else { continue };
            // A collective's traffic is its groups' on every member: count it once.
            if n.op != Op::Send && links.contains_key(&k) {
                continue;
            }
            let per = links.entry(k).or_default();
            for (f, t, b) in step_traffic(mesh, &info.types, n)? {
                *per.entry((f, t)).or_default() += b;
            }
        }
    }
    for (k, w) in why.iter_mut() {
        let per = links.remove(k).unwrap_or_default();
        let mut sent: BTreeMap<usize, u64> = BTreeMap::new();
        for (&(f, _), &b) in &per {
            *sent.entry(f).or_default() += b;
        }
        w.bytes_per_device = sent.values().copied().max().unwrap_or(0);
        w.busiest_link = per.values().copied().max().unwrap_or(0);
    }
    Ok(())
}
