"""Losses: the mean over the batch of a per-sample loss, with its gradient.

Categorical cross-entropy works on the last axis: (N, K) class probabilities, or (N, T, K) per position
(a language model's next-token distributions), where the value is the mean over all N * T positions.
The regression losses are means over every element, as PyTorch's MSELoss() and L1Loss().

Each loss returns (value, dy) with dy = d(mean loss)/d(prediction). When the model ends in the activation
a loss fuses with (Softmax for categorical cross-entropy, Sigmoid for binary cross-entropy), the model
calls `from_logits` instead: stable for any logits (no log(0), no exp overflow) and cheaper.

The value is a 0-d float64 array of the backend (a NumPy scalar on the CPU, a device scalar on the GPU), so
that computing it never waits for the device; `float(value)` reads it. It is the sum in the data's dtype,
then divided in float64, exactly as `float(sum) / count` was.
"""
from pydtnn.activations import Sigmoid, Softmax, stable_sigmoid
from pydtnn.backends import array_module as _xp
from pydtnn.errors import ConfigError


def _mean(total, count):
    """A loss's value: its sum (an array of the data's dtype) in float64, divided by `count`, on its device."""
    return total.astype("float64") / count


class Loss:
    name = None
    fuses_with = None          # the activation class whose input (the logits) `from_logits` takes

    def __call__(self, y_pred, y_true):
        raise NotImplementedError

    def from_logits(self, z, y_true):
        """Returns (value, y_pred, dz)."""
        raise NotImplementedError


class CategoricalCrossEntropy(Loss):
    """-mean_n sum_k y_nk log p_nk, for one-hot (or soft) targets.

    label_smoothing e in [0, 1) trains on the targets (1 - e) y + e/K (K classes), as PyTorch's
    cross_entropy(label_smoothing=e): the loss and its gradient both see the smoothed targets.
    """
    name = "categorical_cross_entropy"
    fuses_with = Softmax

    def __init__(self, eps=1e-12, label_smoothing=0.0):
        ls = label_smoothing
        if isinstance(ls, bool) or not isinstance(ls, (int, float)) or not 0 <= ls < 1:
            raise ConfigError(f"categorical_cross_entropy: label_smoothing must be in [0, 1), got {ls} "
                              f"(--label_smoothing)")
        self.eps, self.label_smoothing = eps, float(ls)

    def _targets(self, y_true):
        if not self.label_smoothing:
            return y_true
        e = self.label_smoothing
        return (1 - e) * y_true + e / y_true.shape[-1]

    @staticmethod
    def _positions(y):
        """How many distributions the mean runs over: N, or N * T for (N, T, K)."""
        return y.size // y.shape[-1]

    def __call__(self, y_pred, y_true):
        xp = _xp(y_pred)
        y_true = self._targets(y_true)
        p = xp.clip(y_pred, self.eps, 1.0)
        n = self._positions(y_pred)
        value = -_mean((y_true * xp.log(p)).sum(), n)
        return value, -(y_true / p) / n

    def from_logits(self, z, y_true):
        xp = _xp(z)
        y_true = self._targets(y_true)
        shifted = z - z.max(axis=-1, keepdims=True)
        log_p = shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))
        p = xp.exp(log_p)
        n = self._positions(z)
        value = -_mean((y_true * log_p).sum(), n)
        # d/dz of -sum_k y_k log softmax(z)_k = p * sum_k y_k - y (= p - y for one-hot targets)
        dz = (p * y_true.sum(axis=-1, keepdims=True) - y_true) / n
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
        value = -_mean((y_true * xp.log(p) + (1 - y_true) * xp.log(1 - p)).sum(), count)
        return value, (p - y_true) / (p * (1 - p)) / count

    def from_logits(self, z, y_true):
        xp = _xp(z)
        e = xp.exp(-xp.abs(z))
        # log(1 + exp(-|z|)) + max(z, 0) - y z is the stable form of the loss
        value = _mean((xp.maximum(z, 0) - y_true * z + xp.log1p(e)).sum(), z.size)
        p = stable_sigmoid(xp, z, e)
        return value, p, (p - y_true) / z.size


class MeanSquaredError(Loss):
    """mean over every element of (y_pred - y)^2, as torch.nn.MSELoss() (regression, autoencoders)."""
    name = "mean_squared_error"

    def __call__(self, y_pred, y_true):
        diff = y_pred - y_true
        return _mean((diff * diff).sum(), diff.size), diff * diff.dtype.type(2 / diff.size)


class MeanAbsoluteError(Loss):
    """mean over every element of |y_pred - y|, as torch.nn.L1Loss() (its gradient sign(.), 0 at 0)."""
    name = "mean_absolute_error"

    def __call__(self, y_pred, y_true):
        xp = _xp(y_pred)
        diff = y_pred - y_true
        return _mean(xp.abs(diff).sum(), diff.size), xp.sign(diff) * diff.dtype.type(1 / diff.size)


LOSSES = {cls.name: cls for cls in (CategoricalCrossEntropy, BinaryCrossEntropy, MeanSquaredError,
                                    MeanAbsoluteError)}


def get_loss(name_or_loss, label_smoothing=0.0):
    """A loss by name (or a Loss, returned as is); label_smoothing is for categorical_cross_entropy only."""
    if isinstance(name_or_loss, Loss):
        if label_smoothing:
            raise ConfigError("label_smoothing is given to the Loss itself when passing a Loss object")
        return name_or_loss
    if name_or_loss not in LOSSES:
        raise ConfigError(f"unknown loss {name_or_loss!r}: choose one of {', '.join(LOSSES)}")
    if name_or_loss == CategoricalCrossEntropy.name:
        return CategoricalCrossEntropy(label_smoothing=label_smoothing)
    if label_smoothing:
        raise ConfigError(f"label_smoothing (--label_smoothing {label_smoothing}) applies to "
                          f"categorical_cross_entropy only, not {name_or_loss}")
    return LOSSES[name_or_loss]()
