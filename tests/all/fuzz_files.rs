//! The checks of the coverage-guided fuzz targets (fuzz/src/checks.rs, `make fuzz-files`)
//! run on the inputs libFuzzer found that once failed them (testdata/fuzz-regressions/
//! TARGET/), and on the testdata files the corpora are seeded with: each must be read or
//! refused in one line, never panic.

#[path = "../../fuzz/src/checks.rs"]
mod checks;

use std::path::{Path, PathBuf};

use crate::common::scratch;

/// The files under `dir` (recursively) whose path ends with `suffix`, sorted.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return v };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(files(&p, suffix));
        } else if p.to_string_lossy().ends_with(suffix) {
            v.push(p);
        }
    }
    v.sort();
    v
}

/// Seed files of each target from testdata (as tools/fuzz_seeds.sh picks them, fewer).
fn seeds(target: &str, artifacts: &Path) -> Vec<PathBuf> {
    let t = Path::new("testdata");
    match target {
        "onnx_import" => files(&t.join("onnx"), ".onnx"),
        "safetensors" => files(t, ".safetensors"),
        "checkpoint_index" => files(t, ".index.json"),
        "npy" => files(&t.join("mlp"), ".npy"),
        "text_graph" => [files(&t.join("bad"), ".txt"), files(&t.join("regress"), ".txt")].concat(),
        "json_graph" => [files(t, "graph.json"), files(&t.join("regress"), ".json")].concat(),
        "artifact" => files(artifacts, ".mshc"),
        _ => panic!("no seeds for target {target}"),
    }
}

#[test]
fn found_inputs_and_seeds_are_read_or_refused_in_one_line() {
    let dir = scratch("fuzz-files");
    let art = dir.join("mlp.mshc").display().to_string();
    let run = crate::common::meshc(&["compile", "testdata/mlp/graph.json", "-o", &art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    // An artifact over a symbolic batch: its sizes, size table and scaled steps.
    let art = dir.join("mlp-batch.mshc").display().to_string();
    let run = crate::common::meshc(&["compile", "testdata/mlp/graph.json", "--dim", "batch=1..64", "-o", &art]);
    assert_eq!(run.status, Some(0), "{run:?}");
    let mut failed = Vec::new();
    for (target, check) in checks::TARGETS {
        let found = files(&Path::new("testdata/fuzz-regressions").join(target), "");
        let inputs = [found, seeds(target, &dir)].concat();
        assert!(!inputs.is_empty(), "no inputs for target {target}");
        for f in inputs {
            let data = std::fs::read(&f).unwrap();
            if std::panic::catch_unwind(|| check(&data)).is_err() {
                failed.push(format!("{target}: {}", f.display()));
            }
        }
    }
    checks::remove_scratch();
    assert!(failed.is_empty(), "inputs that fail their fuzz target's check:\n{}", failed.join("\n"));
}
