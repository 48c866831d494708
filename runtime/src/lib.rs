//! meshc-runtime: everything needed to run a compiled artifact, and nothing of the
//! compiler (no passes, no Cranelift). The compiler and this crate meet in the artifact
//! format and the kernel ABI (`format`).
//!
//! The modules live in rooms, from the bottom up:
//! - `format`: `abi`, `mesh`, `program`, `degradation`, `epilogue`, `order`, `mask`,
//!   `artifact`, `signature`;
//! - `kernels`: `library`, `small_m`, `panels`, `matmul_shape`, `epilogue`, `attention`,
//!   `vmath`, `pool`;
//! - `comm`: `traffic`, `fabric`, `reduce`, `degraded`, `exchange`, `transport`, `mpi`,
//!   `sync`, `error`, `memory`;
//! - `exec`: `runner`, `loader`, `resident`;
//! - `tools`: `cli`, `steps`, `inspect`, `trace`, `output`.

pub mod comm;
pub mod exec;
pub mod format;
pub mod kernels;
pub mod tools;
