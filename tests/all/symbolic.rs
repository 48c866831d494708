//! Symbolic dims (docs/dynamic-shapes.md): shapes inferred over symbols agree with the
//! verifier on the graph written at any size within the bounds, the interpreter run on one
//! symbolic graph at several sizes agrees with the graph written at each size, and a call
//! whose sizes break a bound, a divisor or an equality is refused with one line.

use std::path::{Path, PathBuf};

use meshc_ir::sym::{self, Binding, Symbol, Symbols};
use meshc_ir::{load, text, verify, Tensor};
use proptest::prelude::*;

use crate::common::{meshc, random_graph, scratch};

/// A tiny deterministic generator: the bindings a test tries are the same on every run.
fn lcg(state: &mut u64) -> u64 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *state >> 33
}

/// Every graph file under testdata (recursively) that loads and names input dims.
fn named_dim_graphs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("testdata is readable") {
            let p = e.expect("readable").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "json" || x == "txt") {
                out.push(p);
            }
        }
    }
    let mut all = Vec::new();
    walk(Path::new("testdata"), &mut all);
    all.sort();
    all.into_iter()
        .filter(|p| {
            load::load(p).is_ok_and(|(g, _)| g.inputs.iter().any(|i| i.dims.iter().flatten().any(Option::is_some)))
        })
        .collect()
}

/// Every input dim name of `g` as a symbol over `1..=hi`.
fn symbols_of(g: &meshc_ir::Graph, hi: i64) -> Symbols {
    let names = g.inputs.iter().flat_map(|i| i.dims.iter().flatten().flatten());
    names.map(|n| (n.clone(), Symbol { name: n.clone(), lo: 1, hi, multiple_of: 1 })).collect()
}

/// The verifier's shapes of the graph written at `at` are the symbolic shapes evaluated
/// there, for every tensor.
fn agrees_at(g: &meshc_ir::Graph, si: &sym::SymInfo, at: &Binding) -> Result<(), String> {
    let sg = sym::specialise(g, si, at)?;
    let info = verify::verify(&sg).map_err(|e| format!("at {at:?}: the written graph does not verify: {e}"))?;
    for (name, shape) in &si.shapes {
        let want: Vec<usize> = shape.iter().map(|e| e.eval(at).expect("bound") as usize).collect();
        if info.types[name].shape != want {
            return Err(format!("at {at:?}: '{name}' is {:?}, symbolically {want:?}", info.types[name].shape));
        }
    }
    Ok(())
}

#[test]
fn testdata_graphs_agree_with_the_verifier_at_random_sizes() {
    let graphs = named_dim_graphs();
    assert!(graphs.len() >= 8, "found {graphs:?}");
    let (mut compared, mut moved, mut inferred) = (0, 0, 0);
    for path in &graphs {
        let (g, info) = load::load(path).unwrap();
        let symbols = symbols_of(&g, 48);
        let si = match sym::infer_graph(&g, &info, &symbols) {
            Ok(si) => si,
            // A graph whose reshapes cannot be read at other sizes says so, naming the node;
            // one whose inputs give a dim name two sizes names both inputs.
            Err(e) => {
                assert!(e.starts_with("node '") || e.contains("but input '"), "{}: {e}", path.display());
                // (Inference disagreeing with the verifier is never the graph's fault.)
                assert!(!e.contains("a meshc bug"), "{}: {e}", path.display());
                continue;
            }
        };
        inferred += 1;
        assert_eq!(sym::specialise(&g, &si, &si.example).unwrap(), g, "{}", path.display());
        let mut state = compared as u64 + 1;
        for _ in 0..40 {
            // Half the symbols keep their example size: a symbol a param pins still lets the
            // others move.
            let mut pick = |name: &str| match lcg(&mut state) % 2 {
                0 => si.example[name],
                _ => 1 + (lcg(&mut state) % 48) as i64,
            };
            let at: Binding = symbols.keys().map(|n| (n.clone(), pick(n))).collect();
            if si.checks.iter().any(|c| c.kind.holds(&at) == Some(false)) {
                continue;
            }
            agrees_at(&g, &si, &at).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            compared += 1;
            moved += usize::from(at != si.example);
        }
    }
    assert!(inferred >= 8, "only {inferred} of {} graphs inferred", graphs.len());
    // Most graphs pin some symbol (a param sized to it); the rest must move freely.
    assert!(moved >= 50, "only {moved} of {compared} bindings left the graphs' own sizes");
}

/// The random graphs of the property tests without their slices (which halve a dim: a
/// literal size there means the half at the written size only).
pub(crate) fn graph_at(b: usize, d: usize, ops: &[(u8, u8, u8)]) -> meshc_ir::Graph {
    let ops: Vec<(u8, u8, u8)> = ops.iter().map(|&(o, p, a)| (if o % 11 == 9 { 0 } else { o }, p, a)).collect();
    let src = random_graph(b, d, &ops).replacen(&format!("f32[{b},{d}]"), &format!("f32[{b},{d}] dims(batch, _)"), 1);
    text::parse(&src).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The graph written at another batch by the symbolic shapes is the graph the generator
    /// writes at that batch: the same attributes and the same types everywhere.
    #[test]
    fn random_graphs_written_at_a_batch_are_the_generated_ones(
        d in 0usize..2,
        ops in prop::collection::vec((0u8..11, any::<u8>(), any::<u8>()), 1..10),
        b2 in prop::sample::select(vec![2usize, 10, 14, 22]),
    ) {
        let d = [4, 8][d];
        let g = graph_at(6, d, &ops);
        let info = verify::verify(&g).unwrap();
        let symbols: Symbols = [("batch".to_string(), Symbol { name: "batch".into(), lo: 1, hi: 64, multiple_of: 1 })].into();
        let si = sym::infer_graph(&g, &info, &symbols).map_err(|e| TestCaseError::fail(format!("{e}\n{}", text::print(&g))))?;
        let want = graph_at(b2, d, &ops);
        // The generator picks operands among same-shape values, and a batch can make two
        // shapes meet (at 2, [2*4/2, 2] is [4, 2]): then it wrote another graph.
        let wiring = |g: &meshc_ir::Graph| g.nodes.iter().map(|n| (n.op, n.inputs.clone())).collect::<Vec<_>>();
        if wiring(&want) != wiring(&g) {
            return Err(TestCaseError::reject("the generator wires another graph at this batch"));
        }
        let shape = [b2, d];
        let at = match sym::bind(&g, &si, |_| Some(&shape[..])) {
            Ok(at) => at,
            // A param sized to the batch (a transposed matmul's weight) pins it, directly or
            // through a reshape (`2*batch == 12`): check says so.
            Err(e) if e.contains("fail the check") => return Err(TestCaseError::reject("batch is pinned")),
            Err(e) => return Err(TestCaseError::fail(format!("{e}\n{}", text::print(&g)))),
        };
        let written = sym::specialise(&g, &si, &at).unwrap();
        prop_assert_eq!(&written, &want, "{}", text::print(&g));
        agrees_at(&g, &si, &at).map_err(TestCaseError::fail)?;
    }
}

fn write(dir: &Path, name: &str, t: &Tensor) -> String {
    let p = dir.join(name);
    t.write_npy(&p).unwrap();
    format!("x={}", p.display())
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| (lcg(&mut s) % 2001) as f32 / 1000.0 - 1.0).collect()
}

#[test]
fn interp_at_three_batches_is_the_graph_written_at_each() {
    let dir = scratch("sym-interp");
    let graph = "testdata/mlp/graph.json";
    let full = Tensor::f32(vec![16, 64], values(16 * 64, 7));
    let arg = write(&dir, "x16.npy", &full);
    let r = meshc(&["interp", graph, "--input", &arg, "--output", &format!("y={}", dir.join("y16.npy").display())]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let y16 = Tensor::read_npy(&dir.join("y16.npy")).unwrap();
    for b in [1usize, 5, 23] {
        let x = Tensor::f32(vec![b, 64], full.as_f32().unwrap().iter().copied().cycle().take(b * 64).collect());
        let arg = write(&dir, &format!("x{b}.npy"), &x);
        let mut outs = Vec::new();
        for dim in ["batch=1..64".to_string(), format!("batch={b}")] {
            let out = dir.join(format!("y{b}-{}.npy", outs.len()));
            let r =
                meshc(&["interp", "--dim", &dim, graph, "--input", &arg, "--output", &format!("y={}", out.display())]);
            assert_eq!(r.status, Some(0), "--dim {dim}: {}", r.stderr);
            outs.push(Tensor::read_npy(&out).unwrap());
        }
        assert_eq!(outs[0], outs[1], "batch {b}: the symbolic graph and the graph written at {b} differ");
        assert_eq!(outs[0].shape, vec![b, 64]);
        // Rows are independent in an MLP: each row is the written graph's row for that input.
        let (got, all) = (outs[0].as_f32().unwrap(), y16.as_f32().unwrap());
        for (i, v) in got.iter().enumerate() {
            let w = all[i % (16 * 64)];
            assert!((v - w).abs() <= 1e-5 * w.abs().max(1.0), "batch {b}, element {i}: {v} vs {w}");
        }
    }
}

#[test]
fn sizes_that_break_the_bounds_are_refused_with_one_line() {
    let dir = scratch("sym-refused");
    let graph = "testdata/mlp/graph.json";
    let refused = |dim: &str, shape: Vec<usize>, want: &str| {
        let n = shape.iter().product();
        let arg = write(&dir, "x.npy", &Tensor::f32(shape, vec![0.5; n]));
        let r = meshc(&["interp", "--dim", dim, graph, "--input", &arg]);
        assert_eq!(r.status, Some(1), "{}", r.stdout);
        assert_eq!(r.stderr.trim(), format!("error: {want}"));
    };
    refused("batch=1..64", vec![70, 64], "input x: dim 0 (batch) is 70, outside 1..64");
    refused("batch=8..64:multiple_of=8", vec![12, 64], "input x: dim 0 (batch) is 12, not a multiple of 8");
    refused("batch=1..64", vec![3, 65], "input x: dim 1 is 65, the graph's is 64");
    // Two inputs sharing a symbol must agree on it.
    let tg = "testdata/transformer/graph.json";
    let ids = dir.join("ids.npy");
    Tensor { shape: vec![3, 8], data: meshc_ir::Data::I32(vec![1; 24]) }.write_npy(&ids).unwrap();
    let mask = dir.join("mask.npy");
    Tensor::f32(vec![2, 1, 1, 8], vec![0.0; 16]).write_npy(&mask).unwrap();
    let ids_arg = format!("ids={}", ids.display());
    let mask_arg = format!("mask={}", mask.display());
    let r = meshc(&["interp", "--dim", "batch=1..8", tg, "--input", &ids_arg, "--input", &mask_arg]);
    assert_eq!(r.stderr.trim(), "error: input mask: dim 0 (batch) is 2, but input ids has batch = 3");
    // `explain` needs values for now, and says how to give them (tests/all/dynamic.rs
    // has the compiled path).
    let r = meshc(&["explain", "--dim", "batch=1..64", graph, "--layout", "testdata/mlp/layouts/dp-2.json"]);
    assert_eq!(r.status, Some(1));
    assert!(
        r.stderr
            .contains("the compiled path needs a value for now (give --dim batch=N; the graph is written at batch=16)"),
        "{}",
        r.stderr
    );
    let r = meshc(&["check", "--dim", "rows=1..4", graph]);
    assert!(
        r.stderr.contains("--dim rows: no input has a dim named 'rows' (named input dims: batch, embed)"),
        "{}",
        r.stderr
    );
}

/// A gather of constant indices from a dim that a pad shortens by one has no valid instance
/// at batch 1 (its axis is empty then): the symbolic shapes state `batch >= 2`, which a
/// call at batch 1 fails in one line (a fuzzer finding: the bounds allowed it).
#[test]
fn a_gather_from_an_axis_that_may_be_empty_checks_it_is_not() {
    let dir = scratch("sym-gather-empty");
    let graph = dir.join("g.txt");
    let src = "graph g {
  input x: f32[4] dims(batch)
  param i: i64[2] = value [0, 1]
  p = pad(x) {pads = [-1, 0]}
  y = gather(p, i) {axis = 0}
  output y
}";
    std::fs::write(&graph, src).unwrap();
    let graph = graph.display().to_string();
    let r = meshc(&["check", "--dim", "batch=1..4", &graph]);
    assert!(r.stdout.contains("run-time check: batch >= 2 (node 'y')"), "{}", r.stdout);
    let interp = |b: usize| {
        let arg = write(&dir, &format!("x{b}.npy"), &Tensor::f32(vec![b], values(b, 3)));
        meshc(&["interp", "--dim", "batch=1..4", &graph, "--input", &arg])
    };
    let r = interp(1);
    assert_eq!(r.status, Some(1), "{}", r.stdout);
    assert_eq!(r.stderr.trim(), "error: input sizes batch = 1 fail the check batch >= 2 (node 'y')");
    let r = interp(3);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
}

#[test]
fn check_prints_symbolic_shapes_and_run_time_checks() {
    let r = meshc(&["check", "--dim", "batch=1..64", "testdata/mlp/graph.json"]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    for line in ["input  x: f32[batch, 64]", "symbol batch: 1..64 (the graph's size: 16)", "shape  h f32[batch, 256]"] {
        assert!(r.stdout.contains(line), "{line}\n{}", r.stdout);
    }
    assert!(r.stdout.contains("run-time checks: none (the bounds prove every shape)"), "{}", r.stdout);
    // The transformer's position table is sized to seq: seq is pinned, and check says so.
    let r =
        meshc(&["check", "--json", "--dim", "batch=1..64", "--dim", "seq=1..512", "testdata/transformer/graph.json"]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(j["runtime_checks"][0]["check"], "seq == 8", "{}", r.stdout);
    assert_eq!(j["inputs"][1]["symbolic"], serde_json::json!(["batch", "1", "1", "seq"]));
    assert_eq!(j["symbols"][1]["example"], 8);
}

#[test]
fn an_onnx_encoder_is_symbolic_in_batch_and_seq() {
    let model = "testdata/onnx/encoder/model.onnx";
    let dims = ["--dim", "batch=1..32", "--dim", "seq=1..256"];
    let r = meshc(&[&["check", model][..], &dims].concat());
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("output last_hidden_state: f32[batch, seq, 32]"), "{}", r.stdout);
    assert!(r.stdout.contains("run-time checks: none"), "{}", r.stdout);
    let dir = scratch("sym-onnx");
    for (b, s) in [(1usize, 2usize), (2, 9), (4, 17)] {
        let h = dir.join(format!("h{b}-{s}.npy"));
        Tensor::f32(vec![b, s, 32], values(b * s * 32, (b * 100 + s) as u64)).write_npy(&h).unwrap();
        let m = dir.join(format!("m{b}-{s}.npy"));
        let mask: Vec<i64> = (0..b * s).map(|k| i64::from(k % s < s - k / s % 2)).collect();
        Tensor { shape: vec![b, s], data: meshc_ir::Data::I64(mask) }.write_npy(&m).unwrap();
        let io = [format!("hidden_states={}", h.display()), format!("attention_mask={}", m.display())];
        let mut outs = Vec::new();
        let fixed = ["--dim".to_string(), format!("batch={b}"), "--dim".to_string(), format!("seq={s}")];
        let ranged = dims.map(String::from);
        for d in [ranged, fixed] {
            let out = dir.join(format!("y{b}-{s}-{}.npy", outs.len()));
            let o = format!("last_hidden_state={}", out.display());
            let mut args: Vec<&str> = vec!["interp", model, "--input", &io[0], "--input", &io[1], "--output", &o];
            args.extend(d.iter().map(String::as_str));
            let r = meshc(&args);
            assert_eq!(r.status, Some(0), "{args:?}: {}", r.stderr);
            outs.push(Tensor::read_npy(&out).unwrap());
        }
        assert_eq!(outs[0].shape, vec![b, s, 32]);
        assert_eq!(outs[0], outs[1], "at batch {b}, seq {s}: the symbolic import and the import at those sizes differ");
    }
}

/// testdata/mlp written as text in `dir` (its weight file named by absolute path) with the
/// declaration `dim` before its input, and as JSON beside it.
fn declared_mlp(dir: &Path, dim: &str) -> [String; 2] {
    let r = meshc(&["fmt", "testdata/mlp/graph.json", "--to", "text"]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let weights = std::fs::canonicalize("testdata/mlp/weights").unwrap();
    let text = r
        .stdout
        .replace("graph mlp {\n", &format!("graph mlp {{\n  {dim}\n"))
        .replace("file(\"weights/", &format!("file(\"{}/", weights.display()));
    let txt = dir.join("declared.txt");
    std::fs::write(&txt, text).unwrap();
    let json = dir.join("declared.json");
    let r = meshc(&["fmt", &txt.display().to_string(), "--to", "json", "-o", &json.display().to_string()]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    [txt.display().to_string(), json.display().to_string()]
}

#[test]
fn bounds_a_graph_declares_make_it_symbolic_without_dim() {
    let dir = scratch("sym-declared");
    let x5 = write(&dir, "x5.npy", &Tensor::f32(vec![5, 64], values(5 * 64, 3)));
    let out = |name: &str| dir.join(name).display().to_string();
    let r = meshc(&[
        "interp",
        "testdata/mlp/graph.json",
        "--dim",
        "batch=5",
        "--input",
        &x5,
        "--output",
        &format!("y={}", out("want.npy")),
    ]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let want = Tensor::read_npy(&dir.join("want.npy")).unwrap();
    for graph in declared_mlp(&dir, "dim batch = 1..64") {
        let r = meshc(&["check", &graph]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        assert!(r.stdout.contains("symbol batch: 1..64 (the graph's size: 16)"), "{graph}: {}", r.stdout);
        assert!(r.stdout.contains("input  x: f32[batch, 64]"), "{graph}: {}", r.stdout);
        let r = meshc(&["interp", &graph, "--input", &x5, "--output", &format!("y={}", out("got.npy"))]);
        assert_eq!(r.status, Some(0), "{graph}: {}", r.stderr);
        assert_eq!(Tensor::read_npy(&dir.join("got.npy")).unwrap(), want, "{graph}");
        // A `--dim` replaces the declared bounds: a narrower range refuses batch 5...
        let r = meshc(&["interp", &graph, "--dim", "batch=1..4", "--input", &x5]);
        assert_eq!(r.stderr.trim(), "error: input x: dim 0 (batch) is 5, outside 1..4", "{graph}");
        // ...and a value writes the graph at it, as for a graph that declares nothing.
        let r = meshc(&["check", &graph, "--dim", "batch=5"]);
        assert!(r.stdout.contains("input  x: f32[5,64]") && !r.stdout.contains("symbol"), "{graph}: {}", r.stdout);
        // Compiled as declared, one artifact for every batch size, as with `--dim
        // batch=1..64`; given a value, the artifact is the undeclared graph's at that
        // size, byte for byte.
        let r = meshc(&["compile", &graph, "-o", &out("a.mshc")]);
        assert_eq!(r.status, Some(0), "{graph}: {}", r.stderr);
        let r = meshc(&["compile", "testdata/mlp/graph.json", "--dim", "batch=1..64", "-o", &out("r.mshc")]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        assert_eq!(std::fs::read(out("a.mshc")).unwrap(), std::fs::read(out("r.mshc")).unwrap(), "{graph}");
        for (args, name) in [
            (vec![&graph[..], "--dim", "batch=7"], "a7.mshc"),
            (vec!["testdata/mlp/graph.json", "--dim", "batch=7"], "b7.mshc"),
        ] {
            let r = meshc(&[&["compile"][..], &args, &["-o", &out(name)]].concat());
            assert_eq!(r.status, Some(0), "{args:?}: {}", r.stderr);
        }
        assert_eq!(std::fs::read(out("a7.mshc")).unwrap(), std::fs::read(out("b7.mshc")).unwrap(), "{graph}");
    }
    // `fmt` keeps the declaration in both formats.
    let [txt, json] = declared_mlp(&dir, "dim batch = 8..64:multiple_of=8");
    assert!(std::fs::read_to_string(&json)
        .unwrap()
        .contains(r#""symbols": {"batch":{"lo":8,"hi":64,"multiple_of":8}},"#));
    let r = meshc(&["fmt", &json, "--to", "text"]);
    assert_eq!(r.stdout, std::fs::read_to_string(&txt).unwrap());
    let r = meshc(&["interp", &txt, "--input", &x5]);
    assert_eq!(r.stderr.trim(), "error: input x: dim 0 (batch) is 5, outside 8..64");
}

#[test]
fn import_with_ranges_writes_them_into_the_graph() {
    let model = "testdata/onnx/encoder/model.onnx";
    let dir = scratch("sym-import");
    let (b, s) = (2usize, 9usize);
    let h = dir.join("h.npy");
    Tensor::f32(vec![b, s, 32], values(b * s * 32, 11)).write_npy(&h).unwrap();
    let m = dir.join("m.npy");
    let mask: Vec<i64> = (0..b * s).map(|k| i64::from(k % s < s - k / s)).collect();
    Tensor { shape: vec![b, s], data: meshc_ir::Data::I64(mask) }.write_npy(&m).unwrap();
    let io = [format!("hidden_states={}", h.display()), format!("attention_mask={}", m.display())];
    let interp = |graph: &str, dims: &[&str], name: &str| {
        let out = dir.join(name);
        let o = format!("last_hidden_state={}", out.display());
        let r = meshc(&[&["interp", graph, "--input", &io[0], "--input", &io[1], "--output", &o][..], dims].concat());
        assert_eq!(r.status, Some(0), "{graph} {dims:?}: {}", r.stderr);
        Tensor::read_npy(&out).unwrap()
    };
    let want = interp(model, &["--dim", "batch=2", "--dim", "seq=9"], "want.npy");
    for ext in ["txt", "json"] {
        let graph = dir.join(format!("enc.{ext}")).display().to_string();
        let r = meshc(&["import", model, "--dim", "batch=1..32", "--dim", "seq=1..256", "-o", &graph]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        assert!(r.stderr.contains("the graph declares batch=1..32, seq=1..256"), "{}", r.stderr);
        let r = meshc(&["check", &graph]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        for line in [
            "symbol batch: 1..32 (the graph's size: 3)",
            "symbol seq: 1..256 (the graph's size: 5)",
            "output last_hidden_state: f32[batch, seq, 32]",
        ] {
            assert!(r.stdout.contains(line), "{ext}: {line}\n{}", r.stdout);
        }
        assert_eq!(interp(&graph, &[], &format!("got-{ext}.npy")), want, "{ext}");
    }
    // A value is a size the graph is written at, not a declaration.
    let graph = dir.join("enc2.txt").display().to_string();
    let r = meshc(&["import", model, "--dim", "batch=2", "--dim", "seq=1..256", "-o", &graph]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let text = std::fs::read_to_string(&graph).unwrap();
    assert!(text.contains("\n  dim seq = 1..256\n") && !text.contains("dim batch"), "{text}");
    assert_eq!(interp(&graph, &[], "got-2.npy"), want);
}

/// testdata/onnx/mlp with its output divided by the batch size, read from the input's
/// Shape: a value computed from a size, which the importer folds at the example size.
fn mlp_over_batch(dir: &Path) -> String {
    use meshc_onnx::proto::{AttributeProto, Message, ModelProto, NodeProto, TensorProto};
    let mut m = ModelProto::decode(&std::fs::read("testdata/onnx/mlp/model.onnx").unwrap()[..]).unwrap();
    let g = m.graph.as_mut().unwrap();
    let last = g.node.iter_mut().find(|n| n.output == ["y"]).unwrap();
    last.output = vec!["y_raw".into()];
    g.initializer.push(TensorProto {
        name: Some("zero".into()),
        data_type: Some(7),
        int64_data: vec![0],
        ..Default::default()
    });
    let node = |op: &str, input: &[&str], out: &str| NodeProto {
        op_type: Some(op.into()),
        input: input.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        ..Default::default()
    };
    let mut cast = node("Cast", &["b"], "bf");
    cast.attribute.push(AttributeProto { name: Some("to".into()), r#type: Some(2), i: Some(1), ..Default::default() });
    g.node.extend([
        node("Shape", &["x"], "s"),
        node("Gather", &["s", "zero"], "b"),
        cast,
        node("Div", &["y_raw", "bf"], "y"),
    ]);
    let p = dir.join("mlp_over_batch.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p.display().to_string()
}

#[test]
fn a_value_computed_from_a_symbol_s_size_refuses_the_symbol() {
    let dir = scratch("sym-value");
    let model = mlp_over_batch(&dir);
    let x = write(&dir, "x5.npy", &Tensor::f32(vec![5, 16], values(5 * 16, 5)));
    let r = meshc(&["interp", &model, "--dim", "batch=5", "--input", &x]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    // Folded at the example (3), the divisor would be 3 at every batch: refused instead,
    // naming the param that differs and the symbol.
    let out = dir.join("g.txt").display().to_string();
    let dims = ["--dim", "batch=1..8"];
    for args in [vec!["check", &model], vec!["interp", &model, "--input", &x], vec!["import", &model, "-o", &out]] {
        let r = meshc(&[&args[..], &dims].concat());
        assert_eq!(r.status, Some(1), "{args:?}: {}", r.stdout);
        assert!(
            r.stderr.contains("imported at batch=4, param 'y.1' holds f32[] (first 4) where the import at the example holds f32[] (first 3): the model computes it from batch in a way meshc does not read symbolically; give batch a value (--dim batch=N;"),
            "{args:?}: {}",
            r.stderr
        );
    }
    assert!(!dir.join("g.txt").exists());
}
