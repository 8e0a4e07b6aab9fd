"""Conv2D: 2-D convolution with stride, padding, dilation and depthwise / pointwise grouping.

Weights are (nfilters, C // groups, kh, kw) on every backend; the backend's kernels do the work.
"""
from pydtnn.backends import ConvSpec
from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer, ParamAttr, pair


class Conv2D(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    weights, biases = ParamAttr("weights"), ParamAttr("biases")
    dw, db = ParamAttr("weights", grad=True), ParamAttr("biases", grad=True)

    def __init__(self, nfilters=None, filter_shape=None, padding=0, stride=1, dilation=1, activation=None,
                 use_bias=True, grouping=None, weights_initializer="glorot_uniform", biases_initializer="zeros",
                 name=None):
        super().__init__(activation=activation, name=name)
        if grouping not in (None, "standard", "depthwise", "pointwise"):
            raise ConfigError(f"Conv2D grouping must be None, 'depthwise' or 'pointwise', got {grouping!r}")
        if grouping == "pointwise":
            if filter_shape not in (None, 1, (1, 1), [1, 1]):
                raise ConfigError(f"Conv2D grouping='pointwise' means a 1x1 filter, got filter_shape={filter_shape}")
            filter_shape = (1, 1)
        elif filter_shape is None:
            filter_shape = (3, 3)
        self.nfilters, self.grouping = nfilters, grouping
        self.filter_shape = pair(filter_shape, "filter_shape", "Conv2D")
        self.padding_arg, self.stride, self.dilation = padding, pair(stride, "stride", "Conv2D"), \
            pair(dilation, "dilation", "Conv2D")
        self.use_bias = use_bias
        self.weights_initializer, self.biases_initializer = weights_initializer, biases_initializer

    def _padding(self):
        if self.padding_arg == "valid":
            return (0, 0)
        if self.padding_arg == "same":
            if self.stride != (1, 1):
                raise self.shape_error("padding='same' needs stride 1")
            (kh, kw), (dh, dw) = self.filter_shape, self.dilation
            if (dh * (kh - 1)) % 2 or (dw * (kw - 1)) % 2:
                raise self.shape_error("padding='same' needs an odd (dilated) filter size")
            return (dh * (kh - 1) // 2, dw * (kw - 1) // 2)
        return pair(self.padding_arg, "padding", self.name)

    def build(self, in_shape):
        if len(in_shape) != 3:
            raise self.shape_error("Conv2D needs (C, H, W) input")
        c, h, w = in_shape
        if self.grouping == "depthwise":
            if self.nfilters not in (None, c):
                raise self.shape_error(f"a depthwise convolution keeps the {c} channels; nfilters={self.nfilters}")
            nfilters, groups = c, c
        else:
            if not self.nfilters or self.nfilters <= 0:
                raise self.shape_error(f"nfilters must be a positive int, got {self.nfilters!r}")
            nfilters, groups = self.nfilters, 1
        if min(self.stride) < 1 or min(self.dilation) < 1 or min(self.filter_shape) < 1:
            raise self.shape_error("filter_shape, stride and dilation must be >= 1")
        padding = self._padding()
        if min(padding) < 0:
            raise self.shape_error(f"padding must be >= 0, got {padding}")
        self.spec = ConvSpec(c, nfilters, self.filter_shape, self.stride, padding, self.dilation, groups)
        ho, wo = self.spec.output_hw(h, w)
        if ho <= 0 or wo <= 0:
            raise self.shape_error(f"the {self.filter_shape} filter (dilation {self.dilation}, padding {padding}) "
                                   f"does not fit the {h}x{w} input")
        return (nfilters, ho, wo)

    def param_specs(self):
        s = self.spec
        kh, kw = s.kernel
        fan_in = s.in_channels // s.groups * kh * kw
        fan_out = s.out_channels // s.groups * kh * kw
        specs = {"weights": ((s.out_channels, s.in_channels // s.groups, kh, kw), self.weights_initializer,
                             fan_in, fan_out)}
        if self.use_bias:
            specs["biases"] = ((s.out_channels,), self.biases_initializer, fan_in, fan_out)
        return specs

    # --- declaration for the execution passes (pydtnn/execution/) ---------------------------------------
    def fuses_next_relu(self):
        """A Relu right after this convolution runs in its bias pass where the backend takes relu=."""
        return bool(getattr(self.backend, "fuses_conv_relu", False))

    def forward(self, x, training=False, *, relu=None):
        """relu: the FusedRelu of the Relu after this layer (from the model's execution plan)."""
        y, self.ctx = self.backend.conv2d_forward(x, self.weights, self.biases if self.use_bias else None,
                                                  self.spec, **({"relu": True} if relu is not None else {}))
        return relu.hand_on(y) if relu is not None else y               # y is relu(conv(x) + b) there

    def backward(self, dy, *, relu=None):
        db = self.db if self.use_bias else None
        with_bias = self.use_bias
        if relu is not None:        # dy arrives after the fused Relu: its mask and the bias's gradient first
            dy, _ = self.backend.bias_relu_backward(dy, relu.y, db_out=db)
            with_bias = False
        self.backend.conv2d_backward_weights(dy, self.ctx, self.spec, with_bias,
                                             out=(self.dw, db if with_bias else None))
        if not self.input_grad_needed:
            return None
        return self.backend.conv2d_backward_data(dy, self.weights, self.ctx, self.spec)
