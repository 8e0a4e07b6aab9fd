"""Element-wise kernels of the CPU backend: ReLU forward and backward (of a gradient in one part or two), and
the sum of two arrays (an AdditionBlock's merge, with a ReLU fused in on request). The numba kernels, then `ElementwiseKernels`,
their host side. Parts are ranges of the flat arrays (`jit`'s conventions); NaN stays NaN.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.jit import FAST_KEEP_NAN
from pydtnn.backends.cpu.parts import CHEAP, part_range
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.errors import ShapeError


@njit(**FAST_KEEP_NAN)
def relu_fwd(t, nt, xf, yf):
    """y = max(x, 0) (NaN stays NaN), in parts of the flat array."""
    zero = xf.dtype.type(0)
    i0, i1 = part_range(t, nt, xf.size)
    for i in range(uint64(i0), uint64(i1)):
        v = xf[i]
        yf[i] = zero if v <= zero else v


@njit(**FAST_KEEP_NAN)
def relu_bwd(t, nt, dyf, yf, dxf):
    """dx = dy where y > 0, else 0."""
    zero = dyf.dtype.type(0)
    i0, i1 = part_range(t, nt, dyf.size)
    for i in range(uint64(i0), uint64(i1)):
        dxf[i] = dyf[i] if yf[i] > 0 else zero


@njit(**FAST_KEEP_NAN)
def relu_bwd_sum(t, nt, dyf, af, yf, dxf):
    """dx = dy + a where y > 0, else 0 (relu_bwd of a gradient in two parts)."""
    zero = dyf.dtype.type(0)
    i0, i1 = part_range(t, nt, dyf.size)
    for i in range(uint64(i0), uint64(i1)):
        dxf[i] = dyf[i] + af[i] if yf[i] > 0 else zero


@njit(**FAST_KEEP_NAN)
def add_fwd(t, nt, af, bf, yf, relu):
    """y = a + b, or relu(a + b) (NaN stays NaN)."""
    zero = af.dtype.type(0)
    i0, i1 = part_range(t, nt, af.size)
    if relu:
        for i in range(uint64(i0), uint64(i1)):
            v = af[i] + bf[i]
            yf[i] = zero if v <= zero else v
    else:
        for i in range(uint64(i0), uint64(i1)):
            yf[i] = af[i] + bf[i]


class ElementwiseKernels:
    """The host side of the element-wise kernels, mixed into `CPUBackend`."""

    def relu_forward(self, x):
        x = self._c(x)
        y = np.empty_like(x)
        POOL.run(relu_fwd, self._nt(x.size // CHEAP), x.reshape(-1), y.reshape(-1))
        return y

    def relu_backward(self, dy, y, addend=None):
        dy = self._c(dy)
        dx = np.empty_like(dy)
        if addend is None:
            POOL.run(relu_bwd, self._nt(dy.size // CHEAP), dy.reshape(-1), self._c(y).reshape(-1), dx.reshape(-1))
        else:
            if addend.shape != dy.shape:
                raise ShapeError(f"relu_backward: addend {addend.shape} and dy {dy.shape} differ")
            POOL.run(relu_bwd_sum, self._nt(dy.size // CHEAP), dy.reshape(-1), self._c(addend).reshape(-1),
                     self._c(y).reshape(-1), dx.reshape(-1))
        return dx

    def add(self, a, b, relu=False):
        a, b = self._c(a), self._c(b)
        if a.shape != b.shape:
            raise ShapeError(f"add: shapes {a.shape} and {b.shape} differ")
        y = np.empty_like(a)
        POOL.run(add_fwd, self._nt(a.size // CHEAP), a.reshape(-1), b.reshape(-1), y.reshape(-1), relu)
        return y
