//! Control flow: which branch of an `If` the import takes. The model walk (`import`) imports
//! the taken branch's nodes in place of the `If` node, in the scope of the graph around it:
//! a branch reads the values of the enclosing graphs by name.
//!
//! An `If` is folded when its condition is known at import time — a constant, a fact of the
//! static shapes (`Shape` → `Equal` folds like any shape subgraph) or an input fixed with
//! `--const` (`sr == 16000` in a voice-activity model). A condition computed at run time is
//! refused in one line: meshc does not select between compiled programs yet.

use super::builder::Value;
use super::proto::{GraphProto, NodeProto};

type R<T> = std::result::Result<T, String>;

/// The op types the model walk imports itself, by their subgraphs, never through a
/// converter of `dispatch`.
pub const OPS: [&str; 1] = ["If"];

/// The branch (`then_branch` or `else_branch`) an `If` node with condition `cond` takes.
pub fn taken<'a>(n: &'a NodeProto, cond: Option<&Value>) -> R<&'a GraphProto> {
    let cond = cond.ok_or("its condition (input 0) is not given")?;
    let Some(t) = cond.as_const() else {
        return Err("its condition is computed at run time; meshc imports If only when the condition is known \
                    at import time (a constant, a fact of the shapes, or an input fixed with --const)"
            .into());
    };
    if t.numel() != 1 {
        return Err(format!("its condition holds {} values, If takes one", t.numel()));
    }
    let branch = match t.data.iter_f64().next() != Some(0.0) {
        true => "then_branch",
        false => "else_branch",
    };
    n.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(branch))
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| format!("its {branch} is not given"))
}
