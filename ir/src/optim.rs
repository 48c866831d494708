//! Optimizer steps as graph ops: `train_step` turns a graph with a scalar loss into one
//! training step — the gradients (`grad`), then the update of every differentiated param
//! — with the optimizer's state (moments, step count) as zero-initialised params
//! `opt.m.P`, `opt.v.P`, `opt.step`. The step's outputs are the loss and `next.S` for
//! every state tensor S (the params and the optimizer state): a runner that feeds
//! `next.S` back as S runs the training loop.
//!
//! The updates (g = grad.P, t the step count after this step):
//! - `sgd:LR`: P ← P - LR·g
//! - `momentum:LR,BETA`: m ← BETA·m + g; P ← P - LR·m
//! - `adamw:LR,B1,B2,EPS,WD`: m ← B1·m + (1-B1)·g; v ← B2·v + (1-B2)·g²;
//!   P ← P - LR·(m/(1-B1^t) / (√(v/(1-B2^t)) + EPS) + WD·P) (decoupled weight decay).

use crate::attr::Attr;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::grad::{grad, grad_name};
use crate::graph::{Dims, Graph, Init, Node, Output, Param, ParamData};
use crate::ops::Op;
use crate::verify::{self, Info};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    Sgd { lr: f32 },
    Momentum { lr: f32, beta: f32 },
    AdamW { lr: f32, b1: f32, b2: f32, eps: f32, wd: f32 },
}

impl Optimizer {
    /// Parses `sgd:LR`, `momentum:LR,BETA` or `adamw:LR,B1,B2,EPS,WD`.
    pub fn parse(spec: &str) -> Result<Optimizer> {
        let bad = |why: &str| {
            Error::new(format!("--optimizer '{spec}': {why} (sgd:LR, momentum:LR,BETA or adamw:LR,B1,B2,EPS,WD)"))
        };
        let (kind, args) = spec.split_once(':').ok_or_else(|| bad("no ':' after the optimizer's name"))?;
        let v: Vec<f32> = args
            .split(',')
            .map(|a| match a.trim().parse::<f64>() {
                // A number beyond f32's range would train with an infinite rate.
                Ok(x) if x.is_finite() && (x as f32).is_finite() => Ok(x as f32),
                Ok(x) if x.is_finite() => Err(bad(&format!("{} is beyond f32's range", a.trim()))),
                _ => Err(bad(&format!("'{}' is not a finite number", a.trim()))),
            })
            .collect::<Result<_>>()?;
        let want = match kind {
            "sgd" => 1,
            "momentum" => 2,
            "adamw" => 5,
            _ => return Err(bad(&format!("unknown optimizer '{kind}'"))),
        };
        if v.len() != want {
            return Err(bad(&format!(
                "{kind} takes {want} value{}, got {}",
                if want == 1 { "" } else { "s" },
                v.len()
            )));
        }
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
    let mut b = Updates { g: out, consts: 0 };
    let mut state: Vec<String> = wrt.to_vec();
    let step = match opt {
        Optimizer::AdamW { .. } => Some(b.state("opt.step", TensorType::new(DType::F32, vec![]), None, &mut state)?),
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
                let m = b.state(&format!("opt.m.{p}"), ty.clone(), dims.clone(), &mut state)?;
                let bm = b.scale(&m, beta)?;
                b.node(&next_name(&m), Op::Add, &[&bm, &gp])?
            }
            Optimizer::AdamW { b1, b2, eps, wd, .. } => {
                let (c1, c2) = corrections.clone().expect("adamw has bias corrections");
                let m = b.state(&format!("opt.m.{p}"), ty.clone(), dims.clone(), &mut state)?;
                let v = b.state(&format!("opt.v.{p}"), ty.clone(), dims.clone(), &mut state)?;
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

struct Updates {
    g: Graph,
    consts: usize,
}

impl Updates {
    fn taken(&self, name: &str) -> bool {
        self.g.inputs.iter().any(|i| i.name == name)
            || self.g.params.iter().any(|p| p.name == name)
            || self.g.nodes.iter().any(|n| n.name == name)
    }

    fn fresh(&mut self, name: String) -> Result<String> {
        if self.taken(&name) {
            return Err(Error::new(format!("the training step needs the name '{name}', which the graph already uses")));
        }
        Ok(name)
    }

    fn node(&mut self, name: &str, op: Op, inputs: &[&str]) -> Result<String> {
        let name = self.fresh(name.to_string())?;
        self.g.nodes.push(Node::new(&name, op, inputs));
        Ok(name)
    }

    fn tmp(&mut self, op: Op, inputs: &[&str]) -> Result<String> {
        let name = format!("opt.t{}", self.g.nodes.len());
        self.node(&name, op, inputs)
    }

    fn constant(&mut self, v: f32) -> Result<String> {
        let name = self.fresh(format!("opt_const.{}", self.consts))?;
        self.consts += 1;
        self.g.params.push(Param {
            name: name.clone(),
            ty: TensorType::new(DType::F32, vec![]),
            dims: None,
            data: ParamData::Value(Attr::Float(v as f64)),
            loc: None,
        });
        Ok(name)
    }

    fn scale(&mut self, x: &str, c: f32) -> Result<String> {
        let c = self.constant(c)?;
        self.tmp(Op::Mul, &[x, &c])
    }

    /// A zero-initialised state param (named like the param it belongs to), recorded in `state`.
    fn state(&mut self, name: &str, ty: TensorType, dims: Option<Dims>, state: &mut Vec<String>) -> Result<String> {
        let name = self.fresh(name.to_string())?;
        self.g.params.push(Param { name: name.clone(), ty, dims, data: ParamData::Init(Init::Zeros), loc: None });
        state.push(name.clone());
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::Optimizer;

    #[test]
    fn specs_parse_or_say_why_not() {
        assert_eq!(Optimizer::parse("sgd:0.1").unwrap(), Optimizer::Sgd { lr: 0.1 });
        assert_eq!(
            Optimizer::parse("adamw:1e-3,0.9,0.999,1e-8,0.01").unwrap(),
            Optimizer::AdamW { lr: 1e-3, b1: 0.9, b2: 0.999, eps: 1e-8, wd: 0.01 }
        );
        assert_eq!(
            Optimizer::parse("momentum:0.1").unwrap_err().msg,
            "--optimizer 'momentum:0.1': momentum takes 2 values, got 1 (sgd:LR, momentum:LR,BETA or adamw:LR,B1,B2,EPS,WD)"
        );
        assert!(Optimizer::parse("adam:1").unwrap_err().msg.contains("unknown optimizer 'adam'"));
        assert!(Optimizer::parse("sgd:nan").unwrap_err().msg.contains("'nan' is not a finite number"));
        assert!(Optimizer::parse("sgd:1e40").unwrap_err().msg.contains("1e40 is beyond f32's range"));
        assert!(Optimizer::parse("sgd").unwrap_err().msg.contains("no ':'"));
    }
}
