//! Reduction splitting, per device, before fusion: a reduction to few results over many
//! elements is few units of work, so its kernel runs on one core however many the device
//! has (DynamicQuantizeLinear's range of a whole activation: one result over 1.5 M
//! elements of MiniLM-L3's FFN at 8×128, read twice, for the max and the min). It becomes
//! two reductions: the innermost reduced axes first, kept as dims of 1, to at least
//! `MIN_PARTIALS` partial results that the kernel splits over the cores; then the node
//! itself on those (its axes and `keepdims` as they were: the axes the first reduced are
//! of size 1 now).
//!
//! `reduce_max` gives the same value in any grouping (of a +0 and a −0, either).
//! `reduce_sum` and `reduce_mean` are regrouped (every partial covers the same count of
//! elements, so a mean of means is the mean), which changes f32 rounding as a different
//! blocking of the loop would. Only f32 reductions are split, and only in programs without
//! symbolic dims (`compile` does not run the pass there: a reduction along a symbolic dim
//! is the runner's); integer ones are scalar loops. A reduction of one axis of more than
//! one element stays as it is (splitting it would need a reshape that the axis' length may
//! not allow), and so does one whose partials would each cover fewer than `MIN_RUN`
//! elements (the second reduction would then read nearly as much as the first).
//!
//! The first keeps the node's inputs and is named `NAME.partial`; the second keeps the
//! node's name, so its readers are unchanged, and a prologue fused into the reduction
//! (`passes::fuse`) goes with the first, which reads the operand.

use meshc_ir::verify::Info;
use meshc_ir::{attrs, Attr, DType, Graph, Op};

use super::fold::Folded;

/// Reduced elements from which a reduction to few results is split: below, the second
/// kernel's call costs more than the cores save.
const MIN_ELEMENTS: usize = 1 << 18;

/// Results below which a reduction counts as few, and the partial results the first
/// reduction leaves at least.
const MIN_PARTIALS: usize = 64;

/// Elements each partial result covers at least.
const MIN_RUN: usize = 256;

/// The graph `g` (verified as `info`, its constants `folded`) with every f32 reduction to
/// few results over many elements split in two; `None` when there is none.
pub fn split(g: &Graph, info: &Info, folded: &Folded) -> Option<Graph> {
    let mut used = super::names(g);
    let mut out = g.clone();
    out.nodes.clear();
    let mut changed = false;
    for n in &g.nodes {
        let stages = match n.op {
            Op::ReduceSum | Op::ReduceMean | Op::ReduceMax if !folded.has(&n.name) => {
                stages(&info.types[&n.inputs[0]], &attrs::Reduce::of(n))
            }
            _ => None,
        };
        let Some(first) = stages else {
            out.nodes.push(n.clone());
            continue;
        };
        let mut partial = n.clone();
        partial.name = super::fresh(&used, &n.name, "partial");
        used.insert(partial.name.clone());
        partial.attrs.insert("axes".to_string(), Attr::ints(&first));
        partial.attrs.insert("keepdims".to_string(), Attr::Bool(true));
        // A lowered program declares each node's type: the node's own is not the partial's.
        (partial.shape, partial.dims) = (None, None);
        let mut whole = n.clone();
        whole.inputs = vec![partial.name.clone()];
        out.nodes.extend([partial, whole]);
        changed = true;
    }
    changed.then_some(out)
}

/// The axes of the first of the two reductions a reduction of `x` by `r` splits into, or
/// `None` when it is not split.
fn stages(x: &meshc_ir::TensorType, r: &attrs::Reduce) -> Option<Vec<i64>> {
    if x.dtype != DType::F32 {
        return None;
    }
    let rank = x.shape.len();
    let mut axes: Vec<usize> = match &r.axes {
        None => (0..rank).collect(),
        Some(a) => meshc_ir::infer::norm_axes(a, rank).ok()?,
    };
    // An axis of one element reduces nothing: it is left to the node.
    axes.retain(|&d| x.shape[d] != 1);
    axes.sort_unstable();
    let reduced: usize = axes.iter().map(|&d| x.shape[d]).product();
    let results = x.shape.iter().product::<usize>().checked_div(reduced)?;
    if axes.len() < 2 || results >= MIN_PARTIALS || reduced < MIN_ELEMENTS {
        return None;
    }
    // Take reduced axes into the first stage from the innermost out while the partial
    // results stay at least MIN_PARTIALS.
    let mut cut = axes.len() - 1;
    let mut left: usize = axes[..cut].iter().map(|&d| x.shape[d]).product();
    if results * left < MIN_PARTIALS {
        return None;
    }
    while cut > 1 && results * (left / x.shape[axes[cut - 1]]) >= MIN_PARTIALS {
        cut -= 1;
        left /= x.shape[axes[cut]];
    }
    if reduced / left < MIN_RUN {
        return None;
    }
    Some(axes[cut..].iter().map(|&d| d as i64).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshc_ir::TensorType;

    fn axes(shape: &[usize], a: Option<Vec<i64>>) -> Option<Vec<i64>> {
        stages(&TensorType::new(DType::F32, shape.to_vec()), &attrs::Reduce { axes: a, keepdims: false })
    }

    #[test]
    fn the_innermost_axes_go_first_while_partials_stay_many() {
        assert_eq!(axes(&[8, 128, 384], None), Some(vec![2]));
        assert_eq!(axes(&[1024, 1536], None), Some(vec![1]));
        assert_eq!(axes(&[2, 4, 64, 1024], None), Some(vec![3]));
        assert_eq!(axes(&[4, 3, 8, 32768], Some(vec![-1, 1, 0])), Some(vec![3]));
        assert_eq!(axes(&[64, 2, 4, 512], None), Some(vec![1, 2, 3]));
        // Each partial covers the innermost axis whatever the results: 512 elements here.
        assert_eq!(axes(&[4, 3, 171, 512], Some(vec![1, 2, 3])), Some(vec![3]));
        // Few elements, many results, one axis, or too few partials whatever the cut: as it is.
        assert_eq!(axes(&[8, 128, 32], None), None);
        assert_eq!(axes(&[512, 1024], Some(vec![1])), None);
        assert_eq!(axes(&[1 << 20], None), None);
        assert_eq!(axes(&[2, 1 << 20], None), None);
        // Short innermost runs, or only axes of one element besides one: as it is.
        assert_eq!(axes(&[131072, 2], None), None);
        assert_eq!(axes(&[262144, 1], None), None);
        assert_eq!(axes(&[262144, 1, 1], None), None);
        assert_eq!(axes(&[8, 1, 128, 384], None), Some(vec![3]));
        let i32s = TensorType::new(DType::I32, vec![1024, 1536]);
        assert_eq!(stages(&i32s, &attrs::Reduce { axes: None, keepdims: false }), None);
    }
}
