"""Splits, datasets, normalization and augmentation shared by every loader.

Storage and presentation are kept apart:

- a *source* holds the raw samples, ``uint8`` NCHW images and ``int64`` labels, in memory
  (:class:`ArraySource`) or streamed from disk (``imagenet.ShardSource``); it answers
  ``len(source)``, ``source.get(indices) -> (x_uint8, y_int64)`` and ``source.blocks`` (``None``, or the
  boundaries of the contiguous index ranges that should be read together, e.g. NPZ shards);
- a :class:`Split` is a contiguous range ``[start, stop)`` of a source plus the way to present it:
  conversion to ``float32``, normalization, and (train split only) augmentation.

Images stay ``uint8`` until :meth:`Split.take`, which gathers a batch, augments it and converts it:
CIFAR-10 costs 150 MB in memory instead of 600 MB as ``float32``.

Randomness is a pure function of ``(seed, epoch, sample index)`` (a counter-based SplitMix64 hash,
vectorized in NumPy), so the samples a replica gets do not depend on how many replicas share a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["Split", "Dataset", "ArraySource", "Augmentation", "NORMALIZATION", "hash_uniform"]

# Per-channel mean and standard deviation of the pixels scaled to [0, 1] (the published constants):
# - mnist: 0.1307 / 0.3081, the values computed on the 60,000 training images (PyTorch's MNIST example).
# - cifar10: mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616), the per-pixel statistics of the
#   50,000 training images (the often-quoted std (0.2023, 0.1994, 0.2010) is a per-image mean of stds).
# - imagenet: mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225), torchvision's ImageNet constants.
# - synthetic: 0.5 / 0.25, which matches how its pixels are generated (templates in [32, 224) + noise).
NORMALIZATION: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "synthetic": ((0.5,), (0.25,)),
}

# --------------------------------------------------------------------------------------------------
# Counter-based random numbers: uniform in [0, 1) as a pure function of (seed, epoch, stream, index).
# SplitMix64: the state at position i is key + (i + 1) * GAMMA, passed through its finalizer.
# --------------------------------------------------------------------------------------------------
_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _splitmix_int(x: int) -> int:
    z = (x + _GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def _stream_key(seed: int, epoch: int, stream: int) -> int:
    return _splitmix_int(_splitmix_int(_splitmix_int(int(seed) & _MASK) ^ (int(epoch) & _MASK)) ^ stream)


def hash_uniform(seed: int, epoch: int, stream: int, indices) -> np.ndarray:
    """Uniform float64 numbers in [0, 1), one per index, a pure function of (seed, epoch, stream, index).

    Vectorized (a few NumPy passes over the indices); no generator is created per sample.
    """
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    key = np.uint64(_stream_key(seed, epoch, stream))
    # uint64 array arithmetic wraps modulo 2**64, which is what SplitMix64 needs.
    z = (idx + np.uint64(1)) * np.uint64(_GAMMA) + key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


_STREAM_FLIP, _STREAM_CROP, _STREAM_CROP_TOP, _STREAM_CROP_LEFT = 1, 2, 3, 4


@dataclass(frozen=True)
class Augmentation:
    """Train-time augmentation, applied by :meth:`Split.take` when it is given an ``epoch``.

    - flip: with probability ``flip_prob`` a sample is mirrored left-right, i.e. along the WIDTH axis
      (the last axis of NCHW; upstream PyDTNN flipped the height axis by mistake).
    - crop: with probability ``crop_prob`` a random ``crop_size x crop_size`` window (top-left corner
      uniform over the valid positions) is kept where it is and every pixel outside it is set to black
      (0 before normalization). This is "crop, then zero-pad back to the original size at the crop's own
      offset": no resize, and the output shape stays the input shape, so the model is unchanged.

    Every decision is a hash of (seed, epoch, sample index): the same sample gets the same augmentation
    in a given epoch whichever replica, batch or batch split it lands in.
    """

    seed: int = 0
    flip: bool = False
    flip_prob: float = 0.5
    crop: bool = False
    crop_size: int = 16
    crop_prob: float = 0.5

    @property
    def active(self) -> bool:
        return self.flip or self.crop

    def apply(self, x: np.ndarray, indices: np.ndarray, epoch: int) -> np.ndarray:
        """Augment a gathered batch ``x`` (N, C, H, W) in place (it must be a private copy); returns x."""
        n, _, h, w = x.shape
        if n == 0:
            return x
        if self.flip and self.flip_prob > 0:
            do_flip = hash_uniform(self.seed, epoch, _STREAM_FLIP, indices) < self.flip_prob
            if do_flip.any():
                x[do_flip] = x[do_flip][..., ::-1]
        if self.crop and self.crop_prob > 0 and self.crop_size < max(h, w):
            do_crop = hash_uniform(self.seed, epoch, _STREAM_CROP, indices) < self.crop_prob
            if do_crop.any():
                sel = np.flatnonzero(do_crop)
                ch, cw = min(self.crop_size, h), min(self.crop_size, w)
                top = np.floor(hash_uniform(self.seed, epoch, _STREAM_CROP_TOP, indices[sel])
                               * (h - ch + 1)).astype(np.int64)
                left = np.floor(hash_uniform(self.seed, epoch, _STREAM_CROP_LEFT, indices[sel])
                                * (w - cw + 1)).astype(np.int64)
                rows = np.arange(h)[None, :]
                cols = np.arange(w)[None, :]
                keep_r = (rows >= top[:, None]) & (rows < top[:, None] + ch)    # (k, H)
                keep_c = (cols >= left[:, None]) & (cols < left[:, None] + cw)  # (k, W)
                keep = keep_r[:, None, :, None] & keep_c[:, None, None, :]      # (k, 1, H, W)
                x[sel] = np.where(keep, x[sel], 0)
        return x


class ArraySource:
    """Raw samples held in memory: ``x`` uint8 (N, C, H, W), ``y`` int64 (N,)."""

    blocks = None

    def __init__(self, x: np.ndarray, y: np.ndarray):
        if x.ndim != 4 or x.dtype != np.uint8:
            raise ValueError(f"ArraySource wants uint8 NCHW images, got {x.dtype} {x.shape}")
        if y.shape != (x.shape[0],):
            raise ValueError(f"ArraySource: {x.shape[0]} images but labels of shape {y.shape}")
        self.x = x
        self.y = y.astype(np.int64, copy=False)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.x.shape[1:])

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def get(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[indices], self.y[indices]   # fancy indexing: private copies


class Split:
    """A contiguous range of a source, presented as normalized float32 NCHW batches.

    ``len(split)``, ``split.epoch_order(seed, epoch)``, ``split.take(indices, epoch=None)``.
    """

    TARGETS = ("labels", "inputs")

    def __init__(self, source, start: int = 0, stop: int | None = None, *, nclasses: int,
                 mean=None, std=None, augmentation: Augmentation | None = None, name: str = "train",
                 targets: str = "labels"):
        stop = len(source) if stop is None else stop
        if targets not in self.TARGETS:
            raise ConfigError(f"targets must be one of {', '.join(self.TARGETS)}, got {targets!r}")
        self.targets = targets
        if not 0 <= start <= stop <= len(source):
            raise ValueError(f"bad split range [{start}, {stop}) of a source of {len(source)} samples")
        self.source = source
        self.start, self.stop = int(start), int(stop)
        self.nclasses = int(nclasses)
        self.name = name
        self.input_shape = tuple(source.input_shape)
        self.augmentation = augmentation if augmentation is not None and augmentation.active else None
        c = self.input_shape[0]
        if mean is None:
            self.mean = self.std = None
            scale, bias = np.full(c, 1.0 / 255.0), np.zeros(c)
        else:
            mean = np.broadcast_to(np.asarray(mean, dtype=np.float64), (c,))
            std = np.broadcast_to(np.asarray(std, dtype=np.float64), (c,))
            self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
            scale, bias = 1.0 / (255.0 * std), -mean / std
        # x_float = x_uint8 * scale + bias  ==  (x_uint8 / 255 - mean) / std
        self._scale = scale.astype(np.float32).reshape(1, c, 1, 1)
        self._bias = bias.astype(np.float32).reshape(1, c, 1, 1)

    def __len__(self) -> int:
        return self.stop - self.start

    dtype = np.dtype(np.float32)      # the type of a batch's inputs (`take`'s x)

    def __repr__(self) -> str:
        return (f"Split({self.name!r}, {len(self)} samples, shape={self.input_shape}, "
                f"nclasses={self.nclasses}, augmentation={self.augmentation})")

    # ------------------------------------------------------------------------------------------
    def blocks(self) -> np.ndarray | None:
        """Boundaries (split-local) of the contiguous ranges to read together, or None."""
        src_blocks = self.source.blocks
        if src_blocks is None:
            return None
        b = np.clip(np.asarray(src_blocks, dtype=np.int64), self.start, self.stop) - self.start
        return np.unique(np.concatenate([[0], b, [len(self)]]))

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` visits the samples (int64 split-local indices).

        The same on every rank for the same (seed, epoch). In-memory splits: a full permutation from
        ``np.random.default_rng([seed, epoch])``. Block-structured (sharded) splits: the blocks in a
        random order, then a random order of the samples inside each block, so that a streaming reader
        loads each shard once per epoch.
        """
        n = len(self)
        rng = np.random.default_rng([int(seed), int(epoch)])
        bounds = self.blocks()
        if bounds is None:
            return rng.permutation(n).astype(np.int64)
        starts, stops = bounds[:-1], bounds[1:]
        parts = [starts[b] + rng.permutation(stops[b] - starts[b])
                 for b in rng.permutation(len(starts))]
        return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, dtype=np.int64)

    def take(self, indices, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Samples ``indices`` (split-local) as ``x`` float32 (N, C, H, W) normalized, ``y`` int64 labels,
        or with ``targets="inputs"`` (an autoencoder's) ``y`` a copy of ``x``.

        Augmentation (train split only) is applied when ``epoch`` is given.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"{self.name} split: index out of range [0, {n})")
        idx = np.where(idx < 0, idx + n, idx)
        x, y = self.source.get(idx + self.start)
        if self.augmentation is not None and epoch is not None:
            x = self.augmentation.apply(x, idx, int(epoch))
        out = np.empty(x.shape, dtype=np.float32)
        np.multiply(x, self._scale, out=out)
        out += self._bias
        if self.targets == "inputs":
            return out, out.copy()
        return out, np.asarray(y, dtype=np.int64)


@dataclass
class Dataset:
    """What :func:`pydtnn.datasets.load_dataset` returns."""

    name: str
    input_shape: tuple[int, int, int]
    nclasses: int
    train: Split
    val: Split | None = None
    test: Split | None = None
    target_shape: tuple | None = None    # per-sample shape of the targets; None: (nclasses,) one-hot labels

    @property
    def output_shape(self) -> tuple:
        """The output shape a model needs for these targets."""
        return tuple(self.target_shape) if self.target_shape is not None else (self.nclasses,)

    def describe(self) -> str:
        """One line for logs: name, shape, classes and split sizes."""
        def size(s):
            return "none" if s is None else str(len(s))
        return (f"{self.name}: input {self.input_shape}, {self.nclasses} classes, train {size(self.train)}, "
                f"val {size(self.val)}, test {size(self.test)}")


def check_fraction(name: str, value: float, *, upper_open: bool = True) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    ok = 0.0 <= v < 1.0 if upper_open else 0.0 <= v <= 1.0
    if not ok:
        raise ConfigError(f"{name} must be in [0, 1{')' if upper_open else ']'}, got {value!r}")
    return v
