//! Running a compiled graph: the runner (`runner`: validation, device threads and streams,
//! inputs and outputs, step dispatch), opening an artifact into it (`loader`), and state
//! kept on the devices between runs (`resident`).

pub mod loader;
pub mod resident;
pub mod runner;
