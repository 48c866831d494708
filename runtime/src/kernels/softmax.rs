//! A softmax of an f32 tensor along one axis, whose shape each call decides: the runner's
//! `Library::Softmax` (`SoftmaxAlong`). A program compiled with symbolic dims takes a softmax
//! along a symbolic dim this way (a decoder's masked attention scores over the sequence),
//! where a generated kernel, whose loops bake the axis' length in, cannot. As the
//! interpreter, it subtracts each run's max and sums its exponentials in f64; a NaN in a
//! run makes the whole run NaN.

use std::sync::Arc;

use anyhow::Result;

use crate::format::mask::Mask;
use crate::format::program::{Buffer, SoftmaxAlong};
use crate::kernels::call::{f32_buffer, Kept, LibraryCall, Planned};

/// Buffers: result, operand.
impl LibraryCall for SoftmaxAlong {
    fn buffers(&self) -> usize {
        2
    }

    fn plan(&self, buffers: &[&Buffer], _: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let SoftmaxAlong { shape, axis } = self;
        if *axis >= shape.len() {
            return Err(format!("axis {axis} is not a dim of {shape:?}"));
        }
        shape.iter().try_fold(4usize, |n, &d| n.checked_mul(d)).ok_or("the shape overflows")?;
        f32_buffer(buffers, 0, shape)?;
        f32_buffer(buffers, 1, shape)?;
        let outer = shape[..*axis].iter().product();
        let inner = shape[axis + 1..].iter().product();
        let n = shape[*axis];
        Ok(Box::new(SoftmaxPlan { outer, n, inner, spare: parking_lot::Mutex::new(Vec::new()) }))
    }
}

/// Elements from which a softmax is split over the threads: about 50 µs of f64
/// exponentials, more than a split's hand-off costs.
const SPLIT_ELEMENTS: usize = 4096;

/// A softmax as planned: the runs along the axis are `n` elements `inner` apart, `inner`
/// of them after each other in each of `outer` blocks. A part of a call takes a buffer of a
/// run's exponentials from `spare` and puts it back, so that calls after the first allocate
/// nothing.
struct SoftmaxPlan {
    outer: usize,
    n: usize,
    inner: usize,
    spare: parking_lot::Mutex<Vec<Vec<f64>>>,
}

impl Planned for SoftmaxPlan {
    unsafe fn call<'m>(&self, args: &[*mut u8], _: &dyn Fn(usize) -> Option<&'m Mask>, threads: usize) -> Result<()> {
        let runs = self.outer * self.inner;
        let parts = match threads > 1 && runs * self.n >= SPLIT_ELEMENTS {
            true => (crate::kernels::pool::PARTS_PER_THREAD * threads).min(runs),
            false => 1,
        };
        let (dst, src) = (args[0] as usize, args[1] as usize);
        crate::kernels::pool::split(parts, &|p| {
            let mut e = self.spare.lock().pop().unwrap_or_default();
            e.resize(self.n, 0.0);
            // SAFETY: `plan` checked both buffers hold the whole shape, and the result
            // aliases no operand; the parts write disjoint runs.
            unsafe { self.runs(dst as *mut f32, src as *const f32, runs * p / parts..runs * (p + 1) / parts, &mut e) };
            self.spare.lock().push(e);
        });
        Ok(())
    }
}

impl SoftmaxPlan {
    /// The runs `runs` (run `r` is block `r / inner`'s `r % inner`-th), as the interpreter:
    /// each run's max subtracted, its exponentials (into `e`) summed in f64.
    ///
    /// # Safety
    /// `dst` and `src` hold the whole shape each, apart; nothing else writes these runs.
    unsafe fn runs(&self, dst: *mut f32, src: *const f32, runs: std::ops::Range<usize>, e: &mut [f64]) {
        for r in runs {
            let (o, i) = (r / self.inner, r % self.inner);
            let at = |k: usize| (o * self.n + k) * self.inner + i;
            // SAFETY: every index of a run lies inside the shape (the caller's contract).
            let x = |k: usize| f64::from(unsafe { *src.add(at(k)) });
            let max = (0..self.n).map(x).fold(f64::NEG_INFINITY, |m, v| match v {
                _ if v.is_nan() || m.is_nan() => f64::NAN,
                _ => m.max(v),
            });
            for (k, e) in e.iter_mut().enumerate() {
                *e = (x(k) - max).exp();
            }
            let sum: f64 = e.iter().sum();
            for (k, e) in e.iter().enumerate() {
                // SAFETY: as above; this run is this call's alone.
                unsafe { *dst.add(at(k)) = (e / sum) as f32 };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::program::Storage;

    fn buf(bytes: usize) -> Buffer {
        Buffer { name: String::new(), bytes, storage: Storage::Arena { offset: 0 }, mask: None }
    }

    fn run(shape: &[usize], axis: usize, x: &[f32]) -> Vec<f32> {
        run_on(shape, axis, x, 1)
    }

    fn run_on(shape: &[usize], axis: usize, x: &[f32], threads: usize) -> Vec<f32> {
        let s = SoftmaxAlong { shape: shape.to_vec(), axis };
        let mut out = vec![0f32; x.len()];
        let plan = s.plan(&[&buf(x.len() * 4), &buf(x.len() * 4)], &Default::default()).unwrap();
        // SAFETY: the buffers `plan` was given, apart.
        unsafe { plan.call(&[out.as_mut_ptr() as *mut u8, x.as_ptr() as *mut u8], &|_| None, threads) }.unwrap();
        out
    }

    /// Split over threads (along every axis of a shape large enough to split), the bits of
    /// one thread's.
    #[test]
    fn split_runs_give_one_thread_s_bits() {
        let shape = [3usize, 37, 64];
        let x: Vec<f32> = (0..3 * 37 * 64).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.01).collect();
        for axis in 0..3 {
            let one = run(&shape, axis, &x);
            for threads in [2, 3] {
                assert_eq!(run_on(&shape, axis, &x, threads), one, "axis {axis} on {threads} threads");
            }
        }
    }

    /// Against the softmax written out index by index, along every axis of a rank-3 shape.
    #[test]
    fn every_axis_is_as_written_out() {
        let shape = [2usize, 3, 4];
        let x: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.5).collect();
        let strides = [12usize, 4, 1];
        for axis in 0..3 {
            let got = run(&shape, axis, &x);
            for (j, &g) in got.iter().enumerate() {
                let base = j - (j / strides[axis] % shape[axis]) * strides[axis];
                let run: Vec<f32> = (0..shape[axis]).map(|k| x[base + k * strides[axis]]).collect();
                let max = run.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = run.iter().map(|v| (v - max).exp()).sum();
                let want = (x[j] - max).exp() / sum;
                assert!((g - want).abs() <= 1e-6, "axis {axis} at {j}: {g} vs {want}");
            }
        }
    }

    #[test]
    fn masked_entries_are_zero_and_a_nan_spoils_its_run() {
        let got = run(&[2, 2], 1, &[0.0, f32::NEG_INFINITY, f32::NAN, 1.0]);
        assert_eq!(&got[..2], &[1.0, 0.0]);
        assert!(got[2].is_nan() && got[3].is_nan(), "{got:?}");
    }

    #[test]
    fn bad_axes_and_small_buffers_are_refused() {
        let s = |axis| SoftmaxAlong { shape: vec![2, 3], axis };
        assert!(s(2).plan(&[&buf(24), &buf(24)], &Default::default()).is_err());
        let e = s(1).plan(&[&buf(24), &buf(20)], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 1 holds 20 bytes"), "{e}");
    }
}
