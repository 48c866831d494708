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
/// split ([-, model]) while y contracts over its rows (split, as a is). Slicing the whole
/// param every device maps costs nothing, so lowering reads it [model, -]; explain says so.
#[test]
fn an_overridden_param_layout_is_reported() {
    let dir = crate::common::scratch("explain-override");
    let spec = dir.join("spec.json");
    let original = std::fs::read_to_string("testdata/mlp/layouts/design-2x4.json").unwrap();
    std::fs::write(&spec, original.replace(r#""w1": [null, "model"]"#, r#""w?": [null, "model"]"#)).unwrap();
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
