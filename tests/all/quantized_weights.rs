//! `--weights-dtype int8` (and the half types' embedding tables): the compiled program is
//! the interpreter's on the quantized graph, its outputs within int8's rounding of the f32
//! ones on one device and over a mesh, and the weights take a quarter of their bytes.

use std::collections::HashMap;
use std::path::Path;

use meshc_ir::{params, text, verify, Data, Tensor};

use crate::common::{input_args, meshc, scratch, weights_bytes};

/// Relative L2 distance of `got` from `want`.
fn rel_l2(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.data.to_f64(), want.data.to_f64());
    let diff: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
    (diff / w.iter().map(|b| b * b).sum::<f64>()).sqrt()
}

/// `meshc run GRAPH --weights-dtype W` with `extra` args, the output `name` read back.
fn run(dir: &Path, graph: &str, inputs: &[String], weights: &str, extra: &[&str], name: &str) -> Tensor {
    let out = dir.join(format!("{weights}-{}.npy", extra.len())).display().to_string();
    let o = format!("{name}={out}");
    let mut args = vec!["run", graph, "--weights-dtype", weights, "--output", &o];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(extra);
    let r = meshc(&args);
    assert_eq!(r.status, Some(0), "{weights} {extra:?}: {}", r.stderr);
    Tensor::read_npy(Path::new(&out)).unwrap()
}

#[test]
fn int8_weights_run_as_the_interpreter_runs_the_quantized_graph() {
    let dir = scratch("int8-oracle");
    let graph = "testdata/mlp/graph.json";
    let inputs = input_args(Path::new(graph));
    let compiled = run(&dir, graph, &inputs, "int8", &[], "y");
    // The program the quantize pass made, interpreted.
    let art = dir.join("a.mshc").display().to_string();
    let r = meshc(&["compile", graph, "--weights-dtype", "int8", "--dump-after", "quantize", "-o", &art]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let body = r.stdout.strip_prefix("# device 0\n").expect("one device");
    let g = text::parse(body).unwrap();
    let info = verify::verify(&g).unwrap();
    let mut values: HashMap<String, Tensor> = params::load_all(&g, Path::new("testdata/mlp")).unwrap();
    values.insert("x".into(), Tensor::read_npy(Path::new("testdata/mlp/inputs/x.npy")).unwrap());
    let want = &meshc_ir::interp::run(&g, &info.order, &info.types, values).unwrap()["y"];
    // The same roundings to 8 bits, exact integer sums: the same numbers but for the last
    // bits of the scaling.
    assert!(rel_l2(&compiled, want) < 1e-6, "compiled vs interpreted: {}", rel_l2(&compiled, want));
}

#[test]
fn int8_weights_run_within_their_rounding_on_one_device_and_a_mesh() {
    let dir = scratch("int8-mlp");
    let graph = "testdata/mlp/graph.json";
    let inputs = input_args(Path::new(graph));
    let wide = run(&dir, graph, &inputs, "f32", &[], "y");
    // Split by columns and by rows: each device quantizes its part.
    for layout in
        [&[][..], &["--layout", "testdata/mlp/layouts/mp-2x4.json"], &["--layout", "testdata/mlp/layouts/dp-2.json"]]
    {
        let q = run(&dir, graph, &inputs, "int8", layout, "y");
        let e = rel_l2(&q, &wide);
        assert!(e > 0.0 && e < 3e-2, "{layout:?}: relative L2 difference {e} of int8 weights");
    }
    let art = |w: &str| {
        let a = dir.join(format!("{w}.mshc")).display().to_string();
        let r = meshc(&["compile", graph, "--weights-dtype", w, "-o", &a]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        weights_bytes(&a)
    };
    let (q, f) = (art("int8"), art("f32"));
    assert!(q * 100 < f * 30, "int8 weights {q} bytes, f32 {f}");
}

/// A table that gather reads is stored as int8 rows or bf16 and widened as its rows are
/// gathered: the outputs within each type's rounding, the table's bytes shrunk.
#[test]
fn embedding_tables_take_the_weights_dtype() {
    let dir = scratch("tables");
    let graph = dir.join("g.txt");
    std::fs::write(
        &graph,
        "graph g {\n  input ids: i64[4,6]\n  param emb: f32[1000,64] = init normal{seed = 1, std = 1.0}\n  \
         param w: f32[64,32] = init normal{seed = 2, std = 0.2}\n  h = gather(emb, ids) {axis = 0}\n  \
         y = matmul(h, w)\n  output y\n}\n",
    )
    .unwrap();
    let ids = dir.join("ids.npy");
    Tensor::new(vec![4, 6], Data::I64((0..24).map(|i| i * 41 % 1000).collect())).write_npy(&ids).unwrap();
    let graph = graph.display().to_string();
    let inputs = vec!["--input".to_string(), format!("ids={}", ids.display())];
    let wide = run(&dir, &graph, &inputs, "f32", &[], "y");
    for (w, within) in [("bf16", 1e-2), ("int8", 3e-2)] {
        let e = rel_l2(&run(&dir, &graph, &inputs, w, &[], "y"), &wide);
        assert!(e > 0.0 && e < within, "{w}: relative L2 difference {e}");
        let a = dir.join(format!("{w}.mshc")).display().to_string();
        assert_eq!(meshc(&["compile", &graph, "--weights-dtype", w, "-o", &a]).status, Some(0));
        let table = meshc(&["inspect", &a]);
        let stored = if w == "bf16" { "emb.bf16" } else { "emb.int8" };
        let bytes = 1000 * 64 * if w == "bf16" { 2 } else { 1 };
        let line = table.stdout.lines().find(|l| l.split_whitespace().nth(1) == Some(stored));
        assert!(line.is_some_and(|l| l.contains(&format!(" {bytes} bytes"))), "{w}: {}", table.stdout);
    }
}

/// One artifact for every batch and length quantizes each call's rows as the artifact
/// compiled for that shape does: the same outputs, bit for bit.
#[test]
fn int8_weights_over_symbolic_dims_match_the_static_artifact() {
    let dir = scratch("int8-dynamic");
    let model = "testdata/onnx/encoder/model.onnx";
    let inputs = input_args(Path::new(model));
    let ranged = ["--dim", "batch=1..4", "--dim", "seq=1..8"];
    let fixed = ["--dim", "batch=2", "--dim", "seq=5"];
    let outs: Vec<Tensor> =
        [ranged, fixed].iter().map(|dims| run(&dir, model, &inputs, "int8", dims, "last_hidden_state")).collect();
    assert_eq!(outs[0], outs[1]);
    let e =
        rel_l2(&outs[1], &Tensor::read_npy(Path::new("testdata/onnx/encoder/expected/last_hidden_state.npy")).unwrap());
    assert!(e > 0.0 && e < 3e-2, "relative L2 difference {e} of int8 weights");
}
