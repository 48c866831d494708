//! meshc-runtime: everything needed to run a compiled artifact, and nothing of the
//! compiler (no passes, no Cranelift). The compiler and this crate meet only in the
//! artifact format (`artifact`, `program`) and the kernel ABI (`abi`).
//!
//! Modules, from the bottom up: `abi` (kernel signature, CPU features, executable memory),
//! `mesh` (the device mesh and layouts), `program` (what the artifact's program and meta
//! sections hold), `artifact` (the container: sections, checksums, mapping), `mask` (pruning
//! mask records), `matmul_shape`, `library`, `small_m` and `panels` (the library GEMM; `panels` the
//! prepacked weights), `pool` (the
//! fork/join of a step over the cores), `degraded` (the
//! fault-tolerant collective planner), `exchange` (send/recv), `fabric` (collectives over
//! the simulated mesh), `runner` (validation and execution), `loader` (artifact to runner),
//! `trace` and `inspect` (reports), `cli` (the run command shared by both binaries);
//! `transport` (the seam between hosts, one process each) and `mpi` (the MPI transport,
//! cargo feature `mpi`); `resident` (state kept on the devices between runs) and `steps` (training runs).

pub mod abi;
pub mod artifact;
pub mod attention;
pub mod cli;
pub mod degraded;
pub mod epilogue;
pub mod error;
pub mod exchange;
pub mod fabric;
pub mod inspect;
pub mod library;
pub mod loader;
pub mod mask;
pub mod matmul_shape;
pub mod memory;
pub mod mesh;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod order;
pub mod output;
pub mod panels;
pub mod pool;
pub mod program;
pub mod resident;
pub mod runner;
pub mod signature;
pub mod small_m;
pub mod steps;
pub mod sync;
pub mod trace;
pub mod transport;
pub mod vmath;
