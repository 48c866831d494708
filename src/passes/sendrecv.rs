//! The `sendrecv` pass (docs/design.md §4.1): joins the per-stage lowered programs of a placed graph
//! into one program per device of the whole mesh, turning every edge between stages into
//! point-to-point transfers.
//!
//! A tensor produced in stage A (laid out `la` over A's sub-mesh) and read in stage B (laid
//! out `lb` over B's) moves once per destination device of B, not once per edge: each
//! device of B receives exactly the block `lb` gives it, cut into the pieces that A's blocks
//! hold, each piece from one device of A that holds it (the destination itself when it is
//! in A too, else replicas spread over the destinations) — a reshard with no gather to one
//! device in between. A piece that is not the sender's whole block is sliced first; the
//! receiver concatenates its pieces. Every pair shares a unique key `TENSOR:SRC->DST`
//! (`TENSOR.stageB:SRC->DST` when B shares devices with another stage: there B knows the
//! tensor as `TENSOR.stageB`, since the device may hold `TENSOR` in A's layout too).
//!
//! Order: each device runs the nodes of its stages, and the transfers of a tensor right
//! after the node that produces it (graph inputs' transfers first), all in one global
//! order, so that blocking on a send or recv can never form a cycle (as with collectives).
//!
//! Protocol (recorded on both ends): `move` when the sent buffer is dead on the sender after
//! the send (the receiver then reads it in place), `copy` otherwise.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;

use anyhow::Result;
use meshc_ir::verify::Info;
use meshc_ir::{Attr, Graph, Input, Node, Op, Output, TensorType};

use super::fresh;
use super::lower::Lowered;
use super::place::Placement;
use meshc_runtime::format::mesh::{Layout, Mesh};
use meshc_runtime::format::program::{Rule, StageMesh, Why};

fn ints(v: impl IntoIterator<Item = usize>) -> Attr {
    Attr::List(v.into_iter().map(|x| Attr::Int(x as i64)).collect())
}

struct Join<'a> {
    g: &'a Graph,
    info: &'a Info,
    p: &'a Placement,
    stages: &'a [Lowered],
    devices: Vec<Graph>,
    names: Vec<HashSet<String>>,
    /// The attribution records of the transfers (by key) and of the stages' collectives.
    why: BTreeMap<String, Why>,
}

impl Join<'_> {
    /// The name stage `s` knows tensor `t` by, when `t` arrives from another stage.
    fn arriving_name(&self, s: usize, t: &str) -> String {
        let shared = self
            .p
            .stages
            .iter()
            .enumerate()
            .any(|(o, st)| o != s && st.mesh.devices.iter().any(|d| self.p.stages[s].mesh.devices.contains(d)));
        let arrives = self.p.stage_of.get(t).is_some_and(|&from| from != s);
        if shared && arrives {
            format!("{t}.stage{s}")
        } else {
            t.to_string()
        }
    }

    fn push(&mut self, d: usize, mut n: Node) {
        n.device = Some(d as u32);
        self.names[d].insert(n.name.clone());
        self.devices[d].nodes.push(n);
    }

    fn layout_in(&self, s: usize, t: &str, produced: bool) -> Layout {
        let l = &self.stages[s];
        let list = if produced && !self.g.inputs.iter().any(|i| i.name == t) { &l.outputs } else { &l.inputs };
        list.iter().find(|(n, _)| n == t).map(|(_, l)| l.clone()).expect("the stage graph has the tensor")
    }

    /// The transfers of `t` from stage `a` to stage `b` (see the module doc).
    fn transfer(&mut self, t: &str, a: usize, b: usize) {
        let ty = self.info.types[t].clone();
        let shape = ty.shape.clone();
        let la = self.layout_in(a, t, true);
        let lb = self.layout_in(b, t, false);
        let (ma, mb): (StageMesh, StageMesh) = (self.p.stages[a].mesh.clone(), self.p.stages[b].mesh.clone());
        let consumer = self.g.nodes.iter().find(|n| self.p.stage_of[&n.name] == b && n.inputs.iter().any(|i| i == t));
        let why = Why {
            node: consumer.map_or_else(|| t.to_string(), |n| n.name.clone()),
            tensor: t.to_string(),
            from: format!("{} on stage {a}", ma.mesh.layout_string(&la)),
            to: format!("{} on stage {b}", mb.mesh.layout_string(&lb)),
            rule: Rule::StageBoundary,
            bytes_per_device: 0,
            busiest_link: 0,
        };
        for j in 0..mb.devices.len() {
            let gj = mb.devices[j];
            let rb = mb.mesh.region(&shape, &lb, j);
            // Per dim: (A's block index, the part of the destination's range in that block).
            let per_dim: Vec<Vec<(usize, Range<usize>)>> = (0..shape.len())
                .map(|d| match la[d] {
                    None => vec![(0, rb[d].clone())],
                    Some(ax) => {
                        let bs = shape[d] / ma.mesh.shards(ax);
                        if rb[d].is_empty() || bs == 0 {
                            return vec![(0, rb[d].clone())];
                        }
                        (rb[d].start / bs..=(rb[d].end - 1) / bs)
                            .map(|k| (k, rb[d].start.max(k * bs)..rb[d].end.min((k + 1) * bs)))
                            .collect()
                    }
                })
                .collect();
            let mut pieces: BTreeMap<Vec<usize>, String> = BTreeMap::new();
            let mut idx = vec![0usize; shape.len()];
            loop {
                let blocks: Vec<usize> = (0..shape.len()).map(|d| per_dim[d][idx[d]].0).collect();
                let range: Vec<Range<usize>> = (0..shape.len()).map(|d| per_dim[d][idx[d]].1.clone()).collect();
                let holders: Vec<usize> = (0..ma.devices.len())
                    .filter(|&i| (0..shape.len()).all(|d| la[d].is_none_or(|ax| ma.mesh.coord(i, ax) == blocks[d])))
                    .collect();
                // A device that holds the piece itself takes it locally.
                let src = holders.iter().copied().find(|&i| ma.devices[i] == gj).unwrap_or(holders[j % holders.len()]);
                let name = self.piece(t, &ty, &ma, src, &la, &range, (gj, &self.arriving_name(b, t)), &why);
                pieces.insert(idx.clone(), name);
                // Odometer over the pieces, last dim fastest.
                let mut d = shape.len();
                loop {
                    if d == 0 {
                        break;
                    }
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < per_dim[d].len() {
                        break;
                    }
                    idx[d] = 0;
                }
                if idx.iter().all(|&i| i == 0) {
                    break;
                }
            }
            let counts: Vec<usize> = per_dim.iter().map(Vec::len).collect();
            let whole = self.assemble(t, gj, &pieces, &counts, &mut Vec::new());
            let name = self.arriving_name(b, t);
            if whole == t {
                // All of it is here already, under its own name: an alias (a reshape to the
                // same shape shares the buffer).
                let mut n = Node::new(name, Op::Reshape, &[t]);
                n.attrs.insert("shape".into(), ints(rb.iter().map(Range::len)));
                self.push(gj, n);
            } else {
                self.rename_last(gj, &whole, &name);
            }
        }
    }

    /// Sends the piece `range` of `t` from stage-local device `src` of `ma` to global device
    /// `dst`, where it becomes part of `as_name`; returns the name of the recv on `dst` (of
    /// the piece itself when `dst` holds it).
    #[allow(clippy::too_many_arguments)]
    fn piece(
        &mut self,
        t: &str,
        ty: &TensorType,
        ma: &StageMesh,
        src: usize,
        la: &[Option<usize>],
        range: &[Range<usize>],
        (dst, as_name): (usize, &str),
        why: &Why,
    ) -> String {
        let gi = ma.devices[src];
        let held = ma.mesh.region(&ty.shape, la, src);
        let mut operand = t.to_string();
        if held != range {
            let name = fresh(&self.names[gi], t, "piece");
            let mut n = Node::new(&name, Op::Slice, &[t]);
            let axes: Vec<usize> = (0..range.len()).filter(|&d| held[d] != range[d]).collect();
            n.attrs.insert("axes".into(), ints(axes.iter().copied()));
            n.attrs.insert("starts".into(), ints(axes.iter().map(|&d| range[d].start - held[d].start)));
            n.attrs.insert("ends".into(), ints(axes.iter().map(|&d| range[d].end - held[d].start)));
            self.push(gi, n);
            operand = name;
        }
        if gi == dst {
            return operand;
        }
        let key = format!("{as_name}:{gi}->{dst}");
        self.why.insert(key.clone(), why.clone());
        let mut send = Node::new(fresh(&self.names[gi], t, "send"), Op::Send, &[&operand]);
        send.attrs.insert("key".into(), Attr::Str(key.clone()));
        send.attrs.insert("to".into(), Attr::Int(dst as i64));
        self.push(gi, send);
        let mut recv = Node::new(fresh(&self.names[dst], t, "recv"), Op::Recv, &[]);
        recv.attrs.insert("key".into(), Attr::Str(key));
        recv.attrs.insert("from".into(), Attr::Int(gi as i64));
        recv.attrs.insert("shape".into(), ints(range.iter().map(Range::len)));
        recv.attrs.insert("dtype".into(), Attr::Str(ty.dtype.name().into()));
        let name = recv.name.clone();
        self.push(dst, recv);
        name
    }

    /// Concatenates the pieces received on `d` (a grid of `counts` pieces per dim) from
    /// dimension `prefix.len()` on; returns the name of the result.
    fn assemble(
        &mut self,
        t: &str,
        d: usize,
        pieces: &BTreeMap<Vec<usize>, String>,
        counts: &[usize],
        prefix: &mut Vec<usize>,
    ) -> String {
        let dim = prefix.len();
        if dim == counts.len() {
            return pieces[prefix].clone();
        }
        let parts: Vec<String> = (0..counts[dim])
            .map(|k| {
                prefix.push(k);
                let p = self.assemble(t, d, pieces, counts, prefix);
                prefix.pop();
                p
            })
            .collect();
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one part");
        }
        let name = fresh(&self.names[d], t, "concat");
        let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
        let mut n = Node::new(&name, Op::Concat, &refs);
        n.attrs.insert("axis".into(), Attr::Int(dim as i64));
        self.push(d, n);
        name
    }

    /// Names the node `local` of device `d` (the last one pushed) `t`.
    fn rename_last(&mut self, d: usize, local: &str, t: &str) {
        let last = self.devices[d].nodes.last_mut().expect("a node was pushed");
        debug_assert_eq!(last.name, local);
        last.name = t.to_string();
        self.names[d].insert(t.to_string());
    }
}

/// Runs the pass: `stages[s]` is stage `s`'s graph lowered over its sub-mesh. The result is
/// one program per device of `mesh`; devices in no stage run an empty one.
pub fn join(g: &Graph, info: &Info, mesh: &Mesh, p: &Placement, stages: &[Lowered]) -> Result<Lowered> {
    let base = Graph { name: g.name.clone(), ..Graph::default() };
    let mut j = Join {
        g,
        info,
        p,
        stages,
        devices: vec![base; mesh.devices()],
        names: vec![HashSet::new(); mesh.devices()],
        why: BTreeMap::new(),
    };
    // Generated node names (reshards, statistics) may repeat across stages; collectives are
    // numbered by name, so later stages' repeats get the stage as a suffix.
    let original: HashSet<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    let mut seen: HashSet<String> = HashSet::new();
    let mut renames: Vec<HashMap<String, String>> = Vec::new();
    for (s, l) in stages.iter().enumerate() {
        let mut r = HashMap::new();
        // A tensor a stage receives keeps its name, unless the stage shares a device with
        // another, where the name may already be taken by the tensor in another layout.
        for (t, _) in &l.inputs {
            if j.arriving_name(s, t) != *t {
                r.insert(t.clone(), j.arriving_name(s, t));
            }
        }
        let names: Vec<String> =
            l.devices.first().map(|d| d.nodes.iter().map(|n| n.name.clone()).collect()).unwrap_or_default();
        for n in &names {
            if !original.contains(n.as_str()) && seen.contains(n) {
                r.insert(n.clone(), format!("{n}.s{s}"));
            }
        }
        seen.extend(names);
        for (k, w) in &l.why {
            j.why.insert(r.get(k).unwrap_or(k).clone(), w.clone());
        }
        renames.push(r);
    }
    // Per stage and local device: the lowered nodes of each original node.
    let mut chunks: Vec<Vec<HashMap<String, Vec<Node>>>> = Vec::new();
    for (s, l) in stages.iter().enumerate() {
        let mut per_dev = Vec::new();
        for dg in &l.devices {
            let mut map: HashMap<String, Vec<Node>> = HashMap::new();
            let mut cur = Vec::new();
            for n in &dg.nodes {
                let mut n = n.clone();
                if let Some(to) = renames[s].get(&n.name) {
                    n.name = to.clone();
                }
                for i in &mut n.inputs {
                    if let Some(to) = renames[s].get(i) {
                        *i = to.clone();
                    }
                }
                // Collectives name their groups by the stage's device numbers.
                if let Ok(groups) = n.groups() {
                    let devices = &p.stages[s].mesh.devices;
                    let renumber = |g: &Vec<i64>| g.iter().map(|&d| devices[d as usize] as i64).collect::<Vec<i64>>();
                    let groups = groups.iter().map(|g| Attr::ints(&renumber(g))).collect();
                    n.attrs.insert("groups".into(), Attr::List(groups));
                }
                let done = original.contains(n.name.as_str());
                let key = n.name.clone();
                cur.push(n);
                if done {
                    map.insert(key, std::mem::take(&mut cur));
                }
            }
            per_dev.push(map);
        }
        chunks.push(per_dev);
    }
    // Params, and the graph inputs each device holds (placeholders of 0 elements elsewhere,
    // so that every program lists every input).
    let mut absent: Vec<HashSet<String>> = vec![HashSet::new(); mesh.devices()];
    for (d, placeholders) in absent.iter_mut().enumerate() {
        // (stage, local device) of every stage the device is in.
        let member: Vec<(usize, usize)> = (p.stages.iter().enumerate())
            .filter_map(|(s, st)| st.mesh.devices.iter().position(|&x| x == d).map(|k| (s, k)))
            .collect();
        for i in &g.inputs {
            let held = member.iter().find(|&&(s, _)| p.stage_of[&i.name] == s);
            let input = match held {
                Some(&(s, k)) => stages[s].devices[k].inputs.iter().find(|x| x.name == i.name).cloned().expect("held"),
                None => {
                    placeholders.insert(i.name.clone());
                    Input { name: i.name.clone(), ty: TensorType::new(i.ty.dtype, vec![0]), dims: None, loc: None }
                }
            };
            j.names[d].insert(input.name.clone());
            j.devices[d].inputs.push(input);
        }
        for &(s, k) in &member {
            for param in &stages[s].devices[k].params {
                if j.names[d].insert(param.name.clone()) {
                    j.devices[d].params.push(param.clone());
                }
            }
        }
    }
    let crossings = p.crossings(g, info);
    let send_all = |j: &mut Join, t: &str| {
        for (x, from, to) in &crossings {
            if x == t {
                for &b in to {
                    j.transfer(t, *from, b);
                }
            }
        }
    };
    for i in &g.inputs {
        send_all(&mut j, &i.name);
    }
    for &k in &info.order {
        let n = &g.nodes[k];
        let s = p.stage_of[&n.name];
        for (local, &d) in p.stages[s].mesh.devices.iter().enumerate() {
            for node in chunks[s][local].remove(&n.name).unwrap_or_default() {
                j.push(d, node);
            }
        }
        send_all(&mut j, &n.name);
    }
    // Outputs, with a placeholder where a device holds none.
    let mut io_stages = BTreeMap::new();
    let mut outputs = Vec::new();
    for o in &g.outputs {
        let s = p.stage_of.get(&o.name).copied().unwrap_or(0);
        let (_, layout) = stages[s].outputs.iter().find(|(n, _)| n == &o.name).cloned().expect("stage output");
        outputs.push((o.name.clone(), layout));
        io_stages.insert(o.name.clone(), p.stages[s].mesh.clone());
        for d in 0..mesh.devices() {
            let dev = &mut j.devices[d];
            let has = dev.inputs.iter().any(|i| i.name == o.name)
                || dev.nodes.iter().any(|n| n.name == o.name)
                || dev.params.iter().any(|p| p.name == o.name);
            if !has {
                let ty = TensorType::new(info.types[&o.name].dtype, vec![0]);
                dev.inputs.push(Input { name: o.name.clone(), ty, dims: None, loc: None });
            }
            dev.outputs.push(Output::new(o.name.clone()));
        }
    }
    let inputs = g
        .inputs
        .iter()
        .map(|i| {
            let s = p.stage_of[&i.name];
            io_stages.insert(i.name.clone(), p.stages[s].mesh.clone());
            let layout = stages[s].inputs.iter().find(|(n, _)| n == &i.name).map(|(_, l)| l.clone());
            (i.name.clone(), layout.unwrap_or_else(|| vec![None; i.ty.rank()]))
        })
        .collect();
    // A device that receives a graph input it does not hold (for a stage that reads it)
    // renames its placeholder: the received tensor takes the input's name.
    for (d, dev) in j.devices.iter_mut().enumerate() {
        let received: HashSet<&str> = dev.nodes.iter().map(|n| n.name.as_str()).collect();
        for i in dev.inputs.iter_mut().filter(|i| absent[d].contains(&i.name) && received.contains(i.name.as_str())) {
            i.name = format!("{}.absent", i.name);
        }
    }
    choose_protocols(&mut j.devices);
    // The stages priced their collectives over their sub-meshes; over the whole mesh the
    // routes (and so the busiest link) may differ.
    crate::attribution::price(mesh, &j.devices, &mut j.why)?;
    let overridden = stages.iter().flat_map(|l| l.overridden.iter().cloned()).collect();
    let pinned = stages.iter().flat_map(|l| l.pinned.clone()).collect();
    Ok(Lowered { mesh: mesh.clone(), devices: j.devices, inputs, outputs, io_stages, why: j.why, overridden, pinned })
}

/// Records on every send and its recv whether the sent tensor is dead on the sender after
/// the send (`move`: the receiver may read it in place) or not (`copy`).
fn choose_protocols(devices: &mut [Graph]) {
    let mut protocol: HashMap<String, &'static str> = HashMap::new();
    for dev in devices.iter_mut() {
        let outputs: HashSet<String> = dev.outputs.iter().map(|o| o.name.clone()).collect();
        for i in 0..dev.nodes.len() {
            if dev.nodes[i].op != Op::Send {
                continue;
            }
            let x = dev.nodes[i].inputs[0].clone();
            let later = dev.nodes[i + 1..].iter().any(|n| n.inputs.contains(&x));
            let p = if later || outputs.contains(&x) { "copy" } else { "move" };
            let n = &mut dev.nodes[i];
            n.attrs.insert("protocol".into(), Attr::Str(p.into()));
            protocol.insert(n.transfer_key(), p);
        }
    }
    for dev in devices.iter_mut() {
        for n in dev.nodes.iter_mut().filter(|n| n.op == Op::Recv) {
            let p = protocol.get(&n.transfer_key()).copied().unwrap_or("copy");
            n.attrs.insert("protocol".into(), Attr::Str(p.into()));
        }
    }
}
