//! Building the meshc graph of an import: values are either known at import time
//! (`Value::Const`) or computed at run time (`Value::Tensor`); a meshc node all of whose
//! operands are known is evaluated with the reference interpreter instead of being emitted,
//! which is how shape subgraphs fold. Weights are the exception: a node on a weight stays a
//! node, so the weight stays a param under its ONNX name (layout specs name it; compile's
//! fold pass folds its transposes and casts anyway). Names are sanitised and unique.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use meshc_ir::infer::{infer, Operand};
use meshc_ir::interp::eval_node;
use meshc_ir::{Attr, DType, Data, Graph, Node, Op, Param, ParamData, Tensor, TensorType};

type R<T> = std::result::Result<T, String>;

/// The meshc tensor and the axis whose size an element of a const is (`Value::Const::sizes`).
pub type SizeOf = (String, usize);

#[derive(Clone)]
pub enum Value {
    Const {
        t: Rc<Tensor>,
        /// In an import with ranged dims (`Builder::sizes`), for each element of a const
        /// computed from shapes, the tensor dim it is the size of, if it is one: a
        /// converter that takes a length from it can then build that length from the
        /// tensor (`iota`) instead of the number, which holds at the example sizes only.
        sizes: Option<Rc<[Option<SizeOf>]>>,
        /// The ONNX name of an initializer or Constant it is, which names its param.
        source: Option<String>,
        /// A float initializer (or Constant) of more than one element: kept as a param.
        weight: bool,
        /// The half type an initializer was stored in (`t` holds it widened): its param
        /// keeps the half bytes.
        half: Option<DType>,
    },
    /// A graph input or node of the meshc graph, by its meshc name.
    Tensor(String),
}

impl Value {
    pub fn computed(t: Tensor) -> Value {
        Value::Const { t: Rc::new(t), sizes: None, source: None, weight: false, half: None }
    }

    /// A const computed from shapes whose elements are the sizes `sizes` name.
    pub fn sized(t: Tensor, sizes: Vec<Option<SizeOf>>) -> Value {
        let sizes = sizes.iter().any(Option::is_some).then(|| sizes.into());
        Value::Const { t: Rc::new(t), sizes, source: None, weight: false, half: None }
    }

    /// Which tensor dim each element is the size of (`None`: not known to be any).
    pub fn sizes(&self) -> Option<&[Option<SizeOf>]> {
        match self {
            Value::Const { sizes, .. } => sizes.as_deref(),
            Value::Tensor(_) => None,
        }
    }

    /// An initializer or Constant named `source`.
    pub fn named(t: Tensor, source: &str) -> Value {
        Value::stored(t, source, DType::F32)
    }

    /// An initializer named `source` stored as `dtype` (a half is widened in `t`).
    pub fn stored(t: Tensor, source: &str, dtype: DType) -> Value {
        let weight = t.dtype() == DType::F32 && t.numel() > 1;
        let half = Some(dtype).filter(|d| d.is_half());
        Value::Const { t: Rc::new(t), sizes: None, source: Some(source.to_string()), weight, half }
    }

    pub fn as_const(&self) -> Option<&Tensor> {
        match self {
            Value::Const { t, .. } => Some(t),
            Value::Tensor(_) => None,
        }
    }
}

/// The most nodes one model imports into. What the importer unrolls — loops, scans,
/// recurrent layers, and those nested in each other — multiplies a small file into many
/// nodes; each limit of its own (trips, steps, body nodes) bounds one form, and this bounds
/// them all together. A bidirectional LSTM of 1024 steps is about 51,000 nodes; BERT-large
/// a few thousand. (Reaching it costs about 0.5 s; the file fuzzer, under AddressSanitizer
/// and 10 s an input, found twice this too slow.)
pub const MAX_NODES: usize = 1 << 16;

/// A const turned into a param: its value, the half type it is stored in, and the name it
/// is read by.
type ParamOf = (Rc<Tensor>, Option<DType>, String);

/// A hash of `t`'s dtype, shape and bytes: consts are the same when their bits are (`==`
/// on floats makes 0.0 equal -0.0 and a NaN unequal to itself).
fn bits_hash(t: &Tensor) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (t.dtype().name(), &t.shape, t.to_le_bytes()).hash(&mut h);
    h.finish()
}

/// What `Value::Tensor` names resolve to, and what the import has produced so far.
#[derive(Default)]
pub struct Builder {
    pub graph: Graph,
    /// The values of the graph's params, by param name.
    pub params: HashMap<String, Tensor>,
    pub(crate) types: HashMap<String, TensorType>,
    used: HashSet<String>,
    /// The graph's output names, which nodes named after ONNX nodes must leave to them.
    reserved: HashSet<String>,
    /// Consts already turned into params, by ONNX source name and a hash of their bits
    /// (`bits_hash`): each value under that key and the name it is read by. A name can
    /// stand for several values — ONNX requires unique value names but not unique node
    /// names, and a Constant is named after its node (the Constants of silero's OpenVINO
    /// export are all `F0::anon`) — so a const is the param of an earlier one only when it
    /// holds the same value (a Constant of a loop body, imported once per iteration, is
    /// one param).
    param_of: HashMap<(String, u64), Vec<ParamOf>>,
    /// The new name of each node `output` renamed, by its old one.
    renamed: HashMap<String, String>,
    /// The suffix `fresh` last gave each base name, where its search starts next: every
    /// smaller one is taken (a name freed again, `forget`, drops its base's entry). From 2 up
    /// every time, a loop body unrolled n times cost n² lookups.
    suffix: HashMap<String, usize>,
    /// An import with ranged dims: a `Shape` of a computed tensor records which dims its
    /// elements are (`Value::Const::sizes`), and folding keeps track of them.
    pub sizes: bool,
    /// The nodes of loop bodies imported so far, every unrolled iteration counted
    /// (`control::MAX_UNROLLED` bounds them over the whole model, nested loops included).
    pub unrolled: usize,
}

/// `name` as a meshc name: ONNX names are any string (`/encoder/layer.0/MatMul_output_0`,
/// `onnx::MatMul_12`), meshc's become file names (`run --output-dir`) and layout spec keys,
/// so everything but letters, digits, `_` and `.` becomes `_`, and a leading `_` is dropped.
pub fn sanitise(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
    let s = s.trim_start_matches(['_', '.']);
    match s.chars().next() {
        None => "t".to_string(),
        Some(c) if c.is_ascii_digit() => format!("t{s}"),
        Some(_) => s.to_string(),
    }
}

impl Builder {
    /// A fresh meshc name for ONNX name `hint`: sanitised, with `_2`, `_3`... if taken.
    pub fn fresh(&mut self, hint: &str) -> String {
        let base = sanitise(hint);
        let taken = |n: &String| self.used.contains(n) || self.reserved.contains(n);
        let from = self.suffix.get(&base).copied().unwrap_or(1);
        let (k, name) = (from..)
            .map(|k| (k, if k == 1 { base.clone() } else { format!("{base}_{k}") }))
            .find(|(_, n)| !taken(n))
            .expect("an unused suffix exists");
        self.used.insert(name.clone());
        self.suffix.insert(base, k);
        name
    }

    /// Keeps graph output `name` (an ONNX name) free for `output`: a node may be named after
    /// an ONNX node whose name is another value's output name.
    pub fn reserve(&mut self, name: &str) {
        self.reserved.insert(sanitise(name));
    }

    pub fn add_input(&mut self, input: meshc_ir::Input) {
        self.types.insert(input.name.clone(), input.ty.clone());
        self.graph.inputs.push(input);
    }

    pub fn ty(&self, v: &Value) -> TensorType {
        match v {
            Value::Const { t, .. } => t.ty(),
            Value::Tensor(n) => self.types[n].clone(),
        }
    }

    /// The half dtype of the graph input `v` is the widened form of (see `import::input`).
    pub fn half_origin(&self, v: &Value) -> Option<DType> {
        let Value::Tensor(name) = v else { return None };
        let node = self.graph.nodes.iter().find(|n| &n.name == name).filter(|n| n.op == Op::Cast)?;
        let input = self.graph.inputs.iter().find(|i| node.inputs.first() == Some(&i.name))?;
        Some(input.ty.dtype).filter(|d| d.is_half())
    }

    /// The meshc name of `v`, turning a const into a param (once per ONNX source). A half
    /// initializer's param keeps its half bytes (weights file and artifact at half the size)
    /// and is read through a cast to f32, which a matmul reads as the half weight itself.
    pub fn operand(&mut self, v: &Value, hint: &str) -> String {
        let (t, source, half) = match v {
            Value::Tensor(n) => return n.clone(),
            Value::Const { t, source, half, .. } => (t, source, *half),
        };
        // The same bits under the same name (the hash only finds the candidates).
        let key = source.as_ref().map(|s| (s.clone(), bits_hash(t)));
        let same = |(u, h, _): &&ParamOf| *h == half && (Rc::ptr_eq(u, t) || u.to_le_bytes() == t.to_le_bytes());
        if let Some((_, _, p)) = key.as_ref().and_then(|k| self.param_of.get(k)?.iter().find(same)) {
            return p.clone();
        }
        let value = match half {
            // Exact: `t` was widened from these halves.
            Some(h) => Tensor::new(t.shape.clone(), Data::from_f64(h, t.data.to_f64())),
            None => (**t).clone(),
        };
        let name = self.param(source.as_deref().unwrap_or(hint), value);
        let read = match half {
            Some(_) => {
                let cast = self.fresh(&format!("{name}.f32"));
                let mut node = Node::new(&cast, Op::Cast, &[name.as_str()]);
                node.attrs.insert("to".into(), Attr::Str(DType::F32.name().into()));
                self.types.insert(cast.clone(), t.ty());
                self.graph.nodes.push(node);
                cast
            }
            None => name,
        };
        if let Some(k) = key {
            self.param_of.entry(k).or_default().push((t.clone(), half, read.clone()));
        }
        read
    }

    /// A new param holding `value`, named after `hint`.
    pub fn param(&mut self, hint: &str, value: Tensor) -> String {
        let name = self.fresh(hint);
        let ty = value.ty();
        self.types.insert(name.clone(), ty.clone());
        // The file is set when the graph is written (`save`): in memory, `params` holds it.
        let data = ParamData::File { path: String::new(), key: Some(name.clone()) };
        self.graph.params.push(Param { name: name.clone(), ty, dims: None, data, loc: None });
        self.params.insert(name.clone(), value);
        name
    }

    /// `op(args) {attrs}`, named after `name`: evaluated now when every operand is a
    /// non-weight const, else emitted.
    pub fn node(&mut self, name: &str, op: Op, args: &[&Value], attrs: &[(&str, Attr)]) -> R<Value> {
        if self.graph.nodes.len() >= MAX_NODES {
            return Err(format!(
                "the import makes more than {MAX_NODES} nodes of the model, the most meshc builds from one model"
            ));
        }
        let mut node = Node::new(name, op, &[]);
        for (k, v) in attrs {
            node.attrs.insert(k.to_string(), v.clone());
        }
        let types: Vec<TensorType> = args.iter().map(|a| self.ty(a)).collect();
        let operands: Vec<Operand> = types.iter().map(|ty| Operand { ty, dims: None }).collect();
        let out = infer(&node, &operands).map_err(|e| format!("{op}: {e}"))?.ty;
        let consts: Option<Vec<&Tensor>> = args
            .iter()
            .map(|a| match a {
                Value::Const { t, weight: false, .. } => Some(&**t),
                _ => None,
            })
            .collect();
        if let Some(consts) = consts {
            let t = eval_node(&node, &consts, &out).map_err(|e| e.msg)?;
            return Ok(match fold_sizes(&node, args, &consts, &out) {
                Some(sizes) => Value::sized(t, sizes),
                None => Value::computed(t),
            });
        }
        node.inputs = args.iter().enumerate().map(|(i, a)| self.operand(a, &format!("{name}.{i}"))).collect();
        node.name = self.fresh(name);
        self.types.insert(node.name.clone(), out);
        let v = Value::Tensor(node.name.clone());
        self.graph.nodes.push(node);
        Ok(v)
    }

    /// Names the graph output `want` after its ONNX name, so that `run --output-dir` writes
    /// the files onnxruntime's outputs are named by: the node computing it is renamed (with
    /// every use) when the name is free; an input, param or node that already has the name
    /// is the output itself; anything else (an input or initializer under another name, a
    /// value that is already another output: no-op Identity, Cast and Expand make such
    /// aliases) gets a copy of that name. A node renamed stays found under its old name,
    /// which another output may alias. Consts become params.
    pub fn output(&mut self, v: &Value, want: &str) -> R<String> {
        let have = match v {
            Value::Tensor(n) => n.clone(),
            Value::Const { .. } => self.operand(v, want),
        };
        let have = self.renamed.get(&have).cloned().unwrap_or(have);
        let want = sanitise(want);
        self.reserved.remove(&want);
        self.forget(&want);
        let is_output = self.graph.outputs.iter().any(|o| o.name == have);
        let free = !self.used.contains(&want);
        if !is_output && (have == want || !free) {
            return Ok(have);
        }
        if !is_output && self.graph.nodes.iter().any(|n| n.name == have) {
            self.rename(&have, &want);
            return Ok(want);
        }
        let same = Attr::ints(&self.types[&have].shape.iter().map(|&d| d as i64).collect::<Vec<_>>());
        let copy = self.node(&want, Op::Reshape, &[&Value::Tensor(have)], &[("shape", same)])?;
        Ok(self.operand(&copy, &want))
    }

    /// `name` is free again: `fresh` searches the bases it may have come from (`base` or
    /// `base_k`) from their start.
    fn forget(&mut self, name: &str) {
        self.suffix.remove(name);
        if let Some((base, k)) = name.rsplit_once('_') {
            if k.parse::<usize>().is_ok() {
                self.suffix.remove(base);
            }
        }
    }

    /// Names the graph's dims from what its ops do with them (`dims`).
    pub fn name_dims(&mut self) {
        super::dims::name_dims(&mut self.graph, &self.types);
    }

    /// Node `from` becomes `to` (a free name), with every use; `from` is free again.
    fn rename(&mut self, from: &str, to: &str) {
        for n in &mut self.graph.nodes {
            if n.name == from {
                n.name = to.to_string();
            }
            for i in n.inputs.iter_mut().filter(|i| *i == from) {
                *i = to.to_string();
            }
        }
        let ty = self.types.remove(from).expect("a node has a type");
        self.types.insert(to.to_string(), ty);
        self.used.remove(from);
        self.forget(from);
        self.used.insert(to.to_string());
        self.renamed.insert(from.to_string(), to.to_string());
    }
}

/// Which size each element of `node` folded over `consts` is, when an operand's elements
/// are sizes (`Value::Const::sizes`) and the op only moves them: the op evaluated again on
/// the numbers of the elements in place of their values. Arithmetic on a size makes a
/// number that is no tensor's size: `None`.
fn fold_sizes(node: &Node, args: &[&Value], consts: &[&Tensor], out: &TensorType) -> Option<Vec<Option<SizeOf>>> {
    args.iter().find_map(|a| a.sizes())?;
    let moved = match node.op {
        Op::Cast if matches!(out.dtype, DType::I32 | DType::I64) => return args[0].sizes().map(<[_]>::to_vec),
        Op::Reshape | Op::Transpose | Op::BroadcastTo | Op::Concat | Op::Slice => args.len(),
        // The data moves, the indices select.
        Op::Gather => 1,
        _ => return None,
    };
    let mut all: Vec<Option<SizeOf>> = Vec::new();
    let mut numbered: Vec<Tensor> = Vec::new();
    for (k, (a, t)) in args.iter().zip(consts).enumerate() {
        if k >= moved {
            numbered.push((*t).clone());
            continue;
        }
        let first = all.len() as i64;
        match a.sizes() {
            Some(s) => all.extend(s.iter().cloned()),
            None => all.extend(std::iter::repeat_n(None, t.numel())),
        }
        numbered.push(Tensor::new(t.shape.clone(), Data::I64((first..all.len() as i64).collect())));
    }
    let refs: Vec<&Tensor> = numbered.iter().collect();
    let at = eval_node(node, &refs, &TensorType::new(DType::I64, out.shape.clone())).ok()?;
    match &at.data {
        Data::I64(v) => Some(v.iter().map(|&i| all[i as usize].clone()).collect()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitised_and_unique() {
        assert_eq!(sanitise("/encoder/layer.0/MatMul_output_0"), "encoder_layer.0_MatMul_output_0");
        assert_eq!(sanitise("onnx::MatMul_12"), "onnx__MatMul_12");
        assert_eq!(sanitise("0"), "t0");
        assert_eq!(sanitise(""), "t");
        let mut b = Builder::default();
        assert_eq!(b.fresh("a/b"), "a_b");
        assert_eq!(b.fresh("a:b"), "a_b_2");
    }

    #[test]
    fn fresh_names_are_the_first_free_suffix_whatever_was_freed_between() {
        // What a search from suffix 1 finds, against the cached search, over random mixes of
        // names taken, reserved and freed again (as `output` and `rename` free them), with
        // bases that are other bases' suffixed names.
        let hints = ["a", "a_2", "a_2_2", "a_3", "b"];
        let mut b = Builder::default();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let hint = hints[(seed % 5) as usize];
            let taken: Vec<String> = b.used.iter().chain(&b.reserved).cloned().collect();
            let pick = taken.get((seed >> 16) as usize % taken.len().max(1)).cloned();
            match ((seed >> 8) % 4, pick) {
                (0, _) => b.reserve(hint),
                (1, Some(n)) => {
                    b.reserved.remove(&n);
                    b.forget(&n);
                }
                (2, Some(n)) => {
                    b.used.remove(&n);
                    b.forget(&n);
                }
                _ => {
                    let free = |n: &String| !b.used.contains(n) && !b.reserved.contains(n);
                    let want = (1..).map(|k| if k == 1 { hint.to_string() } else { format!("{hint}_{k}") }).find(free);
                    assert_eq!(Some(b.fresh(hint)), want);
                }
            }
        }
    }

    #[test]
    fn nodes_leave_graph_output_names_to_the_outputs() {
        let mut b = Builder::default();
        b.reserve("y");
        let x = Value::named(Tensor::f32(vec![2], vec![1.0, 2.0]), "x");
        // An ONNX node named 'y' that computes another value than output 'y'.
        let v = b.node("y", Op::Neg, &[&x], &[]).unwrap();
        assert!(matches!(v, Value::Tensor(ref n) if n == "y_2"));
        let w = b.node("z", Op::Neg, &[&v], &[]).unwrap();
        assert_eq!(b.output(&w, "y").unwrap(), "y");
    }

    #[test]
    fn folding_keeps_which_sizes_a_shape_s_elements_are_until_arithmetic() {
        let mut b = Builder { sizes: true, ..Builder::default() };
        let shape = Value::sized(
            Tensor::new(vec![3], meshc_ir::Data::I64(vec![3, 5, 8])),
            vec![Some(("x".into(), 0)), Some(("x".into(), 1)), None],
        );
        let i64s = |v: &[i64]| Value::computed(Tensor::new(vec![v.len()], meshc_ir::Data::I64(v.to_vec())));
        // Gather [2, 1], then a reshape and a concat after a plain number: each element keeps
        // the size it is.
        let picked = b.node("g", Op::Gather, &[&shape, &i64s(&[2, 1])], &[]).unwrap();
        assert_eq!(picked.sizes().unwrap(), &[None, Some(("x".into(), 1))]);
        let r = b.node("r", Op::Reshape, &[&picked], &[("shape", Attr::ints(&[2, 1]))]).unwrap();
        let flat = b.node("f", Op::Reshape, &[&r], &[("shape", Attr::ints(&[2]))]).unwrap();
        let cat = b.node("c", Op::Concat, &[&i64s(&[7]), &flat], &[("axis", Attr::Int(0))]).unwrap();
        assert_eq!(cat.as_const().unwrap().data, meshc_ir::Data::I64(vec![7, 8, 5]));
        assert_eq!(cat.sizes().unwrap(), &[None, None, Some(("x".into(), 1))]);
        let cast = b.node("i32", Op::Cast, &[&cat], &[("to", Attr::Str("i32".into()))]).unwrap();
        assert_eq!(cast.sizes(), cat.sizes());
        // A size plus one is no size, nor is one cast to f32.
        let plus = b.node("p", Op::Add, &[&cat, &i64s(&[1])], &[]).unwrap();
        assert!(plus.sizes().is_none());
        let f = b.node("f32", Op::Cast, &[&cat], &[("to", Attr::Str("f32".into()))]).unwrap();
        assert!(f.sizes().is_none());
        assert!(b.graph.nodes.is_empty());
    }

    #[test]
    fn nodes_on_constants_fold_and_nodes_on_weights_stay() {
        let mut b = Builder::default();
        let two = Value::computed(Tensor::new(vec![], meshc_ir::Data::I64(vec![2])));
        let v = b.node("m", Op::Mul, &[&two, &two], &[]).unwrap();
        assert_eq!(v.as_const().unwrap().data, meshc_ir::Data::I64(vec![4]));
        assert!(b.graph.nodes.is_empty());
        let w = Value::named(Tensor::f32(vec![2], vec![1.0, 2.0]), "w");
        let v = b.node("n", Op::Neg, &[&w], &[]).unwrap();
        assert!(matches!(v, Value::Tensor(ref n) if n == "n"));
        assert_eq!(b.graph.params[0].name, "w");
    }
}
