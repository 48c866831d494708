//! The `lower` pass (docs/design.md §4.2): from a graph whose tensors all have layouts to one program
//! per device — the slice-wise instance of every op on the block each device holds, with
//! communication only where slice-wise results are not the answer.
//!
//! Per node: the operands are brought to the layouts the op needs (`reshard`), the local op
//! runs, and its result — possibly a partial sum over mesh axes — is brought to the node's
//! layout. `reshard` is the only place that inserts communication:
//! - a partial result: reduce_scatter when the target splits a dimension over that axis,
//!   all_reduce otherwise;
//! - a split that must go: all_to_all when the same axis moves to another dimension,
//!   all_gather otherwise;
//! - a split to add: a local slice, no communication.
//!
//! Contractions (matmul, einsum) and reductions keep a split contracted/reduced dimension
//! split and all-reduce the partial results — or reduce-scatter them, when only elementwise
//! ops read them on the way to graph outputs the spec leaves free (`scatter_plan`: those ops
//! then run split, and the outputs stay split for the runner to assemble); softmax and layer_norm over a split axis are
//! decomposed so that their statistics (max and sum; mean and variance) are combined over the
//! axis. Params are held whole by every device (they are mapped from the artifact) and each
//! device slices its block locally; compile folds those slices into per-device weights.
//! Inputs and outputs are scattered and gathered by the runner, by their layouts.
//!
//! Every device's program has the same nodes in the same order (SPMD), so a collective is
//! named alike on all members of its group; only the bounds of local slices differ.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{bail, Result};
use meshc_ir::attrs::{self, ScatterReduction};
use meshc_ir::infer::norm_axis;
use meshc_ir::verify::Info;
use meshc_ir::{Attr, Attrs, DType, Graph, Input, Node, Op, Output, Param, ParamData, TensorType};

use super::layout::{carried, corresponding_dims, reduced_axes, Layouts};
use crate::layout::Source;
use meshc_runtime::format::mesh::{Layout, Mesh};
use meshc_runtime::format::program::{Rule, StageMesh, Why};

/// One program per device, plus the layouts of the graph's inputs and outputs.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub mesh: Mesh,
    pub devices: Vec<Graph>,
    pub inputs: Vec<(String, Layout)>,
    pub outputs: Vec<(String, Layout)>,
    /// With placement: the stage that holds each graph input and output (its layout above
    /// is over that stage's sub-mesh).
    pub io_stages: BTreeMap<String, StageMesh>,
    /// Why each communication step is there, by `attribution::key` (priced over `mesh`).
    pub why: BTreeMap<String, Why>,
    /// Params a reader slices other than the spec's explicit layout says.
    pub overridden: Vec<Overridden>,
    /// Partial sums all-reduced where a reduce_scatter would have done but for the layouts
    /// the spec's `layouts` entries give some tensors: node -> those tensors (`explain`
    /// suggests leaving them free).
    pub pinned: BTreeMap<String, Vec<String>>,
}

/// A param the spec gives a layout explicitly, read by `node` in another one. Every device
/// maps the whole param from the artifact, so lowering slices it locally in the layout its
/// reader needs: no communication, where keeping the spec's layout would reshard it (and the
/// device stores the block it reads, which may be larger than the spec's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Overridden {
    pub param: String,
    pub node: String,
    /// The spec's layout, and the one `node` reads (`Mesh::layout_string`, over the stage's
    /// sub-mesh under a placement).
    pub spec: String,
    pub read: String,
}

impl Lowered {
    /// `g` (verified as `info`) on one device, as it is.
    pub fn single(g: &Graph, info: &Info) -> Lowered {
        let unsplit = |name: &str| (name.to_string(), vec![None; info.types[name].rank()]);
        Lowered {
            mesh: Mesh::single(),
            devices: vec![g.clone()],
            inputs: g.inputs.iter().map(|i| unsplit(&i.name)).collect(),
            outputs: g.outputs.iter().map(|o| unsplit(&o.name)).collect(),
            io_stages: BTreeMap::new(),
            why: BTreeMap::new(),
            overridden: Vec::new(),
            pinned: BTreeMap::new(),
        }
    }
}

struct Lower<'a> {
    g: &'a Graph,
    info: &'a Info,
    mesh: &'a Mesh,
    layouts: &'a Layouts,
    devs: Vec<Graph>,
    /// Local type of every local tensor (the same on every device).
    types: HashMap<String, TensorType>,
    /// The local tensor that holds a global tensor in a layout.
    versions: HashMap<(String, Layout), String>,
    /// The local tensor that holds a global tensor (not a param) in its own layout.
    home: HashMap<String, String>,
    /// The record each collective emitted now gets (set around each reshard).
    cause: Option<Why>,
    why: BTreeMap<String, Why>,
    overridden: Vec<Overridden>,
    /// Layouts `scatter_plan` changed from the layout pass's.
    relaid: HashMap<String, Layout>,
    /// The mesh axes that split a param or state (`Layouts::held_splits`).
    model_axes: BTreeSet<usize>,
    pinned: BTreeMap<String, Vec<String>>,
}

fn groups_attr(groups: Vec<Vec<usize>>) -> Attr {
    Attr::List(groups.into_iter().map(|g| Attr::List(g.into_iter().map(|d| Attr::Int(d as i64)).collect())).collect())
}

fn ints(v: impl IntoIterator<Item = usize>) -> Attr {
    Attr::List(v.into_iter().map(|x| Attr::Int(x as i64)).collect())
}

impl Lower<'_> {
    fn fresh(&self, base: &str, what: &str) -> String {
        let mut name = format!("{base}.{what}");
        let mut k = 1;
        while self.types.contains_key(&name) || self.info.types.contains_key(&name) {
            k += 1;
            name = format!("{base}.{what}{k}");
        }
        name
    }

    /// Adds a node to every device; `per_device` may vary its attrs by device.
    fn emit_with(
        &mut self,
        name: &str,
        op: Op,
        inputs: &[&str],
        ty: TensorType,
        per_device: impl Fn(usize) -> Attrs,
    ) -> String {
        for (d, dev) in self.devs.iter_mut().enumerate() {
            let mut n = Node::new(name, op, inputs);
            n.attrs = per_device(d);
            n.dtype = Some(ty.dtype);
            n.shape = Some(ty.shape.clone());
            n.device = Some(d as u32);
            dev.nodes.push(n);
        }
        self.types.insert(name.to_string(), ty);
        name.to_string()
    }

    fn emit(&mut self, name: &str, op: Op, inputs: &[&str], ty: TensorType, attrs: Attrs) -> String {
        self.emit_with(name, op, inputs, ty, |_| attrs.clone())
    }

    fn global(&self, t: &str) -> &TensorType {
        &self.info.types[t]
    }

    fn local_ty(&self, t: &str, layout: &[Option<usize>]) -> TensorType {
        let ty = self.global(t);
        TensorType::new(ty.dtype, self.mesh.local_shape(&ty.shape, layout))
    }

    fn collective(
        &mut self,
        t: &str,
        src: &str,
        op: Op,
        axes: &[usize],
        attrs: Attrs,
        after: &[Option<usize>],
    ) -> String {
        let name = self.fresh(t, op.name());
        let mut attrs = attrs;
        attrs.insert("groups".into(), groups_attr(self.mesh.groups(axes)));
        let ty = self.local_ty(t, after);
        self.attribute(&name);
        self.emit(&name, op, &[src], ty, attrs)
    }

    /// Records the current cause for the collective `name`.
    fn attribute(&mut self, name: &str) {
        let cause = self.cause.clone().expect("every collective is emitted with its cause");
        self.why.insert(name.to_string(), cause);
    }

    /// The record of a step that brings `tensor` from `from` to `to` for node `n`.
    fn cause(&self, n: &Node, tensor: &str, from: String, to: &[Option<usize>], rule: Rule) -> Why {
        Why {
            node: n.name.clone(),
            tensor: tensor.to_string(),
            from,
            to: self.mesh.layout_string(to),
            rule,
            bytes_per_device: 0,
            busiest_link: 0,
        }
    }

    /// Why operand `i` of `n`, laid out `cur`, must be brought to `req`: the rule behind the
    /// first split it loses.
    fn operand_rule(&self, n: &Node, i: usize, cur: &[Option<usize>], req: &[Option<usize>]) -> Rule {
        let Some(d) = (0..cur.len()).find(|&d| cur[d].is_some() && req[d] != cur[d]) else {
            return Rule::OperandLayoutsDisagree;
        };
        let dout = corresponding_dims(n, i, self.info).into_iter().find(|p| p.0 == d).map(|p| p.1);
        // Whether a reshape could carry the split of dim d: then the result's layout lost it.
        let keeps = || {
            let kept = carried(self.mesh, n, i, self.info, cur, true);
            let mut result = vec![None; self.global(&n.name).rank()];
            kept.into_iter().for_each(|(o, a)| result[o] = Some(a));
            carried(self.mesh, n, i, self.info, &result, false).contains(&(d, cur[d].expect("split")))
        };
        match (n.op, dout) {
            (Op::Reshape, _) if !keeps() => Rule::ReshapeCannotKeepSplit,
            (Op::MatMul | Op::Einsum, None) => Rule::ContractionNeedsOtherSplit,
            (op, None) if op != Op::Reshape => Rule::OpReadsWholeDim,
            _ if matches!(self.layouts.source.get(&n.name), Some(Source::Spec | Source::Rule)) => {
                Rule::LayoutGivenInSpec
            }
            _ => Rule::OperandLayoutsDisagree,
        }
    }

    /// A local slice that splits dims of `src` (holding `t` in layout `from`) to `to`.
    fn split_locally(&mut self, t: &str, src: &str, from: &[Option<usize>], to: &[Option<usize>]) -> String {
        let dims: Vec<usize> = (0..to.len()).filter(|&d| to[d].is_some() && from[d].is_none()).collect();
        let name = self.fresh(t, "split");
        let shape = self.mesh.local_shape(&self.global(t).shape, from);
        let ty = self.local_ty(t, to);
        let mesh = self.mesh.clone();
        self.emit_with(&name, Op::Slice, &[src], ty, |d| {
            let entry = |k: usize| to[k].expect("split dim");
            let block = |k: usize| shape[k] / mesh.shards(entry(k));
            let mut a = Attrs::new();
            a.insert("axes".into(), ints(dims.iter().copied()));
            a.insert("starts".into(), ints(dims.iter().map(|&k| mesh.coord(d, entry(k)) * block(k))));
            a.insert("ends".into(), ints(dims.iter().map(|&k| (mesh.coord(d, entry(k)) + 1) * block(k))));
            a
        })
    }

    /// Brings `src`, holding global tensor `t` in layout `from` (partial over the mesh axes
    /// `partial`, to be combined by `reduce`), to layout `to`. Returns the local name.
    fn reshard(
        &mut self,
        t: &str,
        src: &str,
        from: &[Option<usize>],
        partial: &[usize],
        reduce: &str,
        to: &[Option<usize>],
    ) -> String {
        let mut cur = src.to_string();
        let mut from = from.to_vec();
        let rank = from.len();
        let mut rest = Vec::new();
        let reduce_attr = |a: &mut Attrs| {
            a.insert("reduce".into(), Attr::Str(reduce.into()));
        };
        for &a in partial {
            match (0..rank).find(|&d| to[d] == Some(a) && from[d].is_none()) {
                Some(d) => {
                    from[d] = Some(a);
                    let mut attrs = Attrs::new();
                    attrs.insert("axis".into(), Attr::Int(d as i64));
                    reduce_attr(&mut attrs);
                    cur = self.collective(t, &cur, Op::ReduceScatter, &[a], attrs, &from);
                }
                None => rest.push(a),
            }
        }
        if !rest.is_empty() {
            let mut attrs = Attrs::new();
            reduce_attr(&mut attrs);
            cur = self.collective(t, &cur, Op::AllReduce, &rest, attrs, &from);
        }
        for d in 0..rank {
            let Some(a) = from[d] else { continue };
            if to[d] == Some(a) {
                continue;
            }
            let mut attrs = Attrs::new();
            from[d] = None;
            match (0..rank).find(|&e| to[e] == Some(a) && from[e].is_none()) {
                Some(e) => {
                    from[e] = Some(a);
                    attrs.insert("split_axis".into(), Attr::Int(e as i64));
                    attrs.insert("concat_axis".into(), Attr::Int(d as i64));
                    cur = self.collective(t, &cur, Op::AllToAll, &[a], attrs, &from);
                }
                None => {
                    attrs.insert("axis".into(), Attr::Int(d as i64));
                    cur = self.collective(t, &cur, Op::AllGather, &[a], attrs, &from);
                }
            }
        }
        if from != to {
            cur = self.split_locally(t, &cur, &from, to);
        }
        cur
    }

    /// The local name of operand `i` of `n` (global tensor `t`) in layout `to`, resharding
    /// its first version. Params are sliced from the whole param every device holds.
    fn operand(&mut self, n: &Node, i: usize, to: &[Option<usize>]) -> String {
        let t = n.inputs[i].as_str();
        let key = (t.to_string(), to.to_vec());
        if let Some(v) = self.versions.get(&key) {
            return v.clone();
        }
        let v = if self.g.params.iter().any(|p| p.name == t) {
            let given = &self.layouts.of[t];
            if self.layouts.source.get(t) == Some(&Source::Spec) && given.as_slice() != to {
                self.overridden.push(Overridden {
                    param: t.to_string(),
                    node: n.name.clone(),
                    spec: self.mesh.layout_string(given),
                    read: self.mesh.layout_string(to),
                });
            }
            let whole = vec![None; to.len()];
            self.split_locally(t, t, &whole, to)
        } else {
            let src = self.home[t].clone();
            let layout = self.layout_of(t);
            let rule = self.operand_rule(n, i, &layout, to);
            self.cause = Some(self.cause(n, t, self.mesh.layout_string(&layout), to, rule));
            let v = self.reshard(t, &src, &layout, &[], "sum", to);
            self.cause = None;
            v
        };
        self.versions.insert(key, v.clone());
        v
    }

    /// Names the last emitted node `name` (the node's own name on every device).
    fn finish(&mut self, n: &Node, local: String, layout: Layout) {
        if local != n.name {
            for dev in &mut self.devs {
                let last = dev.nodes.last_mut().expect("a node was emitted");
                debug_assert_eq!(last.name, local);
                last.name = n.name.clone();
            }
            let ty = self.types.remove(&local).expect("emitted");
            self.types.insert(n.name.clone(), ty);
            if let Some(w) = self.why.remove(&local) {
                self.why.insert(n.name.clone(), w);
            }
        }
        self.versions.insert((n.name.clone(), layout), n.name.clone());
        self.home.insert(n.name.clone(), n.name.clone());
    }

    fn node(&mut self, n: &Node, out: &Layout) -> Result<()> {
        use meshc_ir::{binary_ops, communication_ops, movement_ops, scan_ops, ternary_ops, unary_ops, window_ops};
        let (local, natural, partial, reduce) = match n.op {
            Op::MatMul | Op::Einsum => self.contraction(n, out),
            Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => self.reduction(n, out),
            Op::Softmax => self.softmax(n, out),
            Op::LayerNorm => self.layer_norm(n, out),
            Op::ScatterElements if self.adds_into_zeros(n) => self.scatter_add(n, out),
            // Slice by slice along the dims `corresponding_dims` pairs with the result (the
            // layout pass gathers the others first): elementwise ops, data movement, windows
            // over batch and channels, scans off their axis, attention over its batch dims and
            // query rows.
            unary_ops!()
            | binary_ops!()
            | ternary_ops!()
            | movement_ops!()
            | window_ops!()
            | scan_ops!()
            | Op::Attention => self.slicewise(n, out),
            communication_ops!() => bail!(
                "node '{}': {} cannot be combined with a layout spec (lowering inserts collectives itself)",
                n.name,
                n.op
            ),
        };
        let mut out = out.clone();
        let mut rule = match n.op {
            Op::MatMul | Op::Einsum => Rule::ContractionOverSplitDim,
            Op::ScatterElements => Rule::ScatterAddOfSplitUpdates,
            _ => Rule::ReductionOverSplitDim,
        };
        if !partial.is_empty() {
            match self.scatter_plan(n, &natural, &partial, &out) {
                Ok(plan) => {
                    out = plan[&n.name].clone();
                    self.relaid.extend(plan);
                    rule = Rule::PartialSumScattered;
                }
                Err(pinned) if !pinned.is_empty() => {
                    self.pinned.insert(n.name.clone(), pinned);
                }
                Err(_) => {}
            }
        }
        let out = &out;
        let result = if natural == *out && partial.is_empty() {
            local
        } else {
            let axes: Vec<String> = partial.iter().map(|&a| self.mesh.entry_name(a)).collect();
            let from = format!("{} partial({})", self.mesh.layout_string(&natural), axes.join(", "));
            self.cause = Some(self.cause(n, &n.name, from, out, rule));
            let r = self.reshard(&n.name, &local, &natural, &partial, reduce, out);
            self.cause = None;
            r
        };
        self.finish(n, result, out.clone());
        Ok(())
    }

    /// The layout global tensor `t` was given (a param's is where it prefers to be sliced).
    fn current(&self, t: &str) -> Layout {
        self.layout_of(t)
    }

    /// The layout of `t`: the layout pass's, unless `scatter_plan` changed it.
    fn layout_of(&self, t: &str) -> Layout {
        self.relaid.get(t).unwrap_or(&self.layouts.of[t]).clone()
    }

    /// The layouts under which the partial sum `n` (held in `natural`, partial over
    /// `partial`) is reduce-scattered instead of all-reduced into `out`. That needs every
    /// reader of it, and of theirs, to be elementwise, up to graph outputs the spec leaves
    /// free (`Layouts::free_outputs`), and for each axis the all_reduce would combine a dim
    /// of `n` whose split those readers carry to their results; they then run split (their
    /// other operands sliced locally, never moved: none of those may hold a factor of the
    /// axis) and the outputs stay split, gathered by the runner on the host, which is no
    /// mesh link. On a ring that halves the bytes (GSPMD all-reduces there, and splits the
    /// elementwise tail only if an output sharding asks for it). Gives the new layouts of `n`
    /// and the readers. Only over axes that split a param or state (model parallelism): a
    /// data-parallel partial sum stays an all_reduce, the collective the runner re-plans
    /// around a lost device (a reduce_scatter's block of a lost member goes to no one).
    /// `Err(ts)` when only the spec's `layouts` entries of the tensors `ts` stand in the way
    /// (a dim-name rule, which pins every tensor of those dims, does not count: no change to
    /// one tensor's entry would free it).
    fn scatter_plan(
        &self,
        n: &Node,
        natural: &Layout,
        partial: &[usize],
        out: &Layout,
    ) -> std::result::Result<HashMap<String, Layout>, Vec<String>> {
        let mesh = self.mesh;
        let axes: Vec<usize> = partial.iter().copied().filter(|&a| !out.contains(&Some(a))).collect();
        if axes.is_empty() || !axes.iter().all(|&a| self.model_axes.contains(&mesh.split(a).0)) {
            return Err(Vec::new());
        }
        // The readers, and theirs, in graph order.
        let mut names: BTreeSet<&str> = BTreeSet::from([n.name.as_str()]);
        let mut chain: Vec<&Node> = Vec::new();
        for &k in &self.info.order {
            let r = &self.g.nodes[k];
            if r.name != n.name && r.inputs.iter().any(|i| names.contains(i.as_str())) {
                if !r.op.is_elementwise() {
                    return Err(Vec::new());
                }
                names.insert(&r.name);
                chain.push(r);
            }
        }
        let mut pinned = Vec::new();
        for &t in &names {
            match self.layouts.source.get(t) {
                Some(Source::Spec) => pinned.push(t.to_string()),
                Some(Source::Rule) => return Err(Vec::new()),
                _ if self.g.outputs.iter().any(|o| o.name == t) && !self.layouts.free_outputs.contains(t) => {
                    return Err(Vec::new())
                }
                _ => {}
            }
        }
        let mut plan: HashMap<String, Layout> = names.iter().map(|&t| (t.to_string(), self.layout_of(t))).collect();
        for a in axes {
            let fits = |plan: &HashMap<String, Layout>, t: &str, d: usize| {
                let l = &plan[t];
                l[d].is_none()
                    && !self.overlaps_any(l.iter().flatten(), a)
                    && self.global(t).shape[d].is_multiple_of(mesh.shards(a))
            };
            // The dim of each tensor of the chain that `a` splits, from a dim of `n`'s.
            let carry = |d0: usize| -> Option<HashMap<&str, usize>> {
                if natural[d0].is_some() || !fits(&plan, &n.name, d0) {
                    return None;
                }
                let mut dim_of: HashMap<&str, usize> = HashMap::from([(n.name.as_str(), d0)]);
                for r in &chain {
                    let mut at = None;
                    for (i, t) in r.inputs.iter().enumerate() {
                        let Some(&d) = dim_of.get(t.as_str()) else { continue };
                        let dr = corresponding_dims(r, i, self.info).into_iter().find(|p| p.0 == d)?.1;
                        if at.is_some_and(|x| x != dr) {
                            return None;
                        }
                        at = Some(dr);
                    }
                    let dr = at?;
                    let moved = |t: &String| {
                        !dim_of.contains_key(t.as_str())
                            && !self.g.params.iter().any(|p| &p.name == t)
                            && self.overlaps_any(self.layout_of(t).iter().flatten(), a)
                    };
                    if !fits(&plan, &r.name, dr) || r.inputs.iter().any(moved) {
                        return None;
                    }
                    dim_of.insert(&r.name, dr);
                }
                Some(dim_of)
            };
            let dims = (0..natural.len()).find_map(carry).ok_or_else(Vec::new)?;
            for (t, d) in dims {
                plan.get_mut(t).expect("in the chain")[d] = Some(a);
            }
        }
        if pinned.is_empty() {
            Ok(plan)
        } else {
            Err(pinned)
        }
    }

    /// Whether entry `a` shares a factor of a mesh axis with one of `used`.
    fn overlaps_any<'u>(&self, mut used: impl Iterator<Item = &'u usize>, a: usize) -> bool {
        used.any(|&b| self.mesh.overlaps(a, b))
    }

    fn local_name(&self, n: &Node) -> String {
        self.fresh(&n.name, "local")
    }

    /// Ops that are slice-wise along every dimension they carry from operand to result.
    fn slicewise(&mut self, n: &Node, out: &Layout) -> (String, Layout, Vec<usize>, &'static str) {
        let mut covered = vec![n.op == Op::BroadcastTo; out.len()];
        let mut operands = Vec::new();
        for (i, t) in n.inputs.iter().enumerate() {
            let mut req = vec![None; self.global(t).rank()];
            for (di, a) in carried(self.mesh, n, i, self.info, out, false) {
                req[di] = Some(a);
            }
            // What the operand in `req` gives the result (a reshape may keep less than asked).
            for (dout, a) in carried(self.mesh, n, i, self.info, &req, true) {
                covered[dout] |= out[dout] == Some(a);
            }
            operands.push(self.operand(n, i, &req));
        }
        let natural: Layout = out.iter().zip(&covered).map(|(&a, &c)| if c { a } else { None }).collect();
        let ty = self.local_ty(&n.name, &natural);
        let mut attrs = n.attrs.clone();
        match n.op {
            Op::Reshape | Op::BroadcastTo => {
                attrs = attrs::Shape { shape: ty.shape.iter().map(|&d| d as i64).collect() }.to_attrs();
            }
            Op::Slice => {
                // Split dims are never sliced (they are not covered otherwise): drop them.
                let rank = out.len();
                let slice = attrs::Slice::of(n);
                let axes = slice.axes_or_leading();
                let keep: Vec<usize> = (0..axes.len())
                    .filter(|&k| norm_axis(axes[k], rank).map_or(true, |d| natural[d].is_none()))
                    .collect();
                let pick = |v: &[i64]| keep.iter().map(|&k| v[k]).collect::<Vec<i64>>();
                let local = attrs::Slice {
                    starts: pick(&slice.starts),
                    ends: pick(&slice.ends),
                    axes: Some(pick(&axes)),
                    steps: slice.steps.as_deref().map(pick),
                };
                attrs = local.to_attrs();
            }
            // A depthwise conv split over its channels has that many groups locally.
            Op::Conv if natural[1].is_some() && attrs::Conv::of(n).groups > 1 => {
                attrs = attrs::Conv { groups: ty.shape[1] as i64, ..attrs::Conv::of(n) }.to_attrs();
            }
            // Attributes that hold no size of a split dim stay as they are (pads and
            // windows only touch dims that are not split).
            meshc_ir::unary_ops!()
            | meshc_ir::binary_ops!()
            | meshc_ir::ternary_ops!()
            | Op::Transpose
            | Op::BroadcastLike
            | Op::Concat
            | Op::Gather
            | Op::ScatterElements
            | Op::DynamicSlice
            | Op::DynamicUpdateSlice
            | Op::Iota
            | Op::Pad
            | Op::Conv
            | Op::MaxPool
            | Op::AvgPool
            | Op::CumSum
            | Op::Attention => {}
            Op::MatMul
            | Op::Einsum
            | Op::ReduceSum
            | Op::ReduceMean
            | Op::ReduceMax
            | Op::Softmax
            | Op::LayerNorm
            | meshc_ir::communication_ops!() => unreachable!("{} is not lowered slice-wise", n.op),
        }
        let name = self.local_name(n);
        let refs: Vec<&str> = operands.iter().map(String::as_str).collect();
        let local = self.emit(&name, n.op, &refs, ty, attrs);
        (local, natural, vec![], "sum")
    }

    /// matmul and einsum: every operand dim is an output dim (split as the output), or a
    /// contracted dim, kept split when an operand already is (the result is then partial).
    fn contraction(&mut self, n: &Node, out: &Layout) -> (String, Layout, Vec<usize>, &'static str) {
        let ro = out.len();
        // Letters: result dims are 0..ro; the contracted dim of matmul is ro; einsum
        // letters not in the result get numbers from ro on.
        let mut letters: Vec<Vec<usize>> = Vec::new();
        if n.op == Op::Einsum {
            let eq = attrs::Einsum::of(n).equation;
            let (terms, result) = meshc_ir::infer::parse_equation(&eq, n.inputs.len()).expect("verified");
            let mut extra: Vec<char> = Vec::new();
            for t in &terms {
                letters.push(
                    t.iter()
                        .map(|c| match result.iter().position(|r| r == c) {
                            Some(p) => p,
                            None => {
                                if !extra.contains(c) {
                                    extra.push(*c);
                                }
                                ro + extra.iter().position(|e| e == c).expect("pushed")
                            }
                        })
                        .collect(),
                );
            }
        } else {
            let mut fresh = ro + 1;
            for i in 0..2 {
                let rank = self.global(&n.inputs[i]).rank();
                let pairs = corresponding_dims(n, i, self.info);
                let k = if i == 0 { rank - 1 } else { rank.saturating_sub(2).min(rank - 1) };
                let v = (0..rank)
                    .map(|d| match pairs.iter().find(|p| p.0 == d) {
                        Some(&(_, o)) => o,
                        None if d == k => ro,
                        None => {
                            fresh += 1;
                            fresh
                        }
                    })
                    .collect();
                letters.push(v);
            }
        }
        // A letter repeated within one operand (a diagonal) is never split.
        let repeated = |l: usize| letters.iter().any(|t| t.iter().filter(|&&x| x == l).count() > 1);
        let size_of = |this: &Self, l: usize| -> usize {
            letters
                .iter()
                .zip(&n.inputs)
                .find_map(|(t, name)| t.iter().position(|&x| x == l).map(|d| this.global(name).shape[d]))
                .unwrap_or(1)
        };
        let mut axis_of: HashMap<usize, Option<usize>> = HashMap::new();
        let mut natural = out.clone();
        for (o, a) in natural.iter_mut().enumerate() {
            if repeated(o) || letters.iter().all(|t| !t.contains(&o)) {
                *a = None;
            }
            axis_of.insert(o, *a);
        }
        let mut partial = Vec::new();
        let f32 = self.global(&n.name).dtype == DType::F32;
        // A contracted dim split over an axis the spec puts on one of the result's dims (a
        // weight gradient sharded over the data axis, `--zero`): the local blocks are
        // contracted and the partial sums reduce-scattered, instead of gathering the operands.
        let given = self.layouts.source.get(&n.name) == Some(&Source::Spec);
        for (i, t) in n.inputs.iter().enumerate().filter(|_| f32 && given) {
            for (d, _) in letters[i].iter().enumerate().filter(|&(_, &l)| l >= ro && !repeated(l)) {
                if let Some(o) = self.current(t)[d].and_then(|a| natural.iter().position(|&x| x == Some(a))) {
                    natural[o] = None;
                    axis_of.insert(o, None);
                }
            }
        }
        for (i, t) in n.inputs.iter().enumerate().filter(|_| f32) {
            let cur = self.current(t);
            for (d, &l) in letters[i].iter().enumerate() {
                if l < ro || axis_of.contains_key(&l) {
                    continue;
                }
                let ok = |a: usize| {
                    !repeated(l)
                        && !self.overlaps_any(natural.iter().flatten().chain(&partial), a)
                        && size_of(self, l).is_multiple_of(self.mesh.shards(a))
                };
                if let Some(a) = cur[d].filter(|&a| ok(a)) {
                    axis_of.insert(l, Some(a));
                    partial.push(a);
                }
            }
        }
        let mut operands = Vec::new();
        for (i, t) in n.inputs.iter().enumerate() {
            let shape = &self.global(t).shape;
            let req: Layout = letters[i]
                .iter()
                .enumerate()
                .map(|(d, l)| {
                    axis_of
                        .get(l)
                        .copied()
                        .flatten()
                        .filter(|&a| shape[d].is_multiple_of(self.mesh.shards(a)) && shape[d] > 1)
                })
                .collect();
            operands.push(self.operand(n, i, &req));
        }
        let ty = self.local_ty(&n.name, &natural);
        let name = self.local_name(n);
        let refs: Vec<&str> = operands.iter().map(String::as_str).collect();
        let local = self.emit(&name, n.op, &refs, ty, n.attrs.clone());
        (local, natural, partial, "sum")
    }

    /// Whether `n` is an f32 scatter_elements with reduction `add` into zeros (a constant
    /// zero param, broadcast or reshaped): what a gather's gradient is.
    fn adds_into_zeros(&self, n: &Node) -> bool {
        fn zeros(g: &Graph, t: &str) -> bool {
            if let Some(p) = g.params.iter().find(|p| p.name == t) {
                return matches!(&p.data, ParamData::Value(v) if v.as_float() == Some(0.0));
            }
            g.nodes
                .iter()
                .find(|n| n.name == t)
                .is_some_and(|n| matches!(n.op, Op::BroadcastTo | Op::Reshape) && zeros(g, &n.inputs[0]))
        }
        attrs::ScatterElements::of(n).reduction == ScatterReduction::Add
            && self.global(&n.name).dtype == DType::F32
            && zeros(self.g, &n.inputs[0])
    }

    /// A scatter-add into zeros runs where the indices are, as they are laid out (indices
    /// are integers, which collectives do not carry; the updates are brought to the same
    /// layout). A split of a dim the result shares (off the axis, spanned whole) splits the
    /// result too; a split of the axis leaves each device the whole result with its own
    /// updates added into zeros: a partial sum over that mesh axis, combined after. (Off
    /// the axis, an index's position is its coordinate, so other splits are gathered.)
    fn scatter_add(&mut self, n: &Node, out: &Layout) -> (String, Layout, Vec<usize>, &'static str) {
        let axis = norm_axis(attrs::ScatterElements::of(n).axis, out.len()).expect("verified");
        let shared: Vec<usize> = corresponding_dims(n, 1, self.info).into_iter().map(|p| p.0).collect();
        let held = self.current(&n.inputs[1]);
        let within: Layout = (0..held.len()).map(|d| held[d].filter(|_| d == axis || shared.contains(&d))).collect();
        let natural: Layout = (0..out.len()).map(|d| if shared.contains(&d) { within[d] } else { None }).collect();
        let partial: Vec<usize> = within[axis].into_iter().collect();
        let operands = [self.operand(n, 0, &natural), self.operand(n, 1, &within), self.operand(n, 2, &within)];
        let ty = self.local_ty(&n.name, &natural);
        let name = self.local_name(n);
        let refs: Vec<&str> = operands.iter().map(String::as_str).collect();
        let local = self.emit(&name, n.op, &refs, ty, n.attrs.clone());
        (local, natural, partial, "sum")
    }

    /// Reductions keep a split reduced dim split; the partial results are combined.
    fn reduction(&mut self, n: &Node, out: &Layout) -> (String, Layout, Vec<usize>, &'static str) {
        let t = &n.inputs[0];
        let rank = self.global(t).rank();
        let cur = self.current(t);
        let mut req = vec![None; rank];
        let mut natural = vec![None; out.len()];
        for (di, dout) in corresponding_dims(n, 0, self.info) {
            req[di] = out[dout];
            natural[dout] = out[dout];
        }
        let mut partial = Vec::new();
        // Partial results are combined in f32 only; other dtypes are reduced whole.
        let f32 = self.global(&n.name).dtype == DType::F32;
        for d in reduced_axes(n, rank).into_iter().filter(|_| f32) {
            if let Some(a) = cur[d].filter(|&a| !self.overlaps_any(out.iter().flatten().chain(&partial), a)) {
                req[d] = Some(a);
                partial.push(a);
            }
        }
        let x = self.operand(n, 0, &req);
        let ty = self.local_ty(&n.name, &natural);
        let name = self.local_name(n);
        let local = self.emit(&name, n.op, &[&x], ty, n.attrs.clone());
        let reduce = match n.op {
            Op::ReduceMax => "max",
            Op::ReduceMean => "mean",
            _ => "sum",
        };
        (local, natural, partial, reduce)
    }

    /// The layout a normalising op (softmax, layer_norm) reads its input in: the result's,
    /// plus the input's own split of the normalised dims when that axis is free.
    fn normalised_layout(&self, n: &Node, out: &Layout, dims: &[usize]) -> Layout {
        let cur = self.current(&n.inputs[0]);
        let mut req = out.clone();
        for &d in dims {
            if req[d].is_none() {
                if let Some(a) = cur[d].filter(|&a| !self.overlaps_any(req.iter().flatten(), a)) {
                    req[d] = Some(a);
                }
            }
        }
        req
    }

    fn softmax(&mut self, n: &Node, out: &Layout) -> (String, Layout, Vec<usize>, &'static str) {
        let rank = out.len();
        let axis = norm_axis(attrs::Softmax::of(n).axis, rank).expect("verified");
        let req = self.normalised_layout(n, out, &[axis]);
        let x = self.operand(n, 0, &req);
        let ty = self.local_ty(&n.name, &req);
        // An empty result needs no statistics (and a max over an empty axis has no identity).
        let Some(a) = req[axis].filter(|_| !ty.shape.contains(&0)) else {
            let name = self.local_name(n);
            return (self.emit(&name, Op::Softmax, &[&x], ty, n.attrs.clone()), req, vec![], "sum");
        };
        // softmax(x) = exp(x - max) / sum(exp(x - max)), max and sum over the whole axis.
        let mut stat_shape = ty.shape.clone();
        stat_shape[axis] = 1;
        let stat = TensorType::new(DType::F32, stat_shape);
        let mut red = Attrs::new();
        red.insert("axes".into(), ints([axis]));
        red.insert("keepdims".into(), Attr::Bool(true));
        self.statistics_cause(n, &req);
        let base = &n.name;
        let m = self.emit(&self.fresh(base, "max"), Op::ReduceMax, &[&x], stat.clone(), red.clone());
        let m = self.combine(base, &m, vec![a], "max", &stat);
        let sh = self.emit(&self.fresh(base, "shifted"), Op::Sub, &[&x, &m], ty.clone(), Attrs::new());
        let e = self.emit(&self.fresh(base, "exp"), Op::Exp, &[&sh], ty.clone(), Attrs::new());
        let s = self.emit(&self.fresh(base, "sum"), Op::ReduceSum, &[&e], stat.clone(), red);
        let s = self.combine(base, &s, vec![a], "sum", &stat);
        self.cause = None;
        let name = self.local_name(n);
        (self.emit(&name, Op::Div, &[&e, &s], ty, Attrs::new()), req, vec![], "sum")
    }

    /// The cause of the statistics all_reduces of softmax or layer_norm `n`, read in `req`.
    fn statistics_cause(&mut self, n: &Node, req: &[Option<usize>]) {
        let t = &n.inputs[0];
        let from = self.mesh.layout_string(req);
        self.cause = Some(self.cause(n, t, from, &vec![None; req.len()], Rule::StatisticsOverSplitDim));
    }

    /// all_reduce of a statistic over the mesh axes `axes`.
    fn combine(&mut self, base: &str, x: &str, axes: Vec<usize>, reduce: &str, ty: &TensorType) -> String {
        let mut attrs = Attrs::new();
        attrs.insert("reduce".into(), Attr::Str(reduce.into()));
        attrs.insert("groups".into(), groups_attr(self.mesh.groups(&axes)));
        let name = self.fresh(base, "all_reduce");
        self.attribute(&name);
        self.emit(&name, Op::AllReduce, &[x], ty.clone(), attrs)
    }

    /// A scalar f32 constant, held by every device.
    fn constant(&mut self, base: &str, what: &str, v: f64) -> String {
        let name = self.fresh(base, what);
        let ty = TensorType::new(DType::F32, vec![]);
        for dev in &mut self.devs {
            dev.params.push(Param {
                name: name.clone(),
                ty: ty.clone(),
                dims: None,
                data: ParamData::Value(Attr::Float(v)),
                loc: None,
            });
        }
        self.types.insert(name.clone(), ty);
        name
    }

    fn layer_norm(&mut self, n: &Node, out: &Layout) -> (String, Layout, Vec<usize>, &'static str) {
        let rank = out.len();
        let attrs::LayerNorm { axis, eps } = attrs::LayerNorm::of(n);
        let axis = norm_axis(axis, rank).expect("verified");
        let dims: Vec<usize> = (axis..rank).collect();
        let req = self.normalised_layout(n, out, &dims);
        let x = self.operand(n, 0, &req);
        let gamma = self.operand(n, 1, &req[axis..]);
        let beta = self.operand(n, 2, &req[axis..]);
        let ty = self.local_ty(&n.name, &req);
        let split: Vec<usize> = dims.iter().filter_map(|&d| req[d]).collect();
        if split.is_empty() || ty.shape.contains(&0) {
            let name = self.local_name(n);
            return (self.emit(&name, Op::LayerNorm, &[&x, &gamma, &beta], ty, n.attrs.clone()), req, vec![], "sum");
        }
        // (x - mean) * rsqrt(var + eps) * gamma + beta, with the sums over the normalised
        // dims combined across the axes that split them.
        let count: usize = dims.iter().map(|&d| self.global(&n.name).shape[d]).product();
        let base = &n.name;
        let mut stat_shape = ty.shape.clone();
        for &d in &dims {
            stat_shape[d] = 1;
        }
        let stat = TensorType::new(DType::F32, stat_shape);
        let mut red = Attrs::new();
        red.insert("axes".into(), ints(dims.iter().copied()));
        red.insert("keepdims".into(), Attr::Bool(true));
        self.statistics_cause(n, &req);
        let inv_n = self.constant(base, "inv_count", 1.0 / count as f64);
        let eps = self.constant(base, "eps", eps);
        let e = |this: &mut Self, what: &str, op: Op, ins: &[&str], ty: &TensorType, attrs: Attrs| {
            let name = this.fresh(base, what);
            this.emit(&name, op, ins, ty.clone(), attrs)
        };
        let s1 = e(self, "sum", Op::ReduceSum, &[&x], &stat, red.clone());
        let s1 = self.combine(base, &s1, split.clone(), "sum", &stat);
        let mean = e(self, "mean", Op::Mul, &[&s1, &inv_n], &stat, Attrs::new());
        let d = e(self, "centred", Op::Sub, &[&x, &mean], &ty, Attrs::new());
        let sq = e(self, "square", Op::Mul, &[&d, &d], &ty, Attrs::new());
        let s2 = e(self, "sum_sq", Op::ReduceSum, &[&sq], &stat, red);
        let s2 = self.combine(base, &s2, split, "sum", &stat);
        let var = e(self, "var", Op::Mul, &[&s2, &inv_n], &stat, Attrs::new());
        let ve = e(self, "var_eps", Op::Add, &[&var, &eps], &stat, Attrs::new());
        let r = e(self, "rstd", Op::Rsqrt, &[&ve], &stat, Attrs::new());
        self.cause = None;
        let nrm = e(self, "normed", Op::Mul, &[&d, &r], &ty, Attrs::new());
        let sc = e(self, "scaled", Op::Mul, &[&nrm, &gamma], &ty, Attrs::new());
        let name = self.local_name(n);
        (self.emit(&name, Op::Add, &[&sc, &beta], ty, Attrs::new()), req, vec![], "sum")
    }
}

/// Runs the pass on a verified graph whose tensors all have layouts.
pub fn lower(g: &Graph, info: &Info, layouts: &Layouts) -> Result<Lowered> {
    let mesh = &layouts.mesh;
    let mut base = Graph { name: g.name.clone(), ..Graph::default() };
    let mut types = HashMap::new();
    let mut versions = HashMap::new();
    let mut home = HashMap::new();
    for i in &g.inputs {
        let layout = layouts.of[&i.name].clone();
        let ty = TensorType::new(i.ty.dtype, mesh.local_shape(&i.ty.shape, &layout));
        base.inputs.push(Input { name: i.name.clone(), ty: ty.clone(), dims: i.dims.clone(), loc: None });
        types.insert(i.name.clone(), ty);
        versions.insert((i.name.clone(), layout), i.name.clone());
        home.insert(i.name.clone(), i.name.clone());
    }
    for p in &g.params {
        base.params.push(Param { loc: None, ..p.clone() });
        types.insert(p.name.clone(), p.ty.clone());
        versions.insert((p.name.clone(), vec![None; p.ty.rank()]), p.name.clone());
    }
    base.outputs = g.outputs.iter().map(|o| Output::new(o.name.clone())).collect();
    let mut l = Lower {
        g,
        info,
        mesh,
        layouts,
        devs: vec![base; mesh.devices()],
        types,
        versions,
        home,
        cause: None,
        why: BTreeMap::new(),
        overridden: Vec::new(),
        relaid: HashMap::new(),
        model_axes: layouts.held_splits(g).into_iter().map(|(_, a)| mesh.split(a).0).collect(),
        pinned: BTreeMap::new(),
    };
    for &k in &info.order {
        let n = &g.nodes[k];
        let out = l.layout_of(&n.name);
        l.node(n, &out)?;
    }
    let io = |list: &mut dyn Iterator<Item = &String>| list.map(|t| (t.clone(), l.layout_of(t))).collect();
    let inputs = io(&mut g.inputs.iter().map(|i| &i.name));
    let mut outputs: Vec<(String, Layout)> = io(&mut g.outputs.iter().map(|o| &o.name));
    for (name, layout) in &mut outputs {
        // An output that is an input or param leaves in the layout it has locally.
        if g.params.iter().any(|p| &p.name == name) {
            *layout = vec![None; layout.len()];
        }
    }
    crate::attribution::price(mesh, &l.devs, &mut l.why)?;
    Ok(Lowered {
        mesh: mesh.clone(),
        devices: l.devs,
        inputs,
        outputs,
        io_stages: BTreeMap::new(),
        why: l.why,
        overridden: l.overridden,
        pinned: l.pinned,
    })
}

/// `--dump-after lower` (and `sendrecv`): every device's program in the text format, each
/// communication step after a comment that says why it is there (the text still parses).
pub fn dump(l: &Lowered) -> String {
    let mut s = String::new();
    for (d, g) in l.devices.iter().enumerate() {
        let c: Vec<String> = l.mesh.coords(d).iter().map(usize::to_string).collect();
        s.push_str(&format!("# device {d} ({})\n", c.join(",")));
        let notes: HashMap<&str, String> = (g.nodes.iter())
            .filter_map(|n| {
                let w = l.why.get(&crate::attribution::key(n)?)?;
                Some((n.name.as_str(), w.describe(n.op.name())))
            })
            .collect();
        for line in meshc_ir::text::print(g).lines() {
            let defined = line.trim_start().split([':', ' ']).next().unwrap_or_default();
            if let Some(note) = notes.get(defined) {
                s.push_str(&format!("  # {note}\n"));
            }
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

/// Reads back the per-device programs the dumps of lower, sendrecv, expand, attention and
/// epilogue print, over `mesh`: before each device's graph a line `# device N` (the rest of
/// the line is a comment, but `: degraded, no work` marks a device without a program),
/// devices in order from 0, one per device of the mesh. The text says nothing of the
/// layouts of the graph's inputs and outputs nor of why its communication is there: the
/// result has every input and output unsplit (their ranks from the first program with
/// outputs, which is verified for them), and no reasons.
pub fn parse(src: &str, mesh: Mesh) -> Result<Lowered> {
    let lines: Vec<&str> = src.lines().collect();
    let heads: Vec<(usize, &str)> = (lines.iter().enumerate())
        .filter_map(|(i, l)| {
            Some((i, l.strip_prefix("# device ").filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))?))
        })
        .collect();
    let first = heads.first().map_or(lines.len(), |h| h.0);
    if let Some(i) = (0..first).find(|&i| !lines[i].trim().is_empty() && !lines[i].starts_with('#')) {
        bail!("line {}: expected '# device 0' before any program", i + 1);
    }
    let mut devices = Vec::new();
    for (k, &(at, rest)) in heads.iter().enumerate() {
        let number = rest.split(|c: char| !c.is_ascii_digit()).next().unwrap_or_default();
        if number.parse() != Ok(devices.len()) {
            bail!("line {}: expected '# device {}', not '# device {rest}'", at + 1, devices.len());
        }
        let end = heads.get(k + 1).map_or(lines.len(), |h| h.0);
        // Blank lines in place of the text before, so that errors give lines of `src`.
        let text = "\n".repeat(at + 1) + &lines[at + 1..end].join("\n");
        let g = if rest.ends_with(": degraded, no work") {
            if let Some(i) = (at + 1..end).find(|&i| !lines[i].trim().is_empty() && !lines[i].starts_with('#')) {
                bail!("line {}: device {number} is degraded and has no program", i + 1);
            }
            Graph::default()
        } else {
            meshc_ir::text::parse(&text).map_err(|e| anyhow::anyhow!("device {number}: {e}"))?
        };
        devices.push(g);
    }
    if devices.len() != mesh.devices() {
        bail!("{} programs for the {} devices of the mesh", devices.len(), mesh.devices());
    }
    let unsplit = |name: &str, rank: usize| (name.to_string(), vec![None; rank]);
    let (inputs, outputs) = match devices.iter().enumerate().find(|(_, g)| !g.outputs.is_empty()) {
        Some((d, g)) => {
            // What rank an output has, the verifier says.
            let types = meshc_ir::verify::verify(g).map_err(|e| anyhow::anyhow!("device {d}: {e}"))?.types;
            (
                g.inputs.iter().map(|i| unsplit(&i.name, i.ty.rank())).collect(),
                g.outputs.iter().map(|o| unsplit(&o.name, types[&o.name].rank())).collect(),
            )
        }
        None => (Vec::new(), Vec::new()),
    };
    Ok(Lowered {
        mesh,
        devices,
        inputs,
        outputs,
        io_stages: BTreeMap::new(),
        why: BTreeMap::new(),
        overridden: Vec::new(),
        pinned: BTreeMap::new(),
    })
}
