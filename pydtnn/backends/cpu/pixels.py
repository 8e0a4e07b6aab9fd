"""Convolutions of tiny images (a few output pixels) as one GEMM per (output pixel, kernel tap), numba.

Why: on VGG's 2x2 images a 3x3 convolution with padding 1 sees 4 of its 9 taps at every output pixel;
the packing paths of `conv` multiply the other 5 by zeros, 2.25x the work, and pack the input first.
Here, for every output pixel p and every tap (i, j) that lands inside the image, at input pixel q:
    forward          y[:, p, ks]  += x[:, q, :]  @ W[i, j][:, ks]       (N x C) @ (C x K)
    backward data    dx[:, q, cs] += dy[:, p, :] @ W[i, j][cs, :]^T     (N x K) @ (K x C)
    backward weights dW[i, j][:, ks] += x[:, q, :]^T @ dy[:, p, ks]     (C x N) @ (N x K)
W (kh, kw, C, K) is the direct kernels' filter layout; the batch is the GEMMs' long side, read in place
(rows H*W*C apart), nothing is packed. Part t of nt takes a range of output channels ks (of input
channels cs in backward data), so parts never write the same element and there is one dW. The arithmetic
of an element does not depend on the parts.

Kernels follow `jit`'s conventions. `PixelsConvKernels`, at the end, is their host side.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.contract import ConvSpec
from pydtnn.backends.cpu.jit import FAST
from pydtnn.backends.cpu.parts import grid_part
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu.runtime.blas import NO_TRANS, TRANS, addr, gemm
from pydtnn.backends.cpu.runtime.threads import POOL


@njit(**FAST)
def _taps(H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """(count, 3) rows (output pixel p, tap i * kw + j, input pixel q) of every tap inside the image."""
    pairs = np.empty((Ho * Wo * kh * kw, 3), np.int64)
    count = 0
    for ho in range(Ho):
        for wo in range(Wo):
            for i in range(kh):
                for j in range(kw):
                    h = ho * sh - ph + i * dh
                    w = wo * sw - pw + j * dw
                    if 0 <= h < H and 0 <= w < W:
                        pairs[count, 0] = ho * Wo + wo
                        pairs[count, 1] = i * kw + j
                        pairs[count, 2] = h * W + w
                        count += 1
    return pairs[:count]


@njit(**FAST)
def _fill_columns(dst, rows, width, c0, cn, bias):
    """dst (rows, width)[:, c0:c0 + cn] = bias[c0:c0 + cn], or zero when bias is empty."""
    zero = dst.dtype.type(0.0)
    has_bias = bias.size > 0
    for r in range(rows):
        o = uint64(r * width + c0)
        for c in range(uint64(cn)):
            dst[o + c] = bias[uint64(c0) + c] if has_bias else zero


@njit(**FAST)
def fwd(t, nt, fp, xf, wt, bias, yf, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """y (N, Ho, Wo, K) = conv(x (N, H, W, C), wt (kh, kw, C, K)) + bias, output channels of part t."""
    one = xf.dtype.type(1.0)
    _, _, k0, k1 = grid_part(t, nt, nt, 1, K)
    kn = k1 - k0
    if kn <= 0:
        return
    P = Ho * Wo
    _fill_columns(yf, N * P, K, k0, kn, bias)       # bias (or zero) first; every tap inside accumulates
    for p, tap, q in _taps(H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
        gemm(fp, NO_TRANS, NO_TRANS, N, kn, C, one, addr(xf, q * C), H * W * C,
             addr(wt, tap * C * K + k0), K, one, addr(yf, p * K + k0), P * K)


@njit(**FAST)
def bwd_data(t, nt, fp, dyf, wt, dxf, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """dx (N, H, W, C) from dy (N, Ho, Wo, K) and wt (kh, kw, C, K), input channels of part t."""
    one = dyf.dtype.type(1.0)
    _, _, c0, c1 = grid_part(t, nt, nt, 1, C)
    cn = c1 - c0
    if cn <= 0:
        return
    Q = H * W
    _fill_columns(dxf, N * Q, C, c0, cn, dxf[:0])   # zero: pixels no tap reaches stay zero
    for p, tap, q in _taps(H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
        gemm(fp, NO_TRANS, TRANS, N, cn, K, one, addr(dyf, p * K), Ho * Wo * K,
             addr(wt, (tap * C + c0) * K), K, one, addr(dxf, q * C + c0), Q * C)


@njit(**FAST)
def bwd_w(t, nt, fp, xf, dyf, dwt, dbacc, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias):
    """dwt (kh, kw, C, K) += x^T dy per tap (zeroed by the caller), dbacc (K,) = sum of dy; output channels
    of part t."""
    one = xf.dtype.type(1.0)
    _, _, k0, k1 = grid_part(t, nt, nt, 1, K)
    kn = k1 - k0
    if kn <= 0:
        return
    P = Ho * Wo
    for p, tap, q in _taps(H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
        gemm(fp, TRANS, NO_TRANS, C, kn, N, one, addr(xf, q * C), H * W * C,
             addr(dyf, p * K + k0), P * K, one, addr(dwt, tap * C * K + k0), K)
    if with_bias:
        for r in range(N * P):
            o = uint64(r * K + k0)
            for k in range(uint64(kn)):
                dbacc[uint64(k0) + k] += dyf[o + k]


class PixelsConvKernels:
    """The host side of the per-pixel GEMMs, mixed into `conv.ConvKernels` (which decides where they run:
    `ConvKernels._pixels`). Filters go to the direct kernels' layout (kh, kw, C, K) and back through
    `LayoutKernels._swap_outer`."""

    def _pixels_forward(self, x, w, bias, y, spec: ConvSpec):
        n, h, wd, c = x.shape
        _, ho, wo, k = y.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        wt = self._swap_outer(w, k, c, kh * kw)                             # (kh, kw, C, K)
        with blas.blas_single_thread():
            POOL.run(fwd, self._nt(y.size), blas.gemm_ptr(self.dtype), x.reshape(-1), wt, bias,
                     y.reshape(-1), n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw)

    def _pixels_backward_data(self, dy, w, dx, spec: ConvSpec):
        n, h, wd, c = dx.shape
        _, ho, wo, k = dy.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        with blas.blas_single_thread():
            POOL.run(bwd_data, self._nt(dx.size), blas.gemm_ptr(self.dtype), dy.reshape(-1),
                     self._swap_outer(w, k, c, kh * kw), dx.reshape(-1), n, h, wd, c, k, ho, wo,
                     kh, kw, sh, sw, ph, pw, dh, dw)
        return dx

    def _pixels_backward_weights(self, x, dy, spec: ConvSpec, with_bias):
        n, h, wd, c = x.shape
        _, ho, wo, k = dy.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        dwt = np.zeros(kh * kw * c * k, self.dtype)
        db = np.zeros(k, self.dtype)
        with blas.blas_single_thread():
            POOL.run(bwd_w, self._nt(dy.size), blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1),
                     dwt, db, n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias)
        return self._swap_outer(dwt, kh * kw, c, k).reshape(k, c, kh, kw), (db if with_bias else None)
