"""Upsample2D: enlarge images by an integer factor, as `torch.nn.Upsample(scale_factor=s, mode=...)`.

- "nearest": every pixel repeated s x s times; backward sums each s x s block.
- "bilinear" (align_corners=False, PyTorch's default): output pixel i samples the input at
  (i + 0.5) / s - 0.5, clamped at 0, between its two neighbours. Separable, so it is two small
  interpolation matrices, (H*s, H) and (W*s, W), applied by matmul along H and along W; backward applies
  their transposes.
"""
from pydtnn.errors import ConfigError
from pydtnn.layers.base import Layer, pair


def interpolation_matrix(xp, size, scale, dtype):
    """(size * scale, size): row i holds the two bilinear weights of output i (align_corners=False)."""
    import numpy as np
    out = np.arange(size * scale)
    src = np.maximum((out + 0.5) / scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), size - 1)
    hi = np.minimum(lo + 1, size - 1)
    frac = src - lo
    m = np.zeros((size * scale, size))
    np.add.at(m, (out, lo), 1 - frac)
    np.add.at(m, (out, hi), frac)
    return xp.asarray(m.astype(dtype))


class Upsample2D(Layer):
    internal_layout = True      # H and W located from the backend's layout
    MODES = ("nearest", "bilinear")

    def __init__(self, scale_factor=2, mode="nearest", name=None):
        super().__init__(name=name)
        sh, sw = pair(scale_factor, "scale_factor", "Upsample2D")
        if isinstance(scale_factor, float) and not scale_factor.is_integer() or sh < 1 or sw < 1:
            raise ConfigError(f"Upsample2D scale_factor must be a positive int (or a pair), got {scale_factor!r}")
        if mode not in self.MODES:
            raise ConfigError(f"Upsample2D mode must be 'nearest' or 'bilinear', got {mode!r}")
        self.scale, self.mode = (sh, sw), mode

    def build(self, in_shape):
        if len(in_shape) != 3:
            raise self.shape_error("Upsample2D needs (C, H, W) input")
        c, h, w = in_shape
        if self.mode == "bilinear":
            dtype = self.backend.dtype
            self.ah = interpolation_matrix(self.xp, h, self.scale[0], dtype)
            self.aw = interpolation_matrix(self.xp, w, self.scale[1], dtype)
        return (c, h * self.scale[0], w * self.scale[1])

    def forward(self, x, training=False):
        xp, (sh, sw) = self.xp, self.scale
        nhwc = self.channel_axis == 3
        if self.mode == "nearest":
            h_axis = 1 if nhwc else 2
            return xp.repeat(xp.repeat(x, sh, axis=h_axis), sw, axis=h_axis + 1)
        if nhwc:                                   # (N, H, W, C): W*C contiguous rows, then W by broadcasting
            n, h, w, c = x.shape
            y = self.backend.matmul(self.ah, x.reshape(n, h, w * c)).reshape(n, h * sh, w, c)
            return self.backend.matmul(self.aw, y)
        return self.backend.matmul(self.backend.matmul(self.ah, x), self.aw.T)     # (N, C, H, W)

    def backward(self, dy):
        sh, sw = self.scale
        nhwc = self.channel_axis == 3
        if self.mode == "nearest":
            if nhwc:
                n, ho, wo, c = dy.shape
                return dy.reshape(n, ho // sh, sh, wo // sw, sw, c).sum(axis=(2, 4))
            n, c, ho, wo = dy.shape
            return dy.reshape(n, c, ho // sh, sh, wo // sw, sw).sum(axis=(3, 5))
        if nhwc:
            n, ho, wo, c = dy.shape
            g = self.backend.matmul(self.aw.T, dy)                             # (N, Ho, W, C)
            w = g.shape[2]
            return self.backend.matmul(self.ah.T, g.reshape(n, ho, w * c)).reshape(n, ho // sh, w, c)
        return self.backend.matmul(self.backend.matmul(self.ah.T, dy), self.aw)
