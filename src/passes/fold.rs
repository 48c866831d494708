//! Constant folding, per device: params, and the nodes computable from them alone (the
//! local slices, reshapes, transposes and casts of params that lowering gives each
//! device), are evaluated at compile time with the reference interpreter and become that
//! device's weights. The keep pattern of each pruned param (`passes::pilot`) is folded along
//! with it, so a device's slice of a weight gets the matching slice of its mask.
//!
//! Matmul weights may be stored as f16/bf16 (`WeightsDtype`): a weight that only ever
//! serves as the right operand of matmuls is kept (or, asked to, converted) in half
//! precision, and the matmul kernel widens it as it packs it — half the bytes in the
//! artifact, at load and at run time. The `cast` to f32 that reads a half weight is then
//! not folded into an f32 copy but absorbed by its matmuls (`Folded::absorbed`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use anyhow::{bail, Context, Result};
use meshc_ir::params::Params;
use meshc_ir::verify::Info;
use meshc_ir::{DType, Graph, Op, Tensor};

use super::pilot::ParamMask;

/// A constant of a device's program.
pub enum Const<'p> {
    /// The param of that name, its value read from `Params` when it is used: a weight that
    /// goes into the artifact as it is never becomes a tensor of its own (nor one per
    /// device of a mesh).
    Param,
    /// A folded node's value.
    Value(Cow<'p, Tensor>),
    /// The slice `node` (its operand a param whose bytes are in a weight file): a device's
    /// part of a weight is read from the file when it is written (`Folded::bytes`), never a
    /// tensor of its own, nor is the whole weight.
    Slice { param: String, node: meshc_ir::Node, ty: meshc_ir::TensorType },
    /// A folded node's value that only other folded nodes read (an int8 weight's absolute,
    /// scaled and rounded copies), dropped once the last of them is evaluated: a compile
    /// holds a few copies of one weight at a time, not of every weight.
    Spent { ty: meshc_ir::TensorType },
}

/// The constants of one device's program.
pub struct Folded<'p> {
    /// Params and folded nodes, by name.
    pub consts: HashMap<String, Const<'p>>,
    /// Keep patterns (1 kept, 0 pruned) of the pruned params and of what was folded from them.
    pub keeps: HashMap<String, Tensor>,
    /// Where the values of `Const::Param`s are read.
    pub params: &'p Params<'p>,
    /// Casts to f32 of half-precision weights that only matmuls read (as their right
    /// operand), by name, with the weight they cast: the matmuls read the weight itself.
    pub absorbed: HashMap<String, String>,
    /// The f32 weights converted to a half type (`WeightsDtype::F16`/`BF16`), with the
    /// largest absolute rounding error of each, in program order.
    pub converted: Vec<(String, f64)>,
}

/// How matmul weights are stored in the artifact (`--weights-dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsDtype {
    /// As the checkpoint holds them: an f16/bf16 weight stays f16/bf16.
    #[default]
    Keep,
    /// Every weight f32 (twice the bytes, no widening at run time).
    F32,
    /// f32 weights that only matmuls read, rounded (to nearest even) into f16 or bf16.
    F16,
    BF16,
    /// f32 matmul weights quantized to int8 per column, the activations per row as the
    /// program runs (`passes::quantize`).
    Int8,
}

/// Ops evaluated at compile time when all their operands are constants: data movement,
/// `reduce_max`, and the elementwise ops that produce no more elements than their largest
/// operand (a broadcast would only grow the weights): a batch norm folded into a conv's
/// weight and bias (mul, add), a weight quantized to int8 (`passes::quantize`: abs,
/// maximum, div, round).
fn foldable(n: &meshc_ir::Node, info: &Info) -> bool {
    let largest = n.inputs.iter().map(|i| info.types[i].numel()).max().unwrap_or(0);
    matches!(n.op, Op::Slice | Op::Reshape | Op::Transpose | Op::Cast | Op::ReduceMax)
        || matches!(n.op, Op::Mul | Op::Add | Op::Div | Op::Maximum | Op::Abs | Op::Round)
            && info.types[&n.name].numel() <= largest
}

/// The names `fold` makes constants of in `g` (verified as `info`): its params, and every
/// foldable node of constants.
pub fn constants<'g>(g: &'g Graph, info: &Info) -> std::collections::HashSet<&'g str> {
    let mut consts: std::collections::HashSet<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    for &k in &info.order {
        let n = &g.nodes[k];
        if foldable(n, info) && n.inputs.iter().all(|i| consts.contains(i.as_str())) {
            consts.insert(&n.name);
        }
    }
    consts
}

/// Folds `g` (verified as `info`), whose params' values are in `params` (inline values
/// are read from the graph), with the pruning `masks` by param name; the values named in
/// `retain` are kept even when only folded nodes read them.
pub fn fold<'p>(
    g: &Graph,
    info: &Info,
    params: &'p Params<'p>,
    masks: &HashMap<String, ParamMask>,
    weights: WeightsDtype,
    retain: &std::collections::HashSet<&str>,
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
    // Whether `name` is read only as the right operand of (unmasked) matmuls.
    let only_matmul_b = |name: &str, keeps: &HashMap<String, Tensor>| {
        let uses = || g.nodes.iter().flat_map(|n| n.inputs.iter().enumerate().map(move |(j, i)| (n, j, i)));
        !keeps.contains_key(name)
            && !g.outputs.iter().any(|o| o.name == name)
            && uses().any(|(_, _, i)| i == name)
            && uses().filter(|(_, _, i)| *i == name).all(|(n, j, _)| n.op == Op::MatMul && j == 1)
    };
    let mut absorbed = HashMap::new();
    // Per value, the position in `info.order` of its last reader, and its readers.
    let mut last: HashMap<&str, usize> = HashMap::new();
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (at, &k) in info.order.iter().enumerate() {
        for i in &g.nodes[k].inputs {
            last.insert(i, at);
            readers.entry(i).or_default().push(k);
        }
    }
    let output = |name: &str| g.outputs.iter().any(|o| o.name == name);
    for (at, &k) in info.order.iter().enumerate() {
        let n = &g.nodes[k];
        let half_operand = |i: &String| info.types[i].dtype.is_half() && consts.contains_key(i);
        if weights != WeightsDtype::F32
            && n.op == Op::Cast
            && info.types[&n.name].dtype == DType::F32
            && half_operand(&n.inputs[0])
            && only_matmul_b(&n.name, &keeps)
        {
            absorbed.insert(n.name.clone(), n.inputs[0].clone());
        } else if foldable(n, info) && n.inputs.iter().all(|i| consts.contains_key(i)) {
            let mapped = |i: &String| matches!(consts[i], Const::Param) && params.file_view(param(g, i)).is_some();
            if n.op == Op::Slice && mapped(&n.inputs[0]) {
                let (param, ty) = (n.inputs[0].clone(), info.types[&n.name].clone());
                consts.insert(n.name.clone(), Const::Slice { param, node: n.clone(), ty });
            } else {
                let args = (n.inputs.iter()).map(|i| value(g, params, &consts, i)).collect::<Result<Vec<_>>>()?;
                let args: Vec<&Tensor> = args.iter().map(|t| &**t).collect();
                let t = meshc_ir::interp::eval_node(n, &args, &info.types[&n.name])?;
                consts.insert(n.name.clone(), Const::Value(Cow::Owned(t)));
            }
            if n.op != Op::Cast && n.inputs.iter().all(|i| keeps.contains_key(i)) {
                let args: Vec<&Tensor> = n.inputs.iter().map(|i| &keeps[i]).collect();
                keeps.insert(n.name.clone(), meshc_ir::interp::eval_node(n, &args, &info.types[&n.name])?);
            }
        }
        // The operands this node read last: spent if every reader was folded.
        for i in n.inputs.iter().filter(|i| last[i.as_str()] == at && !output(i) && !retain.contains(i.as_str())) {
            let folded = |r: &usize| consts.contains_key(&g.nodes[*r].name);
            if matches!(consts.get(i), Some(Const::Value(_))) && readers[i.as_str()].iter().all(folded) {
                consts.insert(i.clone(), Const::Spent { ty: info.types[i].clone() });
            }
        }
    }
    let mut converted = Vec::new();
    if let Some(dtype) = match weights {
        WeightsDtype::F16 => Some(DType::F16),
        WeightsDtype::BF16 => Some(DType::BF16),
        _ => None,
    } {
        let order = g.params.iter().map(|p| &p.name).chain(info.order.iter().map(|&k| &g.nodes[k].name));
        let names: Vec<String> = order
            .filter(|name| consts.contains_key(*name) && info.types[*name].dtype == DType::F32)
            .filter(|name| only_matmul_b(name, &keeps))
            .cloned()
            .collect();
        for name in names {
            let t = value(g, params, &consts, &name)?;
            // Element by element: an f64 copy of a large weight would be 2x its f32 bytes.
            let half = Tensor::new(t.shape.clone(), meshc_ir::Data::from_f64(dtype, t.data.iter_f64()));
            let err = t.data.iter_f64().zip(half.data.iter_f64()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            converted.push((name.clone(), err));
            consts.insert(name, Const::Value(Cow::Owned(half)));
        }
    }
    Ok(Folded { consts, keeps, params, absorbed, converted })
}

fn param<'g>(g: &'g Graph, name: &str) -> &'g meshc_ir::Param {
    g.params.iter().find(|p| p.name == name).expect("a param")
}

/// The bytes of the slice `node` of the file-backed param `name` (a `Const::Slice`), read
/// from its file run by run.
fn mapped_slice(g: &Graph, params: &Params, name: &str, node: &meshc_ir::Node) -> Result<Vec<u8>> {
    let p = param(g, name);
    let src = params.file_view(p).expect("a slice is folded only from a file-backed param");
    let mut out = Vec::new();
    slice_runs(node, &p.ty, |at, len| Ok(src.read_into(at, len, &mut out)?))?;
    Ok(out)
}

/// Calls `read(first byte, bytes)` for each run of the slice `node` of a weight of type
/// `ty`, in order (a run: elements adjacent in both).
fn slice_runs(
    node: &meshc_ir::Node,
    ty: &meshc_ir::TensorType,
    mut read: impl FnMut(usize, usize) -> Result<()>,
) -> Result<()> {
    let size = ty.dtype.size_bytes();
    let mut run: Option<(usize, usize)> = None;
    for at in meshc_ir::interp::slice_offsets(node, &ty.shape)? {
        run = match run {
            Some((first, len)) if first + len == at => Some((first, len + 1)),
            Some((first, len)) => {
                read(first * size, len * size)?;
                Some((at, 1))
            }
            None => Some((at, 1)),
        };
    }
    if let Some((first, len)) = run {
        read(first * size, len * size)?;
    }
    Ok(())
}

/// The value of the constant `name` of `consts` as a tensor.
fn value<'a>(
    g: &Graph,
    params: &'a Params<'a>,
    consts: &'a HashMap<String, Const<'a>>,
    name: &str,
) -> Result<Cow<'a, Tensor>> {
    let t = match &consts[name] {
        Const::Param => params.get(param(g, name)).with_context(|| format!("param '{name}'"))?,
        Const::Value(t) => Cow::Borrowed(&**t),
        Const::Slice { param: p, node, ty } => {
            Cow::Owned(Tensor::from_le_bytes(ty, &mapped_slice(g, params, p, node)?))
        }
        Const::Spent { .. } => bail!("the folded value '{name}' was dropped once its readers were folded"),
    };
    Ok(t)
}

impl Folded<'_> {
    /// The little-endian bytes the artifact stores for the constant `name` of `g`: a param
    /// read from a file as it is comes straight from the file, a slice of one is read from
    /// it run by run, anything else goes through one conversion buffer.
    pub fn bytes(&self, g: &Graph, name: &str) -> Result<Cow<'_, [u8]>> {
        Ok(match &self.consts[name] {
            Const::Param => {
                let p = param(g, name);
                match self.params.file_view(p) {
                    Some(v) => Cow::Owned(v.bytes()?),
                    None => Cow::Owned(self.params.get(p)?.to_le_bytes()),
                }
            }
            Const::Value(t) => Cow::Owned(t.to_le_bytes()),
            Const::Slice { param: p, node, .. } => Cow::Owned(mapped_slice(g, self.params, p, node)?),
            Const::Spent { .. } => bail!("the folded value '{name}' is read by nothing the program runs"),
        })
    }

    /// The value of the constant `name` of `g`.
    pub fn value(&self, g: &Graph, name: &str) -> Result<Cow<'_, Tensor>> {
        value(g, self.params, &self.consts, name)
    }

    /// Whether `name` is a constant of the program.
    pub fn has(&self, name: &str) -> bool {
        self.consts.contains_key(name)
    }

    /// The type in which the matmul operand `name` (declared `types[name]`) is stored: a
    /// half weight behind an absorbed cast, a converted weight, or as declared.
    pub fn stored(&self, name: &str, types: &HashMap<String, meshc_ir::TensorType>) -> meshc_ir::TensorType {
        let weight = self.absorbed.get(name).map_or(name, String::as_str);
        let dtype = match self.consts.get(weight) {
            Some(Const::Value(t)) => t.dtype(),
            _ => types[weight].dtype,
        };
        meshc_ir::TensorType::new(dtype, types[name].shape.clone())
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
            let ty = match &f.consts[&n.name] {
                Const::Value(t) => t.ty(),
                Const::Slice { ty, .. } | Const::Spent { ty } => ty.clone(),
                Const::Param => unreachable!("a node is not a param"),
            };
            let _ = writeln!(s, "  {} = {}({})  -> {ty}", n.name, n.op.name(), n.inputs.join(", "));
        }
        let mut absorbed: Vec<_> = f.absorbed.iter().collect();
        absorbed.sort();
        for (cast, weight) in absorbed {
            let _ = writeln!(s, "  {cast} = cast({weight}) absorbed: its matmuls read the half weight");
        }
        for (name, err) in &f.converted {
            let Const::Value(t) = &f.consts[name] else { unreachable!("converted weights are values") };
            let _ = writeln!(s, "  {name} stored as {} (max abs rounding error {err:.3e})", t.dtype());
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use meshc_ir::interp::eval_node;

    /// A slice copied from a weight's bytes run by run is the slice the interpreter takes,
    /// whatever its axes and steps (negative, larger than a dim, skipping dims).
    #[test]
    fn slice_runs_are_the_interpreters_slice() {
        let attrs = [
            "starts = [0], ends = [2]",
            "axes = [1], starts = [1], ends = [5]",
            "axes = [2], starts = [0], ends = [4]",
            "axes = [0, 2], starts = [1, 1], ends = [3, 3]",
            "axes = [1], starts = [-1], ends = [-100], steps = [-2]",
            "axes = [2, 0], starts = [3, 2], ends = [0, 0], steps = [-1, -1]",
            "axes = [1], starts = [0], ends = [6], steps = [7]",
            "axes = [1], starts = [4], ends = [2]",
        ];
        let body: String = attrs.iter().enumerate().map(|(i, a)| format!("  s{i} = slice(w) {{{a}}}\n")).collect();
        let outs: Vec<String> = (0..attrs.len()).map(|i| format!("s{i}")).collect();
        let src = format!(
            "graph g {{\n  param w: f32[3,6,4] = init normal{{seed = 1, std = 1.0}}\n{body}  output {}\n}}\n",
            outs.join(", ")
        );
        let g = meshc_ir::text::parse(&src).unwrap();
        let info = meshc_ir::verify::verify(&g).unwrap();
        let w = meshc_ir::params::load_all(&g, std::path::Path::new(".")).unwrap().remove("w").unwrap();
        let bytes = w.to_le_bytes();
        for n in &g.nodes {
            let want = eval_node(n, &[&w], &info.types[&n.name]).unwrap().to_le_bytes();
            let mut got = Vec::new();
            super::slice_runs(n, &g.params[0].ty, |at, len| {
                got.extend_from_slice(&bytes[at..at + len]);
                Ok(())
            })
            .unwrap();
            assert_eq!(got, want, "{}", n.name);
        }
    }
}
