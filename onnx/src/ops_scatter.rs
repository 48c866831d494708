//! ONNX's scatters onto meshc's `scatter_elements`: ScatterElements (and Scatter, its name
//! before opset 11) maps one to one (axis, reduction); ScatterND scatters along axis 0 of the data seen as `[n_0·…·n_(k−1), rest…]`,
//! at each index tuple's row-major offset over the first k dims (`ops_more::flat_offsets`,
//! which also range-checks each component), broadcast over the rest, and is viewed back.
//! Updates land in row-major order of the indices, so with no reduction a later duplicate
//! wins (ONNX leaves that order undefined for ScatterND; its reference does the same).

use meshc_ir::attrs::ScatterReduction;
use meshc_ir::infer::norm_axis;
use meshc_ir::{Attr, DType, Op};

use super::builder::Value;
use super::ops::{cast, i64_table, one, reshape, scalar, Converter, Ctx, R};
use super::ops_math::Steps;
use super::ops_more::{dims, flat_offsets};

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] = &[
    Converter::since(11, "ScatterElements", |b, c| one(scatter_elements(&mut Steps { b, c }))),
    // ScatterElements under its older name (deprecated from 11).
    Converter::between(9, 10, "Scatter", |b, c| one(scatter_elements(&mut Steps { b, c }))),
    Converter::since(11, "ScatterND", |b, c| one(scatter_nd(&mut Steps { b, c }))),
    Converter::new("TensorScatter", |b, c| one(tensor_scatter(&mut Steps { b, c }))),
];

/// The `reduction` attribute (none before opset 16; max and min from 18).
fn reduction(c: &Ctx) -> R<Attr> {
    let r = c.string("reduction", "none");
    match ScatterReduction::parse(&r) {
        Some(_) => Ok(Attr::Str(r)),
        None => Err(format!("reduction '{r}' is not one of {}", ScatterReduction::NAMES.join(", "))),
    }
}

fn scatter_elements(s: &mut Steps) -> R<Value> {
    let args = [s.c.arg(0)?, s.c.arg(1)?, s.c.arg(2)?];
    let attrs = [("axis", Attr::Int(s.c.int("axis", 0))), ("reduction", reduction(s.c)?)];
    s.op("", Op::ScatterElements, &args, &attrs)
}

fn scatter_nd(s: &mut Steps) -> R<Value> {
    let (data, indices, updates) = (s.c.arg(0)?, s.c.arg(1)?, s.c.arg(2)?);
    let (ds, is, us) = (s.b.ty(data).shape, s.b.ty(indices).shape, s.b.ty(updates).shape);
    if !s.b.ty(indices).dtype.is_int() {
        return Err(format!("indices are {}, not integers", s.b.ty(indices).dtype));
    }
    let k = *is.last().ok_or("indices is a scalar: ScatterND needs rank 1 or more")?;
    let lead = &is[..is.len() - 1];
    if k == 0 || k > ds.len() || us != [lead, &ds[k..]].concat() {
        return Err(format!("indices {is:?} and updates {us:?} do not fit data {ds:?}"));
    }
    let flat = flat_offsets(s, indices, &ds[..k])?;
    let rest = dims(&ds[k..]);
    let rows = lead.iter().product::<usize>() as i64;
    let view = |first: usize| [vec![first as i64], rest.clone()].concat();
    let blocks = reshape(s.b, data, &view(ds[..k].iter().product()), &s.c.part("blocks"))?;
    let rows_of_updates = reshape(s.b, updates, &view(rows as usize), &s.c.part("update_rows"))?;
    let column = [vec![rows], vec![1; rest.len()]].concat();
    let flat = reshape(s.b, &flat, &column, &s.c.part("row_index"))?;
    let spread = [("shape", Attr::ints(&view(rows as usize)))];
    let index = s.op("row_indices", Op::BroadcastTo, &[&flat], &spread)?;
    let attrs = [("axis", Attr::Int(0)), ("reduction", reduction(s.c)?)];
    let out = s.op("scattered", Op::ScatterElements, &[&blocks, &index, &rows_of_updates], &attrs)?;
    reshape(s.b, &out, &dims(&ds), &s.c.out)
}

/// TensorScatter (a KV cache's write): the update's step s of batch b lands at
/// `write_indices[b] + s` along the axis (modulo the axis's length for `circular`), as a
/// `scatter_elements` whose indices are those positions broadcast over the update; a
/// linear write past the end is a run-time error naming the node. Missing write indices
/// are zeros.
fn tensor_scatter(s: &mut Steps) -> R<Value> {
    let (cache, update) = (s.c.arg(0)?, s.c.arg(1)?);
    let (cs, us) = (s.b.ty(cache).shape, s.b.ty(update).shape);
    let rank = cs.len();
    let axis = norm_axis(s.c.int("axis", -2), rank)?;
    let circular = match s.c.string("mode", "linear").as_str() {
        "linear" => false,
        "circular" => true,
        other => return Err(format!("mode '{other}' is not linear or circular")),
    };
    let fits = us.len() == rank && (0..rank).all(|d| if d == axis { us[d] <= cs[d] } else { us[d] == cs[d] });
    if axis == 0 || !fits {
        return Err(format!(
            "update of shape {us:?} does not fit cache of shape {cs:?} along axis {axis} (not the batch)"
        ));
    }
    let mut column = vec![1i64; rank];
    column[0] = cs[0] as i64;
    let starts = match s.c.opt(2) {
        Some(w) => {
            let w = cast(s.b, w, DType::I64, &s.c.part("write_indices"))?;
            reshape(s.b, &w, &column, &s.c.part("starts"))?
        }
        None => i64_table("the write indices", vec![1; rank], |_| 0)?,
    };
    let mut steps_shape = vec![1usize; rank];
    steps_shape[axis] = us[axis];
    let steps = i64_table("the update steps", steps_shape, |i| i as i64)?;
    let at = s.op0("positions", Op::Add, &[&starts, &steps])?;
    let at = match circular {
        true => s.op("wrapped", Op::Mod, &[&at, &scalar(DType::I64, cs[axis] as f64)], &[])?,
        false => at,
    };
    let index = s.op("indices", Op::BroadcastTo, &[&at], &[("shape", Attr::ints(&dims(&us)))])?;
    let attrs = [("axis", Attr::Int(axis as i64)), ("reduction", Attr::Str("none".into()))];
    s.op("", Op::ScatterElements, &[cache, &index, update], &attrs)
}

#[cfg(test)]
mod tests {
    use meshc_ir::{Data, Tensor};

    use super::super::proto::AttributeProto;
    use crate::dispatch::tests::{attr_i, eval, f32s};

    fn attr_s(name: &str, v: &str) -> AttributeProto {
        AttributeProto { name: Some(name.into()), s: Some(v.as_bytes().to_vec()), ..Default::default() }
    }

    fn idx(v: Vec<i64>, shape: Vec<usize>) -> Tensor {
        Tensor::new(shape, Data::I64(v))
    }

    #[test]
    fn scatter_nd_adds_rows_at_index_tuples_and_refuses_an_index_out_of_range() {
        let data = Tensor::f32(vec![2, 2, 2], vec![0.0; 8]);
        // Tuples (1, 0), (-2, 1) and (1, 0) again: rows of 2, added in order or the last kept.
        let upd = Tensor::f32(vec![3, 2], vec![1.0, 2.0, 10.0, 20.0, 5.0, 6.0]);
        let args = vec![data.clone(), idx(vec![1, 0, -2, 1, 1, 0], vec![3, 2]), upd.clone()];
        let y = eval("ScatterND", 16, args.clone(), vec![attr_s("reduction", "add")]).unwrap();
        assert_eq!(f32s(&y), vec![0.0, 0.0, 10.0, 20.0, 6.0, 8.0, 0.0, 0.0]);
        let y = eval("ScatterND", 13, args, vec![]).unwrap();
        assert_eq!((y.shape.clone(), f32s(&y)), (vec![2, 2, 2], vec![0.0, 0.0, 10.0, 20.0, 5.0, 6.0, 0.0, 0.0]));
        // [0, 2] would land inside the flat data as [1, 0]: each component is checked.
        let args = vec![data, idx(vec![0, 2, 0, 0, 0, 0], vec![3, 2]), upd];
        let e = eval("ScatterND", 13, args, vec![]).unwrap_err();
        assert!(e.contains("gather index 2 out of range"), "{e}");
    }

    #[test]
    fn scatter_elements_and_its_old_name_keep_axis_and_reduction() {
        let data = Tensor::f32(vec![1, 5], vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        let args = vec![data, idx(vec![1, -4], vec![1, 2]), Tensor::f32(vec![1, 2], vec![1.5, 2.5])];
        let y = eval("ScatterElements", 18, args.clone(), vec![attr_i("axis", 1), attr_s("reduction", "max")]);
        assert_eq!(f32s(&y.unwrap()), vec![1.0, 2.5, 3.0, 4.0, 5.0]);
        let y = eval("Scatter", 9, args.clone(), vec![attr_i("axis", 1)]).unwrap();
        assert_eq!(f32s(&y), vec![1.0, 2.5, 3.0, 4.0, 5.0]);
        let e = eval("ScatterElements", 18, args, vec![attr_s("reduction", "sum")]).unwrap_err();
        assert!(e.contains("reduction 'sum' is not one of none, add, mul, max, min"), "{e}");
    }
    /// Batch 0 writes at 1, batch 1 at 3: linearly that runs past the 4 steps and fails,
    /// circularly its second step wraps to 0.
    #[test]
    fn tensor_scatter_writes_each_batch_at_its_index() {
        let cache = Tensor::f32(vec![2, 4, 1], vec![0.0; 8]);
        let update = Tensor::f32(vec![2, 2, 1], vec![1.0, 2.0, 3.0, 4.0]);
        let at = Tensor::new(vec![2], Data::I64(vec![1, 3]));
        let y = eval(
            "TensorScatter",
            24,
            vec![cache.clone(), update.clone(), at.clone()],
            vec![attr_s("mode", "circular")],
        );
        assert_eq!(f32s(&y.unwrap()), vec![0.0, 1.0, 2.0, 0.0, 4.0, 0.0, 0.0, 3.0]);
        let e = eval("TensorScatter", 24, vec![cache, update, at], vec![]).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }
}
