//! What a placement is made of, shared by the explicit placer (`super`), the auto placer
//! (`super::auto`) and micro-batching: stages (a sub-mesh and the spec that applies on
//! it), the placement itself, the cost model of the module doc of `super`, and the
//! helpers that turn mesh slices into stages.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use anyhow::{anyhow, bail, Result};
use meshc_ir::verify::{verify, Info};
use meshc_ir::{Graph, Input, Output};

use crate::layout::{is_pattern, resolve_layouts, resolve_rules, Entry, Seed, Spec};
use meshc_runtime::format::mesh::{Mesh, Topology};
use meshc_runtime::format::program::StageMesh;

/// The most micro-batches accepted: the graph is unrolled once per micro-batch.
pub const MAX_MICROBATCHES: u64 = 1024;

/// A stage: a sub-mesh, how it was written, and the layout spec that applies on it.
#[derive(Clone, Debug)]
pub struct Stage {
    pub mesh: StageMesh,
    /// The slice of the mesh, as `"0:1,*"`.
    pub slice: String,
    /// The rules and layouts of the stage, over its sub-mesh.
    pub spec: Spec,
}

/// The result of the pass.
#[derive(Clone, Debug)]
pub struct Placement {
    pub stages: Vec<Stage>,
    /// The stage of every graph input and node (of `unrolled` when there is one).
    pub stage_of: BTreeMap<String, usize>,
    /// With micro-batches: the graph unrolled into one copy per micro-batch
    /// (`microbatch`), which the later passes compile instead of the graph.
    pub unrolled: Option<(Graph, Info)>,
}

/// A node's estimated cost (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub flops: u64,
    pub bytes: u64,
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.flops += o.flops;
        self.bytes += o.bytes;
    }
}

/// The cost of node `k` of `g`.
pub fn cost(g: &Graph, info: &Info, k: usize) -> Cost {
    let n = &g.nodes[k];
    let params: u64 = n
        .inputs
        .iter()
        .filter(|i| g.params.iter().any(|p| &p.name == *i))
        .map(|i| info.types[i].size_bytes() as u64)
        .sum();
    Cost { flops: meshc_ir::cost::node_flops(n, info), bytes: info.types[&n.name].size_bytes() as u64 + params }
}

/// Every explicit layout names a tensor of the graph (stages see only their own tensors,
/// so a typo would otherwise go unnoticed).
pub fn check_layout_names(g: &Graph, info: &Info, spec: &Spec) -> Result<()> {
    let (_, unmatched) = spec.expand_patterns(g).map_err(|m| anyhow!("{}: {m}", spec.file))?;
    if let Some(p) = unmatched.first() {
        bail!("{}: layout of '{p}': the pattern matches no tensor of graph '{}'", spec.file, g.name);
    }
    match spec.layouts.keys().find(|t| !is_pattern(t) && !info.types.contains_key(*t)) {
        Some(t) => {
            let hint = meshc_ir::suggest::did_you_mean(t, info.types.keys().map(String::as_str));
            bail!("{}: layout of '{t}': graph '{}' has no tensor '{t}'{hint}", spec.file, g.name)
        }
        None => Ok(()),
    }
}

/// Gives every graph input without a stage the stage of its first consumer.
pub fn fill(g: &Graph, info: &Info, stage_of: &mut BTreeMap<String, usize>) {
    for i in &g.inputs {
        if !stage_of.contains_key(&i.name) {
            let first = info.order.iter().map(|&k| &g.nodes[k]).find(|n| n.inputs.contains(&i.name));
            stage_of.insert(i.name.clone(), first.map_or(0, |n| stage_of[&n.name]));
        }
    }
}

/// `*` matches any run of characters; everything else itself. Linear in the pattern times
/// the name (a pattern of many stars must not take exponential time).
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // ok[j]: the pattern so far matches the first j characters of the name.
    let mut ok = vec![false; n.len() + 1];
    ok[0] = true;
    for &c in &p {
        if c == '*' {
            for j in 1..=n.len() {
                ok[j] |= ok[j - 1];
            }
        } else {
            for j in (1..=n.len()).rev() {
                ok[j] = ok[j - 1] && n[j - 1] == c;
            }
            ok[0] = false;
        }
    }
    ok[n.len()]
}

/// Parses `"0:1,*"`: per axis `*`, `k` or `a:b` (b excluded).
pub fn parse_slice(mesh: &Mesh, s: &str) -> Result<Vec<Range<usize>>, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() != mesh.shape.len() {
        return Err(format!(
            "{} parts for a mesh of rank {} (one per axis: *, k or a:b)",
            parts.len(),
            mesh.shape.len()
        ));
    }
    parts
        .iter()
        .zip(&mesh.shape)
        .zip(&mesh.axes)
        .map(|((p, &n), axis)| {
            let num = |t: &str, default: usize| -> Result<usize, String> {
                if t.is_empty() {
                    Ok(default)
                } else {
                    t.parse().map_err(|_| format!("'{p}' is not *, k or a:b"))
                }
            };
            let r = match p.split_once(':') {
                _ if *p == "*" => 0..n,
                Some((a, b)) => num(a, 0)?..num(b, n)?,
                None => {
                    let k = num(p, usize::MAX)?;
                    k..k.saturating_add(1)
                }
            };
            if r.start >= r.end || r.end > n {
                return Err(format!("'{p}' is not a non-empty range of axis '{axis}' (size {n})"));
            }
            Ok(r)
        })
        .collect()
}

pub fn slice_string(ranges: &[Range<usize>]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|r| if r.len() == 1 { r.start.to_string() } else { format!("{}:{}", r.start, r.end) })
        .collect();
    parts.join(",")
}

/// The sub-mesh of `mesh` over coordinates `ranges`: the same axes, their sizes the ranges'
/// lengths; a torus axis taken whole stays a torus (the runner routes over the whole mesh
/// anyway, this only names the sub-mesh).
pub fn sub_mesh(mesh: &Mesh, ranges: &[Range<usize>]) -> StageMesh {
    let shape: Vec<usize> = ranges.iter().map(Range::len).collect();
    let whole = ranges.iter().zip(&mesh.shape).all(|(r, &n)| r.len() == n || r.len() == 1);
    let topology = if whole { mesh.topology } else { Topology::Mesh };
    let sub = Mesh { shape: shape.clone(), axes: mesh.axes.clone(), topology };
    let devices = (0..sub.devices())
        .map(|k| {
            let c: Vec<usize> = sub.coords(k).iter().zip(ranges).map(|(c, r)| r.start + c).collect();
            mesh.device(&c)
        })
        .collect();
    StageMesh { mesh: sub, devices }
}

/// The spec of a stage: the spec's rules and layouts over the stage's mesh, or, when its
/// `entry` gives either, the entry's own (what it leaves out is empty, not the spec's).
pub fn stage_spec(spec: &Spec, mesh: &Mesh, entry: Option<&Entry>) -> Result<Spec> {
    let mut s = Spec { mesh: mesh.clone(), placement: None, ..spec.clone() };
    if let Some(e) = entry.filter(|e| e.layouts.is_some() || e.rules.is_some()) {
        let own = |e: meshc_ir::Error| anyhow!("{e}");
        s.layouts = e.layouts.as_ref().map_or(Ok(BTreeMap::new()), |l| resolve_layouts(mesh, l)).map_err(own)?;
        s.rules = e.rules.as_ref().map_or(Ok(Vec::new()), |r| resolve_rules(mesh, r)).map_err(own)?;
    }
    Ok(s)
}

impl Stage {
    /// The layouts the stage's spec fixes for the tensors of its graph `sg`: its explicit
    /// layouts and rules that concern them (others concern other stages).
    pub fn seeds(&self, sg: &Graph, si: &Info) -> Result<BTreeMap<String, Seed>> {
        let mut spec = self.spec.clone();
        // A pattern may match tensors of other stages only: the whole graph checks that it
        // matches some (`check_layout_names`).
        spec.layouts = spec.expand_patterns(sg).map_err(|m| anyhow!("{}: {m}", spec.file))?.0;
        spec.layouts.retain(|t, _| si.types.contains_key(t));
        spec.rules.retain(|(dim, _)| si.dims.values().flatten().any(|d| d.as_deref() == Some(dim.as_str())));
        spec.seed_layouts(sg, si).map_err(|e| anyhow!("{e}"))
    }
}

impl Placement {
    /// The tensors produced in one stage and read in another, in graph order, with their
    /// producing stage and the stages that read them.
    pub fn crossings(&self, g: &Graph, info: &Info) -> Vec<(String, usize, Vec<usize>)> {
        let names = g.inputs.iter().map(|i| &i.name).chain(info.order.iter().map(|&k| &g.nodes[k].name));
        names
            .filter_map(|t| {
                let from = self.stage_of[t];
                let mut to: Vec<usize> = g
                    .nodes
                    .iter()
                    .filter(|n| n.inputs.contains(t) && self.stage_of[&n.name] != from)
                    .map(|n| self.stage_of[&n.name])
                    .collect();
                to.sort();
                to.dedup();
                (!to.is_empty()).then(|| (t.clone(), from, to))
            })
            .collect()
    }

    /// The part of `g` stage `s` runs: its nodes in graph order; as inputs the graph inputs it
    /// holds and the tensors other stages send it; the params its nodes read; as outputs the
    /// graph outputs it computes and the tensors it sends. Verified.
    pub fn stage_graph(&self, g: &Graph, info: &Info, s: usize) -> Result<(Graph, Info)> {
        let here = |t: &String| self.stage_of.get(t) == Some(&s);
        let nodes: Vec<_> = info.order.iter().map(|&k| g.nodes[k].clone()).filter(|n| here(&n.name)).collect();
        let read: BTreeSet<&String> = nodes.iter().flat_map(|n| &n.inputs).collect();
        let mut sub = Graph { name: g.name.clone(), ..Graph::default() };
        let global_inputs = g.inputs.iter().filter(|i| here(&i.name)).map(|i| i.name.clone());
        let mut arriving: Vec<String> =
            read.iter().filter(|t| self.stage_of.get(**t).is_some_and(|&o| o != s)).map(|t| t.to_string()).collect();
        arriving.sort_by_key(|t| position(g, info, t));
        for t in global_inputs.chain(arriving) {
            sub.inputs.push(Input {
                name: t.clone(),
                ty: info.types[&t].clone(),
                dims: info.dims.get(&t).cloned(),
                loc: None,
            });
        }
        sub.params = g.params.iter().filter(|p| read.contains(&p.name)).cloned().collect();
        let mut outputs: Vec<String> = g.outputs.iter().map(|o| o.name.clone()).filter(|o| here(o)).collect();
        for (t, from, _) in self.crossings(g, info) {
            if from == s && !outputs.contains(&t) {
                outputs.push(t);
            }
        }
        sub.outputs = outputs.into_iter().map(Output::new).collect();
        sub.nodes = nodes;
        if sub.outputs.is_empty() {
            bail!("stage {s} ({}) computes nothing any other stage or output needs", self.stages[s].slice);
        }
        let sinfo = verify(&sub).map_err(|e| anyhow!("stage {s}: {e}"))?;
        Ok((sub, sinfo))
    }
}

/// Where tensor `t` comes in graph order: inputs first, then nodes in topological order.
pub fn position(g: &Graph, info: &Info, t: &str) -> usize {
    g.inputs.iter().position(|i| i.name == t).unwrap_or_else(|| {
        g.inputs.len() + info.order.iter().position(|&k| g.nodes[k].name == t).unwrap_or(usize::MAX - g.inputs.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices() {
        let m = Mesh::numbered(&[2, 4], Topology::Torus);
        assert_eq!(parse_slice(&m, "0:1,*"), Ok(vec![0..1, 0..4]));
        assert_eq!(parse_slice(&m, "1, 2:"), Ok(vec![1..2, 2..4]));
        assert_eq!(parse_slice(&m, ":, :2"), Ok(vec![0..2, 0..2]));
        assert!(parse_slice(&m, "0").unwrap_err().contains("1 parts for a mesh of rank 2"));
        assert!(parse_slice(&m, "2,*").unwrap_err().contains("'2' is not a non-empty range of axis 'a0' (size 2)"));
        assert!(parse_slice(&m, "1:1,*").unwrap_err().contains("not a non-empty range"));
        assert!(parse_slice(&m, "x,*").unwrap_err().contains("'x' is not *, k or a:b"));
        let s = sub_mesh(&m, &[1..2, 1..3]);
        assert_eq!((s.mesh.shape.clone(), s.devices.clone()), (vec![1, 2], vec![5, 6]));
        assert_eq!(s.mesh.topology, Topology::Mesh);
        assert_eq!(sub_mesh(&m, &[0..1, 0..4]).mesh.topology, Topology::Torus);
        assert_eq!(slice_string(&[0..1, 0..4]), "0,0:4");
    }

    #[test]
    fn globs() {
        assert!(glob("f*", "f1_b"));
        assert!(glob("*_b", "f1_b"));
        assert!(glob("q*b", "q_b"));
        assert!(!glob("q*b", "q_r"));
        assert!(glob("*", ""));
        assert!(!glob("k", "k_b"));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "aXbYbZ"));
        assert!(!glob(&"*a".repeat(40), &"a".repeat(39)), "many stars stay fast");
    }
}
