//! The kernels' names for profilers: with `MESHC_PERF_MAP=1`, loading an artifact appends
//! each kernel's address range and name to `/tmp/perf-PID.map`, the file `perf report`
//! (and other profilers that follow its convention) reads to name code that no ELF file
//! describes. Without it, every generated kernel shows as one anonymous `[JIT]` blob.

use std::io::Write;

use crate::format::program::Program;

/// The environment variable that asks for the map.
pub const VAR: &str = "MESHC_PERF_MAP";

/// Appends a line `START SIZE meshc:DEVICE:KERNEL` (hex, as the format wants) per kernel of
/// `programs`, whose code begins at `code`. A profiling aid: a map that cannot be written
/// is reported on stderr and the run goes on.
pub(super) fn write(programs: &[Program], code: *const u8) {
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let mut lines = String::new();
    for p in programs {
        for k in &p.kernels {
            let start = code as usize + k.offset;
            // A name is the artifact's: one line of printable characters whatever it holds.
            let name: String = k.name.chars().map(|c| if c.is_ascii_graphic() { c } else { '_' }).collect();
            lines.push_str(&format!("{start:x} {:x} meshc:{}:{name}\n", k.len, p.device));
        }
    }
    let appended = std::fs::OpenOptions::new().create(true).append(true).open(&path);
    if let Err(e) = appended.and_then(|mut f| f.write_all(lines.as_bytes())) {
        eprintln!("warning: {VAR}: cannot write {path}: {e}");
    }
}
