"""Special functions of the CPU backend, compiled with numba: erfc (GELU) in one pass, through libm's erfc.

The array-module formulas of `_special` evaluate every range on every element (about 60 array passes);
this is one loop calling the C library's erfc, parallel over parts (`_cpu_pool`).
"""
from __future__ import annotations

import math

from numba import njit

from pydtnn.backends._cpu_kernels import _part


@njit(cache=True, boundscheck=False, nogil=True)
def erfc(t, nt, x, out, n):
    i0, i1 = _part(t, nt, n)
    for i in range(i0, i1):
        out[i] = math.erfc(x[i])
