//! Strided loop nests, shared by every kernel family that walks tensors (elementwise,
//! data movement, reductions): `Dim` (a loop's trip count and a stride per pointer),
//! `collapse` (fewer, longer loops), `for_nest` and `for_parts` (the nest, whole or cut
//! into the kernel's parts).

use cranelift_codegen::ir::Value;

use super::emit::KernelBuilder;

/// One loop of a nest: its trip count and, per pointer the nest advances, a stride
/// (elements or bytes, as the caller decides).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Dim {
    pub n: usize,
    pub strides: Vec<i64>,
}

impl Dim {
    pub fn new(n: usize, strides: &[i64]) -> Dim {
        Dim { n, strides: strides.to_vec() }
    }

    pub fn scaled(&self, by: i64) -> Dim {
        Dim { n: self.n, strides: self.strides.iter().map(|s| s * by).collect() }
    }
}

/// Row-major element strides of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as i64;
    }
    s
}

/// The same iteration with fewer loops: size-1 dims dropped, and a dim merged into the
/// next one wherever, for every pointer, stepping the outer dim once equals stepping the
/// inner dim its full length. An empty iteration stays empty (a merge with a size-0 dim
/// has size 0).
pub(crate) fn collapse(dims: &[Dim]) -> Vec<Dim> {
    let mut out: Vec<Dim> = Vec::new();
    for d in dims.iter().filter(|d| d.n != 1) {
        match out.last_mut() {
            Some(prev) if prev.strides.iter().zip(&d.strides).all(|(&p, &s)| p == s * d.n as i64) => {
                prev.n *= d.n;
                prev.strides.clone_from(&d.strides);
            }
            _ => out.push(d.clone()),
        }
    }
    out
}

/// `ptr + i * stride` (bytes); no arithmetic for stride 0.
pub(crate) fn advance(kb: &mut KernelBuilder, ptr: Value, i: Value, stride: i64) -> Value {
    if stride == 0 {
        ptr
    } else {
        kb.addr(ptr, i, stride)
    }
}

/// Loops over `dims` (outermost first, strides in bytes, one per pointer) and calls `body`
/// with the pointers advanced to each point.
pub(crate) fn for_nest(
    kb: &mut KernelBuilder,
    dims: &[Dim],
    ptrs: &[Value],
    body: &mut dyn FnMut(&mut KernelBuilder, &[Value]),
) {
    match dims.split_first() {
        None => body(kb, ptrs),
        Some((d, rest)) if d.n == 1 => for_nest(kb, rest, ptrs, body),
        Some((d, rest)) => kb.for_const(0, d.n as i64, 1, |kb, i| {
            let moved: Vec<Value> = ptrs.iter().zip(&d.strides).map(|(&p, &s)| advance(kb, p, i, s)).collect();
            for_nest(kb, rest, &moved, body)
        }),
    }
}

/// `for_nest`, with the outermost of `dims` cut into the kernel's parts: this call visits
/// only its part of those iterations (`KernelBuilder::part_range`); in a kernel that scales
/// with symbolic dims, the call's rows' share of them (`rows::outer`). With no dims the body
/// runs once, so such a kernel must not be split.
pub(crate) fn for_parts(
    kb: &mut KernelBuilder,
    dims: &[Dim],
    ptrs: &[Value],
    body: &mut dyn FnMut(&mut KernelBuilder, &[Value]),
) {
    let Some((d, rest)) = dims.split_first() else { return body(kb, ptrs) };
    let n = match super::rows::outer(kb, d.n) {
        Some(n) => n,
        None => kb.iconst(d.n as i64),
    };
    let repeats = super::rows::repeats(kb, ptrs.len(), d.n);
    let (start, end) = kb.part_range(n);
    kb.for_range(start, end, 1, |kb, i| {
        let moved: Vec<Value> = (ptrs.iter().zip(&d.strides).zip(&repeats))
            .map(|((&p, &s), repeat)| match repeat {
                Some(repeat) => {
                    let at = repeat.at(kb, i);
                    advance(kb, p, at, s)
                }
                None => advance(kb, p, i, s),
            })
            .collect();
        for_nest(kb, rest, &moved, body)
    });
}
