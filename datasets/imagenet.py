"""ImageNet as a folder of NPZ shards (upstream PyDTNN's format), streamed shard by shard.

Each ``*.npz`` file (sorted by name) holds ``x``: uint8 (n, C, H, W) and ``y``: integer labels
(n,) in 1..nclasses (1-based, as upstream writes them; the loader subtracts 1). Shards are opened
with ``allow_pickle=False``.

The shard index is built from the ``.npy`` headers inside the zip archives (a few bytes per shard, no
image data is read), so opening 1,024 shards is quick. Image data is loaded on demand, a whole shard at
a time, and at most :attr:`ShardSource.max_cached` (2) shards are kept in memory. The matching epoch
order (:meth:`pydtnn.datasets.Split.epoch_order`) visits shards in a random order and the samples of
each shard contiguously, so each shard is read once per epoch; random access across many shards works
but reloads shards.
"""

from __future__ import annotations

import glob
import os
import zipfile
import zlib
from collections import OrderedDict

import numpy as np

from pydtnn.errors import DatasetError


def _npy_header(zf: zipfile.ZipFile, member: str, path: str):
    """(shape, dtype) of ``member`` in an open npz, reading only its header."""
    try:
        with zf.open(member) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)  # 3.0: utf8 names only
    except KeyError:
        raise DatasetError(f"{path}: NPZ shard has no array '{member[:-4]}'") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DatasetError(f"{path}: corrupt header of '{member[:-4]}' ({e})") from None
    return tuple(int(d) for d in shape), np.dtype(dtype)


def read_shard_header(path: str) -> tuple[tuple[int, ...], np.dtype, tuple[int, ...], np.dtype]:
    """Shapes and dtypes of ``x`` and ``y`` of one shard, without loading the data."""
    try:
        with zipfile.ZipFile(path) as zf:
            xs, xd = _npy_header(zf, "x.npy", path)
            ys, yd = _npy_header(zf, "y.npy", path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except zipfile.BadZipFile:
        raise DatasetError(f"{path}: not an NPZ file or truncated (bad zip archive)") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(xs) != 4 or xd != np.uint8:
        raise DatasetError(f"{path}: 'x' must be uint8 (n, C, H, W), found {xd} {xs}")
    if ys not in ((xs[0],), (xs[0], 1)) or yd.kind not in "iu":
        raise DatasetError(f"{path}: 'y' must be {xs[0]} integer labels, found {yd} {ys}")
    return xs, xd, ys, yd


class ShardSource:
    """Samples of a folder of NPZ shards; global index = position in the concatenation of shards."""

    max_cached = 2

    def __init__(self, folder: str, nclasses: int = 1000, ways_out: str = ""):
        """`ways_out`: what to do when the folder or its shards are missing, ending that message."""
        ways_out = f": {ways_out}" if ways_out else ""
        if not os.path.isdir(folder):
            raise DatasetError(f"{folder}: ImageNet shard folder not found{ways_out}")
        self.folder = folder
        self.paths = sorted(glob.glob(os.path.join(folder, "*.npz")))
        if not self.paths:
            raise DatasetError(f"{folder}: no *.npz shards in this folder{ways_out}")
        self.nclasses = int(nclasses)
        sizes, shape = [], None
        for p in self.paths:
            xs, _, _, _ = read_shard_header(p)
            if shape is None:
                shape = xs[1:]
            elif xs[1:] != shape:
                raise DatasetError(f"{p}: images of shape {xs[1:]}, but {self.paths[0]} has {shape}")
            sizes.append(xs[0])
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.input_shape = tuple(int(d) for d in shape)
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self.loads = 0   # number of shard reads so far (for tests and statistics)

    @property
    def blocks(self) -> np.ndarray:
        return self.offsets

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _shard(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        if s in self._cache:
            self._cache.move_to_end(s)
            return self._cache[s]
        while len(self._cache) >= self.max_cached:   # free memory before reading the next shard
            self._cache.popitem(last=False)
        path = self.paths[s]
        try:
            with np.load(path, allow_pickle=False) as z:
                x, y = z["x"], z["y"]
        except FileNotFoundError:
            raise DatasetError(f"{path}: file not found") from None
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
            raise DatasetError(f"{path}: corrupt or truncated NPZ shard ({type(e).__name__}: {e})") from None
        n = int(self.sizes[s])
        if x.dtype != np.uint8 or x.shape != (n,) + self.input_shape:
            raise DatasetError(f"{path}: 'x' is {x.dtype} {x.shape}, its header said uint8 "
                               f"{(n,) + self.input_shape}")
        y = np.asarray(y).reshape(-1).astype(np.int64) - 1
        if y.shape != (n,):
            raise DatasetError(f"{path}: {y.shape[0]} labels for {n} images")
        if n and (y.min() < 0 or y.max() >= self.nclasses):
            bad = int(y.min() if y.min() < 0 else y.max()) + 1
            raise DatasetError(f"{path}: label {bad} out of range 1..{self.nclasses} (labels are 1-based)")
        self.loads += 1
        self._cache[s] = (x, y)
        return x, y

    def get(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        x = np.empty((idx.size,) + self.input_shape, dtype=np.uint8)
        y = np.empty(idx.size, dtype=np.int64)
        if idx.size == 0:
            return x, y
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        # Shards in order of first appearance, so that the cache ends holding the ones read last.
        uniq, first = np.unique(shard, return_index=True)
        for s in uniq[np.argsort(first)]:
            sel = np.flatnonzero(shard == s)
            sx, sy = self._shard(int(s))
            local = idx[sel] - self.offsets[s]
            x[sel] = sx[local]
            y[sel] = sy[local]
        return x, y
