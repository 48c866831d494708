//! The graph data model: inputs, params, single-output nodes, outputs. Per-device programs
//! produced by later passes are ordinary graphs whose nodes carry a `device` annotation and
//! may use the communication ops, so every stage of the pipeline prints in one format.

use crate::attr::{Attr, Attrs};
use crate::attrs;
use crate::dtype::{DType, TensorType};
use crate::error::Loc;
use crate::ops::Op;
use crate::sym::symbol::Symbols;

/// Optional names of tensor dimensions (`["batch", null]`); `None` entries are unnamed.
pub type Dims = Vec<Option<String>>;

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Graph {
    pub name: String,
    pub inputs: Vec<Input>,
    pub params: Vec<Param>,
    pub nodes: Vec<Node>,
    pub outputs: Vec<Output>,
    /// The bounds the graph declares for its symbolic dims (`dim seq = 1..512`), which the
    /// command line's `--dim`s override; empty in every graph a pass builds, whose sizes are
    /// all values (docs/dynamic-shapes.md).
    pub symbols: Symbols,
}

#[derive(Clone, Debug)]
pub struct Input {
    pub name: String,
    pub ty: TensorType,
    pub dims: Option<Dims>,
    pub loc: Option<Loc>,
}

#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub ty: TensorType,
    pub dims: Option<Dims>,
    pub data: ParamData,
    pub loc: Option<Loc>,
}

/// Where a param's values come from. File paths are relative to the graph file.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamData {
    /// `.npy`, or `.safetensors` with `key` naming the tensor.
    File {
        path: String,
        key: Option<String>,
    },
    Init(Init),
    /// Inline values: a scalar or nested lists matching the shape.
    Value(Attr),
}

/// Seeded, deterministic initialisers; `docs/format.md` specifies the generator so numpy
/// (tools/gen_testdata.py) reproduces it bit for bit.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Normal { seed: u64, mean: f64, std: f64 },
    Uniform { seed: u64, low: f64, high: f64 },
    Zeros,
    Ones,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<String>,
    pub attrs: Attrs,
    /// Declared result type, checked against inference when present.
    pub dtype: Option<DType>,
    pub shape: Option<Vec<usize>>,
    pub dims: Option<Dims>,
    /// Linear device index, set by lowering for per-device programs.
    pub device: Option<u32>,
    pub loc: Option<Loc>,
}

#[derive(Clone, Debug)]
pub struct Output {
    pub name: String,
    pub loc: Option<Loc>,
}

// Source locations are not part of a graph's meaning: two graphs that differ only in where
// they were parsed from are equal (this is what makes JSON → text → JSON the identity).
impl PartialEq for Input {
    fn eq(&self, o: &Self) -> bool {
        (&self.name, &self.ty, &self.dims) == (&o.name, &o.ty, &o.dims)
    }
}

impl PartialEq for Param {
    fn eq(&self, o: &Self) -> bool {
        (&self.name, &self.ty, &self.dims, &self.data) == (&o.name, &o.ty, &o.dims, &o.data)
    }
}

impl PartialEq for Node {
    fn eq(&self, o: &Self) -> bool {
        (&self.name, self.op, &self.inputs, &self.attrs, self.dtype, &self.shape, &self.dims, self.device)
            == (&o.name, o.op, &o.inputs, &o.attrs, o.dtype, &o.shape, &o.dims, o.device)
    }
}

impl PartialEq for Output {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name
    }
}

impl Graph {
    /// The name of every tensor: inputs, params, then nodes, each in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &String> {
        let inputs = self.inputs.iter().map(|i| &i.name);
        inputs.chain(self.params.iter().map(|p| &p.name)).chain(self.nodes.iter().map(|n| &n.name))
    }

    /// The dim names the inputs carry, sorted, once each, for messages about a symbol that
    /// names none of them (`batch, embed`, or `none`).
    pub fn input_dim_names(&self) -> String {
        let mut named: Vec<&str> =
            self.inputs.iter().flat_map(|i| i.dims.iter().flatten().flatten()).map(String::as_str).collect();
        named.sort_unstable();
        named.dedup();
        if named.is_empty() {
            "none".to_string()
        } else {
            named.join(", ")
        }
    }
}

impl Node {
    pub fn new(name: impl Into<String>, op: Op, inputs: &[&str]) -> Node {
        Node {
            name: name.into(),
            op,
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            attrs: Attrs::new(),
            dtype: None,
            shape: None,
            dims: None,
            device: None,
            loc: None,
        }
    }

    pub fn with_attr(mut self, key: &str, value: Attr) -> Node {
        self.attrs.insert(key.to_string(), value);
        self
    }

    /// The device groups of a collective (all_reduce, all_gather, reduce_scatter, all_to_all).
    pub fn groups(&self) -> Result<Vec<Vec<i64>>, String> {
        Ok(match self.op {
            Op::AllReduce => attrs::AllReduce::try_of(self)?.groups,
            Op::AllGather => attrs::AllGather::try_of(self)?.groups,
            Op::ReduceScatter => attrs::ReduceScatter::try_of(self)?.groups,
            Op::AllToAll => attrs::AllToAll::try_of(self)?.groups,
            op => return Err(format!("{op} is not a collective")),
        })
    }

    /// The key that pairs a send with its recv.
    pub fn transfer_key(&self) -> String {
        match self.op {
            Op::Send => attrs::Send::of(self).key,
            Op::Recv => attrs::Recv::of(self).key,
            op => panic!("node '{}': {op} has no transfer key", self.name),
        }
    }
}

impl attrs::HasAttrs for Node {
    fn attrs(&self) -> &Attrs {
        &self.attrs
    }

    fn describe(&self) -> String {
        format!("node '{}' ({})", self.name, self.op)
    }
}

impl Output {
    pub fn new(name: impl Into<String>) -> Output {
        Output { name: name.into(), loc: None }
    }
}
