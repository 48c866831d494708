//! Reading a graph file of either format: `.json` is `meshc-graph/1`, anything else the
//! text format (`-`, standard input, is JSON when it starts with `{`). Parses, verifies, and stamps every error with the file's name.

use std::path::Path;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::verify::{self, Info};
use crate::{file, json, text};

pub fn is_json(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Parses a graph file without verifying it.
pub fn parse_file(path: &Path) -> Result<Graph> {
    let file = path.display().to_string();
    let src = file::read(path, file::MAX_TEXT_BYTES, "graph").map_err(|e| e.in_file(&file))?;
    let src = String::from_utf8(src).map_err(|_| Error::new("graph file is not UTF-8 text").in_file(&file))?;
    let json_text = match file::is_stdio(path) {
        true => src.trim_start().starts_with('{'),
        false => is_json(path),
    };
    let parsed = if json_text { json::parse(&src) } else { text::parse(&src) };
    parsed.map_err(|e| e.in_file(&file))
}

/// Parses and verifies a graph file.
pub fn load(path: &Path) -> Result<(Graph, Info)> {
    let g = parse_file(path)?;
    let info = verify::verify(&g).map_err(|e| e.in_file(path.display().to_string()))?;
    Ok((g, info))
}
