//! `cargo bench --bench pipeline`: kernel throughput (softmax, layer_norm, a fused GELU
//! chain, against memcpy), end-to-end latency, compile time and planned arena (against the
//! naive sum of its buffers) of every testdata graph, and artifact load time for two weight
//! sizes. Prints a table; figures are best-of-N or median
//! wall times on this machine, measured in one run.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use common::testdata_graphs;
use meshc::compile::{self, Compiled, Emit, Options};
use meshc_ir::{load, params, text, verify, Data, Graph, Tensor};

/// Median wall time of `f` in seconds, after one warm-up call.
fn median(n: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn compile_text(src: &str, params: &HashMap<String, Tensor>, emit: Emit) -> Compiled {
    let g = text::parse(src).expect("bench graph parses");
    let info = verify::verify(&g).expect("bench graph verifies");
    compile::compile(&g, &info, params, &Options { emit, ..Options::default() }).expect("bench graph compiles")
}

fn random(shape: &[usize], seed: u32) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(2654435761).max(1);
    let v = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 4.0 - 2.0
        })
        .collect();
    Tensor::new(shape.to_vec(), Data::F32(v))
}

/// Runs a compiled graph in memory `n` times; median seconds per whole run.
fn time_compiled(c: Compiled, inputs: &HashMap<String, Tensor>, n: usize) -> f64 {
    let l = c.load().unwrap();
    median(n, || {
        l.run(inputs).unwrap();
    })
}

/// Median seconds of the steps alone (no input/output copies) over `n` runs, on at most
/// `threads` cores.
fn time_steps(c: Compiled, inputs: &HashMap<String, Tensor>, n: usize, threads: usize) -> f64 {
    let mut l = c.load().unwrap();
    l.set_threads(threads);
    let mut runs = Vec::new();
    for _ in 0..=n {
        let mut total = 0.0;
        l.run_timed(inputs, &mut |t| total += t.dur.as_secs_f64()).unwrap();
        runs.push(total);
    }
    runs.remove(0); // warm-up
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn kernels() {
    let cores = rayon::current_num_threads();
    println!("\n## Kernels (GB/s counts bytes read + written once; 1 thread, then {cores} cores: `run --threads`)");
    println!("Ratios are against the faster memcpy (one thread or {cores} halves at once), per byte.");
    println!("| kernel | shape | ms, 1 thread | ms, {cores} cores | GB/s, {cores} cores | vs memcpy, 1 thread | vs memcpy, {cores} cores |");
    println!("|---|---|---|---|---|---|---|");
    let (rows, cols) = (4096usize, 4096usize);
    let bytes = rows * cols * 4;
    let src = vec![1.0f32; rows * cols];
    let mut dst = vec![0.0f32; rows * cols];
    let t_copy1 = median(9, || dst.copy_from_slice(std::hint::black_box(&src)));
    // Split as the runner splits a kernel: the first piece on this thread, the others on
    // the pool (`runner::call_kernel`).
    let chunk = src.len().div_ceil(cores);
    let t_copyn = median(9, || {
        let mut pieces = dst.chunks_mut(chunk).zip(std::hint::black_box(&src).chunks(chunk));
        let (d0, s0) = pieces.next().unwrap();
        rayon::in_place_scope(|scope| {
            for (d, s) in pieces {
                scope.spawn(move |_| d.copy_from_slice(s));
            }
            d0.copy_from_slice(s0);
        });
    });
    let t_copy = t_copy1.min(t_copyn);
    let gbs = |t: f64| 2.0 * bytes as f64 / t / 1e9;
    println!(
        "| memcpy | {rows}x{cols} f32 | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} |",
        t_copy1 * 1e3,
        t_copyn * 1e3,
        gbs(t_copyn),
        t_copy1 / t_copy,
        t_copyn / t_copy
    );
    let x = random(&[rows, cols], 1);
    let row = |seed| random(&[cols], seed);
    let cases: Vec<(&str, String, HashMap<String, Tensor>)> = vec![
        (
            "fused relu(x*a+b)",
            format!("graph g {{ input x: f32[{rows},{cols}] param a: f32[{cols}] = init ones param b: f32[{cols}] = init zeros m = mul(x, a) s = add(m, b) y = relu(s) output y }}"),
            HashMap::from([("a".to_string(), row(2)), ("b".to_string(), row(3))]),
        ),
        (
            "fused gelu(x*a+b)",
            format!("graph g {{ input x: f32[{rows},{cols}] param a: f32[{cols}] = init ones param b: f32[{cols}] = init zeros m = mul(x, a) s = add(m, b) y = gelu(s) output y }}"),
            HashMap::from([("a".to_string(), row(2)), ("b".to_string(), row(3))]),
        ),
        ("softmax(axis=-1)", format!("graph g {{ input x: f32[{rows},{cols}] y = softmax(x) output y }}"), HashMap::new()),
        (
            "layer_norm(axis=-1)",
            format!("graph g {{ input x: f32[{rows},{cols}] param a: f32[{cols}] = init ones param b: f32[{cols}] = init zeros y = layer_norm(x, a, b) output y }}"),
            HashMap::from([("a".to_string(), row(2)), ("b".to_string(), row(3))]),
        ),
    ];
    for (name, src, params) in cases {
        let inputs = HashMap::from([("x".to_string(), x.clone())]);
        let k1 = time_steps(compile_text(&src, &params, Emit::Memory), &inputs, 7, 1);
        let kn = time_steps(compile_text(&src, &params, Emit::Memory), &inputs, 7, cores);
        println!(
            "| {name} | {rows}x{cols} f32 | {:.2} | {:.2} | {:.1} | {:.2} | {:.2} |",
            k1 * 1e3,
            kn * 1e3,
            gbs(kn),
            k1 / t_copy,
            kn / t_copy
        );
    }
}

fn load_inputs(g: &Graph, graph: &Path) -> HashMap<String, Tensor> {
    let dir = graph.parent().unwrap().join("inputs");
    g.inputs.iter().map(|i| (i.name.clone(), Tensor::read_npy(&dir.join(format!("{}.npy", i.name))).unwrap())).collect()
}

fn graphs() {
    println!("\n## Testdata graphs (in-memory compile, native target)");
    println!("Arena: planned by liveness (`passes::buffers`) against the naive sum of all buffers.");
    println!("| graph | compile ms | run median µs | run median µs, naive arena | interpreter median µs | arena bytes | naive bytes | arena/naive |");
    println!("|---|---|---|---|---|---|---|---|");
    for path in testdata_graphs() {
        let (g, info) = load::load(&path).unwrap();
        let ps = params::load_all(&g, path.parent().unwrap()).unwrap();
        let inputs = load_inputs(&g, &path);
        let t_compile = median(3, || {
            compile::compile(&g, &info, &ps, &Options::default()).unwrap();
        });
        let c = compile::compile(&g, &info, &ps, &Options::default()).unwrap();
        let arena = c.programs[0].arena_bytes;
        let t_run = time_compiled(c, &inputs, 51);
        let naive = compile::compile(&g, &info, &ps, &Options { plan_arena: false, ..Options::default() }).unwrap();
        let naive_bytes = naive.programs[0].arena_bytes;
        let t_naive = time_compiled(naive, &inputs, 51);
        let mut values = inputs.clone();
        values.extend(ps.clone());
        let t_interp = median(5, || {
            meshc_ir::interp::run(&g, &info.order, &info.types, values.clone()).unwrap();
        });
        let name = path.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} | {arena} | {naive_bytes} | {:.1}% |",
            t_compile * 1e3,
            t_run * 1e6,
            t_naive * 1e6,
            t_interp * 1e6,
            100.0 * arena as f64 / naive_bytes as f64
        );
    }
}

/// Wall time of whole `meshc run` processes (start to exit, an upper bound on start to
/// first kernel) for artifacts whose weights are 16 MiB and 256 MiB. The one kernel gathers
/// a row of the weight, so all of it must be in the artifact (the artifact bytes column
/// shows it is) while the run touches one page of it.
fn load_time() {
    println!("\n## Artifact load (process start to exit of `meshc run --trust-weights`)");
    println!("| weights | artifact bytes | in-process open+load µs | process median ms |");
    println!("|---|---|---|---|");
    let meshc = Path::new(env!("CARGO_BIN_EXE_meshc"));
    let dir = std::env::temp_dir().join(format!("meshc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let x = dir.join("i.npy");
    Tensor::new(vec![1], Data::I32(vec![3])).write_npy(&x).unwrap();
    for mib in [16usize, 256] {
        let rows = mib << 14; // rows of 16 f32
        let src = format!(
            "graph load{mib} {{ input i: i32[1] param w: f32[{rows},16] = init zeros y = gather(w, i) {{axis = 0}} output y }}"
        );
        let w = Tensor::new(vec![rows, 16], Data::F32(vec![0.0; rows * 16]));
        let c = compile_text(&src, &HashMap::from([("w".to_string(), w)]), Emit::Artifact);
        let art = dir.join(format!("load{mib}.mshc"));
        meshc::artifact::write_artifact(&c, &art, None).unwrap();
        let size = std::fs::metadata(&art).unwrap().len();
        let t_open = median(21, || {
            let a = meshc_runtime::format::artifact::Artifact::open_with(
                &art,
                meshc_runtime::format::artifact::Verify::SkipBulk,
            )
            .unwrap();
            std::hint::black_box(meshc_runtime::exec::loader::load_artifact(a, "bench").unwrap());
        });
        let input = format!("i={}", x.display());
        let t_proc = median(21, || {
            let s = Command::new(meshc)
                .args(["run", art.to_str().unwrap(), "--trust-weights", "--input", &input])
                .output()
                .unwrap();
            assert!(s.status.success(), "{s:?}");
        });
        println!("| {mib} MiB | {size} | {:.0} | {:.2} |", t_open * 1e6, t_proc * 1e3);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    // `cargo bench` passes --bench; nothing else is expected.
    println!("# meshc pipeline benchmarks");
    kernels();
    graphs();
    load_time();
}
