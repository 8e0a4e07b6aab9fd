"""Fused multi-head attention on the CPU backend: the numba kernels, then `AttentionKernels`, their host
side.

Why: a small ViT's attention is many tiny matrices (batch 64 x 4 heads of 16 x 16). Run as separate
batched products, a softmax and the head transposes, each step is its own pass over memory and its own
call (about 0.5 us of overhead per 16 x 16 x 16 GEMM against 50 ns of arithmetic), and below the threading
threshold it runs on one thread. Here one part of the pool takes whole (sample, head) pairs and does
everything of a pair while its matrices are in L1: the scores GEMM, the row softmax, the dropout mask and
the weighted values, reading q, k and v straight from the (N T, 3D) projection (leading dimension 3D)
and writing the context straight into (N T, D) at the head's columns, so no transpose is ever copied.
Backward does the five products of a pair likewise and writes dq, dk, dv into the (N T, 3D) gradient.

Each pair's arithmetic does not depend on how the pairs are split over threads or on the batch size, so
data-parallel replicas compute exactly the numbers one process computes for the same samples.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from pydtnn.backends.cpu.jit import IEEE
from pydtnn.backends.cpu.parts import MACS_PER_ELEMENT, part_range
from pydtnn.backends.cpu.runtime import blas
from pydtnn.backends.cpu.runtime.blas import NO_TRANS, TRANS, addr, gemm
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.backends.cpu.softmax import softmax_backward_rows, softmax_rows


@njit(**IEEE)
def attention_fwd(t, nt, fptr, qkv, attn, mask, ctx, N, T, H, hd, causal, scale):
    """Pairs (sample, head) of part t: attn[n, h] = softmax(scale q k^T) (T x T, the causal mask when
    causal), ctx[n T:(n + 1) T, h hd:(h + 1) hd] = (attn[n, h] * mask[n, h]) v. qkv: (N T, 3D) flat; attn,
    mask: (N, H, T, T) flat (mask empty: no dropout); ctx: (N T, D) flat."""
    D = H * hd
    ld = 3 * D
    TT = T * T
    one, zero = ctx.dtype.type(1), ctx.dtype.type(0)
    alpha = ctx.dtype.type(scale)
    dropped = np.empty(TT if mask.size > 0 else 0, ctx.dtype)
    p0, p1 = part_range(t, nt, N * H)
    for p in range(p0, p1):
        n, h = p // H, p % H
        row = n * T * ld + h * hd                       # q of the pair; k at + D, v at + 2D
        s = p * TT
        gemm(fptr, NO_TRANS, TRANS, T, T, hd, alpha, addr(qkv, row), ld, addr(qkv, row + D), ld,
             zero, addr(attn, s), T)
        softmax_rows(0, 1, attn[s:s + TT], T, T, T if causal else 0)
        weights = addr(attn, s)
        if mask.size > 0:
            for j in range(TT):
                dropped[j] = attn[s + j] * mask[s + j]
            weights = addr(dropped, 0)
        gemm(fptr, NO_TRANS, NO_TRANS, T, hd, T, one, weights, T, addr(qkv, row + 2 * D), ld,
             zero, addr(ctx, n * T * D + h * hd), D)


@njit(**IEEE)
def attention_bwd(t, nt, fptr, qkv, attn, mask, dctx, dqkv, N, T, H, hd, scale):
    """The gradients of `attention_fwd`: from dctx (N T, D) flat, dqkv (N T, 3D) flat gets dq, dk, dv of the
    pairs of part t (every element of dqkv is written by exactly one pair)."""
    D = H * hd
    ld = 3 * D
    TT = T * T
    one, zero = dctx.dtype.type(1), dctx.dtype.type(0)
    alpha = dctx.dtype.type(scale)
    has_mask = mask.size > 0
    dattn = np.empty(TT, dctx.dtype)
    dropped = np.empty(TT if has_mask else 0, dctx.dtype)
    p0, p1 = part_range(t, nt, N * H)
    for p in range(p0, p1):
        n, h = p // H, p % H
        row = n * T * ld + h * hd
        s = p * TT
        dout = addr(dctx, n * T * D + h * hd)
        weights = addr(attn, s)
        if has_mask:
            for j in range(TT):
                dropped[j] = attn[s + j] * mask[s + j]
            weights = addr(dropped, 0)
        # dv = weights^T dout; dweights = dout v^T
        gemm(fptr, TRANS, NO_TRANS, T, hd, T, one, weights, T, dout, D, zero, addr(dqkv, row + 2 * D), ld)
        gemm(fptr, NO_TRANS, TRANS, T, T, hd, one, dout, D, addr(qkv, row + 2 * D), ld, zero, addr(dattn, 0), T)
        if has_mask:
            for j in range(TT):
                dattn[j] *= mask[s + j]
        softmax_backward_rows(0, 1, attn[s:s + TT], dattn, T, T)          # dscores / scale, in place
        # dq = scale dscores k; dk = scale dscores^T q
        gemm(fptr, NO_TRANS, NO_TRANS, T, hd, T, alpha, addr(dattn, 0), T, addr(qkv, row + D), ld,
             zero, addr(dqkv, row), ld)
        gemm(fptr, TRANS, NO_TRANS, T, hd, T, alpha, addr(dattn, 0), T, addr(qkv, row), ld,
             zero, addr(dqkv, row + D), ld)


class AttentionKernels:
    """The host side of the fused attention, mixed into `CPUBackend`: where BLAS is callable and the arrays
    are the backend's dtype and C-contiguous; else the contract's batched products."""

    def _fused_attention(self, *arrays) -> bool:
        return self.use_blas_kernels and all(a is None or (a.dtype == self.dtype and a.flags.c_contiguous)
                                             for a in arrays)

    def attention_forward(self, qkv, n, t, heads, causal=False, mask=None):
        if not self._fused_attention(qkv, mask):
            return super().attention_forward(qkv, n, t, heads, causal, mask)
        d = qkv.shape[1] // 3
        hd = d // heads
        attn = np.empty((n, heads, t, t), self.dtype)
        context = np.empty((n * t, d), self.dtype)
        nt = self._nt(n * heads * t * t * (2 * hd + 8) // MACS_PER_ELEMENT)
        with blas.blas_single_thread():
            POOL.run(attention_fwd, nt, blas.gemm_ptr(self.dtype), qkv.reshape(-1), attn.reshape(-1),
                     self._no_mask(mask), context.reshape(-1), n, t, heads, hd, bool(causal), 1 / math.sqrt(hd))
        return context, attn

    def attention_backward(self, dcontext, qkv, attn, mask, n, t, heads):
        if not self._fused_attention(dcontext, qkv, attn, mask):
            return super().attention_backward(dcontext, qkv, attn, mask, n, t, heads)
        d = qkv.shape[1] // 3
        hd = d // heads
        dqkv = np.empty_like(qkv)
        nt = self._nt(n * heads * t * t * (4 * hd + 8) // MACS_PER_ELEMENT)
        with blas.blas_single_thread():
            POOL.run(attention_bwd, nt, blas.gemm_ptr(self.dtype), qkv.reshape(-1), attn.reshape(-1),
                     self._no_mask(mask), dcontext.reshape(-1), dqkv.reshape(-1), n, t, heads, hd, 1 / math.sqrt(hd))
        return dqkv

    def _no_mask(self, mask):
        return np.empty(0, self.dtype) if mask is None else mask.reshape(-1)
