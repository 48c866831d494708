//! Artifacts compiled once with symbolic dims (docs/dynamic-shapes.md): each runs at several
//! sizes within its bounds and matches the interpreter on the graph written at each; sizes
//! outside the bounds, and graphs the compiled path cannot scale yet, are refused in one
//! line; the embedding API returns outputs of each call's shape.

use std::path::Path;

use meshc_ir::{Data, Tensor};
use meshc_runtime::api::{Model, Session, TensorView, TensorViewMut};

use crate::common::{assert_close, meshc, scratch, Scratch};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// The inputs of each test graph at batch `b` and sequence length `s` (the encoder's; the
/// transformer's is 8), as `--input` arguments (written in `dir`).
fn inputs(dir: &Path, graph: &str, (b, s): (usize, usize)) -> Vec<String> {
    let t: Vec<(&str, Tensor)> = match graph {
        "mlp" => vec![("x", Tensor::f32(vec![b, 64], values(b * 64, b as u64)))],
        "transformer" => {
            let ids = (0..b * 8).map(|i| ((i * 7 + b) % 50) as i32).collect();
            let mut mask = vec![0.0f32; b * 8];
            mask.iter_mut().enumerate().filter(|(i, _)| i % 8 >= 6).for_each(|(_, m)| *m = -1e9);
            vec![
                ("ids", Tensor { shape: vec![b, 8], data: Data::I32(ids) }),
                ("mask", Tensor::f32(vec![b, 1, 1, 8], mask)),
            ]
        }
        _ => {
            // The last two positions of longer sequences are padding.
            let mask = (0..b * s).map(|i| i64::from(i % s < s.saturating_sub(2).max(1))).collect();
            vec![
                ("hidden_states", Tensor::f32(vec![b, s, 32], values(b * s * 32, (b * 100 + s) as u64))),
                ("attention_mask", Tensor { shape: vec![b, s], data: Data::I64(mask) }),
            ]
        }
    };
    t.iter()
        .map(|(name, t)| {
            let f = dir.join(format!("{graph}-{name}-{b}x{s}.npy"));
            t.write_npy(&f).unwrap();
            format!("{name}={}", f.display())
        })
        .collect()
}

fn with_inputs<'a>(args: &[&'a str], inputs: &'a [String]) -> Vec<&'a str> {
    let mut out = args.to_vec();
    for i in inputs {
        out.extend(["--input", i.as_str()]);
    }
    out
}

/// A graph, its file, its `--dim` ranges (batch, then seq if it has one) and the sizes it
/// runs at.
type Case = (&'static str, &'static str, &'static [&'static str], &'static [(usize, usize)]);

/// One artifact per graph, compiled once for a range of sizes, runs at the smallest, a
/// middle and the largest, each output equal to the interpreter's at that size: batch in
/// the MLP and the transformer (whose position table fixes seq), batch and seq in the
/// ONNX encoder (attention over a run-time sequence length).
#[test]
fn one_artifact_runs_every_size_in_its_bounds() {
    let dir = scratch("dynamic-sizes");
    let cases: [Case; 4] = [
        ("mlp", "testdata/mlp/graph.json", &["batch=1..64"], &[(1, 0), (7, 0), (64, 0)]),
        ("transformer", "testdata/transformer/graph.json", &["batch=1..8"], &[(1, 8), (3, 8), (8, 8)]),
        ("encoder", "testdata/onnx/encoder/model.onnx", &["batch=1..8", "seq=5"], &[(1, 5), (4, 5), (8, 5)]),
        ("encoder", "testdata/onnx/encoder/model.onnx", &["batch=1..8", "seq=1..32"], &[(1, 1), (2, 13), (8, 32)]),
    ];
    for (name, graph, ranges, sizes) in cases {
        let art = dir.join(format!("{name}.mshc")).display().to_string();
        let dims: Vec<&str> = ranges.iter().flat_map(|r| ["--dim", r]).collect();
        let r = meshc(&[&["compile", graph][..], &dims, &["-o", &art]].concat());
        assert_eq!(r.status, Some(0), "{name}: {}", r.stderr);
        for &(b, s) in sizes {
            let ins = inputs(&dir, name, (b, s));
            let (got, want) = (dir.join(format!("{name}-run-{b}x{s}")), dir.join(format!("{name}-interp-{b}x{s}")));
            let out = |d: &Path| d.display().to_string();
            let r = meshc(&with_inputs(&["run", &art, "--output-dir", &out(&got)], &ins));
            assert_eq!(r.status, Some(0), "{name} at batch {b}: {}", r.stderr);
            let at = [format!("batch={b}"), format!("seq={s}")];
            let at: Vec<&str> = at[..ranges.len()].iter().flat_map(|a| ["--dim", a.as_str()]).collect();
            let r = meshc(&with_inputs(&[&["interp", graph][..], &at, &["--output-dir", &out(&want)]].concat(), &ins));
            assert_eq!(r.status, Some(0), "{name} interp at batch {b}: {}", r.stderr);
            let mut compared = 0;
            for f in std::fs::read_dir(&want).unwrap() {
                let f = f.unwrap().path();
                let w = Tensor::read_npy(&f).unwrap();
                let g = Tensor::read_npy(&got.join(f.file_name().unwrap())).unwrap();
                assert_eq!(g.shape[0], b, "{name}: {}", f.display());
                assert_close(&format!("{name} at batch {b}"), &g, &w).unwrap();
                compared += 1;
            }
            assert!(compared > 0, "{name}: no outputs");
        }
    }
}

/// Sizes the bounds do not allow, and graphs the compiled path cannot scale yet: one line
/// each, naming the input and symbol, or the node.
#[test]
fn sizes_and_graphs_it_cannot_run_are_refused_in_one_line() {
    let dir = scratch("dynamic-refused");
    let art = dir.join("mlp.mshc").display().to_string();
    let graph = "testdata/mlp/graph.json";
    let r = meshc(&["compile", graph, "--dim", "batch=8..64:multiple_of=8", "-o", &art]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    for (b, why) in [(65, "dim 0 (batch) is 65, outside 8..64"), (12, "dim 0 (batch) is 12, not a multiple of 8")] {
        let x = dir.join(format!("x{b}.npy"));
        Tensor::f32(vec![b, 64], values(b * 64, 1)).write_npy(&x).unwrap();
        let r = meshc(&["run", &art, "--input", &format!("x={}", x.display())]);
        assert_eq!(r.status, Some(1));
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains(&format!("input x: {why}")), "{}", r.stderr);
    }
    let x = dir.join("x3d.npy");
    Tensor::f32(vec![8, 64, 1], values(512, 1)).write_npy(&x).unwrap();
    let r = meshc(&["run", &art, "--input", &format!("x={}", x.display())]);
    assert!(r.stderr.contains("holds f32[8,64,1], the graph expects f32[64,64]"), "{}", r.stderr);
    // A generated kernel that cannot take a run-time row count (a scatter along the
    // symbolic rows) is refused, naming its node; a mesh takes no symbolic dims.
    let out = dir.join("no.mshc").display().to_string();
    let r = meshc(&["compile", "testdata/cnn/graph.json", "--dim", "batch=1..8", "-o", &out]);
    assert_eq!(r.status, Some(1));
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("node 'sc'") && r.stderr.contains("is not compiled yet"), "{}", r.stderr);
    // A symbol a constant pins (the Trilu mask the importer builds at the example's batch)
    // says which node pins it and what to give instead.
    let r = meshc(&["compile", "testdata/onnx/opset_v2/model.onnx", "--dim", "batch=1..8", "-o", &out]);
    assert_eq!(r.status, Some(1));
    assert_eq!(
        r.stderr.trim(),
        "error: testdata/onnx/opset_v2/model.onnx: batch is pinned to 3 by node 'upper' (it needs batch == 3: a constant sized to it), so it cannot range over 1..8; give it that size (--dim batch=3) or leave it out of the ranges (docs/dynamic-shapes.md)"
    );
    // ConstantOfShape and Expand of Shape(x) follow the batch now; what is left of
    // testdata/onnx/shapes pinning it is a mean that divides by its Size, a value folded at
    // the example, which the import's check against itself refuses.
    let r = meshc(&["compile", "testdata/onnx/shapes/model.onnx", "--dim", "batch=1..8", "-o", &out]);
    assert_eq!(r.status, Some(1));
    assert_eq!(
        r.stderr.trim(),
        "error: testdata/onnx/shapes/model.onnx: imported at batch=4, param 'total.1' holds f32[] (first 24) where the import at the example holds f32[] (first 18): the model computes it from batch in a way meshc does not read symbolically; give batch a value (--dim batch=N; docs/dynamic-shapes.md)"
    );
    let r =
        meshc(&["compile", graph, "--dim", "batch=1..64", "--layout", "testdata/mlp/layouts/dp-2.json", "-o", &out]);
    assert_eq!(r.status, Some(1));
    assert!(r.stderr.contains("symbolic dims compile for one device for now"), "{}", r.stderr);
    assert!(!Path::new(&out).exists());
}

/// Through the embedding API: `run` returns each call's shape, `run_into` writes into
/// buffers of that shape and refuses others; a repeated shape runs as before.
#[test]
fn the_embedding_api_takes_each_call_s_sizes() {
    let dir = scratch("dynamic-embed");
    let art = dir.join("mlp.mshc");
    let r = meshc(&["compile", "testdata/mlp/graph.json", "--dim", "batch=1..64", "-o", &art.display().to_string()]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let model = Model::open(&art).unwrap();
    let session = Session::new(&model).unwrap();
    let mut first: Vec<Vec<f32>> = Vec::new();
    for (call, b) in [3usize, 64, 1, 3].into_iter().enumerate() {
        let x = values(b * 64, b as u64);
        let shape = [b, 64];
        let out = session.run(&[("x", TensorView::new(&x, &shape).unwrap())]).unwrap();
        assert_eq!(out["y"].shape, vec![b, 64]);
        let mut y = vec![0.0f32; b * 64];
        let mut outs = [("y", TensorViewMut::new(&mut y, &shape).unwrap())];
        session.run_into(&[("x", TensorView::new(&x, &shape).unwrap())], &mut outs).unwrap();
        assert_eq!(out["y"].data, Data::F32(y.clone()), "batch {b}");
        // The same shape again, after others, gives the same rows.
        first.push(y[..64].to_vec());
        if call == 3 {
            assert_eq!(first[0], first[3]);
        }
        let mut wrong = vec![0.0f32; (b + 1) * 64];
        let wshape = [b + 1, 64];
        let mut outs = [("y", TensorViewMut::new(&mut wrong, &wshape).unwrap())];
        let e = session.run_into(&[("x", TensorView::new(&x, &shape).unwrap())], &mut outs).unwrap_err();
        assert!(e.to_string().contains("output 'y'"), "{e}");
    }
}

/// A session serving more sizes than the runner keeps plans for: the plans of the sizes
/// used last are kept and the others dropped, the weights copied out of their panels for
/// products of many rows are copied once per step whatever the sizes, and a size planned
/// again after being dropped gives the same bits.
#[test]
fn many_sizes_keep_bounded_plans_and_one_copy_of_each_weight() {
    let dir = scratch("dynamic-many-sizes");
    let art = dir.join("mlp.mshc");
    let r = meshc(&["compile", "testdata/mlp/graph.json", "--dim", "batch=1..640", "-o", &art.display().to_string()]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let loaded = Model::open(&art).unwrap().load().unwrap();
    let run = |b: usize| {
        let x = Tensor::f32(vec![b, 64], values(b * 64, 7)[..b * 64].to_vec());
        loaded.run(&[("x".to_string(), x)].into_iter().collect()).unwrap().remove("y").unwrap()
    };
    let first = run(520);
    // From 512 rows a product copies its weight out of its panels (w1 64×256, w2 256×64).
    let copies = (64 * 256 + 256 * 64) * 4;
    for b in 512..600 {
        run(b);
        let (sizes, bytes) = loaded.kept_for_sizes();
        assert!(sizes <= 64, "plans kept for {sizes} sizes");
        assert_eq!(bytes, copies, "after batch {b}");
    }
    assert_eq!(run(640).shape, vec![640, 64]);
    assert_eq!(loaded.kept_for_sizes().1, copies);
    assert_eq!(run(520), first, "batch 520 planned again");
}

/// Writes `x` of the random graph at batch `b` (width `d`) and returns its `--input`.
fn random_input(dir: &Path, (b, d): (usize, usize), seed: u64) -> String {
    let f = dir.join(format!("x-{b}-{seed}.npy"));
    Tensor::f32(vec![b, d], values(b * d, seed)).write_npy(&f).unwrap();
    format!("x={}", f.display())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// Random graphs over a symbolic batch, compiled once for `1..=12`: at two other
    /// batches each output is the interpreter's at that batch; or the compile is refused
    /// in one line naming a node, never with a crash or a meshc bug.
    #[test]
    fn random_graphs_compiled_once_run_as_the_interpreter_at_other_batches(
        d in 0usize..2,
        ops in proptest::collection::vec((0u8..11, proptest::prelude::any::<u8>(), proptest::prelude::any::<u8>()), 1..10),
        at in proptest::collection::vec(1usize..=12, 2),
    ) {
        let d = [4, 8][d];
        let dir = scratch("dynamic-random");
        let g = crate::symbolic::graph_at(12, d, &ops);
        let file = dir.join("g.txt");
        std::fs::write(&file, meshc_ir::text::print(&g)).unwrap();
        let file = file.display().to_string();
        let art = dir.join("g.mshc").display().to_string();
        let r = meshc(&["compile", &file, "--dim", "batch=1..12", "-o", &art]);
        if r.status != Some(0) {
            let one_line = r.stderr.trim().lines().count() == 1 && r.stderr.contains("node '");
            proptest::prop_assert!(one_line && !r.stderr.contains("meshc bug"), "{}\n{}", r.stderr, meshc_ir::text::print(&g));
            return Err(proptest::test_runner::TestCaseError::reject("not compiled over symbolic dims yet"));
        }
        for (k, &b) in at.iter().enumerate() {
            let x = random_input(&dir, (b, d), k as u64);
            let (got, want) = (dir.join(format!("run-{k}")), dir.join(format!("interp-{k}")));
            let r = meshc(&["run", &art, "--input", &x, "--output-dir", &got.display().to_string()]);
            if r.stderr.contains("fail the check") {
                // A param sized to the batch pins it: the run says so, as `check` does.
                continue;
            }
            proptest::prop_assert_eq!(r.status, Some(0), "batch {}: {}\n{}", b, r.stderr, meshc_ir::text::print(&g));
            let at = format!("batch={b}");
            let r = meshc(&["interp", &file, "--dim", &at, "--input", &x, "--output-dir", &want.display().to_string()]);
            proptest::prop_assert_eq!(r.status, Some(0), "{}", r.stderr);
            for f in std::fs::read_dir(&want).unwrap() {
                let f = f.unwrap().path();
                let w = Tensor::read_npy(&f).unwrap();
                let o = Tensor::read_npy(&got.join(f.file_name().unwrap())).unwrap();
                assert_close(&format!("batch {b}"), &o, &w)
                    .map_err(|e| proptest::test_runner::TestCaseError::fail(format!("{e}\n{}", meshc_ir::text::print(&g))))?;
            }
        }
    }
}

/// `t` with axis `axis` made `n` long, its entries repeated in order (ids and masks stay
/// valid).
fn resized(t: &Tensor, axis: usize, n: usize) -> Tensor {
    use meshc_ir::{Attr, Node, Op, TensorType};
    let idx = Tensor { shape: vec![n], data: Data::I64((0..n).map(|i| (i % t.shape[axis]) as i64).collect()) };
    let node = Node::new("g", Op::Gather, &["t", "i"]).with_attr("axis", Attr::Int(axis as i64));
    let mut shape = t.shape.clone();
    shape[axis] = n;
    meshc_ir::interp::eval_node(&node, &[t, &idx], &TensorType::new(t.dtype(), shape)).unwrap()
}

/// `model` (a graph or an ONNX file named `name`, its inputs in `inputs`) compiled once with
/// each of `dims` over `1..=2N` (N its size there) and run at N, 1 and 2N against the
/// interpreter at each: the sizes it ran at, or the one-line refusal of the compile. A
/// run refused because a param pins the size (the run-time check, in one line) is not
/// counted.
fn once_over_dims(
    dir: &Path,
    name: &str,
    model: &str,
    inputs: &Path,
    dims: &[(String, usize)],
) -> Result<usize, String> {
    let art = dir.join(format!("{name}.mshc")).display().to_string();
    let ranges: Vec<String> = dims.iter().flat_map(|(n, v)| ["--dim".into(), format!("{n}=1..{}", 2 * v)]).collect();
    let ranges: Vec<&str> = ranges.iter().map(String::as_str).collect();
    let r = meshc(&[&["compile", model][..], &ranges, &["-o", &art]].concat());
    if r.status != Some(0) {
        assert_eq!(r.stderr.trim().lines().count(), 1, "{name}: {}", r.stderr);
        assert!(!r.stderr.contains("meshc bug") && !r.stderr.contains("panicked"), "{name}: {}", r.stderr);
        return Err(r.stderr.trim().to_string());
    }
    // Which input axes carry which dim, from the artifact's metadata.
    let meta = Model::open(Path::new(&art)).unwrap();
    let mut ran = 0;
    for scale in [(1, 1), (0, 1), (2, 1)] {
        let at = |v: usize| if scale.0 == 0 { 1 } else { v * scale.0 / scale.1 };
        let mut ins = Vec::new();
        for info in meta.inputs() {
            let mut t = Tensor::read_npy(&inputs.join(format!("{}.npy", info.name))).unwrap();
            for (axis, d) in info.dims.iter().enumerate() {
                if let Some((_, v)) = d.as_ref().and_then(|d| dims.iter().find(|(n, _)| n == d)) {
                    t = resized(&t, axis, at(*v));
                }
            }
            let f = dir.join(format!("{name}-{}-{}.npy", info.name, at(10)));
            t.write_npy(&f).unwrap();
            ins.push(format!("{}={}", info.name, f.display()));
        }
        let (got, want) = (dir.join(format!("{name}-run-{}", at(10))), dir.join(format!("{name}-interp-{}", at(10))));
        let r = meshc(&with_inputs(&["run", &art, "--output-dir", &got.display().to_string()], &ins));
        if r.stderr.contains("fail the check") {
            assert_eq!(r.stderr.trim().lines().count(), 1, "{name}: {}", r.stderr);
            continue;
        }
        assert_eq!(r.status, Some(0), "{name} at {}: {}", at(10), r.stderr);
        let bound: Vec<String> = dims.iter().flat_map(|(n, v)| ["--dim".into(), format!("{n}={}", at(*v))]).collect();
        let bound: Vec<&str> = bound.iter().map(String::as_str).collect();
        let r = meshc(&with_inputs(
            &[&["interp", model][..], &bound, &["--output-dir", &want.display().to_string()]].concat(),
            &ins,
        ));
        assert_eq!(r.status, Some(0), "{name} interp: {}", r.stderr);
        for f in std::fs::read_dir(&want).unwrap() {
            let f = f.unwrap().path();
            let w = Tensor::read_npy(&f).unwrap();
            let g = Tensor::read_npy(&got.join(f.file_name().unwrap())).unwrap();
            assert_close(&format!("{name} at {:?}", bound), &g, &w).unwrap();
        }
        ran += 1;
    }
    Ok(ran)
}

/// The report line of `once_over_dims`'s outcome; counts a model that ran at three sizes.
fn report_line(name: &str, outcome: Result<usize, String>, ran: &mut usize) -> String {
    match outcome {
        Ok(n) => {
            *ran += usize::from(n == 3);
            format!("{name}: ran at {n} of 3 sizes")
        }
        Err(e) => format!("{name}: refused: {e}"),
    }
}

/// Every ONNX test model whose sizes `--dim` gives (its dims.txt), compiled once with each
/// of those dims over `1..=2N` (N its size there): at N, 1 and 2N the artifact's outputs
/// are the interpreter's; or the compile is refused in one line naming a node, or a run
/// is refused because a param pins the size (the run-time check, in one line).
#[test]
fn every_onnx_test_model_compiles_once_over_its_dims_or_says_why() {
    let dir = scratch("dynamic-onnx");
    let mut models: Vec<_> = std::fs::read_dir("testdata/onnx").unwrap().map(|e| e.unwrap().path()).collect();
    models.sort();
    let (mut ran, mut report) = (0, Vec::new());
    for m in models.iter().filter(|m| m.join("dims.txt").is_file() && !m.join("input_shapes.txt").is_file()) {
        let name = m.file_name().unwrap().to_string_lossy().to_string();
        let dims: Vec<(String, usize)> = std::fs::read_to_string(m.join("dims.txt"))
            .unwrap()
            .lines()
            .map(|l| {
                let (n, v) = l.split_once('=').unwrap();
                (n.to_string(), v.parse().unwrap())
            })
            .collect();
        let model = m.join("model.onnx").display().to_string();
        let outcome = once_over_dims(&dir, &name, &model, &m.join("inputs"), &dims);
        report.push(report_line(&name, outcome, &mut ran));
    }
    eprintln!("{}", report.join("\n"));
    assert!(ran >= 18, "only {ran} models ran at three sizes:\n{}", report.join("\n"));
}

/// testdata/onnx/NAME/model.onnx compiled once over `batch=1..B, seq=1..S` in a scratch
/// directory: the directory, the model's path and the artifact's.
fn compiled_once(name: &str, (b, s): (usize, usize)) -> (Scratch, String, String) {
    let dir = scratch(&format!("dynamic-{name}"));
    let model = format!("testdata/onnx/{name}/model.onnx");
    let art = dir.join(format!("{name}.mshc")).display().to_string();
    let (batch, seq) = (format!("batch=1..{b}"), format!("seq=1..{s}"));
    let r = meshc(&["compile", &model, "--dim", &batch, "--dim", &seq, "-o", &art]);
    assert_eq!(r.status, Some(0), "{name}: {}", r.stderr);
    (dir, model, art)
}

/// GPT-2's block (testdata/onnx/gpt2_block) compiled once over `batch=1..4, seq=1..16`: its
/// causal mask `[seq, seq]`, an operand of a where over `[batch, heads, seq, seq]` scores,
/// repeats within their rows, each of its rows held for `seq` elements, and its softmax
/// along seq is the runner's. At each size onnxruntime's output (`tools/gen_onnx_testdata.py
/// --sizes gpt2_block ...` wrote them beside the model).
#[test]
fn gpt2_block_compiled_once_gives_onnxruntime_s_output_at_every_size() {
    let (dir, _, art) = compiled_once("gpt2_block", (4, 16));
    for size in ["1x1", "2x6", "3x5", "4x16", "1x16", "2x9"] {
        let at = Path::new("testdata/onnx/gpt2_block/sizes").join(size);
        let input = format!("hidden_states={}", at.join("inputs/hidden_states.npy").display());
        let got = dir.join(format!("run-{size}"));
        let r = meshc(&["run", &art, "--input", &input, "--output-dir", &got.display().to_string()]);
        assert_eq!(r.status, Some(0), "at {size}: {}", r.stderr);
        let want = Tensor::read_npy(&at.join("expected/output.npy")).unwrap();
        let g = Tensor::read_npy(&got.join("output.npy")).unwrap();
        assert_eq!(g.shape, want.shape, "at {size}");
        assert_close(&format!("gpt2_block at {size}"), &g, &want).unwrap();
    }
}

/// Elementwise operands that repeat over a step's rows other than every so many rows: a
/// `[seq, 1]` column of a `[batch, heads, seq, seq]` where, whose rows are single elements
/// (each of its rows held for `seq` of them), the same column beside a `[1, seq]` row in a
/// `[batch, seq, 8]` sum (held for a whole row, its inner dim broadcast), and a `[batch,
/// 1, 4, 1]` scale of `[batch, seq, 4, 8]` beside a bias, whose row takes several
/// iterations of the kernel's outer loop. One artifact over `batch=1..3, seq=1..6` runs as
/// the interpreter at every size.
#[test]
fn operands_repeating_within_rows_run_as_the_interpreter_at_every_size() {
    let dir = scratch("dynamic-repeats");
    let src = "graph g {
  input x: f32[2,4,5,5] dims(batch, _, seq, seq)
  input y: f32[2,5,8] dims(batch, seq, _)
  input z: f32[2,5,4,8] dims(batch, seq, _, _)
  input c: f32[5,1] dims(seq, _)
  input r: f32[1,5] dims(_, seq)
  input s: f32[2,1,4,1] dims(batch, _, _, _)
  param bias: f32[8] = value [0.5, -1, 2, 0.25, 0, 1, -0.5, 3]
  l = less(c, r)
  w = where(l, c, x)
  t = add(y, c)
  u = mul(z, s)
  v = add(u, bias)
  output w, t, v
}";
    let graph = dir.join("g.txt");
    std::fs::write(&graph, src).unwrap();
    let (graph, art) = (graph.display().to_string(), dir.join("g.mshc").display().to_string());
    let r = meshc(&["compile", &graph, "--dim", "batch=1..3", "--dim", "seq=1..6", "-o", &art]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    for (b, q) in [(1, 1), (3, 6), (2, 3), (1, 6), (3, 2)] {
        let shapes: [(&str, Vec<usize>); 6] = [
            ("x", vec![b, 4, q, q]),
            ("y", vec![b, q, 8]),
            ("z", vec![b, q, 4, 8]),
            ("c", vec![q, 1]),
            ("r", vec![1, q]),
            ("s", vec![b, 1, 4, 1]),
        ];
        let mut ins = Vec::new();
        for (k, (name, shape)) in shapes.iter().enumerate() {
            let f = dir.join(format!("{name}-{b}x{q}.npy"));
            Tensor::f32(shape.clone(), values(shape.iter().product(), 5 + k as u64)).write_npy(&f).unwrap();
            ins.push(format!("{name}={}", f.display()));
        }
        let (got, want) = (dir.join(format!("run-{b}x{q}")), dir.join(format!("interp-{b}x{q}")));
        let r = meshc(&with_inputs(&["run", &art, "--output-dir", &got.display().to_string()], &ins));
        assert_eq!(r.status, Some(0), "at {b}x{q}: {}", r.stderr);
        let (bd, sd) = (format!("batch={b}"), format!("seq={q}"));
        let want_dir = want.display().to_string();
        let r = meshc(&with_inputs(&["interp", &graph, "--dim", &bd, "--dim", &sd, "--output-dir", &want_dir], &ins));
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        for o in ["w", "t", "v"] {
            let read = |d: &Path| Tensor::read_npy(&d.join(format!("{o}.npy"))).unwrap();
            assert_eq!(read(&got), read(&want), "{o} at {b}x{q}");
        }
    }
}

/// Every testdata graph, compiled once with its `batch` over `1..=2N`, as the ONNX models
/// are (`once_over_dims`).
#[test]
fn every_testdata_graph_compiles_once_over_its_batch_or_says_why() {
    let dir = scratch("dynamic-graphs");
    let mut graphs: Vec<_> =
        std::fs::read_dir("testdata").unwrap().map(|e| e.unwrap().path().join("graph.json")).collect();
    graphs.retain(|g| g.is_file());
    graphs.sort();
    let (mut ran, mut report) = (0, Vec::new());
    for g in &graphs {
        let d = g.parent().unwrap();
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        let (graph, _) = meshc_ir::load::load(g).unwrap();
        let batch = graph.inputs.iter().find_map(|i| {
            let k = i.dims.as_ref()?.iter().position(|n| n.as_deref() == Some("batch"))?;
            Some(i.ty.shape[k])
        });
        let Some(n) = batch else { continue };
        let outcome = once_over_dims(&dir, &name, &g.display().to_string(), &d.join("inputs"), &[("batch".into(), n)]);
        report.push(report_line(&name, outcome, &mut ran));
    }
    eprintln!("{}", report.join("\n"));
    assert!(report.len() >= 7, "{report:?}");
    assert!(ran >= 4, "only {ran} graphs ran at three sizes:\n{}", report.join("\n"));
}

/// Found by the differential fuzzer: constant padding of a tensor with no elements has
/// no first slice to build its fill block from over a symbolic batch. The block was a
/// constant sized at the bounds, and every smaller batch was refused (`batch == 2` at the
/// concat of the empty tensor and it); it is now the tensor's sum along the padded dim,
/// so it follows the batch: every batch in the bounds runs as the interpreter does, a dim
/// emptied by a crop (`e`) or by a dynamic_slice of size 0 (the fuzzer's case), padded to
/// a length or to nothing.
#[test]
fn padding_an_empty_tensor_over_a_symbolic_batch_runs_at_every_batch() {
    let dir = scratch("dynamic-empty-pad");
    for (name, src, (input, rest), outs) in [
        (
            "crop",
            "graph g {
  input x: f32[3,2,1,1] dims(batch, _, _, _)
  e = pad(x) {pads = [0, -1, -1, 0, 0, 0, 0, 0], mode = \"constant\", value = 0.5}
  y = pad(e) {pads = [0, 0, 1, 1, 0, 1, 0, 0], mode = \"constant\", value = 0.25}
  output y
}",
            ("x", &[2, 1, 1][..]),
            &[("y", vec![2, 1, 2])][..],
        ),
        (
            "dynamic-slice",
            "graph g {
  input x0: f32[3,2] dims(batch, _)
  param t0: i64[1] = value [3]
  n0 = dynamic_slice(x0, t0) {axes = [1], sizes = [0]}
  n4 = pad(n0) {pads = [0, 1, 0, -1], mode = \"constant\", value = -0.9}
  m = greater(n0, n0)
  b = pad(m) {pads = [0, 1, 0, 1], mode = \"constant\", value = 1}
  output n4, b
}",
            ("x0", &[2][..]),
            &[("n4", vec![0]), ("b", vec![2])][..],
        ),
    ] {
        let graph = dir.join(format!("{name}.txt"));
        std::fs::write(&graph, src).unwrap();
        let (graph, art) = (graph.display().to_string(), dir.join(format!("{name}.mshc")).display().to_string());
        let r = meshc(&["compile", &graph, "--dim", "batch=1..3", "-o", &art]);
        assert_eq!(r.status, Some(0), "{name}: {}", r.stderr);
        for b in [3, 2, 1] {
            let x = dir.join(format!("{name}-x{b}.npy"));
            let dims = [&[b][..], rest].concat();
            Tensor::f32(dims.clone(), values(dims.iter().product(), 3)).write_npy(&x).unwrap();
            let input = format!("{input}={}", x.display());
            let (got, want) = (dir.join(format!("{name}-run{b}")), dir.join(format!("{name}-interp{b}")));
            let r = meshc(&["run", &art, "--input", &input, "--output-dir", &got.display().to_string()]);
            assert_eq!(r.status, Some(0), "{name} at batch {b}: {}", r.stderr);
            let at = format!("batch={b}");
            let want_dir = want.display().to_string();
            let r = meshc(&["interp", &graph, "--dim", &at, "--input", &input, "--output-dir", &want_dir]);
            assert_eq!(r.status, Some(0), "{}", r.stderr);
            for (o, out) in outs {
                let read = |d: &Path| Tensor::read_npy(&d.join(format!("{o}.npy"))).unwrap();
                let (g, w) = (read(&got), read(&want));
                assert_eq!(g, w, "{name}: {o} at batch {b}");
                assert_eq!(g.shape, [&[b][..], out].concat(), "{name}: {o} at batch {b}");
            }
        }
    }
}

/// Found by the differential fuzzer: steps whose results are empty still change how the
/// batch maps to their shapes (a pad of the batch dim, a gather along it), so they are
/// refused as any such step is, not skipped because they do nothing: skipped, they gave
/// an output the bounds' shape at every batch, and ran past an index the interpreter
/// refuses.
#[test]
fn empty_steps_over_a_symbolic_batch_are_refused_as_any_step() {
    let dir = scratch("dynamic-empty-steps");
    for (name, src, node) in [
        (
            "pad",
            "graph g {
  input x: f32[6,1,1] dims(batch, _, _)
  e = slice(x) {starts = [0], ends = [2], axes = [1], steps = [-1]}
  y = pad(e) {pads = [-1, 0, 1, 1, 0, 1], mode = \"constant\", value = 0.0}
  output y
}",
            "node 'y.pad0.first'",
        ),
        (
            "gather",
            "graph g {
  input x: f32[4,6,1] dims(batch, _, _)
  e = slice(x) {starts = [-5], ends = [-6], axes = [1], steps = [1]}
  param i: i32[2] = value [0, -3]
  y = gather(e, i) {axis = 0}
  output y
}",
            "node 'y'",
        ),
    ] {
        let graph = dir.join(format!("{name}.txt"));
        std::fs::write(&graph, src).unwrap();
        let art = dir.join(format!("{name}.mshc")).display().to_string();
        let r = meshc(&["compile", &graph.display().to_string(), "--dim", "batch=1..6", "-o", &art]);
        assert_eq!(r.status, Some(1), "{name}");
        assert_eq!(r.stderr.trim().lines().count(), 1, "{name}: {}", r.stderr);
        assert!(r.stderr.contains(node) && r.stderr.contains("compiled code takes symbolic dims only"), "{}", r.stderr);
    }
}

/// Constants of a shape read from a tensor (testdata/onnx/filled: ConstantOfShape(Shape(x)),
/// Expand of a vector and of a scalar to Shape(x), in f32 and i64), compiled once over
/// `batch=1..6, seq=1..10`: at the example it gives onnxruntime's outputs, and at three
/// other sizes, the smallest and the largest among them, the interpreter's.
#[test]
fn constants_of_shapes_read_from_tensors_compile_once_for_every_size() {
    let (dir, model, art) = compiled_once("filled", (6, 10));
    let run = |x: &str, out: &Path| {
        let r = meshc(&["run", &art, "--input", &format!("x={x}"), "--output-dir", &out.display().to_string()]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
    };
    let got = dir.join("at-example");
    run("testdata/onnx/filled/inputs/x.npy", &got);
    for o in ["y", "count"] {
        let (g, w) =
            (got.join(format!("{o}.npy")), Path::new("testdata/onnx/filled/expected").join(format!("{o}.npy")));
        assert_eq!(Tensor::read_npy(&g).unwrap(), Tensor::read_npy(&w).unwrap(), "{o}");
    }
    for (b, s) in [(1, 1), (2, 9), (6, 10)] {
        let x = dir.join(format!("x-{b}x{s}.npy"));
        Tensor::f32(vec![b, s, 4], values(b * s * 4, 5)).write_npy(&x).unwrap();
        let x = x.display().to_string();
        let (d, want) = (dir.join(format!("run-{b}x{s}")), dir.join(format!("interp-{b}x{s}")));
        run(&x, &d);
        let dims = [format!("batch={b}"), format!("seq={s}")];
        let w = want.display().to_string();
        let r = meshc(&[
            "interp",
            &model,
            "--dim",
            &dims[0],
            "--dim",
            &dims[1],
            "--input",
            &format!("x={x}"),
            "--output-dir",
            &w,
        ]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        for o in ["y", "count"] {
            let read = |p: &Path| Tensor::read_npy(&p.join(format!("{o}.npy"))).unwrap();
            let (g, w) = (read(&d), read(&want));
            assert_eq!(g.shape, vec![b, s, 4], "{o} at {b}x{s}");
            assert_eq!(g, w, "{o} at {b}x{s}");
        }
    }
}

/// A model whose lengths come from `Shape(input_ids)` (the position table sliced to the
/// sequence, a position_ids buffer sliced and gathered, Range(0, seq) gathered, a reshape
/// to Concat of shape pieces), compiled once over `batch=1..6, seq=1..14`: at the size its
/// expected outputs were written at it gives onnxruntime's, and at each size it gives the
/// artifact compiled for exactly that size.
#[test]
fn lengths_read_from_shapes_compile_once_for_every_size() {
    let (dir, model, art) = compiled_once("positions", (6, 14));
    let run = |art: &str, ids: &str, out: &Path| {
        let r =
            meshc(&["run", art, "--input", &format!("input_ids={ids}"), "--output-dir", &out.display().to_string()]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
    };
    let expected = Path::new("testdata/onnx/positions/expected");
    let got = dir.join("at-example");
    run(&art, "testdata/onnx/positions/inputs/input_ids.npy", &got);
    for o in ["emb", "pairs"] {
        let (g, w) = (got.join(format!("{o}.npy")), expected.join(format!("{o}.npy")));
        assert_close(o, &Tensor::read_npy(&g).unwrap(), &Tensor::read_npy(&w).unwrap()).unwrap();
    }
    for (b, s) in [(1, 1), (2, 13), (6, 14), (3, 7)] {
        let ids: Vec<i64> = (0..b * s).map(|i| ((i * 7 + b + s) % 40) as i64).collect();
        let f = dir.join(format!("ids-{b}x{s}.npy"));
        Tensor { shape: vec![b, s], data: Data::I64(ids) }.write_npy(&f).unwrap();
        let one = dir.join(format!("static-{b}x{s}.mshc")).display().to_string();
        let dims = [format!("batch={b}"), format!("seq={s}")];
        let r = meshc(&["compile", &model, "--dim", &dims[0], "--dim", &dims[1], "-o", &one]);
        assert_eq!(r.status, Some(0), "{}", r.stderr);
        let (d, st) = (dir.join(format!("dynamic-{b}x{s}")), dir.join(format!("static-{b}x{s}")));
        run(&art, &f.display().to_string(), &d);
        run(&one, &f.display().to_string(), &st);
        for o in ["emb", "pairs"] {
            let (x, y) = (
                Tensor::read_npy(&d.join(format!("{o}.npy"))).unwrap(),
                Tensor::read_npy(&st.join(format!("{o}.npy"))).unwrap(),
            );
            assert_eq!(x.shape, vec![b, s, if o == "emb" { 8 } else { 2 }], "{o} at {b}x{s}");
            assert_close(&format!("{o} at {b}x{s}"), &x, &y).unwrap();
        }
    }
}
