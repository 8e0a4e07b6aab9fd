"""The numba compile options of the CPU kernels, the conventions every kernel module follows, and
`clear`, the one helper kernel they share.

- A kernel is a serial numba function that releases the GIL (`nogil`) and is compiled once per dtype,
  cached on disk (`cache`). It does part `t` of `nt` of the work (`parts.part_range`, `parts.grid_part`);
  the thread pool (`runtime.threads.POOL`) runs the parts.
- Arrays travel flat and C-contiguous, their dimensions as ints, so each kernel has one compiled signature
  per dtype; in images channels are innermost (NHWC), so the inner loops vectorize over them.
- Hot inner loops index flat arrays with UNSIGNED (uint64) offsets: with a computed signed index numba
  emits negative-index wraparound code that blocks vectorization (measured 2-10x slower). Mixing uint64
  and int64 in numba arithmetic gives float64, so offsets are converted whole.
- The host side of each kernel family (the backend methods that check shapes, allocate and launch the
  parts) is a mixin class in the family's module, which `backend.CPUBackend` inherits.
"""
from __future__ import annotations

from numba import njit, uint64

FAST = {"cache": True, "fastmath": True, "boundscheck": False, "nogil": True}
# no fast math: exact IEEE comparisons and roundings (e.g. max pooling's arg-max, libm's erfc)
IEEE = {"cache": True, "boundscheck": False, "nogil": True}
# fast math that still keeps NaN and inf (a ReLU must pass a NaN on, as NumPy's maximum does, so that a
# diverged run shows in its loss); reassociation lets sums vectorize
FAST_KEEP_NAN = {"cache": True, "boundscheck": False, "nogil": True,
                 "fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"}}


@njit(**FAST)
def clear(dst, d0, n):
    """dst[d0:d0 + n] = 0 (flat, unsigned offsets)."""
    du = uint64(d0)
    for q in range(uint64(n)):
        dst[du + q] = 0
