"""The GPU backend's convolutions: cuDNN (`cudnn.ConvRunner`) for the products, our kernels for the bias.

The bias (and a ReLU fused after the convolution) is added in one pass over cuDNN's fresh output; the
bias's gradient is a per-channel sum in double (`channel_sums`), taken in the pass that applies that ReLU's
mask. dw (and db) go straight into arrays the caller passes (`out`: the model's flat gradient buffer).
"""
from __future__ import annotations

from pydtnn.backends.contract import ConvSpec
from pydtnn.errors import ConfigError, ShapeError


class ConvKernels:
    """Mixed into `GPUBackend`."""
    fuses_conv_relu = True       # conv2d_forward(relu=True) and bias_relu_backward: a Conv2D + Relu pair in one pass

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

    def conv2d_forward(self, x, w, b, spec: ConvSpec, relu=False):
        """y = conv(x, w) + b, and max(y, 0) with `relu` (a ReLU fused after the convolution)."""
        x = self._c(x)
        n, h, wd, ho, wo = self._conv_geometry(x, spec, "conv2d_forward")
        w = self._weights(w, spec)
        y = self.xp.empty((n, spec.out_channels, ho, wo), self.dtype)
        self.conv.run("fprop", x, w, y, spec)
        if b is not None or relu:
            if b is None:
                y = self.relu_forward(y)
            else:
                self.bias_activation(y, b, relu)
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

    def conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool, out=None):
        """(dw, db): dw shaped like w, db (K,) or None; `out`: (dw, db) arrays to write them into (db may be
        None), C-contiguous, e.g. views of the model's flat gradient buffer."""
        (x,) = ctx
        dy = self._c(dy)
        n, h, wd, ho, wo = self._conv_geometry(x, spec, "conv2d_backward_weights")
        k = spec.out_channels
        if dy.shape != (n, k, ho, wo):
            raise ShapeError(f"conv2d_backward_weights: dy has shape {dy.shape}, expected {(n, k, ho, wo)}")
        kh, kw = spec.kernel
        shape = (k, spec.in_channels // spec.groups, kh, kw)
        dw_out, db_out = out if out is not None else (None, None)
        dw = dw_out if dw_out is not None and dw_out.flags.c_contiguous else self.xp.empty(shape, self.dtype)
        self.conv.run("wgrad", x, dw, dy, spec)
        if dw_out is not None and dw is not dw_out:
            dw_out[...] = dw
            dw = dw_out
        db = self.channel_sums(dy, out=db_out, owner=db_out)[1] if with_bias else None
        return dw, db
