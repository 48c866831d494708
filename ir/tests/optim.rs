//! The optimizer steps `train_step` appends, run on the interpreter for two steps (the
//! state fed back by name, as the runner does) against the update formulas computed here.

use std::collections::HashMap;
use std::path::Path;

use meshc_ir::optim::{next_name, train_step, Optimizer};
use meshc_ir::{
    interp, params, verify, Attr, DType, Graph, Input, Node, Op, Output, Param, ParamData, Tensor, TensorType,
};

/// loss = Σ w·x: the gradient of w is x.
fn graph() -> Graph {
    let f32s = |n| TensorType::new(DType::F32, vec![n]);
    Graph {
        name: "lin".into(),
        inputs: vec![Input { name: "x".into(), ty: f32s(3), dims: None, loc: None }],
        params: vec![Param {
            name: "w".into(),
            ty: f32s(3),
            dims: None,
            data: ParamData::Value(Attr::List(vec![Attr::Float(0.5), Attr::Float(-1.0), Attr::Float(2.0)])),
            loc: None,
        }],
        nodes: vec![Node::new("wx", Op::Mul, &["w", "x"]), Node::new("loss", Op::ReduceSum, &["wx"])],
        outputs: vec![Output::new("loss")],
        ..Graph::default()
    }
}

/// Two steps with batches `xs`; returns every state tensor after each step.
fn two_steps(opt: Optimizer, xs: [[f32; 3]; 2]) -> Vec<HashMap<String, Vec<f64>>> {
    let g = graph();
    let info = verify::verify(&g).unwrap();
    let (tg, state) = train_step(&g, &info, "loss", &["w".into()], opt).unwrap();
    let tinfo = verify::verify(&tg).unwrap();
    let mut values = params::load_all(&tg, Path::new(".")).unwrap();
    let mut after = Vec::new();
    for x in xs {
        values.insert("x".into(), Tensor::f32(vec![3], x.to_vec()));
        let out = interp::run(&tg, &tinfo.order, &tinfo.types, values.clone()).unwrap();
        let mut now = HashMap::new();
        for s in &state {
            let t = out[&next_name(s)].clone();
            now.insert(s.clone(), t.data.to_f64());
            values.insert(s.clone(), t);
        }
        after.push(now);
    }
    after
}

fn close(got: &[f64], want: &[f64]) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "got {got:?}, want {want:?}");
    }
}

const W: [f64; 3] = [0.5, -1.0, 2.0];
const XS: [[f32; 3]; 2] = [[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]];

fn x(s: usize) -> [f64; 3] {
    XS[s].map(f64::from)
}

#[test]
fn sgd_steps_along_the_gradient() {
    let a = two_steps(Optimizer::Sgd { lr: 0.1 }, XS);
    let w1: Vec<f64> = (0..3).map(|i| W[i] - 0.1 * x(0)[i]).collect();
    let w2: Vec<f64> = (0..3).map(|i| w1[i] - 0.1 * x(1)[i]).collect();
    close(&a[0]["w"], &w1);
    close(&a[1]["w"], &w2);
}

#[test]
fn momentum_accumulates_the_gradients() {
    let a = two_steps(Optimizer::Momentum { lr: 0.1, beta: 0.9 }, XS);
    let m2: Vec<f64> = (0..3).map(|i| 0.9 * x(0)[i] + x(1)[i]).collect();
    let w2: Vec<f64> = (0..3).map(|i| W[i] - 0.1 * x(0)[i] - 0.1 * m2[i]).collect();
    close(&a[0]["opt.m.w"], &x(0));
    close(&a[1]["opt.m.w"], &m2);
    close(&a[1]["w"], &w2);
}

#[test]
fn adamw_corrects_its_moments_and_decays_the_weights() {
    let (lr, b1, b2, eps, wd) = (0.01f32, 0.9f32, 0.999f32, 1e-8f32, 0.1f32);
    let a = two_steps(Optimizer::AdamW { lr, b1, b2, eps, wd }, XS);
    // The reference computes with the f32 hyperparameters the graph holds.
    let (lr, b1, b2, eps, wd) = (lr as f64, b1 as f64, b2 as f64, eps as f64, wd as f64);
    let (mut w, mut m, mut v) = (W.to_vec(), vec![0.0; 3], vec![0.0; 3]);
    for (s, after) in a.iter().enumerate() {
        let t = (s + 1) as i32;
        for i in 0..3 {
            let g = x(s)[i];
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let (mh, vh) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
            w[i] -= lr * (mh / (vh.sqrt() + eps) + wd * w[i]);
        }
        close(&after["w"], &w);
        close(&after["opt.m.w"], &m);
        close(&after["opt.v.w"], &v);
        close(&after["opt.step"], &[t as f64]);
    }
}
