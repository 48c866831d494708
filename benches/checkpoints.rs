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

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::encoder::{encoder, layer_params, write_safetensors, Scratch};

const BATCH: usize = 2;
const SEQ: usize = 16;

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
    let dir = Scratch(
        std::env::temp_dir().join(format!("meshc-bench-ckpt-{}-{layers}x{d}", std::process::id())),
        "MESHC_CKPT_KEEP",
    );
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
        std::fs::write(&graph, encoder(layers, d, heads, f, (BATCH, SEQ), file, half)).unwrap();
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
