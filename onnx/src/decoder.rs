//! A decoder exported for generation, one step with its KV cache as `past_key_values.N.key`
//! / `.value` inputs and `present.N.key` / `.value` outputs (optimum's naming, which
//! transformers' exports through torch.onnx follow), imported as a decode step
//! (docs/generation.md).
//!
//! The export concatenates the past with the step's keys and returns the result, so a
//! caller must copy a growing cache through every step. The import binds the past to
//! `context - 1` positions and the sequence to 1, so that each concat yields exactly
//! `context` positions. It then makes the past a cache of `context` positions, written at a
//! run-time `pos` by `dynamic_update_slice` in place of the concat: every shape downstream
//! is unchanged, and the cache stays on the devices as state. The attention mask becomes
//! `positions <= pos` and the position ids `pos`, both computed in the step, so the
//! positions past `pos`, which hold nothing yet, are masked as padding.
//!
//! The same file also gives the prefill of a prompt of P ids, run in one call. Its past is
//! bound to one position, all zeros and masked as padding (meshc has no empty tensors), so
//! that the model's own causal mask puts the prompt after it. Each present without that
//! position is an output named after its past: the first P positions of the cache, which
//! the generate loop copies into the decode step's state.

use std::collections::{BTreeMap, HashMap};

use meshc_ir::{Attr, DType, Data, Graph, Input, Node, Op, Output, Param, ParamData, Tensor, TensorType};

use super::proto::{tensor_shape_proto::dimension, type_proto, ModelProto};

type R<T> = std::result::Result<T, String>;
/// Every dim of some inputs, by name (as `--input-shape` gives them).
type Shapes = BTreeMap<String, Vec<usize>>;

/// What the cache holds: `context` positions of `batch` sequences.
#[derive(Clone, Copy, Debug)]
pub struct Cache {
    pub context: usize,
    pub batch: usize,
}

/// Which step of generation the import makes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Entry {
    /// One token per sequence at a run-time `pos`, the cache as state.
    Decode,
    /// The first `prompt` tokens of each sequence in one call, from an empty cache.
    Prefill { prompt: usize },
}

/// The decode step's names, as docs/generation.md's contract gives them.
const IDS: &str = "ids";
const POS: &str = "pos";
/// The prefill's position whose logits it gives: a prompt shorter than the prefill's is
/// padded after its end, which the causal mask keeps from every position before.
const LAST: &str = "last";
/// The one dim a decode step's state must name: the positions it holds.
const CTX: &str = "ctx";
const POSITIONS: &str = "decode.positions";

/// The past inputs of `model`, in order, and the `--input-shape`s that bind the step. A
/// decode step: ids and position ids `[batch, 1]`, the mask `[batch, context]`, each past
/// `[batch, heads, context - 1, head_dim]`. A prefill of P ids: ids and position ids
/// `[batch, P]`, the mask `[batch, P + 1]`, each past `[batch, heads, 1, head_dim]`. Refused
/// in one line when the model has no such past, or one whose heads or head size are not
/// fixed.
pub fn shapes(model: &ModelProto, cache: Cache, entry: Entry) -> R<(Vec<String>, Shapes)> {
    if cache.context < 2 {
        return Err(format!(
            "a context of {} positions is too short for a decoder's cache (at least 2)",
            cache.context
        ));
    }
    let (seq, past_len) = match entry {
        Entry::Decode => (1, cache.context - 1),
        Entry::Prefill { prompt } if (1..=cache.context).contains(&prompt) => (prompt, 1),
        Entry::Prefill { prompt } => {
            return Err(format!("a prompt of {prompt} ids does not fit a context of {}", cache.context))
        }
    };
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    let mut past = Vec::new();
    let mut shapes = BTreeMap::new();
    for i in &graph.input {
        let name = i.name.clone().unwrap_or_default();
        let shape = match name.as_str() {
            "input_ids" | "position_ids" => vec![cache.batch, seq],
            "attention_mask" => vec![cache.batch, past_len + seq],
            _ if is_past(&name) => {
                let fixed = fixed_dims(i.r#type.as_ref());
                let (Some(heads), Some(head_dim)) = (fixed.get(1).copied().flatten(), fixed.get(3).copied().flatten())
                else {
                    return Err(format!(
                        "input '{name}': a past of [batch, heads, past, head_dim] with its heads and head_dim fixed is expected"
                    ));
                };
                past.push(name.clone());
                vec![cache.batch, heads, past_len, head_dim]
            }
            _ => continue,
        };
        shapes.insert(name, shape);
    }
    if past.is_empty() {
        return Err(
            "not a decoder export with a KV cache: no input is named past_key_values.N.key or .value (docs/generation.md)"
                .into(),
        );
    }
    for needed in ["input_ids", "position_ids"] {
        if !shapes.contains_key(needed) {
            return Err(format!(
                "the decoder export has no input '{needed}': {}",
                match needed {
                    "input_ids" => "it takes no token ids",
                    _ => "its positions would come from the past's length, which a cache of fixed size does not have; export it with position_ids",
                }
            ));
        }
    }
    Ok((past, shapes))
}

fn is_past(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("past_key_values.") else { return false };
    let Some((layer, kv)) = rest.split_once('.') else { return false };
    layer.parse::<usize>().is_ok() && matches!(kv, "key" | "value")
}

/// Each dim of an ONNX input type: its value when it has one.
fn fixed_dims(t: Option<&super::proto::TypeProto>) -> Vec<Option<usize>> {
    let Some(type_proto::Value::TensorType(tt)) = t.and_then(|t| t.value.as_ref()) else { return Vec::new() };
    let Some(shape) = &tt.shape else { return Vec::new() };
    shape
        .dim
        .iter()
        .map(|d| match d.value {
            Some(dimension::Value::DimValue(v)) if v > 0 => Some(v as usize),
            _ => None,
        })
        .collect()
}

/// Rewrites the step `g`, imported at `shapes`' sizes for `entry`, into a decode step or a
/// prefill: see the module's comment. `params` receives the constants' values.
pub fn rewrite(
    g: &mut Graph,
    params: &mut HashMap<String, Tensor>,
    past: &[String],
    cache: Cache,
    entry: Entry,
) -> R<()> {
    for taken in [IDS, POS, LAST, POSITIONS] {
        if g.inputs.iter().any(|i| i.name == taken) || g.nodes.iter().any(|n| n.name == taken) {
            return Err(format!("the decoder export already has a value named '{taken}'"));
        }
    }
    rename(g, "input_ids", IDS);
    match entry {
        Entry::Decode => decode(g, params, past, cache),
        Entry::Prefill { prompt } => prefill(g, params, past, cache.batch, prompt),
    }
}

fn decode(g: &mut Graph, params: &mut HashMap<String, Tensor>, past: &[String], cache: Cache) -> R<()> {
    let types = meshc_ir::verify::verify(g).map_err(|e| e.msg)?.types;
    let swapped = swapped_caches(g, &types, past)?;
    group_queries(g, &types, past)?;
    g.inputs.push(Input { name: POS.into(), ty: TensorType::new(DType::I64, vec![1]), dims: None, loc: None });
    for (name, &swapped) in past.iter().zip(&swapped) {
        cache_in_place(g, name, cache.context, swapped)?;
    }
    let mut front = Vec::new();
    if let Some(mut mask) = take_input(g, "attention_mask") {
        budgeted(POSITIONS, &[cache.context], DType::I64)?;
        let positions = Tensor::new(vec![cache.context], Data::I64((0..cache.context as i64).collect()));
        constant(g, params, POSITIONS, positions, Some(vec![Some(CTX.into())]));
        let seen = format!("{}.seen", mask.name);
        front.push(Node::new(&seen, Op::LessEqual, &[POSITIONS, POS]));
        if let Some(d) = mask.dims.as_mut().and_then(|d| d.get_mut(1)) {
            *d = Some(CTX.into());
        }
        front.extend(broadcast_as(&seen, &mask));
    }
    if let Some(ids) = take_input(g, "position_ids") {
        check_position_tables(g, &ids.name, cache.context)?;
        front.extend(broadcast_as(POS, &ids));
    }
    g.nodes.splice(0..0, front);
    Ok(())
}

/// The prefill of `prompt` ids: the past one zero position masked as padding, the positions
/// 0 to `prompt - 1`, and each present but its first position an output named after its
/// past.
fn prefill(g: &mut Graph, params: &mut HashMap<String, Tensor>, past: &[String], batch: usize, prompt: usize) -> R<()> {
    if let Some(mask) = take_input(g, "attention_mask") {
        budgeted(&mask.name, &mask.ty.shape, DType::I64)?;
        let row = std::iter::once(0).chain(std::iter::repeat_n(1, prompt));
        let value: Vec<i64> = row.cycle().take(batch * (prompt + 1)).collect();
        constant(g, params, &mask.name, index_tensor(mask.ty, value), mask.dims);
    }
    if let Some(ids) = take_input(g, "position_ids") {
        check_position_tables(g, &ids.name, prompt)?;
        budgeted(&ids.name, &ids.ty.shape, DType::I64)?;
        let value: Vec<i64> = (0..prompt as i64).cycle().take(batch * prompt).collect();
        constant(g, params, &ids.name, index_tensor(ids.ty, value), ids.dims);
    }
    let types = meshc_ir::verify::verify(g).map_err(|e| e.msg)?.types;
    let swapped = swapped_caches(g, &types, past)?;
    last_logits(g, &types, prompt);
    for (name, swapped) in past.iter().zip(swapped) {
        let present = appending_concat(g, name)?;
        let empty = format!("{name}.empty");
        rename(g, name, &empty);
        let input = take_input(g, &empty).expect("a past is an input");
        budgeted(&empty, &input.ty.shape, input.ty.dtype)?;
        constant(g, params, &empty, Tensor::zeros(&input.ty), input.dims);
        let block = if swapped { format!("{name}.block") } else { name.clone() };
        let mut slice = Node::new(&block, Op::Slice, &[&present]);
        slice.attrs.insert("axes".into(), Attr::ints(&[2]));
        slice.attrs.insert("starts".into(), Attr::ints(&[1]));
        slice.attrs.insert("ends".into(), Attr::ints(&[prompt as i64 + 1]));
        g.nodes.push(slice);
        if swapped {
            g.nodes.push(swap(name, &block));
        }
        for o in g.outputs.iter_mut().filter(|o| o.name == present) {
            *o = Output::new(name);
        }
    }
    Ok(())
}

/// Cuts the prefill's `logits` to each sequence's position `last` (a run-time input),
/// where they come from a matmul of the hidden states `[batch, prompt, hidden]`: the loop
/// reads only that row, and the vocabulary projection of every other position is a third
/// of a small model's prefill (transformers' `generate` keeps one row for the same reason).
/// Any other form of logits keeps every row, and the prefill then takes only prompts of
/// its own length.
fn last_logits(g: &mut Graph, types: &HashMap<String, TensorType>, prompt: usize) {
    let Some(at) = g.nodes.iter().position(|n| n.name == "logits" && n.op == Op::MatMul) else { return };
    let hidden = g.nodes[at].inputs[0].clone();
    if !matches!(types.get(&hidden).map(|t| t.shape.as_slice()), Some([_, p, _]) if *p == prompt) {
        return;
    }
    g.inputs.push(Input { name: LAST.into(), ty: TensorType::new(DType::I64, vec![1]), dims: None, loc: None });
    let row = format!("{hidden}.last");
    let mut slice = Node::new(&row, Op::DynamicSlice, &[&hidden, LAST]);
    slice.attrs.insert("axes".into(), Attr::ints(&[1]));
    slice.attrs.insert("sizes".into(), Attr::ints(&[1]));
    g.nodes[at].inputs[0] = row;
    g.nodes.insert(at, slice);
}

/// `values` as a tensor of `ty`, an integer type the export gave a mask or positions.
fn index_tensor(ty: TensorType, values: Vec<i64>) -> Tensor {
    let data = match ty.dtype {
        DType::I32 => Data::I32(values.into_iter().map(|v| v as i32).collect()),
        _ => Data::I64(values),
    };
    Tensor::new(ty.shape, data)
}

/// Checks the constant `name` of `shape` (built as `dtype`) against the allocation budget
/// before it is built: its size comes from the command line's context and prompt.
fn budgeted(name: &str, shape: &[usize], dtype: DType) -> R<()> {
    meshc_ir::budget::check_shape(format_args!("the constant '{name}'"), shape, dtype.size_bytes()).map(drop)
}

/// A param `name` holding `value`, whose bytes `params` keeps until the graph is written.
fn constant(
    g: &mut Graph,
    params: &mut HashMap<String, Tensor>,
    name: &str,
    value: Tensor,
    dims: Option<meshc_ir::Dims>,
) {
    let data = ParamData::File { path: String::new(), key: Some(name.into()) };
    g.params.push(Param { name: name.into(), ty: value.ty(), dims, data, loc: None });
    params.insert(name.into(), value);
}

/// A table of learned positions (GPT-2's `wpe`) bounds the context: a gather of it at a
/// position past its rows would read nothing the model was trained with.
fn check_position_tables(g: &Graph, positions: &str, context: usize) -> R<()> {
    for n in g.nodes.iter().filter(|n| n.op == Op::Gather && n.inputs.get(1).is_some_and(|i| i == positions)) {
        let axis = n.attrs.get("axis").and_then(Attr::as_int).unwrap_or(0);
        let Some(table) = g.params.iter().find(|p| p.name == n.inputs[0]) else { continue };
        let rows = usize::try_from(axis).ok().and_then(|a| table.ty.shape.get(a)).copied();
        if let Some(rows) = rows.filter(|&r| context > r) {
            return Err(format!(
                "a context of {context} is beyond the model's {rows} positions (its position table '{}')",
                table.name
            ));
        }
    }
    Ok(())
}

/// The nodes that make `input`'s value, of its type, from `from`, a vector along its last
/// axis: a cast, then a broadcast over the rows.
fn broadcast_as(from: &str, input: &Input) -> Vec<Node> {
    let cast = format!("{}.cast", input.name);
    let mut c = Node::new(&cast, Op::Cast, &[from]);
    c.attrs.insert("to".into(), Attr::Str(input.ty.dtype.to_string()));
    let mut b = Node::new(&input.name, Op::BroadcastTo, &[&cast]);
    b.attrs.insert("shape".into(), Attr::ints(&input.ty.shape.iter().map(|&d| d as i64).collect::<Vec<_>>()));
    b.dims = input.dims.clone();
    vec![c, b]
}

/// The past input `name` becomes a cache of `context` positions along axis 2, and the one
/// concat that appends the step's keys to it a `dynamic_update_slice` at `pos`, whose result
/// is the output `next.NAME`, replacing the present output. A `swapped` cache (see
/// `swapped_caches`) is kept `[batch, heads, head_dim, ctx]`: a step transposes only its own
/// keys and writes one column, the swaps that read the cache read it as stored, and any other
/// reader reads it swapped back.
fn cache_in_place(g: &mut Graph, name: &str, context: usize, swapped: bool) -> R<()> {
    let present = appending_concat(g, name)?;
    let k = g.nodes.iter().position(|n| n.name == present).expect("the concat is a node");
    let next = format!("next.{name}");
    let input = g.inputs.iter_mut().find(|i| i.name == name).expect("a past is an input");
    let dims = input.dims.get_or_insert_with(|| vec![None; 4]);
    dims[2] = Some(CTX.into());
    input.ty.shape[2] = context;
    if swapped {
        input.ty.shape.swap(2, 3);
        dims.swap(2, 3);
    }
    let dims = dims.clone();
    let node = &mut g.nodes[k];
    node.op = Op::DynamicUpdateSlice;
    node.inputs.push(POS.into());
    node.attrs.clear();
    node.attrs.insert("axes".into(), Attr::ints(&[if swapped { 3 } else { 2 }]));
    node.dims = Some(dims);
    if swapped {
        let update = format!("{next}.update");
        let t = swap(&update, &node.inputs[1]);
        node.inputs[1] = update;
        let readers: Vec<String> = g.nodes.iter().filter(|n| reads(n, &present)).map(|n| n.name.clone()).collect();
        let swaps: Vec<String> = readers.iter().filter(|r| is_swap(node_named(g, r))).cloned().collect();
        let unswapped = format!("{present}.unswapped");
        for n in g.nodes.iter_mut().filter(|n| readers.contains(&n.name) && !swaps.contains(&n.name)) {
            n.inputs.iter_mut().filter(|i| **i == present).for_each(|i| *i = unswapped.clone());
        }
        if readers.len() > swaps.len() {
            g.nodes.insert(k + 1, swap(&unswapped, &present));
        }
        g.nodes.insert(k, t);
        g.nodes.retain(|n| !swaps.contains(&n.name));
        for reader in &swaps {
            rename(g, reader, &present);
        }
    }
    rename(g, &present, &next);
    Ok(())
}

/// `name = transpose(x)`, swapping the last two of four dims.
fn swap(name: &str, x: &str) -> Node {
    let mut t = Node::new(name, Op::Transpose, &[x]);
    t.attrs.insert("perm".into(), Attr::ints(&[0, 1, 3, 2]));
    t
}

fn is_swap(n: &Node) -> bool {
    n.op == Op::Transpose
        && n.attrs.get("perm").and_then(Attr::as_ints).is_some_and(|p| matches!(p[..], [0, 1, 3, 2] | [0, 1, -1, -2]))
}

fn reads(n: &Node, value: &str) -> bool {
    n.inputs.iter().any(|i| i == value)
}

fn node_named<'g>(g: &'g Graph, name: &str) -> &'g Node {
    g.nodes.iter().find(|n| n.name == name).expect("a node of that name")
}

/// The index of the one node reading `value`, if exactly one does.
fn only_reader(g: &Graph, value: &str) -> Option<usize> {
    let mut readers = (0..g.nodes.len()).filter(|&k| reads(&g.nodes[k], value));
    let first = readers.next()?;
    readers.next().is_none().then_some(first)
}

/// Which of the caches of `past` to keep swapped, `[batch, heads, head_dim, ctx]`: those the
/// attention reads only through a swap of their last two dims (GPT-2's and Llama's
/// `key.transpose(-1, -2)`), directly or after a grouped-query repeat (`repeat_of`).
/// Reading such a cache row-major transposed all of it every step (0.85 ms a layer at
/// 1024 positions of GPT-2 small, a third of a token's time). Decided on the graph as
/// imported, so that the decode step and the prefill keep the same layout.
fn swapped_caches(g: &Graph, types: &HashMap<String, TensorType>, past: &[String]) -> R<Vec<bool>> {
    past.iter()
        .map(|name| {
            let present = appending_concat(g, name)?;
            let read = match repeat_of(g, types, &present) {
                Some([.., c]) => g.nodes[c].name.clone(),
                None => present,
            };
            let readers: Vec<&Node> = g.nodes.iter().filter(|n| reads(n, &read)).collect();
            Ok(!readers.is_empty() && readers.iter().all(|n| is_swap(n)))
        })
        .collect()
}

/// A cache repeated for grouped-query attention (transformers' `repeat_kv`): reshaped to
/// `[b, kv, 1, s, d]`, broadcast to `[b, kv, rep, s, d]` and reshaped to `[b, kv·rep, s,
/// d]`, each the only reader of the one before. The three nodes' indices.
fn repeat_of(g: &Graph, types: &HashMap<String, TensorType>, present: &str) -> Option<[usize; 3]> {
    let a = only_reader(g, present)?;
    let b = only_reader(g, &g.nodes[a].name)?;
    let c = only_reader(g, &g.nodes[b].name)?;
    let ops = [g.nodes[a].op, g.nodes[b].op, g.nodes[c].op] == [Op::Reshape, Op::BroadcastTo, Op::Reshape];
    let shape = |k: usize| types.get(&g.nodes[k].name).map(|t| t.shape.as_slice()).unwrap_or_default();
    let (p, sa, sb, sc) = (types.get(present)?.shape.as_slice(), shape(a), shape(b), shape(c));
    let fits = ops
        && p.len() == 4
        && sa == [p[0], p[1], 1, p[2], p[3]]
        && sb.len() == 5
        && sb[..2] == sa[..2]
        && sb[3..] == sa[3..]
        && sc == [p[0], p[1] * sb[2], p[2], p[3]];
    fits.then_some([a, b, c])
}

/// Grouped-query attention without the repeat: where a layer's keys and values are
/// repeated from `kv` heads to `kv·rep` (`repeat_of`) only to be read by one attention of
/// one query row per head (a decode step), the query's heads `[b, kv·rep, 1, d]` become
/// `rep` rows of each of the `kv` heads, `[b, kv, rep, d]`, which read the caches as they
/// are; the result is reshaped back. The scores of a query row are the same numbers either
/// way. The repeat copied both caches every step, and the keys' transpose a third time.
/// All or nothing: where any layer does not fit, or the graph would not verify, the graph
/// stays as it is.
fn group_queries(g: &mut Graph, types: &HashMap<String, TensorType>, past: &[String]) -> R<()> {
    let mut grouped = g.clone();
    for (key, value) in past.iter().filter_map(|k| Some((k, format!("{}.value", k.strip_suffix(".key")?)))) {
        if !past.contains(&value) {
            continue;
        }
        let (pk, pv) = (appending_concat(g, key)?, appending_concat(g, &value)?);
        if !group_layer(&mut grouped, types, &pk, &pv) {
            return Ok(());
        }
    }
    if meshc_ir::verify::verify(&grouped).is_ok() {
        *g = grouped;
    }
    Ok(())
}

/// `group_queries` for one layer, whose presents are `pk` and `pv`, on `g` (typed by
/// `types` before any layer was grouped); false where it does not fit.
fn group_layer(g: &mut Graph, types: &HashMap<String, TensorType>, pk: &str, pv: &str) -> bool {
    let (Some(rk), Some(rv)) = (repeat_of(g, types, pk), repeat_of(g, types, pv)) else { return false };
    let name = |k: usize| g.nodes[k].name.clone();
    let repeated_v = name(rv[2]);
    let Some(kt) = only_reader(g, &name(rk[2])).filter(|&k| is_swap(&g.nodes[k])) else { return false };
    let is_product_with = |k: &usize, b: &str| g.nodes[*k].op == Op::MatMul && g.nodes[*k].inputs[1] == b;
    let Some(m1) = only_reader(g, &name(kt)).filter(|k| is_product_with(k, &name(kt))) else { return false };
    let Some(m2) = only_reader(g, &repeated_v).filter(|k| is_product_with(k, &repeated_v)) else { return false };
    let q = g.nodes[m1].inputs[0].clone();
    let (kv, rep) = (types[pk].shape[1], types[&name(rk[1])].shape[2]);
    let Some(&[b, heads, 1, d]) = types.get(&q).map(|t| t.shape.as_slice()) else { return false };
    if heads != kv * rep {
        return false;
    }
    // The chain from the scores to the product with v, each the only reader of the one
    // before: its shapes change from [b, heads, 1, s] to [b, kv, rep, s].
    let mut chain = vec![m1];
    while chain[chain.len() - 1] != m2 {
        match only_reader(g, &name(chain[chain.len() - 1])) {
            Some(next) if !chain.contains(&next) => chain.push(next),
            _ => return false,
        }
    }
    let (m1_name, m2_name) = (name(m1), name(m2));
    let grouped_q = format!("{m1_name}.grouped_q");
    let mut reshape_q = Node::new(&grouped_q, Op::Reshape, &[&q]);
    reshape_q.attrs.insert("shape".into(), Attr::ints(&[b as i64, kv as i64, rep as i64, d as i64]));
    let grouped_out = format!("{m2_name}.grouped");
    let mut reshape_out = Node::new(&m2_name, Op::Reshape, &[&grouped_out]);
    reshape_out.attrs.insert("shape".into(), Attr::ints(&[b as i64, heads as i64, 1, d as i64]));
    reshape_out.dims = g.nodes[m2].dims.clone();
    let drop: Vec<String> = rk.iter().chain(&rv).map(|&k| name(k)).collect();
    for &k in &chain {
        g.nodes[k].shape = None;
        g.nodes[k].dims = None;
    }
    g.nodes[m1].inputs[0] = grouped_q;
    g.nodes[kt].inputs[0] = pk.to_string();
    g.nodes[m2].inputs[1] = pv.to_string();
    g.nodes[m2].name = grouped_out.clone();
    g.nodes.retain(|n| !drop.contains(&n.name));
    let at = g.nodes.iter().position(|n| n.name == m1_name).expect("m1 stays");
    g.nodes.insert(at, reshape_q);
    let at = g.nodes.iter().position(|n| n.name == grouped_out).expect("m2 stays");
    g.nodes.insert(at + 1, reshape_out);
    true
}

/// The one node reading the past input `name`: a concat of it and the step's keys along
/// axis 2 whose result is an output (the present). Its name, or one line saying what the
/// export does instead.
fn appending_concat(g: &Graph, name: &str) -> R<String> {
    let readers: Vec<usize> = (0..g.nodes.len()).filter(|&k| reads(&g.nodes[k], name)).collect();
    let k = match readers.as_slice() {
        [k] => *k,
        [] => return Err(format!("input '{name}' is read by no node: no cache to keep")),
        _ => {
            return Err(format!(
                "input '{name}' is read by '{}' besides '{}': only a past appended to by one concat becomes a cache",
                g.nodes[readers[1]].name, g.nodes[readers[0]].name
            ))
        }
    };
    let node = &g.nodes[k];
    let axis = node.attrs.get("axis").and_then(Attr::as_int);
    if node.op != Op::Concat || node.inputs.len() != 2 || node.inputs[0] != name || !matches!(axis, Some(2 | -2)) {
        return Err(format!(
            "input '{name}' is read by '{}' ({}), where a concat of it and the step's keys along axis 2 is expected",
            node.name, node.op
        ));
    }
    let present = node.name.clone();
    if !g.outputs.iter().any(|o| o.name == present) {
        return Err(format!("the concat '{present}' of input '{name}' is not an output: no present to keep"));
    }
    Ok(present)
}

/// Removes the input `name` and returns it; its uses stay, for nodes of its name to feed.
fn take_input(g: &mut Graph, name: &str) -> Option<Input> {
    let k = g.inputs.iter().position(|i| i.name == name)?;
    Some(g.inputs.remove(k))
}

/// Value `from` (an input, a node or an output) becomes `to`, with every use.
fn rename(g: &mut Graph, from: &str, to: &str) {
    let to = to.to_string();
    for i in g.inputs.iter_mut().filter(|i| i.name == from) {
        i.name = to.clone();
    }
    for n in &mut g.nodes {
        if n.name == from {
            n.name = to.clone();
        }
        for i in n.inputs.iter_mut().filter(|i| *i == from) {
            *i = to.clone();
        }
    }
    for o in g.outputs.iter_mut().filter(|o| o.name == from) {
        *o = Output::new(to.clone());
    }
}
