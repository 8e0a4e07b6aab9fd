"""Convolution kernels of the CPU backend (NHWC), compiled with numba (private helper module).

Algorithm ("row-tap" packing fused with GEMM, one thread pool):
- The output rows of every image are cut into blocks; each numba thread takes a contiguous range of
  (image, row block) items and, for each, packs the input rows the block needs into a small buffer that
  stays in cache, then calls single-threaded BLAS on it right away.
- Row-tap packing expands only along the kernel WIDTH: packed row (h, wo) holds the kw*C values
  x[h, wo*sw + j*dw, c] (j, c). The kh kernel rows are then kh GEMMs on row-shifted slices of the same
  buffer (beta=1 accumulates), so the packed data is kw/sw times the input instead of kh*kw times
  (im2col). With a vertical stride the packed rows are stored phase by phase (h = q*sh + r), which keeps
  every kernel row's slice contiguous.
- `fold=True` packs all kh*kw taps (classic im2col) and runs ONE GEMM with a kh-times larger reduction:
  better when the channel count is small (first layer) and the packing cost is negligible.
- 1x1 convolutions with stride 1 and no padding skip packing (the NHWC input already is the matrix).
- Backward weights packs the same buffers and accumulates dW per thread (beta=1), then sums threads.
- Backward data: for stride 1 it is a forward convolution of dy with the flipped, transposed kernel (so
  it reuses the fast path); otherwise dcol = dy @ W^T per row block, scattered (col2im) into dx; an
  image belongs to a single thread, so the scatter needs no atomics.
- Depthwise (groups == C): direct per-tap multiply-accumulate, vectorized over contiguous channels.

Every kernel is serial and releases the GIL; it does part `t` of `nt` (`_cpu_pool` runs the parts on
threads). Arrays are passed flattened (1-D, C-contiguous) with their dimensions as ints, to keep one
compiled signature per dtype. `fp` is the address of cblas_?gemm (see `_cpu_blas`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from pydtnn.backends._cpu_blas import NO_TRANS, TRANS, addr, gemm

_NJ = dict(cache=True, fastmath=True, boundscheck=False, nogil=True)


# Performance note: inner loops index 0-based slice views with their loop variable. Indexing a flat
# array with a computed (signed) offset makes numba emit negative-index wraparound code that blocks
# vectorization (measured 8-10x slower copies).

@njit(**_NJ)
def _pack_row(xf, n, h, H, W, C, Wo, kw, sw, dw, pw, dst, d0, dstride):
    """dst[d0 + wo*dstride + j*C + c] = x[n, h, wo*sw + j*dw - pw, c], zero outside the image."""
    L = kw * C
    if h < 0 or h >= H:
        for wo in range(Wo):
            d = dst[d0 + wo * dstride:d0 + wo * dstride + L]
            for q in range(L):
                d[q] = 0
        return
    row = (n * H + h) * W * C
    xr = xf[row:row + W * C]
    if dw == 1 and sw == 1:
        # interior output columns: the kw*C values are contiguous in the input row
        lo = min(pw, Wo)               # first wo with wo - pw >= 0
        hi = min(W - kw + 1 + pw, Wo)  # wo < hi  <=>  wo - pw + kw - 1 <= W - 1
        if hi < lo:
            hi = lo
        for wo in range(lo, hi):
            d = dst[d0 + wo * dstride:d0 + wo * dstride + L]
            sx = xr[(wo - pw) * C:(wo - pw) * C + L]
            for q in range(L):
                d[q] = sx[q]
        for wo in range(0, lo):
            _pack_px(xr, W, C, kw, sw, dw, pw, wo, dst[d0 + wo * dstride:d0 + wo * dstride + L])
        for wo in range(hi, Wo):
            _pack_px(xr, W, C, kw, sw, dw, pw, wo, dst[d0 + wo * dstride:d0 + wo * dstride + L])
    else:
        for wo in range(Wo):
            _pack_px(xr, W, C, kw, sw, dw, pw, wo, dst[d0 + wo * dstride:d0 + wo * dstride + L])


@njit(**_NJ)
def _pack_px(xr, W, C, kw, sw, dw, pw, wo, d):
    """d[j*C + c] = xr[(wo*sw + j*dw - pw)*C + c] (one packed pixel of one input row xr)."""
    for j in range(kw):
        wi = wo * sw + j * dw - pw
        dj = d[j * C:(j + 1) * C]
        if wi < 0 or wi >= W:
            for c in range(C):
                dj[c] = 0
        else:
            sx = xr[wi * C:(wi + 1) * C]
            for c in range(C):
                dj[c] = sx[c]


@njit(**_NJ)
def _pack_block(xf, n, a, e, H, W, C, Wo, kh, kw, sh, sw, ph, pw, dh, dw, fold, nph, qext, buf):
    """Pack the input rows that output rows [a, e) of image n need (layout: see module doc)."""
    L = kw * C
    if fold:
        KK = kh * L
        for ho in range(a, e):
            for i in range(kh):
                _pack_row(xf, n, ho * sh + i * dh - ph, H, W, C, Wo, kw, sw, dw, pw,
                          buf, (ho - a) * Wo * KK + i * L, KK)
    else:
        R = e - a + qext
        for r in range(nph):
            for qq in range(R):
                _pack_row(xf, n, (a + qq) * sh + r - ph, H, W, C, Wo, kw, sw, dw, pw,
                          buf, ((r * R) + qq) * Wo * L, L)


@njit(**_NJ)
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
    per = (items + nt - 1) // nt
    has_bias = bias.size > 0
    buf = np.empty(bufsize, xf.dtype)
    for it in range(t * per, min(items, (t + 1) * per)):
        n = it // nblk
        a = (it - n * nblk) * rb
        e = min(Ho, a + rb)
        M = (e - a) * Wo
        yoff = (n * Ho + a) * Wo * K
        if direct:
            gemm(fp, NO_TRANS, NO_TRANS, M, K, C, one, addr(xf, (n * H + a) * W * C), C,
                 addr(wt, 0), K, zero, addr(yf, yoff), K)
        else:
            _pack_block(xf, n, a, e, H, W, C, Wo, kh, kw, sh, sw, ph, pw, dh, dw, fold, nph, qext, buf)
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


@njit(**_NJ)
def conv_bwd_w(t, nt, fp, xf, dyf, acc, dbacc, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw,
               rb, fold, direct, bufsize, with_bias):
    """acc[t] (kh, kw*C, K) += packed(x)^T dy and dbacc[t] (K,) += sum dy over this part's rows."""
    one = xf.dtype.type(1.0)
    L = kw * C
    nph = min(sh, (kh - 1) * dh + 1)
    qext = ((kh - 1) * dh) // sh
    nblk = (Ho + rb - 1) // rb
    items = N * nblk
    per = (items + nt - 1) // nt
    KK = kh * L
    buf = np.empty(bufsize, xf.dtype)
    for it in range(t * per, min(items, (t + 1) * per)):
        n = it // nblk
        a = (it - n * nblk) * rb
        e = min(Ho, a + rb)
        M = (e - a) * Wo
        yoff = (n * Ho + a) * Wo * K
        if direct:
            gemm(fp, TRANS, NO_TRANS, C, K, M, one, addr(xf, (n * H + a) * W * C), C,
                 addr(dyf, yoff), K, one, addr(acc, t * KK * K), K)
        else:
            _pack_block(xf, n, a, e, H, W, C, Wo, kh, kw, sh, sw, ph, pw, dh, dw, fold, nph, qext, buf)
            if fold:
                gemm(fp, TRANS, NO_TRANS, KK, K, M, one, addr(buf, 0), KK,
                     addr(dyf, yoff), K, one, addr(acc, t * KK * K), K)
            else:
                R = e - a + qext
                for i in range(kh):
                    r = (i * dh) % sh
                    o = (i * dh) // sh
                    gemm(fp, TRANS, NO_TRANS, L, K, M, one, addr(buf, (r * R + o) * Wo * L), L,
                         addr(dyf, yoff), K, one, addr(acc, t * KK * K + i * L * K), K)
        if with_bias:
            dbt = dbacc[t]
            yb = dyf[yoff:yoff + M * K]
            for p in range(M):
                yp = yb[p * K:(p + 1) * K]
                for k in range(K):
                    dbt[k] += yp[k]


@njit(**_NJ)
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
        dxn = dxf[base_n:base_n + H * W * C]
        for q in range(H * W * C):
            dxn[q] = 0
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
                            d = dxn[(h * W + wi) * C:(h * W + wi + 1) * C]
                            sc = dcol[src + j * C:src + (j + 1) * C]
                            for c in range(C):
                                d[c] += sc[c]


# --- depthwise --------------------------------------------------------------------------------------

@njit(**_NJ)
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
    if hi > Wo:
        hi = Wo
    if lo > hi:
        lo = hi
    return lo, hi


@njit(**_NJ)
def dw_fwd(t, nt, xf, wt, bias, yf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """Depthwise: y[n,ho,wo,c] = sum_ij x[n, ho*sh+i*dh-ph, wo*sw+j*dw-pw, c] * wt[i,j,c] + b[c]."""
    has_bias = bias.size > 0
    rows = N * Ho
    per = (rows + nt - 1) // nt
    for nh in range(t * per, min(rows, (t + 1) * per)):
        n = nh // Ho
        ho = nh - n * Ho
        yr = yf[nh * Wo * C:(nh + 1) * Wo * C]
        if has_bias:
            for wo in range(Wo):
                yp = yr[wo * C:(wo + 1) * C]
                for c in range(C):
                    yp[c] = bias[c]
        else:
            for q in range(Wo * C):
                yr[q] = 0
        for i in range(kh):
            h = ho * sh + i * dh - ph
            if h < 0 or h >= H:
                continue
            xr = xf[(n * H + h) * W * C:(n * H + h + 1) * W * C]
            for j in range(kw):
                lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                wv = wt[(i * kw + j) * C:(i * kw + j + 1) * C]
                for wo in range(lo, hi):
                    xs = (wo * sw + j * dw - pw) * C
                    xp = xr[xs:xs + C]
                    yp = yr[wo * C:(wo + 1) * C]
                    for c in range(C):
                        yp[c] += xp[c] * wv[c]


@njit(**_NJ)
def dw_bwd_data(t, nt, dyf, wt, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """Depthwise backward data, scattered per image (an image belongs to one thread)."""
    per = (N + nt - 1) // nt
    for n in range(t * per, min(N, (t + 1) * per)):
        dxn = dxf[n * H * W * C:(n + 1) * H * W * C]
        for q in range(H * W * C):
            dxn[q] = 0
        for ho in range(Ho):
            yr = dyf[(n * Ho + ho) * Wo * C:(n * Ho + ho + 1) * Wo * C]
            for i in range(kh):
                h = ho * sh + i * dh - ph
                if h < 0 or h >= H:
                    continue
                xr = dxn[h * W * C:(h + 1) * W * C]
                for j in range(kw):
                    lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                    wv = wt[(i * kw + j) * C:(i * kw + j + 1) * C]
                    for wo in range(lo, hi):
                        xs = (wo * sw + j * dw - pw) * C
                        xp = xr[xs:xs + C]
                        yp = yr[wo * C:(wo + 1) * C]
                        for c in range(C):
                            xp[c] += yp[c] * wv[c]


@njit(**_NJ)
def dw_bwd_w(t, nt, xf, dyf, acc, dbacc, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias):
    """Depthwise backward weights: acc[t] (kh, kw, C) and dbacc[t] (C,) partial sums of part t."""
    rows = N * Ho
    per = (rows + nt - 1) // nt
    at = acc[t]
    dbt = dbacc[t]
    for nh in range(t * per, min(rows, (t + 1) * per)):
        n = nh // Ho
        ho = nh - n * Ho
        yr = dyf[nh * Wo * C:(nh + 1) * Wo * C]
        if with_bias:
            for wo in range(Wo):
                yp = yr[wo * C:(wo + 1) * C]
                for c in range(C):
                    dbt[c] += yp[c]
        for i in range(kh):
            h = ho * sh + i * dh - ph
            if h < 0 or h >= H:
                continue
            xr = xf[(n * H + h) * W * C:(n * H + h + 1) * W * C]
            for j in range(kw):
                lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                av = at[(i * kw + j) * C:(i * kw + j + 1) * C]
                for wo in range(lo, hi):
                    xs = (wo * sw + j * dw - pw) * C
                    xp = xr[xs:xs + C]
                    yp = yr[wo * C:(wo + 1) * C]
                    for c in range(C):
                        av[c] += xp[c] * yp[c]
