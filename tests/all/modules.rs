//! The module graph of each crate has no cycle: a module (a file, or a folder's mod.rs)
//! that names another (`crate::x`, `super::x`, `use crate::{x, y}`, or a parent naming its
//! child `x::`) depends on it, and no chain of such uses comes back. Read from the sources
//! as text (comments and `#[cfg(test)] mod tests` left out: tests may reach anywhere), the
//! same reading `tools/module_map.py` draws.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub(crate) type Module = Vec<String>;

/// Every module of the crate under `src` and its source text (without tests and comments).
pub(crate) fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let rel: Vec<String> =
                p.strip_prefix(src).unwrap().iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if p.is_dir() {
                if rel[0] != "bin" {
                    dirs.push(p);
                }
                continue;
            }
            let Some(stem) = rel.last().unwrap().strip_suffix(".rs") else { continue };
            let mut m: Module = rel[..rel.len() - 1].to_vec();
            // A binary's main.rs beside the library's lib.rs is a crate root of its own.
            let bin_root = stem == "main" && dir.join("lib.rs").exists();
            if !matches!(stem, "mod" | "lib" | "main") || bin_root {
                m.push(stem.to_string());
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            let text = text.split("#[cfg(test)]\npub(crate) mod tests").next().unwrap();
            let text: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap()).collect();
            out.insert(m, text.join("\n"));
        }
    }
    out
}

/// Every path named after `root::` (`crate`, `super`, `meshc_runtime`), with `use` groups
/// expanded at any depth (`root::a::{b, c::{d, e}}` names `a::b`, `a::c::d` and `a::c::e`);
/// `self` in a group stands for the path before it.
fn paths_after(text: &str, root: &str) -> Vec<Vec<String>> {
    /// The paths of the use tree at the start of `s`, each after `prefix`.
    fn tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let s = s.trim_start();
        if let Some(group) = s.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => return tree(&group[start..i], prefix, out),
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        tree(&group[start..i], prefix, out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
        let (name, rest) = s.split_at(end);
        let mut path = prefix.to_vec();
        if !name.is_empty() && name != "self" {
            path.push(name.to_string());
        }
        match rest.strip_prefix("::") {
            Some(rest) => tree(rest, &path, out),
            None if path.len() > prefix.len() || name == "self" => out.push(path),
            None => {}
        }
    }
    let key = format!("{root}::");
    let mut out = Vec::new();
    for (at, _) in text.match_indices(&key) {
        if at > 0 && text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        tree(&text[at + key.len()..], &[], &mut out);
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The paths after each `crate::`/`super::`, with their root.
fn references(text: &str) -> Vec<(&'static str, Vec<String>)> {
    let crate_ = paths_after(text, "crate").into_iter().map(|p| ("crate", p));
    crate_.chain(paths_after(text, "super").into_iter().map(|p| ("super", p))).collect()
}

/// The longest prefix of `path` that is a module.
fn resolve(mods: &BTreeMap<Module, String>, path: &[String]) -> Option<Module> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| mods.contains_key(m))
}

fn edges(mods: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut out: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (me, text) in mods.iter().filter(|(m, _)| !m.is_empty()) {
        let mut to = BTreeSet::new();
        for (root, path) in references(text) {
            let full = if root == "crate" { path } else { [&me[..me.len() - 1], &path[..]].concat() };
            to.extend(resolve(mods, &full));
        }
        for child in mods.keys().filter(|c| c.len() == me.len() + 1 && c.starts_with(me)) {
            if text.contains(&format!("{}::", child.last().unwrap())) {
                to.insert(child.clone());
            }
        }
        to.remove(me);
        to.retain(|m| !m.is_empty());
        out.insert(me.clone(), to);
    }
    out
}

/// A cycle of the graph, if there is one, as a path that comes back to its start.
fn cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        u: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        state: &mut BTreeMap<Module, bool>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        state.insert(u.clone(), false);
        stack.push(u.clone());
        for v in edges.get(u).into_iter().flatten() {
            match state.get(v) {
                Some(false) => {
                    let start = stack.iter().position(|m| m == v).unwrap();
                    return Some([&stack[start..], &[v.clone()][..]].concat());
                }
                Some(true) => {}
                None => {
                    if let Some(c) = visit(v, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(u.clone(), true);
        None
    }
    let mut state = BTreeMap::new();
    for u in edges.keys() {
        if !state.contains_key(u) {
            if let Some(c) = visit(u, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_module_cycle() {
    for src in ["ir/src", "runtime/src", "onnx/src", "src"] {
        let mods = modules(Path::new(src));
        assert!(mods.len() > 5, "{src}: {} modules read", mods.len());
        let g = edges(&mods);
        if let Some(c) = cycle(&g) {
            let names: Vec<String> = c.iter().map(|m| m.join("::")).collect();
            panic!("{src}: module cycle {}", names.join(" -> "));
        }
    }
}

/// The check can fail: a graph with a cycle is found, and named.
#[test]
fn a_cycle_is_found() {
    let m = |s: &str| vec![s.to_string()];
    let mut mods = BTreeMap::new();
    mods.insert(m("a"), "use crate::b::f;".to_string());
    mods.insert(m("b"), "fn g() { crate::c::h() }".to_string());
    mods.insert(m("c"), "use crate::{a, b};".to_string());
    mods.insert(vec![], String::new());
    let c = cycle(&edges(&mods)).expect("a cycle");
    assert_eq!(c.first(), c.last());
    mods.insert(m("c"), "fn h() {}".to_string());
    assert_eq!(cycle(&edges(&mods)), None);
}

/// The runtime's rooms, bottom up, each with exactly the rooms it uses (docs/design.md §1).
/// `format` is the contract the compiler writes and uses nothing; the kernels and the
/// communication below the runner know the format only; the tools drive runners.
const ROOMS: &[(&str, &[&str])] = &[
    ("format", &[]),
    ("kernels", &["format"]),
    ("comm", &["format"]),
    ("exec", &["format", "kernels", "comm"]),
    ("api", &["format", "exec"]),
    ("tools", &["format", "comm", "exec", "api"]),
];

/// What any compiler module may import from the runtime: the format, the pure models of
/// `comm` (the link/traffic model, the fault-tolerant planner), and what code generation
/// and the passes share with the kernels (shape planning, the f32 and 8-bit panel layouts,
/// GELU/exp constants, when the library GEMM is faster, attention's key limit).
const COMPILER_ANYWHERE: &[&str] = &[
    "format::*",
    "comm::traffic",
    "comm::degraded",
    "kernels::matmul_shape",
    "kernels::panels",
    "kernels::igemm",
    "kernels::vmath",
    "kernels::library",
    "kernels::attention",
];

/// The compiler's driver modules (paths under src/), which also load and run artifacts and
/// write files: they may import `exec` and `tools` as well.
const COMPILER_DRIVERS: &[&str] =
    &["main.rs", "command.rs", "driver.rs", "compile.rs", "train.rs", "pipeline.rs", "artifact.rs"];

fn allowed(rules: &[&str], room: &str, module: &str) -> bool {
    rules.iter().any(|r| r.split_once("::").is_some_and(|(rr, rm)| rr == room && (rm == "*" || rm == module)))
}

/// Per (room, room it uses): the modules that use it and what they name, as
/// "kernels::library -> format::mask". Every module must sit in a room.
fn room_edges(mods: &BTreeMap<Module, String>) -> Result<BTreeMap<(String, String), Vec<String>>, String> {
    let rooms: Vec<&str> = ROOMS.iter().map(|r| r.0).collect();
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (me, text) in mods.iter().filter(|(m, _)| !m.is_empty()) {
        if !rooms.contains(&me[0].as_str()) {
            return Err(format!("runtime module {} is in no room ({})", me.join("::"), rooms.join(", ")));
        }
        for path in paths_after(text, "crate") {
            if path[0] != me[0] && rooms.contains(&path[0].as_str()) {
                let what = format!("{} -> {}", me.join("::"), path[..2.min(path.len())].join("::"));
                out.entry((me[0].clone(), path[0].clone())).or_default().push(what);
            }
        }
    }
    out.values_mut().for_each(|v| v.dedup());
    Ok(out)
}

/// What is wrong with the runtime's room edges against `ROOMS`: an edge it does not list,
/// or one it lists that nothing uses any more (the table and design.md §1 are the truth).
fn room_violations(mods: &BTreeMap<Module, String>) -> Vec<String> {
    let edges = match room_edges(mods) {
        Ok(e) => e,
        Err(e) => return vec![e],
    };
    let pinned: BTreeSet<(String, String)> =
        ROOMS.iter().flat_map(|(r, to)| to.iter().map(|t| (r.to_string(), t.to_string()))).collect();
    let mut bad: Vec<String> = (edges.iter().filter(|(e, _)| !pinned.contains(*e)))
        .map(|((a, b), uses)| format!("room {a} may not use room {b}: {}", uses.join(", ")))
        .collect();
    bad.extend(
        (pinned.iter().filter(|e| !edges.contains_key(*e)))
            .map(|(a, b)| format!("room {a} no longer uses room {b}: drop it from ROOMS and docs/design.md §1")),
    );
    bad
}

/// What the compiler's modules import from the runtime against the rules above, as
/// "src/passes/x.rs imports exec::runner".
fn compiler_violations(mods: &BTreeMap<Module, String>) -> Vec<String> {
    let mut bad = Vec::new();
    for (me, text) in mods {
        let file = match me.is_empty() {
            true => "lib.rs".to_string(),
            false => format!("{}.rs", me.join("/")),
        };
        // A folder's module is its mod.rs.
        let file = if Path::new("src").join(&file).exists() { file } else { format!("{}/mod.rs", me.join("/")) };
        let driver = COMPILER_DRIVERS.contains(&file.as_str());
        for path in paths_after(text, "meshc_runtime") {
            let (room, module) = (path[0].as_str(), path.get(1).map_or("*", String::as_str));
            let ok = allowed(COMPILER_ANYWHERE, room, module) || (driver && matches!(room, "exec" | "tools"));
            if !ok {
                bad.push(format!("src/{file} imports {}", path[..2.min(path.len())].join("::")));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

#[test]
fn runtime_rooms_use_only_the_rooms_pinned() {
    let mods = modules(Path::new("runtime/src"));
    let bad = room_violations(&mods);
    assert!(bad.is_empty(), "runtime/src:\n{}", bad.join("\n"));
}

#[test]
fn the_compiler_imports_from_the_runtime_only_what_is_pinned() {
    let mods = modules(Path::new("src"));
    assert!(mods.len() > 5);
    let bad = compiler_violations(&mods);
    assert!(bad.is_empty(), "the compiler reaches into the runtime where it may not:\n{}", bad.join("\n"));
}

/// The ONNX frontend (onnx/, crate meshc-onnx) takes one thing from the runtime: the
/// all-or-nothing writer of `meshc import`'s files.
#[test]
fn the_onnx_frontend_imports_only_the_output_writer() {
    let mods = modules(Path::new("onnx/src"));
    assert!(mods.len() > 5);
    let uses: BTreeSet<String> =
        mods.values().flat_map(|text| paths_after(text, "meshc_runtime")).map(|p| p.join("::")).collect();
    let bad: Vec<&String> = uses.iter().filter(|p| !p.starts_with("tools::output")).collect();
    assert!(bad.is_empty(), "meshc-onnx reaches into the runtime: {bad:?}");
}

/// The checks can fail: a format module that names the runner, an edge the table lists
/// but nothing uses, a module outside the rooms, a compiler pass that runs artifacts.
#[test]
fn forbidden_runtime_uses_are_found() {
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Module>();
    let mut mods = BTreeMap::new();
    for (room, to) in ROOMS {
        let uses: Vec<String> = to.iter().map(|t| format!("use crate::{t}::x::Y;")).collect();
        mods.insert(m(&format!("{room}::x")), uses.join("\n"));
    }
    assert_eq!(room_violations(&mods), Vec::<String>::new());
    mods.insert(m("format::mesh"), "fn f() { crate::exec::{runner::Loaded, io}::g() }".to_string());
    assert_eq!(
        room_violations(&mods),
        ["room format may not use room exec: format::mesh -> exec::runner, format::mesh -> exec::io"]
    );
    mods.remove(&m("format::mesh"));
    mods.insert(m("tools::x"), "use crate::{format::x::A, exec::x::B, api::x::C};".to_string());
    assert_eq!(
        room_violations(&mods),
        ["room tools no longer uses room comm: drop it from ROOMS and docs/design.md §1"]
    );
    mods.insert(m("flat"), String::new());
    assert!(room_violations(&mods)[0].starts_with("runtime module flat is in no room"));

    let mut src = BTreeMap::new();
    src.insert(m("passes::streams"), "use meshc_runtime::format::order::Order;".to_string());
    src.insert(m("driver"), "use meshc_runtime::tools::output::Outputs;".to_string());
    src.insert(m("main"), "use meshc_runtime::exec::{loader::load_artifact, runner::Loaded};".to_string());
    assert_eq!(compiler_violations(&src), Vec::<String>::new());
    src.insert(m("passes::streams"), "use meshc_runtime::{format::order::Order, tools::inspect::step_note};".into());
    src.insert(m("attribution"), "use meshc_runtime::comm::{traffic, fabric::Fabric};".to_string());
    assert_eq!(
        compiler_violations(&src),
        ["src/attribution.rs imports comm::fabric", "src/passes/streams.rs imports tools::inspect"]
    );
}
