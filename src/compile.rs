//! The back of the pipeline: the lowered programs of every device in, a `Compiled` out.
//! `run` walks the device and program passes of `pipeline::PASSES` (expand, fold,
//! gelu, attention, epilogue, zero_point, reduce_split, fuse, code generation here, streams, buffers), each over every
//! device before the next; code generation turns each step into a kernel (a fused
//! elementwise loop, a matmul by the generated kernel or the library GEMM, a collective or
//! a transfer) defined in the module `Options::emit` asks for (`codegen::module`: the
//! artifact's code section, or executable memory), stores identical kernels and weight
//! blocks once, and lays the weights out 64-byte aligned.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use anyhow::{bail, Context, Result};
use meshc_ir::attrs;
use meshc_ir::infer::{norm_axes, norm_axis};
use meshc_ir::params::Params;
use meshc_ir::verify::{verify, Info};
use meshc_ir::{Graph, Node, Op, Tensor, TensorType};

use crate::codegen::elementwise::{Arg, Fused, FusedNode};
use crate::codegen::module::{ArtifactModule, JitCode, Kernels, Place};
use crate::codegen::{self, Generated, Target};
use crate::passes;
use crate::passes::fold::{Const, Folded};
use crate::passes::fuse::Groups;
use crate::passes::lower::Lowered;
use crate::pipeline::{self, DevicePass, Dumps, Flow, Instrument, Level, Pass, ProgramPass};
use crate::sizes::StepScaling;
use meshc_ir::cost::node_flops;
use meshc_ir::sym::SymInfo;
use meshc_runtime::exec::runner::Loaded;
use meshc_runtime::format::mesh::{Layout, Mesh};
use meshc_runtime::format::program::{
    align_up, Attention, Buffer, Byte, Collective, Concat, Elem, Exec, IntMatmul, IoSpec, Kernel, Library, Matmul,
    Meta, Program, Protocol, Reduce, Reduction, SoftmaxAlong, Step, Storage, Transfer, Transpose, Transposed, Why,
    ALIGN,
};
use meshc_runtime::format::symbolic::{RepeatSlots, Scaling, Symbolic};
use meshc_runtime::kernels::igemm;
use meshc_runtime::kernels::library;
use meshc_runtime::kernels::matmul_shape::MatmulShape;
use meshc_runtime::kernels::panels;

/// The name of a symbolic program's size table buffer (`Storage::Sizes`).
const SIZES: &str = "(sizes)";

/// Which implementation serves matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gemm {
    /// The faster one for each shape (`library::prefer_library`).
    Auto,
    Cranelift,
    Library,
}

#[derive(Clone)]
pub struct Options {
    pub target: String,
    pub gemm: Gemm,
    /// Plan each arena from liveness (`passes::buffers::plan`); false gives every buffer its
    /// own slot (`passes::buffers::naive`), which the tests compare the plan against.
    pub plan_arena: bool,
    /// Pruning masks of matmul weights by param name (`passes::pilot::apply`): stored before
    /// the (local slices of the) weights, and read by the matmuls that use them.
    pub masks: HashMap<String, passes::pilot::ParamMask>,
    /// How each device's steps are ordered and split into streams (`passes::streams`).
    pub streams: passes::streams::Config,
    pub emit: Emit,
    /// How matmul weights are stored (`passes::fold::WeightsDtype`).
    pub weights: passes::fold::WeightsDtype,
    /// Fold elementwise chains into the library matmuls before them (`passes::epilogue`);
    /// false keeps them separate steps, which `cargo bench --bench models` compares against.
    pub epilogues: bool,
    /// Fuse attention chains into one step each (`passes::attention`); false keeps the
    /// matmuls and the softmax separate, which `cargo bench --bench models` compares against.
    pub attention: bool,
    /// Symbolic dims (`crate::sizes`): the graph is written at their upper bounds, and the
    /// artifact runs at every size within them. Empty: a static compile.
    pub symbols: meshc_ir::sym::Symbols,
}

/// Where the kernels go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    /// Into executable memory, to run in this process (`Compiled::load`).
    Memory,
    /// Into a code section, to write as an artifact (`artifact::write_artifact`).
    Artifact,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            target: "native".into(),
            gemm: Gemm::Auto,
            plan_arena: true,
            masks: HashMap::new(),
            streams: Default::default(),
            emit: Emit::Memory,
            weights: Default::default(),
            epilogues: true,
            attention: true,
            symbols: Default::default(),
        }
    }
}

/// A compiled graph: everything an artifact holds.
pub struct Compiled {
    pub meta: Meta,
    /// One per device, in device order.
    pub programs: Vec<Program>,
    pub code: Code,
    pub weights: Vec<u8>,
}

/// The kernels of a `Compiled`, as `Options::emit` asked.
pub enum Code {
    /// The code section of an artifact.
    Section(Vec<u8>),
    /// In executable memory, at the offsets the programs name.
    Memory(Box<JitCode>),
}

impl Compiled {
    /// The compiled programs ready to run in this process, with no artifact file in
    /// between: the kernels where the JIT put them, the weight bytes an artifact would hold.
    pub fn load(self) -> Result<Loaded> {
        let Code::Memory(code) = self.code else {
            bail!("compiled for an artifact: write it and load that, or compile to run in memory");
        };
        Loaded::in_memory(self.meta, self.programs, code, &self.weights)
    }
}

/// The module kernels are defined in, as `Options::emit` asks.
enum Sink {
    Section(Box<Kernels<ArtifactModule>>),
    Memory(Box<Kernels<cranelift_jit::JITModule>>),
}

impl Sink {
    fn define(&mut self, func: cranelift_codegen::ir::Function) -> Result<Place> {
        match self {
            Sink::Section(k) => k.define(func),
            Sink::Memory(k) => k.define(func),
        }
    }

    fn finish(self) -> Result<Code> {
        Ok(match self {
            Sink::Section(k) => Code::Section(k.finish()?),
            Sink::Memory(k) => Code::Memory(Box::new(k.finish()?)),
        })
    }
}

/// The fused-kernel description of the group rooted at `r`, and the names of its operands.
fn fused_spec(g: &Graph, info: &Info, groups: &Groups, r: usize) -> (Fused, Vec<String>) {
    let members = groups.members(info, r);
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

/// The epilogue of a library matmul (`passes::epilogue`), its steps' operand shapes from
/// `info`.
fn epilogue(node: &Node, info: &Info) -> Result<Vec<meshc_runtime::format::epilogue::Step>> {
    let attrs::MatMul { epilogue, a_zero_point } = attrs::MatMul::of(node);
    let Some(attr) = epilogue else { return Ok(Vec::new()) };
    let mut operands = meshc_ir::ops::matmul_operands(&node.inputs[2..], a_zero_point).1.iter();
    let steps = meshc_ir::ops::epilogue_steps(&attr).map_err(anyhow::Error::msg)?;
    (steps.into_iter())
        .map(|(name, _)| {
            let shape = || operands.next().map_or_else(Vec::new, |o| info.types[o].shape.clone());
            meshc_runtime::format::epilogue::Step::parse(name, shape)
                .with_context(|| format!("node '{}': epilogue step '{name}'", node.name))
        })
        .collect()
}

/// Numbers the program's buffers one at a time; arena offsets are left to the
/// buffer-assignment pass (`passes::buffers`).
#[derive(Default)]
struct Buffers {
    list: Vec<Buffer>,
    of: HashMap<String, usize>,
}

impl Buffers {
    fn arena(&mut self, name: &str, bytes: usize) -> usize {
        self.list.push(Buffer { name: name.to_string(), bytes, storage: Storage::Arena { offset: 0 }, mask: None });
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
    if node.inputs.len() > 2 && node.op == Op::MatMul {
        bail!("node '{}': the generated matmul kernel takes no epilogue", node.name);
    }
    match node.op {
        // An i32 matmul is the integer library GEMM's (`Builder::program`).
        Op::MatMul if out.dtype != meshc_ir::DType::F32 => {
            bail!("node '{}': an {} matmul has no compiled kernel (`meshc interp` runs it)", node.name, out.dtype)
        }
        Op::MatMul => codegen::matmul::matmul(target, &name, &inputs[0], &inputs[1], out),
        Op::ReduceSum | Op::ReduceMean | Op::ReduceMax | Op::Softmax | Op::LayerNorm => {
            codegen::reduce::kernel(target, &name, node, inputs, out)
        }
        Op::Transpose
        | Op::Slice
        | Op::Concat
        | Op::BroadcastTo
        | Op::BroadcastLike
        | Op::Gather
        | Op::ScatterElements
        | Op::DynamicSlice
        | Op::DynamicUpdateSlice
        | Op::Iota
        | Op::Einsum => codegen::movement::kernel(target, &name, node, inputs, out),
        Op::Conv => codegen::conv::depthwise(target, &name, node, inputs, out),
        Op::CumSum => codegen::scan::cumsum(target, &name, node, inputs, out),
        // Elementwise ops run as fused loops, a reshape is a view of its operand, attention
        // and communication are runtime steps, and the expand pass rewrites pad and pools
        // (and the convs it does not keep) into gathers and matmuls: none has a kernel here.
        meshc_ir::unary_ops!()
        | meshc_ir::binary_ops!()
        | meshc_ir::ternary_ops!()
        | meshc_ir::communication_ops!()
        | Op::Reshape
        | Op::Attention
        | Op::Pad
        | Op::MaxPool
        | Op::AvgPool => bail!("node '{}': no kernel for {}", node.name, node.op),
    }
}

/// The indices of a gather that are a constant (the tables `passes::expand` builds), which
/// its kernel then copies by (`codegen::movement::gather_table`).
fn constant_indices(g: &Graph, folded: &Folded, node: &Node, operands: &[TensorType]) -> Result<Option<Vec<i64>>> {
    if node.op != Op::Gather || !folded.consts.contains_key(&node.inputs[1]) {
        return Ok(None);
    }
    let bytes = folded.bytes(g, &node.inputs[1])?;
    Ok(match operands[1].dtype {
        meshc_ir::DType::I64 => {
            Some(bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect())
        }
        meshc_ir::DType::I32 => {
            Some(bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64).collect())
        }
        _ => None,
    })
}

/// The mask record of every weight of `g` that is the right operand of a matmul and has a
/// keep pattern in `keeps` that prunes something, with its entry in the program.
fn local_masks<'g>(
    g: &'g Graph,
    info: &Info,
    consts: &HashMap<String, Const<'_>>,
    keeps: &HashMap<String, Tensor>,
    block: usize,
) -> HashMap<&'g str, (meshc_runtime::format::mask::Mask, meshc_runtime::format::program::MaskInfo)> {
    let mut out = HashMap::new();
    for n in g.nodes.iter().filter(|n| n.op == Op::MatMul && !consts.contains_key(&n.name)) {
        let w = n.inputs[1].as_str();
        let Some(keep) = keeps.get(w).filter(|t| t.shape.len() >= 2) else { continue };
        let (k, cols) = (keep.shape[keep.shape.len() - 2], keep.shape[keep.shape.len() - 1]);
        let (mut col_keep, mut row_keep) = (vec![false; cols], vec![false; k]);
        for (i, &x) in keep.as_f32().expect("f32 keep pattern").iter().enumerate() {
            if x != 0.0 {
                col_keep[i % cols] = true;
                row_keep[(i / cols) % k] = true;
            }
        }
        let mask = meshc_runtime::format::mask::Mask::new(&col_keep, &row_keep, block);
        if !mask.prunes() {
            continue;
        }
        let flops = node_flops(n, info);
        let skipped = flops - (flops as f64 * mask.kept_fraction()).round() as u64;
        let entry = meshc_runtime::format::program::MaskInfo {
            bytes: mask.record_len(),
            rows: k,
            cols,
            flops,
            flops_skipped: skipped,
        };
        out.insert(w, (mask, entry));
    }
    out
}

/// Code and weights shared by the programs of all devices: identical kernels and identical
/// weight blocks (replicas of a param shard) are stored once.
struct Builder {
    target: Target,
    gemm: Gemm,
    /// The block size of the pruning masks (one for all).
    mask_block: usize,
    code: Sink,
    weights: Vec<u8>,
    /// Offsets in `weights` of the blocks stored so far (mask record and bytes), by a hash
    /// of their content: keys holding the bytes themselves kept a second copy of a model.
    weight_at: HashMap<u64, Vec<usize>>,
    /// Collective ids by node name: the members of a group name a collective alike.
    collectives: BTreeMap<String, usize>,
    symbols: meshc_ir::sym::Symbols,
    /// With symbols: the size table so far and the graph's symbolic inputs, outputs and
    /// checks (from the one device's program).
    symbolic: Option<Symbolic>,
}

/// A fingerprint of a weight block for finding equal ones: its mask record, its length and
/// samples spread over its bytes. `Builder::weight` confirms equality by comparing the
/// bytes, so a collision costs a compare, while hashing every byte was a second pass over
/// the whole checkpoint (8% of compiling a 0.4 GB one).
fn fingerprint(record: &[u8], bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    const EDGE: usize = 4096;
    const SAMPLES: usize = 256;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (record, bytes.len()).hash(&mut h);
    if bytes.len() <= 2 * EDGE + SAMPLES * 8 {
        bytes.hash(&mut h);
    } else {
        bytes[..EDGE].hash(&mut h);
        bytes[bytes.len() - EDGE..].hash(&mut h);
        for k in 0..SAMPLES {
            let at = EDGE + k * (bytes.len() - 2 * EDGE - 8) / SAMPLES;
            bytes[at..at + 8].hash(&mut h);
        }
    }
    h.finish()
}

impl Builder {
    fn new(opts: &Options) -> Result<Builder> {
        let target = Target::by_name(&opts.target)?;
        let code = match opts.emit {
            Emit::Artifact => Sink::Section(Box::new(Kernels::artifact(&target))),
            Emit::Memory => Sink::Memory(Box::new(Kernels::jit(&target)?)),
        };
        Ok(Builder {
            target,
            gemm: opts.gemm,
            mask_block: opts.masks.values().next().map_or(0, |m| m.block),
            code,
            weights: Vec::new(),
            weight_at: HashMap::new(),
            collectives: BTreeMap::new(),
            symbols: opts.symbols.clone(),
            symbolic: None,
        })
    }

    /// Stores `bytes` (after `record`, a mask record that must end right where they start),
    /// once per distinct content; returns the offset of `bytes`.
    fn weight(&mut self, record: &[u8], bytes: &[u8]) -> usize {
        let at = self.weight_at.entry(fingerprint(record, bytes)).or_default();
        let (w, r) = (&self.weights, record.len());
        let same = |o: usize| w.get(o..o + r) == Some(record) && w.get(o + r..o + r + bytes.len()) == Some(bytes);
        if let Some(&o) = at.iter().find(|&&o| same(o)) {
            return o + record.len();
        }
        let offset = align_up(self.weights.len(), ALIGN);
        self.weights.resize(offset, 0);
        self.weights.extend_from_slice(record);
        self.weights.extend_from_slice(bytes);
        at.push(offset);
        offset + record.len()
    }

    /// Whether the library GEMM serves a matmul of operands of these types (as stored).
    /// Both GEMMs read a half weight (widening it by blocks): the choice is by shape.
    fn library_serves(&self, operands: &[TensorType]) -> bool {
        if operands[0].dtype != meshc_ir::DType::F32 {
            // An i32 product is the integer GEMM's whatever `gemm` says.
            return false;
        }
        match self.gemm {
            Gemm::Library => true,
            Gemm::Cranelift => false,
            Gemm::Auto => {
                library::prefer_library(&operands[0], &TensorType::new(meshc_ir::DType::F32, operands[1].shape.clone()))
            }
        }
    }

    /// Whether the constant `name` is stored in panels: an f32 (or bf16) matrix (or batch of them)
    /// whose columns pad to whole strips cheaply (`panels::worth_packing`), that is no output,
    /// and that every node reading it reads as the right operand of a matmul the library
    /// GEMM serves with at most `panels::SMALL_M` rows a matrix. (Longer products pack their
    /// weight once per call over many rows, and the gemm crate's kernels, which pack `a` too,
    /// ran them 5% faster than the panels' kernels: `cargo bench --bench gemm`; at few rows
    /// the panels are level with the small-M GEMM or faster, 2.8× at one row.) Over symbolic
    /// rows (`si`) a call may have few whatever the bounds: panels then, which the runner
    /// copies out row-major for a call with many (`meshc_runtime::kernels::library`). A
    /// bf16 weight (`--weights-dtype`) is stored in panels where every product reading it
    /// has static rows, at most `panels::SMALL_M`: the small-M GEMM widens its strips as it
    /// streams them (read row-major, a strip crosses a page per row: at one row a 768×50257
    /// bf16 weight took 7.7 ms row-major and 3.1 ms in panels, its f32 panels 5.1 ms). An
    /// f16 one stays row-major: its small-M kernels need AVX-512, and on AVX2 the runner
    /// would copy the panels out on every call. The caller leaves pruned weights row-major:
    /// their GEMM runs on strided views.
    fn in_panels(&self, g: &Graph, info: &Info, folded: &Folded, name: &str, si: Option<&SymInfo>) -> bool {
        use meshc_ir::DType;
        let ty = folded.stored(name, &info.types);
        let mut readers =
            g.nodes.iter().filter(|n| !folded.consts.contains_key(&n.name) && n.inputs.iter().any(|i| i == name));
        let half = ty.dtype == DType::BF16;
        let symbolic = |n: &Node| si.is_some_and(|si| si.shapes[&n.inputs[0]].iter().any(|d| !d.is_const()));
        (ty.dtype == DType::F32 || half)
            && ty.shape.len() >= 2
            && panels::worth_packing(ty.shape[ty.shape.len() - 1])
            && !g.outputs.iter().any(|o| o.name == name)
            && !folded.absorbed.values().any(|w| w == name)
            && readers.all(|n| {
                let a = &info.types[&n.inputs[0]];
                n.op == Op::MatMul
                    && n.inputs[0] != name
                    && n.inputs[1] == name
                    && !n.inputs[2..].iter().any(|x| x == name)
                    && self.library_serves(&[a.clone(), ty.clone()])
                    && match half {
                        true => {
                            !symbolic(n)
                                && MatmulShape::infer(&a.shape, &ty.shape).is_ok_and(|(s, _)| s.m <= panels::SMALL_M)
                        }
                        false => {
                            MatmulShape::infer(&a.shape, &ty.shape).is_ok_and(|(s, _)| s.m <= panels::SMALL_M)
                                || symbolic(n)
                        }
                    }
            })
    }

    /// Whether the constant `name` is an i32 weight that only integer matmuls read, as their
    /// right operand: stored packed for the integer GEMM (`igemm::pack`) when its columns
    /// fit 8 bits, as those of MatMulInteger's centred weights do.
    fn int_weight(g: &Graph, info: &Info, folded: &Folded, name: &str) -> bool {
        let ty = folded.stored(name, &info.types);
        let mut readers =
            g.nodes.iter().filter(|n| !folded.consts.contains_key(&n.name) && n.inputs.iter().any(|i| i == name));
        ty.dtype == meshc_ir::DType::I32
            && ty.shape.len() >= 2
            && !g.outputs.iter().any(|o| o.name == name)
            && !folded.absorbed.values().any(|w| w == name)
            && readers.all(|n| {
                n.op == Op::MatMul
                    && n.inputs[0] != name
                    && n.inputs[1] == name
                    && !n.inputs[2..].iter().any(|x| x == name)
            })
    }

    /// The transposes that the library GEMMs reading them take through strides instead
    /// (`meshc_runtime::format::program::Transposed`), each with its operand: a swap of the last two
    /// dims of a run-time value, not an output, read only as operand `a` or `b` of library
    /// matmuls with an f32 `b` kept row-major. The training step's backward pass transposes
    /// activations and weights before its GEMMs: 26 MB of copies per step for the bench MLP.
    fn strided_transposes(
        &self,
        g: &Graph,
        info: &Info,
        folded: &Folded,
        row_major: impl Fn(&str) -> bool,
    ) -> HashMap<String, String> {
        let swaps_last_two = |n: &Node| {
            let rank = info.types[&n.inputs[0]].shape.len();
            let perm = match attrs::Transpose::of(n).perm {
                Some(p) => norm_axes(&p, rank).unwrap_or_default(),
                None => (0..rank).rev().collect(),
            };
            rank >= 2 && perm.iter().copied().eq((0..rank - 2).chain([rank - 1, rank - 2]))
        };
        let library_reader = |r: &Node, name: &str| {
            if r.op != Op::MatMul || r.inputs[2..].iter().any(|x| x == name) || !row_major(&r.inputs[1]) {
                return false;
            }
            let b = folded.stored(&r.inputs[1], &info.types);
            b.dtype == meshc_ir::DType::F32 && self.library_serves(&[info.types[&r.inputs[0]].clone(), b])
        };
        g.nodes
            .iter()
            .filter(|n| n.op == Op::Transpose && !folded.consts.contains_key(&n.name) && swaps_last_two(n))
            .filter(|n| !g.outputs.iter().any(|o| o.name == n.name))
            .filter(|n| {
                let mut readers = g.nodes.iter().filter(|r| r.inputs.contains(&n.name)).peekable();
                readers.peek().is_some() && readers.all(|r| library_reader(r, &n.name))
            })
            .map(|n| (n.name.clone(), n.inputs[0].clone()))
            .collect()
    }

    /// The program of one device: `g` verified as `info`, its constants `folded` and its
    /// fusion `groups`; its steps in program order on one stream and its buffers unplanned
    /// (`passes::streams` and `passes::buffers` follow), with the operand positions each
    /// step's kernel lets its result overwrite.
    fn program(
        &mut self,
        (device, devices): (usize, usize),
        g: &Graph,
        info: &Info,
        folded: &Folded,
        groups: &Groups,
        why: &BTreeMap<String, Why>,
    ) -> Result<(Program, Vec<Vec<usize>>)> {
        let mut bufs = Buffers::default();
        let Folded { consts, keeps, absorbed, .. } = folded;
        let si = self.symbolic_program(devices, g, info)?;
        if si.is_some() {
            bufs.list.push(Buffer { name: SIZES.to_string(), bytes: 0, storage: Storage::Sizes, mask: None });
            bufs.of.insert(SIZES.to_string(), bufs.list.len() - 1);
        }
        // The weights stored in panels (`meshc_runtime::kernels::panels`).
        let mut panelled: Vec<String> = Vec::new();
        let masks = local_masks(g, info, consts, keeps, self.mask_block);
        // Only the constants something reads become weights.
        let outputs: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
        let used = |name: &str| {
            outputs.contains(&name)
                || g.nodes.iter().any(|n| !consts.contains_key(&n.name) && n.inputs.iter().any(|i| i == name))
        };
        let mut names: Vec<&String> = consts.keys().filter(|c| used(c)).collect();
        names
            .sort_by_key(|c| (g.params.iter().position(|p| &p.name == *c), g.nodes.iter().position(|n| &n.name == *c)));
        for name in names {
            let mut bytes = folded.bytes(g, name)?;
            if !masks.contains_key(name.as_str()) && self.in_panels(g, info, folded, name, si.as_ref()) {
                // Only library matmuls read it, as their weight: stored as their GEMM reads
                // it, so no run packs it.
                let shape = &info.types[name].shape;
                let (k, n) = match shape[..] {
                    [.., k, n] => (k, n),
                    _ => unreachable!("`in_panels` takes matrices"),
                };
                let count = shape[..shape.len() - 2].iter().product();
                let size = folded.stored(name, &info.types).dtype.size_bytes();
                bytes = std::borrow::Cow::Owned(panels::pack_elems(&bytes, size, count, k, n));
                panelled.push(name.clone());
            } else if !masks.contains_key(name.as_str()) && Self::int_weight(g, info, folded, name) {
                let shape = &info.types[name].shape;
                let (k, n) = (shape[shape.len() - 2], shape[shape.len() - 1]);
                let count = shape[..shape.len() - 2].iter().product();
                let values: Vec<i32> =
                    bytes.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().expect("4"))).collect();
                if let Some(packed) = igemm::pack(&values, count, k, n) {
                    bytes = std::borrow::Cow::Owned(packed);
                    panelled.push(name.clone());
                }
            }
            let len = bytes.len();
            let (record, mask) = match masks.get(name.as_str()) {
                Some((m, info)) => (m.encode(), Some(info.clone())),
                None => (Vec::new(), None),
            };
            let offset = self.weight(&record, &bytes);
            bufs.list.push(Buffer { name: name.clone(), bytes: len, storage: Storage::Weights { offset }, mask });
            bufs.of.insert(name.clone(), bufs.list.len() - 1);
        }
        let inputs: Vec<usize> = g.inputs.iter().map(|i| bufs.arena(&i.name, i.ty.size_bytes())).collect();
        let strided =
            self.strided_transposes(g, info, folded, |b| !panelled.iter().any(|p| p == b) && !masks.contains_key(b));

        let mut kernels: Vec<Kernel> = Vec::new();
        let mut kernel_of: HashMap<(usize, usize), usize> = HashMap::new();
        let mut steps = Vec::new();
        // Per step, the positions of operands its kernel lets the result overwrite.
        let mut in_place: Vec<Vec<usize>> = Vec::new();
        for &r in &groups.roots {
            let node = &g.nodes[r];
            if consts.contains_key(&node.name) {
                continue;
            }
            let out = &info.types[&node.name];
            if let Some(weight) = absorbed.get(&node.name) {
                // Its matmuls read the half weight itself (`passes::fold`).
                let b = bufs.get(weight);
                bufs.of.insert(node.name.clone(), b);
                continue;
            }
            if strided.contains_key(&node.name) {
                // Its matmuls read its operand through strides.
                continue;
            }
            if node.op == Op::Reshape {
                // Same bytes, new shape: the result shares its operand's buffer.
                let b = bufs.get(&node.inputs[0]);
                bufs.of.insert(node.name.clone(), b);
                continue;
            }
            let mut operand_types: Vec<TensorType> = node.inputs.iter().map(|i| info.types[i].clone()).collect();
            if node.op == Op::MatMul {
                operand_types[1] = folded.stored(&node.inputs[1], &info.types);
            }
            let why = crate::attribution::key(node).and_then(|k| why.get(&k).cloned());
            if matches!(node.op, Op::Send | Op::Recv) {
                let t = transfer(node, out)?;
                let (exec, b) = if node.op == Op::Send {
                    // The send's result is its operand: nothing new to hold.
                    let b = bufs.get(&node.inputs[0]);
                    bufs.of.insert(node.name.clone(), b);
                    (Exec::Send(t), b)
                } else {
                    (Exec::Recv(t), bufs.arena(&node.name, out.size_bytes()))
                };
                steps.push(Step { node: node.name.clone(), exec, buffers: vec![b], why, scaling: None });
                in_place.push(Vec::new());
                continue;
            }
            // An elementwise step runs its fused group: the group's kernel spec and operands.
            let fused = node.op.is_elementwise().then(|| fused_spec(g, info, groups, r));
            // A reduction's group is its prologue (`passes::fuse`), in order, then itself:
            // the kernel reads the chain's operand.
            let prologue =
                Some(groups.members(info, r)).filter(|m| !node.op.is_elementwise() && m.len() > 1).map(|m| {
                    let ops: Vec<Op> = m[..m.len() - 1].iter().map(|&k| g.nodes[k].op).collect();
                    (ops, vec![g.nodes[m[0]].inputs[0].clone()])
                });
            let step_operands = (fused.as_ref().map(|(_, operands)| operands))
                .or(prologue.as_ref().map(|(_, operands)| operands))
                .unwrap_or(&node.inputs);
            // Over symbolic dims, the library GEMM and attention are planned for each call's
            // shapes; a generated kernel takes a run-time row count at most.
            let scaling = match &si {
                Some(si) => {
                    let library = matches!(node.op, Op::MatMul | Op::Attention);
                    crate::sizes::step_scaling(si, node, step_operands, library)?
                }
                None => None,
            };
            let scaling = scaling.map(|s| self.stated(s));
            if scaling.is_some() && node.op == Op::MatMul && masks.contains_key(node.inputs[1].as_str()) {
                bail!("node '{}': a pruned matmul over symbolic dims is not compiled yet", node.name);
            }
            // An 8-bit `a` is an integer product's too (less its zero point: `passes::zero_point`).
            let a_bytes = match operand_types[0].dtype {
                meshc_ir::DType::U8 => Some(Byte::U8),
                meshc_ir::DType::I8 => Some(Byte::I8),
                _ => None,
            };
            let integer =
                node.op == Op::MatMul && (operand_types[0].dtype == meshc_ir::DType::I32 || a_bytes.is_some());
            if integer && masks.contains_key(node.inputs[1].as_str()) {
                bail!("node '{}': an i32 matmul with a pruned weight is not compiled", node.name);
            }
            let use_library =
                node.op == Op::MatMul && !integer && (scaling.is_some() || self.library_serves(&operand_types));
            let mut shares = Vec::new();
            let (exec, operands, scratch) = if node.op.is_communication() {
                (Exec::Collective(self.collective(node, &operand_types[0], device, devices)?), node.inputs.clone(), 0)
            } else if let (Some(Scaling::Shapes(_)), Op::Transpose) = (&scaling, node.op) {
                // It moves a symbolic dim: the runner's transpose, which takes its shape
                // per call.
                let x = &operand_types[0];
                let perm = match attrs::Transpose::of(node).perm {
                    Some(p) => norm_axes(&p, x.rank()).map_err(anyhow::Error::msg)?,
                    None => (0..x.rank()).rev().collect(),
                };
                let t = Transpose { shape: x.shape.clone(), perm, elem: x.dtype.size_bytes() };
                (Exec::Library(Library::Transpose(t)), node.inputs.clone(), 0)
            } else if let (Some(Scaling::Shapes(_)), Op::ReduceSum | Op::ReduceMean | Op::ReduceMax) =
                (&scaling, node.op)
            {
                // It reduces along a symbolic dim: the runner's reduction, which takes its
                // shape per call (and has no prologue: `passes::fuse` gives none there).
                if prologue.is_some() {
                    bail!("node '{}': a reduction with a prologue along a symbolic dim is not compiled", node.name);
                }
                let x = &operand_types[0];
                if x.dtype != meshc_ir::DType::F32 {
                    bail!("node '{}': {} of {} along a symbolic dim is not compiled yet", node.name, node.op, x.dtype);
                }
                let axes = crate::passes::layout::reduced_axes(node, x.rank());
                let op = match node.op {
                    Op::ReduceSum => Reduce::Sum,
                    Op::ReduceMean => Reduce::Mean,
                    _ => Reduce::Max,
                };
                let r = Reduction { shape: x.shape.clone(), axes, op };
                (Exec::Library(Library::Reduce(r)), node.inputs.clone(), 0)
            } else if let (Some(Scaling::Shapes(_)), Op::Softmax) = (&scaling, node.op) {
                // It is along a symbolic dim: the runner's softmax, which takes its shape
                // per call (a softmax takes no prologue: `passes::fuse`).
                let x = &operand_types[0];
                if x.dtype != meshc_ir::DType::F32 {
                    bail!("node '{}': softmax of {} along a symbolic dim is not compiled yet", node.name, x.dtype);
                }
                let axis = norm_axis(attrs::Softmax::of(node).axis, x.rank()).map_err(anyhow::Error::msg)?;
                let s = SoftmaxAlong { shape: x.shape.clone(), axis };
                (Exec::Library(Library::Softmax(s)), node.inputs.clone(), 0)
            } else if let (Some(Scaling::Shapes(_)), Op::Concat) = (&scaling, node.op) {
                // It concatenates along or before a symbolic dim: the runner's concat, which
                // places each operand's part per call.
                let axis = norm_axis(attrs::Concat::of(node).axis, out.rank()).map_err(anyhow::Error::msg)?;
                let inputs = operand_types.iter().map(|t| t.shape.clone()).collect();
                let c = Concat { inputs, axis, elem: out.dtype.size_bytes() };
                (Exec::Library(Library::Concat(c)), node.inputs.clone(), 0)
            } else if node.op == Op::Attention {
                let steps = attrs::Attention::of(node).scores.steps();
                let scale = steps.iter().find_map(|s| match *s {
                    "mul" => Some(meshc_runtime::format::program::Scale::Mul),
                    "div" => Some(meshc_runtime::format::program::Scale::Div),
                    _ => None,
                });
                let mask =
                    steps.contains(&"add").then(|| info.types[node.inputs.last().expect("a mask")].shape.clone());
                let lib = Library::Attention(Attention {
                    q: operand_types[0].shape.clone(),
                    k: operand_types[1].shape.clone(),
                    v: operand_types[2].shape.clone(),
                    out: out.shape.clone(),
                    scale,
                    mask,
                });
                (Exec::Library(lib), node.inputs.clone(), 0)
            } else if integer {
                let lib = Library::IntMatmul(IntMatmul {
                    a: operand_types[0].shape.clone(),
                    b: operand_types[1].shape.clone(),
                    out: out.shape.clone(),
                    panels: panelled.contains(&node.inputs[1]),
                    a_bytes,
                    epilogue: epilogue(node, info)?,
                });
                (Exec::Library(lib), node.inputs.clone(), 0)
            } else if use_library {
                let lib = Library::Matmul(Matmul {
                    a: operand_types[0].shape.clone(),
                    b: operand_types[1].shape.clone(),
                    out: out.shape.clone(),
                    b_elem: Elem::of(operand_types[1].dtype),
                    panels: panelled.contains(&node.inputs[1]),
                    epilogue: epilogue(node, info)?,
                    transposed: Transposed {
                        a: strided.contains_key(&node.inputs[0]),
                        b: strided.contains_key(&node.inputs[1]),
                    },
                });
                let operands = node.inputs.iter().map(|i| strided.get(i).unwrap_or(i).clone()).collect();
                (Exec::Library(lib), operands, 0)
            } else {
                // A scaled kernel reads its rows from the size table, after its operands.
                let scaled = match &scaling {
                    Some(Scaling::Rows { size, hi, repeats }) => {
                        let buf = 1 + step_operands.len();
                        Some(codegen::rows::RowsArg { buf, slot: *size, hi: *hi, repeats: repeats.clone() })
                    }
                    _ => None,
                };
                let generate_step = || -> Result<(Generated, Vec<String>)> {
                    Ok(if let Some((spec, operands)) = fused {
                        // A fused loop reads each element before writing the same index, so an
                        // operand laid out exactly like the result (not broadcast) may be it.
                        shares = (spec.inputs.iter().enumerate())
                            .filter(|(_, t)| t.shape == out.shape && t.dtype.size_bytes() == out.dtype.size_bytes())
                            .map(|(k, _)| k + 1)
                            .collect();
                        (codegen::elementwise::fused(&self.target, &kernel_name(node), &spec)?, operands)
                    } else if node.op == Op::MatMul && masks.contains_key(node.inputs[1].as_str()) {
                        let (a, b) = (&operand_types[0], &operand_types[1]);
                        (codegen::matmul::masked(&self.target, &kernel_name(node), a, b, out)?, node.inputs.clone())
                    } else {
                        if node.op == Op::DynamicUpdateSlice {
                            // It copies its operand only where the result is elsewhere.
                            shares = vec![1];
                        }
                        match &prologue {
                            Some((ops, operands)) => {
                                let name = kernel_name(node);
                                let k = codegen::reduce::with_prologue(
                                    &self.target,
                                    &name,
                                    node,
                                    &operand_types,
                                    out,
                                    ops,
                                )?;
                                (k, operands.clone())
                            }
                            None => {
                                let generated = match constant_indices(g, folded, node, &operand_types)? {
                                    Some(table) => {
                                        let name = kernel_name(node);
                                        let (t, types) = (&self.target, &operand_types);
                                        codegen::movement::gather_table(t, &name, node, types, out, &table)?
                                    }
                                    None => None,
                                };
                                let generated = match generated {
                                    Some(k) => k,
                                    None => generate(&self.target, node, &operand_types, out)?,
                                };
                                (generated, node.inputs.clone())
                            }
                        }
                    })
                };
                let (generated, mut operands) = match scaled.clone() {
                    Some(arg) => {
                        codegen::rows::scaled(arg, generate_step).with_context(|| format!("node '{}'", node.name))?
                    }
                    None => generate_step()?,
                };
                if scaled.is_some() {
                    if generated.scratch > 0 {
                        bail!(
                            "node '{}': a kernel with scratch space over symbolic rows is not compiled yet",
                            node.name
                        );
                    }
                    operands.push(SIZES.to_string());
                }
                let (parts, scratch) = (generated.parts, generated.scratch);
                // Identical kernels share one copy of the code.
                let Place { offset, len } =
                    self.code.define(generated.func).with_context(|| format!("node '{}'", node.name))?;
                // The same code may serve steps with different numbers of buffers (a loop
                // over zero elements reads no operand): each arity is its own kernel.
                let arity = 1 + operands.len() + usize::from(scratch > 0);
                let k = *kernel_of.entry((offset, arity)).or_insert_with(|| {
                    kernels.push(Kernel {
                        name: kernel_name(node),
                        offset,
                        len,
                        parts,
                        args: Vec::new(),
                        in_place: shares.clone(),
                    });
                    kernels.len() - 1
                });
                (Exec::Kernel(k), operands, scratch)
            };
            let mut buffers = vec![bufs.arena(&node.name, out.size_bytes())];
            buffers.extend(operands.iter().map(|o| bufs.get(o)));
            if scratch > 0 {
                buffers.push(bufs.arena(&format!("{}.scratch", node.name), scratch));
            }
            if let Exec::Kernel(k) = exec {
                // Steps that share a kernel's code may pass buffers of different sizes (a
                // slice reads a prefix of each): the code reaches no further than the
                // smallest, which is what the runner then requires.
                let sizes = buffers.iter().map(|&b| bufs.list[b].bytes);
                let kernel = &mut kernels[k];
                if kernel.args.is_empty() {
                    kernel.args.extend(sizes);
                } else {
                    kernel.args.iter_mut().zip(sizes).for_each(|(a, s)| *a = (*a).min(s));
                    // In place is a property of the code at a position (it reads each
                    // element before writing that index): what one step's shapes show
                    // safe holds for every step running the same bytes.
                    for &k in &shares {
                        if !kernel.in_place.contains(&k) {
                            kernel.in_place.push(k);
                        }
                    }
                    kernel.in_place.sort();
                }
            }
            steps.push(Step { node: node.name.clone(), exec, buffers, why, scaling });
            in_place.push(shares);
        }
        let outputs = g.outputs.iter().map(|o| bufs.get(&o.name)).collect();
        if let (Some(b), Some(sym)) = (bufs.of.get(SIZES), &self.symbolic) {
            bufs.list[*b].bytes = 8 * sym.sizes.len();
        }
        let p = Program {
            device,
            arena_bytes: 0,
            buffers: bufs.list,
            kernels,
            steps,
            inputs,
            outputs,
            ..Program::default()
        };
        Ok((p, in_place))
    }

    fn collective(&mut self, node: &Node, operand: &TensorType, device: usize, devices: usize) -> Result<Collective> {
        // The fabric moves and reduces f32 elements only: refused here, with the node, rather
        // than at run time.
        if operand.dtype != meshc_ir::DType::F32 {
            bail!(
                "node '{}' ({} of a {operand} tensor): collectives carry f32 only; lay the tensor out so that it needs none (replicated, or split as its producer is)",
                node.name,
                node.op.name()
            );
        }
        let mut c = crate::attribution::collective(node, operand)?;
        let groups = &c.groups;
        if let Some(d) = groups.iter().flatten().find(|&&d| d >= devices) {
            bail!("node '{}': its groups name device {d}, but the mesh has {devices} device(s)", node.name);
        }
        if !groups.iter().any(|g| g.contains(&device)) {
            bail!("node '{}': device {device} runs it but is in none of its groups", node.name);
        }
        let next = self.collectives.len();
        c.id = *self.collectives.entry(node.name.clone()).or_insert(next);
        Ok(c)
    }

    /// With symbols: the program's symbolic shapes (inferred at the upper bounds, at which
    /// the graph is written), and its inputs, outputs and checks kept for the metadata.
    fn symbolic_program(&mut self, devices: usize, g: &Graph, info: &Info) -> Result<Option<SymInfo>> {
        if self.symbols.is_empty() {
            return Ok(None);
        }
        if devices != 1 {
            bail!(
                "symbolic dims compile for one device for now: give each a size (--dim NAME=N) to compile for a mesh of {devices}"
            );
        }
        let si = meshc_ir::sym::infer_graph(g, info, &self.symbols)
            .map_err(|e| anyhow::anyhow!("symbolic shapes of the program at the upper bounds: {e}"))?;
        let shape = |name: &str| si.shapes[name].clone();
        self.symbolic = Some(Symbolic {
            symbols: self.symbols.values().cloned().collect(),
            inputs: g.inputs.iter().map(|i| shape(&i.name)).collect(),
            outputs: g.outputs.iter().map(|o| shape(&o.name)).collect(),
            checks: si.checks.clone(),
            sizes: Vec::new(),
        });
        Ok(Some(si))
    }

    /// The size table's entry for `rows` (added the first time).
    fn size_slot(&mut self, rows: &meshc_ir::sym::Expr) -> usize {
        let sizes = &mut self.symbolic.as_mut().expect("a symbolic compile").sizes;
        match sizes.iter().position(|e| e == rows) {
            Some(i) => i,
            None => {
                sizes.push(rows.clone());
                sizes.len() - 1
            }
        }
    }

    /// How a step scales, as the artifact states it and a scaled kernel reads it: a
    /// generated kernel's rows and its repeating operands' strides and periods become
    /// size-table entries, the repeats per kernel buffer, the result (which repeats
    /// nothing) first, and none when no operand repeats.
    fn stated(&mut self, s: StepScaling) -> Scaling {
        let (rows, hi, repeats) = match s {
            StepScaling::Shapes(shapes) => return Scaling::Shapes(shapes),
            StepScaling::Rows { rows, hi, repeats } => (rows, hi, repeats),
        };
        let size = self.size_slot(&rows);
        if repeats.iter().all(Option::is_none) {
            return Scaling::Rows { size, hi, repeats: Vec::new() };
        }
        let repeats = std::iter::once(None)
            .chain(repeats.iter().map(|r| {
                r.as_ref().map(|r| RepeatSlots {
                    stride: (r.stride.as_const() != Some(1)).then(|| self.size_slot(&r.stride)),
                    period: self.size_slot(&r.period),
                })
            }))
            .collect();
        Scaling::Rows { size, hi, repeats }
    }

    fn finish(self, mut meta: Meta, programs: Vec<Program>) -> Result<Compiled> {
        meta.symbolic = self.symbolic;
        Ok(Compiled { meta, programs, code: self.code.finish()?, weights: self.weights })
    }
}

/// One side of a transfer from a send or recv node (`passes::sendrecv`).
fn transfer(node: &Node, ty: &TensorType) -> Result<Transfer> {
    let (key, peer, protocol) = match node.op {
        Op::Send => {
            let a = attrs::Send::of(node);
            (a.key, a.to, a.protocol)
        }
        _ => {
            let a = attrs::Recv::of(node);
            (a.key, a.from, a.protocol)
        }
    };
    let protocol = Protocol::parse(protocol.as_str())
        .with_context(|| format!("node '{}': protocol {protocol} has no runtime transfer", node.name))?;
    let peer = usize::try_from(peer).with_context(|| format!("node '{}': device {peer}", node.name))?;
    Ok(Transfer { key, peer, bytes: ty.size_bytes(), protocol })
}

fn meta(g: &Graph, info: &Info, target: &Target, mesh: Mesh, layouts: &HashMap<String, Layout>) -> Meta {
    let spec = |name: &str, ty: &TensorType| {
        IoSpec::with_layout(name, ty, layouts.get(name).cloned().unwrap_or_else(|| vec![None; ty.rank()]))
            .with_dims(info.dims.get(name))
    };
    Meta {
        graph: g.name.clone(),
        target: target.name.clone(),
        features: target.features.clone(),
        mesh,
        flops: g.nodes.iter().map(|n| node_flops(n, info)).sum(),
        inputs: g.inputs.iter().map(|i| spec(&i.name, &i.ty)).collect(),
        outputs: g.outputs.iter().map(|o| spec(&o.name, &info.types[&o.name])).collect(),
        degraded: Default::default(),
        model_axes: Vec::new(),
        hosts: Vec::new(),
        symbolic: None,
    }
}

/// The IR of the device and program passes: every device's program with what the
/// verifier inferred of it, its constants and fusion groups, then its runtime program.
struct Back<'a> {
    lowered: &'a Lowered,
    params: &'a Params<'a>,
    opts: &'a Options,
    b: Builder,
    /// The devices with work (a degraded one has none, `degraded::leave_out`): each its
    /// number, program, and types as the verifier infers them (None once a pass rewrote
    /// the program, until it is verified again).
    devices: Vec<(usize, Cow<'a, Graph>, Option<Info>)>,
    folded: Vec<Folded<'a>>,
    groups: Vec<Groups>,
    /// One per device of the mesh, in device order.
    programs: Vec<Program>,
    /// Per program, per step, the operand positions its kernel lets the result overwrite.
    in_place: Vec<Vec<Vec<usize>>>,
}

/// What the verifier inferred of a device's program: it ran after every pass that rewrote
/// one (`pipeline::Pass::verify`).
fn verified(info: &Option<Info>) -> &Info {
    info.as_ref().expect("every pass that rewrites a program is verified after it")
}

impl Back<'_> {
    /// Every device's program in the text format (it parses back, fused nodes and all).
    fn programs_text(&self) -> String {
        let mut s = String::new();
        for (d, g, _) in &self.devices {
            s.push_str(&format!("# device {d}\n"));
            s.push_str(&meshc_ir::text::print(g));
        }
        s
    }
}

impl pipeline::Ir for Back<'_> {
    fn lacks(&self, _: &Pass) -> Option<&'static str> {
        None
    }

    fn run(&mut self, pass: &Pass) -> Result<()> {
        match pass.level {
            Level::Device(DevicePass::Expand) => {
                let symbolic = !self.opts.symbols.is_empty();
                for (d, dev, info) in self.devices.iter_mut().filter(|(_, dev, _)| passes::expand::needed(dev)) {
                    *dev = Cow::Owned(
                        passes::expand::expand(dev, verified(info), symbolic).with_context(|| format!("device {d}"))?,
                    );
                    *info = None;
                }
            }
            Level::Device(DevicePass::Quantize) => {
                let (masks, weights) = (&self.opts.masks, self.opts.weights);
                for (_, dev, info) in self.devices.iter_mut() {
                    if let Some((q, _)) = passes::quantize::quantize(dev, verified(info), masks, weights) {
                        (*dev, *info) = (Cow::Owned(q), None);
                    }
                }
            }
            Level::Device(DevicePass::Fold) => {
                let (params, opts) = (self.params, self.opts);
                self.folded = (self.devices.iter())
                    .map(|(d, dev, info)| {
                        passes::fold::fold(dev, verified(info), params, &opts.masks, opts.weights, &Default::default())
                            .with_context(|| format!("device {d}"))
                    })
                    .collect::<Result<Vec<_>>>()?;
            }
            Level::Device(DevicePass::Gelu) => {
                for ((_, dev, info), f) in self.devices.iter_mut().zip(&self.folded) {
                    if let Some(g) = passes::gelu::recognise(dev, verified(info), f) {
                        (*dev, *info) = (Cow::Owned(g), None);
                    }
                }
            }
            Level::Device(DevicePass::Attention) => {
                for ((_, dev, info), f) in self.devices.iter_mut().zip(&self.folded).filter(|_| self.opts.attention) {
                    if let Some(fused) = passes::attention::fuse(dev, verified(info), f) {
                        (*dev, *info) = (Cow::Owned(fused), None);
                    }
                }
            }
            Level::Device(DevicePass::Epilogue) => {
                for ((_, dev, info), f) in self.devices.iter_mut().zip(&self.folded).filter(|_| self.opts.epilogues) {
                    let types = &verified(info).types;
                    let b = &self.b;
                    let library =
                        |n: &Node| b.library_serves(&[types[&n.inputs[0]].clone(), f.stored(&n.inputs[1], types)]);
                    if let Some(fused) = passes::epilogue::fuse(dev, verified(info), f, library) {
                        (*dev, *info) = (Cow::Owned(fused), None);
                    }
                }
            }
            Level::Device(DevicePass::ZeroPoint) => {
                for ((_, dev, info), f) in self.devices.iter_mut().zip(&self.folded) {
                    if let Some(g) = passes::zero_point::fuse(dev, verified(info), f) {
                        (*dev, *info) = (Cow::Owned(g), None);
                    }
                }
            }
            // Over symbolic dims the pass is not run: a reduction along one is the runner's,
            // planned per call, and what a partial would scale with is not worked out.
            Level::Device(DevicePass::ReduceSplit) if !self.opts.symbols.is_empty() => {}
            Level::Device(DevicePass::ReduceSplit) => {
                for ((_, dev, info), f) in self.devices.iter_mut().zip(&self.folded) {
                    if let Some(g) = passes::reduce_split::split(dev, verified(info), f) {
                        (*dev, *info) = (Cow::Owned(g), None);
                    }
                }
            }
            Level::Device(DevicePass::Fuse) => {
                self.groups = (self.devices.iter().zip(&self.folded))
                    .map(|((_, dev, info), f)| passes::fuse::fuse(dev, verified(info), f, self.opts.symbols.is_empty()))
                    .collect();
            }
            Level::Program(ProgramPass::Codegen) => {
                let n = self.lowered.devices.len();
                self.programs = (0..n).map(|d| Program { device: d, ..Default::default() }).collect();
                self.in_place = vec![Vec::new(); n];
                for (((d, dev, info), f), gr) in self.devices.iter().zip(&self.folded).zip(&self.groups) {
                    let (p, shares) = (self.b)
                        .program((*d, n), dev, verified(info), f, gr, &self.lowered.why)
                        .with_context(|| format!("device {d}"))?;
                    (self.programs[*d], self.in_place[*d]) = (p, shares);
                }
            }
            Level::Program(ProgramPass::Streams) => {
                for (p, shares) in self.programs.iter_mut().zip(&mut self.in_place) {
                    passes::streams::schedule(p, shares);
                    p.streams = passes::streams::assign(p, &self.opts.streams);
                }
            }
            Level::Program(ProgramPass::Buffers) => {
                for (p, shares) in self.programs.iter_mut().zip(&self.in_place) {
                    if self.opts.plan_arena {
                        passes::buffers::plan(p, shares);
                    } else {
                        passes::buffers::naive(p);
                    }
                }
            }
            Level::Global(_) | Level::Stage(_) => unreachable!("the driver runs {}", pass.name),
        }
        Ok(())
    }

    fn verify(&mut self, pass: &Pass) -> Result<()> {
        for (d, dev, info) in self.devices.iter_mut().filter(|(_, _, info)| info.is_none()) {
            *info = Some(
                verify(dev).with_context(|| format!("device {d}: the program {} made does not verify", pass.name))?,
            );
        }
        Ok(())
    }

    fn text(&self, pass: &Pass) -> Result<String> {
        Ok(match pass.level {
            Level::Device(
                DevicePass::Expand
                | DevicePass::Quantize
                | DevicePass::Gelu
                | DevicePass::Attention
                | DevicePass::Epilogue
                | DevicePass::ZeroPoint
                | DevicePass::ReduceSplit,
            ) => self.programs_text(),
            Level::Device(DevicePass::Fold) => {
                let v: Vec<_> = self.devices.iter().zip(&self.folded).map(|((d, dev, _), f)| (*d, &**dev, f)).collect();
                passes::fold::dump(&v)
            }
            Level::Device(DevicePass::Fuse) => {
                let v: Vec<_> = (self.devices.iter().zip(&self.groups))
                    .map(|((d, dev, info), gr)| (*d, &**dev, verified(info), gr))
                    .collect();
                passes::fuse::dump(&v)
            }
            Level::Program(ProgramPass::Codegen) => codegen_dump(&self.programs),
            Level::Program(ProgramPass::Streams) => passes::streams::dump(&self.programs),
            Level::Program(ProgramPass::Buffers) => passes::buffers::dump(&self.programs),
            Level::Global(_) | Level::Stage(_) => unreachable!("the driver dumps {}", pass.name),
        })
    }

    fn dot(&self, pass: &Pass) -> String {
        match pass.level {
            Level::Program(ProgramPass::Streams) => crate::dot::streams(&self.programs),
            _ => unreachable!("{} has no dot form", pass.name),
        }
    }
}

/// The `--dump-after codegen` text: per device, its kernels (with the operands each lets
/// its result overwrite), its buffers (weights, or arena space the buffers pass places) and
/// its steps in program order, each with what runs it and the buffers it is given.
fn codegen_dump(programs: &[Program]) -> String {
    let mut s = String::new();
    for p in programs {
        let (k, b, n) = (p.kernels.len(), p.buffers.len(), p.steps.len());
        s += &format!("device {}: {k} kernels, {b} buffers, {n} steps\n", p.device);
        for (i, k) in p.kernels.iter().enumerate() {
            let shares: Vec<String> = k.in_place.iter().map(usize::to_string).collect();
            let shares =
                if shares.is_empty() { String::new() } else { format!("  in place of operand {}", shares.join(", ")) };
            s += &format!("  k{i:<4} {}{shares}\n", k.name);
        }
        for (i, buf) in p.buffers.iter().enumerate() {
            let at = match buf.storage {
                Storage::Weights { .. } if buf.mask.is_some() => "weights, masked",
                Storage::Weights { .. } => "weights",
                Storage::Arena { .. } => "arena",
                Storage::Sizes => "size table",
            };
            s += &format!("  b{i:<4} {:<28} {:>10} bytes  {at}\n", buf.name, buf.bytes);
        }
        for st in &p.steps {
            let bufs: Vec<String> = st.buffers.iter().map(|b| format!("b{b}")).collect();
            let line = format!(
                "  {:<28} {:<36} ({})",
                st.node,
                meshc_runtime::format::order::exec_text(p, st),
                bufs.join(", ")
            );
            s += line.trim_end();
            s.push('\n');
        }
    }
    s
}

/// What the device and program passes made of the lowered programs: the runtime program of
/// every device, and the code and weights they share. `finish` adds the metadata.
pub struct Built {
    programs: Vec<Program>,
    b: Builder,
}

impl Built {
    /// The compiled graph `g` (verified as `info`, whose FLOPs the metadata counts), of which
    /// `lowered` is the lowering these programs were made from.
    pub fn finish(self, g: &Graph, info: &Info, lowered: &Lowered) -> Result<Compiled> {
        let Built { mut programs, b } = self;
        let layouts: HashMap<String, Layout> = lowered.inputs.iter().chain(&lowered.outputs).cloned().collect();
        let mut meta = meta(g, info, &b.target, lowered.mesh.clone(), &layouts);
        for io in meta.inputs.iter_mut().chain(&mut meta.outputs) {
            io.stage = lowered.io_stages.get(&io.name).cloned();
        }
        // Placed programs list, after the graph's inputs, placeholders of the outputs a device
        // does not hold: they are no inputs of the run.
        for p in &mut programs {
            p.inputs.truncate(g.inputs.len());
        }
        b.finish(meta, programs)
    }
}

/// Runs the device and program passes of `pipeline::PASSES` over `lowered`, whose
/// params' values are `params`, as `inst` asks: None when it stops after a pass. `infos` holds what the verifier
/// inferred of each device's program where the caller has verified it; the others are
/// verified first.
pub fn run<'a>(
    lowered: &'a Lowered,
    infos: Vec<Option<Info>>,
    params: &'a Params<'a>,
    opts: &'a Options,
    inst: &Instrument,
) -> Result<Option<Built>> {
    let mut devices = Vec::new();
    for ((d, dev), info) in lowered.devices.iter().enumerate().zip(infos) {
        if dev.nodes.is_empty() && dev.outputs.is_empty() {
            continue;
        }
        let info = match info {
            Some(info) => info,
            None => verify(dev).with_context(|| format!("device {d}: the lowered program does not verify"))?,
        };
        devices.push((d, Cow::Borrowed(dev), Some(info)));
    }
    let mut back = Back {
        lowered,
        params,
        opts,
        b: Builder::new(opts)?,
        devices,
        folded: Vec::new(),
        groups: Vec::new(),
        programs: Vec::new(),
        in_place: Vec::new(),
    };
    Ok(match pipeline::run(&mut back, pipeline::back(), inst)? {
        Flow::Done => Some(Built { programs: back.programs, b: back.b }),
        Flow::Stopped => None,
    })
}

/// Compiles the per-device programs of `lowered`, the lowering of `g` (verified as `info`,
/// whose FLOPs the metadata counts), with `params` holding `g`'s params: the device and
/// program passes (`run`), dumped as `dumps` asks.
pub fn compile_lowered<'p>(
    g: &Graph,
    info: &Info,
    lowered: &Lowered,
    params: impl Into<Params<'p>>,
    opts: &Options,
    dumps: &Dumps,
) -> Result<Compiled> {
    let params = params.into();
    let built = run(lowered, vec![None; lowered.devices.len()], &params, opts, &Instrument::dumps(dumps))?;
    built.expect("only --stop-after stops the pipeline").finish(g, info, lowered)
}

/// Compiles a graph for one device.
pub fn compile<'p>(g: &Graph, info: &Info, params: impl Into<Params<'p>>, opts: &Options) -> Result<Compiled> {
    compile_lowered(g, info, &Lowered::single(g, info), params, opts, &Dumps::default())
}
