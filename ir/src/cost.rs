//! The cost model the compiler plans with: FLOPs per node (the placer balances stages by
//! it, the artifact reports it, `--bench` divides by it).

use std::collections::BTreeMap;

use crate::attrs::{self, ScatterReduction};
use crate::graph::Node;
use crate::ops::Op;
use crate::verify::Info;

/// The FLOP estimate of a node: 2 per multiply-add of contractions and convs, one per
/// element for elementwise ops, reductions, pooling taps and combining scatters, a few per
/// element for softmax and layer_norm; data movement costs none.
pub fn node_flops(n: &Node, info: &Info) -> u64 {
    let numel = |name: &str| info.types[name].numel() as u64;
    match n.op {
        Op::MatMul => {
            let a = &info.types[&n.inputs[0]].shape;
            2 * numel(&n.name) * *a.last().unwrap_or(&1) as u64
        }
        Op::Attention => {
            // The two products, the scores' steps and the softmax over every score.
            let (q, kt, out) =
                (&info.types[&n.inputs[0]].shape, &info.types[&n.inputs[1]].shape, &info.types[&n.name].shape);
            let (d, s, dv) = (q[q.len() - 1] as u64, kt[kt.len() - 1] as u64, out[out.len() - 1] as u64);
            let scores = numel(&n.name) / dv.max(1) * s;
            scores * (2 * d + 2 * dv + 5 + (n.inputs.len() as u64 - 3))
        }
        Op::Einsum => {
            // The multiply-adds of its pairwise contractions (`einsum::path`).
            let eq = attrs::Einsum::of(n).equation;
            let Ok((terms, out)) = crate::infer::parse_equation(&eq, n.inputs.len()) else { return 0 };
            let mut sizes: BTreeMap<char, usize> = BTreeMap::new();
            for (t, i) in terms.iter().zip(&n.inputs) {
                for (c, &d) in t.iter().zip(&info.types[i].shape) {
                    sizes.insert(*c, d);
                }
            }
            u64::try_from(crate::einsum::multiply_adds(&terms, &out, &sizes).saturating_mul(2)).unwrap_or(u64::MAX)
        }
        Op::Conv => {
            // Every output element is a dot product over its group's channels and the kernel.
            let w = &info.types[&n.inputs[1]].shape;
            let taps: u64 = w[1..].iter().map(|&d| d as u64).product();
            2 * numel(&n.name) * taps + if n.inputs.len() == 3 { numel(&n.name) } else { 0 }
        }
        Op::MaxPool | Op::AvgPool => {
            let kernel = match n.op {
                Op::MaxPool => attrs::MaxPool::of(n).kernel,
                _ => attrs::AvgPool::of(n).kernel,
            };
            kernel.iter().fold(numel(&n.name), |f, &k| f.saturating_mul(k.max(1) as u64))
        }
        Op::ScatterElements => match attrs::ScatterElements::of(n).reduction {
            ScatterReduction::None => 0,
            _ => numel(&n.inputs[2]),
        },
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => numel(&n.inputs[0]),
        Op::Softmax => 5 * numel(&n.name),
        Op::LayerNorm => 8 * numel(&n.name),
        unary_ops!() | binary_ops!() | ternary_ops!() => numel(&n.name),
        // One addition per element.
        Op::CumSum | Op::Iota => numel(&n.name),
        Op::Reshape
        | Op::Transpose
        | Op::BroadcastTo
        | Op::BroadcastLike
        | Op::Concat
        | Op::Slice
        | Op::DynamicSlice
        | Op::DynamicUpdateSlice
        | Op::Gather
        | Op::Pad
        | Op::Send
        | Op::Recv
        | Op::AllReduce
        | Op::AllGather
        | Op::ReduceScatter
        | Op::AllToAll => 0,
    }
}
