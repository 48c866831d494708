//! Running a compiled graph: `Loaded`, a program ready to run (`runner`), its checks of
//! what it is handed (`validate`), the device threads (`threads`), a run of every device's
//! streams on them (`streams`), what they share (`shared`) and the cores their long GEMMs
//! take turns at when they outnumber them (`gate`), one step (`step`), the
//! inputs and outputs crossing between the host and the devices (`io`) in blocks worked
//! out at load (`blocks`) and what a tensor
//! that does not fit them is (`mismatch`), state kept on the devices between runs
//! (`resident`), the sizes of a call to a graph compiled with symbolic dims (`sizes`),
//! opening an artifact into a `Loaded` (`loader`) and naming its kernels for profilers
//! (`perf_map`).

pub mod blocks;
pub mod gate;
pub mod io;
pub mod loader;
pub mod mismatch;
pub mod perf_map;
pub mod resident;
pub mod runner;
pub mod shared;
pub mod sizes;
pub mod step;
pub mod streams;
pub mod threads;
pub mod validate;
