//! The pilot pass (docs/design.md §4.3) on a ReLU MLP whose pilot input provably kills two of its four
//! hidden blocks: those get priority exactly 0 and are dropped first, the live ones get the
//! documented priority, keep=1.0 keeps everything, and the `--dump-after pilot` text is
//! pinned in golden/pilot/. Also the simplifications and the CLI's refusals.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::common::{golden, meshc, scratch};
use meshc::passes::pilot::{run, simplify_params, Config, Select, Simplify, WeightMask, DEFAULT_BLOCK};
use meshc_ir::{Data, Tensor};

const BATCH: usize = 8;
const IN: usize = 4;
const HIDDEN: usize = 64;
const OUT: usize = 3;
/// Hidden blocks whose W1 columns are all negative: dead for positive inputs.
const DEAD: [usize; 2] = [1, 3];

/// Deterministic values in [lo, hi).
fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

struct Mlp {
    dir: crate::common::Scratch,
    x: Tensor,
    w1: Tensor,
    w2: Tensor,
}

impl Mlp {
    fn graph(&self) -> PathBuf {
        self.dir.join("graph.json")
    }
    fn pilot_x(&self) -> String {
        format!("x={}", self.dir.join("x.npy").display())
    }
}

/// y = relu(x·W1)·W2 with positive x and the DEAD blocks of W1's columns negative.
fn mlp(name: &str) -> Mlp {
    mlp_with(name, r#""op": "matmul""#)
}

/// The same MLP with `op` (its JSON op and attrs) as both layers.
fn mlp_with(name: &str, op: &str) -> Mlp {
    let dir = scratch(name);
    let x = Tensor::f32(vec![BATCH, IN], values(BATCH * IN, 1, 0.1, 1.0));
    let mut w1 = values(IN * HIDDEN, 2, -1.0, 1.0);
    for (i, w) in w1.iter_mut().enumerate() {
        let block = (i % HIDDEN) / DEFAULT_BLOCK;
        *w = if DEAD.contains(&block) { -w.abs() - 0.01 } else { w.abs() + 0.01 };
    }
    let w1 = Tensor::f32(vec![IN, HIDDEN], w1);
    let w2 = Tensor::f32(vec![HIDDEN, OUT], values(HIDDEN * OUT, 3, -1.0, 1.0));
    for (n, t) in [("x", &x), ("w1", &w1), ("w2", &w2)] {
        t.write_npy(&dir.join(format!("{n}.npy"))).unwrap();
    }
    let graph = format!(
        r#"{{ "format": "meshc-graph/1", "name": "pilot_mlp",
  "inputs": [{{"name": "x", "dtype": "f32", "shape": [{BATCH}, {IN}]}}],
  "params": [{{"name": "w1", "dtype": "f32", "shape": [{IN}, {HIDDEN}], "file": "w1.npy"}},
             {{"name": "w2", "dtype": "f32", "shape": [{HIDDEN}, {OUT}], "file": "w2.npy"}}],
  "nodes": [{{"name": "h", {op}, "inputs": ["x", "w1"]}},
            {{"name": "a", "op": "relu", "inputs": ["h"]}},
            {{"name": "y", {op}, "inputs": ["a", "w2"]}}],
  "outputs": ["y"] }}"#
    );
    std::fs::write(dir.join("graph.json"), graph).unwrap();
    Mlp { dir, x, w1, w2 }
}

fn pilot(m: &Mlp, simplify: Simplify, select: Select) -> Vec<WeightMask> {
    let (g, info) = meshc_ir::load::load(&m.graph()).unwrap();
    let params = HashMap::from([("w1".to_string(), m.w1.clone()), ("w2".to_string(), m.w2.clone())]);
    let runs = vec![HashMap::from([("x".to_string(), m.x.clone())])];
    run(&g, &info, &params, &Config { runs, simplify, block: DEFAULT_BLOCK, select }).unwrap()
}

fn f32s(t: &Tensor) -> &[f32] {
    t.as_f32().unwrap()
}

#[test]
fn dead_blocks_get_priority_zero_and_go_first() {
    let m = mlp("dead");
    let masks = pilot(&m, Simplify::Bits(23), Select::Keep(0.5));
    let w1 = masks.iter().find(|w| w.weight == "w1" && w.node == "h").unwrap();
    assert_eq!(w1.priorities.len(), HIDDEN / DEFAULT_BLOCK);
    // The documented rule for y = relu(x·W1)·W2: Σ_batch |relu(h)[:, block]| · ‖W2[k, :]‖₁.
    let (x, w1v, w2v) = (f32s(&m.x), f32s(&m.w1), f32s(&m.w2));
    for (b, &p) in w1.priorities.iter().enumerate() {
        let mut want = 0.0f64;
        for k in b * DEFAULT_BLOCK..(b + 1) * DEFAULT_BLOCK {
            let row: f64 = (0..OUT).map(|n| (w2v[k * OUT + n] as f64).abs()).sum();
            for r in 0..BATCH {
                let h: f32 = (0..IN).map(|i| x[r * IN + i] * w1v[i * HIDDEN + k]).sum();
                want += (h.max(0.0) as f64) * row;
            }
        }
        if DEAD.contains(&b) {
            assert_eq!(p, 0.0, "dead block {b}");
        } else {
            assert!(p > 0.0 && ((p - want) / want).abs() < 1e-5, "block {b}: {p} vs {want}");
        }
    }
    assert_eq!(w1.keep, vec![true, false, true, false]);
    assert_eq!(w1.flops_skipped, 2 * (BATCH * IN * 2 * DEFAULT_BLOCK) as u64);
    // Dropping exactly the zero-priority blocks is also what threshold 0 does.
    let t = pilot(&m, Simplify::Exponent, Select::Threshold(0.0));
    assert_eq!(t.iter().find(|w| w.weight == "w1").unwrap().keep, vec![true, false, true, false]);
}

#[test]
fn einsum_weights_are_prunable_like_matmul_ones() {
    let mm = pilot(&mlp("mm"), Simplify::Bits(10), Select::Keep(0.5));
    let es = pilot(
        &mlp_with("es", r#""op": "einsum", "attrs": {"equation": "bk,kn->bn"}"#),
        Simplify::Bits(10),
        Select::Keep(0.5),
    );
    assert_eq!(mm.len(), 2);
    assert_eq!(mm, es);
}

#[test]
fn keep_one_keeps_everything() {
    let m = mlp("keep1");
    for w in pilot(&m, Simplify::Bits(7), Select::Keep(1.0)) {
        assert!(w.keep.iter().all(|&k| k), "{}", w.weight);
        assert_eq!(w.flops_skipped, 0);
    }
}

#[test]
fn simplifications() {
    let m = mlp("simplify");
    let params = HashMap::from([("w1".to_string(), m.w1.clone()), ("w2".to_string(), m.w2.clone())]);
    assert_eq!(simplify_params(&params, &Simplify::Bits(23)), params);
    let pow2: Vec<f32> = (-20..20).map(|e| if e % 3 == 0 { -(2f32.powi(e)) } else { 2f32.powi(e) }).collect();
    let p = HashMap::from([("w".to_string(), Tensor::f32(vec![pow2.len()], pow2.clone()))]);
    assert_eq!(simplify_params(&p, &Simplify::Exponent)["w"].data, Data::F32(pow2));
    // Downsampling the batch averages pilot rows: the dead blocks stay dead.
    let d = pilot(&m, Simplify::Downsample { axis: 0, factor: 2 }, Select::Keep(0.5));
    let w1 = d.iter().find(|w| w.weight == "w1").unwrap();
    assert!(DEAD.iter().all(|&b| w1.priorities[b] == 0.0));
    assert_eq!(w1.flops, 2 * (BATCH * IN * HIDDEN) as u64, "FLOPs are those of the real graph");
}

fn compile(m: &Mlp, extra: &[&str]) -> crate::common::Run {
    let (out, graph, x) = (m.dir.join("out.mshc"), m.graph(), m.pilot_x());
    let mut args = vec!["compile", graph.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend(extra.iter().copied().map(|a| if a == "X" { x.as_str() } else { a }));
    meshc(&args)
}

#[test]
fn dump_after_pilot_golden() {
    let m = mlp("golden");
    let mut failures = Vec::new();
    for (file, args) in [
        ("keep0.5.txt", &["--pilot-input", "X", "--pilot-keep", "0.5"][..]),
        (
            "keep1.0-exponent-two-runs.txt",
            &["--pilot-input", "X", "--pilot-input", "X", "--pilot-simplify", "exponent"],
        ),
        (
            "threshold0-downsample.txt",
            &["--pilot-input", "X", "--pilot-threshold", "0", "--pilot-simplify", "downsample:0:4"],
        ),
    ] {
        let r = compile(&m, &[&["--dump-after", "pilot"], args].concat());
        assert_eq!(r.status, Some(0), "{file}: {}", r.stderr);
        failures.extend(golden(&format!("pilot/{file}"), &r.stdout).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn refusals_are_one_line() {
    let m = mlp("refused");
    for (args, want) in [
        (&["--dump-after", "pilot"][..], "--dump-after pilot needs pilot inputs"),
        (&["--pilot-keep", "0.5"], "need pilot inputs"),
        (&["--pilot-input", "X", "--pilot-keep", "0"], "--pilot-keep 0: expected 0 < F <= 1"),
        (&["--pilot-input", "X", "--pilot-simplify", "bits:30"], "--pilot-simplify 'bits:30'"),
        (&["--pilot-input", "X", "--pilot-simplify", "downsample:1:2"], "does not accept the smaller inputs"),
        (&["--pilot-input", "z=nope.npy"], "the graph has no input 'z'"),
        (&["--pilot-input", "X", "--pilot-simplify", "downsample:0:3"], "axis 0 has size 8, not a multiple of 3"),
        // The input is rank 2: an axis 9 would leave the pilot run unsimplified.
        (&["--pilot-input", "X", "--pilot-simplify", "downsample:9:2"], "no input has an axis 9 ('x' rank 2)"),
    ] {
        let r = compile(&m, args);
        assert_eq!(r.status, Some(1), "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(want) && r.stderr.lines().count() == 1, "{args:?}: {}", r.stderr);
    }
    assert!(m.dir.exists());
}

#[test]
fn masks_do_not_depend_on_the_layout() {
    let dir = scratch("layout");
    let out = dir.join("out.mshc");
    let base = ["compile", "testdata/mlp/graph.json", "-o", out.to_str().unwrap()];
    let pilot = ["--pilot-input", "x=testdata/mlp/inputs/x.npy", "--pilot-keep", "0.3", "--dump-after", "pilot"];
    let plain = meshc(&[&base[..], &pilot].concat());
    let laid = meshc(&[&base[..], &pilot, &["--layout", "testdata/mlp/layouts/mp-4.json"]].concat());
    assert_eq!(plain.status, Some(0), "{}", plain.stderr);
    assert_eq!(laid.status, Some(0), "{}", laid.stderr);
    assert!(plain.stdout.contains("weight w1 in"), "{}", plain.stdout);
    assert_eq!(plain.stdout, laid.stdout);
}
