//! Shared helpers of the integration tests: running the real binary, finding testdata
//! graphs, comparing tensors with the stated tolerance, and golden files.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

use std::path::{Path, PathBuf};
use std::process::Command;

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn meshc(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_meshc")).args(args).output().expect("meshc runs");
    Run {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Every `testdata/<name>/graph.json`, sorted.
pub fn testdata_graphs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("testdata")
        .expect("testdata exists")
        .map(|e| e.expect("readable").path().join("graph.json"))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no testdata graphs found");
    v
}

/// Compares `actual` with golden/`name`; with MESHC_BLESS=1 rewrites the file instead.
/// The error shows a line diff.
pub fn golden(name: &str, actual: &str) -> Result<(), String> {
    let path = Path::new("golden").join(name);
    if std::env::var_os("MESHC_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return Ok(());
    }
    let expected = std::fs::read_to_string(&path)
        .map_err(|_| format!("{} is missing; run `make golden` and review it", path.display()))?;
    if expected == actual {
        return Ok(());
    }
    let mut diff = format!("{} differs (run `make golden` if the change is intended):\n", path.display());
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        match (e.get(i), a.get(i)) {
            (Some(x), Some(y)) if x == y => {}
            (x, y) => {
                if let Some(x) = x {
                    diff.push_str(&format!("  -{:>4}: {x}\n", i + 1));
                }
                if let Some(y) = y {
                    diff.push_str(&format!("  +{:>4}: {y}\n", i + 1));
                }
            }
        }
    }
    Err(diff)
}

/// Compares two tensors under the tolerance of `Tensor::closeness`; the error names the
/// first offending element and the worst error.
pub fn assert_close(what: &str, got: &meshc_ir::Tensor, want: &meshc_ir::Tensor) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("{what}: got {}, want {}", got.ty(), want.ty()));
    }
    let c = got.closeness(want);
    match c.first_bad {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {} but should be {} (worst abs error {:e} at {})",
            got.data.to_f64()[i],
            want.data.to_f64()[i],
            c.max_abs_err,
            c.worst
        )),
    }
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("meshc-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--input NAME=FILE` arguments for every `.npy` in `<graph dir>/inputs`.
pub fn input_args(graph: &Path) -> Vec<String> {
    let mut args = Vec::new();
    let dir = graph.parent().unwrap().join("inputs");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    files.sort();
    for f in files {
        args.push("--input".to_string());
        args.push(format!("{}={}", f.file_stem().unwrap().to_string_lossy(), f.display()));
    }
    args
}

/// Checks every `<graph dir>/expected/NAME.npy` against `out_dir/NAME.npy`.
pub fn compare_expected(graph: &Path, out_dir: &Path) -> Result<usize, String> {
    let dir = graph.parent().unwrap().join("expected");
    let mut n = 0;
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?.map(|e| e.unwrap().path()).collect();
    files.sort();
    for want_path in files {
        let name = want_path.file_name().unwrap();
        let want = meshc_ir::Tensor::read_npy(&want_path).map_err(|e| e.to_string())?;
        let got = meshc_ir::Tensor::read_npy(&out_dir.join(name)).map_err(|e| e.to_string())?;
        assert_close(&format!("{} output {}", graph.display(), name.to_string_lossy()), &got, &want)?;
        n += 1;
    }
    Ok(n)
}

/// One testdata graph under one of its layout specs.
pub struct LayoutCase {
    pub graph: PathBuf,
    pub spec: PathBuf,
    /// `<graph>-<layout>`, e.g. `mlp-mp-2x4`: names its golden files.
    pub label: String,
}

/// Every layout spec `testdata/<graph>/layouts/<layout>.json` with its graph's
/// `graph.json`, sorted by graph then spec.
pub fn layout_cases() -> Vec<LayoutCase> {
    let mut v = Vec::new();
    for graph in testdata_graphs() {
        let dir = graph.parent().unwrap();
        let Ok(entries) = std::fs::read_dir(dir.join("layouts")) else { continue };
        let mut specs: Vec<PathBuf> = entries
            .map(|e| e.expect("readable").path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        specs.sort();
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        v.extend(specs.into_iter().map(|spec| {
            let label = format!("{name}-{}", spec.file_stem().unwrap().to_string_lossy());
            LayoutCase { graph: graph.clone(), spec, label }
        }));
    }
    v
}
