"""Depthwise convolution on the CPU backend (groups == in == out channels, NHWC): direct per-tap
multiply-accumulate, vectorized over contiguous channels, compiled with numba; then
`DepthwiseConvKernels`, their host side. Kernels follow `jit`'s conventions; parts are ranges of output
rows (forward), whole images (backward data: no write races) or of rows with their own accumulator
(backward weights, summed by the host).
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.contract import ConvSpec
from pydtnn.backends.cpu.jit import FAST, clear
from pydtnn.backends.cpu.runtime.threads import POOL


@njit(**FAST)
def _wo_range(Wo, W, sw, pw, j, dw):
    """[lo, hi) of output columns whose input column wo*sw - pw + j*dw lies inside [0, W)."""
    off = j * dw - pw
    lo = 0
    if off < 0:
        lo = (-off + sw - 1) // sw
    # wo*sw + off <= W - 1  <=>  wo <= (W - 1 - off) // sw
    if W - 1 - off < 0:
        hi = 0
    else:
        hi = (W - 1 - off) // sw + 1
    hi = min(hi, Wo)
    return min(lo, hi), hi


@njit(**FAST)
def dw_fwd(t, nt, xf, wt, bias, yf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """Depthwise: y[n,ho,wo,c] = sum_ij x[n, ho*sh+i*dh-ph, wo*sw+j*dw-pw, c] * wt[i,j,c] + b[c]."""
    has_bias = bias.size > 0
    Cu = uint64(C)
    rows = N * Ho
    per = (rows + nt - 1) // nt
    for nh in range(t * per, min(rows, (t + 1) * per)):
        n = nh // Ho
        ho = nh - n * Ho
        yb = nh * Wo * C
        for wo in range(Wo):
            ys = uint64(yb + wo * C)
            for c in range(Cu):
                yf[ys + c] = bias[c] if has_bias else 0
        for i in range(kh):
            h = ho * sh + i * dh - ph
            if h < 0 or h >= H:
                continue
            xb = (n * H + h) * W * C
            for j in range(kw):
                lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                wb = uint64((i * kw + j) * C)
                for wo in range(lo, hi):
                    xs = uint64(xb + (wo * sw + j * dw - pw) * C)
                    ys = uint64(yb + wo * C)
                    for c in range(Cu):
                        yf[ys + c] += xf[xs + c] * wt[wb + c]


@njit(**FAST)
def dw_bwd_data(t, nt, dyf, wt, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """Depthwise backward data, scattered per image (an image belongs to one thread)."""
    Cu = uint64(C)
    per = (N + nt - 1) // nt
    for n in range(t * per, min(N, (t + 1) * per)):
        clear(dxf, n * H * W * C, H * W * C)
        for ho in range(Ho):
            yb = (n * Ho + ho) * Wo * C
            for i in range(kh):
                h = ho * sh + i * dh - ph
                if h < 0 or h >= H:
                    continue
                xb = (n * H + h) * W * C
                for j in range(kw):
                    lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                    wb = uint64((i * kw + j) * C)
                    for wo in range(lo, hi):
                        xs = uint64(xb + (wo * sw + j * dw - pw) * C)
                        ys = uint64(yb + wo * C)
                        for c in range(Cu):
                            dxf[xs + c] += dyf[ys + c] * wt[wb + c]


@njit(**FAST)
def dw_bwd_w(t, nt, xf, dyf, acc, dbacc, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias):
    """Depthwise backward weights: acc[t] (kh, kw, C) and dbacc[t] (C,) partial sums of part t."""
    at = np.zeros(kh * kw * C, acc.dtype)      # thread-private accumulators (no false sharing)
    dbt = np.zeros(C, acc.dtype)
    Cu = uint64(C)
    rows = N * Ho
    per = (rows + nt - 1) // nt
    for nh in range(t * per, min(rows, (t + 1) * per)):
        n = nh // Ho
        ho = nh - n * Ho
        yb = nh * Wo * C
        if with_bias:
            for wo in range(Wo):
                ys = uint64(yb + wo * C)
                for c in range(Cu):
                    dbt[c] += dyf[ys + c]
        for i in range(kh):
            h = ho * sh + i * dh - ph
            if h < 0 or h >= H:
                continue
            xb = (n * H + h) * W * C
            for j in range(kw):
                lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                wb = uint64((i * kw + j) * C)
                for wo in range(lo, hi):
                    xs = uint64(xb + (wo * sw + j * dw - pw) * C)
                    ys = uint64(yb + wo * C)
                    for c in range(Cu):
                        at[wb + c] += xf[xs + c] * dyf[ys + c]
    acc[t, :] = at
    dbacc[t, :] = dbt


class DepthwiseConvKernels:
    """The host side of the depthwise convolution, mixed into `conv.ConvKernels`. Filters (C, 1, kh, kw) go
    to the kernels' (kh, kw, C)."""

    def _depthwise_forward(self, x, w, bias, y, spec: ConvSpec):
        n, h, wd, c = x.shape
        _, ho, wo, _ = y.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        wt = self._c(np.asarray(w)[:, 0].transpose(1, 2, 0))           # (kh, kw, C)
        POOL.run(dw_fwd, self._nt(y.size), x.reshape(-1), wt.reshape(-1), bias, y.reshape(-1),
                 n, h, wd, c, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw)

    def _depthwise_backward_data(self, dy, w, dx, spec: ConvSpec):
        n, h, wd, c = dx.shape
        _, ho, wo, _ = dy.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        wt = self._c(w[:, 0].transpose(1, 2, 0))
        POOL.run(dw_bwd_data, self._nt(dx.size), dy.reshape(-1), wt.reshape(-1), dx.reshape(-1),
                 n, h, wd, c, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw)
        return dx

    def _depthwise_backward_weights(self, x, dy, spec: ConvSpec, with_bias):
        n, h, wd, c = x.shape
        _, ho, wo, _ = dy.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        nt = self._nt(dy.size)
        acc = np.zeros((nt, kh * kw * c), self.dtype)
        dbacc = np.zeros((nt, c), self.dtype)
        POOL.run(dw_bwd_w, nt, x.reshape(-1), dy.reshape(-1), acc, dbacc, n, h, wd, c, ho, wo,
                 kh, kw, sh, sw, ph, pw, dh, dw, with_bias)
        dwt, db = acc.sum(axis=0), dbacc.sum(axis=0)
        dwu = np.ascontiguousarray(dwt.reshape(kh, kw, c).transpose(2, 0, 1))[:, None]
        return dwu, (db if with_bias else None)
