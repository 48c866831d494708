//! The op table is the one place an op is declared: every op it lists must parse and print
//! in both graph formats under its name, and be documented in docs/ops.md with each of its
//! attributes and their defaults. (Layout, lowering, cost, gradients and code generation
//! match on ops without a catch-all, so an op without a rule there does not compile; the
//! ONNX column — the ONNX ops that produce each IR op, or an explicit none — is the same
//! kind of match in meshc-onnx, onnx/src/sources.rs, whose test holds it to the converters:
//! this crate cannot see them.)

use meshc_ir::attrs::AttrKind;
use meshc_ir::{json, text, Attr, DType, Graph, Input, Node, Op, Output, TensorType};

/// A value of each kind, for a node that must carry its required attributes.
fn sample(kind: AttrKind) -> Attr {
    match kind {
        AttrKind::Int => Attr::Int(1),
        AttrKind::Float => Attr::Float(0.5),
        AttrKind::Bool => Attr::Bool(true),
        AttrKind::Str => Attr::Str("k".into()),
        AttrKind::DType => Attr::Str("f32".into()),
        AttrKind::Enum(names) => Attr::Str(names[names.len() - 1].into()),
        AttrKind::Ints => Attr::ints(&[1, 2]),
        AttrKind::Groups => Attr::List(vec![Attr::ints(&[0, 1])]),
    }
}

#[test]
fn every_op_round_trips_through_both_formats() {
    for &op in Op::ALL {
        assert_eq!(Op::from_name(op.name()), Some(op));
        let mut node = Node::new("y", op, &["x"]);
        for spec in op.attrs() {
            node.attrs.insert(spec.name.to_string(), sample(spec.kind));
        }
        let g = Graph {
            name: "g".into(),
            inputs: vec![Input { name: "x".into(), ty: TensorType::new(DType::F32, vec![2]), dims: None, loc: None }],
            params: vec![],
            nodes: vec![node],
            outputs: vec![Output::new("y")],
            ..Graph::default()
        };
        assert_eq!(text::parse(&text::print(&g)).unwrap_or_else(|e| panic!("{op}: {e}")), g, "{op} in text");
        assert_eq!(json::parse(&json::print(&g)).unwrap_or_else(|e| panic!("{op}: {e}")), g, "{op} in JSON");
    }
}

#[test]
fn every_op_and_attribute_is_documented_with_its_default() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/ops.md")).unwrap();
    // An op is documented by a row of a table whose first cell names it (`| neg abs relu |`)
    // or by a code span that starts with its name (`layer_norm(x, gamma, beta)`).
    let mut documented = std::collections::HashSet::new();
    for line in doc.lines() {
        if let Some(cell) = line.strip_prefix('|').and_then(|l| l.split('|').next()) {
            documented.extend(cell.split_whitespace().map(|w| w.trim_matches('`')));
        }
    }
    for span in doc.split('`').skip(1).step_by(2) {
        documented.insert(span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or(""));
    }
    let flat = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    for &op in Op::ALL {
        let name = op.name();
        assert!(documented.contains(name), "docs/ops.md does not document {name}");
        for spec in op.attrs() {
            assert!(doc.contains(spec.name), "docs/ops.md does not name {name}'s attribute {}", spec.name);
            if let Some(default) = spec.default {
                // Written as in the text format; a float default of a whole number may be
                // written as an integer.
                let shown = match default() {
                    Attr::Float(x) if x.fract() == 0.0 => vec![format!("{x:?}"), format!("{}", x as i64)],
                    v => vec![v.to_string()],
                };
                assert!(
                    shown.iter().any(|v| flat.contains(&format!("{} = {v}", spec.name))),
                    "docs/ops.md does not give {name}'s {} its default {}",
                    spec.name,
                    shown[0]
                );
            }
        }
    }
}
