//! The one allocation budget. Every size meshc derives from a file it reads and then
//! allocates — a tensor the interpreter or constant folding computes, a param it
//! initialises, an index table the ONNX importer or the expand pass builds, a window's
//! taps, an einsum's intermediates — is checked here before the memory is asked for,
//! against one limit: half the memory available when meshc starts (`MemAvailable` in
//! /proc/meminfo; `FALLBACK` where that cannot be read), or what `--max-memory` says. A
//! size over it is a one-line error naming what asked and how much, where it would
//! otherwise abort in the allocator or swap for minutes. The limit bounds each allocation,
//! not their sum: it keeps a tiny file from asking for terabytes, it does not account for
//! every byte a computation holds at once. A file's own bytes read into memory (a `.npy`,
//! a graph) are bounded by the file and its reader, not by this.
//!
//! `CEILING` bounds the sizes meshc describes at all — a tensor type, a window's taps — so
//! that size arithmetic never overflows. A type is not an allocation: a graph for a mesh of
//! devices may describe tensors no one host holds, so the verifier checks types against
//! the ceiling, and what is allocated is checked against the limit.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest size meshc describes (1 TiB): far beyond any real device, small enough that
/// size arithmetic never overflows.
pub const CEILING: usize = 1 << 40;

/// The limit where /proc/meminfo cannot be read.
pub const FALLBACK: u64 = 8 << 30;

/// 0 until the limit is first asked for or set.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// The limit, in bytes, on any one allocation sized by a file.
pub fn limit() -> u64 {
    match LIMIT.load(Ordering::Relaxed) {
        0 => {
            let avail = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| mem_available(&s));
            let limit = avail.map_or(FALLBACK, |b| b / 2).clamp(1, CEILING as u64);
            LIMIT.store(limit, Ordering::Relaxed);
            limit
        }
        l => l,
    }
}

/// Sets the limit (`--max-memory`), at most `CEILING`.
pub fn set_limit(bytes: u64) {
    LIMIT.store(bytes.clamp(1, CEILING as u64), Ordering::Relaxed);
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The number of elements of `shape`, exact however large (no overflow to wrap).
pub fn elems(shape: &[usize]) -> u128 {
    shape.iter().fold(1u128, |n, &d| n.saturating_mul(d as u128))
}

/// Checks that `count` items of `size` bytes each, which `what` asks for, fit the limit;
/// gives `count` back as a `usize`. The error reads "WHAT needs SIZE, more than the LIMIT
/// meshc may allocate (--max-memory)".
pub fn check(what: impl fmt::Display, count: u128, size: usize) -> Result<usize, String> {
    check_against(limit(), what, count, size)
}

fn check_against(limit: u64, what: impl fmt::Display, count: u128, size: usize) -> Result<usize, String> {
    let bytes = count.saturating_mul(size as u128);
    match usize::try_from(count) {
        Ok(n) if bytes <= limit as u128 => Ok(n),
        _ => {
            // Just over the limit, both could read "1.0 MiB": the bytes say it then.
            let asked = match bytes < 2 * limit as u128 {
                true => format!("{bytes} bytes"),
                false => Bytes(bytes).to_string(),
            };
            let limit = Bytes(limit as u128);
            Err(format!("{what} needs {asked}, more than the {limit} meshc may allocate (--max-memory)"))
        }
    }
}

/// `check` for a tensor of `shape` and elements of `size` bytes.
pub fn check_shape(what: impl fmt::Display, shape: &[usize], size: usize) -> Result<usize, String> {
    check(what, elems(shape), size)
}

/// A byte count as people read it: `512 bytes`, `8 GiB`, `1.5 KiB` (one decimal unless
/// exact).
pub struct Bytes(pub u128);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} byte{}", self.0, if self.0 == 1 { "" } else { "s" });
        }
        let (mut unit, mut scale) = (0, 1024u128);
        while unit + 1 < UNITS.len() && self.0 >= scale * 1024 {
            (unit, scale) = (unit + 1, scale * 1024);
        }
        match self.0 % scale {
            0 => write!(f, "{} {}", self.0 / scale, UNITS[unit]),
            _ => write!(f, "{:.1} {}", self.0 as f64 / scale as f64, UNITS[unit]),
        }
    }
}

/// Units of a size (`--max-memory`, a layout's `memory_per_device`), with their bytes: the
/// single letters and the IEC names are powers of 1024, the SI names powers of 1000.
pub const UNITS: [(&str, u64); 13] = [
    ("B", 1),
    ("K", 1 << 10),
    ("M", 1 << 20),
    ("G", 1 << 30),
    ("T", 1 << 40),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("kB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

/// A positive byte count: digits with an optional unit (`8G`, `512M`, `2 GiB`, `1000000`).
pub fn parse_size(s: &str) -> Option<u64> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let unit = unit.strip_prefix(' ').unwrap_or(unit);
    let scale = if unit.is_empty() { 1 } else { UNITS.iter().find(|(u, _)| *u == unit)?.1 };
    n.checked_mul(scale).filter(|&b| b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("8G"), Some(8 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2 GiB"), Some(2 << 30));
        assert_eq!(parse_size("1000000"), Some(1_000_000));
        assert_eq!(parse_size("3kB"), Some(3000));
        for bad in ["", "0", "G", "8 G ", "8g", "-1", "1.5G", "99999999999T"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(Bytes(1).to_string(), "1 byte");
        assert_eq!(Bytes(1023).to_string(), "1023 bytes");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(8 << 40).to_string(), "8 TiB");
        assert_eq!(Bytes((8 << 40) + 1).to_string(), "8.0 TiB");
        assert_eq!(Bytes(u128::MAX).to_string(), "295147905179352825856.0 EiB");
    }

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo = "MemTotal:       32768000 kB\nMemFree:  100 kB\nMemAvailable:   16384000 kB\n";
        assert_eq!(mem_available(meminfo), Some(16_384_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }

    /// Over the limit is an error naming what asked, under it gives the count; products
    /// past u64 do not wrap. (The tests share the process's limit: only raised here.)
    #[test]
    fn sizes_over_the_limit_are_refused() {
        assert_eq!(check_against(1 << 20, "t", 1 << 18, 4), Ok(1 << 18));
        assert_eq!(
            check_against(1 << 20, "the table", (1 << 18) + 1, 4).unwrap_err(),
            "the table needs 1048580 bytes, more than the 1 MiB meshc may allocate (--max-memory)"
        );
        assert_eq!(
            check_against(1 << 30, "the table", 3 << 30, 1).unwrap_err(),
            "the table needs 3 GiB, more than the 1 GiB meshc may allocate (--max-memory)"
        );
        let e = check_against(1 << 30, "x", elems(&[1 << 40, 1 << 40, 1 << 40]), 8).unwrap_err();
        assert!(e.starts_with("x needs 9223372036854775808 EiB"), "{e}");
        set_limit(u64::MAX);
        assert_eq!(limit(), CEILING as u64);
    }
}
