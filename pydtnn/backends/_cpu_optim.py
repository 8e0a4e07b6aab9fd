"""Optimizer updates of the CPU backend in one pass over memory (numba).

After a step's compute the flat buffers are out of cache; NumPy's `v *= mu; v -= lr * g; w += v` reads
and writes them four times and allocates a temporary (measured 115 us against 61 us for one fused pass
over simplecnn's 0.1 M float32 parameters, caches cold).
"""
from __future__ import annotations

from numba import njit


@njit(cache=True, fastmath=True, boundscheck=False, nogil=True)
def sgd_momentum(w, v, g, lr, mu, nesterov):
    """v = mu v - lr g;  w += v  (Nesterov: w += mu v - lr g), elementwise over flat arrays."""
    for i in range(w.size):
        vi = mu * v[i] - lr * g[i]
        v[i] = vi
        if nesterov:
            w[i] += mu * vi - lr * g[i]
        else:
            w[i] += vi
