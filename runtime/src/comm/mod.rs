//! How devices and hosts exchange data: the collective fabric over the simulated mesh
//! (`fabric`), the fault-tolerant collective planner (`degraded`), send/recv between device
//! threads (`exchange`), the seam between hosts (`transport`) and the MPI transport (`mpi`,
//! cargo feature `mpi`); with what they wait and fail with: locks and waits (`sync`), the
//! typed errors of a run (`error`) and aligned buffers (`memory`).

pub mod degraded;
pub mod error;
pub mod exchange;
pub mod fabric;
pub mod memory;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod sync;
pub mod transport;
