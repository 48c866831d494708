//! Golden-file tests through the real `meshc` binary: every bad input in testdata/bad/ must
//! fail with its pinned one-line error (under `--max-memory 1G`); the text form and `check`
//! summary of every testdata graph are pinned too. `make golden` (MESHC_BLESS=1) rewrites
//! the files instead.

use crate::common::{golden, meshc, testdata_graphs};
use std::path::Path;

#[test]
fn bad_inputs_fail_with_pinned_errors() {
    let mut cases: Vec<_> = std::fs::read_dir("testdata/bad")
        .expect("testdata/bad exists")
        .map(|e| e.expect("readable dir").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e != "md" && e != "npy" && e != "safetensors"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 30, "expected at least 30 bad inputs, found {}", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        // Under a fixed memory budget, the refusals of the budget read the same everywhere.
        let run = meshc(&["check", &case.display().to_string(), "--max-memory", "1G"]);
        if run.status != Some(1) || run.stderr.lines().count() != 1 || !run.stdout.is_empty() {
            failures.push(format!("{}: expected exit 1 and one stderr line, got {run:?}", case.display()));
            continue;
        }
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        if let Err(e) = golden(&format!("bad/{name}.txt"), &run.stderr) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn testdata_graphs_print_and_check_as_pinned() {
    let mut failures = Vec::new();
    for g in testdata_graphs() {
        let name = g.parent().unwrap().file_name().unwrap().to_string_lossy().to_string();
        let path = g.display().to_string();
        for (kind, args) in [("fmt", vec!["fmt", &path, "--to", "text"]), ("check", vec!["check", &path])] {
            let run = meshc(&args);
            if run.status != Some(0) {
                failures.push(format!("meshc {}: {run:?}", args.join(" ")));
            } else if let Err(e) = golden(&format!("{kind}/{name}.txt"), &run.stdout) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(Path::new("golden/fmt").is_dir());
}
