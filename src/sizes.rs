//! Which steps of a graph compiled with symbolic dims scale with a call's sizes, and how
//! (docs/dynamic-shapes.md). Every buffer is laid out at the upper bounds and every tensor
//! of a call is stored from the start of its buffer at its own shape. Library calls (the
//! GEMM, attention, and the runner's transpose) are planned for each call's shapes, so
//! they take symbolic dims anywhere. A generated kernel bakes its shapes in but for one
//! count: a tensor whose symbolic dims are all leading dims (`[batch, seq, 384]`,
//! `[batch*seq, 384]`) is a prefix of whole rows, and a kernel whose result and every
//! operand that depends on the symbols have the same rows (the product of their leading
//! dims up to the last symbolic one), and whose op treats rows independently, does the
//! first `r` of the `hi` rows it is generated for. A transpose that moves a symbolic dim,
//! a reduction or a softmax along one and a concat along or before one are the runner's;
//! every other step over symbolic sizes is refused, naming the node.

use anyhow::{bail, Result};
use meshc_ir::infer::{norm_axes, norm_axis};
use meshc_ir::sym::{Expr, SymInfo};
use meshc_ir::{attrs, Node, Op};

/// How a step scales.
#[derive(Clone, Debug, PartialEq)]
pub enum StepScaling {
    /// A generated kernel: its rows and their number at the upper bounds; per operand, how
    /// an elementwise operand broadcast along some of the result's leading dims repeats
    /// over the result's rows, if it is one.
    Rows { rows: Expr, hi: usize, repeats: Vec<Option<Repeat>> },
    /// A library call: each tensor's shape (result, then operands).
    Shapes(Vec<Vec<Expr>>),
}

/// How an elementwise operand broadcast along some of the result's leading dims is read:
/// result row `r` reads its row `(r / stride) mod period`. `[seq, 384]` in `[batch, seq,
/// 384]` repeats every `seq` rows (stride 1); a causal mask's `[seq, 1]` in `[batch, heads,
/// seq, seq]` scores, whose rows are single elements, holds each of its `seq` rows for
/// `seq` rows in turn (stride `seq`).
#[derive(Clone, Debug, PartialEq)]
pub struct Repeat {
    pub stride: Expr,
    pub period: Expr,
}

/// Tensor `t`'s symbolic shape (empty for a name inference never saw).
fn symbolic_shape<'a>(si: &'a SymInfo, t: &str) -> &'a [Expr] {
    si.shapes.get(t).map_or(&[], Vec::as_slice)
}

/// The rows of a tensor of symbolic `shape`: how many leading dims they span and their
/// product; `None` for a static tensor.
fn rows_of(shape: &[Expr]) -> Option<(usize, Expr)> {
    let last = shape.iter().rposition(|d| !d.is_const())?;
    Some((last + 1, Expr::product(&shape[..=last])))
}

/// How the step that computes `node` from `operands` (tensor names; an elementwise step's
/// are its fused group's) scales with the symbols, as a library call if `library`;
/// `None` when none of its tensors depends on them. A transpose that moves a symbolic dim
/// becomes a library call.
pub fn step_scaling(si: &SymInfo, node: &Node, operands: &[String], library: bool) -> Result<Option<StepScaling>> {
    // iota reads only its operand's size, broadcast_like only its first operand's values:
    // the sizes they read scale as their result does.
    let operands = match node.op {
        Op::Iota => &[],
        Op::BroadcastLike => &operands[..1],
        _ => operands,
    };
    let shape = |t: &str| symbolic_shape(si, t);
    let tensors = std::iter::once(&node.name).chain(operands);
    if tensors.clone().all(|t| shape(t).iter().all(Expr::is_const)) {
        return Ok(None);
    }
    let shapes = || StepScaling::Shapes(tensors.clone().map(|t| shape(t).to_vec()).collect());
    if library {
        return Ok(Some(shapes()));
    }
    // A result empty along a static dim is empty at every size: its kernel does nothing,
    // and needs no row count once the step is one that scales by rows.
    let empty = shape(&node.name).iter().any(|d| d.as_const() == Some(0));
    match rows(si, node, operands) {
        Ok(_) if empty => Ok(None),
        // A transpose that moves a symbolic dim, a reduction or a softmax along one and a
        // concat along or before one are the runner's: library calls of each call's shape.
        Err(_)
            if matches!(
                node.op,
                Op::Transpose | Op::ReduceSum | Op::ReduceMean | Op::ReduceMax | Op::Softmax | Op::Concat
            ) =>
        {
            Ok(Some(shapes()))
        }
        r => r.map(Some),
    }
}

/// A generated kernel's rows (`StepScaling::Rows`), or why it cannot scale.
fn rows(si: &SymInfo, node: &Node, operands: &[String]) -> Result<StepScaling> {
    let shape = |t: &str| symbolic_shape(si, t);
    let result = rows_of(shape(&node.name));
    let ops: Vec<Option<(usize, Expr)>> = operands.iter().map(|o| rows_of(shape(o))).collect();
    let Some((lead, rows)) = result else {
        if let Some(k) = ops.iter().position(Option::is_some) {
            bail!(
                "node '{}': its operand '{}' has symbolic dims ({}) but its result does not; compiled code takes symbolic dims only where a step keeps them (docs/dynamic-shapes.md)",
                node.name,
                operands[k],
                meshc_ir::sym::infer::show(shape(&operands[k]))
            );
        }
        bail!("node '{}': its result is static", node.name);
    };
    let mut repeats = vec![None; operands.len()];
    for (k, (o, r)) in operands.iter().zip(&ops).enumerate() {
        if let Some(p) = r.as_ref().filter(|(_, r)| *r != rows).and_then(|_| repeat(shape(o), shape(&node.name), lead))
        {
            if node.op.is_elementwise() {
                repeats[k] = Some(p);
                continue;
            }
        }
        if let Some((_, r)) = r.as_ref().filter(|(_, r)| *r != rows) {
            bail!(
                "node '{}': its operand '{o}' has rows {r} where its result {} has {rows}; compiled code takes symbolic dims only as leading dims every tensor of a step shares (docs/dynamic-shapes.md)",
                node.name,
                meshc_ir::sym::infer::show(shape(&node.name))
            );
        }
    }
    let x = ops.first().cloned().flatten().map_or(0, |(l, _)| l);
    let rank = shape(operands.first().map_or("", String::as_str)).len();
    let keeps_rows = |axes: &[usize]| axes.iter().all(|&a| a >= x);
    let ok = match node.op {
        _ if node.op.is_elementwise() => true,
        Op::BroadcastTo | Op::BroadcastLike => true,
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => match attrs::Reduce::of(node).axes {
            Some(a) => norm_axes(&a, rank).is_ok_and(|a| keeps_rows(&a)),
            None => false,
        },
        Op::Softmax => norm_axis(attrs::Softmax::of(node).axis, rank).is_ok_and(|a| a >= x),
        Op::LayerNorm => norm_axis(attrs::LayerNorm::of(node).axis, rank).is_ok_and(|a| a >= x),
        Op::Transpose => match attrs::Transpose::of(node).perm {
            Some(p) => norm_axes(&p, rank).is_ok_and(|p| p.iter().take(lead).enumerate().all(|(i, &a)| i == a)),
            None => false,
        },
        Op::Gather => norm_axis(attrs::Gather::of(node).axis, rank).is_ok_and(|a| a >= x),
        Op::Iota => true,
        Op::DynamicSlice => norm_axes(&attrs::DynamicSlice::of(node).axes, rank).is_ok_and(|a| keeps_rows(&a)),
        Op::DynamicUpdateSlice => {
            norm_axes(&attrs::DynamicUpdateSlice::of(node).axes, rank).is_ok_and(|a| keeps_rows(&a))
        }
        Op::Concat => norm_axis(attrs::Concat::of(node).axis, rank).is_ok_and(|a| a >= x),
        Op::Slice => {
            let s = attrs::Slice::of(node);
            let axes = s.axes.unwrap_or_else(|| (0..s.starts.len() as i64).collect());
            norm_axes(&axes, rank).is_ok_and(|a| keeps_rows(&a))
        }
        // Depthwise (the only conv left after expansion): each image's planes on their own.
        Op::Conv => lead == 1,
        _ => false,
    };
    if !ok {
        bail!(
            "node '{}': {} over its symbolic rows {rows} is not compiled yet (the interpreter runs it: `meshc interp`; docs/dynamic-shapes.md)",
            node.name,
            node.op.name()
        );
    }
    let hi = rows.eval(&si.example).and_then(|v| usize::try_from(v).ok()).filter(|&v| v > 0);
    let Some(hi) = hi else { bail!("node '{}': its rows {rows} are empty at the upper bounds", node.name) };
    Ok(StepScaling::Rows { rows, hi, repeats })
}

/// How an operand of symbolic `shape` broadcast against a result of `out` shape, whose rows
/// span `lead` dims, repeats over them (`Repeat`): within the leading dims its dims, aligned
/// to the result's, are 1s, then a run equal to the result's (the dims it has, the period),
/// then 1s (the result's dims there are the stride). Its inner dims are the result's or 1.
fn repeat(shape: &[Expr], out: &[Expr], lead: usize) -> Option<Repeat> {
    let off = out.len().checked_sub(shape.len())?;
    let one = Expr::constant(1);
    let dim = |i: usize| if i < off { &one } else { &shape[i - off] };
    let first = (0..lead).find(|&i| dim(i).as_const() != Some(1))?;
    let end = (0..lead).rfind(|&i| dim(i).as_const() != Some(1))? + 1;
    let run = (first..end).all(|i| dim(i) == &out[i]);
    let inner = (lead..out.len()).all(|i| dim(i) == &out[i] || dim(i).as_const() == Some(1));
    (run && inner).then(|| Repeat { stride: Expr::product(&out[end..lead]), period: Expr::product(&out[first..end]) })
}
