"""The float32 GELU kernels' error over EVERY float32 input (the bound quoted in `pydtnn.backends.cpu.special`).

    python scripts/experiments/gelu_error_bound.py            # about a minute a core; --stride 97 for a quick sample

For each finite float32 x, against float64 references through libm's erfc and exp: Phi(x) (the float32
Phi the forward multiplies x by) and y = x Phi(x), in units of the float32 ulp of the float64 reference
(0.5 = correctly rounded), and the derivative Phi(x) + x phi(x) the forward keeps for the backward, in
units of eps32 * (Phi(x) + |x phi(x)|) (its terms cancel near x = -0.75, so a relative measure would say
nothing about the kernel). NaN must give NaN, +-inf the limits.
"""
from __future__ import annotations

import argparse
import math

import numpy as np
from numba import njit

from pydtnn.backends.cpu import rows as krows
from pydtnn.backends.cpu.special import ndtr32

_EPS32 = 2.0 ** -23


@njit(cache=True)
def _ulp32(r):
    m, e = math.frexp(abs(r))
    return max(2.0 ** (e - 24), 2.0 ** -149)


@njit(cache=True)
def _phi(x, out):
    """The float32 Phi the forward multiplies by (`ndtr32`, rounded)."""
    for i in range(x.size):
        out[i] = ndtr32(x[i])


@njit(cache=True)
def _worst(x, cdf, y, dx, worst, where):
    """worst[0..3] = max error of cdf, y where Phi is normal, y where it is subnormal (ulps) and dx (eps32 * terms);
    where[...] their x."""
    for i in range(x.size):
        v = float(x[i])
        if not math.isfinite(v):
            continue
        phi_ref = 0.5 * math.erfc(-v / math.sqrt(2.0))
        pdf = math.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)
        ey = abs(y[i] - v * phi_ref) / _ulp32(v * phi_ref)
        normal = phi_ref >= 2.0 ** -126          # Phi normal (below, its own rounding is absolute)
        errs = (abs(cdf[i] - phi_ref) / _ulp32(phi_ref), ey if normal else 0.0, 0.0 if normal else ey,
                abs(dx[i] - (phi_ref + v * pdf)) / (_EPS32 * (phi_ref + abs(v * pdf)) + 2.0 ** -149))
        for j in range(4):
            if errs[j] > worst[j]:
                worst[j], where[j] = errs[j], v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stride", type=int, default=1, help="check every stride-th float32 bit pattern")
    args = ap.parse_args()
    worst, where = np.zeros(4), np.zeros(4)
    chunk = 1 << 24
    for start in range(0, 1 << 32, chunk):
        x = np.arange(start, start + chunk, args.stride, dtype=np.uint64).astype(np.uint32).view(np.float32)
        cdf, y, dx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        krows.gelu32_fwd(0, 1, x, y, dx, x.size)       # dx: the derivative the forward keeps (dy = 1)
        _phi(x, cdf)
        _worst(x, cdf, y, dx, worst, where)
    names = ("Phi(x) [ulp]", "x Phi(x), Phi normal [ulp]", "x Phi(x), Phi subnormal [ulp]",
             "Phi + x phi [eps32 * terms]")
    for name, w, v in zip(names, worst, where):
        print(f"{name:36s} max error {w:.3f} at x = {v!r}")
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    cdf, y, dfac = np.empty_like(special), np.empty_like(special), np.empty_like(special)
    krows.gelu32_fwd(0, 1, special, y, dfac, special.size)
    _phi(special, cdf)
    print("x:", special, "-> Phi:", cdf, "y:", y)


if __name__ == "__main__":
    main()
