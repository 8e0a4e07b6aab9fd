"""Matrix products on the CPU backend's one thread pool (FC, attention): the numba kernels, then
`MatmulKernels`, their host side (`matmul`, `linear`, `linear_weight_grads`).

Why: a multi-threaded OpenBLAS call runs its own threads, which spin for a while after each call, next to
the backend's pool workers, which spin too (`runtime.threads`). On a 2-core machine at 2 threads that makes 3-4
busy threads on 2 cores around every FC or attention product. Here the product is cut into parts that the
pool runs, each part one single-threaded GEMM (OpenBLAS limited to one thread for the duration), so one
pool of threads does all the work.

Operands are any strided views whose matrices have unit stride along rows or along columns (x.T, head
slices of a (N T, 3D) array...): they are passed as addresses with a transpose flag and a leading
dimension, never copied. A batch of matrices (leading axes) is split over the parts; a single matrix is
split along its longer output side.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, uint64

from pydtnn.backends.cpu.parts import MACS_PER_ELEMENT
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu.runtime.blas import NO_TRANS, TRANS, gemm
from pydtnn.backends.cpu.runtime.threads import POOL

_NJ = {"cache": True, "nogil": True}


@njit(**_NJ)
def _block(t, nt, m, n):
    """Part t of nt of an (m, n) output: (r0, r1, c0, c1), a range of rows when m >= n, else of columns."""
    if m >= n:
        return t * m // nt, (t + 1) * m // nt, 0, n
    return 0, m, t * n // nt, (t + 1) * n // nt


@njit(**_NJ)
def gemm_parts(t, nt, fptr, a, b, c, a_off, b_off, c_off, m, n, k, ta, tb, lda, ldb, ldc, alpha, beta,
               a_rstride, b_cstride, item):
    """Part t of nt of C[i] = alpha A[i] B[i] + beta C[i] for every matrix i of the batch (addresses
    a + a_off[i] ... in bytes). One matrix: its block of C (`_block`); a_rstride (b_cstride) is the byte
    step of one row of A (one column of B), item the element size."""
    nb = a_off.shape[0]
    if nb > 1:
        for i in range(t * nb // nt, (t + 1) * nb // nt):
            gemm(fptr, ta, tb, m, n, k, alpha, a + a_off[i], lda, b + b_off[i], ldb, beta, c + c_off[i], ldc)
        return
    r0, r1, c0, c1 = _block(t, nt, m, n)
    if r1 > r0 and c1 > c0:
        gemm(fptr, ta, tb, r1 - r0, c1 - c0, k, alpha, a + a_off[0] + r0 * a_rstride, lda,
             b + b_off[0] + c0 * b_cstride, ldb, beta, c + c_off[0] + (r0 * ldc + c0) * item, ldc)


@njit(**_NJ)
def linear_parts(t, nt, fptr, a, b, y, bias, m, n, k, ta, tb, lda, ldb, a_rstride, b_cstride):
    """Part t of nt of y (m, n) = A B + bias (bias of n, or empty: none), A and B at addresses a and b: the
    part's block of y (`_block`) is set to the bias rows, then the GEMM accumulates onto it (beta = 1;
    OpenBLAS's beta = 0 is a zeroing pass of its own), so the bias costs no extra pass."""
    r0, r1, c0, c1 = _block(t, nt, m, n)
    if r1 <= r0 or c1 <= c0:
        return
    beta = y.dtype.type(0.0)
    if bias.size > 0:
        beta = y.dtype.type(1.0)
        for r in range(uint64(r0), uint64(r1)):      # unsigned offsets: the loop vectorizes
            row = r * uint64(n)
            for c in range(uint64(c0), uint64(c1)):
                y[row + c] = bias[c]
    gemm(fptr, ta, tb, r1 - r0, c1 - c0, k, y.dtype.type(1.0), a + r0 * a_rstride, lda, b + c0 * b_cstride, ldb,
         beta, y.ctypes.data + (r0 * n + c0) * y.itemsize, n)


@njit(**_NJ)
def weight_grad_parts(t, nt, fptr, a, lda, b, ldb, c, db, dy, m, n, k):
    """Part t of nt of C (m, n) = A^T B, A (k, m) and B (k, n) at addresses a and b with unit column stride,
    C C-contiguous (the part's block of C, `_block`); and, db not empty, db = dy (k, len(db), C-contiguous)
    summed over its rows, a range of its columns a part, in float64 (NumPy's sum over rows ran on one
    thread: 30-45 us a layer in a ViT step)."""
    r0, r1, c0, c1 = _block(t, nt, m, n)
    if r1 > r0 and c1 > c0:
        item = c.itemsize
        gemm(fptr, TRANS, NO_TRANS, r1 - r0, c1 - c0, k, c.dtype.type(1.0), a + r0 * item, lda, b + c0 * item,
             ldb, c.dtype.type(0.0), c.ctypes.data + (r0 * n + c0) * item, n)
    if db.size > 0:
        w = uint64(db.size)
        s0, s1 = uint64(t * db.size // nt), uint64((t + 1) * db.size // nt)
        acc = np.zeros(s1 - s0, np.float64)
        for r in range(uint64(k)):
            row = r * w
            for j in range(s0, s1):
                acc[j - s0] += dy[row + j]
        for j in range(s0, s1):
            db[j] = acc[j - s0]


def operand(a):
    """(transpose flag, leading dimension, byte step of one row, byte step of one column) of the matrices
    (last two axes) of a, or None when neither axis has unit stride."""
    item = a.itemsize
    rs, cs = a.strides[-2], a.strides[-1]
    rows, cols = a.shape[-2], a.shape[-1]
    if cs == item and rs % item == 0 and (rs // item >= max(1, cols) or rows == 1):
        return NO_TRANS, max(rs // item, cols, 1), rs, cs
    if rs == item and cs % item == 0 and (cs // item >= max(1, rows) or cols == 1):
        return TRANS, max(cs // item, rows, 1), rs, cs
    return None


def operands(a, b):
    """(a, b, operand(a), operand(b)), each operand copied to C order where neither axis has unit stride."""
    ta, tb = operand(a), operand(b)
    if ta is None:
        a = np.ascontiguousarray(a)
        ta = operand(a)
    if tb is None:
        b = np.ascontiguousarray(b)
        tb = operand(b)
    return a, b, ta, tb


def batch_offsets(a, shape):
    """Byte offsets of the matrices of a, broadcast over the batch `shape` (int64, flattened)."""
    lead = a.ndim - 2
    off = np.zeros(shape, np.int64)
    for ax in range(lead):
        size = a.shape[ax]
        step = a.strides[ax] if size > 1 else 0
        idx = [1] * len(shape)
        idx[len(shape) - lead + ax] = -1
        off = off + (np.arange(size, dtype=np.int64) * step).reshape(idx)
    return np.ascontiguousarray(off.reshape(-1))


class MatmulKernels:
    """The host side of the matrix products, mixed into `CPUBackend`: each part one single-threaded GEMM.
    Where BLAS is not callable, or the operands are not the backend's dtype, NumPy's own product (the
    contract's reference)."""

    def matmul(self, a, b, out=None):
        """a @ b as `numpy.matmul` (leading axes broadcast), optionally into `out` (C-contiguous)."""
        ok = (self.use_blas_kernels and a.ndim >= 2 and b.ndim >= 2 and a.dtype == self.dtype == b.dtype
              and a.shape[-1] == b.shape[-2] and min(a.shape[-2], a.shape[-1], b.shape[-1]) > 0)
        if not ok:
            return np.matmul(a, b, out=out)
        if a.ndim == 2 and b.ndim == 2 and (out is None or (out.shape == (a.shape[0], b.shape[1])
                                                            and out.dtype == self.dtype and out.flags.c_contiguous)):
            return self._product(a, b, self._no_bias, out)
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        nb = math.prod(batch)
        nt = self._nt(nb * m * n * k // MACS_PER_ELEMENT)
        if nt == 1:                                    # NumPy's own call is cheaper; BLAS on this thread only
            with blas.blas_single_thread():
                return np.matmul(a, b, out=out)
        a, b, ta, tb = operands(a, b)
        shape = batch + (m, n)
        c = out if (out is not None and out.shape == shape and out.dtype == self.dtype
                    and out.flags.c_contiguous) else np.empty(shape, self.dtype)
        item = c.itemsize
        c_off = np.arange(nb, dtype=np.int64) * (m * n * item)
        one, zero = self.dtype.type(1), self.dtype.type(0)
        with blas.blas_single_thread():
            POOL.run(gemm_parts, nt, blas.gemm_ptr(self.dtype), a.ctypes.data, b.ctypes.data, c.ctypes.data,
                     batch_offsets(a, batch), batch_offsets(b, batch), c_off, m, n, k, ta[0], tb[0],
                     ta[1], tb[1], n, one, zero, ta[2], tb[3], item)
        if out is not None and c is not out:
            out[...] = c
            return out
        return c

    def linear(self, x, w, b=None):
        """x @ w + b on the pool, the bias written into each part's block of the output before its GEMM
        adds on (`linear_parts`): no pass of its own over the output (the ViT's FC layers, 2 threads:
        243 -> 165-176 us with their bias)."""
        ok = (self.use_blas_kernels and x.ndim == 2 and w.ndim == 2 and x.dtype == self.dtype == w.dtype
              and x.shape[1] == w.shape[0] and min(x.shape[0], x.shape[1], w.shape[1]) > 0
              and (b is None or np.size(b) == w.shape[1]))
        if not ok:
            return super().linear(x, w, b)
        return self._product(x, w, self._no_bias if b is None else self._vec(b), None)

    def linear_weight_grads(self, x, dy, dw, db=None, out_in=False):
        """dw and db in one pool run (`weight_grad_parts`): the GEMM's parts and the bias sums' columns."""
        if x.ndim != 2 or dy.ndim != 2:
            return super().linear_weight_grads(x, dy, dw, db, out_in)
        rows, (fi, fo) = x.shape[0], (x.shape[1], dy.shape[1])
        ok = (self.use_blas_kernels and dy.shape[0] == rows > 0
              and x.dtype == dy.dtype == dw.dtype == self.dtype and dw.shape == ((fo, fi) if out_in else (fi, fo))
              and dw.flags.c_contiguous and dy.flags.c_contiguous and x.strides[1] == x.itemsize
              and (db is None or (db.shape == (fo,) and db.dtype == self.dtype and db.flags.c_contiguous)))
        if not ok:
            return super().linear_weight_grads(x, dy, dw, db, out_in)
        a, b = (dy, x) if out_in else (x, dy)          # dw = a^T b
        m, n = a.shape[1], b.shape[1]
        with blas.blas_single_thread():
            POOL.run(weight_grad_parts, self._nt(m * n * rows // MACS_PER_ELEMENT), blas.gemm_ptr(self.dtype),
                     a.ctypes.data, a.strides[0] // a.itemsize, b.ctypes.data, b.strides[0] // b.itemsize,
                     dw.reshape(-1), self._no_bias if db is None else db, dy.reshape(-1), m, n, rows)

    def _product(self, a, b, bias, out):
        """a @ b + bias (empty: none) for 2-D operands, into `out` (C-contiguous) or a new array: one GEMM a
        part, without the batch machinery of `matmul` (25-37 us of Python a call, against GEMMs of
        100-200 us in a ViT step)."""
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        nt = self._nt(m * n * k // MACS_PER_ELEMENT)
        if nt == 1 and bias.size == 0:                 # NumPy's own call is cheaper; BLAS on this thread only
            with blas.blas_single_thread():
                return np.matmul(a, b, out=out)
        a, b, ta, tb = operands(a, b)
        y = np.empty((m, n), self.dtype) if out is None else out
        with blas.blas_single_thread():
            POOL.run(linear_parts, nt, blas.gemm_ptr(self.dtype), a.ctypes.data, b.ctypes.data, y.reshape(-1),
                     bias, m, n, k, ta[0], tb[0], ta[1], tb[1], ta[2], tb[3])
        return y
