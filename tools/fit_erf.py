#!/usr/bin/env python3
"""Fit the rational erf of src/codegen/math.rs and find its saturation caps.

Run from the repository root:  python3 tools/fit_erf.py [M N]   (needs numpy and mpmath)

erf(x)/x = P(z)/Q(z), z = x², on x in [0, 4] (erf is 1 in f32 beyond 3.92, and Φ − ½ =
½erf(x/√2) needs x/√2 up to 5.6/√2 = 3.96): P of degree M, Q of degree N (5 5 by default),
minimax for relative error. Without arguments it first prints the f64 minimax error of a few
lower degrees, the trade-off behind the choice of (5, 5), and how far each is from GELU's
error budget when fitted for GELU alone (`gelu_weight`).

The fit is Loeb's linearisation P − f·Q ≈ 0 weighted by 1/(f·Q_previous), with Lawson's
reweighting (each point's weight times its error) driving the least-squares solutions to
equioscillation; on a dense Chebyshev grid, computed in f64 against mpmath's erf.

For the chosen degree it prints the f64 tables of math.rs with Q made monic (its leading
coefficient 1, so the first Horner step is an addition, not a fused multiply-add); math.rs
rounds them to f32 for erf, and for Φ − ½ after rescaling (x → x/√2, times ½), as `tables`
does here. Then it emulates the kernel's f32 evaluation, n = xc·P(z), n/Q(z), with and
without FMA (an FMA rounds once; emulated exactly), and searches the caps: the first float
at or past the point where erf rounds to 1 in f32 (3.92; Φ: 5.6) at which both evaluations
give exactly 1 (Φ − ½: ½), so that the clamped results saturate exactly. Finally it
reports the emulated max relative error of erf on [0, 4] (the Rust test `max_error_sweeps`
measures the real code).
"""

import sys

import mpmath
import numpy as np

mpmath.mp.dps = 30
X_MAX = 4.0
GRID = 3000


def erf_over_x(x):
    return float(mpmath.erf(x) / x) if x != 0 else float(2 / mpmath.sqrt(mpmath.pi))


def grid():
    # Chebyshev points on [0, X_MAX], with both ends.
    k = np.arange(GRID + 1)
    x = X_MAX * (1 - np.cos(np.pi * k / GRID)) / 2
    return x, np.array([erf_over_x(mpmath.mpf(float(v))) for v in x])


# What GELU's tests leave to the rational once the f32 evaluation has taken its share (about
# 3.7e-7 of 5.5e-7 relative for x >= −1, 8.7e-7 of 1.2e-6 absolute below): 1.5e-7 relative
# in Φ, 3e-7 absolute in x·Φ.
PHI_RELATIVE, GELU_ABSOLUTE = 1.5e-7, 3e-7


def gelu_weight(u):
    """Weights on erf(u)/u's error that make 1 GELU's budget: Φ − ½ = ½u·(erf(u)/u) at
    x = u√2 is relative to Φ(±x) for |x| <= 1, to Φ(x) and absolute times |x| beyond."""
    w = []
    for v in u:
        t = float(v) * np.sqrt(2)
        if t <= 1:
            tail = 1 / float(mpmath.ncdf(-t))
        else:
            tail = max(1 / float(mpmath.ncdf(t)), t * PHI_RELATIVE / GELU_ABSOLUTE)
        w.append(float(v) / 2 * tail / PHI_RELATIVE)
    return np.array(w)


def fit(m, n, x, f, iters=400, weight=None):
    """p (m+1), q (n+1, q[0] = 1) in z = x², minimax for the error times `weight` (relative
    error by default); and that max error."""
    t = (x / X_MAX) ** 2  # z scaled to [0, 1] for conditioning
    vp = np.vander(t, m + 1, increasing=True)
    vq = np.vander(t, n + 1, increasing=True)[:, 1:]
    a = np.hstack([vp, -f[:, None] * vq])
    w = np.ones_like(t) / len(t)
    qprev = np.ones_like(t)
    best = (np.inf, None, None)
    for _ in range(iters):
        s = np.sqrt(w) / (f * qprev) if weight is None else np.sqrt(w) * weight / qprev
        c, *_ = np.linalg.lstsq(a * s[:, None], f * s, rcond=None)
        p, q = c[: m + 1], np.concatenate([[1.0], c[m + 1 :]])
        qprev = np.polynomial.polynomial.polyval(t, q)
        err = np.polynomial.polynomial.polyval(t, p) / qprev - f
        err = err / f if weight is None else err * weight
        e = np.max(np.abs(err))
        if e < best[0]:
            best = (e, p, q)
        w = w * np.abs(err)
        w /= w.sum()
    e, p, q = best
    scale = (1 / X_MAX**2) ** np.arange(max(m, n) + 1)
    return p * scale[: m + 1], q * scale[: n + 1], e


def round_f32(hi, lo):
    """hi + lo (an exact f64 pair, |lo| <= ulp(hi)/2) rounded once to f32."""
    r = hi.astype(np.float32)
    d = hi - r.astype(np.float64)
    half = np.abs(np.spacing(r).astype(np.float64)) / 2
    # Only a hi exactly halfway between two floats can be pushed across by lo.
    tie = (np.abs(d) == half) & (lo != 0)
    away = tie & (np.sign(lo) == np.sign(d))
    toward = tie & (np.sign(lo) != np.sign(d))
    r = np.where(away, np.nextafter(r, np.float32(np.inf) * np.sign(d).astype(np.float32)), r)
    r = np.where(toward, hi.astype(np.float32), r)
    return r.astype(np.float32)


def fma32(a, b, c):
    """a·b + c rounded once to f32: the product is exact in f64, the sum exact as a pair."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = c.astype(np.float64) if isinstance(c, np.ndarray) else np.float64(c)
    s = p + c
    bb = s - p
    lo = (p - (s - bb)) + (c - bb)
    return round_f32(s, lo)


def horner32(z, c, fma):
    """The kernel's Horner: a monic polynomial starts with an addition."""
    c = [np.float32(v) for v in c]
    if c[-1] == 1:
        r = z + c[-2]
        rest = c[:-2]
    else:
        r = np.full_like(z, c[-1])
        rest = c[:-1]
    for k in reversed(rest):
        r = fma32(r, z, k) if fma else (r * z + k).astype(np.float32)
    return r


def rational32(xc, p, q, fma):
    z = (xc * xc).astype(np.float32)
    n = (xc * horner32(z, p, fma)).astype(np.float32)
    return (n / horner32(z, q, fma)).astype(np.float32)


def monic(p, q):
    """P and Q divided by Q's leading coefficient (the f64 tables of math.rs)."""
    return p / q[-1], q / q[-1]


def tables(p, q, s, d):
    """f32 coefficients of s·erf(x/√d)/x from the monic f64 tables, as math.rs makes them:
    x → x/√d divides the k-th coefficients by d^k, and multiplying both by d^N (exact for
    d = 2) keeps Q monic."""
    n = len(q) - 1
    pp = [c * (s / np.sqrt(d)) * d ** (n - k) for k, c in enumerate(p)]
    qq = [c * d ** (n - k) for k, c in enumerate(q)]
    return np.array(pp, dtype=np.float32), np.array(qq, dtype=np.float32)


def find_cap(start, p, q, target):
    x = np.float32(start)
    for _ in range(100000):
        xs = np.array([x], dtype=np.float32)
        if all(rational32(xs, p, q, fma)[0] == np.float32(target) for fma in (True, False)):
            return x
        x = np.nextafter(x, np.float32(np.inf), dtype=np.float32)
    raise SystemExit(f"no cap found from {start}")


def rust_table(name, c):
    vals = ", ".join(repr(float(v)) for v in c)
    return f"const {name}: [f64; {len(c)}] = [{vals}];"


def main():
    x, f = grid()
    if len(sys.argv) == 3:
        m, n = int(sys.argv[1]), int(sys.argv[2])
    else:
        m, n = 5, 5
        print("erf(x)/x = P(z)/Q(z) on [0, 4] by degree (M, N): f64 minimax relative error, and")
        print("the error of a fit weighted for GELU alone in units of its budget (1 = all of it):")
        gw = gelu_weight(x)
        for dm, dn in [(5, 5), (5, 4), (4, 5), (6, 3), (3, 6), (4, 4), (4, 3), (3, 3)]:
            print(f"  ({dm}, {dn}): {fit(dm, dn, x, f)[2]:.2e}  {fit(dm, dn, x, f, weight=gw)[2]:.2f}")
    p, q, e = fit(m, n, x, f)
    print(f"\n({m}, {n}): f64 max relative error {e:.2e}")
    p, q = monic(p, q)
    ep, eq = tables(p, q, 1.0, 1.0)
    fp, fq = tables(p, q, 0.5, 2.0)
    erf_cap = find_cap(3.92, ep, eq, 1.0)
    phi_cap = find_cap(5.6, fp, fq, 0.5)
    print(rust_table("ERF_P", p))
    print(rust_table("ERF_Q", q))
    for name, cap in (("ERF_CAP", erf_cap), ("PHI_CAP", phi_cap)):
        cap = np.float32(cap)
        print(f"const {name}: f32 = {np.format_float_positional(cap)}; // {cap.view(np.uint32):#010x}")
    # The f32 evaluation against erf, on floats over [−4, 4] clamped as the kernel does.
    xs = np.linspace(1e-3, X_MAX, 200001).astype(np.float32)
    want = np.array([float(mpmath.erf(float(v))) for v in xs[::50]])
    for fma in (True, False):
        got = rational32(np.minimum(xs, erf_cap)[::50], ep, eq, fma).astype(np.float64)
        err = np.max(np.abs(got - want) / want)
        print(f"emulated f32 erf, {'FMA' if fma else 'no FMA'}: max relative error {err:.2e}")


if __name__ == "__main__":
    main()
