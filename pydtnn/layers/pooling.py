"""MaxPool2D and AveragePool2D; pool_shape=(0, 0) pools globally over the whole image."""
from pydtnn.backends import PoolSpec
from pydtnn.layers.base import Layer, pair


class _Pool2D(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    kind = None

    def __init__(self, pool_shape=(2, 2), stride=None, padding=0, name=None):
        super().__init__(name=name)
        self.pool_shape = pair(pool_shape, "pool_shape", type(self).__name__)
        self.stride_arg, self.padding = stride, pair(padding, "padding", type(self).__name__)

    def build(self, in_shape):
        if len(in_shape) != 3:
            raise self.shape_error("pooling needs (C, H, W) input")
        c, h, w = in_shape
        pool = (h, w) if self.pool_shape == (0, 0) else self.pool_shape
        stride = pool if self.stride_arg is None or self.pool_shape == (0, 0) else \
            pair(self.stride_arg, "stride", self.name)
        if min(pool) < 1 or min(stride) < 1 or min(self.padding) < 0:
            raise self.shape_error(f"bad pool {pool} / stride {stride} / padding {self.padding}")
        if self.padding[0] * 2 > pool[0] or self.padding[1] * 2 > pool[1]:
            raise self.shape_error(f"padding {self.padding} must be at most half the pool {pool}")
        self.spec = PoolSpec(self.kind, pool, stride, self.padding)
        ho, wo = self.spec.output_hw(h, w)
        if ho <= 0 or wo <= 0:
            raise self.shape_error(f"the {pool} pool does not fit the {h}x{w} input")
        return (c, ho, wo)

    def forward(self, x, training=False):
        y, self.ctx = self.backend.pool2d_forward(x, self.spec)
        return y

    def backward(self, dy):
        return self.backend.pool2d_backward(dy, self.ctx, self.spec)


class MaxPool2D(_Pool2D):
    kind = "max"


class AveragePool2D(_Pool2D):
    kind = "avg"
