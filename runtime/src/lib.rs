//! meshc-runtime: everything needed to run a compiled artifact, and nothing of the
//! compiler (no passes, no Cranelift). The compiler and this crate meet in `format`: the
//! artifact, the programs in it and the kernel ABI (docs/design.md §1).
//!
//! The modules live in six rooms; each room uses only the rooms listed after it
//! (pinned by tests/all/modules.rs):
//! - `format` (uses nothing): `abi`, `mesh`, `program`, `degradation`, `epilogue`, `order`,
//!   `mask`, `artifact`, `signature`, `isa`, `symbolic`;
//! - `kernels` (format): `call`, `library`, `small_m`, `panels`, `igemm`, `matmul_shape`, `epilogue`,
//!   `attention`, `transpose`, `reduce`, `softmax`, `concat`, `vmath`, `pool`;
//! - `comm` (format): `traffic`, `fabric`, `reduce`, `degraded`, `exchange`, `transport`,
//!   `mpi`, `sync`, `error`, `memory`;
//! - `exec` (format, kernels, comm): `runner`, `validate`, `threads`, `streams`, `shared`, `gate`,
//!   `step`, `io`, `blocks`, `resident`, `mismatch`, `loader`, `sizes`, `perf_map`;
//! - `api` (format, exec): the embedding API — `model`, `session`, `view`, `error`, `generate`;
//! - `tools` (format, comm, exec, api): `cli`, `steps`, `generate`, `inspect`, `trace`, `output`.

pub mod api;
pub mod comm;
pub mod exec;
pub mod format;
pub mod kernels;
pub mod tools;
