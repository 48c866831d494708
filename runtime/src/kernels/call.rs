//! The runner's one seam to the library kernels (`Exec::Library`): each kind of library call
//! says how many buffers it takes, checks them before any run, and runs on them. The
//! implementations live next to their kernels (`Matmul` in `library`, `Attention` in
//! `attention`), and `crate::kernels::library_call` picks one for a step. Adding a library
//! kernel adds a description to `crate::format::program`, its `LibraryCall` next to the
//! kernel and an arm to `library_call`, and nothing to the runner.

use std::sync::Arc;

use anyhow::Result;

use crate::format::mask::Mask;
use crate::format::program::Buffer;
use crate::kernels::panels::Unpacked;

/// A library call of a program step.
pub trait LibraryCall {
    /// How many buffers the step passes: the result, then the operands.
    fn buffers(&self) -> usize;

    /// Checks the call's shapes against each other and the step's `buffers` (as many as
    /// `buffers()` says, in order) against them: each large enough and aligned for its
    /// element type, stored as the call can read it. The message names the buffer by its
    /// position. What it returns runs the call: everything that depends only on the shapes
    /// (loop nests, operand strides) is worked out here, once, when a program is loaded,
    /// so that a call allocates nothing. What depends on the step's buffers alone, and not
    /// on the shapes, goes into `kept`, which every plan of the step shares.
    fn plan(&self, buffers: &[&Buffer], kept: &Arc<Kept>) -> Result<Box<dyn Planned>, String>;
}

/// What the plans of one step share. A step over symbolic dims is planned again for each
/// call's shapes (`exec::sizes::Replans`); a copy that depends on its weight alone is made
/// once for the step, not once per shape.
#[derive(Default)]
pub struct Kept {
    /// The step's f32 weight in panels, copied out for the row-major GEMM.
    pub(crate) f32s: Unpacked<f32>,
    /// The step's half weight in panels, copied out where the small-M GEMM does not serve.
    pub(crate) halves: Unpacked<u16>,
}

impl Kept {
    /// The bytes of the copies kept.
    pub fn bytes(&self) -> usize {
        self.f32s.bytes() + self.halves.bytes()
    }
}

/// A library call planned for its step's buffers (`LibraryCall::plan`).
pub trait Planned: Send + Sync {
    /// Runs the call on the step's buffers at `args` on up to `threads` cores; `mask(i)` is
    /// the decoded pruning mask of buffer `i`, if it is a masked weight.
    ///
    /// # Safety
    /// `args` point at the buffers `plan` accepted, the result aliases no operand, and
    /// nothing else touches them while the call runs.
    unsafe fn call<'m>(&self, args: &[*mut u8], mask: &dyn Fn(usize) -> Option<&'m Mask>, threads: usize)
        -> Result<()>;
}

/// Checks that buffer `i` holds an f32 tensor of `shape` at an offset aligned for it.
pub(crate) fn f32_buffer(buffers: &[&Buffer], i: usize, shape: &[usize]) -> Result<(), String> {
    let need = shape.iter().try_fold(4usize, |n, &d| n.checked_mul(d));
    if need.is_none_or(|n| buffers[i].bytes < n) {
        return Err(format!("buffer {i} holds {} bytes, too few for F32{shape:?}", buffers[i].bytes));
    }
    let Some(offset) = buffers[i].storage.offset() else { return Err(format!("buffer {i} is the size table")) };
    if !offset.is_multiple_of(4) {
        return Err(format!("buffer {i} at offset {offset} is not aligned for F32"));
    }
    Ok(())
}
