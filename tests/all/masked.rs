//! Conditional execution (docs/design.md §4.3): artifacts compiled with the pilot pass skip the pruned
//! blocks, and compute exactly the pruned graph. The oracle is the reference interpreter
//! on the graph with the pruned params (`passes::pilot::apply`: pruned columns of W1,
//! entries of b1 and rows of W2 zeroed). Checked for the generated and the library matmul,
//! on one device and under mesh layouts; a ReLU MLP with provably dead hidden units loses
//! exactly nothing and skips exactly those blocks; keep 1.0 is the unpruned artifact, byte
//! for byte.

use std::collections::{BTreeMap, HashMap};

use crate::common::{meshc, scratch};
use meshc::compile::{Code, Compiled, Emit, Gemm, Options};
use meshc::driver;
use meshc::passes::pilot::{self, Config, Select, Simplify};
use meshc::pipeline::Dumps;
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Tensor};

const BATCH: usize = 24;
const IN: usize = 20;
const HIDDEN: usize = 96;
const OUT: usize = 10;
const BLOCK: usize = 16;

/// Deterministic values: `k / 8` for k in -8..8 when `dyadic` (every sum of products of
/// such values in this MLP is exact in f32, whatever the order), else uniform in [-1, 1).
fn values(n: usize, seed: u64, dyadic: bool) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            if dyadic {
                ((u * 16.0).floor() - 8.0) / 8.0
            } else {
                2.0 * u - 1.0
            }
        })
        .collect()
}

/// y = relu(x·W1 + b1)·W2 + b2, with the hidden blocks in `dead` dead for inputs ≥ 0
/// (W1 columns ≤ 0 and b1 < 0 there).
fn mlp(dead: &[usize], dyadic: bool) -> (Graph, Info, HashMap<String, Tensor>) {
    let src = format!(
        "graph pilot_mlp {{
  input x: f32[{BATCH},{IN}]
  param w1: f32[{IN},{HIDDEN}] = init uniform{{seed = 1, low = -1, high = 1}}
  param b1: f32[{HIDDEN}] = init uniform{{seed = 1, low = -1, high = 1}}
  param w2: f32[{HIDDEN},{OUT}] = init uniform{{seed = 1, low = -1, high = 1}}
  param b2: f32[{OUT}] = init uniform{{seed = 1, low = -1, high = 1}}
  h = matmul(x, w1)
  hb = add(h, b1)
  a = relu(hb)
  z = matmul(a, w2)
  y = add(z, b2)
  output y
}}"
    );
    let g = meshc_ir::text::parse(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let info = meshc_ir::verify::verify(&g).unwrap();
    let mut w1 = values(IN * HIDDEN, 2, dyadic);
    let mut b1 = values(HIDDEN, 3, dyadic);
    for (i, w) in w1.iter_mut().enumerate() {
        if dead.contains(&((i % HIDDEN) / BLOCK)) {
            *w = -w.abs();
        }
    }
    for (j, b) in b1.iter_mut().enumerate() {
        if dead.contains(&(j / BLOCK)) {
            *b = -b.abs() - 0.125;
        }
    }
    let params = HashMap::from([
        ("w1".to_string(), Tensor::f32(vec![IN, HIDDEN], w1)),
        ("b1".to_string(), Tensor::f32(vec![HIDDEN], b1)),
        ("w2".to_string(), Tensor::f32(vec![HIDDEN, OUT], values(HIDDEN * OUT, 4, dyadic))),
        ("b2".to_string(), Tensor::f32(vec![OUT], values(OUT, 5, dyadic))),
    ]);
    (g, info, params)
}

/// A text graph whose params are all `init`: parsed, verified, params made.
fn parsed(src: &str) -> (Graph, Info, HashMap<String, Tensor>) {
    let g = meshc_ir::text::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let info = meshc_ir::verify::verify(&g).unwrap();
    let params = meshc_ir::params::load_all(&g, std::path::Path::new(".")).unwrap();
    (g, info, params)
}

/// Inputs ≥ 0.
fn input(seed: u64, dyadic: bool) -> HashMap<String, Tensor> {
    let x: Vec<f32> = values(BATCH * IN, seed, dyadic).iter().map(|v| v.abs()).collect();
    HashMap::from([("x".to_string(), Tensor::f32(vec![BATCH, IN], x))])
}

fn config(select: Select) -> Config {
    Config { runs: vec![input(7, true)], simplify: Simplify::Bits(10), block: BLOCK, select }
}

fn build(
    m: &(Graph, Info, HashMap<String, Tensor>),
    layout: Option<&str>,
    gemm: Gemm,
    cfg: Option<&Config>,
) -> Compiled {
    build_for(Emit::Memory, m, layout, gemm, cfg)
}

fn build_for(
    emit: Emit,
    (g, info, params): &(Graph, Info, HashMap<String, Tensor>),
    layout: Option<&str>,
    gemm: Gemm,
    cfg: Option<&Config>,
) -> Compiled {
    let spec = layout.map(|f| meshc::layout::load(std::path::Path::new(f)).unwrap());
    let opts = Options { gemm, emit, ..Options::default() };
    driver::Job::new(g, info, params, &opts).spec(spec.as_ref()).pilot(cfg).build(&Dumps::default()).unwrap()
}

/// Runs `c` on `inputs`, and returns the outputs with the runner's decoded masks of device 0
/// by weight name.
fn run(
    c: Compiled,
    inputs: &HashMap<String, Tensor>,
) -> (BTreeMap<String, Tensor>, BTreeMap<String, meshc_runtime::format::mask::Mask>) {
    let loaded = c.load().unwrap();
    let masks = (loaded.programs[0].buffers.iter().enumerate())
        .filter_map(|(i, b)| Some((b.name.clone(), loaded.mask(0, i)?.clone())))
        .collect();
    (loaded.run(inputs).unwrap(), masks)
}

/// The interpreter on the pruned graph.
fn oracle(m: &(Graph, Info, HashMap<String, Tensor>), cfg: &Config, inputs: &HashMap<String, Tensor>) -> Tensor {
    let (g, info, params) = m;
    let masks = pilot::run(g, info, params, cfg).unwrap();
    let pruned = pilot::apply(g, info, params, &masks, cfg.block).unwrap();
    let mut values = pruned.params.clone();
    values.extend(inputs.clone());
    meshc_ir::interp::run(g, &info.order, &info.types, values).unwrap().remove("y").unwrap()
}

#[test]
fn dead_units_are_skipped_exactly_and_lose_nothing() {
    let dead = [1, 4];
    let m = mlp(&dead, true);
    // Threshold 0 drops exactly the blocks that never contribute.
    let cfg = config(Select::Threshold(0.0));
    let live: Vec<(usize, usize)> = vec![(0, BLOCK), (2 * BLOCK, 2 * BLOCK), (5 * BLOCK, BLOCK)];
    for gemm in [Gemm::Cranelift, Gemm::Library] {
        let (unpruned, none) = run(build(&m, None, gemm, None), &input(11, true));
        assert!(none.is_empty());
        // A different input than the pilot's: the dead units are dead for every x ≥ 0.
        let (pruned, masks) = run(build(&m, None, gemm, Some(&cfg)), &input(11, true));
        assert_eq!(pruned["y"], unpruned["y"], "{gemm:?}: exactly zero error");
        assert_eq!(masks["w1"].col_runs, live, "{gemm:?}: W1 skips exactly the dead columns");
        assert_eq!(masks["w1"].row_runs, [(0, IN)]);
        assert_eq!(masks["w2"].row_runs, live, "{gemm:?}: W2 skips exactly the dead units' rows");
        assert_eq!(masks["w2"].col_runs, [(0, OUT)]);
        assert_eq!(masks.len(), 2);
    }
}

#[test]
fn keep_one_is_the_unpruned_artifact() {
    let m = mlp(&[], false);
    for gemm in [Gemm::Cranelift, Gemm::Library] {
        let plain = build(&m, None, gemm, None);
        let kept = build(&m, None, gemm, Some(&config(Select::Keep(1.0))));
        assert_eq!(kept.weights, plain.weights, "{gemm:?}");
        let section = |cfg| match build_for(Emit::Artifact, &m, None, gemm, cfg).code {
            Code::Section(bytes) => bytes,
            Code::Memory(_) => unreachable!("compiled for an artifact"),
        };
        assert_eq!(section(Some(&config(Select::Keep(1.0)))), section(None), "{gemm:?}");
        let (a, _) = run(plain, &input(3, false));
        let (b, masks) = run(kept, &input(3, false));
        assert!(masks.is_empty());
        let bits = |t: &Tensor| t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a["y"]), bits(&b["y"]), "{gemm:?}");
    }
}

#[test]
fn both_matmul_paths_compute_the_pruned_graph() {
    let m = mlp(&[], false);
    for keep in [0.2, 0.5, 0.7] {
        let cfg = config(Select::Keep(keep));
        let inputs = input(5, false);
        let want = oracle(&m, &cfg, &inputs);
        let (unpruned, _) = run(build(&m, None, Gemm::Library, None), &inputs);
        assert!(
            crate::common::assert_close("unpruned", &unpruned["y"], &want).is_err(),
            "keep {keep}: pruning changes y"
        );
        for gemm in [Gemm::Cranelift, Gemm::Library] {
            let (got, masks) = run(build(&m, None, gemm, Some(&cfg)), &inputs);
            crate::common::assert_close(&format!("keep {keep} {gemm:?}"), &got["y"], &want).unwrap();
            let kept = masks["w1"].cols_kept();
            assert_eq!(kept, (keep * (HIDDEN / BLOCK) as f64).ceil() as usize * BLOCK, "keep {keep}");
            assert_eq!(masks["w2"].rows_kept(), kept);
        }
    }
}

#[test]
fn masked_runs_under_layouts_equal_one_device() {
    let m = mlp(&[], false);
    let cfg = config(Select::Keep(0.4));
    let inputs = input(9, false);
    let dir = scratch("masked-layouts");
    let (single, _) = run(build(&m, None, Gemm::Auto, Some(&cfg)), &inputs);
    for (name, layouts) in [
        ("mp-4", r#"{"w1": [null, "m"], "b1": ["m"], "w2": ["m", null]}"#),
        // 96 hidden over 3: 32 per device, blocks of 16 align; over 2x3 (a torus) 48 and
        // 32 columns per device.
        ("mp-3", r#"{"w1": [null, "m"], "w2": ["m", null]}"#),
        ("dp-2", r#"{"x": ["m", null]}"#),
        ("mp-k", r#"{"w1": ["m", null]}"#),
    ] {
        let n = if name == "mp-3" {
            3
        } else if name == "dp-2" {
            2
        } else {
            4
        };
        let spec = format!(
            r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [{n}], "axes": ["m"]}}, "layouts": {layouts}}}"#
        );
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, spec).unwrap();
        for gemm in [Gemm::Cranelift, Gemm::Library] {
            let (got, masks) = run(build(&m, Some(file.to_str().unwrap()), gemm, Some(&cfg)), &inputs);
            assert!(!masks.is_empty(), "{name}: device 0 has masked weights");
            crate::common::assert_close(&format!("{name} {gemm:?}"), &got["y"], &single["y"]).unwrap();
        }
    }
}

#[test]
fn inspect_shows_masks_and_flops_skipped() {
    let dir = scratch("masked-inspect");
    let out = dir.join("p.mshc");
    let x = "x=testdata/mlp/inputs/x.npy";
    let c = meshc(&[
        "compile",
        "testdata/mlp/graph.json",
        "-o",
        out.to_str().unwrap(),
        "--pilot-input",
        x,
        "--pilot-keep",
        "0.25",
    ]);
    assert_eq!(c.status, Some(0), "{}", c.stderr);
    assert!(c.stderr.contains("pilot: FLOPs skipped"), "{}", c.stderr);
    let i = meshc(&["inspect", out.to_str().unwrap()]);
    assert_eq!(i.status, Some(0), "{}", i.stderr);
    assert!(i.stdout.contains("mask w1: columns kept 64 of 256 in 16-wide blocks"), "{}", i.stdout);
    assert!(i.stdout.contains("mask w2: rows kept 64 of 256"), "{}", i.stdout);
    assert!(i.stdout.contains("pilot: FLOPs skipped"), "{}", i.stdout);
}

#[test]
fn compare_unpruned_prints_the_error() {
    let x = "x=testdata/mlp/inputs/x.npy";
    let run = |extra: &[&str]| {
        meshc(
            &[&["run", "testdata/mlp/graph.json", "--input", x, "--output-dir", "/dev/null/none"][..4], extra].concat(),
        )
    };
    let same = run(&["--pilot-input", x, "--pilot-keep", "1.0", "--compare-unpruned"]);
    assert_eq!(same.status, Some(0), "{}", same.stderr);
    assert!(
        same.stdout.contains(
            "compare-unpruned y: max abs error 0.000e0, relative L2 0.000e0, argmax agrees on 16 of 16 rows (100.00%)"
        ),
        "{}",
        same.stdout
    );
    let pruned = run(&["--pilot-input", x, "--pilot-keep", "0.25", "--compare-unpruned"]);
    assert_eq!(pruned.status, Some(0), "{}", pruned.stderr);
    let line = pruned.stdout.lines().find(|l| l.starts_with("compare-unpruned y:")).unwrap();
    assert!(!line.contains("max abs error 0.000e0"), "{line}");
    // --conditional: the pilot input is the run's own.
    let live = run(&["--conditional", "--pilot-keep", "0.25", "--compare-unpruned"]);
    assert_eq!(live.status, Some(0), "{}", live.stderr);
    assert_eq!(live.stdout, pruned.stdout);
    let refused = run(&["--compare-unpruned"]);
    assert_eq!(refused.status, Some(1));
    assert!(refused.stderr.contains("nothing is pruned without the pilot pass"), "{}", refused.stderr);
    assert!(refused.stdout.is_empty(), "refused before running: {}", refused.stdout);
    let missing = run(&["--pilot-input", x, "--compare-unpruned=nope.json"]);
    assert_eq!(missing.status, Some(1));
    assert_eq!(missing.stderr, "error: --compare-unpruned nope.json: no such file\n");
    assert!(missing.stdout.is_empty());

    let a = |v: &[f32]| Tensor::f32(vec![2, 3], v.to_vec());
    let pruned = BTreeMap::from([("y".to_string(), a(&[1., 2., 3., 3., 1., 0.]))]);
    let unpruned = BTreeMap::from([("y".to_string(), a(&[1., 2., 4., 1., 2., 0.]))]);
    let s = driver::compare(&pruned, &unpruned).unwrap();
    let rel = (6.0f64 / 26.0).sqrt();
    assert_eq!(
        s,
        format!(
            "compare-unpruned y: max abs error 2.000e0, relative L2 {rel:.3e}, argmax agrees on 1 of 2 rows (50.00%)\n"
        )
    );
}

#[test]
fn corrupted_mask_records_are_refused_at_load() {
    let m = mlp(&[], false);
    let c = build(&m, None, Gemm::Cranelift, Some(&config(Select::Keep(0.5))));
    let (offset, info) = (c.programs[0].buffers.iter())
        .find_map(|b| match (&b.storage, &b.mask) {
            (meshc_runtime::format::program::Storage::Weights { offset }, Some(info)) => Some((*offset, info.clone())),
            _ => None,
        })
        .expect("a masked weight");
    let record = offset - info.bytes;
    for (at, byte, want) in [
        (record, b'X', "bad mask record magic"),
        // The first column run's start, beyond the weight's columns.
        (record + meshc_runtime::format::mask::HEADER + 1, 0x7f, "out of order or out of bounds"),
        // The record's length word.
        (offset - 4, 3, "no mask record"),
    ] {
        let mut c = build(&m, None, Gemm::Cranelift, Some(&config(Select::Keep(0.5))));
        c.weights[at] = byte;
        let e = c.load().err().expect("refused");
        assert!(format!("{e:#}").contains(want), "{e:#}");
    }
}

/// What `apply` prunes beyond the ReLU MLP: a chain through sigmoid (which maps a removed
/// feature to 0.5, not 0) stops there, columns that reach an output through a softmax are
/// results and stay, and a weight used twice is left alone.
#[test]
fn apply_prunes_only_what_stays_exactly_zero() {
    let src = "graph g {
  input x: f32[4,8]
  param w1: f32[8,32] = init uniform{seed = 1, low = -1, high = 1}
  param b1: f32[32] = init uniform{seed = 2, low = -1, high = 1}
  param w2: f32[32,16] = init uniform{seed = 3, low = -1, high = 1}
  param ws: f32[16,16] = init uniform{seed = 4, low = -1, high = 1}
  h = matmul(x, w1)
  hb = add(h, b1)
  s = sigmoid(hb)
  z = matmul(s, w2)
  u = matmul(z, ws)
  v = matmul(u, ws)
  y = softmax(v) {axis = -1}
  output y
}";
    let (g, info, params) = parsed(src);
    let x = Tensor::f32(vec![4, 8], values(32, 9, false));
    let cfg = Config {
        runs: vec![HashMap::from([("x".to_string(), x.clone())])],
        simplify: Simplify::Bits(23),
        block: 8,
        select: Select::Keep(0.5),
    };
    let masks = pilot::run(&g, &info, &params, &cfg).unwrap();
    let p = pilot::apply(&g, &info, &params, &masks, 8).unwrap();
    let log = p.log.join("\n");
    let w1 = &p.masks["w1"];
    assert_eq!(w1.col_keep.iter().filter(|&&k| !k).count(), 16, "{log}");
    assert!(w1.row_keep.iter().all(|&k| k));
    // b1's entries go with the removed features (the add keeps them exactly zero) ...
    let dropped: Vec<usize> = (0..32).filter(|&j| !w1.col_keep[j]).collect();
    assert!(dropped.iter().all(|&j| p.params["b1"].as_f32().unwrap()[j] == 0.0), "{log}");
    // ... but sigmoid does not, so w2's rows stay; and w2's columns are not outputs, so they
    // are pruned, while ws is used twice.
    assert!(p.masks["w2"].row_keep.iter().all(|&k| k), "{log}");
    assert!(p.masks["w2"].col_keep.iter().any(|&k| !k), "{log}");
    assert!(!p.masks.contains_key("ws"), "{log}");
    assert!(log.contains("ws in u: not pruned"), "{log}");
    // The compiled pruned graph computes exactly this.
    let m = (g, info, params);
    let want = oracle(&m, &cfg, &HashMap::from([("x".to_string(), x.clone())]));
    let (got, _) = run(build(&m, None, Gemm::Cranelift, Some(&cfg)), &HashMap::from([("x".to_string(), x)]));
    crate::common::assert_close("sigmoid chain", &got["y"], &want).unwrap();
}

/// Three layers: the middle weight loses rows (the first layer's pruned features) and
/// columns (its own) at once; one device and a model-parallel layout, both matmul paths.
#[test]
fn deep_mlp_prunes_rows_and_columns_of_one_weight() {
    let src = "graph deep {
  input x: f32[16,24]
  param w1: f32[24,64] = init uniform{seed = 1, low = -1, high = 1}
  param b1: f32[64] = init uniform{seed = 2, low = -1, high = 1}
  param w2: f32[64,48] = init uniform{seed = 3, low = -1, high = 1}
  param w3: f32[48,8] = init uniform{seed = 4, low = -1, high = 1}
  h1 = matmul(x, w1)
  hb = add(h1, b1)
  a1 = relu(hb)
  h2 = matmul(a1, w2)
  a2 = gelu(h2)
  y = matmul(a2, w3)
  output y
}";
    let (g, info, params) = parsed(src);
    let x = Tensor::f32(vec![16, 24], values(16 * 24, 21, false));
    let inputs = HashMap::from([("x".to_string(), x.clone())]);
    let cfg = Config { runs: vec![inputs.clone()], simplify: Simplify::Exponent, block: 8, select: Select::Keep(0.4) };
    let m = (g, info, params);
    let want = oracle(&m, &cfg, &inputs);
    let dir = scratch("masked-deep");
    let spec = dir.join("mp.json");
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [4], "axes": ["m"]}, "layouts": {"w2": ["m", null]}}"#,
    )
    .unwrap();
    for layout in [None, Some(spec.to_str().unwrap())] {
        for gemm in [Gemm::Cranelift, Gemm::Library] {
            let (got, masks) = run(build(&m, layout, gemm, Some(&cfg)), &inputs);
            crate::common::assert_close(&format!("{layout:?} {gemm:?}"), &got["y"], &want).unwrap();
            if layout.is_none() {
                let w2 = &masks["w2"];
                assert!(w2.rows_kept() < 64 && w2.cols_kept() < 48, "{w2:?}");
                assert_eq!(masks["w3"].rows_kept(), w2.cols_kept(), "gelu(0) = 0: w3 loses w2's pruned features");
            }
        }
    }
}

/// Placed specs (stages on sub-meshes joined by send/recv) carry the masks too.
#[test]
fn masked_runs_under_placements_equal_one_device() {
    let path = std::path::Path::new("testdata/mlp/graph.json");
    let (g, info) = meshc_ir::load::load(path).unwrap();
    let params = meshc_ir::params::load_all(&g, path.parent().unwrap()).unwrap();
    let x = Tensor::read_npy(std::path::Path::new("testdata/mlp/inputs/x.npy")).unwrap();
    let inputs = HashMap::from([("x".to_string(), x)]);
    let cfg = Config { runs: vec![inputs.clone()], simplify: Simplify::Bits(7), block: 16, select: Select::Keep(0.3) };
    let m = (g, info, params);
    let (single, masks) = run(build(&m, None, Gemm::Auto, Some(&cfg)), &inputs);
    assert!(masks.contains_key("w1"));
    for spec in ["stages-2x4", "pipeline-2", "design-2x4"] {
        let file = format!("testdata/mlp/layouts/{spec}.json");
        for gemm in [Gemm::Cranelift, Gemm::Library] {
            let c = build(&m, Some(&file), gemm, Some(&cfg));
            let masked = c.programs.iter().flat_map(|p| &p.buffers).filter(|b| b.mask.is_some()).count();
            assert!(masked >= 2, "{spec}: the devices hold masked weights");
            let (got, _) = run(c, &inputs);
            crate::common::assert_close(&format!("{spec} {gemm:?}"), &got["y"], &single["y"]).unwrap();
        }
    }
}
