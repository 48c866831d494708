//! Quantized models and the integer GEMM (issue 35), in one run:
//!
//! - paraphrase-MiniLM-L3-v2's encoder (its shapes, seeded weights: `tools/gen_onnx_testdata.py
//!   --minilm-l3`) quantized by onnxruntime's own `quantize_dynamic` (int8 weights:
//!   DynamicQuantizeLinear, 18 MatMulInteger) into target/onnx-bench/minilm_l3_int8.onnx,
//!   compiled by meshc for each shape and run by `meshc run --bench --threads 2` against an
//!   onnxruntime session on 2 threads on the same quantized file and input files; and how far
//!   meshc's outputs are from onnxruntime's on that file, against how far onnxruntime's int8
//!   outputs are from its f32 ones (the error quantization makes);
//! - `--weights-dtype` on an f32 model, all-MiniLM-L6-v2's shapes whole (BERT embeddings
//!   with a 30522-word table, 6 layers 384 wide; seeded weights: `tools/gen_onnx_testdata.py
//!   --minilm-l6`): each artifact's size against f32's, and at 32×128 the int8 and bf16
//!   artifacts' latency against f32's (`meshc run --bench`, all cores) with the cosine of
//!   their mean-pooled sentence embeddings to f32's (the least over the batch);
//! - the integer GEMM (`meshc_runtime::kernels::igemm`, a prepacked 8-bit weight) at
//!   2048×2048×2048 on every path this CPU has, against the f32 library GEMM
//!   (`kernels::library::matmul`) on the same shape, 2 threads, in GOP/s (2 per multiply-add).
//!
//!     cargo bench --bench int8

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Result};
use common::ort::{compile, inputs, latency, model, ort_medians, python};
use meshc_ir::{Data, Tensor};
use meshc_runtime::kernels::epilogue::Bound;
use meshc_runtime::kernels::igemm::{self, Path as IntPath, A, B};
use meshc_runtime::kernels::library::{self, Threads};
use meshc_runtime::kernels::matmul_shape::MatmulShape;

const SHAPES: [(usize, usize); 2] = [(2, 13), (8, 128)];
const THREADS: usize = 2;

/// Quantizes the f32 model (argv 1) into argv 2 as onnxruntime's dynamic quantization does.
const QUANTIZE: &str = r#"
import sys
from onnxruntime.quantization import QuantType, quantize_dynamic
quantize_dynamic(sys.argv[1], sys.argv[2], weight_type=QuantType.QInt8)
"#;

/// Per input dir (argv 3…, each holding meshc's output under meshc/): max |meshc − onnxruntime|
/// on the quantized model (argv 1), and max |onnxruntime int8 − onnxruntime f32 (argv 2)|.
const ERRORS: &str = r#"
import os, sys, numpy as np, onnxruntime as ort
q, f = (ort.InferenceSession(m, providers=["CPUExecutionProvider"]) for m in sys.argv[1:3])
for d in sys.argv[3:]:
    feed = {x[:-4]: np.load(os.path.join(d, "inputs", x)) for x in os.listdir(os.path.join(d, "inputs"))}
    want, f32 = q.run(None, feed)[0], f.run(None, feed)[0]
    got = np.load(os.path.join(d, "meshc", "last_hidden_state.npy"))
    print(float(np.abs(got - want).max()), float(np.abs(want - f32).max()))
"#;

/// The quantized encoder, made (from the generator's f32 one) unless it is there already.
fn quantized() -> Option<(PathBuf, PathBuf)> {
    let f32_model = model("minilm_l3", "--minilm-l3")?;
    let q = PathBuf::from("target/onnx-bench/minilm_l3_int8.onnx");
    if !q.is_file() {
        let ok = Command::new(python()).args(["-W", "ignore", "-c", QUANTIZE]).arg(&f32_model).arg(&q).status();
        if !ok.is_ok_and(|s| s.success()) {
            return None;
        }
    }
    Some((f32_model, q))
}

fn encoder(meshc: &Path, dir: &Path) {
    let Some((f32_model, q)) = quantized() else {
        println!("quantized MiniLM-L3: not measured (no Python with onnx and onnxruntime: make onnx-testdata)");
        return;
    };
    let mut rows = Vec::new();
    let mut feeds = Vec::new();
    for (b, s) in SHAPES {
        let at = dir.join(format!("{b}x{s}"));
        let mut args = inputs(&at.join("inputs"), (b, s));
        args.extend(["--threads".to_string(), THREADS.to_string()]);
        let dims = ["--dim".to_string(), format!("batch={b}"), "--dim".to_string(), format!("seq={s}")];
        let art = dir.join(format!("minilm_l3_int8-{b}x{s}.mshc"));
        compile(meshc, &q, &dims, &art);
        let runs = (20_000 / (b * s)).clamp(10, 300);
        rows.push(((b, s), latency(meshc, &art, &args, runs, &at.join("meshc"))));
        feeds.push((at.join("inputs"), runs));
    }
    let ort = ort_medians(&q, &feeds);
    let errors: Option<Vec<(f64, f64)>> = Command::new(python())
        .args(["-c", ERRORS])
        .arg(&q)
        .arg(&f32_model)
        .args(SHAPES.map(|(b, s)| dir.join(format!("{b}x{s}"))))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            (String::from_utf8_lossy(&o.stdout).lines())
                .map(|l| {
                    let mut x = l.split_whitespace().map(|v| v.parse().ok());
                    Some((x.next()??, x.next()??))
                })
                .collect()
        });
    println!(
        "quantize_dynamic MiniLM-L3 (3 layers, 384 wide, int8 weights), {THREADS} threads, the same quantized file:"
    );
    println!(
        "{:>7} {:>9} {:>15} {:>9} {:>24} {:>22}",
        "shape", "meshc ms", "onnxruntime ms", "meshc/ort", "max |meshc - ort int8|", "max |ort int8 - f32|"
    );
    for (i, ((b, s), ms)) in rows.into_iter().enumerate() {
        let o = ort.as_ref().map(|o| o[i]);
        let (ort_ms, ratio) = o.map_or(("-".into(), "-".into()), |o| (format!("{o:.3}"), format!("{:.2}x", ms / o)));
        let (e, q_err) =
            errors.as_ref().map_or(("-".into(), "-".into()), |e| (format!("{:.2e}", e[i].0), format!("{:.3}", e[i].1)));
        println!("{:>7} {ms:>9.3} {ort_ms:>15} {ratio:>9} {e:>24} {q_err:>22}", format!("{b}x{s}"));
    }
}

/// The least cosine, over the sequences of a batch, between the mean-pooled (over the
/// unmasked positions) hidden states `a` and `b` of `[batch, seq, d]`.
fn pooled_cosine(a: &Tensor, b: &Tensor, mask: &[i64]) -> f64 {
    let [batch, seq, d] = a.shape[..] else { panic!("[batch, seq, d]") };
    let (a, b) = (a.data.to_f64(), b.data.to_f64());
    let pool = |x: &[f64], i: usize| -> Vec<f64> {
        let mut v = vec![0.0; d];
        for t in (0..seq).filter(|t| mask[i * seq + t] != 0) {
            v.iter_mut().zip(&x[(i * seq + t) * d..][..d]).for_each(|(s, x)| *s += x);
        }
        v
    };
    (0..batch)
        .map(|i| {
            let (p, q) = (pool(&a, i), pool(&b, i));
            let dot: f64 = p.iter().zip(&q).map(|(x, y)| x * y).sum();
            dot / (p.iter().map(|x| x * x).sum::<f64>() * q.iter().map(|x| x * x).sum::<f64>()).sqrt()
        })
        .fold(f64::INFINITY, f64::min)
}

/// `--weights-dtype` on all-MiniLM-L6-v2's shapes: sizes, and speed and cosine at 32×128.
fn weights(meshc: &Path, dir: &Path) {
    let Some(model) = model("minilm_l6", "--minilm-l6") else {
        println!("--weights-dtype: not measured (no Python that can run tools/gen_onnx_testdata.py)");
        return;
    };
    let (b, s) = (32, 128);
    let ins = dir.join("l6-inputs");
    std::fs::create_dir_all(&ins).unwrap();
    let mut state = 7u64;
    let ids: Vec<i64> = (0..b * s)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as i64 % 30522
        })
        .collect();
    let mask: Vec<i64> = (0..b * s).map(|i| i64::from(i % s < s - 2 - i / s % 16)).collect();
    let mut args = Vec::new();
    for (name, data) in [("input_ids", ids), ("attention_mask", mask.clone())] {
        let f = ins.join(format!("{name}.npy"));
        Tensor::new(vec![b, s], Data::I64(data)).write_npy(&f).unwrap();
        args.extend(["--input".to_string(), format!("{name}={}", f.display())]);
    }
    let dims: Vec<String> = ["--dim", &format!("batch={b}"), "--dim", &format!("seq={s}")].map(String::from).into();
    println!("--weights-dtype on all-MiniLM-L6-v2's shapes (seeded weights), {b}x{s}, all cores:");
    println!(
        "{:>7} {:>12} {:>8} {:>11} {:>10} {:>22}",
        "weights", "artifact MB", "of f32", "latency ms", "f32/this", "pooled cosine to f32"
    );
    let mut f32_run: Option<(u64, f64, Tensor)> = None;
    for w in ["f32", "bf16", "int8"] {
        let art = dir.join(format!("l6-{w}.mshc"));
        let (_, bytes) = compile(meshc, &model, &[&dims[..], &["--weights-dtype".into(), w.into()]].concat(), &art);
        let out = dir.join(format!("l6-{w}"));
        let ms = latency(meshc, &art, &args, 5, &out);
        let hidden = Tensor::read_npy(&out.join("last_hidden_state.npy")).unwrap();
        let (f_bytes, f_ms, f_hidden) = f32_run.get_or_insert_with(|| (bytes, ms, hidden.clone()));
        println!(
            "{w:>7} {:>12.1} {:>7.2}x {ms:>11.1} {:>9.2}x {:>22.5}",
            bytes as f64 / 1e6,
            bytes as f64 / *f_bytes as f64,
            *f_ms / ms,
            pooled_cosine(&hidden, f_hidden, &mask)
        );
    }
}

/// Seconds of the fastest of `reps` calls after one to warm up (of that one with no `reps`).
fn best(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    let mut best = if reps == 0 { t.elapsed().as_secs_f64() } else { f64::INFINITY };
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// Deterministic pseudo-random integers in lo..=hi.
fn ints(seed: u64, len: usize, (lo, hi): (i32, i32)) -> Vec<i32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + ((s >> 33) % (hi - lo + 1) as u64) as i32
        })
        .collect()
}

fn gemm() -> Result<()> {
    let (m, k, n) = (2048, 2048, 2048);
    let s = MatmulShape::new(&[m, k], &[k, n], &[m, n])?;
    let gops = |secs: f64| 2.0 * (m * k * n) as f64 / secs / 1e9;
    // A u8 activation less its zero point (read as bytes, as the zero_point pass makes the
    // compiled product do), an i8 weight less its own, as the importer writes them.
    let x: Vec<u8> = ints(1, m * k, (0, 255)).iter().map(|&x| x as u8).collect();
    let a: Vec<i32> = x.iter().map(|&x| i32::from(x) - 131).collect();
    let b: Vec<i32> = ints(2, k * n, (-128, 127)).iter().map(|x| x + 3).collect();
    let Some(packed) = igemm::pack(&b, 1, k, n) else { bail!("8-bit columns") };
    let af: Vec<f32> = a.iter().map(|&x| x as f32 / 256.0).collect();
    let bf: Vec<f32> = b.iter().map(|&x| x as f32 / 128.0).collect();
    let mut c = vec![0f32; m * n];
    let paths = IntPath::available();
    let mut outs: Vec<Vec<i32>> = paths.iter().map(|_| vec![0i32; m * n]).collect();
    let mut scratch = Vec::new();
    // Rounds of every GEMM in turn, the best of each kept: on a machine shared with other
    // jobs, a busy spell then slows all of them rather than one.
    let (mut f32_secs, mut int_secs) = (f64::INFINITY, vec![f64::INFINITY; paths.len()]);
    for _ in 0..3 {
        let t = best(1, || library::matmul(&af, &bf, &mut c, &s, Threads::Exactly(THREADS), &Bound::none()))?;
        f32_secs = f32_secs.min(t);
        for ((&path, out), secs) in paths.iter().zip(&mut outs).zip(&mut int_secs) {
            let reps = if path == IntPath::Scalar { 0 } else { 1 };
            let t = best(reps, || {
                let a = A::Bytes { data: &x, signed: false, zp: 131 };
                igemm::matmul_on(path, a, B::Packed(&packed), out, &s, THREADS, &mut scratch, &Bound::none())
            })?;
            *secs = secs.min(t);
        }
    }
    if let Some(i) = outs.iter().position(|o| *o != outs[0]) {
        bail!("the {:?} integer GEMM's result differs from the {:?} one's", paths[i], paths[0]);
    }
    println!("GEMM {m}x{k}x{n}, {THREADS} threads, GOP/s (2 per multiply-add), best of 3 rounds of each in turn:");
    println!("  f32 library GEMM          {:>7.1}", gops(f32_secs));
    for (path, secs) in paths.iter().zip(int_secs) {
        let g = gops(secs);
        println!("  int8 GEMM, {:<14} {g:>7.1}   {:.2}x the f32 GEMM", format!("{path:?}"), f32_secs / secs);
    }
    Ok(())
}

fn main() -> Result<()> {
    common::isa_from_env();
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| {
        c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    });
    println!("CPU: {}", cpu.as_deref().unwrap_or("unknown"));
    let meshc = PathBuf::from(env!("CARGO_BIN_EXE_meshc"));
    let dir = std::env::temp_dir().join(format!("meshc-bench-int8-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    encoder(&meshc, &dir);
    weights(&meshc, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    gemm()
}
