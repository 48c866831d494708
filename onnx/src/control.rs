//! Control flow: which branch of an `If` the import takes, and how many times a `Loop`'s
//! body is imported. The model walk (`import`) imports a subgraph's nodes in place of the
//! node that holds it, in the scope of the graph around it: a subgraph reads the values of
//! the enclosing graphs by name.
//!
//! Both are decided at import time, from what is known then — a constant, a fact of the
//! static shapes (`Shape` → `Equal` folds like any shape subgraph) or an input fixed with
//! `--const` (`sr == 16000` in a voice-activity model): an `If` imports its taken branch
//! alone, a `Loop` is unrolled. A condition or trip count computed at run time is refused in
//! one line: meshc does not select between compiled programs or loop over one yet.

use meshc_ir::{Data, Tensor};

use super::builder::Value;
use super::proto::{GraphProto, NodeProto};

type R<T> = std::result::Result<T, String>;

/// The op types the model walk imports itself, by their subgraphs, never through a
/// converter of `dispatch`.
pub const OPS: [&str; 3] = ["If", "Loop", "Scan"];

/// The most iterations a `Loop` is unrolled to: each is a copy of its body in the graph.
pub const MAX_TRIPS: i64 = 1024;

/// The most body nodes unrolling imports in one model, over every iteration of every loop:
/// loops nested three deep at `MAX_TRIPS` each would otherwise import a billion bodies.
/// An LSTM exported as a loop over 500 steps of a 40-node body is 20,000; a graph many
/// times this size would take minutes to compile, and is better refused at once.
pub const MAX_UNROLLED: usize = 1 << 16;

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

/// A `Loop` node's body.
pub fn body(n: &NodeProto) -> R<&GraphProto> {
    n.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some("body"))
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| "its body is not given".to_string())
}

/// The single value of `v`, known at import time, as an i64 (a bool as 0 or 1).
fn known(v: &Value, what: &str) -> R<i64> {
    let t = v.as_const().ok_or_else(|| {
        format!(
            "its {what} is computed at run time; meshc unrolls a Loop only when its trip count and condition \
             are known at import time (constants, facts of the shapes, or inputs fixed with --const)"
        )
    })?;
    match t.numel() {
        1 => Ok(t.data.iter_f64().next().unwrap_or(0.0) as i64),
        n => Err(format!("its {what} holds {n} values, a Loop takes one")),
    }
}

/// The iterations of a `Loop`: up to its trip count (input 0, when given) while its
/// condition (input 1, then what each iteration's body gives) holds. The body's condition
/// ends the loop even when input 1 is not given: ONNX's text calls it ignored then, but
/// onnxruntime and ONNX's reference evaluator end the loop on it, and so does meshc.
pub struct Trips {
    max: Option<i64>,
    cond: bool,
    done: i64,
}

impl Trips {
    pub fn new(args: &[Option<Value>]) -> R<Trips> {
        let max = args.first().and_then(Option::as_ref).map(|v| known(v, "trip count")).transpose()?;
        let cond = args.get(1).and_then(Option::as_ref).map(|v| known(v, "condition")).transpose()?;
        Ok(Trips { max, cond: cond.is_none_or(|c| c != 0), done: 0 })
    }

    /// The next iteration's number and condition (the body's first two inputs), or None
    /// when the loop has ended.
    pub fn next(&mut self) -> R<Option<[Value; 2]>> {
        if !self.cond || self.max.is_some_and(|m| self.done >= m) {
            return Ok(None);
        }
        if self.done >= MAX_TRIPS {
            return Err(format!("it runs more than {MAX_TRIPS} iterations, the most meshc unrolls"));
        }
        let number = Value::computed(Tensor::new(vec![], Data::I64(vec![self.done])));
        self.done += 1;
        Ok(Some([number, Value::computed(Tensor::new(vec![], Data::Bool(vec![true])))]))
    }

    /// The number of the iteration last begun.
    pub fn current(&self) -> i64 {
        self.done - 1
    }

    /// Takes the condition the body gave for the next iteration.
    pub fn set_condition(&mut self, v: &Value) -> R<()> {
        self.cond = known(v, "body's condition")? != 0;
        Ok(())
    }
}
