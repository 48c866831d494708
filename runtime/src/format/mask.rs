//! Pruning masks in the artifact (docs/design.md §4.3): the record stored
//! immediately before a masked weight block, so that the weight's address alone yields
//! both the weights and their mask, and the matmul kernels (generated and library) that
//! read it.
//!
//! A mask says which columns (output features) of a `[.., K, N]` weight and which of its
//! rows (the contracted K, pruned because the features that feed them are) a matmul must
//! compute; the rest is skipped. It is stored run-length encoded, as the sorted runs of
//! kept columns and of kept rows, because runs are what both kernels iterate over: one
//! dense sub-GEMM per (column run, row run) pair. The record, all `u32` little-endian,
//! padded to a multiple of 64 bytes so the weight after it stays aligned:
//!
//! ```text
//! 0   magic "MSK1"
//! 4   number of column runs C      8   number of row runs R
//! 12  columns N                    16  rows K
//! 20  block (the pilot's block of output features, for reports)
//! 24  C pairs (start, len), then R pairs (start, len)
//! ... zero padding
//! L-4 L, the record's length: the record starts at (weight address − L)
//! ```

use anyhow::{bail, Result};

const MAGIC: &[u8; 4] = b"MSK1";
/// Bytes before the runs.
pub const HEADER: usize = 24;

/// The decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mask {
    pub cols: usize,
    pub rows: usize,
    pub block: usize,
    /// Kept columns and kept rows, as sorted, disjoint, non-empty `(start, len)` runs.
    pub col_runs: Vec<(usize, usize)>,
    pub row_runs: Vec<(usize, usize)>,
}

/// The maximal runs of `true` in `keep`.
pub fn runs(keep: &[bool]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, &k) in keep.iter().enumerate() {
        match out.last_mut() {
            Some((s, l)) if k && *s + *l == i => *l += 1,
            _ if k => out.push((i, 1)),
            _ => {}
        }
    }
    out
}

fn kept(runs: &[(usize, usize)]) -> usize {
    runs.iter().map(|r| r.1).sum()
}

impl Mask {
    pub fn new(col_keep: &[bool], row_keep: &[bool], block: usize) -> Mask {
        Mask { cols: col_keep.len(), rows: row_keep.len(), block, col_runs: runs(col_keep), row_runs: runs(row_keep) }
    }

    /// Whether the mask skips anything.
    pub fn prunes(&self) -> bool {
        kept(&self.col_runs) < self.cols || kept(&self.row_runs) < self.rows
    }

    pub fn cols_kept(&self) -> usize {
        kept(&self.col_runs)
    }

    pub fn rows_kept(&self) -> usize {
        kept(&self.row_runs)
    }

    /// The fraction of a matmul's multiply-adds the mask keeps.
    pub fn kept_fraction(&self) -> f64 {
        let all = (self.cols * self.rows) as f64;
        if all == 0.0 {
            1.0
        } else {
            (self.cols_kept() * self.rows_kept()) as f64 / all
        }
    }

    /// The record's length in bytes.
    pub fn record_len(&self) -> usize {
        (HEADER + 8 * (self.col_runs.len() + self.row_runs.len()) + 4).div_ceil(64) * 64
    }

    pub fn encode(&self) -> Vec<u8> {
        let len = self.record_len();
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(MAGIC);
        let header = [self.col_runs.len(), self.row_runs.len(), self.cols, self.rows, self.block];
        for v in header.into_iter().chain(self.col_runs.iter().chain(&self.row_runs).flat_map(|&(s, l)| [s, l])) {
            b.extend_from_slice(&(v as u32).to_le_bytes());
        }
        b.resize(len - 4, 0);
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b
    }

    /// Decodes and checks the record that ends at byte `at` of `weights` (where its weight
    /// starts), for a weight of `rows × cols` matrices: a corrupted record is refused here,
    /// before any kernel trusts its runs.
    pub fn decode(weights: &[u8], at: usize, rows: usize, cols: usize) -> Result<Mask> {
        let u32_at = |o: usize| -> Option<usize> {
            Some(u32::from_le_bytes(weights.get(o..o.checked_add(4)?)?.try_into().ok()?) as usize)
        };
        let len = at.checked_sub(4).and_then(u32_at).filter(|&l| l >= HEADER + 4 && l.is_multiple_of(64));
        let Some(start) = len.and_then(|l| at.checked_sub(l)) else { bail!("no mask record before the weight") };
        if &weights[start..start + 4] != MAGIC {
            bail!("bad mask record magic");
        }
        let field = |i: usize| u32_at(start + 4 + 4 * i).unwrap_or(0);
        let (nc, nr) = (field(0), field(1));
        if field(2) != cols || field(3) != rows {
            bail!("mask record for {}x{} matrices on a {rows}x{cols} weight", field(3), field(2));
        }
        if HEADER + 8 * (nc + nr) + 4 > len.unwrap_or(0) {
            bail!("mask record too short for its runs");
        }
        let run_list = |first: usize, count: usize, bound: usize| -> Result<Vec<(usize, usize)>> {
            let mut out = Vec::with_capacity(count);
            let mut end = 0;
            for i in 0..count {
                let (s, l) = (field(5 + 2 * (first + i)), field(6 + 2 * (first + i)));
                if l == 0 || s < end || s + l > bound {
                    bail!("mask run ({s}, {l}) out of order or out of bounds");
                }
                end = s + l;
                out.push((s, l));
            }
            Ok(out)
        };
        Ok(Mask { cols, rows, block: field(4), col_runs: run_list(0, nc, cols)?, row_runs: run_list(nc, nr, rows)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let cols: Vec<bool> = (0..40).map(|i| (i / 8) % 2 == 0).collect();
        let rows: Vec<bool> = (0..5).map(|i| i != 2).collect();
        let m = Mask::new(&cols, &rows, 8);
        assert_eq!(m.col_runs, [(0, 8), (16, 8), (32, 8)]);
        assert_eq!(m.row_runs, [(0, 2), (3, 2)]);
        assert!(m.prunes());
        let mut w = m.encode();
        assert_eq!(w.len() % 64, 0);
        let at = w.len();
        w.extend_from_slice(&[0; 16]);
        assert_eq!(Mask::decode(&w, at, 5, 40).unwrap(), m);
        assert!(Mask::decode(&w, at, 5, 41).is_err(), "shape mismatch");
        assert!(Mask::decode(&w, 0, 5, 40).is_err(), "nothing before the weight");
        let mut bad = w.clone();
        bad[HEADER + 8] = 7; // third column run starts at 7, inside the first
        assert!(Mask::decode(&bad, at, 5, 40).unwrap_err().to_string().contains("out of order"));
        let mut bad = w.clone();
        bad[0] = b'X';
        assert!(Mask::decode(&bad, at, 5, 40).is_err());
        assert!(!Mask::new(&[true; 3], &[true; 2], 1).prunes());
    }
}
