"""The GPU backend's element-wise operations: ReLU, a block's sum of paths, a convolution's bias (with the
ReLU after it) and the bias's gradient (kernels in `kernels/elementwise.py`)."""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ShapeError


class ElementwiseKernels:
    """Mixed into `GPUBackend`; uses its `_launch`, `_fn`, `_c`, `_scratch` and `kernels`."""

    def relu_forward(self, x):
        x = self._c(x)
        y = self.xp.empty_like(x)
        self._launch_packed("relu_fwd", x.size, (x, y), (x, y, np.int64(x.size), self.kernels.index32(x.size)))
        return y

    def relu_backward(self, dy, y, addend=None):
        dy = self._c(dy)
        dx = self.xp.empty_like(dy)
        y = self._c(y)
        if addend is None:
            self._launch_packed("relu_bwd", dy.size, (dy, y, dx), (dy, y, dx, np.int64(dy.size),
                                                                   self.kernels.index32(dy.size)))
            return dx
        a = self._c(addend)
        if a.shape != dy.shape:
            raise ShapeError(f"relu_backward: addend {a.shape} and dy {dy.shape} differ")
        self._launch_packed("relu_bwd_sum", dy.size, (dy, a, y, dx), (dy, a, y, dx, np.int64(dy.size),
                                                                       self.kernels.index32(dy.size)))
        return dx

    def add(self, a, b, relu=False):
        a, b = self._c(a), self._c(b)
        if a.shape != b.shape:
            raise ShapeError(f"add: shapes {a.shape} and {b.shape} differ")
        y = self.xp.empty_like(a)
        self._launch_packed("add_act", a.size, (a, b, y), (a, b, y, np.int64(a.size), np.int32(bool(relu)),
                                                           self.kernels.index32(a.size)))
        return y

    def bias_activation(self, y, b, relu=False):
        """y + b (b per channel: axis 1), and max(., 0) with `relu`, IN PLACE in y (a convolution's fresh
        output); returns y."""
        n, c = y.shape[0], y.shape[1]
        hw = y.size // max(n * c, 1)
        self._plane_launch("bias_act", y.size, hw, (y, self._c(b).reshape(-1), np.int64(y.size), np.int32(hw),
                                                    np.int32(c), np.int32(bool(relu)), self.kernels.index32(y.size)))
        return y

    def channel_sums(self, dy, relu_y=None, out=None, owner=None):
        """(g, per-channel sums of g over every axis but 1), g = dy, or dy * (relu_y > 0) written to a new array:
        a bias's gradient, with the mask of the ReLU after it applied in the same pass. `out`: where the sums
        go (a view of the flat gradient buffer); `owner`: an array whose address keys the scratch (the bias)."""
        dy = self._c(dy)
        n, c = dy.shape[0], dy.shape[1]
        hw = dy.size // max(n * c, 1)
        m = dy.size // max(c, 1)
        s = self._slices(c, m, hw)
        part = (self._scratch(owner, "chan_part", (c * s,), np.float64) if owner is not None
                else self.xp.empty(c * s, np.float64))
        relu = relu_y is not None
        g = self.xp.empty_like(dy) if relu else dy
        y = self._c(relu_y) if relu else dy
        self._fn("chan_sum_partial")((c * s,), (self.kernels.BLOCK,),
                                     (dy, y, g, part, np.int64(m), np.int32(c), np.int32(hw), np.int32(s),
                                      np.int32(relu), self.kernels.index32(dy.size)))
        if out is None:
            out = self.xp.empty(c, self.dtype)
        self._per_channel("chan_sum_finalize", c, (part, np.int32(c), np.int32(s), out))
        return g, out

    def bias_relu_backward(self, dy, y, db_out=None):
        """(g, db): the ReLU's backward (g = dy * (y > 0)) and, with ``db_out``, the bias's gradient (g summed
        per channel) in one pass (`channel_sums`)."""
        if db_out is None:
            return self.relu_backward(dy, y), None
        return self.channel_sums(dy, relu_y=y, out=db_out, owner=db_out)
