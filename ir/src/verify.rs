//! The verifier: everything that makes a graph well-formed — unique names, known operands,
//! no cycles, arity, attribute schemas, dtypes and shapes (via `infer`), declared types,
//! existing outputs. It returns what later stages need: a topological order and the type
//! and dim names of every tensor.

use std::collections::{BTreeSet, HashMap};

use crate::budget::CEILING;
use crate::dtype::{ShapeDisplay, TensorType};
use crate::error::{Error, Loc, Result};
use crate::graph::{Dims, Graph, Node, ParamData};
use crate::infer::{self, Operand};
use crate::params;

/// What the verifier learned about a well-formed graph.
#[derive(Clone, Debug)]
pub struct Info {
    /// Node indices in a topological order (stable: ties keep the file's order).
    pub order: Vec<usize>,
    /// Type of every input, param and node.
    pub types: HashMap<String, TensorType>,
    /// Dim names of every tensor that has any.
    pub dims: HashMap<String, Dims>,
}

fn node_err(n: &Node, msg: impl std::fmt::Display) -> Error {
    Error::at(n.loc, format!("node '{}': {msg}", n.name))
}

fn check_size(ty: &TensorType, loc: Option<Loc>, what: &str) -> Result<()> {
    match ty.checked_size_bytes() {
        Some(_) => Ok(()),
        None => {
            Err(Error::at(loc, format!("{what}: {ty} is too large (the limit is {} GiB per tensor)", CEILING >> 30)))
        }
    }
}

fn check_dims(dims: &Option<Dims>, ty: &TensorType, loc: Option<Loc>, what: &str) -> Result<()> {
    match dims {
        Some(d) if d.len() != ty.rank() => Err(Error::at(
            loc,
            format!(
                "{what}: dims lists {} name{} but the shape {} has rank {}",
                d.len(),
                if d.len() == 1 { "" } else { "s" },
                ShapeDisplay(&ty.shape),
                ty.rank()
            ),
        )),
        _ => Ok(()),
    }
}

/// Each symbol a graph declares names input dims, which give its example value, and the
/// graph as written is one of the sizes its bounds allow.
fn check_symbols(g: &Graph) -> Result<()> {
    for s in g.symbols.values() {
        let mut carried = false;
        for i in &g.inputs {
            for (k, d) in i.dims.iter().flatten().enumerate() {
                if d.as_deref() != Some(s.name.as_str()) {
                    continue;
                }
                carried = true;
                let size = i.ty.shape[k];
                if let Some(why) = s.refuse(i64::try_from(size).unwrap_or(i64::MAX)) {
                    let msg = format!(
                        "symbol '{}': input '{}' is written with {} = {size} (dim {k}), {why}",
                        s.name, i.name, s.name
                    );
                    return Err(Error::at(i.loc, msg));
                }
            }
        }
        if !carried {
            let named = g.input_dim_names();
            return Err(Error::new(format!(
                "symbol '{}': no input has a dim named '{}' (named input dims: {named})",
                s.name, s.name
            )));
        }
    }
    Ok(())
}

fn check_attrs(n: &Node) -> Result<()> {
    let specs = n.op.attrs();
    for (k, v) in &n.attrs {
        let spec = specs.iter().find(|s| s.name == k).ok_or_else(|| {
            let known: Vec<&str> = specs.iter().map(|s| s.name).collect();
            let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
            node_err(n, format!("{} has no attribute '{k}' (it takes: {known})", n.op))
        })?;
        if !spec.accepts(v) {
            return Err(node_err(n, format!("attribute '{k}' must be {}, found {v}", spec.kind)));
        }
    }
    if let Some(s) = specs.iter().find(|s| s.required && !n.attrs.contains_key(s.name)) {
        return Err(node_err(n, format!("{} needs attribute '{}': {}", n.op, s.name, s.kind)));
    }
    Ok(())
}

/// Orders the nodes so every operand is computed before its use; a cycle is an error
/// naming the nodes on it. Hand-written rather than petgraph's `toposort`: ties here keep
/// the file's order (dumps and programs follow the graph as written), and a cycle is
/// reported as its whole path, where petgraph's `Cycle` names one node of it.
fn topo_order(g: &Graph, producer: &HashMap<&str, usize>) -> Result<Vec<usize>> {
    let n = g.nodes.len();
    let mut indegree = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in g.nodes.iter().enumerate() {
        for inp in &node.inputs {
            if let Some(&p) = producer.get(inp.as_str()) {
                indegree[i] += 1;
                users[p].push(i);
            }
        }
    }
    let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every node left has an unfinished operand; following those operands must revisit a node.
    let mut path = vec![(0..n).find(|&i| indegree[i] > 0).expect("some node is left")];
    loop {
        let cur = &g.nodes[*path.last().expect("non-empty")];
        let next = cur
            .inputs
            .iter()
            .filter_map(|inp| producer.get(inp.as_str()).copied())
            .find(|&p| indegree[p] > 0)
            .expect("a node on a cycle has an operand on it");
        if let Some(start) = path.iter().position(|&p| p == next) {
            let names: Vec<&str> = [next]
                .iter()
                .chain(path[start + 1..].iter().rev())
                .chain([&next])
                .map(|&i| g.nodes[i].name.as_str())
                .collect();
            return Err(node_err(&g.nodes[next], format!("cycle: {}", names.join(" -> "))));
        }
        path.push(next);
    }
}

pub fn verify(g: &Graph) -> Result<Info> {
    let mut types: HashMap<String, TensorType> = HashMap::new();
    let mut dims: HashMap<String, Dims> = HashMap::new();
    let mut declared: HashMap<String, Option<Loc>> = HashMap::new();
    let mut declare = |name: &str, loc: Option<Loc>, what: &str| -> Result<()> {
        if name.is_empty() {
            return Err(Error::at(loc, format!("{what} has an empty name")));
        }
        if let Some(prev) = declared.insert(name.to_string(), loc) {
            let prev = prev.map(|l| format!(" (first defined at {}:{})", l.line, l.col)).unwrap_or_default();
            return Err(Error::at(loc, format!("{what} '{name}' is defined twice{prev}")));
        }
        Ok(())
    };
    for i in &g.inputs {
        declare(&i.name, i.loc, "input")?;
        check_size(&i.ty, i.loc, &format!("input '{}'", i.name))?;
        check_dims(&i.dims, &i.ty, i.loc, &format!("input '{}'", i.name))?;
        types.insert(i.name.clone(), i.ty.clone());
        if let Some(d) = &i.dims {
            dims.insert(i.name.clone(), d.clone());
        }
    }
    check_symbols(g)?;
    for p in &g.params {
        declare(&p.name, p.loc, "param")?;
        check_size(&p.ty, p.loc, &format!("param '{}'", p.name))?;
        check_dims(&p.dims, &p.ty, p.loc, &format!("param '{}'", p.name))?;
        if let ParamData::Value(v) = &p.data {
            params::inline_value(p, v)?;
        }
        types.insert(p.name.clone(), p.ty.clone());
        if let Some(d) = &p.dims {
            dims.insert(p.name.clone(), d.clone());
        }
    }
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (idx, n) in g.nodes.iter().enumerate() {
        declare(&n.name, n.loc, "node")?;
        producer.insert(&n.name, idx);
    }
    for n in &g.nodes {
        if !n.op.arity().accepts(n.inputs.len()) {
            return Err(node_err(n, format!("{} takes {}, got {}", n.op, n.op.arity(), n.inputs.len())));
        }
        if let Some(missing) = n.inputs.iter().find(|i| !types.contains_key(*i) && !producer.contains_key(i.as_str())) {
            return Err(node_err(n, format!("unknown operand '{missing}'")));
        }
        check_attrs(n)?;
    }
    let order = topo_order(g, &producer)?;
    for &idx in &order {
        let n = &g.nodes[idx];
        let operands: Vec<Operand> = n.inputs.iter().map(|i| Operand { ty: &types[i], dims: dims.get(i) }).collect();
        let mut inf = infer::infer(n, &operands)
            .map_err(|e| node_err(n, if e.starts_with(n.op.name()) { e } else { format!("{}: {e}", n.op) }))?;
        let declared_ok =
            n.dtype.is_none_or(|d| d == inf.ty.dtype) && n.shape.as_ref().is_none_or(|s| *s == inf.ty.shape);
        if !declared_ok {
            let want = format!(
                "{}{}",
                n.dtype.map_or("?".to_string(), |d| d.to_string()),
                n.shape.as_ref().map_or("".to_string(), |s| ShapeDisplay(s).to_string())
            );
            return Err(node_err(n, format!("declared type {want} but {} gives {}", n.op, inf.ty)));
        }
        check_size(&inf.ty, n.loc, &format!("node '{}'", n.name))?;
        check_dims(&n.dims, &inf.ty, n.loc, &format!("node '{}'", n.name))?;
        if n.dims.is_some() {
            inf.dims.clone_from(&n.dims);
        }
        if let Some(d) = inf.dims {
            dims.insert(n.name.clone(), d);
        }
        types.insert(n.name.clone(), inf.ty);
    }
    if g.outputs.is_empty() {
        return Err(Error::new("the graph has no outputs"));
    }
    let mut seen = BTreeSet::new();
    for o in &g.outputs {
        if !types.contains_key(&o.name) {
            return Err(Error::at(o.loc, format!("output '{}' is not an input, param or node of the graph", o.name)));
        }
        if !seen.insert(&o.name) {
            return Err(Error::at(o.loc, format!("output '{}' is listed twice", o.name)));
        }
    }
    Ok(Info { order, types, dims })
}
