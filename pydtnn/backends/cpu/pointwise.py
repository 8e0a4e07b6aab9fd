"""1x1 stride-1 convolutions on small images as one GEMM over the whole batch's pixels (the CPU backend's
matrix product): `PointwiseConvKernels`, mixed into `conv.ConvKernels` (which decides where it runs:
`ConvKernels._pointwise`). The row blocks of `conv` stay within an image, and on 2x2 or 4x4 images each
block's thin GEMM reads all the weights again (MobileNet's 1024 -> 1024 on 2x2: 13 GFLOP/s).
"""
from __future__ import annotations

import numpy as np


class PointwiseConvKernels:
    """x (N H W, C) @ w (C, K): NHWC already is the GEMM's matrix."""

    def _pointwise_forward(self, x, w, bias, y, spec):
        c, k = x.shape[-1], y.shape[-1]
        self.matmul(x.reshape(-1, c), self._c(np.asarray(w)[:, :, 0, 0]).T, out=y.reshape(-1, k))
        if bias.size:
            y += bias

    def _pointwise_backward_data(self, dy, w, dx, spec):
        c, k = dx.shape[-1], dy.shape[-1]
        self.matmul(dy.reshape(-1, k), self._c(w[:, :, 0, 0]), out=dx.reshape(-1, c))
        return dx

    def _pointwise_backward_weights(self, x, dy, spec, with_bias):
        c, k = x.shape[-1], dy.shape[-1]
        dy2 = dy.reshape(-1, k)
        dwu = self.matmul(dy2.T, x.reshape(-1, c)).reshape(k, c, 1, 1)
        return dwu, (dy2.sum(axis=0) if with_bias else None)
