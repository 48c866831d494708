//! Autoregressive decoding (docs/generation.md) at batch 1, greedy, through
//! `Session::generate`, with f32, bf16 and int8 weights. At batch 1 a step reads every weight
//! once, and the KV caches, so one anchor is the machine's memory bandwidth: memcpy of a
//! buffer as large as the weights, measured in the same run.
//!
//! With a torch venv (target/torch-venv/bin/python, from `make target/torch-venv/installed`,
//! or the python MESHC_TORCH_PYTHON names), tools/bench_decoders.py first exports a
//! GPT-2-small-shaped and a small-Llama-shaped decoder with random weights and times them on
//! torch (transformers' generate()) and on onnxruntime (a Python loop over past/present). Each
//! is then compiled as a decode step of 1024 positions and timed here the same way; the
//! tables give both ratios, and the time to the first token of a 128-token prompt (meshc's
//! from a prefill artifact, and with the prompt fed one position a step).
//!
//! Without the venv, a GPT-2-small-shaped decode step in the text format (12 pre-norm layers,
//! 768 wide, 12 heads, a 50257-token vocabulary tied to the embedding, learned positions,
//! tanh GELU), every weight a seeded `init`, is timed against memcpy only.
//!
//!     cargo bench --bench generate [-- LAYERS CONTEXT]     (the text graph's; default 12 1024)

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use meshc_runtime::api::{GenerateOptions, Model, Sampling, Session};

const D: usize = 768;
const HEADS: usize = 12;
const FF: usize = 3072;
const VOCAB: usize = 50257;
const PROMPT: usize = 8;
const NEW: usize = 32;
/// The positions the ONNX decoders are compiled for: GPT-2's whole position table.
const ONNX_CONTEXT: usize = 1024;
/// Label, `--weights-dtype`, and bytes per weight (int8's scales, one per column, left out).
const WEIGHTS: [(&str, &str, usize); 3] = [("f32", "keep", 4), ("bf16", "bf16", 2), ("int8", "int8", 1)];

/// The decode step as a meshc text graph, every weight a seeded `init`.
fn decoder(layers: usize, ctx: usize) -> String {
    let dh = D / HEADS;
    let mut g = String::from("graph gpt2_step {\n  input ids: i64[1,1] dims(batch, _)\n  input pos: i64[1]\n");
    // The keys are kept transposed, [.., head_dim, ctx]: attention reads kᵀ as it is, and
    // a step writes one column of it.
    for l in 0..layers {
        writeln!(g, "  input kc{l}: f32[1,{HEADS},{dh},{ctx}] dims(batch, heads, head_dim, ctx)").unwrap();
        writeln!(g, "  input vc{l}: f32[1,{HEADS},{ctx},{dh}] dims(batch, heads, ctx, head_dim)").unwrap();
    }
    let mut seed = 0;
    let mut param = |g: &mut String, name: &str, shape: &str, std: f64| {
        seed += 1;
        writeln!(g, "  param {name}: f32[{shape}] = init normal{{seed = {seed}, std = {std}}}").unwrap();
    };
    param(&mut g, "wte", &format!("{VOCAB},{D}"), 0.02);
    param(&mut g, "wpe", &format!("{ctx},{D}"), 0.01);
    for l in 0..layers {
        param(&mut g, &format!("w_qkv{l}"), &format!("{D},{}", 3 * D), 0.02);
        param(&mut g, &format!("b_qkv{l}"), &format!("{}", 3 * D), 0.02);
        param(&mut g, &format!("w_o{l}"), &format!("{D},{D}"), 0.02);
        param(&mut g, &format!("w_fc{l}"), &format!("{D},{FF}"), 0.02);
        param(&mut g, &format!("b_fc{l}"), &format!("{FF}"), 0.02);
        param(&mut g, &format!("w_proj{l}"), &format!("{FF},{D}"), 0.02);
    }
    writeln!(g, "  param ones: f32[{D}] = init ones\n  param zeros: f32[{D}] = init zeros").unwrap();
    writeln!(g, "  param scale: f32[] = value {}", 1.0 / (dh as f64).sqrt()).unwrap();
    let slots: Vec<String> = (0..ctx).map(|i| i.to_string()).collect();
    writeln!(g, "  param slots: i64[{ctx}] = value [{}]", slots.join(", ")).unwrap();
    writeln!(g, "  param neg: f32[] = value -1000000000.0\n  param zero: f32[] = value 0.0").unwrap();
    g += "  tok = gather(wte, ids) {axis = 0}\n  at = dynamic_slice(wpe, pos) {axes = [0], sizes = [1]}\n";
    g += "  x0 = add(tok, at)\n  future = greater(slots, pos)\n  mask = where(future, neg, zero)\n";
    let mut outputs = Vec::new();
    for l in 0..layers {
        let x = format!("x{l}");
        writeln!(
            g,
            "  h{l} = layer_norm({x}, ones, zeros)
  qkv{l} = matmul(h{l}, w_qkv{l})
  qkvb{l} = add(qkv{l}, b_qkv{l})
  q{l} = slice(qkvb{l}) {{starts = [0], ends = [{D}], axes = [2]}}
  k{l} = slice(qkvb{l}) {{starts = [{D}], ends = [{}], axes = [2]}}
  v{l} = slice(qkvb{l}) {{starts = [{}], ends = [{}], axes = [2]}}",
            2 * D,
            2 * D,
            3 * D
        )
        .unwrap();
        for (t, perm) in [("q", "0, 2, 1, 3"), ("k", "0, 2, 3, 1"), ("v", "0, 2, 1, 3")] {
            writeln!(
                g,
                "  {t}r{l} = reshape({t}{l}) {{shape = [1, 1, {HEADS}, {dh}]}}\n  {t}h{l} = transpose({t}r{l}) {{perm = [{perm}]}}"
            )
            .unwrap();
        }
        for (kv, axis) in [("k", 3), ("v", 2)] {
            writeln!(g, "  next.{kv}c{l} = dynamic_update_slice({kv}c{l}, {kv}h{l}, pos) {{axes = [{axis}]}}").unwrap();
            outputs.push(format!("next.{kv}c{l}"));
        }
        writeln!(
            g,
            "  s{l} = matmul(qh{l}, next.kc{l})
  ss{l} = mul(s{l}, scale)
  sm{l} = add(ss{l}, mask)
  p{l} = softmax(sm{l}) {{axis = -1}}
  c{l} = matmul(p{l}, next.vc{l})
  ct{l} = transpose(c{l}) {{perm = [0, 2, 1, 3]}}
  cr{l} = reshape(ct{l}) {{shape = [1, 1, {D}]}}
  o{l} = matmul(cr{l}, w_o{l})
  a{l} = add({x}, o{l})
  g{l} = layer_norm(a{l}, ones, zeros)
  f{l} = matmul(g{l}, w_fc{l})
  fb{l} = add(f{l}, b_fc{l})
  fa{l} = gelu(fb{l}) {{approximate = \"tanh\"}}
  m{l} = matmul(fa{l}, w_proj{l})
  x{} = add(a{l}, m{l})",
            l + 1
        )
        .unwrap();
    }
    writeln!(
        g,
        "  hf = layer_norm(x{layers}, ones, zeros)\n  head = transpose(wte)\n  logits = matmul(hf, head)\n  output logits, {}\n}}",
        outputs.join(", ")
    )
    .unwrap();
    g
}

/// The median of three of `f`'s times, in seconds.
fn median3(mut f: impl FnMut() -> f64) -> f64 {
    let mut t = [f(), f(), f()];
    t.sort_by(f64::total_cmp);
    t[1]
}

fn memcpy_gbs(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    let t = median3(|| {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        start.elapsed().as_secs_f64()
    });
    bytes as f64 / t / 1e9
}

/// What tools/bench_decoders.py prints for a model.
#[derive(serde::Deserialize)]
struct Anchors {
    model: String,
    torch_ms_per_token: f64,
    ort_ms_per_token: f64,
    torch_ttft_ms: f64,
    ort_ttft_ms: f64,
    onnx: PathBuf,
    /// Weights a step reads whole (the embedding rows it gathers are left out).
    weights_read: usize,
    /// The time-to-first-token prompt; the per-token runs take its first `PROMPT` ids.
    prompt: Vec<i64>,
    /// torch's greedy ids after those `PROMPT` ids.
    greedy: Vec<i64>,
    warning: Option<String>,
}

/// `meshc compile SOURCE ARGS -o OUT`, opened; and how long the compile took, in seconds.
/// A refusal is its last line of stderr.
fn compile(source: &Path, args: &[&str], out: &Path) -> Result<(Model, f64), String> {
    let start = Instant::now();
    let c = Command::new(env!("CARGO_BIN_EXE_meshc"))
        .arg("compile")
        .arg(source)
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    if !c.status.success() {
        let err = String::from_utf8_lossy(&c.stderr);
        return Err(err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("failed").to_string());
    }
    Ok((Model::open(out).map_err(|e| e.to_string())?, secs))
}

/// `Session::generate` of `new` tokens after `prompt`, the prompt run in one call of
/// `prefill` when given: seconds, and the ids.
fn generate(
    session: &Session,
    prefill: Option<&Session>,
    prompt: &[i64],
    new: usize,
    context: usize,
) -> (f64, Vec<i64>) {
    let options = GenerateOptions { max_new_tokens: new, context, sampling: Sampling::Greedy, seed: 0, stop: vec![] };
    let prompt = [prompt.to_vec()];
    let start = Instant::now();
    let out = match prefill {
        Some(p) => session.generate_with_prefill(p, &prompt, &options),
        None => session.generate(&prompt, &options),
    };
    (start.elapsed().as_secs_f64(), out.unwrap().tokens[0].clone())
}

/// Seconds per new token: the prompt's steps and the first token, taken away from a run of
/// `NEW` more.
fn per_token(session: &Session, prompt: &[i64], context: usize) -> f64 {
    let run = |new| generate(session, None, prompt, new, context).0;
    run(2);
    median3(|| (run(NEW + 1) - run(1)) / NEW as f64)
}

/// The columns from ms per new token to the ratio against memcpy.
fn rate(per_token: f64, read: usize, memcpy: f64) -> String {
    let gbs = read as f64 / per_token / 1e9;
    format!(
        "{:.2} | {:.1} | {:.0} | {gbs:.1} | {:.2}",
        per_token * 1e3,
        1.0 / per_token,
        read as f64 / 1e6,
        gbs / memcpy
    )
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The exported decoders against torch, onnxruntime and memcpy.
fn onnx_bench(python: &Path, dir: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    eprintln!("tools/bench_decoders.py: exporting (when missing) and timing on torch and onnxruntime");
    let out = Command::new(python)
        .arg(root.join("tools/bench_decoders.py"))
        .arg(root.join("target/bench-decoders"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "tools/bench_decoders.py failed");
    let anchors: Vec<Anchors> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let memcpy = memcpy_gbs(anchors.iter().map(|a| a.weights_read * 4).max().unwrap());
    println!("decode steps exported from transformers (random weights), compiled with --decode-context {ONNX_CONTEXT}");
    println!("batch 1, prompt {PROMPT}, {NEW} new tokens (greedy); {} threads; torch and onnxruntime on 2", threads());
    println!("memcpy of a buffer as large as the largest f32 weights: {memcpy:.1} GB/s (bytes copied per second)");
    println!("targets: torch ms / meshc ms >= 1.5, onnxruntime ms / meshc ms >= 1.0, vs memcpy >= 0.8");
    println!("| model | weights | compile s | ms per new token | tokens/s | MB read per token | GB/s read | vs memcpy | torch ms / meshc ms | onnxruntime ms / meshc ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut ttft = Vec::new();
    let mut notes: Vec<String> =
        anchors.iter().filter_map(|a| Some(format!("{}: {}", a.model, a.warning.as_ref()?))).collect();
    for a in &anchors {
        let mut meshc_ttft = None;
        for (label, dtype, bytes) in WEIGHTS {
            let context = ONNX_CONTEXT.to_string();
            let args = ["--decode-context", &context, "--decode-batch", "1", "--weights-dtype", dtype];
            let (model, secs) = match compile(&a.onnx, &args, &dir.join(format!("{}_{label}.mshc", a.model))) {
                Ok(m) => m,
                Err(e) => {
                    println!("| {} | {label} | not compiled: {e} |", a.model);
                    continue;
                }
            };
            let state = model.state_names();
            let cache: usize = model
                .inputs()
                .iter()
                .filter(|i| state.contains(&i.name))
                .map(|i| i.shape.iter().product::<usize>() * i.dtype.size_bytes())
                .sum();
            // Attention reads the positions up to `pos` (the mask hides the rest): the
            // timed tokens are fed at positions PROMPT to PROMPT + NEW - 1.
            let cache = cache * (PROMPT + NEW / 2 + 1) / ONNX_CONTEXT;
            let session = Session::new(&model).unwrap();
            let t = per_token(&session, &a.prompt[..PROMPT], ONNX_CONTEXT);
            println!(
                "| {} | {label} | {secs:.1} | {} | {:.2} | {:.2} |",
                a.model,
                rate(t, a.weights_read * bytes + cache, memcpy),
                a.torch_ms_per_token / (t * 1e3),
                a.ort_ms_per_token / (t * 1e3)
            );
            if label == "f32" {
                if generate(&session, None, &a.prompt[..PROMPT], NEW + 1, ONNX_CONTEXT).1 != a.greedy {
                    notes.push(format!("{}: meshc's f32 greedy ids differ from torch's", a.model));
                }
                let first = |prefill: Option<&Session>| {
                    format!("{:.1}", median3(|| generate(&session, prefill, &a.prompt, 1, ONNX_CONTEXT).0) * 1e3)
                };
                let prompt_len = a.prompt.len().to_string();
                let args = [&args[..], &["--decode-prefill", &prompt_len]].concat();
                let by_prefill = match compile(&a.onnx, &args, &dir.join(format!("{}_prefill.mshc", a.model))) {
                    Ok((prefill, _)) => first(Some(&Session::new(&prefill).unwrap())),
                    Err(e) => format!("not compiled: {e}"),
                };
                meshc_ttft = Some((by_prefill, first(None)));
            }
        }
        ttft.push((a, meshc_ttft));
    }
    println!("\nthe anchors, ms; the time to the first token after a {}-token prompt", anchors[0].prompt.len());
    println!("| model | torch per new token | onnxruntime per new token | torch TTFT (generate, max_new_tokens=1) | onnxruntime TTFT (one call, empty past) | meshc TTFT, f32 (one call of a --decode-prefill artifact) | meshc TTFT: prompt fed one position a step (f32) |");
    println!("|---|---|---|---|---|---|---|");
    for (a, meshc) in ttft {
        let (prefill, steps) = meshc.unwrap_or(("-".into(), "-".into()));
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {prefill} | {steps} |",
            a.model, a.torch_ms_per_token, a.ort_ms_per_token, a.torch_ttft_ms, a.ort_ttft_ms
        );
    }
    for n in notes {
        println!("note: {n}");
    }
}

/// The built-in text graph against memcpy.
fn text_bench(layers: usize, ctx: usize, dir: &Path) {
    let graph = dir.join("gpt2_step.txt");
    std::fs::write(&graph, decoder(layers, ctx)).unwrap();
    let weights = VOCAB * D + layers * (3 * D * D + D * D + 2 * D * FF);
    let cache = 2 * layers * ctx * D * 4;
    let mc = memcpy_gbs(weights * 4);
    println!(
        "GPT-2-small-shaped decode step: {layers} layers, {D} wide, {HEADS} heads, vocabulary {VOCAB}, context {ctx}"
    );
    println!("batch 1, prompt {PROMPT}, {NEW} new tokens (greedy); {} threads", threads());
    println!("memcpy of {} MB: {mc:.1} GB/s (bytes copied per second)", weights * 4 / 1_000_000);
    println!("| weights | compile s | ms per new token | tokens/s | MB read per token | GB/s read | vs memcpy |");
    println!("|---|---|---|---|---|---|---|");
    let prompt: Vec<i64> = (0..PROMPT as i64).map(|i| i * 97 % VOCAB as i64).collect();
    for (label, dtype, bytes) in WEIGHTS {
        let (model, secs) =
            compile(&graph, &["--weights-dtype", dtype], &dir.join(format!("gpt2_{label}.mshc"))).unwrap();
        let session = Session::new(&model).unwrap();
        let t = per_token(&session, &prompt, ctx);
        println!("| {label} | {secs:.1} | {} |", rate(t, weights * bytes + cache, mc));
    }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let dir = std::env::temp_dir().join(format!("meshc-bench-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let python = std::env::var_os("MESHC_TORCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/torch-venv/bin/python"));
    if python.exists() {
        onnx_bench(&python, &dir);
    } else {
        println!(
            "no torch venv at {} (`make target/torch-venv/installed` makes one, or set MESHC_TORCH_PYTHON): \
             the built-in text graph against memcpy only",
            python.display()
        );
        let (layers, ctx) = (args.first().copied().unwrap_or(12), args.get(1).copied().unwrap_or(1024));
        text_bench(layers, ctx, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
