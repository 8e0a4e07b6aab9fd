"""GroupNorm: channels split in `groups`; each sample standardized over each group's channels and pixels,
then one gamma/beta per channel, as `torch.nn.GroupNorm(groups, C)` on (N, C, H, W) or (N, C).

Statistics are per sample (no batch dependence, nothing to synchronize under data parallelism).
"""
from pydtnn.errors import ConfigError
from pydtnn.layers._normalize import channel_view, standardize, standardize_backward
from pydtnn.layers.base import Layer, ParamAttr


class GroupNorm(Layer):
    internal_layout = True      # groups are formed along the backend's channel axis
    gamma, beta = ParamAttr("gamma"), ParamAttr("beta")
    dgamma, dbeta = ParamAttr("gamma", grad=True), ParamAttr("beta", grad=True)

    def __init__(self, groups, epsilon=1e-5, name=None):
        super().__init__(name=name)
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ConfigError(f"GroupNorm groups must be a positive int, got {groups!r}")
        self.groups, self.epsilon = groups, float(epsilon)

    def build(self, in_shape):
        if len(in_shape) not in (1, 3):
            raise self.shape_error("GroupNorm needs (C, H, W) or (C,) input")
        c = in_shape[0]
        if c % self.groups:
            raise self.shape_error(f"{self.groups} groups do not divide {c} channels")
        self.add_weight("gamma", (c,), "ones", c, c)
        self.add_weight("beta", (c,), "zeros", c, c)
        return in_shape

    def _grouped(self, x):
        """x with its channel axis split into (groups, C // groups), and the axes of one group's statistics."""
        axis = self.channel_axis if x.ndim == 4 else 1
        shape = x.shape[:axis] + (self.groups, x.shape[axis] // self.groups) + x.shape[axis + 1:]
        axes = tuple(a for a in range(1, len(shape)) if a != axis)   # all but the sample and group axes
        return x.reshape(shape), axes, axis

    def forward(self, x, training=False):
        xg, axes, axis = self._grouped(x)
        x_hat, self.inv_std = standardize(self.xp, xg, axes, self.epsilon)
        self.x_hat = x_hat.reshape(x.shape)
        return self.x_hat * channel_view(self.gamma, x.ndim, axis) + channel_view(self.beta, x.ndim, axis)

    def backward(self, dy):
        _, axes, axis = self._grouped(dy)
        others = tuple(a for a in range(dy.ndim) if a != axis)
        self.dgamma[...] = (dy * self.x_hat).sum(axis=others)
        self.dbeta[...] = dy.sum(axis=others)
        g, _, _ = self._grouped(dy * channel_view(self.gamma, dy.ndim, axis))
        x_hat, _, _ = self._grouped(self.x_hat)
        return standardize_backward(g, x_hat, self.inv_std, axes).reshape(dy.shape)
