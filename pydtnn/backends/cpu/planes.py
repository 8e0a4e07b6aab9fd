"""Direct convolution for very few channels (C x K <= 16, K <= 8, e.g. MNIST's 1 -> 4), without BLAS.

With one input channel and four filters a GEMM has nothing to work on (its reduction is kh*kw*C = 9
long, its width K = 4), and the BLAS path ran at about 2 GFLOP/s. Here each image is copied into
zero-padded planes, one per channel (C, Hp, Wp); an output plane of filter k is then a sum of
C*kh*kw shifted planes scaled by one weight each: one long, vectorized loop per (c, tap) over the
whole image, computed at Wp columns per row (the last (kw - 1)*dw of each row are not outputs) and
copied to NHWC at the end. Backward weights is the matching dot product of shifted planes with the
output-gradient planes. Stride 1 only (a stride would waste stride^2 of the work); any padding and
dilation. Kernels follow `jit`'s conventions; parts are whole images. `PlanesConvKernels`, at the end, is
their host side.
"""
from __future__ import annotations

import numpy as np
from numba import njit, uint64

from pydtnn.backends.contract import ConvSpec
from pydtnn.backends.cpu.jit import FAST
from pydtnn.backends.cpu.runtime.threads import POOL

# Measured against the BLAS path (batch 64, 3x3, 1 thread): 1 -> 4 channels 3.5x faster forward, 3.7x
# backward data, 1.7x backward weights; 2 -> 8 and 3 -> 4 1.5-2.4x; 1 -> 16 and more filters slower
# (0.2-0.8x: the output planes are rewritten K times).
PLANES_MAX = 16          # C * K up to this
PLANES_MAX_K = 8         # and at most this many filters


def applies(spec) -> bool:
    """Whether the plane kernels can run this convolution (and pay)."""
    return (spec.groups == 1 and tuple(spec.stride) == (1, 1) and min(spec.padding) >= 0
            and spec.in_channels * spec.out_channels <= PLANES_MAX and spec.out_channels <= PLANES_MAX_K)


def backward_data_applies(spec) -> bool:
    """Backward data runs as a forward of the transposed convolution, whose "full" padding
    dilation * (kernel - 1) - padding must not be negative."""
    (kh, kw), (ph, pw), (dh, dw) = spec.kernel, spec.padding, spec.dilation
    return dh * (kh - 1) >= ph and dw * (kw - 1) >= pw


@njit(**FAST)
def _fill_planes(src, n, H, W, C, Hp, Wp, ph, pw, planes):
    """planes (C, Hp, Wp)[c, h + ph, w + pw] = src (N, H, W, C)[n, h, w, c]; the border stays as allocated
    (zero): every image writes the same region."""
    for h in range(H):
        for w in range(W):
            s = ((n * H + h) * W + w) * C
            d = (h + ph) * Wp + w + pw
            for c in range(C):
                planes[c * Hp * Wp + d] = src[s + c]


@njit(**FAST)
def fwd(t, nt, xf, w, bias, yf, N, H, W, C, K, Ho, Wo, kh, kw, ph, pw, dh, dw):
    """y (N, Ho, Wo, K) = conv(x (N, H, W, C), w (K, C, kh, kw)) + bias, stride 1."""
    Wp = Wo + (kw - 1) * dw
    Hp = Ho + (kh - 1) * dh
    P = Hp * Wp
    L = uint64(Ho * Wp)
    planes = np.zeros(C * P + (kw - 1) * dw, xf.dtype)   # the last row's waste columns read past the end
    acc = np.empty(Ho * Wp, xf.dtype)
    has_bias = bias.size > 0
    per = (N + nt - 1) // nt
    for n in range(t * per, min(N, (t + 1) * per)):
        _fill_planes(xf, n, H, W, C, Hp, Wp, ph, pw, planes)
        for k in range(K):
            b = bias[k] if has_bias else xf.dtype.type(0)
            for l in range(L):
                acc[l] = b
            for c in range(C):
                for i in range(kh):
                    for j in range(kw):
                        coef = w[k, c, i, j]
                        off = uint64(c * P + i * dh * Wp + j * dw)
                        for l in range(L):
                            acc[l] += coef * planes[off + l]
            for ho in range(Ho):
                for wo in range(Wo):
                    yf[((n * Ho + ho) * Wo + wo) * K + k] = acc[ho * Wp + wo]


@njit(**FAST)
def bwd_w(t, nt, xf, dyf, acc, dbacc, N, H, W, C, K, Ho, Wo, kh, kw, ph, pw, dh, dw, with_bias):
    """acc[t] (K, C, kh, kw) += sum over this part's images of shifted input planes . dy planes (float64);
    dbacc[t] (K,) += sum of dy."""
    Wp = Wo + (kw - 1) * dw
    Hp = Ho + (kh - 1) * dh
    P = Hp * Wp
    L = uint64(Ho * Wp)
    planes = np.zeros(C * P + (kw - 1) * dw, xf.dtype)
    g = np.zeros(K * Ho * Wp, xf.dtype)          # dy planes; columns wo >= Wo stay zero
    at = np.zeros((K, C, kh, kw))                # thread-private sums (no line shared with the next part's)
    dbt = np.zeros(K)
    per = (N + nt - 1) // nt
    for n in range(t * per, min(N, (t + 1) * per)):
        _fill_planes(xf, n, H, W, C, Hp, Wp, ph, pw, planes)
        for ho in range(Ho):
            for wo in range(Wo):
                s = ((n * Ho + ho) * Wo + wo) * K
                for k in range(K):
                    g[k * Ho * Wp + ho * Wp + wo] = dyf[s + k]
        for k in range(K):
            gk = uint64(k * Ho * Wp)
            if with_bias:
                sb = xf.dtype.type(0)
                for l in range(L):
                    sb += g[gk + l]
                dbt[k] += sb
            for c in range(C):
                for i in range(kh):
                    for j in range(kw):
                        off = uint64(c * P + i * dh * Wp + j * dw)
                        s = xf.dtype.type(0)
                        for l in range(L):
                            s += planes[off + l] * g[gk + l]
                        at[k, c, i, j] += s
    acc[t] = at
    dbacc[t] = dbt


class PlanesConvKernels:
    """The host side of the plane kernels, mixed into `conv.ConvKernels` (which decides where they run:
    `ConvKernels._planes`)."""

    def _planes_forward(self, x, w, bias, y, spec: ConvSpec):
        n, h, wd, c = x.shape
        _, ho, wo, k = y.shape
        (kh, kw), (ph, pw), (dh, dw) = spec.kernel, spec.padding, spec.dilation
        POOL.run(fwd, self._nt(y.size), x.reshape(-1), self._c(w), bias, y.reshape(-1),
                 n, h, wd, c, k, ho, wo, kh, kw, ph, pw, dh, dw)

    def _planes_backward_data(self, dy, w, dx, spec: ConvSpec):
        """dx = conv(dy, flipped filter with in/out channels swapped), "full" padding (not negative: see
        `backward_data_applies`)."""
        n, h, wd, c = dx.shape
        _, ho, wo, k = dy.shape
        (kh, kw), (ph, pw), (dh, dw) = spec.kernel, spec.padding, spec.dilation
        tspec = ConvSpec(k, c, (kh, kw), (1, 1), (dh * (kh - 1) - ph, dw * (kw - 1) - pw), (dh, dw))
        wf = self._c(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        POOL.run(fwd, self._nt(dx.size), dy.reshape(-1), wf, np.empty(0, self.dtype), dx.reshape(-1),
                 n, ho, wo, k, c, h, wd, kh, kw, *tspec.padding, dh, dw)
        return dx

    def _planes_backward_weights(self, x, dy, spec: ConvSpec, with_bias):
        n, h, wd, c = x.shape
        _, ho, wo, k = dy.shape
        (kh, kw), (ph, pw), (dh, dw) = spec.kernel, spec.padding, spec.dilation
        nt = self._nt(dy.size)
        acc = np.zeros((nt, k, c, kh, kw))
        dbacc = np.zeros((nt, k))
        POOL.run(bwd_w, nt, x.reshape(-1), dy.reshape(-1), acc, dbacc, n, h, wd, c, k, ho, wo,
                 kh, kw, ph, pw, dh, dw, with_bias)
        db = dbacc.sum(axis=0).astype(self.dtype) if with_bias else None
        return acc.sum(axis=0).astype(self.dtype), db
