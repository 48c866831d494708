//! `meshc-run`, the runtime's own binary, through the binary: it runs and inspects the
//! committed artifact testdata/meshc_run/small.mshc (compiled from graph.txt beside it for
//! x86-64-v2; tests/all/trust.rs checks it is what meshc compiles today), and refuses bad
//! artifacts and inputs with one line and exit 1.

use std::path::{Path, PathBuf};
use std::process::Command;

const DIR: &str = "../testdata/meshc_run";

struct Run {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

fn meshc_run(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_meshc-run")).args(args).output().expect("meshc-run starts");
    Run {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn file(name: &str) -> String {
    format!("{DIR}/{name}")
}

/// A scratch directory of this test, emptied first.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("meshc-run-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Exit 1 and one line on stderr that contains `want`.
fn refused(args: &[&str], want: &str) {
    let r = meshc_run(args);
    assert_eq!(r.status, Some(1), "{args:?}: {}{}", r.stdout, r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
    assert!(r.stderr.contains(want), "{args:?}: want {want:?}, got {}", r.stderr);
}

#[test]
fn runs_the_artifact_to_numpys_result_and_writes_the_output() {
    let x = format!("x={}", file("x.npy"));
    let r = meshc_run(&["run", &file("small.mshc"), "--input", &x, "--check-against", DIR]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("check y: max abs error 0.000e0"), "{}", r.stdout);
    let d = scratch("run");
    let out = d.join("y.npy");
    let r = meshc_run(&["run", &file("small.mshc"), "--input", &x, "--output", &format!("y={}", out.display())]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let read = |p: &Path| meshc_ir::Tensor::read_npy(p).unwrap();
    assert_eq!(read(&out), read(Path::new(&file("y.npy"))));
    let r = meshc_run(&["run", &file("small.mshc"), "--input", &x, "--bench", "3"]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    assert!(r.stderr.starts_with("bench: 3 runs, latency min"), "{}", r.stderr);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn inspects_the_artifact_as_text_and_as_json() {
    let r = meshc_run(&["inspect", &file("small.mshc")]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    for want in ["graph small | target x86-64-v2", "input  x: f32[2, 3]", "output y: f32[2, 4]", "weights  offset"] {
        assert!(r.stdout.contains(want), "{want}: {}", r.stdout);
    }
    let r = meshc_run(&["inspect", "--json", &file("small.mshc")]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("inspect --json prints JSON");
    assert_eq!(v["meta"]["graph"], "small", "{v}");
    assert!(v["sections"].as_array().is_some_and(|s| s.len() == 4), "{v}");
}

#[test]
fn bad_artifacts_and_inputs_are_refused_in_one_line() {
    let d = scratch("bad");
    let art = file("small.mshc");
    let x = format!("x={}", file("x.npy"));
    refused(
        &["run", &file("graph.txt"), "--input", &x],
        "not a meshc artifact (meshc-run runs compiled artifacts only)",
    );
    refused(&["run", &d.join("none.mshc").display().to_string(), "--input", &x], "none.mshc");
    refused(&["inspect", DIR], "not a regular file");
    let bytes = std::fs::read(&art).unwrap();
    let cut = d.join("cut.mshc");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    refused(&["run", cut.to_str().unwrap(), "--input", &x], "truncated: header says 16432 bytes, file has 8216");
    // The last byte is the weights'.
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let bad = d.join("flipped.mshc");
    std::fs::write(&bad, &flipped).unwrap();
    refused(&["run", bad.to_str().unwrap(), "--input", &x], "section weights: checksum mismatch (corrupted)");
    refused(&["run", &art], "x");
    let y = format!("x={}", file("y.npy"));
    refused(&["run", &art, "--input", &y], "holds f32[2,4], the graph expects f32[2,3]");
    refused(&["run", &art, "--input", &x, "--input", "z=x.npy"], "z");
    let key = d.join("k.pub");
    std::fs::write(&key, format!("meshc-ed25519-public-key {}\n", "00".repeat(32))).unwrap();
    refused(&["run", &art, "--input", &x, "--require-signature", key.to_str().unwrap()], "not signed");
    assert!(Path::new(&art).is_file());
    std::fs::remove_dir_all(d).unwrap();
}

/// `generate` reaches the decode-step contract: an artifact that is not one (the small
/// matmul takes `x`, not `ids`) and a file that is no artifact are refused in one line.
/// tests/all/generate.rs generates with a decoder through `meshc generate`, which shares
/// this code.
#[test]
fn generate_refuses_what_is_not_a_decode_step() {
    let prompt = file("x.npy");
    let args = |a: &str| {
        ["generate", a, "--prompt", prompt.as_str(), "--context", "4", "--max-new-tokens", "1"].map(String::from)
    };
    let small = file("small.mshc");
    refused(
        &args(&small).each_ref().map(String::as_str),
        "not a decode-step artifact (docs/generation.md): it has no input 'ids'",
    );
    let graph = file("graph.txt");
    refused(&args(&graph).each_ref().map(String::as_str), "not a meshc artifact");
}
