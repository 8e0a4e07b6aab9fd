"""erfc through the array module alone (NumPy has none, and the project does not depend on SciPy).

The piecewise rational approximations of Sun's fdlibm `s_erf.c` (coefficients from there; "Permission to
use, copy, modify, and distribute this software is freely granted, provided that this notice is
preserved."), evaluated on whole arrays: about 1 ulp in float64, so that GELU matches PyTorch to
rounding. Each range is computed on every element and chosen by `where` (no data-dependent indexing,
so it runs on CuPy unchanged); clamps keep the unused lanes finite. On CuPy, `cupyx.scipy.special.erfc`
(one fused kernel) is used when it is there.
"""
from __future__ import annotations

ERX = 8.45062911510467529297e-01
# erf(x) = x + x * P(x^2) / Q(x^2) on |x| < 0.84375
PP = (1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
      -5.77027029648944159157e-03, -2.37630166566501626084e-05)
QQ = (1.0, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
      1.32494738004321644526e-04, -3.96022827877536812320e-06)
# erf(1 + s) = erx + P(s) / Q(s) on 0.84375 <= |x| < 1.25
PA = (-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
      3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02,
      -2.16637559486879084300e-03)
QA = (1.0, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
      1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02)
# erfc(x) = exp(-x^2 - 0.5625 + R(1/x^2) / S(1/x^2)) / x on 1.25 <= |x| < 1/0.35 (RA/SA) and beyond (RB/SB)
RA = (-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
      -6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
      -8.12874355063065934246e+01, -9.81432934416914548592e+00)
SA = (1.0, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
      6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
      6.57024977031928170135e+00, -6.04244152148580987438e-02)
RB = (-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
      -1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
      -4.83519191608651397019e+02)
SB = (1.0, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
      3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
      -2.24409524465858183362e+01)


def _poly(coeffs, z):
    """Horner: coeffs[0] + coeffs[1] z + ..."""
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = acc * z + c
    return acc


def erfc(xp, x):
    """1 - erf(x), elementwise, accurate in both tails (for GELU's Phi(x) = erfc(-x / sqrt 2) / 2)."""
    if xp.__name__ == "cupy":
        try:
            from cupyx.scipy.special import erfc as fused
            return fused(x)
        except ImportError:             # a CuPy without cupyx.scipy: the formulas below
            pass
    one = x.dtype.type(1)
    ax = xp.abs(x)
    neg = x < 0
    # |x| < 0.84375
    z = x * x
    y = _poly(PP, z) / _poly(QQ, z)
    small = xp.where(x < 0.25, one - (x + x * y), 0.5 - (x - 0.5 + x * y))
    # 0.84375 <= |x| < 1.25
    s = ax - 1
    pq = _poly(PA, s) / _poly(QA, s)
    middle = xp.where(neg, one + ERX + pq, one - ERX - pq)
    # 1.25 <= |x| < 28 (beyond: 0, or 2 for negative x)
    t = xp.clip(ax, 1.25, 28.0)
    u = one / (t * t)
    rs = xp.where(t < 1 / 0.35, _poly(RA, u) / _poly(SA, u), _poly(RB, u) / _poly(SB, u))
    hi = t.astype(xp.float32).astype(t.dtype)          # t rounded to 24 bits: hi * hi is exact in float64
    tail = xp.exp(-hi * hi - 0.5625) * xp.exp((hi - t) * (hi + t) + rs) / t
    tail = xp.where(ax >= 28.0, 0.0, tail)
    tail = xp.where(neg, 2 - tail, tail)
    out = xp.where(ax < 0.84375, small, xp.where(ax < 1.25, middle, tail))
    return out.astype(x.dtype, copy=False)
