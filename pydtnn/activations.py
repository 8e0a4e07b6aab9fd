"""Activation layers. Element-wise math through the backend's array module, so one code serves every backend.

Layers never modify their input or their incoming gradient in place: a block may share them between paths.
"""
from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer


class Relu(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    fused_input = None          # set by a fused BatchNormalization before: its output, already relu'd
    _passthrough = False

    def forward(self, x, training=False):
        # fused with the BatchNormalization before it (pydtnn/layers/fusion.py): x is relu(bn(.)) already
        self._passthrough, self.fused_input = x is self.fused_input, None
        self.y = x if self._passthrough else self.backend.relu_forward(x)
        return self.y

    def backward(self, dy):
        if self._passthrough:           # the BatchNormalization's backward applies this ReLU's mask
            return dy
        return self.backend.relu_backward(dy, self.y)


class LeakyRelu(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    def __init__(self, negative_slope=0.01, name=None):
        super().__init__(name=name)
        self.negative_slope = float(negative_slope)

    def forward(self, x, training=False):
        self.positive = x > 0
        return self.xp.where(self.positive, x, x * x.dtype.type(self.negative_slope))

    def backward(self, dy):
        return self.xp.where(self.positive, dy, dy * dy.dtype.type(self.negative_slope))


def stable_sigmoid(xp, x, e=None):
    """1 / (1 + exp(-x)) from exp(-|x|) (exp of a non-positive number only: no overflow for large |x|)."""
    if e is None:
        e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


class Sigmoid(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    def forward(self, x, training=False):
        self.y = stable_sigmoid(self.xp, x)
        return self.y

    def backward(self, dy):
        return dy * self.y * (1 - self.y)


class Tanh(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    def forward(self, x, training=False):
        self.y = self.xp.tanh(x)
        return self.y

    def backward(self, dy):
        return dy * (1 - self.y * self.y)      # upstream used tan and forgot the chain rule


class Softmax(Layer):
    """Softmax over features. A categorical cross-entropy loss fuses with it (see losses.py)."""
    internal_layout = True      # works on the backend's layout directly (no transposes)

    def build(self, in_shape):
        if len(in_shape) != 1:
            raise self.shape_error("Softmax needs flat (features,) input")
        return in_shape

    def forward(self, x, training=False):
        xp = self.xp
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        self.y = e / e.sum(axis=1, keepdims=True)
        return self.y

    def backward(self, dy):
        y = self.y
        return y * (dy - (dy * y).sum(axis=1, keepdims=True))


ACTIVATIONS = {"relu": Relu, "leaky_relu": LeakyRelu, "sigmoid": Sigmoid, "tanh": Tanh, "softmax": Softmax}


def make_activation(spec):
    """The activation layer for an `activation=` shortcut (a name, a class or a layer)."""
    if isinstance(spec, Layer):
        return spec
    if isinstance(spec, type) and issubclass(spec, Layer):
        return spec()
    try:
        return ACTIVATIONS[spec]()
    except (KeyError, TypeError):
        raise ConfigError(f"unknown activation {spec!r}: choose one of {', '.join(ACTIVATIONS)}") from None
