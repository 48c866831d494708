//! The single-device compiler: a verified graph and its params in, a `Compiled` out —
//! kernels (elementwise chains fused into one loop each, matmuls by the generated kernel or
//! the library GEMM), buffers with logical numbers, weights laid out 64-byte aligned, and
//! the steps of the program. Later passes (layouts, placement, streams) feed this per device.

use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Context, Result};
use meshc_ir::verify::Info;
use meshc_ir::{Graph, Node, Op, Tensor, TensorType};

use crate::codegen::elementwise::{Arg, Fused, FusedNode};
use crate::codegen::{self, Generated, Target};
use crate::library;
use crate::program::{align_up, Buffer, Exec, IoSpec, Kernel, Library, Meta, Program, Step, Storage, ALIGN};

/// Which implementation serves matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gemm {
    /// The faster one for each shape (`library::prefer_library`).
    Auto,
    Cranelift,
    Library,
}

pub struct Options {
    pub target: String,
    pub gemm: Gemm,
}

impl Default for Options {
    fn default() -> Self {
        Options { target: "native".into(), gemm: Gemm::Auto }
    }
}

/// A compiled graph: everything an artifact holds.
pub struct Compiled {
    pub meta: Meta,
    /// One per device, in device order.
    pub programs: Vec<Program>,
    pub code: Vec<u8>,
    pub weights: Vec<u8>,
}

/// Kernels start at this alignment inside the code section (a cache-line boundary).
const KERNEL_ALIGN: usize = 64;

/// The groups of nodes that become one step each: elementwise chains whose inner results
/// have no other use are fused into the group of their consumer. Returns, per node, the
/// root of its group, and the roots in order.
fn fusion_groups(g: &Graph, info: &Info) -> (Vec<usize>, Vec<usize>) {
    let index: HashMap<&str, usize> = g.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for inp in &n.inputs {
            if let Some(&p) = index.get(inp.as_str()) {
                if !users[p].contains(&i) {
                    users[p].push(i);
                }
            }
        }
    }
    let is_output: Vec<bool> = g.nodes.iter().map(|n| g.outputs.iter().any(|o| o.name == n.name)).collect();
    let mut root: Vec<usize> = (0..g.nodes.len()).collect();
    // Reverse topological order: a consumer's group is settled before its producers join it.
    for &i in info.order.iter().rev() {
        let n = &g.nodes[i];
        if !n.op.is_elementwise() || n.op.is_communication() {
            continue;
        }
        let fusable = !is_output[i] && users[i].len() == 1 && g.nodes[users[i][0]].op.is_elementwise();
        if fusable {
            root[i] = root[users[i][0]];
        }
    }
    let roots = info.order.iter().copied().filter(|&i| root[i] == i).collect();
    (root, roots)
}

/// The fused-kernel description of the group rooted at `r`, and the names of its operands.
fn fused_spec(g: &Graph, info: &Info, root: &[usize], r: usize) -> (Fused, Vec<String>) {
    let members: Vec<usize> = info.order.iter().copied().filter(|&i| root[i] == r).collect();
    let mut inputs: Vec<String> = Vec::new();
    let mut nodes = Vec::new();
    let mut pos: HashMap<&str, usize> = HashMap::new();
    for &m in &members {
        let n = &g.nodes[m];
        let args = n
            .inputs
            .iter()
            .map(|a| match pos.get(a.as_str()) {
                Some(&k) => Arg::Node(k),
                None => Arg::Input(inputs.iter().position(|x| x == a).unwrap_or_else(|| {
                    inputs.push(a.clone());
                    inputs.len() - 1
                })),
            })
            .collect();
        pos.insert(&n.name, nodes.len());
        nodes.push(FusedNode { op: n.op, attrs: n.attrs.clone(), args, ty: info.types[&n.name].clone() });
    }
    let input_types = inputs.iter().map(|a| info.types[a].clone()).collect();
    (Fused { inputs: input_types, nodes }, inputs)
}

/// Builds the program's buffers one at a time; the arena is a bump allocator for now
/// (liveness-based reuse is the buffer-assignment pass's job).
#[derive(Default)]
struct Buffers {
    list: Vec<Buffer>,
    arena: usize,
    of: HashMap<String, usize>,
}

impl Buffers {
    fn arena(&mut self, name: &str, bytes: usize) -> usize {
        let offset = self.arena;
        self.arena = align_up(offset + bytes, ALIGN);
        self.list.push(Buffer { name: name.to_string(), bytes, storage: Storage::Arena { offset } });
        self.of.insert(name.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }

    fn get(&self, name: &str) -> usize {
        self.of[name]
    }
}

/// A C-identifier-ish kernel name for a node (names may hold any character).
fn kernel_name(node: &Node) -> String {
    let clean: String = node.name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("{}_{clean}", node.op.name())
}

fn generate(target: &Target, node: &Node, inputs: &[TensorType], out: &TensorType) -> Result<Generated> {
    let name = kernel_name(node);
    match node.op {
        Op::MatMul => codegen::matmul::matmul(target, &name, &inputs[0], &inputs[1], out),
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax | Op::Softmax | Op::LayerNorm => {
            codegen::reduce::kernel(target, &name, node, inputs, out)
        }
        Op::Transpose | Op::Slice | Op::Concat | Op::BroadcastTo | Op::Gather | Op::Einsum => {
            codegen::movement::kernel(target, &name, node, inputs, out)
        }
        op if op.is_communication() => bail!("node '{}': {op} needs a mesh layout (a multi-device program)", node.name),
        op => bail!("node '{}': no kernel for {op}", node.name),
    }
}

/// The FLOP estimate of a node: 2 per multiply-add of contractions, one per element for
/// elementwise ops and reductions, a few per element for softmax and layer_norm.
fn node_flops(n: &Node, info: &Info) -> u64 {
    let numel = |name: &str| info.types[name].numel() as u64;
    match n.op {
        Op::MatMul => {
            let a = &info.types[&n.inputs[0]].shape;
            2 * numel(&n.name) * *a.last().unwrap_or(&1) as u64
        }
        Op::Einsum => {
            // Every combination of letters is one multiply-add per operand beyond the first.
            let eq = meshc_ir::infer::attr_str(n, "equation", "");
            let mut sizes: BTreeMap<char, u64> = BTreeMap::new();
            if let Ok((terms, _)) = meshc_ir::infer::parse_equation(eq, n.inputs.len()) {
                for (t, i) in terms.iter().zip(&n.inputs) {
                    for (c, &d) in t.iter().zip(&info.types[i].shape) {
                        sizes.insert(*c, d as u64);
                    }
                }
            }
            2 * sizes.values().product::<u64>() * (n.inputs.len() as u64 - 1).max(1)
        }
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax => numel(&n.inputs[0]),
        Op::Softmax => 5 * numel(&n.name),
        Op::LayerNorm => 8 * numel(&n.name),
        op if op.is_elementwise() => numel(&n.name),
        _ => 0,
    }
}

pub fn compile(g: &Graph, info: &Info, params: &HashMap<String, Tensor>, opts: &Options) -> Result<Compiled> {
    let target = Target::by_name(&opts.target)?;
    let mut bufs = Buffers::default();

    // Weights: each param at a 64-byte aligned offset of the weights section.
    let mut weights = Vec::new();
    for p in &g.params {
        let bytes = params[&p.name].to_le_bytes();
        let offset = align_up(weights.len(), ALIGN);
        weights.resize(offset, 0);
        weights.extend_from_slice(&bytes);
        bufs.list.push(Buffer { name: p.name.clone(), bytes: bytes.len(), storage: Storage::Weights { offset } });
        bufs.of.insert(p.name.clone(), bufs.list.len() - 1);
    }
    let inputs: Vec<usize> = g.inputs.iter().map(|i| bufs.arena(&i.name, i.ty.size_bytes())).collect();

    let (root, roots) = fusion_groups(g, info);
    let mut code: Vec<u8> = Vec::new();
    let mut kernels: Vec<Kernel> = Vec::new();
    let mut by_bytes: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    let mut steps = Vec::new();
    for r in roots {
        let node = &g.nodes[r];
        let out = &info.types[&node.name];
        if node.op == Op::Reshape {
            // Same bytes, new shape: the result shares its operand's buffer.
            let b = bufs.get(&node.inputs[0]);
            bufs.of.insert(node.name.clone(), b);
            continue;
        }
        let operand_types: Vec<TensorType> = node.inputs.iter().map(|i| info.types[i].clone()).collect();
        let use_library = node.op == Op::MatMul
            && match opts.gemm {
                Gemm::Library => true,
                Gemm::Cranelift => false,
                Gemm::Auto => library::prefer_library(&operand_types[0], &operand_types[1]),
            };
        let (exec, operands, scratch) = if use_library {
            let lib = Library::Matmul {
                a: operand_types[0].shape.clone(),
                b: operand_types[1].shape.clone(),
                out: out.shape.clone(),
            };
            (Exec::Library(lib), node.inputs.clone(), 0)
        } else {
            let (generated, operands) = if node.op.is_elementwise() {
                let (spec, operands) = fused_spec(g, info, &root, r);
                (codegen::elementwise::fused(&target, &kernel_name(node), &spec)?, operands)
            } else {
                (generate(&target, node, &operand_types, out)?, node.inputs.clone())
            };
            let bytes = codegen::compile(&target, generated.func).with_context(|| format!("node '{}'", node.name))?;
            // Identical kernels (e.g. the q, k and v projections) share one copy of the code.
            let k = *by_bytes.entry(bytes).or_insert_with_key(|bytes| {
                let offset = align_up(code.len(), KERNEL_ALIGN);
                code.resize(offset, 0);
                code.extend_from_slice(bytes);
                kernels.push(Kernel { name: kernel_name(node), offset, len: bytes.len() });
                kernels.len() - 1
            });
            (Exec::Kernel(k), operands, generated.scratch)
        };
        let mut buffers = vec![bufs.arena(&node.name, out.size_bytes())];
        buffers.extend(operands.iter().map(|o| bufs.get(o)));
        if scratch > 0 {
            buffers.push(bufs.arena(&format!("{}.scratch", node.name), scratch));
        }
        steps.push(Step { node: node.name.clone(), exec, buffers });
    }
    let outputs = g.outputs.iter().map(|o| bufs.get(&o.name)).collect();
    let meta = Meta {
        graph: g.name.clone(),
        target: target.name.clone(),
        features: target.features.clone(),
        mesh: crate::mesh::Mesh::single(),
        flops: g.nodes.iter().map(|n| node_flops(n, info)).sum(),
        inputs: g.inputs.iter().map(|i| IoSpec::new(&i.name, &i.ty)).collect(),
        outputs: g.outputs.iter().map(|o| IoSpec::new(&o.name, &info.types[&o.name])).collect(),
    };
    let program = Program { device: 0, arena_bytes: bufs.arena, buffers: bufs.list, kernels, steps, inputs, outputs };
    Ok(Compiled { meta, programs: vec![program], code, weights })
}
