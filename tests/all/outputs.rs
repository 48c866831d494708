//! Every file meshc writes is all-or-nothing, through the real binary: outputs appear
//! together only when the whole command succeeds, output names cannot escape
//! `--output-dir`, two outputs to one file are refused, a full disk (a file-size limit)
//! and SIGTERM or SIGQUIT leave the old file and no temporary behind.

use std::path::Path;
use std::process::Command;

use crate::common::{input_args, meshc, scratch};

const MLP_X: &str = "x=testdata/mlp/inputs/x.npy";

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn a_failing_run_changes_no_output() {
    let dir = scratch("outputs-fail");
    let old = dir.join("sum_all.npy");
    std::fs::write(&old, "old").unwrap();
    let graph = "testdata/reductions/graph.json";
    let inputs = input_args(Path::new(graph));
    let mut args: Vec<String> = vec!["run".into(), graph.into()];
    args.extend(inputs.iter().cloned());
    // The first output could be written, the second cannot: neither is.
    args.extend(["--output".into(), format!("sum_all={}", old.display())]);
    args.extend(["--output".into(), "sum_02=/nonexistent-meshc-dir/b.npy".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = meshc(&args);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.contains("/nonexistent-meshc-dir/b.npy: cannot write"), "{run:?}");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "old");
    assert_eq!(names(&dir), ["sum_all.npy"], "no temporary is left");

    // Two outputs to one file: refused, nothing written.
    let mut twice: Vec<String> = vec!["run".into(), graph.into()];
    twice.extend(inputs.iter().cloned());
    twice.extend(["--output".into(), format!("sum_all={}", old.display())]);
    twice.extend(["--output".into(), format!("sum_02={}/./sum_all.npy", dir.display())]);
    let twice: Vec<&str> = twice.iter().map(String::as_str).collect();
    let run = meshc(&twice);
    assert_eq!(run.status, Some(1), "{run:?}");
    assert!(run.stderr.contains("two outputs of one command would be written to this file"), "{run:?}");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "old");
}

#[test]
fn output_names_that_are_not_file_names_are_refused() {
    let dir = scratch("outputs-names");
    let graph = dir.join("g.json");
    std::fs::write(
        &graph,
        r#"{"format": "meshc-graph/1", "name": "g", "inputs": [{"name": "x", "dtype": "f32", "shape": [16, 64]}],
            "nodes": [{"name": "../escaped", "op": "relu", "inputs": ["x"]}], "outputs": ["../escaped"]}"#,
    )
    .unwrap();
    let g = graph.display().to_string();
    let out = dir.join("out");
    let o = out.display().to_string();
    let art = dir.join("a.mshc").display().to_string();
    for args in [
        vec!["interp", &g, "--input", MLP_X, "--output-dir", &o],
        vec!["compile", &g, "-o", &art],
        vec!["run", &g, "--input", MLP_X, "--output-dir", &o],
    ] {
        let run = meshc(&args);
        assert_eq!(run.status, Some(1), "{args:?}: {run:?}");
        assert!(run.stderr.contains("output name '../escaped' cannot be a file name"), "{args:?}: {run:?}");
    }
    assert!(!dir.join("escaped.npy").exists() && !Path::new(&art).exists());
}

/// A graph whose artifact holds 64 MiB of weights: slow enough to write that a signal
/// can arrive while the temporary exists, large enough to pass a small file-size limit.
fn big_graph(dir: &Path) -> String {
    let graph = dir.join("big.txt");
    std::fs::write(
        &graph,
        "graph big {\n  input i: i32[1]\n  param w: f32[1048576,16] = init zeros\n  y = gather(w, i) {axis = 0}\n  output y\n}\n",
    )
    .unwrap();
    graph.display().to_string()
}

#[test]
fn a_full_disk_leaves_the_old_artifact_and_no_temporary() {
    let dir = scratch("outputs-full");
    let graph = big_graph(&dir);
    let art = dir.join("big.mshc");
    std::fs::write(&art, "old artifact").unwrap();
    // `ulimit -f` in 512-byte blocks: 8 MiB, far less than the artifact needs.
    let script = format!("ulimit -f 16384; exec {} compile {graph} -o {}", env!("CARGO_BIN_EXE_meshc"), art.display());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write") && stderr.lines().count() == 1, "{stderr}");
    assert_eq!(std::fs::read_to_string(&art).unwrap(), "old artifact");
    assert_eq!(names(&dir), ["big.mshc", "big.txt"], "no temporary is left");
}

#[test]
fn sigterm_or_sigquit_during_compile_removes_the_temporary() {
    for signal in [libc::SIGTERM, libc::SIGQUIT] {
        killed_during_compile(signal);
    }
}

fn killed_during_compile(signal: i32) {
    let dir = scratch(&format!("outputs-signal-{signal}"));
    let graph = big_graph(&dir);
    let art = dir.join("big.mshc");
    std::fs::write(&art, "old artifact").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshc"))
        .args(["compile", &graph, "-o", &art.display().to_string()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let mut saw_temporary = false;
    while child.try_wait().unwrap().is_none() && start.elapsed() < std::time::Duration::from_secs(60) {
        if names(&dir).iter().any(|n| n.contains(".tmp")) {
            saw_temporary = true;
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, signal) };
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let status = child.wait().unwrap();
    assert!(saw_temporary || status.success(), "{signal}: {status:?}");
    assert!(status.success() || status.code() == Some(128 + signal), "{signal}: {status:?}");
    // Old or new, never half-written: the signal may land just after the rename.
    let now = std::fs::read(&art).unwrap();
    assert!(
        now == b"old artifact" || meshc_runtime::format::artifact::Artifact::open(&art).is_ok(),
        "a half-written artifact ({} bytes) after {status:?}",
        now.len()
    );
    assert_eq!(names(&dir), ["big.mshc", "big.txt"], "no temporary is left");
}
