//! Autoregressive decoding (docs/generation.md): a GPT-2-small-shaped decode step (12
//! pre-norm layers, 768 wide, 12 heads, a 50257-token vocabulary tied to the embedding,
//! learned positions, tanh GELU) with random weights, generated greedily through
//! `Session::generate` at batch 1, with f32 and with bf16 weights. At batch 1 a step reads
//! every weight once, and the KV caches, so its anchor is the machine's memory bandwidth:
//! memcpy of a buffer as large as the weights, measured in the same run. The table gives
//! the time per new token, the bytes a token reads (weights and both caches over the whole
//! context), and those bytes per second against memcpy's.
//!
//!     cargo bench --bench generate [-- LAYERS CONTEXT]     (default 12 1024)

use std::fmt::Write as _;
use std::time::Instant;

use meshc_runtime::api::{GenerateOptions, Model, Sampling, Session};

const D: usize = 768;
const HEADS: usize = 12;
const FF: usize = 3072;
const VOCAB: usize = 50257;
const PROMPT: usize = 8;
const NEW: usize = 32;

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

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (layers, ctx) = (args.first().copied().unwrap_or(12), args.get(1).copied().unwrap_or(1024));
    let dir = std::env::temp_dir().join(format!("meshc-bench-generate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let graph = dir.join("gpt2_step.txt");
    std::fs::write(&graph, decoder(layers, ctx)).unwrap();
    let weights = VOCAB * D + layers * (3 * D * D + D * D + 2 * D * FF);
    let cache = 2 * layers * ctx * D * 4;
    let mc = memcpy_gbs(weights * 4);
    println!(
        "GPT-2-small-shaped decode step: {layers} layers, {D} wide, {HEADS} heads, vocabulary {VOCAB}, context {ctx}"
    );
    println!(
        "batch 1, prompt {PROMPT}, {NEW} new tokens (greedy); {} threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("memcpy of {} MB: {mc:.1} GB/s (bytes copied per second)", weights * 4 / 1_000_000);
    println!("| weights | compile s | ms per new token | tokens/s | MB read per token | GB/s read | vs memcpy |");
    println!("|---|---|---|---|---|---|---|");
    for (label, dtype, bytes) in [("f32", "keep", 4), ("bf16", "bf16", 2)] {
        let art = dir.join(format!("gpt2_{label}.mshc"));
        let start = Instant::now();
        let c = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
            .args(["compile", graph.to_str().unwrap(), "--weights-dtype", dtype, "-o", art.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
        let compile = start.elapsed().as_secs_f64();
        let model = Model::open(&art).unwrap();
        let session = Session::new(&model).unwrap();
        let prompt = vec![(0..PROMPT as i64).map(|i| i * 97 % VOCAB as i64).collect::<Vec<i64>>()];
        let run = |new: usize| {
            let options = GenerateOptions {
                max_new_tokens: new,
                context: ctx,
                sampling: Sampling::Greedy,
                seed: 0,
                stop: vec![],
            };
            let start = Instant::now();
            session.generate(&prompt, &options).unwrap();
            start.elapsed().as_secs_f64()
        };
        run(2);
        // The prompt's steps and the first token, taken away from a run of NEW more.
        let per_token = median3(|| (run(NEW + 1) - run(1)) / NEW as f64);
        let read = weights * bytes + cache;
        let gbs = read as f64 / per_token / 1e9;
        println!(
            "| {label} | {compile:.1} | {:.2} | {:.1} | {:.0} | {gbs:.1} | {:.2} |",
            per_token * 1e3,
            1.0 / per_token,
            read as f64 / 1e6,
            gbs / mc
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
