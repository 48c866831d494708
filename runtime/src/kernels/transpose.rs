//! A transpose of any rank and element size whose shape each call decides, the runner's
//! `Library::Transpose`: a program compiled with symbolic dims moves a symbolic dim this
//! way (attention's head transposes over `seq`), where generated code, which bakes its
//! shapes in, cannot. It copies runs: the trailing dims the permutation keeps in place move
//! together, one copy each.

use std::sync::Arc;

use anyhow::Result;

use crate::format::mask::Mask;
use crate::format::program::{Buffer, Transpose};
use crate::kernels::call::{Kept, LibraryCall, Planned};

/// Buffers: result, operand.
impl LibraryCall for Transpose {
    fn buffers(&self) -> usize {
        2
    }

    fn plan(&self, buffers: &[&Buffer], _: &Arc<Kept>) -> Result<Box<dyn Planned>, String> {
        let Transpose { shape, perm, elem } = self;
        let rank = shape.len();
        let mut seen = vec![false; rank];
        if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
            return Err(format!("{perm:?} is not a permutation of the {rank} dims of {shape:?}"));
        }
        if ![1, 2, 4, 8].contains(elem) {
            return Err(format!("elements of {elem} bytes"));
        }
        let bytes = shape.iter().try_fold(*elem, |n, &d| n.checked_mul(d)).ok_or("the shape overflows")?;
        if let Some(i) = (0..2).find(|&i| buffers[i].bytes < bytes) {
            return Err(format!(
                "buffer {i} holds {} bytes, too few for {shape:?} of {elem}-byte elements",
                buffers[i].bytes
            ));
        }
        // The trailing dims kept in place are one run; the others are walked in the
        // result's order, each stepping the operand by its own stride.
        let kept = (0..rank).rev().take_while(|&i| perm[i] == i).count();
        let run = shape[rank - kept..].iter().product::<usize>() * elem;
        let mut stride = vec![0usize; rank];
        let mut s = *elem;
        for d in (0..rank).rev() {
            stride[d] = s;
            s *= shape[d];
        }
        let outer = perm[..rank - kept].iter().map(|&p| (shape[p], stride[p])).collect();
        Ok(Box::new(TransposePlan { outer, run, bytes }))
    }
}

/// A transpose as planned: the result's outer dims (size, the operand's stride in bytes)
/// and the bytes each run moves.
struct TransposePlan {
    outer: Vec<(usize, usize)>,
    run: usize,
    bytes: usize,
}

/// Bytes moved from which a transpose is split over the threads: a part of 16 KiB or more
/// (with four parts a thread) copies for a microsecond or more, against the pool's ~0.1 µs
/// hand-off. (At 4×64, MiniLM-L3's transposes, run on one thread while the other waited,
/// were ~10% of the call.)
const SPLIT_BYTES: usize = 64 << 10;

/// Outer dims whose indices a part keeps on its stack; more take an allocation.
const STACK_DIMS: usize = 8;

impl Planned for TransposePlan {
    unsafe fn call<'m>(&self, args: &[*mut u8], _: &dyn Fn(usize) -> Option<&'m Mask>, threads: usize) -> Result<()> {
        if self.bytes == 0 {
            return Ok(());
        }
        let runs = self.bytes / self.run;
        let parts = match threads > 1 && self.bytes >= SPLIT_BYTES {
            true => (crate::kernels::pool::PARTS_PER_THREAD * threads).min(runs),
            false => 1,
        };
        let (dst, src) = (args[0] as usize, args[1] as usize);
        crate::kernels::pool::split(parts, &|p| {
            // SAFETY: `plan` checked both buffers hold `bytes`; the parts copy disjoint runs
            // of the result, which aliases no operand.
            unsafe { self.copy(dst as *mut u8, src as *const u8, runs * p / parts..runs * (p + 1) / parts) }
        });
        Ok(())
    }
}

impl TransposePlan {
    /// Copies the result's runs `runs`, walking the outer dims from the first one's indices.
    ///
    /// # Safety
    /// `dst` and `src` hold `bytes` each, apart.
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, runs: std::ops::Range<usize>) {
        let (mut stack, mut heap) = ([0usize; STACK_DIMS], Vec::new());
        let at = match self.outer.len() <= STACK_DIMS {
            true => &mut stack[..self.outer.len()],
            false => {
                heap.resize(self.outer.len(), 0);
                &mut heap[..]
            }
        };
        let (mut left, mut from) = (runs.start, 0usize);
        for (d, &(n, stride)) in self.outer.iter().enumerate().rev() {
            at[d] = left % n;
            from += at[d] * stride;
            left /= n;
        }
        for to in runs.map(|r| r * self.run) {
            // SAFETY: every run lies inside both buffers (the caller's contract).
            unsafe { std::ptr::copy_nonoverlapping(src.add(from), dst.add(to), self.run) };
            for (d, &(n, stride)) in self.outer.iter().enumerate().rev() {
                at[d] += 1;
                from += stride;
                if at[d] < n {
                    break;
                }
                from -= stride * n;
                at[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::program::Storage;

    /// Against an index-by-index transpose, for every permutation of a rank-4 shape with
    /// a dim of 1, of f32 and of 2-byte elements; and of a shape large enough to be split,
    /// on 1 and 3 threads.
    #[test]
    fn runs_move_as_an_element_by_element_transpose_does() {
        let perms: Vec<Vec<usize>> = (0..24)
            .map(|mut k| {
                let mut left: Vec<usize> = (0..4).collect();
                (1..=4usize)
                    .rev()
                    .map(|m| {
                        let pick = k % m;
                        k /= m;
                        left.remove(pick)
                    })
                    .collect()
            })
            .collect();
        for (shape, threads) in [([2usize, 3, 1, 4], 1), ([5, 41, 9, 19], 1), ([5, 41, 9, 19], 3)] {
            let n: usize = shape.iter().product();
            for elem in [2usize, 4] {
                assert!(shape[1] == 3 || n * elem >= SPLIT_BYTES, "{shape:?} is split");
                let src: Vec<u8> = (0..n * elem).map(|i| (i * 7 % 251) as u8).collect();
                let buf =
                    |bytes| Buffer { name: String::new(), bytes, storage: Storage::Arena { offset: 0 }, mask: None };
                for perm in &perms {
                    let t = Transpose { shape: shape.to_vec(), perm: perm.clone(), elem };
                    let (b0, b1) = (buf(n * elem), buf(n * elem));
                    let plan = t.plan(&[&b0, &b1], &Default::default()).unwrap();
                    let mut dst = vec![0u8; n * elem];
                    // SAFETY: the buffers `plan` was given, apart.
                    unsafe { plan.call(&[dst.as_mut_ptr(), src.as_ptr() as *mut u8], &|_| None, threads) }.unwrap();
                    let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
                    let mut want = vec![0u8; n * elem];
                    for o in 0..n {
                        let mut idx = [0usize; 4];
                        let mut r = o;
                        for d in (0..4).rev() {
                            idx[d] = r % out[d];
                            r /= out[d];
                        }
                        let mut i = 0;
                        for (d, &n) in shape.iter().enumerate() {
                            let pos = perm.iter().position(|&p| p == d).unwrap();
                            i = i * n + idx[pos];
                        }
                        want[o * elem..(o + 1) * elem].copy_from_slice(&src[i * elem..(i + 1) * elem]);
                    }
                    assert_eq!(dst, want, "{shape:?} {perm:?} {elem} on {threads} threads");
                }
            }
        }
    }

    #[test]
    fn bad_permutations_and_small_buffers_are_refused() {
        let buf = |bytes| Buffer { name: String::new(), bytes, storage: Storage::Arena { offset: 0 }, mask: None };
        let (big, small) = (buf(96), buf(95));
        let t = |perm: Vec<usize>| Transpose { shape: vec![2, 3, 4], perm, elem: 4 };
        assert!(t(vec![0, 0, 1]).plan(&[&big, &big], &Default::default()).is_err());
        assert!(t(vec![0, 1]).plan(&[&big, &big], &Default::default()).is_err());
        let e = t(vec![2, 1, 0]).plan(&[&big, &small], &Default::default()).err().unwrap();
        assert!(e.contains("buffer 1 holds 95 bytes"), "{e}");
    }
}
