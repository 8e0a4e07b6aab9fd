"""Filter layout changes of the CPU backend: the numba kernel, then `LayoutKernels`, its host side.

The direct convolution kernels read filters as (kh, kw, C, K) and write weight gradients in that layout;
layers keep the user's (K, C, kh, kw). NumPy's transposing copies of VGG's 512 x 512 x 3 x 3 filters took
5.5 ms (to the kernels' layout) and 9.8 ms (back), in every step, on one thread: as long as a third of
the layer's own backward. Here the copy goes in short runs that stay in L1, in parts on the thread pool.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.jit import IEEE
from pydtnn.backends.cpu.runtime.threads import POOL

_RUN = 8            # x elements a run: 8 short reads of src (each in its own, reused line), one 8-long write


@njit(**IEEE)
def swap_outer(t, nt, src, dst, X, Y, Z):
    """dst (Z, Y, X)[z, y, x] = src (X, Y, Z)[x, y, z], flat, C-contiguous; part t of nt takes a range of y.
    (Blocks of 16 y by 128 x by 128 z, innermost x, measured 5.6 ms for 512 x 512 x 9; runs of 8 x, 3.2.)"""
    XY, YZ = uint64(X * Y), uint64(Y * Z)
    for y in range(t * Y // nt, (t + 1) * Y // nt):
        yx, yz = uint64(y * X), uint64(y * Z)
        for xb in range(0, X, _RUN):
            xe = min(xb + _RUN, X)
            for z in range(uint64(Z)):
                d = z * XY + yx
                for x in range(uint64(xb), uint64(xe)):
                    dst[d + x] = src[x * YZ + yz + z]


class LayoutKernels:
    """The host side of the layout change, mixed into `CPUBackend` (the direct and per-pixel convolutions
    use it)."""

    def _swap_outer(self, a, x, y, z):
        """a as (x, y, z) -> (z, y, x), flat and contiguous: filters (K, C, kh*kw) <-> (kh*kw, C, K)."""
        src = self._c(a).reshape(-1)
        out = np.empty(src.size, self.dtype)
        POOL.run(swap_outer, self._nt(src.size), src, out, x, y, z)
        return out
