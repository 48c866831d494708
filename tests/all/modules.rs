//! The module graph of each crate has no cycle: a module (a file, or a folder's mod.rs)
//! that names another (`crate::x`, `super::x`, `use crate::{x, y}`, or a parent naming its
//! child `x::`) depends on it, and no chain of such uses comes back. Read from the sources
//! as text (comments and `#[cfg(test)] mod tests` left out: tests may reach anywhere), the
//! same reading `tools/module_map.py` draws.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every module of the crate under `src` and its source text (without tests and comments).
fn modules(src: &Path) -> BTreeMap<Module, String> {
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
            if !matches!(stem, "mod" | "lib" | "main") {
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

/// The paths after each `crate::`/`super::` (expanding `{a, b::c}` groups), with their root.
fn references(text: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut refs = Vec::new();
    for root in ["crate", "super"] {
        let key = format!("{root}::");
        for (at, _) in text.match_indices(&key) {
            if at > 0 && text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &text[at + key.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                for item in group.split('}').next().unwrap().split(',') {
                    let path: Vec<String> = item.trim().split("::").map(str::to_string).collect();
                    if !path[0].is_empty() && path[0] != "self" {
                        refs.push((if root == "crate" { "crate" } else { "super" }, path));
                    }
                }
            } else {
                let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
                let path: Vec<String> = rest[..end].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
                refs.push((if root == "crate" { "crate" } else { "super" }, path));
            }
        }
    }
    refs
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
