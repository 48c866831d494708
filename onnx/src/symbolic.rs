//! A model imported with ranged dims, checked against itself. The importer folds shape
//! arithmetic at the example sizes, but keeps which tensor dim each folded element is the
//! size of: a Slice that cuts a dim to such a size and a Range up to one are built from
//! that dim (`iota`), so they follow it at every size. Symbolic inference then reads the
//! sizes left in reshape, broadcast_to and slice attributes back as expressions, and pins a
//! symbol that meets a constant sized to it. What it cannot see is a *value* computed from a size — the
//! length of a sequence as a divisor (`ReduceSum(x) / Cast(Shape(x)[1])`), a position table
//! cut to it — folded into a constant that is right at the example and wrong at every other
//! size, with no shape to give it away. So the model is imported a second time at other
//! sizes the bounds and the run-time checks allow, and the first import written at those
//! sizes by its symbolic shapes must be that second import exactly (every node, attribute
//! and param value); a difference refuses the symbol, naming what differs. Each symbol is
//! moved alone (one more import per symbol), so the refusal names the one the model
//! computes with and the others stay symbolic once it is given a value.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use meshc_ir::error::shorten;
use meshc_ir::sym::{self, SymInfo, Symbols};
use meshc_ir::{text, Tensor};

use crate::Imported;

/// The model at `path` imported at `dims` (each ranged symbol at its example size) and
/// read over `symbols`, once its reading is the import at other sizes (above).
pub fn import(
    path: &Path,
    dims: &BTreeMap<String, usize>,
    symbols: &Symbols,
    shapes: &BTreeMap<String, Vec<usize>>,
    consts: &BTreeMap<String, Tensor>,
) -> anyhow::Result<(Imported, SymInfo)> {
    let imp = crate::import(path, dims, shapes, consts, true)?;
    let in_file = |e: String| anyhow::anyhow!("{}: {e}", path.display());
    let si = sym::infer_graph(&imp.graph, &imp.info, symbols).map_err(in_file)?;
    // One symbol at a time, so that a refusal names the symbol the model computes with.
    for (name, v) in other_sizes(&si) {
        let mut at = si.example.clone();
        at.insert(name.clone(), v);
        let mut other_dims = dims.clone();
        other_dims.insert(name.clone(), v as usize);
        let other = crate::import(path, &other_dims, shapes, consts, true)
            .map_err(|e| in_file(format!("imported at {name}={v} to check its symbolic reading: {}", e.msg)))?;
        let read = sym::specialise(&imp.graph, &si, &at).map_err(in_file)?;
        let what = graph_difference(&text::print(&read), &text::print(&other.graph))
            .or_else(|| param_difference(&imp.params, &other.params));
        if let Some(what) = what {
            return Err(in_file(format!(
                "imported at {name}={v}, {what}: the model computes it from {name} in a way meshc does not read symbolically; give {name} a value (--dim {name}=N; docs/dynamic-shapes.md)"
            )));
        }
    }
    Ok((imp, si))
}

/// Another size for each ranged symbol, the others at their examples: the next allowed
/// size after its example (or before it, at the upper bound) that no other symbol's
/// example takes, which the run-time checks allow. A symbol the checks pin to its example
/// has none: no other size of it runs.
fn other_sizes(si: &SymInfo) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for s in si.symbols.values().filter(|s| !s.is_fixed()) {
        let ex = si.example[&s.name];
        let free = |v: &i64| s.refuse(*v).is_none() && !si.example.values().any(|u| u == v);
        let above = (ex + 1..=s.hi.min(ex + 4096)).find(free);
        let Some(v) = above.or_else(|| (s.lo.max(ex - 4096)..ex).rev().find(free)) else { continue };
        let mut at = si.example.clone();
        at.insert(s.name.clone(), v);
        if si.checks.iter().all(|c| c.kind.holds(&at) != Some(false)) {
            out.push((s.name.clone(), v));
        }
    }
    out
}

/// The first line where the symbolic reading written at the other sizes (`read`) and the
/// import at them (`other`) differ, both shown.
fn graph_difference(read: &str, other: &str) -> Option<String> {
    let mut a = read.lines();
    let mut b = other.lines();
    loop {
        match (a.next(), b.next()) {
            (None, None) => return None,
            (x, y) if x == y => {}
            (x, y) => {
                let line = |l: Option<&str>| shorten(l.unwrap_or("(nothing)").trim()).into_owned();
                return Some(format!("the import has `{}` where the symbolic reading has `{}`", line(y), line(x)));
            }
        }
    }
}

/// The first param whose value differs between the two imports: a constant computed from a
/// size, whose shape did not show it.
fn param_difference(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> Option<String> {
    let mut names: Vec<&String> = a.keys().collect();
    names.sort();
    names.into_iter().find_map(|n| {
        let (x, y) = (&a[n], b.get(n)?);
        (x.shape != y.shape || x.to_le_bytes() != y.to_le_bytes()).then(|| {
            let first = |t: &Tensor| t.data.to_f64().first().map_or("nothing".to_string(), |v| v.to_string());
            format!(
                "param '{n}' holds {} (first {}) where the import at the example holds {} (first {})",
                y.ty(),
                first(y),
                x.ty(),
                first(x)
            )
        })
    })
}
