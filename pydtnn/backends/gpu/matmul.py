"""Matrix products on the GPU (FC, attention, the embedding's and Upsample2D's products): `MatmulKernels`,
`matmul` as `numpy.matmul` through the backend's own cuBLAS handle (`cublas`), so that a CUDA graph can
capture it (CuPy's matmul cannot be captured: see `cublas`); `linear` and `linear_weight_grads` are the
contract's, over this `matmul`.

Row-major operands are the swapped column-major product: C = A B is C^T = B^T A^T, and a C-order matrix is
its transpose in column-major order, so cuBLAS is given (B, A) untransposed. A transposed view (`w.T`,
`dy.T`, `k.transpose(0, 1, 3, 2)`) is column-major already: passed as the transpose flag with its own leading
dimension, not copied for being transposed. Leading axes broadcast as numpy's: one strided-batched call where each operand's
matrices lie one fixed step apart (0: one matrix for the whole batch); an operand whose matrices do not (the
heads of a (N T, 3D) array: two steps) or whose matrices have no unit stride is first copied into C order
(`cupy.ascontiguousarray`, a kernel, capturable).
"""
from __future__ import annotations

import math

import numpy as np

from pydtnn.backends.gpu.cublas import OP_N, OP_T

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _layout(x):
    """(transpose flag, leading dimension) of the matrices (last two axes) of x in the swapped product, or
    None when neither axis has unit stride."""
    rows, cols = x.shape[-2:]
    item = x.itemsize
    rs, cs = x.strides[-2], x.strides[-1]
    if rs % item or cs % item:
        return None
    rs, cs = rs // item, cs // item
    if rows == 1:                       # a stride over one row or column is never used: say it is contiguous
        rs = cols
    if cols == 1:
        cs = 1
    if cs == 1 and rs >= max(cols, 1):
        return OP_N, max(rs, 1)         # C order: as cuBLAS reads it, already the transpose the swap needs
    if rs == 1 and cs >= max(rows, 1):
        return OP_T, max(cs, 1)         # a transposed view: column-major, so transposed back by the flag
    return None


def _batch_step(x, batch):
    """The one step, in elements, between consecutive matrices of x over the broadcast `batch` shape (0: the
    same matrix for all), or None when no single step describes them."""
    lead = x.ndim - 2
    strides = [0] * (len(batch) - lead) + [s if d > 1 else 0 for s, d in zip(x.strides[:lead], x.shape[:lead])]
    step, after = None, 1
    for s, d in zip(reversed(strides), reversed(batch)):
        if d > 1:
            if s % x.itemsize:
                return None
            e = s // x.itemsize
            if step is None:            # the innermost axis that counts sets the step
                if e % after:
                    return None
                step = e // after
            elif e != step * after:
                return None
        after *= d
    return None if step is not None and step < 0 else step or 0


def _span(x):
    """[first, last] byte addresses x covers."""
    lo = hi = x.data.ptr
    for s, d in zip(x.strides, x.shape):
        (lo, hi) = (lo + s * (d - 1), hi) if s < 0 else (lo, hi + s * (d - 1))
    return lo, hi + x.itemsize - 1


def _overlap(a, b) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 <= b1 and b0 <= a1


class MatmulKernels:
    """`matmul` through cuBLAS, mixed into `GPUBackend`, which holds the handle (`cublas.Cublas`) as `cublas`."""

    def matmul(self, a, b, out=None):
        """a @ b as `numpy.matmul` (1-D operands, broadcast leading axes), optionally into `out`; float32 and
        float64 operands of one dtype through cuBLAS, anything else CuPy's own product."""
        cp = self.xp
        if a.dtype != b.dtype or a.dtype not in _FLOATS or a.ndim == 0 or b.ndim == 0:
            return cp.matmul(a, b, out=out)
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        b2 = b.reshape(-1, 1) if b.ndim == 1 else b
        m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
        try:
            batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        except ValueError:
            batch = None
        shape = None if batch is None else batch + (m, n)
        final = None if batch is None else batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
        if b2.shape[-2] != k or batch is None or (out is not None and out.shape != final):
            return cp.matmul(a, b, out=out)         # raises numpy's error
        direct = (out is not None and out.dtype == a.dtype and out.flags.c_contiguous
                  and not _overlap(out, a) and not _overlap(out, b))
        c = out.reshape(shape) if direct else cp.empty(shape, a.dtype)
        if c.size:
            if k == 0:
                c.fill(0)
            else:
                self._gemm(a2, b2, c, batch)
        if out is None:
            return c.reshape(final)
        if not direct:
            out[...] = c.reshape(final)
        return out

    def _gemm(self, a, b, c, batch):
        """c (batch + (m, n), C order) = a @ b, one cuBLAS call (copying an operand cuBLAS cannot read)."""
        cp = self.xp
        operands = []
        for x in (a, b):
            layout, step = _layout(x), _batch_step(x, batch)
            if layout is None or step is None:
                x = cp.ascontiguousarray(x)
                layout, step = _layout(x), _batch_step(x, batch)
            if step is None:            # broadcast along some leading axes only: every matrix of the batch
                x = cp.ascontiguousarray(cp.broadcast_to(x, batch + x.shape[-2:]))
                layout, step = _layout(x), _batch_step(x, batch)
            operands.append((x, layout, step))
        (a, (ta, lda), sa), (b, (tb, ldb), sb) = operands
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        # C^T (n x m, column-major, ld n) = op(B^T) op(A^T): B first
        self.cublas.gemm(a.dtype, tb, ta, int(n), int(m), int(k), b.data.ptr, int(ldb), a.data.ptr, int(lda),
                         c.data.ptr, int(n), batch=math.prod(batch), stride_a=int(sb), stride_b=int(sa),
                         stride_c=int(m * n))
