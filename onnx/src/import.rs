//! An ONNX model to a meshc graph: the opset and domains it may use, its inputs (symbolic
//! dims bound by `--dim`), its initializers, its nodes in order (each through `ops`), its
//! outputs. Every refusal names what it refuses: the input and dim, the initializer, or the
//! node and its op type.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use meshc_ir::{DType, Data, Graph, Input, Output, Tensor, TensorType};

use super::builder::{Builder, Value};
use super::control;
use super::dispatch;
use super::external::External;
use super::ops::Ctx;
use super::ops_legacy;
use super::proto::tensor_shape_proto::{self, dimension};
use super::proto::{type_proto, GraphProto, ModelProto, NodeProto, ValueInfoProto};
use super::tensors;
use super::unfuse;
use super::validate;

type R<T> = std::result::Result<T, String>;

/// The opsets of the default domain meshc reads (torch.onnx writes 17 and 18 today; before
/// 13, each op's converter says from which opset it reads it).
pub const OPSETS: std::ops::RangeInclusive<i64> = ops_legacy::OLDEST..=28;

fn is_default_domain(d: Option<&str>) -> bool {
    matches!(d, None | Some("" | "ai.onnx"))
}

/// The graph of `model` and its params' values; `dims` binds symbolic dims by name,
/// `shapes` fixes every dim of an input by position (`--input-shape`, for dims ONNX leaves
/// without a size or a name, or whose names clash), and `consts` fixes inputs to values,
/// which then fold like initializers (an input that gives a shape, pads or scales must be
/// known at import time); external data is read relative to `dir`, the model's directory.
/// `sizes`: some dims range (`symbolic.rs`), so lengths read from shapes are built from the
/// tensors they are read from (`Builder::sizes`).
pub fn import(
    model: &ModelProto,
    dims: &BTreeMap<String, usize>,
    shapes: &BTreeMap<String, Vec<usize>>,
    consts: &BTreeMap<String, Tensor>,
    dir: &Path,
    sizes: bool,
) -> R<(Graph, HashMap<String, Tensor>)> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| is_default_domain(o.domain.as_deref()))
        .and_then(|o| o.version)
        .ok_or("the model imports no opset of the default ONNX domain")?;
    if !OPSETS.contains(&opset) {
        let (lo, hi) = OPSETS.into_inner();
        return Err(format!("opset {opset} of the default domain is not supported ({lo} to {hi})"));
    }
    let g = model.graph.as_ref().ok_or("the model has no graph")?;
    let mut b = Builder::default();
    b.sizes = sizes;
    b.graph.name = builder_name(g);
    let mut values: HashMap<String, Value> = HashMap::new();
    let mut external = External::new(dir);
    let sources = sources(g);
    for t in &g.initializer {
        let name = t.name.clone().unwrap_or_default();
        if values.contains_key(&name) {
            return Err(format!("initializer '{name}' is given twice (ONNX names each value once)"));
        }
        let source = sources.get(&name).cloned().unwrap_or_else(|| name.clone());
        let raw = match tensors::is_external(t) {
            true => external.bytes(t).map(|b| Some(std::borrow::Cow::Owned(b))),
            false => Ok(t.raw_data.as_deref().map(std::borrow::Cow::Borrowed)),
        };
        let v = raw
            .and_then(|raw| tensors::tensor_from(t, raw.as_deref()))
            .map_err(|e| format!("initializer '{name}': {e}"))?;
        let stored = tensors::storage_dtype(t.data_type.unwrap_or(0)).unwrap_or(DType::F32);
        values.insert(name, Value::stored(v, &source, stored));
    }
    external.check_unchanged()?;
    let inputs: BTreeSet<&str> = g.input.iter().filter_map(|i| i.name.as_deref()).collect();
    if let Some(unknown) = shapes.keys().find(|s| !inputs.contains(s.as_str())) {
        let hint = meshc_ir::suggest::did_you_mean(unknown, inputs.iter().copied());
        return Err(format!("--input-shape {unknown}: the model has no input '{unknown}'{hint}"));
    }
    let mut bound = BTreeSet::new();
    let mut listed = BTreeSet::new();
    for i in &g.input {
        let onnx_name = i.name.clone().unwrap_or_default();
        if !listed.insert(onnx_name.clone()) {
            return Err(format!("input '{onnx_name}' is listed twice (ONNX names each value once)"));
        }
        if let Some(t) = consts.get(&onnx_name) {
            if shapes.contains_key(&onnx_name) {
                return Err(format!("--input-shape {onnx_name}: --const already fixes that input"));
            }
            let want = i.r#type.as_ref().and_then(|t| match &t.value {
                Some(type_proto::Value::TensorType(tt)) => tensors::storage_dtype(tt.elem_type.unwrap_or(0)).ok(),
                _ => None,
            });
            if want.is_some_and(|d| d != t.dtype()) {
                return Err(format!(
                    "--const {onnx_name}: the value is {}, the input {}",
                    t.dtype(),
                    want.unwrap_or(t.dtype())
                ));
            }
            values.insert(onnx_name.clone(), Value::named(t.clone(), &onnx_name));
            continue;
        }
        // An initializer of the input's name is its default value (ONNX's IR; older
        // exporters list every initializer among the inputs so): meshc's inputs have no
        // defaults, so the input is that constant, unless `--const` gives another value.
        if values.contains_key(&onnx_name) {
            if shapes.contains_key(&onnx_name) {
                return Err(format!(
                    "--input-shape {onnx_name}: the input is the initializer of its name, a constant (--const gives it another value)"
                ));
            }
            continue;
        }
        let v = input(&mut b, i, dims, shapes.get(&onnx_name).map(Vec::as_slice), &mut bound)?;
        values.insert(onnx_name, v);
    }
    if let Some(unused) = consts.keys().find(|c| !inputs.contains(c.as_str())) {
        return Err(format!("--const {unused}: the model has no input '{unused}'"));
    }
    unname_clashing_dims(&mut b.graph);
    if let Some(unused) = dims.keys().find(|d| !bound.contains(*d)) {
        return Err(format!("--dim {unused}: the model's inputs have no symbolic dim '{unused}'"));
    }
    let defined: BTreeSet<&str> = g
        .input
        .iter()
        .filter_map(|i| i.name.as_deref())
        .chain(g.initializer.iter().filter_map(|t| t.name.as_deref()))
        .collect();
    for o in g.output.iter().filter_map(|o| o.name.as_deref()).filter(|o| !defined.contains(o)) {
        b.reserve(o);
    }
    for n in &g.node {
        node(&mut b, n, g, opset, &mut values)?;
    }
    for o in &g.output {
        let name = o.name.clone().unwrap_or_default();
        let v = values.get(&name).ok_or_else(|| format!("output '{name}' is computed by no node"))?;
        let meshc_name = b.output(v, &name).map_err(|e| format!("output '{name}': {e}"))?;
        b.graph.outputs.push(Output::new(meshc_name));
    }
    unfuse::split_fused_projections(&mut b);
    b.name_dims();
    Ok((b.graph, b.params))
}

/// The initializers named by `folded_name`, by ONNX name. A name two of them would share,
/// or that another initializer has, is not given: the param names must stay apart.
fn sources(g: &GraphProto) -> HashMap<String, String> {
    let mut readers: HashMap<&str, Vec<(&NodeProto, usize)>> = HashMap::new();
    for n in &g.node {
        for (k, i) in n.input.iter().enumerate() {
            readers.entry(i.as_str()).or_default().push((n, k));
        }
    }
    let names: Vec<&str> = g.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    let given: Vec<(String, String)> =
        names.iter().filter_map(|&n| Some((n.to_string(), folded_name(n, &readers)?))).collect();
    let mut count: HashMap<&str, usize> = names.iter().map(|&n| (n, 1)).collect();
    for (_, s) in &given {
        *count.entry(s).or_default() += 1;
    }
    given.iter().filter(|(_, s)| count[s.as_str()] == 1).cloned().collect()
}

/// The name a weight torch.onnx made itself gets. Its constant folding writes a Linear's
/// transposed weight, or a Conv's weight with the batch norm after it folded in, as a new
/// initializer named by number (`onnx::MatMul_886` from the TorchScript exporter, `val_84`
/// from the torch.export one): nothing a layout spec could name. Such a weight read by one
/// node is named after that node's module scope, the node and the ONNX name of the input it
/// is: `/encoder/layer.0/attention/self/query/MatMul` reading it as B (or a MatMul whose
/// `namespace` metadata ends in the module `encoder.layer.0.attention.self.query`) gives
/// `encoder.layer.0.attention.self.query.MatMul.B`, so `encoder.layer.*.attention.self.*.MatMul.B`
/// selects the attention projections of every layer, from either exporter.
fn folded_name(name: &str, readers: &HashMap<&str, Vec<(&NodeProto, usize)>>) -> Option<String> {
    let numbered = name.strip_prefix("val_").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !name.starts_with("onnx::") && !numbered {
        return None;
    }
    let [(node, k)] = readers.get(name)?.as_slice() else { return None };
    let op = node.op_type.as_deref().unwrap_or("");
    let scope = match node.name.as_deref().and_then(|n| n.strip_prefix('/')) {
        // TorchScript: `/scope/of/the/module/Op_1`.
        Some(path) => path.replace('/', "."),
        // torch.export: `: Model/encoder: Encoder/.../encoder.layer.0.attention.self.query: Linear/linear: aten.linear.default`,
        // the last module before the aten op's own entry.
        None => {
            let ns = node.metadata_props.iter().find(|p| p.key.as_deref() == Some("namespace"))?.value.as_deref()?;
            let module = ns.rsplit('/').nth(1)?.split(": ").next()?;
            format!("{module}.{op}")
        }
    };
    if scope.is_empty() || scope.starts_with('.') {
        return None;
    }
    let slot = match (op, k) {
        ("MatMul" | "Gemm" | "Add" | "Sub" | "Mul" | "Div", 0) => "A".to_string(),
        ("MatMul" | "Gemm" | "Add" | "Sub" | "Mul" | "Div", 1) => "B".to_string(),
        ("Gemm", 2) => "C".to_string(),
        ("Conv" | "ConvTranspose", 1) => "W".to_string(),
        ("Conv" | "ConvTranspose", 2) => "B".to_string(),
        (_, k) => format!("input{k}"),
    };
    Some(format!("{scope}.{slot}"))
}

fn builder_name(g: &GraphProto) -> String {
    super::builder::sanitise(g.name.as_deref().filter(|n| !n.is_empty()).unwrap_or("model"))
}

/// A graph input: its type with symbolic dims bound (by `--dim`, or by position from its
/// `--input-shape`, which must agree with the model's sizes and the `--dim`s of its dim
/// names), its dim names kept as meshc dims (a layout spec's rules name them). A
/// half-float input stays half and is widened at once.
fn input(
    b: &mut Builder,
    i: &ValueInfoProto,
    dims: &BTreeMap<String, usize>,
    fixed: Option<&[usize]>,
    bound: &mut BTreeSet<String>,
) -> R<Value> {
    let onnx_name = i.name.as_deref().unwrap_or_default();
    let at = |e: String| format!("input '{onnx_name}': {e}");
    let Some(type_proto::Value::TensorType(t)) = i.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(at("only tensor inputs are supported".into()));
    };
    let dtype = tensors::storage_dtype(t.elem_type.unwrap_or(0)).map_err(at)?;
    let shape_proto = t.shape.as_ref().ok_or_else(|| at("its shape is unknown (the model gives no rank)".into()))?;
    let model: Vec<ModelDim> = shape_proto.dim.iter().map(ModelDim::of).collect();
    // What the model and the `--dim`s say of each dim: `1x3x?x?`.
    let known = model
        .iter()
        .map(|d| match d {
            ModelDim::Size(n) => n.to_string(),
            ModelDim::Named(p) => dims.get(p).map_or("?".to_string(), usize::to_string),
            ModelDim::Unknown(_) => "?".to_string(),
        })
        .collect::<Vec<_>>()
        .join("x");
    if let Some(fixed) = fixed {
        let given = fixed.iter().map(usize::to_string).collect::<Vec<_>>().join("x");
        let flag = format!("--input-shape {onnx_name}={given}");
        if fixed.len() != model.len() {
            return Err(format!("{flag}: the input has rank {} ({known}), not {}", model.len(), fixed.len()));
        }
        for (k, (d, &n)) in model.iter().zip(fixed).enumerate() {
            match d {
                ModelDim::Size(m) if *m != n => {
                    return Err(format!("{flag}: axis {k} is {m} in the model, not {n}"));
                }
                ModelDim::Named(p) => match dims.get(p) {
                    Some(&m) if m != n => {
                        return Err(format!("{flag}: axis {k} is dim '{p}', which --dim {p}={m} makes {m}, not {n}"));
                    }
                    Some(_) => {
                        bound.insert(p.clone());
                    }
                    None => {}
                },
                _ => {}
            }
        }
    }
    let (mut shape, mut names) = (Vec::new(), Vec::new());
    for (k, d) in model.iter().enumerate() {
        let name = match d {
            ModelDim::Named(p) => Some(p.clone()),
            _ => None,
        };
        let size = match (d, fixed) {
            (_, Some(fixed)) => fixed[k],
            (ModelDim::Size(n), None) => *n,
            (ModelDim::Named(p), None) => match dims.get(p) {
                Some(&n) => {
                    bound.insert(p.clone());
                    n
                }
                None => {
                    return Err(at(format!(
                        "dim {k} is symbolic ('{p}'): bind it with --dim {p}=N, or give the whole shape with --input-shape {onnx_name}={known}, each ? a size"
                    )))
                }
            },
            (ModelDim::Unknown(why), None) => {
                return Err(at(format!(
                    "axis {k} has no size and no name ({why}): give the whole shape with --input-shape {onnx_name}={known}, each ? a size"
                )))
            }
        };
        shape.push(size);
        names.push(name);
    }
    let ty = TensorType::new(dtype, shape);
    tensors::shape(&ty.shape.iter().map(|&d| d as i64).collect::<Vec<_>>(), dtype.size_bytes()).map_err(at)?;
    let name = b.fresh(i.name.as_deref().unwrap_or("input"));
    let dims = names.iter().any(Option::is_some).then_some(names);
    b.add_input(Input { name: name.clone(), ty, dims, loc: None });
    let v = Value::Tensor(name.clone());
    if dtype.is_half() {
        return b
            .node(
                &format!("{name}.f32"),
                meshc_ir::Op::Cast,
                &[&v],
                &[("to", meshc_ir::Attr::Str(DType::F32.name().into()))],
            )
            .map_err(at);
    }
    Ok(v)
}

/// The outputs of the subgraph `g` (an `If`'s taken branch, one iteration of a `Loop`'s
/// body), its nodes imported in the scope of the graph around it (`values`, which it reads
/// by name) with its inputs bound to `inputs`; what it defines stays in it. Its names go
/// into `values` while it is imported and out again after, rather than into a copy of the
/// scope: an unrolled loop imports its body once per iteration, and copying a model's
/// every name each time made nested loops cost their trip counts times the model's size.
/// (ONNX defines each name once, so a name of the subgraph never hides one around it.)
fn subgraph(
    b: &mut Builder,
    g: &GraphProto,
    opset: i64,
    values: &mut HashMap<String, Value>,
    inputs: Vec<Value>,
) -> R<Vec<Value>> {
    let name = g.name.as_deref().unwrap_or("");
    let within = |e: String| format!("subgraph '{name}': {e}");
    if g.input.len() != inputs.len() {
        return Err(within(format!("it has {} inputs, where {} are given", g.input.len(), inputs.len())));
    }
    let bound = g.input.iter().map(|i| i.name.clone().unwrap_or_default()).zip(inputs);
    let initializers = g.initializer.iter().map(|t| {
        let name = t.name.clone().unwrap_or_default();
        if tensors::is_external(t) {
            return Err(format!(
                "initializer '{name}' keeps its data in an external file, which meshc reads only for the main graph"
            ));
        }
        let v = tensors::tensor_from(t, t.raw_data.as_deref()).map_err(|e| format!("initializer '{name}': {e}"))?;
        Ok((name.clone(), Value::named(v, &name)))
    });
    let mut defined = Vec::new();
    for (name, v) in bound.map(Ok).chain(initializers).collect::<R<Vec<_>>>().map_err(within)? {
        if values.contains_key(&name) {
            return Err(within(format!("'{name}' is already defined around it (ONNX defines each name once)")));
        }
        values.insert(name.clone(), v);
        defined.push(name);
    }
    for n in &g.node {
        node(b, n, g, opset, values).map_err(within)?;
        defined.extend(n.output.iter().filter(|o| !o.is_empty()).cloned());
    }
    let outputs = g
        .output
        .iter()
        .map(|o| {
            let name = o.name.as_deref().unwrap_or("");
            values.get(name).cloned().ok_or_else(|| within(format!("output '{name}' is computed by no node")))
        })
        .collect();
    for name in &defined {
        values.remove(name);
    }
    outputs
}

/// An `If` whose condition is computed at run time: both branches imported, each output
/// the `where` of the condition on the two branches' values, which must have the same type.
fn select(
    b: &mut Builder,
    n: &NodeProto,
    cond: &Value,
    branches: [&GraphProto; 2],
    opset: i64,
    values: &mut HashMap<String, Value>,
) -> R<Vec<Value>> {
    let name = n.name.as_deref().unwrap_or("if");
    let cond = scalar_cond(b, cond, &format!("{name}.cond"))?;
    let then = subgraph(b, branches[0], opset, values, Vec::new())?;
    let otherwise = subgraph(b, branches[1], opset, values, Vec::new())?;
    if then.len() != otherwise.len() {
        return Err(format!("its branches give {} and {} outputs", then.len(), otherwise.len()));
    }
    (then.iter().zip(&otherwise).enumerate())
        .map(|(k, (t, e))| {
            let (tt, te) = (b.ty(t), b.ty(e));
            if tt != te {
                return Err(format!(
                    "its condition is computed at run time and its branches give output {k} as {tt} and {te}; \
                     meshc selects between branches at run time only when they give the same types"
                ));
            }
            b.node(&format!("{name}.select{k}"), meshc_ir::Op::Where, &[&cond, t, e], &[])
        })
        .collect()
}

/// A condition computed at run time as a scalar bool: one value, a bool, reshaped to rank
/// 0 so that a `where` on it broadcasts to a value of any shape.
fn scalar_cond(b: &mut Builder, cond: &Value, name: &str) -> R<Value> {
    let ty = b.ty(cond);
    if ty.dtype != meshc_ir::DType::Bool || ty.numel() != 1 {
        return Err(format!("its condition is {ty}, where it takes one bool"));
    }
    super::ops::reshape(b, cond, &[], name)
}

/// A `Loop` unrolled: its body imported once per iteration, the carried values of one
/// iteration the inputs of the next, the scan outputs of every iteration stacked. The trip
/// count must be known at import time; a condition computed at run time keeps each
/// iteration's carried values only while it has held (`control::Trips`).
fn unroll(
    b: &mut Builder,
    n: &NodeProto,
    args: &[Option<Value>],
    opset: i64,
    values: &mut HashMap<String, Value>,
) -> R<Vec<Value>> {
    let body = control::body(n)?;
    let loop_name = n.name.as_deref().unwrap_or("loop");
    let mut trips = control::Trips::new(args)?;
    // Whether the iterations so far have run, where the condition is computed at run time.
    let mut running = match (trips.cond(), args.get(1).and_then(Option::as_ref)) {
        (control::Cond::AtRunTime, Some(c)) => Some(scalar_cond(b, c, &format!("{loop_name}.cond"))?),
        _ => None,
    };
    let mut carried: Vec<Value> = args
        .iter()
        .skip(2)
        .map(|a| a.clone().ok_or_else(|| "a loop-carried value is not given".to_string()))
        .collect::<R<_>>()?;
    let scans = body.output.len().checked_sub(1 + carried.len()).ok_or_else(|| {
        format!(
            "its body has {} outputs, fewer than the condition and {} carried values",
            body.output.len(),
            carried.len()
        )
    })?;
    let mut stacked: Vec<Vec<Value>> = vec![Vec::new(); scans];
    while let Some(number) = trips.next()? {
        let i = trips.current();
        let at = |e: String| format!("iteration {i}: {e}");
        if running.is_some() && scans > 0 {
            return Err(at("its condition is computed at run time, so the length of its scan outputs would be \
                           decided at run time, which meshc does not support"
                .to_string()));
        }
        count_unrolled(b, body)?;
        let cond_in = running.clone().unwrap_or_else(|| Value::computed(Tensor::new(vec![], Data::Bool(vec![true]))));
        let mut outs =
            subgraph(b, body, opset, values, [number, cond_in].into_iter().chain(carried.iter().cloned()).collect())
                .map_err(at)?;
        let scanned = outs.split_off(outs.len().saturating_sub(scans));
        let next = outs.split_off(1);
        carried = match &running {
            None => next,
            // This iteration ran only if the condition held through the last one.
            Some(r) => (next.iter().zip(&carried).enumerate())
                .map(|(k, (new, old))| {
                    let (tn, to) = (b.ty(new), b.ty(old));
                    if tn != to {
                        return Err(at(format!(
                            "its condition is computed at run time and carried value {k} changes from {to} to {tn}; \
                             meshc keeps an iteration's values at run time only when they keep their types"
                        )));
                    }
                    b.node(&format!("{loop_name}.keep{i}.{k}"), meshc_ir::Op::Where, &[r, new, old], &[])
                })
                .collect::<R<_>>()?,
        };
        let c = control::Cond::of(&outs[0], "body's condition").map_err(at)?;
        trips.set_condition(c);
        if c == control::Cond::AtRunTime {
            let c = scalar_cond(b, &outs[0], &format!("{loop_name}.cond{i}")).map_err(at)?;
            running = Some(match &running {
                None => c,
                Some(r) => b.node(&format!("{loop_name}.running{i}"), meshc_ir::Op::And, &[r, &c], &[]).map_err(at)?,
            });
        }
        for (all, v) in stacked.iter_mut().zip(scanned) {
            all.push(v);
        }
    }
    let mut results = carried;
    for (k, all) in stacked.iter().enumerate() {
        results.push(stack(b, all, 0, &format!("{loop_name}.scan{k}"))?);
    }
    Ok(results)
}

/// Counts one more imported copy of `body` against `control::MAX_UNROLLED`.
fn count_unrolled(b: &mut Builder, body: &GraphProto) -> R<()> {
    b.unrolled += body.node.len();
    if b.unrolled > control::MAX_UNROLLED {
        return Err(format!(
            "unrolling it imports more than {} loop-body nodes in the model, the most meshc unrolls",
            control::MAX_UNROLLED
        ));
    }
    Ok(())
}

/// The values of every iteration of a scan output, stacked along a new `axis`.
fn stack(b: &mut Builder, all: &[Value], axis: usize, name: &str) -> R<Value> {
    if all.is_empty() {
        return Err(format!("{name}: a scan output of no iteration would be empty, which meshc does not support"));
    }
    let rows = all
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut shape: Vec<i64> = b.ty(v).shape.iter().map(|&d| d as i64).collect();
            if axis > shape.len() {
                return Err(format!("{name}: axis {axis} is past the rank {} of its values", shape.len()));
            }
            shape.insert(axis, 1);
            super::ops::reshape(b, v, &shape, &format!("{name}.{i}"))
        })
        .collect::<R<Vec<_>>>()?;
    b.node(name, meshc_ir::Op::Concat, &rows.iter().collect::<Vec<_>>(), &[("axis", meshc_ir::Attr::Int(axis as i64))])
}

/// A `Scan` unrolled: its body imported once per slice of the scan inputs along their scan
/// axes (each read forward or backward), the states of one iteration the inputs of the
/// next, the scan outputs of every iteration stacked along their axes (in reverse order
/// where their direction says so). Scan-8's batched form is older than meshc reads.
fn scan(
    b: &mut Builder,
    n: &NodeProto,
    args: &[Option<Value>],
    opset: i64,
    values: &mut HashMap<String, Value>,
) -> R<Vec<Value>> {
    if opset < 9 {
        return Err(format!("Scan at opset {opset} (its batched form, before 9) is not supported"));
    }
    let body = control::body(n)?;
    let attr = |name: &str| n.attribute.iter().find(|a| a.name.as_deref() == Some(name));
    let m = attr("num_scan_inputs").and_then(|a| a.i).ok_or("num_scan_inputs is not given")?;
    let m = usize::try_from(m)
        .ok()
        .filter(|&m| m >= 1 && m <= args.len())
        .ok_or_else(|| format!("num_scan_inputs is {m}; the node has {} inputs", args.len()))?;
    let args: Vec<Value> =
        args.iter().map(|a| a.clone().ok_or_else(|| "an input is not given".to_string())).collect::<R<_>>()?;
    let (mut states, inputs) = (args[..args.len() - m].to_vec(), &args[args.len() - m..]);
    let scans =
        body.output.len().checked_sub(states.len()).ok_or_else(|| {
            format!("its body has {} outputs, fewer than its {} states", body.output.len(), states.len())
        })?;
    // An axis or direction per scan input (output), 0 where not given.
    let per = |name: &str, count: usize| -> R<Vec<i64>> {
        match attr(name) {
            None => Ok(vec![0; count]),
            Some(a) if a.ints.len() == count => Ok(a.ints.clone()),
            Some(a) => Err(format!("{name} has {} entries, for {count} scan values", a.ints.len())),
        }
    };
    let (in_axes, in_dirs) = (per("scan_input_axes", m)?, per("scan_input_directions", m)?);
    let (out_axes, out_dirs) = (per("scan_output_axes", scans)?, per("scan_output_directions", scans)?);
    if let Some(d) = in_dirs.iter().chain(&out_dirs).find(|&&d| d != 0 && d != 1) {
        return Err(format!("a scan direction is {d}, where ONNX has 0 (forward) and 1 (reverse)"));
    }
    let mut axes = Vec::with_capacity(m);
    let mut trips = None;
    for (j, (v, &axis)) in inputs.iter().zip(&in_axes).enumerate() {
        let shape = b.ty(v).shape;
        let axis = meshc_ir::infer::norm_axis(axis, shape.len()).map_err(|e| format!("scan input {j}: {e}"))?;
        if trips.is_some_and(|t| t != shape[axis]) {
            return Err(format!(
                "scan input {j} has {} slices along its axis, the first {}",
                shape[axis],
                trips.unwrap_or(0)
            ));
        }
        trips = Some(shape[axis]);
        axes.push(axis);
    }
    let trips = trips.unwrap_or(0);
    if trips as i64 > control::MAX_TRIPS {
        return Err(format!("it runs {trips} iterations, more than the {} meshc unrolls", control::MAX_TRIPS));
    }
    let name = n.name.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "scan".into());
    let mut stacked: Vec<Vec<Value>> = vec![Vec::new(); scans];
    for t in 0..trips {
        count_unrolled(b, body)?;
        let slices = inputs
            .iter()
            .zip(axes.iter().zip(&in_dirs))
            .enumerate()
            .map(|(j, (v, (&axis, &dir)))| {
                let at = if dir == 1 { trips - 1 - t } else { t };
                let index = Value::computed(meshc_ir::Tensor::new(vec![], meshc_ir::Data::I64(vec![at as i64])));
                let attrs = [("axis", meshc_ir::Attr::Int(axis as i64))];
                b.node(&format!("{name}.in{j}.{t}"), meshc_ir::Op::Gather, &[v, &index], &attrs)
            })
            .collect::<R<Vec<_>>>()?;
        let mut outs = subgraph(b, body, opset, values, states.into_iter().chain(slices).collect())
            .map_err(|e| format!("iteration {t}: {e}"))?;
        let scanned = outs.split_off(outs.len() - scans);
        states = outs;
        for (all, v) in stacked.iter_mut().zip(scanned) {
            all.push(v);
        }
    }
    let mut results = states;
    for (k, ((mut all, &axis), &dir)) in stacked.into_iter().zip(&out_axes).zip(&out_dirs).enumerate() {
        if dir == 1 {
            all.reverse();
        }
        let rank = all.first().map_or(0, |v| b.ty(v).shape.len()) + 1;
        let axis = meshc_ir::infer::norm_axis(axis, rank).map_err(|e| format!("scan output {k}: {e}"))?;
        results.push(stack(b, &all, axis, &format!("{name}.scan{k}"))?);
    }
    Ok(results)
}

/// The values `results` of node `n` recorded under its output names: as many as it has.
fn record(n: &NodeProto, results: Vec<Value>, values: &mut HashMap<String, Value>) -> R<()> {
    if results.len() != n.output.len() {
        return Err(format!("its subgraph gives {} outputs, the node has {}", results.len(), n.output.len()));
    }
    for (name, v) in n.output.iter().zip(results).filter(|(name, _)| !name.is_empty()) {
        values.insert(name.clone(), v);
    }
    Ok(())
}

/// A dim of an input as the model declares it.
enum ModelDim {
    Size(usize),
    Named(String),
    /// Neither: why, for the error (Paddle2ONNX writes -1, some exporters nothing).
    Unknown(&'static str),
}

impl ModelDim {
    fn of(d: &tensor_shape_proto::Dimension) -> ModelDim {
        match &d.value {
            Some(dimension::Value::DimValue(v)) if *v >= 0 => ModelDim::Size(*v as usize),
            Some(dimension::Value::DimValue(_)) => ModelDim::Unknown("its dim_value is negative"),
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => ModelDim::Named(p.clone()),
            _ => ModelDim::Unknown("the model gives neither dim_value nor dim_param"),
        }
    }
}

/// A dim name that `--input-shape`s gave two sizes (an exporter naming unrelated dims `?`,
/// say) names nothing: it is dropped from every input, since a meshc dim name stands for one
/// size (a layout spec's rules and `--dim` on the written graph bind it as one).
fn unname_clashing_dims(g: &mut Graph) {
    let mut sizes: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for i in &g.inputs {
        for (name, &n) in i.dims.iter().flatten().zip(&i.ty.shape) {
            if let Some(name) = name {
                sizes.entry(name.clone()).or_default().insert(n);
            }
        }
    }
    for i in &mut g.inputs {
        if let Some(dims) = &mut i.dims {
            for d in dims.iter_mut() {
                if d.as_ref().is_some_and(|name| sizes[name].len() > 1) {
                    *d = None;
                }
            }
            if dims.iter().all(Option::is_none) {
                i.dims = None;
            }
        }
    }
}

/// One node of `g`: checked for its domain, against its op's schema (`validate`) and for
/// outputs no other node, input or initializer defines (ONNX graphs are in SSA form),
/// converted by the converter of its op type at the model's opset (`dispatch`), its
/// outputs recorded.
fn node(b: &mut Builder, n: &NodeProto, g: &GraphProto, opset: i64, values: &mut HashMap<String, Value>) -> R<()> {
    let op_type = n.op_type.as_deref().unwrap_or("");
    let out = n.output.iter().find(|o| !o.is_empty()).cloned().unwrap_or_default();
    let label = n.name.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| out.clone());
    // An op type ONNX does not define is the file's own text, so it is only shown quoted
    // (where errors escape and shorten what a file names).
    let known = validate::defines(op_type);
    let fail = |e: String| match known {
        true => format!("node '{label}' ({op_type}): {e}"),
        false => format!("node '{label}': {e}"),
    };
    if !is_default_domain(n.domain.as_deref()) {
        let domain = n.domain.as_deref().unwrap_or("");
        return Err(fail(format!(
            "domain '{domain}' of op '{op_type}' is not supported (only the default ONNX domain)"
        )));
    }
    validate::check(n, opset).map_err(fail)?;
    for (k, o) in n.output.iter().enumerate().filter(|(_, o)| !o.is_empty()) {
        let by = match () {
            _ if g.input.iter().any(|i| i.name.as_ref() == Some(o)) => "a graph input",
            _ if g.initializer.iter().any(|t| t.name.as_ref() == Some(o)) => "an initializer",
            _ if n.output[..k].contains(o) => "this node's output before it",
            _ if values.contains_key(o) => "an earlier node",
            _ => continue,
        };
        return Err(fail(format!("output '{o}' is already defined by {by} (ONNX defines each name once)")));
    }
    let args = n
        .input
        .iter()
        .map(|i| match i.as_str() {
            "" => Ok(None),
            i => values.get(i).cloned().map(Some).ok_or_else(|| {
                fail(format!("input '{i}' is not computed before it (the nodes are not in order, or form a cycle)"))
            }),
        })
        .collect::<R<Vec<_>>>()?;
    if op_type == "If" {
        let cond = args.first().and_then(Option::as_ref);
        let results = match (control::branches(n, cond).map_err(fail)?, cond) {
            (control::Branches::Both { then, otherwise }, Some(cond)) => {
                select(b, n, cond, [then, otherwise], opset, values)
            }
            (control::Branches::Taken(g), _) => subgraph(b, g, opset, values, Vec::new()),
            (control::Branches::Both { .. }, None) => Err("its condition (input 0) is not given".into()),
        }
        .map_err(fail)?;
        return record(n, results, values).map_err(fail);
    }
    if op_type == "Loop" {
        let results = unroll(b, n, &args, opset, values).map_err(fail)?;
        return record(n, results, values).map_err(fail);
    }
    if op_type == "Scan" {
        let results = scan(b, n, &args, opset, values).map_err(fail)?;
        return record(n, results, values).map_err(fail);
    }
    let convert = dispatch::converter(op_type, opset).map_err(fail)?;
    // The meshc nodes are named after the ONNX node (`/encoder/layer.0/attention/self/query/MatMul`),
    // which says where in the model they are; a node without a name after its first output.
    let results = convert(b, &Ctx { node: n, args, opset, out: label.clone() }).map_err(fail)?;
    for (name, v) in n.output.iter().zip(results).filter(|(name, _)| !name.is_empty()) {
        values.insert(name.clone(), v);
    }
    Ok(())
}
