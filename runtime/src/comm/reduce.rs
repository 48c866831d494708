//! The arithmetic of the fabric's reductions: operands combined elementwise in rank order
//! (((o0 ∘ o1) ∘ o2) ∘ ...), so that every member gets bit-identical results whatever the
//! thread timing, the operand size or the hosts; in AVX-512 code where the CPU has it, and
//! written out with non-temporal stores where the result will not stay in the cache.

use crate::format::program::Reduce;

/// Elements reduced at a time: the accumulator stays in L1 while the operands stream by.
const BLOCK: usize = 2048;

/// `dests[k][dst..dst+len] = reduce over members of ops[m][src..src+len]`, combining in
/// rank order.
///
/// # Safety
/// The ranges must be valid, and the destinations must not overlap the operand ranges of
/// other parts.
pub(crate) unsafe fn reduce_range(
    ops: &[*const f32],
    src: usize,
    dests: &[*mut f32],
    dst: usize,
    len: usize,
    reduce: Reduce,
    stream: bool,
) {
    let mut acc = [0f32; BLOCK];
    // On the stack for up to 32 operands: a collective's call must not allocate.
    let srcs: smallvec::SmallVec<[&[f32]; 32]> =
        ops.iter().map(|&p| unsafe { std::slice::from_raw_parts(p.add(src), len) }).collect();
    let mut b = 0;
    while b < len {
        let e = (b + BLOCK).min(len);
        let a = &mut acc[..e - b];
        combine(a, &srcs, b, reduce, true);
        if reduce == Reduce::Mean {
            let n = srcs.len() as f32;
            a.iter_mut().for_each(|x| *x /= n);
        }
        for &d in dests {
            unsafe { store(d.add(dst + b), a, stream) };
        }
        b = e;
    }
}

/// `fold` with the operation of `reduce` (a mean sums; the caller divides), in AVX-512 or
/// AVX2 code as the CPU has them (`format::isa`): wider loads keep more bytes in flight per
/// core, ~13% more bandwidth on a 16 MiB all_reduce with AVX-512 than without. Every lane
/// computes exactly what the scalar code would. Unless `fresh`, the fold goes on from what
/// `acc` holds (a partial result of earlier ranks, from another host).
pub(crate) fn combine(acc: &mut [f32], srcs: &[&[f32]], at: usize, reduce: Reduce, fresh: bool) {
    use crate::format::isa::{current, Isa};
    match current() {
        // SAFETY: the CPU has AVX-512F (`format::isa` forces no ISA above the CPU's).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { combine_avx512(acc, srcs, at, reduce, fresh) },
        // SAFETY: as above, with AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { combine_avx2(acc, srcs, at, reduce, fresh) },
        _ => combine_any(acc, srcs, at, reduce, fresh),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn combine_avx512(acc: &mut [f32], srcs: &[&[f32]], at: usize, reduce: Reduce, fresh: bool) {
    combine_any(acc, srcs, at, reduce, fresh)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn combine_avx2(acc: &mut [f32], srcs: &[&[f32]], at: usize, reduce: Reduce, fresh: bool) {
    combine_any(acc, srcs, at, reduce, fresh)
}

#[inline(always)]
fn combine_any(acc: &mut [f32], srcs: &[&[f32]], at: usize, reduce: Reduce, fresh: bool) {
    match reduce {
        Reduce::Sum | Reduce::Mean => fold(acc, srcs, at, fresh, |x, y| x + y),
        // numpy's maximum: a NaN on either side wins.
        Reduce::Max => fold(acc, srcs, at, fresh, |x, y| if y > x || y.is_nan() { y } else { x }),
    }
}

/// `acc[i] = c(..c(c(srcs[0][at+i], srcs[1][at+i]), srcs[2][at+i]).., srcs[n-1][at+i])`,
/// reading up to eight operands per pass over the block (more memory streams at once read
/// faster; the order of combination stays the rank order).
#[inline(always)]
fn fold(acc: &mut [f32], srcs: &[&[f32]], at: usize, fresh: bool, c: impl Fn(f32, f32) -> f32 + Copy) {
    let mut k = 0;
    while k < srcs.len() {
        let s = &srcs[k..];
        let first = fresh && k == 0;
        k += match s.len() {
            1 => pass::<1>(acc, s, at, first, c),
            2 => pass::<2>(acc, s, at, first, c),
            3 => pass::<3>(acc, s, at, first, c),
            4 => pass::<4>(acc, s, at, first, c),
            5 => pass::<5>(acc, s, at, first, c),
            6 => pass::<6>(acc, s, at, first, c),
            7 => pass::<7>(acc, s, at, first, c),
            _ => pass::<8>(acc, s, at, first, c),
        };
    }
}

/// One pass of `fold` over the first `N` of `srcs`, starting from the first of them or,
/// unless `first`, from `acc`. Returns `N`.
#[inline(always)]
fn pass<const N: usize>(
    acc: &mut [f32],
    srcs: &[&[f32]],
    at: usize,
    first: bool,
    c: impl Fn(f32, f32) -> f32,
) -> usize {
    let n = acc.len();
    let s: [&[f32]; N] = std::array::from_fn(|k| &srcs[k][at..at + n]);
    if first {
        for i in 0..n {
            let mut v = s[0][i];
            for x in &s[1..] {
                v = c(v, x[i]);
            }
            acc[i] = v;
        }
    } else {
        for i in 0..n {
            let mut v = acc[i];
            for x in &s {
                v = c(v, x[i]);
            }
            acc[i] = v;
        }
    }
    N
}

/// Copies `src` to `dst`, with non-temporal stores when `stream` (and `dst` is aligned).
///
/// # Safety
/// `dst` must be valid for `src.len()` elements.
unsafe fn store(dst: *mut f32, src: &[f32], stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && (dst as usize).is_multiple_of(16) {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let mut i = 0;
        while i + 4 <= src.len() {
            // SAFETY: SSE is part of x86_64; dst + i is 16-byte aligned and in bounds.
            unsafe { _mm_stream_ps(dst.add(i), _mm_loadu_ps(src.as_ptr().add(i))) };
            i += 4;
        }
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), src.len() - i) };
        return;
    }
    let _ = stream;
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
}

/// Orders non-temporal stores before the release of the rendezvous that publishes them.
pub(crate) fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::isa::Isa;

    /// Every path the CPU has gives the scalar code's bits, for sums and maxima (NaNs
    /// included), 1 to 11 operands (one pass of eight and a second), fresh or going on from
    /// a partial result, at an offset into the operands.
    #[test]
    fn every_path_gives_the_scalar_bits() {
        let len = 1000;
        let value = |k: usize, i: usize| match (k * 31 + i * 7) % 97 {
            0 => f32::NAN,
            v => (v as f32 - 48.0) * 0.37 + (i as f32) * 1e-3,
        };
        for n in 1..=11 {
            let ops: Vec<Vec<f32>> = (0..n).map(|k| (0..len + 5).map(|i| value(k, i)).collect()).collect();
            let srcs: Vec<&[f32]> = ops.iter().map(Vec::as_slice).collect();
            for reduce in [Reduce::Sum, Reduce::Max] {
                for fresh in [true, false] {
                    let start: Vec<f32> = (0..len).map(|i| value(99, i)).collect();
                    let mut want = start.clone();
                    combine_any(&mut want, &srcs, 5, reduce, fresh);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
                    #[cfg(target_arch = "x86_64")]
                    for isa in [Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detected()) {
                        let mut got = start.clone();
                        // SAFETY: the CPU has the ISA (filtered above).
                        unsafe {
                            match isa {
                                Isa::Avx512 => combine_avx512(&mut got, &srcs, 5, reduce, fresh),
                                _ => combine_avx2(&mut got, &srcs, 5, reduce, fresh),
                            }
                        }
                        assert_eq!(bits(&got), bits(&want), "{isa:?}, {n} operands, {reduce:?}, fresh {fresh}");
                    }
                    let mut got = start.clone();
                    combine(&mut got, &srcs, 5, reduce, fresh);
                    assert_eq!(bits(&got), bits(&want), "the current path, {n} operands, {reduce:?}");
                }
            }
        }
    }
}
