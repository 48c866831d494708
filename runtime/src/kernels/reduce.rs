//! A sum, mean or max of an f32 tensor over any axes, whose shape each call decides: the
//! runner's `Library::Reduce` (`Reduction`). A program compiled with symbolic dims reduces along a
//! symbolic dim this way (a loss summed over the batch, dynamic quantization's range of a
//! whole activation), where a generated kernel, whose reduction loops bake their trip
//! counts in, cannot. Each result is accumulated in f64, so a sum of millions of elements
//! stays as close to the exact one as the interpreter's; a max propagates NaN as the
//! generated kernels do. Results over trailing dims (a whole tensor, a row) reduce their
//! contiguous run in vector lanes: element by element, the two whole-activation maxes of
//! each DynamicQuantizeLinear took a third of a quantized encoder's time.

use std::sync::Arc;

use anyhow::Result;

use crate::format::mask::Mask;
use crate::format::program::{Buffer, Reduce, Reduction};
use crate::kernels::call::{f32_buffer, Kept, LibraryCall, Planned};

/// Buffers: result, operand.
impl LibraryCall for Reduction {
    fn buffers(&self) -> usize {
        2
    }

    fn plan(&self, buffers: &[&Buffer], _: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let Reduction { shape, axes, op } = self;
        let rank = shape.len();
        let mut seen = vec![false; rank];
        if axes.iter().any(|&a| a >= rank || std::mem::replace(&mut seen[a], true)) {
            return Err(format!("axes {axes:?} are not distinct dims of {shape:?}"));
        }
        // (The shape's element count is checked against the operand's buffer below; it
        // overflows nothing here, where the strides are at most that count.)
        shape.iter().try_fold(4usize, |n, &d| n.checked_mul(d)).ok_or("the shape overflows")?;
        let dims = |reduced: bool| -> Vec<(usize, usize)> {
            let mut stride = 1usize;
            let mut out = vec![(0, 0); rank];
            for d in (0..rank).rev() {
                out[d] = (shape[d], stride);
                stride = stride.saturating_mul(shape[d]);
            }
            out.into_iter().enumerate().filter(|(d, _)| seen[*d] == reduced).map(|(_, s)| s).collect()
        };
        let (kept, reduced) = (dims(false), dims(true));
        let count: usize = reduced.iter().map(|d| d.0).product();
        if *op == Reduce::Max && count == 0 {
            return Err(format!("reduce_max over an empty axis of {shape:?}"));
        }
        let result: Vec<usize> = kept.iter().map(|d| d.0).collect();
        f32_buffer(buffers, 0, &result)?;
        f32_buffer(buffers, 1, shape)?;
        // Reduced dims that are the trailing ones make each result one contiguous run.
        let trailing = (0..rank).all(|d| seen[d] == (d >= rank - axes.len()));
        Ok(Box::new(ReducePlan { kept, reduced, count, op: *op, trailing }))
    }
}

/// A reduction as planned: the kept and the reduced dims (size, the operand's stride in
/// elements), the elements each result reduces, and what it computes.
struct ReducePlan {
    kept: Vec<(usize, usize)>,
    reduced: Vec<(usize, usize)>,
    count: usize,
    op: Reduce,
    /// Each result reduces one contiguous run of `count` elements.
    trailing: bool,
}

/// Lanes of the contiguous runs' accumulators: wide enough for the compiler to keep them in
/// vector registers.
const LANES: usize = 16;

/// The sum (in f64) or the max (NaN if any element is) of a contiguous run, lane by lane.
fn contiguous(op: Reduce, xs: &[f32]) -> f64 {
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    if op == Reduce::Max {
        let mut top = [f32::NEG_INFINITY; LANES];
        let mut nan = false;
        for c in chunks {
            for (t, &x) in top.iter_mut().zip(c) {
                nan |= x.is_nan();
                *t = if x > *t { x } else { *t };
            }
        }
        for &x in tail {
            nan |= x.is_nan();
            top[0] = if x > top[0] { x } else { top[0] };
        }
        return if nan { f64::NAN } else { f64::from(top.iter().copied().fold(f32::NEG_INFINITY, f32::max)) };
    }
    let mut sum = [0f64; LANES];
    for c in chunks {
        for (t, &x) in sum.iter_mut().zip(c) {
            *t += f64::from(x);
        }
    }
    sum.iter().sum::<f64>() + tail.iter().map(|&x| f64::from(x)).sum::<f64>()
}

/// Calls `f` with the offset of every index of `dims` (size, stride), the last dim fastest.
fn offsets(dims: &[(usize, usize)], mut f: impl FnMut(usize)) {
    if dims.iter().any(|d| d.0 == 0) {
        return;
    }
    let mut at = vec![0usize; dims.len()];
    let mut off = 0usize;
    loop {
        f(off);
        let mut d = dims.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            at[d] += 1;
            off += dims[d].1;
            if at[d] < dims[d].0 {
                break;
            }
            off -= dims[d].1 * dims[d].0;
            at[d] = 0;
        }
    }
}

impl Planned for ReducePlan {
    unsafe fn call<'m>(&self, args: &[*mut u8], _: &dyn Fn(usize) -> Option<&'m Mask>, _: usize) -> Result<()> {
        let (dst, src) = (args[0] as *mut f32, args[1] as *const f32);
        if self.trailing {
            let results: usize = self.kept.iter().map(|d| d.0).product();
            for o in 0..results {
                // SAFETY: `plan` checked the operand holds `results` runs of `count` elements
                // and the result one f32 per run.
                let xs = unsafe { std::slice::from_raw_parts(src.add(o * self.count), self.count) };
                let mut v = contiguous(self.op, xs);
                if self.op == Reduce::Mean {
                    v /= self.count as f64;
                }
                // SAFETY: as above, `o` is below the results the buffer holds.
                unsafe { *dst.add(o) = v as f32 };
            }
            return Ok(());
        }
        let mut o = 0usize;
        offsets(&self.kept, |base| {
            let mut acc = match self.op {
                Reduce::Max => f64::NEG_INFINITY,
                Reduce::Sum | Reduce::Mean => 0.0,
            };
            offsets(&self.reduced, |r| {
                // SAFETY: `plan` checked the operand's buffer holds the whole shape, and
                // every offset is an index of it.
                let x = f64::from(unsafe { *src.add(base + r) });
                acc = match self.op {
                    Reduce::Max if x.is_nan() || x > acc => x,
                    Reduce::Max => acc,
                    Reduce::Sum | Reduce::Mean => acc + x,
                };
            });
            if self.op == Reduce::Mean {
                acc /= self.count as f64;
            }
            // SAFETY: `plan` checked the result's buffer holds one f32 per kept index.
            unsafe { *dst.add(o) = acc as f32 };
            o += 1;
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::program::Storage;

    fn buf(bytes: usize) -> Buffer {
        Buffer { name: String::new(), bytes, storage: Storage::Arena { offset: 0 }, mask: None }
    }

    fn run(shape: &[usize], axes: &[usize], op: Reduce, x: &[f32]) -> Vec<f32> {
        let r = Reduction { shape: shape.to_vec(), axes: axes.to_vec(), op };
        let kept: usize = (0..shape.len()).filter(|d| !axes.contains(d)).map(|d| shape[d]).product();
        let mut out = vec![0f32; kept];
        let plan = r.plan(&[&buf(kept * 4), &buf(x.len() * 4)], &Default::default()).unwrap();
        // SAFETY: the buffers `plan` was given, apart.
        unsafe { plan.call(&[out.as_mut_ptr() as *mut u8, x.as_ptr() as *mut u8], &|_| None, 1) }.unwrap();
        out
    }

    /// Against sums, means and maxes written out index by index, over every set of axes of
    /// a rank-3 shape.
    #[test]
    fn every_set_of_axes_reduces_as_written_out() {
        let shape = [2usize, 3, 4];
        let x: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.5).collect();
        let at = |i: usize, j: usize, k: usize| x[(i * 3 + j) * 4 + k];
        for mask in 0..8usize {
            let axes: Vec<usize> = (0..3).filter(|d| mask >> d & 1 == 1).collect();
            let range = |d: usize, v: usize| if axes.contains(&d) { 0..shape[d] } else { v..v + 1 };
            let kept = |d: usize| if axes.contains(&d) { 1 } else { shape[d] };
            for op in [Reduce::Sum, Reduce::Mean, Reduce::Max] {
                let mut want = Vec::new();
                for i in 0..kept(0) {
                    for j in 0..kept(1) {
                        for k in 0..kept(2) {
                            let vals: Vec<f32> = range(0, i)
                                .flat_map(|a| range(1, j).flat_map(move |b| range(2, k).map(move |c| (a, b, c))))
                                .map(|(a, b, c)| at(a, b, c))
                                .collect();
                            let sum: f32 = vals.iter().sum();
                            want.push(match op {
                                Reduce::Sum => sum,
                                Reduce::Mean => sum / vals.len() as f32,
                                Reduce::Max => vals.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                            });
                        }
                    }
                }
                let got = run(&shape, &axes, op, &x);
                assert_eq!(got.len(), want.len(), "{axes:?} {op:?}");
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{axes:?} {op:?}: {got:?} vs {want:?}");
                }
            }
        }
    }

    /// Runs longer than the lanes: maxes, sums and means of whole rows, against the
    /// element-by-element path (the same reduction over a leading axis, transposed).
    #[test]
    fn long_runs_reduce_in_lanes_as_element_by_element() {
        let (rows, n) = (3usize, 1037usize);
        let x: Vec<f32> = (0..rows * n).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 0.013).collect();
        let xt: Vec<f32> = (0..rows * n).map(|i| x[(i % rows) * n + i / rows]).collect();
        for op in [Reduce::Sum, Reduce::Mean, Reduce::Max] {
            let lanes = run(&[rows, n], &[1], op, &x);
            let each = run(&[n, rows], &[0], op, &xt);
            for (a, b) in lanes.iter().zip(&each) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{op:?}: {lanes:?} vs {each:?}");
            }
        }
        let mut y = x.clone();
        y[n + 500] = f32::NAN;
        let top = run(&[rows, n], &[1], Reduce::Max, &y);
        assert!(!top[0].is_nan() && top[1].is_nan() && !top[2].is_nan(), "{top:?}");
    }

    #[test]
    fn a_max_propagates_nan() {
        assert!(run(&[4], &[0], Reduce::Max, &[1.0, f32::NAN, 3.0, 2.0])[0].is_nan());
        assert_eq!(run(&[2, 2], &[1], Reduce::Max, &[1.0, 5.0, f32::NEG_INFINITY, -2.0]), [5.0, -2.0]);
    }

    #[test]
    fn bad_axes_small_buffers_and_empty_maxes_are_refused() {
        let r = |axes: Vec<usize>, op| Reduction { shape: vec![2, 3], axes, op };
        let (out, x) = (buf(8), buf(24));
        assert!(r(vec![2], Reduce::Sum).plan(&[&out, &x], &Default::default()).is_err());
        assert!(r(vec![1, 1], Reduce::Sum).plan(&[&out, &x], &Default::default()).is_err());
        let e = r(vec![1], Reduce::Sum).plan(&[&out, &buf(20)], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 1 holds 20 bytes"), "{e}");
        let empty = Reduction { shape: vec![2, 0], axes: vec![1], op: Reduce::Max };
        assert!(empty.plan(&[&out, &x], &Default::default()).err().unwrap().contains("empty axis"));
    }
}
