"""Row softmax kernels of the CPU backend, compiled with numba: attention scores and Softmax layers.

One row (the last axis) at a time, in place: its maximum, then exp and sum, then the scaling, while the
row is in L1 — one pass over memory instead of the five of the NumPy expression (subtract, exp, sum,
divide, and the maximum's). `causal` = T > 0 treats rows as the T x T matrices of attention: in row i of
each matrix, entries j > i get weight 0 (they count as -inf). Parts are row ranges (`_cpu_pool`).
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends._cpu_kernels import _part
from pydtnn.backends._cpu_special import exp_neg

# fast math that keeps inf and NaN semantics (a masked -inf, a diverged NaN score)
_NJ = {"cache": True, "boundscheck": False, "nogil": True, "fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"},
       "error_model": "numpy"}
_EXP_UNDERFLOW = 708.0      # exp(-u) for u beyond: below float64's smallest normal, 0


@njit(**_NJ)
def softmax_rows(t, nt, s, rows, length, causal):
    r0, r1 = _part(t, nt, rows)
    lu = uint64(length)
    for r in range(r0, r1):
        base = uint64(r) * lu          # unsigned offsets: see `_cpu_kernels`
        valid = lu if causal == 0 else uint64(r % causal) + uint64(1)     # row i of a T x T matrix: j <= i
        m = -np.inf
        for j in range(valid):
            v = s[base + j]
            if v > m or v != v:
                m = v
        total = 0.0
        for j in range(valid):
            # exp(s - m) through `exp_neg` (arithmetic only, so this loop vectorizes; libm's exp ran 20 ns an
            # element), float64 inside: relative error ~ (u + 1) eps64, far below float32's rounding
            u = float(m) - float(s[base + j])
            e = 0.0 if u > _EXP_UNDERFLOW else exp_neg(u)
            s[base + j] = e
            total += e
        inv = 1.0 / total
        for j in range(valid):
            s[base + j] *= inv
        for j in range(valid, lu):
            s[base + j] = 0.0


@njit(**_NJ)
def softmax_backward_rows(t, nt, y, g, rows, length):
    """g <- y * (g - sum_j g_j y_j), row by row, in place (the softmax's backward)."""
    r0, r1 = _part(t, nt, rows)
    for r in range(r0, r1):
        base = r * length
        dot = 0.0
        for j in range(length):
            dot += g[base + j] * y[base + j]
        for j in range(length):
            g[base + j] = y[base + j] * (g[base + j] - dot)
