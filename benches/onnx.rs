//! Imported ONNX models through the real `meshc` binary against onnxruntime, in the same
//! run: the blocks of testdata/onnx (a BERT encoder block, a GPT-2 decoder block, a ResNet
//! basic block, MobileNetV2 inverted residuals) and a 6-layer, 384-wide encoder
//! (all-MiniLM-L6-v2's shapes) that `tools/gen_onnx_testdata.py --bench` writes under
//! target/onnx-bench/. Per model: `meshc compile MODEL.onnx` (import + compile, wall time,
//! the median of 3), `meshc run ARTIFACT --bench N` (one device) and an onnxruntime session
//! with intra_op_num_threads = 2, each on the model's input files. onnxruntime comes from
//! the venv `make onnx-testdata` makes (target/onnx-venv), or `MESHC_ORT_PYTHON`; without
//! one the bench says "onnxruntime: not measured" (and skips the generated encoder).
//!
//!     cargo bench --bench onnx

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const MODELS: &[&str] = &["encoder", "gpt2_block", "resnet_block", "mobilenet_block"];
const GENERATED: &str = "encoder_6x384";
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

/// The median wall time (ms) of `meshc compile MODEL.onnx`, and the median latency (ms)
/// `meshc run --bench` prints for its artifact.
fn meshc_medians(meshc: &Path, d: &Path, dir: &Path) -> (f64, f64) {
    let name = d.file_name().unwrap().to_string_lossy().to_string();
    let art = dir.join(format!("{name}.mshc"));
    let mut compiles: Vec<f64> = (0..COMPILES)
        .map(|_| {
            let t = Instant::now();
            let out =
                Command::new(meshc).arg("compile").arg(d.join("model.onnx")).args(dims(d)).arg("-o").arg(&art).output();
            let out = out.unwrap();
            assert!(out.status.success(), "compile {name}: {}", String::from_utf8_lossy(&out.stderr));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    compiles.sort_by(f64::total_cmp);
    let out = Command::new(meshc)
        .arg("run")
        .arg(&art)
        .args(inputs(d))
        .arg("--check-against")
        .arg(d.join("expected"))
        .arg("--output-dir")
        .arg(dir.join(&name))
        .args(["--bench", &RUNS.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "run {name}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let median = text.split("median ").nth(1).and_then(|s| s.split(" ms").next()).unwrap_or_else(|| panic!("{text}"));
    (compiles[COMPILES / 2], median.parse().unwrap())
}

const ORT: &str = r#"
import os, sys, time, numpy as np, onnxruntime as ort
runs = int(sys.argv[1])
for d in sys.argv[2:]:
    o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
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

/// onnxruntime's median latency (ms) per model dir, or `None` without a Python that has it.
fn ort_medians(dirs: &[PathBuf]) -> Option<Vec<f64>> {
    let out = Command::new(python()).arg("-c").arg(ORT).arg(RUNS.to_string()).args(dirs).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().map(|l| l.split_whitespace().nth(1)?.parse().ok()).collect()
}

/// The generated encoder's dir, written by the generator unless it is there already;
/// `None` without a Python that can run the generator.
fn generated() -> Option<PathBuf> {
    let root = PathBuf::from("target/onnx-bench");
    let d = root.join(GENERATED);
    if !d.join("model.onnx").is_file() {
        let ok = Command::new(python()).arg("tools/gen_onnx_testdata.py").arg("--bench").arg(&root).status();
        if !ok.is_ok_and(|s| s.success()) {
            return None;
        }
    }
    Some(d)
}

fn main() {
    let meshc = PathBuf::from(env!("CARGO_BIN_EXE_meshc"));
    let dir = std::env::temp_dir().join(format!("meshc-bench-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut dirs: Vec<PathBuf> = MODELS.iter().map(|m| Path::new("testdata/onnx").join(m)).collect();
    dirs.extend(generated());
    let ours: Vec<(f64, f64)> = dirs.iter().map(|d| meshc_medians(&meshc, d, &dir)).collect();
    let ort = ort_medians(&dirs);
    let _ = std::fs::remove_dir_all(&dir);
    println!("{:<18} {:>16} {:>12} {:>16} {:>8}", "model", "compile ms", "meshc ms", "onnxruntime ms", "ratio");
    for (i, d) in dirs.iter().enumerate() {
        let m = d.file_name().unwrap().to_string_lossy();
        let (compile, run) = ours[i];
        match &ort {
            Some(o) => println!("{m:<18} {compile:>16.1} {run:>12.4} {:>16.4} {:>7.2}x", o[i], run / o[i]),
            None => println!("{m:<18} {compile:>16.1} {run:>12.4} {:>16}", "-"),
        }
    }
    if ort.is_none() {
        println!("onnxruntime: not measured (no Python with onnxruntime: make onnx-testdata, or set MESHC_ORT_PYTHON)");
    }
}
