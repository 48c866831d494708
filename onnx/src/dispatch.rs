//! The converter of each ONNX op type at each opset: the tables of the ops modules
//! (`CONVERTERS` in each) merged into one map, which the model walk asks for every node.
//! An op is claimed by one converter per opset (tested), and docs/onnx.md lists exactly the
//! ops of the tables (tested).

use std::collections::HashMap;
use std::sync::LazyLock;

use super::ops::{Convert, Converter, CURRENT, R};
use super::{
    control, nn, ops, ops_attention, ops_legacy, ops_math, ops_more, ops_quant, ops_rnn, ops_sample, ops_scatter,
    ops_signal, ops_trig, validate,
};

/// Every module's table.
const TABLES: [&[Converter]; 12] = [
    ops::CONVERTERS,
    ops_math::CONVERTERS,
    ops_trig::CONVERTERS,
    ops_more::CONVERTERS,
    ops_scatter::CONVERTERS,
    ops_sample::CONVERTERS,
    ops_signal::CONVERTERS,
    ops_attention::CONVERTERS,
    ops_legacy::CONVERTERS,
    nn::CONVERTERS,
    ops_rnn::CONVERTERS,
    ops_quant::CONVERTERS,
];

/// The converters of each op type, by op type. A converter written for opset 13 on serves
/// the older opsets at which the same version of its op is already in effect (ConvTranspose
/// came in at 11 and changed next at 22, so opsets 11 and 12 mean what 13 means): a model
/// of opset 12 is refused only for the ops whose version there differs.
static CONVERTERS: LazyLock<HashMap<&'static str, Vec<Converter>>> = LazyLock::new(|| {
    let mut map: HashMap<&str, Vec<Converter>> = HashMap::new();
    for c in TABLES.iter().flat_map(|t| t.iter()) {
        let first = match c.first {
            CURRENT => validate::since(c.op, CURRENT).unwrap_or(CURRENT),
            first => first,
        };
        map.entry(c.op).or_default().push(Converter { first, ..*c });
    }
    map
});

/// The converter of `op_type` at `opset`, or why there is none: an op meshc does not map, or
/// an opset older than the oldest whose version of the op meshc implements.
pub fn converter(op_type: &str, opset: i64) -> R<Convert> {
    let Some(all) = CONVERTERS.get(op_type) else {
        return Err(format!("op '{op_type}' is not supported (docs/onnx.md lists the supported ops)"));
    };
    if let Some(c) = all.iter().find(|c| (c.first..=c.last).contains(&opset)) {
        return Ok(c.convert);
    }
    let last = all.iter().map(|c| c.last).max().unwrap_or(i64::MAX);
    if opset > last {
        return Err(format!("{op_type} at opset {opset} is not supported (meshc reads it up to opset {last})"));
    }
    let first = all.iter().map(|c| c.first).min().unwrap_or(CURRENT);
    Err(format!(
        "{op_type} at opset {opset} is not supported: meshc implements its meaning from opset {first} (the model \
         converted to opset {first} or later, e.g. by onnx.version_converter, imports)"
    ))
}

/// The ONNX op types meshc imports (at some opset), sorted: the converters' and the control
/// flow the model walk imports itself.
pub fn supported() -> Vec<&'static str> {
    let mut ops: Vec<&str> = CONVERTERS.keys().copied().chain(control::OPS).collect();
    ops.sort_unstable();
    ops
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeSet;

    use meshc_ir::Tensor;

    use super::*;
    use crate::builder::{Builder, Value};
    use crate::ops::Ctx;
    use crate::proto::{AttributeProto, NodeProto};

    pub(crate) fn attr_i(name: &str, v: i64) -> AttributeProto {
        AttributeProto { name: Some(name.into()), i: Some(v), ..Default::default() }
    }

    pub(crate) fn attr_f(name: &str, v: f32) -> AttributeProto {
        AttributeProto { name: Some(name.into()), f: Some(v), ..Default::default() }
    }

    pub(crate) fn attr_str(name: &str, v: &str) -> AttributeProto {
        AttributeProto { name: Some(name.into()), s: Some(v.as_bytes().to_vec()), ..Default::default() }
    }

    pub(crate) fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto { name: Some(name.into()), ints: v.to_vec(), ..Default::default() }
    }

    /// `op_type` at `opset` on constant inputs, as the importer dispatches it: every node
    /// folds, so the result is the reference interpreter's.
    pub(crate) fn eval(op_type: &str, opset: i64, inputs: Vec<Tensor>, attribute: Vec<AttributeProto>) -> R<Tensor> {
        eval_outputs(op_type, opset, inputs, attribute, 1).map(|mut v| v.remove(0))
    }

    /// `eval` of a node with `outputs` outputs, all of them.
    pub(crate) fn eval_outputs(
        op_type: &str,
        opset: i64,
        inputs: Vec<Tensor>,
        attribute: Vec<AttributeProto>,
        outputs: usize,
    ) -> R<Vec<Tensor>> {
        let convert = converter(op_type, opset)?;
        let output = (0..outputs).map(|k| format!("y{k}")).collect();
        let node = NodeProto { op_type: Some(op_type.into()), output, attribute, ..Default::default() };
        let ctx = Ctx {
            node: &node,
            args: inputs.into_iter().map(|t| Some(Value::computed(t))).collect(),
            opset,
            out: "y".into(),
        };
        let v = convert(&mut Builder::default(), &ctx)?;
        Ok(v.iter().take(outputs).map(|v| v.as_const().expect("constant inputs fold").clone()).collect())
    }

    pub(crate) fn f32s(t: &Tensor) -> Vec<f32> {
        t.data.iter_f64().map(|v| v as f32).collect()
    }

    #[test]
    fn no_op_is_claimed_twice_at_one_opset() {
        for (op, all) in CONVERTERS.iter() {
            for (i, a) in all.iter().enumerate() {
                assert!(a.first <= a.last, "{op}: opsets {} to {}", a.first, a.last);
                for b in &all[i + 1..] {
                    let at = a.first.max(b.first);
                    assert!(a.last < b.first || b.last < a.first, "{op} is claimed twice at opset {at}");
                }
            }
        }
        assert!(CONVERTERS["Softmax"].len() == 2, "Softmax has an old and a new converter");
    }

    /// The ops of docs/onnx.md's "Supported ops" table: the first column of each row, whose
    /// words outside parentheses (separated by spaces or commas) are ONNX op types.
    fn documented() -> BTreeSet<String> {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/onnx.md")).unwrap();
        let section = doc.split("\n## Supported ops\n").nth(1).expect("docs/onnx.md has a Supported ops section");
        let section = section.split("\n## ").next().unwrap();
        let mut ops = BTreeSet::new();
        for row in section.lines().filter(|l| l.starts_with('|')).skip(2) {
            let first = row.split('|').nth(1).unwrap();
            let mut depth = 0;
            let bare: String = first
                .chars()
                .filter(|&ch| {
                    depth += (ch == '(') as i32;
                    let keep = depth == 0;
                    depth -= (ch == ')') as i32;
                    keep
                })
                .collect();
            for word in bare.split([' ', ',']).filter(|w| !w.is_empty()) {
                let op = word.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                    && word.chars().all(|c| c.is_ascii_alphanumeric());
                assert!(op, "docs/onnx.md: '{word}' in '{first}' is not an op type (notes go in parentheses)");
                ops.insert(word.to_string());
            }
        }
        ops
    }

    #[test]
    fn the_documented_ops_are_the_tables_ops() {
        let doc = documented();
        let table: BTreeSet<String> = supported().into_iter().map(str::to_string).collect();
        let undocumented: Vec<&String> = table.difference(&doc).collect();
        let unmapped: Vec<&String> = doc.difference(&table).collect();
        assert!(undocumented.is_empty(), "mapped but not in docs/onnx.md's Supported ops: {undocumented:?}");
        assert!(unmapped.is_empty(), "in docs/onnx.md's Supported ops but mapped by no converter: {unmapped:?}");
    }

    /// Sin and Cos from opset 7, their first, on angles as Llama's rotary embeddings make
    /// them (position × inverse frequency, thousands of radians).
    #[test]
    fn sin_and_cos_import_from_opset_7() {
        let x = Tensor::f32(vec![4], vec![0.0, -1.5, 4095.0, 8191.0 * 0.75]);
        for (op, f) in [("Sin", f64::sin as fn(f64) -> f64), ("Cos", f64::cos)] {
            let want: Vec<f32> = f32s(&x).iter().map(|&v| f(v as f64) as f32).collect();
            assert_eq!(f32s(&eval(op, 7, vec![x.clone()], vec![]).unwrap()), want, "{op}");
            assert!(converter(op, 6).is_err(), "{op} at opset 6");
        }
    }
}
