"""A learnable synthetic dataset for any input shape and number of classes (the offline default).

Each class has a fixed random *template*: a coarse random pattern (one value per 4 x 4 block per channel
when the image is at least 16 pixels on a side, per pixel otherwise) with values in [32, 224). A sample is
its class template plus independent uniform noise in [-64, 64], clipped to uint8. Classes are balanced
and shuffled. Templates differ by about 78 grey levels per pixel (RMS), the noise is about 37, so a
linear model, an MLP or a small CNN separates the classes well above chance within an epoch or two,
while the task is not a constant.

Everything is a function of ``seed``: the templates, the train samples and the (disjoint, same
templates) test samples. Samples are stored uint8 like the real datasets; the default number of training
samples is 8,192, fewer for large images so that the training set stays near 128 MiB.
"""

from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError

from .base import ArraySource

DEFAULT_SHAPE = (1, 28, 28)
DEFAULT_NCLASSES = 10
MAX_DEFAULT_BYTES = 128 * 2**20


def default_samples(input_shape) -> int:
    per = int(np.prod(input_shape))
    return int(min(8192, max(256, MAX_DEFAULT_BYTES // per)))


def _templates(rng: np.random.Generator, input_shape, nclasses: int):
    c, h, w = input_shape
    block = 4 if min(h, w) >= 16 else 1
    gh, gw = -(-h // block), -(-w // block)
    coarse = rng.integers(32, 224, size=(nclasses, c, gh, gw), dtype=np.uint8)
    return coarse, block


def _make(rng: np.random.Generator, coarse, block, input_shape, n: int, nclasses: int):
    c, h, w = input_shape
    y = rng.permutation(np.arange(n, dtype=np.int64) % nclasses)
    x = np.empty((n, c, h, w), dtype=np.uint8)
    chunk = max(1, (16 * 2**20) // (c * h * w))
    for s in range(0, n, chunk):
        yy = y[s:s + chunk]
        t = coarse[yy]
        if block > 1:
            t = np.repeat(np.repeat(t, block, axis=2), block, axis=3)[:, :, :h, :w]
        noise = rng.integers(-64, 65, size=t.shape, dtype=np.int16)
        x[s:s + chunk] = np.clip(t.astype(np.int16) + noise, 0, 255).astype(np.uint8)
    return ArraySource(x, y)


def make_sources(input_shape=None, nclasses=None, train_samples=None, test_samples=None, seed: int = 0):
    """(train source, test source) of the synthetic dataset."""
    shape = tuple(DEFAULT_SHAPE if input_shape is None else input_shape)
    if len(shape) != 3 or any(int(d) < 1 for d in shape):
        raise ConfigError(f"synthetic dataset: input_shape must be (C, H, W) of positive sizes, got {shape}")
    shape = tuple(int(d) for d in shape)
    k = DEFAULT_NCLASSES if nclasses is None else int(nclasses)
    if k < 1:
        raise ConfigError(f"synthetic dataset: nclasses must be >= 1, got {nclasses}")
    n_train = default_samples(shape) if train_samples is None else int(train_samples)
    if n_train < 1:
        raise ConfigError(f"synthetic dataset: synthetic_samples must be >= 1, got {train_samples}")
    n_test = max(1, n_train // 5) if test_samples is None else int(test_samples)
    coarse, block = _templates(np.random.default_rng([int(seed), 0]), shape, k)
    train = _make(np.random.default_rng([int(seed), 1]), coarse, block, shape, n_train, k)
    test = _make(np.random.default_rng([int(seed), 2]), coarse, block, shape, n_test, k)
    return train, test, k
