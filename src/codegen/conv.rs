//! The depthwise conv kernel: a 1-D or 2-D f32 `conv` whose groups are its input channels
//! (output channel m reads input channel m / (M/C) alone), which `passes::expand` leaves
//! as it is instead of going through im2col + GEMM — there, each group is a matmul of one
//! row by a handful of taps, all overhead, after a gather that copies the input k² times.
//!
//! Each (image, output channel) plane is one unit of work (the parts split the planes).
//! Output rows are computed as f32x4 vectors along the output width: a tap is one vector
//! load of the input row (stride 2: two loads and a shuffle; larger strides: four scalar
//! loads) times the tap's weight, splatted once per plane, accumulated onto the bias.
//! Padding costs no copy and no test in the loops: the geometry is known at compile time,
//! so the output columns and rows split into an interior, whose taps all land inside the
//! input (a runtime loop over rows, vectors over columns), and borders of a few rows and
//! columns, unrolled with only their valid taps. The interior columns past the last full
//! vector are unrolled as scalars the same way.

use anyhow::{bail, Result};
use cranelift_codegen::ir::{types, ConstantData, InstBuilder, MemFlagsData, Value};
use meshc_ir::window::conv_window;
use meshc_ir::{DType, Node, TensorType};

use super::emit::{build_kernel, mem, KernelBuilder, F32X4, LANES};
use super::math::Math;
use super::{parts_for, Generated, Target};

const F32: i64 = 4;

/// One spatial dim of the window: input and output sizes, kernel taps, stride, dilation,
/// the begin pad.
#[derive(Clone, Copy, Debug)]
struct Axis {
    input: usize,
    output: usize,
    taps: usize,
    stride: usize,
    dilation: usize,
    pad: usize,
}

impl Axis {
    /// The input index tap `t` of output `o` reads, if it is inside the input.
    fn source(&self, o: usize, t: usize) -> Option<usize> {
        (o * self.stride + t * self.dilation).checked_sub(self.pad).filter(|&i| i < self.input)
    }

    /// The outputs `[lo, hi)` whose taps all land inside the input.
    fn interior(&self) -> (usize, usize) {
        let lo = self.pad.div_ceil(self.stride).min(self.output);
        let span = (self.taps - 1) * self.dilation;
        let hi = match (self.input - 1 + self.pad).checked_sub(span) {
            Some(last) => (last / self.stride + 1).min(self.output),
            None => 0,
        };
        (lo, hi.max(lo))
    }

    /// The taps of output `o` that land inside the input.
    fn valid(&self, o: usize) -> Vec<usize> {
        (0..self.taps).filter(|&t| self.source(o, t).is_some()).collect()
    }
}

/// Whether `conv` of `x` by `w` (all f32) is depthwise with 1 or 2 spatial dims: what
/// [`depthwise`] computes.
pub fn is_depthwise(node: &Node, x: &TensorType, w: &TensorType) -> bool {
    let Ok((_, groups)) = conv_window(node, &x.shape, &w.shape) else { return false };
    matches!(x.rank(), 3 | 4) && groups == x.shape[1] && x.dtype == DType::F32 && w.dtype == DType::F32
}

/// The depthwise conv of `inputs` (`x`, `w`, optional bias `b`) into `out`.
pub fn depthwise(
    target: &Target,
    name: &str,
    node: &Node,
    inputs: &[TensorType],
    out: &TensorType,
) -> Result<Generated> {
    let (x, w) = (&inputs[0], &inputs[1]);
    if !is_depthwise(node, x, w) || inputs.iter().chain([out]).any(|t| t.dtype != DType::F32) {
        bail!("node '{}': conv of {x} by {w} is not an f32 depthwise conv", node.name);
    }
    let (win, _) = conv_window(node, &x.shape, &w.shape).map_err(anyhow::Error::msg)?;
    let outs = win.out_sizes(&x.shape[2..]).map_err(anyhow::Error::msg)?;
    let axis = |d: usize| Axis {
        input: x.shape[2 + d],
        output: outs[d],
        taps: win.kernel[d],
        stride: win.strides[d],
        dilation: win.dilations[d],
        pad: win.begin[d],
    };
    // A 1-D conv is a 2-D one of height 1.
    let one = Axis { input: 1, output: 1, taps: 1, stride: 1, dilation: 1, pad: 0 };
    let (rows, cols) = if x.rank() == 4 { (axis(0), axis(1)) } else { (one, axis(0)) };
    let (n, c, m) = (x.shape[0], x.shape[1], w.shape[0]);
    let expected: Vec<usize> = [n, m].into_iter().chain(outs.iter().copied()).collect();
    if out.shape != expected {
        bail!("node '{}': conv result {out}, expected shape {expected:?}", node.name);
    }
    let dw = Dw { rows, cols, c, mult: m / c, m, bias: inputs.len() > 2 };
    let planes = n * m;
    let parts = parts_for(out.size_bytes() + x.size_bytes(), planes);
    let func = build_kernel(target, name, |kb| dw.emit(kb, target, planes));
    Ok(Generated { func, scratch: 0, parts })
}

/// The geometry of one depthwise conv.
struct Dw {
    rows: Axis,
    cols: Axis,
    c: usize,
    /// Output channels per input channel.
    mult: usize,
    m: usize,
    bias: bool,
}

/// The per-plane values a row reads: the plane's input and output, its weights (and their
/// splats), its bias (and its splat).
struct Plane {
    x: Value,
    y: Value,
    w: Value,
    splats: Vec<Value>,
    bias: Value,
    bias_vec: Value,
}

impl Dw {
    fn emit(&self, kb: &mut KernelBuilder, target: &Target, planes: usize) {
        let (out, x, w) = (kb.buf(0), kb.buf(1), kb.buf(2));
        let b = self.bias.then(|| kb.buf(3));
        let (r, cl) = (self.rows, self.cols);
        let taps = r.taps * cl.taps;
        // Over a symbolic batch the call's images are the first planes.
        let planes = super::rows::outer(kb, planes).unwrap_or_else(|| kb.iconst(planes as i64));
        let (lo, hi) = kb.part_range(planes);
        kb.for_range(lo, hi, 1, |kb, plane| {
            // plane = image·M + m; input channel m / mult of the same image.
            let img = kb.b.ins().udiv_imm_u(plane, self.m as i64);
            let ch = kb.b.ins().urem_imm_u(plane, self.m as i64);
            let ci = kb.b.ins().udiv_imm_u(ch, self.mult as i64);
            let src = kb.b.ins().imul_imm_s(img, self.c as i64);
            let src = kb.b.ins().iadd(src, ci);
            let xp = kb.addr(x, src, (r.input * cl.input) as i64 * F32);
            let y = kb.addr(out, plane, (r.output * cl.output) as i64 * F32);
            let wp = kb.addr(w, ch, taps as i64 * F32);
            let splats = (0..taps)
                .map(|t| {
                    let s = kb.b.ins().load(types::F32, mem(), wp, (t as i64 * F32) as i32);
                    kb.b.ins().splat(F32X4, s)
                })
                .collect();
            let bias = match b {
                Some(b) => {
                    let at = kb.addr(b, ch, F32);
                    kb.b.ins().load(types::F32, mem(), at, 0)
                }
                None => kb.f32const(0.0),
            };
            let bias_vec = kb.b.ins().splat(F32X4, bias);
            let p = Plane { x: xp, y, w: wp, splats, bias, bias_vec };
            let (row_lo, row_hi) = r.interior();
            for oh in (0..row_lo).chain(row_hi..r.output) {
                let at = kb.iconst(oh as i64);
                self.row(kb, target, &p, at, &r.valid(oh));
            }
            let all: Vec<usize> = (0..r.taps).collect();
            kb.for_const(row_lo as i64, row_hi as i64, 1, |kb, oh| self.row(kb, target, &p, oh, &all));
        });
    }

    /// Output row `oh` of plane `p`, reading the kernel rows `khs` (those inside the input).
    fn row(&self, kb: &mut KernelBuilder, target: &Target, p: &Plane, oh: Value, khs: &[usize]) {
        let (r, cl) = (self.rows, self.cols);
        let x_row = kb.addr(p.x, oh, (r.stride * cl.input) as i64 * F32);
        let y_row = kb.addr(p.y, oh, cl.output as i64 * F32);
        // The byte offset, from the row's first input element, of kernel row kh, input column i.
        let offset = |kh: usize, i: i64| ((kh * r.dilation) as i64 - r.pad as i64) * cl.input as i64 * F32 + i * F32;
        let (lo, hi) = cl.interior();
        let vectors = (hi - lo) / LANES;
        kb.for_const(lo as i64, (lo + vectors * LANES) as i64, LANES as i64, |kb, ow| {
            let at = kb.addr(x_row, ow, (cl.stride as i64) * F32);
            let mut acc = p.bias_vec;
            for &kh in khs {
                for kw in 0..cl.taps {
                    let off = offset(kh, (kw * cl.dilation) as i64 - cl.pad as i64);
                    let v = self.load_strided(kb, at, off as i32);
                    acc = Math::new(&mut kb.b, F32X4, target).madd(v, p.splats[kh * cl.taps + kw], acc);
                }
            }
            let dst = kb.addr(y_row, ow, F32);
            kb.b.ins().store(mem(), acc, dst, 0);
        });
        // Columns outside the vectors: the borders and the interior's last few, unrolled.
        for ow in (0..lo).chain(lo + vectors * LANES..cl.output) {
            let mut acc = p.bias;
            for &kh in khs {
                for kw in cl.valid(ow) {
                    let i = cl.source(ow, kw).expect("a valid tap") as i64;
                    let v = kb.b.ins().load(types::F32, mem(), x_row, offset(kh, i) as i32);
                    let wt = kb.b.ins().load(types::F32, mem(), p.w, ((kh * cl.taps + kw) as i64 * F32) as i32);
                    acc = Math::new(&mut kb.b, types::F32, target).madd(v, wt, acc);
                }
            }
            kb.b.ins().store(mem(), acc, y_row, (ow as i64 * F32) as i32);
        }
    }

    /// Four input elements `stride` apart from `at + off`, as one vector; it reads none
    /// past the last.
    fn load_strided(&self, kb: &mut KernelBuilder, at: Value, off: i32) -> Value {
        let s = self.cols.stride;
        match s {
            1 => kb.b.ins().load(F32X4, mem(), at, off),
            2 => {
                // [a0 a1 a2 a3] and [a3 a4 a5 a6]: lanes 0 and 2 of the first, 1 and 3 of
                // the second (the second load starts at a3 so as not to read past a6).
                let lo = kb.b.ins().load(F32X4, mem(), at, off);
                let hi = kb.b.ins().load(F32X4, mem(), at, off + 3 * F32 as i32);
                let bytes = |lanes: [u8; 4]| lanes.iter().flat_map(|&l| (0..4).map(move |k| l * 4 + k)).collect();
                let mask: Vec<u8> = bytes([0, 2, 5, 7]);
                let mask = kb.b.func.dfg.immediates.push(ConstantData::from(mask));
                let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
                let (lo, hi) =
                    (kb.b.ins().bitcast(types::I8X16, flags, lo), kb.b.ins().bitcast(types::I8X16, flags, hi));
                let v = kb.b.ins().shuffle(lo, hi, mask);
                kb.b.ins().bitcast(F32X4, flags, v)
            }
            _ => {
                let mut v = kb.splat(0.0);
                for l in 0..LANES {
                    let e = kb.b.ins().load(types::F32, mem(), at, off + (l * s) as i32 * F32 as i32);
                    v = kb.b.ins().insertlane(v, e, l as u8);
                }
                v
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::movement::testing::{check, ints, node, random};
    use super::*;
    use meshc_ir::{Attr, Op};
    use proptest::prelude::*;

    /// A depthwise conv node over `x` ([N, C, spatial...]) by `w` ([C·mult, 1, taps...]),
    /// with or without a bias, and its operands.
    fn case(x: &[usize], w: &[usize], attrs: &[(&str, Attr)], bias: bool, seed: u64) -> (Node, Vec<meshc_ir::Tensor>) {
        let mut args = vec![random(DType::F32, x, -1.0, 1.0, seed), random(DType::F32, w, -1.0, 1.0, seed + 1)];
        if bias {
            args.push(random(DType::F32, &w[..1], -1.0, 1.0, seed + 2));
        }
        let mut attrs = attrs.to_vec();
        attrs.push(("groups", Attr::Int(x[1] as i64)));
        (node(Op::Conv, args.len(), &attrs), args)
    }

    /// MobileNet's shapes: 3×3 at stride 1 and 2 (also the SAME_UPPER padding TensorFlow
    /// writes, which pads the end more than the begin), a 5×5, and a 1-D conv.
    #[test]
    fn mobilenet_shapes_match_the_interpreter() {
        let pads = |p: [i64; 4]| ("pads", ints(&p));
        type Case<'a> = (Vec<usize>, Vec<usize>, Vec<(&'a str, Attr)>);
        let cases: Vec<Case> = vec![
            (vec![2, 24, 12, 12], vec![24, 1, 3, 3], vec![pads([1; 4])]),
            (vec![2, 32, 12, 12], vec![32, 1, 3, 3], vec![("strides", ints(&[2, 2])), pads([0, 0, 1, 1])]),
            (vec![1, 8, 17, 19], vec![8, 1, 5, 5], vec![("strides", ints(&[2, 2])), pads([2; 4])]),
            (vec![2, 6, 30], vec![12, 1, 3], vec![("pads", ints(&[1, 1])), ("dilations", ints(&[2]))]),
        ];
        for (i, (x, w, attrs)) in cases.iter().enumerate() {
            for bias in [false, true] {
                let (n, args) = case(x, w, attrs, bias, 10 * i as u64);
                check(depthwise, &n, &args);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random shapes, strides (1, 2 and 3: the three ways a vector is loaded),
        /// dilations, uneven pads and channel multipliers, 1-D and 2-D, against the
        /// interpreter, compiled for the host and for x86-64-v2 (no FMA).
        #[test]
        fn random_depthwise_convs_match_the_interpreter(
            two_d in any::<bool>(), n in 1usize..3, c in 1usize..5, mult in 1usize..3,
            size in (1usize..9, 1usize..15), taps in (1usize..4, 1usize..5), strides in (1i64..4, 1i64..4),
            dilations in (1i64..3, 1i64..3), pads in proptest::collection::vec(0i64..3, 4), bias in any::<bool>(),
            seed in 0u64..1000,
        ) {
            let (h, kh, sh, dh) = if two_d { (size.0, taps.0, strides.0, dilations.0) } else { (1, 1, 1, 1) };
            let spans = [(h, kh, dh, pads[0] + pads[2]), (size.1, taps.1, dilations.1, pads[1] + pads[3])];
            prop_assume!(spans.iter().all(|&(s, k, d, p)| s as i64 + p > (k as i64 - 1) * d));
            let (x, w, attrs) = if two_d {
                let attrs = vec![("strides", ints(&[sh, strides.1])), ("dilations", ints(&[dh, dilations.1])),
                                 ("pads", ints(&pads))];
                (vec![n, c, h, size.1], vec![c * mult, 1, kh, taps.1], attrs)
            } else {
                let attrs = vec![("strides", ints(&[strides.1])), ("dilations", ints(&[dilations.1])),
                                 ("pads", ints(&[pads[1], pads[3]]))];
                (vec![n, c, size.1], vec![c * mult, 1, taps.1], attrs)
            };
            let (node, args) = case(&x, &w, &attrs, bias, seed);
            check(depthwise, &node, &args);
        }
    }

    /// Split into parts, the planes are each written once, by one part, as the whole call
    /// writes them.
    #[test]
    fn parts_tile_the_planes() {
        let (n, args) = case(&[2, 5, 6, 9], &[5, 1, 3, 3], &[("pads", ints(&[1; 4]))], true, 3);
        let tys: Vec<TensorType> = args.iter().map(|a| a.ty()).collect();
        let out = super::super::movement::testing::out_type(&n, &args);
        let target = super::super::emit::testing::native();
        let g = depthwise(&target, "k", &n, &tys, &out).unwrap();
        let mut ins: Vec<Vec<u8>> = args.iter().map(|a| a.to_le_bytes()).collect();
        super::super::emit::testing::check_parts(&target, g.func, out.size_bytes(), &mut ins, "depthwise");
    }
}
