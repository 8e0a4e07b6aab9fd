"""In-memory (or memory-mapped) arrays as the training loop's data: what `Model.fit(x, y)` trains on.

`ArraySplit` has the three things the Trainer asks of a split (`len`, `epoch_order`, `take`); rows are read
only when a batch takes them, so a memory-mapped `x` is never read whole.
"""
from __future__ import annotations

import types

import numpy as np

from pydtnn.errors import ShapeError


class ArraySplit:
    def __init__(self, x, y, shuffle=True, name="train"):
        if len(x) != len(y):
            raise ShapeError(f"{name}: {len(x)} inputs but {len(y)} targets")
        if len(x) == 0:
            raise ShapeError(f"{name}: no samples")
        self.x, self.y, self.shuffle, self.name = x, y, bool(shuffle), name

    def __len__(self):
        return len(self.x)

    def epoch_order(self, seed, epoch):
        """The same order on every rank for the same (seed, epoch); the identity without shuffling."""
        if not self.shuffle:
            return np.arange(len(self), dtype=np.int64)
        return np.random.default_rng([int(seed), int(epoch)]).permutation(len(self)).astype(np.int64)

    def take(self, indices, epoch=None):
        idx = np.asarray(indices, dtype=np.int64)
        return self.x[idx], self.y[idx]


def arrays_dataset(x, y, validation_data=None, shuffle=True):
    """A dataset-like object (train, val, test) over host arrays, targets as given."""
    val = None if validation_data is None else ArraySplit(*validation_data, shuffle=False, name="validation_data")
    return types.SimpleNamespace(train=ArraySplit(x, y, shuffle), val=val, test=None)
