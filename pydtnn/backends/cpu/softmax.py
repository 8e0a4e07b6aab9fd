"""Row softmax on the CPU backend (attention scores, Softmax layers): the numba kernels, then
`SoftmaxKernels`, their host side.

One row (the last axis) at a time, in place: its maximum, then exp and sum, then the scaling, while the
row is in L1 — one pass over memory instead of the five of the NumPy expression (subtract, exp, sum,
divide, and the maximum's). `causal` = T > 0 treats rows as the T x T matrices of attention: in row i of
each matrix, entries j > i get weight 0 (they count as -inf). Parts are row ranges (`jit`'s conventions).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types, uint64
from numba.extending import overload

from pydtnn.backends.cpu.jit import FAST_KEEP_NAN
from pydtnn.backends.cpu.parts import part_range
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.backends.cpu.special import EXP32_UNDERFLOW, exp_neg, exp_neg32

# fast math that keeps inf and NaN semantics (a masked -inf, a diverged NaN score)
_NJ = dict(FAST_KEEP_NAN, error_model="numpy")
_EXP_UNDERFLOW = 708.0      # exp(-u) for u beyond: below float64's smallest normal, 0
_SUM_BLOCK = 64
# the row maximum's loop may assume no NaN (a select reduction vectorizes only then); it runs only on rows
# `_has_nan` found free of NaN, so the assumption always holds
_NJ_NO_NAN = dict(_NJ, fastmath=_NJ["fastmath"] | {"nnan"})


@njit(**_NJ)
def _has_nan(s, base, n):
    bad = False
    for j in range(n):
        v = s[base + j]
        bad |= v != v
    return bad


@njit(**_NJ_NO_NAN)
def _max_of_numbers(s, base, n):
    m = s.dtype.type(-np.inf)
    for j in range(n):
        v = s[base + j]
        m = v if v > m else m
    return m


@njit(**_NJ)
def _row_max(s, base, n):
    """The row's maximum, NaN if it holds one: two vectorized passes (the one NaN-aware loop ran scalar:
    softmax of the ViT's rows of 17, 161 -> 136 us for 256 x 17 rows)."""
    return s.dtype.type(np.nan) if _has_nan(s, base, n) else _max_of_numbers(s, base, n)


def _exp_below(m, v):
    """exp(v - m) for v <= m, in the precision of the scores (numba only)."""


@overload(_exp_below)
def _exp_below_impl(m, v):
    # arithmetic only (`special`), so the row loop vectorizes; libm's exp ran 20 ns an element
    if m == types.float32 and v == types.float32:
        def exp32(m, v):
            # float32 throughout, 8 lanes: u = m - v carries one rounding (relative eps32 u, absolute at most
            # eps32 u e^-u <= 2e-8 on the weight), exp_neg32 under one ulp
            u = m - v
            return np.float32(0.0) if u > EXP32_UNDERFLOW else exp_neg32(u)
        return exp32

    def exp64(m, v):
        # float64 inside: relative error ~ (u + 1) eps64
        u = float(m) - float(v)
        return 0.0 if u > _EXP_UNDERFLOW else exp_neg(u)
    return exp64


@njit(**_NJ)
def softmax_rows(t, nt, s, rows, length, causal):
    r0, r1 = part_range(t, nt, rows)
    lu = uint64(length)
    for r in range(r0, r1):
        base = uint64(r) * lu          # unsigned offsets: see `jit`
        valid = lu if causal == 0 else uint64(r % causal) + uint64(1)     # row i of a T x T matrix: j <= i
        m = _row_max(s, base, valid)
        # the sum in blocks of _SUM_BLOCK in the scores' precision (a float32 sum keeps the loop 8 wide; the
        # float64 one did not vectorize), the blocks' sums in float64: relative error <= (_SUM_BLOCK / 8 + 3)
        # eps32 (8 lanes) at any row length
        total = 0.0
        j0 = uint64(0)
        while j0 < valid:
            j1 = min(j0 + uint64(_SUM_BLOCK), valid)
            part = s.dtype.type(0)
            for j in range(j0, j1):
                e = _exp_below(m, s[base + j])
                s[base + j] = e
                part += e
            total += part
            j0 = j1
        inv = 1.0 / total
        for j in range(valid):
            s[base + j] *= inv
        for j in range(valid, lu):
            s[base + j] = 0.0


@njit(**_NJ)
def softmax_backward_rows(t, nt, y, g, rows, length):
    """g <- y * (g - sum_j g_j y_j), row by row, in place (the softmax's backward). The dot product is summed
    as the forward's row sum (blocks of _SUM_BLOCK in the data's precision, the blocks in float64), with
    unsigned offsets: both loops vectorize (the ViT's 256 x 17 rows of 17: 144 -> 41 us)."""
    r0, r1 = part_range(t, nt, rows)
    lu = uint64(length)
    for r in range(uint64(r0), uint64(r1)):
        base = r * lu
        dot = 0.0
        j0 = uint64(0)
        while j0 < lu:
            j1 = min(j0 + uint64(_SUM_BLOCK), lu)
            part = g.dtype.type(0)
            for j in range(j0, j1):
                part += g[base + j] * y[base + j]
            dot += part
            j0 = j1
        d = g.dtype.type(dot)
        for j in range(lu):
            g[base + j] = y[base + j] * (g[base + j] - d)


class SoftmaxKernels:
    """The host side of the row softmax, mixed into `CPUBackend`, in place; other dtypes or non-contiguous
    arrays take the contract's NumPy reference."""

    def softmax(self, s, causal=False):
        if s.dtype != self.dtype or not s.flags.c_contiguous:
            return super().softmax(s, causal)
        length = s.shape[-1]
        rows = s.size // length
        POOL.run(softmax_rows, self._nt(s.size), s.reshape(-1), rows, length, length if causal else 0)
        return s

    def softmax_backward(self, y, g):
        if g.dtype != self.dtype or not (g.flags.c_contiguous and y.flags.c_contiguous) or y.shape != g.shape:
            return super().softmax_backward(y, g)
        length = g.shape[-1]
        POOL.run(softmax_backward_rows, self._nt(g.size), y.reshape(-1), g.reshape(-1), g.size // length,
                 length)
        return g
