"""Convolution kernels of the CPU backend (NHWC), compiled with numba (private helper module).

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
- Depthwise (groups == C): direct per-tap multiply-accumulate, vectorized over contiguous channels.

Every kernel is serial and releases the GIL; it does part `t` of `nt` (`_cpu_pool` runs the parts on
threads). Arrays are passed flattened (1-D, C-contiguous) with their dimensions as ints, to keep one
compiled signature per dtype. `fp` is the address of cblas_?gemm (see `_cpu_blas`).
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.runtime.blas import NO_TRANS, TRANS, addr, gemm

_NJ = {"cache": True, "fastmath": True, "boundscheck": False, "nogil": True}


# Performance note: hot inner loops index flat arrays with UNSIGNED (uint64) offsets. With a computed
# signed index numba emits negative-index wraparound code that blocks vectorization (measured 2-10x
# slower). Mixing uint64 and int64 in numba arithmetic gives float64, so offsets are converted whole.

@njit(**_NJ)
def _zero(dst, d0, n):
    du = uint64(d0)
    for q in range(uint64(n)):
        dst[du + q] = 0


@njit(**_NJ)
def _pack_row(xf, n, h, H, W, C, Wo, kw, sw, dw, pw, dst, d0, dstride):
    """dst[d0 + wo*dstride + j*C + c] = x[n, h, wo*sw + j*dw - pw, c], zero outside the image."""
    L = kw * C
    Lu = uint64(L)
    Cu = uint64(C)
    if h < 0 or h >= H:
        for wo in range(Wo):
            _zero(dst, d0 + wo * dstride, L)
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


@njit(**_NJ)
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


@njit(**_NJ)
def grid_part(t, nt, kparts, items, K):
    """Part t of nt: (first item, end item, k0, k1). The parts form a grid of nt // kparts item ranges
    by kparts ranges of output channels (k0 and k1 multiples of 8, so each range's loops start aligned)."""
    g = t // kparts
    q = t - g * kparts
    pc = nt // kparts
    per = (items + pc - 1) // pc
    k0 = (q * K // kparts) // 8 * 8
    k1 = K if q == kparts - 1 else ((q + 1) * K // kparts) // 8 * 8
    return g * per, min(items, (g + 1) * per), k0, k1


@njit(**_NJ)
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
        _zero(dxf, base_n, H * W * C)
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
    hi = min(hi, Wo)
    return min(lo, hi), hi


@njit(**_NJ)
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


@njit(**_NJ)
def dw_bwd_data(t, nt, dyf, wt, dxf, N, H, W, C, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """Depthwise backward data, scattered per image (an image belongs to one thread)."""
    Cu = uint64(C)
    per = (N + nt - 1) // nt
    for n in range(t * per, min(N, (t + 1) * per)):
        _zero(dxf, n * H * W * C, H * W * C)
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


@njit(**_NJ)
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
