//! numpy concatenate of any rank and element size whose shapes each call decides: the
//! runner's `Library::Concat`. A program compiled with symbolic dims concatenates along a
//! symbolic dim, or along a dim before one, this way: where each operand's part of a row
//! of the result begins depends on the call's sizes, which generated code bakes in. Each
//! operand's part of each row is one copy.

use std::sync::Arc;

use anyhow::Result;

use crate::format::mask::Mask;
use crate::format::program::{Buffer, Concat};
use crate::kernels::call::{Kept, LibraryCall, Planned};

/// Buffers: result, then the operands.
impl LibraryCall for Concat {
    fn buffers(&self) -> usize {
        1 + self.inputs.len()
    }

    fn plan(&self, buffers: &[&Buffer], _: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let Concat { inputs, axis, elem } = self;
        let Some(first) = inputs.first() else { return Err("no operands".into()) };
        if *axis >= first.len() {
            return Err(format!("axis {axis} of operands of rank {}", first.len()));
        }
        if ![1, 2, 4, 8].contains(elem) {
            return Err(format!("elements of {elem} bytes"));
        }
        for (i, s) in inputs.iter().enumerate() {
            let agrees = s.len() == first.len() && (0..s.len()).all(|d| d == *axis || s[d] == first[d]);
            if !agrees {
                return Err(format!("operand {i} of shape {s:?} does not concatenate with {first:?} along {axis}"));
            }
        }
        let bytes = |s: &[usize]| s.iter().try_fold(*elem, |n, &d| n.checked_mul(d)).ok_or("the shape overflows");
        let rows = first[..*axis].iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or("the shape overflows")?;
        let mut runs = Vec::new();
        for (i, s) in inputs.iter().enumerate() {
            let need = bytes(s)?;
            if buffers[i + 1].bytes < need {
                return Err(format!("buffer {} holds {} bytes, too few for {s:?}", i + 1, buffers[i + 1].bytes));
            }
            runs.push(need.checked_div(rows).unwrap_or(0));
        }
        let row: usize = runs.iter().sum();
        let total = row.checked_mul(rows).ok_or("the shape overflows")?;
        if buffers[0].bytes < total {
            return Err(format!("buffer 0 holds {} bytes, too few for the {total} of the result", buffers[0].bytes));
        }
        Ok(Box::new(ConcatPlan { rows, runs, row }))
    }
}

/// A concat as planned: the rows before the axis, each operand's bytes in a row, and the
/// result's row.
struct ConcatPlan {
    rows: usize,
    runs: Vec<usize>,
    row: usize,
}

impl Planned for ConcatPlan {
    unsafe fn call<'m>(&self, args: &[*mut u8], _: &dyn Fn(usize) -> Option<&'m Mask>, _: usize) -> Result<()> {
        let dst = args[0];
        for r in 0..self.rows {
            let mut at = r * self.row;
            for (i, &run) in self.runs.iter().enumerate() {
                // SAFETY: `plan` checked every operand holds `rows` runs and the result
                // `rows` rows of their sum; the result aliases no operand.
                unsafe { std::ptr::copy_nonoverlapping(args[i + 1].add(r * run), dst.add(at), run) };
                at += run;
            }
        }
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

    /// Against a concat written out index by index, along each axis of rank-3 operands of
    /// different lengths there, one of them empty.
    #[test]
    fn runs_concatenate_as_written_out() {
        for axis in 0..3usize {
            let shapes: Vec<Vec<usize>> = [2usize, 0, 3]
                .iter()
                .map(|&n| {
                    let mut s = vec![2usize, 3, 4];
                    s[axis] = n;
                    s
                })
                .collect();
            let data: Vec<Vec<u32>> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| (0..s.iter().product::<usize>()).map(|i| (k * 1000 + i) as u32).collect())
                .collect();
            let c = Concat { inputs: shapes.clone(), axis, elem: 4 };
            let mut out_shape = [2usize, 3, 4];
            out_shape[axis] = 5;
            let n: usize = out_shape.iter().product();
            let bufs: Vec<Buffer> = std::iter::once(n * 4).chain(data.iter().map(|d| d.len() * 4)).map(buf).collect();
            let plan = c.plan(&bufs.iter().collect::<Vec<_>>(), &Default::default()).unwrap();
            let mut out = vec![0u32; n];
            let mut args: Vec<*mut u8> = vec![out.as_mut_ptr() as *mut u8];
            args.extend(data.iter().map(|d| d.as_ptr() as *mut u8));
            // SAFETY: the buffers `plan` was given, apart.
            unsafe { plan.call(&args, &|_| None, 1) }.unwrap();
            for (o, &got) in out.iter().enumerate() {
                let idx = [o / (out_shape[1] * out_shape[2]), o / out_shape[2] % out_shape[1], o % out_shape[2]];
                let (mut k, mut at) = (0, idx[axis]);
                while at >= shapes[k][axis] {
                    at -= shapes[k][axis];
                    k += 1;
                }
                let mut i = idx;
                i[axis] = at;
                let s = &shapes[k];
                assert_eq!(got, data[k][(i[0] * s[1] + i[1]) * s[2] + i[2]], "axis {axis}, element {o}");
            }
        }
    }

    #[test]
    fn mismatched_operands_and_small_buffers_are_refused() {
        let big = buf(1024);
        let c = |inputs: Vec<Vec<usize>>| Concat { inputs, axis: 1, elem: 4 };
        assert!(c(vec![vec![2, 3], vec![3, 3]]).plan(&[&big, &big, &big], &Default::default()).is_err());
        assert!(c(vec![vec![2, 3], vec![2, 3, 1]]).plan(&[&big, &big, &big], &Default::default()).is_err());
        let e = c(vec![vec![2, 3], vec![2, 4]]).plan(&[&big, &big, &buf(31)], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 2 holds 31 bytes"), "{e}");
        let e = c(vec![vec![2, 3], vec![2, 4]]).plan(&[&buf(55), &big, &big], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 0 holds 55 bytes"), "{e}");
    }
}
