"""Flatten: (C, H, W) -> (C*H*W,) in NCHW order on every backend, so FC weights mean the same everywhere."""
from pydtnn.layers.base import Layer


class Flatten(Layer):
    internal_layout = True      # it does the NCHW <-> internal conversion itself
    def build(self, in_shape):
        size = 1
        for d in in_shape:
            size *= d
        return (size,)

    def forward(self, x, training=False):
        self.x_shape = x.shape
        if x.ndim == 4:
            x = self.backend.to_user(x)
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        n = dy.shape[0]
        if len(self.in_shape) == 3:
            return self.backend.to_internal(dy.reshape((n,) + self.in_shape))
        return dy.reshape(self.x_shape)
