//! The built-in losses `--loss KIND:OUTPUT` attaches to a graph that has none, such as an
//! imported ONNX model: the loss ops are appended to the graph with one new input for the
//! truth (`target`, or `labels` for classification), named as onnxruntime's training
//! artifacts name them. Every loss is a mean over all elements (torch's default
//! reduction), computed from ops of the op set, so it differentiates, lays out and
//! compiles like any graph.
//!
//! - `mse:Y` — mean((Y − target)²)
//! - `l1:Y` — mean(|Y − target|)
//! - `bce_with_logits:Y` — mean(max(Y, 0) − Y·target + log(1 + exp(−|Y|))), the stable form
//! - `cross_entropy:Y` — Y logits with the classes along the last axis, `labels` i64 of Y's
//!   shape without it: mean(logsumexp(Y) − Y[labels]), logsumexp shifted by the row's max.
//!   A label outside 0..C selects no class and adds 0 to the sum (the mean still counts it).

use crate::append::Appender;
use crate::attr::Attr;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::graph::{Graph, Input, Node, Output, Param, ParamData};
use crate::ops::Op;
use crate::suggest::did_you_mean;
use crate::verify::Info;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mse,
    L1,
    BceWithLogits,
    CrossEntropy,
}

const KINDS: [(&str, Kind); 4] = [
    ("mse", Kind::Mse),
    ("l1", Kind::L1),
    ("bce_with_logits", Kind::BceWithLogits),
    ("cross_entropy", Kind::CrossEntropy),
];

/// The name the attached loss gets.
pub const LOSS: &str = "loss";

/// `--loss` as given: a scalar the graph computes, or a built-in loss of one of its tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    Named(String),
    Builtin { kind: Kind, of: String },
}

impl Spec {
    pub fn parse(s: &str) -> Result<Spec> {
        let Some((kind, of)) = s.split_once(':') else { return Ok(Spec::Named(s.to_string())) };
        let Some(&(_, kind)) = KINDS.iter().find(|(k, _)| *k == kind) else {
            let names: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
            return Err(Error::new(format!(
                "--loss {s}: no built-in loss '{kind}'{} (the built-in losses: {})",
                did_you_mean(kind, names.iter().copied()),
                names.join(", ")
            )));
        };
        if of.is_empty() {
            return Err(Error::new(format!("--loss {s}: name the tensor the loss is taken of (KIND:OUTPUT)")));
        }
        Ok(Spec::Builtin { kind, of: of.to_string() })
    }
}

/// `g` (verified as `info`) with the built-in loss `kind` of its tensor `of` attached: the
/// loss ops, the truth input and the output `loss` appended; and the loss's name.
pub fn attach(g: &Graph, info: &Info, kind: Kind, of: &str) -> Result<(Graph, String)> {
    let Some(ty) = info.types.get(of) else {
        return Err(Error::new(format!(
            "--loss: the graph has no tensor '{of}'{}",
            did_you_mean(of, info.types.keys().map(String::as_str))
        )));
    };
    if ty.dtype != DType::F32 {
        return Err(Error::new(format!("--loss: '{of}' is {}: a loss is taken of an f32 tensor", ty.dtype)));
    }
    let dims = info.dims.get(of).cloned();
    let mut b = Appender::new(g.clone(), LOSS, "the loss");
    let loss = match kind {
        Kind::Mse | Kind::L1 | Kind::BceWithLogits => {
            let t = truth(&mut b, "target", ty.clone(), dims)?;
            let per = match kind {
                Kind::Mse => {
                    let d = b.tmp(Op::Sub, &[of, &t])?;
                    b.tmp(Op::Mul, &[&d, &d])?
                }
                Kind::L1 => {
                    let d = b.tmp(Op::Sub, &[of, &t])?;
                    b.tmp(Op::Abs, &[&d])?
                }
                _ => {
                    let zero = b.constant(0.0)?;
                    let one = b.constant(1.0)?;
                    let pos = b.tmp(Op::Maximum, &[of, &zero])?;
                    let yt = b.tmp(Op::Mul, &[of, &t])?;
                    let a = b.tmp(Op::Abs, &[of])?;
                    let na = b.tmp(Op::Neg, &[&a])?;
                    let e = b.tmp(Op::Exp, &[&na])?;
                    let e1 = b.tmp(Op::Add, &[&one, &e])?;
                    let soft = b.tmp(Op::Log, &[&e1])?;
                    let lin = b.tmp(Op::Sub, &[&pos, &yt])?;
                    b.tmp(Op::Add, &[&lin, &soft])?
                }
            };
            reduce(&mut b, Some(LOSS), Op::ReduceMean, &per, None, false)?
        }
        Kind::CrossEntropy => {
            let Some((&classes, rows)) = ty.shape.split_last() else {
                return Err(Error::new(format!(
                    "--loss cross_entropy:{of}: '{of}' is a scalar; it must hold logits with the classes along its last axis"
                )));
            };
            let last = rows.len() as i64;
            let label_dims = dims.map(|d| d[..rows.len()].to_vec());
            let labels = truth(&mut b, "labels", TensorType::new(DType::I64, rows.to_vec()), label_dims)?;
            let max = reduce(&mut b, None, Op::ReduceMax, of, Some(last), true)?;
            let z = b.tmp(Op::Sub, &[of, &max])?;
            let e = b.tmp(Op::Exp, &[&z])?;
            let s = reduce(&mut b, None, Op::ReduceSum, &e, Some(last), true)?;
            let lse = b.tmp(Op::Log, &[&s])?;
            let logp = b.tmp(Op::Sub, &[&z, &lse])?;
            let mut column = rows.iter().map(|&n| n as i64).collect::<Vec<_>>();
            column.push(1);
            let name = b.tmp_name();
            let l = b.push(Node::new(name, Op::Reshape, &[&labels]).with_attr("shape", Attr::ints(&column)))?;
            let ids = b.fresh(format!("{LOSS}.classes"))?;
            b.g.params.push(Param {
                name: ids.clone(),
                ty: TensorType::new(DType::I64, vec![classes]),
                dims: None,
                data: ParamData::Value(Attr::ints(&(0..classes as i64).collect::<Vec<_>>())),
                loc: None,
            });
            let hit = b.tmp(Op::Equal, &[&l, &ids])?;
            let name = b.tmp_name();
            let onehot =
                b.push(Node::new(name, Op::Cast, &[&hit]).with_attr("to", Attr::Str(DType::F32.name().into())))?;
            let picked = b.tmp(Op::Mul, &[&logp, &onehot])?;
            let per = reduce(&mut b, None, Op::ReduceSum, &picked, Some(last), false)?;
            let m = reduce(&mut b, None, Op::ReduceMean, &per, None, false)?;
            b.node(LOSS, Op::Neg, &[&m])?
        }
    };
    b.g.outputs.push(Output::new(&loss));
    Ok((b.g, loss))
}

/// The input holding the truth the loss compares with.
fn truth(b: &mut Appender, name: &str, ty: TensorType, dims: Option<Vec<Option<String>>>) -> Result<String> {
    let name = b.fresh(name.to_string())?;
    b.g.inputs.push(Input { name: name.clone(), ty, dims, loc: None });
    Ok(name)
}

/// `op` over `axis` (every axis when none), named `name` or a temporary.
fn reduce(b: &mut Appender, name: Option<&str>, op: Op, x: &str, axis: Option<i64>, keepdims: bool) -> Result<String> {
    let name = name.map_or_else(|| b.tmp_name(), str::to_string);
    let mut n = Node::new(name, op, &[x]).with_attr("keepdims", Attr::Bool(keepdims));
    if let Some(a) = axis {
        n = n.with_attr("axes", Attr::ints(&[a]));
    }
    b.push(n)
}
