//! Per-call overhead of the embedding API (docs/embedding.md): a tiny graph (relu of 16
//! floats) compiled by the real `meshc` and called through `Session::run_into` (target: at
//! most 5 µs a call, and no heap allocation once warm: runtime/tests/no_alloc.rs asserts it)
//! and `Session::run`, with the heap allocations each call makes counted on every thread.
//!
//!     cargo bench --bench embed

use std::time::Instant;

use meshc_runtime::api::{Model, Session, TensorView, TensorViewMut};

#[path = "../runtime/tests/common/counting.rs"]
mod counting;
use counting::allocations;

const GRAPH: &str = r#"{
  "format": "meshc-graph/1",
  "name": "relu16",
  "inputs": [{"name": "x", "dtype": "f32", "shape": [16]}],
  "params": [],
  "nodes": [{"name": "y", "op": "relu", "inputs": ["x"]}],
  "outputs": ["y"]
}"#;

/// The median over `rounds` rounds of the mean time of `calls` calls of `f`, in µs, and the
/// allocations per call.
fn time(rounds: usize, calls: usize, mut f: impl FnMut()) -> (f64, f64) {
    (0..calls).for_each(|_| f());
    let before = allocations();
    let mut means: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            (0..calls).for_each(|_| f());
            t.elapsed().as_secs_f64() * 1e6 / calls as f64
        })
        .collect();
    let allocs = (allocations() - before) as f64 / (rounds * calls) as f64;
    means.sort_by(f64::total_cmp);
    (means[rounds / 2], allocs)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("meshc-bench-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (graph, art) = (dir.join("relu16.json"), dir.join("relu16.mshc"));
    std::fs::write(&graph, GRAPH).unwrap();
    let c = std::process::Command::new(env!("CARGO_BIN_EXE_meshc"))
        .args(["compile", graph.to_str().unwrap(), "-o", art.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let model = Model::open(&art).unwrap();
    let session = Session::new(&model).unwrap();
    let x: Vec<f32> = (0..16).map(|i| i as f32 - 8.0).collect();
    let mut y = vec![0f32; 16];
    let inputs = [("x", TensorView::new(&x, &[16]).unwrap())];
    let (into, into_allocs) = time(21, 20_000, || {
        let mut out = [("y", TensorViewMut::new(&mut y, &[16]).unwrap())];
        session.run_into(&inputs, &mut out).unwrap();
    });
    assert_eq!(y, x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
    let (owned, owned_allocs) = time(21, 20_000, || {
        std::hint::black_box(session.run(&inputs).unwrap());
    });
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    println!("embed: relu of 16 f32, one session, {cpu}");
    println!("  run_into  {into:.2} µs/call (target <= 5 µs), {into_allocs:.1} heap allocations/call (target 0)");
    println!("  run       {owned:.2} µs/call, {owned_allocs:.1} heap allocations/call");
    let _ = std::fs::remove_dir_all(&dir);
}
