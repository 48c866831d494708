//! Zero-point fusion, per device, after the epilogues: an integer matmul whose `a` is
//! `cast(x, i32) − z`, an 8-bit `x` (u8 or i8) less a zero point `z` of one element, reads
//! `x` and `z` themselves (`a_zero_point`, docs/ops.md). onnxruntime's dynamic quantization
//! writes every MatMulInteger's activation so (DynamicQuantizeLinear's u8 result and its
//! zero point), and the importer centres it this way; without the pass, each such `a` is
//! written out as i32, four bytes an element, and read back by the integer GEMM only to be
//! taken to bytes again. The GEMM takes `x` as the bytes it splits rows into anyway
//! (`meshc_runtime::kernels::igemm`), with `−z` as every row's offset.
//!
//! The `sub` (and then the `cast`) is dropped when only such matmuls read it: the query,
//! key and value projections of an encoder layer share one quantized activation.

use std::collections::{HashMap, HashSet};

use meshc_ir::verify::Info;
use meshc_ir::{attrs, Attr, DType, Graph, Node, Op};

use super::fold::Folded;

/// The graph `g` (verified as `info`, its constants `folded`) with every integer matmul of
/// a centred 8-bit `a` reading the bytes and the zero point; `None` when there is none.
pub fn fuse(g: &Graph, info: &Info, folded: &Folded) -> Option<Graph> {
    let reads = super::Reads::new(g);
    let mut rewritten: Vec<Option<Node>> = vec![None; g.nodes.len()];
    // The subs and casts a rewrite stops reading, each with the readers it loses.
    let mut unread: HashMap<&str, usize> = HashMap::new();
    for (i, m) in g.nodes.iter().enumerate() {
        if m.op != Op::MatMul || m.inputs.len() < 2 || folded.has(&m.name) || attrs::MatMul::of(m).a_zero_point {
            continue;
        }
        let Some((x, z)) = centred(g, info, folded, &reads, &m.inputs[0]) else { continue };
        if info.types[&m.inputs[1]].dtype != DType::I32 || m.inputs[1] == m.inputs[0] {
            continue;
        }
        *unread.entry(m.inputs[0].as_str()).or_default() += 1;
        let mut node = m.clone();
        let operands = [x, m.inputs[1].as_str(), z].into_iter().map(str::to_string);
        node.inputs = operands.chain(m.inputs[2..].iter().cloned()).collect();
        node.attrs.insert("a_zero_point".to_string(), Attr::Bool(true));
        rewritten[i] = Some(node);
    }
    if unread.is_empty() {
        return None;
    }
    // A sub no one reads any more goes, and so does a cast no sub that stays reads.
    let gone = |name: &str, lost: usize| reads.count(name) == lost && !reads.is_output(name);
    let mut dropped = HashSet::new();
    let mut casts: HashMap<&str, usize> = HashMap::new();
    for (&sub, &lost) in &unread {
        if gone(sub, lost) {
            dropped.insert(sub);
            *casts.entry(g.nodes[reads.producer[sub]].inputs[0].as_str()).or_default() += 1;
        }
    }
    dropped.extend(casts.into_iter().filter(|&(cast, lost)| gone(cast, lost)).map(|(cast, _)| cast));
    let nodes = (g.nodes.iter().zip(rewritten))
        .filter(|(n, _)| !dropped.contains(n.name.as_str()))
        .map(|(n, r)| r.unwrap_or_else(|| n.clone()))
        .collect();
    Some(Graph { nodes, ..g.clone() })
}

/// The 8-bit value and the zero point of `a` when it is `cast(x, i32) − z`, computed as
/// the program runs, with `z` one i32 element and the result `x`'s shape.
fn centred<'g>(
    g: &'g Graph,
    info: &Info,
    folded: &Folded,
    reads: &super::Reads<'g>,
    a: &str,
) -> Option<(&'g str, &'g str)> {
    let sub = &g.nodes[*reads.producer.get(a)?];
    if sub.op != Op::Sub || folded.has(&sub.name) {
        return None;
    }
    let (c, z) = (&sub.inputs[0], &sub.inputs[1]);
    let cast = &g.nodes[*reads.producer.get(c.as_str())?];
    // (A folded cast may have spent its constant operand: nothing stores it for the matmul.)
    if cast.op != Op::Cast || attrs::Cast::of(cast).to != DType::I32 || folded.has(&cast.name) {
        return None;
    }
    let x = &cast.inputs[0];
    let (tx, tz) = (&info.types[x], &info.types[z]);
    let fits = matches!(tx.dtype, DType::U8 | DType::I8) && info.types[a].shape == tx.shape;
    (fits && tz.dtype == DType::I32 && tz.numel() == 1).then_some((x.as_str(), z.as_str()))
}
