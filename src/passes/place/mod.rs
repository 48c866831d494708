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
//! (`meshc_ir::cost::node_flops`: 2 per multiply-add, about one per element otherwise) and the
//! bytes it writes plus the bytes of the params it reads; a cut costs the bytes of every
//! tensor that crosses it (once per tensor and consuming stage).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::ops::Range;

use anyhow::{anyhow, Result};
use meshc_ir::verify::Info;
use meshc_ir::Graph;

use crate::layout::{Devices, Entry, Spec, Stages};

mod auto;
mod microbatch;
mod stages;

use stages::{check_layout_names, fill, glob, slice_string, stage_spec, sub_mesh};
pub use stages::{cost, parse_slice, Cost, Placement, Stage, MAX_MICROBATCHES};

/// Runs the pass; `None` when the spec places nothing (the whole mesh runs every node).
pub fn place(g: &Graph, info: &Info, spec: &Spec) -> Result<Option<Placement>> {
    let Some(p) = &spec.placement else { return Ok(None) };
    let err = |msg: String| anyhow!("{}: placement: {msg}", spec.file);
    let microbatches = match p.microbatches {
        None => 1,
        Some(m) if (1..=MAX_MICROBATCHES).contains(&m) => m as usize,
        Some(m) => {
            return Err(err(format!(
                "\"microbatches\": {m} is not a number of micro-batches (1 to {MAX_MICROBATCHES})"
            )))
        }
    };
    let mut placement = match &p.stages {
        Stages::Auto(auto) => auto::auto(g, info, spec, auto)?,
        Stages::Listed(entries) => explicit(g, info, spec, entries)?,
    };
    if microbatches > 1 {
        placement.unrolled =
            Some(microbatch::unroll(g, info, microbatches, &mut placement.stage_of).map_err(|e| err(e.to_string()))?);
    }
    Ok(Some(placement))
}

/// The placement of a list of entries (see the module doc).
fn explicit(g: &Graph, info: &Info, spec: &Spec, entries: &[Entry]) -> Result<Placement> {
    let err = |msg: String| anyhow!("{}: placement: {msg}", spec.file);
    let mut stages: Vec<Stage> = Vec::new();
    let mut stage_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut entry_of: BTreeMap<String, usize> = BTreeMap::new();
    for (e, entry) in entries.iter().enumerate() {
        let at = |msg: String| err(format!("entry {}: {msg}", e + 1));
        let ranges = match &entry.devices {
            Devices::Slice(s) => parse_slice(&spec.mesh, s).map_err(|m| at(format!("devices \"{s}\": {m}")))?,
            &Devices::Device(n) => {
                let d = usize::try_from(n).ok().filter(|&d| d < spec.mesh.devices()).ok_or_else(|| {
                    at(format!("device {n} does not exist (the mesh has {} devices)", spec.mesh.devices()))
                })?;
                spec.mesh.coords(d).into_iter().map(|c| c..c + 1).collect()
            }
        };
        let sm = sub_mesh(&spec.mesh, &ranges);
        let s = match stages.iter().position(|s| s.mesh.devices == sm.devices) {
            Some(s) if entry.layouts.is_some() || entry.rules.is_some() => {
                return Err(at(format!("layouts or rules for stage {} are given by an earlier entry already", s)));
            }
            Some(s) => s,
            None => {
                let spec = stage_spec(spec, &sm.mesh, Some(entry)).map_err(|m| at(m.to_string()))?;
                stages.push(Stage { slice: slice_string(&ranges), mesh: sm, spec });
                stages.len() - 1
            }
        };
        for name in entry.nodes.iter().map(String::as_str) {
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
                let st_spec = stage_spec(spec, &sm.mesh, None)?;
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
