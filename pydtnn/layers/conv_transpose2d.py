"""ConvTranspose2D: the transposed 2-D convolution, as `torch.nn.ConvTranspose2d(C_in, nfilters, k,
stride, padding, output_padding)`; weights (C_in, nfilters, kh, kw) and biases (nfilters,).

It is the adjoint of the convolution `spec` from nfilters to C_in channels, so the backend's own
convolution kernels do all of it: forward = that convolution's backward-data, backward-data = its
forward, weight gradient = its backward-weights (input dy, output gradient x). Output size:
(H - 1) * stride - 2 * padding + kh + output_padding (output_padding < stride picks among the sizes a
strided convolution maps to H).
"""
from pydtnn.backends import ConvSpec
from pydtnn.layers._normalize import channel_view
from pydtnn.layers.base import Layer, ParamAttr, pair


class ConvTranspose2D(Layer):
    internal_layout = True      # the backend's convolution kernels, on its layout
    weights, biases = ParamAttr("weights"), ParamAttr("biases")
    dw, db = ParamAttr("weights", grad=True), ParamAttr("biases", grad=True)

    def __init__(self, nfilters, filter_shape, stride=1, padding=0, output_padding=0, activation=None,
                 use_bias=True, weights_initializer="glorot_uniform", biases_initializer="zeros", name=None):
        super().__init__(activation=activation, name=name)
        self.nfilters = nfilters
        self.filter_shape = pair(filter_shape, "filter_shape", "ConvTranspose2D")
        self.stride = pair(stride, "stride", "ConvTranspose2D")
        self.padding = pair(padding, "padding", "ConvTranspose2D")
        self.output_padding = pair(output_padding, "output_padding", "ConvTranspose2D")
        self.use_bias = use_bias
        self.weights_initializer, self.biases_initializer = weights_initializer, biases_initializer

    def build(self, in_shape):
        if len(in_shape) != 3:
            raise self.shape_error("ConvTranspose2D needs (C, H, W) input")
        if isinstance(self.nfilters, bool) or not isinstance(self.nfilters, int) or self.nfilters < 1:
            raise self.shape_error(f"nfilters must be a positive int, got {self.nfilters!r}")
        c, h, w = in_shape
        if min(self.stride) < 1 or min(self.filter_shape) < 1 or min(self.padding) < 0:
            raise self.shape_error("filter_shape and stride must be >= 1, padding >= 0")
        if any(not 0 <= op < s for op, s in zip(self.output_padding, self.stride)):
            raise self.shape_error(f"output_padding {self.output_padding} must be >= 0 and smaller than the "
                                   f"stride {self.stride}")
        (kh, kw), (sh, sw), (ph, pw), (oh, ow) = self.filter_shape, self.stride, self.padding, self.output_padding
        ho, wo = (h - 1) * sh - 2 * ph + kh + oh, (w - 1) * sw - 2 * pw + kw + ow
        if ho <= 0 or wo <= 0:
            raise self.shape_error(f"padding {self.padding} leaves no output ({ho}x{wo})")
        self.spec = ConvSpec(self.nfilters, c, self.filter_shape, self.stride, self.padding)
        assert self.spec.output_hw(ho, wo) == (h, w)
        return (self.nfilters, ho, wo)

    def param_specs(self):
        c, k = self.in_shape[0], self.nfilters
        kh, kw = self.filter_shape
        specs = {"weights": ((c, k, kh, kw), self.weights_initializer, k * kh * kw, c * kh * kw)}
        if self.use_bias:
            specs["biases"] = ((k,), self.biases_initializer, k * kh * kw, c * kh * kw)
        return specs

    def forward(self, x, training=False):
        be = self.backend
        self.x = x
        out = self.xp.empty(be.internal_shape(x.shape[0], self.shape), dtype=x.dtype)
        y = be.conv2d_backward_data(x, self.weights, be.conv2d_context(out), self.spec)
        if self.use_bias:
            y += channel_view(self.biases, 4, self.channel_axis)
        return y

    def backward(self, dy):
        be = self.backend
        if self.input_grad_needed:
            dx, ctx = be.conv2d_forward(dy, self.weights, None, self.spec)
        else:
            dx, ctx = None, be.conv2d_context(dy)
        self.dw[...], _ = be.conv2d_backward_weights(self.x, ctx, self.spec, False)
        if self.use_bias:
            axes = tuple(a for a in range(4) if a != self.channel_axis)
            self.db[...] = dy.sum(axis=axes)
        return dx
