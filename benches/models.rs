//! `cargo bench --bench models`: meshc on real-model shapes beside the engines it competes
//! with, all measured in this one run on this machine:
//!
//! - the 6-layer, 384-wide, 12-head GELU encoder (all-MiniLM-L6-v2's shapes; seeded weights
//!   written as a `.safetensors` checkpoint by `common::encoder`) at batch 2 × 13 and 32 × 128,
//!   meshc on 1 and 2 threads against JAX/XLA and onnxruntime (1 and 2 intra-op threads) on
//!   the same weights and inputs (`tools/bench_models.py`, which checks its output against
//!   meshc's), and a per-GEMM table of meshc's run (shape, GFLOP/s, share of the run);
//! - the 2×4-mesh MLP of the mesh bench against XLA on the one machine;
//! - the encoder compiled to an artifact: `meshc run` from process start to result.
//!
//! The anchors run in Python: XLA with the first of `$MESHC_BENCH_PYTHON`,
//! `target/jax-venv/bin/python`, `target/onnx-venv/bin/python`, `python3` that imports jax
//! (`python3 -m venv target/jax-venv && target/jax-venv/bin/pip install jax`), onnxruntime
//! with the first that imports onnx and onnxruntime (`make onnx-testdata` makes
//! target/onnx-venv); an engine not found prints "not measured". Figures are medians of N
//! runs (`MODELS_BENCH_RUNS` scales N); ratios are meshc's median over the anchor's.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::encoder::{encoder, layer_params, write_safetensors, Scratch};
use common::median;
use meshc::compile::Options;
use meshc::driver;
use meshc::pipeline::Dumps;
use meshc_ir::{params, text, verify, Data, Tensor};
use meshc_runtime::exec::runner::Loaded;
use meshc_runtime::format::program::{Exec, Library, Matmul};

const LAYERS: usize = 6;
const WIDTH: usize = 384;
const HEADS: usize = 12;
const FFN: usize = 4 * WIDTH;

/// The number of timed runs of a case whose single run takes about `secs`: enough for
/// a stable median within a few seconds per engine, scaled by `MODELS_BENCH_RUNS`/100.
fn runs_for(secs: f64) -> usize {
    let scale = std::env::var("MODELS_BENCH_RUNS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(100.0);
    ((2.0 / secs.max(1e-6)).clamp(5.0, 300.0) * scale / 100.0).max(3.0) as usize
}

/// The Python interpreters the anchors may run in, in order of preference.
fn pythons() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v: Vec<PathBuf> = std::env::var_os("MESHC_BENCH_PYTHON").map(PathBuf::from).into_iter().collect();
    v.extend(["target/jax-venv/bin/python", "target/onnx-venv/bin/python"].map(|p| root.join(p)));
    v.push("python3".into());
    v
}

/// The first interpreter that imports every module of `modules`.
fn python_with(modules: &str) -> Option<PathBuf> {
    pythons()
        .into_iter()
        .find(|p| Command::new(p).args(["-c", &format!("import {modules}")]).output().is_ok_and(|o| o.status.success()))
}

/// An anchor's figures: median and first-call milliseconds, max abs difference from meshc.
struct Anchor {
    median_ms: f64,
    first_ms: f64,
    max_abs_err: Option<f64>,
}

/// Runs `tools/bench_models.py` with `args` under `python`; `Err` says why not.
fn anchor(python: &Path, args: &[String]) -> Result<Anchor, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/bench_models.py");
    let out = Command::new(python).arg(script).args(args).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let num = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
    Ok(Anchor {
        median_ms: num("median_ms").ok_or("no median_ms")?,
        first_ms: num("first_ms").ok_or("no first_ms")?,
        max_abs_err: num("max_abs_err"),
    })
}

/// Seconds of one run of `l` on `inputs`.
fn time_run(l: &Loaded, inputs: &HashMap<String, Tensor>) -> f64 {
    let s = Instant::now();
    l.run(inputs).unwrap();
    s.elapsed().as_secs_f64()
}

/// Flops of one encoder run on `b` × `s` tokens: its six GEMMs per layer and attention's two
/// batched products.
fn encoder_flops(b: usize, s: usize) -> f64 {
    let (d, f) = (WIDTH as f64, FFN as f64);
    let tokens = (b * s) as f64;
    LAYERS as f64 * (2.0 * tokens * (4.0 * d * d + 2.0 * d * f) + 4.0 * tokens * s as f64 * d)
}

/// Seeded inputs of the encoder: `x` in [-1, 1), a mask that hides the last two tokens of
/// every other sequence.
fn encoder_inputs(b: usize, s: usize) -> HashMap<String, Tensor> {
    let x = (0..b * s * WIDTH).map(|i| ((i * 7919) % 2003) as f32 / 1001.5 - 1.0).collect();
    let mask = (0..b * s).map(|i| if (i / s) % 2 == 1 && i % s >= s - 2 { -1e9 } else { 0.0 }).collect();
    HashMap::from([
        ("x".to_string(), Tensor::new(vec![b, s, WIDTH], Data::F32(x))),
        ("mask".to_string(), Tensor::new(vec![b, 1, 1, s], Data::F32(mask))),
    ])
}

/// The per-GEMM table of one run of `l` (steps summed over `runs` runs): for each library
/// matmul shape, its calls per run, time per call, GFLOP/s and share of the run's step time.
fn gemm_table(l: &Loaded, inputs: &HashMap<String, Tensor>, runs: usize) {
    let mut by_shape: BTreeMap<(Vec<usize>, Vec<usize>), (usize, Duration)> = BTreeMap::new();
    let mut total = Duration::ZERO;
    for _ in 0..runs {
        l.run_timed(inputs, &mut |t| {
            total += t.dur;
            if let Exec::Library(Library::Matmul(Matmul { a, b, .. })) = &l.programs[t.device].steps[t.step].exec {
                let e = by_shape.entry((a.clone(), b.clone())).or_default();
                e.0 += 1;
                e.1 += t.dur;
            }
        })
        .unwrap();
    }
    println!("  {:<28} {:>6} {:>10} {:>9} {:>7}", "meshc GEMM [a] @ [b]", "calls", "µs/call", "GFLOP/s", "share");
    let mut gemms = Duration::ZERO;
    for ((a, b), (calls, dur)) in by_shape {
        let flops = 2.0 * a.iter().product::<usize>() as f64 * b[b.len() - 1] as f64;
        let per = dur.as_secs_f64() / calls as f64;
        let shape = |s: &[usize]| s.iter().map(usize::to_string).collect::<Vec<_>>().join("x");
        println!(
            "  {:<28} {:>6} {:>10.1} {:>9.1} {:>6.1}%",
            format!("{} @ {}", shape(&a), shape(&b)),
            calls / runs,
            per * 1e6,
            flops / per / 1e9,
            100.0 * dur.as_secs_f64() / total.as_secs_f64()
        );
        gemms += dur;
    }
    println!(
        "  {:<28} {:>6} {:>10} {:>9} {:>6.1}%",
        "everything else",
        "",
        "",
        "",
        100.0 * (1.0 - gemms.as_secs_f64() / total.as_secs_f64())
    );
}

/// The steps of layer 0's attention, from the head splits to the merge of the heads: µs
/// per run of each step of each program, medians over `runs` runs on 2 threads (the fused
/// program's attention step is `l0_ctx`).
fn attention_table(programs: &[(&str, &Loaded)], inputs: &HashMap<String, Tensor>, runs: usize) {
    const STEPS: [&str; 8] = ["l0_q_h", "l0_k_t", "l0_v_h", "l0_scores", "l0_masked", "l0_probs", "l0_ctx", "l0_ctx_t"];
    println!("  layer 0 attention, µs per run (2 threads, median of {runs}):");
    for (what, l) in programs {
        let mut per: Vec<Vec<f64>> = vec![Vec::new(); STEPS.len()];
        for _ in 0..runs {
            let mut run = [0.0; STEPS.len()];
            l.run_timed(inputs, &mut |t| {
                let node = &l.programs[t.device].steps[t.step].node;
                if let Some(k) = STEPS.iter().position(|s| s == node) {
                    run[k] += t.dur.as_secs_f64() * 1e6;
                }
            })
            .unwrap();
            per.iter_mut().zip(run).for_each(|(p, r)| p.push(r));
        }
        let cells: Vec<(&str, f64)> =
            STEPS.iter().zip(per).map(|(s, t)| (*s, median(t))).filter(|(_, t)| *t > 0.0).collect();
        let total: f64 = cells.iter().map(|c| c.1).sum();
        let list: Vec<String> = cells.iter().map(|(s, t)| format!("{} {t:.0}", &s[3..])).collect();
        println!("    {what:<9} {total:>8.0} µs = {}", list.join(" + "));
    }
}

/// The encoder at batch `b` × `s`: meshc on 1 and 2 threads, the anchors, the GEMM table.
/// Leaves the graph, checkpoint and inputs in `dir`.
fn encoder_case(dir: &Path, (b, s): (usize, usize), anchors: &Anchors) {
    let params: Vec<_> = (0..LAYERS).flat_map(|l| layer_params(l, WIDTH, FFN)).collect();
    write_safetensors(&dir.join("model.safetensors"), &params, &mut 0x9E37_79B9_7F4A_7C15, false);
    let src = encoder(LAYERS, WIDTH, HEADS, FFN, (b, s), "model.safetensors", false);
    std::fs::write(dir.join("encoder.txt"), &src).unwrap();
    let g = text::parse(&src).expect("the encoder parses");
    let info = verify::verify(&g).expect("the encoder verifies");
    let values = params::load_all(&g, dir).expect("the checkpoint loads");
    let build = |epilogues, attention| {
        let opts = Options { epilogues, attention, ..Options::default() };
        driver::Job::new(&g, &info, &values, &opts).build(&Dumps::default()).unwrap().load().unwrap()
    };
    let (mut l, mut unfused, mut apart) = (build(true, true), build(false, true), build(true, false));
    let inputs = encoder_inputs(b, s);
    for (name, t) in &inputs {
        t.write_npy(&dir.join(format!("{name}.npy"))).unwrap();
    }
    let flops = encoder_flops(b, s);
    println!(
        "\n## encoder {LAYERS}x{WIDTH}, {HEADS} heads, GELU FFN {FFN}, batch {b} x {s}: {:.3} GFLOP per run",
        flops / 1e9
    );
    let probe = Instant::now();
    l.run(&inputs).unwrap();
    let runs = runs_for(probe.elapsed().as_secs_f64());
    // 1 and 2 threads, and the programs without epilogues and without fused attention on
    // 2, alternate, so that all see the same load from the rest of the machine; the 2-thread
    // runs change places every round, so that none always follows the 1-thread run.
    let mut times = [Vec::new(), Vec::new()];
    let (mut plain, mut separate) = (Vec::new(), Vec::new());
    unfused.set_threads(2);
    apart.set_threads(2);
    for round in 0..runs {
        l.set_threads(1);
        times[0].push(time_run(&l, &inputs));
        l.set_threads(2);
        for k in 0..3 {
            match (round + k) % 3 {
                0 => times[1].push(time_run(&l, &inputs)),
                1 => plain.push(time_run(&unfused, &inputs)),
                _ => separate.push(time_run(&apart, &inputs)),
            }
        }
    }
    l.run(&inputs).unwrap().values().next().unwrap().write_npy(&dir.join("y.npy")).unwrap();
    let meshc = times.map(median);
    let row = |name: &str, ms: f64, vs: &str| {
        println!("  {name:<22} {ms:>9.3} ms {:>8.1} GFLOP/s  {vs}", flops / ms / 1e6);
    };
    println!("  median of {runs} runs");
    row("meshc 1 thread", meshc[0] * 1e3, "");
    row("meshc 2 threads", meshc[1] * 1e3, &format!("({:.2}x the 1-thread run)", meshc[0] / meshc[1]));
    let plain = median(plain);
    row("  without epilogues", plain * 1e3, &format!("(with / without = {:.3})", meshc[1] / plain));
    let separate = median(separate);
    row("  without attention", separate * 1e3, &format!("(fused / separate = {:.3})", meshc[1] / separate));
    let dir_s = dir.display().to_string();
    let common_args = |engine: &str, threads: usize| -> Vec<String> {
        let mut v: Vec<String> = ["encoder", &dir_s, "--engine", engine].map(String::from).to_vec();
        for (k, n) in
            [("--layers", LAYERS), ("--width", WIDTH), ("--heads", HEADS), ("--threads", threads), ("--runs", runs)]
        {
            v.extend([k.to_string(), n.to_string()]);
        }
        v
    };
    for (label, engine, threads) in [("ORT 1 thread", "ort", 1), ("ORT 2 threads", "ort", 2), ("XLA", "xla", 2)] {
        let python = if engine == "ort" { &anchors.ort } else { &anchors.xla };
        let Some(python) = python else {
            println!("  {label:<22} not measured ({} not found)", if engine == "ort" { "onnxruntime" } else { "jax" });
            continue;
        };
        match anchor(python, &common_args(engine, threads)) {
            Ok(a) => {
                let err = a.max_abs_err.unwrap_or(f64::NAN);
                assert!(err < 1e-2, "{label} computes another function: max abs difference from meshc {err}");
                let mine = meshc[threads.min(2) - 1] * 1e3;
                row(label, a.median_ms, &format!("meshc {threads}T / {label} = {:.2}", mine / a.median_ms));
                if engine == "xla" {
                    println!(
                        "  {:<22} first call (with compiling) {:.0} ms; max |XLA - meshc| {err:.1e}",
                        "", a.first_ms
                    );
                } else {
                    println!("  {:<22} max |ORT - meshc| {err:.1e}", "");
                }
            }
            Err(e) => println!("  {label:<22} not measured ({e})"),
        }
    }
    l.set_threads(2);
    attention_table(&[("fused", &l), ("separate", &apart)], &inputs, runs.min(50));
    for (what, l) in [("", &l), (" (without epilogues)", &unfused)] {
        println!("  per GEMM{what}:");
        gemm_table(l, &inputs, runs.min(50));
        let p = &l.programs[0];
        let split = p.steps.iter().filter(|st| matches!(st.exec, Exec::Kernel(k) if p.kernels[k].parts > 1)).count();
        let library = p.steps.iter().filter(|st| matches!(st.exec, Exec::Library(_))).count();
        println!(
            "  steps per run: {} ({split} generated kernels that split over the cores, {library} library matmuls)",
            p.steps.len()
        );
    }
}

/// Microseconds of one fork/join of a step over two cores with no work: the runner's
/// (`meshc_runtime::kernels::pool::split`, two parts) and a rayon scope entered from outside its pool
/// (one part spawned, one run here: how the runner split a step before), back to back
/// and after a 200 µs pause of this thread (the pool's thread gone idle, as between steps
/// that do not split).
fn fork_join_cost() {
    let pool = || {
        meshc_runtime::kernels::pool::split(2, &|p| {
            std::hint::black_box(p);
        })
    };
    let rayon = || rayon::in_place_scope(|s| s.spawn(|_| std::hint::black_box(())));
    let time = |fork: &dyn Fn(), pause: Option<Duration>| {
        fork();
        let t = (0..2000)
            .map(|_| {
                if let Some(p) = pause {
                    let s = Instant::now();
                    while s.elapsed() < p {
                        std::hint::spin_loop();
                    }
                }
                let s = Instant::now();
                fork();
                s.elapsed().as_secs_f64()
            })
            .collect();
        median(t) * 1e6
    };
    println!("\n## fork/join of a step over 2 cores, no work (µs, median of 2000)");
    for (label, fork) in [("meshc pool", &pool as &dyn Fn()), ("rayon scope", &rayon)] {
        let pause = Some(Duration::from_micros(200));
        println!("  {label:<22} {:>6.1} back to back {:>6.1} 200 µs apart", time(fork, None), time(fork, pause));
    }
}

/// The mesh bench's MLP on the 2×4 mesh against XLA on the same machine.
fn mlp_case(anchors: &Anchors) {
    use common::mlp::{build_with, input, B, D, H, SPEC_2X4};
    let flops = 4.0 * (B * D * H) as f64;
    let build = |epilogues| build_with(Some(SPEC_2X4), &Options { epilogues, ..Options::default() }).load().unwrap();
    let (l, unfused) = (build(true), build(false));
    let x = input();
    let probe = Instant::now();
    l.run(&x).unwrap();
    let runs = runs_for(probe.elapsed().as_secs_f64());
    let (mut t, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        t.push(time_run(&l, &x));
        plain.push(time_run(&unfused, &x));
    }
    let (t, plain) = (median(t), median(plain));
    println!("\n## MLP [{B},{D}]·[{D},{H}] → relu → ·[{H},{D}], {:.2} GFLOP per run, median of {runs}", flops / 1e9);
    println!("  {:<22} {:>9.3} ms {:>8.1} GFLOP/s", "meshc 2x4 mesh", t * 1e3, flops / t / 1e9);
    println!(
        "  {:<22} {:>9.3} ms {:>8.1} GFLOP/s  (with / without = {:.3})",
        "  without epilogues",
        plain * 1e3,
        flops / plain / 1e9,
        t / plain
    );
    let Some(python) = &anchors.xla else {
        println!("  XLA: not measured (jax not found)");
        return;
    };
    match anchor(python, &["mlp".into(), "--engine".into(), "xla".into(), "--runs".into(), runs.to_string()]) {
        Ok(a) => println!(
            "  {:<22} {:>9.3} ms {:>8.1} GFLOP/s  meshc / XLA = {:.2}",
            "XLA",
            a.median_ms,
            flops / a.median_ms / 1e6,
            t * 1e3 / a.median_ms
        ),
        Err(e) => println!("  XLA: not measured ({e})"),
    }
}

/// `meshc run` of the encoder's artifact (compiled from `dir`'s graph), from process start
/// to its outputs written: median wall time, with the weights checksum and without.
fn process_case(dir: &Path) {
    let meshc = env!("CARGO_BIN_EXE_meshc");
    let art = dir.join("encoder.mshc");
    let status = Command::new(meshc)
        .arg("compile")
        .arg(dir.join("encoder.txt"))
        .arg("-o")
        .arg(&art)
        .status()
        .expect("meshc starts");
    assert!(status.success(), "meshc compile failed");
    println!("\n## the 2 x 13 encoder's artifact, `meshc run` from process start to result (median of 15)");
    for (label, extra) in [("weights checked", None), ("--trust-weights", Some("--trust-weights"))] {
        let t = (0..15)
            .map(|_| {
                let mut c = Command::new(meshc);
                c.arg("run").arg(&art).args(extra);
                for n in ["x", "mask"] {
                    c.arg("--input").arg(format!("{n}={}", dir.join(format!("{n}.npy")).display()));
                }
                c.arg("--output-dir").arg(dir.join("out"));
                let s = Instant::now();
                let out = c.output().expect("meshc starts");
                assert!(out.status.success(), "meshc run failed: {}", String::from_utf8_lossy(&out.stderr));
                s.elapsed().as_secs_f64()
            })
            .collect();
        println!("  {label:<22} {:>9.1} ms", median(t) * 1e3);
    }
}

/// Where each anchor engine runs: a Python that imports it, if any.
struct Anchors {
    xla: Option<PathBuf>,
    ort: Option<PathBuf>,
}

fn main() {
    common::isa_from_env();
    let anchors = Anchors { xla: python_with("jax"), ort: python_with("onnx, onnxruntime") };
    if anchors.xla.is_none() {
        println!("XLA: not measured (no Python with jax; python3 -m venv target/jax-venv && target/jax-venv/bin/pip install jax)");
    }
    let scratch = |what: &str| {
        let dir = std::env::temp_dir().join(format!("meshc-bench-models-{}-{what}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir, "MESHC_MODELS_KEEP")
    };
    fork_join_cost();
    let small = scratch("2x13");
    encoder_case(&small.0, (2, 13), &anchors);
    encoder_case(&scratch("32x128").0, (32, 128), &anchors);
    mlp_case(&anchors);
    process_case(&small.0);
}
