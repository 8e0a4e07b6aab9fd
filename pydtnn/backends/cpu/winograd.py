"""Winograd convolution on the CPU backend (NHWC, 3x3 filters, stride 1): the kernels, compiled with numba,
then `WinogradConvKernels`, their host side. The transforms themselves are `winograd_transforms`.

F(m x m, 3 x 3) computes an m x m output tile from an a x a input tile (a = m + 2) with a*a products per
(input channel, output channel) pair instead of 9*m*m: 2.25x fewer for m = 2, 4x fewer for m = 4
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). With the transforms
    input   V = B^T d B        (a x a, per input channel)
    filter  U = G g G^T        (a x a, per filter)
    output  Y = A^T M A        (m x m, per output channel),   M[e] = sum_c V[e, c] U[e, c, :]
the a*a element-wise products over channels are a*a GEMMs (tiles x C) @ (C x K).

How it runs (the design of `conv`: one thread pool, cache-sized blocks, single-threaded BLAS):
- The output tiles of all images, in (image, tile row, tile column) order, are cut into chunks of `tb`
  tiles; each thread takes a contiguous range of chunks, or (too few chunks to share, `kparts`) every
  chunk in a range of output channels. Per chunk: transform the input tiles into a small buffer
  V (a*a, tb, C), run the a*a GEMMs into M (a*a, tb, K), transform M into the output. Both buffers
  stay in L2; nothing of size "whole batch in the Winograd domain" is ever allocated.
- Padding is any integer (negative crops): tiles read the input at an offset and treat what lies
  outside as zeros; tiles hanging over the output's edge compute, and drop, the extra outputs.
- Backward data is the same kernel on dy with the flipped filter (in/out channels swapped), padding 2 - p.
- Backward weights: dU[e] = sum_tiles V[e]^T dYhat[e], with dYhat = A dy A^T per tile (zero beyond the
  output's edge): one GEMM per chunk and e with the tiles as the (long) reduction; then dw = G^T dU G.

Kernels follow `jit`'s conventions.
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
from pydtnn.backends.cpu.winograd_transforms import bt, filter_transform, transform2d, weight_grad_transform

# The tile size the backend uses: F(4x4, 3x3) (see docs/performance.md for the measurements: F(2x2, 3x3)
# was slower on every ResNet-20 shape, its transforms cost more per output than the GEMMs it saves).
TILE = 4


def applies(spec) -> bool:
    """Winograd covers dense 3x3 convolutions with stride 1 and dilation 1 (any padding)."""
    return (tuple(spec.kernel) == (3, 3) and tuple(spec.stride) == (1, 1) and tuple(spec.dilation) == (1, 1)
            and spec.groups == 1)


def pays(spec, h: int, w: int) -> bool:
    """The "auto" rule, measured on this project's machines (docs/performance.md): Winograd wins in all
    three passes once both channel counts reach 32; with fewer, the per-tile transforms cost more than
    the GEMMs save (16 -> 16: forward 0.78-0.91x, backward weights 0.94-1.20x against 512-row direct
    blocks, slower than the 256-row blocks the direct backward weights now uses). Images smaller than one
    output tile waste most of it: VGG-11's 512 -> 512 on 2x2 ran 1.9-2.8x slower than direct."""
    return spec.in_channels >= 32 and spec.out_channels >= 32 and min(h, w) >= TILE


def chunk_tiles(c: int, k: int, m: int = TILE) -> int:
    """Tiles per chunk: 64 measured best or within 5% of it on every ResNet-20 shape (16 to 256 tried)."""
    return 64


def tiles(n: int, ho: int, wo: int, m: int = TILE) -> int:
    """Output tiles of a batch."""
    return n * (-(-ho // m)) * (-(-wo // m))


def kparts(t: int, tb: int, c: int, k: int, nt: int, weights_pass: bool) -> int:
    """How the nt parts split a pass over t tiles in chunks of tb: 1 (each part takes a range of chunks)
    or nt (each part takes all chunks, in a range of output channels). Measured at 2 threads, batch 64
    (docs/performance.md, fifth pass):
    - With fewer than two chunks a part, ranges of chunks cannot be balanced: VGG-11's 512 -> 512 on 4x4
      images is one chunk, so one part did all of it (forward 29.4 ms against 33.0 at 1 thread; by
      channels 20.2).
    - Backward weights gives each range of chunks its own (a*a, C, K) accumulator, zeroed and summed
      afterwards (38 MB each for 512 x 512): by channels there is one. That paid once 4 K >= t
      (128 -> 256 on 8x8: 7.4 -> 6.5 ms; 64 -> 64 on 8x8: 1.53 -> 1.48), not below (64 -> 128 on 16x16:
      5.8 -> 6.8; 32 -> 32 on 16x16: 1.8 -> 2.6, where every part transforms all input tiles again)."""
    if nt == 1:
        return 1
    if -(-t // tb) < 2 * nt or (weights_pass and 4 * k >= t):
        return nt
    return 1



@njit(**FAST)
def _tile_of(tile, TH, TW):
    n = tile // (TH * TW)
    r = tile - n * TH * TW
    ti = r // TW
    return n, ti, r - ti * TW

@njit(**FAST)
def _gather_run(xf, n, h0, w0, R, m, H, W, C, D):
    """D (a, a, R, C)[r, s, q] = x[n, h0 + r, w0 + q*m + s, :] for R consecutive tiles, zero outside."""
    a = m + 2
    Cu = uint64(C)
    for r in range(a):
        h = h0 + r
        for s in range(a):
            base = (r * a + s) * R * C
            for q in range(R):
                w = w0 + q * m + s
                du = uint64(base + q * C)
                if h < 0 or h >= H or w < 0 or w >= W:
                    for c in range(Cu):
                        D[du + c] = 0
                else:
                    su = uint64(((n * H + h) * W + w) * C)
                    for c in range(Cu):
                        D[du + c] = xf[su + c]


@njit(**FAST)
def _input_tiles(xf, t0, nb, tb, TH, TW, m, H, W, C, ph, pw, D, E, V):
    """V (a*a, tb, C) rows [0, nb) = B^T d B of tiles t0 .. t0 + nb - 1. Tiles are taken in runs along a
    row of tiles and laid out (r, s, tile, C), so both passes loop over tiles x channels at once (long,
    vectorized loops even with 16 channels) instead of one tile's channels."""
    a = m + 2
    tt = 0
    while tt < nb:
        tile = t0 + tt
        n = tile // (TH * TW)
        ti = (tile - n * TH * TW) // TW
        tj = tile - n * TH * TW - ti * TW
        R = min(nb - tt, TW - tj)               # the run: to the end of this row of tiles or of the chunk
        L = R * C
        _gather_run(xf, n, ti * m - ph, tj * m - pw, R, m, H, W, C, D)
        for r in range(a):                      # along s: E[r, j] = B^T D[r, :]
            bt(m, D, r * a * L, L, E, r * a * L, L, L)
        for j in range(a):                      # along r: V[i*a + j, tt:tt+R] = B^T E[:, j]
            bt(m, E, j * L, a * L, V, j * tb * C + tt * C, a * tb * C, L)
        tt += R


@njit(**FAST)
def fwd(t, nt, fp, xf, U, bias, yf, N, H, W, C, K, Ho, Wo, ph, pw, m, tb, kparts):
    """y (N, Ho, Wo, K) = conv3x3(x (N, H, W, C), padding (ph, pw)) + bias, from U (a*a, C, K); this part's
    chunks and output channels (`grid_part`)."""
    one = xf.dtype.type(1.0)
    zero = xf.dtype.type(0.0)
    a = m + 2
    TH = (Ho + m - 1) // m
    TW = (Wo + m - 1) // m
    T = N * TH * TW
    c0, c1, k0, k1 = grid_part(t, nt, kparts, (T + tb - 1) // tb, K)
    kn = k1 - k0
    if kn <= 0:
        return
    has_bias = bias.size > 0
    knu, k0u = uint64(kn), uint64(k0)
    tmp = np.empty(a * a * kn, xf.dtype)
    Xg = np.empty(a * a * min(tb, TW) * C, xf.dtype)     # a run of input tiles, gathered and half-transformed
    Xt = np.empty(a * a * min(tb, TW) * C, xf.dtype)
    yt = np.empty(m * m * kn, xf.dtype)
    V = np.empty(a * a * tb * C, xf.dtype)
    M = np.empty(a * a * tb * kn, xf.dtype)
    for ch in range(c0, c1):
        t0 = ch * tb
        nb = min(T, t0 + tb) - t0
        _input_tiles(xf, t0, nb, tb, TH, TW, m, H, W, C, ph, pw, Xg, Xt, V)
        for e in range(a * a):
            gemm(fp, NO_TRANS, NO_TRANS, nb, kn, C, one, addr(V, e * tb * C), C, addr(U, e * C * K + k0), K,
                 zero, addr(M, e * tb * kn), kn)
        for tt in range(nb):
            n, ti, tj = _tile_of(t0 + tt, TH, TW)
            transform2d(1, m, M, tt * kn, a * tb * kn, tb * kn, a, m, tmp, yt, 0, kn, kn)
            for i in range(m):
                h = ti * m + i
                if h >= Ho:
                    break
                for j in range(m):
                    w = tj * m + j
                    if w >= Wo:
                        break
                    yu = uint64(((n * Ho + h) * Wo + w) * K) + k0u
                    su = uint64((i * m + j) * kn)
                    if has_bias:
                        for k in range(knu):
                            yf[yu + k] = yt[su + k] + bias[k0u + k]
                    else:
                        for k in range(knu):
                            yf[yu + k] = yt[su + k]


@njit(**FAST)
def bwd_w(t, nt, fp, xf, dyf, acc, dbacc, N, H, W, C, K, Ho, Wo, ph, pw, m, tb, with_bias, kparts):
    """acc[g] (a*a, C, K) += sum over this part's tiles of V[e]^T (A dy A^T)[e], in its output channels, g its
    chunk range (`grid_part`); dbacc[t] (K,) += the sum of dy in them."""
    one = xf.dtype.type(1.0)
    a = m + 2
    TH = (Ho + m - 1) // m
    TW = (Wo + m - 1) // m
    T = N * TH * TW
    c0, c1, k0, k1 = grid_part(t, nt, kparts, (T + tb - 1) // tb, K)
    kn = k1 - k0
    if kn <= 0:
        return
    g0 = t // kparts
    knu, k0u = uint64(kn), uint64(k0)
    tmp = np.empty(a * a * kn, xf.dtype)
    Xg = np.empty(a * a * min(tb, TW) * C, xf.dtype)     # a run of input tiles, gathered and half-transformed
    Xt = np.empty(a * a * min(tb, TW) * C, xf.dtype)
    g = np.empty(m * m * kn, xf.dtype)
    V = np.empty(a * a * tb * C, xf.dtype)
    D = np.empty(a * a * tb * kn, xf.dtype)
    dbt = np.zeros(kn, xf.dtype)
    for ch in range(c0, c1):
        t0 = ch * tb
        nb = min(T, t0 + tb) - t0
        _input_tiles(xf, t0, nb, tb, TH, TW, m, H, W, C, ph, pw, Xg, Xt, V)
        for tt in range(nb):
            n, ti, tj = _tile_of(t0 + tt, TH, TW)
            for i in range(m):                  # the m x m tile of dy in this part's channels, zero beyond the edge
                h = ti * m + i
                for j in range(m):
                    w = tj * m + j
                    gu = uint64((i * m + j) * kn)
                    if h >= Ho or w >= Wo:
                        for k in range(knu):
                            g[gu + k] = 0
                    else:
                        su = uint64(((n * Ho + h) * Wo + w) * K) + k0u
                        for k in range(knu):
                            g[gu + k] = dyf[su + k]
                        if with_bias:
                            for k in range(knu):
                                dbt[k] += g[gu + k]
            transform2d(2, m, g, 0, m * kn, kn, m, a, tmp, D, tt * kn, tb * kn, kn)
        for e in range(a * a):
            gemm(fp, TRANS, NO_TRANS, C, kn, nb, one, addr(V, e * tb * C), C, addr(D, e * tb * kn), kn,
                 one, addr(acc, (g0 * a * a + e) * C * K + k0), K)
    for k in range(kn):
        dbacc[t, k0 + k] = dbt[k]


class WinogradConvKernels:
    """The host side of the Winograd convolution, mixed into `conv.ConvKernels` (which decides where it runs:
    `ConvKernels._winograd`)."""

    def _winograd_forward(self, x, w, bias, y, spec: ConvSpec):
        self._winograd_tiles(x, self._winograd_filters(w), bias, y, spec.padding)

    def _winograd_backward_data(self, dy, w, dx, spec: ConvSpec):
        # dx = conv(dy, flipped filter with in/out channels swapped), padding 2 - p (negative: a crop)
        (kh, kw), (ph, pw), (dh, dw) = spec.kernel, spec.padding, spec.dilation
        u = self._winograd_filters(w, flipped=True)
        self._winograd_tiles(dy, u, np.empty(0, self.dtype), dx, (dh * (kh - 1) - ph, dw * (kw - 1) - pw))
        return dx

    def _winograd_filters(self, w, flipped=False):
        """U = G g G^T of every filter (of the flipped, channel-swapped ones: backward data), threaded."""
        u_size = (TILE + 2) ** 2 * w.shape[0] * w.shape[1]
        return filter_transform(w, TILE, self.dtype, self._nt(u_size), flipped, POOL.run,
                                self._scratch("winograd_u", u_size))

    def _winograd_tiles(self, x, u, bias, y, padding):
        """y = conv3x3(x, padding) + bias (empty: none) from the filters' transform u."""
        n, h, wd, c = x.shape
        _, ho, wo, k = y.shape
        m = TILE
        tb = chunk_tiles(c, k)
        nt = self._nt(max(x.size, y.size))
        kp = self._kparts(kparts(tiles(n, ho, wo), tb, c, k, nt, False), nt)
        with blas.blas_single_thread():
            POOL.run(fwd, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), u.reshape(-1), bias, y.reshape(-1),
                     n, h, wd, c, k, ho, wo, padding[0], padding[1], m, tb, kp)

    def _winograd_backward_weights(self, x, dy, spec: ConvSpec, with_bias):
        n, h, wd, c = x.shape
        _, ho, wo, k = dy.shape
        m = TILE
        a = m + 2
        nt = self._nt(max(x.size, dy.size))
        kp = self._kparts(kparts(tiles(n, ho, wo), chunk_tiles(c, k), c, k, nt, True), nt)
        groups = nt // kp                       # one accumulator per range of chunks
        acc = self._scratch("winograd_du", groups * a * a * c * k).reshape(groups, -1)
        acc.fill(0)
        dbacc = np.zeros((nt, k), self.dtype)
        with blas.blas_single_thread():
            POOL.run(bwd_w, nt, blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1), acc, dbacc,
                     n, h, wd, c, k, ho, wo, spec.padding[0], spec.padding[1], m, chunk_tiles(c, k), with_bias,
                     kp)
        db = dbacc.sum(axis=0)
        dw = weight_grad_transform(acc, m, k, c, self.dtype, self._nt(acc.size), POOL.run)   # sums the parts
        return dw, (db if with_bias else None)
