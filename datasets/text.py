"""A byte-level text dataset for language models: next-byte targets at every position.

The file's bytes are cut into consecutive, non-overlapping sequences of T bytes; sample i is
x = bytes[i T : i T + T] and y = bytes[i T + 1 : i T + T + 1], both int64 ids in 0..255, so a causal model
learns to predict each next byte (a per-token cross entropy over 256 classes). `validation_split` holds
out the LAST sequences (later text, never seen in training).

The default file is `data/gettysburg_declaration.txt` in this package: public-domain text (the Gettysburg
Address, the opening of the Declaration of Independence and the Preamble of the US Constitution, 3.8 kB),
small enough to ship.
"""
from __future__ import annotations

import math
import os

import numpy as np

from pydtnn.errors import ConfigError, DatasetError

DEFAULT_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gettysburg_declaration.txt")
VOCABULARY = 256


class TextSplit:
    """Sequences [start, stop) of a byte stream; the interface of :class:`~.base.Split` the trainer uses."""

    blocks = None

    def __init__(self, data: np.ndarray, seq_len: int, start: int, stop: int, name: str):
        self.data, self.seq_len = data, int(seq_len)
        self.start, self.stop, self.name = int(start), int(stop), name
        self.nclasses = VOCABULARY
        self.input_shape = (self.seq_len,)
        self.augmentation = None

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"TextSplit({self.name!r}, {len(self)} sequences of {self.seq_len} bytes)"

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """A permutation of the sequences, the same on every rank for (seed, epoch)."""
        return np.random.default_rng([int(seed), int(epoch)]).permutation(len(self)).astype(np.int64)

    def take(self, indices, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(x, y), both int64 (N, T): the sequences and their next bytes."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"{self.name} split: index out of range [0, {n})")
        idx = np.where(idx < 0, idx + n, idx) + self.start
        offsets = idx[:, None] * self.seq_len + np.arange(self.seq_len + 1)[None, :]
        window = self.data[offsets].astype(np.int64)
        return window[:, :-1], window[:, 1:]


def load_bytes(path=None, sequence_length: int = 64, validation_split: float = 0.0):
    """A :class:`~.base.Dataset` of byte sequences from the text file at `path` (default: the shipped one)."""
    from .base import Dataset
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
        raise ConfigError(f"sequence_length must be a positive int, got {sequence_length!r}")
    path = DEFAULT_TEXT if path is None else os.fspath(path)
    if os.path.isdir(path):
        raise DatasetError(f"{path}: the bytes dataset reads one text file, not a folder")
    try:
        with open(path, "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    n = (len(data) - 1) // sequence_length
    if n < 2:
        raise DatasetError(f"{path}: {len(data)} bytes make fewer than 2 sequences of {sequence_length} bytes "
                           f"(and their next bytes): use a longer text or a shorter --sequence_length")
    nval = max(1, int(math.floor(n * validation_split + 0.5))) if validation_split > 0 else 0
    if nval >= n:
        raise ConfigError(f"validation_split={validation_split} leaves no training sequence of {n}")
    train = TextSplit(data, sequence_length, 0, n - nval, "train")
    val = TextSplit(data, sequence_length, n - nval, n, "val") if nval else None
    return Dataset(name="bytes", input_shape=(sequence_length,), nclasses=VOCABULARY, train=train, val=val,
                   test=None, target_shape=(sequence_length, VOCABULARY))
