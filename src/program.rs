//! The per-device program: what the compiler hands the runner through the artifact, and all
//! the runner knows — buffers with logical numbers and where they live, kernels (offsets into
//! the code section), library calls, and the steps that tie them together (seed 001's op
//! DAG, buffer data and library data). Serialised as JSON inside the artifact.

use meshc_ir::{DType, TensorType};
use serde::{Deserialize, Serialize};

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
    pub devices: usize,
    /// Estimated floating-point operations of one run (for GFLOP/s figures).
    pub flops: u64,
    pub inputs: Vec<IoSpec>,
    pub outputs: Vec<IoSpec>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IoSpec {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

impl IoSpec {
    pub fn new(name: &str, ty: &TensorType) -> IoSpec {
        IoSpec { name: name.to_string(), dtype: ty.dtype.name().to_string(), shape: ty.shape.clone() }
    }

    pub fn ty(&self) -> Option<TensorType> {
        Some(TensorType::new(DType::parse(&self.dtype)?, self.shape.clone()))
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
}

/// A logical buffer: its number is its index in `Program::buffers`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// The tensor it holds (or `NODE.scratch` for a kernel's scratch space).
    pub name: String,
    pub bytes: usize,
    pub storage: Storage,
}

/// A generated kernel inside the code section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub name: String,
    pub offset: usize,
    pub len: usize,
}

/// A subroutine linked into the runner (seed 001's "library data").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Library {
    /// numpy matmul of f32 operands (batched, broadcasting) by the runner's GEMM.
    Matmul { a: Vec<usize>, b: Vec<usize>, out: Vec<usize> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exec {
    Kernel(usize),
    Library(Library),
}

/// One step of the program: run a kernel or a library call on buffers (result first).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The graph node(s) it computes, for traces and errors.
    pub node: String,
    pub exec: Exec,
    pub buffers: Vec<usize>,
}

/// The program of one device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
}
