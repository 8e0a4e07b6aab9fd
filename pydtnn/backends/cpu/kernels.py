"""Pooling and batch-normalization kernels of the CPU backend (NHWC), compiled with numba.

Every kernel is serial, releases the GIL and does part `t` of `nt` (rows, or whole images where it
scatters, so threads never write the same element); `_cpu_pool` runs the parts on threads. Arrays are
flat and C-contiguous; loops run over contiguous channels innermost, so they vectorize. Reductions write
per-part partial sums (float64) that the caller adds up.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

_NJ = {"cache": True, "fastmath": True, "boundscheck": False, "nogil": True}
_NJ_STRICT = {"cache": True, "boundscheck": False, "nogil": True}   # exact IEEE comparisons (max pooling)
# fast math that still keeps NaN and inf (a ReLU must pass a NaN on, as NumPy's maximum does, so that a
# diverged run shows in its loss)
_NJ_NAN = {"cache": True, "boundscheck": False, "nogil": True,
           "fastmath": {"nsz", "arcp", "contract", "afn", "reassoc"}}


def _part(t, nt, total):
    per = (total + nt - 1) // nt
    return t * per, min(total, (t + 1) * per)


_part = njit(**_NJ)(_part)


# Hot inner loops index flat arrays with UNSIGNED (uint64) offsets: with a computed signed index numba
# emits negative-index wraparound code that blocks vectorization (measured 2-10x slower). Mixing uint64
# and int64 in numba arithmetic gives float64, so offsets are converted whole.

@njit(**_NJ)
def _zero(dst, d0, n):
    du = uint64(d0)
    for q in range(uint64(n)):
        dst[du + q] = 0


# --- pooling ---------------------------------------------------------------------------------------

@njit(**_NJ_STRICT)
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


@njit(**_NJ_STRICT)
def maxpool_fwd(t, nt, xf, yf, idx, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = max over the window (padding counts as -inf); idx = FIRST arg-max tap (i*kw + j); -1 where the
    window holds nothing above -inf (NaN never wins; such windows get no gradient)."""
    Cu = uint64(C)
    r0, r1 = _part(t, nt, N * Ho)
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


@njit(**_NJ)
def maxpool_bwd(t, nt, dyf, idx, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """dx[arg-max] += dy, image by image (overlapping windows need no atomics). Windows that tile the
    input (stride == pool, no padding) take a gather path that writes each dx element once."""
    Cu = uint64(C)
    n0, n1 = _part(t, nt, N)
    if sh == kh and sw == kw and ph == 0 and pw == 0:
        for n in range(n0, n1):
            base = n * H * W * C
            if Ho * kh < H or Wo * kw < W:
                _zero(dxf, base, H * W * C)        # rows/columns that no window covers
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
        _zero(dxf, base, H * W * C)
        for ho in range(Ho):
            for wo in range(Wo):
                o = uint64(((n * Ho + ho) * Wo + wo) * C)
                corner = base + ((ho * sh - ph) * W + wo * sw - pw) * C    # tap (0, 0), may be outside
                for c in range(Cu):
                    tap = idx[o + c]
                    if tap >= 0:
                        i = tap // kw
                        dxf[uint64(corner + (i * W + tap - i * kw) * C) + c] += dyf[o + c]


@njit(**_NJ)
def avgpool_fwd(t, nt, xf, yf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    """y = sum over the window / (kh*kw) (padded zeros count)."""
    inv = xf.dtype.type(1.0 / (kh * kw))
    Cu = uint64(C)
    r0, r1 = _part(t, nt, N * Ho)
    for nh in range(r0, r1):
        n = nh // Ho
        ho = nh - n * Ho
        yb = nh * Wo * C
        _zero(yf, yb, Wo * C)
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


@njit(**_NJ)
def avgpool_bwd(t, nt, dyf, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw):
    inv = dyf.dtype.type(1.0 / (kh * kw))
    Cu = uint64(C)
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        base = n * H * W * C
        _zero(dxf, base, H * W * C)
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


@njit(**_NJ)
def global_avg_fwd(t, nt, xf, yf, N, HW, C):
    inv = 1.0 / HW
    x3 = xf.reshape(N, HW, C)
    y2 = yf.reshape(N, C)
    acc = np.zeros(C, np.float64)
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        for c in range(C):
            acc[c] = 0
        xn = x3[n]
        for p in range(HW):
            for c in range(C):
                acc[c] += xn[p, c]
        for c in range(C):
            y2[n, c] = acc[c] * inv


@njit(**_NJ)
def global_avg_bwd(t, nt, dyf, dxf, N, HW, C):
    inv = dyf.dtype.type(1.0 / HW)
    dx3 = dxf.reshape(N, HW, C)
    dy2 = dyf.reshape(N, C)
    n0, n1 = _part(t, nt, N)
    for n in range(n0, n1):
        dn = dx3[n]
        for p in range(HW):
            for c in range(C):
                dn[p, c] = dy2[n, c] * inv


# --- batch normalization ---------------------------------------------------------------------------

@njit(**_NJ)
def bn_sums(t, nt, xf, ldx, dyf, center, s1, s2, M, C, backward, fk2, fk3, relu):
    """Per-channel partial sums of part t, into s1[t], s2[t] (float64):
    forward  (backward=False): sum d, sum d*d with d = x - center (shifted sums: stable variance);
    backward (backward=True):  sum dy, sum dy * (x - center); with `relu`, dy counts only where the
    fused ReLU's output was positive: where fk2 * (x - center) + fk3, the forward's own float32 affine
    map, is (the ReLU's backward, fused, without reading its output).
    x's row r starts at xf[r * ldx] (ldx >= C: x may be a channel slice, as a dense block's input is), dy is
    (M, C). Blocks of 128 rows accumulate in the data's dtype (twice the SIMD width of float64, measured
    ~1.3-2x faster), blocks add up in float64."""
    a1 = np.zeros(C, np.float64)        # thread-private accumulators (no false sharing)
    a2 = np.zeros(C, np.float64)
    b1 = np.zeros(C, xf.dtype)
    b2 = np.zeros(C, xf.dtype)
    cc = np.empty(C, xf.dtype)
    zero = xf.dtype.type(0)
    for c in range(C):
        cc[c] = center[c]
    uc, ul = uint64(C), uint64(ldx)
    r0, r1 = _part(t, nt, M)
    for rb in range(r0, r1, 128):
        re = min(r1, rb + 128)
        for c in range(C):
            b1[c] = 0
            b2[c] = 0
        if backward and relu:
            for r in range(rb, re):
                xo, go = uint64(r) * ul, uint64(r) * uc
                for c in range(uc):
                    d = xf[xo + c] - cc[c]
                    g = dyf[go + c] if fk2[c] * d + fk3[c] > zero else zero
                    b1[c] += g
                    b2[c] += g * d
        elif backward:
            for r in range(rb, re):
                xo, go = uint64(r) * ul, uint64(r) * uc
                for c in range(uc):
                    g = dyf[go + c]
                    b1[c] += g
                    b2[c] += g * (xf[xo + c] - cc[c])
        else:
            for r in range(rb, re):
                xo = uint64(r) * ul
                for c in range(uc):
                    d = xf[xo + c] - cc[c]
                    b1[c] += d
                    b2[c] += d * d
        for c in range(C):
            a1[c] += b1[c]
            a2[c] += b2[c]
    for c in range(C):
        s1[t, c] = a1[c]
        s2[t, c] = a2[c]


@njit(**_NJ_NAN)
def bn_affine(t, nt, xf, ldx, dyf, center, k1, k2, k3, outf, M, C, with_dy, fk2, fk3, relu, addf, lda, with_add):
    """out = k1 * dy + k2 * (x - center) + k3 per channel (without the dy term when not with_dy).
    `relu` fuses a following ReLU: forward, out = max(out, 0); backward, dy counts only where the forward's
    fk2 * (x - center) + fk3 was positive. `with_add` adds row r of addf (at addf[r * lda]) to out's: a
    gradient from another path summed in the same pass. x's rows are ldx apart (bn_sums), dy's and out's C."""
    zero = xf.dtype.type(0)
    uc, ul, ua = uint64(C), uint64(ldx), uint64(lda)
    r0, r1 = _part(t, nt, M)
    for r in range(r0, r1):
        xo, o = uint64(r) * ul, uint64(r) * uc
        if with_dy and relu:
            for c in range(uc):
                d = xf[xo + c] - center[c]
                g = dyf[o + c] if fk2[c] * d + fk3[c] > zero else zero
                outf[o + c] = k1[c] * g + k2[c] * d + k3[c]
        elif with_dy:
            for c in range(uc):
                outf[o + c] = k1[c] * dyf[o + c] + k2[c] * (xf[xo + c] - center[c]) + k3[c]
        elif relu:
            for c in range(uc):
                v = k2[c] * (xf[xo + c] - center[c]) + k3[c]
                outf[o + c] = zero if v <= zero else v
        else:
            for c in range(uc):
                outf[o + c] = k2[c] * (xf[xo + c] - center[c]) + k3[c]
        if with_add:
            ao = uint64(r) * ua
            for c in range(uc):
                outf[o + c] += addf[ao + c]


# --- ReLU ------------------------------------------------------------------------------------------

@njit(**_NJ_NAN)
def relu_fwd(t, nt, xf, yf):
    """y = max(x, 0) (NaN stays NaN), in parts of the flat array."""
    zero = xf.dtype.type(0)
    i0, i1 = _part(t, nt, xf.size)
    for i in range(uint64(i0), uint64(i1)):
        v = xf[i]
        yf[i] = zero if v <= zero else v


@njit(**_NJ_NAN)
def relu_bwd(t, nt, dyf, yf, dxf):
    """dx = dy where y > 0, else 0."""
    zero = dyf.dtype.type(0)
    i0, i1 = _part(t, nt, dyf.size)
    for i in range(uint64(i0), uint64(i1)):
        dxf[i] = dyf[i] if yf[i] > 0 else zero


@njit(**_NJ_NAN)
def add_fwd(t, nt, af, bf, yf, relu):
    """y = a + b, or relu(a + b) (NaN stays NaN)."""
    zero = af.dtype.type(0)
    i0, i1 = _part(t, nt, af.size)
    if relu:
        for i in range(uint64(i0), uint64(i1)):
            v = af[i] + bf[i]
            yf[i] = zero if v <= zero else v
    else:
        for i in range(uint64(i0), uint64(i1)):
            yf[i] = af[i] + bf[i]
