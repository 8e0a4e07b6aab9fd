"""Input: declares the per-sample shape and moves user NCHW data into the backend's layout."""
from pydtnn.layers.base import Layer


class Input(Layer):
    internal_layout = True      # it does the NCHW <-> internal conversion itself
    def __init__(self, shape, name=None):
        super().__init__(name=name)
        self.declared_shape = tuple(int(d) for d in shape)

    def build(self, in_shape):
        if len(self.declared_shape) not in (1, 3):
            raise self.shape_error(f"shape must be (features,) or (C, H, W), got {self.declared_shape}")
        return self.declared_shape

    def forward(self, x, training=False):
        if tuple(x.shape[1:]) != self.shape:
            raise self.shape_error(f"got a batch of shape {tuple(x.shape)}, expected (N, *{self.shape})")
        x = self.backend.asarray(x)
        return self.backend.to_internal(x) if x.ndim == 4 else x

    def backward(self, dy):
        return self.backend.to_user(dy) if dy.ndim == 4 else dy
