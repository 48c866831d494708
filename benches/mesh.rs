//! `cargo bench --bench mesh`: the issue's mesh benchmark — the MLP
//! x[512,1024]·W1[1024,4096] → ReLU → ·W2[4096,1024] compiled for a 2×4 mesh (batch over
//! `data`, hidden over `model`, Megatron-style) and for one device, run in memory end to end
//! (inputs scattered, outputs gathered). GFLOP/s counts 4·B·D·H. Medians of N runs, both
//! measured in this one run. `MESH_BENCH_RUNS` sets N (default 20).

use std::collections::HashMap;
use std::time::Instant;

use meshc::compile::{Compiled, Options};
use meshc::driver;
use meshc::dumps::Dumps;

use meshc::layout;
use meshc_ir::{params, text, verify, Data, Tensor};

const B: usize = 512;
const D: usize = 1024;
const H: usize = 4096;

const GRAPH: &str = "graph mlp_bench {
  input x: f32[512,1024] dims(batch, embed)
  param w1: f32[1024,4096] dims(embed, hidden) = init normal{seed = 1, std = 0.02}
  param w2: f32[4096,1024] dims(hidden, embed) = init normal{seed = 2, std = 0.02}
  h = matmul(x, w1)
  a = relu(h)
  y = matmul(a, w2)
  output y
}";

const SPEC_2X4: &str = r#"{"format": "meshc-layout/1",
  "mesh": {"shape": [2, 4], "axes": ["data", "model"], "topology": "torus"},
  "rules": {"batch": "data", "hidden": "model"}}"#;

fn build(spec: Option<&str>) -> Compiled {
    let g = text::parse(GRAPH).expect("bench graph parses");
    let info = verify::verify(&g).expect("bench graph verifies");
    let values = params::load_all(&g, std::path::Path::new(".")).expect("init params");
    let spec = spec.map(|s| layout::parse(s, "bench-spec").expect("bench spec parses"));
    driver::build(&g, &info, spec.as_ref(), &values, &Options::default(), &Dumps::default(), None).expect("compiles")
}

fn input() -> HashMap<String, Tensor> {
    let v = (0..B * D).map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0).collect();
    HashMap::from([("x".to_string(), Tensor::new(vec![B, D], Data::F32(v)))])
}

/// Median seconds per run, and the outputs of the last run.
fn time(c: Compiled, runs: usize) -> (f64, Tensor) {
    let l = c.load().unwrap();
    let x = input();
    let mut y = l.run(&x).unwrap();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            y = l.run(&x).unwrap();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], y.remove("y").unwrap())
}

fn main() {
    let runs = std::env::var("MESH_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let flops = 4.0 * (B * D * H) as f64;
    println!("\n## MLP [{B},{D}]·[{D},{H}] → relu → ·[{H},{D}], {:.2} GFLOP per run, median of {runs}", flops / 1e9);
    let (t1, y1) = time(build(None), runs);
    println!("1 device          {:8.2} ms  {:7.1} GFLOP/s", t1 * 1e3, flops / t1 / 1e9);
    let (t8, y8) = time(build(Some(SPEC_2X4)), runs);
    println!(
        "2x4 mesh (8 dev)  {:8.2} ms  {:7.1} GFLOP/s   ({:.2}x the 1-device run)",
        t8 * 1e3,
        flops / t8 / 1e9,
        t1 / t8
    );
    let c = y8.closeness(&y1);
    assert!(c.first_bad.is_none(), "the mesh result differs from the 1-device result: {c:?}");
    println!("mesh vs 1-device result: max abs difference {:.2e}", c.max_abs_err);
}
