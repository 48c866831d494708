//! `meshc explain`: what a sharding plan costs and why. From the lowered programs of a graph
//! under a layout spec it gathers every attribution record (`program::Why`) into a table
//! sorted by bytes, totals the traffic per device and per link (collectives by the fabric's
//! schedules, which is what `meshc run --link-stats` counts, and transfers by their routes,
//! which the fabric does not count), estimates the time on the simulated fabric, counts the
//! FLOPs each device computes and those computed redundantly, and for the costliest entries
//! names the spec change that would remove them when one exists.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use anyhow::{Context, Result};
use meshc_ir::cost::node_flops;
use meshc_ir::verify::{verify, Info};
use meshc_ir::{Graph, Op};
use meshc_runtime::format::mesh::Mesh;
use meshc_runtime::format::program::{Rule, Why};
use serde::Serialize;

use crate::attribution;
use crate::layout::{resolve_entry, AxisRef, Spec};
use crate::passes::layout::{corresponding_dims, reshape_layout, reshape_run_layout};
use crate::passes::lower::{Lowered, Overridden};

/// Latency of one collective or transfer on the simulated fabric: the one-rendezvous
/// all_reduce over 8 devices that `benches/collectives.rs` times took 12–18 µs at 16 KiB
/// (the figures `traffic::SMALL_BYTES` was chosen by).
const LATENCY_US: f64 = 15.0;

/// Bytes per µs over one link: the ring all_reduce of 16 MiB per device over 8 devices
/// (`benches/collectives.rs`, large path, 2 cores) took about 6.8 ms, a bus bandwidth
/// 2(n-1)/n · 16 MiB / 6.8 ms ≈ 4.3 GB/s; rounded down to 4 GB/s.
const BYTES_PER_US: f64 = 4000.0;

/// How many of the costliest entries get a suggestion.
const SUGGESTED: usize = 5;

/// One row of the table: a collective (all its groups), or all transfers of one tensor
/// between two stages.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    /// all_gather, all_reduce, reduce_scatter, all_to_all or send.
    pub step: String,
    /// The collective node (alike on every member), or the tensor transferred.
    pub name: String,
    /// Point-to-point transfers this row sums (1 for a collective).
    pub count: usize,
    #[serde(flatten)]
    pub why: Why,
    /// Bytes over all links.
    pub bytes: u64,
    /// Estimated time on the fabric: one latency plus the busiest link's bytes.
    pub time_us: f64,
    /// The spec change that would remove the entry, when one is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Device {
    pub device: usize,
    pub coords: Vec<usize>,
    /// Bytes the device puts onto its links (what it forwards included).
    pub sent: u64,
    pub flops: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Link {
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    /// Bytes of collectives: what `meshc run --link-stats` counts for the link.
    pub collectives: u64,
    /// Bytes of send/recv transfers (not in the fabric's counters).
    pub transfers: u64,
}

/// The report: entries sorted by bytes, costliest first.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub graph: String,
    pub mesh: Mesh,
    pub entries: Vec<Entry>,
    pub devices: Vec<Device>,
    /// Links that carry anything, sorted by (from, to).
    pub links: Vec<Link>,
    pub bytes: u64,
    pub busiest_link: u64,
    /// Estimated communication time, the entries one after the other (no overlap).
    pub time_us: f64,
    /// FLOPs of the graph on one device, and summed over every device's program.
    pub flops: u64,
    pub flops_all_devices: u64,
    /// Work done redundantly: what the devices compute beyond the graph's own FLOPs, and
    /// the nodes that account for it, most first.
    pub replicated_flops: u64,
    pub replicated: Vec<(String, u64)>,
    /// The mesh axes the spec's `layouts` split, when more than a quarter of the FLOPs are
    /// replicated all the same: the spec asks for a split the plan largely does not make.
    pub unsplit_axes: Vec<String>,
    /// Params whose explicit layout in the spec a reader overrode (`lower::Overridden`).
    pub overridden: Vec<Overridden>,
    /// Graph outputs each device returns a block of, as (name, layout over the mesh or
    /// stage that computes it): the runner assembles them on the host, over no mesh link.
    pub split_outputs: Vec<(String, String)>,
    /// The spec degrades devices or links: the figures are of the fault-free schedules.
    pub degraded: bool,
}

fn coords(mesh: &Mesh, d: usize) -> Vec<usize> {
    mesh.coords(d)
}

/// Lowers `g` under `spec` and explains the result.
pub fn explain(g: &Graph, info: &Info, spec: &Spec) -> Result<Report> {
    let (lowered, _) = crate::driver::lower_spec(g, info, spec)?;
    let degraded = !spec.degraded.degradation(&spec.mesh).is_empty();
    let mut r = report(g, info, &lowered, degraded)?;
    if r.replicated_flops * 4 > r.flops {
        let axes = spec.layouts.values().flatten().flatten().map(|&a| spec.mesh.entry_name(a));
        r.unsplit_axes = axes.collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    }
    Ok(r)
}

/// Explains `lowered`, the lowering of `g`; `degraded` when the spec degrades the mesh.
pub fn report(g: &Graph, info: &Info, lowered: &Lowered, degraded: bool) -> Result<Report> {
    let mesh = &lowered.mesh;
    let mut rows: BTreeMap<String, Entry> = BTreeMap::new();
    let mut links: BTreeMap<(usize, usize), Link> = BTreeMap::new();
    let mut per_row_links: HashMap<String, BTreeMap<(usize, usize), u64>> = HashMap::new();
    let mut device_flops = vec![0u64; lowered.devices.len()];
    let mut by_node: BTreeMap<String, u64> = BTreeMap::new();
    let originals: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    for (d, dev) in lowered.devices.iter().enumerate() {
        if dev.nodes.is_empty() {
            continue;
        }
        let dinfo = verify(dev).with_context(|| format!("device {d}: the lowered program does not verify"))?;
        for n in &dev.nodes {
            if !n.op.is_communication() {
                let f = node_flops(n, &dinfo);
                device_flops[d] += f;
                if let Some(owner) = owner(&originals, &n.name) {
                    *by_node.entry(owner.to_string()).or_default() += f;
                }
                continue;
            }
            let Some(k) = attribution::key(n) else { continue };
            let Some(why) = lowered.why.get(&k) else { continue };
            // A collective appears on every member: its traffic (all groups) once. Transfers
            // of one tensor between two stages make one row.
            let send = n.op == Op::Send;
            let row = if send { format!("{}|{}|{}", why.tensor, why.from, why.to) } else { k };
            if n.op == Op::Recv || (!send && rows.contains_key(&row)) {
                continue;
            }
            let traffic = attribution::step_traffic(mesh, &dinfo.types, n)?;
            let entry = rows.entry(row.clone()).or_insert_with(|| Entry {
                step: n.op.name().to_string(),
                name: if send { why.tensor.clone() } else { n.name.clone() },
                count: 0,
                why: why.clone(),
                bytes: 0,
                time_us: 0.0,
                fix: None,
            });
            entry.count += 1;
            let per = per_row_links.entry(row).or_default();
            for (f, t, b) in traffic {
                entry.bytes += b;
                *per.entry((f, t)).or_default() += b;
                let l = links.entry((f, t)).or_insert_with(|| Link {
                    from: coords(mesh, f),
                    to: coords(mesh, t),
                    collectives: 0,
                    transfers: 0,
                });
                if send {
                    l.transfers += b;
                } else {
                    l.collectives += b;
                }
            }
        }
    }
    let mut entries: Vec<Entry> = rows
        .into_iter()
        .map(|(row, mut e)| {
            if e.count > 1 {
                // The transfers of a row run side by side: the busiest link and the most one
                // device sends are over all of them.
                let per = &per_row_links[&row];
                let mut sent: BTreeMap<usize, u64> = BTreeMap::new();
                for (&(f, _), &b) in per {
                    *sent.entry(f).or_default() += b;
                }
                e.why.bytes_per_device = sent.values().copied().max().unwrap_or(0);
                e.why.busiest_link = per.values().copied().max().unwrap_or(0);
            }
            e.time_us = LATENCY_US + e.why.busiest_link as f64 / BYTES_PER_US;
            e
        })
        .collect();
    entries.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    for e in entries.iter_mut().take(SUGGESTED) {
        e.fix = fix(g, info, mesh, &e.why, lowered.pinned.get(&e.name));
    }
    let mut sent = vec![0u64; lowered.devices.len()];
    for (&(f, _), l) in &links {
        sent[f] += l.collectives + l.transfers;
    }
    let devices = (0..lowered.devices.len())
        .map(|d| Device { device: d, coords: coords(mesh, d), sent: sent[d], flops: device_flops[d] })
        .collect();
    let flops: u64 = g.nodes.iter().map(|n| node_flops(n, info)).sum();
    let flops_all_devices: u64 = device_flops.iter().sum();
    let mut replicated: Vec<(String, u64)> = g
        .nodes
        .iter()
        .filter_map(|n| {
            let extra = by_node.get(&n.name).copied().unwrap_or(0).saturating_sub(node_flops(n, info));
            (extra > 0).then(|| (n.name.clone(), extra))
        })
        .collect();
    replicated.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let links: Vec<Link> = links.into_values().collect();
    Ok(Report {
        graph: g.name.clone(),
        mesh: mesh.clone(),
        bytes: entries.iter().map(|e| e.bytes).sum(),
        busiest_link: links.iter().map(|l| l.collectives + l.transfers).max().unwrap_or(0),
        time_us: entries.iter().map(|e| e.time_us).sum(),
        entries,
        devices,
        links,
        flops,
        flops_all_devices,
        replicated_flops: flops_all_devices.saturating_sub(flops),
        replicated,
        unsplit_axes: Vec::new(),
        overridden: lowered.overridden.clone(),
        split_outputs: (lowered.outputs.iter())
            .filter(|(_, l)| l.iter().any(Option::is_some))
            .map(|(o, l)| (o.clone(), lowered.io_stages.get(o).map_or(mesh, |s| &s.mesh).layout_string(l)))
            .collect(),
        degraded,
    })
}

/// The graph node a lowered node computes part of: `NAME` or `NAME.suffix` (the longest such
/// name of the graph).
fn owner<'a>(originals: &[&'a str], name: &str) -> Option<&'a str> {
    originals
        .iter()
        .filter(|o| name == **o || name.strip_prefix(**o).is_some_and(|rest| rest.starts_with('.')))
        .max_by_key(|o| o.len())
        .copied()
}

/// The mesh axis names of a layout string "[-, model] …" per dim.
fn axes_of(layout: &str) -> Vec<Option<String>> {
    let inner = layout.trim_start_matches('[').split(']').next().unwrap_or_default();
    if inner.is_empty() {
        return Vec::new();
    }
    inner.split(", ").map(|a| (a != "-").then(|| a.to_string())).collect()
}

/// The layout the entries `axes` name (`axes_of`), over `mesh`.
fn resolved(mesh: &Mesh, axes: &[Option<String>]) -> Option<Vec<Option<usize>>> {
    let entry = |a: &Option<String>| match a {
        Some(a) => resolve_entry(mesh, &AxisRef::Name(a.clone())).ok().map(Some),
        None => Some(None),
    };
    axes.iter().map(entry).collect()
}

/// The spec change that would remove the step `w` describes (or make it cheaper), when one
/// is known. `pinned`: for an all_reduce of a partial sum, the tensors whose layouts in the
/// spec kept it from being reduce-scattered (`Lowered::pinned`).
fn fix(g: &Graph, info: &Info, mesh: &Mesh, w: &Why, pinned: Option<&Vec<String>>) -> Option<String> {
    match w.rule {
        Rule::ContractionOverSplitDim | Rule::ReductionOverSplitDim => pinned.map(|ts| {
            let ts: Vec<String> = ts.iter().map(|t| format!("'{t}'")).collect();
            format!(
                "drop the layout of {} from the spec: '{}' would be reduce-scattered instead, the elementwise ops \
                 after it and the outputs they reach left split",
                ts.join(", "),
                w.node
            )
        }),
        Rule::LayoutGivenInSpec => {
            let n = g.nodes.iter().find(|n| n.name == w.node)?;
            // Through a reshape, the layout that keeps its operand's split.
            let (layout, of) = if n.op == Op::Reshape {
                let from = resolved(mesh, &axes_of(&w.from))?;
                let (ins, out) = (&info.types[&w.tensor].shape, &info.types[&n.name].shape);
                (mesh.layout_string(&reshape_layout(mesh, ins, &from, out)), "that keeps the split of")
            } else {
                (w.from.clone(), "of")
            };
            Some(format!("give '{}' the layout {layout} {of} its operand '{}' in the spec", w.node, w.tensor))
        }
        Rule::OperandLayoutsDisagree => {
            Some(format!("give '{}' and the other operands of '{}' one layout in the spec", w.tensor, w.node))
        }
        Rule::StageBoundary => Some(format!("place '{}' on the stage that computes '{}'", w.node, w.tensor)),
        Rule::ReshapeCannotKeepSplit => {
            let n = g.nodes.iter().find(|n| n.name == w.node)?;
            let ins = &info.types[&w.tensor].shape;
            let out = &info.types[&n.name].shape;
            let (held, kept) = (axes_of(&w.from), axes_of(&w.to));
            // The first split the reshape loses (others it may keep).
            let (d, axis) = held
                .iter()
                .enumerate()
                .find_map(|(d, a)| a.clone().filter(|_| kept.get(d) != Some(a)).map(|a| (d, a)))?;
            let from = resolved(mesh, &held)?;
            let size = mesh.shards(from[d]?);
            // A dim the reshape keeps (major dim of a group) whose sizes divide by the axis.
            let keep = corresponding_dims(n, 0, info)
                .into_iter()
                .find(|&(di, dout)| di != d && ins[di].is_multiple_of(size) && out[dout].is_multiple_of(size));
            if let (None, Some((run, result))) = (keep, reshape_run_layout(mesh, ins, &from, out, d, from[d]?)) {
                return Some(format!(
                    "give '{}' the layout {} in the spec (its {axis} blocks as one run over the dims '{}' reshapes \
                     together): '{}' keeps it, as {}",
                    w.tensor,
                    mesh.layout_string(&run),
                    w.node,
                    w.node,
                    mesh.layout_string(&result)
                ));
            }
            let mut s = match keep {
                Some((di, _)) => format!(
                    "split dim {di} of '{}' (size {}) over {axis} instead of dim {d}: '{}' keeps it whole",
                    w.tensor, ins[di], w.node
                ),
                None => format!("'{}' keeps no dim of '{}' that {axis} ({size}) divides", w.node, w.tensor),
            };
            let _ = write!(s, "; or a {axis} axis whose size divides the major dim of the reshaped group");
            Some(s)
        }
        _ => None,
    }
}

impl Report {
    /// The text of `meshc explain`.
    pub fn text(&self) -> String {
        let m = &self.mesh;
        let c = |v: &[usize]| format!("({})", v.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
        let shape: Vec<String> = m.shape.iter().map(usize::to_string).collect();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# explain {}: {} [{}] axes [{}]{}",
            self.graph,
            m.topology.name(),
            shape.join("x"),
            m.axes.join(", "),
            if self.degraded { " (degraded: figures of the fault-free schedules)" } else { "" }
        );
        let _ = writeln!(
            s,
            "communication: {} step(s), {} bytes over links, busiest link {} bytes, estimated {:.1} µs",
            self.entries.len(),
            self.bytes,
            self.busiest_link,
            self.time_us
        );
        if !self.entries.is_empty() {
            let _ = writeln!(
                s,
                "  {:>10} {:>9} {:>9} {:>8}  {:<14} {:<22} {:<12} {:<12} why",
                "bytes", "busiest", "/device", "µs", "step", "name", "tensor", "for"
            );
        }
        for e in &self.entries {
            let step = if e.count > 1 { format!("{} x{}", e.step, e.count) } else { e.step.clone() };
            let _ = writeln!(
                s,
                "  {:>10} {:>9} {:>9} {:>8.1}  {:<14} {:<22} {:<12} {:<12} {} -> {}: {}",
                e.bytes,
                e.why.busiest_link,
                e.why.bytes_per_device,
                e.time_us,
                step,
                e.name,
                e.why.tensor,
                e.why.node,
                e.why.from,
                e.why.to,
                e.why.rule.describe()
            );
        }
        let _ = writeln!(s, "per device:");
        for d in &self.devices {
            let _ = writeln!(s, "  device {} {}: sends {} bytes, {} FLOPs", d.device, c(&d.coords), d.sent, d.flops);
        }
        if !self.links.is_empty() {
            let _ = writeln!(s, "per link (collectives as --link-stats counts them; transfers beside):");
        }
        for l in &self.links {
            let _ = writeln!(
                s,
                "  link {} -> {} {} bytes{}",
                c(&l.from),
                c(&l.to),
                l.collectives,
                if l.transfers > 0 { format!(" + {} bytes of transfers", l.transfers) } else { String::new() }
            );
        }
        let max = self.devices.iter().map(|d| d.flops).max().unwrap_or(0);
        let pct = 100.0 * self.replicated_flops as f64 / self.flops.max(1) as f64;
        let _ = writeln!(
            s,
            "compute: graph {} FLOPs, all devices {} FLOPs (busiest device {}), replicated {} FLOPs ({pct:.0}% of the graph)",
            self.flops, self.flops_all_devices, max, self.replicated_flops
        );
        for (n, f) in self.replicated.iter().take(SUGGESTED) {
            let _ = writeln!(s, "  replicated {n}: {f} FLOPs");
        }
        if !self.unsplit_axes.is_empty() {
            let _ = writeln!(
                s,
                "warning: {pct:.0}% of the FLOPs are replicated although the spec's layouts split over {}: \
                 the nodes above compute whole on every device (check shows where each layout came from)",
                self.unsplit_axes.join(", ")
            );
        }
        if !self.overridden.is_empty() {
            let _ = writeln!(
                s,
                "params read in another layout than the spec gives (each device maps the whole param and slices \
                 what its reader needs, with no communication; the spec's layout would need a reshard):"
            );
        }
        for o in &self.overridden {
            let _ = writeln!(s, "  {}: spec {}, read {} by '{}'", o.param, o.spec, o.read, o.node);
        }
        if !self.split_outputs.is_empty() {
            let _ = writeln!(s, "outputs left split (the runner assembles the blocks on the host, over no mesh link):");
        }
        for (o, l) in &self.split_outputs {
            let _ = writeln!(s, "  {o} {l}");
        }
        let fixes: Vec<&Entry> = self.entries.iter().filter(|e| e.fix.is_some()).collect();
        if !fixes.is_empty() {
            let _ = writeln!(s, "to remove (or shrink) the costliest:");
        }
        for e in fixes {
            let _ = writeln!(s, "  {} ({} bytes): {}", e.name, e.bytes, e.fix.as_deref().unwrap_or_default());
        }
        s
    }
}
