//! Running a compiled graph: the runner (`runner`: validation, device threads and streams,
//! inputs and outputs, step dispatch), opening an artifact into it (`loader`), and state
//! kept on the devices between runs (`resident`).

pub mod io;
pub mod loader;
pub mod resident;
pub mod runner;
pub mod step;
pub mod streams;
pub mod threads;
pub mod validate;
