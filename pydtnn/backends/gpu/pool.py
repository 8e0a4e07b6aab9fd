"""The GPU backend's pooling (kernels in `kernels/pool.py`); global average pooling's forward is a CuPy
reduction."""
from __future__ import annotations

import numpy as np

from pydtnn.backends.contract import PoolSpec
from pydtnn.errors import ConfigError, ShapeError


class PoolingKernels:
    """Mixed into `GPUBackend`."""

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
                     + self._pool_args(spec, h, w, ho, wo) + (self.kernels.index32(x.size, y.size),))
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
            self._launch("gavg_bwd", dx.size, (dy, dx, np.int64(dx.size), np.int32(h * w),
                                               self.dtype.type(1.0 / (h * w)), self.kernels.index32(dx.size)))
            return dx
        self._launch("pool_bwd", dx.size, (dy, idx if idx is not None else self._no_index(), dx, np.int64(dx.size))
                     + self._pool_args(spec, h, w, ho, wo) + (self.kernels.index32(dx.size, dy.size),))
        return dx
