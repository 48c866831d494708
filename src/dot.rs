//! The Graphviz form of the graph-shaped dumps (`--dump-format dot`): `place`, `lower`,
//! `sendrecv` and `streams` drawn as one directed graph each, printed by petgraph's `Dot`.
//! Stages, devices and streams are clusters (`subgraph cluster_…`, which `Dot` does not
//! draw, so they follow its output and name its node ids); data flow is a plain edge, and
//! what crosses a stage or a device — collectives, sends and receives, and the event waits
//! between streams — a coloured edge labelled with what it carries.

use std::collections::HashMap;
use std::fmt::Write as _;

use meshc_ir::verify::Info;
use meshc_ir::{Graph, Node, Op};
use meshc_runtime::format::program::{CollectiveOp, Exec, Program, StreamKind};
use petgraph::dot::{Config, Dot};
use petgraph::graph::{DiGraph, NodeIndex};

use crate::passes::lower::Lowered;
use crate::passes::place::Placement;

/// What an edge stands for, which gives its colour.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Data flow within a stage or device, or a stream's own order.
    Flow,
    /// A tensor sent from one stage or device to another.
    Transfer,
    Collective,
    /// A wait for an event recorded on another stream.
    Wait,
}

impl Kind {
    fn color(self) -> &'static str {
        match self {
            Kind::Flow => "gray40",
            Kind::Transfer => "blue",
            Kind::Collective => "red",
            Kind::Wait => "darkorange",
        }
    }
}

struct Link {
    kind: Kind,
    label: String,
}

// `Dot` requires it of edge weights; the attribute getter writes the label instead.
impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

/// A cluster: its label, its own nodes and the clusters inside it.
#[derive(Default)]
struct Cluster {
    label: String,
    members: Vec<NodeIndex>,
    inner: Vec<Cluster>,
}

/// A drawing under construction: the graph `Dot` prints and the clusters around its nodes.
#[derive(Default)]
struct Drawing {
    graph: DiGraph<String, Link>,
    clusters: Vec<Cluster>,
}

impl Drawing {
    fn node(&mut self, label: String) -> NodeIndex {
        self.graph.add_node(label)
    }

    fn edge(&mut self, a: NodeIndex, b: NodeIndex, kind: Kind, label: String) {
        self.graph.add_edge(a, b, Link { kind, label });
    }

    /// Links the members of a group in rank order, as the collective `label` joins them.
    fn group_edges(&mut self, members: &[NodeIndex], label: &str) {
        for w in members.windows(2) {
            self.edge(w[0], w[1], Kind::Collective, label.to_string());
        }
    }

    fn render(&self) -> String {
        let dot = Dot::with_attr_getters(
            &self.graph,
            &[Config::GraphContentOnly, Config::NodeNoLabel, Config::EdgeNoLabel],
            &|_, e| {
                let l = e.weight();
                let label = if l.label.is_empty() { String::new() } else { format!(", label = {:?}", l.label) };
                // Collectives run across devices side by side: they do not rank the drawing.
                let free = if l.kind == Kind::Collective { ", constraint = false" } else { "" };
                format!("color = {}, fontcolor = {}{label}{free}", l.kind.color(), l.kind.color())
            },
            &|_, (_, label)| format!("label = {label:?}"),
        );
        let mut s = String::from("digraph {\n    node [shape = box, fontname = monospace];\n");
        s += &dot.to_string();
        let mut next = 0;
        for c in &self.clusters {
            write_cluster(&mut s, c, 1, &mut next);
        }
        s += "}\n";
        s
    }
}

fn write_cluster(s: &mut String, c: &Cluster, depth: usize, next: &mut usize) {
    let pad = "    ".repeat(depth);
    let _ = writeln!(s, "{pad}subgraph cluster_{next} {{");
    *next += 1;
    let _ = writeln!(s, "{pad}    label = {:?};", c.label);
    for m in &c.members {
        let _ = writeln!(s, "{pad}    {};", m.index());
    }
    for inner in &c.inner {
        write_cluster(s, inner, depth + 1, next);
    }
    let _ = writeln!(s, "{pad}}}");
}

fn bytes(n: usize) -> String {
    format!("{n} B")
}

/// The `place` dump: every input and node in the cluster of its stage; data flow between
/// stages (what `sendrecv` will transfer) in colour, with its bytes.
pub fn place(g: &Graph, info: &Info, p: &Placement) -> String {
    let mut d = Drawing::default();
    let mut clusters: Vec<Cluster> = (p.stages.iter().enumerate())
        .map(|(i, st)| {
            let devices: Vec<String> = st.mesh.devices.iter().map(usize::to_string).collect();
            Cluster { label: format!("stage {i}: devices [{}]", devices.join(",")), ..Cluster::default() }
        })
        .collect();
    let mut at: HashMap<&str, NodeIndex> = HashMap::new();
    let names = g.inputs.iter().map(|i| (&i.name, "input")).chain(info.order.iter().map(|&k| {
        let n = &g.nodes[k];
        (&n.name, n.op.name())
    }));
    for (name, what) in names {
        let v = d.node(format!("{name}\n{what} {}", info.types[name]));
        clusters[p.stage_of[name]].members.push(v);
        at.insert(name, v);
    }
    for &k in &info.order {
        let n = &g.nodes[k];
        for t in n.inputs.iter().filter(|t| at.contains_key(t.as_str())) {
            let (from, to) = (p.stage_of[t], p.stage_of[&n.name]);
            let (kind, label) = if from == to {
                (Kind::Flow, String::new())
            } else {
                (Kind::Transfer, bytes(info.types[t].size_bytes()))
            };
            d.edge(at[t.as_str()], at[n.name.as_str()], kind, label);
        }
    }
    d.clusters = clusters;
    d.render()
}

/// The bytes of a lowered node's result (its type is declared by lowering).
fn node_bytes(n: &Node) -> usize {
    n.dtype.map_or(0, |t| t.size_bytes() * n.shape.iter().flatten().product::<usize>())
}

/// The `lower` and `sendrecv` dumps: every device's program in its cluster (within the
/// cluster of its stage when `stages` has several, each labelled, with what the verifier
/// inferred of each device's program); collectives link the members of each group, sends
/// their receives, in colour with their bytes.
pub fn lowered(stages: &[(String, &Lowered, &[Option<Info>])]) -> String {
    let mut d = Drawing::default();
    // Devices are numbered within their stage.
    let mut at: HashMap<(usize, usize, &str), NodeIndex> = HashMap::new();
    for (s, (label, l, infos)) in stages.iter().enumerate() {
        let mut stage = Cluster { label: label.clone(), ..Cluster::default() };
        let io_layout: HashMap<&str, &[Option<usize>]> =
            l.inputs.iter().chain(&l.outputs).map(|(n, lay)| (n.as_str(), lay.as_slice())).collect();
        // A label's type is the block the device holds; a graph input's or output's, its
        // layout over the mesh too.
        let layout =
            |name: &str| io_layout.get(name).map_or(String::new(), |lay| format!(" {}", l.mesh.layout_string(lay)));
        for (dev, g) in l.devices.iter().enumerate() {
            let coords: Vec<String> = l.mesh.coords(dev).iter().map(usize::to_string).collect();
            let mut c = Cluster { label: format!("device {dev} ({})", coords.join(",")), ..Cluster::default() };
            let ty = |t: &meshc_ir::TensorType, name: &str| format!("\n{t}{}", layout(name));
            // A device with no work has no inference, and no nodes to label.
            let types = infos.get(dev).and_then(Option::as_ref).map(|i| &i.types);
            for i in &g.inputs {
                let v = d.node(format!("{}\ninput{}", i.name, ty(&i.ty, &i.name)));
                c.members.push(v);
                at.insert((s, dev, &i.name), v);
            }
            for n in &g.nodes {
                let t = types.and_then(|t| t.get(&n.name)).map_or(String::new(), |t| ty(t, &n.name));
                let v = d.node(format!("{}\n{}{t}", n.name, n.op.name()));
                c.members.push(v);
                at.insert((s, dev, &n.name), v);
                for t in n.inputs.iter().filter_map(|t| at.get(&(s, dev, t.as_str()))) {
                    d.edge(*t, v, Kind::Flow, String::new());
                }
            }
            stage.inner.push(c);
        }
        if stages.len() == 1 {
            d.clusters = stage.inner;
        } else {
            d.clusters.push(stage);
        }
    }
    let nodes = || {
        (stages.iter().enumerate())
            .flat_map(|(s, (_, l, _))| l.devices.iter().enumerate().map(move |(dev, g)| (s, dev, g)))
            .flat_map(|(s, dev, g)| g.nodes.iter().map(move |n| (s, dev, n)))
    };
    let sends: HashMap<String, NodeIndex> = nodes()
        .filter(|(_, _, n)| n.op == Op::Send)
        .map(|(s, dev, n)| (n.transfer_key(), at[&(s, dev, n.name.as_str())]))
        .collect();
    for (s, dev, n) in nodes() {
        let v = at[&(s, dev, n.name.as_str())];
        match n.op {
            Op::Send => {}
            Op::Recv => {
                if let Some(&from) = sends.get(&n.transfer_key()) {
                    d.edge(from, v, Kind::Transfer, bytes(node_bytes(n)));
                }
            }
            op if op.is_communication() => {
                let groups = n.groups().unwrap_or_default();
                // Drawn once, from the group's first member.
                let Some(mine) = groups.iter().find(|g| g.first() == Some(&(dev as i64))) else { continue };
                let members: Vec<NodeIndex> =
                    mine.iter().filter_map(|&m| at.get(&(s, m as usize, n.name.as_str())).copied()).collect();
                d.group_edges(&members, &format!("{} {}", op.name(), bytes(node_bytes(n))));
            }
            _ => {}
        }
    }
    d.render()
}

/// The `streams` dump: every device a cluster of its streams, each stream its steps in
/// order; waits for events of other streams, collectives and transfers in colour.
pub fn streams(programs: &[Program]) -> String {
    let mut d = Drawing::default();
    let mut at: HashMap<(usize, usize), NodeIndex> = HashMap::new();
    for p in programs {
        let mut c = Cluster { label: format!("device {}", p.device), ..Cluster::default() };
        let plan = &p.streams;
        for (s, st) in plan.streams.iter().enumerate() {
            let kind = match st.kind {
                StreamKind::Compute => "compute",
                StreamKind::Comm => "comm",
            };
            let mut inner = Cluster { label: format!("stream {s} ({kind})"), ..Cluster::default() };
            let mut prev = None;
            for &i in &st.steps {
                let v = d.node(format!("{i} {}", p.steps[i].node));
                inner.members.push(v);
                at.insert((p.device, i), v);
                if let Some(u) = prev.replace(v) {
                    d.edge(u, v, Kind::Flow, String::new());
                }
            }
            c.inner.push(inner);
        }
        d.clusters.push(c);
        for w in &plan.waits {
            let after = plan.events[w.event].after;
            d.edge(at[&(p.device, after)], at[&(p.device, w.before)], Kind::Wait, format!("event {}", w.event));
        }
    }
    let steps = || programs.iter().flat_map(|p| p.steps.iter().enumerate().map(move |(i, s)| (p, i, s)));
    let sends: HashMap<&str, NodeIndex> = steps()
        .filter_map(|(p, i, s)| match &s.exec {
            Exec::Send(t) => Some((t.key.as_str(), at[&(p.device, i)])),
            _ => None,
        })
        .collect();
    for (p, i, step) in steps() {
        let v = at[&(p.device, i)];
        match &step.exec {
            Exec::Recv(t) => {
                if let Some(&s) = sends.get(t.key.as_str()) {
                    d.edge(s, v, Kind::Transfer, bytes(t.bytes));
                }
            }
            Exec::Collective(c) => {
                let Some(mine) = c.groups.iter().find(|g| g.first() == Some(&p.device)) else { continue };
                let step_of = |m: usize| {
                    let q = programs.iter().find(|q| q.device == m)?;
                    let k = q.steps.iter().position(|s| matches!(&s.exec, Exec::Collective(o) if o.id == c.id))?;
                    at.get(&(m, k)).copied()
                };
                let members: Vec<NodeIndex> = mine.iter().filter_map(|&m| step_of(m)).collect();
                let size = step.buffers.first().map_or(0, |&b| p.buffers[b].bytes);
                d.group_edges(&members, &format!("{} {}", collective_name(&c.op), bytes(size)));
            }
            Exec::Kernel(_) | Exec::Library(_) | Exec::Send(_) => {}
        }
    }
    d.render()
}

fn collective_name(op: &CollectiveOp) -> &'static str {
    match op {
        CollectiveOp::AllReduce { .. } => "all_reduce",
        CollectiveOp::AllGather { .. } => "all_gather",
        CollectiveOp::ReduceScatter { .. } => "reduce_scatter",
        CollectiveOp::AllToAll { .. } => "all_to_all",
    }
}
