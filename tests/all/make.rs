//! The build-system use of the depfile: with the Makefile's `artifacts` rule, an artifact is
//! rebuilt when its graph or a weight file changes, and not otherwise.

use crate::common::scratch;
use std::process::Command;

fn make(args: &[&str]) -> std::process::Output {
    Command::new("make").args(args).output().expect("make runs")
}

#[test]
fn artifacts_rebuild_only_when_an_input_changes() {
    let dir = scratch("make");
    let src = dir.join("src");
    let out = dir.join("out");
    std::fs::create_dir_all(&src).unwrap();
    let copied = Command::new("cp").args(["-r", "testdata/mlp", src.join("mlp").to_str().unwrap()]).status().unwrap();
    assert!(copied.success());
    let vars = [
        format!("MESHC={}", env!("CARGO_BIN_EXE_meshc")),
        format!("ART_SRC={}", src.display()),
        format!("ART_DIR={}", out.display()),
    ];
    let target = out.join("mlp.mshc").display().to_string();
    let args: Vec<&str> = vars.iter().map(String::as_str).chain([target.as_str()]).collect();
    let query: Vec<&str> = ["-q"].into_iter().chain(args.iter().copied()).collect();

    assert!(make(&args).status.success(), "{:?}", make(&args));
    assert!(out.join("mlp.mshc.d").is_file());
    assert_eq!(make(&query).status.code(), Some(0), "up to date right after a build");

    // Touching a weight file named only by the depfile makes the artifact stale.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let w = src.join("mlp/weights/w1.npy");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes).unwrap();
    assert_eq!(make(&query).status.code(), Some(1), "a changed weight file must trigger a rebuild");
    assert!(make(&args).status.success());
    assert_eq!(make(&query).status.code(), Some(0));

    // An unrelated file in the graph's directory does not.
    std::fs::write(src.join("mlp/notes.txt"), "unrelated").unwrap();
    assert_eq!(make(&query).status.code(), Some(0), "an unrelated file must not trigger a rebuild");
}

/// A depfile names its files as make reads them whatever characters they hold: a space,
/// `#` (a comment), `:` (a rule's colon) and `$` (a variable) escaped. Make then finds the
/// artifact up to date, stale when a weight file changes, and every file by its name.
#[test]
fn a_depfile_of_paths_with_make_syntax_in_them_reads_back_in_make() {
    let dir = scratch("make-names");
    let src = dir.join("a b$c#d:e");
    let copied = Command::new("cp").args(["-r", "testdata/mlp", src.to_str().unwrap()]).status().unwrap();
    assert!(copied.success());
    let art = src.join("mlp.mshc");
    let run = crate::common::meshc(&[
        "compile",
        src.join("graph.json").to_str().unwrap(),
        "-o",
        art.to_str().unwrap(),
        "-MF",
        dir.join("mlp.d").to_str().unwrap(),
    ]);
    assert_eq!(run.status, Some(0), "{run:?}");
    std::fs::write(dir.join("Makefile"), "include mlp.d\n%.mshc:\n\t@echo rebuild\n").unwrap();
    let query = || make(&["-q", "-C", dir.to_str().unwrap()]);
    assert_eq!(query().status.code(), Some(0), "{:?}", query());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let w = src.join("weights/w1.npy");
    std::fs::write(&w, std::fs::read(&w).unwrap()).unwrap();
    assert_eq!(query().status.code(), Some(1), "{:?}", query());
}
