//! Constant folding, per device: params, and the nodes computable from them alone (the
//! local slices, reshapes, transposes and casts of params that lowering gives each
//! device), are evaluated at compile time with the reference interpreter and become that
//! device's weights. The keep pattern of each pruned param (`passes::pilot`) is folded along
//! with it, so a device's slice of a weight gets the matching slice of its mask.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Op, ParamData, Tensor};

use super::pilot::ParamMask;

/// The constants of one device's program.
pub struct Folded<'p> {
    /// Params and folded nodes, by name. Params from files or initialisers are borrowed:
    /// every device of a mesh reads the same ones, and a copy each would hold a model's
    /// weights once per device.
    pub consts: HashMap<String, Cow<'p, Tensor>>,
    /// Keep patterns (1 kept, 0 pruned) of the pruned params and of what was folded from them.
    pub keeps: HashMap<String, Tensor>,
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
    params: &'p HashMap<String, Tensor>,
    masks: &HashMap<String, ParamMask>,
) -> Result<Folded<'p>> {
    let mut consts: HashMap<String, Cow<'p, Tensor>> = HashMap::new();
    for p in &g.params {
        let t = match &p.data {
            ParamData::Value(v) => Cow::Owned(meshc_ir::params::inline_value(p, v)?),
            _ => Cow::Borrowed(params.get(&p.name).with_context(|| format!("no value for param '{}'", p.name))?),
        };
        consts.insert(p.name.clone(), t);
    }
    let mut keeps: HashMap<String, Tensor> = HashMap::new();
    for (name, m) in masks {
        if let Some(t) = consts.get(name) {
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
            let args: Vec<&Tensor> = n.inputs.iter().map(|i| &*consts[i]).collect();
            let t = meshc_ir::interp::eval_node(n, &args, &info.types[&n.name])?;
            consts.insert(n.name.clone(), Cow::Owned(t));
            if n.op != Op::Cast && n.inputs.iter().all(|i| keeps.contains_key(i)) {
                let args: Vec<&Tensor> = n.inputs.iter().map(|i| &keeps[i]).collect();
                keeps.insert(n.name.clone(), meshc_ir::interp::eval_node(n, &args, &info.types[&n.name])?);
            }
        }
    }
    Ok(Folded { consts, keeps })
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
            let _ =
                writeln!(s, "  {} = {}({})  -> {}", n.name, n.op.name(), n.inputs.join(", "), f.consts[&n.name].ty());
        }
    }
    s
}
