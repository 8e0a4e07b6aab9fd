"""Winograd convolution kernels of the CPU backend (NHWC, 3x3 filters, stride 1), compiled with numba.

F(m x m, 3 x 3) computes an m x m output tile from an a x a input tile (a = m + 2) with a*a products per
(input channel, output channel) pair instead of 9*m*m: 2.25x fewer for m = 2, 4x fewer for m = 4
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). With the transforms
    input   V = B^T d B        (a x a, per input channel)
    filter  U = G g G^T        (a x a, per filter)
    output  Y = A^T M A        (m x m, per output channel),   M[e] = sum_c V[e, c] U[e, c, :]
the a*a element-wise products over channels are a*a GEMMs (tiles x C) @ (C x K).

How it runs (the design of `_cpu_conv`: one thread pool, cache-sized blocks, single-threaded BLAS):
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
- Transforms are 1-D passes with hard-coded coefficients, channels (or filters) innermost (vectorized);
  filters are transformed in float64.

Every kernel is serial, releases the GIL and does part `t` of `nt`; arrays are flat and C-contiguous.
"""
from __future__ import annotations

import llvmlite.binding as _llvm
import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.runtime.blas import NO_TRANS, TRANS, addr, gemm
from pydtnn.backends.cpu.conv import grid_part

# The transforms' loops run over channels (3 to 64 here) and read and write 4-6 rows each. Two LLVM limits
# kept them scalar: its vectorized loop body takes 64 float32 at a time (8 lanes x 4 interleaved) and
# left shorter loops to scalar code, and it gives up on loops needing more than 8 run-time alias checks
# (6 loads x 6 stores here). A vectorized epilogue for loops of 8+ lanes and a higher check limit made
# the transforms 2-4x faster (measured). These options are process-wide and only change how later
# compilations vectorize, never results. (Transforming whole rows of tiles at once, with long loops,
# measured slower: it computes the horizontal pass at every column, m times the work.)
_llvm.set_option("pydtnn", "-epilogue-vectorization-minimum-VF=8")
_llvm.set_option("pydtnn", "-runtime-memory-check-threshold=128")

_NJ = {"cache": True, "fastmath": True, "boundscheck": False, "nogil": True}

# The transform matrices (exact rationals; float64 here, cast to the data's dtype when used).
# F(2, 3): interpolation points 0, 1, -1, infinity.
_F2 = (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),         # B^T
       np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),                  # G
       np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64))                                        # A^T
# F(4, 3): points 0, 1, -1, 2, -2, infinity.
_F4 = (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                 [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
       np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                 [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
       np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64))

MATRICES = {2: _F2, 4: _F4}

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


def filter_transform(w, m: int, dtype, nt: int = 1, flipped: bool = False, run=None, out=None):
    """U (a*a, C, K) = G g G^T of every filter g = w[k, c] (w: (K, C, 3, 3), user layout), in float64.
    `flipped`: of the filters of backward data instead, g = w[k, c, ::-1, ::-1] with in/out channels swapped
    (U of shape (a*a, K, C)). In `nt` parts through `run` (the thread pool's), reading w where it lies, into
    `out` (a flat buffer of at least U's size, reused: a fresh U of 512 x 512 filters is 38 MB of new pages)."""
    k, c = w.shape[0], w.shape[1]
    w = np.ascontiguousarray(w, dtype=dtype)
    rows, cols = (k, c) if flipped else (c, k)
    size = (m + 2) ** 2 * rows * cols
    u = (np.empty(size, dtype) if out is None else out[:size]).reshape(-1, rows * cols)
    # element (row i, column j) of U's (rows, cols) plane reads w at i * si + j * sj + tap
    si, sj = (9 * c, 9) if flipped else (9, 9 * c)
    (run or _serial)(_filter_rows, nt, m, w.reshape(-1), u.reshape(-1), rows, cols, si, sj, flipped)
    return u.reshape(-1, rows, cols)


def weight_grad_transform(du, m: int, k: int, c: int, dtype, nt: int = 1, run=None):
    """dw (K, C, 3, 3) = G^T dU G from dU (a*a, C, K) or from the sum of the parts' dU (parts, a*a, C, K),
    in float64, in `nt` parts (ranges of input channels) through `run`, written in the user's layout."""
    du = np.ascontiguousarray(du)
    dw = np.empty((k, c, 3, 3), dtype)
    (run or _serial)(_grad_rows, nt, m, du.reshape(-1), dw.reshape(-1), du.size // ((m + 2) ** 2 * c * k), c, k)
    return dw


def _serial(fn, nt, *args):
    for t in range(nt):
        fn(t, nt, *args)


# Filters per block, with 16 rows (input channels) a group: a block's taps and partial sums stay in L1, and
# when reading w (or writing dw) is a transpose, a group's rows reuse the lines of w its first row brought
# into cache. Each transform is two 1-D passes with hard-coded coefficients (`_g`, `_gt`: 144 multiply-adds
# a filter for F(4x4, 3x3), vectorized across the block); the one 36 x 9 matrix product a filter that they
# replace ran 15-19 ms for 512 x 512 filters, and the weights' gradient also paid a 10 ms transpose.
_BLOCK = 128


@njit(**_NJ)
def _filter_rows(t, nt, m, w, dst, rows, cols, si, sj, flipped):
    """Rows t*rows//nt ... of dst (a*a, rows*cols, flat) = G g G^T, the taps of (i, j) at w[i*si + j*sj + q]
    (in reverse order when `flipped`)."""
    a = m + 2
    B = uint64(_BLOCK)
    taps = np.empty(9 * _BLOCK, np.float64)
    tmp = np.empty(3 * a * _BLOCK, np.float64)
    cu = dst.size // (a * a)
    r0, r1 = t * rows // nt, (t + 1) * rows // nt
    for i0 in range(r0, r1, 16):
        for j0 in range(0, cols, _BLOCK):
            nb = min(_BLOCK, cols - j0)
            for i in range(i0, min(i0 + 16, r1)):
                for jj in range(uint64(nb)):
                    base = uint64(i * si + j0 * sj) + jj * uint64(sj)
                    for q in range(9):
                        taps[uint64(q) * B + jj] = w[base + uint64(8 - q if flipped else q)]
                for r in range(3):              # rows of g: tmp[r, j] = (G g[r, :])[j]
                    _g(m, taps, r * 3 * _BLOCK, _BLOCK, tmp, r * a * _BLOCK, _BLOCK, nb)
                out = i * cols + j0
                for j in range(a):              # columns: U[i', j] = (G tmp[:, j])[i'], at dst[(i' a + j) cu + out]
                    _g(m, tmp, j * _BLOCK, a * _BLOCK, dst, j * cu + out, a * cu, nb)


@njit(**_NJ)
def _grad_rows(t, nt, m, du, dw, S, C, K):
    """Input channels t*C//nt ... of dw (K, C, 3, 3, flat) = G^T (sum_s du[s]) G, du (S, a*a, C, K)."""
    a = m + 2
    A2 = a * a
    B = uint64(_BLOCK)
    d = np.empty(A2 * _BLOCK, np.float64)
    tmp = np.empty(a * 3 * _BLOCK, np.float64)
    res = np.empty(9 * _BLOCK, np.float64)
    CK = uint64(C * K)
    r0, r1 = t * C // nt, (t + 1) * C // nt
    for i0 in range(r0, r1, 16):
        for j0 in range(0, K, _BLOCK):
            nb = uint64(min(_BLOCK, K - j0))
            for c in range(i0, min(i0 + 16, r1)):
                src = uint64(c * K + j0)
                for e in range(A2):             # the parts' sum, in float64
                    de = uint64(e) * B
                    for l in range(nb):
                        d[de + l] = du[uint64(e) * CK + src + l]
                    for sp in range(1, S):
                        so = uint64(sp * A2 + e) * CK + src
                        for l in range(nb):
                            d[de + l] += du[so + l]
                for i in range(a):              # rows: tmp[i, s] = (G^T d[i, :])[s]
                    _gt(m, d, i * a * _BLOCK, _BLOCK, tmp, i * 3 * _BLOCK, _BLOCK, nb)
                for s in range(3):              # columns: res[r, s] = (G^T tmp[:, s])[r]
                    _gt(m, tmp, s * _BLOCK, 3 * _BLOCK, res, s * _BLOCK, 3 * _BLOCK, nb)
                for l in range(nb):             # dw[k, c, q], a transpose: the group's rows share its lines
                    o = (uint64(j0) + l) * uint64(9 * C) + uint64(9 * c)
                    for q in range(9):
                        dw[o + uint64(q)] = res[uint64(q) * B + l]


@njit(**_NJ)
def _tile_of(tile, TH, TW):
    n = tile // (TH * TW)
    r = tile - n * TH * TW
    ti = r // TW
    return n, ti, r - ti * TW


@njit(**_NJ)
def _offsets(s0, ss):
    """s0 + i*ss for i < 6, each as uint64 (computed signed, converted whole: see _cpu_conv's note)."""
    return (uint64(s0), uint64(s0 + ss), uint64(s0 + 2 * ss), uint64(s0 + 3 * ss), uint64(s0 + 4 * ss),
            uint64(s0 + 5 * ss))


# 1-D transforms, hard-coded per tile size: read src[s0 + i*ss + l] (i < p), write dst[d0 + j*ds + l]
# (j < q), for l < L (the vectorized axis: channels).

@njit(**_NJ)
def _bt(m, src, s0, ss, dst, d0, ds, L):
    """B^T: a -> a (input tiles)."""
    i0, i1, i2, i3, i4, i5 = _offsets(s0, ss)
    o0, o1, o2, o3, o4, o5 = _offsets(d0, ds)
    if m == 2:
        for l in range(uint64(L)):
            x0, x1, x2, x3 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l]
            dst[o0 + l] = x0 - x2
            dst[o1 + l] = x1 + x2
            dst[o2 + l] = x2 - x1
            dst[o3 + l] = x1 - x3
    else:
        c2, c4, c5 = src.dtype.type(2), src.dtype.type(4), src.dtype.type(5)
        for l in range(uint64(L)):
            x0, x1, x2, x3, x4, x5 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l], src[i4 + l], src[i5 + l]
            p = x4 - c4 * x2
            q = x3 - c4 * x1
            u = x4 - x2
            v = c2 * (x3 - x1)
            dst[o0 + l] = c4 * x0 - c5 * x2 + x4
            dst[o1 + l] = p + q
            dst[o2 + l] = p - q
            dst[o3 + l] = u + v
            dst[o4 + l] = u - v
            dst[o5 + l] = c4 * x1 - c5 * x3 + x5


@njit(**_NJ)
def _at(m, src, s0, ss, dst, d0, ds, L):
    """A^T: a -> m (output tiles)."""
    i0, i1, i2, i3, i4, i5 = _offsets(s0, ss)
    o0, o1, o2, o3, _, _ = _offsets(d0, ds)
    if m == 2:
        for l in range(uint64(L)):
            x0, x1, x2, x3 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l]
            dst[o0 + l] = x0 + x1 + x2
            dst[o1 + l] = x1 - x2 - x3
    else:
        c2, c4, c8 = src.dtype.type(2), src.dtype.type(4), src.dtype.type(8)
        for l in range(uint64(L)):
            x0, x1, x2, x3, x4, x5 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l], src[i4 + l], src[i5 + l]
            p = x1 + x2
            q = x1 - x2
            u = x3 + x4
            v = x3 - x4
            dst[o0 + l] = x0 + p + u
            dst[o1 + l] = q + c2 * v
            dst[o2 + l] = p + c4 * u
            dst[o3 + l] = q + c8 * v + x5


@njit(**_NJ)
def _a(m, src, s0, ss, dst, d0, ds, L):
    """A: m -> a (output-gradient tiles, backward weights)."""
    i0, i1, i2, i3, _, _ = _offsets(s0, ss)
    o0, o1, o2, o3, o4, o5 = _offsets(d0, ds)
    if m == 2:
        for l in range(uint64(L)):
            x0, x1 = src[i0 + l], src[i1 + l]
            dst[o0 + l] = x0
            dst[o1 + l] = x0 + x1
            dst[o2 + l] = x0 - x1
            dst[o3 + l] = -x1
    else:
        c2, c4, c8 = src.dtype.type(2), src.dtype.type(4), src.dtype.type(8)
        for l in range(uint64(L)):
            x0, x1, x2, x3 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l]
            p = x0 + x2
            q = x1 + x3
            u = x0 + c4 * x2
            v = c2 * x1 + c8 * x3
            dst[o0 + l] = x0
            dst[o1 + l] = p + q
            dst[o2 + l] = p - q
            dst[o3 + l] = u + v
            dst[o4 + l] = u - v
            dst[o5 + l] = x3


@njit(**_NJ)
def _g(m, src, s0, ss, dst, d0, ds, L):
    """G: 3 -> a (filters)."""
    i0, i1, i2, _, _, _ = _offsets(s0, ss)
    o0, o1, o2, o3, o4, o5 = _offsets(d0, ds)
    if m == 2:
        h = src.dtype.type(0.5)
        for l in range(uint64(L)):
            x0, x1, x2 = src[i0 + l], src[i1 + l], src[i2 + l]
            dst[o0 + l] = x0
            dst[o1 + l] = h * (x0 + x1 + x2)
            dst[o2 + l] = h * (x0 - x1 + x2)
            dst[o3 + l] = x2
    else:
        c4, c6 = src.dtype.type(1 / 4), src.dtype.type(1 / 6)
        c12, c24 = src.dtype.type(1 / 12), src.dtype.type(1 / 24)
        for l in range(uint64(L)):
            x0, x1, x2 = src[i0 + l], src[i1 + l], src[i2 + l]
            p = x0 + x2
            u = c24 * x0 + c6 * x2
            v = c12 * x1
            dst[o0 + l] = c4 * x0
            dst[o1 + l] = -c6 * (p + x1)
            dst[o2 + l] = c6 * (x1 - p)
            dst[o3 + l] = u + v
            dst[o4 + l] = u - v
            dst[o5 + l] = x2


@njit(**_NJ)
def _gt(m, src, s0, ss, dst, d0, ds, L):
    """G^T: a -> 3 (weights' gradient)."""
    i0, i1, i2, i3, i4, i5 = _offsets(s0, ss)
    o0, o1, o2, _, _, _ = _offsets(d0, ds)
    if m == 2:
        h = src.dtype.type(0.5)
        for l in range(uint64(L)):
            x0, x1, x2, x3 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l]
            p = h * (x1 + x2)
            dst[o0 + l] = x0 + p
            dst[o1 + l] = h * (x1 - x2)
            dst[o2 + l] = p + x3
    else:
        c4, c6 = src.dtype.type(1 / 4), src.dtype.type(1 / 6)
        c12, c24 = src.dtype.type(1 / 12), src.dtype.type(1 / 24)
        for l in range(uint64(L)):
            x0, x1, x2, x3, x4, x5 = src[i0 + l], src[i1 + l], src[i2 + l], src[i3 + l], src[i4 + l], src[i5 + l]
            p = x1 + x2
            u = x3 + x4
            dst[o0 + l] = c4 * x0 - c6 * p + c24 * u
            dst[o1 + l] = c6 * (x2 - x1) + c12 * (x3 - x4)
            dst[o2 + l] = c6 * (u - p) + x5


@njit(**_NJ)
def _transform2d(kind, m, src, s0, rs, cs, p, q, tmp, dst, d0, dstride, L):
    """dst[d0 + (i*q + j)*dstride + l] = (T src T^T)[i, j, l] for the p x p tile src[s0 + r*rs + s*cs + l]
    (T: kind 0 = B^T, 1 = A^T, 2 = A; q outputs per axis); tmp holds p*q*L."""
    for r in range(p):                          # rows: tmp[r, j] = (T src[r, :])[j]
        if kind == 0:
            _bt(m, src, s0 + r * rs, cs, tmp, r * q * L, L, L)
        elif kind == 1:
            _at(m, src, s0 + r * rs, cs, tmp, r * q * L, L, L)
        else:
            _a(m, src, s0 + r * rs, cs, tmp, r * q * L, L, L)
    for j in range(q):                          # columns: dst[i, j] = (T tmp[:, j])[i]
        if kind == 0:
            _bt(m, tmp, j * L, q * L, dst, d0 + j * dstride, q * dstride, L)
        elif kind == 1:
            _at(m, tmp, j * L, q * L, dst, d0 + j * dstride, q * dstride, L)
        else:
            _a(m, tmp, j * L, q * L, dst, d0 + j * dstride, q * dstride, L)


@njit(**_NJ)
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


@njit(**_NJ)
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
            _bt(m, D, r * a * L, L, E, r * a * L, L, L)
        for j in range(a):                      # along r: V[i*a + j, tt:tt+R] = B^T E[:, j]
            _bt(m, E, j * L, a * L, V, j * tb * C + tt * C, a * tb * C, L)
        tt += R


@njit(**_NJ)
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
            _transform2d(1, m, M, tt * kn, a * tb * kn, tb * kn, a, m, tmp, yt, 0, kn, kn)
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


@njit(**_NJ)
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
            _transform2d(2, m, g, 0, m * kn, kn, m, a, tmp, D, tt * kn, tb * kn, kn)
        for e in range(a * a):
            gemm(fp, TRANS, NO_TRANS, C, kn, nb, one, addr(V, e * tb * C), C, addr(D, e * tb * kn), kn,
                 one, addr(acc, (g0 * a * a + e) * C * K + k0), K)
    for k in range(kn):
        dbacc[t, k0 + k] = dbt[k]
