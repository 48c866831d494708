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

mod common;

use std::path::{Path, PathBuf};

use common::ort::{compile, inputs, latency, model, ort_medians};
use meshc_ir::Tensor;

const SHAPES: &[(usize, usize)] = &[(1, 7), (1, 16), (2, 13), (4, 64), (8, 128), (32, 256)];
const BOUNDS: [&str; 4] = ["--dim", "batch=1..32", "--dim", "seq=1..256"];
/// Model, the generator's flag that writes it.
const MODELS: &[(&str, &str)] = &[("encoder_6x384", "--bench"), ("minilm_l3", "--minilm-l3")];

/// Runs at a shape: enough for a stable median at small shapes, a few at the largest.
fn runs((b, s): (usize, usize)) -> usize {
    (20_000 / (b * s)).clamp(5, 300)
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
