"""The GPU backend: CuPy arrays, layout NCHW, cuDNN convolutions, CuPy kernels for the rest.

- Device: `GPUBackend(device=None)` takes the launcher's local rank modulo the visible devices (see
  `_gpu_device`), made current BEFORE anything is allocated.
- Convolutions: cuDNN (`_cudnn.ConvRunner`): the cuDNN Frontend graph API, with the legacy C API (ctypes)
  as per-geometry fallback; the bias is added by CuPy. Which of the two should be the default is to be
  confirmed by measurement on the device (`scripts/bench_gpu.py --conv ...`).
- `precision`: "fp32" (default: honest float32; cuDNN plans with tensor-core/TF32 numerical notes
  deselected, CuPy matmul with TF32 off) or "tf32" (cuDNN and cuBLAS may use TF32 tensor cores);
  visible as `backend.precision`. float64 is always double. CuPy's matmul compute type is process-wide:
  the float32 GPU backend created last sets it (`apply_precision()` sets it again).
- `deterministic` (default: $PYDTNN_GPU_DETERMINISTIC, else off): only cuDNN plans / algorithms that give
  the same bits every run (see `_cudnn`); every other GPU kernel here is deterministic already. For a
  resumed run bit-exact against the uninterrupted one, turn autotuning off too (`auto_conv_alg=False`,
  `--enable_cudnn_auto_conv_alg false`): autotuning measures, and two processes may pin different plans.
- Pooling: CuPy RawKernels (`_gpu_kernels`), max with the FIRST arg-max in window order and -inf
  padding, avg counting padded zeros; backward gathers per input element (deterministic). Global average
  pooling is a CuPy reduction.
- Batch normalization: CuPy RawKernels, not cuDNN: per-channel partial sums in double with a shifted
  one-pass variance (the CPU backend's formulation, so both backends agree to rounding), one fused
  element-wise pass for the output and one for dx; the biased batch variance is returned. Chosen over
  the cuDNN frontend's batchnorm because it also covers float64 and 2-D inputs, needs no graph per shape
  and no host-scalar wrappers for epsilon/momentum (gpu-notes.md), and keeps the exact semantics in view.
- No allocation outside CuPy's memory pool; cuDNN graphs, descriptors and algorithms are cached per
  geometry, and one workspace is reused.

NOT RUN ON HARDWARE: this module was written on a machine without a GPU. What runs everywhere: the
ConfigError when CuPy or a device is missing, and the pure device-choice functions.
"""
from __future__ import annotations

import os
import warnings

import numpy as np

from pydtnn.backends import Backend, ConvSpec, PoolSpec, parse_dtype
from pydtnn.backends.gpu.device import use_device
from pydtnn.errors import ConfigError, ShapeError

PRECISIONS = ("fp32", "tf32")
DETERMINISTIC_VAR = "PYDTNN_GPU_DETERMINISTIC"
_BLOCK = 256


def _deterministic(value) -> bool:
    """The `deterministic` option: the argument when given, else $PYDTNN_GPU_DETERMINISTIC (1/true/yes: on),
    else off."""
    if value is None:
        env = os.environ.get(DETERMINISTIC_VAR, "").strip().lower()
        if env not in ("", "0", "1", "true", "false", "yes", "no"):
            raise ConfigError(f"{DETERMINISTIC_VAR} must be 1 or 0, got {env!r}")
        return env in ("1", "true", "yes")
    if not isinstance(value, bool):
        raise ConfigError(f"GPU option deterministic must be True or False, got {value!r}")
    return value


def _set_matmul_precision(precision: str) -> None:
    """CuPy's float32 matmul (cuBLAS): TF32 tensor cores for "tf32", strict float32 otherwise."""
    try:
        from cupy._core import _routines_linalg as lin
        lin.set_compute_type(np.float32, lin.COMPUTE_TYPE_TF32 if precision == "tf32" else lin.COMPUTE_TYPE_DEFAULT)
    except Exception as e:  # noqa: BLE001 - a CuPy without this internal: say so, keep CuPy's default
        warnings.warn(f"could not set CuPy's float32 matmul compute type for precision={precision!r}: {e}")


class GPUBackend(Backend):
    """CuPy/cuDNN kernels, NCHW inside and out."""
    name = "gpu"
    layout = "NCHW"

    def __init__(self, dtype="float32", seed: int = 0, device=None, precision: str = "fp32",
                 auto_conv_alg: bool = False, conv_impl: str | None = None, deterministic: bool | None = None):
        self.dtype = parse_dtype(dtype, "gpu")
        if precision not in PRECISIONS:
            raise ConfigError(f"GPU precision must be 'fp32' or 'tf32', got {precision!r}")
        self.deterministic = _deterministic(deterministic)
        cupy, self.device = use_device(device)          # before any allocation
        self.xp = cupy
        self.precision = precision
        self.auto_conv_alg = bool(auto_conv_alg)
        self.apply_precision()
        from pydtnn.backends.gpu import kernels as _gpu_kernels
        self._kernels = _gpu_kernels
        self._fns = {}
        self._unused_index = None
        self.seed(seed)
        from pydtnn.backends.gpu.cudnn import ConvRunner
        self.conv = ConvRunner(cupy, self.dtype, precision, conv_impl, self.auto_conv_alg, self.deterministic)

    def apply_precision(self) -> None:
        """Set CuPy's float32 matmul compute type (process-wide in CuPy) to this backend's precision; done at
        construction, call again when backends of different precisions take turns in one process."""
        if self.dtype == np.float32:
            _set_matmul_precision(self.precision)

    # --- arrays -------------------------------------------------------------------------------------
    def asarray(self, a):
        cp = self.xp
        if isinstance(a, cp.ndarray):
            return cp.ascontiguousarray(a, dtype=self.dtype)
        return cp.asarray(np.ascontiguousarray(a, dtype=self.dtype))

    def to_numpy(self, a):
        if isinstance(a, self.xp.ndarray):
            return a.get()
        return np.asarray(a)

    def to_internal(self, x_nchw):
        x = self.asarray(x_nchw)
        if x.ndim != 4:
            raise ShapeError(f"to_internal expects a 4-D NCHW array, got shape {x.shape}")
        return x

    def to_user(self, x):
        if x.ndim != 4:
            raise ShapeError(f"to_user expects a 4-D NCHW array, got shape {x.shape}")
        return x

    def seed(self, seed: int) -> None:
        """A counter-based generator (`_gpu_random`): its state can be checkpointed, unlike CuPy's."""
        from pydtnn.backends.gpu.rng import CounterRNG
        self.rng = CounterRNG(self.xp, self.dtype, self._uniform_fill, seed)

    def _uniform_fill(self, out, key, offset):
        self._launch("uniform_fill", out.size, (out, np.int64(out.size), key, offset))

    def synchronize(self) -> None:
        self.xp.cuda.runtime.deviceSynchronize()

    def conv_report(self) -> dict:
        """Which cuDNN implementation serves which convolution (and why the legacy API, where it does)."""
        return self.conv.report()

    # --- helpers ------------------------------------------------------------------------------------
    def _c(self, a):
        return self.asarray(a)

    def _fn(self, name):
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = self._kernels.module(self.xp, self.dtype).get_function(name)
        return fn

    def _launch(self, name, total, args):
        fn = self._fn(name)
        grid = max(1, min(int(-(-total // _BLOCK)), 65535 * 8))
        fn((grid,), (_BLOCK,), args)

    # --- convolution --------------------------------------------------------------------------------
    def _conv_geometry(self, x, spec: ConvSpec, what):
        self._check4(x, what)
        n, c, h, w = x.shape
        if c != spec.in_channels:
            raise ShapeError(f"{what}: input has {c} channels, the convolution expects {spec.in_channels}")
        g = spec.groups
        if g < 1 or spec.in_channels % g or spec.out_channels % g:
            raise ConfigError(f"unsupported convolution groups={g} (in_channels={spec.in_channels}, "
                              f"out_channels={spec.out_channels}): groups must divide both")
        ho, wo = self._out_hw(spec, h, w, what)
        return n, h, w, ho, wo

    def _weights(self, w, spec: ConvSpec):
        w = self._c(w)
        kh, kw = spec.kernel
        expected = (spec.out_channels, spec.in_channels // spec.groups, kh, kw)
        if w.shape != expected:
            raise ShapeError(f"convolution weights have shape {w.shape}, expected {expected}")
        return w

    def conv2d_forward(self, x, w, b, spec: ConvSpec):
        x = self._c(x)
        n, h, wd, ho, wo = self._conv_geometry(x, spec, "conv2d_forward")
        w = self._weights(w, spec)
        y = self.xp.empty((n, spec.out_channels, ho, wo), self.dtype)
        self.conv.run("fprop", x, w, y, spec)
        if b is not None:
            y += self._c(b).reshape(1, -1, 1, 1)
        return y, (x,)

    def conv2d_backward_data(self, dy, w, ctx, spec: ConvSpec):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_data")
        expected = (n, spec.out_channels, ho, wo)
        if dy.shape != expected:
            raise ShapeError(f"conv2d_backward_data: dy has shape {dy.shape}, expected {expected}")
        dx = self.xp.empty_like(x)
        self.conv.run("dgrad", dx, self._weights(w, spec), dy, spec)
        return dx

    def conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool):
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_weights")
        k = spec.out_channels
        if dy.shape != (n, k, ho, wo):
            raise ShapeError(f"conv2d_backward_weights: dy has shape {dy.shape}, expected {(n, k, ho, wo)}")
        kh, kw = spec.kernel
        dw = self.xp.empty((k, spec.in_channels // spec.groups, kh, kw), self.dtype)
        self.conv.run("wgrad", x, dw, dy, spec)
        db = dy.reshape(n, k, ho * wo).sum(axis=(0, 2)) if with_bias else None
        return dw, db

    # --- pooling ------------------------------------------------------------------------------------
    def _pool_geometry(self, x, spec: PoolSpec, what):
        self._check4(x, what)
        if spec.kind not in ("max", "avg"):
            raise ConfigError(f"unknown pooling kind {spec.kind!r}: choose 'max' or 'avg'")
        n, c, h, w = x.shape
        ho, wo = self._out_hw(spec, h, w, what)
        return n, c, h, w, ho, wo

    @staticmethod
    def _is_global_avg(spec: PoolSpec, h, w):
        return spec.kind == "avg" and tuple(spec.pool) == (h, w) and tuple(spec.padding) == (0, 0)

    def _pool_args(self, spec: PoolSpec, h, w, ho, wo):
        (kh, kw), (sh, sw), (ph, pw) = spec.pool, spec.stride, spec.padding
        return tuple(np.int32(v) for v in (h, w, ho, wo, kh, kw, sh, sw, ph, pw, spec.kind == "max"))

    def _no_index(self):
        """The `int* idx` argument of average pooling, never read: an int32 array, as the signature says."""
        if self._unused_index is None:
            self._unused_index = self.xp.empty(1, np.int32)
        return self._unused_index

    def pool2d_forward(self, x, spec: PoolSpec):
        x = self._c(x)
        n, c, h, w, ho, wo = self._pool_geometry(x, spec, "pool2d_forward")
        if self._is_global_avg(spec, h, w):                     # a reduction
            return x.reshape(n, c, h * w).mean(axis=2).reshape(n, c, 1, 1), (x.shape, None)
        y = self.xp.empty((n, c, ho, wo), self.dtype)
        idx = self.xp.empty((n, c, ho, wo), np.int32) if spec.kind == "max" else None
        self._launch("pool_fwd", y.size, (x, y, idx if idx is not None else self._no_index(), np.int64(y.size))
                     + self._pool_args(spec, h, w, ho, wo) + (self._kernels.index32(x.size, y.size),))
        return y, (x.shape, idx)

    def pool2d_backward(self, dy, ctx, spec: PoolSpec):
        xshape, idx = ctx
        n, c, h, w = xshape
        ho, wo = spec.output_hw(h, w)
        dy = self._c(dy)
        if dy.shape != (n, c, ho, wo):
            raise ShapeError(f"pool2d_backward: dy has shape {dy.shape}, expected {(n, c, ho, wo)}")
        dx = self.xp.empty(xshape, self.dtype)
        if self._is_global_avg(spec, h, w):
            dx[...] = dy * self.dtype.type(1.0 / (h * w))
            return dx
        self._launch("pool_bwd", dx.size, (dy, idx if idx is not None else self._no_index(), dx, np.int64(dx.size))
                     + self._pool_args(spec, h, w, ho, wo) + (self._kernels.index32(dx.size, dy.size),))
        return dx

    # --- batch normalization ------------------------------------------------------------------------
    def _bn_geometry(self, x, gamma, what):
        x = self._c(x)
        if x.ndim not in (2, 4):
            raise ShapeError(f"{what} expects a 2-D (N, C) or 4-D NCHW array, got shape {x.shape}")
        c = x.shape[1]
        if int(np.prod(gamma.shape)) != c:
            raise ShapeError(f"{what}: input has {c} channels but gamma has {int(np.prod(gamma.shape))}")
        hw = int(np.prod(x.shape[2:])) if x.ndim == 4 else 1
        return x, c, hw, x.size // max(c, 1)

    def _bn_sums(self, x, dy, shift, c, hw, m, backward):
        """Per-channel partial sums (see `_gpu_kernels`): returns (partials, number of slices).
        One block per (channel, slice), all on gridDim.x (its limit is 2**31 - 1, gridDim.y's 65,535)."""
        s = int(max(1, min(-(-528 // c), -(-m // _BLOCK))))          # about 4 blocks per SM in all
        part = self.xp.empty((c, s, 2), np.float64)
        shift = part if shift is None else shift                       # forward: the kernel reads x instead
        self._fn("bn_partial")((c * s,), (_BLOCK,), (x, dy, shift, part, np.int64(m), np.int32(c), np.int32(hw),
                                                     np.int32(s), np.int32(backward),
                                                     self._kernels.index32(x.size)))
        return part, s

    def _bn_apply(self, x, mean64, scale64, beta, hw, c):
        y = self.xp.empty_like(x)
        self._launch("bn_apply", x.size, (x, mean64, scale64, beta, y, np.int64(x.size), np.int32(hw), np.int32(c),
                                          self._kernels.index32(x.size)))
        return y

    def _per_channel(self, name, c, args):
        self._fn(name)((-(-c // 128),), (128,), args)

    def batchnorm_forward_train(self, x, gamma, beta, eps: float, sync=None, center=None):
        cp = self.xp
        x, c, hw, m = self._bn_geometry(x, gamma, "batchnorm_forward_train")
        if m == 0:
            raise ShapeError("batchnorm_forward_train: empty batch")
        gamma, beta = self._c(gamma).reshape(-1), self._c(beta).reshape(-1)
        part, s = self._bn_sums(x, x, None, c, hw, m, False)
        if sync is not None:
            return self._bn_forward_synced(x, gamma, beta, eps, part, m, hw, sync, center)
        mean, var = cp.empty(c, self.dtype), cp.empty(c, self.dtype)
        mean64, scale64, invstd64 = (cp.empty(c, np.float64) for _ in range(3))
        self._per_channel("bn_finalize_fwd", c, (part, x, gamma, np.int32(c), np.int32(hw), np.int32(s),
                                                 np.float64(m), np.float64(eps), mean, var, mean64, scale64,
                                                 invstd64))
        y = self._bn_apply(x, mean64, scale64, beta, hw, c)
        return y, mean, var, (x, mean64, invstd64, gamma, hw, m)

    def _bn_forward_synced(self, x, gamma, beta, eps, part, m, hw, sync, center):
        """Global-batch statistics: the partial sums (about each channel's first element, as the kernel
        takes them) are added up here, reduced over replicas by `sync`, and finalized in float64."""
        cp = self.xp
        c = gamma.shape[0]
        t = part.sum(axis=1)
        shift = (x[0, :, 0, 0] if x.ndim == 4 else x[0, :]).astype(np.float64)
        centre = cp.asarray(center, dtype=np.float64).reshape(-1)
        t1, t2, count = sync.forward_moments(cp, t[:, 0], t[:, 1], m, shift, centre)
        d1 = t1 / count
        mean64 = centre + d1
        var64 = cp.maximum(t2 / count - d1 * d1, 0.0)
        invstd64 = 1.0 / cp.sqrt(var64 + eps)
        scale64 = gamma.astype(np.float64) * invstd64
        y = self._bn_apply(x, mean64, scale64, beta, hw, c)
        return y, mean64.astype(self.dtype), var64.astype(self.dtype), (x, mean64, invstd64, gamma, hw, count)

    def batchnorm_forward_infer(self, x, gamma, beta, mean, var, eps: float):
        cp = self.xp
        x, c, hw, m = self._bn_geometry(x, gamma, "batchnorm_forward_infer")
        mean64 = cp.asarray(mean, dtype=np.float64).reshape(-1)
        scale64 = cp.asarray(gamma, dtype=np.float64).reshape(-1) / cp.sqrt(
            cp.asarray(var, dtype=np.float64).reshape(-1) + eps)
        return self._bn_apply(x, mean64, scale64, self._c(beta).reshape(-1), hw, c)

    def batchnorm_backward(self, dy, ctx, sync=None, addend=None):
        cp = self.xp
        x, mean64, invstd64, gamma, hw, count = ctx
        dy = self._c(dy)
        if dy.shape != x.shape:
            raise ShapeError(f"batchnorm_backward: dy has shape {dy.shape}, expected {x.shape}")
        c = x.shape[1]
        m = x.size // c
        part, s = self._bn_sums(x, dy, mean64, c, hw, m, True)
        if sync is None:
            k1, k2, k3 = (cp.empty(c, np.float64) for _ in range(3))
            dgamma, dbeta = cp.empty(c, self.dtype), cp.empty(c, self.dtype)
            self._per_channel("bn_finalize_bwd", c, (part, invstd64, gamma, np.int32(c), np.int32(s),
                                                     np.float64(m), k1, k2, k3, dgamma, dbeta))
        else:       # this replica's dgamma, dbeta; dx from the sums over every replica
            t = part.sum(axis=1)
            dgamma, dbeta = (t[:, 1] * invstd64).astype(self.dtype), t[:, 0].astype(self.dtype)
            sdy, sdyx = sync.backward_sums(cp, t[:, 0], t[:, 1])
            g = gamma.astype(np.float64)
            k1 = g * invstd64
            k2 = -g * invstd64 ** 3 * sdyx / count
            k3 = -k1 * sdy / count
        dx = cp.empty_like(x)
        self._launch("bn_apply_bwd", x.size, (dy, x, mean64, k1, k2, k3, dx, np.int64(x.size), np.int32(hw),
                                              np.int32(c), self._kernels.index32(x.size)))
        if addend is not None:
            dx += addend
        return dx, dgamma, dbeta
