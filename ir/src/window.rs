//! Sliding-window ops and padding — conv, max_pool, avg_pool and pad (docs/ops.md): the
//! geometry their attributes describe (`Window`), the result shapes shape inference gives
//! them, and their reference semantics for the interpreter. The compiler's expansion of
//! these ops into gathers and matmuls reads the same geometry, so both agree on which input
//! element every window tap reads.
//!
//! Layout is ONNX's: `x` is `[N, C, spatial...]`, a conv weight `[M, C/groups, kernel...]`,
//! `pads` lists the begin pads of every spatial dim, then the end pads.

use crate::attrs::{self, PadMode};
use crate::budget;
use crate::dtype::ShapeDisplay;
use crate::graph::Node;
use crate::ops::Op;
use crate::tensor::{Data, Tensor};

type R<T> = std::result::Result<T, String>;

/// Where one window tap lands along one spatial dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tap {
    /// On input element `i`.
    Real(usize),
    /// On padding (inside `pads`).
    Pad,
    /// Past the padded input: only a ceil_mode pooling window reaches there; it does not
    /// count at all.
    Outside,
}

/// The geometry of a conv or pooling window over the spatial dims.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub begin: Vec<usize>,
    pub end: Vec<usize>,
    pub dilations: Vec<usize>,
    pub ceil_mode: bool,
}

/// The window attributes conv and the pools share (conv's kernel is its weight's shape).
struct Geometry {
    kernel: Option<Vec<i64>>,
    strides: Option<Vec<i64>>,
    pads: Option<Vec<i64>>,
    dilations: Option<Vec<i64>>,
    ceil_mode: bool,
}

impl Geometry {
    fn of(node: &Node) -> R<Geometry> {
        Ok(match node.op {
            Op::Conv => {
                let a = attrs::Conv::try_of(node)?;
                Geometry { kernel: None, strides: a.strides, pads: a.pads, dilations: a.dilations, ceil_mode: false }
            }
            Op::MaxPool => {
                let a = attrs::MaxPool::try_of(node)?;
                let (kernel, ceil_mode) = (Some(a.kernel), a.ceil_mode);
                Geometry { kernel, strides: a.strides, pads: a.pads, dilations: a.dilations, ceil_mode }
            }
            Op::AvgPool => {
                let a = attrs::AvgPool::try_of(node)?;
                let (kernel, ceil_mode) = (Some(a.kernel), a.ceil_mode);
                Geometry { kernel, strides: a.strides, pads: a.pads, dilations: a.dilations, ceil_mode }
            }
            op => return Err(format!("{op} has no window")),
        })
    }
}

fn positive(v: Option<Vec<i64>>, name: &str, n: usize) -> R<Vec<usize>> {
    let v = v.unwrap_or_else(|| vec![1; n]);
    if v.len() != n {
        return Err(format!("'{name}' has {} entries, expected {n} (one per spatial dim)", v.len()));
    }
    v.iter().map(|&s| usize::try_from(s).ok().filter(|&s| s > 0).ok_or(format!("'{name}' must be positive"))).collect()
}

impl Window {
    /// The window of `node` (conv: `kernel` from its weight; pools: their `kernel` attribute)
    /// over `spatial` dims.
    pub fn of(node: &Node, spatial: usize, kernel: Option<&[usize]>) -> R<Window> {
        let geometry = Geometry::of(node)?;
        let kernel = match kernel {
            Some(k) => k.to_vec(),
            None => {
                let n = geometry.kernel.as_ref().map_or(0, Vec::len);
                positive(geometry.kernel, "kernel", n)?
            }
        };
        if kernel.len() != spatial || spatial == 0 {
            return Err(format!("the kernel has {} dims, the input {spatial} spatial dims", kernel.len()));
        }
        let pads = geometry.pads.unwrap_or_else(|| vec![0; 2 * spatial]);
        if pads.len() != 2 * spatial {
            return Err(format!("'pads' has {} entries, expected {} (begins, then ends)", pads.len(), 2 * spatial));
        }
        let pads = pads.iter().map(|&p| usize::try_from(p).map_err(|_| "'pads' must not be negative".to_string()));
        let pads = pads.collect::<R<Vec<usize>>>()?;
        Ok(Window {
            strides: positive(geometry.strides, "strides", spatial)?,
            dilations: positive(geometry.dilations, "dilations", spatial)?,
            begin: pads[..spatial].to_vec(),
            end: pads[spatial..].to_vec(),
            kernel,
            ceil_mode: geometry.ceil_mode,
        })
    }

    /// The result's spatial sizes for input spatial sizes `input` (ONNX's rule: with
    /// ceil_mode a last window that would start past the input and its begin pad is dropped).
    /// A window whose outputs times its taps exceed `budget::CEILING` is refused: no
    /// computation over it could be described, let alone run.
    pub fn out_sizes(&self, input: &[usize]) -> R<Vec<usize>> {
        let out = (0..input.len())
            .map(|d| {
                let span = (self.kernel[d] - 1).checked_mul(self.dilations[d]).and_then(|s| s.checked_add(1));
                let padded = input[d].checked_add(self.begin[d]).and_then(|p| p.checked_add(self.end[d]));
                let (Some(span), Some(padded)) = (span, padded) else {
                    return Err(format!("the window or the padded input along spatial dim {d} is too large"));
                };
                if padded < span {
                    return Err(format!(
                        "the window spans {span} along spatial dim {d}, the padded input only {padded}"
                    ));
                }
                let s = self.strides[d];
                let mut n = (padded - span) / s + 1;
                if self.ceil_mode && !(padded - span).is_multiple_of(s) {
                    n += 1;
                    if (n - 1) * s >= input[d] + self.begin[d] {
                        n -= 1;
                    }
                }
                Ok(n)
            })
            .collect::<R<Vec<usize>>>()?;
        let taps = budget::elems(&out).saturating_mul(budget::elems(&self.kernel));
        if taps > budget::CEILING as u128 {
            return Err(format!(
                "the kernel {} at each of the {} outputs makes {taps} taps, more than the {} meshc describes",
                ShapeDisplay(&self.kernel),
                ShapeDisplay(&out),
                budget::CEILING
            ));
        }
        Ok(out)
    }

    /// Where tap `k` of output position `o` lands along spatial dim `d` of an input of size `n`.
    pub fn tap(&self, d: usize, n: usize, o: usize, k: usize) -> Tap {
        // In i128: strides and pads as large as i64's make positions past its range.
        let at = |v: usize| v as i128;
        let i = at(o) * at(self.strides[d]) + at(k) * at(self.dilations[d]) - at(self.begin[d]);
        if (0..at(n)).contains(&i) {
            Tap::Real(i as usize)
        } else if i < at(n) + at(self.end[d]) {
            Tap::Pad
        } else {
            Tap::Outside
        }
    }

    /// The taps `k` of output position `o` along spatial dim `d` (input size `n`) that land
    /// on the input, and those that land on it or its padding: `lo..hi` and `0..pad_hi`.
    fn reach(&self, d: usize, n: usize, o: usize) -> (usize, usize, usize) {
        let (s, dil, kernel) = (self.strides[d] as i128, self.dilations[d], self.kernel[d]);
        // Tap k reads input element o·s + k·dil − begin.
        let start = o as i128 * s - self.begin[d] as i128;
        let first_at_least = |bound: i128| ((bound - start).max(0) as u128).div_ceil(dil as u128).min(kernel as u128);
        let (lo, hi) = (first_at_least(0), first_at_least(n as i128));
        let pad_hi = first_at_least(n as i128 + self.end[d] as i128);
        (lo as usize, hi.max(lo) as usize, pad_hi as usize)
    }

    /// How many taps of output position `o` (flattened over `out`, the result's spatial
    /// sizes) an average counts: those on the input, and with `include_pad` those on
    /// padding (never those past it, where only a ceil_mode window reaches).
    pub fn counted(&self, input: &[usize], out: &[usize], o: usize, include_pad: bool) -> usize {
        let oi = unflatten(o, out);
        (0..input.len())
            .map(|d| {
                let (lo, hi, pad_hi) = self.reach(d, input[d], oi[d]);
                if include_pad {
                    pad_hi
                } else {
                    hi - lo
                }
            })
            .product()
    }

    /// For every (output position, kernel tap) pair, both flattened row-major over the
    /// spatial dims, where the tap lands in the flattened input of spatial sizes `input`.
    pub fn taps(&self, input: &[usize], out: &[usize]) -> R<Vec<Tap>> {
        let every: Vec<Vec<usize>> = self.kernel.iter().map(|&k| (0..k).collect()).collect();
        self.taps_among(input, out, &every)
    }

    /// The taps a pool reads: per output position, only the kernel taps (per spatial dim)
    /// that land on the input for some output position. The others read padding wherever
    /// the window is, which a max ignores and an average counts (`counted`) without reading,
    /// so a kernel far wider than its input costs no more than the input. Gives the number
    /// of taps per output position, and the table `taps` would give over them.
    pub fn pool_taps(&self, input: &[usize], out: &[usize]) -> R<(usize, Vec<Tap>)> {
        let live: Vec<Vec<usize>> = (0..input.len())
            .map(|d| {
                let mut ranges: Vec<(usize, usize)> = (0..out[d])
                    .map(|o| self.reach(d, input[d], o))
                    .filter(|(lo, hi, _)| lo < hi)
                    .map(|(lo, hi, _)| (lo, hi))
                    .collect();
                ranges.sort_unstable();
                let mut live: Vec<usize> = Vec::new();
                for (lo, hi) in ranges {
                    let from = live.last().map_or(lo, |&l| lo.max(l + 1));
                    budget::check("the taps of a pooling window", (live.len() + hi.saturating_sub(from)) as u128, 8)?;
                    live.extend(from..hi);
                }
                // A dim no window reaches into still reads (padding) through one tap.
                if live.is_empty() {
                    live.push(0);
                }
                Ok(live)
            })
            .collect::<R<_>>()?;
        let per_output = live.iter().map(Vec::len).product();
        Ok((per_output, self.taps_among(input, out, &live)?))
    }

    /// `taps` over the kernel taps `ks` (per spatial dim) only.
    fn taps_among(&self, input: &[usize], out: &[usize], ks: &[Vec<usize>]) -> R<Vec<Tap>> {
        let lens: Vec<usize> = ks.iter().map(Vec::len).collect();
        let (n_out, n_k) = (numel(out), numel(&lens));
        let count = budget::elems(out).saturating_mul(budget::elems(&lens));
        budget::check(
            format_args!("the window table of kernel {} over {} outputs", ShapeDisplay(&self.kernel), n_out),
            count,
            std::mem::size_of::<Tap>(),
        )?;
        let mut taps = Vec::with_capacity(n_out * n_k);
        for o in 0..n_out {
            let oi = unflatten(o, out);
            for k in 0..n_k {
                let ki = unflatten(k, &lens);
                let mut flat = 0;
                let mut tap = Tap::Real(0);
                for d in 0..input.len() {
                    match (self.tap(d, input[d], oi[d], ks[d][ki[d]]), tap) {
                        (_, Tap::Outside) | (Tap::Outside, _) => tap = Tap::Outside,
                        (Tap::Pad, _) | (_, Tap::Pad) => tap = Tap::Pad,
                        (Tap::Real(i), Tap::Real(_)) => flat = flat * input[d] + i,
                    }
                }
                taps.push(if let Tap::Real(_) = tap { Tap::Real(flat) } else { tap });
            }
        }
        Ok(taps)
    }
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Row-major multi-index of flat index `i` in `shape`.
pub fn unflatten(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// The conv of `node` for input shape `x` and weight shape `w`: its window and groups.
pub fn conv_window(node: &Node, x: &[usize], w: &[usize]) -> R<(Window, usize)> {
    if x.len() < 3 || w.len() != x.len() {
        return Err(format!(
            "conv wants x of rank >= 3 ([N, C, spatial...]) and a weight of the same rank, found ranks {} and {}",
            x.len(),
            w.len()
        ));
    }
    let groups = usize::try_from(attrs::Conv::try_of(node)?.groups)
        .ok()
        .filter(|&g| g > 0)
        .ok_or("'groups' must be positive")?;
    if !x[1].is_multiple_of(groups) || !w[0].is_multiple_of(groups) || w[1] * groups != x[1] {
        return Err(format!(
            "groups = {groups} needs C = {} and M = {} divisible by it and a weight with C/groups input channels, found {}",
            x[1], w[0], w[1]
        ));
    }
    Ok((Window::of(node, x.len() - 2, Some(&w[2..]))?, groups))
}

/// The result shape of `pad`: `x` with `pads` (begins, then ends; negative crops) added.
pub fn pad_shape(node: &Node, x: &[usize]) -> R<(Vec<i64>, Vec<usize>)> {
    let attrs::Pad { pads, mode, .. } = attrs::Pad::try_of(node)?;
    if pads.len() != 2 * x.len() {
        return Err(format!("'pads' has {} entries, expected {} (begins, then ends)", pads.len(), 2 * x.len()));
    }
    let shape = (0..x.len())
        .map(|d| {
            let n = x[d] as i64 + pads[d] + pads[x.len() + d];
            usize::try_from(n).map_err(|_| format!("pads crop dim {d} (size {}) below zero", x[d]))
        })
        .collect::<R<Vec<_>>>()?;
    if mode != PadMode::Constant {
        if let Some(d) = (0..x.len()).find(|&d| x[d] == 0 && shape[d] > 0) {
            return Err(format!("{mode} padding of dim {d} of size 0 has nothing to copy"));
        }
    }
    Ok((pads, shape))
}

/// Where output index `o` of a dim of input size `n` padded by `begin` reads from in
/// `mode` (`None`: the constant).
pub fn pad_source(mode: PadMode, n: usize, begin: i64, o: usize) -> Option<usize> {
    let i = o as i64 - begin;
    let n = n as i64;
    if (0..n).contains(&i) {
        return Some(i as usize);
    }
    let j = match mode {
        PadMode::Edge => i.clamp(0, n - 1),
        PadMode::Wrap => i.rem_euclid(n),
        PadMode::Reflect if n == 1 => 0,
        PadMode::Reflect => {
            let j = i.rem_euclid(2 * (n - 1));
            if j >= n {
                2 * (n - 1) - j
            } else {
                j
            }
        }
        PadMode::Constant => return None,
    };
    Some(j as usize)
}

// ---------------------------------------------------------------------------------------
// Reference semantics
// ---------------------------------------------------------------------------------------

fn f32s<'a>(t: &'a Tensor, what: &str) -> R<&'a [f32]> {
    t.as_f32().ok_or_else(|| format!("{what} must be f32, found {}", t.dtype()))
}

/// conv: f64 accumulation, rounded to f32 once per result element.
pub fn conv(node: &Node, x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> R<Tensor> {
    let (win, groups) = conv_window(node, &x.shape, &w.shape)?;
    let (xv, wv) = (f32s(x, "x")?, f32s(w, "the weight")?);
    let bv = b.map(|b| f32s(b, "the bias")).transpose()?;
    let sp = &x.shape[2..];
    let out_sp = win.out_sizes(sp)?;
    let taps = win.taps(sp, &out_sp)?;
    let (n, c, m) = (x.shape[0], x.shape[1], w.shape[0]);
    let (cg, mg) = (c / groups, m / groups);
    let (n_in, n_out, n_k) = (numel(sp), numel(&out_sp), numel(&win.kernel));
    let mut out = Vec::with_capacity(n * m * n_out);
    for b_ in 0..n {
        for oc in 0..m {
            let g = oc / mg;
            for o in 0..n_out {
                let mut acc = bv.map_or(0.0, |b| b[oc] as f64);
                for ci in 0..cg {
                    let xc = &xv[(b_ * c + g * cg + ci) * n_in..][..n_in];
                    let wk = &wv[(oc * cg + ci) * n_k..][..n_k];
                    for (k, tap) in taps[o * n_k..][..n_k].iter().enumerate() {
                        if let Tap::Real(i) = tap {
                            acc += xc[*i] as f64 * wk[k] as f64;
                        }
                    }
                }
                out.push(acc as f32);
            }
        }
    }
    Ok(Tensor::f32([&x.shape[..1], &[m], &out_sp[..]].concat(), out))
}

/// max_pool and avg_pool: per window, the max of its real elements, or their mean (with
/// `count_include_pad`, pads count as zeros; taps past the padded input never count).
pub fn pool(node: &Node, x: &Tensor, max: bool) -> R<Tensor> {
    let win = Window::of(node, x.shape.len().saturating_sub(2), None)?;
    let include_pad = !max && attrs::AvgPool::try_of(node)?.count_include_pad;
    let xv = f32s(x, "x")?;
    let sp = &x.shape[2..];
    let out_sp = win.out_sizes(sp)?;
    let (n_k, taps) = win.pool_taps(sp, &out_sp)?;
    let (n_in, n_out) = (numel(sp), numel(&out_sp));
    let counts: Vec<usize> =
        (0..if max { 0 } else { n_out }).map(|o| win.counted(sp, &out_sp, o, include_pad)).collect();
    let mut out = Vec::with_capacity(x.shape[0] * x.shape[1] * n_out);
    for plane in xv.chunks(n_in.max(1)).take(x.shape[0] * x.shape[1]) {
        for o in 0..n_out {
            let window = &taps[o * n_k..][..n_k];
            let real = window.iter().filter_map(|t| if let Tap::Real(i) = t { Some(plane[*i] as f64) } else { None });
            out.push(if max {
                real.fold(f64::NEG_INFINITY, |a, v| if a >= v || a.is_nan() { a } else { v }) as f32
            } else {
                (real.sum::<f64>() / counts[o] as f64) as f32
            });
        }
    }
    Ok(Tensor::f32([&x.shape[..2], &out_sp[..]].concat(), out))
}

/// pad, any dtype; `value` (converted to the dtype) fills the constant mode.
pub fn pad(node: &Node, x: &Tensor) -> R<Tensor> {
    let (pads, shape) = pad_shape(node, &x.shape)?;
    let attrs::Pad { mode, value, .. } = attrs::Pad::try_of(node)?;
    let r = x.shape.len();
    let maps: Vec<Vec<Option<usize>>> =
        (0..r).map(|d| (0..shape[d]).map(|o| pad_source(mode, x.shape[d], pads[d], o)).collect()).collect();
    let src: Vec<Option<usize>> = (0..numel(&shape))
        .map(|i| {
            let idx = unflatten(i, &shape);
            (0..r).try_fold(0, |flat, d| maps[d][idx[d]].map(|s| flat * x.shape[d] + s))
        })
        .collect();
    let fill = Data::from_f64(x.dtype(), [value]);
    let data = match (&x.data, &fill) {
        (Data::F32(v), Data::F32(f)) => Data::F32(src.iter().map(|s| s.map_or(f[0], |i| v[i])).collect()),
        (Data::I32(v), Data::I32(f)) => Data::I32(src.iter().map(|s| s.map_or(f[0], |i| v[i])).collect()),
        (Data::I64(v), Data::I64(f)) => Data::I64(src.iter().map(|s| s.map_or(f[0], |i| v[i])).collect()),
        (Data::Bool(v), Data::Bool(f)) => Data::Bool(src.iter().map(|s| s.map_or(f[0], |i| v[i])).collect()),
        (Data::F16(v), Data::F16(f)) => Data::F16(src.iter().map(|s| s.map_or(f[0], |i| v[i])).collect()),
        (Data::BF16(v), Data::BF16(f)) => Data::BF16(src.iter().map(|s| s.map_or(f[0], |i| v[i])).collect()),
        _ => unreachable!("the fill has the dtype of x"),
    };
    Ok(Tensor::new(shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::Attr;

    fn node(op: Op, attrs: &[(&str, Attr)]) -> Node {
        let mut n = Node::new("n", op, &["x"]);
        for (k, v) in attrs {
            n.attrs.insert(k.to_string(), v.clone());
        }
        n
    }

    fn ints(v: &[i64]) -> Attr {
        Attr::ints(v)
    }

    fn row(v: &[f32]) -> Tensor {
        Tensor::f32(vec![1, 1, v.len()], v.to_vec())
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.as_f32().unwrap().to_vec()
    }

    /// ceil_mode adds a last window only where it starts inside the input (and its begin
    /// pad), and that window averages over its real elements alone.
    #[test]
    fn ceil_mode_keeps_only_windows_that_start_inside() {
        let x = row(&[1., 2., 3., 4., 5.]);
        let attrs = |ceil| vec![("kernel", ints(&[2])), ("strides", ints(&[2])), ("ceil_mode", Attr::Bool(ceil))];
        assert_eq!(values(&pool(&node(Op::MaxPool, &attrs(false)), &x, true).unwrap()), [2., 4.]);
        assert_eq!(values(&pool(&node(Op::MaxPool, &attrs(true)), &x, true).unwrap()), [2., 4., 5.]);
        assert_eq!(values(&pool(&node(Op::AvgPool, &attrs(true)), &x, false).unwrap()), [1.5, 3.5, 5.]);
        // Input 1, end pad 1, stride 2: ceil would give a second window starting in the
        // end pad, which ONNX drops.
        let n = node(
            Op::MaxPool,
            &[
                ("kernel", ints(&[1])),
                ("strides", ints(&[2])),
                ("pads", ints(&[0, 1])),
                ("ceil_mode", Attr::Bool(true)),
            ],
        );
        assert_eq!(Window::of(&n, 1, None).unwrap().out_sizes(&[1]).unwrap(), [1]);
    }

    /// A kernel far wider than its input reads only the input's taps; an average still
    /// counts the pads (with count_include_pad) without reading them.
    #[test]
    fn wide_kernels_read_only_the_input() {
        let wide = 1i64 << 31;
        let attrs = |inc| {
            vec![("kernel", ints(&[wide])), ("pads", ints(&[2, wide - 6])), ("count_include_pad", Attr::Bool(inc))]
        };
        let win = Window::of(&node(Op::AvgPool, &attrs(false)), 1, None).unwrap();
        let out = win.out_sizes(&[4]).unwrap();
        assert_eq!(out, [1]);
        let (per_output, taps) = win.pool_taps(&[4], &out).unwrap();
        assert_eq!((per_output, taps), (4, vec![Tap::Real(0), Tap::Real(1), Tap::Real(2), Tap::Real(3)]));
        let x = row(&[1., 5., -2., 3.]);
        assert_eq!(values(&pool(&node(Op::AvgPool, &attrs(false)), &x, false).unwrap()), [1.75]);
        assert_eq!(values(&pool(&node(Op::AvgPool, &attrs(true)), &x, false).unwrap()), [(7. / wide as f64) as f32]);
        assert_eq!(values(&pool(&node(Op::MaxPool, &attrs(false)[..2]), &x, true).unwrap()), [5.]);
    }

    /// Strides and pads of 2^62 put window positions past i64: classified, not overflowed.
    #[test]
    fn positions_past_i64_are_still_classified() {
        let big = 1i64 << 62;
        let n = node(Op::MaxPool, &[("kernel", ints(&[1])), ("strides", ints(&[big])), ("pads", ints(&[big, big]))]);
        let got = values(&pool(&n, &row(&[1., 2., 3., 4.]), true).unwrap());
        assert_eq!(got, [f32::NEG_INFINITY, 1., f32::NEG_INFINITY]);
    }

    #[test]
    fn count_include_pad_counts_pads_as_zeros() {
        let x = row(&[1., 2., 3.]);
        let attrs = |inc| vec![("kernel", ints(&[3])), ("pads", ints(&[1, 1])), ("count_include_pad", Attr::Bool(inc))];
        assert_eq!(values(&pool(&node(Op::AvgPool, &attrs(false)), &x, false).unwrap()), [1.5, 2., 2.5]);
        assert_eq!(values(&pool(&node(Op::AvgPool, &attrs(true)), &x, false).unwrap()), [1., 2., 5. / 3.]);
        // Max ignores pads, even when every real element is negative.
        let neg = row(&[-1., -2., -3.]);
        assert_eq!(values(&pool(&node(Op::MaxPool, &attrs(false)), &neg, true).unwrap()), [-1., -1., -2.]);
    }

    /// Negative pads crop; reflect, edge and wrap map the new positions back in.
    #[test]
    fn pads_crop_and_modes_map_indices() {
        let x = Tensor::f32(vec![4], vec![1., 2., 3., 4.]);
        let pad_with = |mode: &str| {
            let n = node(
                Op::Pad,
                &[("pads", ints(&[-1, 2])), ("mode", Attr::Str(mode.into())), ("value", Attr::Float(9.))],
            );
            values(&pad(&n, &x).unwrap())
        };
        assert_eq!(pad_with("constant"), [2., 3., 4., 9., 9.]);
        assert_eq!(pad_with("reflect"), [2., 3., 4., 3., 2.]);
        assert_eq!(pad_with("edge"), [2., 3., 4., 4., 4.]);
        assert_eq!(pad_with("wrap"), [2., 3., 4., 1., 2.]);
        let n = node(Op::Pad, &[("pads", ints(&[3, 0])), ("mode", Attr::Str("reflect".into()))]);
        assert_eq!(values(&pad(&n, &Tensor::f32(vec![2], vec![1., 2.])).unwrap()), [2., 1., 2., 1., 2.]);
        let n = node(Op::Pad, &[("pads", ints(&[-3, -2]))]);
        assert!(pad_shape(&n, &[4]).unwrap_err().contains("below zero"));
        let n = node(Op::Pad, &[("pads", ints(&[1, 0])), ("mode", Attr::Str("edge".into()))]);
        assert!(pad_shape(&n, &[0]).unwrap_err().contains("nothing to copy"));
    }

    /// A padded 3x3 box filter sums the 4, 6 or 9 real neighbours; a depthwise conv keeps
    /// channels apart; the grouping must divide the channels.
    #[test]
    fn conv_pads_and_groups() {
        let mut n = Node::new("c", Op::Conv, &["x", "w"]);
        n.attrs.insert("pads".into(), ints(&[1, 1, 1, 1]));
        let x = Tensor::f32(vec![1, 1, 3, 3], vec![1.; 9]);
        let w = Tensor::f32(vec![1, 1, 3, 3], vec![1.; 9]);
        assert_eq!(values(&conv(&n, &x, &w, None).unwrap()), [4., 6., 4., 6., 9., 6., 4., 6., 4.]);
        let mut dw = Node::new("c", Op::Conv, &["x", "w"]);
        dw.attrs.insert("groups".into(), Attr::Int(2));
        let x = Tensor::f32(vec![1, 2, 1, 2], vec![1., 2., 10., 20.]);
        let w = Tensor::f32(vec![2, 1, 1, 1], vec![2., 3.]);
        let b = Tensor::f32(vec![2], vec![0.5, -0.5]);
        assert_eq!(values(&conv(&dw, &x, &w, Some(&b)).unwrap()), [2.5, 4.5, 29.5, 59.5]);
        let bad = Tensor::f32(vec![2, 2, 1, 1], vec![1.; 4]);
        assert!(conv(&dw, &x, &bad, None).unwrap_err().contains("groups"));
    }
}
