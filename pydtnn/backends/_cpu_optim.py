"""Optimizer updates of the CPU backend in one pass over memory (numba), in parts on the backend's threads.

After a step's compute the flat buffers are out of cache; NumPy's `v *= mu; v -= lr * g; w += v` reads
and writes them four times and allocates a temporary (measured 115 us against 61 us for one fused pass
over simplecnn's 0.1 M float32 parameters, caches cold). The pass is bound by memory bandwidth, but one
thread does not saturate it: VGG-11's 9.75 M parameters (195 MB moved), caches cold, median of 30, took
4.5 ms on one thread and 3.9 ms in two parts (docs/performance.md, seventh pass). Each element's update is
the same arithmetic whichever part computes it, so the result does not depend on the thread count.
"""
from __future__ import annotations

from numba import njit, uint64

from pydtnn.backends._cpu_pool import POOL

# An element's update reads three arrays and writes two: a cheap, memory-bound pass (the backend's rule for
# ReLU and the like: `_CHEAP` elements count as one of its thread threshold)
_CHEAP = 8
# Parts start at multiples of 16 elements (a 64-byte line of float32): no line is written by two threads.
_LINE = 16


@njit(cache=True, nogil=True)
def _span(t, nt, total):
    per = -(-total // (nt * _LINE)) * _LINE
    return min(total, t * per), min(total, (t + 1) * per)


@njit(cache=True, fastmath=True, boundscheck=False, nogil=True)
def _sgd_momentum(t, nt, w, v, g, lr, mu, nesterov):
    """Part t of nt of: v = mu v - lr g;  w += v  (Nesterov: w += mu v - lr g), elementwise over flat arrays."""
    i0, i1 = _span(t, nt, w.size)
    for i in range(uint64(i0), uint64(i1)):
        vi = mu * v[i] - lr * g[i]
        v[i] = vi
        if nesterov:
            w[i] += mu * vi - lr * g[i]
        else:
            w[i] += vi


def sgd_momentum(w, v, g, lr, mu, nesterov, nt=None):
    """The fused SGD-with-momentum update of w and v in place, in `nt` parts (default: the CPU backend's
    thread rule for a cheap pass over w.size elements, which follows threadpoolctl's limit)."""
    if nt is None:
        from pydtnn.backends.cpu import default_threads
        nt = default_threads(w.size // _CHEAP)
    POOL.run(_sgd_momentum, nt, w, v, g, lr, mu, nesterov)
