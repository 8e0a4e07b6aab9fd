"""Metrics: per-batch means of a per-sample quantity, so ranks can combine them weighted by batch size.

`categorical_*` metrics compare predicted class probabilities with one-hot targets:
- categorical_accuracy: the arg-max class is the target class;
- categorical_hinge: max(0, 1 + max_{k != t} p_k - p_t) (as Keras);
- categorical_mse / categorical_mae: the squared / absolute error of the probability given to the target
  class, (1 - p_t)^2 and |1 - p_t| (as upstream PyDTNN).
`regression_*` metrics are the mean squared / absolute error over every output; `mean_squared_error` and
`mean_absolute_error` are the same, named as the losses they follow.
Class metrics read the last axis, so on (N, T, K) outputs (a language model) they are means over the
N * T positions. A metric returns a 0-d array of the backend (a device scalar on the GPU: computing it never
waits for the device); `float()` reads it.
"""
from pydtnn.errors import ConfigError
from pydtnn.backends import array_module as _xp


def _rows(a):
    """(N, K) as it is, (N, T, K) as (N * T, K)."""
    return a.reshape(-1, a.shape[-1])


def _target_prob(y_pred, y_true):
    xp = _xp(y_pred)
    y_pred, y_true = _rows(y_pred), _rows(y_true)
    return y_pred[xp.arange(y_pred.shape[0]), y_true.argmax(axis=1)]


def categorical_accuracy(y_pred, y_true):
    return (y_pred.argmax(axis=-1) == y_true.argmax(axis=-1)).mean()


def categorical_hinge(y_pred, y_true):
    xp = _xp(y_pred)
    pos = (y_true * y_pred).sum(axis=-1)
    neg = ((1 - y_true) * y_pred).max(axis=-1)
    return xp.maximum(0, neg - pos + 1).mean()


def categorical_mse(y_pred, y_true):
    return ((1 - _target_prob(y_pred, y_true)) ** 2).mean()


def categorical_mae(y_pred, y_true):
    return abs(1 - _target_prob(y_pred, y_true)).mean()


def regression_mse(y_pred, y_true):
    return ((y_pred - y_true) ** 2).mean()


def regression_mae(y_pred, y_true):
    return abs(y_pred - y_true).mean()


METRICS = {f.__name__: f for f in (categorical_accuracy, categorical_hinge, categorical_mse, categorical_mae,
                                   regression_mse, regression_mae)}
METRICS.update(mean_squared_error=regression_mse, mean_absolute_error=regression_mae)


def get_metric(name):
    if callable(name):
        return name
    try:
        return METRICS[name]
    except KeyError:
        raise ConfigError(f"unknown metric {name!r}: choose from {', '.join(METRICS)}") from None
