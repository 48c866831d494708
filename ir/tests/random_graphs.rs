//! Property tests on random small graphs of elementwise, matmul, reduce and transpose ops:
//! the interpreter agrees with a second, independent evaluator written here (rank ≤ 2,
//! all f64, nested loops), and both formats print and parse back to the same graph.

use std::collections::HashMap;

use meshc_ir::{interp, json, text, verify, Attr, DType, Graph, Input, Node, Op, Output, Tensor, TensorType};
use proptest::prelude::*;

/// A value of the independent evaluator: a matrix (rank ≤ 2 padded to [rows, cols]).
#[derive(Clone, Debug)]
struct M {
    shape: Vec<usize>,
    v: Vec<f64>,
}

impl M {
    fn rc(&self) -> (usize, usize) {
        match self.shape.len() {
            0 => (1, 1),
            1 => (1, self.shape[0]),
            _ => (self.shape[0], self.shape[1]),
        }
    }
    fn at(&self, i: usize, j: usize) -> f64 {
        let (r, c) = self.rc();
        // size-1 dims repeat: broadcasting for the shapes this test generates.
        self.v[(if r == 1 { 0 } else { i }) * c + if c == 1 { 0 } else { j }]
    }
}

#[derive(Clone, Debug)]
enum Step {
    Unary(Op, usize),
    Binary(Op, usize, usize),
    MatMul(usize, usize),
    Reduce(Op, usize, usize, bool),
    Transpose(usize),
}

fn unary(op: Op, x: f64) -> f64 {
    match op {
        Op::Neg => -x,
        Op::Abs => x.abs(),
        Op::Relu => x.max(0.0),
        Op::Tanh => x.tanh(),
        Op::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        _ => unreachable!(),
    }
}

fn binary(op: Op, a: f64, b: f64) -> f64 {
    match op {
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
        Op::Maximum => a.max(b),
        Op::Minimum => a.min(b),
        _ => unreachable!(),
    }
}

/// Evaluates one step independently of the crate's interpreter.
fn eval(step: &Step, vals: &[M]) -> Option<M> {
    Some(match *step {
        Step::Unary(op, a) => M { shape: vals[a].shape.clone(), v: vals[a].v.iter().map(|&x| unary(op, x)).collect() },
        Step::Binary(op, a, b) => {
            let (x, y) = (&vals[a], &vals[b]);
            // Only same-shape operands or a [1, c] / [c] row against a [r, c] matrix.
            let shape = if x.shape.len() >= y.shape.len() { x.shape.clone() } else { y.shape.clone() };
            let (r, c) = M { shape: shape.clone(), v: vec![] }.rc();
            let v = (0..r)
                .flat_map(|i| (0..c).map(move |j| (i, j)))
                .map(|(i, j)| binary(op, x.at(i, j), y.at(i, j)))
                .collect();
            M { shape, v }
        }
        Step::MatMul(a, b) => {
            let (x, y) = (&vals[a], &vals[b]);
            let (r, k) = x.rc();
            let c = y.rc().1;
            let v = (0..r)
                .flat_map(|i| (0..c).map(move |j| (i, j)))
                .map(|(i, j)| (0..k).map(|t| x.at(i, t) * y.at(t, j)).sum())
                .collect();
            M { shape: vec![r, c], v }
        }
        Step::Reduce(op, a, axis, keep) => {
            let x = &vals[a];
            let (r, c) = x.rc();
            let (outer, inner) = if axis == 0 { (c, r) } else { (r, c) };
            let mut v = Vec::new();
            for o in 0..outer {
                let items: Vec<f64> = (0..inner).map(|t| if axis == 0 { x.at(t, o) } else { x.at(o, t) }).collect();
                v.push(match op {
                    Op::ReduceSum => items.iter().sum(),
                    Op::ReduceMean => items.iter().sum::<f64>() / inner as f64,
                    _ => items.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                });
            }
            let shape = match (axis, keep) {
                (0, true) => vec![1, c],
                (1, true) => vec![r, 1],
                _ => vec![outer],
            };
            M { shape, v }
        }
        Step::Transpose(a) => {
            let x = &vals[a];
            let (r, c) = x.rc();
            M {
                shape: vec![c, r],
                v: (0..c).flat_map(|j| (0..r).map(move |i| (i, j))).map(|(i, j)| x.at(i, j)).collect(),
            }
        }
    })
}

/// Draws a sequence of steps that type-checks by construction, given the shapes so far.
fn plan(seed: Vec<u32>, first: (usize, usize)) -> (Vec<Step>, Vec<Vec<usize>>) {
    let mut shapes: Vec<Vec<usize>> = vec![vec![first.0, first.1]];
    let mut steps = Vec::new();
    for s in seed {
        let n = shapes.len();
        let a = (s as usize / 7) % n;
        let sa = shapes[a].clone();
        let step = match s % 6 {
            0 => Step::Unary([Op::Neg, Op::Abs, Op::Relu, Op::Tanh, Op::Sigmoid][(s as usize / 3) % 5], a),
            1 => {
                // a partner of the same shape, or a row vector broadcast against a matrix
                let partner = (0..n).rev().find(|&b| shapes[b] == sa || (sa.len() == 2 && shapes[b] == vec![sa[1]]));
                match partner {
                    Some(b) => {
                        Step::Binary([Op::Add, Op::Sub, Op::Mul, Op::Maximum, Op::Minimum][(s as usize / 11) % 5], a, b)
                    }
                    None => Step::Unary(Op::Tanh, a),
                }
            }
            2 if sa.len() == 2 => match (0..n).find(|&b| shapes[b].len() == 2 && shapes[b][0] == sa[1]) {
                Some(b) => Step::MatMul(a, b),
                None => Step::Transpose(a),
            },
            3 if sa.len() == 2 => Step::Reduce(
                [Op::ReduceSum, Op::ReduceMean, Op::ReduceMax][(s as usize / 5) % 3],
                a,
                (s as usize / 13) % 2,
                s % 2 == 0,
            ),
            4 if sa.len() == 2 => Step::Transpose(a),
            _ => Step::Unary(Op::Relu, a),
        };
        let shape = eval(
            &step,
            &shapes.iter().map(|s| M { shape: s.clone(), v: vec![0.0; s.iter().product()] }).collect::<Vec<_>>(),
        )
        .expect("planned steps evaluate")
        .shape;
        shapes.push(shape);
        steps.push(step);
    }
    (steps, shapes)
}

fn build_graph(steps: &[Step], x_shape: &[usize]) -> Graph {
    let name = |i: usize| if i == 0 { "x".to_string() } else { format!("t{i}") };
    let mut g = Graph { name: "random".into(), ..Graph::default() };
    g.inputs.push(Input { name: "x".into(), ty: TensorType::new(DType::F32, x_shape.to_vec()), dims: None, loc: None });
    for (k, step) in steps.iter().enumerate() {
        let out = name(k + 1);
        let node = match *step {
            Step::Unary(op, a) => Node::new(out, op, &[&name(a)]),
            Step::Binary(op, a, b) => Node::new(out, op, &[&name(a), &name(b)]),
            Step::MatMul(a, b) => Node::new(out, Op::MatMul, &[&name(a), &name(b)]),
            Step::Reduce(op, a, axis, keep) => Node::new(out, op, &[&name(a)])
                .with_attr("axes", Attr::ints(&[axis as i64]))
                .with_attr("keepdims", Attr::Bool(keep)),
            Step::Transpose(a) => Node::new(out, Op::Transpose, &[&name(a)]),
        };
        g.nodes.push(node);
    }
    g.outputs.push(Output::new(name(steps.len())));
    g
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn interpreter_agrees_with_independent_evaluator(
        rows in 1usize..5, cols in 1usize..5,
        seed in prop::collection::vec(0u32..10_000, 1..12),
        data in prop::collection::vec(-2.0f32..2.0, 16),
    ) {
        let (steps, _) = plan(seed, (rows, cols));
        let g = build_graph(&steps, &[rows, cols]);
        let info = verify::verify(&g).map_err(|e| TestCaseError::fail(e.to_string()))?;

        let x: Vec<f32> = (0..rows * cols).map(|i| data[i % data.len()]).collect();
        let mut inputs = HashMap::new();
        inputs.insert("x".to_string(), Tensor::f32(vec![rows, cols], x.clone()));
        let got = interp::run(&g, &info.order, &info.types, inputs).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let got = &got[&g.outputs[0].name];

        let mut vals = vec![M { shape: vec![rows, cols], v: x.iter().map(|&v| v as f64).collect() }];
        for s in &steps {
            let v = eval(s, &vals).unwrap();
            vals.push(v);
        }
        let want = vals.last().unwrap();
        prop_assert_eq!(&got.shape, &want.shape);
        // f32 rounding after every op vs f64 throughout: error relative to the largest magnitude.
        let scale = 1.0 + want.v.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (a, b) in got.data.to_f64().iter().zip(&want.v) {
            prop_assert!((a - b).abs() <= 1e-4 * scale, "got {} want {} in {:?}", a, b, steps);
        }

        // Both formats print and parse back to the same graph.
        prop_assert_eq!(&text::parse(&text::print(&g)).unwrap(), &g);
        prop_assert_eq!(&json::parse(&json::print(&g)).unwrap(), &g);
    }
}
