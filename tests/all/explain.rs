//! `meshc explain`: its report for every testdata graph under each of its layout specs is
//! pinned in golden/explain/<graph>-<layout>.txt (MESHC_BLESS=1 rewrites them), `--json`
//! gives the same entries; and under random legal layouts the bytes it predicts per link are
//! the bytes the runner's fabric counts, while the outputs equal the single-device run.

use std::collections::{BTreeMap, HashMap};

use meshc::passes::layout::propagate;
use meshc::passes::lower::lower;
use meshc_ir::Tensor;
use proptest::prelude::*;

use crate::common::{golden, layout_cases, meshc, random_seeds, testdata_graphs};

#[test]
fn explain_of_every_layout_is_pinned() {
    let mut failures = Vec::new();
    for c in layout_cases() {
        let (graph, spec) = (c.graph.display().to_string(), c.spec.display().to_string());
        let run = meshc(&["explain", &graph, "--layout", &spec]);
        if run.status != Some(0) {
            failures.push(format!("meshc explain {graph} --layout {spec}: {run:?}"));
            continue;
        }
        failures.extend(golden(&format!("explain/{}.txt", c.label), &run.stdout).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn json_lists_the_entries_of_the_text() {
    let args = ["explain", "testdata/transformer/graph.json", "--layout", "testdata/transformer/layouts/mp-8.json"];
    let run = meshc(&[&args[..], &["--json"]].concat());
    assert_eq!(run.status, Some(0), "{run:?}");
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let entries = v["entries"].as_array().unwrap();
    // The two Megatron all_reduces, then the half-scores added over pairs of devices.
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[2]["tensor"], "scores");
    assert_eq!(entries[2]["rule"], "contraction_over_split_dim");
    let bytes: u64 = entries.iter().map(|e| e["bytes"].as_u64().unwrap()).sum();
    assert_eq!(v["bytes"].as_u64(), Some(bytes));
    let text = meshc(&args).stdout;
    assert!(text.contains(&format!("{bytes} bytes over links")), "{text}");
}

/// A param the spec lays out explicitly but its reader slices otherwise: w2 given its columns
/// split ([-, model]) while y, which the spec keeps whole on that dim, contracts over its
/// rows (split, as a is). Slicing the whole param every device maps costs nothing, so
/// lowering reads it [model, -]; explain says so.
#[test]
fn an_overridden_param_layout_is_reported() {
    let dir = crate::common::scratch("explain-override");
    let spec = dir.join("spec.json");
    let original = std::fs::read_to_string("testdata/mlp/layouts/design-2x4.json").unwrap();
    std::fs::write(
        &spec,
        original.replace(r#""w1": [null, "model"]"#, r#""w?": [null, "model"], "y": ["data", null]"#),
    )
    .unwrap();
    let run = meshc(&["explain", "testdata/mlp/graph.json", "--layout", spec.to_str().unwrap()]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(run.stdout.contains("params read in another layout than the spec gives"), "{}", run.stdout);
    assert!(run.stdout.contains("  w2: spec [-, model], read [model, -] by 'y'\n"), "{}", run.stdout);
    assert!(!run.stdout.contains("  w1: spec"), "w1 is read as the spec gives it: {}", run.stdout);
    let json = meshc(&["explain", "testdata/mlp/graph.json", "--layout", spec.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["overridden"][0]["param"], "w2");
    // The spec as given (w1 only) overrides nothing.
    let plain = meshc(&["explain", "testdata/mlp/graph.json", "--layout", "testdata/mlp/layouts/design-2x4.json"]);
    assert!(!plain.stdout.contains("params read in another layout"), "{}", plain.stdout);
}

/// A mesh axis of size 1 splits nothing: the batch ruled (or laid out) onto the `data` axis
/// of a [1, 4] mesh is one block, so the reshape that merges it with the sequence has no split
/// to lose. explain lists no communication over `data` (it used to list a 0-byte all_gather,
/// "reshape cannot keep the split", per such reshape) — the same steps as on a plain [4]
/// mesh — and the run still computes what one device does.
#[test]
fn a_size_one_axis_splits_nothing() {
    let dir = crate::common::scratch("explain-size-one-axis");
    let graph = dir.join("graph.txt");
    std::fs::write(
        &graph,
        "graph g {\n  input x: f32[2,3,16] dims(batch, seq, embed)\n  \
         param w: f32[16,16] dims(embed, hidden) = init normal{seed = 1, std = 0.3}\n  \
         h = matmul(x, w)\n  r = reshape(h) {shape = [6,16]}\n  y = tanh(r)\n  output y\n}\n",
    )
    .unwrap();
    let graph = graph.display().to_string();
    let explain = |name: &str, mesh: &str, rules: &str, layouts: &str| {
        let path = dir.join(name);
        let text = format!(
            r#"{{"format": "meshc-layout/1", "mesh": {mesh}, {rules}"layouts": {{"w": [null, "model"]{layouts}}}}}"#
        );
        std::fs::write(&path, text).unwrap();
        let path = path.display().to_string();
        let run = meshc(&["explain", &graph, "--layout", &path, "--json"]);
        assert_eq!(run.status, Some(0), "{run:?}");
        let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        (path, v["entries"].as_array().unwrap().clone())
    };
    let data_model = r#"{"shape": [1, 4], "axes": ["data", "model"]}"#;
    let (_, plain) = explain("plain.json", r#"{"shape": [4], "axes": ["model"]}"#, "", "");
    assert!(plain.is_empty(), "{plain:?}");
    let (ruled, by_rule) = explain("rule.json", data_model, r#""rules": {"batch": "data"}, "#, "");
    assert_eq!(by_rule, plain, "[1, 4] with the batch ruled onto data, against [4]");
    let (_, given) = explain("given.json", data_model, "", r#", "x": ["data", null, null]"#);
    assert_eq!(given, plain, "[1, 4] with x laid out over data, against [4]");
    run_equals_interp(&dir, &graph, &ruled, &[2, 3, 16]);
}

/// `meshc run` of `graph` (input x of `shape`, output y) under `spec` gives what the
/// interpreter gives.
fn run_equals_interp(dir: &std::path::Path, graph: &str, spec: &str, shape: &[usize]) {
    let x = dir.join("x.npy");
    let v: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| (i % 7) as f32 / 3.0 - 1.0).collect();
    Tensor::new(shape.to_vec(), meshc_ir::Data::F32(v)).write_npy(&x).unwrap();
    let input = format!("x={}", x.display());
    let (got, want) = (dir.join("got.npy"), dir.join("want.npy"));
    let r = meshc(&["run", graph, "--layout", spec, "--input", &input, "--output", &format!("y={}", got.display())]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let r = meshc(&["interp", graph, "--input", &input, "--output", &format!("y={}", want.display())]);
    assert_eq!(r.status, Some(0), "{r:?}");
    let (got, want) = (Tensor::read_npy(&got).unwrap(), Tensor::read_npy(&want).unwrap());
    crate::common::assert_close("y", &got, &want).unwrap();
}

#[test]
fn a_missing_spec_is_one_line() {
    let run = meshc(&["explain", "testdata/mlp/graph.json", "--layout", "no/such/spec.json"]);
    assert_eq!(run.status, Some(1));
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn predicted_link_bytes_are_what_the_fabric_counts(
        graph in 0usize..16, mesh in 0usize..7,
        picks in proptest::collection::vec(proptest::collection::vec(0u8..8, 4), 64), density in 1usize..4
    ) {
        let graphs = testdata_graphs();
        let dir = graphs[graph % graphs.len()].parent().unwrap().to_path_buf();
        let (g, info) = meshc_ir::load::load(&dir.join("graph.json")).unwrap();
        let mesh = &crate::common::meshes()[mesh];
        let layouts = propagate(&g, &info, mesh, random_seeds(&g, &info, mesh, &picks, density));
        let lowered = lower(&g, &info, &layouts).unwrap();
        let report = meshc::explain::report(&g, &info, &lowered, false).unwrap();
        let params = meshc_ir::params::load_all(&g, &dir).unwrap();
        // Collectives carry f32 only: a layout that needs one of another dtype is refused.
        let compiled = meshc::compile::compile_lowered(&g, &info, &lowered, &params, &Default::default(), &Default::default());
        prop_assume!(compiled.is_ok());
        let loaded = compiled.unwrap().load().unwrap();
        let inputs: HashMap<String, Tensor> = g
            .inputs
            .iter()
            .map(|i| (i.name.clone(), Tensor::read_npy(&dir.join("inputs").join(format!("{}.npy", i.name))).unwrap()))
            .collect();
        let got = loaded.run(&inputs).unwrap();
        crate::common::matches_expected(&dir.join("graph.json"), &got).map_err(TestCaseError::fail)?;
        let counted: BTreeMap<(Vec<usize>, Vec<usize>), u64> =
            loaded.link_stats().links.into_iter().filter(|l| l.bytes > 0).map(|l| ((l.from, l.to), l.bytes)).collect();
        let predicted: BTreeMap<(Vec<usize>, Vec<usize>), u64> =
            report.links.into_iter().filter(|l| l.collectives > 0).map(|l| ((l.from, l.to), l.collectives)).collect();
        prop_assert_eq!(predicted, counted, "{} on {:?}", dir.display(), mesh.shape);
    }
}

/// A reshape that merges [2, 16] into [32] loses a 4-way split of the 16 (each device's
/// block straddles the rows); laid out as 2 x 2 blocks — sub-axes `model:(1)2`, `model:(2)2`
/// — the quarters are contiguous and the merge keeps them. explain suggests that layout, and
/// the spec that follows it moves nothing and still computes what one device does.
#[test]
fn a_reshape_that_loses_a_split_gets_a_sub_axis_layout_suggested() {
    let dir = crate::common::scratch("explain-sub-axis");
    let graph = dir.join("graph.txt");
    std::fs::write(
        &graph,
        "graph runs {\n  input x: f32[2,16]\n  param w: f32[16,16] = init normal{seed = 1, std = 0.3}\n  \
         h = matmul(x, w)\n  r = reshape(h) {shape = [32]}\n  y = tanh(r)\n  output y\n}\n",
    )
    .unwrap();
    let spec = |layouts: &str| {
        let path = dir.join(format!("spec{}.json", layouts.len()));
        let text = format!(
            r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [4], "axes": ["model"]}}, "layouts": {{{layouts}}}}}"#
        );
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let graph = graph.display().to_string();
    let lost = meshc(&["explain", &graph, "--layout", &spec(r#""w": [null, "model"]"#)]);
    assert_eq!(lost.status, Some(0), "{lost:?}");
    assert!(lost.stdout.contains("all_gather     h.all_gather"), "{}", lost.stdout);
    assert!(lost.stdout.contains("reshape cannot keep the split"), "{}", lost.stdout);
    let fix = "give 'h' the layout [model:(1)2, model:(2)2] in the spec (its model blocks as one run over the dims \
               'r' reshapes together): 'r' keeps it, as [model]";
    assert!(lost.stdout.contains(fix), "{}", lost.stdout);
    let kept = spec(r#""w": [null, "model"], "h": ["model:(1)2", "model:(2)2"]"#);
    let run = meshc(&["explain", &graph, "--layout", &kept]);
    assert!(run.stdout.contains("communication: 0 step(s)"), "{}", run.stdout);
    assert!(run.stdout.contains("  y [model]\n"), "{}", run.stdout);
    run_equals_interp(&dir, &graph, &kept, &[2, 16]);
}

/// The MLP on a 4-way model axis: y, a partial sum over the axis, is an output. mp-4 pins it
/// replicated, so it is all-reduced and explain says which spec entry keeps it so; without
/// that entry it is reduce-scattered, left split for the runner to assemble, and the run
/// still gives the expected outputs.
#[test]
fn a_pinned_output_that_keeps_a_partial_sum_whole_gets_freeing_it_suggested() {
    let graph = "testdata/mlp/graph.json";
    let pinned = meshc(&["explain", graph, "--layout", "testdata/mlp/layouts/mp-4.json"]);
    assert_eq!(pinned.status, Some(0), "{pinned:?}");
    assert!(pinned.stdout.contains("all_reduce     y "), "{}", pinned.stdout);
    let fix = "y (24576 bytes): drop the layout of 'y' from the spec: 'y' would be reduce-scattered instead";
    assert!(pinned.stdout.contains(fix), "{}", pinned.stdout);
    let dir = crate::common::scratch("explain-free-output");
    let spec = dir.join("mp-4-free.json");
    let original = std::fs::read_to_string("testdata/mlp/layouts/mp-4.json").unwrap();
    let free = original.replace(r#", "y": [null, null]"#, "");
    assert_ne!(free, original, "mp-4 pins y");
    std::fs::write(&spec, free).unwrap();
    let spec = spec.to_str().unwrap();
    let json = meshc(&["explain", graph, "--layout", spec, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{}", json.stdout);
    assert_eq!(entries[0]["step"], "reduce_scatter");
    assert_eq!(entries[0]["rule"], "partial_sum_scattered");
    assert_eq!(entries[0]["to"], "[model, -]");
    assert!(v["bytes"].as_u64().unwrap() < 24576, "{}", json.stdout);
    assert_eq!(v["split_outputs"][0], serde_json::json!(["y", "[model, -]"]));
    let mut args = vec!["run".to_string(), graph.into(), "--layout".into(), spec.into()];
    args.extend(crate::common::input_args(std::path::Path::new(graph)));
    args.extend(["--check-against".into(), "testdata/mlp/expected".into()]);
    let run = meshc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(run.status, Some(0), "{run:?}");
}

/// A rule constrains the dims it names and nothing else: with `batch -> data`, w1 split on
/// its columns and w2 on its rows, the hidden dims of h and a take `model` from w1 (as GSPMD
/// propagates them), and the MLP runs Megatron-style: one all_reduce, nothing replicated.
/// Pinning h whole on that dim leaves both matmuls replicated over model, which explain warns of.
#[test]
fn rules_leave_unnamed_dims_to_propagation() {
    let dir = crate::common::scratch("explain-rules");
    let graph = dir.join("mlp.txt");
    std::fs::write(
        &graph,
        "graph mlp {\n  input x: f32[8,32] dims(batch, _)\n  param w1: f32[32,64] = init normal{seed = 1, std = 0.1}\n  \
         param w2: f32[64,16] = init normal{seed = 2, std = 0.1}\n  h = matmul(x, w1)\n  a = relu(h)\n  \
         y = matmul(a, w2)\n  output y\n}\n",
    )
    .unwrap();
    let spec = |layouts: &str| {
        let path = dir.join("spec.json");
        let text = format!(
            r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [2, 2], "axes": ["data", "model"]}},
               "rules": {{"batch": "data"}}, "layouts": {{{layouts}}}}}"#
        );
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let megatron = spec(r#""w1": [null, "model"], "w2": ["model", null]"#);
    let g = graph.display().to_string();
    let check = meshc(&["check", &g, "--layout", &megatron]);
    assert_eq!(check.status, Some(0), "{check:?}");
    for line in [
        "layout x [data, -] (rule)",
        "layout w1 [-, model] (spec)",
        "layout h [data, model] (rule, other dims propagated from w1)",
        "layout a [data, model] (rule, other dims propagated from h)",
        "layout y [data, -] (rule)",
    ] {
        assert!(check.stdout.contains(&format!("{line}\n")), "{line}: {}", check.stdout);
    }
    let run = meshc(&["explain", &g, "--layout", &megatron]);
    assert!(run.stdout.contains("communication: 1 step(s)"), "{}", run.stdout);
    assert!(run.stdout.contains("all_reduce     y "), "{}", run.stdout);
    assert!(run.stdout.contains("replicated 0 FLOPs (0% of the graph)"), "{}", run.stdout);
    assert!(!run.stdout.contains("warning:"), "{}", run.stdout);
    let pinned = meshc(&["explain", &g, "--layout", &spec(r#""w1": [null, "model"], "h": ["data", null]"#)]);
    let warning = "warning: 100% of the FLOPs are replicated although the spec's layouts split over data, model";
    assert!(pinned.stdout.contains(warning), "{}", pinned.stdout);
}
