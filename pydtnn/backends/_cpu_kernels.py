"""Pooling and batch-normalization kernels of the CPU backend (NHWC), compiled with numba.

All arrays are flat and C-contiguous; loops run over contiguous channels innermost, so they vectorize.
Parallel loops split rows (or images, where a thread scatters into its own image) across threads.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

_NJ = dict(cache=True, fastmath=True, boundscheck=False, nogil=True)
_NJ_STRICT = dict(cache=True, boundscheck=False, nogil=True)   # NaN/inf-aware comparisons (max pooling)


# --- pooling ---------------------------------------------------------------------------------------

@njit(parallel=True, **_NJ_STRICT)
def maxpool_fwd(xf, yf, idx, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = max over the window (padding counts as -inf); idx = first arg-max tap (i*kw + j), -1 if none."""
    for nh in prange(N * Ho):
        n = nh // Ho
        ho = nh - n * Ho
        for wo in range(Wo):
            o = (nh * Wo + wo) * C
            for c in range(C):
                yf[o + c] = -np.inf
                idx[o + c] = -1
            for i in range(kh):
                h = ho * sh - ph + i
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = wo * sw - pw + j
                    if w < 0 or w >= W:
                        continue
                    s = ((n * H + h) * W + w) * C
                    t = i * kw + j
                    for c in range(C):
                        v = xf[s + c]
                        if v > yf[o + c] or idx[o + c] < 0:
                            yf[o + c] = v
                            idx[o + c] = t
    return


@njit(parallel=True, **_NJ)
def maxpool_bwd(dyf, idx, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, nt):
    """dx[arg-max] += dy; an image belongs to one thread, so overlapping windows need no atomics."""
    per = (N + nt - 1) // nt
    for t in prange(nt):
        for n in range(t * per, min(N, (t + 1) * per)):
            base = n * H * W * C
            for q in range(H * W * C):
                dxf[base + q] = 0
            for ho in range(Ho):
                for wo in range(Wo):
                    o = ((n * Ho + ho) * Wo + wo) * C
                    for c in range(C):
                        tap = idx[o + c]
                        if tap >= 0:
                            i = tap // kw
                            j = tap - i * kw
                            h = ho * sh - ph + i
                            w = wo * sw - pw + j
                            dxf[base + (h * W + w) * C + c] += dyf[o + c]


@njit(parallel=True, **_NJ)
def avgpool_fwd(xf, yf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = sum over the window / (kh*kw) (padded zeros count)."""
    inv = xf.dtype.type(1.0 / (kh * kw))
    for nh in prange(N * Ho):
        n = nh // Ho
        ho = nh - n * Ho
        for wo in range(Wo):
            o = (nh * Wo + wo) * C
            for c in range(C):
                yf[o + c] = 0
            for i in range(kh):
                h = ho * sh - ph + i
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = wo * sw - pw + j
                    if w < 0 or w >= W:
                        continue
                    s = ((n * H + h) * W + w) * C
                    for c in range(C):
                        yf[o + c] += xf[s + c]
            for c in range(C):
                yf[o + c] *= inv


@njit(parallel=True, **_NJ)
def avgpool_bwd(dyf, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, nt):
    inv = dyf.dtype.type(1.0 / (kh * kw))
    per = (N + nt - 1) // nt
    for t in prange(nt):
        for n in range(t * per, min(N, (t + 1) * per)):
            base = n * H * W * C
            for q in range(H * W * C):
                dxf[base + q] = 0
            for ho in range(Ho):
                for wo in range(Wo):
                    o = ((n * Ho + ho) * Wo + wo) * C
                    for i in range(kh):
                        h = ho * sh - ph + i
                        if h < 0 or h >= H:
                            continue
                        for j in range(kw):
                            w = wo * sw - pw + j
                            if w < 0 or w >= W:
                                continue
                            d = base + (h * W + w) * C
                            for c in range(C):
                                dxf[d + c] += dyf[o + c] * inv


@njit(parallel=True, **_NJ)
def global_avg_fwd(xf, yf, N, HW, C):
    inv = 1.0 / HW
    for n in prange(N):
        acc = np.zeros(C, np.float64)
        base = n * HW * C
        for p in range(HW):
            for c in range(C):
                acc[c] += xf[base + p * C + c]
        for c in range(C):
            yf[n * C + c] = acc[c] * inv


@njit(parallel=True, **_NJ)
def global_avg_bwd(dyf, dxf, N, HW, C):
    inv = dyf.dtype.type(1.0 / HW)
    for n in prange(N):
        base = n * HW * C
        for p in range(HW):
            for c in range(C):
                dxf[base + p * C + c] = dyf[n * C + c] * inv


# --- batch normalization ---------------------------------------------------------------------------

@njit(parallel=True, **_NJ)
def bn_stats(xf, M, C, nt):
    """Per-channel mean and biased variance of x (M, C), one pass, shifted float64 sums (stable)."""
    per = (M + nt - 1) // nt
    s1 = np.zeros((nt, C), np.float64)
    s2 = np.zeros((nt, C), np.float64)
    shift = np.empty(C, np.float64)
    for c in range(C):
        shift[c] = xf[c]
    for t in prange(nt):
        a1 = np.zeros(C, np.float64)
        a2 = np.zeros(C, np.float64)
        for r in range(t * per, min(M, (t + 1) * per)):
            b = r * C
            for c in range(C):
                d = xf[b + c] - shift[c]
                a1[c] += d
                a2[c] += d * d
        for c in range(C):
            s1[t, c] = a1[c]
            s2[t, c] = a2[c]
    mean = np.empty(C, np.float64)
    var = np.empty(C, np.float64)
    for c in range(C):
        t1 = 0.0
        t2 = 0.0
        for t in range(nt):
            t1 += s1[t, c]
            t2 += s2[t, c]
        m1 = t1 / M
        mean[c] = shift[c] + m1
        var[c] = max(t2 / M - m1 * m1, 0.0)
    return mean, var


@njit(parallel=True, **_NJ)
def bn_apply(xf, center, scale, offset, yf, M, C, nt):
    """y = (x - center) * scale + offset, per channel."""
    per = (M + nt - 1) // nt
    for t in prange(nt):
        for r in range(t * per, min(M, (t + 1) * per)):
            b = r * C
            for c in range(C):
                yf[b + c] = (xf[b + c] - center[c]) * scale[c] + offset[c]


@njit(parallel=True, **_NJ)
def bn_bwd_sums(xf, dyf, mean, M, C, nt):
    """(sum dy, sum dy * (x - mean)) per channel, float64."""
    per = (M + nt - 1) // nt
    s1 = np.zeros((nt, C), np.float64)
    s2 = np.zeros((nt, C), np.float64)
    for t in prange(nt):
        a1 = np.zeros(C, np.float64)
        a2 = np.zeros(C, np.float64)
        for r in range(t * per, min(M, (t + 1) * per)):
            b = r * C
            for c in range(C):
                g = dyf[b + c]
                a1[c] += g
                a2[c] += g * (xf[b + c] - mean[c])
        for c in range(C):
            s1[t, c] = a1[c]
            s2[t, c] = a2[c]
    sdy = np.zeros(C, np.float64)
    sdyx = np.zeros(C, np.float64)
    for t in range(nt):
        for c in range(C):
            sdy[c] += s1[t, c]
            sdyx[c] += s2[t, c]
    return sdy, sdyx


@njit(parallel=True, **_NJ)
def bn_bwd_dx(xf, dyf, center, k1, k2, k3, dxf, M, C, nt):
    """dx = k1 * dy + k2 * (x - center) + k3, per channel."""
    per = (M + nt - 1) // nt
    for t in prange(nt):
        for r in range(t * per, min(M, (t + 1) * per)):
            b = r * C
            for c in range(C):
                dxf[b + c] = k1[c] * dyf[b + c] + k2[c] * (xf[b + c] - center[c]) + k3[c]
