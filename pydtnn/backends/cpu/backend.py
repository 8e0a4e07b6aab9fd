"""The CPU backend: NumPy arrays, internal layout NHWC, BLAS (OpenBLAS) + numba kernels.

Design (see `_cpu_conv` for the convolution algorithm):
- NHWC keeps channels contiguous, so a convolution is a GEMM that reduces over contiguous channels and
  element-wise kernels vectorize over channels.
- Heavy kernels are serial numba functions (`cache=True`, `nogil=True`, compiled once per dtype and
  cached on disk), split in parts run by a small thread pool (`_cpu_pool`). Convolutions call
  single-threaded BLAS from inside, chunk by chunk, on small packed buffers that stay in cache: one
  thread pool, no im2col matrix in memory. The thread count follows OpenBLAS's (so `threadpoolctl`
  limits apply to these kernels too) unless `num_threads` is set.
- Where NumPy's BLAS cannot be called from numba (NumPy linked to another BLAS), convolutions fall back
  to plain NumPy (`sliding_window_view` + `tensordot`): correct, slower.
- `ctx` of a convolution keeps only a reference to its input; pooling keeps the arg-max taps (int32);
  batch normalization keeps the input and its per-channel statistics.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from pydtnn.backends import Backend, ConvSpec, PoolSpec, parse_dtype
from pydtnn.backends.cpu import attention as katt
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu import conv as kc
from pydtnn.backends.cpu.runtime import heap as _cpu_heap
from pydtnn.backends.cpu import kernels as kp
from pydtnn.backends.cpu import layout as klayout
from pydtnn.backends.cpu import matmul as kmm
from pydtnn.backends.cpu import rows as krows
from pydtnn.backends.cpu import softmax as ksm
from pydtnn.backends.cpu import special as kspecial
from pydtnn.backends.cpu import pixels as kpix
from pydtnn.backends.cpu import planes
from pydtnn.backends.cpu import winograd as wino
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.errors import ConfigError, ShapeError

# Row blocks: aim for about this many output pixels per packed GEMM (the packed block stays in L2), and
# at most this many packed elements per block.
_TARGET_ROWS = 512
_BUF_ELEMS = 1 << 21
# Backward weights takes half: its GEMMs reduce over the block's rows and accumulate into the thread's
# dW, and 16 -> 16 channels on 32x32 images ran 1.25x faster with 256 (other ResNet-20 shapes: +-5%).
_TARGET_ROWS_BWD_W = 256

# The im2col variant ("fold": all kernel taps in one GEMM per block, blocks spanning images) packs kh times
# more than row-tap. Row-tap won on every ResNet-20 and MNIST shape, even with 1 or 3 input channels, but
# its per-image GEMMs get thin on small images: fold wins there once there are enough output channels
# (K) for the packing to be cheap against the GEMM (measured: AlexNet-CIFAR 4x4 and 8x8 layers with
# K >= 192 ran 1.2-1.7x faster folded, ResNet-20's 8x8 K=64 layers 1.3x slower).


def _use_fold(ho, wo, k) -> bool:
    return (ho * wo <= 64 and k >= 128) or (ho * wo <= 16 and k >= 32)


# Below this many elements a kernel runs on the calling thread only. A hand-off to a worker cost ~15 us
# alone and 30-60 us inside a step when the workers took the GIL: measured then, the ViT's LayerNorm (65,536
# elements) and simplecnn's ReLU (200,704) ran slower at 2 threads than at 1 inside a step, its 16 x 16 x 16
# attention products did not gain. With GIL-free workers (`_cpu_pool`) a 4,096-element ReLU costs 7 us more
# on 2 threads than on 1 (it was 23 us), but lowering this to 4,096 changed no step (simplecnn, the ViT:
# 1.00x). Cheap passes (ReLU, add, batch and layer normalization: 0.1-0.5 ns an element) count _CHEAP
# elements as one; a matrix product counts one element per _MACS_PER_ELEMENT multiply-adds.
_PARALLEL_MIN = 32768
_CHEAP = 8
# LayerNorm makes three passes over each row (two sums, then the output): 2 elements count as one unit. The
# ViT's 1088 x 64 rows then run in 2 parts: 39 -> 27 us alone, the 2-thread step 7.21 -> 7.14 ms (alternated
# in one process, 8 rounds, every round faster); as a cheap pass (8 elements a unit) they ran on one thread.
_LAYERNORM = 2
_MACS_PER_ELEMENT = 64
# `_pointwise`: 1x1 convolutions on images of at most this many pixels (4x4) run as one whole-batch GEMM
# (measured 1.3-7x faster on 4x4 and 2x2 images, mixed on 8x8, slower on 32x32)
_POINTWISE_MAX_HW = 16
# Output images of at most this many pixels run as one GEMM per (pixel, tap) (`_cpu_pixels`): VGG-11's
# 512 -> 512 on 2x2 images, forward / backward data / backward weights at 1 thread 16.7 / 15.5 / 16.2 ms
# packed, 12.5 / 13.5 / 12.1 per pixel; at 2 threads 9.2 / 9.5 / 11.6 and 6.9 / 7.4 / 6.9.
_PIXELS_MAX_HW = 4
_CPUS = os.cpu_count() or 1


def default_threads(work: int, num_threads: int | None = None, parallel_min: int = _PARALLEL_MIN) -> int:
    """Threads for a kernel over `work` elements: 1 below `parallel_min`, else `num_threads` or OpenBLAS's
    thread count (which threadpoolctl limits), at most 4 per core."""
    if work < parallel_min:
        return 1
    n = num_threads or blas.blas_threads() or _CPUS
    return max(1, min(int(n), 4 * _CPUS))


_warned = []


def _warn_fallback():
    if not blas.GEMM_OK and not _warned:
        _warned.append(True)
        warnings.warn("pydtnn cpu backend: NumPy's BLAS is not the OpenBLAS of NumPy's wheels, so convolutions "
                      "use a plain NumPy path (correct but several times slower)", RuntimeWarning, stacklevel=3)


CONV_ALGORITHMS = ("auto", "direct", "winograd")


class CPUBackend(Backend):
    """NumPy/BLAS/numba kernels, NHWC inside, NCHW at the edges.

    `conv_algorithm`: "direct" (the row-tap kernels of `_cpu_conv`), "winograd" (F(4x4, 3x3) for every
    3x3 stride-1 undilated dense convolution, direct for the others) or "auto" (Winograd where it
    measured faster: see `_cpu_winograd.pays`)."""
    name = "cpu"
    layout = "NHWC"

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
        self._parallel_min = _PARALLEL_MIN       # tests: 0 runs even tiny kernels on several threads
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

    # --- helpers ------------------------------------------------------------------------------------
    def _c(self, a):
        return np.ascontiguousarray(a, dtype=self.dtype)

    def _nt(self, work: int = _PARALLEL_MIN) -> int:
        """Threads for a kernel over `work` elements: `num_threads`, else OpenBLAS's thread count."""
        return default_threads(work, self.num_threads, self._parallel_min)

    # --- convolution --------------------------------------------------------------------------------
    def _swap_outer(self, a, x, y, z):
        """a as (x, y, z) -> (z, y, x), flat and contiguous: filters (K, C, kh*kw) <-> (kh*kw, C, K)."""
        src = self._c(a).reshape(-1)
        out = np.empty(src.size, self.dtype)
        POOL.run(klayout.swap_outer, self._nt(src.size), src, out, x, y, z)
        return out

    def _conv_plan(self, spec: ConvSpec, n, h, w, c, k, ho, wo, target_rows=_TARGET_ROWS):
        """(rb, fold, direct, bufsize, nt) of the fused kernel for this geometry."""
        (kh, kw), (sh, sw), (ph, pw), (dh, _) = spec.kernel, spec.stride, spec.padding, spec.dilation
        direct = kh == 1 and kw == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0
        fold = (bool(self._force_fold) or _use_fold(ho, wo, k)) and not direct
        nt = self._nt(n * max(h * w * c, ho * wo * k))
        rows = n * ho if fold else ho          # fold blocks run over (image, row); row-tap blocks within an image
        L = kw * c
        per_row = wo * (kh * L if fold else min(sh, (kh - 1) * dh + 1) * L)   # packed elements per output row
        rb = max(1, min(rows, -(-target_rows // wo), _BUF_ELEMS // per_row))
        # keep enough items to feed every thread
        while rb > 1 and (1 if fold else n) * (-(-rows // rb)) < 2 * nt:
            rb = -(-rb // 2)
        if direct:
            bufsize = 1
        elif fold:
            bufsize = rb * wo * kh * L
        else:
            nph = min(sh, (kh - 1) * dh + 1)
            qext = ((kh - 1) * dh) // sh
            bufsize = nph * (rb + qext) * wo * L
        return rb, fold, direct, bufsize, nt

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

    def conv2d_forward(self, x, w, b, spec: ConvSpec):
        x = self._c(x)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_forward")
        k = spec.out_channels
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        bias = self._c(b).reshape(-1) if b is not None else np.empty(0, self.dtype)
        y = np.empty((n, ho, wo, k), self.dtype)
        if self._is_depthwise(spec):
            wt = self._c(np.asarray(w)[:, 0].transpose(1, 2, 0))           # (kh, kw, C)
            POOL.run(kc.dw_fwd, self._nt(y.size), x.reshape(-1), wt.reshape(-1), bias, y.reshape(-1),
                     n, h, wd, c, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw)
            return y, (x,)
        if self._planes(spec):
            POOL.run(planes.fwd, self._nt(y.size), x.reshape(-1), self._c(w), bias, y.reshape(-1),
                     n, h, wd, c, k, ho, wo, kh, kw, ph, pw, dh, dw)
            return y, (x,)
        if not self.use_blas_kernels:
            _warn_fallback()
            y[...] = np.tensordot(self._windows(x, spec, ho, wo), self._c(w), axes=([3, 4, 5], [1, 2, 3]))
            if b is not None:
                y += bias
            return y, (x,)
        if self._winograd(spec, h, wd):
            self._wino_fwd(x, self._wino_filters(w), bias, y, spec.padding)
            return y, (x,)
        if self._pointwise(spec, ho, wo):
            self.matmul(x.reshape(-1, c), self._c(np.asarray(w)[:, :, 0, 0]).T, out=y.reshape(-1, k))
            if b is not None:
                y += bias
            return y, (x,)
        wt = self._swap_outer(w, k, c, kh * kw)                             # (kh, kw, C, K)
        if self._pixels(spec, ho, wo):
            with blas.blas_single_thread():
                POOL.run(kpix.fwd, self._nt(y.size), blas.gemm_ptr(self.dtype), x.reshape(-1), wt, bias,
                         y.reshape(-1), n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw)
            return y, (x,)
        self._conv_fwd_core(x, wt, bias, y, spec, n, h, wd, c, k, ho, wo)
        return y, (x,)

    def _pointwise(self, spec: ConvSpec, ho, wo) -> bool:
        """A 1x1 stride-1 convolution on small images: one GEMM over the whole batch's pixels. The row
        blocks of `_cpu_conv` stay within an image, and on 2x2 or 4x4 images each block's thin GEMM reads
        all the weights again (MobileNet's 1024 -> 1024 on 2x2: 13 GFLOP/s)."""
        (kh, kw), (sh, sw), (ph, pw) = spec.kernel, spec.stride, spec.padding
        return (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0) and spec.groups == 1 and ho * wo <= _POINTWISE_MAX_HW

    def _pixels(self, spec: ConvSpec, ho, wo) -> bool:
        """Tiny images: one GEMM per (output pixel, tap inside the image), no packing (`_cpu_pixels`)."""
        return spec.groups == 1 and ho * wo <= _PIXELS_MAX_HW

    def _planes(self, spec: ConvSpec) -> bool:
        """Very few channels: the BLAS-free plane kernels (`_cpu_planes`), unless Winograd is forced."""
        return planes.applies(spec) and not (self.conv_algorithm == "winograd" and wino.applies(spec))

    # --- Winograd (3x3, stride 1) ------------------------------------------------------------------
    def _winograd(self, spec: ConvSpec, h, w) -> bool:
        """Whether this convolution runs as Winograd F(4x4, 3x3)."""
        if self.conv_algorithm == "direct" or not self.use_blas_kernels or not wino.applies(spec):
            return False
        return self.conv_algorithm == "winograd" or wino.pays(spec, h, w)

    def _wino_filters(self, w, flipped=False):
        """U = G g G^T of every filter (of the flipped, channel-swapped ones: backward data), threaded."""
        u_size = (wino.TILE + 2) ** 2 * w.shape[0] * w.shape[1]
        return wino.filter_transform(w, wino.TILE, self.dtype, self._nt(u_size), flipped, POOL.run,
                                     self._scratch("winograd_u", u_size))

    def _scratch(self, name, size):
        """A flat buffer of at least `size` elements kept between calls (used within one call only): large
        fresh arrays cost a page fault per 4 KiB on first touch, about as much as the work on them."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = self._buffers[name] = np.empty(size, self.dtype)
        return buf[:size]

    def _kparts(self, rule, nt):
        """The channel split of a pass's parts (`kc.grid_part`): the rule's, or the one a test forces."""
        forced = self._force_kparts
        if forced is not None:
            return forced if nt % forced == 0 else 1
        return rule

    def _wino_fwd(self, x, u, bias, y, padding):
        n, h, wd, c = x.shape
        _, ho, wo, k = y.shape
        m = wino.TILE
        tb = wino.chunk_tiles(c, k)
        nt = self._nt(max(x.size, y.size))
        kp = self._kparts(wino.kparts(wino.tiles(n, ho, wo), tb, c, k, nt, False), nt)
        with blas.blas_single_thread():
            POOL.run(wino.fwd, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), u.reshape(-1), bias, y.reshape(-1),
                     n, h, wd, c, k, ho, wo, padding[0], padding[1], m, tb, kp)

    def _wino_bwd_w(self, x, dy, spec: ConvSpec, with_bias):
        n, h, wd, c = x.shape
        _, ho, wo, k = dy.shape
        m = wino.TILE
        a = m + 2
        nt = self._nt(max(x.size, dy.size))
        kp = self._kparts(wino.kparts(wino.tiles(n, ho, wo), wino.chunk_tiles(c, k), c, k, nt, True), nt)
        groups = nt // kp                       # one accumulator per range of chunks
        acc = self._scratch("winograd_du", groups * a * a * c * k).reshape(groups, -1)
        acc.fill(0)
        dbacc = np.zeros((nt, k), self.dtype)
        with blas.blas_single_thread():
            POOL.run(wino.bwd_w, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1), acc, dbacc,
                     n, h, wd, c, k, ho, wo, spec.padding[0], spec.padding[1], m, wino.chunk_tiles(c, k), with_bias,
                     kp)
        db = dbacc.sum(axis=0)
        dw = wino.weight_grad_transform(acc, m, k, c, self.dtype, self._nt(acc.size), POOL.run)   # sums the parts
        return dw, (db if with_bias else None)

    def _conv_fwd_core(self, x, wt, bias, y, spec, n, h, wd, c, k, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        rb, fold, direct, bufsize, nt = self._conv_plan(spec, n, h, wd, c, k, ho, wo)
        with blas.blas_single_thread():
            POOL.run(kc.conv_fwd, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), wt, bias, y.reshape(-1),
                     n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb, fold, direct, bufsize)

    def conv2d_backward_data(self, dy, w, ctx, spec: ConvSpec):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_data")
        k = spec.out_channels
        if dy.shape != (n, ho, wo, k):
            raise ShapeError(f"conv2d_backward_data: dy has shape {dy.shape}, expected {(n, ho, wo, k)}")
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        dx = np.empty_like(x)
        w = np.asarray(w)
        if self._is_depthwise(spec):
            wt = self._c(w[:, 0].transpose(1, 2, 0))
            POOL.run(kc.dw_bwd_data, self._nt(dx.size), dy.reshape(-1), wt.reshape(-1), dx.reshape(-1),
                     n, h, wd, c, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw)
            return dx
        if self._planes(spec) and dh * (kh - 1) >= ph and dw * (kw - 1) >= pw:
            # dx = conv(dy, flipped filter with in/out channels swapped), "full" padding
            tspec = ConvSpec(k, c, (kh, kw), (1, 1), (dh * (kh - 1) - ph, dw * (kw - 1) - pw), (dh, dw))
            wf = self._c(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
            POOL.run(planes.fwd, self._nt(dx.size), dy.reshape(-1), wf, np.empty(0, self.dtype), dx.reshape(-1),
                     n, ho, wo, k, c, h, wd, kh, kw, *tspec.padding, dh, dw)
            return dx
        if not self.use_blas_kernels:
            return self._bwd_data_numpy(dy, self._c(w), spec, x.shape, ho, wo)
        if self._pointwise(spec, ho, wo):
            self.matmul(dy.reshape(-1, k), self._c(w[:, :, 0, 0]), out=dx.reshape(-1, c))
            return dx
        if self._pixels(spec, ho, wo):
            with blas.blas_single_thread():
                POOL.run(kpix.bwd_data, self._nt(dx.size), blas.gemm_ptr(self.dtype), dy.reshape(-1),
                         self._swap_outer(w, k, c, kh * kw), dx.reshape(-1), n, h, wd, c, k, ho, wo,
                         kh, kw, sh, sw, ph, pw, dh, dw)
            return dx
        pth, ptw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
        if self._winograd(spec, h, wd):
            # dx = conv(dy, flipped filter with in/out channels swapped), padding 2 - p (negative: a crop)
            u = self._wino_filters(w, flipped=True)
            self._wino_fwd(dy, u, np.empty(0, self.dtype), dx, (pth, ptw))
            return dx
        if sh == 1 and sw == 1 and pth >= 0 and ptw >= 0:
            # stride 1: dx = conv(dy, flipped kernel with in/out channels swapped), "full" padding
            tspec = ConvSpec(k, c, (kh, kw), (1, 1), (pth, ptw), (dh, dw))
            wt = self._c(w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)).reshape(-1)   # (kh, kw, K, C)
            self._conv_fwd_core(dy, wt, np.empty(0, self.dtype), dx, tspec, n, ho, wo, k, c, h, wd)
            return dx
        wt = self._swap_outer(w, k, c, kh * kw)                             # (kh, kw, C, K)
        rb = max(1, min(ho, -(-_TARGET_ROWS // wo), _BUF_ELEMS // (wo * kh * kw * c)))
        with blas.blas_single_thread():
            POOL.run(kc.conv_bwd_data_scatter, self._nt(dx.size), blas.gemm_ptr(self.dtype), dy.reshape(-1), wt,
                     dx.reshape(-1), n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb)
        return dx

    def conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_weights")
        k = spec.out_channels
        if dy.shape != (n, ho, wo, k):
            raise ShapeError(f"conv2d_backward_weights: dy has shape {dy.shape}, expected {(n, ho, wo, k)}")
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        if self._is_depthwise(spec):
            nt = self._nt(dy.size)
            acc = np.zeros((nt, kh * kw * c), self.dtype)
            dbacc = np.zeros((nt, c), self.dtype)
            POOL.run(kc.dw_bwd_w, nt, x.reshape(-1), dy.reshape(-1), acc, dbacc, n, h, wd, c, ho, wo,
                     kh, kw, sh, sw, ph, pw, dh, dw, with_bias)
            dwt, db = acc.sum(axis=0), dbacc.sum(axis=0)
            dwu = np.ascontiguousarray(dwt.reshape(kh, kw, c).transpose(2, 0, 1))[:, None]
            return dwu, (db if with_bias else None)
        if not self.use_blas_kernels:
            dwu = np.tensordot(dy, self._windows(x, spec, ho, wo), axes=([0, 1, 2], [0, 1, 2]))
            db = dy.reshape(-1, k).sum(axis=0) if with_bias else None
            return np.ascontiguousarray(dwu, dtype=self.dtype), db
        if self._winograd(spec, h, wd):
            return self._wino_bwd_w(x, dy, spec, with_bias)
        if self._pointwise(spec, ho, wo):
            dy2 = dy.reshape(-1, k)
            dwu = self.matmul(dy2.T, x.reshape(-1, c)).reshape(k, c, 1, 1)
            return dwu, (dy2.sum(axis=0) if with_bias else None)
        if self._planes(spec):
            nt = self._nt(dy.size)
            acc = np.zeros((nt, k, c, kh, kw))
            dbacc = np.zeros((nt, k))
            POOL.run(planes.bwd_w, nt, x.reshape(-1), dy.reshape(-1), acc, dbacc, n, h, wd, c, k, ho, wo,
                     kh, kw, ph, pw, dh, dw, with_bias)
            db = dbacc.sum(axis=0).astype(self.dtype) if with_bias else None
            return acc.sum(axis=0).astype(self.dtype), db
        if self._pixels(spec, ho, wo):
            dwt = np.zeros(kh * kw * c * k, self.dtype)
            db = np.zeros(k, self.dtype)
            with blas.blas_single_thread():
                POOL.run(kpix.bwd_w, self._nt(dy.size), blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1),
                         dwt, db, n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias)
            return self._swap_outer(dwt, kh * kw, c, k).reshape(k, c, kh, kw), (db if with_bias else None)
        rb, fold, direct, bufsize, nt = self._conv_plan(spec, n, h, wd, c, k, ho, wo, _TARGET_ROWS_BWD_W)
        kp = self._kparts(kc.weight_kparts(n * ho * wo, kh * kw * c, k, nt), nt)
        groups = nt // kp                       # one accumulator per range of rows
        acc = np.zeros((groups, kh * kw * c * k), self.dtype)
        dbacc = np.zeros((nt, k), self.dtype)
        with blas.blas_single_thread():
            POOL.run(kc.conv_bwd_w, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1), acc, dbacc,
                     n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb, fold, direct, bufsize, with_bias,
                     kp)
        dwt, db = (acc[0], dbacc[0]) if nt == 1 else (acc.sum(axis=0), dbacc.sum(axis=0))
        dwu = self._swap_outer(dwt, kh * kw, c, k).reshape(k, c, kh, kw)
        return dwu, (db if with_bias else None)

    # NumPy fallback (no callable BLAS): windows view (N, Ho, Wo, C, kh, kw) of the padded input
    def _windows(self, x, spec: ConvSpec, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
        win = sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(1, 2))
        return win[:, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, :, ::dh, ::dw]

    def _bwd_data_numpy(self, dy, w, spec: ConvSpec, xshape, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        n, h, wd, c = xshape
        dcol = np.tensordot(dy, w, axes=([3], [0]))                          # (N, Ho, Wo, C, kh, kw)
        dxp = np.zeros((n, h + 2 * ph + sh, wd + 2 * pw + sw, c), self.dtype)
        for i in range(kh):
            for j in range(kw):
                dxp[:, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += dcol[..., i, j]
        return np.ascontiguousarray(dxp[:, ph:ph + h, pw:pw + wd])

    # --- pooling ------------------------------------------------------------------------------------
    def _pool_geometry(self, x, spec: PoolSpec, what):
        self._check4(x, what)
        n, h, w, c = x.shape
        if spec.kind not in ("max", "avg"):
            raise ConfigError(f"unknown pooling kind {spec.kind!r}: choose 'max' or 'avg'")
        ho, wo = self._out_hw(spec, h, w, what)
        return n, h, w, c, ho, wo

    def pool2d_forward(self, x, spec: PoolSpec):
        x = self._c(x)
        n, h, w, c, ho, wo = self._pool_geometry(x, spec, "pool2d_forward")
        (kh, kw), (sh, sw), (ph, pw) = spec.pool, spec.stride, spec.padding
        y = np.empty((n, ho, wo, c), self.dtype)
        nt = self._nt(x.size)
        if spec.kind == "avg" and (kh, kw) == (h, w) and ph == 0 and pw == 0:      # global: a reduction
            POOL.run(kp.global_avg_fwd, nt, x.reshape(-1), y.reshape(-1), n, h * w, c)
            return y, (x.shape, None)
        if spec.kind == "avg":
            POOL.run(kp.avgpool_fwd, nt, x.reshape(-1), y.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
            return y, (x.shape, None)
        idx = np.empty((n, ho, wo, c), np.int32)
        POOL.run(kp.maxpool_fwd, nt, x.reshape(-1), y.reshape(-1), idx.reshape(-1), n, h, w, c, ho, wo,
                 kh, kw, sh, sw, ph, pw)
        return y, (x.shape, idx)

    def pool2d_backward(self, dy, ctx, spec: PoolSpec):
        xshape, idx = ctx
        n, h, w, c = xshape
        (kh, kw), (sh, sw), (ph, pw) = spec.pool, spec.stride, spec.padding
        ho, wo = spec.output_hw(h, w)
        dy = self._c(dy)
        if dy.shape != (n, ho, wo, c):
            raise ShapeError(f"pool2d_backward: dy has shape {dy.shape}, expected {(n, ho, wo, c)}")
        dx = np.empty(xshape, self.dtype)
        nt = self._nt(dx.size)
        if spec.kind == "avg" and (kh, kw) == (h, w) and ph == 0 and pw == 0:
            POOL.run(kp.global_avg_bwd, nt, dy.reshape(-1), dx.reshape(-1), n, h * w, c)
        elif spec.kind == "avg":
            POOL.run(kp.avgpool_bwd, nt, dy.reshape(-1), dx.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
        else:
            POOL.run(kp.maxpool_bwd, nt, dy.reshape(-1), idx.reshape(-1), dx.reshape(-1), n, h, w, c, ho, wo,
                     kh, kw, sh, sw, ph, pw)
        return dx

    def erfc(self, x):
        x = self._c(x)
        out = np.empty_like(x)
        POOL.run(kspecial.erfc, self._nt(x.size), x.reshape(-1), out.reshape(-1), x.size)
        return out

    # --- GELU and last-axis LayerNorm (the sequence layers): one pass each way, numba ------------------
    def gelu_forward(self, x):
        """(y, ctx): ctx is GELU's derivative Phi(x) + x phi(x), written in the same pass (`_cpu_rows`)."""
        if x.dtype != self.dtype:
            y, (x, cdf) = super().gelu_forward(x)
            return y, cdf + x * np.exp(-0.5 * x * x) * x.dtype.type(krows._RSQRT2PI)
        x = self._c(x)
        y, dfac = np.empty_like(x), np.empty_like(x)
        kernel = krows.gelu32_fwd if x.dtype == np.float32 else krows.gelu_fwd      # float64: libm's erfc
        POOL.run(kernel, self._nt(x.size), x.reshape(-1), y.reshape(-1), dfac.reshape(-1), x.size)
        return y, dfac

    def gelu_backward(self, dy, ctx):
        dfac = ctx
        if dy.dtype != self.dtype or dy.shape != dfac.shape:
            return dy * dfac
        dy = self._c(dy)
        dx = np.empty_like(dy)
        POOL.run(krows.gelu_bwd, self._nt(dy.size // _CHEAP), dy.reshape(-1), dfac.reshape(-1), dx.reshape(-1),
                 dy.size)
        return dx

    def layernorm_forward(self, x, gamma, beta, eps: float):
        if x.dtype != self.dtype:
            return super().layernorm_forward(x, gamma, beta, eps)
        x = self._c(x)
        d = x.shape[-1]
        rows = x.size // d
        y, x_hat = np.empty_like(x), np.empty_like(x)
        inv_std = np.empty(rows, self.dtype)
        POOL.run(krows.layernorm_fwd, self._nt(x.size // _LAYERNORM), x.reshape(-1), self._vec(gamma), self._vec(beta),
                 y.reshape(-1), x_hat.reshape(-1), inv_std, rows, d, float(eps))
        return y, (x_hat, inv_std)

    def layernorm_backward(self, dy, ctx, gamma):
        x_hat, inv_std = ctx
        if dy.dtype != self.dtype or dy.shape != x_hat.shape or inv_std.ndim != 1:
            return super().layernorm_backward(dy, ctx, gamma)
        dy = self._c(dy)
        d = dy.shape[-1]
        rows = dy.size // d
        nt = self._nt(dy.size // _LAYERNORM)
        dgamma, dbeta = np.zeros((nt, d)), np.zeros((nt, d))
        dx = np.empty_like(dy)
        POOL.run(krows.layernorm_bwd, nt, dy.reshape(-1), x_hat.reshape(-1), inv_std, self._vec(gamma),
                 dx.reshape(-1), dgamma, dbeta, rows, d)
        return dx, dgamma.sum(axis=0).astype(self.dtype), dbeta.sum(axis=0).astype(self.dtype)

    # --- row softmax (attention, Softmax layers): fused numba kernels, in place -----------------------
    def softmax(self, s, causal=False):
        if s.dtype != self.dtype or not s.flags.c_contiguous:
            return super().softmax(s, causal)
        length = s.shape[-1]
        rows = s.size // length
        POOL.run(ksm.softmax_rows, self._nt(s.size), s.reshape(-1), rows, length, length if causal else 0)
        return s

    def softmax_backward(self, y, g):
        if g.dtype != self.dtype or not (g.flags.c_contiguous and y.flags.c_contiguous) or y.shape != g.shape:
            return super().softmax_backward(y, g)
        length = g.shape[-1]
        POOL.run(ksm.softmax_backward_rows, self._nt(g.size), y.reshape(-1), g.reshape(-1), g.size // length,
                 length)
        return g

    # --- attention: a (sample, head) pair's products and softmax in one part of the pool -------------
    def _fused_attention(self, *arrays) -> bool:
        return self.use_blas_kernels and all(a is None or (a.dtype == self.dtype and a.flags.c_contiguous)
                                             for a in arrays)

    def attention_forward(self, qkv, n, t, heads, causal=False, mask=None):
        if not self._fused_attention(qkv, mask):
            return super().attention_forward(qkv, n, t, heads, causal, mask)
        d = qkv.shape[1] // 3
        hd = d // heads
        attn = np.empty((n, heads, t, t), self.dtype)
        context = np.empty((n * t, d), self.dtype)
        nt = self._nt(n * heads * t * t * (2 * hd + 8) // _MACS_PER_ELEMENT)
        with blas.blas_single_thread():
            POOL.run(katt.attention_fwd, nt, blas.gemm_ptr(self.dtype), qkv.reshape(-1), attn.reshape(-1),
                     self._no_mask(mask), context.reshape(-1), n, t, heads, hd, bool(causal), 1 / math.sqrt(hd))
        return context, attn

    def attention_backward(self, dcontext, qkv, attn, mask, n, t, heads):
        if not self._fused_attention(dcontext, qkv, attn, mask):
            return super().attention_backward(dcontext, qkv, attn, mask, n, t, heads)
        d = qkv.shape[1] // 3
        hd = d // heads
        dqkv = np.empty_like(qkv)
        nt = self._nt(n * heads * t * t * (4 * hd + 8) // _MACS_PER_ELEMENT)
        with blas.blas_single_thread():
            POOL.run(katt.attention_bwd, nt, blas.gemm_ptr(self.dtype), qkv.reshape(-1), attn.reshape(-1),
                     self._no_mask(mask), dcontext.reshape(-1), dqkv.reshape(-1), n, t, heads, hd, 1 / math.sqrt(hd))
        return dqkv

    def _no_mask(self, mask):
        return np.empty(0, self.dtype) if mask is None else mask.reshape(-1)

    # --- ReLU -----------------------------------------------------------------------------------------
    def relu_forward(self, x):
        x = self._c(x)
        y = np.empty_like(x)
        POOL.run(kp.relu_fwd, self._nt(x.size // _CHEAP), x.reshape(-1), y.reshape(-1))
        return y

    def relu_backward(self, dy, y):
        dy = self._c(dy)
        dx = np.empty_like(dy)
        POOL.run(kp.relu_bwd, self._nt(dy.size // _CHEAP), dy.reshape(-1), self._c(y).reshape(-1), dx.reshape(-1))
        return dx

    def add(self, a, b, relu=False):
        a, b = self._c(a), self._c(b)
        if a.shape != b.shape:
            raise ShapeError(f"add: shapes {a.shape} and {b.shape} differ")
        y = np.empty_like(a)
        POOL.run(kp.add_fwd, self._nt(a.size // _CHEAP), a.reshape(-1), b.reshape(-1), y.reshape(-1), relu)
        return y

    # --- batch normalization ------------------------------------------------------------------------
    def _rows(self, a):
        """(flat, ld): a's rows of C = a.shape[-1] values, row r at flat[r * ld], without a copy where a is
        a channel slice of a C-contiguous array (a dense block's input or gradient); else a's copy, ld = C."""
        a = np.asarray(a)
        c = a.shape[-1] if a.ndim else 1
        if a.dtype == self.dtype and not a.flags.c_contiguous and a.ndim >= 2 and a.size and c:
            it, st = a.itemsize, a.strides
            even = all(st[d] == st[d + 1] * a.shape[d + 1] for d in range(a.ndim - 2))
            if st[-1] == it and st[-2] % it == 0 and st[-2] // it >= c and even:
                ld = st[-2] // it
                return as_strided(a, shape=((a.size // c - 1) * ld + c,), strides=(it,)), ld
        return self._c(a).reshape(-1), c

    def _bn_2d(self, x, gamma, what):
        x = np.asarray(x)
        if x.ndim not in (2, 4):
            raise ShapeError(f"{what} expects a 2-D (N, C) or 4-D NHWC array, got shape {x.shape}")
        c = x.shape[-1]
        if np.size(gamma) != c:
            raise ShapeError(f"{what}: input has {c} channels but gamma has {np.size(gamma)}")
        xf, ldx = self._rows(x)
        if ldx == c:                # contiguous: x itself, or its copy in the backend's dtype
            x = xf.reshape(x.shape)
        return x, xf, ldx, x.size // max(c, 1), c

    def _vec(self, v):
        return np.ascontiguousarray(np.asarray(v).reshape(-1), dtype=self.dtype)

    fuses_relu = True           # batchnorm_* take relu=True: a following ReLU in the same pass over memory

    # batchnorm_forward_train takes known=: the batch moments of x's last channels, summed before (a dense
    # chain's previous input, pydtnn/execution/concat_chain.py); batchnorm_moments(ctx) gives a forward's own.
    reuses_bn_moments = True

    def batchnorm_forward_train(self, x, gamma, beta, eps: float, sync=None, center=None, relu=False, known=None):
        """`known`: (mean, biased variance), float64, of x's last len(mean) channels in this batch; only the
        channels in front of them are summed. Not with `sync` (the global moments come from one collective)."""
        x, xf, ldx, m, c = self._bn_2d(x, gamma, "batchnorm_forward_train")
        if m == 0:
            raise ShapeError("batchnorm_forward_train: empty batch")
        nt = self._nt(x.size // _CHEAP)
        if known is None:
            mean, var, m = self._bn_moments(xf, ldx, m, c, nt, sync, center)
        else:
            mk, vk = (np.asarray(a, np.float64).reshape(-1) for a in known)
            cn = c - mk.size
            if sync is not None or not 0 < cn <= c or vk.size != mk.size:
                raise ValueError(f"batchnorm_forward_train: known moments of {mk.size} of {c} channels"
                                 + (" with sync" if sync is not None else ""))
            # the same row parts (nt from the whole x) and shift (x's first row) as summing every channel
            mean, var, _ = self._bn_moments(*self._rows(x[..., :cn]), m, cn, nt, None, None)
            mean, var = np.concatenate([mean, mk]), np.concatenate([var, vk])
        invstd = 1.0 / np.sqrt(var + eps)
        g = np.asarray(gamma, np.float64).reshape(-1)
        y = np.empty(x.shape, self.dtype)
        fk2, fk3 = self._vec(g * invstd), self._vec(beta)
        POOL.run(kp.bn_affine, nt, xf, ldx, xf, self._vec(mean), self._vec(mean), fk2, fk3, y.reshape(-1),
                 x.size // c, c, False, fk2, fk3, relu, xf, ldx, False)
        ctx = (x, mean, invstd, g, m, (fk2, fk3) if relu else None, var)     # the fused ReLU's mask, from x
        return y, mean.astype(self.dtype), var.astype(self.dtype), ctx

    def _bn_moments(self, xf, ldx, m, c, nt, sync, center):
        """Per-channel (mean, biased variance, count) of m rows of c values (row r at xf[r * ldx]), float64,
        from shifted sums: about x's first row (a stable one-pass variance), or, synchronized, about the
        centre every replica shares, and then over the global batch."""
        s1 = np.empty((nt, c))
        s2 = np.empty((nt, c))
        shift = xf[:c].astype(np.float64) if sync is None else np.asarray(center, np.float64).reshape(-1)
        POOL.run(kp.bn_sums, nt, xf, ldx, xf, shift, s1, s2, m, c, False, xf, xf, False)
        t1, t2 = s1.sum(axis=0), s2.sum(axis=0)
        if sync is not None:
            t1, t2, m = sync.forward_moments(np, t1, t2, m, shift, shift)
        d1 = t1 / m
        return shift + d1, np.maximum(t2 / m - d1 * d1, 0.0), m

    def batchnorm_moments(self, ctx):
        """(mean, biased variance), float64, of the batch the forward that made `ctx` normalized with."""
        return ctx[1], ctx[6]

    def batchnorm_forward_infer(self, x, gamma, beta, mean, var, eps: float, relu=False):
        x, xf, ldx, m, c = self._bn_2d(x, gamma, "batchnorm_forward_infer")
        invstd = 1.0 / np.sqrt(np.asarray(var, np.float64).reshape(-1) + eps)
        scale = np.asarray(gamma, np.float64).reshape(-1) * invstd
        y = np.empty(x.shape, self.dtype)
        mu = self._vec(mean)
        POOL.run(kp.bn_affine, self._nt(x.size // _CHEAP), xf, ldx, xf, mu, mu, self._vec(scale),
                 self._vec(beta), y.reshape(-1), m, c, False, mu, mu, relu, xf, ldx, False)
        return y

    def batchnorm_backward(self, dy, ctx, sync=None, relu_y=None, addend=None):
        """With `relu_y` (the fused ReLU's output), dy is the gradient after that ReLU. Its mask is recomputed
        from x with the forward's float32 coefficients when the forward ran fused (one array less to read).
        `addend` (x's shape) is added to dx in the same pass: another path's gradient of x."""
        x, mean, invstd, g, count, fused = ctx[:6]
        dy = self._c(dy)
        relu = relu_y is not None
        if relu and fused is None:          # forward ran unfused: the ReLU's backward first
            dy, relu = self.relu_backward(dy, relu_y), False
        mu = self._vec(mean)
        fk2, fk3 = fused if relu else (mu, mu)
        if dy.shape != x.shape:
            raise ShapeError(f"batchnorm_backward: dy has shape {dy.shape}, expected {x.shape}")
        if addend is not None and np.shape(addend) != x.shape:
            raise ShapeError(f"batchnorm_backward: addend has shape {np.shape(addend)}, expected {x.shape}")
        c = x.shape[-1]
        m = x.size // c
        nt = self._nt(x.size // _CHEAP)
        s1 = np.empty((nt, c))
        s2 = np.empty((nt, c))
        (xf, ldx), dyf = self._rows(x), dy.reshape(-1)
        POOL.run(kp.bn_sums, nt, xf, ldx, dyf, mu, s1, s2, m, c, True, fk2, fk3, relu)
        sdy, sdyx = s1.sum(axis=0), s2.sum(axis=0)
        dgamma, dbeta = (sdyx * invstd).astype(self.dtype), sdy.astype(self.dtype)   # this replica's share
        if sync is not None:
            sdy, sdyx = sync.backward_sums(np, sdy, sdyx)
        # dx = g*invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), means over the (global) batch
        k1 = g * invstd
        k2 = -g * invstd ** 3 * sdyx / count
        k3 = -k1 * sdy / count
        dx = np.empty(x.shape, self.dtype)
        af, lda = (dyf, c) if addend is None else self._rows(addend)
        POOL.run(kp.bn_affine, nt, xf, ldx, dyf, mu, self._vec(k1), self._vec(k2), self._vec(k3),
                 dx.reshape(-1), m, c, True, fk2, fk3, relu, af, lda, addend is not None)
        return dx, dgamma, dbeta

    # --- matrix products (FC, attention): on the pool, single-threaded BLAS per part ------------------
    def matmul(self, a, b, out=None):
        """a @ b as `numpy.matmul` (leading axes broadcast), optionally into `out` (C-contiguous)."""
        ok = (self.use_blas_kernels and a.ndim >= 2 and b.ndim >= 2 and a.dtype == self.dtype == b.dtype
              and a.shape[-1] == b.shape[-2] and min(a.shape[-2], a.shape[-1], b.shape[-1]) > 0)
        if not ok:
            return np.matmul(a, b, out=out)
        if a.ndim == 2 and b.ndim == 2 and (out is None or (out.shape == (a.shape[0], b.shape[1])
                                                            and out.dtype == self.dtype and out.flags.c_contiguous)):
            return self._product(a, b, self._no_bias, out)
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        nb = math.prod(batch)
        nt = self._nt(nb * m * n * k // _MACS_PER_ELEMENT)
        if nt == 1:                                    # NumPy's own call is cheaper; BLAS on this thread only
            with blas.blas_single_thread():
                return np.matmul(a, b, out=out)
        a, b, ta, tb = kmm.operands(a, b)
        shape = batch + (m, n)
        c = out if (out is not None and out.shape == shape and out.dtype == self.dtype
                    and out.flags.c_contiguous) else np.empty(shape, self.dtype)
        item = c.itemsize
        c_off = np.arange(nb, dtype=np.int64) * (m * n * item)
        one, zero = self.dtype.type(1), self.dtype.type(0)
        with blas.blas_single_thread():
            POOL.run(kmm.gemm_parts, nt, blas.gemm_ptr(self.dtype), a.ctypes.data, b.ctypes.data, c.ctypes.data,
                     kmm.batch_offsets(a, batch), kmm.batch_offsets(b, batch), c_off, m, n, k, ta[0], tb[0],
                     ta[1], tb[1], n, one, zero, ta[2], tb[3], item)
        if out is not None and c is not out:
            out[...] = c
            return out
        return c

    def linear(self, x, w, b=None):
        """x @ w + b on the pool, the bias written into each part's block of the output before its GEMM
        adds on (`kmm.linear_parts`): no pass of its own over the output (the ViT's FC layers, 2 threads:
        243 -> 165-176 us with their bias)."""
        ok = (self.use_blas_kernels and x.ndim == 2 and w.ndim == 2 and x.dtype == self.dtype == w.dtype
              and x.shape[1] == w.shape[0] and min(x.shape[0], x.shape[1], w.shape[1]) > 0
              and (b is None or np.size(b) == w.shape[1]))
        if not ok:
            return super().linear(x, w, b)
        return self._product(x, w, self._no_bias if b is None else self._vec(b), None)

    def linear_weight_grads(self, x, dy, dw, db=None, out_in=False):
        """dw and db in one pool run (`kmm.weight_grad_parts`): the GEMM's parts and the bias sums' columns."""
        if x.ndim != 2 or dy.ndim != 2:
            return super().linear_weight_grads(x, dy, dw, db, out_in)
        rows, (fi, fo) = x.shape[0], (x.shape[1], dy.shape[1])
        ok = (self.use_blas_kernels and dy.shape[0] == rows > 0
              and x.dtype == dy.dtype == dw.dtype == self.dtype and dw.shape == ((fo, fi) if out_in else (fi, fo))
              and dw.flags.c_contiguous and dy.flags.c_contiguous and x.strides[1] == x.itemsize
              and (db is None or (db.shape == (fo,) and db.dtype == self.dtype and db.flags.c_contiguous)))
        if not ok:
            return super().linear_weight_grads(x, dy, dw, db, out_in)
        a, b = (dy, x) if out_in else (x, dy)          # dw = a^T b
        m, n = a.shape[1], b.shape[1]
        with blas.blas_single_thread():
            POOL.run(kmm.weight_grad_parts, self._nt(m * n * rows // _MACS_PER_ELEMENT), blas.gemm_ptr(self.dtype),
                     a.ctypes.data, a.strides[0] // a.itemsize, b.ctypes.data, b.strides[0] // b.itemsize,
                     dw.reshape(-1), self._no_bias if db is None else db, dy.reshape(-1), m, n, rows)

    def _product(self, a, b, bias, out):
        """a @ b + bias (empty: none) for 2-D operands, into `out` (C-contiguous) or a new array: one GEMM a
        part, without the batch machinery of `matmul` (25-37 us of Python a call, against GEMMs of
        100-200 us in a ViT step)."""
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        nt = self._nt(m * n * k // _MACS_PER_ELEMENT)
        if nt == 1 and bias.size == 0:                 # NumPy's own call is cheaper; BLAS on this thread only
            with blas.blas_single_thread():
                return np.matmul(a, b, out=out)
        a, b, ta, tb = kmm.operands(a, b)
        y = np.empty((m, n), self.dtype) if out is None else out
        with blas.blas_single_thread():
            POOL.run(kmm.linear_parts, nt, blas.gemm_ptr(self.dtype), a.ctypes.data, b.ctypes.data, y.reshape(-1),
                     bias, m, n, k, ta[0], tb[0], ta[1], tb[1], ta[2], tb[3])
        return y
