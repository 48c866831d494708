//! How devices and hosts exchange data: the link model of the mesh and the bytes each
//! collective puts on its links (`traffic`, pure: the compiler predicts with it), the
//! collective fabric over the simulated mesh (`fabric`) and its reduction arithmetic
//! (`reduce`), the fault-tolerant collective planner (`degraded`), send/recv between device
//! threads (`exchange`), the seam between hosts (`transport`) and the MPI transport (`mpi`,
//! cargo feature `mpi`); and what they wait and fail with: locks and waits (`sync`), the
//! typed errors of a run (`error`) and aligned buffers (`memory`).

pub mod degraded;
pub mod error;
pub mod exchange;
pub mod fabric;
pub mod memory;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod reduce;
pub mod sync;
pub mod traffic;
pub mod transport;
