"""Pooling and batch-normalization kernels of the CPU backend (NHWC), compiled with numba.

Every kernel is serial, releases the GIL and does part `t` of `nt` (rows, or whole images where it
scatters, so threads never write the same element); `_cpu_pool` runs the parts on threads. Arrays are
flat and C-contiguous; loops run over contiguous channels innermost, so they vectorize. Reductions write
per-part partial sums (float64) that the caller adds up.
"""
from __future__ import annotations

import numpy as np
from numba import njit

_NJ = dict(cache=True, fastmath=True, boundscheck=False, nogil=True)
_NJ_STRICT = dict(cache=True, boundscheck=False, nogil=True)   # exact IEEE comparisons (max pooling)


def _part(t, nt, total):
    per = (total + nt - 1) // nt
    return t * per, min(total, (t + 1) * per)


_part = njit(**_NJ)(_part)


# Inner loops index 0-based slice views with their loop variable: computed signed offsets into a flat
# array make numba emit negative-index wraparound code that blocks vectorization.

# --- pooling ---------------------------------------------------------------------------------------

@njit(**_NJ_STRICT)
def maxpool_fwd(t, nt, xf, yf, idx, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = max over the window (padding counts as -inf); idx = FIRST arg-max tap (i*kw + j), -1 if none."""
    r0, r1 = _part(t, nt, N * Ho)
    for nh in range(r0, r1):
        n = nh // Ho
        ho = nh - n * Ho
        for wo in range(Wo):
            o = (nh * Wo + wo) * C
            yp = yf[o:o + C]
            ip = idx[o:o + C]
            for c in range(C):
                yp[c] = -np.inf
                ip[c] = -1
            for i in range(kh):
                h = ho * sh - ph + i
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = wo * sw - pw + j
                    if w < 0 or w >= W:
                        continue
                    s = ((n * H + h) * W + w) * C
                    xp = xf[s:s + C]
                    tap = i * kw + j
                    for c in range(C):
                        v = xp[c]
                        if v > yp[c] or ip[c] < 0:
                            yp[c] = v
                            ip[c] = tap


@njit(**_NJ)
def maxpool_bwd(t, nt, dyf, idx, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """dx[arg-max] += dy, image by image (overlapping windows need no atomics)."""
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        dxn = dxf[n * H * W * C:(n + 1) * H * W * C]
        for q in range(H * W * C):
            dxn[q] = 0
        for ho in range(Ho):
            for wo in range(Wo):
                o = ((n * Ho + ho) * Wo + wo) * C
                yp = dyf[o:o + C]
                ip = idx[o:o + C]
                for c in range(C):
                    tap = ip[c]
                    if tap >= 0:
                        i = tap // kw
                        j = tap - i * kw
                        dxn[((ho * sh - ph + i) * W + wo * sw - pw + j) * C + c] += yp[c]


@njit(**_NJ)
def avgpool_fwd(t, nt, xf, yf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = sum over the window / (kh*kw) (padded zeros count)."""
    inv = xf.dtype.type(1.0 / (kh * kw))
    r0, r1 = _part(t, nt, N * Ho)
    for nh in range(r0, r1):
        n = nh // Ho
        ho = nh - n * Ho
        for wo in range(Wo):
            o = (nh * Wo + wo) * C
            yp = yf[o:o + C]
            for c in range(C):
                yp[c] = 0
            for i in range(kh):
                h = ho * sh - ph + i
                if h < 0 or h >= H:
                    continue
                for j in range(kw):
                    w = wo * sw - pw + j
                    if w < 0 or w >= W:
                        continue
                    s = ((n * H + h) * W + w) * C
                    xp = xf[s:s + C]
                    for c in range(C):
                        yp[c] += xp[c]
            for c in range(C):
                yp[c] *= inv


@njit(**_NJ)
def avgpool_bwd(t, nt, dyf, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    inv = dyf.dtype.type(1.0 / (kh * kw))
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        dxn = dxf[n * H * W * C:(n + 1) * H * W * C]
        for q in range(H * W * C):
            dxn[q] = 0
        for ho in range(Ho):
            for wo in range(Wo):
                o = ((n * Ho + ho) * Wo + wo) * C
                yp = dyf[o:o + C]
                for i in range(kh):
                    h = ho * sh - ph + i
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = wo * sw - pw + j
                        if w < 0 or w >= W:
                            continue
                        d = dxn[(h * W + w) * C:(h * W + w + 1) * C]
                        for c in range(C):
                            d[c] += yp[c] * inv


@njit(**_NJ)
def global_avg_fwd(t, nt, xf, yf, N, HW, C):
    inv = 1.0 / HW
    acc = np.zeros(C, np.float64)
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        for c in range(C):
            acc[c] = 0
        xn = xf[n * HW * C:(n + 1) * HW * C]
        for p in range(HW):
            xp = xn[p * C:(p + 1) * C]
            for c in range(C):
                acc[c] += xp[c]
        yp = yf[n * C:(n + 1) * C]
        for c in range(C):
            yp[c] = acc[c] * inv


@njit(**_NJ)
def global_avg_bwd(t, nt, dyf, dxf, N, HW, C):
    inv = dyf.dtype.type(1.0 / HW)
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        yp = dyf[n * C:(n + 1) * C]
        dxn = dxf[n * HW * C:(n + 1) * HW * C]
        for p in range(HW):
            d = dxn[p * C:(p + 1) * C]
            for c in range(C):
                d[c] = yp[c] * inv


# --- batch normalization ---------------------------------------------------------------------------

@njit(**_NJ)
def bn_sums(t, nt, xf, dyf, center, s1, s2, M, C, backward):
    """Per-channel float64 partial sums of part t, into s1[t], s2[t]:
    forward  (backward=False): sum d, sum d*d with d = x - center (shifted sums: stable variance);
    backward (backward=True):  sum dy, sum dy * (x - center)."""
    a1 = s1[t]
    a2 = s2[t]
    for c in range(C):
        a1[c] = 0
        a2[c] = 0
    r0, r1 = _part(t, nt, M)
    if backward:
        for r in range(r0, r1):
            xr = xf[r * C:(r + 1) * C]
            gr = dyf[r * C:(r + 1) * C]
            for c in range(C):
                g = gr[c]
                a1[c] += g
                a2[c] += g * (xr[c] - center[c])
    else:
        for r in range(r0, r1):
            xr = xf[r * C:(r + 1) * C]
            for c in range(C):
                d = xr[c] - center[c]
                a1[c] += d
                a2[c] += d * d


@njit(**_NJ)
def bn_affine(t, nt, xf, dyf, center, k1, k2, k3, outf, M, C, with_dy):
    """out = k1 * dy + k2 * (x - center) + k3 per channel (without the dy term when not with_dy)."""
    r0, r1 = _part(t, nt, M)
    if with_dy:
        for r in range(r0, r1):
            xr = xf[r * C:(r + 1) * C]
            gr = dyf[r * C:(r + 1) * C]
            orow = outf[r * C:(r + 1) * C]
            for c in range(C):
                orow[c] = k1[c] * gr[c] + k2[c] * (xr[c] - center[c]) + k3[c]
    else:
        for r in range(r0, r1):
            xr = xf[r * C:(r + 1) * C]
            orow = outf[r * C:(r + 1) * C]
            for c in range(C):
                orow[c] = k2[c] * (xr[c] - center[c]) + k3[c]
