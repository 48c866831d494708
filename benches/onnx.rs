//! Imported CNN blocks (testdata/onnx: a ResNet basic block, MobileNetV2 inverted
//! residuals) through the real `meshc` binary against onnxruntime, in the same run: `meshc
//! run ARTIFACT --bench N` (compiled once, one device) and an onnxruntime session with
//! intra_op_num_threads = 2, each on the model's committed input. onnxruntime comes from
//! the venv `make onnx-testdata` makes (target/onnx-venv), or `MESHC_ORT_PYTHON`; without
//! one the bench says "onnxruntime: not measured".
//!
//!     cargo bench --bench onnx

use std::path::{Path, PathBuf};
use std::process::Command;

const MODELS: &[&str] = &["resnet_block", "mobilenet_block"];
const RUNS: usize = 300;

/// The median latency (ms) `meshc run --bench` prints.
fn meshc_median(meshc: &Path, model: &str, dir: &Path) -> f64 {
    let d = Path::new("testdata/onnx").join(model);
    let art = dir.join(format!("{model}.mshc"));
    let dims: Vec<String> = std::fs::read_to_string(d.join("dims.txt"))
        .unwrap()
        .lines()
        .flat_map(|l| ["--dim".to_string(), l.to_string()])
        .collect();
    let model_path = d.join("model.onnx");
    let out = Command::new(meshc).arg("compile").arg(&model_path).args(&dims).arg("-o").arg(&art).output().unwrap();
    assert!(out.status.success(), "compile {model}: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(meshc)
        .arg("run")
        .arg(&art)
        .arg("--input")
        .arg(format!("x={}", d.join("inputs/x.npy").display()))
        .arg("--output-dir")
        .arg(dir.join(model))
        .args(["--bench", &RUNS.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "run {model}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let median = text.split("median ").nth(1).and_then(|s| s.split(" ms").next()).unwrap_or_else(|| panic!("{text}"));
    median.parse().unwrap()
}

const ORT: &str = r#"
import sys, time, numpy as np, onnxruntime as ort
runs = int(sys.argv[1])
for m in sys.argv[2:]:
    o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
    s = ort.InferenceSession(f"testdata/onnx/{m}/model.onnx", o, providers=["CPUExecutionProvider"])
    x = np.load(f"testdata/onnx/{m}/inputs/x.npy")
    for _ in range(20): s.run(None, {"x": x})
    t = []
    for _ in range(runs):
        a = time.perf_counter(); s.run(None, {"x": x}); t.append(time.perf_counter() - a)
    print(m, np.median(t) * 1e3)
"#;

/// onnxruntime's median latency (ms) per model, or `None` without a Python that has it.
fn ort_medians() -> Option<Vec<f64>> {
    let python = std::env::var_os("MESHC_ORT_PYTHON")
        .map_or_else(|| PathBuf::from("target/onnx-venv/bin/python"), PathBuf::from);
    let out = Command::new(python).arg("-c").arg(ORT).arg(RUNS.to_string()).args(MODELS).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().map(|l| l.split_whitespace().nth(1)?.parse().ok()).collect()
}

fn main() {
    let meshc = PathBuf::from(env!("CARGO_BIN_EXE_meshc"));
    let dir = std::env::temp_dir().join(format!("meshc-bench-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours: Vec<f64> = MODELS.iter().map(|m| meshc_median(&meshc, m, &dir)).collect();
    let ort = ort_medians();
    let _ = std::fs::remove_dir_all(&dir);
    println!("{:<18} {:>14} {:>18} {:>8}", "model", "meshc ms", "onnxruntime ms", "ratio");
    for (i, m) in MODELS.iter().enumerate() {
        match &ort {
            Some(o) => println!("{m:<18} {:>14.4} {:>18.4} {:>7.2}x", ours[i], o[i], ours[i] / o[i]),
            None => println!("{m:<18} {:>14.4} {:>18}", ours[i], "-"),
        }
    }
    if ort.is_none() {
        println!("onnxruntime: not measured (no Python with onnxruntime: make onnx-testdata, or set MESHC_ORT_PYTHON)");
    }
}
