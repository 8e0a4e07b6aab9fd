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


@njit(**_NJ)
def _pack_row(xf, n, h, H, W, C, Wo, kw, sw, dw, pw, dst, d0, dstride):
    """dst[d0 + wo*dstride + j*C + c] = x[n, h, wo*sw + j*dw - pw, c], zero outside the image."""
    L = kw * C
    if h < 0 or h >= H:
        for wo in range(Wo):
            base = d0 + wo * dstride
            for q in range(L):
                dst[base + q] = 0
        return
    row = (n * H + h) * W * C
    if dw == 1 and sw == 1:
        # interior output columns: the kw*C values are contiguous in the input row
        lo = pw                        # first wo with wo - pw >= 0
        hi = W - kw + 1 + pw           # wo < hi  <=>  wo - pw + kw - 1 <= W - 1
        if lo > Wo:
            lo = Wo
        if hi > Wo:
            hi = Wo
        if hi < lo:
            hi = lo
        for wo in range(lo, hi):
            base = d0 + wo * dstride
            s = row + (wo - pw) * C
            for q in range(L):
                dst[base + q] = xf[s + q]
        for wo in range(0, lo):
            _pack_px(xf, row, W, C, kw, sw, dw, pw, wo, dst, d0 + wo * dstride)
        for wo in range(hi, Wo):
            _pack_px(xf, row, W, C, kw, sw, dw, pw, wo, dst, d0 + wo * dstride)
    else:
        for wo in range(Wo):
            _pack_px(xf, row, W, C, kw, sw, dw, pw, wo, dst, d0 + wo * dstride)


@njit(**_NJ)
def _pack_px(xf, row, W, C, kw, sw, dw, pw, wo, dst, base):
    for j in range(kw):
        wi = wo * sw + j * dw - pw
        o = base + j * C
        if wi < 0 or wi >= W:
            for c in range(C):
                dst[o + c] = 0
        else:
            s = row + wi * C
            for c in range(C):
                dst[o + c] = xf[s + c]


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
            for p in range(M):
                base = yoff + p * K
                for k in range(K):
                    yf[base + k] += bias[k]


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
            for p in range(M):
                base = yoff + p * K
                for k in range(K):
                    dbacc[t, k] += dyf[base + k]


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
        for q in range(H * W * C):
            dxf[base_n + q] = 0
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
                            d = base_n + (h * W + wi) * C
                            s = src + j * C
                            for c in range(C):
                                dxf[d + c] += dcol[s + c]


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
        ybase = nh * Wo * C
        if has_bias:
            for wo in range(Wo):
                for c in range(C):
                    yf[ybase + wo * C + c] = bias[c]
        else:
            for q in range(Wo * C):
                yf[ybase + q] = 0
        for i in range(kh):
            h = ho * sh + i * dh - ph
            if h < 0 or h >= H:
                continue
            xrow = (n * H + h) * W * C
            for j in range(kw):
                lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                wb = (i * kw + j) * C
                for wo in range(lo, hi):
                    xs = xrow + (wo * sw + j * dw - pw) * C
                    ys = ybase + wo * C
                    for c in range(C):
                        yf[ys + c] += xf[xs + c] * wt[wb + c]


@njit(**_NJ)
def dw_bwd_data(t, nt, dyf, wt, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """Depthwise backward data, scattered per image (an image belongs to one thread)."""
    per = (N + nt - 1) // nt
    for n in range(t * per, min(N, (t + 1) * per)):
        base_n = n * H * W * C
        for q in range(H * W * C):
            dxf[base_n + q] = 0
        for ho in range(Ho):
            ybase = (n * Ho + ho) * Wo * C
            for i in range(kh):
                h = ho * sh + i * dh - ph
                if h < 0 or h >= H:
                    continue
                xrow = base_n + h * W * C
                for j in range(kw):
                    lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                    wb = (i * kw + j) * C
                    for wo in range(lo, hi):
                        xs = xrow + (wo * sw + j * dw - pw) * C
                        ys = ybase + wo * C
                        for c in range(C):
                            dxf[xs + c] += dyf[ys + c] * wt[wb + c]


@njit(**_NJ)
def dw_bwd_w(t, nt, xf, dyf, acc, dbacc, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias):
    """Depthwise backward weights: acc[t] (kh, kw, C) and dbacc[t] (C,) partial sums of part t."""
    rows = N * Ho
    per = (rows + nt - 1) // nt
    for nh in range(t * per, min(rows, (t + 1) * per)):
        n = nh // Ho
        ho = nh - n * Ho
        ybase = nh * Wo * C
        if with_bias:
            for q in range(Wo):
                for c in range(C):
                    dbacc[t, c] += dyf[ybase + q * C + c]
        for i in range(kh):
            h = ho * sh + i * dh - ph
            if h < 0 or h >= H:
                continue
            xrow = (n * H + h) * W * C
            for j in range(kw):
                lo, hi = _wo_range(Wo, W, sw, pw, j, dw)
                wb = (i * kw + j) * C
                for wo in range(lo, hi):
                    xs = xrow + (wo * sw + j * dw - pw) * C
                    ys = ybase + wo * C
                    for c in range(C):
                        acc[t, wb + c] += xf[xs + c] * dyf[ys + c]
