//! Inline f32 math for kernels: exp, log, tanh, erf, erfc, sin, cos, sigmoid, both GELU forms,
//! pow, sqrt and rsqrt, emitted as straight-line Cranelift IR on `F32X4` (the vector loop) or `F32` (the
//! scalar tail) — the same code for both, no calls per element.
//!
//! Methods (coefficients are minimax fits made for these forms and ranges):
//! - `exp`: n = round(x·log2 e) by the 1.5·2^23 trick, r = x − n·ln2 in two parts (Cody–Waite),
//!   expm1(r) = r + r²·P4(r), and 2^n built from exponent bits in two halves so that
//!   subnormal results come out right. x is clamped to [−110.9, 150] first, so overflow gives
//!   inf and underflow 0; NaN passes through.
//! - `log`: x = 2^e·m with m in [√½, √2) (subnormals scaled by 2^23 first), f = m − 1,
//!   log1p(f) = f − f²/2 + f³·P8(f); log(0) = −inf, log(x<0) = NaN, log(inf) = inf.
//! - `tanh`: −expm1(−2|x|)/(expm1(−2|x|) + 2) with the sign of x; the expm1 form keeps small
//!   |x| accurate without a second polynomial.
//! - `erf`: x·P5(x²)/Q5(x²) with x clamped to ±3.92 (where erf is ±1 in f32): one rational
//!   over the whole range, no exponential and no branches; Q monic (its Horner chain starts
//!   with an addition), fitted by `tools/fit_erf.py`, whose table of lower degrees shows why
//!   not fewer terms: their f64 error alone would exceed the f32 evaluation's.
//! - `erfc`: t·exp(−x² + P9(t − 0.583)), t = 1/(1 + 0.45|x|), with x² carried exactly as a
//!   high and a low part (FMA, or Dekker's product without) so the exponential sees the
//!   error-free argument; 2 − that for x < 0. Not 1 − erf, which cancels: erfc keeps its
//!   relative accuracy down to the subnormal results (x ≈ 9.2 to 10.06).
//! - `sin`, `cos`: of |x| (sin takes x's sign back), k = round(|x|·2/π) by the magic number,
//!   r = |x| − k·π/2 with π/2 in four parts (Cody–Waite; the first three of 7 bits, so the
//!   products are exact for k < 2^17 without FMA too), then ±sin r or ±cos r by k mod 4,
//!   each a degree-7 or -8 polynomial on [−π/4, π/4]. Accurate to |x| ≈ 2e5 (rotary
//!   embeddings reach thousands of radians); beyond 2^22·π/2, where one ulp of x is more
//!   than 0.5, the reduction fails and r is clamped: finite results in [−1, 1], not sin x.
//!   ±inf and NaN give NaN.
//! - `sigmoid`: 1/(1 + exp(−x)).
//! - `gelu` (exact): x·Φ(x) with Φ = ½ + ½erf(x/√2) from the same rational (x clamped to
//!   ±5.6, where Φ is 0 or 1 in f32). Accurate relative to the result for x >= −1; below,
//!   Φ is a small difference of numbers near ½ and its error is absolute (a few roundings of
//!   ½, times |x|): 9e-7 at most, about a tenth of the project tolerance's absolute term
//!   (1e-5), and gelu(x) is −0 below −5.6 where the true value is above −6e-8. The former
//!   form, x·½erfc(−x/√2) through an exponential, kept relative accuracy down to the
//!   subnormals with 3.6 times the instructions (the fused gelu chain ran 3 times slower).
//! - `gelu` (tanh form): x/(1 + e^−y), y = 2√(2/π)(x + 0.044715x³), which is
//!   x·½(1 + tanh(y/2)) without its cancellation; e^−y by n = round(−y·log2 e) and a degree-5
//!   polynomial, with one Cody–Waite constant where FMA keeps n·ln2 unrounded (the argument's
//!   own rounding dominates). Where e^−y overflows (x < −10.02) the result is −0: the true
//!   values there are under 5e-38.
//! - `pow(a, b)` = exp(b·log|a|) with log|a| and the product carried as hi + lo pairs
//!   (Fast2Sum, and FMA or Dekker products), so b does not magnify log's final roundings;
//!   plus the C/numpy special cases: b = 0 or a = 1 gives 1; negative a gives NaN unless b
//!   is an integer (then odd powers keep a's sign); ±0, ±inf and b = ±inf as C `pow`.
//!   Differences from the interpreter's f64 `powf`: a few-ulp f32 result, so exact integer
//!   powers (2^10) may be off in the last bit; the rest of the special cases agree.
//! - `sqrt` is the native instruction; `rsqrt` = 1/sqrt (not the approximate instruction).
//!
//! Measured max relative error over normal results against the interpreter (f64, rounded to
//! f32, so 1.2e-7 means one ulp off the correctly rounded result), 1e5 points each, on the
//! FMA and non-FMA targets, vector and scalar forms alike (test `max_error_sweeps`, which
//! asserts these bounds with a little slack): exp, log, rsqrt 1.2e-7; sigmoid 1.6e-7;
//! tanh 2.0e-7; erf 3.0e-7 (the rational's f32 evaluation: a few roundings of values near
//! 1); erfc 4.7e-7 over [−5, 10.5] (test `erfc_error_sweep`); sin and cos 1.2e-7 over
//! [−10, 10], [−1e4, 1e4] and [−2.06e5, 2.06e5], below |result| = 1/16 as absolute error
//! (test `sin_cos_error_sweeps`: near a zero the reduction's error is absolute); pow 1.2e-7 for |b·ln a| up to 80 with moderate a and b, 3.4e-7 with |b| up to 120;
//! gelu 3.7e-7 for x >= −1 and at most 8.7e-7 absolute below (see
//! above); gelu's tanh form 2.8e-7 for x >= −1, then growing as 1.3e-7·|y| with
//! y = 2√(2/π)(x + 0.044715x³) (the rounding of that argument): 9e-7 at x = −3, 1.3e-5 at
//! x = −10 where results are 1e-38.
//!
//! Without the target's FMA, fused multiply-adds become a multiply and an add (Cranelift's
//! fallback for `fma` is a libcall, which a relocation-free kernel cannot make).

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;

use meshc_runtime::kernels::vmath::{erf_coefficients, ERF_CAP, EXP5, LN2_HI, LN2_LO, MAGIC, PHI_CAP};

use super::Target;

/// expm1(r) = r + r²·P(r) on |r| <= ln2/2 (P(0) = ½); relative error 1.4e-8.
const EXPM1: [f32; 5] = [0.5, 0.16666548, 0.041666854, 0.008366058, 0.0013898229];
/// log1p(f) = f − f²/2 + f³·P(f) on [√½ − 1, √2 − 1]; absolute error 1.7e-10 with these
/// f32 coefficients (fitted one at a time after rounding the previous ones), which pow
/// needs: b·log a magnifies it.
const LOG1P: [f32; 9] =
    [0.333333, -0.2500001, 0.20002905, -0.16668601, 0.1420611, -0.12387539, 0.11960279, -0.118062034, 0.0675385];
/// erfc(z) = t·exp(−z² + P(t − ERFC_C)), t = 1/(1 + ERFC_T·z), on [0, 11.1]; absolute
/// error of P (= relative error of erfc) 1.7e-8. Centring the variable in t's range keeps
/// the f32 evaluation well conditioned (1.1e-7 instead of 2.2e-7 in t itself).
const ERFC: [f32; 10] = [
    -0.6390098,
    1.4898688,
    0.27821994,
    -0.3774618,
    -0.20537138,
    0.2615767,
    0.1494555,
    -0.24389382,
    -0.08000161,
    0.17433211,
];
const ERFC_T: f32 = 0.45;
const ERFC_C: f32 = 0.5834028;
/// Beyond this erfc underflows to 0 in f32 (it is 1.4e-45 at 10.06).
const ERFC_MAX: f32 = 11.0;

/// π/2 as four f32 parts, the first three of 7 significant bits: k·part is exact for
/// k < 2^17, so x − k·π/2 loses nothing to the products for |x| below 2^17·π/2 ≈ 2.06e5,
/// FMA or not. The sum is π/2 to 6e-17.
const PIO2: [f32; 4] = [1.578125, -0.0073242188, -4.4703484e-6, 1.5893255e-8];
/// sin r = r + r³·P(r²) and cos r = 1 − r²/2 + r⁴·P(r²) on |r| <= π/4 (Cephes' sinf and
/// cosf fits): relative error 8e-9 and 2e-10 with these f32 coefficients.
const SIN: [f32; 3] = [-0.16666655, 0.008332161, -0.00019515296];
const COS: [f32; 3] = [0.041666646, -0.0013887316, 2.4433157e-5];

/// Emits f32 math on one lane type (`F32` or `F32X4`) into a function being built.
pub struct Math<'r, 'f> {
    pub b: &'r mut FunctionBuilder<'f>,
    ty: Type,
    fma: bool,
}

impl<'r, 'f> Math<'r, 'f> {
    /// `ty` is `F32` or `F32X4`.
    pub fn new(b: &'r mut FunctionBuilder<'f>, ty: Type, target: &Target) -> Self {
        debug_assert!(ty == types::F32 || ty == types::F32X4);
        Math { b, ty, fma: target.has("fma") }
    }

    pub fn ty(&self) -> Type {
        self.ty
    }

    /// The integer type with the same lanes (`I32` or `I32X4`); also the type of masks on
    /// vectors (scalar masks are `I8` 0/1, as `fcmp` makes them).
    pub fn int_ty(&self) -> Type {
        if self.ty.is_vector() {
            types::I32X4
        } else {
            types::I32
        }
    }

    /// `v` in every lane.
    pub fn c(&mut self, v: f32) -> Value {
        let s = self.b.ins().f32const(v);
        self.splat(s)
    }

    /// The integer `v` in every lane of `int_ty`.
    pub fn ci(&mut self, v: i32) -> Value {
        let s = self.b.ins().iconst(types::I32, i64::from(v as u32));
        self.splat(s)
    }

    fn splat(&mut self, s: Value) -> Value {
        if self.ty.is_vector() {
            let t = self.b.func.dfg.value_type(s).by(4).expect("32-bit lanes");
            self.b.ins().splat(t, s)
        } else {
            s
        }
    }

    fn bits(&mut self, x: Value) -> Value {
        let t = self.int_ty();
        self.b.ins().bitcast(t, MemFlagsData::new(), x)
    }

    fn float(&mut self, x: Value) -> Value {
        self.b.ins().bitcast(self.ty, MemFlagsData::new(), x)
    }

    /// a·b + c, fused when the target has FMA.
    pub fn madd(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.b.ins().fmul(a, b);
            self.b.ins().fadd(p, c)
        }
    }

    /// c[0] + c[1]·x + c[2]·x² + …: Horner's rule for short polynomials, Estrin's scheme
    /// (pairs c[i] + c[i+1]·x, then combined with x², x⁴, …) for longer ones. The
    /// kernels are bound by the latency of these chains — the out-of-order window holds
    /// only two or three loop iterations — so the shorter critical path pays for the few
    /// extra multiplies.
    fn poly(&mut self, x: Value, c: &[f32]) -> Value {
        if c.len() <= 4 {
            let (&last, rest) = c.split_last().expect("non-empty polynomial");
            let mut r = self.c(last);
            for &k in rest.iter().rev() {
                let k = self.c(k);
                r = self.madd(r, x, k);
            }
            return r;
        }
        let mut terms: Vec<Value> = c.iter().map(|&k| self.c(k)).collect();
        let mut power = x;
        loop {
            terms = terms.chunks(2).map(|p| if let [lo, hi] = *p { self.madd(hi, power, lo) } else { p[0] }).collect();
            if terms.len() == 1 {
                return terms[0];
            }
            power = self.b.ins().fmul(power, power);
        }
    }

    /// A lane mask: `I8` 0/1 on scalars, all-ones/zero `I32X4` lanes on vectors.
    pub fn cmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }

    /// `mask ? a : b` per lane, for values of any lane type with 32-bit lanes (or any
    /// scalar type).
    pub fn select(&mut self, mask: Value, a: Value, b: Value) -> Value {
        let t = self.b.func.dfg.value_type(a);
        if !t.is_vector() {
            return self.b.ins().select(mask, a, b);
        }
        let m = if self.b.func.dfg.value_type(mask) == t {
            mask
        } else {
            self.b.ins().bitcast(t, MemFlagsData::new(), mask)
        };
        self.b.ins().bitselect(m, a, b)
    }

    /// min(x, hi), keeping NaN (one `minps`: it returns its second operand on NaN).
    fn clamp_max(&mut self, x: Value, hi: f32) -> Value {
        let hi = self.c(hi);
        let over = self.cmp(FloatCC::LessThan, hi, x);
        self.select(over, hi, x)
    }

    /// max(x, lo), keeping NaN (one `maxps`).
    fn clamp_min(&mut self, x: Value, lo: f32) -> Value {
        let lo = self.c(lo);
        let under = self.cmp(FloatCC::LessThan, x, lo);
        self.select(under, lo, x)
    }

    /// |mag| with the sign bit of `sign`.
    fn copysign(&mut self, mag: Value, sign: Value) -> Value {
        let m = self.b.ins().fabs(mag);
        let sign_bit = self.c(-0.0);
        let s = self.b.ins().band(sign, sign_bit);
        self.b.ins().bor(m, s)
    }

    /// maximum and minimum as docs/ops.md defines them: `a >= b || isnan(a) ? a : b` (and
    /// `<=`), so NaN in either operand gives NaN.
    pub fn maximum(&mut self, a: Value, b: Value) -> Value {
        self.min_max(a, b, true)
    }

    pub fn minimum(&mut self, a: Value, b: Value) -> Value {
        self.min_max(a, b, false)
    }

    fn min_max(&mut self, a: Value, b: Value, max: bool) -> Value {
        // `b beats a ? b : a` lowers to one maxps/minps, which returns `a` when either is
        // NaN: right when `a` is NaN, and a NaN `b` (with `a` not NaN) is patched after.
        let beats = if max { self.cmp(FloatCC::LessThan, a, b) } else { self.cmp(FloatCC::LessThan, b, a) };
        let m = self.select(beats, b, a);
        let b_nan = self.cmp(FloatCC::Unordered, b, b);
        self.select(b_nan, b, m)
    }

    /// maximum(x, 0): one maxps (NaN and −0 pass through, as in the interpreter).
    pub fn relu(&mut self, x: Value) -> Value {
        self.clamp_min(x, 0.0)
    }

    pub fn sqrt(&mut self, x: Value) -> Value {
        self.b.ins().sqrt(x)
    }

    pub fn rsqrt(&mut self, x: Value) -> Value {
        let s = self.b.ins().sqrt(x);
        let one = self.c(1.0);
        self.b.ins().fdiv(one, s)
    }

    /// The shared core of exp and expm1: for the argument `hi + lo` (`lo` a small
    /// correction), returns (q, n) with e^(hi+lo) = 2^n·(1 + q), n an integer lane.
    /// Valid for hi + lo in about [−174, 176]; callers clamp.
    fn exp_core(&mut self, hi: Value, lo: Option<Value>) -> (Value, Value) {
        let x = match lo {
            Some(lo) => self.b.ins().fadd(hi, lo),
            None => hi,
        };
        let magic = self.c(MAGIC);
        let log2e = self.c(std::f32::consts::LOG2_E);
        let k = self.madd(x, log2e, magic);
        let kf = self.b.ins().fsub(k, magic);
        let nkf = self.b.ins().fneg(kf);
        let ln2_hi = self.c(LN2_HI);
        let mut r = self.madd(nkf, ln2_hi, hi);
        if let Some(lo) = lo {
            r = self.b.ins().fadd(r, lo);
        }
        let ln2_lo = self.c(LN2_LO);
        let r = self.madd(nkf, ln2_lo, r);
        let h = self.poly(r, &EXPM1);
        let r2 = self.b.ins().fmul(r, r);
        let q = self.madd(h, r2, r);
        // k's low mantissa bits hold n (offset by the magic number's bits).
        let kb = self.bits(k);
        let magic_bits = self.ci(MAGIC.to_bits() as i32);
        let n = self.b.ins().isub(kb, magic_bits);
        (q, n)
    }

    /// 2^n for integer lanes n in [−126, 127].
    fn pow2i(&mut self, n: Value) -> Value {
        let bias = self.ci(127);
        let e = self.b.ins().iadd(n, bias);
        let e = self.b.ins().ishl_imm_s(e, 23);
        self.float(e)
    }

    /// 2^n·(1 + q), with 2^n applied in two halves so n in [−252, 254] works: results
    /// round to subnormals or overflow to inf as they should.
    fn exp_finish(&mut self, q: Value, n: Value) -> Value {
        let n1 = self.b.ins().sshr_imm_s(n, 1);
        let n2 = self.b.ins().isub(n, n1);
        let s1 = self.pow2i(n1);
        let s2 = self.pow2i(n2);
        let m = self.madd(q, s1, s1);
        self.b.ins().fmul(m, s2)
    }

    pub fn exp(&mut self, x: Value) -> Value {
        self.exp_scaled(x, None)
    }

    /// e^(x + lo) (`lo` a small correction to x), clamped so that the result is inf above
    /// and exactly 0 far below, and n stays in `exp_finish`'s range.
    fn exp_scaled(&mut self, x: Value, lo: Option<Value>) -> Value {
        let x = self.clamp_max(x, 150.0);
        let x = self.clamp_min(x, -160.0 * std::f32::consts::LN_2);
        let (q, n) = self.exp_core(x, lo);
        self.exp_finish(q, n)
    }

    /// e^x − 1 for x in [−20, 0.35]: 2^n·q + (2^n − 1), exact-ish near 0.
    fn expm1_small(&mut self, x: Value) -> Value {
        let (q, n) = self.exp_core(x, None);
        let s = self.pow2i(n);
        let one = self.c(1.0);
        let sm1 = self.b.ins().fsub(s, one);
        self.madd(q, s, sm1)
    }

    pub fn log(&mut self, x: Value) -> Value {
        let (hi, _) = self.log_parts(x);
        self.log_specials(x, hi)
    }

    /// log(x) for positive finite x as hi + lo, lo being the rounding error of the last
    /// two additions (what pow needs to stay accurate when b·log a is large; unused
    /// otherwise, and then removed as dead code).
    fn log_parts(&mut self, x: Value) -> (Value, Value) {
        // Subnormals: scale into the normal range and take 23 off the exponent.
        let min_normal = self.c(f32::MIN_POSITIVE);
        let tiny = self.cmp(FloatCC::LessThan, x, min_normal);
        let two23 = self.c(8_388_608.0);
        let scaled = self.b.ins().fmul(x, two23);
        let xs = self.select(tiny, scaled, x);
        // Subtracting √½'s bits puts m in [√½, √2) and makes the exponent field e.
        let sqrt_half = self.ci(0x3f35_04f3);
        let xb = self.bits(xs);
        let ix = self.b.ins().isub(xb, sqrt_half);
        let e = self.b.ins().sshr_imm_s(ix, 23);
        let mant_mask = self.ci(0x007f_ffff);
        let mant = self.b.ins().band(ix, mant_mask);
        let mb = self.b.ins().iadd(mant, sqrt_half);
        let m = self.float(mb);
        let one = self.c(1.0);
        let f = self.b.ins().fsub(m, one);
        let ef = self.b.ins().fcvt_from_sint(self.ty, e);
        let (c23, c0) = (self.c(23.0), self.c(0.0));
        let adj = self.select(tiny, c23, c0);
        let ef = self.b.ins().fsub(ef, adj);

        // log = (e·ln2_hi + e·ln2_lo) + ((f − f²/2) + f³·P(f)), every addition with its
        // error recovered by Fast2Sum (|f| >= |f²/2|, |f − f²/2| >= |f³·P|, |e·ln2_hi| >=
        // |e·ln2_lo|, and e·ln2 is 0 or at least ln2 > |log1p f|); so is the error of f²,
        // the largest rounded term.
        let (z, ze) = self.two_prod(f, f);
        let mhalf = self.c(-0.5);
        let hz = self.b.ins().fmul(mhalf, z);
        let (s1, e1) = self.fast_two_sum(f, hz);
        let p = self.poly(f, &LOG1P);
        let pz = self.b.ins().fmul(p, z);
        let w = self.b.ins().fmul(pz, f);
        let (s2, e2) = self.fast_two_sum(s1, w);
        let (ln2_hi, ln2_lo) = (self.c(LN2_HI), self.c(LN2_LO));
        let a = self.b.ins().fmul(ef, ln2_hi);
        let l = self.b.ins().fmul(ef, ln2_lo);
        let (c, e3) = self.fast_two_sum(a, l);
        let (hi, e4) = self.fast_two_sum(c, s2);
        let lo = self.b.ins().fadd(e1, e2);
        let lo = self.b.ins().fadd(lo, e3);
        let lo = self.b.ins().fadd(lo, e4);
        (hi, self.madd(mhalf, ze, lo))
    }

    /// log's results for 0 (−inf), negatives (NaN), inf and NaN (themselves); `r` elsewhere.
    fn log_specials(&mut self, x: Value, r: Value) -> Value {
        let inf = self.c(f32::INFINITY);
        let finite = self.cmp(FloatCC::LessThan, x, inf);
        let r = self.select(finite, r, x);
        let zero = self.c(0.0);
        let neg = self.cmp(FloatCC::LessThan, x, zero);
        let nan = self.c(f32::NAN);
        let r = self.select(neg, nan, r);
        let is_zero = self.cmp(FloatCC::Equal, x, zero);
        let minf = self.c(f32::NEG_INFINITY);
        self.select(is_zero, minf, r)
    }

    /// (s, e) with s = fl(a + b) and s + e = a + b exactly, for |a| >= |b| (or a = 0).
    fn fast_two_sum(&mut self, a: Value, b: Value) -> (Value, Value) {
        let s = self.b.ins().fadd(a, b);
        let t = self.b.ins().fsub(s, a);
        let e = self.b.ins().fsub(b, t);
        (s, e)
    }

    pub fn tanh(&mut self, x: Value) -> Value {
        let a = self.b.ins().fabs(x);
        let m2 = self.c(-2.0);
        let y = self.b.ins().fmul(a, m2);
        // tanh is ±1 in f32 beyond |x| = 9.01.
        let y = self.clamp_min(y, -20.0);
        let e = self.expm1_small(y);
        let two = self.c(2.0);
        let d = self.b.ins().fadd(e, two);
        let ne = self.b.ins().fneg(e);
        let t = self.b.ins().fdiv(ne, d);
        self.copysign(t, x)
    }

    pub fn sigmoid(&mut self, x: Value) -> Value {
        let nx = self.b.ins().fneg(x);
        let e = self.exp(nx);
        let one = self.c(1.0);
        let d = self.b.ins().fadd(one, e);
        self.b.ins().fdiv(one, d)
    }

    /// (p, e) with p = fl(a·b) and p + e = a·b exactly (barring overflow and underflow):
    /// e from an FMA, or without one by Dekker's product of 12-bit halves.
    fn two_prod(&mut self, a: Value, b: Value) -> (Value, Value) {
        let p = self.b.ins().fmul(a, b);
        let np = self.b.ins().fneg(p);
        if self.fma {
            return (p, self.b.ins().fma(a, b, np));
        }
        let (ah, al) = self.split(a);
        let (bh, bl) = self.split(b);
        let hh = self.b.ins().fmul(ah, bh);
        let hl = self.b.ins().fmul(ah, bl);
        let lh = self.b.ins().fmul(al, bh);
        let ll = self.b.ins().fmul(al, bl);
        let e = self.b.ins().fadd(hh, np);
        let e = self.b.ins().fadd(e, hl);
        let e = self.b.ins().fadd(e, lh);
        (p, self.b.ins().fadd(e, ll))
    }

    /// x = hi + lo with hi the top 12 significant bits of x (so products of halves are
    /// exact).
    fn split(&mut self, x: Value) -> (Value, Value) {
        let xb = self.bits(x);
        let top = self.ci(!0xfff);
        let hb = self.b.ins().band(xb, top);
        let hi = self.float(hb);
        (hi, self.b.ins().fsub(x, hi))
    }

    /// c[0] + c[1]·x + …: Horner's rule, the fewest operations (and NaN-free when x is
    /// large: every step keeps the sign of the leading term). A monic polynomial starts with
    /// an addition, which leaves the multiply pipes that bound these kernels.
    fn horner(&mut self, x: Value, c: &[f32]) -> Value {
        let (&last, rest) = c.split_last().expect("non-empty polynomial");
        let (mut r, rest) = match rest.split_last() {
            Some((&next, rest)) if last == 1.0 => {
                let next = self.c(next);
                (self.b.ins().fadd(x, next), rest)
            }
            _ => (self.c(last), rest),
        };
        for &k in rest.iter().rev() {
            let k = self.c(k);
            r = self.madd(r, x, k);
        }
        r
    }

    /// s·erf(x/√d) for x clamped to ±cap, as xc·P(xc²)/Q(xc²) with ERF_P/ERF_Q rescaled
    /// (s, d = 1, 1 for erf; ½, 2 for Φ − ½). One formula over the whole range: no
    /// branches, no exponential; the clamp makes the result saturate exactly (see ERF_CAP).
    fn erf_rational(&mut self, x: Value, s: f64, d: f64, cap: f32) -> Value {
        let (p, q) = erf_coefficients(s, d);
        // The clamp stays a minps/maxps pair: an unsigned integer minimum of |x|'s bits
        // (pminud, the sign put back by logic ops) leaves the FMA pipes freer but was 2%
        // slower in L1 (as C intrinsics on Zen 5) and no faster in the streaming bench.
        let xc = self.clamp_max(x, cap);
        let xc = self.clamp_min(xc, -cap);
        let z = self.b.ins().fmul(xc, xc);
        let pz = self.horner(z, &p);
        let qz = self.horner(z, &q);
        let n = self.b.ins().fmul(xc, pz);
        self.b.ins().fdiv(n, qz)
    }

    pub fn erf(&mut self, x: Value) -> Value {
        self.erf_rational(x, 1.0, 1.0, ERF_CAP)
    }

    /// erfc(|x|) = t·e^(−x² + P(t − ERFC_C)), t = 1/(1 + ERFC_T·|x|), with x² carried as an
    /// exact hi + lo pair so that the exponential sees the error-free argument; 2 − that
    /// for x < 0 (in [1, 2]: no cancellation). Never 1 − erf(x), which is 0 in f32 from
    /// x ≈ 3.9 while erfc is still 1e-8; this keeps relative accuracy down to the subnormals.
    pub fn erfc(&mut self, x: Value) -> Value {
        let a = self.b.ins().fabs(x);
        let a = self.clamp_max(a, ERFC_MAX);
        let (kt, one) = (self.c(ERFC_T), self.c(1.0));
        let d = self.madd(a, kt, one);
        let t = self.b.ins().fdiv(one, d);
        let (hi, lo) = self.two_prod(a, a);
        let c = self.c(ERFC_C);
        let tc = self.b.ins().fsub(t, c);
        let p = self.poly(tc, &ERFC);
        let nhi = self.b.ins().fneg(hi);
        let corr = self.b.ins().fsub(p, lo);
        let (q, n) = self.exp_core(nhi, Some(corr));
        let e = self.exp_finish(q, n);
        let pos = self.b.ins().fmul(t, e);
        let two = self.c(2.0);
        let neg = self.b.ins().fsub(two, pos);
        let zero = self.c(0.0);
        let is_neg = self.cmp(FloatCC::LessThan, x, zero);
        self.select(is_neg, neg, pos)
    }

    pub fn sin(&mut self, x: Value) -> Value {
        let a = self.b.ins().fabs(x);
        let y = self.sin_quarters(a, 0);
        // sin is odd: x's sign (that of −0 too) goes onto sin|x|.
        let sign_bit = self.c(-0.0);
        let s = self.b.ins().band(x, sign_bit);
        self.b.ins().bxor(y, s)
    }

    /// sin(|x| + π/2), cos being even.
    pub fn cos(&mut self, x: Value) -> Value {
        let a = self.b.ins().fabs(x);
        self.sin_quarters(a, 1)
    }

    /// sin(a + quarters·π/2) for a >= 0: k = round(a·2/π) by the magic number, whose low
    /// bits are k, r = a − k·π/2 by Cody–Waite (`PIO2`), then ±sin r or ±cos r by the
    /// quadrant k + quarters. r is exact but for its last rounding for a < 2.06e5; past
    /// 2^22·π/2 the magic number no longer rounds a·2/π to an integer, and r is clamped so
    /// that the result stays in [−1, 1] (there is no accuracy to keep: the ulp of such an a
    /// is over 0.5). ±inf give inf − inf = NaN in the first reduction step.
    fn sin_quarters(&mut self, a: Value, quarters: i32) -> Value {
        let magic = self.c(MAGIC);
        let two_over_pi = self.c(std::f32::consts::FRAC_2_PI);
        let k = self.madd(a, two_over_pi, magic);
        let kf = self.b.ins().fsub(k, magic);
        let nkf = self.b.ins().fneg(kf);
        let mut r = a;
        for part in PIO2 {
            let part = self.c(part);
            r = self.madd(nkf, part, r);
        }
        // ±1, not ±π/4: without FMA a·2/π rounds before the magic number does, and k can be
        // one off near the middle of two quadrants (r just past π/4, where the polynomials
        // still hold).
        let r = self.clamp_max(r, 1.0);
        let r = self.clamp_min(r, -1.0);
        let z = self.b.ins().fmul(r, r);
        let ps = self.poly(z, &SIN);
        let rz = self.b.ins().fmul(r, z);
        let sin_r = self.madd(rz, ps, r);
        let pc = self.poly(z, &COS);
        let z2 = self.b.ins().fmul(z, z);
        let (minus_half, one) = (self.c(-0.5), self.c(1.0));
        let c = self.madd(z, minus_half, one);
        let cos_r = self.madd(z2, pc, c);
        // sin(r + n·π/2) is sin r, cos r, −sin r, −cos r for n mod 4 = 0, 1, 2, 3.
        let kb = self.bits(k);
        let base = self.ci(MAGIC.to_bits() as i32 - quarters);
        let n = self.b.ins().isub(kb, base);
        let (one_i, zero_i) = (self.ci(1), self.ci(0));
        let low = self.b.ins().band(n, one_i);
        let odd = self.b.ins().icmp(IntCC::NotEqual, low, zero_i);
        let y = self.select(odd, cos_r, sin_r);
        let two_i = self.ci(2);
        let half_turn = self.b.ins().band(n, two_i);
        let sign = self.b.ins().ishl_imm_s(half_turn, 30);
        let sign = self.float(sign);
        self.b.ins().bxor(y, sign)
    }

    /// x·Φ(x) with Φ = ½ + ½erf(x/√2) from the rational erf: 17 vector operations (9 of
    /// them multiply-adds) instead of an erfc with its exponential and division. The price is
    /// in the negative tail, where Φ is a difference of nearly equal numbers: the error there
    /// is absolute, a few f32 roundings of ½ times |x| (at most 9e-7, near x = −5.4), and
    /// results below −PHI_CAP are −0 (the true values are above −6e-8 there).
    pub fn gelu_erf(&mut self, x: Value) -> Value {
        let e = self.erf_rational(x, 0.5, 2.0, PHI_CAP);
        let half = self.c(0.5);
        let phi = self.b.ins().fadd(e, half);
        self.b.ins().fmul(x, phi)
    }

    /// x·½(1 + tanh(y/2)) = x·σ(y) = x/(1 + e^−y), y = 2√(2/π)(x + 0.044715x³), with a
    /// short exponential: the argument's own rounding (~1e-7·|y|) dwarfs a second
    /// Cody–Waite constant and a sixth polynomial term, so neither is spent.
    pub fn gelu_tanh(&mut self, x: Value) -> Value {
        // −y = x·(−c − c·0.044715·x²): three roundings, the fewest this form allows.
        let c = 2.0 * std::f64::consts::FRAC_2_PI.sqrt();
        let x2 = self.b.ins().fmul(x, x);
        let (k3, k1) = (self.c(-(c * 0.044715) as f32), self.c(-c as f32));
        let p = self.madd(x2, k3, k1);
        let ny = self.b.ins().fmul(x, p);
        // e^−y for −y in [−87, 88.5]: n = round(−y·log2 e) stays in [−126, 128], where
        // 2^n's bits below are a normal float or (n = 128) exactly inf, so x/(1 + e^−y) is
        // ±0 far below (NaN for x = −inf, as in the interpreter) and x far above.
        let ny = self.clamp_max(ny, 88.5);
        let ny = self.clamp_min(ny, -87.0);
        // Adding the magic number rounds to an integer n in its low mantissa bits; with the
        // exponent bias folded in, shifting those bits up gives 2^n's bit pattern (the
        // magic number's own bits shift out).
        let magic = self.c(MAGIC + 127.0);
        let log2e = self.c(std::f32::consts::LOG2_E);
        let k = self.madd(ny, log2e, magic);
        let kf = self.b.ins().fsub(k, magic);
        let nkf = self.b.ins().fneg(kf);
        // With FMA, n·ln2 is not rounded before the subtraction and one constant suffices;
        // without, the product's rounding (3.8e-6 at n = 128) needs Cody–Waite's exact part.
        let r = if self.fma {
            let ln2 = self.c(std::f32::consts::LN_2);
            self.madd(nkf, ln2, ny)
        } else {
            let (ln2_hi, ln2_lo) = (self.c(LN2_HI), self.c(LN2_LO));
            let r = self.madd(nkf, ln2_hi, ny);
            self.madd(nkf, ln2_lo, r)
        };
        let er = self.horner(r, &EXP5);
        let kb = self.bits(k);
        let sb = self.b.ins().ishl_imm_s(kb, 23);
        let scale = self.float(sb);
        let e = self.b.ins().fmul(er, scale);
        let one = self.c(1.0);
        let d = self.b.ins().fadd(one, e);
        self.b.ins().fdiv(x, d)
    }

    pub fn pow(&mut self, a: Value, b: Value) -> Value {
        // b·log|a| as t + t_lo, so the exponential's argument carries no rounding error
        // that b would magnify.
        let aa = self.b.ins().fabs(a);
        let (lh, ll) = self.log_parts(aa);
        let la = self.log_specials(aa, lh);
        let (t, pe) = self.two_prod(b, la);
        let bl = self.b.ins().fmul(b, ll);
        let t_lo = self.b.ins().fadd(pe, bl);
        // The correction only means something where exp does not saturate (and t is not
        // NaN or inf).
        let at = self.b.ins().fabs(t);
        let limit = self.c(150.0);
        let in_range = self.cmp(FloatCC::LessThan, at, limit);
        let zero = self.c(0.0);
        let t_lo = self.select(in_range, t_lo, zero);
        // |a| = 1: exactly 1 even for b = ±inf (C pow); a = −1 with a NaN b is patched below.
        let unit = self.cmp(FloatCC::Equal, la, zero);
        let t = self.select(unit, zero, t);
        let r = self.exp_scaled(t, Some(t_lo));

        // Is b an integer, and odd? Exact through i32 when |b| < 2^31; beyond 2^24 every
        // float (and ±inf, as C pow treats it) is an even integer.
        let it = self.int_ty();
        let bi = self.b.ins().fcvt_to_sint_sat(it, b);
        let bf = self.b.ins().fcvt_from_sint(self.ty, bi);
        let exact = self.cmp(FloatCC::Equal, bf, b);
        let ab = self.b.ins().fabs(b);
        let two24 = self.c(16_777_216.0);
        let huge = self.cmp(FloatCC::GreaterThanOrEqual, ab, two24);
        let is_int = self.b.ins().bor(exact, huge);
        let one_i = self.ci(1);
        let low = self.b.ins().band(bi, one_i);
        let zero_i = self.ci(0);
        let odd_bit = self.b.ins().icmp(IntCC::NotEqual, low, zero_i);
        let odd = self.b.ins().band(exact, odd_bit);
        // Odd powers keep a's sign (also for −0 and −inf).
        let sign = self.c(-0.0);
        let a_sign = self.b.ins().band(a, sign);
        let signed = self.b.ins().bor(r, a_sign);
        let r_int = self.select(odd, signed, r);
        // A finite negative base with a non-integer exponent has no real power.
        let ninf = self.c(f32::NEG_INFINITY);
        let neg = self.cmp(FloatCC::LessThan, a, zero);
        let finite = self.cmp(FloatCC::GreaterThan, a, ninf);
        let neg_finite = self.b.ins().band(neg, finite);
        let nan = self.c(f32::NAN);
        let r_frac = self.select(neg_finite, nan, r);
        let r = self.select(is_int, r_int, r_frac);

        let one = self.c(1.0);
        let b_zero = self.cmp(FloatCC::Equal, b, zero);
        let a_one = self.cmp(FloatCC::Equal, a, one);
        let trivial = self.b.ins().bor(b_zero, a_one);
        self.select(trivial, one, r)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codegen::emit::testing::{bytes_f32, f32_bytes, run};
    use crate::codegen::emit::{build_kernel, mem, LANES};
    use crate::codegen::host_features;
    use meshc_ir::interp::eval_node;
    use meshc_ir::{Attr, DType, Node, Op, Tensor, TensorType};

    /// The targets whose code this host can run: native (FMA here) and x86-64-v2 (no FMA).
    pub(crate) fn runnable_targets() -> Vec<Target> {
        let host = host_features();
        ["native", "x86-64-v2"]
            .iter()
            .map(|n| Target::by_name(n).expect("known target"))
            .filter(|t| t.features.iter().all(|f| host.contains(f)))
            .collect()
    }

    /// A deterministic generator (splitmix64), so failures reproduce.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        pub fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
            (lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64) as f32
        }
    }

    /// Runs `f` over `args` (same lengths) with the vector loop (length a multiple of 4) or
    /// the scalar form on every element.
    fn apply(t: &Target, vector: bool, args: &[&[f32]], f: &dyn Fn(&mut Math, &[Value]) -> Value) -> Vec<f32> {
        let n = args[0].len();
        let step = if vector { LANES } else { 1 };
        assert_eq!(n % step, 0);
        let func = build_kernel(t, "math", |k| {
            let out = k.buf(0);
            let ins: Vec<Value> = (0..args.len()).map(|i| k.buf(i + 1)).collect();
            k.for_const(0, n as i64, step as i64, |k, i| {
                let ty = if vector { types::F32X4 } else { types::F32 };
                let vals: Vec<Value> = ins
                    .iter()
                    .map(|&p| {
                        let a = k.addr(p, i, 4);
                        k.b.ins().load(ty, mem(), a, 0)
                    })
                    .collect();
                let dst = k.addr(out, i, 4);
                let mut m = Math::new(&mut k.b, ty, t);
                let r = f(&mut m, &vals);
                m.b.ins().store(mem(), r, dst, 0);
            });
        });
        let mut out = vec![0u8; n * 4];
        let mut bufs: Vec<Vec<u8>> = args.iter().map(|a| f32_bytes(a)).collect();
        let mut all: Vec<&mut [u8]> = vec![&mut out];
        all.extend(bufs.iter_mut().map(|b| b.as_mut_slice()));
        assert_eq!(run(t, func, &mut all), 0);
        bytes_f32(&out)
    }

    /// The interpreter's result of `op` (with `attrs`) on f32 vectors.
    fn oracle(op: Op, attrs: &[(&str, &str)], args: &[&[f32]]) -> Vec<f32> {
        let mut node = Node::new("n", op, &[]);
        for (k, v) in attrs {
            node = node.with_attr(k, Attr::Str(v.to_string()));
        }
        let ts: Vec<Tensor> = args.iter().map(|a| Tensor::f32(vec![a.len()], a.to_vec())).collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let ty = TensorType::new(DType::F32, vec![args[0].len()]);
        eval_node(&node, &refs, &ty).expect("oracle").as_f32().expect("f32").to_vec()
    }

    /// Max error relative to max(|result|, `floor`) over normal results (subnormal results
    /// only need to be tiny), with the worst argument for the message.
    fn max_rel_err(got: &[f32], want: &[f32], floor: f64) -> (f64, usize) {
        let mut worst = (0.0, 0);
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let e = if g == w || (g.is_nan() && w.is_nan()) {
                0.0
            } else if w.abs() < f32::MIN_POSITIVE {
                assert!(g.abs() <= f32::MIN_POSITIVE, "element {i}: got {g}, want subnormal {w}");
                0.0
            } else {
                ((g as f64 - w as f64) / (w as f64).abs().max(floor)).abs()
            };
            if e > worst.0 || e.is_nan() {
                worst = (e, i);
            }
        }
        worst
    }

    /// erfc(z) for z >= 3.5 in f64 by its continued fraction: the interpreter's
    /// ½(1 + erf(x/√2)) loses relative accuracy in f64 below x ≈ −5 (and is 0 below −8), so
    /// gelu's tails need this.
    fn erfc_cf(z: f64) -> f64 {
        let mut t = z;
        for n in (1..=200).rev() {
            t = z + (n as f64 / 2.0) / t;
        }
        (-z * z).exp() / std::f64::consts::PI.sqrt() / t
    }

    fn gelu_reference(x: &[&[f32]]) -> Vec<f32> {
        let want = oracle(Op::Gelu, &[], x);
        let tail = |x: f64| x * 0.5 * erfc_cf(-x / std::f64::consts::SQRT_2);
        x[0].iter().zip(want).map(|(&x, w)| if x < -5.0 { tail(x as f64) as f32 } else { w }).collect()
    }

    /// The interpreter's x·½(1 + tanh u) as x·σ(2u), the same function without the
    /// cancellation that makes f64 lose the tail.
    fn gelu_tanh_reference(x: &[&[f32]]) -> Vec<f32> {
        let f = |x: f64| {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            x / (1.0 + (-2.0 * u).exp())
        };
        x[0].iter().map(|&x| f(x as f64) as f32).collect()
    }

    /// One accuracy sweep: how to draw a point's arguments, the code under test, the
    /// reference, and the max relative error claimed.
    struct Sweep {
        name: &'static str,
        point: fn(&mut Rng) -> Vec<f32>,
        emit: fn(&mut Math, &[Value]) -> Value,
        reference: fn(&[&[f32]]) -> Vec<f32>,
        bound: f64,
    }

    /// 2^u for u uniform: log-uniform over the positive floats.
    fn log_uniform(r: &mut Rng) -> f32 {
        (r.uniform(-149.0, 128.0) as f64).exp2() as f32
    }

    /// Each function over 1e5 points on every runnable target, vector and scalar forms:
    /// the max relative error over normal results stays within the bound claimed here.
    #[test]
    fn max_error_sweeps() {
        let sweeps = [
            Sweep {
                name: "exp",
                point: |r| vec![r.uniform(-104.0, 89.0)],
                emit: |m, x| m.exp(x[0]),
                reference: |x| oracle(Op::Exp, &[], x),
                bound: 2.0e-7,
            },
            Sweep {
                name: "log",
                point: |r| vec![log_uniform(r)],
                emit: |m, x| m.log(x[0]),
                reference: |x| oracle(Op::Log, &[], x),
                bound: 1.3e-7,
            },
            Sweep {
                name: "tanh",
                point: |r| vec![r.uniform(-10.0, 10.0)],
                emit: |m, x| m.tanh(x[0]),
                reference: |x| oracle(Op::Tanh, &[], x),
                bound: 2.5e-7,
            },
            // The rational's f32 evaluation (a few roundings of values near 1) costs 1 ulp
            // more than the former erfc-based form (1.7e-7): still 300× inside the project's
            // relative tolerance (1e-4).
            Sweep {
                name: "erf",
                point: |r| vec![r.uniform(-5.0, 5.0)],
                emit: |m, x| m.erf(x[0]),
                reference: |x| oracle(Op::Erf, &[], x),
                bound: 3.5e-7,
            },
            Sweep {
                name: "sigmoid",
                point: |r| vec![r.uniform(-90.0, 90.0)],
                emit: |m, x| m.sigmoid(x[0]),
                reference: |x| oracle(Op::Sigmoid, &[], x),
                bound: 2.5e-7,
            },
            // Relative accuracy for x >= −1 only: below, the error is absolute (test
            // `gelu_negative_tail_error_is_absolute`).
            Sweep {
                name: "gelu",
                point: |r| vec![r.uniform(-1.0, 10.0)],
                emit: |m, x| m.gelu_erf(x[0]),
                reference: gelu_reference,
                bound: 4.5e-7,
            },
            Sweep {
                name: "gelu_tanh",
                point: |r| vec![r.uniform(-1.0, 10.0)],
                emit: |m, x| m.gelu_tanh(x[0]),
                reference: gelu_tanh_reference,
                bound: 3.0e-7,
            },
            // The f32 rounding of the argument y = 2√(2/π)(x + 0.044715x³) shows in the
            // negative tail as ~1.3e-7·|y| relative, down to x = −10 (y ≈ −87); below, e^−y
            // overflows and results under 5e-38 come out as −0 (`rational_caps_saturate_exactly`).
            Sweep {
                name: "gelu_tanh<-1",
                point: |r| vec![r.uniform(-10.0, -1.0)],
                emit: |m, x| m.gelu_tanh(x[0]),
                reference: gelu_tanh_reference,
                bound: 1.5e-5,
            },
            Sweep {
                name: "rsqrt",
                point: |r| vec![log_uniform(r)],
                emit: |m, x| m.rsqrt(x[0]),
                reference: |x| oracle(Op::Rsqrt, &[], x),
                bound: 1.3e-7,
            },
            // a log-uniform in [1e-3, 1e3], b in [-12, 12], so |b·ln a| reaches 83.
            Sweep {
                name: "pow",
                point: |r| {
                    vec![(r.uniform(-3.0, 3.0) as f64 * std::f64::consts::LN_10).exp() as f32, r.uniform(-12.0, 12.0)]
                },
                emit: |m, x| m.pow(x[0], x[1]),
                reference: |x| oracle(Op::Pow, &[], x),
                bound: 2.5e-7,
            },
            // a anywhere in the positive floats (subnormals too), b so that a^b stays within
            // about 2^±120: large |b| magnifies log's remaining error (~3e-9 absolute).
            Sweep {
                name: "pow wide",
                point: |r| {
                    let u = r.uniform(-148.0, 127.0) as f64;
                    vec![u.exp2() as f32, (r.uniform(-120.0, 120.0) as f64 / u.abs().max(1.0)) as f32]
                },
                emit: |m, x| m.pow(x[0], x[1]),
                reference: |x| oracle(Op::Pow, &[], x),
                bound: 5.0e-7,
            },
        ];
        run_sweeps(&sweeps, 7, 0.0);
    }

    /// erfc where 1 − erf(x) would cancel (x > 0.5) and on into the subnormal results
    /// (x > 9.2), and over [−5, 0] where it is 2 − erfc(|x|). Its own test and points, so
    /// that adding it left the other sweeps' points as they were.
    #[test]
    fn erfc_error_sweep() {
        let sweep = Sweep {
            name: "erfc",
            point: |r| vec![r.uniform(-5.0, 10.5)],
            emit: |m, x| m.erfc(x[0]),
            reference: |x| oracle(Op::Erfc, &[], x),
            bound: 5.0e-7,
        };
        run_sweeps(&[sweep], 11, 0.0);
    }

    /// sin and cos for small arguments, for the thousands of radians of rotary position
    /// embeddings (position × inverse frequency), and up to where the reduction's products
    /// stay exact (2^17·π/2 ≈ 2.06e5). Relative error where |result| >= 1/16, absolute
    /// below: near a zero of sin or cos the result is ±r, r = x − k·π/2, whose error grows
    /// with k whatever r is — π/2's parts sum to it within 6e-17, and without FMA k·PIO2[3]
    /// rounds (1.2e-10 at k = 2^17) — so it only shows as relative error close to a zero
    /// (to 1e4 it stays at 1 ulp; cos(−143434.13) = −1.1e-5 is off by 4.8e-7 of itself).
    #[test]
    fn sin_cos_error_sweeps() {
        let sweeps = [
            Sweep {
                name: "sin",
                point: |r| vec![r.uniform(-10.0, 10.0)],
                emit: |m, x| m.sin(x[0]),
                reference: |x| oracle(Op::Sin, &[], x),
                bound: 2.5e-7,
            },
            Sweep {
                name: "cos",
                point: |r| vec![r.uniform(-10.0, 10.0)],
                emit: |m, x| m.cos(x[0]),
                reference: |x| oracle(Op::Cos, &[], x),
                bound: 2.5e-7,
            },
            Sweep {
                name: "sin 1e4",
                point: |r| vec![r.uniform(-1e4, 1e4)],
                emit: |m, x| m.sin(x[0]),
                reference: |x| oracle(Op::Sin, &[], x),
                bound: 2.5e-7,
            },
            Sweep {
                name: "cos 1e4",
                point: |r| vec![r.uniform(-1e4, 1e4)],
                emit: |m, x| m.cos(x[0]),
                reference: |x| oracle(Op::Cos, &[], x),
                bound: 2.5e-7,
            },
            Sweep {
                name: "sin 2e5",
                point: |r| vec![r.uniform(-2.06e5, 2.06e5)],
                emit: |m, x| m.sin(x[0]),
                reference: |x| oracle(Op::Sin, &[], x),
                bound: 2.5e-7,
            },
            Sweep {
                name: "cos 2e5",
                point: |r| vec![r.uniform(-2.06e5, 2.06e5)],
                emit: |m, x| m.cos(x[0]),
                reference: |x| oracle(Op::Cos, &[], x),
                bound: 2.5e-7,
            },
        ];
        run_sweeps(&sweeps, 13, 1.0 / 16.0);
    }

    /// `floor`: the error is relative to max(|result|, floor), absolute below it.
    fn run_sweeps(sweeps: &[Sweep], seed: u64, floor: f64) {
        const N: usize = 100_000;
        let mut rng = Rng(seed);
        for t in runnable_targets() {
            for s in sweeps {
                let points: Vec<Vec<f32>> = (0..N).map(|_| (s.point)(&mut rng)).collect();
                let args: Vec<Vec<f32>> = (0..points[0].len()).map(|j| points.iter().map(|p| p[j]).collect()).collect();
                let args: Vec<&[f32]> = args.iter().map(|a| a.as_slice()).collect();
                let want = (s.reference)(&args);
                for vector in [true, false] {
                    let got = apply(&t, vector, &args, &s.emit);
                    let (e, i) = max_rel_err(&got, &want, floor);
                    let form = if vector { "f32x4" } else { "f32" };
                    eprintln!("{:12} {:9} {form:5}: max rel err {e:.2e} at {:?}", s.name, t.name, points[i]);
                    assert!(
                        e <= s.bound,
                        "{} on {} {form}: {e:e} > {:e} at {:?}: got {}, want {}",
                        s.name,
                        t.name,
                        s.bound,
                        points[i],
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }

    /// GELU (exact) below x = −1: Φ = ½ + ½erf(x/√2) is a difference of numbers near ½, so
    /// its error is absolute, a few roundings of ½; times |x| that stays under 1e-6 (9% of
    /// the project tolerance's absolute term, 1e-5, at worst near x = −5.4; 2% at x = −3),
    /// and results are exactly −0 past the clamp. Dense over [−14, −1], tails included.
    #[test]
    fn gelu_negative_tail_error_is_absolute() {
        const N: usize = 100_000;
        let x: Vec<f32> = (0..N).map(|i| -1.0 - 13.0 * i as f32 / N as f32).collect();
        let want = gelu_reference(&[&x]);
        for t in runnable_targets() {
            for vector in [true, false] {
                let got = apply(&t, vector, &[&x], &|m, v| m.gelu_erf(v[0]));
                let (mut worst, mut at) = (0.0f64, 0);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let e = (g as f64 - w as f64).abs();
                    assert!(e.is_finite(), "x = {}: got {g}, want {w}", x[i]);
                    if e > worst {
                        (worst, at) = (e, i);
                    }
                    if x[i] <= -PHI_CAP {
                        assert!(g == 0.0 && g.is_sign_negative(), "x = {}: got {g}, want -0", x[i]);
                    }
                }
                eprintln!("gelu x<-1 {:9} vector={vector}: max abs err {worst:.2e} at {}", t.name, x[at]);
                assert!(worst <= 1.0e-6, "{} vector={vector}: {worst:e} at x = {}", t.name, x[at]);
            }
        }
    }

    /// The rational forms saturate exactly past their caps (the caps were found for both
    /// evaluation orders, with and without FMA), and the special values come out as the
    /// interpreter's: ±0 keep their sign, ±inf saturate (gelu(−inf) = −inf·0 = NaN), NaN
    /// stays NaN. The tanh form's shortened exponential too: overflow to ±0, no NaN.
    #[test]
    fn rational_caps_saturate_exactly() {
        let inf = f32::INFINITY;
        let x = [
            0.0,
            -0.0,
            ERF_CAP,
            -ERF_CAP,
            PHI_CAP,
            -PHI_CAP,
            4.5,
            -4.5,
            7.0,
            -7.0,
            13.0,
            -13.0,
            1e30,
            -1e30,
            f32::MAX,
            -f32::MAX,
            inf,
            -inf,
            f32::NAN,
            1e-40,
            -1e-40,
            1e-30,
            -1e-30,
        ];
        let erf = [0.0, -0.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0];
        // From f64 formulas; exact zeros where the f32 result is (the exact form's −0 past its
        // cap stands for −6e-8 and smaller).
        let gelu =
            [0.0, -0.0, 3.91983, -1.73553e-4, PHI_CAP, -0.0, 4.49998, -1.52895e-5, 7.0, -0.0, 13.0, -0.0, 1e30, -0.0];
        let gelu_tanh = [
            0.0,
            -0.0,
            3.9199,
            -1.02309e-4,
            PHI_CAP,
            -2.66085e-9,
            4.49999,
            -5.13674e-6,
            7.0,
            -2.31544e-15,
            13.0,
            -0.0,
            1e30,
            -0.0,
        ];
        let same = |g: f32, w: f32| g == w && g.is_sign_negative() == w.is_sign_negative();
        for t in runnable_targets() {
            for vector in [true, false] {
                let mut x = x.to_vec();
                x.resize(x.len().next_multiple_of(LANES), 1.0);
                let e = apply(&t, vector, &[&x], &|m, v| m.erf(v[0]));
                let g = apply(&t, vector, &[&x], &|m, v| m.gelu_erf(v[0]));
                let gt = apply(&t, vector, &[&x], &|m, v| m.gelu_tanh(v[0]));
                let at = |i: usize| format!("{} vector={vector} x = {:e}", t.name, x[i]);
                for (i, &w) in erf.iter().enumerate() {
                    assert!(same(e[i], w), "erf at {}: got {:e}, want {w:e}", at(i), e[i]);
                }
                for (i, (&w, &wt)) in gelu.iter().zip(&gelu_tanh).enumerate() {
                    // Exact where the result is exact (0, x, −0); elsewhere within the tail's
                    // absolute bound or 1e-5 relative (the sweeps hold the finer accuracy).
                    let close = |g: f32, w: f32| same(g, w) || (w != 0.0 && (g - w).abs() <= 1.2e-6 + 1e-5 * w.abs());
                    assert!(close(g[i], w), "gelu at {}: got {:e}, want {w:e}", at(i), g[i]);
                    assert!(close(gt[i], wt), "gelu_tanh at {}: got {:e}, want {wt:e}", at(i), gt[i]);
                }
                let n = erf.len();
                // ±f32::MAX, ±inf, NaN, then tiny values: tiny in, tiny (and same-signed) out.
                assert!(same(g[n - 4], f32::MAX) && same(gt[n - 4], f32::MAX), "{}", at(n - 4));
                assert!(same(g[n - 3], -0.0) && same(gt[n - 3], -0.0), "{}", at(n - 3));
                assert!(same(g[n - 2], inf) && same(gt[n - 2], inf), "{}", at(n - 2));
                assert!(g[n - 1].is_nan() && gt[n - 1].is_nan(), "{}", at(n - 1));
                assert!(e[n].is_nan() && g[n].is_nan() && gt[n].is_nan(), "{}", at(n));
                for i in n + 1..n + 5 {
                    let xi = x[i];
                    assert!(
                        e[i].abs() <= 2.0 * xi.abs() && e[i].is_sign_negative() == xi.is_sign_negative(),
                        "{}",
                        at(i)
                    );
                    assert!(g[i].abs() <= xi.abs() && gt[i].abs() <= xi.abs(), "{}", at(i));
                }
            }
        }
    }

    /// sin keeps the sign of ±0 and returns subnormals as they are; ±inf and NaN give NaN;
    /// past the reduction's range (the ulp of x over 0.5 from 2^22·π/2 on) the results are
    /// still finite and in [−1, 1].
    #[test]
    fn sin_cos_special_values() {
        let inf = f32::INFINITY;
        let x = [0.0, -0.0, 1e-40, -1e-40, inf, -inf, f32::NAN, 1e7, -3e9, 1e30, f32::MAX, -f32::MAX];
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits();
        for t in runnable_targets() {
            for vector in [true, false] {
                let s = apply(&t, vector, &[&x], &|m, v| m.sin(v[0]));
                let c = apply(&t, vector, &[&x], &|m, v| m.cos(v[0]));
                let at =
                    |i: usize| format!("{} vector={vector} x = {:e}: sin {:e}, cos {:e}", t.name, x[i], s[i], c[i]);
                for i in 0..4 {
                    assert!(same(s[i], x[i]) && c[i] == 1.0, "{}", at(i));
                }
                for i in 4..7 {
                    assert!(s[i].is_nan() && c[i].is_nan(), "{}", at(i));
                }
                for i in 7..x.len() {
                    assert!(s[i].abs() <= 1.0 && c[i].abs() <= 1.0, "{}", at(i));
                }
            }
        }
    }
}
