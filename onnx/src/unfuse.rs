//! Fused projections split back into one projection per part. Exporters of GPT-2-style
//! models compute the query, key and value with one matmul against a weight with the three
//! weights side by side (`c_attn`, `[hidden, 3·hidden]`), then slice its output into
//! three. Split over a mesh axis, that fused dim would give each device a block that cuts
//! across the three parts (device 0 of 2 holding all of q and half of k), so Megatron
//! sharding of the heads is out of reach, and the dim has no role to be named by. When
//! every reader of such a projection (after its bias, if any) is a slice of its last dim,
//! each slice becomes a matmul with its own slice of the weight (and bias): the parts are
//! ordinary projections, their output dims are `heads` (`dims`), and a rule splits each
//! one evenly. The weight slices are taken with the reference interpreter's slice, so they
//! follow ONNX's clamping exactly; the parts compute the same sums as the fused matmul.

use std::collections::HashMap;

use meshc_ir::infer::{infer, Operand};
use meshc_ir::interp::eval_node;
use meshc_ir::{attrs, Attr, Graph, Node, Op, Param, Tensor};

use crate::builder::Builder;

/// One fused projection found: `y = x·w` (`matmul`), then `z = y + bias` (`add`; whether
/// the bias is its first operand) when there is one, read only by `slices`.
struct Fused {
    matmul: String,
    weight: String,
    add: Option<(String, String, bool)>,
    slices: Vec<String>,
}

pub fn split_fused_projections(b: &mut Builder) {
    for f in find(&b.graph, &b.params) {
        // A projection whose slices cannot all be taken of the weight stays fused.
        let _ = split(b, &f);
    }
}

fn readers(g: &Graph) -> HashMap<&str, Vec<&Node>> {
    let mut r: HashMap<&str, Vec<&Node>> = HashMap::new();
    for n in &g.nodes {
        for i in &n.inputs {
            r.entry(i.as_str()).or_default().push(n);
        }
    }
    r
}

fn find(g: &Graph, params: &HashMap<String, Tensor>) -> Vec<Fused> {
    let readers = readers(g);
    let outputs: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
    let only = |t: &str| -> Option<&[&Node]> {
        (!outputs.contains(&t)).then(|| readers.get(t).map(Vec::as_slice).unwrap_or(&[]))
    };
    let mut found = Vec::new();
    for m in g.nodes.iter().filter(|n| n.op == Op::MatMul && n.inputs.len() == 2) {
        let weight = &m.inputs[1];
        if params.get(weight).is_none_or(|w| w.shape.len() != 2) {
            continue;
        }
        let Some(after) = only(&m.name) else { continue };
        let (add, z) = match after {
            [a] if a.op == Op::Add && a.inputs.len() == 2 => {
                let bias_first = a.inputs[0] != m.name;
                let bias = &a.inputs[usize::from(!bias_first)];
                let n = params[weight].shape[1];
                if params.get(bias).is_none_or(|t| t.shape != [n]) {
                    continue;
                }
                (Some((a.name.clone(), bias.clone(), bias_first)), a.name.as_str())
            }
            _ => (None, m.name.as_str()),
        };
        let Some(slices) = only(z) else { continue };
        if slices.len() < 2 || !slices.iter().all(|s| last_axis_slice(s)) {
            continue;
        }
        let slices = slices.iter().map(|s| s.name.clone()).collect();
        found.push(Fused { matmul: m.name.clone(), weight: weight.clone(), add, slices });
    }
    found
}

/// A slice of the last dim only (`axes = [-1]`, or the last axis of the matmul's output,
/// which is all `find` accepts: the weight is 2-D, so a slice of another dim would be of
/// the activations' rows).
fn last_axis_slice(s: &Node) -> bool {
    let Ok(a) = attrs::Slice::try_of(s) else { return false };
    let last = a.axes.as_deref().is_some_and(|ax| ax.len() == 1) && a.starts.len() == 1;
    last && a.steps.as_deref().is_none_or(|st| st == [1])
}

fn split(b: &mut Builder, f: &Fused) -> Result<(), String> {
    let g = &b.graph;
    let m = g.nodes.iter().find(|n| n.name == f.matmul).ok_or("matmul gone")?;
    let x = m.inputs[0].clone();
    let rank = b.types[&f.matmul].rank() as i64;
    let mut parts = Vec::new();
    for (k, s) in f.slices.iter().enumerate() {
        let node = g.nodes.iter().find(|n| &n.name == s).ok_or("slice gone")?;
        let a = attrs::Slice::try_of(node)?;
        let axis = a.axes.as_deref().unwrap_or(&[])[0];
        if axis != -1 && axis != rank - 1 {
            return Err("not the last dim".into());
        }
        let cut = |t: &Tensor, axis: i64| -> Result<Tensor, String> {
            let mut n = Node::new("part", Op::Slice, &[]);
            n.attrs.insert("starts".into(), Attr::ints(&a.starts));
            n.attrs.insert("ends".into(), Attr::ints(&a.ends));
            n.attrs.insert("axes".into(), Attr::ints(&[axis]));
            let ty = t.ty();
            let out = infer(&n, &[Operand { ty: &ty, dims: None }])?.ty;
            eval_node(&n, &[t], &out).map_err(|e| e.msg)
        };
        let w = cut(&b.params[&f.weight], 1)?;
        let bias = match &f.add {
            Some((_, bias, _)) => Some(cut(&b.params[bias], 0)?),
            None => None,
        };
        parts.push((k, s.clone(), w, bias));
    }
    let first_new = b.graph.params.len();
    let mut replacement: HashMap<String, Vec<Node>> = HashMap::new();
    for (k, s, w, bias) in parts {
        let wname = b.param(&format!("{}.{k}", f.weight), w);
        let mut nodes = Vec::new();
        match (&f.add, bias) {
            (Some((_, bname, bias_first)), Some(bv)) => {
                let bname = b.param(&format!("{bname}.{k}"), bv);
                let mm = b.fresh(&format!("{s}.matmul"));
                b.types.insert(mm.clone(), b.types[&s].clone());
                nodes.push(Node::new(&mm, Op::MatMul, &[x.as_str(), wname.as_str()]));
                let operands = if *bias_first { [bname.as_str(), mm.as_str()] } else { [mm.as_str(), bname.as_str()] };
                nodes.push(Node::new(&s, Op::Add, &operands));
            }
            _ => nodes.push(Node::new(&s, Op::MatMul, &[x.as_str(), wname.as_str()])),
        }
        replacement.insert(s.clone(), nodes);
    }
    let gone = [Some(f.matmul.clone()), f.add.as_ref().map(|a| a.0.clone())];
    let old = std::mem::take(&mut b.graph.nodes);
    for n in old {
        if let Some(new) = replacement.remove(&n.name) {
            b.graph.nodes.extend(new);
        } else if !gone.contains(&Some(n.name.clone())) {
            b.graph.nodes.push(n);
        }
    }
    // The parts' params go where the fused weight was, so the graph reads in order.
    let new: Vec<Param> = b.graph.params.drain(first_new..).collect();
    let at = b.graph.params.iter().position(|q| q.name == f.weight).ok_or("weight gone")?;
    b.graph.params.splice(at + 1..at + 1, new);
    let mut fused = vec![f.weight.as_str()];
    fused.extend(f.add.as_ref().map(|a| a.1.as_str()));
    for p in fused {
        if !b.graph.nodes.iter().any(|n| n.inputs.iter().any(|i| i == p)) {
            b.graph.params.retain(|q| q.name != p);
            b.params.remove(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use meshc_ir::{interp, verify, Attr, DType, Input, Op, Output, Tensor, TensorType};

    use super::split_fused_projections;
    use crate::builder::{Builder, Value};

    /// x·w + bias cut into [0, 2) and [2, -1) (an uneven split, with an end from the back),
    /// plus `extra` reading the projection itself when asked.
    fn model(extra: bool) -> Builder {
        let mut b = Builder::default();
        let ty = TensorType::new(DType::F32, vec![3, 4]);
        b.add_input(Input { name: "x".into(), ty, dims: None, loc: None });
        let x = Value::Tensor("x".into());
        let vals = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<_>>();
        let w = Value::named(Tensor::f32(vec![4, 6], vals(24, 0.7)), "w");
        let bias = Value::named(Tensor::f32(vec![6], vals(6, 1.3)), "bias");
        let y = b.node("y", Op::MatMul, &[&x, &w], &[]).unwrap();
        let z = b.node("z", Op::Add, &[&bias, &y], &[]).unwrap();
        let mut outs = Vec::new();
        for (name, start, end) in [("q", 0, 2), ("kv", 2, -1)] {
            let attrs = [("starts", Attr::ints(&[start])), ("ends", Attr::ints(&[end])), ("axes", Attr::ints(&[-1]))];
            outs.push(b.node(name, Op::Slice, &[&z], &attrs).unwrap());
        }
        if extra {
            outs.push(b.node("r", Op::Relu, &[&z], &[]).unwrap());
        }
        for o in outs {
            let Value::Tensor(n) = o else { unreachable!() };
            b.graph.outputs.push(Output::new(n));
        }
        b
    }

    fn run(b: &Builder) -> HashMap<String, Vec<f64>> {
        let info = verify::verify(&b.graph).unwrap();
        let mut values = b.params.clone();
        values.insert("x".into(), Tensor::f32(vec![3, 4], (0..12).map(|i| i as f32 / 5.0 - 1.0).collect()));
        let out = interp::run(&b.graph, &info.order, &info.types, values).unwrap();
        out.into_iter().map(|(k, t)| (k, t.data.to_f64())).collect()
    }

    #[test]
    fn slices_of_a_projection_become_projections_with_the_same_values() {
        let mut b = model(false);
        let want = run(&b);
        split_fused_projections(&mut b);
        let ops: Vec<(&str, Op)> = b.graph.nodes.iter().map(|n| (n.name.as_str(), n.op)).collect();
        assert_eq!(
            ops,
            [("q.matmul", Op::MatMul), ("q", Op::Add), ("kv.matmul", Op::MatMul), ("kv", Op::Add)],
            "{:?}",
            b.graph.nodes
        );
        let params: Vec<(&str, &[usize])> =
            b.graph.params.iter().map(|p| (p.name.as_str(), p.ty.shape.as_slice())).collect();
        assert_eq!(params, [("w.0", &[4, 2][..]), ("bias.0", &[2]), ("w.1", &[4, 3]), ("bias.1", &[3])]);
        // The bias stays the add's first operand, as the model wrote it.
        assert_eq!(b.graph.nodes[1].inputs, ["bias.0", "q.matmul"]);
        assert_eq!(run(&b), want);
    }

    #[test]
    fn a_projection_read_whole_stays_fused() {
        let mut b = model(true);
        let before: Vec<String> = b.graph.nodes.iter().map(|n| n.name.clone()).collect();
        split_fused_projections(&mut b);
        let after: Vec<String> = b.graph.nodes.iter().map(|n| n.name.clone()).collect();
        assert_eq!(before, after);
    }
}
