"""Losses: the mean over the batch of a per-sample loss, with its gradient.

Each loss returns (value, dy) with dy = d(mean loss)/d(prediction). When the model ends in the activation
a loss fuses with (Softmax for categorical cross-entropy, Sigmoid for binary cross-entropy), the model
calls `from_logits` instead: stable for any logits (no log(0), no exp overflow) and cheaper.
"""
from pydtnn.activations import Sigmoid, Softmax, stable_sigmoid
from pydtnn.backends import array_module as _xp
from pydtnn.errors import ConfigError


class Loss:
    name = None
    fuses_with = None          # the activation class whose input (the logits) `from_logits` takes

    def __call__(self, y_pred, y_true):
        raise NotImplementedError

    def from_logits(self, z, y_true):
        """Returns (value, y_pred, dz)."""
        raise NotImplementedError


class CategoricalCrossEntropy(Loss):
    """-mean_n sum_k y_nk log p_nk, for one-hot (or soft) targets."""
    name = "categorical_cross_entropy"
    fuses_with = Softmax

    def __init__(self, eps=1e-12):
        self.eps = eps

    def __call__(self, y_pred, y_true):
        xp = _xp(y_pred)
        p = xp.clip(y_pred, self.eps, 1.0)
        n = y_pred.shape[0]
        value = -float((y_true * xp.log(p)).sum()) / n
        return value, -(y_true / p) / n

    def from_logits(self, z, y_true):
        xp = _xp(z)
        shifted = z - z.max(axis=1, keepdims=True)
        log_p = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        p = xp.exp(log_p)
        n = z.shape[0]
        value = -float((y_true * log_p).sum()) / n
        # d/dz of -sum_k y_k log softmax(z)_k = p * sum_k y_k - y (= p - y for one-hot targets)
        dz = (p * y_true.sum(axis=1, keepdims=True) - y_true) / n
        return value, p, dz


class BinaryCrossEntropy(Loss):
    """-mean over samples and outputs of y log p + (1 - y) log(1 - p) (upstream computed it wrongly)."""
    name = "binary_cross_entropy"
    fuses_with = Sigmoid

    def __init__(self, eps=1e-12):
        self.eps = eps

    def __call__(self, y_pred, y_true):
        xp = _xp(y_pred)
        p = xp.clip(y_pred, self.eps, 1.0 - self.eps)
        count = y_pred.size
        value = -float((y_true * xp.log(p) + (1 - y_true) * xp.log(1 - p)).sum()) / count
        return value, (p - y_true) / (p * (1 - p)) / count

    def from_logits(self, z, y_true):
        xp = _xp(z)
        e = xp.exp(-xp.abs(z))
        # log(1 + exp(-|z|)) + max(z, 0) - y z is the stable form of the loss
        value = float((xp.maximum(z, 0) - y_true * z + xp.log1p(e)).sum()) / z.size
        p = stable_sigmoid(xp, z, e)
        return value, p, (p - y_true) / z.size


LOSSES = {cls.name: cls for cls in (CategoricalCrossEntropy, BinaryCrossEntropy)}


def get_loss(name_or_loss):
    if isinstance(name_or_loss, Loss):
        return name_or_loss
    try:
        return LOSSES[name_or_loss]()
    except KeyError:
        raise ConfigError(f"unknown loss {name_or_loss!r}: choose one of {', '.join(LOSSES)}") from None
