//! The `grad` transform against central finite differences on the interpreter, one op at
//! a time over random shapes and attributes (a property test), plus its refusals.
//!
//! The interpreter has no f64 dtype (it rounds to f32 after every op), so the differences
//! are taken in f32 with a step of 5e-3 on values at least 0.025 away from every kink
//! (relu, abs, maximum/minimum, reduce_max), and compared with |analytic - numeric| <=
//! 2e-3 + 2e-2·|numeric|; the loss Σ y·r is summed in f64 from the f32 `y`
//! (`loss_of`). The rounding noise of a loss of a few units is ~1e-6, i.e.
//! ~1e-4 in the quotient (a few times that after Richardson extrapolation of the steps h
//! and h/2, which cancels the h²f'''/6 truncation term a strongly curved loss makes
//! large): a missing term, a wrong factor or a wrong sign is off by far more than the
//! tolerance.
//!
//! Each case's graph is `y = OP(operands)`, `loss = reduce_sum(y * r)` with a random `r`,
//! so every element of the gradient of y is weighted differently.

use std::collections::HashMap;
use std::path::Path;

use meshc_ir::grad::{grad, select_wrt};
use meshc_ir::window::{Tap, Window};
use meshc_ir::{interp, params, verify, Attr, DType, Graph, Input, Node, Op, Output, Tensor, TensorType};
use proptest::prelude::*;

/// xorshift64*: the cases' values come from a proptest-chosen seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn shape(&mut self, rank: usize) -> Vec<usize> {
        (0..rank).map(|_| 1 + self.below(3)).collect()
    }
    /// A shape of rank `min_rank` to `min_rank + spread - 1`.
    fn any_shape(&mut self, min_rank: usize, spread: usize) -> Vec<usize> {
        let rank = min_rank + self.below(spread);
        self.shape(rank)
    }
    /// Distinct magnitudes 0.25 + 0.05·k (+ `offset`), random signs unless `positive`:
    /// any two values of one tensor are ≥ 0.05 apart, of tensors with offsets differing by
    /// 0.025 at least 0.025.
    fn values(&mut self, n: usize, offset: f64, positive: bool) -> Vec<f32> {
        let mut perm: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            perm.swap(i, self.below(i + 1));
        }
        perm.iter()
            .map(|&k| {
                let sign = if positive || self.next() & 1 == 0 { 1.0 } else { -1.0 };
                (sign * (0.25 + 0.05 * k as f64 + offset)) as f32
            })
            .collect()
    }
}

/// One case: a graph computing `y`, its input values, and the inputs to differentiate.
struct Case {
    inputs: Vec<(String, Tensor)>,
    nodes: Vec<Node>,
    wrt: Vec<String>,
}

impl Case {
    fn new() -> Case {
        Case { inputs: Vec::new(), nodes: Vec::new(), wrt: Vec::new() }
    }
    fn input(&mut self, name: &str, t: Tensor, diff: bool) -> String {
        self.inputs.push((name.to_string(), t));
        if diff {
            self.wrt.push(name.to_string());
        }
        name.to_string()
    }
    fn float(&mut self, rng: &mut Rng, name: &str, shape: Vec<usize>, offset: f64, positive: bool) -> String {
        let n = shape.iter().product();
        let t = Tensor::f32(shape, rng.values(n, offset, positive));
        self.input(name, t, true)
    }
    fn node(&mut self, n: Node) {
        self.nodes.push(n);
    }

    /// The graph with `loss = reduce_sum(y * r)` appended.
    fn graph(&self, rng: &mut Rng) -> (Graph, HashMap<String, Tensor>) {
        let mut g = Graph { name: "case".into(), ..Default::default() };
        let mut values: HashMap<String, Tensor> = self.inputs.iter().cloned().collect();
        for (name, t) in &self.inputs {
            g.inputs.push(Input { name: name.clone(), ty: t.ty(), dims: None, loc: None });
        }
        g.nodes.clone_from(&self.nodes);
        let info = verify::verify(&Graph { outputs: vec![Output::new("y")], ..g.clone() }).expect("case verifies");
        let y_ty = &info.types["y"];
        let r = Tensor::f32(y_ty.shape.clone(), (0..y_ty.numel()).map(|_| (rng.unit() * 2.0 - 1.0) as f32).collect());
        g.inputs.push(Input { name: "r".into(), ty: r.ty(), dims: None, loc: None });
        values.insert("r".into(), r);
        g.nodes.push(Node::new("yr", Op::Mul, &["y", "r"]));
        g.nodes.push(Node::new("loss", Op::ReduceSum, &["yr"]));
        g.outputs.push(Output::new("loss"));
        (g, values)
    }
}

/// The loss Σ y·r, summed in f64 from the interpreter's `y`: the graph's own f32
/// `reduce_sum` rounds a loss of tens of units by a few 1e-6, which the differences divide
/// by the step into errors as large as the tolerance (a 2-group dilated conv's gradient,
/// exact to 1e-7 against numpy in f64, was off by 3e-3 that way).
fn loss_of(g: &Graph, info: &verify::Info, values: &HashMap<String, Tensor>) -> f64 {
    let forward = Graph { outputs: vec![Output::new("y")], ..g.clone() };
    let out = interp::run(&forward, &info.order, &info.types, values.clone()).expect("forward runs");
    out["y"].data.to_f64().iter().zip(values["r"].data.to_f64()).map(|(y, r)| y * r).sum()
}

/// Checks every gradient element of `case` against central differences.
fn check(case: &Case, rng: &mut Rng) -> Result<(), TestCaseError> {
    let (g, values) = case.graph(rng);
    let info = verify::verify(&g).expect("forward verifies");
    let wrt = select_wrt(&g, &case.wrt).expect("wrt selects");
    let gg = grad(&g, &info, "loss", &wrt).expect("grad builds");
    let ginfo = verify::verify(&gg).unwrap_or_else(|e| panic!("gradient graph verifies: {e}"));
    let mut all = values.clone();
    all.extend(params::load_all(&gg, Path::new(".")).expect("constants load"));
    let grads = interp::run(&gg, &ginfo.order, &ginfo.types, all).expect("gradient graph runs");
    const H: f32 = 5e-3;
    for w in &wrt {
        let analytic = grads[&format!("grad.{w}")].data.to_f64();
        let base = values[w].clone();
        let n = base.numel();
        prop_assert_eq!(analytic.len(), n);
        for (i, &want) in analytic.iter().enumerate() {
            let x = base.as_f32().expect("wrt inputs are f32")[i];
            let at = |v: f32| {
                let mut vals = values.clone();
                let mut t = base.as_f32().expect("f32").to_vec();
                t[i] = v;
                vals.insert(w.clone(), Tensor::f32(base.shape.clone(), t));
                loss_of(&g, &info, &vals)
            };
            let central = |h: f32| {
                let (hi, lo) = (x + h, x - h);
                (at(hi) - at(lo)) / (hi as f64 - lo as f64)
            };
            // Richardson extrapolation of steps h and h/2 cancels the h² term, which a
            // strongly curved loss (a layer norm over 3 elements of small variance) made
            // larger than the tolerance.
            let numeric = (4.0 * central(H / 2.0) - central(H)) / 3.0;
            prop_assert!(
                (want - numeric).abs() <= 2e-3 + 2e-2 * numeric.abs(),
                "d loss / d {}[{}]: grad gives {}, finite differences {}\n{}",
                w,
                i,
                want,
                numeric,
                meshc_ir::text::print(&gg)
            );
        }
    }
    Ok(())
}

fn ints(v: &[i64]) -> Attr {
    Attr::ints(v)
}

/// A shape `b` broadcasts against `a` with: some dims set to 1, some leading dims dropped.
fn broadcastable(rng: &mut Rng, a: &[usize]) -> Vec<usize> {
    let drop = rng.below(a.len() + 1);
    a[drop..].iter().map(|&d| if rng.below(3) == 0 { 1 } else { d }).collect()
}

const BINARY: &[Op] = &[Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Maximum, Op::Minimum, Op::Pow];
const UNARY: &[Op] = &[
    Op::Neg,
    Op::Abs,
    Op::Exp,
    Op::Log,
    Op::Sqrt,
    Op::Rsqrt,
    Op::Tanh,
    Op::Erf,
    Op::Erfc,
    Op::Sin,
    Op::Cos,
    Op::Sigmoid,
    Op::Relu,
    Op::Gelu,
];

fn elementwise_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let shape = rng.any_shape(0, 4);
    if rng.below(2) == 0 {
        let op = UNARY[rng.below(UNARY.len())];
        let positive = matches!(op, Op::Log | Op::Sqrt | Op::Rsqrt);
        let x = c.float(rng, "x", shape, 0.0, positive);
        let mut n = Node::new("y", op, &[&x]);
        if op == Op::Gelu {
            n = n.with_attr("approximate", Attr::Str(["none", "tanh"][rng.below(2)].into()));
        }
        c.node(n);
    } else {
        let op = BINARY[rng.below(BINARY.len())];
        let (sa, sb) = if rng.below(2) == 0 {
            let b = broadcastable(rng, &shape);
            (shape, b)
        } else {
            (broadcastable(rng, &shape), shape)
        };
        let a = c.float(rng, "a", sa, 0.0, op == Op::Pow);
        let b = c.float(rng, "b", sb, 0.025, false);
        c.node(Node::new("y", op, &[&a, &b]));
    }
    c
}

fn where_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let shape = rng.any_shape(1, 3);
    let cs = broadcastable(rng, &shape);
    let n = cs.iter().product();
    let cond = Tensor::new(cs, meshc_ir::Data::Bool((0..n).map(|_| rng.below(2) == 0).collect()));
    c.input("c", cond, false);
    let bs = broadcastable(rng, &shape);
    c.float(rng, "a", shape, 0.0, false);
    c.float(rng, "b", bs, 0.0, false);
    c.node(Node::new("y", Op::Where, &["c", "a", "b"]));
    c
}

/// floor, ceil or round of `a` times `b`, plus a where whose condition compares `a` with
/// a threshold (negated or not): the rounding and the comparison pass no gradient, the
/// chosen branch and the product the rest. `a` stays 0.1 from every jump (integers and
/// halves) and 0.05 from the threshold.
fn piecewise_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let shape = rng.any_shape(1, 3);
    let n: usize = shape.iter().product();
    let a: Vec<f32> = (0..n)
        .map(|_| {
            let frac = 0.1 + 0.3 * rng.unit() + if rng.below(2) == 0 { 0.0 } else { 0.5 };
            (rng.below(5) as f64 - 2.0 + frac) as f32
        })
        .collect();
    let t: Vec<f32> = a.iter().map(|&x| x + if rng.below(2) == 0 { 0.05 } else { -0.05 }).collect();
    c.input("a", Tensor::f32(shape.clone(), a), true);
    c.input("t", Tensor::f32(shape.clone(), t), false);
    c.float(rng, "b", shape, 0.0, false);
    let round = [Op::Floor, Op::Ceil, Op::Round][rng.below(3)];
    let cmp = [Op::Greater, Op::GreaterEqual, Op::Less, Op::LessEqual, Op::Equal][rng.below(5)];
    c.node(Node::new("f", round, &["a"]));
    c.node(Node::new("fb", Op::Mul, &["f", "b"]));
    c.node(Node::new("k", cmp, &["a", "t"]));
    let cond = if rng.below(2) == 0 {
        c.node(Node::new("nk", Op::Not, &["k"]));
        "nk"
    } else {
        "k"
    };
    c.node(Node::new("w", Op::Where, &[cond, "a", "b"]));
    c.node(Node::new("y", Op::Add, &["fb", "w"]));
    c
}

/// pad in any mode, each side padded by up to 2 or cropped by 1 (keeping a dim): reflect
/// and wrap may pad by more than the dim has, reading some elements several times.
fn pad_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let shape = rng.any_shape(1, 3);
    let rank = shape.len();
    let mut pads = vec![0i64; 2 * rank];
    for d in 0..rank {
        for side in [d, d + rank] {
            let crop = shape[d] as i64 + pads[d] + pads[d + rank] > 1 && rng.below(3) == 0;
            pads[side] = if crop { -1 } else { rng.below(3) as i64 };
        }
    }
    let x = c.float(rng, "x", shape, 0.0, false);
    let mode = ["constant", "reflect", "edge", "wrap"][rng.below(4)];
    let mut n = Node::new("y", Op::Pad, &[&x]).with_attr("pads", ints(&pads)).with_attr("mode", Attr::Str(mode.into()));
    if mode == "constant" {
        n = n.with_attr("value", Attr::Float(0.5));
    }
    c.node(n);
    c
}

/// Window attributes over `spatial` dims of sizes up to 4: kernels up to 3, strides and
/// dilations up to 2, pads up to 2 (below the window's span, so every window reads a
/// real element), sizes grown until the window fits.
fn window_attrs(rng: &mut Rng, spatial: usize) -> (Vec<usize>, Vec<usize>, Vec<(&'static str, Attr)>) {
    let kernel: Vec<usize> = (0..spatial).map(|_| 1 + rng.below(3)).collect();
    let strides: Vec<i64> = (0..spatial).map(|_| 1 + rng.below(2) as i64).collect();
    let dilations: Vec<i64> = (0..spatial).map(|_| 1 + rng.below(2) as i64).collect();
    let span = |d: usize| (kernel[d] - 1) * dilations[d] as usize + 1;
    let mut pads = vec![0i64; 2 * spatial];
    for d in 0..spatial {
        for side in [d, d + spatial] {
            pads[side] = rng.below(3.min(span(d))) as i64;
        }
    }
    let sizes: Vec<usize> = (0..spatial)
        .map(|d| (1 + rng.below(4)).max(span(d).saturating_sub((pads[d] + pads[d + spatial]) as usize)))
        .collect();
    let attrs = vec![("strides", ints(&strides)), ("dilations", ints(&dilations)), ("pads", ints(&pads))];
    (kernel, sizes, attrs)
}

/// conv, 1-D or 2-D, with or without a bias: plain, grouped (2 groups) or depthwise (as
/// many groups as channels, each with one or two output channels).
fn conv_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let spatial = 1 + rng.below(2);
    let (kernel, sizes, attrs) = window_attrs(rng, spatial);
    let (groups, channels, outs) = match rng.below(3) {
        0 => (1, 1 + rng.below(2), 1 + rng.below(2)),
        1 => (2, 2 * (1 + rng.below(2)), 2 * (1 + rng.below(2))),
        _ => {
            let ch = 1 + rng.below(3);
            (ch, ch, ch * (1 + rng.below(2)))
        }
    };
    let batch = 1 + rng.below(2);
    let x = c.float(rng, "x", [vec![batch, channels], sizes].concat(), 0.0, false);
    let w = c.float(rng, "w", [vec![outs, channels / groups], kernel].concat(), 0.025, false);
    let mut inputs = vec![x, w];
    if rng.below(2) == 0 {
        inputs.push(c.float(rng, "b", vec![outs], 0.0, false));
    }
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let mut n = Node::new("y", Op::Conv, &refs).with_attr("groups", Attr::Int(groups as i64));
    for (k, v) in attrs {
        n = n.with_attr(k, v);
    }
    c.node(n);
    c
}

/// max_pool or avg_pool, 1-D or 2-D, ceil_mode either way, avg_pool counting pads or
/// not. The values are 0.05 apart, so a step of 5e-3 never changes which one is the max.
/// Windows on padding alone (their result NaN) are drawn again.
fn pool_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let spatial = 1 + rng.below(2);
    let op = [Op::MaxPool, Op::AvgPool][rng.below(2)];
    let (n, sizes) = loop {
        let (kernel, sizes, attrs) = window_attrs(rng, spatial);
        let kernel: Vec<i64> = kernel.iter().map(|&k| k as i64).collect();
        let mut n = Node::new("y", op, &["x"]).with_attr("kernel", ints(&kernel));
        for (k, v) in attrs {
            n = n.with_attr(k, v);
        }
        n = n.with_attr("ceil_mode", Attr::Bool(rng.below(2) == 0));
        if op == Op::AvgPool {
            n = n.with_attr("count_include_pad", Attr::Bool(rng.below(2) == 0));
        }
        let win = Window::of(&n, spatial, None).expect("a valid window");
        let out = win.out_sizes(&sizes).expect("the window fits");
        let taps = win.taps(&sizes, &out).expect("a small table");
        if taps.chunks(kernel.iter().product::<i64>() as usize).all(|w| w.iter().any(|t| matches!(t, Tap::Real(_)))) {
            break (n, sizes);
        }
    };
    let shape = [vec![1 + rng.below(2), 1 + rng.below(2)], sizes].concat();
    c.float(rng, "x", shape, 0.0, false);
    c.node(n);
    c
}

fn contraction_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let (m, k, n) = (1 + rng.below(3), 1 + rng.below(3), 1 + rng.below(3));
    match rng.below(6) {
        0 => {
            c.float(rng, "a", vec![m, k], 0.0, false);
            c.float(rng, "b", vec![k, n], 0.0, false);
        }
        1 => {
            c.float(rng, "a", vec![k], 0.0, false);
            c.float(rng, "b", vec![2, k, n], 0.0, false);
        }
        2 => {
            c.float(rng, "a", vec![2, 1, m, k], 0.0, false);
            c.float(rng, "b", vec![k], 0.0, false);
        }
        3 => {
            c.float(rng, "a", vec![3, m, k], 0.0, false);
            c.float(rng, "b", vec![k, n], 0.0, false);
        }
        4 => {
            c.float(rng, "a", vec![k], 0.0, false);
            c.float(rng, "b", vec![k], 0.0, false);
        }
        _ => {
            // Einsums: plain, batched, a letter only one operand has, three operands.
            let (eq, shapes): (&str, Vec<Vec<usize>>) = match rng.below(4) {
                0 => ("ij,jk->ki", vec![vec![m, k], vec![k, n]]),
                1 => ("bij,bkj->bik", vec![vec![2, m, k], vec![2, n, k]]),
                2 => ("ij,k->kj", vec![vec![m, k], vec![n]]),
                _ => ("ab,bc,cd->ad", vec![vec![m, k], vec![k, n], vec![n, 2]]),
            };
            let names: Vec<String> =
                shapes.into_iter().enumerate().map(|(i, s)| c.float(rng, &format!("e{i}"), s, 0.0, false)).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            c.node(Node::new("y", Op::Einsum, &refs).with_attr("equation", Attr::Str(eq.into())));
            return c;
        }
    }
    c.node(Node::new("y", Op::MatMul, &["a", "b"]));
    c
}

fn reduction_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let rank = 1 + rng.below(3);
    let shape = rng.shape(rank);
    let x = c.float(rng, "x", shape, 0.0, false);
    let op = [Op::ReduceSum, Op::ReduceMean, Op::ReduceMax, Op::Softmax, Op::LayerNorm][rng.below(5)];
    let axis = rng.below(rank) as i64 - if rng.below(2) == 0 { rank as i64 } else { 0 };
    let node = match op {
        Op::Softmax => Node::new("y", op, &[&x]).with_attr("axis", Attr::Int(axis)),
        Op::LayerNorm => {
            let shape = c.inputs[0].1.shape.clone();
            let norm = shape[(axis + if axis < 0 { rank as i64 } else { 0 }) as usize..].to_vec();
            let gm = c.float(rng, "gamma", norm.clone(), 0.0, false);
            let bt = c.float(rng, "beta", norm, 0.0, false);
            Node::new("y", op, &[&x, &gm, &bt]).with_attr("axis", Attr::Int(axis)).with_attr("eps", Attr::Float(1e-3))
        }
        _ => {
            let mut n = Node::new("y", op, &[&x]).with_attr("keepdims", Attr::Bool(rng.below(2) == 0));
            if rng.below(4) != 0 {
                let axes: Vec<i64> = (0..rank as i64).filter(|_| rng.below(2) == 0).collect();
                n = n.with_attr("axes", ints(&axes));
            }
            n
        }
    };
    c.node(node);
    c
}

fn movement_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let rank = 1 + rng.below(3);
    let shape = rng.shape(rank);
    let numel: usize = shape.iter().product();
    let x = c.float(rng, "x", shape.clone(), 0.0, false);
    let node = match rng.below(8) {
        0 => Node::new("y", Op::Reshape, &[&x]).with_attr("shape", ints(&[numel as i64, 1])),
        1 => {
            let mut perm: Vec<i64> = (0..rank as i64).collect();
            for i in (1..rank).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            Node::new("y", Op::Transpose, &[&x]).with_attr("perm", ints(&perm))
        }
        2 => {
            let mut to: Vec<i64> = vec![2];
            to.extend(shape.iter().map(|&d| d as i64));
            Node::new("y", Op::BroadcastTo, &[&x]).with_attr("shape", ints(&to))
        }
        3 => {
            let axis = rng.below(rank);
            let mut s2 = shape.clone();
            s2[axis] = 1 + rng.below(3);
            let x2 = c.float(rng, "x2", s2, 0.025, false);
            Node::new("y", Op::Concat, &[&x, &x2, &x]).with_attr("axis", Attr::Int(axis as i64))
        }
        4 => slice_node(rng, &x, rank),
        // A window at starts before, inside and past the operand (clamped), of x or
        // written into x: the gradients of both operands of the update.
        5 | 6 => {
            let axes: Vec<usize> = (0..rank).filter(|_| rng.below(2) == 0).collect();
            let mut window = shape.clone();
            for &a in &axes {
                window[a] = rng.below(shape[a] + 1);
            }
            let starts: Vec<i64> = axes.iter().map(|&a| rng.below(2 * shape[a] + 3) as i64 - 1).collect();
            c.input("starts", Tensor::new(vec![axes.len()], meshc_ir::Data::I64(starts)), false);
            let list: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            if rng.below(2) == 0 {
                let sizes: Vec<i64> = axes.iter().map(|&a| window[a] as i64).collect();
                Node::new("y", Op::DynamicSlice, &[&x, "starts"])
                    .with_attr("axes", ints(&list))
                    .with_attr("sizes", ints(&sizes))
            } else {
                let u = c.float(rng, "u", window, 0.025, false);
                Node::new("y", Op::DynamicUpdateSlice, &[&x, &u, "starts"]).with_attr("axes", ints(&list))
            }
        }
        _ => {
            let axis = rng.below(rank);
            let n = shape[axis] as i64;
            let ishape = rng.any_shape(0, 3);
            let count: usize = ishape.iter().product();
            // In range, negative ones included, repeats likely (their gradients add).
            let idx: Vec<i64> = (0..count).map(|_| rng.below(2 * n as usize) as i64 - n).collect();
            c.input("idx", Tensor::new(ishape, meshc_ir::Data::I64(idx)), false);
            Node::new("y", Op::Gather, &[&x, "idx"]).with_attr("axis", Attr::Int(axis as i64))
        }
    };
    c.node(node);
    c
}

/// Any mix of starts, ends and steps (negative, out of range) on some of the axes.
fn slice_node(rng: &mut Rng, x: &str, rank: usize) -> Node {
    let axes: Vec<i64> = (0..rank as i64).filter(|_| rng.below(3) != 0).collect();
    let pick = |rng: &mut Rng| rng.below(13) as i64 - 6;
    let starts: Vec<i64> = axes.iter().map(|_| pick(rng)).collect();
    let ends: Vec<i64> = axes.iter().map(|_| pick(rng)).collect();
    let steps: Vec<i64> = axes.iter().map(|_| [1, 2, 3, -1, -2, -3][rng.below(6)]).collect();
    Node::new("y", Op::Slice, &[x])
        .with_attr("starts", ints(&starts))
        .with_attr("ends", ints(&ends))
        .with_attr("axes", ints(&axes))
        .with_attr("steps", ints(&steps))
}

fn cumsum_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let shape = rng.any_shape(1, 3);
    let rank = shape.len() as i64;
    let axis = rng.below(shape.len()) as i64 - if rng.below(2) == 0 { rank } else { 0 };
    let x = c.float(rng, "x", shape, 0.0, false);
    let n = Node::new("y", Op::CumSum, &[&x])
        .with_attr("axis", Attr::Int(axis))
        .with_attr("exclusive", Attr::Bool(rng.below(2) == 0))
        .with_attr("reverse", Attr::Bool(rng.below(2) == 0));
    c.node(n);
    c
}

fn slice_case(rng: &mut Rng) -> Case {
    let mut c = Case::new();
    let rank = 1 + rng.below(2);
    let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(6)).collect();
    let x = c.float(rng, "x", shape, 0.0, false);
    c.node(slice_node(rng, &x, rank));
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn elementwise_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&elementwise_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn where_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&where_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn piecewise_constant_ops_pass_no_gradient(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&piecewise_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn pad_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&pad_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn conv_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&conv_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn pool_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&pool_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn contraction_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&contraction_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn reduction_and_normalisation_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&reduction_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn cumsum_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&cumsum_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn slice_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&slice_case(&mut rng), &mut rng)?;
    }

    #[test]
    fn data_movement_gradients_match_finite_differences(seed in 1u64..) {
        let mut rng = Rng(seed);
        check(&movement_case(&mut rng), &mut rng)?;
    }
}

/// A chain through a shared subexpression: `s = x·w` used three times, differentiated
/// once; the same graph gives the same gradient graph (and so the same bits).
#[test]
fn shared_subexpressions_are_differentiated_once_and_deterministically() {
    let mut rng = Rng(7);
    let mut c = Case::new();
    c.float(&mut rng, "x", vec![2, 3], 0.0, false);
    c.float(&mut rng, "w", vec![3, 3], 0.025, false);
    c.node(Node::new("s", Op::MatMul, &["x", "w"]));
    c.node(Node::new("t", Op::Tanh, &["s"]));
    c.node(Node::new("u", Op::Mul, &["s", "t"]));
    c.node(Node::new("y", Op::Add, &["u", "s"]));
    check(&c, &mut rng).unwrap();
    let (g, _) = c.graph(&mut rng);
    let info = verify::verify(&g).unwrap();
    let wrt = select_wrt(&g, &["x".into(), "w".into()]).unwrap();
    let a = grad(&g, &info, "loss", &wrt).unwrap();
    let b = grad(&g, &info, "loss", &wrt).unwrap();
    assert_eq!(a, b);
    // One matmul gradient pair for s, however many times s is used.
    let matmuls = a.nodes.iter().filter(|n| n.op == Op::MatMul).count();
    assert_eq!(matmuls, 3, "{}", meshc_ir::text::print(&a));
    assert!(a.nodes.iter().any(|n| n.name == "grad.s"), "s's three contributions are summed as grad.s");
}

fn small_graph(extra: &[Node], loss_from: &str) -> (Graph, verify::Info) {
    let mut g = Graph { name: "g".into(), ..Default::default() };
    g.inputs.push(Input { name: "x".into(), ty: TensorType::new(DType::F32, vec![4]), dims: None, loc: None });
    g.nodes.extend_from_slice(extra);
    g.nodes.push(Node::new("loss", Op::ReduceSum, &[loss_from]));
    g.outputs.push(Output::new("loss"));
    let info = verify::verify(&g).unwrap();
    (g, info)
}

#[test]
fn a_non_differentiable_use_on_the_path_names_the_node() {
    let (g, info) = small_graph(
        &[
            Node::new("i", Op::Cast, &["x"]).with_attr("to", Attr::Str("i32".into())),
            Node::new("f", Op::Cast, &["i"]).with_attr("to", Attr::Str("f32".into())),
        ],
        "f",
    );
    let e = grad(&g, &info, "loss", &["x".into()]).unwrap_err();
    assert_eq!(e.msg, "node 'i': cast to i32 is not differentiable, and the loss depends on 'x' through it");
}

#[test]
fn bad_loss_and_wrt_are_one_line_errors() {
    let (g, info) = small_graph(&[Node::new("e", Op::Exp, &["x"])], "e");
    assert_eq!(grad(&g, &info, "nope", &[]).unwrap_err().msg, "--loss 'nope' is not a tensor of the graph");
    assert_eq!(grad(&g, &info, "e", &[]).unwrap_err().msg, "--loss 'e' is f32[4]; the loss must be a scalar f32[]");
    assert_eq!(select_wrt(&g, &["w*".into()]).unwrap_err().msg, "--wrt 'w*' matches no param or input of the graph");
}
