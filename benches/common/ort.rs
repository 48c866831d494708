//! The onnxruntime-anchored ONNX benches' shared steps (`dynamic`, `int8`): the generator's
//! models under target/onnx-bench/, seeded encoder inputs, `meshc compile` and `meshc run
//! --bench` timed, and onnxruntime's medians on the same files (intra_op_num_threads = 2).
//! onnxruntime comes from target/onnx-venv (`make onnx-testdata`) or `MESHC_ORT_PYTHON`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use meshc_ir::{Data, Tensor};

pub fn python() -> PathBuf {
    std::env::var_os("MESHC_ORT_PYTHON").map_or_else(|| PathBuf::from("target/onnx-venv/bin/python"), PathBuf::from)
}

/// The model's ONNX file, written by the generator unless it is there already.
pub fn model(name: &str, flag: &str) -> Option<PathBuf> {
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
pub fn inputs(dir: &Path, (b, s): (usize, usize)) -> Vec<String> {
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
pub fn compile(meshc: &Path, model: &Path, dims: &[String], art: &Path) -> (f64, u64) {
    let t = Instant::now();
    let out = Command::new(meshc).arg("compile").arg(model).args(dims).arg("-o").arg(art).output().unwrap();
    assert!(out.status.success(), "compile {dims:?}: {}", String::from_utf8_lossy(&out.stderr));
    (t.elapsed().as_secs_f64() * 1e3, std::fs::metadata(art).unwrap().len())
}

/// The median latency (ms) `meshc run --bench` prints for `art` on `inputs`, its outputs
/// written to `out` (which the caller compares).
pub fn latency(meshc: &Path, art: &Path, inputs: &[String], runs: usize, out: &Path) -> f64 {
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
pub fn ort_medians(model: &Path, dirs: &[(PathBuf, usize)]) -> Option<Vec<f64>> {
    let args = dirs.iter().map(|(d, r)| format!("{}:{r}", d.display()));
    let out = Command::new(python()).arg("-c").arg(ORT).arg(model).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().parse().ok()).collect()
}
