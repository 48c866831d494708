//! The contract between the compiler and the runtime, and all the compiler writes: the
//! kernel ABI (`abi`), the device mesh and layouts (`mesh`), the per-device program and the
//! metadata (`program`), what failed in the mesh (`degradation`), a library matmul's
//! epilogue steps (`epilogue`), the sizes of a graph compiled with symbolic dims
//! (`symbolic`), when a program's steps happen under its stream plan
//! (`order`), pruning mask records (`mask`), the container and its sections (`artifact`)
//! and its signature (`signature`); and the vector ISA the runtime's own kernels use
//! (`isa`), which both rooms below the runner read. Nothing here imports another room: what the compiler
//! writes is defined without the code that runs it.

pub mod abi;
pub mod artifact;
pub mod degradation;
pub mod epilogue;
pub mod isa;
pub mod mask;
pub mod mesh;
pub mod order;
pub mod program;
pub mod signature;
pub mod symbolic;
