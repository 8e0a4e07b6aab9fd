"""GELU and last-axis LayerNorm kernels of the CPU backend, compiled with numba (private helper).

The NumPy expressions of the layers make 5-10 passes over memory each (x * cdf, exp, the products of the
backward; LayerNorm's mean, centring, variance, scaling, and as many backward): here one pass forward and
one backward, a LayerNorm row at a time while it sits in L1. Statistics are summed in float64. Parts are
element or row ranges (`_cpu_pool`).
"""
from __future__ import annotations

import math

from numba import njit

from pydtnn.backends._cpu_kernels import _part

_NJ = {"cache": True, "boundscheck": False, "nogil": True}

_RSQRT2 = 1.0 / math.sqrt(2.0)
_RSQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


@njit(**_NJ)
def gelu_fwd(t, nt, x, y, cdf, n):
    """cdf = Phi(x) = erfc(-x / sqrt 2) / 2 (accurate in both tails), y = x * cdf."""
    i0, i1 = _part(t, nt, n)
    for i in range(i0, i1):
        c = 0.5 * math.erfc(-x[i] * _RSQRT2)
        cdf[i] = c
        y[i] = x[i] * c


@njit(**_NJ)
def gelu_bwd(t, nt, dy, x, cdf, dx, n):
    """dx = dy * (Phi(x) + x phi(x)), phi the standard normal density."""
    i0, i1 = _part(t, nt, n)
    for i in range(i0, i1):
        v = x[i]
        dx[i] = dy[i] * (cdf[i] + v * _RSQRT2PI * math.exp(-0.5 * v * v))


@njit(**_NJ)
def layernorm_fwd(t, nt, x, gamma, beta, y, xhat, inv_std, rows, d, eps):
    """Per row of d: xhat = (x - mean) / sqrt(var + eps) (two passes, float64 sums), y = xhat gamma + beta."""
    r0, r1 = _part(t, nt, rows)
    for r in range(r0, r1):
        base = r * d
        s = 0.0
        for j in range(d):
            s += x[base + j]
        mean = s / d
        v = 0.0
        for j in range(d):
            c = x[base + j] - mean
            v += c * c
        inv = 1.0 / math.sqrt(v / d + eps)
        inv_std[r] = inv
        for j in range(d):
            h = (x[base + j] - mean) * inv
            xhat[base + j] = h
            y[base + j] = h * gamma[j] + beta[j]


@njit(**_NJ)
def layernorm_bwd(t, nt, dy, xhat, inv_std, gamma, dx, dgamma, dbeta, rows, d):
    """dx = inv_std (g - mean(g) - xhat mean(g xhat)), g = dy gamma, per row; dgamma[t] += dy xhat and
    dbeta[t] += dy over this part's rows (float64 partial sums the caller adds up)."""
    r0, r1 = _part(t, nt, rows)
    for r in range(r0, r1):
        base = r * d
        sg = 0.0
        sgx = 0.0
        for j in range(d):
            g = dy[base + j] * gamma[j]
            sg += g
            sgx += g * xhat[base + j]
            dgamma[t, j] += dy[base + j] * xhat[base + j]
            dbeta[t, j] += dy[base + j]
        mg, mgx = sg / d, sgx / d
        inv = inv_std[r]
        for j in range(d):
            dx[base + j] = inv * (dy[base + j] * gamma[j] - mg - xhat[base + j] * mgx)

