//! The reference execution of lowered per-device programs: every local op by the reference
//! interpreter, every collective by its plain definition, inputs scattered and outputs
//! gathered by their layouts, a send/recv pair by handing the value over (placed graphs:
//! inputs and outputs on their stage's devices only, by `Lowered::io_stages`). It checks the lowering pass on its own — no code generation,
//! no runner, no threads — and is what the property tests run on random graphs and layouts.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use anyhow::{anyhow, bail, Context, Result};
use meshc_ir::attrs::{self, ReduceKind};
use meshc_ir::verify::{verify, Info};
use meshc_ir::{interp, DType, Data, Op, ParamData, Tensor, TensorType};

use crate::passes::lower::Lowered;
use meshc_runtime::format::mesh::Mesh;

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f(index into a tensor of shape `outer`, index into the block)` for every element
/// of the block `region` of it, in the block's row-major order.
fn for_block(outer: &[usize], region: &[Range<usize>], mut f: impl FnMut(usize, usize)) {
    let st = strides(outer);
    let shape: Vec<usize> = region.iter().map(Range::len).collect();
    let n: usize = shape.iter().product();
    let mut idx = vec![0; shape.len()];
    for k in 0..n {
        f(idx.iter().zip(region).zip(&st).map(|((i, r), s)| (r.start + i) * s).sum(), k);
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The block `region` of a tensor of `shape` and `dtype` whose values are `v`.
fn block(v: &[f64], shape: &[usize], dtype: DType, region: &[Range<usize>]) -> Tensor {
    let mut out = Vec::new();
    for_block(shape, region, |i, _| out.push(v[i]));
    Tensor::new(region.iter().map(Range::len).collect(), Data::from_f64(dtype, out))
}

/// `n` equal blocks of `t` along `axis`.
fn split(t: &Tensor, axis: usize, n: usize) -> Vec<Tensor> {
    let b = t.shape[axis] / n;
    let v = t.data.to_f64();
    (0..n)
        .map(|k| {
            let mut r: Vec<Range<usize>> = t.shape.iter().map(|&s| 0..s).collect();
            r[axis] = k * b..(k + 1) * b;
            block(&v, &t.shape, t.dtype(), &r)
        })
        .collect()
}

fn concat(parts: &[Tensor], axis: usize) -> Tensor {
    let mut shape = parts[0].shape.clone();
    shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
    let mut out = vec![0.0; shape.iter().product()];
    let mut at = 0;
    for p in parts {
        let v = p.data.to_f64();
        let mut r: Vec<Range<usize>> = shape.iter().map(|&s| 0..s).collect();
        r[axis] = at..at + p.shape[axis];
        for_block(&shape, &r, |i, k| out[i] = v[k]);
        at += p.shape[axis];
    }
    Tensor::new(shape, Data::from_f64(parts[0].dtype(), out))
}

fn reduce(parts: &[Tensor], kind: ReduceKind) -> Tensor {
    let vs: Vec<Vec<f64>> = parts.iter().map(|p| p.data.to_f64()).collect();
    let out = (0..vs[0].len()).map(|i| {
        let xs = vs.iter().map(|v| v[i]);
        match kind {
            ReduceKind::Max => xs.fold(f64::NEG_INFINITY, f64::max),
            ReduceKind::Mean => xs.sum::<f64>() / vs.len() as f64,
            ReduceKind::Sum => xs.sum(),
        }
    });
    Tensor::new(parts[0].shape.clone(), Data::from_f64(parts[0].dtype(), out.collect::<Vec<_>>()))
}

/// The results of one collective for every member of a group, from their operands.
fn collective(op: Op, node: &meshc_ir::Node, xs: &[Tensor]) -> Vec<Tensor> {
    let n = xs.len();
    match op {
        Op::AllReduce => vec![reduce(xs, attrs::AllReduce::of(node).reduce); n],
        Op::AllGather => vec![concat(xs, attrs::AllGather::of(node).axis as usize); n],
        Op::ReduceScatter => {
            let a = attrs::ReduceScatter::of(node);
            split(&reduce(xs, a.reduce), a.axis as usize, n)
        }
        Op::AllToAll => {
            let a = attrs::AllToAll::of(node);
            let blocks: Vec<Vec<Tensor>> = xs.iter().map(|x| split(x, a.split_axis as usize, n)).collect();
            (0..n)
                .map(|r| concat(&blocks.iter().map(|b| b[r].clone()).collect::<Vec<_>>(), a.concat_axis as usize))
                .collect()
        }
        _ => unreachable!("not a collective: {op}"),
    }
}

fn group_of(node: &meshc_ir::Node, d: usize) -> Result<Vec<usize>> {
    let groups = node.groups().map_err(anyhow::Error::msg)?;
    groups
        .into_iter()
        .map(|g| g.into_iter().map(|x| x as usize).collect::<Vec<_>>())
        .find(|g| g.contains(&d))
        .ok_or_else(|| anyhow!("node '{}': device {d} is in none of its groups", node.name))
}

/// Runs every device's program; `params` holds the graph's params by name (whole).
pub fn run(
    l: &Lowered,
    params: &HashMap<String, Tensor>,
    inputs: &HashMap<String, Tensor>,
) -> Result<BTreeMap<String, Tensor>> {
    let mesh: &Mesh = &l.mesh;
    let infos: Vec<Info> = l
        .devices
        .iter()
        .enumerate()
        .map(|(d, g)| verify(g).with_context(|| format!("device {d}")))
        .collect::<Result<_>>()?;
    let whole: Vec<(&Tensor, Vec<f64>)> = l
        .inputs
        .iter()
        .map(|(name, _)| {
            let t = inputs.get(name).ok_or_else(|| anyhow!("missing input '{name}'"))?;
            Ok((t, t.data.to_f64()))
        })
        .collect::<Result<_>>()?;
    // The mesh a tensor's layout is over, and the index of device `d` on it.
    let local = |name: &str, d: usize| -> Option<(&Mesh, usize)> {
        match l.io_stages.get(name) {
            None => Some((mesh, d)),
            Some(s) => s.devices.iter().position(|&x| x == d).map(|k| (&s.mesh, k)),
        }
    };
    let mut values: Vec<HashMap<String, Tensor>> = Vec::new();
    for (d, g) in l.devices.iter().enumerate() {
        let mut v = HashMap::new();
        for ((name, layout), (t, f)) in l.inputs.iter().zip(&whole) {
            let b = match local(name, d) {
                Some((m, k)) => block(f, &t.shape, t.dtype(), &m.region(&t.shape, layout, k)),
                None => Tensor::new(vec![0], Data::from_f64(t.dtype(), vec![])),
            };
            v.insert(name.clone(), b);
        }
        // Placeholders of outputs the device does not hold.
        for i in &g.inputs {
            v.entry(i.name.clone())
                .or_insert_with(|| Tensor::new(i.ty.shape.clone(), Data::from_f64(i.ty.dtype, vec![])));
        }
        for p in &g.params {
            let t = match &p.data {
                ParamData::Value(a) => meshc_ir::params::inline_value(p, a)?,
                _ => params.get(&p.name).cloned().ok_or_else(|| anyhow!("missing param '{}'", p.name))?,
            };
            v.insert(p.name.clone(), t);
        }
        values.push(v);
    }
    let mut next = vec![0usize; l.devices.len()];
    // Sent values by key, until received.
    let mut mailbox: HashMap<String, Tensor> = HashMap::new();
    loop {
        let mut progress = false;
        // Run each device up to its next collective (or a recv whose send has not run).
        for (d, g) in l.devices.iter().enumerate() {
            while let Some(&k) = infos[d].order.get(next[d]) {
                let node = &g.nodes[k];
                if node.op == Op::Send {
                    let key = node.transfer_key();
                    let x = values[d][&node.inputs[0]].clone();
                    values[d].insert(node.name.clone(), x.clone());
                    if mailbox.insert(key.clone(), x).is_some() {
                        bail!("device {d}: node '{}': key '{key}' is sent twice", node.name);
                    }
                    next[d] += 1;
                    progress = true;
                    continue;
                }
                if node.op == Op::Recv {
                    let Some(x) = mailbox.remove(&node.transfer_key()) else { break };
                    let want: &TensorType = &infos[d].types[&node.name];
                    if x.ty() != *want {
                        bail!("device {d}: node '{}': received {}, expected {want}", node.name, x.ty());
                    }
                    values[d].insert(node.name.clone(), x);
                    next[d] += 1;
                    progress = true;
                    continue;
                }
                if node.op.is_communication() {
                    break;
                }
                let args: Vec<&Tensor> = node.inputs.iter().map(|i| &values[d][i]).collect();
                let out = interp::eval_node(node, &args, &infos[d].types[&node.name])
                    .with_context(|| format!("device {d}"))?;
                values[d].insert(node.name.clone(), out);
                next[d] += 1;
                progress = true;
            }
        }
        // Complete every collective whose whole group has reached it.
        for d in 0..l.devices.len() {
            let Some(&k) = infos[d].order.get(next[d]) else { continue };
            let node = &l.devices[d].nodes[k];
            if !node.op.is_communication() || matches!(node.op, Op::Send | Op::Recv) {
                continue;
            }
            let group = group_of(node, d)?;
            let at = |m: usize| infos[m].order.get(next[m]).map(|&j| &l.devices[m].nodes[j].name);
            if group[0] != d || group.iter().any(|&m| at(m) != Some(&node.name)) {
                continue;
            }
            let xs: Vec<Tensor> = group.iter().map(|&m| values[m][&node.inputs[0]].clone()).collect();
            let results = collective(node.op, node, &xs);
            for (&m, r) in group.iter().zip(results) {
                let want: &TensorType = &infos[m].types[&node.name];
                if r.ty() != *want {
                    bail!("device {m}: node '{}': collective result is {}, inferred {want}", node.name, r.ty());
                }
                values[m].insert(node.name.clone(), r);
                next[m] += 1;
            }
            progress = true;
        }
        if next.iter().zip(&infos).all(|(&n, i)| n == i.order.len()) {
            break;
        }
        if !progress {
            let stuck: Vec<String> = (0..l.devices.len())
                .filter_map(|d| {
                    infos[d].order.get(next[d]).map(|&k| format!("device {d} at '{}'", l.devices[d].nodes[k].name))
                })
                .collect();
            bail!("the collectives or transfers deadlock: {}", stuck.join(", "));
        }
    }
    let mut outputs = BTreeMap::new();
    for (name, layout) in &l.outputs {
        let first = (0..l.devices.len()).find(|&d| local(name, d).is_some()).unwrap_or(0);
        let local0 = &values[first][name];
        let m0 = local(name, first).map_or(mesh, |(m, _)| m);
        let shape: Vec<usize> =
            local0.shape.iter().zip(layout).map(|(&s, a)| a.map_or(s, |a| s * m0.shards(a))).collect();
        let mut out = vec![0.0; shape.iter().product()];
        for (d, v) in values.iter().enumerate() {
            let Some((m, k)) = local(name, d) else { continue };
            if m.writes_back(layout, k) {
                let local = v[name].data.to_f64();
                for_block(&shape, &m.region(&shape, layout, k), |i, k| out[i] = local[k]);
            }
        }
        outputs.insert(name.clone(), Tensor::new(shape, Data::from_f64(local0.dtype(), out)));
    }
    Ok(outputs)
}
