//! GridSample (docs/onnx.md): every output position reads X at coordinates the grid gives at
//! run time, so unlike Resize's nothing is a table: the coordinates, their taps and weights
//! are elementwise ops on the grid, and each tap is a gather from X viewed as
//! `[N·positions, C]` at the flat index of the tap in its batch. Out-of-range taps are
//! mapped as ONNX's reference maps them (clamped for `border`, reflected for
//! `reflection`) or read a zero pad placed around X (`zeros`), so no gather index is ever
//! out of range whatever the grid holds.

use meshc_ir::{Attr, Op};

use super::builder::Value;
use super::ops::{i64_table, one, reshape, Converter, R};
use super::ops_math::{float_only, Steps};

/// This module's converters (docs/onnx.md).
pub const CONVERTERS: &[Converter] =
    &[Converter::since(16, "GridSample", |b, c| one(grid_sample(&mut Steps { b, c })))];

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// Keys' cubic convolution with a = −0.75 (ONNX's reference and PyTorch's): the weights of
/// the taps at −1, 0, 1, 2 from the floor, for t the fraction past it.
const CUBIC_A: f64 = -0.75;

fn grid_sample(s: &mut Steps) -> R<Value> {
    let (x, grid) = (s.c.arg(0)?, s.c.arg(1)?);
    float_only(s.b, x, "GridSample")?;
    float_only(s.b, grid, "GridSample's grid")?;
    let (xs, gs) = (s.b.ty(x).shape, s.b.ty(grid).shape);
    let k = xs.len().saturating_sub(2);
    if k == 0 || gs.len() != k + 2 || gs[0] != xs[0] || gs[k + 1] != k {
        return Err(format!("X of shape {xs:?} and grid of shape {gs:?} are not [N, C, D1..Dk] and [N, O1..Ok, k]"));
    }
    // Opset 20 renamed bilinear and bicubic to linear and cubic, as it made them N-d.
    let renamed = s.c.opset >= 20;
    let mode = match (s.c.string("mode", if renamed { "linear" } else { "bilinear" }).as_str(), renamed) {
        ("nearest", _) => Mode::Nearest,
        ("linear", true) | ("bilinear", false) => Mode::Linear,
        ("cubic", true) | ("bicubic", false) => Mode::Cubic,
        (other, _) => return Err(format!("mode '{other}' is not supported at opset {}", s.c.opset)),
    };
    let padding = match s.c.string("padding_mode", "zeros").as_str() {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        other => return Err(format!("padding_mode '{other}' is not zeros, border or reflection")),
    };
    let align = s.c.int("align_corners", 0) != 0;
    let (n, ch, spatial) = (xs[0], xs[1], xs[2..].to_vec());
    if spatial.contains(&0) {
        return Err(format!("X of shape {xs:?} has no position to sample"));
    }
    let out_spatial = gs[1..=k].to_vec();
    let sampled: Vec<i64> = std::iter::once(n).chain(out_spatial.iter().copied()).map(|d| d as i64).collect();

    // X as [N·positions, C] (padded by one zero on every side of each spatial dim for
    // `zeros`: a tap off the input is clamped onto the pad).
    let pad = usize::from(padding == Padding::Zeros);
    let data = if pad == 1 {
        let mut pads = vec![0i64; 2 * xs.len()];
        for d in 0..k {
            pads[2 + d] = 1;
            pads[xs.len() + 2 + d] = 1;
        }
        s.op("padded", Op::Pad, &[x], &[("pads", Attr::ints(&pads))])?
    } else {
        x.clone()
    };
    let padded: Vec<usize> = spatial.iter().map(|&d| d + 2 * pad).collect();
    let positions: usize = padded.iter().product();
    let mut perm: Vec<i64> = vec![0];
    perm.extend(2..xs.len() as i64);
    perm.push(1);
    let last = s.op("channels_last", Op::Transpose, &[&data], &[("perm", Attr::ints(&perm))])?;
    let rows = reshape(s.b, &last, &[(n * positions) as i64, ch as i64], &s.c.part("rows"))?;

    // Per spatial dim d (grid component k − 1 − d: x is the last dim's), the taps' flat
    // offsets (index times the dim's stride in the padded X) and their weights.
    let mut taps = Vec::new();
    for d in 0..k {
        let comp = (k - 1 - d) as i64;
        let at = |what: &str| format!("d{d}_{what}");
        let g = s.op(
            &at("grid"),
            Op::Slice,
            &[grid],
            &[("starts", Attr::ints(&[comp])), ("ends", Attr::ints(&[comp + 1])), ("axes", Attr::ints(&[-1]))],
        )?;
        let g = reshape(s.b, &g, &sampled, &s.c.part(&at("coord")))?;
        let size = spatial[d] as f64;
        let stride: usize = padded[d + 1..].iter().product();
        let (lo, hi) = if align { (0.0, size - 1.0) } else { (-0.5, size - 0.5) };
        // The reference's denormalisation, in its order of f32 steps.
        let g1 = s.op0(&at("plus_one"), Op::Add, &[&g, &s.k(&g, 1.0)])?;
        let mut pos = if align {
            let h = s.op0(&at("half"), Op::Div, &[&g1, &s.k(&g, 2.0)])?;
            s.op0(&at("position"), Op::Mul, &[&h, &s.k(&g, size - 1.0)])?
        } else {
            let m = s.op0(&at("scaled"), Op::Mul, &[&g1, &s.k(&g, size)])?;
            let m1 = s.op0(&at("minus_one"), Op::Sub, &[&m, &s.k(&g, 1.0)])?;
            s.op0(&at("position"), Op::Div, &[&m1, &s.k(&g, 2.0)])?
        };
        if mode == Mode::Nearest {
            pos = s.op0(&at("nearest"), Op::Round, &[&pos])?;
        }
        pos = match padding {
            Padding::Zeros => pos,
            Padding::Border => {
                let out = outside(s, &pos, lo, hi, &at("outside"))?;
                let c = clamp(s, &pos, 0.0, size - 1.0, &at("clamped"))?;
                s.op0(&at("bordered"), Op::Where, &[&out, &c, &pos])?
            }
            Padding::Reflection => reflect(s, &pos, lo, hi, &at("reflected"))?,
        };
        let (offsets, weights): (Vec<f64>, Vec<Value>) = match mode {
            Mode::Nearest => (vec![0.0], vec![]),
            Mode::Linear | Mode::Cubic => {
                let base = s.op0(&at("floor"), Op::Floor, &[&pos])?;
                let t = s.op0(&at("fraction"), Op::Sub, &[&pos, &base])?;
                pos = base;
                if mode == Mode::Linear {
                    let w0 = s.op0(&at("w0"), Op::Sub, &[&s.k(&t, 1.0), &t])?;
                    (vec![0.0, 1.0], vec![w0, t])
                } else {
                    (vec![-1.0, 0.0, 1.0, 2.0], cubic_weights(s, &t, &at("w"))?)
                }
            }
        };
        // As `[N, O..., 1]`, to broadcast over the channels of the gathered taps.
        let mut per_channel = sampled.clone();
        per_channel.push(1);
        let weights = weights
            .iter()
            .enumerate()
            .map(|(j, w)| reshape(s.b, w, &per_channel, &s.c.part(&at(&format!("weight{j}")))))
            .collect::<R<Vec<_>>>()?;
        let mut dim_taps = Vec::new();
        for (j, off) in offsets.iter().enumerate() {
            let i = if *off == 0.0 {
                pos.clone()
            } else {
                s.op0(&at(&format!("tap{j}")), Op::Add, &[&pos, &s.k(&pos, *off)])?
            };
            let i = match padding {
                // Onto the pad: −1 and D of the unpadded dim, shifted by the pad.
                Padding::Zeros => {
                    let c = clamp(s, &i, -1.0, size, &at(&format!("tap{j}_clamped")))?;
                    s.op0(&at(&format!("tap{j}_padded")), Op::Add, &[&c, &s.k(&c, 1.0)])?
                }
                Padding::Border => clamp(s, &i, 0.0, size - 1.0, &at(&format!("tap{j}_clamped")))?,
                // The reference reflects a tap's index too; the clamp keeps a NaN grid's
                // taps (and any rounding) inside X.
                Padding::Reflection => {
                    let r = reflect(s, &i, lo, hi, &at(&format!("tap{j}_reflected")))?;
                    clamp(s, &r, 0.0, size - 1.0, &at(&format!("tap{j}_clamped")))?
                }
            };
            let idx = s.op(&at(&format!("tap{j}_index")), Op::Cast, &[&i], &[("to", Attr::Str("i64".into()))])?;
            let flat = s.op0(&at(&format!("tap{j}_offset")), Op::Mul, &[&idx, &s.k(&idx, stride as f64)])?;
            dim_taps.push((flat, weights.get(j).cloned()));
        }
        taps.push(dim_taps);
    }
    // Each batch's rows start at n·positions.
    let batch = i64_table("the batch offsets", vec![n], |i| (i * positions) as i64)?;
    let batch_shape: Vec<i64> = std::iter::once(n as i64).chain(out_spatial.iter().map(|_| 1)).collect();
    let batch = reshape(s.b, &batch, &batch_shape, &s.c.part("batch_offsets"))?;
    let y = interpolate(s, &rows, &taps, 0, &batch, "tap")?;
    // [N, O..., C] → [N, C, O...].
    let mut back: Vec<i64> = vec![0, k as i64 + 1];
    back.extend(1..=k as i64);
    s.op("", Op::Transpose, &[&y], &[("perm", Attr::ints(&back))])
}

/// The sum over dim `d`'s taps of their weight times the interpolation over the dims after
/// it, the last dim innermost as in the reference; a tap of every dim is a gather of `rows`
/// at the sum of the taps' offsets, `[N, O..., C]`.
fn interpolate(
    s: &mut Steps,
    rows: &Value,
    taps: &[Vec<(Value, Option<Value>)>],
    d: usize,
    offset: &Value,
    at: &str,
) -> R<Value> {
    if d == taps.len() {
        let v = s.op(at, Op::Gather, &[rows, offset], &[("axis", Attr::Int(0))])?;
        return Ok(v);
    }
    let mut sum: Option<Value> = None;
    for (j, (off, w)) in taps[d].iter().enumerate() {
        let name = format!("{at}{j}");
        let o = s.op0(&format!("{name}_at"), Op::Add, &[offset, off])?;
        let v = interpolate(s, rows, taps, d + 1, &o, &name)?;
        let v = match w {
            Some(w) => s.op0(&format!("{name}_weighted"), Op::Mul, &[&v, w])?,
            None => v,
        };
        sum = Some(match sum {
            Some(acc) => s.op0(&format!("{name}_sum"), Op::Add, &[&acc, &v])?,
            None => v,
        });
    }
    sum.ok_or_else(|| "a dim has no taps".into())
}

fn clamp(s: &mut Steps, v: &Value, lo: f64, hi: f64, at: &str) -> R<Value> {
    let m = s.op0(&format!("{at}_low"), Op::Maximum, &[v, &s.k(v, lo)])?;
    s.op0(at, Op::Minimum, &[&m, &s.k(v, hi)])
}

/// Whether `v` lies outside `[lo, hi]`.
fn outside(s: &mut Steps, v: &Value, lo: f64, hi: f64, at: &str) -> R<Value> {
    let below = s.op0(&format!("{at}_below"), Op::Less, &[v, &s.k(v, lo)])?;
    let above = s.op0(&format!("{at}_above"), Op::Greater, &[v, &s.k(v, hi)])?;
    s.op0(at, Op::Or, &[&below, &above])
}

/// The reference's reflection of `v` into `[lo, hi]`: by the nearer border, the distance
/// past it folded by the range `n` times, back from the nearer border when n is even, from
/// the farther one when odd. An empty range (one position, aligned corners) is its point.
fn reflect(s: &mut Steps, v: &Value, lo: f64, hi: f64, at: &str) -> R<Value> {
    let step = |what: &str| format!("{at}_{what}");
    let range = hi - lo;
    let below = s.op0(&step("below"), Op::Less, &[v, &s.k(v, lo)])?;
    let above = s.op0(&step("above"), Op::Greater, &[v, &s.k(v, hi)])?;
    let out = s.op0(&step("outside"), Op::Or, &[&below, &above])?;
    if range == 0.0 {
        return s.op0(at, Op::Where, &[&out, &s.k(v, lo), v]);
    }
    let past_lo = s.op0(&step("past_low"), Op::Sub, &[&s.k(v, lo), v])?;
    let past_hi = s.op0(&step("past_high"), Op::Sub, &[v, &s.k(v, hi)])?;
    let dx = s.op0(&step("past"), Op::Where, &[&below, &past_lo, &past_hi])?;
    let q = s.op0(&step("folds_exact"), Op::Div, &[&dx, &s.k(v, range)])?;
    let folds = s.op0(&step("folds"), Op::Floor, &[&q])?;
    let whole = s.op0(&step("whole"), Op::Mul, &[&folds, &s.k(v, range)])?;
    let r = s.op0(&step("rest"), Op::Sub, &[&dx, &whole])?;
    let half = s.op0(&step("half_folds"), Op::Mul, &[&folds, &s.k(v, 0.5)])?;
    let half_floor = s.op0(&step("half_folds_floor"), Op::Floor, &[&half])?;
    let even = s.op0(&step("even"), Op::Equal, &[&half, &half_floor])?;
    // Below: lo + r (even) or hi − r (odd); above: hi − r (even) or lo + r (odd).
    let from_lo = s.op0(&step("from_low"), Op::Add, &[&s.k(v, lo), &r])?;
    let from_hi = s.op0(&step("from_high"), Op::Sub, &[&s.k(v, hi), &r])?;
    let lo_side = s.op0(&step("low_side"), Op::Equal, &[&below, &even])?;
    let moved = s.op0(&step("moved"), Op::Where, &[&lo_side, &from_lo, &from_hi])?;
    s.op0(at, Op::Where, &[&out, &moved, v])
}

/// The four cubic weights of the taps at −1, 0, 1, 2 for fraction `t` (the reference's
/// formulas, of t + 1, t, 1 − t and 2 − t).
fn cubic_weights(s: &mut Steps, t: &Value, at: &str) -> R<Vec<Value>> {
    let a = CUBIC_A;
    let mut w = Vec::new();
    for (j, (shift, sign)) in [(1.0, 1.0), (0.0, 1.0), (1.0, -1.0), (2.0, -1.0)].into_iter().enumerate() {
        let name = |what: &str| format!("{at}{j}_{what}");
        // u = shift + sign·t: the tap's distance.
        let st = if sign > 0.0 { t.clone() } else { s.op0(&name("neg"), Op::Neg, &[t])? };
        let u = if shift == 0.0 { st } else { s.op0(&name("u"), Op::Add, &[&st, &s.k(t, shift)])? };
        let v = if j == 0 || j == 3 {
            // ((a·u − 5a)·u + 8a)·u − 4a
            let p = s.op0(&name("p0"), Op::Mul, &[&u, &s.k(t, a)])?;
            let p = s.op0(&name("p1"), Op::Sub, &[&p, &s.k(t, 5.0 * a)])?;
            let p = s.op0(&name("p2"), Op::Mul, &[&p, &u])?;
            let p = s.op0(&name("p3"), Op::Add, &[&p, &s.k(t, 8.0 * a)])?;
            let p = s.op0(&name("p4"), Op::Mul, &[&p, &u])?;
            s.op0(&format!("{at}{j}"), Op::Sub, &[&p, &s.k(t, 4.0 * a)])?
        } else {
            // ((a + 2)·u − (a + 3))·u·u + 1
            let p = s.op0(&name("p0"), Op::Mul, &[&u, &s.k(t, a + 2.0)])?;
            let p = s.op0(&name("p1"), Op::Sub, &[&p, &s.k(t, a + 3.0)])?;
            let p = s.op0(&name("p2"), Op::Mul, &[&p, &u])?;
            let p = s.op0(&name("p3"), Op::Mul, &[&p, &u])?;
            s.op0(&format!("{at}{j}"), Op::Add, &[&p, &s.k(t, 1.0)])?
        };
        w.push(v);
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use meshc_ir::Tensor;

    use crate::dispatch::tests::{attr_i, eval, f32s};
    use crate::proto::AttributeProto;

    fn attr_s(name: &str, v: &str) -> AttributeProto {
        AttributeProto { name: Some(name.into()), s: Some(v.as_bytes().to_vec()), ..Default::default() }
    }

    /// X = [[1, 2], [3, 4]] sampled at grid points `(x, y)`.
    fn sample(points: &[(f32, f32)], mode: &str, padding: &str, align: i64) -> Vec<f32> {
        let x = Tensor::f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let grid = Tensor::f32(vec![1, 1, points.len(), 2], points.iter().flat_map(|&(x, y)| [x, y]).collect());
        let attrs = vec![attr_s("mode", mode), attr_s("padding_mode", padding), attr_i("align_corners", align)];
        f32s(&eval("GridSample", 20, vec![x, grid], attrs).unwrap())
    }

    #[test]
    fn grid_sample_interpolates_and_pads_as_onnx_reference() {
        // The centre is the mean; (2, 0) lies past the right edge at x = 2.5.
        assert_eq!(sample(&[(0.0, 0.0), (2.0, 0.0)], "linear", "zeros", 0), vec![2.5, 0.0]);
        assert_eq!(sample(&[(2.0, 0.0)], "linear", "border", 0), vec![3.0]);
        // Reflected off x = 1.5 back to 0.5: the centre again.
        assert_eq!(sample(&[(2.0, 0.0)], "linear", "reflection", 0), vec![2.5]);
        assert_eq!(sample(&[(-1.0, -1.0), (1.0, 1.0)], "linear", "zeros", 1), vec![1.0, 4.0]);
        // x = 0.8 rounds to column 1, y = 0 is row 0.
        assert_eq!(sample(&[(0.6, -1.0)], "nearest", "zeros", 1), vec![2.0]);
        // Keys' weights sum to 1: with border padding a constant stays that constant.
        let x = Tensor::f32(vec![1, 1, 3, 3], vec![5.0; 9]);
        let grid = Tensor::f32(vec![1, 1, 3, 2], vec![0.3, -0.7, 1.9, 0.1, -2.2, 3.0]);
        let attrs = vec![attr_s("mode", "cubic"), attr_s("padding_mode", "border")];
        for v in f32s(&eval("GridSample", 20, vec![x, grid], attrs).unwrap()) {
            assert!((v - 5.0).abs() < 1e-5, "{v}");
        }
        let e = eval(
            "GridSample",
            16,
            vec![Tensor::f32(vec![1, 1, 1, 1], vec![0.0]), Tensor::f32(vec![1, 1, 1, 2], vec![0.0; 2])],
            vec![attr_s("mode", "linear")],
        );
        assert!(e.unwrap_err().contains("mode 'linear' is not supported at opset 16"));
    }
}
