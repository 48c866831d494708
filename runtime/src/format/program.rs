//! The per-device program: what the compiler hands the runner through the artifact, and all
//! the runner knows — buffers with logical numbers and where they live, kernels (offsets into
//! the code section), library calls, and the steps that tie them together (docs/design.md §4.4's op
//! DAG, buffer data and library data). Serialised as JSON inside the artifact.

use meshc_ir::{DType, Dims, TensorType};
use serde::{Deserialize, Serialize};

use crate::format::degradation::Degradation;
use crate::format::mesh::{Layout, Mesh};

/// Alignment of every buffer, weight and arena slot.
pub const ALIGN: usize = 64;

pub fn align_up(n: usize, a: usize) -> usize {
    n.div_ceil(a) * a
}

/// Everything the artifact says about the compiled graph as a whole.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub graph: String,
    pub target: String,
    /// CPU features the code relies on; the runner refuses a CPU that lacks one.
    pub features: Vec<String>,
    /// The devices the programs run on (`Mesh::single()` without a layout spec).
    pub mesh: Mesh,
    /// Estimated floating-point operations of one run (for GFLOP/s figures).
    pub flops: u64,
    pub inputs: Vec<IoSpec>,
    pub outputs: Vec<IoSpec>,
    /// The devices and links the layout spec names degraded (docs/design.md §6.2): those devices run
    /// nothing, and the collectives route around them.
    #[serde(default, skip_serializing_if = "Degradation::is_empty")]
    pub degraded: Degradation,
    /// The mesh axes some param is split over: a device lost along them would take its
    /// shard of the model with it, so no degradation may fail a device then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_axes: Vec<usize>,
    /// The devices of each host (the layout spec's `hosts`): under `meshc run --transport
    /// mpi`, rank h runs the devices of host h. Empty: one host runs every device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Vec<usize>>,
    /// Compiled with symbolic dims: the inputs' and outputs' shapes above are at the upper
    /// bounds, and each call's are these expressions at the symbols its inputs bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbolic: Option<crate::format::symbolic::Symbolic>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoSpec {
    pub name: String,
    pub dtype: String,
    /// The whole tensor's shape; each device's buffer holds its block under `layout`.
    pub shape: Vec<usize>,
    /// The names the graph gives its dimensions (`dims(batch, _)`, an ONNX input's
    /// `dim_param`s), one per dimension, `None` for an unnamed one; empty when it names none.
    /// Only callers read it (the runner never does), so it is optional, and left out when
    /// empty: an artifact of a graph without dim names is the same bytes as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dims: Dims,
    /// The mesh axis each dimension is split over (`mesh::Mesh::region`).
    pub layout: Layout,
    /// With placement: the stage (sub-mesh) that holds the tensor; `layout` is over its mesh
    /// and devices outside it hold nothing (a 0-byte placeholder buffer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<StageMesh>,
}

/// A stage of a placed graph: a sub-mesh of the device mesh. Its local device k (row-major
/// over `mesh`) is the global device `devices[k]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageMesh {
    pub mesh: Mesh,
    pub devices: Vec<usize>,
}

impl IoSpec {
    pub fn new(name: &str, ty: &TensorType) -> IoSpec {
        IoSpec::with_layout(name, ty, vec![None; ty.shape.len()])
    }

    pub fn with_layout(name: &str, ty: &TensorType, layout: Layout) -> IoSpec {
        IoSpec {
            name: name.to_string(),
            dtype: ty.dtype.name().to_string(),
            shape: ty.shape.clone(),
            dims: Vec::new(),
            layout,
            stage: None,
        }
    }

    /// With the graph's dim names `dims` of the tensor (none when every one is unnamed).
    pub fn with_dims(self, dims: Option<&Dims>) -> IoSpec {
        let dims = dims.filter(|d| d.iter().any(Option::is_some)).cloned().unwrap_or_default();
        IoSpec { dims, ..self }
    }

    /// The name of each dimension, `None` where the graph names none.
    pub fn dim_names(&self) -> Dims {
        if self.dims.is_empty() {
            vec![None; self.shape.len()]
        } else {
            self.dims.clone()
        }
    }

    /// The block of the tensor `device` holds (index ranges per dimension), and whether it
    /// is the copy of that block that writes it back; `None` when the device holds none.
    pub fn block(&self, mesh: &Mesh, device: usize) -> Option<(Vec<std::ops::Range<usize>>, bool)> {
        let (mesh, local) = self.local(mesh, device)?;
        Some((mesh.region(&self.shape, &self.layout, local), mesh.writes_back(&self.layout, local)))
    }

    /// The mesh `layout` is over and `device`'s place in it; `None` when the device is
    /// outside the tensor's stage (it holds none of it).
    pub fn local<'a>(&'a self, mesh: &'a Mesh, device: usize) -> Option<(&'a Mesh, usize)> {
        match &self.stage {
            None => Some((mesh, device)),
            Some(s) => Some((&s.mesh, s.devices.iter().position(|&d| d == device)?)),
        }
    }

    /// The mesh `layout` is over: the stage's, or the whole one.
    pub fn mesh<'a>(&'a self, mesh: &'a Mesh) -> &'a Mesh {
        self.stage.as_ref().map_or(mesh, |s| &s.mesh)
    }

    pub fn ty(&self) -> Option<TensorType> {
        Some(TensorType::new(self.elem()?, self.shape.clone()))
    }

    /// The dtype, if it is one meshc has: `ty`'s, without building the type (a run asks
    /// on every call, and must not allocate).
    pub fn elem(&self) -> Option<DType> {
        DType::parse(&self.dtype)
    }

    /// The whole tensor's bytes, if its dtype is one meshc has.
    pub fn size_bytes(&self) -> Option<usize> {
        Some(self.elem()?.size_bytes() * self.shape.iter().product::<usize>())
    }
}

/// Where a buffer's bytes live at run time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// In the device's arena, at this byte offset.
    Arena { offset: usize },
    /// In the artifact's weights section, at this byte offset (mapped, never copied).
    Weights { offset: usize },
    /// The call's size table (`Symbolic::sizes`, one i64 each), which the runner fills
    /// before the first step.
    Sizes,
}

impl Storage {
    /// The byte offset in the arena or the weights; `None` for the size table.
    pub fn offset(&self) -> Option<usize> {
        match *self {
            Storage::Arena { offset } | Storage::Weights { offset } => Some(offset),
            Storage::Sizes => None,
        }
    }
}

/// A logical buffer: its number is its index in `Program::buffers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// The tensor it holds (or `NODE.scratch` for a kernel's scratch space).
    pub name: String,
    pub bytes: usize,
    pub storage: Storage,
    /// A pruning mask record (`crate::format::mask`) stored right before this weight, read by the
    /// matmul that takes the weight as its right operand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<MaskInfo>,
}

/// What the program says about a weight's mask record; the record itself says which runs
/// are kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaskInfo {
    /// The record's length: it occupies the bytes just before the weight.
    pub bytes: usize,
    /// Rows (K) and columns (N) of the weight's matrices.
    pub rows: usize,
    pub cols: usize,
    /// FLOPs of the matmul that reads the weight, unpruned, and those the mask skips.
    pub flops: u64,
    pub flops_skipped: u64,
}

/// A generated kernel inside the code section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub name: String,
    pub offset: usize,
    pub len: usize,
    /// Into how many parts the runner may split a call (the kernel ABI's `part`/`parts`).
    pub parts: usize,
    /// Per buffer the kernel takes (result, operands, scratch), bytes its code may reach
    /// (shapes are baked in; the smallest buffer any of its steps passes): the runner
    /// refuses a step that passes fewer buffers or smaller ones.
    pub args: Vec<usize>,
    /// The operand positions (of `args`) whose buffer may be the result's: the code reads
    /// each element before writing it. The runner accepts a plan in which a buffer shares
    /// bytes with another it is live with only for these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_place: Vec<usize>,
}

/// A subroutine linked into the runner (docs/design.md §4.5).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Library {
    Matmul(Matmul),
    IntMatmul(IntMatmul),
    Attention(Attention),
    Transpose(Transpose),
    Reduce(Reduction),
    Softmax(SoftmaxAlong),
    Concat(Concat),
}

impl Library {
    /// The call at other shapes of its buffers (`shapes[i]`: buffer i's, in buffer order):
    /// a matmul's result, operands and epilogue operands; attention's result, q, k, v,
    /// then (past the scale's) the mask; a transpose's, a reduction's or a softmax's result and operand;
    /// a concat's result and operands.
    pub fn at_shapes(&self, shapes: &[Vec<usize>]) -> Library {
        use crate::format::epilogue::Step;
        let at = |i: usize| shapes.get(i).cloned().unwrap_or_default();
        // An epilogue's operands follow the result, a and b (and an 8-bit a's zero point).
        let epilogue = |steps: &[Step], first: usize| {
            let mut next = first;
            let mut steps = steps.to_vec();
            for s in &mut steps {
                if let Step::Add(shape) | Step::Mul(shape) | Step::Div(shape) = s {
                    *shape = at(next);
                    next += 1;
                }
            }
            steps
        };
        match self {
            Library::Matmul(m) => {
                let epilogue = epilogue(&m.epilogue, 3);
                Library::Matmul(Matmul { out: at(0), a: at(1), b: at(2), epilogue, ..m.clone() })
            }
            Library::IntMatmul(m) => {
                let epilogue = epilogue(&m.epilogue, 3 + usize::from(m.a_bytes.is_some()));
                Library::IntMatmul(IntMatmul { out: at(0), a: at(1), b: at(2), epilogue, ..m.clone() })
            }
            Library::Attention(a) => {
                let mask = 4 + usize::from(a.scale.is_some());
                Library::Attention(Attention {
                    out: at(0),
                    q: at(1),
                    k: at(2),
                    v: at(3),
                    mask: a.mask.as_ref().map(|_| at(mask)),
                    scale: a.scale,
                })
            }
            Library::Transpose(t) => Library::Transpose(Transpose { shape: at(1), ..t.clone() }),
            Library::Reduce(r) => Library::Reduce(Reduction { shape: at(1), ..r.clone() }),
            Library::Softmax(s) => Library::Softmax(SoftmaxAlong { shape: at(1), ..s.clone() }),
            Library::Concat(c) => {
                Library::Concat(Concat { inputs: (1..=c.inputs.len()).map(at).collect(), ..c.clone() })
            }
        }
    }
}

/// A reduction of an f32 tensor of `shape` (the operand's) over `axes`, kept as dims of 1
/// or not (the result's bytes are the same), by the runner (`crate::kernels::reduce`): for
/// a program compiled with symbolic dims that reduces along one (a loss over the batch,
/// dynamic quantization's range of a whole tensor), whose calls decide how many elements
/// each result reduces. Buffers: result, operand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reduction {
    pub shape: Vec<usize>,
    pub axes: Vec<usize>,
    pub op: Reduce,
}

/// A softmax of an f32 tensor of `shape` along `axis`, by the runner
/// (`crate::kernels::softmax`): for a program compiled with symbolic dims whose softmax is
/// along one (masked attention scores over the sequence), whose calls decide the runs'
/// length. Buffers: result, operand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SoftmaxAlong {
    pub shape: Vec<usize>,
    pub axis: usize,
}

/// numpy concatenate of operands of `inputs` shapes along `axis`, elements of `elem`
/// bytes, by the runner (`crate::kernels::concat`): for a program compiled with symbolic
/// dims that concatenates along one, or before one (a cache of keys and the new ones along
/// the sequence), whose calls decide where each operand's part begins. Buffers: result,
/// then the operands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Concat {
    pub inputs: Vec<Vec<usize>>,
    pub axis: usize,
    pub elem: usize,
}

/// numpy transpose of a tensor of `shape` (the operand's) with elements of `elem` bytes,
/// by the runner (`crate::kernels::transpose`): for a program compiled with symbolic dims,
/// whose calls decide the shape. Buffers: result, operand.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transpose {
    pub shape: Vec<usize>,
    pub perm: Vec<usize>,
    pub elem: usize,
}

/// numpy matmul of f32 operands (batched, broadcasting) by the runner's GEMM; the right
/// operand, a weight, may be stored as f16 or bf16 (`b_elem`). Buffers: result, a, b, then
/// the epilogue's operands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Matmul {
    pub a: Vec<usize>,
    pub b: Vec<usize>,
    pub out: Vec<usize>,
    #[serde(default, skip_serializing_if = "Elem::is_f32")]
    pub b_elem: Elem,
    /// `b` is a weight stored in the GEMM's panels (`crate::kernels::panels`, f32), not row-major.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub panels: bool,
    /// Elementwise steps applied to the result as the GEMM finishes each block of it
    /// (`crate::kernels::epilogue`); their operands are the step's buffers after `b`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epilogue: Vec<crate::format::epilogue::Step>,
    /// Whether `a` and `b` are stored transposed: the buffer holds the operand with its
    /// last two dims swapped (a transpose the compiler left to the GEMM's strides).
    #[serde(default, skip_serializing_if = "Transposed::is_none")]
    pub transposed: Transposed,
}

/// numpy matmul of i32 operands (batched, broadcasting), every sum wrapping as ONNX's i32
/// accumulator, by the runner's integer GEMM (`crate::kernels::igemm`): the product of
/// 8-bit operands less their zero points. Buffers: result, a, b, the zero point of an
/// 8-bit `a`, then the epilogue's operands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntMatmul {
    pub a: Vec<usize>,
    pub b: Vec<usize>,
    pub out: Vec<usize>,
    /// `b` is a weight stored packed as 8-bit panels with its column corrections
    /// (`crate::kernels::igemm::pack`), not row-major i32.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub panels: bool,
    /// `a` is stored in 8 bits, and the product is of `a − zero point` (an i32, the buffer
    /// after `b`): the kernel reads the bytes as they are instead of an i32 copy of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a_bytes: Option<Byte>,
    /// Steps applied to each block of the result as it is finished, as `Matmul`'s: empty
    /// (the result i32), or `to_f32` and then f32 steps (the result f32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epilogue: Vec<crate::format::epilogue::Step>,
}

/// An 8-bit integer type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Byte {
    U8,
    I8,
}

/// Fused attention (`crate::kernels::attention`): `softmax(scores, -1) @ v`, the scores
/// `q @ k` (`k` holding kᵀ) scaled by the number in the buffer after `v` if `scale` says
/// how, then plus the mask (of shape `mask`, the next buffer) if there is one. Buffers:
/// result, q, k, v, then the scale's and the mask's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attention {
    pub q: Vec<usize>,
    pub k: Vec<usize>,
    pub v: Vec<usize>,
    pub out: Vec<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Vec<usize>>,
}

/// How fused attention scales its scores by the step's scale buffer (one f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    Mul,
    Div,
}

impl Scale {
    pub fn name(self) -> &'static str {
        match self {
            Scale::Mul => "mul",
            Scale::Div => "div",
        }
    }
}

/// Which operands of a library matmul are stored transposed (`Matmul::transposed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transposed {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub a: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub b: bool,
}

impl Transposed {
    pub fn is_none(&self) -> bool {
        !self.a && !self.b
    }
}

/// How a library matmul's right operand is stored: f32, or a half type that the GEMM
/// widens a block of rows at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Elem {
    #[default]
    F32,
    F16,
    Bf16,
}

impl Elem {
    pub fn is_f32(&self) -> bool {
        *self == Elem::F32
    }

    pub fn size(self) -> usize {
        if self == Elem::F32 {
            4
        } else {
            2
        }
    }

    /// The storage of a `dtype` operand (f32 for anything that is not a half).
    pub fn of(dtype: DType) -> Elem {
        match dtype {
            DType::F16 => Elem::F16,
            DType::BF16 => Elem::Bf16,
            _ => Elem::F32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reduce {
    Sum,
    Max,
    /// The sum divided by the number of contributions.
    Mean,
}

impl Reduce {
    pub fn name(self) -> &'static str {
        match self {
            Reduce::Sum => "sum",
            Reduce::Max => "max",
            Reduce::Mean => "mean",
        }
    }

    pub fn parse(s: &str) -> Option<Reduce> {
        match s {
            "sum" => Some(Reduce::Sum),
            "max" => Some(Reduce::Max),
            "mean" => Some(Reduce::Mean),
            _ => None,
        }
    }
}

/// What a collective computes (numpy-style axes of the local operand).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    AllReduce {
        reduce: Reduce,
    },
    /// Concatenates the members' operands along `axis`, in rank order.
    AllGather {
        axis: usize,
    },
    /// Reduces, then member r keeps block r of `axis`.
    ReduceScatter {
        axis: usize,
        reduce: Reduce,
    },
    /// Member r sends block s of `split_axis` to member s and concatenates what it receives
    /// along `concat_axis`, in rank order.
    AllToAll {
        split_axis: usize,
        concat_axis: usize,
    },
}

/// A collective over groups of devices. Every member of a group runs the step with the same
/// `id`; the runner's fabric pairs them up by it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    pub op: CollectiveOp,
    /// Numbers the collectives of the compiled graph; equal on all members of a group.
    pub id: usize,
    /// All groups of the collective (disjoint), each in rank order; the device's own group is
    /// the one that contains it.
    pub groups: Vec<Vec<usize>>,
    /// f32 only for now: dtype and shape of this device's operand.
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// How a send/recv pair moves its bytes, chosen at compile time (docs/design.md §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Same process, the send's buffer dead after it: the receiver reads the sender's
    /// memory in place (the sender never reuses it within the run), no copy, and the send
    /// does not wait.
    Move,
    /// Same process: the receiver announces its buffer, the sender copies into it.
    Copy,
    /// Another process: reserved for a transport between processes (docs/design.md §7).
    Remote,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Move => "move",
            Protocol::Copy => "copy",
            Protocol::Remote => "remote",
        }
    }

    pub fn parse(s: &str) -> Option<Protocol> {
        [Protocol::Move, Protocol::Copy, Protocol::Remote].into_iter().find(|p| p.name() == s)
    }
}

/// One side of a point-to-point transfer. The pair shares `key`; `peer` is the other side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transfer {
    pub key: String,
    pub peer: usize,
    pub bytes: usize,
    pub protocol: Protocol,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exec {
    Kernel(usize),
    Library(Library),
    /// Buffers: result, operand.
    Collective(Collective),
    /// Buffers: the operand sent.
    Send(Transfer),
    /// Buffers: the result received.
    Recv(Transfer),
}

impl Exec {
    /// What the step runs, as messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Exec::Kernel(_) => "kernel",
            Exec::Library(_) => "library call",
            Exec::Collective(_) => "collective",
            Exec::Send(_) => "send",
            Exec::Recv(_) => "recv",
        }
    }
}

/// One step of the program: run a kernel or a library call on buffers (result first).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The graph node(s) it computes, for traces and errors.
    pub node: String,
    pub exec: Exec,
    pub buffers: Vec<usize>,
    /// Why the compiler inserted this communication step (collectives, sends and recvs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<Why>,
    /// With symbolic dims: how the step's work scales with the call's sizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<crate::format::symbolic::Scaling>,
}

/// The rule that made the compiler move a tensor (docs/design.md §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A matmul or einsum contracted a split dim: each device holds a partial sum.
    ContractionOverSplitDim,
    /// A reduction reduced a split dim: each device holds a partial result.
    ReductionOverSplitDim,
    /// softmax or layer_norm over a split dim: their statistics are combined over the axis.
    StatisticsOverSplitDim,
    /// A scatter-add into zeros of split indices and updates (a gather's gradient): each
    /// device adds its own updates into the whole result, a partial sum.
    ScatterAddOfSplitUpdates,
    /// A reshape cannot keep the operand's split (the split dim is not the major dim of a
    /// group of dims it keeps together, or a size does not divide).
    ReshapeCannotKeepSplit,
    /// A contraction needs the operand split otherwise (its axis splits another dim of the
    /// result, or the dim is a diagonal).
    ContractionNeedsOtherSplit,
    /// The op reads the whole of a dim the operand splits (a concat, slice or gather axis,
    /// a broadcast, a normalised dim whose axis the result uses).
    OpReadsWholeDim,
    /// The op is slice-wise, and the spec gives its result another layout than the operand's.
    LayoutGivenInSpec,
    /// The op is slice-wise, and propagation gave its result another operand's layout.
    OperandLayoutsDisagree,
    /// The tensor crosses from one stage of the placement to another.
    StageBoundary,
    /// A partial sum whose readers are all elementwise, up to graph outputs the spec leaves
    /// free: reduce-scattered, and those readers and outputs left split.
    PartialSumScattered,
}

impl Rule {
    pub fn describe(self) -> &'static str {
        match self {
            Rule::ContractionOverSplitDim => "contraction over a split dim",
            Rule::ReductionOverSplitDim => "reduction over a split dim",
            Rule::StatisticsOverSplitDim => "normalisation statistics over a split dim",
            Rule::ScatterAddOfSplitUpdates => "scatter-add of split updates",
            Rule::ReshapeCannotKeepSplit => "reshape cannot keep the split",
            Rule::ContractionNeedsOtherSplit => "contraction needs the operand split otherwise",
            Rule::OpReadsWholeDim => "the op reads a split dim whole",
            Rule::LayoutGivenInSpec => "layout given in the spec",
            Rule::OperandLayoutsDisagree => "operand layouts disagree",
            Rule::StageBoundary => "stage boundary",
            Rule::PartialSumScattered => "partial sum reduce-scattered: only elementwise consumers and a free output",
        }
    }
}

/// The attribution of one communication step: which op needed which tensor in which layout,
/// by which rule, and what it costs on the mesh. Every member of a collective, and both ends
/// of a transfer, carry the same record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Why {
    /// The graph node that needed the step.
    pub node: String,
    /// The graph tensor moved (the node's operand, or its own result when partial).
    pub tensor: String,
    /// The layout the tensor had, and the one it was needed in (`Mesh::layout_string`, with
    /// `partial(AXES)` for a partial result; a stage's layouts are over its sub-mesh).
    pub from: String,
    pub to: String,
    pub rule: Rule,
    /// The most bytes any one device sends onto its links for the step (forwarded bytes
    /// included), by the fabric's schedule (`crate::comm::traffic`); for a transfer, the piece.
    pub bytes_per_device: u64,
    /// The bytes of the step over the busiest link of the mesh.
    pub busiest_link: u64,
}

impl Why {
    /// "all_gather of q2 for q3: [-, model] -> [-, -] (reshape cannot keep the split), 1536 B
    /// per device, 1536 B on the busiest link": `what` names the step.
    pub fn describe(&self, what: &str) -> String {
        format!(
            "{what} of {} for {}: {} -> {} ({}), {} B per device, {} B on the busiest link",
            self.tensor,
            self.node,
            self.from,
            self.to,
            self.rule.describe(),
            self.bytes_per_device,
            self.busiest_link
        )
    }
}

/// What a stream runs: kernels and library calls, or collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Compute,
    Comm,
}

/// A sequence of steps that runs in order, independently of the device's other streams but
/// for the events it waits on (docs/design.md §4.4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stream {
    pub kind: StreamKind,
    /// Step numbers, ascending.
    pub steps: Vec<usize>,
}

/// A cross-stream dependency: the event `event` (recorded once step `Event::after` has
/// finished) must have happened before step `before` starts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Wait {
    pub event: usize,
    pub before: usize,
}

/// An event, recorded on its step's stream right after the step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub after: usize,
}

/// How a device's steps are split into streams. Stream 0 is the main stream: it copies the
/// inputs in (every other stream starts after that), and at the end waits for the events of
/// `join` before the outputs are read. Empty (`streams` empty): one stream runs the steps in
/// program order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamPlan {
    pub streams: Vec<Stream>,
    pub events: Vec<Event>,
    pub waits: Vec<Wait>,
    pub join: Vec<usize>,
}

/// The program of one device (the default: nothing to run, as for a degraded device).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub device: usize,
    pub arena_bytes: usize,
    pub buffers: Vec<Buffer>,
    pub kernels: Vec<Kernel>,
    pub steps: Vec<Step>,
    /// Buffer of each graph input (copied in before the first step), in `Meta::inputs` order.
    pub inputs: Vec<usize>,
    /// Buffer of each graph output (copied out after the last step), in `Meta::outputs` order.
    pub outputs: Vec<usize>,
    /// The streams the steps run on, and the events between them (`passes::streams`).
    #[serde(default)]
    pub streams: StreamPlan,
}
