//! f32 math shared by the generated kernels and the runner: the coefficients of GELU's two
//! forms (`src/codegen/math.rs` documents the methods and their measured errors, and emits
//! them as Cranelift IR) and the same formulas in Rust, for the library GEMM's epilogues
//! (`crate::kernels::epilogue`). Both evaluate one formula step for step (with FMA where the code
//! has it), so a fused epilogue and the separate kernel it replaces agree to the rounding.

/// erf(x)/x = P(x²)/Q(x²) on [0, 4]: minimax for relative error, 2.5e-8 in f64 (these are
/// the f64 coefficients of `tools/fit_erf.py`; each use rounds them to f32 after any
/// rescaling). Beyond 4, erf is 1 in f32. Both erf and Φ − ½ = ½erf(x/√2) (GELU) use it, Φ's
/// coefficients rescaled. Q is monic, so its Horner chain starts with an addition, and lower
/// degrees are not accurate enough: (4, 5) is at 3.5e-7 and (5, 4) at 6.8e-7 in f64, more
/// than the f32 evaluation's own error (the script prints the table).
pub const ERF_P: [f64; 6] = [
    30154.39408027222,
    5172.232909481946,
    1419.0720811349504,
    103.77717951729163,
    7.60462204479449,
    0.05309381786237195,
];
pub const ERF_Q: [f64; 6] =
    [26723.636612411494, 13491.63015711747, 3082.5732460007057, 406.39329373622957, 31.682766752688096, 1.0];
/// Where the clamped argument stops: the first floats past erf's (and Φ's) rounding to 1 at
/// which the f32 evaluation gives exactly erf = ±1 (Φ − ½ = ±½), with and without FMA
/// (searched by `tools/fit_erf.py`, which emulates both evaluations; checked by the test
/// `rational_caps_saturate_exactly`), so results past the cap are exactly ±1, x and −0.
pub const ERF_CAP: f32 = 3.9200027; // 0x407ae153
pub const PHI_CAP: f32 = 5.6000004; // 0x40b33334
/// e^r on |r| <= ln2/2 (Horner, degree 5), relative error 9.2e-8 with these f32 coefficients
/// (fitted one at a time after rounding the previous ones): the exponential of GELU's tanh
/// form, whose argument already carries a larger rounding error.
pub const EXP5: [f32; 6] = [1.0, 0.9999997, 0.49999148, 0.1666765, 0.041898176, 0.008289499];

pub const MAGIC: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer in the low bits
pub const LN2_HI: f32 = 0.693_359_4; // 355/512: n·LN2_HI is exact for |n| < 2^15
pub const LN2_LO: f32 = -2.121_944_4e-4;

/// The rational `s·erf(x/√d)` = x·P(x²)/Q(x²) as f32 coefficients (P, Q), ERF_P and ERF_Q
/// rescaled: x → x/√d divides the k-th coefficients by d^k; multiplying both polynomials by
/// d^5 (exact for d = 2) keeps Q monic.
pub fn erf_coefficients(s: f64, d: f64) -> ([f32; 6], [f32; 6]) {
    let scaled =
        |c: &[f64; 6], s: f64| -> [f32; 6] { std::array::from_fn(|k| (c[k] * s * d.powi(5 - k as i32)) as f32) };
    (scaled(&ERF_P, s / d.sqrt()), scaled(&ERF_Q, 1.0))
}

/// a·b + c, fused when `FMA`.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Horner's rule, c[5] first.
#[inline(always)]
pub(crate) fn horner<const FMA: bool>(x: f32, c: &[f32; 6]) -> f32 {
    c[..5].iter().rev().fold(c[5], |r, &k| madd::<FMA>(r, x, k))
}

/// Horner's rule for a monic polynomial (c[5] = 1), starting with an addition, as the
/// generated kernels' `horner` does for one.
#[inline(always)]
fn horner_monic<const FMA: bool>(x: f32, c: &[f32; 6]) -> f32 {
    c[..4].iter().rev().fold(x + c[4], |r, &k| madd::<FMA>(r, x, k))
}

/// min(x, hi) keeping NaN.
#[inline(always)]
fn clamp_max(x: f32, hi: f32) -> f32 {
    if hi < x {
        hi
    } else {
        x
    }
}

/// max(x, lo) keeping NaN.
#[inline(always)]
fn clamp_min(x: f32, lo: f32) -> f32 {
    if x < lo {
        lo
    } else {
        x
    }
}

/// GELU's exact form x·Φ(x), Φ − ½ from `phi` = `erf_coefficients(0.5, 2.0)`.
#[inline(always)]
pub fn gelu_erf<const FMA: bool>(x: f32, phi: &([f32; 6], [f32; 6])) -> f32 {
    let xc = clamp_min(clamp_max(x, PHI_CAP), -PHI_CAP);
    let z = xc * xc;
    let e = xc * horner::<FMA>(z, &phi.0) / horner_monic::<FMA>(z, &phi.1);
    x * (e + 0.5)
}

/// GELU's tanh form x/(1 + e^−y), y = 2√(2/π)(x + 0.044715x³).
#[inline(always)]
pub fn gelu_tanh<const FMA: bool>(x: f32) -> f32 {
    let c = 2.0 * std::f64::consts::FRAC_2_PI.sqrt();
    let p = madd::<FMA>(x * x, -(c * 0.044715) as f32, -c as f32);
    x / (1.0 + exp_clamped::<FMA>(x * p))
}

/// SiLU x/(1 + e^−x) = x · sigmoid(x). Below −88.5, where e^−x is clamped, sigmoid(x) is
/// 0 in f32 and the interpreter's product x · 0: −0, and NaN for −∞ (the quotient would
/// give x / 2.7e38 there, −1.1 for −3e38).
#[inline(always)]
pub fn silu<const FMA: bool>(x: f32) -> f32 {
    let q = x / (1.0 + exp_clamped::<FMA>(-x));
    if x < -88.5 {
        x * 0.0
    } else {
        q
    }
}

/// e^y for y clamped to [−87, 88.5]: beyond, 1 + e^y in a quotient's denominator is 1 or
/// large enough that the quotient is 0 (or −0), as the unclamped value gives.
#[inline(always)]
fn exp_clamped<const FMA: bool>(y: f32) -> f32 {
    let ny = clamp_min(clamp_max(y, 88.5), -87.0);
    let magic = MAGIC + 127.0;
    let k = madd::<FMA>(ny, std::f32::consts::LOG2_E, magic);
    let nkf = -(k - magic);
    let r = if FMA {
        madd::<FMA>(nkf, std::f32::consts::LN_2, ny)
    } else {
        madd::<FMA>(nkf, LN2_LO, madd::<FMA>(nkf, LN2_HI, ny))
    };
    let scale = f32::from_bits(k.to_bits() << 23);
    horner::<FMA>(r, &EXP5) * scale
}
