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

impl Planned for TransposePlan {
    unsafe fn call<'m>(&self, args: &[*mut u8], _: &dyn Fn(usize) -> Option<&'m Mask>, _: usize) -> Result<()> {
        if self.bytes == 0 {
            return Ok(());
        }
        let (dst, src) = (args[0], args[1] as *const u8);
        let mut at = vec![0usize; self.outer.len()];
        let mut from = 0usize;
        for to in (0..self.bytes).step_by(self.run) {
            // SAFETY: `plan` checked both buffers hold `bytes`; every run lies inside them,
            // and the result aliases no operand.
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::program::Storage;

    /// Against an index-by-index transpose, for every permutation of a rank-4 shape with
    /// a dim of 1, of f32 and of 2-byte elements.
    #[test]
    fn runs_move_as_an_element_by_element_transpose_does() {
        let shape = [2usize, 3, 1, 4];
        let n: usize = shape.iter().product();
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
        for elem in [2usize, 4] {
            let src: Vec<u8> = (0..n * elem).map(|i| (i * 7 % 251) as u8).collect();
            let buf = |bytes| Buffer { name: String::new(), bytes, storage: Storage::Arena { offset: 0 }, mask: None };
            for perm in &perms {
                let t = Transpose { shape: shape.to_vec(), perm: perm.clone(), elem };
                let (b0, b1) = (buf(n * elem), buf(n * elem));
                let plan = t.plan(&[&b0, &b1], &Default::default()).unwrap();
                let mut dst = vec![0u8; n * elem];
                // SAFETY: the buffers `plan` was given, apart.
                unsafe { plan.call(&[dst.as_mut_ptr(), src.as_ptr() as *mut u8], &|_| None, 1) }.unwrap();
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
                assert_eq!(dst, want, "{perm:?} {elem}");
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
