//! Symbolic shape inference over a verified graph: every tensor's shape as dim expressions,
//! and the checks a call's sizes must pass that the bounds do not already prove. The graph's
//! own sizes are the symbols' example values: they pick the meaning of the literal sizes in
//! reshape, broadcast_to and slice attributes (`[26, 384]` after `[batch, seq, 384]` at
//! batch 2, seq 13 is `[batch*seq, 384]`), and every inferred shape must evaluate to the
//! verifier's at them — a disagreement is reported, never guessed over.

use std::collections::HashMap;
use std::fmt;

use super::expr::{Binding, Expr};
use super::symbol::{Symbols, MAX_BOUND};
use crate::attrs;
use crate::graph::{Graph, Node};
use crate::infer::{group_size, norm_axes, norm_axis, parse_equation};
use crate::ops::Op;
use crate::verify::Info;

type R<T> = std::result::Result<T, String>;

/// A fact about the symbols a call must meet, and the node that needs it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Check {
    pub kind: CheckKind,
    pub node: String,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    Eq(Expr, Expr),
    /// The expression is a multiple of the constant.
    Divisible(Expr, i64),
    /// The expression is at least the constant.
    AtLeast(Expr, i64),
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckKind::Eq(a, b) => write!(f, "{a} == {b}"),
            CheckKind::Divisible(e, k) => write!(f, "{e} divisible by {k}"),
            CheckKind::AtLeast(e, k) => {
                // `batch - 3 >= 0` reads as `batch >= 3`, `5 - batch >= 1` as `batch <= 4`.
                let c = e.constant_term();
                let rest = e.sub(&Expr::constant(c));
                match rest.all_negative() {
                    true => write!(f, "{} <= {}", rest.scale(-1), c - k),
                    false => write!(f, "{rest} >= {}", k - c),
                }
            }
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (node '{}')", self.kind, self.node)
    }
}

impl CheckKind {
    /// Whether the check holds at `b` (`None`: a symbol is unbound).
    pub fn holds(&self, b: &Binding) -> Option<bool> {
        self.holds_with(&|s| b.get(s).copied())
    }

    /// `holds` with each symbol's value from `value`.
    pub fn holds_with(&self, value: &dyn Fn(&str) -> Option<i64>) -> Option<bool> {
        Some(match self {
            CheckKind::Eq(x, y) => x.eval_with(value)? == y.eval_with(value)?,
            CheckKind::Divisible(e, k) => e.eval_with(value)?.checked_rem(*k)? == 0,
            CheckKind::AtLeast(e, k) => e.eval_with(value)? >= *k,
        })
    }
}

/// An attribute whose literal sizes depend on the symbols: per entry, the expression that
/// replaces it at other sizes (`None` keeps the literal, e.g. a reshape's `-1`).
#[derive(Clone, Debug, PartialEq)]
pub struct SizeAttr {
    pub key: &'static str,
    pub entries: Vec<Option<Expr>>,
}

/// What symbolic inference learned about a graph.
#[derive(Clone, Debug)]
pub struct SymInfo {
    pub symbols: Symbols,
    /// The symbols' values in the graph as written.
    pub example: Binding,
    /// Every input, param and node's shape.
    pub shapes: HashMap<String, Vec<Expr>>,
    /// What a call must meet beyond the bounds, in graph order, without repeats.
    pub checks: Vec<Check>,
    /// The size attributes of the nodes whose literal sizes depend on the symbols.
    pub sizes: HashMap<String, Vec<SizeAttr>>,
}

impl SymInfo {
    /// The symbols' divisors and bounds as `Expr` wants them.
    fn bounds(&self) -> impl Fn(&str) -> (i64, i64) + '_ {
        |s| self.symbols.get(s).map_or((0, MAX_BOUND), |y| (y.lo, y.hi))
    }
}

struct Cx<'a> {
    info: &'a mut SymInfo,
    node: &'a Node,
}

impl Cx<'_> {
    fn example(&self, e: &Expr) -> R<i64> {
        e.eval(&self.info.example).ok_or_else(|| format!("{e} has no value at the graph's sizes"))
    }

    fn push(&mut self, kind: CheckKind) {
        if !self.info.checks.iter().any(|c| c.kind == kind) {
            self.info.checks.push(Check { kind, node: self.node.name.clone() });
        }
    }

    /// Records that `a` and `b` must be equal, unless they are the same expression; an
    /// equality no binding within the bounds meets is an error.
    fn eq(&mut self, a: &Expr, b: &Expr) -> R<()> {
        if a == b {
            return Ok(());
        }
        let (ra, rb) = {
            let bounds = self.info.bounds();
            (a.range(&bounds), b.range(&bounds))
        };
        if ra.1 < rb.0 || rb.1 < ra.0 {
            return Err(format!("needs {a} == {b}, which no size within the bounds meets"));
        }
        // The graph is valid at its own sizes: a need they do not meet is a reading that
        // cannot say what the graph does there (a dim of 1 stretched by broadcasting).
        let (ea, eb) = (self.example(a)?, self.example(b)?);
        if ea != eb {
            return Err(format!(
                "needs {a} == {b}, which the graph's own sizes do not meet ({ea} and {eb}: a dim of 1 broadcast against another size is read symbolically only when it is 1 at every size)"
            ));
        }
        // The side with symbols first: `seq == 8`.
        let (a, b) = if (a.is_const(), a) < (b.is_const(), b) { (a, b) } else { (b, a) };
        self.push(CheckKind::Eq(a.clone(), b.clone()));
        Ok(())
    }

    fn at_least(&mut self, e: &Expr, k: i64) -> R<()> {
        let (lo, hi) = e.range(&self.info.bounds());
        if lo >= k as i128 {
            return Ok(());
        }
        if hi < k as i128 {
            return Err(format!("needs {e} >= {k}, which no size within the bounds meets"));
        }
        self.push(CheckKind::AtLeast(e.clone(), k));
        Ok(())
    }

    fn divisible(&mut self, e: &Expr, k: i64) {
        let syms = &self.info.symbols;
        if !e.divisible_by(k, &|s| syms.get(s).map_or(1, |y| y.multiple_of)) {
            self.push(CheckKind::Divisible(e.clone(), k));
        }
    }

    /// numpy broadcasting of two dims: a symbol broadcasts against itself and a static 1;
    /// any other pair must be equal at run time (a symbol that is 1 on one call is not
    /// stretched: compiled code would have to branch on it).
    fn broadcast_dim(&mut self, a: &Expr, b: &Expr) -> R<Expr> {
        if a == b || b.as_const() == Some(1) {
            return Ok(a.clone());
        }
        if a.as_const() == Some(1) {
            return Ok(b.clone());
        }
        self.eq(a, b)?;
        Ok(if b.is_const() { b.clone() } else { a.clone() })
    }

    fn broadcast(&mut self, shapes: &[&[Expr]]) -> R<Vec<Expr>> {
        let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut out = vec![Expr::constant(1); rank];
        for s in shapes {
            for (i, d) in s.iter().enumerate() {
                let o = &mut out[rank - s.len() + i];
                *o = self.broadcast_dim(&o.clone(), d)?;
            }
        }
        Ok(out)
    }

    /// An operand applied to `out` in place (epilogues, attention's score steps): each of its
    /// dims is a static 1 or equal to the result's.
    fn fits(&mut self, operand: &[Expr], out: &[Expr]) -> R<()> {
        for (o, r) in operand.iter().rev().zip(out.iter().rev()) {
            if o.as_const() != Some(1) {
                self.eq(o, r)?;
            }
        }
        Ok(())
    }

    fn matmul(&mut self, a: &[Expr], b: &[Expr]) -> R<Vec<Expr>> {
        let one = Expr::constant(1);
        let pa: Vec<Expr> = if a.len() == 1 { vec![one.clone(), a[0].clone()] } else { a.to_vec() };
        let pb: Vec<Expr> = if b.len() == 1 { vec![b[0].clone(), one] } else { b.to_vec() };
        let (m, k) = (&pa[pa.len() - 2], &pa[pa.len() - 1]);
        let (k2, n) = (&pb[pb.len() - 2], &pb[pb.len() - 1]);
        self.eq(k, k2)?;
        let mut shape = self.broadcast(&[&pa[..pa.len() - 2], &pb[..pb.len() - 2]])?;
        if a.len() > 1 {
            shape.push(m.clone());
        }
        if b.len() > 1 {
            shape.push(n.clone());
        }
        Ok(shape)
    }

    fn size_attr(&mut self, key: &'static str, entries: Vec<Option<Expr>>) {
        if entries.iter().flatten().any(|e| !e.is_const()) {
            self.info.sizes.entry(self.node.name.clone()).or_default().push(SizeAttr { key, entries });
        }
    }
}

/// Infers every tensor's symbolic shape. `info` is the verifier's (at the graph's sizes);
/// each symbol names the input dims carrying its name.
pub fn infer_graph(g: &Graph, info: &Info, symbols: &Symbols) -> R<SymInfo> {
    let mut si = SymInfo {
        symbols: symbols.clone(),
        example: Binding::new(),
        shapes: HashMap::new(),
        checks: Vec::new(),
        sizes: HashMap::new(),
    };
    let mut seen_from: HashMap<String, String> = HashMap::new();
    for i in &g.inputs {
        let mut shape = Vec::new();
        for (k, &size) in i.ty.shape.iter().enumerate() {
            let name = i.dims.as_ref().and_then(|d| d[k].as_deref()).filter(|n| symbols.contains_key(*n));
            let Some(name) = name else {
                shape.push(Expr::constant(size as i64));
                continue;
            };
            match si.example.insert(name.to_string(), size as i64) {
                Some(prev) if prev != size as i64 => {
                    return Err(format!(
                        "input '{}': dim {k} ({name}) is {size}, but input '{}' has {name} = {prev}",
                        i.name, seen_from[name]
                    ))
                }
                _ => {
                    seen_from.insert(name.to_string(), i.name.clone());
                }
            }
            shape.push(Expr::sym(name));
        }
        si.shapes.insert(i.name.clone(), shape);
    }
    if let Some(s) = symbols.keys().find(|s| !si.example.contains_key(*s)) {
        let named = g.input_dim_names();
        return Err(format!("--dim {s}: no input has a dim named '{s}' (named input dims: {named})"));
    }
    for p in &g.params {
        si.shapes.insert(p.name.clone(), p.ty.shape.iter().map(|&d| Expr::constant(d as i64)).collect());
    }
    for &idx in &info.order {
        let n = &g.nodes[idx];
        let ops: Vec<Vec<Expr>> = n.inputs.iter().map(|i| si.shapes[i].clone()).collect();
        let want = &info.types[&n.name].shape;
        let shape = node_shape(&mut Cx { info: &mut si, node: n }, &ops, info, want)
            .map_err(|e| format!("node '{}' ({}): {e}", n.name, n.op))?;
        let at_example: Option<Vec<i64>> = shape.iter().map(|e| e.eval(&si.example)).collect();
        if at_example.as_deref() != Some(&want.iter().map(|&d| d as i64).collect::<Vec<_>>()[..]) {
            return Err(format!(
                "node '{}' ({}): symbolic shape {} does not give the graph's {:?} at its sizes (a meshc bug)",
                n.name,
                n.op,
                show(&shape),
                want
            ));
        }
        si.shapes.insert(n.name.clone(), shape);
    }
    Ok(si)
}

/// `[batch, seq, 384]`.
pub fn show(shape: &[Expr]) -> String {
    let d: Vec<String> = shape.iter().map(Expr::to_string).collect();
    format!("[{}]", d.join(", "))
}

fn consts(v: &[usize]) -> Vec<Expr> {
    v.iter().map(|&d| Expr::constant(d as i64)).collect()
}

fn node_shape(cx: &mut Cx, ops: &[Vec<Expr>], info: &Info, want: &[usize]) -> R<Vec<Expr>> {
    use Op::*;
    let node = cx.node;
    let x = || ops[0].clone();
    let example = |i: usize| -> &[usize] { &info.types[&node.inputs[i]].shape };
    match node.op {
        unary_ops!() | Softmax | CumSum | Send | AllReduce => Ok(x()),
        binary_ops!() | ternary_ops!() => {
            let refs: Vec<&[Expr]> = ops.iter().map(Vec::as_slice).collect();
            cx.broadcast(&refs)
        }
        MatMul => {
            let out = cx.matmul(&ops[0], &ops[1])?;
            for o in &ops[2..] {
                cx.fits(o, &out)?;
            }
            Ok(out)
        }
        Attention => {
            let scores = cx.matmul(&ops[0], &ops[1])?;
            for o in &ops[3..] {
                cx.fits(o, &scores)?;
            }
            cx.matmul(&scores, &ops[2])
        }
        Einsum => {
            let (terms, out) = parse_equation(&attrs::Einsum::try_of(node)?.equation, ops.len())?;
            let mut sizes: Vec<(char, Expr)> = Vec::new();
            for (t, o) in terms.iter().zip(ops) {
                for (&c, d) in t.iter().zip(o) {
                    match sizes.iter().find(|(l, _)| *l == c) {
                        Some((_, s)) => cx.eq(&s.clone(), d)?,
                        None => sizes.push((c, d.clone())),
                    }
                }
            }
            out.iter()
                .map(|c| sizes.iter().find(|(l, _)| l == c).map(|s| s.1.clone()).ok_or(format!("letter '{c}' unknown")))
                .collect()
        }
        ReduceSum | ReduceMean | ReduceMax => {
            let attrs::Reduce { axes, keepdims } = attrs::Reduce::try_of(node)?;
            let xs = x();
            let axes = match axes {
                Some(a) => norm_axes(&a, xs.len())?,
                None => (0..xs.len()).collect(),
            };
            if node.op == ReduceMax {
                for &a in &axes {
                    cx.at_least(&xs[a], 1)?;
                }
            }
            Ok(xs
                .into_iter()
                .enumerate()
                .filter_map(|(i, d)| match axes.contains(&i) {
                    false => Some(d),
                    true => keepdims.then(|| Expr::constant(1)),
                })
                .collect())
        }
        LayerNorm => {
            let xs = x();
            let axis = norm_axis(attrs::LayerNorm::try_of(node)?.axis, xs.len())?;
            for o in &ops[1..] {
                for (a, b) in o.iter().zip(&xs[axis..]) {
                    cx.eq(a, b)?;
                }
            }
            Ok(xs)
        }
        Reshape => reshape(cx, &ops[0], example(0), want),
        Transpose => {
            let xs = x();
            let perm = match attrs::Transpose::try_of(node)?.perm {
                Some(p) => norm_axes(&p, xs.len())?,
                None => (0..xs.len()).rev().collect(),
            };
            Ok(perm.iter().map(|&p| xs[p].clone()).collect())
        }
        BroadcastTo => broadcast_to(cx, &ops[0], want),
        BroadcastLike => cx.broadcast(&[&ops[0], &ops[1]]),
        Concat => {
            let first = &ops[0];
            let axis = norm_axis(attrs::Concat::try_of(node)?.axis, first.len())?;
            let mut out = first.clone();
            for o in &ops[1..] {
                for d in (0..first.len()).filter(|&d| d != axis) {
                    cx.eq(&first[d], &o[d])?;
                }
                out[axis] = out[axis].add(&o[axis]);
            }
            Ok(out)
        }
        Slice => slice(cx, &ops[0]),
        Gather => {
            let axis = norm_axis(attrs::Gather::try_of(node)?.axis, ops[0].len())?;
            let ds = &ops[0];
            nonempty_where_indexed(cx, &ds[axis], &ops[1])?;
            Ok([&ds[..axis], &ops[1][..], &ds[axis + 1..]].concat())
        }
        Iota => Ok(vec![ops[0][norm_axis(attrs::Iota::try_of(node)?.axis, ops[0].len())?].clone()]),
        ScatterElements => {
            let axis = norm_axis(attrs::ScatterElements::try_of(node)?.axis, ops[0].len())?;
            for (u, i) in ops[2].iter().zip(&ops[1]) {
                cx.eq(u, i)?;
            }
            for (d, (i, s)) in ops[1].iter().zip(&ops[0]).enumerate() {
                if d != axis && i != s {
                    cx.at_least(&s.sub(i), 0)?;
                }
            }
            nonempty_where_indexed(cx, &ops[0][axis], &ops[1])?;
            Ok(x())
        }
        DynamicSlice => {
            let attrs::DynamicSlice { axes, sizes } = attrs::DynamicSlice::try_of(node)?;
            let mut out = x();
            for (a, &size) in norm_axes(&axes, out.len())?.into_iter().zip(&sizes) {
                cx.at_least(&out[a].sub(&Expr::constant(size)), 0)?;
                out[a] = Expr::constant(size);
            }
            Ok(out)
        }
        DynamicUpdateSlice => {
            let axes = norm_axes(&attrs::DynamicUpdateSlice::try_of(node)?.axes, ops[0].len())?;
            for (d, (u, s)) in ops[1].iter().zip(&ops[0]).enumerate() {
                match axes.contains(&d) {
                    true => cx.at_least(&s.sub(u), 0)?,
                    false => cx.eq(u, s)?,
                }
            }
            Ok(x())
        }
        Recv => Ok(consts(want)),
        AllGather | ReduceScatter | AllToAll => {
            let n = group_size(node)? as i64;
            let mut out = x();
            let rank = out.len();
            let (split, gather) = match node.op {
                AllGather => (None, Some(attrs::AllGather::try_of(node)?.axis)),
                ReduceScatter => (Some(attrs::ReduceScatter::try_of(node)?.axis), None),
                _ => {
                    let a = attrs::AllToAll::try_of(node)?;
                    (Some(a.split_axis), Some(a.concat_axis))
                }
            };
            if let Some(s) = split {
                let s = norm_axis(s, rank)?;
                cx.divisible(&out[s], n);
                out[s] = out[s].floor_div(n);
            }
            if let Some(c) = gather {
                let c = norm_axis(c, rank)?;
                out[c] = out[c].scale(n);
            }
            Ok(out)
        }
        Pad => {
            let attrs::Pad { pads, mode, .. } = attrs::Pad::try_of(node)?;
            let xs = x();
            let r = xs.len();
            if pads.len() != 2 * r {
                return Err(format!("'pads' has {} entries, expected {}", pads.len(), 2 * r));
            }
            let mut out = Vec::new();
            for (d, e) in xs.iter().enumerate() {
                let o = e.add(&Expr::constant(pads[d] + pads[r + d]));
                if !o.is_const() {
                    cx.at_least(&o, 0)?;
                }
                // Reflect, edge and wrap copy the dim's elements into the padding: an empty
                // dim has none (`window::pad_shape`).
                if mode != attrs::PadMode::Constant && pads[d] + pads[r + d] > 0 && !e.is_const() {
                    cx.at_least(e, 1)?;
                }
                out.push(o);
            }
            Ok(out)
        }
        Conv | MaxPool | AvgPool => window(cx, ops, info),
    }
}

/// A window op's result: batch, channels (conv: the weight's out channels), then per spatial
/// dim `(in + pads - span) / stride + 1`.
/// A gather from (a scatter into) an axis of size `n` reads (writes) it at some index when
/// its `indices` are not empty, so `n` must then be at least 1. Where the indices may be
/// empty at some sizes no check is stated (a check that holds only when another size is
/// not 0 is not one a call can state); a kernel refuses an index out of range then.
fn nonempty_where_indexed(cx: &mut Cx, n: &Expr, indices: &[Expr]) -> R<()> {
    let (lo, _) = Expr::product(indices).range(&cx.info.bounds());
    if lo >= 1 {
        cx.at_least(n, 1)?;
    }
    Ok(())
}

fn window(cx: &mut Cx, ops: &[Vec<Expr>], info: &Info) -> R<Vec<Expr>> {
    let node = cx.node;
    let xs = &ops[0];
    let (win, channels) = if node.op == Op::Conv {
        let xe = &info.types[&node.inputs[0]].shape;
        let we = &info.types[&node.inputs[1]].shape;
        let (win, groups) = crate::window::conv_window(node, xe, we)?;
        let w = &ops[1];
        cx.eq(&xs[1], &w[1].scale(groups as i64))?;
        if let Some(b) = ops.get(2) {
            cx.eq(&b[0], &w[0])?;
        }
        (win, w[0].clone())
    } else {
        (crate::window::Window::of(node, xs.len() - 2, None)?, xs[1].clone())
    };
    let mut out = vec![xs[0].clone(), channels];
    // Each static spatial dim by its own window (kernel, stride, pads and dilation of that
    // dim): `out_sizes` takes every spatial dim at once.
    let examples = xs[2..].iter().map(|e| cx.example(e).map(|v| v as usize)).collect::<R<Vec<usize>>>()?;
    let static_out = win.out_sizes(&examples)?;
    for (d, e) in xs[2..].iter().enumerate() {
        if e.is_const() {
            out.push(Expr::constant(static_out[d] as i64));
            continue;
        }
        if win.ceil_mode {
            return Err(format!("ceil_mode over the symbolic spatial dim {e} is not supported yet"));
        }
        let span = ((win.kernel[d] - 1) * win.dilations[d] + 1) as i64;
        let room = e.add(&Expr::constant((win.begin[d] + win.end[d]) as i64 - span));
        cx.at_least(&room, 0)?;
        out.push(room.floor_div(win.strides[d] as i64).add(&Expr::constant(1)));
    }
    Ok(out)
}

/// `broadcast_to`: a target size equal to a symbolic operand dim's example is that dim.
fn broadcast_to(cx: &mut Cx, xs: &[Expr], want: &[usize]) -> R<Vec<Expr>> {
    let off = want.len() - xs.len();
    let mut out = consts(want);
    for (j, d) in xs.iter().enumerate() {
        if d.is_const() {
            continue;
        }
        if cx.example(d)? == want[off + j] as i64 {
            out[off + j] = d.clone();
        } else {
            // Stretched from 1 at the example: the symbol must stay 1.
            cx.eq(d, &Expr::constant(1))?;
        }
    }
    cx.size_attr("shape", out.iter().cloned().map(Some).collect());
    Ok(out)
}

/// The factors of a product of dims: each dim's atoms (a sum is one factor) and the
/// product of their constant coefficients.
fn factors(dims: &[Expr]) -> (i64, Vec<Expr>) {
    let mut c = 1i64;
    let mut out = Vec::new();
    for d in dims {
        match d.as_monomial() {
            Some((k, atoms)) => {
                c = c.saturating_mul(k);
                out.extend(atoms.into_iter().map(Expr::of_atom));
            }
            None => out.push(d.clone()),
        }
    }
    (c, out)
}

/// `reshape`: the operand's dims and the target's are grouped into runs of equal size (at
/// the example), so a symbolic dim only ever goes where its run goes. A run of one target
/// dim is the product of its operand dims; a run that splits a product takes, for each
/// target size, the symbolic factors whose example product it is (one way only, or the
/// reshape is ambiguous), and the target's `-1` takes what is left.
fn reshape(cx: &mut Cx, xs: &[Expr], xe: &[usize], want: &[usize]) -> R<Vec<Expr>> {
    let target = attrs::Shape::try_of(cx.node)?.shape;
    if xs.iter().all(Expr::is_const) {
        return Ok(consts(want));
    }
    if xe.contains(&0) || want.contains(&0) {
        return Err("a reshape of symbolic dims with a size-0 dim is not supported".into());
    }
    for (k, d) in xs.iter().enumerate() {
        if !d.is_const() && xe[k] == 1 {
            return Err(format!(
                "operand dim {k} ({d}) is 1 in the graph, so its place in the reshape is ambiguous; write the graph at a size above 1"
            ));
        }
    }
    let mut out: Vec<Expr> = consts(want);
    let xi: Vec<usize> = (0..xs.len()).filter(|&k| xe[k] != 1).collect();
    let oi: Vec<usize> = (0..want.len()).filter(|&k| want[k] != 1).collect();
    let (mut i, mut j) = (0, 0);
    while i < xi.len() || j < oi.len() {
        let (mut gx, mut go) = (Vec::new(), Vec::new());
        let (mut px, mut po) = (1u128, 1u128);
        loop {
            if (gx.is_empty() || px < po) && i < xi.len() {
                px *= xe[xi[i]] as u128;
                gx.push(xi[i]);
                i += 1;
            } else if (go.is_empty() || po < px) && j < oi.len() {
                po *= want[oi[j]] as u128;
                go.push(oi[j]);
                j += 1;
            } else {
                break;
            }
            if px == po && !gx.is_empty() && !go.is_empty() {
                break;
            }
        }
        if px != po {
            return Err("the operand and target sizes do not group into runs of equal size".into());
        }
        let dims: Vec<Expr> = gx.iter().map(|&k| xs[k].clone()).collect();
        if dims.iter().all(Expr::is_const) {
            continue;
        }
        let whole = Expr::product(&dims);
        if let [o] = go[..] {
            out[o] = whole;
            continue;
        }
        let (mut c, mut left) = factors(&dims);
        let mut const_part = 1i64;
        let mut rest_at = None;
        let divide = !go.iter().any(|&o| target[o] == -1);
        for &o in &go {
            if target[o] == -1 {
                rest_at = Some(o);
                continue;
            }
            match pick(cx, &mut left, &mut c, want[o] as i64, divide)? {
                Some(e) => out[o] = e,
                None => const_part *= want[o] as i64,
            }
        }
        let rest = Expr::product(&left).scale(c);
        match rest_at {
            Some(o) => {
                cx.divisible(&rest, const_part);
                out[o] = rest.floor_div(const_part);
            }
            // Every factor and all of the constant went to some target size: the sizes
            // multiply back to the operand's by construction (divisions checked exact).
            None if left.is_empty() && const_part == 1 && c == 1 => {}
            None if left.is_empty() && const_part == 1 => {
                let got = Expr::product(go.iter().map(|&o| &out[o]));
                cx.eq(&got, &whole)?;
            }
            None => {
                return Err(format!(
                "the target {target:?} splits {whole} into sizes no symbol matches; write -1 for the part that varies"
            ))
            }
        }
    }
    let entries = target.iter().zip(&out).map(|(&t, e)| (t != -1).then(|| e.clone())).collect();
    cx.size_attr("shape", entries);
    Ok(out)
}

/// The size-`size` part of a split product, taken out of its factors `left` and constant
/// `c`: a product of symbolic factors whose example is `size`, or that times a part of `c`,
/// or that divided by a constant (which `c` then gains, and a check makes exact), or a part
/// of `c` alone, in that order of preference, the smallest constant first; two different
/// best answers are ambiguous. `None`: nothing fits (the `-1` then divides what is left).
/// With a `-1` in the run, the symbols are that part's and no other size divides them
/// (`[s] → [-1, 8]` is `[s/8, 8]`, not `[2, s/2]`): `divide` is false.
fn pick(cx: &mut Cx, left: &mut Vec<Expr>, c: &mut i64, size: i64, divide: bool) -> R<Option<Expr>> {
    let ex: Vec<i64> = left.iter().map(|e| cx.example(e)).collect::<R<_>>()?;
    let n = left.len().min(12);
    // (preference, constant), the expression, the factors it takes, the divisor.
    let mut found: Option<((u8, i64), Expr, usize, i64)> = None;
    for mask in 0usize..(1 << n) {
        let bits = (0..n).filter(|b| mask >> b & 1 == 1);
        let Some(p) = bits.clone().try_fold(1i64, |p, b| p.checked_mul(ex[b])) else { continue };
        let prod = Expr::product(bits.map(|b| &left[b]));
        let (key, e, div) = if p != 0 && size % p == 0 && *c % (size / p) == 0 {
            ((if mask == 0 { 2 } else { 0 }, size / p), prod.scale(size / p), 1)
        } else if divide && mask != 0 && size != 0 && p % size == 0 {
            ((1, p / size), prod.floor_div(p / size), p / size)
        } else {
            continue;
        };
        match &found {
            Some((k, fe, _, _)) if *k == key && *fe != e => {
                return Err(format!(
                    "target size {size} is both {fe} and {e} at the graph's sizes; give the symbols sizes in the graph that differ from each other and from the static dims"
                ))
            }
            Some((k, _, _, _)) if *k <= key => {}
            _ => found = Some((key, e, mask, div)),
        }
    }
    let Some(((_, k), e, mask, div)) = found else { return Ok(None) };
    if div > 1 {
        let taken = Expr::product((0..n).filter(|b| mask >> b & 1 == 1).map(|b| &left[b]));
        cx.divisible(&taken, div);
        *c *= div;
    } else {
        *c /= k;
    }
    let mut i = 0;
    left.retain(|_| {
        i += 1;
        mask >> (i - 1) & 1 == 0
    });
    Ok(Some(e))
}

/// `slice` along a symbolic dim `n`: a literal start or end at or past the example's end is
/// the end (`n`, rewritten at other sizes); one inside it is that index (checked to stay
/// inside); a negative one counts from `n`.
fn slice(cx: &mut Cx, xs: &[Expr]) -> R<Vec<Expr>> {
    let a = attrs::Slice::try_of(cx.node)?;
    let axes = norm_axes(&a.axes_or_leading(), xs.len())?;
    let steps = a.steps_or_ones();
    let mut out = xs.to_vec();
    let (mut starts, mut ends) = (vec![None; axes.len()], vec![None; axes.len()]);
    for (k, &ax) in axes.iter().enumerate() {
        let n = &xs[ax];
        if n.is_const() {
            let (_, len) =
                crate::infer::slice_range(a.starts[k], a.ends[k], steps[k], n.as_const().expect("const") as usize)?;
            out[ax] = Expr::constant(len as i64);
            continue;
        }
        let ne = cx.example(n)?;
        let step = steps[k];
        let (start, s_attr) = position(cx, n, ne, a.starts[k], step)?;
        let (end, e_attr) = position(cx, n, ne, a.ends[k], step)?;
        starts[k] = s_attr;
        ends[k] = e_attr;
        let span = if step > 0 { end.sub(&start) } else { start.sub(&end) };
        // Empty at the graph's sizes, its length there is 0, not the span: the length is
        // `max(0, span)`, which no expression says.
        if cx.example(&span)? < 0 {
            return Err(format!(
                "it is empty along dim {ax} ({n}) at the graph's sizes, and an empty slice of a symbolic dim is not read symbolically: give {n} a value"
            ));
        }
        cx.at_least(&span, 0)?;
        let s = step.unsigned_abs() as i64;
        out[ax] = span.add(&Expr::constant(s - 1)).floor_div(s);
    }
    cx.size_attr("starts", starts);
    cx.size_attr("ends", ends);
    Ok(out)
}

/// Where a literal slice bound `v` lands on a symbolic dim `n` (example `ne`), clamped as
/// Python clamps (`[0, n]` going forward, `[-1, n-1]` going back), and the expression that
/// replaces the literal at other sizes when it names the end.
fn position(cx: &mut Cx, n: &Expr, ne: i64, v: i64, step: i64) -> R<(Expr, Option<Expr>)> {
    let back = step < 0;
    let last = if back { n.sub(&Expr::constant(1)) } else { n.clone() };
    if v >= ne {
        return Ok((last, Some(n.clone())));
    }
    if v >= 0 {
        // An index inside the dim at every size: n > v going back (a valid index), n >= v forward.
        cx.at_least(&n.sub(&Expr::constant(v)), i64::from(back))?;
        return Ok((Expr::constant(v), None));
    }
    if v + ne >= 0 {
        cx.at_least(&n.add(&Expr::constant(v)), 0)?;
        return Ok((n.add(&Expr::constant(v)), None));
    }
    // Before the start at every size: clamped to the first position.
    cx.at_least(&Expr::constant(-v).sub(n), 1)?;
    Ok((Expr::constant(if back { -1 } else { 0 }), None))
}
