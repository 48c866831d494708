//! The epilogue of a library matmul as the program describes it (`Library::Matmul`):
//! elementwise steps the GEMM applies to each block of its result, each taking the running
//! value as its left operand, a binary step's right operand being the matmul's next extra
//! operand (docs/ops.md). What the steps compute is `crate::kernels::epilogue`.

use serde::{Deserialize, Serialize};

/// One step of an epilogue; a binary step carries the shape of its operand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// The i32 product as f32 (round to nearest): the first step of an integer matmul's
    /// epilogue, and only of one.
    ToF32,
    /// x + y.
    Add(Vec<usize>),
    /// x · y.
    Mul(Vec<usize>),
    /// x / y.
    Div(Vec<usize>),
    /// maximum(x, 0).
    Relu,
    /// x·Φ(x) (`gelu {approximate = "none"}`).
    Gelu,
    /// GELU's tanh form (`gelu {approximate = "tanh"}`).
    GeluTanh,
    /// x · sigmoid(x) (SiLU).
    Silu,
}

impl Step {
    /// The step's name in a matmul's `epilogue` attribute (docs/ops.md).
    pub fn name(&self) -> &'static str {
        match self {
            Step::ToF32 => "to_f32",
            Step::Add(_) => "add",
            Step::Mul(_) => "mul",
            Step::Div(_) => "div",
            Step::Relu => "relu",
            Step::Gelu => "gelu",
            Step::GeluTanh => "gelu_tanh",
            Step::Silu => "silu",
        }
    }

    /// The step named `name`, with the shape of its operand if it takes one (`None` for
    /// an unknown name).
    pub fn parse(name: &str, operand: impl FnOnce() -> Vec<usize>) -> Option<Step> {
        Some(match name {
            "to_f32" => Step::ToF32,
            "add" => Step::Add(operand()),
            "mul" => Step::Mul(operand()),
            "div" => Step::Div(operand()),
            "relu" => Step::Relu,
            "gelu" => Step::Gelu,
            "gelu_tanh" => Step::GeluTanh,
            "silu" => Step::Silu,
            _ => return None,
        })
    }

    pub fn operand(&self) -> Option<&[usize]> {
        match self {
            Step::Add(s) | Step::Mul(s) | Step::Div(s) => Some(s),
            _ => None,
        }
    }
}

/// The shapes of the steps' operands, in step order.
pub fn operands(steps: &[Step]) -> impl Iterator<Item = &[usize]> {
    steps.iter().filter_map(Step::operand)
}
