//! The `layout` pass: gives every tensor of the graph a layout over the mesh, GSPMD-style.
//! What the spec fixes is kept: every dim of a tensor with an explicit entry, the dims a
//! dim-name rule names. The rest is propagated from neighbours until nothing changes:
//! forward from a node's operands to its result, then backward from a result to operands,
//! into tensors that have no layout yet and into the dims a rule left open. When operands
//! disagree about a dimension, the largest operand wins — re-laying-out the smaller one is
//! the cheaper move. A split that would not be legal (axis already used, size not
//! divisible) is dropped, and so is one over a mesh axis of size 1, which splits nothing.
//! Whatever is left is replicated.
//!
//! `corresponding_dims` is the one place that knows, per op, which operand dimension becomes
//! which result dimension; lowering relies on the same table.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::ops::Range;

use meshc_ir::attrs;
use meshc_ir::infer::{norm_axes, norm_axis, parse_equation, slice_range};
use meshc_ir::optim::next_name;
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Node, Op};

use crate::layout::{Seed, Source};
use meshc_runtime::format::mesh::{Layout, Mesh};

/// The layout of every tensor (input, param and node) of a graph.
#[derive(Clone, Debug)]
pub struct Layouts {
    pub mesh: Mesh,
    pub of: BTreeMap<String, Layout>,
    pub source: BTreeMap<String, Source>,
    /// For a tensor that took splits from a neighbour: that neighbour (an operand, or the
    /// result of a node that reads it).
    pub from: BTreeMap<String, String>,
    /// The graph outputs computed by a node whose layout the spec leaves free (neither given
    /// nor ruled) and that no later run reads back (a training step's next state is read in
    /// its state's layout; under a placement, a tensor another stage reads is sent in the
    /// layout the stage gave it). Lowering may leave them split where that saves communication.
    pub free_outputs: BTreeSet<String>,
}

impl Layouts {
    /// Where the layout of `t` came from: the spec's `layouts`, a rule, a neighbour (for a
    /// rule, the dims it left open), or nowhere (replicated).
    pub fn origin(&self, t: &str) -> String {
        match (self.source[t], self.from.get(t)) {
            (Source::Rule, Some(n)) => format!("rule, other dims propagated from {n}"),
            (Source::Propagated, Some(n)) => format!("propagated from {n}"),
            (source, _) => source.name().to_string(),
        }
    }

    /// The splits of the tensors a device holds from run to run — params and a training
    /// step's state (an input S with an output next.S) — as (tensor, entry).
    pub fn held_splits<'g>(&self, g: &'g Graph) -> Vec<(&'g str, usize)> {
        let state = g.inputs.iter().map(|i| &i.name).filter(|n| g.outputs.iter().any(|o| o.name == next_name(n)));
        (g.params.iter().map(|p| &p.name).chain(state))
            .flat_map(|n| self.of.get(n).into_iter().flatten().flatten().map(|&a| (n.as_str(), a)))
            .collect()
    }
}

/// Pairs `(operand dim, result dim)` of operand `i` of `n` that are the same dimension, so a
/// split of one is a split of the other and the op stays slice-wise along it.
pub fn corresponding_dims(n: &Node, i: usize, info: &Info) -> Vec<(usize, usize)> {
    let ins = &info.types[&n.inputs[i]].shape;
    let out = &info.types[&n.name].shape;
    let aligned = |ins: &[usize], out: &[usize]| -> Vec<(usize, usize)> {
        // numpy broadcasting: trailing dims line up; a size-1 dim stretched is not the same.
        let off = out.len().saturating_sub(ins.len());
        (0..ins.len()).filter(|&d| d + off < out.len() && ins[d] == out[d + off]).map(|d| (d, d + off)).collect()
    };
    match n.op {
        Op::MatMul => {
            let (a, b) = (&info.types[&n.inputs[0]].shape, &info.types[&n.inputs[1]].shape);
            let batch = |x: &[usize], keep: usize, out_batch: usize| -> Vec<(usize, usize)> {
                // Batch dims of an operand against the result's batch dims, right-aligned.
                aligned(&x[..x.len() - keep], &out[..out_batch])
            };
            match (a.len(), b.len(), i) {
                (1, _, 0) => vec![],
                (_, 1, 1) => vec![],
                (ra, 1, 0) => (0..ra - 1).map(|d| (d, d)).collect(),
                (1, rb, 1) => {
                    let mut v = batch(b, 2, out.len() - 1);
                    v.push((rb - 1, out.len() - 1));
                    v
                }
                (ra, _, 0) => {
                    let mut v = batch(a, 2, out.len() - 2);
                    v.push((ra - 2, out.len() - 2));
                    v
                }
                (_, rb, _) => {
                    let mut v = batch(b, 2, out.len() - 2);
                    v.push((rb - 1, out.len() - 1));
                    v
                }
            }
        }
        Op::Einsum => {
            let Ok((terms, result)) = parse_equation(&attrs::Einsum::of(n).equation, n.inputs.len()) else {
                return vec![];
            };
            let t = &terms[i];
            (0..t.len())
                .filter(|&d| t.iter().filter(|&&c| c == t[d]).count() == 1)
                .filter_map(|d| result.iter().position(|&c| c == t[d]).map(|p| (d, p)))
                .collect()
        }
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => {
            let axes = reduced_axes(n, ins.len());
            let keep = attrs::Reduce::of(n).keepdims;
            let mut pairs = Vec::new();
            let mut o = 0;
            for d in 0..ins.len() {
                if !axes.contains(&d) {
                    pairs.push((d, o));
                }
                if keep || !axes.contains(&d) {
                    o += 1;
                }
            }
            pairs
        }
        Op::Softmax | Op::Cast => (0..ins.len()).map(|d| (d, d)).collect(),
        Op::LayerNorm => {
            let off = if i == 0 { 0 } else { out.len() - ins.len() };
            (0..ins.len()).map(|d| (d, d + off)).collect()
        }
        Op::Transpose => {
            let perm = match attrs::Transpose::of(n).perm {
                Some(p) => norm_axes(&p, ins.len()).unwrap_or_default(),
                None => (0..ins.len()).rev().collect(),
            };
            perm.iter().enumerate().map(|(j, &p)| (p, j)).collect()
        }
        Op::Reshape => reshape_pairs(ins, out),
        Op::Concat => {
            let axis = norm_axis(attrs::Concat::of(n).axis, ins.len()).unwrap_or(0);
            (0..ins.len()).filter(|&d| d != axis).map(|d| (d, d)).collect()
        }
        Op::Slice => (0..ins.len()).filter(|&d| !sliced(n, ins, d)).map(|d| (d, d)).collect(),
        // The dims off the axes, of the operand and of the update alike; the starts (and a
        // split of an axis, whose window could fall on any device) are whole on each device.
        Op::DynamicSlice | Op::DynamicUpdateSlice if i + 1 < n.inputs.len() => {
            let axes = match n.op {
                Op::DynamicSlice => attrs::DynamicSlice::of(n).axes,
                _ => attrs::DynamicUpdateSlice::of(n).axes,
            };
            let axes = norm_axes(&axes, ins.len()).unwrap_or_default();
            (0..ins.len()).filter(|d| !axes.contains(d)).map(|d| (d, d)).collect()
        }
        Op::DynamicSlice | Op::DynamicUpdateSlice => vec![],
        // Positions are global: a device's part of a split axis would count from 0, so the
        // result is whole on each device.
        Op::Iota => vec![],
        Op::Gather => {
            let data = &info.types[&n.inputs[0]].shape;
            let axis = norm_axis(attrs::Gather::of(n).axis, data.len()).unwrap_or(0);
            let ri = info.types[&n.inputs[1]].shape.len();
            if i == 0 {
                (0..data.len()).filter(|&d| d != axis).map(|d| (d, if d < axis { d } else { d + ri - 1 })).collect()
            } else {
                (0..ri).map(|d| (d, axis + d)).collect()
            }
        }
        // A dim off the axis that the indices span whole splits data, indices and updates
        // alike, and each shard scatters on its own (indices count along the axis, which
        // stays whole); any other split is gathered before the op.
        Op::ScatterElements => {
            let data = &info.types[&n.inputs[0]].shape;
            let idx = &info.types[&n.inputs[1]].shape;
            let axis = norm_axis(attrs::ScatterElements::of(n).axis, data.len()).unwrap_or(0);
            (0..data.len()).filter(|&d| d != axis && idx.get(d) == Some(&data[d])).map(|d| (d, d)).collect()
        }
        // Every dim but the axis: a result element needs every operand element before it
        // along the axis, so a split of the axis is gathered before the op (a shard would
        // sum only its own part; carrying the earlier shards' totals in is not done).
        Op::CumSum => {
            let axis = norm_axis(attrs::CumSum::of(n).axis, ins.len()).unwrap_or(0);
            (0..ins.len()).filter(|&d| d != axis).map(|d| (d, d)).collect()
        }
        Op::Conv => conv_pairs(n, i, info),
        // Batch and channel; the spatial dims change size (a split of them is gathered).
        Op::MaxPool | Op::AvgPool => vec![(0, 0), (1, 1)],
        Op::Pad => {
            let pads = attrs::Pad::of(n).pads;
            (0..ins.len())
                .filter(|&d| pads.get(d) == Some(&0) && pads.get(ins.len() + d) == Some(&0))
                .map(|d| (d, d))
                .collect()
        }
        // q [.., m, d], kᵀ [.., d, s], v [.., s, dv] and the scores' operands (broadcasting to
        // [.., m, s]) give [.., m, dv]: the batch dims pass through, and q's rows are the
        // result's rows.
        Op::Attention => {
            let mut pairs = aligned(&ins[..ins.len().saturating_sub(2)], &out[..out.len() - 2]);
            if i == 0 {
                pairs.push((ins.len() - 2, out.len() - 2));
            }
            pairs
        }
        meshc_ir::communication_ops!() => vec![],
        // Elementwise ops broadcast as numpy does, and so do broadcast_to and broadcast_like.
        meshc_ir::unary_ops!()
        | meshc_ir::binary_ops!()
        | meshc_ir::ternary_ops!()
        | Op::BroadcastTo
        | Op::BroadcastLike => aligned(ins, out),
    }
}

/// conv: the batch passes through; the weight's (and bias's) output channels are the
/// result's channels when each output channel reads all input channels (groups = 1) or
/// exactly its own (depthwise: groups = C = M), where the input's channels are too. Other
/// splits (spatial, input channels, grouped convs) are gathered before the conv.
fn conv_pairs(n: &Node, i: usize, info: &Info) -> Vec<(usize, usize)> {
    let (c, m) = (info.types[&n.inputs[0]].shape[1], info.types[&n.inputs[1]].shape[0]);
    let groups = attrs::Conv::of(n).groups as usize;
    let depthwise = groups > 1 && groups == c && c == m;
    match i {
        0 if depthwise => vec![(0, 0), (1, 1)],
        0 => vec![(0, 0)],
        _ if groups == 1 || depthwise => vec![(0, 1)],
        _ => vec![],
    }
}

/// The dims a reduction reduces (all of them when `axes` is absent).
pub fn reduced_axes(n: &Node, rank: usize) -> Vec<usize> {
    match attrs::Reduce::of(n).axes {
        Some(a) => norm_axes(&a, rank).unwrap_or_default(),
        None => (0..rank).collect(),
    }
}

/// Whether slice `n` changes dim `d` of its operand (anything but the full range, step 1).
pub fn sliced(n: &Node, ins: &[usize], d: usize) -> bool {
    let slice = attrs::Slice::of(n);
    let (starts, ends, steps) = (&slice.starts, &slice.ends, slice.steps_or_ones());
    slice.axes_or_leading().iter().enumerate().any(|(k, &a)| {
        norm_axis(a, ins.len()).ok() == Some(d)
            && (steps.get(k) != Some(&1)
                || slice_range(starts[k], ends[k], 1, ins[d]).map_or(true, |(start, len)| (start, len) != (0, ins[d])))
    })
}

/// For reshape: the first non-unit dim of each group of operand dims whose product equals
/// that of a group of result dims (`reshape_groups`). A split of the first dim of such a
/// group keeps every device's block contiguous on both sides (when both sizes divide by the
/// axis); `reshape_layout` keeps more.
fn reshape_pairs(ins: &[usize], out: &[usize]) -> Vec<(usize, usize)> {
    let first = |s: &[usize], r: Range<usize>| r.clone().find(|&k| s[k] != 1);
    (reshape_groups(ins, out).into_iter()).filter_map(|(i, j)| Some((first(ins, i)?, first(out, j)?))).collect()
}

/// The groups of consecutive operand and result dims of a reshape whose products are equal,
/// smallest first: the reshape only regroups the elements within each.
fn reshape_groups(ins: &[usize], out: &[usize]) -> Vec<(Range<usize>, Range<usize>)> {
    let mut groups = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < ins.len() && j < out.len() {
        let (i0, j0) = (i, j);
        let (mut pi, mut pj) = (ins[i], out[j]);
        i += 1;
        j += 1;
        while pi != pj {
            if pi < pj && i < ins.len() {
                pi *= ins[i];
                i += 1;
            } else if j < out.len() {
                pj *= out[j];
                j += 1;
            } else {
                return groups;
            }
        }
        groups.push((i0..i, j0..j));
    }
    groups
}

/// The layout of the result of reshaping a tensor of shape `ins`, laid out `layout`, to
/// `out`, keeping every split that leaves each device's block a box on both sides. Within
/// a group of dims (`reshape_groups`) the splits must read, major to minor, as consecutive
/// factors of one mesh axis over dims that are cut to width 1 but the last split one (so
/// each device holds one contiguous run of the flattened group); that run is then cut the
/// same way over the result's dims: whole dims first, then a divisor of the next one. So a
/// 32-wide dim over 8 devices becomes 4 heads x 8 as `[axis:(1)4, axis:(4)2]`, and merging
/// those back gives the whole axis. A group whose split does not survive stays unsplit.
pub fn reshape_layout(mesh: &Mesh, ins: &[usize], layout: &[Option<usize>], out: &[usize]) -> Layout {
    let mut result = vec![None; out.len()];
    for (gi, go) in reshape_groups(ins, out) {
        let Some((axis, pre, size)) = flattened(mesh, ins, layout, gi) else { continue };
        for (d, a) in cut_run(mesh, out, go, axis, pre, size).unwrap_or_default() {
            result[d] = Some(a);
        }
    }
    result
}

/// The factors of `axis` after `pre`, `size` of them in all, cut over the `dims` of a tensor
/// of `shape`, major to minor — whole dims first, then a divisor of the next — so that each
/// device's block is one contiguous run of the flattened dims: (dim, entry) pairs, `None`
/// when the factors do not fit.
fn cut_run(
    mesh: &Mesh,
    shape: &[usize],
    dims: Range<usize>,
    axis: usize,
    pre: usize,
    size: usize,
) -> Option<Vec<(usize, usize)>> {
    let (mut at, mut left, mut cut) = (pre, size, Vec::new());
    for d in dims.filter(|&d| shape[d] > 1) {
        if left == 1 {
            break;
        }
        let f = if left.is_multiple_of(shape[d]) { shape[d] } else { left };
        if !shape[d].is_multiple_of(f) {
            break;
        }
        cut.push((d, mesh.part(axis, at, f)));
        at *= f;
        left /= f;
    }
    (left == 1).then_some(cut)
}

/// For a reshape from `ins` to `out` that loses the split of operand dim `d` over `entry`:
/// the operand layout `layout` with that split spread instead over the dims reshaped
/// together with `d`, as one run (`cut_run`: sub-axes of `entry`'s axis where the run spans
/// several dims), and the result's layout, which keeps it. `None` when no such run fits,
/// the reshape would still lose it, or another entry splits those dims.
pub fn reshape_run_layout(
    mesh: &Mesh,
    ins: &[usize],
    layout: &[Option<usize>],
    out: &[usize],
    d: usize,
    entry: usize,
) -> Option<(Layout, Layout)> {
    let (gi, _) = reshape_groups(ins, out).into_iter().find(|(gi, _)| gi.contains(&d))?;
    if gi.clone().any(|k| k != d && layout[k].is_some()) {
        return None;
    }
    let (axis, pre, size) = mesh.split(entry);
    let mut run = layout.to_vec();
    run[d] = None;
    for (k, a) in cut_run(mesh, ins, gi, axis, pre, size)? {
        run[k] = Some(a);
    }
    let result = reshape_layout(mesh, ins, &run, out);
    let kept = result.iter().flatten().any(|&a| mesh.overlaps(a, entry));
    (kept && run.as_slice() != layout).then_some((run, result))
}

/// The split of the dims `group` of a tensor of `shape` laid out `layout`, read as one
/// flattened dim: `(axis, pre, size)` when it is one run of factors of one axis, split as
/// `reshape_layout` needs; `None` when nothing or something else splits the group.
fn flattened(
    mesh: &Mesh,
    shape: &[usize],
    layout: &[Option<usize>],
    group: Range<usize>,
) -> Option<(usize, usize, usize)> {
    let split: Vec<usize> = group.clone().filter(|&d| layout[d].is_some()).collect();
    let (&first, &last) = (split.first()?, split.last()?);
    let (axis, pre, _) = mesh.split(layout[first]?);
    let mut next = pre;
    for &d in &split {
        let (x, p, s) = mesh.split(layout[d]?);
        if x != axis || p != next {
            return None;
        }
        next *= s;
    }
    // Every dim before the last split one is cut to width 1, and none after it is split.
    let whole = (group.start..last).all(|d| layout[d].map_or(1, |a| mesh.shards(a)) == shape[d]);
    whole.then_some((axis, pre, next / pre))
}

/// The splits that carry over between operand `i` of `n` and its result: with `forward`,
/// those of the operand laid out `layout`, as (result dim, entry); else those of the result
/// laid out `layout`, as (operand dim, entry). A reshape keeps what `reshape_layout` keeps.
pub fn carried(
    mesh: &Mesh,
    n: &Node,
    i: usize,
    info: &Info,
    layout: &[Option<usize>],
    forward: bool,
) -> Vec<(usize, usize)> {
    if n.op == Op::Reshape && i == 0 {
        let (ins, out) = (&info.types[&n.inputs[0]].shape, &info.types[&n.name].shape);
        let (from, to) = if forward { (ins, out) } else { (out, ins) };
        let l = reshape_layout(mesh, from, layout, to);
        return l.iter().enumerate().filter_map(|(d, a)| a.map(|a| (d, a))).collect();
    }
    let pairs = corresponding_dims(n, i, info).into_iter();
    let pairs = pairs.map(|(di, dout)| if forward { (di, dout) } else { (dout, di) });
    pairs.filter_map(|(from, to)| layout[from].map(|a| (to, a))).collect()
}

/// Adds to `layout` (of a tensor of `shape`) the candidates `(dim, axis)` that fall on an
/// `open` dim, in priority order, skipping any that would make it illegal; whether any did.
fn extend(mesh: &Mesh, shape: &[usize], layout: &mut Layout, open: &[bool], candidates: &[(usize, usize)]) -> bool {
    let mut added = false;
    for &(d, a) in candidates {
        let free = !layout.iter().flatten().any(|&b| mesh.overlaps(a, b));
        if open[d] && layout[d].is_none() && free && shape[d].is_multiple_of(mesh.shards(a)) {
            layout[d] = Some(a);
            added = true;
        }
    }
    added
}

/// The state of `propagate`.
struct Propagation<'a> {
    mesh: &'a Mesh,
    info: &'a Info,
    of: BTreeMap<String, Layout>,
    source: BTreeMap<String, Source>,
    from: BTreeMap<String, String>,
    /// The dims propagation may still split, of the tensors that have a layout: those a
    /// rule left open. A tensor without a layout has every dim open; one whose splits came
    /// from a neighbour is settled whole.
    open: BTreeMap<String, Vec<bool>>,
}

impl Propagation<'_> {
    /// Adds to tensor `t` the candidates carried from `neighbour`; whether any was taken.
    fn take(&mut self, t: &str, neighbour: &str, candidates: &[(usize, usize)]) -> bool {
        let shape = &self.info.types[t].shape;
        let mut layout = self.of.get(t).cloned().unwrap_or_else(|| vec![None; shape.len()]);
        let open = self.open.get(t).cloned().unwrap_or_else(|| vec![true; shape.len()]);
        if !open.contains(&true) || !extend(self.mesh, shape, &mut layout, &open, candidates) {
            return false;
        }
        self.of.insert(t.to_string(), layout);
        self.source.entry(t.to_string()).or_insert(Source::Propagated);
        self.from.insert(t.to_string(), neighbour.to_string());
        self.open.insert(t.to_string(), vec![false; shape.len()]);
        true
    }
}

/// Runs the pass. `seeds` are the layouts the spec fixes (already legality-checked).
pub fn propagate(g: &Graph, info: &Info, mesh: &Mesh, seeds: BTreeMap<String, Seed>) -> Layouts {
    let (of, source, from, open) = Default::default();
    let mut st = Propagation { mesh, info, of, source, from, open };
    for (name, seed) in seeds {
        // A mesh axis of size 1 (a `data` axis of one device, the axis a stage's sub-mesh
        // takes one slice of) cuts a dim into one block: no split. Recording it would make
        // lowering "gather" it wherever it cannot be kept, a collective over groups of one.
        let layout = seed.layout.iter().map(|a| a.filter(|&a| mesh.shards(a) > 1)).collect();
        st.of.insert(name.clone(), layout);
        st.source.insert(name.clone(), seed.source);
        st.open.insert(name, seed.open);
    }
    let bytes = |t: &str| info.types[t].size_bytes();
    loop {
        let mut changed = false;
        // Forward: a result from its operands, the largest operand first.
        for &k in &info.order {
            let n = &g.nodes[k];
            if n.op.is_communication() {
                continue;
            }
            let mut operands: Vec<usize> = (0..n.inputs.len()).filter(|&i| st.of.contains_key(&n.inputs[i])).collect();
            operands.sort_by_key(|&i| std::cmp::Reverse(bytes(&n.inputs[i])));
            let Some(&first) = operands.first() else { continue };
            let candidates: Vec<(usize, usize)> =
                operands.iter().flat_map(|&i| carried(mesh, n, i, info, &st.of[&n.inputs[i]], true)).collect();
            changed |= st.take(&n.name, &n.inputs[first], &candidates);
        }
        // Backward: operands from their first consumer whose result has a layout.
        for &k in &info.order {
            let n = &g.nodes[k];
            let Some(out) = st.of.get(&n.name).cloned() else { continue };
            if n.op.is_communication() {
                continue;
            }
            for (i, name) in n.inputs.iter().enumerate() {
                changed |= st.take(name, &n.name, &carried(mesh, n, i, info, &out, false));
            }
        }
        if !changed {
            break;
        }
    }
    let Propagation { mut of, mut source, from, .. } = st;
    for name in g.tensor_names() {
        if !of.contains_key(name) {
            of.insert(name.clone(), vec![None; info.types[name].rank()]);
            source.insert(name.clone(), Source::Default);
        }
    }
    debug_assert!(of.iter().all(|(t, l)| mesh.fits(&info.types[t].shape, l)));
    let computed = |o: &String| g.nodes.iter().any(|n| &n.name == o);
    let next_state = |o: &String| g.inputs.iter().any(|i| &next_name(&i.name) == o);
    let free_outputs = (g.outputs.iter().map(|o| &o.name))
        .filter(|o| computed(o) && !next_state(o) && matches!(source[*o], Source::Propagated | Source::Default))
        .cloned()
        .collect();
    Layouts { mesh: mesh.clone(), of, source, from, free_outputs }
}

/// `--dump-after layout`: the mesh, then every tensor in graph order with its global type,
/// its layout, the block each device holds, and where the layout came from.
pub fn dump(g: &Graph, info: &Info, l: &Layouts) -> String {
    let m = &l.mesh;
    let mut s = String::new();
    let shape: Vec<String> = m.shape.iter().map(usize::to_string).collect();
    let _ = writeln!(
        s,
        "# layout of graph {}: {} [{}] axes [{}]",
        g.name,
        m.topology.name(),
        shape.join("x"),
        m.axes.join(", ")
    );
    let names = g.inputs.iter().map(|i| &i.name).chain(g.params.iter().map(|p| &p.name));
    let names = names.chain(info.order.iter().map(|&k| &g.nodes[k].name));
    for name in names {
        let ty = &info.types[name];
        let layout = &l.of[name];
        let local = m.local_shape(&ty.shape, layout);
        let local: Vec<String> = local.iter().map(usize::to_string).collect();
        let _ = writeln!(
            s,
            "{name:<20} {:<24} {:<20} local [{}]  ({})",
            ty.to_string(),
            m.layout_string(layout),
            local.join(", "),
            l.origin(name)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshc_runtime::format::mesh::Topology;

    #[test]
    fn reshapes_keep_splits_that_leave_each_block_a_box() {
        let m8 = Mesh::numbered(&[8], Topology::Mesh);
        let (hi, lo) = (m8.part(0, 1, 4), m8.part(0, 4, 2));
        // 32 split 8 ways into 4 heads x 8: heads 4 ways, head_dim 2 ways; merging is the inverse.
        assert_eq!(reshape_layout(&m8, &[2, 32], &[None, Some(0)], &[2, 4, 8]), vec![None, Some(hi), Some(lo)]);
        assert_eq!(reshape_layout(&m8, &[2, 4, 8], &[None, Some(hi), Some(lo)], &[2, 32]), vec![None, Some(0)]);
        // Enough heads: the major dim takes the whole split.
        assert_eq!(reshape_layout(&m8, &[64], &[Some(0)], &[8, 8]), vec![Some(0), None]);
        // Splits of dims outside the regrouped ones pass through.
        let m = Mesh::numbered(&[2, 4], Topology::Mesh);
        assert_eq!(reshape_layout(&m, &[2, 32], &[Some(0), Some(1)], &[2, 4, 8]), vec![Some(0), Some(1), None]);
        // Not one contiguous run of the merged dim: a split minor dim alone, half the heads
        // with halves of head_dim, two different axes, blocks that straddle rows.
        let m4 = Mesh::numbered(&[4], Topology::Mesh);
        assert_eq!(reshape_layout(&m4, &[4, 8], &[None, Some(0)], &[32]), vec![None]);
        let halves = [Some(m4.part(0, 1, 2)), Some(m4.part(0, 2, 2))];
        assert_eq!(reshape_layout(&m4, &[4, 8], &halves, &[32]), vec![None]);
        let m22 = Mesh::numbered(&[2, 2], Topology::Mesh);
        assert_eq!(reshape_layout(&m22, &[2, 2], &[Some(0), Some(1)], &[4]), vec![None]);
        assert_eq!(reshape_layout(&m4, &[24], &[Some(0)], &[6, 4]), vec![None, None]);
        // A sub-axis splits further into its own factors.
        let (a, b) = (m8.part(0, 2, 2), m8.part(0, 4, 2));
        assert_eq!(reshape_layout(&m8, &[16], &[Some(m8.part(0, 2, 4))], &[2, 8]), vec![Some(a), Some(b)]);
    }

    #[test]
    fn a_lost_split_spread_over_the_reshaped_dims_as_sub_axes_is_kept() {
        let m4 = Mesh::numbered(&[4], Topology::Mesh);
        // [2, 16] with 16 split 4 ways merges to [32] only if each device holds a contiguous
        // run: 2 x 2 blocks, row-major, are the 4 quarters of 32.
        let (hi, lo) = (m4.part(0, 1, 2), m4.part(0, 2, 2));
        let run = reshape_run_layout(&m4, &[2, 16], &[None, Some(0)], &[32], 1, 0);
        assert_eq!(run, Some((vec![Some(hi), Some(lo)], vec![Some(0)])));
        // Dims outside the group keep their split; the whole axis on the major dim needs no
        // sub-axes.
        let m24 = Mesh::numbered(&[2, 4], Topology::Mesh);
        let run = reshape_run_layout(&m24, &[2, 4, 8], &[Some(0), None, Some(1)], &[2, 32], 2, 1);
        assert_eq!(run, Some((vec![Some(0), Some(1), None], vec![Some(0), Some(1)])));
        // No run fits (6 x 4 cut 4 ways straddles rows), or another entry splits the group.
        assert_eq!(reshape_run_layout(&m4, &[6, 4], &[None, Some(0)], &[24], 1, 0), None);
        assert_eq!(reshape_run_layout(&m24, &[2, 16], &[Some(0), Some(1)], &[32], 1, 1), None);
    }
}
