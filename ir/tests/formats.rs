//! Every testdata graph verifies, and JSON → text → JSON is the identity on it: the graph
//! read back from the text form equals the original, and prints the same canonical JSON.

use std::path::PathBuf;

use meshc_ir::{json, load, text, verify};

fn graphs() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testdata");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path().join("graph.json"))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    assert!(v.len() >= 5, "expected the five testdata graphs, found {v:?}");
    v
}

#[test]
fn json_text_json_is_identity_on_testdata() {
    for path in graphs() {
        let (g, _) = load::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let printed = text::print(&g);
        let back =
            text::parse(&printed).unwrap_or_else(|e| panic!("{}: text does not parse back: {e}", path.display()));
        assert_eq!(back, g, "{}", path.display());
        assert_eq!(json::print(&back), json::print(&g), "{}", path.display());
        // The text form verifies too, and a canonical JSON print is a fixed point.
        verify::verify(&back).unwrap();
        assert_eq!(json::parse(&json::print(&g)).unwrap(), g);
    }
}
