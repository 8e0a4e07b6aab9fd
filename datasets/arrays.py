"""A dataset from a researcher's own arrays: in memory or memory-mapped (`np.load(path, mmap_mode="r")`).

`x` is (N, *input_shape): float features or images used as they are (in their own float type, at least
float32), or integers (int64: an embedding's ids; the model casts them to its dtype otherwise). `y` is (N,) integer class labels
(or (N, T) per-position labels, for a model whose outputs are (T, classes)), or float
targets (N, *target_shape) for a regression or an autoencoder. Nothing reads `x` whole: a batch reads only
its rows, in ascending order (sequential on disk), so every rank of a job can map the same file.
The labels are read once to count the classes (N integers: small beside the images).
"""
from __future__ import annotations

import math

import numpy as np

from pydtnn.errors import DatasetError

from .base import Dataset, check_fraction


class ArraySplit:
    """Rows [start, stop) of (x, y): the interface of :class:`~.base.Split` that the trainer uses."""

    blocks = None
    augmentation = None

    def __init__(self, x, y, start: int = 0, stop: int | None = None, *, nclasses: int = 0, name: str = "train",
                 shuffle: bool = True):
        self.x, self.y = x, y
        self.start, self.stop, self.name = int(start), int(x.shape[0] if stop is None else stop), name
        self.nclasses = int(nclasses)
        self.shuffle = bool(shuffle)
        self.input_shape = tuple(int(d) for d in x.shape[1:])
        # floats keep their precision (a float64 model gets float64 inputs); integers are ids (int64)
        self._x_dtype = _batch_dtype(x.dtype)

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def dtype(self):
        """The type of a batch's inputs (`take`'s x)."""
        return np.dtype(self._x_dtype)

    def __repr__(self) -> str:
        return f"ArraySplit({self.name!r}, {len(self)} samples, shape={self.input_shape})"

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """A permutation of the samples, the same on every rank for (seed, epoch); in order without shuffle."""
        if not self.shuffle:
            return np.arange(len(self), dtype=np.int64)
        return np.random.default_rng([int(seed), int(epoch)]).permutation(len(self)).astype(np.int64)

    def take(self, indices, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of samples `indices` (split-local): x in its float type (int64 for ids), y int64 labels or
        float targets. `epoch` is accepted for the Split interface (arrays get no augmentation)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"{self.name} split: index out of range [0, {n})")
        rows = np.where(idx < 0, idx + n, idx) + self.start
        order = np.argsort(rows, kind="stable")       # ascending reads; results put back in the asked order
        x = np.empty((len(rows),) + self.input_shape, self._x_dtype)
        x[order] = self.x[rows[order]]
        y_sorted = np.asarray(self.y[rows[order]])
        y = np.empty_like(y_sorted, dtype=_batch_dtype(y_sorted.dtype))
        y[order] = y_sorted
        return x, y


def _batch_dtype(dtype):
    """What a batch holds: int64 for integers (labels, ids), the float type itself (at least float32)."""
    if np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_):
        return np.int64
    return np.result_type(dtype, np.float32)


def _check_pair(x, y, what: str):
    for name, a in (("x", x), ("y", y)):
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            raise DatasetError(f"{what}: {name} must be an array (NumPy, or np.load(..., mmap_mode='r')), got "
                               f"{type(a).__name__}")
    if len(x.shape) < 2:
        raise DatasetError(f"{what}: x must be (N, *sample_shape), got shape {tuple(x.shape)}")
    if len(y.shape) < 1 or y.shape[0] != x.shape[0]:
        raise DatasetError(f"{what}: x holds {x.shape[0]} samples but y has shape {tuple(y.shape)}")
    if x.shape[0] < 1:
        raise DatasetError(f"{what}: no samples")
    if not (np.issubdtype(x.dtype, np.number) and np.issubdtype(y.dtype, np.number)) or \
            np.issubdtype(x.dtype, np.complexfloating):
        raise DatasetError(f"{what}: x and y must hold real numbers, got {x.dtype} and {y.dtype}")


def _label_count(y, what: str) -> int:
    labels = np.asarray(y)
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise DatasetError(f"{what}: class labels must be >= 0, found {low}")
    return high + 1


def from_arrays(x_train, y_train, x_test=None, y_test=None, *, name: str = "arrays",
                validation_split: float = 0.0, test_as_validation: bool = False) -> Dataset:
    """A :class:`~.base.Dataset` over the given arrays (they are kept, not copied).

    Integer `y` are class labels (classes = the largest label + 1 over train and test); float `y` are
    targets, whose per-sample shape the model's output must have. `validation_split` holds out the LAST
    fraction of the training rows; `test_as_validation` validates on the test arrays.
    """
    from pydtnn.errors import ConfigError
    validation_split = check_fraction("validation_split", validation_split)
    _check_pair(x_train, y_train, f"{name} (train)")
    has_test = x_test is not None or y_test is not None
    if has_test:
        if x_test is None or y_test is None:
            raise DatasetError(f"{name}: give both x_test and y_test, or neither")
        _check_pair(x_test, y_test, f"{name} (test)")
        if tuple(x_test.shape[1:]) != tuple(x_train.shape[1:]) or tuple(y_test.shape[1:]) != tuple(y_train.shape[1:]):
            raise DatasetError(f"{name}: test samples are {tuple(x_test.shape[1:])} -> {tuple(y_test.shape[1:])}, "
                               f"train samples {tuple(x_train.shape[1:])} -> {tuple(y_train.shape[1:])}")
        if np.issubdtype(y_test.dtype, np.integer) != np.issubdtype(y_train.dtype, np.integer):
            raise DatasetError(f"{name}: train labels are {y_train.dtype} but test labels {y_test.dtype}")
    if validation_split > 0 and test_as_validation:
        raise ConfigError("validation_split and test_as_validation are mutually exclusive; choose one")
    if test_as_validation and not has_test:
        raise ConfigError(f"test_as_validation needs a test set, and {name} has none")

    labels = np.issubdtype(y_train.dtype, np.integer)
    if labels:
        k = max(_label_count(y_train, f"{name} (train)"), _label_count(y_test, f"{name} (test)") if has_test else 0)
        # per-position labels (N, T): the model gives (T, classes), a distribution at every position
        target_shape = tuple(int(d) for d in y_train.shape[1:]) + (k,) if len(y_train.shape) > 1 else None
    else:
        target_shape = tuple(int(d) for d in y_train.shape[1:]) or (1,)
        if not y_train.shape[1:]:
            raise DatasetError(f"{name}: float targets must be (N, *target_shape), e.g. (N, 1), got "
                               f"{tuple(y_train.shape)}")
        k = target_shape[-1]
    n = int(x_train.shape[0])
    nval = max(1, int(math.floor(n * validation_split + 0.5))) if validation_split > 0 else 0
    if nval >= n:
        raise ConfigError(f"validation_split={validation_split} leaves no training sample of {n}")
    train = ArraySplit(x_train, y_train, 0, n - nval, nclasses=k, name="train")
    val = ArraySplit(x_train, y_train, n - nval, n, nclasses=k, name="val") if nval else None
    test = ArraySplit(x_test, y_test, 0, int(x_test.shape[0]), nclasses=k, name="test") if has_test else None
    if test_as_validation:
        val = test
    return Dataset(name=name, input_shape=tuple(int(d) for d in x_train.shape[1:]), nclasses=k, train=train,
                   val=val, test=test, target_shape=target_shape)
