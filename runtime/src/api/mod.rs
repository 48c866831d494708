//! The embedding API: what an application links to run an artifact in its own process,
//! called many times from several threads with its own buffers (docs/embedding.md). The C
//! ABI (the `capi/` crate, header `capi/include/meshc.h`) and the Python package (`python/`)
//! are thin layers over it, and the command line opens artifacts through it.
//!
//! - `Model` (`model`): an artifact opened, verified and checked, with its metadata —
//!   inputs and outputs (name, dtype, shape, layout over the mesh) and the mesh;
//! - `Session` (`session`): a model ready to run, its arenas and device threads created
//!   once and reused by every call; `run` takes borrowed views and returns owned tensors,
//!   `run_into` writes into the caller's buffers; a training artifact's state stays on the
//!   devices between `step`s;
//! - `TensorView`/`TensorViewMut` (`view`, one generic `View` over `&[u8]` or `&mut [u8]`):
//!   a caller's memory seen as a tensor of any dtype meshc has (f16 and bf16 included),
//!   without a copy;
//! - `Session::generate` (`generate`): tokens sampled from a decode-step artifact, the
//!   prompt and each new token fed one position a step, the KV caches kept on the devices;
//! - `Error` (`error`): what went wrong, as one line; a tensor that does not fit the graph
//!   is a `Mismatch` with the same text the runner gives everywhere;
//! - `force_isa`: the vector ISA of the runtime's own kernels for the whole process (the
//!   best the CPU has unless forced lower, to run or measure another path), as `--isa`.

pub mod error;
pub mod generate;
pub mod model;
pub mod session;
pub mod view;

pub use crate::format::isa::{force as force_isa, Isa};
pub use error::Error;
pub use generate::{GenerateOptions, Generated, Sampling};
pub use model::{Model, OpenOptions, TensorInfo};
pub use session::Session;
pub use view::{Element, TensorView, TensorViewMut, View};
