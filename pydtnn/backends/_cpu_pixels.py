"""Convolutions of tiny images (a few output pixels) as one GEMM per (output pixel, kernel tap), numba.

Why: on VGG's 2x2 images a 3x3 convolution with padding 1 sees 4 of its 9 taps at every output pixel;
the packing paths of `_cpu_conv` multiply the other 5 by zeros, 2.25x the work, and pack the input first.
Here, for every output pixel p and every tap (i, j) that lands inside the image, at input pixel q:
    forward          y[:, p, ks]  += x[:, q, :]  @ W[i, j][:, ks]       (N x C) @ (C x K)
    backward data    dx[:, q, cs] += dy[:, p, :] @ W[i, j][cs, :]^T     (N x K) @ (K x C)
    backward weights dW[i, j][:, ks] += x[:, q, :]^T @ dy[:, p, ks]     (C x N) @ (N x K)
W (kh, kw, C, K) is the direct kernels' filter layout; the batch is the GEMMs' long side, read in place
(rows H*W*C apart), nothing is packed. Part t of nt takes a range of output channels ks (of input
channels cs in backward data), so parts never write the same element and there is one dW. The arithmetic
of an element does not depend on the parts.

Every kernel is serial and releases the GIL; arrays are flat and C-contiguous.
"""
from __future__ import annotations

from numba import njit, uint64

from pydtnn.backends._cpu_blas import NO_TRANS, TRANS, addr, gemm
from pydtnn.backends._cpu_conv import grid_part

_NJ = {"cache": True, "fastmath": True, "boundscheck": False, "nogil": True}


@njit(**_NJ)
def _source(ho, wo, i, j, H, W, sh, sw, ph, pw, dh, dw):
    """Input pixel index of output pixel (ho, wo) under tap (i, j), or -1 where it falls in the padding."""
    h = ho * sh - ph + i * dh
    w = wo * sw - pw + j * dw
    if h < 0 or h >= H or w < 0 or w >= W:
        return -1
    return h * W + w


@njit(**_NJ)
def fwd(t, nt, fp, xf, wt, bias, yf, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """y (N, Ho, Wo, K) = conv(x (N, H, W, C), wt (kh, kw, C, K)) + bias, output channels of part t."""
    one = xf.dtype.type(1.0)
    zero = xf.dtype.type(0.0)
    _, _, k0, k1 = grid_part(t, nt, nt, 1, K)
    kn = k1 - k0
    if kn <= 0:
        return
    has_bias = bias.size > 0
    P = Ho * Wo
    for n in range(N):                          # bias (or zero) first; every valid tap accumulates
        for p in range(P):
            o = uint64((n * P + p) * K + k0)
            for k in range(uint64(kn)):
                yf[o + k] = bias[uint64(k0) + k] if has_bias else zero
    for ho in range(Ho):
        for wo in range(Wo):
            p = ho * Wo + wo
            for i in range(kh):
                for j in range(kw):
                    q = _source(ho, wo, i, j, H, W, sh, sw, ph, pw, dh, dw)
                    if q >= 0:
                        gemm(fp, NO_TRANS, NO_TRANS, N, kn, C, one, addr(xf, q * C), H * W * C,
                             addr(wt, (i * kw + j) * C * K + k0), K, one, addr(yf, p * K + k0), P * K)


@njit(**_NJ)
def bwd_data(t, nt, fp, dyf, wt, dxf, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw):
    """dx (N, H, W, C) from dy (N, Ho, Wo, K) and wt (kh, kw, C, K), input channels of part t."""
    one = dyf.dtype.type(1.0)
    zero = dyf.dtype.type(0.0)
    _, _, c0, c1 = grid_part(t, nt, nt, 1, C)
    cn = c1 - c0
    if cn <= 0:
        return
    Q = H * W
    for n in range(N):
        for q in range(Q):
            o = uint64((n * Q + q) * C + c0)
            for c in range(uint64(cn)):
                dxf[o + c] = zero
    for ho in range(Ho):
        for wo in range(Wo):
            p = ho * Wo + wo
            for i in range(kh):
                for j in range(kw):
                    q = _source(ho, wo, i, j, H, W, sh, sw, ph, pw, dh, dw)
                    if q >= 0:
                        gemm(fp, NO_TRANS, TRANS, N, cn, K, one, addr(dyf, p * K), Ho * Wo * K,
                             addr(wt, ((i * kw + j) * C + c0) * K), K, one, addr(dxf, q * C + c0), Q * C)


@njit(**_NJ)
def bwd_w(t, nt, fp, xf, dyf, dwt, dbacc, N, H, W, C, K, Ho, Wo, kh, kw, sh, sw, ph, pw, dh, dw, with_bias):
    """dwt (kh, kw, C, K) += x^T dy per tap (zeroed by the caller), dbacc (K,) = sum of dy; output channels
    of part t."""
    one = xf.dtype.type(1.0)
    _, _, k0, k1 = grid_part(t, nt, nt, 1, K)
    kn = k1 - k0
    if kn <= 0:
        return
    P = Ho * Wo
    for ho in range(Ho):
        for wo in range(Wo):
            p = ho * Wo + wo
            for i in range(kh):
                for j in range(kw):
                    q = _source(ho, wo, i, j, H, W, sh, sw, ph, pw, dh, dw)
                    if q >= 0:
                        gemm(fp, TRANS, NO_TRANS, C, kn, N, one, addr(xf, q * C), H * W * C,
                             addr(dyf, p * K + k0), P * K, one, addr(dwt, (i * kw + j) * C * K + k0), K)
    if with_bias:
        for r in range(N * P):
            o = uint64(r * K + k0)
            for k in range(uint64(kn)):
                dbacc[uint64(k0) + k] += dyf[o + k]
