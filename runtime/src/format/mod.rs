//! The contract between the compiler and the runtime, and all the compiler writes: the
//! kernel ABI (`abi`), the device mesh and layouts (`mesh`), the per-device program and the
//! metadata (`program`), when a program's steps happen under its stream plan (`order`),
//! pruning mask records (`mask`), the container and its sections (`artifact`) and its
//! signature (`signature`).

pub mod abi;
pub mod artifact;
pub mod mask;
pub mod mesh;
pub mod order;
pub mod program;
pub mod signature;
