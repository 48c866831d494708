//! `cargo bench --bench mesh`: the mesh benchmark — the MLP
//! x[512,1024]·W1[1024,4096] → ReLU → ·W2[4096,1024] compiled for a 2×4 mesh (batch over
//! `data`, hidden over `model`, Megatron-style), for a 1×2 mesh and for one device, run in
//! memory end to end (inputs scattered, outputs gathered). GFLOP/s counts 4·B·D·H.
//!
//! The 1×2 mesh does the same work on two device threads, so on a 2-core machine the 2×4
//! mesh over the 1×2 mesh is the cost of running more devices than cores (8 threads on 2
//! cores); the CPU column (CPU seconds of the process per wall second of a run) shows cores
//! burnt by waiting. The three run in turn, so that all see the same load from the rest
//! of the machine. Medians of N runs; `MESH_BENCH_RUNS` sets N (default 20).

mod common;

use std::time::Instant;

use common::mlp::{build, input, B, D, H, SPEC_1X2, SPEC_2X4};
use common::{cpu_seconds, median};
use meshc_ir::Tensor;
use meshc_runtime::exec::runner::Loaded;

fn main() {
    let runs = std::env::var("MESH_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let flops = 4.0 * (B * D * H) as f64;
    println!("\n## MLP [{B},{D}]·[{D},{H}] → relu → ·[{H},{D}], {:.2} GFLOP per run, median of {runs}", flops / 1e9);
    let cases: Vec<(&str, Loaded)> =
        [("1 device", None), ("1x2 mesh (2 dev)", Some(SPEC_1X2)), ("2x4 mesh (8 dev)", Some(SPEC_2X4))]
            .map(|(name, spec)| (name, build(spec).load().unwrap()))
            .into_iter()
            .collect();
    let x = input();
    let mut ys: Vec<Tensor> = cases.iter().map(|(_, l)| l.run(&x).unwrap().remove("y").unwrap()).collect();
    // Per case: wall seconds and CPU seconds of each run.
    let mut times = vec![(Vec::new(), Vec::new()); cases.len()];
    for _ in 0..runs {
        for (((_, l), (wall, cpu)), y) in cases.iter().zip(&mut times).zip(&mut ys) {
            let (s, c) = (Instant::now(), cpu_seconds());
            *y = l.run(&x).unwrap().remove("y").unwrap();
            wall.push(s.elapsed().as_secs_f64());
            cpu.push(cpu_seconds() - c);
        }
    }
    let t: Vec<f64> = times.iter().map(|(w, _)| median(w.clone())).collect();
    for (((name, _), (wall, cpu)), &ti) in cases.iter().zip(&times).zip(&t) {
        let load = median(cpu.iter().zip(wall).map(|(c, w)| c / w).collect());
        println!(
            "{name:<18} {:8.2} ms  {:7.1} GFLOP/s  {load:4.2} CPU  ({:.2}x the 1-device run)",
            ti * 1e3,
            flops / ti / 1e9,
            t[0] / ti
        );
    }
    println!("8 devices / 2 devices throughput: {:.2}", t[1] / t[2]);
    for ((name, _), y) in cases.iter().zip(&ys).skip(1) {
        let c = y.closeness(&ys[0]);
        assert!(c.first_bad.is_none(), "the {name} result differs from the 1-device result: {c:?}");
        println!("{name} vs 1-device result: max abs difference {:.2e}", c.max_abs_err);
    }
}
