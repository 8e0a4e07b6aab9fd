"""LayerNorm: each sample standardized over its features, then scaled and shifted (learnable gamma, beta).

- (N, D) and (N, T, D): over the last axis, as `torch.nn.LayerNorm(D)`; gamma, beta have shape (D,);
- (N, C, H, W): over (C, H, W) together, with one gamma/beta per channel (C,), as
  `torch.nn.GroupNorm(1, C)` (a LayerNorm that works on any image size).
Needs no synchronization under data parallelism: its statistics are per sample.
"""
from pydtnn.layers._normalize import channel_view, standardize, standardize_backward
from pydtnn.layers.base import Layer, ParamAttr


class LayerNorm(Layer):
    internal_layout = True      # images: statistics over all of (C, H, W); gamma on the backend's channel axis
    gamma, beta = ParamAttr("gamma"), ParamAttr("beta")
    dgamma, dbeta = ParamAttr("gamma", grad=True), ParamAttr("beta", grad=True)

    def __init__(self, epsilon=1e-5, name=None):
        super().__init__(name=name)
        self.epsilon = float(epsilon)

    def build(self, in_shape):
        if len(in_shape) not in (1, 2, 3):
            raise self.shape_error("LayerNorm needs (D,), (T, D) or (C, H, W) input")
        features = in_shape[0] if len(in_shape) == 3 else in_shape[-1]
        self.add_weight("gamma", (features,), "ones", features, features)
        self.add_weight("beta", (features,), "zeros", features, features)
        return in_shape

    def _axes(self, x):
        """(normalized axes, the axis gamma lies along)."""
        if x.ndim == 4:
            return (1, 2, 3), self.channel_axis
        return (x.ndim - 1,), x.ndim - 1

    def forward(self, x, training=False):
        if x.ndim != 4:                  # over the last axis: the backend's one-pass kernels
            y, self.ctx = self.backend.layernorm_forward(x, self.gamma, self.beta, self.epsilon)
            return y
        axes, axis = self._axes(x)
        self.x_hat, self.inv_std = standardize(self.xp, x, axes, self.epsilon)
        return self.x_hat * channel_view(self.gamma, x.ndim, axis) + channel_view(self.beta, x.ndim, axis)

    def backward(self, dy):
        if dy.ndim != 4:
            dx, self.dgamma[...], self.dbeta[...] = self.backend.layernorm_backward(dy, self.ctx, self.gamma)
            return dx
        axes, axis = self._axes(dy)
        others = tuple(a for a in range(dy.ndim) if a != axis)
        self.dgamma[...] = (dy * self.x_hat).sum(axis=others)
        self.dbeta[...] = dy.sum(axis=others)
        return standardize_backward(dy * channel_view(self.gamma, dy.ndim, axis), self.x_hat, self.inv_std, axes)
