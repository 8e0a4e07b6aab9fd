"""The CPU backend: NumPy arrays, internal layout NHWC, BLAS (OpenBLAS) + numba kernels.

Design (see `_cpu_conv` for the convolution algorithm):
- NHWC keeps channels contiguous, so a convolution is a GEMM that reduces over contiguous channels and
  element-wise kernels vectorize over channels.
- Heavy kernels are numba functions (`cache=True`, compiled once per dtype and cached on disk). They run
  on numba's thread pool and call single-threaded BLAS from inside, chunk by chunk, on small packed
  buffers that stay in cache: one thread pool, no im2col matrix in memory. The thread count follows
  OpenBLAS's (so `threadpoolctl` limits apply to these kernels too) unless `num_threads` is set.
- Where NumPy's BLAS cannot be called from numba (NumPy linked to another BLAS), convolutions fall back
  to plain NumPy (`sliding_window_view` + `tensordot`): correct, slower.
- `ctx` of a convolution keeps only a reference to its input; pooling keeps the arg-max taps (int32);
  batch normalization keeps the input and its per-channel statistics.
"""
from __future__ import annotations

import numba
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pydtnn.backends import Backend, ConvSpec, PoolSpec
from pydtnn.backends import _cpu_blas as blas
from pydtnn.backends import _cpu_conv as kc
from pydtnn.backends import _cpu_kernels as kp
from pydtnn.errors import ConfigError, ShapeError

_DTYPES = {"float32": np.float32, "float64": np.float64}

# Row blocks: aim for about this many output pixels per packed GEMM (the packed block stays in L2).
_TARGET_ROWS = 512
# Fold all kernel taps into one GEMM (im2col per block) when a kernel row's reduction kw*C is this small.
_FOLD_BELOW = 64


def _parse_dtype(dtype) -> np.dtype:
    try:
        dt = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dt = None
    if dt is None or dt.type not in (np.float32, np.float64):
        raise ConfigError(f"unsupported dtype {dtype!r} for the cpu backend: choose 'float32' or 'float64'")
    return dt


class CPUBackend(Backend):
    """NumPy/BLAS/numba kernels, NHWC inside, NCHW at the edges."""
    name = "cpu"
    layout = "NHWC"

    def __init__(self, dtype="float32", seed: int = 0):
        self.xp = np
        self.dtype = _parse_dtype(dtype)
        self.rng = np.random.default_rng(seed)
        self.num_threads: int | None = None      # None: follow OpenBLAS's thread count
        self.use_blas_kernels = blas.GEMM_OK     # False: NumPy fallback for convolutions (also for tests)

    # --- arrays -------------------------------------------------------------------------------------
    def asarray(self, a):
        return np.ascontiguousarray(a, dtype=self.dtype)

    def to_numpy(self, a):
        return np.asarray(a)

    def to_internal(self, x_nchw):
        x = np.asarray(x_nchw)
        if x.ndim != 4:
            raise ShapeError(f"to_internal expects a 4-D NCHW array, got shape {x.shape}")
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1), dtype=self.dtype)

    def to_user(self, x):
        x = np.asarray(x)
        if x.ndim != 4:
            raise ShapeError(f"to_user expects a 4-D NHWC array, got shape {x.shape}")
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2))

    def seed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    # --- helpers ------------------------------------------------------------------------------------
    def _c(self, a):
        return np.ascontiguousarray(a, dtype=self.dtype)

    def _nt(self) -> int:
        """Threads for this call: `num_threads`, else OpenBLAS's count; numba's pool is set to it."""
        n = self.num_threads or blas.blas_threads() or numba.get_num_threads()
        n = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)
        return n

    @staticmethod
    def _check4(x, what):
        if x.ndim != 4:
            raise ShapeError(f"{what} expects a 4-D NHWC array, got shape {x.shape}")

    @staticmethod
    def _out_hw(spec, h, w, what):
        ho, wo = spec.output_hw(h, w)
        if ho <= 0 or wo <= 0:
            raise ShapeError(f"{what}: input {h}x{w} is too small for {spec} (output {ho}x{wo})")
        return ho, wo

    # --- convolution --------------------------------------------------------------------------------
    def _conv_plan(self, spec: ConvSpec, n, h, w, c, k, ho, wo):
        """(rb, fold, direct, bufsize) of the fused kernel for this geometry."""
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        direct = kh == 1 and kw == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0
        fold = (kw * c < _FOLD_BELOW) and not direct
        rb = max(1, min(ho, -(-_TARGET_ROWS // wo)))
        nt = self._nt()
        # keep enough items to feed every thread
        while rb > 1 and n * (-(-ho // rb)) < 2 * nt:
            rb = -(-rb // 2)
        L = kw * c
        if direct:
            bufsize = 1
        elif fold:
            bufsize = rb * wo * kh * L
        else:
            nph = min(sh, (kh - 1) * dh + 1)
            qext = ((kh - 1) * dh) // sh
            bufsize = nph * (rb + qext) * wo * L
        return rb, fold, direct, bufsize, nt

    def _conv_geometry(self, x, spec: ConvSpec, what):
        self._check4(x, what)
        n, h, w, c = x.shape
        if c != spec.in_channels:
            raise ShapeError(f"{what}: input has {c} channels, the convolution expects {spec.in_channels}")
        ho, wo = self._out_hw(spec, h, w, what)
        return n, h, w, c, ho, wo

    def _is_depthwise(self, spec: ConvSpec) -> bool:
        if spec.groups == 1:
            return False
        if spec.groups == spec.in_channels and spec.out_channels == spec.in_channels:
            return True
        raise ConfigError(f"unsupported convolution groups={spec.groups} (in_channels={spec.in_channels}, "
                          f"out_channels={spec.out_channels}): use 1, or depthwise (groups == in == out)")

    def conv2d_forward(self, x, w, b, spec: ConvSpec):
        x = self._c(x)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_forward")
        k = spec.out_channels
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        bias = self._c(b).reshape(-1) if b is not None else np.empty(0, self.dtype)
        y = np.empty((n, ho, wo, k), self.dtype)
        if self._is_depthwise(spec):
            wt = self._c(np.asarray(w)[:, 0].transpose(1, 2, 0))           # (kh, kw, C)
            self._nt()
            kc.dw_fwd(x.reshape(-1), wt.reshape(-1), bias, y.reshape(-1), n, h, wd, c, ho, wo,
                      kh, kw, sh, sw, ph, pw, dh, dw)
            return y, (x,)
        if not self.use_blas_kernels:
            y[...] = np.tensordot(self._windows(x, spec, ho, wo), self._c(w), axes=([3, 4, 5], [1, 2, 3]))
            if b is not None:
                y += bias
            return y, (x,)
        wt = self._c(np.asarray(w).transpose(2, 3, 1, 0)).reshape(-1)       # (kh, kw, C, K)
        self._conv_fwd_core(x, wt, bias, y, spec, n, h, wd, c, k, ho, wo)
        return y, (x,)

    def _conv_fwd_core(self, x, wt, bias, y, spec, n, h, wd, c, k, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        rb, fold, direct, bufsize, nt = self._conv_plan(spec, n, h, wd, c, k, ho, wo)
        with blas.blas_single_thread():
            kc.conv_fwd(blas.gemm_ptr(self.dtype), x.reshape(-1), wt, bias, y.reshape(-1),
                        n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw,
                        rb, fold, direct, nt, bufsize)

    def conv2d_backward_data(self, dy, w, ctx, spec: ConvSpec):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_data")
        k = spec.out_channels
        if dy.shape != (n, ho, wo, k):
            raise ShapeError(f"conv2d_backward_data: dy has shape {dy.shape}, expected {(n, ho, wo, k)}")
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        dx = np.empty_like(x)
        w = np.asarray(w)
        if self._is_depthwise(spec):
            wt = self._c(w[:, 0].transpose(1, 2, 0))
            nt = self._nt()
            kc.dw_bwd_data(dy.reshape(-1), wt.reshape(-1), dx.reshape(-1), n, h, wd, c, ho, wo,
                           kh, kw, sh, sw, ph, pw, dh, dw, nt)
            return dx
        if not self.use_blas_kernels:
            return self._bwd_data_numpy(dy, self._c(w), spec, x.shape, ho, wo)
        pth, ptw = dh * (kh - 1) - ph, dw * (kw - 1) - pw
        if sh == 1 and sw == 1 and pth >= 0 and ptw >= 0:
            # stride 1: dx = conv(dy, flipped kernel with in/out channels swapped), "full" padding
            tspec = ConvSpec(k, c, (kh, kw), (1, 1), (pth, ptw), (dh, dw))
            wt = self._c(w[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)).reshape(-1)   # (kh, kw, K, C)
            self._conv_fwd_core(dy, wt, np.empty(0, self.dtype), dx, tspec, n, ho, wo, k, c, h, wd)
            return dx
        wt = self._c(w.transpose(2, 3, 1, 0)).reshape(-1)                    # (kh, kw, C, K)
        rb = max(1, min(ho, -(-_TARGET_ROWS // wo)))
        nt = self._nt()
        with blas.blas_single_thread():
            kc.conv_bwd_data_scatter(blas.gemm_ptr(self.dtype), dy.reshape(-1), wt, dx.reshape(-1),
                                     n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw, rb, nt)
        return dx

    def conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, c, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_weights")
        k = spec.out_channels
        if dy.shape != (n, ho, wo, k):
            raise ShapeError(f"conv2d_backward_weights: dy has shape {dy.shape}, expected {(n, ho, wo, k)}")
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        if self._is_depthwise(spec):
            dwt = np.zeros(kh * kw * c, self.dtype)
            db = np.zeros(c, self.dtype)
            nt = self._nt()
            kc.dw_bwd_w(x.reshape(-1), dy.reshape(-1), dwt, db, n, h, wd, c, ho, wo,
                        kh, kw, sh, sw, ph, pw, dh, dw, nt, with_bias)
            dwu = np.ascontiguousarray(dwt.reshape(kh, kw, c).transpose(2, 0, 1))[:, None]
            return dwu, (db if with_bias else None)
        if not self.use_blas_kernels:
            dwu = np.tensordot(dy, self._windows(x, spec, ho, wo), axes=([0, 1, 2], [0, 1, 2]))
            db = dy.reshape(-1, k).sum(axis=0) if with_bias else None
            return np.ascontiguousarray(dwu, dtype=self.dtype), db
        rb, fold, direct, bufsize, nt = self._conv_plan(spec, n, h, wd, c, k, ho, wo)
        dwt = np.zeros(kh * kw * c * k, self.dtype)
        db = np.zeros(k, self.dtype)
        with blas.blas_single_thread():
            kc.conv_bwd_w(blas.gemm_ptr(self.dtype), x.reshape(-1), dy.reshape(-1), dwt, db,
                          n, h, wd, c, k, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw,
                          rb, fold, direct, nt, bufsize, with_bias)
        dwu = np.ascontiguousarray(dwt.reshape(kh, kw, c, k).transpose(3, 2, 0, 1))
        return dwu, (db if with_bias else None)

    # NumPy fallback (no callable BLAS): windows view (N, Ho, Wo, C, kh, kw) of the padded input
    def _windows(self, x, spec: ConvSpec, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
        win = sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(1, 2))
        return win[:, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, :, ::dh, ::dw]

    def _bwd_data_numpy(self, dy, w, spec: ConvSpec, xshape, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        n, h, wd, c = xshape
        dcol = np.tensordot(dy, w, axes=([3], [0]))                          # (N, Ho, Wo, C, kh, kw)
        dxp = np.zeros((n, h + 2 * ph + sh, wd + 2 * pw + sw, c), self.dtype)
        for i in range(kh):
            for j in range(kw):
                dxp[:, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += dcol[..., i, j]
        return np.ascontiguousarray(dxp[:, ph:ph + h, pw:pw + wd])

    # --- pooling ------------------------------------------------------------------------------------
    def _pool_geometry(self, x, spec: PoolSpec, what):
        self._check4(x, what)
        n, h, w, c = x.shape
        if spec.kind not in ("max", "avg"):
            raise ConfigError(f"unknown pooling kind {spec.kind!r}: choose 'max' or 'avg'")
        ho, wo = self._out_hw(spec, h, w, what)
        return n, h, w, c, ho, wo

    def pool2d_forward(self, x, spec: PoolSpec):
        x = self._c(x)
        n, h, w, c, ho, wo = self._pool_geometry(x, spec, "pool2d_forward")
        (kh, kw), (sh, sw), (ph, pw) = spec.pool, spec.stride, spec.padding
        y = np.empty((n, ho, wo, c), self.dtype)
        self._nt()
        if spec.kind == "avg" and (kh, kw) == (h, w) and ph == 0 and pw == 0:
            kp.global_avg_fwd(x.reshape(-1), y.reshape(-1), n, h * w, c)
            return y, (x.shape, None)
        if spec.kind == "avg":
            kp.avgpool_fwd(x.reshape(-1), y.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
            return y, (x.shape, None)
        idx = np.empty((n, ho, wo, c), np.int32)
        kp.maxpool_fwd(x.reshape(-1), y.reshape(-1), idx.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
        return y, (x.shape, idx)

    def pool2d_backward(self, dy, ctx, spec: PoolSpec):
        xshape, idx = ctx
        n, h, w, c = xshape
        (kh, kw), (sh, sw), (ph, pw) = spec.pool, spec.stride, spec.padding
        ho, wo = spec.output_hw(h, w)
        dy = self._c(dy)
        if dy.shape != (n, ho, wo, c):
            raise ShapeError(f"pool2d_backward: dy has shape {dy.shape}, expected {(n, ho, wo, c)}")
        dx = np.empty(xshape, self.dtype)
        nt = self._nt()
        if spec.kind == "avg" and (kh, kw) == (h, w) and ph == 0 and pw == 0:
            kp.global_avg_bwd(dy.reshape(-1), dx.reshape(-1), n, h * w, c)
        elif spec.kind == "avg":
            kp.avgpool_bwd(dy.reshape(-1), dx.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw, nt)
        else:
            kp.maxpool_bwd(dy.reshape(-1), idx.reshape(-1), dx.reshape(-1), n, h, w, c, ho, wo,
                           kh, kw, sh, sw, ph, pw, nt)
        return dx

    # --- batch normalization ------------------------------------------------------------------------
    def _bn_2d(self, x, gamma, what):
        x = self._c(x)
        if x.ndim not in (2, 4):
            raise ShapeError(f"{what} expects a 2-D (N, C) or 4-D NHWC array, got shape {x.shape}")
        c = x.shape[-1]
        if np.size(gamma) != c:
            raise ShapeError(f"{what}: input has {c} channels but gamma has {np.size(gamma)}")
        return x, x.reshape(-1, c)

    def batchnorm_forward_train(self, x, gamma, beta, eps: float):
        x, x2 = self._bn_2d(x, gamma, "batchnorm_forward_train")
        m, c = x2.shape
        nt = self._nt()
        mean, var = kp.bn_stats(x2.reshape(-1), m, c, nt)
        invstd = 1.0 / np.sqrt(var + eps)
        g = np.asarray(gamma, np.float64).reshape(-1)
        dt = self.dtype
        y = np.empty_like(x)
        kp.bn_apply(x2.reshape(-1), mean.astype(dt), (g * invstd).astype(dt), self._c(beta).reshape(-1),
                    y.reshape(-1), m, c, nt)
        ctx = (x, mean, invstd, g)
        return y, mean.astype(self.dtype), var.astype(self.dtype), ctx

    def batchnorm_forward_infer(self, x, gamma, beta, mean, var, eps: float):
        x, x2 = self._bn_2d(x, gamma, "batchnorm_forward_infer")
        m, c = x2.shape
        invstd = 1.0 / np.sqrt(np.asarray(var, np.float64).reshape(-1) + eps)
        scale = np.asarray(gamma, np.float64).reshape(-1) * invstd
        y = np.empty_like(x)
        kp.bn_apply(x2.reshape(-1), self._c(mean).reshape(-1), scale.astype(self.dtype), self._c(beta).reshape(-1),
                    y.reshape(-1), m, c, self._nt())
        return y

    def batchnorm_backward(self, dy, ctx):
        x, mean, invstd, g = ctx
        dy = self._c(dy)
        if dy.shape != x.shape:
            raise ShapeError(f"batchnorm_backward: dy has shape {dy.shape}, expected {x.shape}")
        c = x.shape[-1]
        m = x.size // c
        nt = self._nt()
        sdy, sdyx = kp.bn_bwd_sums(x.reshape(-1), dy.reshape(-1), mean, m, c, nt)
        dbeta = sdy
        dgamma = sdyx * invstd
        k1 = g * invstd
        k2 = -g * invstd ** 3 * sdyx / m
        k3 = -k1 * sdy / m
        dx = np.empty_like(x)
        kp.bn_bwd_dx(x.reshape(-1), dy.reshape(-1), mean.astype(self.dtype), k1.astype(self.dtype), k2.astype(self.dtype),
                     k3.astype(self.dtype), dx.reshape(-1), m, c, nt)
        return dx, dgamma.astype(self.dtype), dbeta.astype(self.dtype)
