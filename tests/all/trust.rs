//! Hostile files and edge values through the real binaries (issue "Trust nothing, again"):
//! an artifact rewritten while it runs, casts to halves, integer division, NaN params, and
//! the committed artifact `meshc-run`'s own tests (runtime/tests/meshc_run.rs) run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{input_args, meshc, scratch};

/// `cp other.mshc running.mshc` truncates the running artifact and writes other bytes into
/// the same inode. The runner read the file into memory of its own when it opened it (no
/// mapping of the file is left), so the run goes on with what it verified: exit 0, never
/// SIGBUS (a mapped weights section past the new end of the file faulted).
#[test]
fn rewriting_a_running_artifact_in_place_never_crashes_it() {
    let tmp = scratch("trust-rewrite");
    let art = tmp.join("mlp.mshc");
    let graph = Path::new("testdata/mlp/graph.json");
    let c = meshc(&["compile", "testdata/mlp/graph.json", "-o", art.to_str().unwrap()]);
    assert_eq!(c.status, Some(0), "{c:?}");
    let original = std::fs::read(&art).unwrap();
    let mut args: Vec<String> = vec!["run".into(), art.display().to_string()];
    args.extend(input_args(graph));
    args.extend(["--check-against", "testdata/mlp/expected", "--bench", "20000"].map(String::from));
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshc"))
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("meshc starts");
    // The check's line comes after the first run, before the bench's runs: the artifact
    // has been opened and used.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("check y:") && first.contains("(ok)"), "{first:?}");
    let mut while_running = 0;
    for i in 0..50 {
        // As cp does: the same file cut to nothing, then other bytes (a shorter file).
        let other: &[u8] = if i % 2 == 0 { b"MESHC\0AR, cut short" } else { &original[..original.len() / 3] };
        std::fs::write(&art, other).unwrap();
        if child.try_wait().unwrap().is_none() {
            while_running += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The rest of stdout is read as it comes (a closed pipe would end the run by SIGPIPE).
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "killed or failed: {:?} {stderr}", out.status);
    assert!(while_running > 0, "the run ended before the file was rewritten: nothing was tested");
    assert!(stderr.contains("bench: 20000 runs"), "{stderr}");
}
