"""Batch normalization on the CPU backend (per channel, channels innermost): the numba kernels, then
`BatchNormKernels`, their host side (the backend's `batchnorm_*` methods).

Two kernels make every pass: `bn_sums` (per-channel partial sums, float64, per part) and `bn_affine`
(out = k1 dy + k2 (x - center) + k3 per channel), forward and backward, with a following ReLU fused in
(`relu`) and another path's gradient added on (`addend`). They read x's rows `ldx` apart, so a channel
slice of a wider array (a dense block's input) is read in place (`_rows`). Kernels follow `jit`'s
conventions; parts are ranges of rows.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64
from numpy.lib.stride_tricks import as_strided

from pydtnn.backends.cpu.jit import FAST, FAST_KEEP_NAN
from pydtnn.backends.cpu.parts import CHEAP, part_range
from pydtnn.backends.cpu.runtime.threads import POOL
from pydtnn.errors import ShapeError


@njit(**FAST)
def bn_sums(t, nt, xf, ldx, dyf, center, s1, s2, M, C, backward, fk2, fk3, relu):
    """Per-channel partial sums of part t, into s1[t], s2[t] (float64):
    forward  (backward=False): sum d, sum d*d with d = x - center (shifted sums: stable variance);
    backward (backward=True):  sum dy, sum dy * (x - center); with `relu`, dy counts only where the
    fused ReLU's output was positive: where fk2 * (x - center) + fk3, the forward's own float32 affine
    map, is (the ReLU's backward, fused, without reading its output).
    x's row r starts at xf[r * ldx] (ldx >= C: x may be a channel slice, as a dense block's input is), dy is
    (M, C). Blocks of 128 rows accumulate in the data's dtype (twice the SIMD width of float64, measured
    ~1.3-2x faster), blocks add up in float64."""
    a1 = np.zeros(C, np.float64)        # thread-private accumulators (no false sharing)
    a2 = np.zeros(C, np.float64)
    b1 = np.zeros(C, xf.dtype)
    b2 = np.zeros(C, xf.dtype)
    cc = np.empty(C, xf.dtype)
    zero = xf.dtype.type(0)
    for c in range(C):
        cc[c] = center[c]
    uc, ul = uint64(C), uint64(ldx)
    r0, r1 = part_range(t, nt, M)
    for rb in range(r0, r1, 128):
        re = min(r1, rb + 128)
        for c in range(C):
            b1[c] = 0
            b2[c] = 0
        if backward and relu:
            for r in range(rb, re):
                xo, go = uint64(r) * ul, uint64(r) * uc
                for c in range(uc):
                    d = xf[xo + c] - cc[c]
                    g = dyf[go + c] if fk2[c] * d + fk3[c] > zero else zero
                    b1[c] += g
                    b2[c] += g * d
        elif backward:
            for r in range(rb, re):
                xo, go = uint64(r) * ul, uint64(r) * uc
                for c in range(uc):
                    g = dyf[go + c]
                    b1[c] += g
                    b2[c] += g * (xf[xo + c] - cc[c])
        else:
            for r in range(rb, re):
                xo = uint64(r) * ul
                for c in range(uc):
                    d = xf[xo + c] - cc[c]
                    b1[c] += d
                    b2[c] += d * d
        for c in range(C):
            a1[c] += b1[c]
            a2[c] += b2[c]
    for c in range(C):
        s1[t, c] = a1[c]
        s2[t, c] = a2[c]


@njit(**FAST_KEEP_NAN)
def bn_affine(t, nt, xf, ldx, dyf, center, k1, k2, k3, outf, M, C, with_dy, fk2, fk3, relu, addf, lda, with_add):
    """out = k1 * dy + k2 * (x - center) + k3 per channel (without the dy term when not with_dy).
    `relu` fuses a following ReLU: forward, out = max(out, 0); backward, dy counts only where the forward's
    fk2 * (x - center) + fk3 was positive. `with_add` adds row r of addf (at addf[r * lda]) to out's: a
    gradient from another path summed in the same pass. x's rows are ldx apart (bn_sums), dy's and out's C."""
    zero = xf.dtype.type(0)
    uc, ul, ua = uint64(C), uint64(ldx), uint64(lda)
    r0, r1 = part_range(t, nt, M)
    for r in range(r0, r1):
        xo, o = uint64(r) * ul, uint64(r) * uc
        if with_dy and relu:
            for c in range(uc):
                d = xf[xo + c] - center[c]
                g = dyf[o + c] if fk2[c] * d + fk3[c] > zero else zero
                outf[o + c] = k1[c] * g + k2[c] * d + k3[c]
        elif with_dy:
            for c in range(uc):
                outf[o + c] = k1[c] * dyf[o + c] + k2[c] * (xf[xo + c] - center[c]) + k3[c]
        elif relu:
            for c in range(uc):
                v = k2[c] * (xf[xo + c] - center[c]) + k3[c]
                outf[o + c] = zero if v <= zero else v
        else:
            for c in range(uc):
                outf[o + c] = k2[c] * (xf[xo + c] - center[c]) + k3[c]
        if with_add:
            ao = uint64(r) * ua
            for c in range(uc):
                outf[o + c] += addf[ao + c]


class BatchNormKernels:
    """The host side of batch normalization, mixed into `CPUBackend` (which declares `fuses_relu` and
    `reuses_bn_moments`). ctx: (x, mean, invstd, gamma, count, the fused ReLU's coefficients or None,
    biased variance); the mean and variance in float64."""

    def _rows(self, a):
        """(flat, ld): a's rows of C = a.shape[-1] values, row r at flat[r * ld], without a copy where a is
        a channel slice of a C-contiguous array (a dense block's input or gradient); else a's copy, ld = C."""
        a = np.asarray(a)
        c = a.shape[-1] if a.ndim else 1
        if a.dtype == self.dtype and not a.flags.c_contiguous and a.ndim >= 2 and a.size and c:
            it, st = a.itemsize, a.strides
            even = all(st[d] == st[d + 1] * a.shape[d + 1] for d in range(a.ndim - 2))
            if st[-1] == it and st[-2] % it == 0 and st[-2] // it >= c and even:
                ld = st[-2] // it
                return as_strided(a, shape=((a.size // c - 1) * ld + c,), strides=(it,)), ld
        return self._c(a).reshape(-1), c

    def _bn_2d(self, x, gamma, what):
        x = np.asarray(x)
        if x.ndim not in (2, 4):
            raise ShapeError(f"{what} expects a 2-D (N, C) or 4-D NHWC array, got shape {x.shape}")
        c = x.shape[-1]
        if np.size(gamma) != c:
            raise ShapeError(f"{what}: input has {c} channels but gamma has {np.size(gamma)}")
        xf, ldx = self._rows(x)
        if ldx == c:                # contiguous: x itself, or its copy in the backend's dtype
            x = xf.reshape(x.shape)
        return x, xf, ldx, x.size // max(c, 1), c

    def batchnorm_forward_train(self, x, gamma, beta, eps: float, sync=None, center=None, relu=False, known=None,
                                running=None):
        """`known`: (mean, biased variance), float64, of x's last len(mean) channels in this batch; only the
        channels in front of them are summed. Not with `sync` (the global moments come from one collective)."""
        x, xf, ldx, m, c = self._bn_2d(x, gamma, "batchnorm_forward_train")
        if m == 0:
            raise ShapeError("batchnorm_forward_train: empty batch")
        nt = self._nt(x.size // CHEAP)
        if known is None:
            mean, var, m = self._bn_moments(xf, ldx, m, c, nt, sync, center)
        else:
            mk, vk = (np.asarray(a, np.float64).reshape(-1) for a in known)
            cn = c - mk.size
            if sync is not None or not 0 < cn <= c or vk.size != mk.size:
                raise ValueError(f"batchnorm_forward_train: known moments of {mk.size} of {c} channels"
                                 + (" with sync" if sync is not None else ""))
            # the same row parts (nt from the whole x) and shift (x's first row) as summing every channel
            mean, var, _ = self._bn_moments(*self._rows(x[..., :cn]), m, cn, nt, None, None)
            mean, var = np.concatenate([mean, mk]), np.concatenate([var, vk])
        invstd = 1.0 / np.sqrt(var + eps)
        g = np.asarray(gamma, np.float64).reshape(-1)
        y = np.empty(x.shape, self.dtype)
        fk2, fk3 = self._vec(g * invstd), self._vec(beta)
        POOL.run(bn_affine, nt, xf, ldx, xf, self._vec(mean), self._vec(mean), fk2, fk3, y.reshape(-1),
                 x.size // c, c, False, fk2, fk3, relu, xf, ldx, False)
        ctx = (x, mean, invstd, g, m, (fk2, fk3) if relu else None, var)     # the fused ReLU's mask, from x
        mean, var = mean.astype(self.dtype), var.astype(self.dtype)
        if running is not None:
            self.update_running_stats(running, mean, var, m)
        return y, mean, var, ctx

    def _bn_moments(self, xf, ldx, m, c, nt, sync, center):
        """Per-channel (mean, biased variance, count) of m rows of c values (row r at xf[r * ldx]), float64,
        from shifted sums: about x's first row (a stable one-pass variance), or, synchronized, about the
        centre every replica shares, and then over the global batch."""
        s1 = np.empty((nt, c))
        s2 = np.empty((nt, c))
        shift = xf[:c].astype(np.float64) if sync is None else np.asarray(center, np.float64).reshape(-1)
        POOL.run(bn_sums, nt, xf, ldx, xf, shift, s1, s2, m, c, False, xf, xf, False)
        t1, t2 = s1.sum(axis=0), s2.sum(axis=0)
        if sync is not None:
            t1, t2, m = sync.forward_moments(np, t1, t2, m, shift, shift)
        d1 = t1 / m
        return shift + d1, np.maximum(t2 / m - d1 * d1, 0.0), m

    def batchnorm_moments(self, ctx):
        """(mean, biased variance), float64, of the batch the forward that made `ctx` normalized with."""
        return ctx[1], ctx[6]

    def batchnorm_forward_infer(self, x, gamma, beta, mean, var, eps: float, relu=False):
        x, xf, ldx, m, c = self._bn_2d(x, gamma, "batchnorm_forward_infer")
        invstd = 1.0 / np.sqrt(np.asarray(var, np.float64).reshape(-1) + eps)
        scale = np.asarray(gamma, np.float64).reshape(-1) * invstd
        y = np.empty(x.shape, self.dtype)
        mu = self._vec(mean)
        POOL.run(bn_affine, self._nt(x.size // CHEAP), xf, ldx, xf, mu, mu, self._vec(scale),
                 self._vec(beta), y.reshape(-1), m, c, False, mu, mu, relu, xf, ldx, False)
        return y

    def batchnorm_backward(self, dy, ctx, sync=None, relu_y=None, addend=None, out=None):
        """With `relu_y` (the fused ReLU's output), dy is the gradient after that ReLU. Its mask is recomputed
        from x with the forward's float32 coefficients when the forward ran fused (one array less to read).
        `addend` (x's shape) is added to dx in the same pass: another path's gradient of x."""
        x, mean, invstd, g, count, fused = ctx[:6]
        dy = self._c(dy)
        relu = relu_y is not None
        if relu and fused is None:          # forward ran unfused: the ReLU's backward first
            dy, relu = self.relu_backward(dy, relu_y), False
        mu = self._vec(mean)
        fk2, fk3 = fused if relu else (mu, mu)
        if dy.shape != x.shape:
            raise ShapeError(f"batchnorm_backward: dy has shape {dy.shape}, expected {x.shape}")
        if addend is not None and np.shape(addend) != x.shape:
            raise ShapeError(f"batchnorm_backward: addend has shape {np.shape(addend)}, expected {x.shape}")
        c = x.shape[-1]
        m = x.size // c
        nt = self._nt(x.size // CHEAP)
        s1 = np.empty((nt, c))
        s2 = np.empty((nt, c))
        (xf, ldx), dyf = self._rows(x), dy.reshape(-1)
        POOL.run(bn_sums, nt, xf, ldx, dyf, mu, s1, s2, m, c, True, fk2, fk3, relu)
        sdy, sdyx = s1.sum(axis=0), s2.sum(axis=0)
        dgamma, dbeta = (sdyx * invstd).astype(self.dtype), sdy.astype(self.dtype)   # this replica's share
        if sync is not None:
            sdy, sdyx = sync.backward_sums(np, sdy, sdyx)
        # dx = g*invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), means over the (global) batch
        k1 = g * invstd
        k2 = -g * invstd ** 3 * sdyx / count
        k3 = -k1 * sdy / count
        dx = np.empty(x.shape, self.dtype)
        af, lda = (dyf, c) if addend is None else self._rows(addend)
        POOL.run(bn_affine, nt, xf, ldx, dyf, mu, self._vec(k1), self._vec(k2), self._vec(k3),
                 dx.reshape(-1), m, c, True, fk2, fk3, relu, af, lda, addend is not None)
        return (dx,) + self.into((dgamma, dbeta), out)
