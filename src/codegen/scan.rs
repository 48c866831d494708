//! Scan kernels: cumsum, the running sum along one axis. Each line along the axis is one
//! pass in its own order (`reverse` runs from the end): the first result element is the
//! first operand element (0 when `exclusive`), every later one the result before it plus
//! the operand element at (or, exclusive, before) its place — sequential additions in the
//! element type, so the result is the interpreter's bit for bit (integers wrap).

use anyhow::{bail, Result};
use cranelift_codegen::ir::{types, InstBuilder};
use meshc_ir::attrs;
use meshc_ir::infer::norm_axis;
use meshc_ir::{DType, Node, TensorType};

use super::emit::{build_kernel, mem};
use super::nest::{collapse, for_nest, Dim};
use super::{Generated, Target};

pub fn cumsum(target: &Target, name: &str, node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Generated> {
    let [x] = inputs else { bail!("cumsum takes one operand") };
    if out != x {
        bail!("cumsum of {x} into {out}: the types differ");
    }
    let attrs::CumSum { axis, exclusive, reverse } = attrs::CumSum::of(node);
    let axis = norm_axis(axis, x.rank()).map_err(anyhow::Error::msg)?;
    let (ty, float) = match x.dtype {
        DType::F32 => (types::F32, true),
        DType::I32 => (types::I32, false),
        DType::I64 => (types::I64, false),
        other => bail!("cumsum of {other} is not defined"),
    };
    let esize = x.dtype.size_bytes() as i64;
    let n = x.shape[axis] as i64;
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    // Bytes from one element of a line to the next in visiting order; the immediate
    // offsets below must hold it.
    let step = inner as i64 * esize * if reverse { -1 } else { 1 };
    let Ok(back) = i32::try_from(-step) else { bail!("cumsum along an axis {step} bytes apart is too far") };
    let first = if reverse { (n - 1).max(0) * inner as i64 * esize } else { 0 };
    let lines = collapse(&[Dim::new(outer, &[n * inner as i64 * esize; 2]), Dim::new(inner, &[esize; 2])]);
    let func = build_kernel(target, name, |kb| {
        if n == 0 || outer * inner == 0 {
            return;
        }
        let (dst, src) = (kb.buf(0), kb.buf(1));
        for_nest(kb, &lines, &[src, dst], &mut |kb, p| {
            let (s0, d0) = (kb.b.ins().iadd_imm_s(p[0], first), kb.b.ins().iadd_imm_s(p[1], first));
            let head = match (exclusive, float) {
                (false, _) => kb.b.ins().load(ty, mem(), s0, 0),
                (true, true) => kb.b.ins().f32const(0.0),
                (true, false) => kb.b.ins().iconst(ty, 0),
            };
            kb.b.ins().store(mem(), head, d0, 0);
            kb.for_const(1, n, 1, |kb, j| {
                let (s, d) = (kb.addr(s0, j, step), kb.addr(d0, j, step));
                let before = kb.b.ins().load(ty, mem(), d, back);
                let v = kb.b.ins().load(ty, mem(), s, if exclusive { back } else { 0 });
                let sum = if float { kb.b.ins().fadd(before, v) } else { kb.b.ins().iadd(before, v) };
                kb.b.ins().store(mem(), sum, d, 0);
            });
        });
    });
    Ok(Generated { func, scratch: 0, parts: 1 })
}

#[cfg(test)]
mod tests {
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Attr, Op};

    use super::*;
    use crate::codegen::movement::testing::{random, run_kernel};

    /// Every axis (negative ones too), both flags, each dtype, sizes 0 and 1 along the
    /// axis, against the interpreter bit for bit, on the host and on a target without FMA.
    #[test]
    fn cumsum_matches_the_interpreter() {
        for (k, shape) in [&[3usize, 4, 5][..], &[7], &[2, 1, 3], &[2, 0, 3]].into_iter().enumerate() {
            for dtype in [DType::F32, DType::I32, DType::I64] {
                let x = random(dtype, shape, -1000.0, 1000.0, k as u64);
                let rank = shape.len() as i64;
                for axis in -rank..rank {
                    for (exclusive, reverse) in [(false, false), (true, false), (false, true), (true, true)] {
                        let node = Node::new("y", Op::CumSum, &["x"])
                            .with_attr("axis", Attr::Int(axis))
                            .with_attr("exclusive", Attr::Bool(exclusive))
                            .with_attr("reverse", Attr::Bool(reverse));
                        let want = eval_node(&node, &[&x], &x.ty()).unwrap();
                        for (status, got) in run_kernel(cumsum, &node, std::slice::from_ref(&x)) {
                            assert_eq!(status, 0);
                            assert_eq!(
                                got, want,
                                "{dtype}{shape:?} axis {axis} exclusive {exclusive} reverse {reverse}"
                            );
                        }
                    }
                }
            }
        }
    }
}
