//! Dim names for an imported graph, so that a layout spec's `rules` can shard it
//! (docs/onnx.md, "Dim names"). ONNX names only the symbolic dims of graph inputs; the
//! rest is read off the ops: every dim of every tensor is put in a class with the dims an
//! op forces to be the same one (an elementwise op's aligned dims, a matmul's contracted
//! and batch dims, a transpose's permuted dims, the dims a reshape keeps), both ways
//! through the graph, so that a name found anywhere covers the whole class. A class is
//! then named by the role it plays: an input's symbolic dim (`batch`, `seq`); `hidden`,
//! the dim most projection weights (matmul weights) share — the model width, which every
//! layer's residual stream carries; `heads` and `head_dim`, the parts a reshape splits a
//! dim into when the first becomes a batch dim of a matmul (attention), with `heads` also
//! for the dim split (a projection's output) and the dim the parts are merged back into;
//! `ffn`, a projection's output that another projection reads (the MLP's inner width);
//! `channels`, a conv weight's out channels (and so the next conv's in channels). Names
//! are per role, not per layer, so one rule covers every layer.

use std::collections::{BTreeMap, HashMap, HashSet};

use meshc_ir::infer::{infer, norm_axes, norm_axis, Operand};
use meshc_ir::{attrs, Dims, Family, Graph, Op, TensorType};

/// Every dim of every tensor as one slot; slots joined into classes.
struct Classes<'a> {
    base: HashMap<&'a str, usize>,
    shape: HashMap<&'a str, &'a [usize]>,
    parent: Vec<usize>,
}

impl<'a> Classes<'a> {
    fn slot(&self, t: &str, axis: usize) -> Option<usize> {
        Some(self.base.get(t)? + axis).filter(|_| axis < self.shape[t].len())
    }

    fn size(&self, t: &str, axis: usize) -> usize {
        self.shape[t][axis]
    }

    fn rank(&self, t: &str) -> usize {
        self.shape.get(t).map_or(0, |s| s.len())
    }

    fn root(&mut self, mut s: usize) -> usize {
        while self.parent[s] != s {
            self.parent[s] = self.parent[self.parent[s]];
            s = self.parent[s];
        }
        s
    }

    /// Joins dim `i` of `a` with dim `j` of `b`, when both exist and have the same size.
    fn join(&mut self, a: &str, i: usize, b: &str, j: usize) {
        let (Some(x), Some(y)) = (self.slot(a, i), self.slot(b, j)) else { return };
        if self.size(a, i) != self.size(b, j) {
            return;
        }
        let (x, y) = (self.root(x), self.root(y));
        // The older slot stays the root, so names go to classes in graph order.
        self.parent[x.max(y)] = x.min(y);
    }

    /// Joins `a`'s dims with `out`'s, aligned from the right (numpy broadcasting); a dim
    /// of 1 broadcast against a larger one is another dim.
    fn join_aligned(&mut self, a: &str, out: &str) {
        let (ra, ro) = (self.rank(a), self.rank(out));
        for i in 0..ra.min(ro) {
            let (ia, io) = (ra - 1 - i, ro - 1 - i);
            if self.size(a, ia) > 1 || self.size(out, io) == 1 {
                self.join(a, ia, out, io);
            }
        }
    }
}

/// Names the dims of `g`'s inputs and params, and of the nodes whose names inference
/// cannot rebuild from them (a reshape's split dims); `types` holds every tensor's type.
pub fn name_dims(g: &mut Graph, types: &HashMap<String, TensorType>) {
    let names = {
        let mut c = Classes { base: HashMap::new(), shape: HashMap::new(), parent: Vec::new() };
        let all = g.inputs.iter().map(|i| &i.name).chain(g.params.iter().map(|p| &p.name));
        for t in all.chain(g.nodes.iter().map(|n| &n.name)) {
            let Some(ty) = types.get(t) else { continue };
            c.base.insert(t, c.parent.len());
            c.shape.insert(t, &ty.shape);
            let n = c.parent.len();
            c.parent.extend(n..n + ty.shape.len());
        }
        let roles = join_all(&mut c, g);
        name_classes(&mut c, g, &roles)
    };
    let class_dims = |t: &str, rank: usize| -> Option<Dims> {
        let d: Dims = (0..rank).map(|i| names.get(&(t.to_string(), i)).cloned()).collect();
        d.iter().any(Option::is_some).then_some(d)
    };
    for i in &mut g.inputs {
        let mut d = class_dims(&i.name, i.ty.rank()).unwrap_or_else(|| vec![None; i.ty.rank()]);
        // A symbolic dim keeps its ONNX name, whatever its class is called.
        for (k, n) in i.dims.iter().flatten().enumerate() {
            if n.is_some() {
                d[k].clone_from(n);
            }
        }
        i.dims = d.iter().any(Option::is_some).then_some(d);
    }
    for p in &mut g.params {
        p.dims = class_dims(&p.name, p.ty.rank());
    }
    // Nodes get dims only where inference, which carries names forward from the inputs
    // and params, would leave a named dim unnamed: a node with all its dims spelt out on
    // every line would bury the graph in them.
    let mut known: HashMap<String, Option<Dims>> = HashMap::new();
    for i in &g.inputs {
        known.insert(i.name.clone(), i.dims.clone());
    }
    for p in &g.params {
        known.insert(p.name.clone(), p.dims.clone());
    }
    for n in &mut g.nodes {
        let ops: Vec<Operand> =
            n.inputs.iter().filter_map(|i| Some(Operand { ty: types.get(i)?, dims: known.get(i)?.as_ref() })).collect();
        let Some(ty) = types.get(&n.name) else { continue };
        let inferred = if ops.len() == n.inputs.len() { infer(n, &ops).ok().and_then(|r| r.dims) } else { None };
        let mut merged = inferred.clone().unwrap_or_else(|| vec![None; ty.rank()]);
        if let Some(d) = class_dims(&n.name, ty.rank()) {
            for (m, c) in merged.iter_mut().zip(d) {
                if m.is_none() {
                    *m = c;
                }
            }
        }
        let merged = merged.iter().any(Option::is_some).then_some(merged);
        if merged != inferred {
            n.dims.clone_from(&merged);
        }
        known.insert(n.name.clone(), merged);
    }
}

/// What the naming needs to know besides the classes, as slots.
#[derive(Default)]
struct Roles {
    /// The rank-2 weights matmuls read as their rhs (projections), as read.
    projections: Vec<String>,
    /// The weights convs read, as read.
    conv_weights: Vec<String>,
    /// A reshape's split: the dim split, its major part, its minor part.
    splits: Vec<(usize, usize, usize)>,
    /// A reshape's merge: the major part, the minor part, the dim they become.
    merges: Vec<(usize, usize, usize)>,
    /// Dims a matmul broadcasts over (batch dims of its result).
    matmul_batch: Vec<usize>,
}

fn join_all(c: &mut Classes, g: &Graph) -> Roles {
    let params: HashSet<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    let nodes: HashMap<&str, &meshc_ir::Node> = g.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // A weight as an op reads it: a param, or one read through casts (half weights) and
    // transposes (Gemm's transB); the classes join the read with the param.
    let is_weight = |t: &str| {
        let mut t = t;
        while let Some(n) = nodes.get(t).filter(|n| matches!(n.op, Op::Cast | Op::Transpose)) {
            t = n.inputs[0].as_str();
        }
        params.contains(t)
    };
    let mut roles = Roles::default();
    for n in &g.nodes {
        let out = n.name.as_str();
        if !c.shape.contains_key(out) || n.inputs.iter().any(|i| !c.shape.contains_key(i.as_str())) {
            continue;
        }
        let x = n.inputs.first().map(String::as_str).unwrap_or("");
        let (rx, ro) = (c.rank(x), c.rank(out));
        match n.op.family() {
            Family::Unary | Family::Binary | Family::Ternary => {
                for i in &n.inputs {
                    c.join_aligned(i, out);
                }
            }
            _ => {}
        }
        match n.op {
            Op::Softmax | Op::LayerNorm | Op::BroadcastTo | Op::BroadcastLike | Op::Pad => {
                for i in &n.inputs {
                    c.join_aligned(i, out);
                }
            }
            Op::MatMul if n.inputs.len() == 2 && rx >= 2 && c.rank(&n.inputs[1]) >= 2 => {
                let w = n.inputs[1].as_str();
                let rw = c.rank(w);
                c.join(x, rx - 1, w, rw - 2);
                c.join(x, rx - 2, out, ro - 2);
                c.join(w, rw - 1, out, ro - 1);
                for k in 0..ro - 2 {
                    for (t, r) in [(x, rx), (w, rw)] {
                        if k + r >= ro && c.size(t, k + r - ro) > 1 {
                            c.join(t, k + r - ro, out, k);
                        }
                    }
                    roles.matmul_batch.extend(c.slot(out, k));
                }
                if rw == 2 && is_weight(w) {
                    roles.projections.push(w.to_string());
                }
            }
            Op::Transpose => {
                let perm = attrs::Transpose::try_of(n).ok().and_then(|t| t.perm);
                let perm: Vec<usize> = match perm {
                    Some(p) => p.iter().map(|&a| norm_axis(a, rx).unwrap_or(0)).collect(),
                    None => (0..rx).rev().collect(),
                };
                for (i, &p) in perm.iter().enumerate() {
                    c.join(x, p, out, i);
                }
            }
            Op::Reshape => reshape(c, x, out, &mut roles),
            Op::Slice => {
                for i in 0..rx.min(ro) {
                    c.join(x, i, out, i);
                }
            }
            Op::Concat => {
                let axis = attrs::Concat::try_of(n).ok().and_then(|a| norm_axis(a.axis, ro).ok());
                for i in &n.inputs {
                    for k in (0..ro).filter(|&k| Some(k) != axis) {
                        c.join(i, k, out, k);
                    }
                }
            }
            // Its one dim is the length of x's axis.
            Op::Iota => {
                if let Some(axis) = attrs::Iota::try_of(n).ok().and_then(|a| norm_axis(a.axis, rx).ok()) {
                    c.join(x, axis, out, 0);
                }
            }
            Op::Gather => {
                let Some(axis) = attrs::Gather::try_of(n).ok().and_then(|a| norm_axis(a.axis, rx).ok()) else {
                    continue;
                };
                let idx = n.inputs[1].as_str();
                let ri = c.rank(idx);
                for k in 0..axis {
                    c.join(x, k, out, k);
                }
                for k in 0..ri {
                    c.join(idx, k, out, axis + k);
                }
                for k in axis + 1..rx {
                    c.join(x, k, out, k - 1 + ri);
                }
            }
            Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => {
                let Ok(r) = attrs::Reduce::try_of(n) else { continue };
                let axes = match r.axes {
                    Some(a) => norm_axes(&a, rx).unwrap_or_default(),
                    None => (0..rx).collect(),
                };
                let kept = (0..rx).filter(|k| !axes.contains(k));
                for (j, k) in kept.enumerate() {
                    c.join(x, k, out, if r.keepdims { k } else { j });
                }
            }
            Op::Conv if rx >= 2 => {
                let w = n.inputs[1].as_str();
                c.join(x, 0, out, 0);
                c.join(w, 0, out, 1);
                if attrs::Conv::try_of(n).is_ok_and(|a| a.groups == 1) {
                    c.join(x, 1, w, 1);
                }
                if let Some(b) = n.inputs.get(2) {
                    c.join(b, 0, out, 1);
                }
                if is_weight(w) {
                    roles.conv_weights.push(w.to_string());
                }
            }
            Op::MaxPool | Op::AvgPool if rx >= 2 => {
                c.join(x, 0, out, 0);
                c.join(x, 1, out, 1);
            }
            _ => {}
        }
    }
    roles
}

/// A reshape keeps its leading and trailing dims of unchanged size (as inference's names
/// do); between them, one dim split into two, or two merged into one, is recorded.
fn reshape(c: &mut Classes, x: &str, out: &str, roles: &mut Roles) {
    let (old, new) = (c.shape[x].to_vec(), c.shape[out].to_vec());
    let lead = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
    let trail = old.iter().rev().zip(new.iter().rev()).take_while(|(a, b)| a == b).count();
    let trail = trail.min(old.len() - lead).min(new.len() - lead);
    for k in 0..lead {
        c.join(x, k, out, k);
    }
    for k in 0..trail {
        c.join(x, old.len() - 1 - k, out, new.len() - 1 - k);
    }
    let slots = |t: &str, k: usize| c.slot(t, k).expect("within the rank");
    match (old.len() - lead - trail, new.len() - lead - trail) {
        (1, 2) if new[lead] > 1 && new[lead + 1] > 1 => {
            roles.splits.push((slots(x, lead), slots(out, lead), slots(out, lead + 1)));
        }
        (2, 1) if old[lead] > 1 && old[lead + 1] > 1 => {
            roles.merges.push((slots(x, lead), slots(x, lead + 1), slots(out, lead)));
        }
        _ => {}
    }
}

/// The name of each named slot, by (tensor, axis), from the names of the classes.
fn name_classes(c: &mut Classes, g: &Graph, roles: &Roles) -> HashMap<(String, usize), String> {
    let mut names: HashMap<usize, String> = HashMap::new();
    // A class keeps the first name it is given.
    fn give(names: &mut HashMap<usize, String>, c: &mut Classes, slot: usize, name: &str) {
        let r = c.root(slot);
        names.entry(r).or_insert_with(|| name.to_string());
    }
    for i in &g.inputs {
        for (k, n) in i.dims.iter().flatten().enumerate() {
            if let (Some(n), Some(s)) = (n, c.slot(&i.name, k)) {
                give(&mut names, c, s, n);
            }
        }
    }
    // `hidden`: the class most projection weights have a dim in (at least two), the first
    // such class in graph order on a tie.
    let mut count: BTreeMap<usize, usize> = BTreeMap::new();
    for w in &roles.projections {
        for k in 0..2 {
            let s = c.slot(w, k).expect("a projection has rank 2");
            *count.entry(c.root(s)).or_default() += 1;
        }
    }
    let best = count.iter().filter(|(r, _)| !names.contains_key(r)).max_by_key(|&(&r, &n)| (n, std::cmp::Reverse(r)));
    if let Some((&r, _)) = best.filter(|(_, &n)| n >= 2) {
        give(&mut names, c, r, "hidden");
    }
    let batch: HashSet<usize> = roles.matmul_batch.iter().map(|&s| c.root(s)).collect();
    let mut heads = HashSet::new();
    for &(whole, major, minor) in &roles.splits {
        if batch.contains(&c.root(major)) {
            give(&mut names, c, major, "heads");
            give(&mut names, c, minor, "head_dim");
            give(&mut names, c, whole, "heads");
            heads.insert(c.root(major));
        }
    }
    for &(major, _, merged) in &roles.merges {
        if heads.contains(&c.root(major)) {
            give(&mut names, c, merged, "heads");
        }
    }
    let reads: Vec<usize> = roles.projections.iter().map(|w| c.slot(w, 0).expect("rank 2")).collect();
    let inner: HashSet<usize> = reads.into_iter().map(|s| c.root(s)).collect();
    for w in &roles.projections {
        let s = c.slot(w, 1).expect("rank 2");
        if inner.contains(&c.root(s)) {
            give(&mut names, c, s, "ffn");
        }
    }
    // Out channels only: the first conv's in channels are the image's (3, which no mesh
    // axis divides), and every later conv's are the out channels of the one before.
    for w in &roles.conv_weights {
        if let Some(s) = c.slot(w, 0).filter(|_| c.size(w, 0) > 1) {
            give(&mut names, c, s, "channels");
        }
    }
    let mut out = HashMap::new();
    let tensors: Vec<(String, usize)> = c.base.iter().map(|(t, &b)| (t.to_string(), b)).collect();
    for (t, b) in tensors {
        for k in 0..c.rank(&t) {
            if let Some(n) = names.get(&c.root(b + k)) {
                out.insert((t.clone(), k), n.clone());
            }
        }
    }
    out
}
