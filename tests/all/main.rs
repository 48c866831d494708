//! Every integration test in one binary, a module per topic (cargo links one test
//! binary instead of one per file, and runs every test in one pool of threads).

mod common;

mod attention;
mod buffers;
mod checkpoints;
mod cli;
mod compiled;
mod degraded;
mod distributed;
mod docs;
mod dot;
mod dynamic;
mod embed;
mod epilogue;
mod explain;
mod fuzz;
mod fuzz_files;
mod generate;
mod golden;
mod grad;
mod hosts;
mod interp;
mod isa;
mod layouts;
mod lowering;
mod make;
mod masked;
mod modules;
#[cfg(feature = "mpi")]
mod mpi;
mod onnx;
mod onnx_fuzz;
mod outputs;
mod panels;
mod passes;
mod pilot;
mod pipeline;
mod placement;
mod quantized_weights;
mod refused;
mod run_stats;
mod signing;
mod symbolic;
mod train;
mod transposed;
mod trust;
