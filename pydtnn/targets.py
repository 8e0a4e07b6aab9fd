"""What a loss compares a model's outputs with: integer labels one-hot encoded, float targets as they are.

The training loop, `pydtnn.parallel.DataParallel` and `Model.fit` / `Model.evaluate` share these two
functions (host arrays in, host arrays out), so none of them needs another's module for it.
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError


def check_labels(labels, nclasses):
    """Integer labels (a host array) in 0..nclasses - 1, or a one-line ConfigError."""
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= nclasses):
        raise ConfigError(f"labels must be in 0..{nclasses - 1}, got {labels.min()}..{labels.max()} "
                          f"(does the model's output size match the dataset's classes?)")
    return labels


def one_hot(labels, nclasses, dtype):
    """Integer labels (N,) -> one-hot host array (N, nclasses); (N, T) per-position labels -> (N, T, nclasses)."""
    labels = check_labels(labels, nclasses)
    out = np.zeros(labels.shape + (nclasses,), dtype=dtype)
    np.put_along_axis(out, labels[..., None], 1, axis=-1)
    return out


def as_targets(y, nclasses, dtype):
    """What a loss compares the outputs with: integer labels one-hot encoded (one_hot), float targets (an
    autoencoder's images, regression values) as they are, in the model's dtype."""
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.integer):
        return one_hot(y, nclasses, dtype)
    return y.astype(dtype, copy=False)


def targets_for_outputs(y, output_shape, dtype):
    """Targets for a model whose outputs have `output_shape` (per sample): labels (one per sample, or per
    position (N, T): one dimension fewer than the outputs) one-hot encoded, anything else in `dtype`."""
    y = np.asarray(y)
    if y.ndim == len(output_shape):
        return one_hot(y, output_shape[-1], dtype)
    return y.astype(dtype, copy=False)


def labels_or_targets(y, nclasses, dtype):
    """What travels to the device for a loss: integer labels checked and as int32 (a backend's `one_hot` makes
    the targets there, `as_targets`' values), float targets in the model's dtype."""
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.integer):
        return check_labels(y, nclasses).astype(np.int32, copy=False)
    return y.astype(dtype, copy=False)
