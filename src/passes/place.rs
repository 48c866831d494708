//! The `place` pass (docs/design.md §4.1): every node of the graph gets a stage — a device or a
//! sub-mesh of the device mesh — from the spec's `placement` (docs/layout.md):
//! - a list of entries `{"nodes": [NAME or PATTERN...], "devices": SLICE}` places the named
//!   nodes (and graph inputs; `*` in a name matches any run of characters) on a sub-mesh:
//!   SLICE has one part per mesh axis, each `*` (the whole axis), `k` (one coordinate) or
//!   `a:b` (coordinates a..b, b excluded; either bound may be left out), e.g. `"0:1,*"`; a
//!   number instead of a string names one device. An entry may carry its own `layouts` and
//!   `rules`, which replace the spec's for that stage. Entries with the same devices form one
//!   stage; stages may share devices (a device then runs the nodes of each of its stages, in
//!   graph order). Nodes no entry names run on the whole mesh (the default: docs/design.md §4.1); a
//!   graph input joins the stage of its first consumer. Params are not placed: every stage
//!   that reads a param holds its own copy (params are mapped weights, colocated with their
//!   consumers).
//! - `{"auto": {"stages": N}}` cuts the graph into N stages over N equal sub-meshes
//!   (`auto`).
//!
//! Within a stage the tensors get layouts over its sub-mesh and are lowered there (passes
//! `layout` and `lower`, run once per stage on `stage_graph`); the `sendrecv` pass then joins
//! the stages with transfers.
//!
//! The cost model (`cost`), shared with the auto placer and the dump: a node costs its FLOPs
//! (`compile::node_flops`: 2 per multiply-add, about one per element otherwise) and the
//! bytes it writes plus the bytes of the params it reads; a cut costs the bytes of every
//! tensor that crosses it (once per tensor and consuming stage).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::ops::Range;

use anyhow::{anyhow, bail, Result};
use meshc_ir::verify::{verify, Info};
use meshc_ir::{Graph, Input, Output};
use serde_json::Value;

use crate::layout::{Seed, Spec, FORMAT};
use meshc_runtime::mesh::{Mesh, Topology};
use meshc_runtime::program::StageMesh;

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
    /// (`place_microbatch`), which the later passes compile instead of the graph.
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
    Cost { flops: crate::compile::node_flops(n, info), bytes: info.types[&n.name].size_bytes() as u64 + params }
}

/// Runs the pass; `None` when the spec places nothing (the whole mesh runs every node).
pub fn place(g: &Graph, info: &Info, spec: &Spec) -> Result<Option<Placement>> {
    let Some(p) = &spec.placement else { return Ok(None) };
    let err = |msg: String| anyhow!("{}: placement: {msg}", spec.file);
    let microbatches = match p.get("microbatches") {
        None => 1,
        Some(v) => v.as_u64().filter(|m| (1..=MAX_MICROBATCHES).contains(m)).ok_or_else(|| {
            err(format!("\"microbatches\": {v} is not a number of micro-batches (1 to {MAX_MICROBATCHES})"))
        })? as usize,
    };
    let mut placement = match p.get("auto") {
        Some(auto) => super::place_auto::auto(g, info, spec, auto)?,
        None => explicit(g, info, spec, p.get("stages").unwrap_or(p))?,
    };
    if microbatches > 1 {
        placement.unrolled = Some(
            super::place_microbatch::unroll(g, info, microbatches, &mut placement.stage_of)
                .map_err(|e| err(e.to_string()))?,
        );
    }
    Ok(Some(placement))
}

/// The placement of a list of entries (see the module doc).
fn explicit(g: &Graph, info: &Info, spec: &Spec, p: &Value) -> Result<Placement> {
    let err = |msg: String| anyhow!("{}: placement: {msg}", spec.file);
    let entries = p.as_array().ok_or_else(|| err("expected a list of entries".into()))?;
    let mut stages: Vec<Stage> = Vec::new();
    let mut stage_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut entry_of: BTreeMap<String, usize> = BTreeMap::new();
    for (e, entry) in entries.iter().enumerate() {
        let at = |msg: String| err(format!("entry {}: {msg}", e + 1));
        let obj = entry.as_object().ok_or_else(|| at("expected {\"nodes\": [...], \"devices\": ...}".into()))?;
        if let Some(k) = obj.keys().find(|k| !["nodes", "devices", "layouts", "rules"].contains(&k.as_str())) {
            return Err(at(format!("unknown key \"{k}\" (keys: nodes, devices, layouts, rules)")));
        }
        let ranges = match obj.get("devices") {
            Some(Value::String(s)) => parse_slice(&spec.mesh, s).map_err(|m| at(format!("devices \"{s}\": {m}")))?,
            Some(Value::Number(n)) => {
                let d = n.as_u64().map(|d| d as usize).filter(|&d| d < spec.mesh.devices()).ok_or_else(|| {
                    at(format!("device {n} does not exist (the mesh has {} devices)", spec.mesh.devices()))
                })?;
                spec.mesh.coords(d).into_iter().map(|c| c..c + 1).collect()
            }
            _ => return Err(at("\"devices\" must be a mesh slice such as \"0:1,*\" or a device number".into())),
        };
        let sm = sub_mesh(&spec.mesh, &ranges);
        let overrides = (obj.get("layouts"), obj.get("rules"));
        let s = match stages.iter().position(|s| s.mesh.devices == sm.devices) {
            Some(s) if overrides != (None, None) => {
                return Err(at(format!("layouts or rules for stage {} are given by an earlier entry already", s)));
            }
            Some(s) => s,
            None => {
                let spec = stage_spec(spec, &sm.mesh, overrides).map_err(|m| at(m.to_string()))?;
                stages.push(Stage { slice: slice_string(&ranges), mesh: sm, spec });
                stages.len() - 1
            }
        };
        let names = obj
            .get("nodes")
            .and_then(Value::as_array)
            .ok_or_else(|| at("\"nodes\" must be a list of node names or patterns".into()))?;
        for name in names {
            let name = name.as_str().ok_or_else(|| at(format!("{name} is not a node name")))?;
            let matches: Vec<&String> = if name.contains('*') {
                let all = g.inputs.iter().map(|i| &i.name).chain(g.nodes.iter().map(|n| &n.name));
                all.filter(|n| glob(name, n)).collect()
            } else if g.params.iter().any(|p| p.name == name) {
                return Err(at(format!("'{name}' is a param; params are placed with the nodes that read them")));
            } else {
                g.inputs.iter().map(|i| &i.name).chain(g.nodes.iter().map(|n| &n.name)).filter(|n| *n == name).collect()
            };
            if matches.is_empty() {
                return Err(at(format!("graph '{}' has no node or input '{name}'", g.name)));
            }
            for m in matches {
                if let Some(&first) = entry_of.get(m) {
                    if first != e {
                        return Err(at(format!("'{m}' is placed by entry {} already", first + 1)));
                    }
                }
                entry_of.insert(m.clone(), e);
                stage_of.insert(m.clone(), s);
            }
        }
    }
    if stages.is_empty() {
        return Err(err("the list is empty (leave \"placement\" out to run every node on the whole mesh)".into()));
    }
    // What no entry names runs on the whole mesh, by the spec's own rules and layouts.
    if g.nodes.iter().any(|n| !stage_of.contains_key(&n.name)) {
        let whole: Vec<Range<usize>> = spec.mesh.shape.iter().map(|&n| 0..n).collect();
        let sm = sub_mesh(&spec.mesh, &whole);
        let s = match stages.iter().position(|s| s.mesh.devices == sm.devices) {
            Some(s) => s,
            None => {
                let st_spec = stage_spec(spec, &sm.mesh, (None, None))?;
                stages.push(Stage { slice: slice_string(&whole), mesh: sm, spec: st_spec });
                stages.len() - 1
            }
        };
        for n in &g.nodes {
            stage_of.entry(n.name.clone()).or_insert(s);
        }
    }
    check_layout_names(g, info, spec)?;
    fill(g, info, &mut stage_of);
    Ok(Placement { stages, stage_of, unrolled: None })
}

/// Every explicit layout names a tensor of the graph (stages see only their own tensors,
/// so a typo would otherwise go unnoticed).
pub(crate) fn check_layout_names(g: &Graph, info: &Info, spec: &Spec) -> Result<()> {
    match spec.layouts.keys().find(|t| !info.types.contains_key(*t)) {
        Some(t) => bail!("{}: layout of '{t}': graph '{}' has no tensor '{t}'", spec.file, g.name),
        None => Ok(()),
    }
}

/// Gives every graph input without a stage the stage of its first consumer.
pub(crate) fn fill(g: &Graph, info: &Info, stage_of: &mut BTreeMap<String, usize>) {
    for i in &g.inputs {
        if !stage_of.contains_key(&i.name) {
            let first = info.order.iter().map(|&k| &g.nodes[k]).find(|n| n.inputs.contains(&i.name));
            stage_of.insert(i.name.clone(), first.map_or(0, |n| stage_of[&n.name]));
        }
    }
}

/// `*` matches any run of characters; everything else itself. Linear in the pattern times
/// the name (a pattern of many stars must not take exponential time).
fn glob(pattern: &str, name: &str) -> bool {
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

pub(crate) fn slice_string(ranges: &[Range<usize>]) -> String {
    let parts: Vec<String> = ranges
        .iter()
        .map(|r| if r.len() == 1 { r.start.to_string() } else { format!("{}:{}", r.start, r.end) })
        .collect();
    parts.join(",")
}

/// The sub-mesh of `mesh` over coordinates `ranges`: the same axes, their sizes the ranges'
/// lengths; a torus axis taken whole stays a torus (the runner routes over the whole mesh
/// anyway, this only names the sub-mesh).
pub(crate) fn sub_mesh(mesh: &Mesh, ranges: &[Range<usize>]) -> StageMesh {
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

/// The spec of a stage: the spec's rules and layouts over the stage's mesh, or the entry's
/// own (`layouts` and `rules` as in a spec, resolved by the spec's parser).
pub(crate) fn stage_spec(spec: &Spec, mesh: &Mesh, overrides: (Option<&Value>, Option<&Value>)) -> Result<Spec> {
    let mut s = Spec { mesh: mesh.clone(), placement: None, ..spec.clone() };
    if overrides != (None, None) {
        let mut raw = serde_json::json!({
            "format": FORMAT,
            "mesh": {"shape": mesh.shape, "axes": mesh.axes},
        });
        if let Some(l) = overrides.0 {
            raw["layouts"] = l.clone();
        }
        if let Some(r) = overrides.1 {
            raw["rules"] = r.clone();
        }
        let parsed = crate::layout::parse(&raw.to_string(), &spec.file).map_err(|e| anyhow!("{e}"))?;
        s.layouts = parsed.layouts;
        s.rules = parsed.rules;
    }
    Ok(s)
}

impl Stage {
    /// The layouts the stage's spec fixes for the tensors of its graph `sg`: its explicit
    /// layouts and rules that concern them (others concern other stages).
    pub fn seeds(&self, sg: &Graph, si: &Info) -> Result<BTreeMap<String, Seed>> {
        let mut spec = self.spec.clone();
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
pub(crate) fn position(g: &Graph, info: &Info, t: &str) -> usize {
    g.inputs.iter().position(|i| i.name == t).unwrap_or_else(|| {
        g.inputs.len() + info.order.iter().position(|&k| g.nodes[k].name == t).unwrap_or(usize::MAX - g.inputs.len())
    })
}

/// `--dump-after place`: the stages, every input and node with its stage and cost, the cost
/// per stage, and the bytes every cut carries.
pub fn dump(g: &Graph, info: &Info, p: &Placement) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# placement of graph {}: {} stage(s)", g.name, p.stages.len());
    let mut per_stage = vec![Cost::default(); p.stages.len()];
    for &k in &info.order {
        per_stage[p.stage_of[&g.nodes[k].name]] += cost(g, info, k);
    }
    for (i, st) in p.stages.iter().enumerate() {
        let m = &st.mesh.mesh;
        let shape: Vec<String> = m.shape.iter().map(usize::to_string).collect();
        let devs: Vec<String> = st.mesh.devices.iter().map(usize::to_string).collect();
        let _ = writeln!(
            s,
            "stage {i}: devices [{}] = slice {} ({} [{}])  cost {} flops, {} bytes",
            devs.join(","),
            st.slice,
            m.topology.name(),
            shape.join("x"),
            per_stage[i].flops,
            per_stage[i].bytes
        );
    }
    for i in &g.inputs {
        let _ = writeln!(s, "{:<20} stage {}  (input {})", i.name, p.stage_of[&i.name], i.ty);
    }
    for &k in &info.order {
        let n = &g.nodes[k];
        let c = cost(g, info, k);
        let _ = writeln!(
            s,
            "{:<20} stage {}  {:<12} {:>10} flops {:>10} bytes",
            n.name,
            p.stage_of[&n.name],
            n.op.name(),
            c.flops,
            c.bytes
        );
    }
    let crossings = p.crossings(g, info);
    let mut cuts: BTreeMap<(usize, usize), (u64, Vec<String>)> = BTreeMap::new();
    for (t, from, to) in &crossings {
        for &d in to {
            let c = cuts.entry((*from, d)).or_default();
            c.0 += info.types[t].size_bytes() as u64;
            c.1.push(t.clone());
        }
    }
    if cuts.is_empty() {
        let _ = writeln!(s, "no cuts");
    }
    for ((a, b), (bytes, ts)) in cuts {
        let _ = writeln!(s, "cut stage {a} -> stage {b}: {bytes} bytes ({})", ts.join(", "));
    }
    s
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
