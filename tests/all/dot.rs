//! `--dump-format dot`: the dumps of `place`, `lower`, `sendrecv` and `streams` as Graphviz
//! graphs through the real binary — one pinned in golden/dot/, all four accepted by
//! `dot -Tsvg` when Graphviz is installed (skipped otherwise), and the passes without a dot
//! form refused by name.

use crate::common::{golden, meshc, scratch};

const GRAPH: &str = "testdata/mlp/graph.json";
const STAGES: &str = "testdata/mlp/layouts/stages-2x4.json";

#[test]
fn graph_dumps_render_with_graphviz() {
    let dir = scratch("dot-dumps");
    let dumps = dir.join("dumps");
    let out = dir.join("a.mshc");
    let (out, dumps_arg) = (out.to_str().unwrap(), dumps.to_str().unwrap());
    let args = ["compile", GRAPH, "--layout", STAGES, "-o", out, "--comm-stream", "always"];
    let run = meshc(&[&args[..], &["--dump-after", "all", "--dump-format", "dot", "--dump-dir", dumps_arg]].concat());
    assert_eq!(run.status, Some(0), "{}", run.stderr);
    let mut files: Vec<String> =
        std::fs::read_dir(&dumps).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files, ["03-place.dot", "05-lower.dot", "06-sendrecv.dot", "17-streams.dot"]);
    let sendrecv = std::fs::read_to_string(dumps.join("06-sendrecv.dot")).unwrap();
    golden("dot/mlp-stages-2x4-sendrecv.dot", &sendrecv).unwrap();
    let has_dot = std::process::Command::new("dot").arg("-V").output().is_ok_and(|o| o.status.success());
    if !has_dot {
        eprintln!("Graphviz's dot is not installed: the dumps are not rendered");
        return;
    }
    for f in &files {
        let svg = std::process::Command::new("dot").args(["-Tsvg", "-o", "/dev/null"]).arg(dumps.join(f)).output();
        let svg = svg.unwrap();
        assert!(svg.status.success(), "{f}: {}", String::from_utf8_lossy(&svg.stderr));
        assert!(svg.stderr.is_empty(), "{f}: dot warns: {}", String::from_utf8_lossy(&svg.stderr));
    }
}

#[test]
fn passes_without_a_dot_form_are_refused() {
    let run = meshc(&["compile", GRAPH, "-o", "/dev/null", "--dump-after", "buffers", "--dump-format", "dot"]);
    assert_eq!(run.status, Some(1));
    assert_eq!(
        run.stderr,
        "error: --dump-format dot: pass 'buffers' has no dot form (passes with one: place, lower, sendrecv, streams)\n"
    );
}
