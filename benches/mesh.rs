//! `cargo bench --bench mesh`: the mesh benchmark — the MLP
//! x[512,1024]·W1[1024,4096] → ReLU → ·W2[4096,1024] compiled for a 2×4 mesh (batch over
//! `data`, hidden over `model`, Megatron-style) and for one device, run in memory end to end
//! (inputs scattered, outputs gathered). GFLOP/s counts 4·B·D·H. Medians of N runs, both
//! measured in this one run. `MESH_BENCH_RUNS` sets N (default 20).

mod common;

use std::time::Instant;

use common::mlp::{build, input, B, D, H, SPEC_2X4};
use meshc::compile::Compiled;
use meshc_ir::Tensor;

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
