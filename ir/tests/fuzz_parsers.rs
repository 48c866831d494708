//! Fuzzing the front end: random byte edits, insertions and truncations of every testdata
//! graph (and of each with bounds declared for its named dims), in both formats, must give a graph or an error — never a panic — through parsing
//! and verification alike.

use std::path::PathBuf;

use meshc_ir::sym::Symbol;
use meshc_ir::{json, load, text, verify};
use proptest::prelude::*;

fn sources() -> Vec<(bool, String)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata");
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    dirs.sort();
    for d in dirs {
        let g = d.join("graph.json");
        if let Ok((mut graph, _)) = load::load(&g) {
            out.push((true, json::print(&graph)));
            out.push((false, text::print(&graph)));
            // Declared bounds too (`dim batch = 1..1024:multiple_of=2`), for the graphs that
            // name input dims.
            let names =
                graph.inputs.iter().flat_map(|i| i.dims.iter().flatten().flatten()).cloned().collect::<Vec<_>>();
            for n in names {
                graph.symbols.insert(n.clone(), Symbol::new(&n, 1, 1024, 2).unwrap());
            }
            if !graph.symbols.is_empty() {
                out.push((true, json::print(&graph)));
                out.push((false, text::print(&graph)));
            }
        }
    }
    assert!(out.len() >= 10);
    out
}

/// Applies `edits` (position, byte, kind) to `src`: replace, insert, or truncate there.
fn mutate(src: &str, edits: &[(usize, u8, u8)]) -> String {
    let mut b = src.as_bytes().to_vec();
    for &(pos, byte, kind) in edits {
        if b.is_empty() {
            break;
        }
        let at = pos % b.len();
        match kind % 3 {
            0 => b[at] = byte,
            1 => b.insert(at, byte),
            _ => b.truncate(at),
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn mutated_graphs_never_panic(which in 0usize..64, edits in prop::collection::vec((0usize..1 << 20, any::<u8>(), any::<u8>()), 1..6)) {
        let all = sources();
        let (is_json, src) = &all[which % all.len()];
        let mutated = mutate(src, &edits);
        let parsed = if *is_json { json::parse(&mutated) } else { text::parse(&mutated) };
        if let Ok(g) = parsed {
            let _ = verify::verify(&g);
        }
    }
}
