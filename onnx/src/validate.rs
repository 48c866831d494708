//! Every node checked against ONNX's schema of its op in the version in effect at the
//! model's opset, as onnx's checker and onnxruntime check a model before running it: the op
//! exists at that opset and is not deprecated; it has as many inputs and outputs as the
//! schema allows, and no empty name where one is required; each attribute is one the
//! schema defines, given once, of the schema's type and with its value; every required
//! attribute is given. A model onnxruntime refuses is refused, in one line naming the node,
//! rather than imported with a meaning of meshc's guessing (a float `axis` read as the
//! default, a third input of Add ignored). The schemas are the onnx package's, generated
//! into schemas.rs (tools/gen_onnx_schemas.py).

use super::proto::attribute_proto::AttributeType as A;
use super::proto::{AttributeProto, NodeProto};

type R<T> = std::result::Result<T, String>;

/// One version of an op's schema: the op type; the opset it came in at; whether it is
/// deprecated; its inputs and its outputs as (fewest, most, formal parameters: one letter
/// each, `S` single, `O` optional, `V` variadic, which the last one may be); its
/// attributes as (name, type, required).
struct S(&'static str, i64, bool, Arity, Arity, &'static [(&'static str, A, bool)]);

type Arity = (usize, usize, &'static str);

include!("schemas.rs");

/// Checks `n`, a node of the default domain, against its op's schema at `opset`. An op
/// ONNX does not define passes: the converter lookup refuses it, naming it.
pub fn check(n: &NodeProto, opset: i64) -> R<()> {
    let op = n.op_type.as_deref().unwrap_or("");
    let versions = versions(op);
    let Some(first) = versions.first() else { return Ok(()) };
    let Some(S(_, since, deprecated, inputs, outputs, attrs)) = versions.iter().rev().find(|s| s.1 <= opset) else {
        return Err(format!("{op} does not exist at opset {opset} (ONNX defines it from opset {})", first.1));
    };
    if *deprecated {
        return Err(format!("{op} is deprecated from opset {since} on (the model's opset is {opset})"));
    }
    arity(op, "input", &n.input, inputs)?;
    arity(op, "output", &n.output, outputs)?;
    let mut seen: Vec<&str> = Vec::new();
    for a in &n.attribute {
        let name = a.name.as_deref().unwrap_or("");
        if seen.contains(&name) {
            return Err(format!("attribute '{name}' is given twice"));
        }
        seen.push(name);
        let Some(&(_, want, _)) = attrs.iter().find(|(known, ..)| *known == name) else {
            let known: Vec<&str> = attrs.iter().map(|(k, ..)| *k).collect();
            return Err(match known.is_empty() {
                true => format!("unknown attribute '{name}' ({op} at opset {opset} has none)"),
                false => format!("unknown attribute '{name}' ({op} at opset {opset} has {})", known.join(", ")),
            });
        };
        attribute(op, a, name, want)?;
    }
    if let Some((name, ..)) = attrs.iter().find(|(name, _, required)| *required && !seen.contains(name)) {
        return Err(format!("attribute '{name}' is required"));
    }
    Ok(())
}

/// Whether ONNX's default domain defines `op` at some opset.
pub fn defines(op: &str) -> bool {
    !versions(op).is_empty()
}

/// Every version of `op`'s schema, oldest first.
fn versions(op: &str) -> &'static [S] {
    let from = SCHEMAS.partition_point(|s| s.0 < op);
    &SCHEMAS[from..from + SCHEMAS[from..].partition_point(|s| s.0 == op)]
}

/// The opset the version of `op` in effect at `opset` came in at; for an op that does not
/// exist yet at `opset`, the one its first version came in at.
pub fn since(op: &str, opset: i64) -> Option<i64> {
    let v = versions(op);
    v.iter().rev().find(|s| s.1 <= opset).or(v.first()).map(|s| s.1)
}

/// The node's inputs or outputs `names` against the schema's `(fewest, most, formals)`.
fn arity(op: &str, what: &str, names: &[String], (fewest, most, formals): &Arity) -> R<()> {
    let n = names.len();
    if n < *fewest || n > *most {
        let takes = match (fewest, most) {
            (lo, hi) if lo == hi => format!("{lo}"),
            (lo, &hi) if hi >= i32::MAX as usize => format!("at least {lo}"),
            (lo, hi) => format!("{lo} to {hi}"),
        };
        let s = if n == 1 { "" } else { "s" };
        return Err(format!("it has {n} {what}{s}, {op} takes {takes}"));
    }
    for (k, name) in names.iter().enumerate() {
        // Past the formal parameters is the last one's variadic tail.
        if name.is_empty() && formals.as_bytes().get(k).is_some_and(|&f| f == b'S') {
            return Err(format!("{what} {k} is empty, but {op} requires it"));
        }
    }
    Ok(())
}

/// One attribute against the type `want` its schema gives it: the type it says it has,
/// and the value field of that type, set.
fn attribute(op: &str, a: &AttributeProto, name: &str, want: A) -> R<()> {
    if a.ref_attr_name.as_deref().is_some_and(|r| !r.is_empty()) {
        return Err(format!("attribute '{name}' refers to a function's attribute, which a graph's node cannot"));
    }
    let have = a.r#type.and_then(|t| A::try_from(t).ok()).unwrap_or(A::Undefined);
    if have != want {
        return Err(format!("attribute '{name}' is {}, {op} takes {}", have.as_str_name(), want.as_str_name()));
    }
    let set = match want {
        A::Float => a.f.is_some(),
        A::Int => a.i.is_some(),
        A::String => a.s.is_some(),
        A::Tensor => a.t.is_some(),
        A::Graph => a.g.is_some(),
        A::SparseTensor => a.sparse_tensor.is_some(),
        A::TypeProto => a.tp.is_some(),
        // Lists may be empty.
        _ => true,
    };
    match set {
        true => Ok(()),
        false => Err(format!("attribute '{name}' ({}) has no value", want.as_str_name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::supported;

    fn node(op: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute,
            ..Default::default()
        }
    }

    fn attr(name: &str, ty: A) -> AttributeProto {
        AttributeProto { name: Some(name.into()), r#type: Some(ty as i32), ..Default::default() }
    }

    fn int(name: &str, v: i64) -> AttributeProto {
        AttributeProto { i: Some(v), ..attr(name, A::Int) }
    }

    #[test]
    fn the_schemas_are_sorted_and_every_supported_op_is_onnxs() {
        assert!(SCHEMAS.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)), "not sorted by op, opset");
        for op in supported() {
            assert!(SCHEMAS.iter().any(|s| s.0 == op && s.1 <= 28), "{op}: no ONNX schema");
        }
    }

    #[test]
    fn nodes_are_checked_as_onnxruntime_checks_them() {
        let softmax = |a| node("Softmax", &["x"], &["y"], vec![a]);
        assert_eq!(check(&softmax(int("axis", 1)), 17), Ok(()));
        let float_axis = AttributeProto { f: Some(1.0), ..attr("axis", A::Float) };
        let cases = [
            (softmax(float_axis), 17, "attribute 'axis' is FLOAT, Softmax takes INT"),
            (softmax(AttributeProto { s: Some(b"1".to_vec()), ..attr("axis", A::String) }), 17, "is STRING"),
            (softmax(AttributeProto { i: Some(1), ..attr("axis", A::Undefined) }), 17, "is UNDEFINED"),
            (softmax(attr("axis", A::Int)), 17, "attribute 'axis' (INT) has no value"),
            (node("Softmax", &["x"], &["y"], vec![int("axis", 1), int("axis", 0)]), 17, "'axis' is given twice"),
            (
                node("Relu", &["x"], &["y"], vec![int("alpha", 1)]),
                17,
                "unknown attribute 'alpha' (Relu at opset 17 has none)",
            ),
            (node("Add", &["x"], &["y"], vec![]), 17, "it has 1 input, Add takes 2"),
            (node("Add", &["x", "x", "x"], &["y"], vec![]), 17, "it has 3 inputs, Add takes 2"),
            (node("Relu", &["x"], &["y", "z"], vec![]), 17, "it has 2 outputs, Relu takes 1"),
            (node("Concat", &[], &["y"], vec![int("axis", 0)]), 17, "it has 0 inputs, Concat takes at least 1"),
            (node("Add", &["x", ""], &["y"], vec![]), 17, "input 1 is empty, but Add requires it"),
            (node("Cast", &["x"], &["y"], vec![]), 17, "attribute 'to' is required"),
            (node("Scatter", &["x", "i", "u"], &["y"], vec![]), 11, "Scatter is deprecated from opset 11"),
            (
                node("Gelu", &["x"], &["y"], vec![]),
                17,
                "Gelu does not exist at opset 17 (ONNX defines it from opset 20)",
            ),
        ];
        for (n, opset, want) in cases {
            let e = check(&n, opset).unwrap_err();
            assert!(e.contains(want), "{:?}: '{e}' does not say '{want}'", n.op_type);
        }
        let refers = AttributeProto { ref_attr_name: Some("a".into()), ..int("axis", 1) };
        assert!(check(&softmax(refers), 17).unwrap_err().contains("refers to a function's attribute"));
        // An optional input may be left empty; an op ONNX does not define is the converter lookup's to refuse.
        assert_eq!(check(&node("Clip", &["x", "", "hi"], &["y"], vec![]), 17), Ok(()));
        assert_eq!(check(&node("NoSuchOp", &["x"], &["y"], vec![]), 17), Ok(()));
    }
}
