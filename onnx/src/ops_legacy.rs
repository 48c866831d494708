//! Models of opsets 1 to 12 of the default domain: which ops meshc imports at those opsets,
//! and the older semantics of the ones that changed at 13 or before. An op of an old model
//! is imported only when the version in effect at the model's opset is one whose meaning
//! meshc implements (`SINCE` lists, per op, the oldest opset for which that holds); every
//! other op of an old model is refused with one line naming op, node and opset, never
//! imported with a newer version's meaning. The mappings of `ops`, `ops_math` and `nn` read
//! attributes where older versions had them (reduction and Squeeze/Unsqueeze axes, Split's
//! sizes, Pad's pads); this module rewrites the rest into the opset-13 form: Softmax,
//! LogSoftmax and Hardmax on the input coerced to 2-D, Clip's `min`/`max` attributes
//! (before 11) and Slice's `starts`/`ends`/`axes` attributes (before 10).

use meshc_ir::{Data, Tensor};

use super::builder::{Builder, Value};
use super::ops::{self, reshape, scalar, Ctx, R};
use super::proto::{AttributeProto, NodeProto};

/// The oldest opset of the default domain meshc reads.
pub const OLDEST: i64 = 1;

/// The first opset whose semantics every mapping implements for every op.
const CURRENT: i64 = 13;

/// Per op, the oldest opset from which meshc's mapping (with this module's rewrites) is
/// right, from ONNX's Changelog. Versions between it and 13 differ only in the element
/// types they allow, or in attributes the mappings read (`Ctx::ints_input_or_attr`).
const SINCE: &[(&str, i64)] = &[
    ("Abs", 6),
    ("Add", 7),
    ("And", 7),
    ("ArgMax", 1),
    ("ArgMin", 1),
    ("AveragePool", 7),
    ("BatchNormalization", 9),
    ("Cast", 6),
    ("Ceil", 6),
    ("Celu", 12),
    ("Clip", 6),
    ("Concat", 4),
    ("Constant", 9),
    ("ConstantOfShape", 9),
    ("Conv", 1),
    ("CumSum", 11),
    ("DepthToSpace", 1),
    ("Div", 7),
    ("Dropout", 7),
    ("Einsum", 12),
    ("Elu", 6),
    ("Equal", 7),
    ("Erf", 9),
    ("Exp", 6),
    ("Expand", 8),
    ("EyeLike", 9),
    ("Flatten", 1),
    ("Floor", 6),
    ("Gather", 1),
    ("GatherElements", 11),
    ("Gemm", 7),
    ("GlobalAveragePool", 1),
    ("GlobalMaxPool", 1),
    ("Greater", 7),
    ("GreaterOrEqual", 12),
    ("HardSigmoid", 6),
    ("Hardmax", 1),
    ("Identity", 1),
    ("InstanceNormalization", 6),
    ("IsInf", 10),
    ("IsNaN", 9),
    ("LeakyRelu", 6),
    ("Less", 7),
    ("LessOrEqual", 12),
    ("Log", 6),
    ("LogSoftmax", 1),
    ("LpNormalization", 1),
    ("MatMul", 9),
    ("Max", 8),
    ("MaxPool", 8),
    ("Mean", 8),
    ("MeanVarianceNormalization", 9),
    ("Min", 8),
    ("Mod", 10),
    ("Mul", 7),
    ("Neg", 6),
    ("NegativeLogLikelihoodLoss", 12),
    ("Not", 1),
    ("OneHot", 9),
    ("Or", 7),
    ("PRelu", 7),
    ("Pad", 2),
    ("Pow", 7),
    ("Range", 11),
    ("Reciprocal", 6),
    ("ReduceL1", 1),
    ("ReduceL2", 1),
    ("ReduceLogSum", 1),
    ("ReduceLogSumExp", 1),
    ("ReduceMax", 1),
    ("ReduceMean", 1),
    ("ReduceMin", 1),
    ("ReduceProd", 1),
    ("ReduceSum", 1),
    ("ReduceSumSquare", 1),
    ("Relu", 6),
    ("Reshape", 5),
    ("Resize", 11),
    ("Round", 11),
    ("Scatter", 9),
    ("ScatterElements", 11),
    ("ScatterND", 11),
    ("Selu", 6),
    ("Shape", 1),
    ("Shrink", 9),
    ("Sigmoid", 6),
    ("Sign", 9),
    ("Size", 1),
    ("Slice", 1),
    ("Softmax", 1),
    ("SoftmaxCrossEntropyLoss", 12),
    ("Softplus", 1),
    ("Softsign", 1),
    ("SpaceToDepth", 1),
    ("Split", 2),
    ("Sqrt", 6),
    ("Squeeze", 1),
    ("Sub", 7),
    ("Sum", 8),
    ("Tanh", 6),
    ("ThresholdedRelu", 10),
    ("Tile", 6),
    ("Transpose", 1),
    ("Unsqueeze", 1),
    ("Where", 9),
    ("Xor", 7),
];

/// Whether `op_type` may be imported at `opset`: always from 13 on (the mappings follow
/// the newest versions), before that only as `SINCE` says.
pub fn check(op_type: &str, opset: i64) -> R<()> {
    if opset >= CURRENT {
        return Ok(());
    }
    match SINCE.iter().find(|(op, _)| *op == op_type) {
        Some(&(_, since)) if opset >= since => Ok(()),
        Some(&(_, since)) => Err(format!(
            "{op_type} at opset {opset} is not supported (meshc implements its semantics from opset {since})"
        )),
        None => Err(format!(
            "{op_type} at opset {opset} is not supported (before opset {CURRENT}, meshc reads only the ops whose older versions it implements)"
        )),
    }
}

/// The outputs of an op whose pre-13 form this module rewrites, else `None`.
pub fn lower(b: &mut Builder, c: &Ctx) -> Option<R<Vec<Value>>> {
    if c.opset >= CURRENT {
        return None;
    }
    Some(match c.node.op_type.as_deref().unwrap_or("") {
        "Softmax" | "LogSoftmax" | "Hardmax" => coerced_2d(b, c),
        "Clip" if c.opset < 11 => {
            let bound = |name: &str| c.attr(name).and_then(|a| a.f).map(|v| scalar(meshc_ir::DType::F32, v.into()));
            let args = vec![c.opt(0).cloned(), bound("min"), bound("max")];
            current(b, c, c.node.clone(), args)
        }
        "Slice" if c.opset < 10 => {
            let ints = |name: &str| c.ints(name).map(|v| Value::computed(Tensor::new(vec![v.len()], Data::I64(v))));
            let (Some(starts), Some(ends)) = (ints("starts"), ints("ends")) else {
                return Some(Err("it needs starts and ends".into()));
            };
            let args = vec![c.opt(0).cloned(), Some(starts), Some(ends), ints("axes")];
            current(b, c, c.node.clone(), args)
        }
        _ => return None,
    })
}

/// The node lowered as its opset-13 version with inputs `args`.
fn current(b: &mut Builder, c: &Ctx, node: NodeProto, args: Vec<Option<Value>>) -> R<Vec<Value>> {
    let ctx = Ctx { node: &node, args, opset: CURRENT, out: c.out.clone() };
    super::ops_math::lower(b, &ctx).unwrap_or_else(|| ops::lower(b, &ctx))
}

/// Before opset 13, Softmax, LogSoftmax and Hardmax see their input as the 2-D matrix
/// `[d0·…·d(axis−1), d(axis)·…]` (axis defaults to 1) and work along its rows.
fn coerced_2d(b: &mut Builder, c: &Ctx) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axis = meshc_ir::infer::norm_axis(c.int("axis", 1), shape.len().max(1))?;
    let rows: usize = shape[..axis.min(shape.len())].iter().product();
    let flat = reshape(b, x, &[rows as i64, (b.ty(x).numel() / rows.max(1)) as i64], &c.part("2d"))?;
    let mut node = c.node.clone();
    node.attribute.retain(|a| a.name.as_deref() != Some("axis"));
    node.attribute.push(AttributeProto { name: Some("axis".into()), i: Some(1), ..Default::default() });
    let ctx = Ctx { node: &node, args: vec![Some(flat)], opset: CURRENT, out: c.part("rows") };
    let y = super::ops_math::lower(b, &ctx).unwrap_or_else(|| ops::lower(b, &ctx))?.remove(0);
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(vec![reshape(b, &y, &dims, &c.out)?])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn attr_i(name: &str, v: i64) -> AttributeProto {
        AttributeProto { name: Some(name.into()), i: Some(v), ..Default::default() }
    }

    pub(crate) fn attr_f(name: &str, v: f32) -> AttributeProto {
        AttributeProto { name: Some(name.into()), f: Some(v), ..Default::default() }
    }

    pub(crate) fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto { name: Some(name.into()), ints: v.to_vec(), ..Default::default() }
    }

    /// `op_type` at `opset` on constant inputs, as the importer dispatches it: every node
    /// folds, so the result is the reference interpreter's.
    pub(crate) fn eval(op_type: &str, opset: i64, inputs: Vec<Tensor>, attribute: Vec<AttributeProto>) -> R<Tensor> {
        check(op_type, opset)?;
        let node =
            NodeProto { op_type: Some(op_type.into()), output: vec!["y".into()], attribute, ..Default::default() };
        let ctx = Ctx {
            node: &node,
            args: inputs.into_iter().map(|t| Some(Value::computed(t))).collect(),
            opset,
            out: "y".into(),
        };
        let mut b = Builder::default();
        let v = lower(&mut b, &ctx)
            .or_else(|| super::super::ops_more::lower(&mut b, &ctx))
            .or_else(|| super::super::ops_scatter::lower(&mut b, &ctx))
            .or_else(|| super::super::ops_math::lower(&mut b, &ctx))
            .unwrap_or_else(|| ops::lower(&mut b, &ctx))?;
        Ok(v[0].as_const().expect("constant inputs fold").clone())
    }

    pub(crate) fn f32s(t: &Tensor) -> Vec<f32> {
        t.data.iter_f64().map(|v| v as f32).collect()
    }

    #[test]
    fn softmax_before_13_normalises_over_the_flattened_trailing_dims() {
        let x = Tensor::f32(vec![2, 2, 2], vec![0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0]);
        let old = eval("Softmax", 11, vec![x.clone()], vec![]).unwrap();
        let e: Vec<f32> = [0.0f32, 1.0, 2.0, 3.0].iter().map(|v| v.exp()).collect();
        let s: f32 = e.iter().sum();
        let want: Vec<f32> = e.iter().map(|v| v / s).chain([0.25; 4]).collect();
        assert_eq!(old.shape, vec![2, 2, 2]);
        assert!(f32s(&old).iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6), "{old:?}");
        // From 13 on the default axis is the last one: pairs are normalised.
        let new = eval("Softmax", 13, vec![x], vec![]).unwrap();
        assert!((f32s(&new)[0] - 1.0 / (1.0 + 1f32.exp())).abs() < 1e-6);
        let h = eval("Hardmax", 12, vec![Tensor::f32(vec![2, 2], vec![1.0, 3.0, 2.0, 0.0])], vec![attr_i("axis", 0)])
            .unwrap();
        assert_eq!(f32s(&h), vec![0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn clip_before_11_and_slice_before_10_take_attributes() {
        let x = Tensor::f32(vec![4], vec![-2.0, 0.5, 3.0, 9.0]);
        let y = eval("Clip", 6, vec![x.clone()], vec![attr_f("min", -1.0), attr_f("max", 2.0)]).unwrap();
        assert_eq!(f32s(&y), vec![-1.0, 0.5, 2.0, 2.0]);
        let y = eval("Clip", 6, vec![x.clone()], vec![attr_f("max", 0.0)]).unwrap();
        assert_eq!(f32s(&y), vec![-2.0, 0.0, 0.0, 0.0]);
        let s = eval("Slice", 9, vec![x.clone()], vec![attr_ints("starts", &[1]), attr_ints("ends", &[3])]).unwrap();
        assert_eq!(f32s(&s), vec![0.5, 3.0]);
        assert!(eval("Slice", 9, vec![x], vec![attr_ints("starts", &[1])]).unwrap_err().contains("starts and ends"));
    }

    #[test]
    fn reductions_and_squeeze_before_13_read_their_axes_attribute() {
        let x = Tensor::f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let y = eval("ReduceSum", 12, vec![x.clone()], vec![attr_ints("axes", &[1]), attr_i("keepdims", 0)]).unwrap();
        assert_eq!(f32s(&y), vec![3.0, 7.0]);
        let y = eval("Unsqueeze", 11, vec![x], vec![attr_ints("axes", &[0])]).unwrap();
        assert_eq!(y.shape, vec![1, 2, 2]);
    }

    #[test]
    fn ops_whose_old_versions_meshc_does_not_implement_are_refused_naming_the_opset() {
        assert!(check("And", 7).is_ok() && check("Not", 1).is_ok());
        let e = check("Add", 6).unwrap_err();
        assert!(e.contains("Add at opset 6") && e.contains("from opset 7"), "{e}");
        let e = check("BatchNormalization", 7).unwrap_err();
        assert!(e.contains("BatchNormalization at opset 7") && e.contains("from opset 9"), "{e}");
        let e = check("Upsample", 9).unwrap_err();
        assert!(e.contains("Upsample at opset 9"), "{e}");
        assert!(check("Upsample", 13).is_ok(), "from 13 on, the mappings decide");
    }
}
