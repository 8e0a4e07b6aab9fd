"""The Winograd transforms of the CPU backend's 3x3 convolution (`winograd`), compiled with numba: the
transform matrices of F(2x2, 3x3) and F(4x4, 3x3), the filters' transform U = G g G^T (`filter_transform`),
the weights' gradient dw = G^T dU G (`weight_grad_transform`), and the 1-D passes the convolution's
kernels apply to input tiles (`bt`: B^T) and output tiles (`transform2d`: A^T, A).

Transforms are 1-D passes with hard-coded coefficients, channels (or filters) innermost (vectorized);
filters are transformed in float64. Kernels follow `jit`'s conventions.
"""
from __future__ import annotations

import llvmlite.binding as _llvm
import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.jit import FAST

# The transforms' loops run over channels (3 to 64 here) and read and write 4-6 rows each. Two LLVM limits
# kept them scalar: its vectorized loop body takes 64 float32 at a time (8 lanes x 4 interleaved) and
# left shorter loops to scalar code, and it gives up on loops needing more than 8 run-time alias checks
# (6 loads x 6 stores here). A vectorized epilogue for loops of 8+ lanes and a higher check limit made
# the transforms 2-4x faster (measured). These options are process-wide and only change how later
# compilations vectorize, never results. (Transforming whole rows of tiles at once, with long loops,
# measured slower: it computes the horizontal pass at every column, m times the work.)
_llvm.set_option("pydtnn", "-epilogue-vectorization-minimum-VF=8")
_llvm.set_option("pydtnn", "-runtime-memory-check-threshold=128")

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


@njit(**FAST)
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


@njit(**FAST)
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



@njit(**FAST)
def _offsets(s0, ss):
    """s0 + i*ss for i < 6, each as uint64 (computed signed, converted whole: see `jit`)."""
    return (uint64(s0), uint64(s0 + ss), uint64(s0 + 2 * ss), uint64(s0 + 3 * ss), uint64(s0 + 4 * ss),
            uint64(s0 + 5 * ss))


# 1-D transforms, hard-coded per tile size: read src[s0 + i*ss + l] (i < p), write dst[d0 + j*ds + l]
# (j < q), for l < L (the vectorized axis: channels).

@njit(**FAST)
def bt(m, src, s0, ss, dst, d0, ds, L):
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


@njit(**FAST)
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


@njit(**FAST)
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


@njit(**FAST)
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


@njit(**FAST)
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


@njit(**FAST)
def transform2d(kind, m, src, s0, rs, cs, p, q, tmp, dst, d0, dstride, L):
    """dst[d0 + (i*q + j)*dstride + l] = (T src T^T)[i, j, l] for the p x p tile src[s0 + r*rs + s*cs + l]
    (T: kind 0 = B^T, 1 = A^T, 2 = A; q outputs per axis); tmp holds p*q*L."""
    for r in range(p):                          # rows: tmp[r, j] = (T src[r, :])[j]
        if kind == 0:
            bt(m, src, s0 + r * rs, cs, tmp, r * q * L, L, L)
        elif kind == 1:
            _at(m, src, s0 + r * rs, cs, tmp, r * q * L, L, L)
        else:
            _a(m, src, s0 + r * rs, cs, tmp, r * q * L, L, L)
    for j in range(q):                          # columns: dst[i, j] = (T tmp[:, j])[i]
        if kind == 0:
            bt(m, tmp, j * L, q * L, dst, d0 + j * dstride, q * dstride, L)
        elif kind == 1:
            _at(m, tmp, j * L, q * L, dst, d0 + j * dstride, q * dstride, L)
        else:
            _a(m, tmp, j * L, q * L, dst, d0 + j * dstride, q * dstride, L)
