"""Pooling on the CPU backend (NHWC): max, average and global average, forward and backward. The numba
kernels, then `PoolingKernels`, their host side (the backend's `pool2d_forward` / `pool2d_backward`).

Kernels follow `jit`'s conventions. Forward parts are ranges of output rows (global average: of images);
backward parts are whole images (windows may overlap, so a part scatters only into its own images: no
atomics).
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.contract import PoolSpec
from pydtnn.backends.cpu.jit import FAST, IEEE, clear
from pydtnn.backends.cpu.parts import part_range
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.errors import ConfigError, ShapeError


@njit(**IEEE)
def _maxpool_fwd_inside(xf, yf, idx, r0, r1, H, W, C, Ho, Wo, kh, kw, sh, sw):
    """maxpool_fwd's output rows r0..r1 when every window lies inside the image (no padding): each output
    kept in a register over its taps, instead of a load and two stores per tap (simplecnn's 4-channel 2x2
    pooling took 3 ns an input element through the general loop)."""
    ninf = xf.dtype.type(-np.inf)
    Cu = uint64(C)
    for nh in range(r0, r1):
        n = nh // Ho
        ho = nh - n * Ho
        yb = uint64(nh * Wo * C)
        rb = (n * H + ho * sh) * W * C
        for wo in range(Wo):
            o = yb + uint64(wo * C)
            s = uint64(rb + wo * sw * C)
            for c in range(Cu):
                m = ninf
                a = -1
                for i in range(kh):
                    for j in range(kw):
                        v = xf[s + uint64((i * W + j) * C) + c]
                        if v > m:                  # strict: ties keep the first arg-max, NaN never wins
                            m = v
                            a = i * kw + j
                yf[o + c] = m
                idx[o + c] = a


@njit(**IEEE)
def maxpool_fwd(t, nt, xf, yf, idx, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = max over the window (padding counts as -inf); idx = FIRST arg-max tap (i*kw + j); -1 where the
    window holds nothing above -inf (NaN never wins; such windows get no gradient)."""
    Cu = uint64(C)
    r0, r1 = part_range(t, nt, N * Ho)
    if ph == 0 and pw == 0:
        _maxpool_fwd_inside(xf, yf, idx, r0, r1, H, W, C, Ho, Wo, kh, kw, sh, sw)
        return
    for nh in range(r0, r1):
        n = nh // Ho
        ho = nh - n * Ho
        yb = nh * Wo * C
        for q in range(uint64(Wo * C)):
            yf[uint64(yb) + q] = -np.inf
            idx[uint64(yb) + q] = -1
        for i in range(kh):
            h = ho * sh - ph + i
            if h < 0 or h >= H:
                continue
            xb = (n * H + h) * W * C
            for wo in range(Wo):
                o = uint64(yb + wo * C)
                for j in range(kw):
                    w = wo * sw - pw + j
                    if w < 0 or w >= W:
                        continue
                    s = uint64(xb + w * C)
                    tap = i * kw + j
                    for c in range(Cu):
                        v = xf[s + c]
                        if v > yf[o + c]:          # strict: ties keep the first arg-max
                            yf[o + c] = v
                            idx[o + c] = tap


@njit(**FAST)
def maxpool_bwd(t, nt, dyf, idx, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """dx[arg-max] += dy, image by image (overlapping windows need no atomics). Windows that tile the
    input (stride == pool, no padding) take a gather path that writes each dx element once."""
    Cu = uint64(C)
    n0, n1 = part_range(t, nt, N)
    if sh == kh and sw == kw and ph == 0 and pw == 0:
        for n in range(n0, n1):
            base = n * H * W * C
            if Ho * kh < H or Wo * kw < W:
                clear(dxf, base, H * W * C)        # rows/columns that no window covers
            for ho in range(Ho):
                for wo in range(Wo):
                    o = uint64(((n * Ho + ho) * Wo + wo) * C)
                    for i in range(kh):
                        for j in range(kw):
                            d = uint64(base + ((ho * kh + i) * W + wo * kw + j) * C)
                            tap = i * kw + j
                            for c in range(Cu):
                                dxf[d + c] = dyf[o + c] if idx[o + c] == tap else 0
        return
    for n in range(n0, n1):
        base = n * H * W * C
        clear(dxf, base, H * W * C)
        for ho in range(Ho):
            for wo in range(Wo):
                o = uint64(((n * Ho + ho) * Wo + wo) * C)
                corner = base + ((ho * sh - ph) * W + wo * sw - pw) * C    # tap (0, 0), may be outside
                for c in range(Cu):
                    tap = idx[o + c]
                    if tap >= 0:
                        i = tap // kw
                        dxf[uint64(corner + (i * W + tap - i * kw) * C) + c] += dyf[o + c]


@njit(**FAST)
def avgpool_fwd(t, nt, xf, yf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = sum over the window / (kh*kw) (padded zeros count)."""
    inv = xf.dtype.type(1.0 / (kh * kw))
    Cu = uint64(C)
    r0, r1 = part_range(t, nt, N * Ho)
    for nh in range(r0, r1):
        n = nh // Ho
        ho = nh - n * Ho
        yb = nh * Wo * C
        clear(yf, yb, Wo * C)
        for i in range(kh):
            h = ho * sh - ph + i
            if h < 0 or h >= H:
                continue
            xb = (n * H + h) * W * C
            for wo in range(Wo):
                o = uint64(yb + wo * C)
                for j in range(kw):
                    w = wo * sw - pw + j
                    if w < 0 or w >= W:
                        continue
                    s = uint64(xb + w * C)
                    for c in range(Cu):
                        yf[o + c] += xf[s + c]
        for q in range(uint64(Wo * C)):
            yf[uint64(yb) + q] *= inv


@njit(**FAST)
def avgpool_bwd(t, nt, dyf, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    inv = dyf.dtype.type(1.0 / (kh * kw))
    Cu = uint64(C)
    n0, n1 = part_range(t, nt, N)
    for n in range(n0, n1):
        base = n * H * W * C
        clear(dxf, base, H * W * C)
        for ho in range(Ho):
            for i in range(kh):
                h = ho * sh - ph + i
                if h < 0 or h >= H:
                    continue
                for wo in range(Wo):
                    o = uint64(((n * Ho + ho) * Wo + wo) * C)
                    for j in range(kw):
                        w = wo * sw - pw + j
                        if w < 0 or w >= W:
                            continue
                        d = uint64(base + (h * W + w) * C)
                        for c in range(Cu):
                            dxf[d + c] += dyf[o + c] * inv


@njit(**FAST)
def global_avg_fwd(t, nt, xf, yf, N, HW, C):
    inv = 1.0 / HW
    x3 = xf.reshape(N, HW, C)
    y2 = yf.reshape(N, C)
    acc = np.zeros(C, np.float64)
    n0, n1 = part_range(t, nt, N)
    for n in range(n0, n1):
        for c in range(C):
            acc[c] = 0
        xn = x3[n]
        for p in range(HW):
            for c in range(C):
                acc[c] += xn[p, c]
        for c in range(C):
            y2[n, c] = acc[c] * inv


@njit(**FAST)
def global_avg_bwd(t, nt, dyf, dxf, N, HW, C):
    inv = dyf.dtype.type(1.0 / HW)
    dx3 = dxf.reshape(N, HW, C)
    dy2 = dyf.reshape(N, C)
    n0, n1 = part_range(t, nt, N)
    for n in range(n0, n1):
        dn = dx3[n]
        for p in range(HW):
            for c in range(C):
                dn[p, c] = dy2[n, c] * inv


class PoolingKernels:
    """The host side of pooling, mixed into `CPUBackend`. ctx: (x's shape, the arg-max taps (int32) or None)."""

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
            POOL.run(global_avg_fwd, nt, x.reshape(-1), y.reshape(-1), n, h * w, c)
            return y, (x.shape, None)
        if spec.kind == "avg":
            POOL.run(avgpool_fwd, nt, x.reshape(-1), y.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
            return y, (x.shape, None)
        idx = np.empty((n, ho, wo, c), np.int32)
        POOL.run(maxpool_fwd, nt, x.reshape(-1), y.reshape(-1), idx.reshape(-1), n, h, w, c, ho, wo,
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
            POOL.run(global_avg_bwd, nt, dy.reshape(-1), dx.reshape(-1), n, h * w, c)
        elif spec.kind == "avg":
            POOL.run(avgpool_bwd, nt, dy.reshape(-1), dx.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
        else:
            POOL.run(maxpool_bwd, nt, dy.reshape(-1), idx.reshape(-1), dx.reshape(-1), n, h, w, c, ho, wo,
                     kh, kw, sh, sw, ph, pw)
        return dx
