//! Models of opsets 1 to 12 of the default domain: the older semantics of the ops that
//! changed at 13 or before. Every converter names the oldest opset whose version means what
//! it implements (`Converter::since`, from ONNX's Changelog), so an op of an old model is
//! imported only when the version in effect at the model's opset is one meshc implements,
//! and refused with one line naming op, node and opset otherwise, never imported with a
//! newer version's meaning. The converters of `ops`, `ops_math` and `nn` read attributes
//! where older versions had them (reduction and Squeeze/Unsqueeze axes, Split's sizes,
//! Pad's pads); this module's rewrite the rest into the opset-13 form: Softmax, LogSoftmax
//! and Hardmax on the input coerced to 2-D, Clip's `min`/`max` attributes (before 11) and
//! Slice's `starts`/`ends`/`axes` attributes (before 10).

use meshc_ir::{Data, Tensor};

use super::builder::{Builder, Value};
use super::ops::{self, reshape, scalar, Convert, Converter, Ctx, CURRENT, R};
use super::ops_math;
use super::proto::AttributeProto;

/// The oldest opset of the default domain meshc reads.
pub const OLDEST: i64 = 1;

/// This module's converters: the versions before 13 (or 11, 10) of ops whose meaning changed.
pub const CONVERTERS: &[Converter] = &[
    Converter::between(1, 12, "Softmax", |b, c| coerced_2d(b, c, ops::softmax)),
    Converter::between(1, 12, "LogSoftmax", |b, c| coerced_2d(b, c, ops::log_softmax)),
    Converter::between(1, 12, "Hardmax", |b, c| coerced_2d(b, c, ops_math::hardmax)),
    Converter::between(6, 10, "Clip", |b, c| {
        let bound = |name: &str| c.attr(name).and_then(|a| a.f).map(|v| scalar(meshc_ir::DType::F32, v.into()));
        let args = vec![c.opt(0).cloned(), bound("min"), bound("max")];
        current(b, c, args, ops::clip)
    }),
    Converter::between(1, 9, "Slice", |b, c| {
        let ints = |name: &str| c.ints(name).map(|v| Value::computed(Tensor::new(vec![v.len()], Data::I64(v))));
        let (Some(starts), Some(ends)) = (ints("starts"), ints("ends")) else {
            return Err("it needs starts and ends".into());
        };
        let args = vec![c.opt(0).cloned(), Some(starts), Some(ends), ints("axes")];
        current(b, c, args, ops::slice)
    }),
];

/// The node converted by its opset-13 converter `convert`, with inputs `args`.
fn current(b: &mut Builder, c: &Ctx, args: Vec<Option<Value>>, convert: Convert) -> R<Vec<Value>> {
    convert(b, &Ctx { node: c.node, args, opset: CURRENT, out: c.out.clone() })
}

/// Before opset 13, Softmax, LogSoftmax and Hardmax see their input as the 2-D matrix
/// `[d0·…·d(axis−1), d(axis)·…]` (axis defaults to 1) and work along its rows, as
/// `convert`, their opset-13 converter, does on that matrix with axis 1.
fn coerced_2d(b: &mut Builder, c: &Ctx, convert: Convert) -> R<Vec<Value>> {
    let x = c.arg(0)?;
    let shape = b.ty(x).shape;
    let axis = meshc_ir::infer::norm_axis(c.int("axis", 1), shape.len().max(1))?;
    let rows: usize = shape[..axis.min(shape.len())].iter().product();
    let flat = reshape(b, x, &[rows as i64, (b.ty(x).numel() / rows.max(1)) as i64], &c.part("2d"))?;
    let mut node = c.node.clone();
    node.attribute.retain(|a| a.name.as_deref() != Some("axis"));
    node.attribute.push(AttributeProto { name: Some("axis".into()), i: Some(1), ..Default::default() });
    let ctx = Ctx { node: &node, args: vec![Some(flat)], opset: CURRENT, out: c.part("rows") };
    let y = convert(b, &ctx)?.remove(0);
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    Ok(vec![reshape(b, &y, &dims, &c.out)?])
}

#[cfg(test)]
mod tests {
    use crate::dispatch::converter;
    use crate::dispatch::tests::{attr_f, attr_i, attr_ints, eval, f32s};
    use meshc_ir::Tensor;

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
        assert!(converter("And", 7).is_ok() && converter("Not", 1).is_ok());
        let e = converter("Add", 6).unwrap_err();
        assert!(e.contains("Add at opset 6") && e.contains("from opset 7"), "{e}");
        let e = converter("BatchNormalization", 7).unwrap_err();
        assert!(e.contains("BatchNormalization at opset 7") && e.contains("from opset 9"), "{e}");
        // An op meshc does not read at any opset says so, not that an older opset is the cause.
        let e = converter("Upsample", 9).unwrap_err();
        assert_eq!(e, "op 'Upsample' is not supported (docs/onnx.md lists the supported ops)");
        let e = converter("Gelu", 12).unwrap_err();
        assert!(
            e.contains("Gelu at opset 12") && e.contains("from opset 20") && e.contains("converted to opset 20"),
            "{e}"
        );
        // A converter written for opset 13 reads the older opsets whose version is the same:
        // ConvTranspose-11 is in effect from 11 to 21, ConvTranspose-1 before.
        assert!(converter("ConvTranspose", 11).is_ok() && converter("ConvTranspose", 12).is_ok());
        let e = converter("ConvTranspose", 10).unwrap_err();
        assert!(e.contains("ConvTranspose at opset 10") && e.contains("from opset 11"), "{e}");
        assert!(converter("GatherND", 11).is_ok() && converter("LpPool", 11).is_ok());
        // Softmax-13 changed the meaning: opset 12 keeps its own converter.
        assert!(converter("Softmax", 12).is_ok() && converter("Softmax", 13).is_ok());
        let e = converter("Scatter", 11).unwrap_err();
        assert!(e.contains("Scatter at opset 11") && e.contains("up to opset 10"), "{e}");
        let e = converter("Upsample", 13).unwrap_err();
        assert!(e.contains("op 'Upsample' is not supported"), "{e}");
    }
}
