"""The arithmetic LayerNorm and GroupNorm share: standardize over some axes, and its backward.

x_hat = (x - mean) / sqrt(var + eps) with the biased variance over `axes`; given dL/dx_hat,
dL/dx = inv_std * (g - mean(g) - x_hat * mean(g * x_hat)), means over the same axes.
"""


def standardize(xp, x, axes, eps):
    """(x_hat, inv_std), inv_std with the reduced axes kept (two passes: stable in float32)."""
    centred = x - x.mean(axis=axes, keepdims=True)
    var = (centred * centred).mean(axis=axes, keepdims=True)
    inv_std = 1 / xp.sqrt(var + x.dtype.type(eps))
    return centred * inv_std, inv_std


def standardize_backward(g, x_hat, inv_std, axes):
    """dL/dx from g = dL/dx_hat."""
    return inv_std * (g - g.mean(axis=axes, keepdims=True) - x_hat * (g * x_hat).mean(axis=axes, keepdims=True))


def channel_view(v, ndim, axis):
    """A per-channel vector shaped to broadcast along `axis` of an ndim-array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)
