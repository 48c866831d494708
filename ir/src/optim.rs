//! Optimizer steps as graph ops: `train_step` turns a graph with a scalar loss into one
//! training step — the gradients (`grad`), then the update of every differentiated param
//! — with the optimizer's state (moments, step count) as zero-initialised params
//! `opt.m.P`, `opt.v.P`, `opt.step`. The step's outputs are the loss and `next.S` for
//! every state tensor S (the params and the optimizer state): a runner that feeds
//! `next.S` back as S runs the training loop.
//!
//! The updates (g = grad.P, t the step count after this step; values by position or by
//! name, `adamw:lr=1e-3,wd=0.01`, with optax's defaults):
//! - `sgd:LR`: P ← P - LR·g
//! - `momentum:LR,BETA`: m ← BETA·m + g; P ← P - LR·m
//! - `adamw:LR,B1=0.9,B2=0.999,EPS=1e-8,WD=1e-4`: m ← B1·m + (1-B1)·g; v ← B2·v + (1-B2)·g²;
//!   P ← P - LR·(m/(1-B1^t) / (√(v/(1-B2^t)) + EPS) + WD·P) (decoupled weight decay).

use crate::append::Appender;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::grad::{grad, grad_name};
use crate::graph::{Dims, Graph, Init, Output, Param, ParamData};
use crate::ops::Op;
use crate::verify::{self, Info};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    Sgd { lr: f32 },
    Momentum { lr: f32, beta: f32 },
    AdamW { lr: f32, b1: f32, b2: f32, eps: f32, wd: f32 },
}

/// An optimizer's values in order: name, and optax's default where it has one.
type Signature = &'static [(&'static str, Option<f32>)];

/// Each optimizer's values.
const SIGNATURES: &[(&str, Signature)] = &[
    ("sgd", &[("lr", None)]),
    ("momentum", &[("lr", None), ("beta", None)]),
    ("adamw", &[("lr", None), ("b1", Some(0.9)), ("b2", Some(0.999)), ("eps", Some(1e-8)), ("wd", Some(1e-4))]),
];

const FORMS: &str = "sgd:LR, momentum:LR,BETA or adamw:LR[,B1,B2,EPS,WD]; values by position or name=value";

impl Optimizer {
    /// Parses `KIND:VALUES`, the values by position, by name (`adamw:lr=1e-3,wd=0.01`) or
    /// positional then named; a value not given takes optax's default (adamw's b1=0.9,
    /// b2=0.999, eps=1e-8, wd=1e-4), and one without a default must be given.
    pub fn parse(spec: &str) -> Result<Optimizer> {
        let bad = |why: &str| Error::new(format!("--optimizer '{spec}': {why} ({FORMS})"));
        let (kind, args) = spec.split_once(':').ok_or_else(|| bad("no ':' after the optimizer's name"))?;
        let names = SIGNATURES.iter().map(|(k, _)| *k);
        let Some((_, sig)) = SIGNATURES.iter().find(|(k, _)| *k == kind) else {
            return Err(bad(&format!("unknown optimizer '{kind}'{}", crate::suggest::did_you_mean(kind, names))));
        };
        let mut values: Vec<Option<f32>> = vec![None; sig.len()];
        let mut named = false;
        for (k, arg) in args.split(',').enumerate() {
            let (slot, text) = match arg.split_once('=') {
                Some((name, text)) => {
                    named = true;
                    let name = name.trim();
                    let slot = sig.iter().position(|(n, _)| *n == name).ok_or_else(|| {
                        let known = sig.iter().map(|(n, _)| *n);
                        bad(&format!("{kind} has no value '{name}'{}", crate::suggest::did_you_mean(name, known)))
                    })?;
                    (slot, text)
                }
                None if named => return Err(bad(&format!("the value '{arg}' by position follows one by name"))),
                None if k >= sig.len() => {
                    let n = sig.len();
                    return Err(bad(&format!("{kind} takes at most {n} value{}", if n == 1 { "" } else { "s" })));
                }
                None => (k, arg),
            };
            let name = sig[slot].0;
            if values[slot].is_some() {
                return Err(bad(&format!("{name} is given twice")));
            }
            let v: f64 =
                text.trim().parse().map_err(|_| bad(&format!("{name} = '{}' is not a number", text.trim())))?;
            // A number beyond f32's range would train with an infinite rate.
            if !v.is_finite() {
                return Err(bad(&format!("{name} = {} is not a finite number", text.trim())));
            }
            if (v as f32).is_infinite() {
                return Err(bad(&format!("{name} = {} is beyond f32's range", text.trim())));
            }
            values[slot] = Some(v as f32);
        }
        let v: Vec<f32> = sig
            .iter()
            .zip(&values)
            .map(|((name, default), v)| v.or(*default).ok_or_else(|| bad(&format!("{kind} needs {name}"))))
            .collect::<Result<_>>()?;
        Ok(match kind {
            "sgd" => Optimizer::Sgd { lr: v[0] },
            "momentum" => Optimizer::Momentum { lr: v[0], beta: v[1] },
            _ => Optimizer::AdamW { lr: v[0], b1: v[1], b2: v[2], eps: v[3], wd: v[4] },
        })
    }
}

/// The name of the output holding state tensor `s` after the step.
pub fn next_name(s: &str) -> String {
    format!("next.{s}")
}

/// One training step of `g` (verified as `info`): the loss, and `next.S` for every state
/// tensor, in `state` order (returned alongside: the differentiated params, then the
/// optimizer state).
pub fn train_step(g: &Graph, info: &Info, loss: &str, wrt: &[String], opt: Optimizer) -> Result<(Graph, Vec<String>)> {
    let mut out = grad(g, info, loss, wrt)?;
    out.outputs = vec![Output::new(loss)];
    let mut b = Appender::new(out, "opt", "the training step");
    let mut state: Vec<String> = wrt.to_vec();
    let step = match opt {
        Optimizer::AdamW { .. } => {
            Some(state_param(&mut b, "opt.step", TensorType::new(DType::F32, vec![]), None, &mut state)?)
        }
        _ => None,
    };
    // The step count after this step, and the bias corrections 1 - B^t.
    let corrections = match (opt, &step) {
        (Optimizer::AdamW { b1, b2, .. }, Some(t)) => {
            let one = b.constant(1.0)?;
            let t1 = b.node("next.opt.step", Op::Add, &[t, &one])?;
            let mut c = Vec::new();
            for beta in [b1, b2] {
                let bc = b.constant(beta)?;
                let pw = b.tmp(Op::Pow, &[&bc, &t1])?;
                c.push(b.tmp(Op::Sub, &[&one, &pw])?);
            }
            Some((c[0].clone(), c[1].clone()))
        }
        _ => None,
    };
    for p in wrt {
        let param = b.g.params.iter().find(|q| &q.name == p);
        let (ty, dims) = param
            .map(|q| (q.ty.clone(), q.dims.clone()))
            .ok_or_else(|| Error::new(format!("'{p}' is not a param: only params can be trained")))?;
        if ty.dtype != DType::F32 {
            return Err(Error::new(format!("param '{p}' is {}: only f32 params can be trained", ty.dtype)));
        }
        let gp = grad_name(p);
        let delta = match opt {
            Optimizer::Sgd { .. } => gp.clone(),
            Optimizer::Momentum { beta, .. } => {
                let m = state_param(&mut b, &format!("opt.m.{p}"), ty.clone(), dims.clone(), &mut state)?;
                let bm = b.scale(&m, beta)?;
                b.node(&next_name(&m), Op::Add, &[&bm, &gp])?
            }
            Optimizer::AdamW { b1, b2, eps, wd, .. } => {
                let (c1, c2) = corrections.clone().expect("adamw has bias corrections");
                let m = state_param(&mut b, &format!("opt.m.{p}"), ty.clone(), dims.clone(), &mut state)?;
                let v = state_param(&mut b, &format!("opt.v.{p}"), ty.clone(), dims.clone(), &mut state)?;
                let bm = b.scale(&m, b1)?;
                let gm = b.scale(&gp, 1.0 - b1)?;
                let m1 = b.node(&next_name(&m), Op::Add, &[&bm, &gm])?;
                let bv = b.scale(&v, b2)?;
                let g2 = b.tmp(Op::Mul, &[&gp, &gp])?;
                let gv = b.scale(&g2, 1.0 - b2)?;
                let v1 = b.node(&next_name(&v), Op::Add, &[&bv, &gv])?;
                let mhat = b.tmp(Op::Div, &[&m1, &c1])?;
                let vhat = b.tmp(Op::Div, &[&v1, &c2])?;
                let sv = b.tmp(Op::Sqrt, &[&vhat])?;
                let e = b.constant(eps)?;
                let den = b.tmp(Op::Add, &[&sv, &e])?;
                let r = b.tmp(Op::Div, &[&mhat, &den])?;
                let decay = b.scale(p, wd)?;
                b.tmp(Op::Add, &[&r, &decay])?
            }
        };
        let lr = match opt {
            Optimizer::Sgd { lr } | Optimizer::Momentum { lr, .. } | Optimizer::AdamW { lr, .. } => lr,
        };
        let step = b.scale(&delta, lr)?;
        b.node(&next_name(p), Op::Sub, &[p, &step])?;
    }
    b.g.outputs.extend(state.iter().map(|s| Output::new(next_name(s))));
    verify::verify(&b.g).map_err(|e| Error::new(format!("the training step does not verify (a meshc bug): {e}")))?;
    Ok((b.g, state))
}

/// A zero-initialised state param (named like the param it belongs to), recorded in `state`.
fn state_param(
    b: &mut Appender,
    name: &str,
    ty: TensorType,
    dims: Option<Dims>,
    state: &mut Vec<String>,
) -> Result<String> {
    let name = b.fresh(name.to_string())?;
    b.g.params.push(Param { name: name.clone(), ty, dims, data: ParamData::Init(Init::Zeros), loc: None });
    state.push(name.clone());
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::Optimizer;

    #[test]
    fn specs_parse_or_say_why_not() {
        let adamw = |lr, wd| Optimizer::AdamW { lr, b1: 0.9, b2: 0.999, eps: 1e-8, wd };
        assert_eq!(Optimizer::parse("sgd:0.1").unwrap(), Optimizer::Sgd { lr: 0.1 });
        assert_eq!(Optimizer::parse("adamw:1e-3,0.9,0.999,1e-8,0.01").unwrap(), adamw(1e-3, 0.01));
        // optax's defaults, by position or by name, in any order.
        assert_eq!(Optimizer::parse("adamw:1e-3").unwrap(), adamw(1e-3, 1e-4));
        assert_eq!(Optimizer::parse("adamw:lr=1e-3").unwrap(), adamw(1e-3, 1e-4));
        assert_eq!(Optimizer::parse("adamw:wd=0.01, lr=1e-3").unwrap(), adamw(1e-3, 0.01));
        assert_eq!(Optimizer::parse("adamw:1e-3,wd=0.01").unwrap(), adamw(1e-3, 0.01));
        assert_eq!(Optimizer::parse("momentum:beta=0.5,lr=0.1").unwrap(), Optimizer::Momentum { lr: 0.1, beta: 0.5 });
        let err = |spec: &str| Optimizer::parse(spec).unwrap_err().msg;
        assert_eq!(
            err("momentum:0.1"),
            "--optimizer 'momentum:0.1': momentum needs beta (sgd:LR, momentum:LR,BETA or adamw:LR[,B1,B2,EPS,WD]; \
             values by position or name=value)"
        );
        assert!(err("adamw:wd=0.1").contains("adamw needs lr"));
        assert!(err("adam:1").contains("unknown optimizer 'adam' (did you mean 'adamw'?)"), "{}", err("adam:1"));
        assert!(err("adamw:lr=1,eps2=3").contains("adamw has no value 'eps2' (did you mean 'eps'?)"));
        assert!(err("adamw:lr=1,0.9").contains("by position follows one by name"));
        assert!(err("adamw:1,lr=2").contains("lr is given twice"));
        assert!(err("sgd:1,2").contains("sgd takes at most 1 value"));
        assert!(err("sgd:nan").contains("lr = nan is not a finite number"));
        assert!(err("sgd:1e40").contains("lr = 1e40 is beyond f32's range"));
        assert!(err("sgd:x").contains("lr = 'x' is not a number"));
        assert!(err("sgd").contains("no ':'"));
    }
}
