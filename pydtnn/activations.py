"""Activation layers. Element-wise math through the backend's array module, so one code serves every backend.

Layers never modify their input or their incoming gradient in place: a block may share them between paths.
"""
import math

from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer


class Relu(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)

    def forward(self, x, training=False, *, relu=None):
        # relu: the FusedRelu pairing this Relu with the layer before it (pydtnn/execution/relu_fusion.py), from
        # the model's execution plan; where that layer applied this ReLU already, x is passed on as it is
        fused = relu is not None and relu.take(x)
        self.y = x if fused else self.backend.relu_forward(x)
        return self.y

    def backward(self, dy, *, relu=None):
        if relu is not None and relu.passed_on:         # the layer before applies the mask
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


class GELU(Layer):
    """x * Phi(x), Phi the standard normal CDF (`approximate="none"`, exact through erfc), or PyTorch's
    tanh approximation 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) (`approximate="tanh"`).

    The tanh form is computed as x * sigmoid(2u), its equal, with the sigmoid from exp(-|2u|): 1 + tanh(u)
    cancels where tanh(u) is near -1 (a relative error of 7e-9 was seen on the GPU at x around -5), the
    sigmoid form has no subtraction."""
    internal_layout = True      # element-wise
    APPROXIMATIONS = ("none", "tanh")
    _C = math.sqrt(2 / math.pi)
    _A = 0.044715

    def __init__(self, approximate="none", name=None):
        super().__init__(name=name)
        if approximate not in self.APPROXIMATIONS:
            raise ConfigError(f"GELU approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x, training=False):
        self.x = x
        if self.approximate == "tanh":
            xp, t = self.xp, x.dtype.type
            z = t(2 * self._C) * (x + t(self._A) * x * x * x)          # 2u
            e = xp.exp(-xp.abs(z))
            one = 1 / (1 + e)
            self.s = xp.where(z >= 0, one, e * one)                   # sigmoid(2u) = (1 + tanh(u)) / 2
            self.sm = xp.where(z >= 0, e * one, one)                  # sigmoid(-2u) = (1 - tanh(u)) / 2
            return x * self.s
        y, self.ctx = self.backend.gelu_forward(x)          # x Phi(x), Phi through erfc: accurate in both tails
        return y

    def backward(self, dy):
        x = self.x
        if self.approximate == "tanh":
            t = x.dtype.type
            du = t(2 * self._C) * (1 + t(3 * self._A) * x * x)          # d(2u)/dx
            return dy * (self.s + x * self.s * self.sm * du)
        return self.backend.gelu_backward(dy, self.ctx)


class SiLU(Layer):
    """x * sigmoid(x) (also called Swish); dy/dx = s (1 + x (1 - s))."""
    internal_layout = True      # element-wise

    def forward(self, x, training=False):
        self.x = x
        self.s = stable_sigmoid(self.xp, x)
        return x * self.s

    def backward(self, dy):
        s = self.s
        return dy * (s * (1 + self.x * (1 - s)))


class Softmax(Layer):
    """Softmax over the last axis: the features of (F,), each position's of (T, D). A categorical
    cross-entropy loss fuses with it (see losses.py)."""
    internal_layout = True      # works on the backend's layout directly (no transposes)

    def build(self, in_shape):
        if len(in_shape) not in (1, 2):
            raise self.shape_error("Softmax needs (features,) or (T, features) input")
        return in_shape

    def forward(self, x, training=False):
        self.y = self.backend.softmax(x.copy())
        return self.y

    def backward(self, dy):
        return self.backend.softmax_backward(self.y, dy.copy())


ACTIVATIONS = {"relu": Relu, "leaky_relu": LeakyRelu, "sigmoid": Sigmoid, "tanh": Tanh, "softmax": Softmax,
               "gelu": GELU, "silu": SiLU}


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


def expand_activations(layers):
    """Insert the activation layer that an `activation="relu"` shortcut asks for after its layer."""
    out = []
    for layer in layers:
        out.append(layer)
        if layer.activation is not None:
            out.append(make_activation(layer.activation))
            layer.activation = None
    return out
