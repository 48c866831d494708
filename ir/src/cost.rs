//! The cost model the compiler plans with: FLOPs per node (the placer balances stages by
//! it, the artifact reports it, `--bench` divides by it).

use std::collections::BTreeMap;

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
            // Every combination of letters is one multiply-add per operand beyond the first.
            let eq = crate::infer::attr_str(n, "equation", "");
            let mut sizes: BTreeMap<char, u64> = BTreeMap::new();
            if let Ok((terms, _)) = crate::infer::parse_equation(eq, n.inputs.len()) {
                for (t, i) in terms.iter().zip(&n.inputs) {
                    for (c, &d) in t.iter().zip(&info.types[i].shape) {
                        sizes.insert(*c, d as u64);
                    }
                }
            }
            2 * sizes.values().product::<u64>() * (n.inputs.len() as u64 - 1).max(1)
        }
        Op::Conv => {
            // Every output element is a dot product over its group's channels and the kernel.
            let w = &info.types[&n.inputs[1]].shape;
            let taps: u64 = w[1..].iter().map(|&d| d as u64).product();
            2 * numel(&n.name) * taps + if n.inputs.len() == 3 { numel(&n.name) } else { 0 }
        }
        Op::MaxPool | Op::AvgPool => {
            let kernel = n.attrs.get("kernel").and_then(crate::Attr::as_ints).unwrap_or_default();
            numel(&n.name) * kernel.iter().map(|&k| k.max(1) as u64).product::<u64>()
        }
        Op::ScatterElements => match crate::infer::attr_str(n, "reduction", "none") {
            "none" => 0,
            _ => numel(&n.inputs[2]),
        },
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => numel(&n.inputs[0]),
        Op::Softmax => 5 * numel(&n.name),
        Op::LayerNorm => 8 * numel(&n.name),
        op if op.is_elementwise() => numel(&n.name),
        _ => 0,
    }
}
