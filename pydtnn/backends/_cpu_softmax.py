"""Row softmax kernels of the CPU backend, compiled with numba: attention scores and Softmax layers.

One row (the last axis) at a time, in place: its maximum, then exp and sum, then the scaling, while the
row is in L1 — one pass over memory instead of the five of the NumPy expression (subtract, exp, sum,
divide, and the maximum's). `causal` = T > 0 treats rows as the T x T matrices of attention: in row i of
each matrix, entries j > i get weight 0 (they count as -inf). Parts are row ranges (`_cpu_pool`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from pydtnn.backends._cpu_kernels import _part

# fast math that keeps inf and NaN semantics (a masked -inf, a diverged NaN score)
_NJ = {"cache": True, "boundscheck": False, "nogil": True, "fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"}}


@njit(**_NJ)
def softmax_rows(t, nt, s, rows, length, causal):
    r0, r1 = _part(t, nt, rows)
    for r in range(r0, r1):
        base = r * length
        valid = length if causal == 0 else (r % causal) + 1        # row i of a T x T matrix: j <= i
        m = -np.inf
        for j in range(valid):
            v = s[base + j]
            if v > m or v != v:
                m = v
        total = 0.0
        for j in range(valid):
            e = np.exp(s[base + j] - m)
            s[base + j] = e
            total += e
        inv = 1.0 / total
        for j in range(valid):
            s[base + j] *= inv
        for j in range(valid, length):
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
