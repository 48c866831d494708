//! Control flow: which branches of an `If` the import takes, and how many times a `Loop`'s
//! body is imported. The model walk (`import`) imports a subgraph's nodes in place of the
//! node that holds it, in the scope of the graph around it: a subgraph reads the values of
//! the enclosing graphs by name.
//!
//! What is known at import time decides at import time — a constant, a fact of the static
//! shapes (`Shape` → `Equal` folds like any shape subgraph) or an input fixed with `--const`
//! (`sr == 16000` in a voice-activity model): an `If` imports its taken branch alone, a
//! `Loop` is unrolled to the iterations it runs. What is computed at run time is decided at
//! run time, with no program to choose between: an `If` imports both branches and selects
//! each output with a `where` on the condition (both are computed; the branches must give
//! outputs of the same types), and a `Loop` whose condition is computed at run time is
//! unrolled to its trip count, each iteration's carried values kept only while the
//! condition has held (a `where` again; a trip count computed at run time is refused, as is
//! a scan output whose length the condition would decide).

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

/// What an `If` imports.
pub enum Branches<'a> {
    /// The branch its condition, known at import time, takes.
    Taken(&'a GraphProto),
    /// Both, for a condition computed at run time.
    Both { then: &'a GraphProto, otherwise: &'a GraphProto },
}

/// The branches an `If` node with condition `cond` imports.
pub fn branches<'a>(n: &'a NodeProto, cond: Option<&Value>) -> R<Branches<'a>> {
    let cond = cond.ok_or("its condition (input 0) is not given")?;
    let branch = |name: &str| {
        n.attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| format!("its {name} is not given"))
    };
    let Some(t) = cond.as_const() else {
        return Ok(Branches::Both { then: branch("then_branch")?, otherwise: branch("else_branch")? });
    };
    if t.numel() != 1 {
        return Err(format!("its condition holds {} values, If takes one", t.numel()));
    }
    match t.data.iter_f64().next() != Some(0.0) {
        true => branch("then_branch").map(Branches::Taken),
        false => branch("else_branch").map(Branches::Taken),
    }
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
            "its {what} is computed at run time; meshc unrolls a Loop only to a trip count known at import time \
             (a constant, a fact of the shapes, or an input fixed with --const)"
        )
    })?;
    match t.numel() {
        1 => Ok(t.data.iter_f64().next().unwrap_or(0.0) as i64),
        n => Err(format!("its {what} holds {n} values, a Loop takes one")),
    }
}

/// A `Loop`'s condition: known at import time, or computed at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    Known(bool),
    AtRunTime,
}

impl Cond {
    /// The condition `v` is (one value, a bool), if it is given.
    pub fn of(v: &Value, what: &str) -> R<Cond> {
        match v.as_const() {
            None => Ok(Cond::AtRunTime),
            Some(_) => Ok(Cond::Known(known(v, what)? != 0)),
        }
    }
}

/// The iterations of a `Loop`: up to its trip count (input 0, when given) while its
/// condition (input 1, then what each iteration's body gives) holds. The body's condition
/// ends the loop even when input 1 is not given: ONNX's text calls it ignored then, but
/// onnxruntime and ONNX's reference evaluator end the loop on it, and so does meshc. Once
/// the condition is computed at run time, every iteration up to the trip count is
/// imported, and the import keeps what each one gives only while the condition holds.
pub struct Trips {
    max: Option<i64>,
    cond: Cond,
    done: i64,
}

impl Trips {
    pub fn new(args: &[Option<Value>]) -> R<Trips> {
        let max = args.first().and_then(Option::as_ref).map(|v| known(v, "trip count")).transpose()?;
        let cond = args.get(1).and_then(Option::as_ref).map(|v| Cond::of(v, "condition")).transpose()?;
        Ok(Trips { max, cond: cond.unwrap_or(Cond::Known(true)), done: 0 })
    }

    /// The condition as the loop starts.
    pub fn cond(&self) -> Cond {
        self.cond
    }

    /// The next iteration's number, or None when the loop has ended.
    pub fn next(&mut self) -> R<Option<Value>> {
        if self.cond == Cond::Known(false) || self.max.is_some_and(|m| self.done >= m) {
            return Ok(None);
        }
        if self.cond == Cond::AtRunTime && self.max.is_none() {
            return Err("its condition is computed at run time and it has no trip count; meshc unrolls a Loop \
                        whose end is decided at run time up to a trip count known at import time"
                .into());
        }
        if self.done >= MAX_TRIPS {
            return Err(format!("it runs more than {MAX_TRIPS} iterations, the most meshc unrolls"));
        }
        let number = Value::computed(Tensor::new(vec![], Data::I64(vec![self.done])));
        self.done += 1;
        Ok(Some(number))
    }

    /// The number of the iteration last begun.
    pub fn current(&self) -> i64 {
        self.done - 1
    }

    /// Takes the condition the body gave for the next iteration: a condition false at
    /// import time ends the loop, one computed at run time keeps it going to its trip count.
    pub fn set_condition(&mut self, c: Cond) {
        self.cond = match c {
            Cond::Known(true) => self.cond,
            c => c,
        };
    }
}
