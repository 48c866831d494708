//! Layout specs through the real `meshc` binary: every illegal spec in testdata/bad_layouts/
//! fails `meshc check testdata/mlp/graph.json --layout SPEC` with its pinned one-line error
//! (golden/bad_layouts/<name>.txt); the layouts each spec testdata/<graph>/layouts/<layout>.json
//! fixes for its graph are pinned too (golden/layouts/<graph>-<layout>.txt).
//! MESHC_BLESS=1 rewrites the pinned files instead.

use crate::common::{golden, layout_cases, meshc};
use std::path::PathBuf;

const MLP: &str = "testdata/mlp/graph.json";

fn json_files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("readable dir").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    v
}

/// `meshc check GRAPH --layout SPEC` must fail like a user error (exit 1, nothing on stdout,
/// one stderr line, no panic) with the message pinned in golden/bad_layouts/`case`.txt.
fn refused(case: &str, graph: &str, spec: &str) -> Result<(), String> {
    let run = meshc(&["check", graph, "--layout", spec]);
    if run.status != Some(1) || !run.stdout.is_empty() || run.stderr.lines().count() != 1 {
        return Err(format!("{spec}: expected exit 1, empty stdout and one stderr line, got {run:?}"));
    }
    if run.stderr.contains("panicked") || !run.stderr.starts_with("error: ") {
        return Err(format!("{spec}: not a one-line user error: {:?}", run.stderr));
    }
    golden(&format!("bad_layouts/{case}.txt"), &run.stderr)
}

#[test]
fn illegal_specs_fail_with_pinned_errors() {
    let cases = json_files("testdata/bad_layouts");
    assert!(cases.len() >= 15, "expected at least 15 illegal specs, found {}", cases.len());
    let mut failures: Vec<String> = cases
        .iter()
        .filter_map(|spec| {
            let case = spec.file_stem().unwrap().to_string_lossy();
            refused(&case, MLP, &spec.display().to_string()).err()
        })
        .collect();
    failures.extend(refused("no-such-file", MLP, "testdata/bad_layouts/no-such-file.json").err());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_bad_graph_is_reported_before_its_spec() {
    // The graph is checked first: its error wins even when the spec is bad too.
    let run = meshc(&["check", "testdata/bad/verify-cycle.json", "--layout", "testdata/bad_layouts/empty-file.json"]);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.starts_with("error: testdata/bad/verify-cycle.json"), "{run:?}");
}

#[test]
fn testdata_specs_check_as_pinned() {
    let cases = layout_cases();
    assert!(!cases.is_empty(), "no testdata/<graph>/layouts/*.json found");
    let mut failures = Vec::new();
    for c in &cases {
        let (graph, spec) = (c.graph.display().to_string(), c.spec.display().to_string());
        let run = meshc(&["check", &graph, "--layout", &spec]);
        if run.status != Some(0) {
            failures.push(format!("meshc check {graph} --layout {spec}: {run:?}"));
            continue;
        }
        // The graph summary comes first, unchanged by the spec.
        let plain = meshc(&["check", &graph]);
        if !run.stdout.starts_with(&plain.stdout) {
            failures.push(format!("{spec}: the summary of {graph} changed with --layout"));
        }
        failures.extend(golden(&format!("layouts/{}.txt", c.label), &run.stdout).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A layout key that is a tensor's name is that tensor, even when the name holds glob
/// characters (ONNX names such as `x[0]`): it does not match `x0` as a pattern would.
#[test]
fn a_key_that_names_a_tensor_is_no_pattern() {
    let dir = crate::common::scratch("layout-literal-key");
    let graph = dir.join("g.txt");
    std::fs::write(
        &graph,
        "graph g {\n  input \"x[0]\": f32[4,4]\n  input x0: f32[4,4]\n  a = relu(\"x[0]\")\n  b = relu(x0)\n  output a\n  output b\n}\n",
    )
    .unwrap();
    let spec = dir.join("l.json");
    std::fs::write(
        &spec,
        r#"{"format": "meshc-layout/1", "mesh": {"shape": [2], "axes": ["d"]}, "layouts": {"x[0]": [0, null]}}"#,
    )
    .unwrap();
    let run = meshc(&["check", &graph.display().to_string(), "--layout", &spec.display().to_string()]);
    assert_eq!(run.status, Some(0), "{run:?}");
    assert!(run.stdout.contains("layout x[0] [d, -] (spec)\n"), "{}", run.stdout);
    assert!(!run.stdout.contains("layout x0 [d, -]"), "{}", run.stdout);
}
