"""Input: declares the per-sample shape and moves user NCHW data into the backend's layout.

Shapes: (C, H, W) images, (F,) features, (T, D) sequences of vectors, and, with `dtype="int64"`,
(T,) integer token ids (for Embedding), which stay integers on the device.
"""
import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer


class Input(Layer):
    internal_layout = True      # it does the NCHW <-> internal conversion itself

    def __init__(self, shape, dtype=None, name=None):
        super().__init__(name=name)
        self.declared_shape = tuple(int(d) for d in shape)
        try:
            self.ids = dtype is not None and np.issubdtype(np.dtype(dtype), np.integer)
        except TypeError:
            raise ConfigError(f"Input dtype must be None (the model's float type) or an integer type for "
                              f"token ids, got {dtype!r}") from None
        self.differentiable_input = not self.ids
        if dtype is not None and not self.ids:
            raise ConfigError(f"Input dtype must be None (the model's float type) or an integer type for "
                              f"token ids, got {dtype!r}")

    def build(self, in_shape):
        if self.ids and len(self.declared_shape) != 1:
            raise self.shape_error(f"integer ids must have shape (T,), got {self.declared_shape}")
        if len(self.declared_shape) not in (1, 2, 3):
            raise self.shape_error(f"shape must be (features,), (T, D) or (C, H, W), got {self.declared_shape}")
        return self.declared_shape

    def forward(self, x, training=False):
        if tuple(x.shape[1:]) != self.shape:
            raise self.shape_error(f"got a batch of shape {tuple(x.shape)}, expected (N, *{self.shape})")
        if self.ids:
            if not np.issubdtype(x.dtype, np.integer):
                raise self.shape_error(f"expects integer token ids, got an array of {x.dtype}")
            return self.xp.asarray(x, dtype=self.xp.int64)
        x = self.backend.asarray(x)
        return self.backend.to_internal(x) if x.ndim == 4 else x

    def backward(self, dy):
        if dy is None:                  # integer ids have no gradient
            return None
        return self.backend.to_user(dy) if dy.ndim == 4 else dy
