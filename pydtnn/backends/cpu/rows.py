"""GELU and last-axis LayerNorm on the CPU backend (the sequence layers): the numba kernels, then
`RowKernels`, their host side.

The NumPy expressions of the layers make 5-10 passes over memory each (x * cdf, exp, the products of the
backward; LayerNorm's mean, centring, variance, scaling, and as many backward): here one pass forward and
one backward, a LayerNorm row at a time while it sits in L1. Statistics are summed in float64. Parts are
element or row ranges (`jit`'s conventions).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.jit import FAST_KEEP_NAN
from pydtnn.backends.cpu.parts import CHEAP, part_range
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.backends.cpu.special import _NJ_EXACT, ndtr32_parts

# Fast math that keeps NaN and inf (a diverged run must show in its loss): without reassociation the row
# sums ran scalar, slower than NumPy's passes.
_NJ = FAST_KEEP_NAN
# LayerNorm makes three passes over each row (two sums, then the output): 2 elements count as one unit. The
# ViT's 1088 x 64 rows then run in 2 parts: 39 -> 27 us alone, the 2-thread step 7.21 -> 7.14 ms (alternated
# in one process, 8 rounds, every round faster); as a cheap pass (8 elements a unit) they ran on one thread.
_LAYERNORM = 2

_RSQRT2 = 1.0 / math.sqrt(2.0)
_RSQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


# GELU's forward also writes its derivative Phi(x) + x phi(x): the backward is then dy times it, one pass
# (it recomputed phi's exponential: 1.75 ns an element in float32, as much as half the forward).

@njit(**_NJ)
def gelu_fwd(t, nt, x, y, dfac, n):
    """y = x Phi(x), Phi = erfc(-x / sqrt 2) / 2 (accurate in both tails); dfac = Phi + x phi(x)."""
    i0, i1 = part_range(t, nt, n)
    for i in range(uint64(i0), uint64(i1)):
        v = x[i]
        c = 0.5 * math.erfc(-v * _RSQRT2)
        y[i] = v * c
        dfac[i] = c + v * _RSQRT2PI * math.exp(-0.5 * v * v)


@njit(**_NJ_EXACT)
def gelu32_fwd(t, nt, x, y, dfac, n):
    """float32: as `gelu_fwd`, Phi from `ndtr32_parts` (no libm call: the loop vectorizes), rounded to
    float32 before both uses (y = x * Phi in float32; dfac from it and phi in float64, rounded once)."""
    i0, i1 = part_range(t, nt, n)
    for i in range(uint64(i0), uint64(i1)):
        phi, g = ndtr32_parts(x[i])
        c = x.dtype.type(phi)
        y[i] = x[i] * c
        dfac[i] = x.dtype.type(float(c) + float(x[i]) * _RSQRT2PI * g)


@njit(**_NJ)
def gelu_bwd(t, nt, dy, dfac, dx, n):
    """dx = dy * dfac (the forward's Phi + x phi)."""
    i0, i1 = part_range(t, nt, n)
    for i in range(uint64(i0), uint64(i1)):
        dx[i] = dy[i] * dfac[i]


@njit(**_NJ)
def layernorm_fwd(t, nt, x, gamma, beta, y, xhat, inv_std, rows, d, eps):
    """Per row of d: xhat = (x - mean) / sqrt(var + eps) (two passes, float64 sums), y = xhat gamma + beta.
    Offsets unsigned: signed computed indices keep numba's loops scalar (see `jit`)."""
    r0, r1 = part_range(t, nt, rows)
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
    r0, r1 = part_range(t, nt, rows)
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


class RowKernels:
    """The host side of GELU and LayerNorm, mixed into `CPUBackend`: one pass each way. Arrays of another
    dtype than the backend's take plain NumPy expressions instead."""

    def gelu_forward(self, x):
        """(y, ctx): ctx is GELU's derivative Phi(x) + x phi(x), written in the same pass."""
        if x.dtype != self.dtype:
            y, (x, cdf) = super().gelu_forward(x)
            return y, cdf + x * np.exp(-0.5 * x * x) * x.dtype.type(_RSQRT2PI)
        x = self._c(x)
        y, dfac = np.empty_like(x), np.empty_like(x)
        kernel = gelu32_fwd if x.dtype == np.float32 else gelu_fwd      # float64: libm's erfc
        POOL.run(kernel, self._nt(x.size), x.reshape(-1), y.reshape(-1), dfac.reshape(-1), x.size)
        return y, dfac

    def gelu_backward(self, dy, ctx):
        dfac = ctx
        if dy.dtype != self.dtype or dy.shape != dfac.shape:
            return dy * dfac
        dy = self._c(dy)
        dx = np.empty_like(dy)
        POOL.run(gelu_bwd, self._nt(dy.size // CHEAP), dy.reshape(-1), dfac.reshape(-1), dx.reshape(-1),
                 dy.size)
        return dx

    def layernorm_forward(self, x, gamma, beta, eps: float):
        if x.dtype != self.dtype:
            return super().layernorm_forward(x, gamma, beta, eps)
        x = self._c(x)
        d = x.shape[-1]
        rows = x.size // d
        y, x_hat = np.empty_like(x), np.empty_like(x)
        inv_std = np.empty(rows, self.dtype)
        POOL.run(layernorm_fwd, self._nt(x.size // _LAYERNORM), x.reshape(-1), self._vec(gamma), self._vec(beta),
                 y.reshape(-1), x_hat.reshape(-1), inv_std, rows, d, float(eps))
        return y, (x_hat, inv_std)

    def layernorm_backward(self, dy, ctx, gamma):
        x_hat, inv_std = ctx
        if dy.dtype != self.dtype or dy.shape != x_hat.shape or inv_std.ndim != 1:
            return super().layernorm_backward(dy, ctx, gamma)
        dy = self._c(dy)
        d = dy.shape[-1]
        rows = dy.size // d
        nt = self._nt(dy.size // _LAYERNORM)
        dgamma, dbeta = np.zeros((nt, d)), np.zeros((nt, d))
        dx = np.empty_like(dy)
        POOL.run(layernorm_bwd, nt, dy.reshape(-1), x_hat.reshape(-1), inv_std, self._vec(gamma),
                 dx.reshape(-1), dgamma, dbeta, rows, d)
        return dx, dgamma.sum(axis=0).astype(self.dtype), dbeta.sum(axis=0).astype(self.dtype)
