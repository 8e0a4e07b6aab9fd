"""Optimizer updates of the CPU backend in one pass over memory (numba), in parts on the backend's threads.

After a step's compute the flat buffers are out of cache; NumPy's `v *= mu; v -= lr * g; w += v` reads
and writes them four times and allocates a temporary (measured 115 us against 61 us for one fused pass
over simplecnn's 0.1 M float32 parameters, caches cold). The pass is bound by memory bandwidth, but one
thread does not saturate it: VGG-11's 9.75 M parameters (195 MB moved), caches cold, median of 30, took
4.5 ms on one thread and 3.9 ms in two parts (docs/performance.md, seventh pass). Each element's update is
the same arithmetic whichever part computes it, so the result does not depend on the thread count.

The adaptive updates (RMSProp, Adam, NAdam, AdamW) make ten or more NumPy passes and as many temporaries of
the parameters' size: at VGG-11's size Adam took 67.5-72.5 ms a step at 1 and at 2 threads, a fifth of the
whole step at 1 thread; fused, 7.1-7.3 ms at 1 thread, 3.9-5.5 in two parts (PyTorch's Adam: 77.3 / 46.9).
Their kernels do NumPy's operations in NumPy's order, each rounded in the parameters' dtype (no fastmath:
no fused multiply-adds, no approximate reciprocals), with the scalars cast as NumPy casts a Python float
against an array: the results are NumPy's, bit for bit (tested).
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu import parts
from pydtnn.backends.cpu.runtime.threads import POOL

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
    """The fused SGD-with-momentum update of w and v in place, in `nt` parts (see `_parts`)."""
    _parts(_sgd_momentum, w, v, g, lr, mu, nesterov, nt=nt)


def _parts(kernel, w, *args, nt=None):
    """Run kernel(t, nt, w, *args) in `nt` parts (default: the CPU backend's thread rule for a cheap,
    memory-bound pass over w.size elements, as ReLU's; it follows threadpoolctl's limit)."""
    if nt is None:
        nt = parts.default_threads(w.size // parts.CHEAP)
    POOL.run(kernel, nt, w, *args)


# No fastmath (NumPy's roundings); IEEE division (inf or nan, not ZeroDivisionError: NumPy's, and it lets
# the loops vectorize: with the check they ran scalar, Adam 55 ms at VGG-11's size against NumPy's 67).
_EXACT = dict(cache=True, boundscheck=False, nogil=True, error_model="numpy")


@njit(**_EXACT)
def _rmsprop(t, nt, w, c, g, rho, one_rho, lr, eps):
    """c = rho c + (1 - rho) g g;  w -= lr g / (sqrt(c) + eps)."""
    i0, i1 = _span(t, nt, w.size)
    for i in range(uint64(i0), uint64(i1)):
        gi = g[i]
        ci = c[i] * rho + one_rho * gi * gi
        c[i] = ci
        w[i] -= lr * gi / (np.sqrt(ci) + eps)


@njit(**_EXACT)
def _moments(m, v, i, gi, b1, one_b1, b2, one_b2):
    """Adam's moments of element i, updated in place: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g."""
    mi = m[i] * b1 + one_b1 * gi
    vi = v[i] * b2 + one_b2 * gi * gi
    m[i] = mi
    v[i] = vi
    return mi, vi


@njit(**_EXACT)
def _adam(t, nt, w, m, v, g, b1, one_b1, b2, one_b2, c1, c2, lr, eps, decay, decoupled):
    """The moments (`_moments`);  m^ = m / c1, v^ = v / c2 (the bias corrections);
    Adam: w -= lr m^ / (sqrt(v^) + eps);  AdamW (`decoupled`): w -= lr (m^ / (sqrt(v^) + eps) + decay w)."""
    i0, i1 = _span(t, nt, w.size)
    for i in range(uint64(i0), uint64(i1)):
        gi = g[i]
        mi, vi = _moments(m, v, i, gi, b1, one_b1, b2, one_b2)
        denom = np.sqrt(vi / c2) + eps
        if decoupled:
            step = mi / c1 / denom
            if decay != 0:
                step += decay * w[i]
            w[i] -= lr * step
        else:
            w[i] -= lr * (mi / c1) / denom


@njit(**_EXACT)
def _nadam(t, nt, w, m, v, g, b1, one_b1, b2, one_b2, c2, eps, kg, km):
    """The moments (`_moments`);  w -= kg g / (sqrt(v / c2) + eps), then w -= km m / (the same)."""
    i0, i1 = _span(t, nt, w.size)
    for i in range(uint64(i0), uint64(i1)):
        gi = g[i]
        mi, vi = _moments(m, v, i, gi, b1, one_b1, b2, one_b2)
        denom = np.sqrt(vi / c2) + eps
        wi = w[i] - kg * gi / denom
        w[i] = wi - km * mi / denom


def rmsprop(w, c, g, rho, lr, eps, nt=None):
    f = w.dtype.type
    _parts(_rmsprop, w, c, g, f(rho), f(1 - rho), f(lr), f(eps), nt=nt)


def adam(w, m, v, g, beta1, beta2, t, lr, eps, decay=0.0, decoupled=False, nt=None):
    """Adam's update at step t (AdamW's with `decoupled`), in place in w, m and v."""
    f = w.dtype.type
    _parts(_adam, w, m, v, g, f(beta1), f(1 - beta1), f(beta2), f(1 - beta2), f(1 - beta1 ** t),
           f(1 - beta2 ** t), f(lr), f(eps), f(decay), decoupled, nt=nt)


def nadam(w, m, v, g, beta1, beta2, t, eps, kg, km, nt=None):
    """NAdam's update at step t with the gradient's and the momentum's coefficients kg, km."""
    f = w.dtype.type
    _parts(_nadam, w, m, v, g, f(beta1), f(1 - beta1), f(beta2), f(1 - beta2), f(1 - beta2 ** t), f(eps),
           f(kg), f(km), nt=nt)
