"""MNIST from the four IDX files (gzip-compressed or raw).

File names (in one folder): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, each optionally with ``.gz``
(a raw file is preferred when both exist; compression is detected from the content, not the name).

IDX format: 2 zero bytes, a type byte (0x08 = uint8, ...), a dimension count, the dimensions as
big-endian uint32, then the data, big-endian, C order. Images have magic 0x00000803 (N, rows, cols),
labels 0x00000801 (N,). The loader checks magic numbers, that the data length matches the header
exactly, that images and labels agree in count and that labels are 0..9; anything else is a
:class:`~pydtnn.errors.DatasetError` naming the file.

**t10k-only folders.** A folder that holds only the t10k pair (e.g. the real MNIST test set shipped at
``tests/data/mnist-t10k/``) is accepted as a *train* folder: its 10,000 images become the pool from
which the train split is drawn, and ``validation_split`` carves the held-out part (the LAST fraction,
deterministically: ``validation_split=0.2`` trains on images 0..7,999 and validates on 8,000..9,999).
There is then no independent test split (``test`` is None) and ``test_as_validation`` is refused.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import numpy as np

from pydtnn.errors import DatasetError

from .base import ArraySource

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801

FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_IDX_DTYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_IDX_CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
              np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise DatasetError(f"{path}: truncated gzip file (the compressed stream ends early)") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as e:
            raise DatasetError(f"{path}: corrupt gzip data ({e})") from None
    return data


def read_idx(path: str, magic: int | None = None) -> np.ndarray:
    """Read one IDX file (raw or gzip) into a native-endian array; ``magic`` checks the kind."""
    data = _read_bytes(path)
    if len(data) < 4:
        raise DatasetError(f"{path}: truncated IDX header ({len(data)} bytes)")
    found = struct.unpack(">I", data[:4])[0]
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES or data[3] == 0:
        raise DatasetError(f"{path}: not an IDX file (bad magic number 0x{found:08x})")
    if magic is not None and found != magic:
        raise DatasetError(f"{path}: bad magic number 0x{found:08x}, expected 0x{magic:08x}")
    dtype, ndim = _IDX_DTYPES[data[2]], data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{path}: truncated IDX header ({len(data)} bytes, needs {header})")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    count = int(np.prod(dims, dtype=np.int64))
    want, have = count * dtype.itemsize, len(data) - header
    if have < want:
        raise DatasetError(f"{path}: truncated: {have} data bytes, the header {dims} promises {want}")
    if have > want:
        raise DatasetError(f"{path}: corrupt: {have - want} unexpected bytes after the {dims} data")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False) if dtype.itemsize > 1 else arr


def write_idx(path: str, array: np.ndarray, compress: bool | None = None) -> None:
    """Write ``array`` as an IDX file (gzip when ``compress`` or, by default, when path ends in .gz)."""
    a = np.asarray(array)
    if a.dtype not in _IDX_CODES:
        raise ValueError(f"IDX cannot store {a.dtype}")
    if compress is None:
        compress = str(path).endswith(".gz")
    head = bytes([0, 0, _IDX_CODES[a.dtype], a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
    body = head + a.astype(a.dtype.newbyteorder(">"), copy=False).tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(body) if compress else body)


def find_file(folder: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            return p
    return None


def has_pair(folder: str, which: str) -> bool:
    return all(find_file(folder, stem) is not None for stem in FILES[which])


def load_pair(folder: str, which: str) -> ArraySource:
    """Load the ``train`` or ``test`` (t10k) pair of ``folder`` as an in-memory source."""
    img_stem, lab_stem = FILES[which]
    img_path = find_file(folder, img_stem) or os.path.join(folder, img_stem + "[.gz]")
    lab_path = find_file(folder, lab_stem) or os.path.join(folder, lab_stem + "[.gz]")
    images = read_idx(img_path, IMAGES_MAGIC)
    labels = read_idx(lab_path, LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(f"{lab_path}: {labels.shape[0]} labels for the {images.shape[0]} images "
                           f"of {os.path.basename(img_path)}")
    if labels.size and labels.max() > 9:
        raise DatasetError(f"{lab_path}: label {int(labels.max())} out of range 0..9")
    return ArraySource(images[:, None, :, :], labels.astype(np.int64))
