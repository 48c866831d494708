//! The fuzz targets' library: the checks (shared with `make test`'s replay of the inputs
//! found before) and what every target sets up once.

mod checks;

pub use checks::*;

/// What any one allocation sized by a file may take in a fuzz target (`--max-memory`):
/// the readers refuse a size over meshc's memory budget, and the default budget (half the
/// machine's memory) would let a tiny input ask for gigabytes, which a sanitized build
/// fills slower than libFuzzer's time limit per input allows.
pub fn init() {
    meshc_ir::budget::set_limit(256 << 20);
}
