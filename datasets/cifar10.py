"""CIFAR-10, binary version: ``data_batch_1.bin`` ... ``data_batch_5.bin`` and ``test_batch.bin``.

Each file is a sequence of 3,073-byte records: one label byte (0..9), then 3,072 pixel bytes, the
32 x 32 red plane, then green, then blue (CHW). The official files hold 10,000 records each
(30,730,000 bytes). The loader checks that every file is a whole, non-zero number of records (so a
truncated download is caught) and that labels are 0..9; a problem is a
:class:`~pydtnn.errors.DatasetError` naming the file. The folder may be the one holding the ``.bin``
files or its parent holding ``cifar-10-batches-bin/`` (the layout of the official archive).
Images stay uint8 in memory (150 MB for the training set).
"""

from __future__ import annotations

import os

import numpy as np

from pydtnn.errors import DatasetError

from .base import ArraySource

SHAPE = (3, 32, 32)
RECORD = 1 + 3 * 32 * 32
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
ARCHIVE_FOLDER = "cifar-10-batches-bin"


def resolve_folder(folder: str) -> str:
    """The folder itself, or its ``cifar-10-batches-bin`` subfolder when the files are there."""
    sub = os.path.join(folder, ARCHIVE_FOLDER)
    if not any(os.path.isfile(os.path.join(folder, f)) for f in TRAIN_FILES + TEST_FILES) \
            and os.path.isdir(sub):
        return sub
    return folder


def has_any(folder: str) -> bool:
    """Whether the folder (or its archive subfolder) holds any of the training files."""
    folder = resolve_folder(folder)
    return any(os.path.isfile(os.path.join(folder, f)) for f in TRAIN_FILES)


def has_files(folder: str, which: str) -> bool:
    files = TRAIN_FILES if which == "train" else TEST_FILES
    folder = resolve_folder(folder)
    return all(os.path.isfile(os.path.join(folder, f)) for f in files)


def _records(path: str) -> int:
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    if size == 0 or size % RECORD:
        raise DatasetError(f"{path}: truncated or not a CIFAR-10 binary batch: {size} bytes is not a "
                           f"whole number of {RECORD}-byte records")
    return size // RECORD


def load_files(folder: str, which: str) -> ArraySource:
    """Load the ``train`` (five data batches) or ``test`` files of ``folder`` into memory."""
    folder = resolve_folder(folder)
    paths = [os.path.join(folder, f) for f in (TRAIN_FILES if which == "train" else TEST_FILES)]
    counts = [_records(p) for p in paths]
    x = np.empty((sum(counts),) + SHAPE, dtype=np.uint8)
    y = np.empty(sum(counts), dtype=np.int64)
    pos = 0
    for path, n in zip(paths, counts):
        try:
            raw = np.fromfile(path, dtype=np.uint8)
        except OSError as e:
            raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
        if raw.size != n * RECORD:
            raise DatasetError(f"{path}: changed size while being read")
        raw = raw.reshape(n, RECORD)
        labels = raw[:, 0]
        if labels.max() > 9:
            raise DatasetError(f"{path}: label {int(labels.max())} out of range 0..9 "
                               f"(corrupt, or not a CIFAR-10 binary batch)")
        y[pos:pos + n] = labels
        x[pos:pos + n] = raw[:, 1:].reshape((n,) + SHAPE)
        pos += n
    return ArraySource(x, y)


def write_batch(path: str, x: np.ndarray, y: np.ndarray) -> None:
    """Write images ``x`` uint8 (N, 3, 32, 32) and labels ``y`` as one CIFAR-10 binary batch file."""
    x = np.asarray(x, dtype=np.uint8).reshape(len(y), -1)
    rec = np.concatenate([np.asarray(y, dtype=np.uint8)[:, None], x], axis=1)
    rec.tofile(path)
