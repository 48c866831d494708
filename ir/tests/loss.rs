//! The built-in losses `loss::attach` appends, run on the interpreter against their
//! formulas computed here in f64, over random values and extreme logits.

use std::path::Path;

use meshc_ir::loss::{self, Spec};
use meshc_ir::Result;
use meshc_ir::{interp, params, verify, DType, Data, Graph, Input, Node, Op, Output, Tensor, TensorType};
use proptest::prelude::*;

const ROWS: usize = 3;
const CLASSES: usize = 4;

/// The built-in loss `spec` names attached to `g`.
fn attach(g: &Graph, info: &verify::Info, spec: &Spec) -> Result<(Graph, String)> {
    let Spec::Builtin { kind, of } = spec else { panic!("{spec:?} is no built-in loss") };
    loss::attach(g, info, *kind, of)
}

/// y = x · 1 (a node, so the loss is taken of a computed tensor, not an input).
fn graph() -> Graph {
    let ty = TensorType::new(DType::F32, vec![ROWS, CLASSES]);
    Graph {
        name: "y".into(),
        inputs: vec![Input { name: "x".into(), ty, dims: Some(vec![Some("batch".into()), None]), loc: None }],
        params: vec![],
        nodes: vec![Node::new("y", Op::Neg, &["x"])],
        outputs: vec![Output::new("y")],
        ..Graph::default()
    }
}

/// The loss `spec` attaches to `graph()`, evaluated at x = −y with truth `truth`.
fn loss(spec: &str, y: &[f32], truth: Tensor) -> f64 {
    let g = graph();
    let info = verify::verify(&g).unwrap();
    let (lg, name) = attach(&g, &info, &Spec::parse(spec).unwrap()).unwrap();
    assert_eq!(name, "loss");
    let linfo = verify::verify(&lg).unwrap();
    assert_eq!(linfo.types["loss"], TensorType::new(DType::F32, vec![]));
    let mut values = params::load_all(&lg, Path::new(".")).unwrap();
    values.insert("x".into(), Tensor::f32(vec![ROWS, CLASSES], y.iter().map(|v| -v).collect()));
    let truth_name = lg.inputs.last().unwrap().name.clone();
    values.insert(truth_name, truth);
    interp::run(&lg, &linfo.order, &linfo.types, values).unwrap()["loss"].data.to_f64()[0]
}

fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len() as f64
}

fn close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "got {got}, want {want}");
}

fn values(n: usize, scale: f32) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-scale..scale, n)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn regression_losses_match_their_formulas(y in values(ROWS * CLASSES, 4.0), t in values(ROWS * CLASSES, 4.0)) {
        let target = || Tensor::f32(vec![ROWS, CLASSES], t.clone());
        let pairs = || y.iter().zip(&t).map(|(&y, &t)| (y as f64, t as f64));
        close(loss("mse:y", &y, target()), mean(pairs().map(|(y, t)| (y - t) * (y - t))));
        close(loss("l1:y", &y, target()), mean(pairs().map(|(y, t)| (y - t).abs())));
        let bce = |(y, t): (f64, f64)| y.max(0.0) - y * t + (-y.abs()).exp().ln_1p();
        close(loss("bce_with_logits:y", &y, target()), mean(pairs().map(bce)));
    }

    /// Logits up to ±1e4: a log of a softmax would give inf or NaN; the shifted form does not.
    #[test]
    fn cross_entropy_matches_and_is_stable(y in values(ROWS * CLASSES, 1e4), labels in prop::collection::vec(0..CLASSES as i64, ROWS)) {
        let got = loss("cross_entropy:y", &y, Tensor::new(vec![ROWS], Data::I64(labels.clone())));
        let want = mean(y.chunks(CLASSES).zip(&labels).map(|(row, &l)| {
            let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() - row[l as usize]
        }));
        prop_assert!(got.is_finite());
        close(got, want);
    }
}

#[test]
fn a_label_outside_the_classes_adds_nothing() {
    let y = [0.0f32; ROWS * CLASSES];
    let got = loss("cross_entropy:y", &y, Tensor::new(vec![ROWS], Data::I64(vec![0, 1, CLASSES as i64])));
    // Two rows pick log(4) each, the third nothing; the mean counts all three.
    close(got, 2.0 * (CLASSES as f64).ln() / ROWS as f64);
}

#[test]
fn truth_inputs_take_the_output_type_and_dim_names() {
    let g = graph();
    let info = verify::verify(&g).unwrap();
    let (lg, _) = attach(&g, &info, &Spec::parse("mse:y").unwrap()).unwrap();
    let t = lg.inputs.iter().find(|i| i.name == "target").unwrap();
    assert_eq!(t.ty, TensorType::new(DType::F32, vec![ROWS, CLASSES]));
    assert_eq!(t.dims, Some(vec![Some("batch".into()), None]));
    let (lg, _) = attach(&g, &info, &Spec::parse("cross_entropy:y").unwrap()).unwrap();
    let l = lg.inputs.iter().find(|i| i.name == "labels").unwrap();
    assert_eq!(l.ty, TensorType::new(DType::I64, vec![ROWS]));
    assert_eq!(l.dims, Some(vec![Some("batch".into())]));
    assert_eq!(lg.outputs.last().unwrap().name, "loss");
}

#[test]
fn bad_specs_say_why() {
    let g = graph();
    let info = verify::verify(&g).unwrap();
    let err = |spec: &str| match Spec::parse(spec) {
        Err(e) => e.msg,
        Ok(s) => attach(&g, &info, &s).unwrap_err().msg,
    };
    assert_eq!(Spec::parse("loss").unwrap(), Spec::Named("loss".into()));
    assert_eq!(
        err("mes:y"),
        "--loss mes:y: no built-in loss 'mes' (did you mean 'mse'?) (the built-in losses: mse, l1, bce_with_logits, cross_entropy)"
    );
    assert_eq!(err("mse:"), "--loss mse:: name the tensor the loss is taken of (KIND:OUTPUT)");
    assert_eq!(err("mse:yy"), "--loss: the graph has no tensor 'yy'");
    // The truth input's name is taken: refused with the name, never shadowed.
    let mut taken = graph();
    taken.inputs.push(Input { name: "target".into(), ty: TensorType::new(DType::F32, vec![1]), dims: None, loc: None });
    let tinfo = verify::verify(&taken).unwrap();
    let e = attach(&taken, &tinfo, &Spec::parse("mse:y").unwrap()).unwrap_err().msg;
    assert_eq!(e, "the loss needs the name 'target', which the graph already uses");
}
