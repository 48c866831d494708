//! Checkpoints at scale, through the real `meshc` binary: a synthetic encoder checkpoint of
//! `LAYERS` layers, `WIDTH` wide (the weight shapes of a BERT-large-sized encoder, ~1.2 GB
//! of f32, seeded values, generated into a temporary directory and removed afterwards), as
//! one `.safetensors` file and as three shards with a Hugging Face index. For each it
//! prints the time of `check`, of `compile` and its peak memory (the peak resident anonymous
//! memory, polled — the page cache of the mapped checkpoint is not the compiler's — and the
//! peak RSS, which counts mapped pages too), the artifact's size against the
//! weights', and `run --trust-weights` from process start to exit.
//!
//!     cargo bench --bench checkpoints            (LAYERS=24 WIDTH=1024 by default)
//!     MESHC_CKPT_LAYERS=4 cargo bench --bench checkpoints
//!     MESHC_CKPT_KEEP=1 ...    keeps the generated files (to profile a step by hand)

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A directory removed when dropped.
struct Scratch(PathBuf);
impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("MESHC_CKPT_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

const BATCH: usize = 2;
const SEQ: usize = 16;

/// The params of layer `l`: name, shape.
fn layer_params(l: usize, d: usize, f: usize) -> Vec<(String, Vec<usize>)> {
    let mut v = Vec::new();
    for (n, shape) in [
        ("ln1_g", vec![d]),
        ("ln1_b", vec![d]),
        ("wq", vec![d, d]),
        ("bq", vec![d]),
        ("wk", vec![d, d]),
        ("bk", vec![d]),
        ("wv", vec![d, d]),
        ("bv", vec![d]),
        ("wo", vec![d, d]),
        ("bo", vec![d]),
        ("ln2_g", vec![d]),
        ("ln2_b", vec![d]),
        ("w_ff1", vec![d, f]),
        ("b_ff1", vec![f]),
        ("w_ff2", vec![f, d]),
        ("b_ff2", vec![d]),
    ] {
        v.push((format!("l{l}_{n}"), shape));
    }
    v
}

/// The encoder's text: `layers` copies of the testdata transformer block's layer (layer
/// norm, 16-head attention with a mask, GELU FFN, residuals), params read from `file`.
/// With `half`, the matmul weights are declared bf16 and cast to f32 where they are used.
fn encoder(layers: usize, d: usize, heads: usize, f: usize, file: &str, half: bool) -> String {
    let (b, s, h, hd) = (BATCH, SEQ, heads, d / heads);
    let mut t = format!(
        "graph encoder_{layers}x{d} {{\n  input x: f32[{b},{s},{d}]\n  input mask: f32[{b},1,1,{s}]\n  param scale: f32[] = value {}\n",
        1.0 / (hd as f64).sqrt()
    );
    for l in 0..layers {
        for (n, shape) in layer_params(l, d, f) {
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            let dtype = if half && is_matmul_weight(&n) { "bf16" } else { "f32" };
            t += &format!("  param {n}: {dtype}[{}] = file(\"{file}\", key = \"{n}\")\n", dims.join(","));
        }
    }
    let mut x = "x".to_string();
    for l in 0..layers {
        let name = |n: &str| format!("l{l}_{n}");
        let p = |n: &str| if half && is_matmul_weight(n) { format!("l{l}_{n}_f") } else { name(n) };
        if half {
            for w in MATMUL_WEIGHTS {
                t += &format!("  {} = cast({}) {{to = \"f32\"}}\n", p(w), name(w));
            }
        }
        t += &format!(
            "  {h_} = layer_norm({x}, {g1}, {b1}) {{axis = -1, eps = 1e-12}}
  {q} = matmul({h_}, {wq})
  {qb} = add({q}, {bq})
  {qr} = reshape({qb}) {{shape = [{b}, {s}, {h}, {hd}]}}
  {qh} = transpose({qr}) {{perm = [0, 2, 1, 3]}}
  {k} = matmul({h_}, {wk})
  {kb} = add({k}, {bk})
  {kr} = reshape({kb}) {{shape = [{b}, {s}, {h}, {hd}]}}
  {kt} = transpose({kr}) {{perm = [0, 2, 3, 1]}}
  {v} = matmul({h_}, {wv})
  {vb} = add({v}, {bv})
  {vr} = reshape({vb}) {{shape = [{b}, {s}, {h}, {hd}]}}
  {vh} = transpose({vr}) {{perm = [0, 2, 1, 3]}}
  {sc} = matmul({qh}, {kt})
  {ss} = mul({sc}, scale)
  {sm} = add({ss}, mask)
  {pr} = softmax({sm}) {{axis = -1}}
  {cx} = matmul({pr}, {vh})
  {ct} = transpose({cx}) {{perm = [0, 2, 1, 3]}}
  {cr} = reshape({ct}) {{shape = [{b}, {s}, {d}]}}
  {o} = matmul({cr}, {wo})
  {ob} = add({o}, {bo})
  {r1} = add({h_}, {ob})
  {h2} = layer_norm({r1}, {g2}, {b2}) {{axis = -1, eps = 1e-12}}
  {f1} = matmul({h2}, {w1})
  {f1b} = add({f1}, {bf1})
  {f1a} = gelu({f1b})
  {f2} = matmul({f1a}, {w2})
  {f2b} = add({f2}, {bf2})
  {y} = add({h2}, {f2b})
",
            h_ = p("h"),
            g1 = p("ln1_g"),
            b1 = p("ln1_b"),
            q = p("q"),
            wq = p("wq"),
            qb = p("q_b"),
            bq = p("bq"),
            qr = p("q_r"),
            qh = p("q_h"),
            k = p("k"),
            wk = p("wk"),
            kb = p("k_b"),
            bk = p("bk"),
            kr = p("k_r"),
            kt = p("k_t"),
            v = p("v"),
            wv = p("wv"),
            vb = p("v_b"),
            bv = p("bv"),
            vr = p("v_r"),
            vh = p("v_h"),
            sc = p("scores"),
            ss = p("scaled"),
            sm = p("masked"),
            pr = p("probs"),
            cx = p("ctx"),
            ct = p("ctx_t"),
            cr = p("ctx_r"),
            o = p("o"),
            wo = p("wo"),
            ob = p("o_b"),
            bo = p("bo"),
            r1 = p("res1"),
            h2 = p("h2"),
            g2 = p("ln2_g"),
            b2 = p("ln2_b"),
            f1 = p("f1"),
            w1 = p("w_ff1"),
            f1b = p("f1_b"),
            bf1 = p("b_ff1"),
            f1a = p("f1_a"),
            f2 = p("f2"),
            w2 = p("w_ff2"),
            f2b = p("f2_b"),
            bf2 = p("b_ff2"),
            y = p("y"),
        );
        x = p("y");
    }
    t + &format!("  output {x}\n}}\n")
}

/// The params of a layer that a matmul reads as its weight (the ones a bf16 checkpoint
/// holds in bf16).
const MATMUL_WEIGHTS: [&str; 6] = ["wq", "wk", "wv", "wo", "w_ff1", "w_ff2"];

fn is_matmul_weight(name: &str) -> bool {
    MATMUL_WEIGHTS.iter().any(|w| name.ends_with(w))
}

/// Seeded values in [-0.05, 0.05) (xorshift: fast enough to write a gigabyte in a second),
/// as little-endian f32 bytes; layer norm gains near 1.
fn values(name: &str, n: usize, seed: &mut u64) -> Vec<u8> {
    let gain = name.ends_with("_g");
    let mut out = Vec::with_capacity(n * 4);
    for _ in 0..n {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let x = ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
        out.extend_from_slice(&(if gain { 1.0 + x } else { x }).to_le_bytes());
    }
    out
}

/// Writes `tensors` (name, shape) as a `.safetensors` file, data made by `values`.
/// With `half`, the matmul weights are stored as bf16 (the same values, rounded).
fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>)], seed: &mut u64, half: bool) {
    let bf16 = |n: &str| half && is_matmul_weight(n);
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (n, shape) in tensors {
        let len = shape.iter().product::<usize>() * if bf16(n) { 2 } else { 4 };
        let dtype = if bf16(n) { "BF16" } else { "F32" };
        header.insert(n.clone(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + len]}));
        off += len;
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(&h).unwrap();
    for (n, shape) in tensors {
        let v = values(n, shape.iter().product(), seed);
        if bf16(n) {
            let wide = v.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64);
            let t = meshc_ir::Tensor::new(vec![v.len() / 4], meshc_ir::Data::from_f64(meshc_ir::DType::BF16, wide));
            f.write_all(&t.to_le_bytes()).unwrap();
        } else {
            f.write_all(&v).unwrap();
        }
    }
    f.flush().unwrap();
}

/// A field of a process's /proc status in bytes (`RssAnon`, `VmHWM`); None once it ended.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// Runs meshc with `args`: wall seconds, peak anonymous RSS and the kernel's peak RSS
/// (VmHWM, which counts mapped file pages too), both polled every millisecond.
fn measure(meshc: &Path, args: &[&str]) -> (f64, u64, u64) {
    let t = Instant::now();
    let mut child = Command::new(meshc).args(args).stdout(Stdio::null()).spawn().expect("meshc starts");
    let (mut anon, mut hwm) = (0, 0);
    let status = loop {
        if let Some(status) = child.try_wait().expect("meshc runs") {
            break status;
        }
        anon = anon.max(status_bytes(child.id(), "RssAnon:").unwrap_or(0));
        hwm = hwm.max(status_bytes(child.id(), "VmHWM:").unwrap_or(0));
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(status.success(), "meshc {args:?} failed");
    (t.elapsed().as_secs_f64(), anon, hwm)
}

fn main() {
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    // all-MiniLM-L6-v2's shapes, then a BERT-large-sized checkpoint.
    case(6, 384, 12);
    case(env("MESHC_CKPT_LAYERS", 24), env("MESHC_CKPT_WIDTH", 1024), 16);
}

/// Generates the checkpoint of an encoder of `layers` layers, `d` wide with `heads` heads,
/// and measures meshc on it.
fn case(layers: usize, d: usize, heads: usize) {
    let f = 4 * d;
    let meshc = PathBuf::from(env!("CARGO_BIN_EXE_meshc"));
    let dir = Scratch(std::env::temp_dir().join(format!("meshc-bench-ckpt-{}-{layers}x{d}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();

    let params: Vec<(String, Vec<usize>)> = (0..layers).flat_map(|l| layer_params(l, d, f)).collect();
    let weight_bytes: usize = params.iter().map(|(_, s)| s.iter().product::<usize>() * 4).sum();
    let t = Instant::now();
    let mut seed = 0x9E37_79B9_7F4A_7C15;
    write_safetensors(&dir.0.join("model.safetensors"), &params, &mut seed, false);
    let mut seed = 0x9E37_79B9_7F4A_7C15;
    write_safetensors(&dir.0.join("model-bf16.safetensors"), &params, &mut seed, true);
    // The same values in three shards: the seed restarts, tensors keep their order.
    let mut seed = 0x9E37_79B9_7F4A_7C15;
    let per = params.len().div_ceil(3);
    let mut weight_map = serde_json::Map::new();
    for (i, chunk) in params.chunks(per).enumerate() {
        let shard = format!("model-{:05}-of-00003.safetensors", i + 1);
        write_safetensors(&dir.0.join(&shard), chunk, &mut seed, false);
        for (n, _) in chunk {
            weight_map.insert(n.clone(), shard.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": weight_bytes}, "weight_map": weight_map});
    std::fs::write(dir.0.join("model.safetensors.index.json"), index.to_string()).unwrap();
    println!(
        "\ncheckpoint: {layers} layers x {d} wide, {heads} heads, {} params, {:.3} GB of f32 (written in {:.1} s)",
        params.len(),
        weight_bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    // The anchor: writing the artifact's bytes alone, as compile writes them (through the
    // page cache, no fsync), on this machine in this run.
    let bytes = vec![1u8; weight_bytes];
    let t = Instant::now();
    std::fs::write(dir.0.join("anchor.bin"), &bytes).unwrap();
    let write_s = t.elapsed().as_secs_f64();
    drop(bytes);
    std::fs::remove_file(dir.0.join("anchor.bin")).unwrap();
    println!(
        "anchor: writing {:.3} GB to a file here takes {write_s:.2} s ({:.2} s per GB)",
        weight_bytes as f64 / 1e9,
        write_s / (weight_bytes as f64 / 1e9)
    );
    let mut inputs = Vec::new();
    for (name, shape) in [("x", vec![BATCH, SEQ, d]), ("mask", vec![BATCH, 1, 1, SEQ])] {
        let path = dir.0.join(format!("{name}.npy"));
        let n: usize = shape.iter().product();
        meshc_ir::Tensor::f32(shape, vec![0.0; n]).write_npy(&path).unwrap();
        inputs.push(format!("{name}={}", path.display()));
    }

    println!(
        "{:<8} {:>8} {:>10} {:>13} {:>12} {:>12} {:>12} {:>10}",
        "source", "check s", "compile s", "s per GB", "RssAnon MB", "bound MB", "VmHWM MB", "run ms"
    );
    for (label, file, half, weights) in [
        ("single", "model.safetensors", false, "keep"),
        ("3 shards", "model.safetensors.index.json", false, "keep"),
        ("bf16", "model-bf16.safetensors", true, "keep"),
        ("->bf16", "model.safetensors", false, "bf16"),
    ] {
        let stem = label.replace(' ', "_").replace("->", "to_");
        let graph = dir.0.join(format!("{stem}.txt"));
        std::fs::write(&graph, encoder(layers, d, heads, f, file, half)).unwrap();
        let art = dir.0.join(format!("{stem}.mshc"));
        let g = graph.to_str().unwrap();
        let check = (0..3).map(|_| measure(&meshc, &["check", g]).0).fold(f64::MAX, f64::min);
        let (compile, anon, hwm) =
            measure(&meshc, &["compile", g, "-o", art.to_str().unwrap(), "--weights-dtype", weights]);
        let art_bytes = std::fs::metadata(&art).unwrap().len();
        let mut run_args = vec!["run".to_string(), art.display().to_string(), "--trust-weights".into()];
        for i in &inputs {
            run_args.extend(["--input".to_string(), i.clone()]);
        }
        run_args.extend(["--output-dir".into(), dir.0.join("out").display().to_string()]);
        let run_args: Vec<&str> = run_args.iter().map(String::as_str).collect();
        let run = (0..3).map(|_| measure(&meshc, &run_args).0).fold(f64::MAX, f64::min);
        let bound = 1.2 * weight_bytes as f64 + 150e6;
        println!(
            "{label:<8} {check:>8.3} {compile:>10.2} {:>13.2} {:>12.0} {:>12.0} {:>12.0} {:>10.1}",
            compile / (weight_bytes as f64 / 1e9),
            anon as f64 / 1e6,
            bound / 1e6,
            hwm as f64 / 1e6,
            run * 1e3
        );
        println!(
            "         artifact {:.2} GB = {:.3}x the weights (peak RssAnon {:.2}x the weights)",
            art_bytes as f64 / 1e9,
            art_bytes as f64 / weight_bytes as f64,
            anon as f64 / weight_bytes as f64
        );
    }
}
