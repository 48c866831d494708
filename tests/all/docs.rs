//! What the docs state that the code can contradict: the artifact format version that
//! docs/artifact.md documents is the one the runtime writes; every source path the docs and
//! the README cite (`src/...`, `runtime/src/...`, `ir/src/...`) exists — files move, and a
//! doc pointing at a file that is gone sends its reader nowhere; the runtime's module doc
//! and design.md §1 list every module in its room; the module map has every module.

use std::collections::BTreeSet;
use std::path::Path;

use meshc_runtime::format::artifact::FORMAT_VERSION;

use crate::modules::modules;

/// The markdown files whose paths are checked.
fn doc_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir("docs")
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".md"))
        .collect();
    files.push("README.md".to_string());
    files.sort();
    files
}

/// Every source path `text` cites: `src/`, `runtime/src/` or `ir/src/` at the start of a
/// word, up to the first character that cannot be part of a path (a sentence's final dot
/// left out).
fn cited_paths(text: &str) -> Vec<String> {
    let in_path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let mut out = Vec::new();
    for (at, _) in text.match_indices("src/") {
        let start = ["runtime/", "ir/"].iter().find(|p| text[..at].ends_with(*p)).map_or(at, |p| at - p.len());
        if text[..start].ends_with(in_path) {
            continue;
        }
        let len = text[start..].find(|c: char| !in_path(c)).unwrap_or(text.len() - start);
        out.push(text[start..start + len].trim_end_matches('.').to_string());
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn artifact_md_documents_the_format_version_the_runtime_writes() {
    let doc = std::fs::read_to_string("docs/artifact.md").unwrap();
    let title = doc.lines().next().unwrap();
    assert!(
        title.ends_with(&format!("format version {FORMAT_VERSION})")),
        "docs/artifact.md's title names another version than {FORMAT_VERSION}: {title}"
    );
    let row = doc.lines().find(|l| l.contains("| format version:")).expect("the header table's version row");
    assert!(
        row.contains(&format!("`{FORMAT_VERSION}`")),
        "docs/artifact.md's header table names another version than {FORMAT_VERSION}: {row}"
    );
}

#[test]
fn every_source_path_the_docs_cite_exists() {
    let mut missing = Vec::new();
    let mut cited = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for path in cited_paths(&text) {
            cited += 1;
            if !Path::new(&path).exists() {
                missing.push(format!("{file}: {path}"));
            }
        }
    }
    assert!(cited > 20, "only {cited} paths found: is the reading broken?");
    assert!(missing.is_empty(), "paths cited in the docs that do not exist:\n{}", missing.join("\n"));
}

/// The reading finds paths in prose, code spans and lists, and only at the start of a word.
#[test]
fn cited_paths_are_read_as_written() {
    let text = "See `runtime/src/format/program.rs`, src/passes/ and ir/src/ops.rs. \
                Not testdata/src/x.rs nor my_src/y.rs; (src/gone.rs)";
    assert_eq!(cited_paths(text), ["ir/src/ops.rs", "runtime/src/format/program.rs", "src/gone.rs", "src/passes/"]);
    assert!(!Path::new("src/gone.rs").exists());
}

/// The modules of each runtime room, from the files (`runtime/src/ROOM/*.rs` but mod.rs).
fn runtime_rooms() -> Vec<(String, BTreeSet<String>)> {
    let mut rooms: Vec<(String, BTreeSet<String>)> = Vec::new();
    for m in modules(Path::new("runtime/src")).into_keys().filter(|m| m.len() == 2) {
        match rooms.iter_mut().find(|(r, _)| *r == m[0]) {
            Some((_, mods)) => {
                mods.insert(m[1].clone());
            }
            None => rooms.push((m[0].clone(), BTreeSet::from([m[1].clone()]))),
        }
    }
    assert!(rooms.len() >= 5, "{rooms:?}");
    rooms
}

/// The names in backticks of `text`.
fn quoted(text: &str) -> BTreeSet<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn the_runtime_docs_list_every_module_in_its_room() {
    let lib = std::fs::read_to_string("runtime/src/lib.rs").unwrap();
    let doc: String = lib.lines().filter_map(|l| l.strip_prefix("//!")).collect::<Vec<_>>().join("\n");
    let design = std::fs::read_to_string("docs/design.md").unwrap();
    for (room, mods) in runtime_rooms() {
        // lib.rs: "- `room` (the rooms it uses): `a`, `b`, ..." up to the next item.
        let item = doc.split("\n - ").find(|i| i.starts_with(&format!("`{room}` ")));
        let item = item.unwrap_or_else(|| panic!("runtime/src/lib.rs lists no room `{room}`"));
        let listed: BTreeSet<String> = quoted(item).into_iter().filter(|n| *n != room).collect();
        assert_eq!(listed, mods, "runtime/src/lib.rs's list of room {room} against runtime/src/{room}/");
        // design.md §1: the room's row of the table names each of its modules.
        let row = design
            .lines()
            .find(|l| l.starts_with(&format!("| `{room}` |")))
            .unwrap_or_else(|| panic!("docs/design.md §1 has no row for room {room}"));
        let missing: Vec<&String> = mods.iter().filter(|m| !quoted(row).contains(*m)).collect();
        assert!(missing.is_empty(), "docs/design.md §1's row of room {room} does not name {missing:?}");
    }
}

#[test]
fn the_module_map_has_every_module() {
    let dot = std::fs::read_to_string("docs/modules.dot").unwrap();
    let nodes: BTreeSet<&str> =
        dot.lines().filter(|l| l.contains("[label=")).filter_map(|l| l.trim().split('"').nth(1)).collect();
    let mut want = BTreeSet::new();
    for (krate, src) in
        [("meshc_ir", "ir/src"), ("meshc_runtime", "runtime/src"), ("meshc_onnx", "onnx/src"), ("meshc", "src")]
    {
        want.extend(
            modules(Path::new(src)).into_keys().filter(|m| !m.is_empty()).map(|m| format!("{krate}::{}", m.join("::"))),
        );
    }
    let missing: Vec<&String> = want.iter().filter(|m| !nodes.contains(m.as_str())).collect();
    let stale: Vec<&&str> = nodes.iter().filter(|n| !want.contains(**n)).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/modules.dot is out of date (`make modules`): missing {missing:?}, gone {stale:?}"
    );
}

/// The `meshc` commands of a markdown file's code blocks, a `\`-continued command joined
/// into one line, a leading `$ ` dropped; the lines a block prints are not commands.
fn doc_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut pending: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if !in_block {
            continue;
        }
        let line = line.trim_start_matches("$ ");
        let joined = match pending.take() {
            Some(p) => p + " " + line.trim(),
            None if line.starts_with("meshc ") => line.to_string(),
            None => continue,
        };
        match joined.strip_suffix('\\') {
            Some(head) => pending = Some(head.trim_end().to_string()),
            None => commands.push(joined),
        }
    }
    commands
}

/// docs/getting-started.md is a newcomer's first contact: every `meshc` command it shows
/// runs, in order, from a fresh directory holding the repository's testdata, with the
/// binary under test as `meshc`.
#[test]
fn every_getting_started_command_runs() {
    let doc = std::fs::read_to_string("docs/getting-started.md").unwrap();
    let commands = doc_commands(&doc);
    assert!(commands.len() >= 8, "{commands:?}");
    let dir = crate::common::scratch("getting-started");
    std::os::unix::fs::symlink(std::fs::canonicalize("testdata").unwrap(), dir.join("testdata")).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_meshc")).parent().unwrap().display().to_string();
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    for c in &commands {
        let out = std::process::Command::new("bash")
            .args(["-o", "pipefail", "-c", c])
            .current_dir(&dir)
            .env("PATH", &path)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{c}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The code blocks of a markdown file: (info string, text).
fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in text.lines() {
        match (line.strip_prefix("```"), open.take()) {
            (Some(info), None) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(block)) => blocks.push(block),
            (None, Some((info, mut body))) => {
                body.push_str(line);
                body.push('\n');
                open = Some((info, body));
            }
            (None, None) => {}
        }
    }
    blocks
}

/// docs/layout.md's examples hold: the field tour's spec is valid on the mlp graph
/// (placement and degraded devices included); its mesh, rules and layouts alone print the
/// layouts the page shows; the sub-axis example parses; the glob example is the spec file it
/// names; and every error line the page quotes is one meshc prints for a testdata spec.
#[test]
fn every_layout_md_example_holds() {
    let doc = std::fs::read_to_string("docs/layout.md").unwrap();
    let blocks = code_blocks(&doc);
    let json: Vec<&str> = blocks.iter().filter(|(info, _)| info == "json").map(|(_, b)| b.as_str()).collect();
    assert_eq!(json.len(), 3, "the page's JSON examples changed: teach this test the new ones");
    let dir = crate::common::scratch("layout-md");
    let tour = dir.join("tour.json");
    std::fs::write(&tour, json[0]).unwrap();
    let run = crate::common::meshc(&["check", "testdata/mlp/graph.json", "--layout", tour.to_str().unwrap()]);
    assert_eq!(run.status, Some(0), "the field tour's spec: {run:?}");
    let printed =
        crate::common::meshc(&["check", "testdata/mlp/graph.json", "--layout", "docs/examples/layout-spec.json"]);
    let (_, shown) = blocks.iter().find(|(_, b)| b.starts_with("mesh torus [2x4]")).unwrap();
    assert!(printed.stdout.ends_with(shown.as_str()), "check prints\n{}\nthe page shows\n{shown}", printed.stdout);
    let sub_axis = format!(
        r#"{{"format": "meshc-layout/1", "mesh": {{"shape": [8], "axes": ["model"]}}, "layouts": {{{}}}}}"#,
        json[1].trim()
    );
    meshc::layout::parse(&sub_axis, "sub-axis example").unwrap();
    let globs: serde_json::Value = serde_json::from_str(&format!("{{{}}}", json[2].trim())).unwrap();
    let file = "testdata/onnx/encoder/layouts/mp-2x2-patterns.json";
    assert!(doc.contains(file));
    let spec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(globs["layouts"], spec["layouts"], "the glob example is not {file}'s");
    let goldens: Vec<String> = std::fs::read_dir("golden/bad_layouts")
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    let quoted: Vec<&str> =
        blocks.iter().flat_map(|(_, b)| b.lines()).filter_map(|l| l.strip_prefix("error: spec.json")).collect();
    assert!(quoted.len() >= 10, "{quoted:?}");
    for q in quoted {
        assert!(
            goldens.iter().any(|g| g.contains(q)),
            "docs/layout.md quotes 'error: spec.json{q}', which no testdata spec gives"
        );
    }
}
