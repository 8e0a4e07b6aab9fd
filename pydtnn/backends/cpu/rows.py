"""GELU and last-axis LayerNorm kernels of the CPU backend, compiled with numba (private helper).

The NumPy expressions of the layers make 5-10 passes over memory each (x * cdf, exp, the products of the
backward; LayerNorm's mean, centring, variance, scaling, and as many backward): here one pass forward and
one backward, a LayerNorm row at a time while it sits in L1. Statistics are summed in float64. Parts are
element or row ranges (`_cpu_pool`).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.kernels import _part
from pydtnn.backends.cpu.special import _NJ_EXACT, ndtr32_parts

# fast math that keeps NaN and inf (a diverged run must show in its loss); reassociation lets the row sums
# vectorize (without it they ran scalar, slower than NumPy's passes)
_NJ = {"cache": True, "boundscheck": False, "nogil": True, "fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"}}

_RSQRT2 = 1.0 / math.sqrt(2.0)
_RSQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


# GELU's forward also writes its derivative Phi(x) + x phi(x): the backward is then dy times it, one pass
# (it recomputed phi's exponential: 1.75 ns an element in float32, as much as half the forward).

@njit(**_NJ)
def gelu_fwd(t, nt, x, y, dfac, n):
    """y = x Phi(x), Phi = erfc(-x / sqrt 2) / 2 (accurate in both tails); dfac = Phi + x phi(x)."""
    i0, i1 = _part(t, nt, n)
    for i in range(uint64(i0), uint64(i1)):
        v = x[i]
        c = 0.5 * math.erfc(-v * _RSQRT2)
        y[i] = v * c
        dfac[i] = c + v * _RSQRT2PI * math.exp(-0.5 * v * v)


@njit(**_NJ_EXACT)
def gelu32_fwd(t, nt, x, y, dfac, n):
    """float32: as `gelu_fwd`, Phi from `ndtr32_parts` (no libm call: the loop vectorizes), rounded to
    float32 before both uses (y = x * Phi in float32; dfac from it and phi in float64, rounded once)."""
    i0, i1 = _part(t, nt, n)
    for i in range(uint64(i0), uint64(i1)):
        phi, g = ndtr32_parts(x[i])
        c = x.dtype.type(phi)
        y[i] = x[i] * c
        dfac[i] = x.dtype.type(float(c) + float(x[i]) * _RSQRT2PI * g)


@njit(**_NJ)
def gelu_bwd(t, nt, dy, dfac, dx, n):
    """dx = dy * dfac (the forward's Phi + x phi)."""
    i0, i1 = _part(t, nt, n)
    for i in range(uint64(i0), uint64(i1)):
        dx[i] = dy[i] * dfac[i]


@njit(**_NJ)
def layernorm_fwd(t, nt, x, gamma, beta, y, xhat, inv_std, rows, d, eps):
    """Per row of d: xhat = (x - mean) / sqrt(var + eps) (two passes, float64 sums), y = xhat gamma + beta.
    Offsets unsigned: signed computed indices keep numba's loops scalar (see `_cpu_kernels`)."""
    r0, r1 = _part(t, nt, rows)
    du = uint64(d)
    for r in range(r0, r1):
        base = uint64(r) * du
        s = 0.0
        for j in range(du):
            s += x[base + j]
        mean = s / d
        v = 0.0
        for j in range(du):
            c = x[base + j] - mean
            v += c * c
        inv = 1.0 / math.sqrt(v / d + eps)
        inv_std[r] = inv
        m32, i32 = x.dtype.type(mean), x.dtype.type(inv)
        for j in range(du):
            h = (x[base + j] - m32) * i32
            xhat[base + j] = h
            y[base + j] = h * gamma[j] + beta[j]


@njit(**_NJ)
def layernorm_bwd(t, nt, dy, xhat, inv_std, gamma, dx, dgamma, dbeta, rows, d):
    """dx = inv_std (g - mean(g) - xhat mean(g xhat)), g = dy gamma, per row; dgamma[t] += dy xhat and
    dbeta[t] += dy over this part's rows (float64 partial sums the caller adds up)."""
    r0, r1 = _part(t, nt, rows)
    du = uint64(d)
    # thread-private sums, copied out at the end: the parts' rows of dgamma and dbeta share a cache line
    # where they meet, and updating them row by row ran 2 parts at 183 us against 51 us for one (1088 x 64)
    dg, db = np.zeros(d, np.float64), np.zeros(d, np.float64)
    for r in range(r0, r1):
        base = uint64(r) * du
        sg = 0.0
        sgx = 0.0
        for j in range(du):
            g = dy[base + j] * gamma[j]
            sg += g
            sgx += g * xhat[base + j]
            dg[j] += dy[base + j] * xhat[base + j]
            db[j] += dy[base + j]
        mg, mgx, inv = dy.dtype.type(sg / d), dy.dtype.type(sgx / d), dy.dtype.type(inv_std[r])
        for j in range(du):
            dx[base + j] = inv * (dy[base + j] * gamma[j] - mg - xhat[base + j] * mgx)
    for j in range(d):
        dgamma[t, j] = dg[j]
        dbeta[t, j] = db[j]
