"""Dropout: inverted dropout with an independent mask for every element of every sample."""
from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer


class Dropout(Layer):
    internal_layout = True      # works on the backend's layout directly (no transposes)
    def __init__(self, rate=0.5, name=None):
        super().__init__(name=name)
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"Dropout rate must be in [0, 1), got {rate}")
        self.rate = float(rate)

    def forward(self, x, training=False):
        if not training or self.rate == 0.0:
            self.mask = None
            return x
        keep = 1.0 - self.rate
        # mask holds 0 or 1/keep, so the expected activation is unchanged and inference is the identity
        self.mask = (self.backend.rng.random(x.shape, dtype=self.backend.dtype) < keep).astype(x.dtype)
        self.mask *= x.dtype.type(1.0 / keep)
        return x * self.mask

    def backward(self, dy):
        return dy if self.mask is None else dy * self.mask
