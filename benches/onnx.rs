//! Imported ONNX models through the real `meshc` binary against onnxruntime, in the same
//! run: the blocks of testdata/onnx (a BERT encoder block, a GPT-2 decoder block, a ResNet
//! basic block, MobileNetV2 inverted residuals) and a 6-layer, 384-wide encoder
//! (all-MiniLM-L6-v2's shapes) that `tools/gen_onnx_testdata.py --bench` writes under
//! target/onnx-bench/. Per model: `meshc compile MODEL.onnx` (import + compile, wall time,
//! the median of 3), `meshc run ARTIFACT --bench N` (one device) and an onnxruntime session
//! with intra_op_num_threads = 2, each on the model's input files. Then the two whole
//! convolution networks the generator writes beside the encoder (YOLOv8n's layers at
//! 640x640 and ResNet-50's at 224x224, batch 1), compiled once and each run at 1 and 2
//! threads (`meshc run --threads N`, intra_op_num_threads = N). onnxruntime comes from
//! the venv `make onnx-testdata` makes (target/onnx-venv), or `MESHC_ORT_PYTHON`; without
//! one the bench says "onnxruntime: not measured" (and skips the generated encoder).
//!
//!     cargo bench --bench onnx

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use meshc_ir::Tensor;

const MODELS: &[&str] = &["encoder", "gpt2_block", "resnet_block", "mobilenet_block"];
const GENERATED: &str = "encoder_6x384";
/// The generated convolution networks, with the runs each timing takes (they take tens to
/// hundreds of milliseconds a run).
const CNNS: &[(&str, usize)] = &[("yolov8n", 20), ("resnet50", 20)];
const RUNS: usize = 300;
const COMPILES: usize = 3;

/// `--dim NAME=N` for each line of the model's dims.txt.
fn dims(d: &Path) -> Vec<String> {
    std::fs::read_to_string(d.join("dims.txt"))
        .unwrap()
        .lines()
        .flat_map(|l| ["--dim".to_string(), l.to_string()])
        .collect()
}

/// `--input NAME=FILE` for each file of the model's inputs/.
fn inputs(d: &Path) -> Vec<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(d.join("inputs")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| ["--input".to_string(), format!("{}={}", f.file_stem().unwrap().to_string_lossy(), f.display())])
        .collect()
}

/// The median wall time (ms) of `compiles` runs of `meshc compile MODEL.onnx` into
/// `dir/NAME.mshc`.
fn compile(meshc: &Path, d: &Path, dir: &Path, compiles: usize) -> f64 {
    let name = d.file_name().unwrap().to_string_lossy().to_string();
    let art = dir.join(format!("{name}.mshc"));
    let mut times: Vec<f64> = (0..compiles)
        .map(|_| {
            let t = Instant::now();
            let out =
                Command::new(meshc).arg("compile").arg(d.join("model.onnx")).args(dims(d)).arg("-o").arg(&art).output();
            let out = out.unwrap();
            assert!(out.status.success(), "compile {name}: {}", String::from_utf8_lossy(&out.stderr));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[compiles / 2]
}

/// The median latency (ms) `meshc run --bench` prints for the artifact `compile` wrote,
/// on `threads` cores (all without), its outputs written to `dir/NAME/`: checked against
/// the model's expected ones with `--check-against` when `check`.
fn latency(meshc: &Path, d: &Path, dir: &Path, runs: usize, threads: Option<usize>, check: bool) -> f64 {
    let name = d.file_name().unwrap().to_string_lossy().to_string();
    let threads = threads.map(|t| ["--threads".to_string(), t.to_string()]);
    let check = check.then(|| ["--check-against".into(), d.join("expected").into_os_string()]);
    let out = Command::new(meshc)
        .arg("run")
        .arg(dir.join(format!("{name}.mshc")))
        .args(inputs(d))
        .args(threads.iter().flatten())
        .args(check.iter().flatten())
        .arg("--output-dir")
        .arg(dir.join(&name))
        .args(["--bench", &runs.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "run {name}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let median = text.split("median ").nth(1).and_then(|s| s.split(" ms").next()).unwrap_or_else(|| panic!("{text}"));
    median.parse().unwrap()
}

const ORT: &str = r#"
import os, sys, time, numpy as np, onnxruntime as ort
runs, threads = int(sys.argv[1]), int(sys.argv[2])
for d in sys.argv[3:]:
    o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.inter_op_num_threads = 1
    s = ort.InferenceSession(os.path.join(d, "model.onnx"), o, providers=["CPUExecutionProvider"])
    feed = {f[:-4]: np.load(os.path.join(d, "inputs", f)) for f in os.listdir(os.path.join(d, "inputs"))}
    for _ in range(20): s.run(None, feed)
    t = []
    for _ in range(runs):
        a = time.perf_counter(); s.run(None, feed); t.append(time.perf_counter() - a)
    print(d, np.median(t) * 1e3)
"#;

fn python() -> PathBuf {
    std::env::var_os("MESHC_ORT_PYTHON").map_or_else(|| PathBuf::from("target/onnx-venv/bin/python"), PathBuf::from)
}

/// onnxruntime's median latency (ms) of `runs` runs per model dir on `threads` threads, or
/// `None` without a Python that has it.
fn ort_medians(dirs: &[PathBuf], runs: usize, threads: usize) -> Option<Vec<f64>> {
    let (runs, threads) = (runs.to_string(), threads.to_string());
    let out = Command::new(python()).arg("-c").arg(ORT).arg(runs).arg(threads).args(dirs).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().map(|l| l.split_whitespace().nth(1)?.parse().ok()).collect()
}

/// The dir of the generated model `name`, written by the generator (with the others) unless
/// it is there already; `None` without a Python that can run the generator.
fn generated(name: &str) -> Option<PathBuf> {
    let root = PathBuf::from("target/onnx-bench");
    let d = root.join(name);
    if !d.join("model.onnx").is_file() {
        let ok = Command::new(python()).arg("tools/gen_onnx_testdata.py").arg("--bench").arg(&root).status();
        if !ok.is_ok_and(|s| s.success()) {
            return None;
        }
    }
    Some(d)
}

/// Checks every output in `got` against `want` to 1e-4 of the output's largest magnitude:
/// a deep network's sums cancel, so an output element near 0 carries the rounding of much
/// larger terms, beyond what `--check-against` allows it relative to itself.
fn check_deep(want: &Path, got: &Path) {
    for f in std::fs::read_dir(want).unwrap() {
        let f = f.unwrap().path();
        let w = Tensor::read_npy(&f).unwrap().data.to_f64();
        let g = Tensor::read_npy(&got.join(f.file_name().unwrap())).unwrap().data.to_f64();
        let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let err = w.iter().zip(&g).fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            w.len() == g.len() && err <= 1e-4 * scale,
            "{}: max abs error {err:e}, largest |value| {scale:e}",
            f.display()
        );
    }
}

fn main() {
    let meshc = PathBuf::from(env!("CARGO_BIN_EXE_meshc"));
    let dir = std::env::temp_dir().join(format!("meshc-bench-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut dirs: Vec<PathBuf> = MODELS.iter().map(|m| Path::new("testdata/onnx").join(m)).collect();
    dirs.extend(generated(GENERATED));
    let ours: Vec<(f64, f64)> =
        dirs.iter().map(|d| (compile(&meshc, d, &dir, COMPILES), latency(&meshc, d, &dir, RUNS, None, true))).collect();
    let ort = ort_medians(&dirs, RUNS, 2);
    println!("{:<18} {:>16} {:>12} {:>16} {:>8}", "model", "compile ms", "meshc ms", "onnxruntime ms", "ratio");
    for (i, d) in dirs.iter().enumerate() {
        let m = d.file_name().unwrap().to_string_lossy();
        let (compile, run) = ours[i];
        match &ort {
            Some(o) => println!("{m:<18} {compile:>16.1} {run:>12.4} {:>16.4} {:>7.2}x", o[i], run / o[i]),
            None => println!("{m:<18} {compile:>16.1} {run:>12.4} {:>16}", "-"),
        }
    }
    for &(name, runs) in CNNS {
        let Some(d) = generated(name) else { continue };
        let compile_ms = compile(&meshc, &d, &dir, 1);
        for threads in [1, 2] {
            let run = latency(&meshc, &d, &dir, runs, Some(threads), false);
            check_deep(&d.join("expected"), &dir.join(name));
            let m = format!("{name} ({threads} thr)");
            match ort_medians(std::slice::from_ref(&d), runs, threads) {
                Some(o) => println!("{m:<18} {compile_ms:>16.1} {run:>12.4} {:>16.4} {:>7.2}x", o[0], run / o[0]),
                None => println!("{m:<18} {compile_ms:>16.1} {run:>12.4} {:>16}", "-"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if ort.is_none() {
        println!("onnxruntime: not measured (no Python with onnxruntime: make onnx-testdata, or set MESHC_ORT_PYTHON)");
    }
}
