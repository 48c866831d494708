//! Appending nodes to a graph under names that must be new: the optimizer step
//! (`optim`) and the built-in losses (`loss`) add their ops this way, so a graph that
//! already uses one of the names is refused with the name rather than silently shadowed.

use crate::attr::Attr;
use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::graph::{Graph, Node, Param, ParamData};
use crate::ops::Op;

pub(crate) struct Appender {
    pub g: Graph,
    consts: usize,
    /// Temporaries are `PREFIX.tN`, constants `PREFIX_const.K`.
    prefix: &'static str,
    /// What needs the names, for the error: "the training step".
    purpose: &'static str,
}

impl Appender {
    pub fn new(g: Graph, prefix: &'static str, purpose: &'static str) -> Appender {
        Appender { g, consts: 0, prefix, purpose }
    }

    fn taken(&self, name: &str) -> bool {
        self.g.inputs.iter().any(|i| i.name == name)
            || self.g.params.iter().any(|p| p.name == name)
            || self.g.nodes.iter().any(|n| n.name == name)
    }

    pub fn fresh(&mut self, name: String) -> Result<String> {
        if self.taken(&name) {
            return Err(Error::new(format!("{} needs the name '{name}', which the graph already uses", self.purpose)));
        }
        Ok(name)
    }

    pub fn push(&mut self, node: Node) -> Result<String> {
        let name = self.fresh(node.name.clone())?;
        self.g.nodes.push(node);
        Ok(name)
    }

    pub fn node(&mut self, name: &str, op: Op, inputs: &[&str]) -> Result<String> {
        self.push(Node::new(name, op, inputs))
    }

    pub fn tmp_name(&self) -> String {
        format!("{}.t{}", self.prefix, self.g.nodes.len())
    }

    pub fn tmp(&mut self, op: Op, inputs: &[&str]) -> Result<String> {
        let name = self.tmp_name();
        self.node(&name, op, inputs)
    }

    pub fn constant(&mut self, v: f32) -> Result<String> {
        let name = self.fresh(format!("{}_const.{}", self.prefix, self.consts))?;
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

    pub fn scale(&mut self, x: &str, c: f32) -> Result<String> {
        let c = self.constant(c)?;
        self.tmp(Op::Mul, &[x, &c])
    }
}
