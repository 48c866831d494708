//! The auto placer of the `place` pass: `"placement": {"auto": {"stages": N}}` cuts the
//! graph into N stages over N equal sub-meshes (the mesh cut along its first axis whose size
//! N divides; each stage keeps the spec's rules and layouts over its sub-mesh).
//!
//! Stages are contiguous runs of the graph's topological order (a pipeline: every transfer
//! goes forward). Among all such cuts the placer picks the one that minimises
//!
//!   max over stages of the stage's FLOPs  +  the bytes crossing all cuts
//!
//! (a byte moved between devices is costed like one FLOP: both are about a nanosecond of a
//! core's time at the rates the runner reaches) among the cuts whose every stage fits
//! `memory_per_device`. A stage needs the bytes of every param its nodes read plus the peak
//! of its live activations (tensors it receives or computes, from production to last use;
//! tensors it sends or outputs live to its end), counted whole on each of its devices: exact
//! for stages of one device, an upper bound when layouts split them further. When no cut
//! fits, the error gives the smallest per-device need any cut reaches and by how much it
//! exceeds the budget.
//!
//! Search: for each candidate bound T on a stage's FLOPs (the FLOPs of every contiguous run
//! that can be a stage), a dynamic program over cut positions finds the fitting cut of least
//! crossing bytes with no stage above T; the best T + bytes wins (ties: the earlier T, then
//! the earlier cut). O(n²) candidates × O(N·n²) each, for the graphs of this project (tens
//! of nodes) a few milliseconds.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use meshc_ir::verify::Info;
use meshc_ir::Graph;

use super::stages::{check_layout_names, cost, fill, slice_string, stage_spec, sub_mesh, Placement, Stage};
use crate::layout::{Auto, Spec};

/// Per contiguous run [i, j) of the topological order: FLOPs, bytes received, memory.
struct Runs {
    flops: Vec<Vec<u64>>,
    crossing: Vec<Vec<u64>>,
    memory: Vec<Vec<u64>>,
}

fn runs(g: &Graph, info: &Info, order: &[usize]) -> Runs {
    let n = order.len();
    let node = |p: usize| &g.nodes[order[p]];
    let pos: BTreeMap<&str, usize> = (0..n).map(|p| (node(p).name.as_str(), p)).collect();
    let is_param = |t: &str| g.params.iter().any(|p| p.name == t);
    let bytes = |t: &str| info.types[t].size_bytes() as u64;
    // Where a tensor becomes available: a node at its position, an input at its first use.
    let born = |t: &str| -> usize {
        pos.get(t).copied().unwrap_or_else(|| (0..n).find(|&p| node(p).inputs.iter().any(|i| i == t)).unwrap_or(0))
    };
    let outputs: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut r = Runs {
        flops: vec![vec![0; n + 1]; n + 1],
        crossing: vec![vec![0; n + 1]; n + 1],
        memory: vec![vec![0; n + 1]; n + 1],
    };
    for i in 0..n {
        let mut flops = 0;
        for j in i + 1..=n {
            flops += cost(g, info, order[j - 1]).flops;
            r.flops[i][j] = flops;
            // Tensors the run reads but does not compute: graph inputs and earlier results.
            let mut arriving: Vec<&str> = Vec::new();
            let mut params: Vec<&str> = Vec::new();
            for p in i..j {
                for t in &node(p).inputs {
                    if is_param(t) {
                        if !params.contains(&t.as_str()) {
                            params.push(t);
                        }
                    } else if pos.get(t.as_str()).is_none_or(|&q| q < i) && !arriving.contains(&t.as_str()) {
                        arriving.push(t);
                    }
                }
            }
            r.crossing[i][j] = arriving.iter().filter(|t| born(t) < i).map(|t| bytes(t)).sum();
            // Live activations at each step of the run.
            let last_use = |t: &str| -> usize {
                let needed_after = (j..n).any(|p| node(p).inputs.iter().any(|x| x == t)) || outputs.contains(&t);
                if needed_after {
                    return j;
                }
                (i..j).filter(|&p| node(p).inputs.iter().any(|x| x == t)).max().unwrap_or(i)
            };
            let mut peak = 0;
            for at in i..j {
                let mut live: u64 = arriving.iter().filter(|t| last_use(t) >= at).map(|t| bytes(t)).sum();
                for p in i..=at {
                    let t = node(p).name.as_str();
                    if last_use(t).max(p) >= at {
                        live += bytes(t);
                    }
                }
                peak = peak.max(live);
            }
            r.memory[i][j] = params.iter().map(|t| bytes(t)).sum::<u64>() + peak;
        }
    }
    r
}

/// The cut of least crossing bytes into `k` runs with no run above `bound` FLOPs or
/// `budget` bytes: the positions where stages 1.. start, and the bytes.
fn best_cut(r: &Runs, n: usize, k: usize, bound: u64, budget: u64) -> Option<(Vec<usize>, u64)> {
    // best[s][j]: (bytes, previous cut) for the first j nodes in s runs.
    let mut best: Vec<Vec<Option<(u64, usize)>>> = vec![vec![None; n + 1]; k + 1];
    best[0][0] = Some((0, 0));
    for s in 1..=k {
        for j in s..=n {
            for i in s - 1..j {
                let Some((b, _)) = best[s - 1][i] else { continue };
                if r.flops[i][j] > bound || r.memory[i][j] > budget {
                    continue;
                }
                let total = b + r.crossing[i][j];
                if best[s][j].is_none_or(|(x, _)| total < x) {
                    best[s][j] = Some((total, i));
                }
            }
        }
    }
    let (bytes, _) = best[k][n]?;
    let mut cuts = Vec::new();
    let mut j = n;
    for s in (1..=k).rev() {
        let (_, i) = best[s][j].expect("on the path");
        if s > 1 {
            cuts.push(i);
        }
        j = i;
    }
    cuts.reverse();
    Some((cuts, bytes))
}

/// The least, over all cuts into `k` runs, of the largest run's memory.
fn least_memory(r: &Runs, n: usize, k: usize) -> u64 {
    let mut best = vec![vec![u64::MAX; n + 1]; k + 1];
    best[0][0] = 0;
    for s in 1..=k {
        for j in s..=n {
            for i in s - 1..j {
                if best[s - 1][i] != u64::MAX {
                    best[s][j] = best[s][j].min(best[s - 1][i].max(r.memory[i][j]));
                }
            }
        }
    }
    best[k][n]
}

/// The nodes some output needs, in topological order.
fn live(g: &Graph, info: &Info) -> Vec<usize> {
    let mut needed: std::collections::BTreeSet<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    for &k in info.order.iter().rev() {
        if needed.contains(g.nodes[k].name.as_str()) {
            needed.extend(g.nodes[k].inputs.iter().map(String::as_str));
        }
    }
    info.order.iter().copied().filter(|&k| needed.contains(g.nodes[k].name.as_str())).collect()
}

pub fn auto(g: &Graph, info: &Info, spec: &Spec, auto: &Auto) -> Result<Placement> {
    let err = |msg: String| anyhow!("{}: placement: auto: {msg}", spec.file);
    let k = usize::try_from(auto.stages)
        .ok()
        .filter(|&k| k >= 1)
        .ok_or_else(|| err("\"stages\" must be a positive number".into()))?;
    // The cut is of the nodes an output needs: a node nothing reads would make a stage of
    // its own that sends nothing on (`live`); such nodes join their operands' stage after.
    let order = live(g, info);
    let n = order.len();
    if k > n {
        return Err(err(format!("{k} stages for a graph of {n} nodes (each stage needs one)")));
    }
    let m = &spec.mesh;
    let axis = (0..m.shape.len())
        .find(|&a| m.shape[a].is_multiple_of(k))
        .ok_or_else(|| err(format!("no axis of the mesh {:?} divides into {k} equal sub-meshes", m.shape)))?;
    let r = runs(g, info, &order);
    let budget = spec.memory_per_device.unwrap_or(u64::MAX);
    let mut bounds: Vec<u64> =
        (0..n).flat_map(|i| (i + 1..=n).map(move |j| (i, j))).map(|(i, j)| r.flops[i][j]).collect();
    bounds.sort();
    bounds.dedup();
    let mut chosen: Option<(u64, Vec<usize>)> = None;
    for &t in &bounds {
        if chosen.as_ref().is_some_and(|(best, _)| t >= *best) {
            break;
        }
        if let Some((cuts, bytes)) = best_cut(&r, n, k, t, budget) {
            let score = t + bytes;
            if chosen.as_ref().is_none_or(|(best, _)| score < *best) {
                chosen = Some((score, cuts));
            }
        }
    }
    let Some((_, cuts)) = chosen else {
        let need = least_memory(&r, n, k);
        bail!(
            "{}: memory_per_device {budget} bytes: the graph does not fit in {k} stage(s): the best cut needs {need} \
             bytes on a device, {} bytes more than the budget",
            spec.file,
            need - budget
        );
    };
    let block = m.shape[axis] / k;
    let mut stages = Vec::new();
    for s in 0..k {
        let mut ranges: Vec<std::ops::Range<usize>> = m.shape.iter().map(|&x| 0..x).collect();
        ranges[axis] = s * block..(s + 1) * block;
        let sm = sub_mesh(m, &ranges);
        let st_spec = stage_spec(spec, &sm.mesh, None)?;
        stages.push(Stage { slice: slice_string(&ranges), mesh: sm, spec: st_spec });
    }
    let mut stage_of = BTreeMap::new();
    for (p, &k) in order.iter().enumerate() {
        let s = cuts.iter().filter(|&&c| c <= p).count();
        stage_of.insert(g.nodes[k].name.clone(), s);
    }
    for &k in &info.order {
        let n = &g.nodes[k];
        if !stage_of.contains_key(&n.name) {
            let s = n.inputs.iter().filter_map(|i| stage_of.get(i)).max().copied().unwrap_or(0);
            stage_of.insert(n.name.clone(), s);
        }
    }
    check_layout_names(g, info, spec)?;
    fill(g, info, &mut stage_of);
    Ok(Placement { stages, stage_of, unrolled: None })
}
