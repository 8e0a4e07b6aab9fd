"""How a CPU kernel's work is cut into parts: how many (`default_threads`, from the size of the work in
the units below) and which share part `t` of `nt` takes (`part_range`, `grid_part`, called inside the
kernels). The thread pool (`runtime.threads.POOL`) runs the parts; `CPUBackend._nt` asks
`default_threads` with the backend's own settings.
"""
from __future__ import annotations

import os

from numba import njit

from pydtnn.backends.cpu.jit import FAST
from pydtnn.backends.cpu.runtime import blas

# Below this many elements a kernel runs on the calling thread only. A hand-off to a worker cost ~15 us
# alone and 30-60 us inside a step when the workers took the GIL: measured then, the ViT's LayerNorm (65,536
# elements) and simplecnn's ReLU (200,704) ran slower at 2 threads than at 1 inside a step, its 16 x 16 x 16
# attention products did not gain. With GIL-free workers (`runtime.threads`) a 4,096-element ReLU costs 7 us
# more on 2 threads than on 1 (it was 23 us), but lowering this to 4,096 changed no step (simplecnn, the ViT:
# 1.00x). Cheap passes (ReLU, add, batch and layer normalization: 0.1-0.5 ns an element) count CHEAP
# elements as one; a matrix product counts one element per MACS_PER_ELEMENT multiply-adds.
PARALLEL_MIN = 32768
CHEAP = 8
MACS_PER_ELEMENT = 64
_CPUS = os.cpu_count() or 1


def default_threads(work: int, num_threads: int | None = None, parallel_min: int = PARALLEL_MIN) -> int:
    """Threads for a kernel over `work` elements: 1 below `parallel_min`, else `num_threads` or OpenBLAS's
    thread count (which threadpoolctl limits), at most 4 per core."""
    if work < parallel_min:
        return 1
    n = num_threads or blas.blas_threads() or _CPUS
    return max(1, min(int(n), 4 * _CPUS))


@njit(**FAST)
def part_range(t, nt, total):
    """[start, end) of part t of nt of `total` items, in equal contiguous ranges."""
    per = (total + nt - 1) // nt
    return t * per, min(total, (t + 1) * per)


@njit(**FAST)
def grid_part(t, nt, kparts, items, K):
    """Part t of nt: (first item, end item, k0, k1). The parts form a grid of nt // kparts item ranges
    by kparts ranges of output channels (k0 and k1 multiples of 8, so each range's loops start aligned)."""
    g = t // kparts
    q = t - g * kparts
    pc = nt // kparts
    per = (items + pc - 1) // pc
    k0 = (q * K // kparts) // 8 * 8
    k1 = K if q == kparts - 1 else ((q + 1) * K // kparts) // 8 * 8
    return g * per, min(items, (g + 1) * per), k0, k1
