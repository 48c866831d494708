//! Training step time, through the real `meshc` binary: the MLP x[B,D] → D×H + relu → H×D
//! with a mean-squared-error loss, forward + backward + AdamW (`compile --loss --optimizer
//! adamw:...`, `run --steps`), on one device and on a 2x4 mesh (batch over the axis of 2,
//! the hidden layer over the axis of 4), beside the same step in JAX (`jax.jit` of
//! value_and_grad and an AdamW update written out, no optax) on the same shapes and mesh
//! (8 host devices), measured in the same run and the same way: after `WARMUP` steps, each
//! of N steps timed alone from its call until its result is there (meshc: a `Session::step`
//! of the embedding API, in this process; JAX: the jitted step and `block_until_ready`),
//! and the median of the N (with the fastest and slowest) reported. Process start, loading
//! and compilation stay out.
//!
//!     cargo bench --bench train                   (B,D,H = 512,1024,4096, N = 10)
//!     MESHC_TRAIN_SHAPE=64,256,1024 MESHC_TRAIN_STEPS=10 cargo bench --bench train
//!     MESHC_TRAIN_PYTHON=path/to/python  (default target/jax-venv/bin/python, the models
//!                                         bench's venv; without jax the JAX column says so)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use meshc_runtime::api::{Model, Session, TensorView};
use meshc_runtime::tools::steps::State;

const ADAMW: &str = "adamw:0.001,0.9,0.999,1e-8,0.01";

/// Steps run before the timed ones, on each side: the first calls start threads and fault
/// the arenas in (meshc), compile and place buffers (JAX).
const WARMUP: usize = 2;

fn env_usizes(key: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(key)
        .ok()
        .map(|s| s.split(',').map(|v| v.trim().parse().expect("a number")).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn graph(b: usize, d: usize, h: usize) -> String {
    format!(
        r#"{{"format": "meshc-graph/1", "name": "train_mlp",
 "inputs": [{{"name": "x", "dtype": "f32", "shape": [{b}, {d}], "dims": ["batch", "embed"]}},
            {{"name": "t", "dtype": "f32", "shape": [{b}, {d}], "dims": ["batch", "embed"]}}],
 "params": [{{"name": "w1", "dtype": "f32", "shape": [{d}, {h}], "dims": ["embed", "hidden"],
              "init": {{"normal": {{"seed": 1, "std": {s1}}}}}}},
            {{"name": "w2", "dtype": "f32", "shape": [{h}, {d}], "dims": ["hidden", "embed"],
              "init": {{"normal": {{"seed": 2, "std": {s2}}}}}}}],
 "nodes": [{{"name": "h", "op": "matmul", "inputs": ["x", "w1"]}},
           {{"name": "a", "op": "relu", "inputs": ["h"]}},
           {{"name": "y", "op": "matmul", "inputs": ["a", "w2"]}},
           {{"name": "e", "op": "sub", "inputs": ["y", "t"]}},
           {{"name": "e2", "op": "mul", "inputs": ["e", "e"]}},
           {{"name": "loss", "op": "reduce_mean", "inputs": ["e2"]}}],
 "outputs": ["loss"]}}"#,
        s1 = 1.0 / (d as f64).sqrt(),
        s2 = 1.0 / (h as f64).sqrt()
    )
}

const LAYOUT: &str = r#"{"format": "meshc-layout/1", "mesh": {"shape": [2, 4], "axes": ["data", "model"]},
 "rules": {"batch": "data", "hidden": "model"}}"#;

const JAX: &str = r#"
import sys, time
b, d, h, n, mesh = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "mesh"
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
k = jax.random.split(jax.random.PRNGKey(0), 4)
w1 = jax.random.normal(k[0], (d, h), jnp.float32) / d ** 0.5
w2 = jax.random.normal(k[1], (h, d), jnp.float32) / h ** 0.5
x = jax.random.normal(k[2], (b, d), jnp.float32)
t = jax.random.normal(k[3], (b, d), jnp.float32)
ps = {"w1": w1, "w2": w2}
if mesh:
    m = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    ps = {"w1": jax.device_put(w1, NamedSharding(m, P(None, "model"))),
          "w2": jax.device_put(w2, NamedSharding(m, P("model", None)))}
    x, t = (jax.device_put(v, NamedSharding(m, P("data", None))) for v in (x, t))
def loss(ps, x, t):
    y = jax.nn.relu(x @ ps["w1"]) @ ps["w2"]
    return jnp.mean((y - t) ** 2)
@jax.jit
def step(ps, mo, vo, s, x, t):
    l, g = jax.value_and_grad(loss)(ps, x, t)
    s = s + 1
    mo = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, mo, g)
    vo = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, vo, g)
    upd = lambda p, m, v: p - 1e-3 * ((m / (1 - 0.9 ** s)) / (jnp.sqrt(v / (1 - 0.999 ** s)) + 1e-8) + 0.01 * p)
    return jax.tree.map(upd, ps, mo, vo), mo, vo, s, l
mo = jax.tree.map(jnp.zeros_like, ps); vo = jax.tree.map(jnp.zeros_like, ps); s = jnp.float32(0)
for _ in range(warmup):
    ps, mo, vo, s, l = step(ps, mo, vo, s, x, t); l.block_until_ready()
for _ in range(n):
    t0 = time.perf_counter()
    ps, mo, vo, s, l = step(ps, mo, vo, s, x, t)
    jax.block_until_ready((ps, l))
    print(time.perf_counter() - t0)
"#;

/// JAX's seconds of each timed step, or why there are none.
fn jax_steps(python: &Path, b: usize, d: usize, h: usize, n: usize, mesh: bool) -> Result<Vec<f64>, String> {
    let script = format!("warmup = {WARMUP}\n{JAX}");
    let out = Command::new(python)
        .args(["-c", &script, &b.to_string(), &d.to_string(), &h.to_string(), &n.to_string()])
        .arg(if mesh { "mesh" } else { "single" })
        .env("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("failed").to_string());
    }
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().parse().map_err(|e| format!("{e}"))).collect()
}

/// meshc's seconds of each timed step of the training artifact at `path`, from its
/// initial state, every step on the batch `x`, `t` of `shape`.
fn meshc_steps(path: &Path, (x, t): (&[f32], &[f32]), shape: &[usize], n: usize) -> Vec<f64> {
    let model = Model::open(path).expect("the artifact opens");
    let loaded = model.load().expect("it loads");
    let init = State::initial(&loaded, &path.display().to_string()).expect("its state section reads");
    let session = Session::new(&model).expect("a session");
    session.set_state(&init.expect("a training artifact").tensors).expect("the state fits");
    let batch = [("x", TensorView::new(x, shape).unwrap()), ("t", TensorView::new(t, shape).unwrap())];
    for _ in 0..WARMUP {
        session.step(&batch).expect("a step");
    }
    (0..n)
        .map(|_| {
            let t0 = Instant::now();
            session.step(&batch).expect("a step");
            t0.elapsed().as_secs_f64()
        })
        .collect()
}

fn meshc(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshc")).args(args).output().expect("meshc runs");
    assert!(out.status.success(), "meshc {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Median, fastest and slowest, in ms.
fn spread(mut secs: Vec<f64>) -> (f64, f64, f64) {
    secs.sort_by(f64::total_cmp);
    (secs[secs.len() / 2] * 1e3, secs[0] * 1e3, secs[secs.len() - 1] * 1e3)
}

fn main() {
    let shape = env_usizes("MESHC_TRAIN_SHAPE", &[512, 1024, 4096]);
    let (b, d, h) = (shape[0], shape[1], shape[2]);
    let n = env_usizes("MESHC_TRAIN_STEPS", &[10])[0].max(1);
    let dir = std::env::temp_dir().join(format!("meshc-bench-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |f: &str| dir.join(f).display().to_string();
    std::fs::write(dir.join("g.json"), graph(b, d, h)).unwrap();
    std::fs::write(dir.join("mp-2x4.json"), LAYOUT).unwrap();
    // One batch for every step: the time does not depend on the values.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut batch = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let (x, t) = (batch(b * d), batch(b * d));
    let python =
        std::env::var_os("MESHC_TRAIN_PYTHON").map(PathBuf::from).unwrap_or("target/jax-venv/bin/python".into());
    let flops = 3.0 * 2.0 * 2.0 * (b * d * h) as f64;
    println!(
        "train step: MLP [{b},{d}] -> {h} -> {d}, MSE loss, forward + backward + {ADAMW}; {WARMUP} warm-up \
         steps, then {n} timed one by one: median (fastest-slowest) ms"
    );
    println!("{:<12} {:>24} {:>10} {:>24} {:>10}", "config", "meshc ms/step", "GFLOP/s", "JAX ms/step", "meshc/JAX");
    for (label, layout) in [("1 device", None), ("2x4 mesh", Some(p("mp-2x4.json")))] {
        let mut args = vec!["compile".to_string(), p("g.json"), "--loss".into(), "loss".into()];
        args.extend(["--optimizer".into(), ADAMW.into(), "-o".into(), p("t.mshc")]);
        if let Some(l) = &layout {
            args.extend(["--layout".into(), l.clone()]);
        }
        meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let (med, lo, hi) = spread(meshc_steps(&dir.join("t.mshc"), (&x, &t), &[b, d], n));
        let (jax_ms, ratio) = match jax_steps(&python, b, d, h, n, layout.is_some()) {
            Ok(j) => {
                let (jm, jl, jh) = spread(j);
                (format!("{jm:.1} ({jl:.1}-{jh:.1})"), format!("{:.2}x", med / jm))
            }
            Err(e) => (format!("n/a ({e})"), "-".into()),
        };
        let meshc_ms = format!("{med:.1} ({lo:.1}-{hi:.1})");
        println!("{label:<12} {meshc_ms:>24} {:>10.1} {jax_ms:>24} {ratio:>10}", flops / (med / 1e3) / 1e9);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
