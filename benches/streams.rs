//! `cargo bench --bench streams`: the stream- and buffer-assignment figures of issue 8.
//!
//! 1. Peak arena bytes against the naive sum of all arena tensors, for every testdata graph
//!    on one device and for every testdata layout (the largest device).
//! 2. End-to-end time of the transformer block on its model-parallel 2x4 layout
//!    (testdata/transformer/layouts/mp-2x4.json), on its 1-D 8-device layout (mp-8, whose
//!    q/k/v all_gathers can overlap the next projections) and on 4 pipeline stages of 2
//!    devices with 2 micro-batches (pipeline-4x2: sends and receives between stages), each
//!    compiled three ways: the
//!    default (a collective goes to the communication stream when compute can overlap it),
//!    every collective on the communication stream (`--comm-stream always`), and one stream
//!    (`--single-stream`); then the same block at a larger size. The configurations run
//!    interleaved (one run of each in turn), medians of N runs; `STREAMS_BENCH_RUNS` sets N
//!    for the testdata size (default 400; the larger size runs N/10).
//!    "cores busy" is the process's CPU time over wall time times the cores: where it is near
//!    100%, no overlap can shorten the run — the collectives' copies and sums are CPU work
//!    too — it can only fill cores left idle while devices wait for each other. For runs
//!    under a millisecond it over-counts (device threads spin up to 50 µs after a run, and
//!    that CPU time lands in the next run's figure), so only the larger size's is meaningful.
//! 3. Chrome traces of one run of each configuration into `$CARGO_TARGET_DIR/bench-out/`
//!    (default `target/bench-out/`): open them in ui.perfetto.dev, one track per device and
//!    stream.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{cpu_seconds, testdata_graphs, transformer, transformer_inputs};
use meshc::compile::{Compiled, Options};
use meshc::driver;
use meshc::layout;
use meshc::passes::buffers::naive_bytes;
use meshc::passes::streams::Config;
use meshc::pipeline::Dumps;
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Tensor};
use meshc_runtime::exec::runner::Loaded;

fn build(
    g: &Graph,
    info: &Info,
    params: &HashMap<String, Tensor>,
    spec: Option<&layout::Spec>,
    streams: Config,
) -> Compiled {
    let opts = Options { streams, ..Options::default() };
    driver::Job::new(g, info, params, &opts).spec(spec).build(&Dumps::default()).expect("compiles")
}

fn arenas() {
    println!("\n## Peak arena bytes vs the naive sum (largest device), scheduled and planned with streams");
    println!("{:<40} {:>12} {:>12} {:>8}", "graph / layout", "arena", "naive", "ratio");
    let row = |label: &str, c: &Compiled| {
        let p = c.programs.iter().max_by_key(|p| p.arena_bytes).expect("a program");
        let naive = naive_bytes(p);
        println!(
            "{label:<40} {:>12} {:>12} {:>7.1}%",
            p.arena_bytes,
            naive,
            100.0 * p.arena_bytes as f64 / naive as f64
        );
    };
    for graph in testdata_graphs() {
        let (g, info) = meshc_ir::load::load(&graph).unwrap();
        let params = meshc_ir::params::load_all(&g, graph.parent().unwrap()).unwrap();
        let name = graph.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        row(&name, &build(&g, &info, &params, None, Config::default()));
        let dir = graph.parent().unwrap().join("layouts");
        let mut specs: Vec<PathBuf> =
            std::fs::read_dir(&dir).map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect()).unwrap_or_default();
        specs.sort();
        for s in specs {
            let spec = layout::load(&s).unwrap();
            let label = format!("{name} {}", s.file_stem().unwrap().to_string_lossy());
            row(&label, &build(&g, &info, &params, Some(&spec), Config::default()));
        }
    }
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

fn out_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let dir = Path::new(&target).join("bench-out");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Times the three stream configurations of `g` under `spec`, interleaved; writes a trace of
/// each. Returns nothing: prints the medians and the ratios against one stream.
fn overlap(label: &str, g: &Graph, info: &Info, params: &HashMap<String, Tensor>, spec: &layout::Spec, runs: usize) {
    let inputs = transformer_inputs(g);
    let configs = [
        ("default (auto)", "auto", Config::default()),
        ("comm stream always", "comm", Config { comm_always: true, ..Config::default() }),
        ("single stream", "single", Config { single: true, ..Config::default() }),
    ];
    let loaded: Vec<(Loaded, usize)> = configs
        .iter()
        .map(|(_, _, cfg)| {
            let c = build(g, info, params, Some(spec), cfg.clone());
            let on_comm = c.programs.iter().map(|p| p.streams.streams.get(1).map_or(0, |s| s.steps.len())).sum();
            (c.load().unwrap(), on_comm)
        })
        .collect();
    let want = loaded[2].0.run(&inputs).unwrap();
    for (l, _) in &loaded {
        let got = l.run(&inputs).unwrap();
        for (k, w) in &want {
            assert_eq!(
                got[k].to_le_bytes(),
                w.to_le_bytes(),
                "{label}: the stream configurations must agree bit for bit"
            );
        }
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(runs); configs.len()];
    let mut busy = vec![(0.0, 0.0); configs.len()]; // (CPU seconds, wall seconds)
    for _ in 0..runs {
        for (k, (l, _)) in loaded.iter().enumerate() {
            let cpu = cpu_seconds();
            let s = Instant::now();
            l.run(&inputs).unwrap();
            let wall = s.elapsed().as_secs_f64();
            times[k].push(wall);
            busy[k].0 += cpu_seconds() - cpu;
            busy[k].1 += wall;
        }
    }
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    println!("\n## {label}: median of {runs} interleaved runs (a shared, noisy machine: compare within this table)");
    for (k, (name, file, _)) in configs.iter().enumerate() {
        let (l, on_comm) = &loaded[k];
        let mut trace = Vec::new();
        l.run_timed(&inputs, &mut |t| trace.push(t.clone())).unwrap();
        let path = out_dir().join(format!("{}-{file}.trace.json", label.replace(' ', "-")));
        std::fs::write(&path, meshc_runtime::tools::trace::chrome_trace(&l.meta, &l.programs, &trace)).unwrap();
        println!(
            "{name:<20} {:9.3} ms  {:5.2}x vs single  cores busy {:3.0}%  ({on_comm} communication steps on comm streams; trace {})",
            medians[k] * 1e3,
            medians[2] / medians[k],
            100.0 * busy[k].0 / busy[k].1 / cores(),
            path.display()
        );
    }
}

fn main() {
    let runs: usize = std::env::var("STREAMS_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    arenas();
    let graph = Path::new("testdata/transformer/graph.json");
    let (g, info) = meshc_ir::load::load(graph).unwrap();
    let params = meshc_ir::params::load_all(&g, graph.parent().unwrap()).unwrap();
    for l in ["mp-2x4", "mp-8", "pipeline-4x2"] {
        let spec = layout::load(&graph.parent().unwrap().join(format!("layouts/{l}.json"))).unwrap();
        overlap(&format!("transformer {l}"), &g, &info, &params, &spec, runs);
    }
    // The same block, larger: batch 8, sequence 128, model 256, 8 heads, hidden 1024.
    let src = transformer(8, 128, 256, 8, 1024, 512);
    let g = meshc_ir::text::parse(&src).unwrap();
    let info = meshc_ir::verify::verify(&g).unwrap();
    let params = meshc_ir::params::load_all(&g, Path::new(".")).unwrap();
    for l in ["mp-2x4", "mp-8", "pipeline-4x2"] {
        let spec = layout::load(&graph.parent().unwrap().join(format!("layouts/{l}.json"))).unwrap();
        overlap(&format!("transformer 8x128x256 {l}"), &g, &info, &params, &spec, (runs / 10).max(5));
    }
}
