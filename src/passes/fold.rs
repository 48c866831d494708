//! Constant folding, per device: params, and the nodes computable from them alone (the
//! local slices, reshapes, transposes and casts of params that lowering gives each
//! device), are evaluated at compile time with the reference interpreter and become that
//! device's weights. The keep pattern of each pruned param (`passes::pilot`) is folded along
//! with it, so a device's slice of a weight gets the matching slice of its mask.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use meshc_ir::params::Params;
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Op, Tensor};

use super::pilot::ParamMask;

/// A constant of a device's program.
pub enum Const<'p> {
    /// The param of that name, its value read from `Params` when it is used: a weight that
    /// goes into the artifact as it is never becomes a tensor of its own (nor one per
    /// device of a mesh).
    Param,
    /// A folded node's value.
    Value(Cow<'p, Tensor>),
}

/// The constants of one device's program.
pub struct Folded<'p> {
    /// Params and folded nodes, by name.
    pub consts: HashMap<String, Const<'p>>,
    /// Keep patterns (1 kept, 0 pruned) of the pruned params and of what was folded from them.
    pub keeps: HashMap<String, Tensor>,
    /// Where the values of `Const::Param`s are read.
    pub params: &'p Params<'p>,
}

/// Ops evaluated at compile time when all their operands are constants.
fn foldable(op: Op) -> bool {
    matches!(op, Op::Slice | Op::Reshape | Op::Transpose | Op::Cast)
}

/// Folds `g` (verified as `info`), whose params' values are in `params` (inline values
/// are read from the graph), with the pruning `masks` by param name.
pub fn fold<'p>(
    g: &Graph,
    info: &Info,
    params: &'p Params<'p>,
    masks: &HashMap<String, ParamMask>,
) -> Result<Folded<'p>> {
    let mut consts: HashMap<String, Const<'p>> = g.params.iter().map(|p| (p.name.clone(), Const::Param)).collect();
    let mut keeps: HashMap<String, Tensor> = HashMap::new();
    for (name, m) in masks {
        if let Some(t) = consts.get(name).map(|_| &info.types[name]) {
            let v = (0..t.numel()).map(|i| {
                let (r, c) = ((i / m.col_keep.len()) % m.row_keep.len(), i % m.col_keep.len());
                if m.row_keep[r] && m.col_keep[c] {
                    1.0
                } else {
                    0.0
                }
            });
            keeps.insert(name.clone(), Tensor::f32(t.shape.clone(), v.collect()));
        }
    }
    for &k in &info.order {
        let n = &g.nodes[k];
        if foldable(n.op) && n.inputs.iter().all(|i| consts.contains_key(i)) {
            let args = (n.inputs.iter())
                .map(|i| match &consts[i] {
                    Const::Param => {
                        let p = g.params.iter().find(|p| &p.name == i).expect("a param");
                        params.get(p).with_context(|| format!("param '{i}'"))
                    }
                    Const::Value(t) => Ok(Cow::Borrowed(&**t)),
                })
                .collect::<Result<Vec<_>>>()?;
            let args: Vec<&Tensor> = args.iter().map(|t| &**t).collect();
            let t = meshc_ir::interp::eval_node(n, &args, &info.types[&n.name])?;
            consts.insert(n.name.clone(), Const::Value(Cow::Owned(t)));
            if n.op != Op::Cast && n.inputs.iter().all(|i| keeps.contains_key(i)) {
                let args: Vec<&Tensor> = n.inputs.iter().map(|i| &keeps[i]).collect();
                keeps.insert(n.name.clone(), meshc_ir::interp::eval_node(n, &args, &info.types[&n.name])?);
            }
        }
    }
    Ok(Folded { consts, keeps, params })
}

impl Folded<'_> {
    /// Whether `name` is a constant of the program.
    pub fn has(&self, name: &str) -> bool {
        self.consts.contains_key(name)
    }
}

/// The `--dump-after fold` text: per device, the nodes folded into weights, in program
/// order, with their types (params are weights by definition and not listed).
pub fn dump(devices: &[(usize, &Graph, &Folded)]) -> String {
    let mut s = String::new();
    for &(d, g, f) in devices {
        let folded: Vec<&meshc_ir::Node> = g.nodes.iter().filter(|n| f.has(&n.name)).collect();
        let _ = writeln!(s, "device {d}: {} node(s) folded", folded.len());
        for n in folded {
            let Const::Value(t) = &f.consts[&n.name] else { unreachable!("a node is not a param") };
            let _ = writeln!(s, "  {} = {}({})  -> {}", n.name, n.op.name(), n.inputs.join(", "), t.ty());
        }
    }
    s
}
