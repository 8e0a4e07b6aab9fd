"""CUDA kernels of the GPU backend: one CuPy RawModule, compiled once per (device, dtype), from the
sources of each kernel family (pool.py, norm.py, elementwise.py, random.py; `common` is their prelude).

Index arithmetic: every kernel over an array takes `idx32`, set by the caller when every index it computes
(inputs and outputs) is below 2**31; the kernels then divide in unsigned 32-bit, which is several times
cheaper on the GPU than the 64-bit divide they use otherwise (one body, templated on the index type).
tests/backends/test_gpu_backend.py checks every kernel against the CPU backend, on a device and, compiled as
C++ on the host, through the stand-in harness (tests/gpu_standin).
"""
from __future__ import annotations

import numpy as np

from pydtnn.backends.gpu.kernels import common, elementwise, norm, pool, random

_CTYPES = {"float32": "float", "float64": "double"}
_MODULES = {}
INDEX32_LIMIT = 2 ** 31      # every index below this: the kernels' 32-bit path (`idx32`)
BLOCK = 256                  # threads per block of the element-wise kernels
PLANE_CHUNK = 1024           # elements of one (n, c) plane a block takes in the plane-wise passes (norm.py)
SOURCE = common.SOURCE + pool.SOURCE + norm.SOURCE + elementwise.SOURCE + random.SOURCE


def module(cupy, dtype):
    """The RawModule of `SOURCE` for `dtype` (float32 / float64) on the current device, compiled once per
    process. Keyed by device too (a module's functions are loaded on the device current at compilation),
    and by the CuPy module itself (the test stand-in of CuPy compiles its own)."""
    name = np.dtype(dtype).name
    key = (id(cupy), int(cupy.cuda.Device().id), name)
    mod = _MODULES.get(key)
    if mod is None:
        mod = _MODULES[key] = cupy.RawModule(code=f"typedef {_CTYPES[name]} T;\n" + SOURCE)
    return mod


def index32(*sizes) -> np.int32:
    """The `idx32` argument: 1 when every size (so every index into those arrays) is below 2**31."""
    return np.int32(max(int(s) for s in sizes) < INDEX32_LIMIT)


def grid(total: int) -> int:
    """Blocks of `BLOCK` threads for a grid-stride loop over `total` elements."""
    return max(1, min(int(-(-total // BLOCK)), 65535 * 8))
