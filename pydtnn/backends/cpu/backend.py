"""The CPU backend: NumPy arrays, internal layout NHWC, BLAS (OpenBLAS) + numba kernels.

Design:
- NHWC keeps channels contiguous, so a convolution is a GEMM that reduces over contiguous channels and
  element-wise kernels vectorize over channels.
- Heavy kernels are serial numba functions (`cache=True`, `nogil=True`, compiled once per dtype and
  cached on disk), split in parts run by a small thread pool (`runtime.threads`). Convolutions call
  single-threaded BLAS from inside, chunk by chunk, on small packed buffers that stay in cache: one
  thread pool, no im2col matrix in memory (`conv` has the algorithm). The thread count follows
  OpenBLAS's (so `threadpoolctl` limits apply to these kernels too) unless `num_threads` is set
  (`parts.default_threads`).
- Where NumPy's BLAS cannot be called from numba (NumPy linked to another BLAS), convolutions fall back
  to plain NumPy (`numpy_conv`): correct, slower.
- `ctx` of a convolution keeps only a reference to its input; pooling keeps the arg-max taps (int32);
  batch normalization keeps the input and its per-channel statistics.

Where the code is: each kernel family has one module (`conv`, `layout`, `pool`, `norm`, `elementwise`, `rows`,
`softmax`, `attention`, `matmul`, `special`) holding its numba kernels and, at its end, their host side: a
mixin class (`PoolingKernels`...) whose methods check shapes, allocate and launch the parts. The GPU backend
names a family it has too by the same module and class (`cpu/norm.py` and `gpu/norm.py` both hold
`BatchNormKernels`). The convolutions' mixin, `conv.ConvKernels` (`conv2d_*`), chooses a call's path and
inherits the host sides of the paths, one module each: `conv` (direct), `depthwise`, `winograd`, `pixels`,
`planes`, `pointwise`, `numpy_conv`. `CPUBackend` inherits the families' mixins and keeps what they share:
the backend's state (dtype, thread settings, scratch buffers) and a kernel's thread count (`_nt`). `optim`
(the fused optimizer updates) is called by `pydtnn.optimizers`, not through the backend. A new kernel goes in
its family's module (kernel and host method; a new family: a new module and mixin, added to `CPUBackend`'s
bases), and its signature with a NumPy reference in `pydtnn.backends.contract`.
"""
from __future__ import annotations

import numpy as np

from pydtnn.backends.contract import Backend, parse_dtype
from pydtnn.backends.cpu.attention import AttentionKernels
from pydtnn.backends.cpu.conv import ConvKernels
from pydtnn.backends.cpu.elementwise import ElementwiseKernels
from pydtnn.backends.cpu.layout import LayoutKernels
from pydtnn.backends.cpu.matmul import MatmulKernels
from pydtnn.backends.cpu.norm import BatchNormKernels
from pydtnn.backends.cpu.parts import PARALLEL_MIN, default_threads
from pydtnn.backends.cpu.pool import PoolingKernels
from pydtnn.backends.cpu.rows import RowKernels
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu.runtime import heap as _cpu_heap
from pydtnn.backends.cpu.softmax import SoftmaxKernels
from pydtnn.backends.cpu.special import SpecialKernels
from pydtnn.errors import ConfigError, ShapeError

CONV_ALGORITHMS = ("auto", "direct", "winograd")


class CPUBackend(ConvKernels, LayoutKernels, PoolingKernels, BatchNormKernels, ElementwiseKernels, RowKernels,
                 SoftmaxKernels, AttentionKernels, MatmulKernels, SpecialKernels, Backend):
    """NumPy/BLAS/numba kernels, NHWC inside, NCHW at the edges.

    `conv_algorithm`: "direct" (the row-tap kernels of `conv`), "winograd" (F(4x4, 3x3) for every
    3x3 stride-1 undilated dense convolution, direct for the others) or "auto" (Winograd where it
    measured faster: see `winograd.pays`)."""
    name = "cpu"
    layout = "NHWC"
    # The capabilities of the contract (`pydtnn.backends.contract`), both in `norm`: the batchnorm kernels
    # take relu=True and relu_y (a following ReLU in the same pass over memory), and known= (a dense
    # chain's moments summed before) with batchnorm_moments(ctx).
    fuses_relu = True
    reuses_bn_moments = True

    def __init__(self, dtype="float32", seed: int = 0, conv_algorithm: str = "auto"):
        if conv_algorithm not in CONV_ALGORITHMS:
            raise ConfigError(f"unknown conv_algorithm {conv_algorithm!r} for the cpu backend: choose "
                              f"{', '.join(repr(a) for a in CONV_ALGORITHMS)}")
        self.conv_algorithm = conv_algorithm
        self.xp = np
        self.dtype = parse_dtype(dtype, "cpu")
        self.rng = np.random.default_rng(seed)
        self.num_threads: int | None = None      # None: follow OpenBLAS's thread count
        self.use_blas_kernels = blas.GEMM_OK     # False: NumPy fallback for convolutions (also for tests)
        self._force_fold = False                 # tests/benchmarks: always use the im2col packing
        self._parallel_min = PARALLEL_MIN        # tests: 0 runs even tiny kernels on several threads
        self._force_kparts: int | None = None    # tests/benchmarks: the parts' channel split (grid_part)
        self._buffers: dict = {}                 # `_scratch`
        self._no_bias = np.empty(0, self.dtype)
        _cpu_heap.keep_heap()                    # freed arrays serve the next step's (no page faults)

    # --- arrays -------------------------------------------------------------------------------------
    def asarray(self, a):
        return np.ascontiguousarray(a, dtype=self.dtype)

    def to_numpy(self, a):
        return np.asarray(a)

    def read_scalars(self, values):
        """The step's scalars are host values already: no stacking on a device, one float64 array (the same
        values as the contract's stack, in a fraction of its time: this runs every step)."""
        return np.array([float(v) for v in values], dtype=np.float64)

    def to_internal(self, x_nchw):
        x = np.asarray(x_nchw)
        if x.ndim != 4:
            raise ShapeError(f"to_internal expects a 4-D NCHW array, got shape {x.shape}")
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=self.dtype)

    def to_user(self, x):
        x = np.asarray(x)
        if x.ndim != 4:
            raise ShapeError(f"to_user expects a 4-D NHWC array, got shape {x.shape}")
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    # --- what the kernel families share -------------------------------------------------------------
    def _c(self, a):
        return np.ascontiguousarray(a, dtype=self.dtype)

    def _vec(self, v):
        return np.ascontiguousarray(np.asarray(v).reshape(-1), dtype=self.dtype)

    def _nt(self, work: int = PARALLEL_MIN) -> int:
        """Threads for a kernel over `work` elements: `num_threads`, else OpenBLAS's thread count."""
        return default_threads(work, self.num_threads, self._parallel_min)

    def _scratch(self, name, size):
        """A flat buffer of at least `size` elements kept between calls (used within one call only): large
        fresh arrays cost a page fault per 4 KiB on first touch, about as much as the work on them."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = self._buffers[name] = np.empty(size, self.dtype)
        return buf[:size]

    def _kparts(self, rule, nt):
        """The channel split of a pass's parts (`parts.grid_part`): the rule's, or the one a test forces."""
        forced = self._force_kparts
        if forced is not None:
            return forced if nt % forced == 0 else 1
        return rule
