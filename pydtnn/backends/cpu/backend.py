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

Where the code is: each kernel family has one module (`conv`, `depthwise`, `winograd`, `pixels`, `planes`,
`pointwise`, `numpy_conv`, `layout`, `pool`, `norm`, `elementwise`, `rows`, `softmax`, `attention`, `matmul`,
`special`) holding its numba kernels and, at its end, their host side: a mixin class (`PoolingKernels`...)
whose methods check shapes, allocate and launch the parts. `CPUBackend` inherits them all and keeps what
they share: the backend's state (dtype, thread settings, scratch buffers), a kernel's thread count
(`_nt`), and the choice of a convolution's path (`conv2d_*`). `optim` (the fused optimizer updates) is
called by `pydtnn.optimizers`, not through the backend. A new kernel goes in its family's module (kernel
and host method; a new family: a new module and mixin, added to `CPUBackend`'s bases), and its signature
with a NumPy reference in `pydtnn.backends.contract`.
"""
from __future__ import annotations

import numpy as np

from pydtnn.backends.contract import Backend, ConvSpec, parse_dtype
from pydtnn.backends.cpu import planes
from pydtnn.backends.cpu import winograd as wino
from pydtnn.backends.cpu.attention import AttentionKernels
from pydtnn.backends.cpu.conv import DirectConvKernels
from pydtnn.backends.cpu.depthwise import DepthwiseConvKernels
from pydtnn.backends.cpu.elementwise import ElementwiseKernels
from pydtnn.backends.cpu.layout import LayoutKernels
from pydtnn.backends.cpu.matmul import MatmulKernels
from pydtnn.backends.cpu.norm import BatchNormKernels
from pydtnn.backends.cpu.numpy_conv import NumpyConvKernels
from pydtnn.backends.cpu.parts import PARALLEL_MIN, default_threads
from pydtnn.backends.cpu.pixels import PixelsConvKernels
from pydtnn.backends.cpu.planes import PlanesConvKernels
from pydtnn.backends.cpu.pointwise import PointwiseConvKernels
from pydtnn.backends.cpu.pool import PoolingKernels
from pydtnn.backends.cpu.rows import RowKernels
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu.runtime import heap as _cpu_heap
from pydtnn.backends.cpu.softmax import SoftmaxKernels
from pydtnn.backends.cpu.special import SpecialKernels
from pydtnn.backends.cpu.winograd import WinogradConvKernels
from pydtnn.errors import ConfigError, ShapeError

# `_pointwise`: 1x1 convolutions on images of at most this many pixels (4x4) run as one whole-batch GEMM
# (measured 1.3-7x faster on 4x4 and 2x2 images, mixed on 8x8, slower on 32x32)
_POINTWISE_MAX_HW = 16
# Output images of at most this many pixels run as one GEMM per (pixel, tap) (`pixels`): VGG-11's
# 512 -> 512 on 2x2 images, forward / backward data / backward weights at 1 thread 16.7 / 15.5 / 16.2 ms
# packed, 12.5 / 13.5 / 12.1 per pixel; at 2 threads 9.2 / 9.5 / 11.6 and 6.9 / 7.4 / 6.9.
_PIXELS_MAX_HW = 4

CONV_ALGORITHMS = ("auto", "direct", "winograd")


class CPUBackend(DirectConvKernels, DepthwiseConvKernels, WinogradConvKernels, PixelsConvKernels,
                 PlanesConvKernels, PointwiseConvKernels, NumpyConvKernels, LayoutKernels, PoolingKernels,
                 BatchNormKernels, ElementwiseKernels, RowKernels, SoftmaxKernels, AttentionKernels,
                 MatmulKernels, SpecialKernels, Backend):
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

    # --- convolution: which path runs it ----------------------------------------------------------
    # The three passes check the paths in their own orders (e.g. backward weights asks for the NumPy
    # fallback before the plane kernels); each path's host side is its module's mixin.
    def _conv_geometry(self, x, spec: ConvSpec, what):
        self._check4(x, what)
        n, h, w, c = x.shape
        if c != spec.in_channels:
            raise ShapeError(f"{what}: input has {c} channels, the convolution expects {spec.in_channels}")
        ho, wo = self._out_hw(spec, h, w, what)
        return n, h, w, c, ho, wo

    def _is_depthwise(self, spec: ConvSpec) -> bool:
        if spec.groups == 1:
            return False
        if spec.groups == spec.in_channels and spec.out_channels == spec.in_channels:
            return True
        raise ConfigError(f"unsupported convolution groups={spec.groups} (in_channels={spec.in_channels}, "
                          f"out_channels={spec.out_channels}): use 1, or depthwise (groups == in == out)")

    def _pointwise(self, spec: ConvSpec, ho, wo) -> bool:
        """A 1x1 stride-1 convolution on small images: one GEMM over the whole batch's pixels (`pointwise`)."""
        (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
        return (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and spec.groups == 1 and ho * wo <= _POINTWISE_MAX_HW

    def _pixels(self, spec: ConvSpec, ho, wo) -> bool:
        """Tiny images: one GEMM per (output pixel, tap inside the image), no packing (`pixels`)."""
        return spec.groups == 1 and ho * wo <= _PIXELS_MAX_HW

    def _planes(self, spec: ConvSpec) -> bool:
        """Very few channels: the BLAS-free plane kernels (`planes`), unless Winograd is forced."""
        return planes.applies(spec) and not (self.conv_algorithm == "winograd" and wino.applies(spec))

    def _winograd(self, spec: ConvSpec, h, w) -> bool:
        """Whether this convolution runs as Winograd F(4x4, 3x3) (`winograd`)."""
        if self.conv_algorithm == "direct" or not self.use_blas_kernels or not wino.applies(spec):
            return False
        return self.conv_algorithm == "winograd" or wino.pays(spec, h, w)

    def conv2d_forward(self, x, w, b, spec: ConvSpec):
        x = self._c(x)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_forward")
        bias = self._c(b).reshape(-1) if b is not None else np.empty(0, self.dtype)
        y = np.empty((n, ho, wo, spec.out_channels), self.dtype)
        if self._is_depthwise(spec):
            self._depthwise_forward(x, w, bias, y, spec)
        elif self._planes(spec):
            self._planes_forward(x, w, bias, y, spec)
        elif not self.use_blas_kernels:
            self._numpy_forward(x, w, bias, y, spec)
        elif self._winograd(spec, h, wd):
            self._winograd_forward(x, w, bias, y, spec)
        elif self._pointwise(spec, ho, wo):
            self._pointwise_forward(x, w, bias, y, spec)
        elif self._pixels(spec, ho, wo):
            self._pixels_forward(x, w, bias, y, spec)
        else:
            self._direct_forward(x, w, bias, y, spec)
        return y, (x,)

    def conv2d_backward_data(self, dy, w, ctx, spec: ConvSpec):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_data")
        k = spec.out_channels
        if dy.shape != (n, ho, wo, k):
            raise ShapeError(f"conv2d_backward_data: dy has shape {dy.shape}, expected {(n, ho, wo, k)}")
        dx = np.empty_like(x)
        w = np.asarray(w)
        if self._is_depthwise(spec):
            return self._depthwise_backward_data(dy, w, dx, spec)
        if self._planes(spec) and planes.backward_data_applies(spec):
            return self._planes_backward_data(dy, w, dx, spec)
        if not self.use_blas_kernels:
            return self._numpy_backward_data(dy, w, dx, spec)
        if self._pointwise(spec, ho, wo):
            return self._pointwise_backward_data(dy, w, dx, spec)
        if self._pixels(spec, ho, wo):
            return self._pixels_backward_data(dy, w, dx, spec)
        if self._winograd(spec, h, wd):
            return self._winograd_backward_data(dy, w, dx, spec)
        return self._direct_backward_data(dy, w, dx, spec)

    def conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool, out=None):
        return self.into(self._conv2d_backward_weights(dy, ctx, spec, with_bias), out)

    def _conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_weights")
        k = spec.out_channels
        if dy.shape != (n, ho, wo, k):
            raise ShapeError(f"conv2d_backward_weights: dy has shape {dy.shape}, expected {(n, ho, wo, k)}")
        if self._is_depthwise(spec):
            return self._depthwise_backward_weights(x, dy, spec, with_bias)
        if not self.use_blas_kernels:
            return self._numpy_backward_weights(x, dy, spec, with_bias)
        if self._winograd(spec, h, wd):
            return self._winograd_backward_weights(x, dy, spec, with_bias)
        if self._pointwise(spec, ho, wo):
            return self._pointwise_backward_weights(x, dy, spec, with_bias)
        if self._planes(spec):
            return self._planes_backward_weights(x, dy, spec, with_bias)
        if self._pixels(spec, ho, wo):
            return self._pixels_backward_weights(x, dy, spec, with_bias)
        return self._direct_backward_weights(x, dy, spec, with_bias)
