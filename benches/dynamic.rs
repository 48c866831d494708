//! One artifact for every batch size and sequence length (docs/dynamic-shapes.md), in one
//! run: the 6-layer, 384-wide encoder (all-MiniLM-L6-v2's shapes) and the 3-layer one
//! (paraphrase-MiniLM-L3-v2's), ONNX exports `tools/gen_onnx_testdata.py` writes under
//! target/onnx-bench/, each compiled once with `--dim batch=1..32 --dim seq=1..256` and run
//! at six shapes against an artifact compiled for exactly that shape and against an
//! onnxruntime session (intra_op_num_threads = 2) on the same input files. Latencies are
//! the medians `meshc run --bench N` prints; compile times the wall time of one
//! `meshc compile` each. onnxruntime comes from target/onnx-venv (`make onnx-testdata`) or
//! `MESHC_ORT_PYTHON`; without one that column says "-", and without a Python that can run
//! the generator the bench says so and stops.
//!
//!     cargo bench --bench dynamic

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use meshc_ir::{Data, Tensor};

const SHAPES: &[(usize, usize)] = &[(1, 7), (1, 16), (2, 13), (4, 64), (8, 128), (32, 256)];
const BOUNDS: [&str; 4] = ["--dim", "batch=1..32", "--dim", "seq=1..256"];
/// Model, the generator's flag that writes it.
const MODELS: &[(&str, &str)] = &[("encoder_6x384", "--bench"), ("minilm_l3", "--minilm-l3")];

/// Runs at a shape: enough for a stable median at small shapes, a few at the largest.
fn runs((b, s): (usize, usize)) -> usize {
    (20_000 / (b * s)).clamp(5, 300)
}

fn python() -> PathBuf {
    std::env::var_os("MESHC_ORT_PYTHON").map_or_else(|| PathBuf::from("target/onnx-venv/bin/python"), PathBuf::from)
}

/// The model's ONNX file, written by the generator unless it is there already.
fn model(name: &str, flag: &str) -> Option<PathBuf> {
    let root = PathBuf::from("target/onnx-bench");
    let file = root.join(name).join("model.onnx");
    if !file.is_file() {
        let ok = Command::new(python()).arg("tools/gen_onnx_testdata.py").arg(flag).arg(&root).status();
        if !ok.is_ok_and(|s| s.success()) {
            return None;
        }
    }
    Some(file)
}

/// Writes the inputs at `(b, s)` into `dir` (hidden states seeded, the last two positions
/// of longer sequences masked), returning the `--input` arguments.
fn inputs(dir: &Path, (b, s): (usize, usize)) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut state = (b * 1000 + s) as u64 | 1;
    let x = (0..b * s * 384)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect();
    let mask = (0..b * s).map(|i| i64::from(s < 8 || i % s < s - 2)).collect();
    let files = [
        ("hidden_states", Tensor::f32(vec![b, s, 384], x)),
        ("attention_mask", Tensor { shape: vec![b, s], data: Data::I64(mask) }),
    ];
    files
        .iter()
        .flat_map(|(name, t)| {
            let f = dir.join(format!("{name}.npy"));
            t.write_npy(&f).unwrap();
            ["--input".to_string(), format!("{name}={}", f.display())]
        })
        .collect()
}

/// Compiles `model` with `dims` into `art`: the wall time (ms) and the artifact's bytes.
fn compile(meshc: &Path, model: &Path, dims: &[String], art: &Path) -> (f64, u64) {
    let t = Instant::now();
    let out = Command::new(meshc).arg("compile").arg(model).args(dims).arg("-o").arg(art).output().unwrap();
    assert!(out.status.success(), "compile {dims:?}: {}", String::from_utf8_lossy(&out.stderr));
    (t.elapsed().as_secs_f64() * 1e3, std::fs::metadata(art).unwrap().len())
}

/// The median latency (ms) `meshc run --bench` prints for `art` on `inputs`, its outputs
/// written to `out` (which the caller compares).
fn latency(meshc: &Path, art: &Path, inputs: &[String], runs: usize, out: &Path) -> f64 {
    let out = Command::new(meshc)
        .arg("run")
        .arg(art)
        .args(inputs)
        .arg("--output-dir")
        .arg(out)
        .args(["--bench", &runs.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "run {}: {}", art.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let median = text.split("median ").nth(1).and_then(|s| s.split(" ms").next()).unwrap_or_else(|| panic!("{text}"));
    median.parse().unwrap()
}

const ORT: &str = r#"
import os, sys, time, numpy as np, onnxruntime as ort
model = sys.argv[1]
o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
s = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
for arg in sys.argv[2:]:
    d, runs = arg.rsplit(":", 1)
    feed = {f[:-4]: np.load(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".npy")}
    for _ in range(3): s.run(None, feed)
    t = []
    for _ in range(int(runs)):
        a = time.perf_counter(); s.run(None, feed); t.append(time.perf_counter() - a)
    print(np.median(t) * 1e3)
"#;

/// onnxruntime's median latency (ms) per input dir, or `None` without a Python that has it.
fn ort_medians(model: &Path, dirs: &[(PathBuf, usize)]) -> Option<Vec<f64>> {
    let args = dirs.iter().map(|(d, r)| format!("{}:{r}", d.display()));
    let out = Command::new(python()).arg("-c").arg(ORT).arg(model).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().parse().ok()).collect()
}

/// The largest difference between the dynamic and the static artifact's outputs.
fn max_diff(a: &Path, b: &Path) -> f64 {
    let mut worst = 0.0f64;
    for f in std::fs::read_dir(b).unwrap() {
        let f = f.unwrap().path();
        let (x, y) = (Tensor::read_npy(&a.join(f.file_name().unwrap())).unwrap(), Tensor::read_npy(&f).unwrap());
        assert_eq!(x.shape, y.shape, "{}", f.display());
        for (p, q) in x.data.to_f64().iter().zip(y.data.to_f64()) {
            worst = worst.max((p - q).abs());
        }
    }
    worst
}

fn main() {
    let meshc = PathBuf::from(env!("CARGO_BIN_EXE_meshc"));
    let dir = std::env::temp_dir().join(format!("meshc-bench-dynamic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for &(name, flag) in MODELS {
        let Some(model) = model(name, flag) else {
            println!("{name}: not measured (no Python that can run tools/gen_onnx_testdata.py: make onnx-testdata)");
            continue;
        };
        let dyn_art = dir.join(format!("{name}-dynamic.mshc"));
        let bounds: Vec<String> = BOUNDS.iter().map(|s| s.to_string()).collect();
        let (dyn_compile, dyn_bytes) = compile(&meshc, &model, &bounds, &dyn_art);
        let mut rows = Vec::new();
        let mut feeds = Vec::new();
        for &(b, s) in SHAPES {
            let at = dir.join(format!("{name}-{b}x{s}"));
            let ins = inputs(&at.join("inputs"), (b, s));
            let dims = ["--dim".to_string(), format!("batch={b}"), "--dim".to_string(), format!("seq={s}")];
            let art = dir.join(format!("{name}-{b}x{s}.mshc"));
            let (compile_ms, bytes) = compile(&meshc, &model, &dims, &art);
            let n = runs((b, s));
            let (out_s, out_d) = (at.join("static"), at.join("dynamic"));
            let static_ms = latency(&meshc, &art, &ins, n, &out_s);
            let dynamic_ms = latency(&meshc, &dyn_art, &ins, n, &out_d);
            rows.push(((b, s), static_ms, dynamic_ms, compile_ms, bytes, max_diff(&out_d, &out_s)));
            feeds.push((at.join("inputs"), n));
        }
        let ort = ort_medians(&model, &feeds);
        println!("{name}: one artifact for batch=1..32, seq=1..256 against one per shape and onnxruntime (2 threads)");
        println!(
            "{:>9} {:>10} {:>11} {:>8} {:>14} {:>8} {:>10}",
            "shape", "static ms", "dynamic ms", "dyn/st", "onnxruntime ms", "dyn/ort", "max diff"
        );
        for (i, &((b, s), st, dy, _, _, diff)) in rows.iter().enumerate() {
            let shape = format!("{b}x{s}");
            match &ort {
                Some(o) => println!(
                    "{shape:>9} {st:>10.3} {dy:>11.3} {:>7.2}x {:>14.3} {:>7.2}x {diff:>10.1e}",
                    dy / st,
                    o[i],
                    dy / o[i]
                ),
                None => {
                    println!("{shape:>9} {st:>10.3} {dy:>11.3} {:>7.2}x {:>14} {:>8} {diff:>10.1e}", dy / st, "-", "-")
                }
            }
        }
        let mut compiles: Vec<f64> = rows.iter().map(|r| r.3).collect();
        compiles.sort_by(f64::total_cmp);
        let static_compile = compiles[compiles.len() / 2];
        let static_bytes = rows.iter().map(|r| r.4).max().unwrap_or(1);
        println!(
            "compile: dynamic {dyn_compile:.0} ms, static {static_compile:.0} ms (median over the shapes): {:.2}x",
            dyn_compile / static_compile
        );
        println!(
            "artifact: dynamic {dyn_bytes} bytes, static {static_bytes} bytes (the largest): {:.3}x",
            dyn_bytes as f64 / static_bytes as f64
        );
        if ort.is_none() {
            println!(
                "onnxruntime: not measured (no Python with onnxruntime: make onnx-testdata, or set MESHC_ORT_PYTHON)"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
