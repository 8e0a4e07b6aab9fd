"""The convolutions of the CPU backend (NHWC): the direct convolution's row-tap kernels, packing fused with
GEMM, compiled with numba; then `DirectConvKernels`, their host side (the path a convolution takes where no
special path applies); last `ConvKernels`, the family's mixin (`conv2d_*`, as `gpu/conv.py`'s), which chooses
a call's path among the direct kernels and the other paths' mixins (`depthwise`, `winograd`, `pixels`,
`planes`, `pointwise`, `numpy_conv`).

Algorithm ("row-tap" packing fused with GEMM, one thread pool):
- The output rows of every image are cut into blocks; each thread takes a contiguous range of
  (image, row block) items and, for each, packs the input rows the block needs into a small buffer that
  stays in cache, then calls single-threaded BLAS on it right away.
- Row-tap packing expands only along the kernel WIDTH: packed row (h, wo) holds the kw*C values
  x[h, wo*sw + j*dw, c] (j, c). The kh kernel rows are then kh GEMMs on row-shifted slices of the same
  buffer (beta=1 accumulates), so the packed data is kw/sw times the input instead of kh*kw times
  (im2col). With a vertical stride the packed rows are stored phase by phase (h = q*sh + r), which keeps
  every kernel row's slice contiguous.
- `fold=True` packs all kh*kw taps (classic im2col, blocks may span images) and runs ONE GEMM with a
  kh-times larger reduction. It measured slower than row-tap on every ResNet-20/MNIST shape (packing
  dominates), so the backend uses it only when forced; it stays as the reference variant.
- 1x1 convolutions with stride 1 and no padding skip packing (the NHWC input already is the matrix).
- Backward weights packs the same buffers and accumulates dW per thread (beta=1), then sums threads.
- Backward data: for stride 1 it is a forward convolution of dy with the flipped, transposed kernel (so
  it reuses the fast path); otherwise dcol = dy @ W^T per row block, scattered (col2im) into dx; an
  image belongs to a single thread, so the scatter needs no atomics.

Kernels follow `jit`'s conventions. `fp` is the address of cblas_?gemm (see `runtime.blas`).
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.contract import ConvSpec
from pydtnn.backends.cpu import planes
from pydtnn.backends.cpu import winograd as wino
from pydtnn.backends.cpu.depthwise import DepthwiseConvKernels
from pydtnn.backends.cpu.jit import FAST, clear
from pydtnn.backends.cpu.numpy_conv import NumpyConvKernels
from pydtnn.backends.cpu.parts import grid_part
from pydtnn.backends.cpu.pixels import PixelsConvKernels
from pydtnn.backends.cpu.planes import PlanesConvKernels
from pydtnn.backends.cpu.pointwise import PointwiseConvKernels
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu.runtime.blas import NO_TRANS, TRANS, addr, gemm
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.backends.cpu.winograd import WinogradConvKernels
from pydtnn.errors import ConfigError, ShapeError


@njit(**FAST)
def _pack_row(xf, n, h, H, W, C, Wo, kw, sw, dw, pw, dst, d0, dstride):
    """dst[d0 + wo*dstride + j*C + c] = x[n, h, wo*sw + j*dw - pw, c], zero outside the image."""
    L = kw * C
    Lu = uint64(L)
    Cu = uint64(C)
    if h < 0 or h >= H:
        for wo in range(Wo):
            clear(dst, d0 + wo * dstride, L)
        return
    row = (n * H + h) * W * C
    lo = 0
    hi = 0
    if dw == 1:
        # interior output columns: the kw*C values are contiguous in the input row, at any stride (strided
        # rows went through the per-tap loop below: the ViT's 7x7 stride-7 patches packed at 3.3 ns an element)
        lo = min(-(-pw // sw), Wo)                          # first wo with wo*sw - pw >= 0
        hi = max(lo, min((W - kw + pw) // sw + 1, Wo))      # wo < hi  <=>  wo*sw - pw + kw - 1 <= W - 1
        for wo in range(lo, hi):
            du = uint64(d0 + wo * dstride)
            su = uint64(row + (wo * sw - pw) * C)
            for q in range(Lu):
                dst[du + q] = xf[su + q]
    for wo in range(Wo):
        if lo <= wo < hi:
            continue
        base = d0 + wo * dstride
        for j in range(kw):
            wi = wo * sw + j * dw - pw
            du = uint64(base + j * C)
            if wi < 0 or wi >= W:
                for c in range(Cu):
                    dst[du + c] = 0
            else:
                su = uint64(row + wi * C)
                for c in range(Cu):
                    dst[du + c] = xf[su + c]


@njit(**FAST)
def _pack_block(xf, n, a, e, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, fold, nph, qext, buf):
    """Pack the input rows that output rows [a, e) of image n need (layout: see module doc); with `fold`,
    [a, e) are rows of the flattened (image, output row) index and n is unused."""
    L = kw * C
    if fold:
        # rows [a, e) of the flattened (image, output row) index: blocks may span images
        KK = kh * L
        for nh in range(a, e):
            nn = nh // Ho
            ho = nh - nn * Ho
            for i in range(kh):
                _pack_row(xf, nn, ho * sh + i * dh - ph, H, W, C, Wo, kw, sw, dw, pw,
                          buf, (nh - a) * Wo * KK + i * L, KK)
    else:
        R = e - a + qext
        for r in range(nph):
            for qq in range(R):
                _pack_row(xf, n, (a + qq) * sh + r - ph, H, W, C, Wo, kw, sw, dw, pw,
                          buf, ((r * R) + qq) * Wo * L, L)


@njit(**FAST)
def conv_fwd(t, nt, fp, xf, wt, bias, yf, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw,
             rb, fold, direct, bufsize):
    """y (N, Ho, Wo, K) = conv(x (N, H, W, C), wt (kh, kw*C, K)) + bias; see module doc."""
    one = xf.dtype.type(1.0)
    zero = xf.dtype.type(0.0)
    L = kw * C
    nph = min(sh, (kh - 1) * dh + 1)
    qext = ((kh - 1) * dh) // sh
    nblk = (Ho + rb - 1) // rb
    items = N * nblk
    if fold:                                   # blocks of rb rows over the flattened (n, ho) index
        nblk = (N * Ho + rb - 1) // rb
        items = nblk
    per = (items + nt - 1) // nt
    has_bias = bias.size > 0
    buf = np.empty(bufsize, xf.dtype)
    for it in range(t * per, min(items, (t + 1) * per)):
        if fold:
            n = 0
            a = it * rb
            e = min(N * Ho, a + rb)
            yoff = a * Wo * K
        else:
            n = it // nblk
            a = (it - n * nblk) * rb
            e = min(Ho, a + rb)
            yoff = (n * Ho + a) * Wo * K
        M = (e - a) * Wo
        if direct:
            gemm(fp, NO_TRANS, NO_TRANS, M, K, C, one, addr(xf, (n * H + a) * W * C), C,
                 addr(wt, 0), K, zero, addr(yf, yoff), K)
        else:
            _pack_block(xf, n, a, e, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, fold, nph, qext, buf)
            if fold:
                gemm(fp, NO_TRANS, NO_TRANS, M, K, kh * L, one, addr(buf, 0), kh * L,
                     addr(wt, 0), K, zero, addr(yf, yoff), K)
            else:
                R = e - a + qext
                for i in range(kh):
                    r = (i * dh) % sh
                    o = (i * dh) // sh
                    gemm(fp, NO_TRANS, NO_TRANS, M, K, L, one, addr(buf, (r * R + o) * Wo * L), L,
                         addr(wt, i * L * K), K, zero if i == 0 else one, addr(yf, yoff), K)
        if has_bias:
            yb = yf[yoff:yoff + M * K]
            for p in range(M):
                yp = yb[p * K:(p + 1) * K]
                for k in range(K):
                    yp[k] += bias[k]


def weight_kparts(rows: int, kk: int, k: int, nt: int) -> int:
    """The channel split of backward weights' parts (`grid_part`): 1 (ranges of rows, each range with its
    own kk x k accumulator, summed afterwards) or nt (every row, a range of output channels each, one
    accumulator; every part packs all rows). Channels once 2 k >= rows: VGG-11's 512 -> 512 on 2x2
    images (256 rows), 2 threads, 16-19 -> 14-17 ms (1 thread: 19-20); with more rows the packing repeated
    in every part costs more than the accumulators (256 -> 256 on 8x8: 36-39 ms either way; 16 -> 16 on
    32x32: 4.2 by rows, 5.0 by channels)."""
    return nt if nt > 1 and 2 * k >= rows else 1


@njit(**FAST)
def conv_bwd_w(t, nt, fp, xf, dyf, acc, dbacc, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw,
               rb, fold, direct, bufsize, with_bias, kparts):
    """acc[g] (kh, kw*C, K) += packed(x)^T dy over this part's rows, in its output channels, g its range of
    rows (`grid_part`); dbacc[t] (K,) += the sum of dy in them."""
    one = xf.dtype.type(1.0)
    L = kw * C
    nph = min(sh, (kh - 1) * dh + 1)
    qext = ((kh - 1) * dh) // sh
    nblk = (Ho + rb - 1) // rb
    items = N * nblk
    if fold:                                   # blocks of rb rows over the flattened (n, ho) index
        nblk = (N * Ho + rb - 1) // rb
        items = nblk
    i0, i1, k0, k1 = grid_part(t, nt, kparts, items, K)
    kn = k1 - k0
    if kn <= 0:
        return
    KK = kh * L
    a0 = (t // kparts) * KK * K + k0           # this part's accumulator, at its first channel
    buf = np.empty(bufsize, xf.dtype)
    dbt = np.zeros(kn, xf.dtype)               # thread-private (no false sharing)
    for it in range(i0, i1):
        if fold:
            n = 0
            a = it * rb
            e = min(N * Ho, a + rb)
            yoff = a * Wo * K
        else:
            n = it // nblk
            a = (it - n * nblk) * rb
            e = min(Ho, a + rb)
            yoff = (n * Ho + a) * Wo * K
        M = (e - a) * Wo
        if direct:
            gemm(fp, TRANS, NO_TRANS, C, kn, M, one, addr(xf, (n * H + a) * W * C), C,
                 addr(dyf, yoff + k0), K, one, addr(acc, a0), K)
        else:
            _pack_block(xf, n, a, e, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, fold, nph, qext, buf)
            if fold:
                gemm(fp, TRANS, NO_TRANS, KK, kn, M, one, addr(buf, 0), KK,
                     addr(dyf, yoff + k0), K, one, addr(acc, a0), K)
            else:
                R = e - a + qext
                for i in range(kh):
                    r = (i * dh) % sh
                    o = (i * dh) // sh
                    gemm(fp, TRANS, NO_TRANS, L, kn, M, one, addr(buf, (r * R + o) * Wo * L), L,
                         addr(dyf, yoff + k0), K, one, addr(acc, a0 + i * L * K), K)
        if with_bias:
            for p in range(M):
                yp = uint64(yoff + p * K + k0)
                for k in range(uint64(kn)):
                    dbt[k] += dyf[yp + k]
    for k in range(kn):
        dbacc[t, k0 + k] = dbt[k]


@njit(**FAST)
def conv_bwd_data_scatter(t, nt, fp, dyf, wt, dxf, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw,
                          rb):
    """dx = col2im(dy @ wt^T), wt (kh*kw*C, K); one image per thread at a time (no write races)."""
    one = dyf.dtype.type(1.0)
    zero = dyf.dtype.type(0.0)
    KK = kh * kw * C
    per = (N + nt - 1) // nt
    dcol = np.empty(rb * Wo * KK, dyf.dtype)
    for n in range(t * per, min(N, (t + 1) * per)):
        base_n = n * H * W * C
        clear(dxf, base_n, H * W * C)
        for a in range(0, Ho, rb):
            e = min(Ho, a + rb)
            M = (e - a) * Wo
            gemm(fp, NO_TRANS, TRANS, M, KK, K, one, addr(dyf, (n * Ho + a) * Wo * K), K,
                 addr(wt, 0), K, zero, addr(dcol, 0), KK)
            for ho in range(a, e):
                for i in range(kh):
                    h = ho * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    for wo in range(Wo):
                        src = ((ho - a) * Wo + wo) * KK + i * kw * C
                        for j in range(kw):
                            wi = wo * sw - pw + j * dw
                            if wi < 0 or wi >= W:
                                continue
                            du = uint64(base_n + (h * W + wi) * C)
                            su = uint64(src + j * C)
                            for c in range(uint64(C)):
                                dxf[du + c] += dcol[su + c]


# --- host side ------------------------------------------------------------------------------------------

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


class DirectConvKernels:
    """The host side of the direct convolution, mixed into `ConvKernels`: the kernels' plan (row blocks,
    fold, buffer sizes, parts) and their launches. Filters go to the kernels' layout (kh, kw, C, K) and
    back through `LayoutKernels._swap_outer`."""

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

    def _direct_forward(self, x, w, bias, y, spec: ConvSpec):
        """y = conv(x, w) + bias (bias empty: none)."""
        kh, kw = spec.kernel
        self._direct_core(x, self._swap_outer(w, spec.out_channels, spec.in_channels, kh * kw), bias, y, spec)

    def _direct_core(self, x, wt, bias, y, spec: ConvSpec):
        """y = conv(x, wt) + bias with the filters already in the kernels' layout (kh, kw, C, K)."""
        n, h, wd, c = x.shape
        _, ho, wo, k = y.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        rb, fold, direct, bufsize, nt = self._conv_plan(spec, n, h, wd, c, k, ho, wo)
        with blas.blas_single_thread():
            POOL.run(conv_fwd, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), wt, bias, y.reshape(-1),
                     n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb, fold, direct, bufsize)

    def _direct_backward_data(self, dy, w, dx, spec: ConvSpec):
        """dx of conv(x, w), into dx; returns dx."""
        n, h, wd, c = dx.shape
        _, ho, wo, k = dy.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        pth, ptw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
        if sh == 1 and sw == 1 and pth >= 0 and ptw >= 0:
            # stride 1: dx = conv(dy, flipped kernel with in/out channels swapped), "full" padding
            tspec = ConvSpec(k, c, (kh, kw), (1, 1), (pth, ptw), (dh, dw))
            wt = self._c(w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)).reshape(-1)   # (kh, kw, K, C)
            self._direct_core(dy, wt, np.empty(0, self.dtype), dx, tspec)
            return dx
        # else dcol = dy @ W^T per row block, scattered (col2im) into dx
        wt = self._swap_outer(w, k, c, kh * kw)                             # (kh, kw, C, K)
        rb = max(1, min(ho, -(-_TARGET_ROWS // wo), _BUF_ELEMS // (wo * kh * kw * c)))
        with blas.blas_single_thread():
            POOL.run(conv_bwd_data_scatter, self._nt(dx.size), blas.gemm_ptr(self.dtype), dy.reshape(-1), wt,
                     dx.reshape(-1), n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb)
        return dx

    def _direct_backward_weights(self, x, dy, spec: ConvSpec, with_bias):
        """(dw, db) of conv(x, w) (+ b); db None without `with_bias`."""
        n, h, wd, c = x.shape
        _, ho, wo, k = dy.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        rb, fold, direct, bufsize, nt = self._conv_plan(spec, n, h, wd, c, k, ho, wo, _TARGET_ROWS_BWD_W)
        kp = self._kparts(weight_kparts(n * ho * wo, kh * kw * c, k, nt), nt)
        groups = nt // kp                       # one accumulator per range of rows
        acc = np.zeros((groups, kh * kw * c * k), self.dtype)
        dbacc = np.zeros((nt, k), self.dtype)
        with blas.blas_single_thread():
            POOL.run(conv_bwd_w, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1), acc, dbacc,
                     n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb, fold, direct, bufsize, with_bias,
                     kp)
        dwt, db = (acc[0], dbacc[0]) if nt == 1 else (acc.sum(axis=0), dbacc.sum(axis=0))
        dwu = self._swap_outer(dwt, kh * kw, c, k).reshape(k, c, kh, kw)
        return dwu, (db if with_bias else None)


# `_pointwise`: 1x1 convolutions on images of at most this many pixels (4x4) run as one whole-batch GEMM
# (measured 1.3-7x faster on 4x4 and 2x2 images, mixed on 8x8, slower on 32x32)
_POINTWISE_MAX_HW = 16
# Output images of at most this many pixels run as one GEMM per (pixel, tap) (`pixels`): VGG-11's
# 512 -> 512 on 2x2 images, forward / backward data / backward weights at 1 thread 16.7 / 15.5 / 16.2 ms
# packed, 12.5 / 13.5 / 12.1 per pixel; at 2 threads 9.2 / 9.5 / 11.6 and 6.9 / 7.4 / 6.9.
_PIXELS_MAX_HW = 4


class ConvKernels(DirectConvKernels, DepthwiseConvKernels, WinogradConvKernels, PixelsConvKernels,
                  PlanesConvKernels, PointwiseConvKernels, NumpyConvKernels):
    """The convolutions of the CPU backend (`conv2d_*`), mixed into `CPUBackend`: which path runs a call,
    over the mixins of the paths (the direct kernels above; `depthwise`, `winograd`, `pixels`, `planes`,
    `pointwise`, `numpy_conv`). The three passes check the paths in their own orders (e.g. backward weights
    asks for the NumPy fallback before the plane kernels)."""

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
