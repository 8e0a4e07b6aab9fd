"""Weights files: NPZ, written atomically, read without pickle (`Model.save` / `Model.load`, the launcher's
--weights_and_bias_filename / --save_weights_and_bias_filename).

One array per parameter and running statistic, keyed "layer_name/param" (NCHW shapes, the same on every
backend). A full training checkpoint (`pydtnn.training.checkpointing`) is a weights file with more keys:
the optimizer's arrays under OPTIMIZER_PREFIX and its metadata under META_KEY; `load_weights` reads one
too, skipping those.

Writes go to a temporary file in the same folder, are fsynced, then renamed over the target: a crash
mid-write leaves the previous file intact.
"""
from __future__ import annotations

import contextlib
import os
import zipfile

import numpy as np

from pydtnn.errors import CheckpointError
from pydtnn.outputs import atomic_write

META_KEY = "__meta__"              # a checkpoint's JSON metadata (uint8 bytes)
OPTIMIZER_PREFIX = "optimizer/"    # a checkpoint's optimizer state arrays


def atomic_savez(path: str, arrays: dict) -> None:
    """NPZ through `outputs.atomic_write` (fsynced temporary file, renamed; umask permissions)."""
    atomic_write(path, lambda f: np.savez(f, **arrays))


@contextlib.contextmanager
def open_npz(path: str, what="file", npy_hint=""):
    """An NPZ archive, opened with allow_pickle=False and closed after the block; one CheckpointError naming
    the file for a missing file, a .npy array (`npy_hint` says more) or a corrupt archive, also when the
    block's reading finds it corrupt."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{what} {path} does not exist")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise CheckpointError(f"{what} {path} is a .npy file (one array), not an NPZ archive of named "
                                  f"arrays{npy_hint}")
        with data:
            yield data
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{what} {path} is corrupt or not an NPZ file ({type(e).__name__}: {e})") from None


def read_npz(path: str, what="file") -> dict:
    """All arrays of an NPZ file, loaded with allow_pickle=False; one clear error for any problem: not an
    NPZ archive (a .npy array, garbage), an array of Python objects, or an array that does not hold finite
    real numbers (strings, complex numbers, NaN); the error names the file and the array."""
    arrays = {}
    with open_npz(path, what, " (write one with numpy.savez)") as data:
        for key in data.files:
            try:
                arrays[key] = data[key]
            except ValueError as e:
                if "allow_pickle" in str(e):
                    raise CheckpointError(f"{what} {path}: array {key!r} holds Python objects (pickled), "
                                          f"which are never loaded") from None
                raise
            if not isinstance(arrays[key], np.ndarray):      # a member that is no .npy: NumPy hands its bytes
                raise CheckpointError(f"{what} {path}: member {key!r} is a plain file in the archive, not a "
                                      f"NumPy array (.npy)")
    for key, value in arrays.items():
        _check_real(value, key, path, what)
    return arrays


def _check_real(value, key, path, what):
    kind = value.dtype.kind
    if kind not in "biuf":
        held = {"U": "strings", "S": "byte strings", "c": "complex numbers", "O": "Python objects",
                "M": "dates", "m": "time spans", "V": "records"}.get(kind, "non-numbers")
        raise CheckpointError(f"{what} {path}: array {key!r} holds {held} ({value.dtype}), not real numbers")
    if kind == "f" and not np.isfinite(value).all():
        raise CheckpointError(f"{what} {path}: array {key!r} holds NaN or infinite values")


def save_weights(path: str, model) -> None:
    atomic_savez(path, model.state_arrays())


def load_weights(path: str, model) -> None:
    arrays = read_npz(path, "weights file")
    arrays.pop(META_KEY, None)
    arrays = {k: v for k, v in arrays.items() if not k.startswith(OPTIMIZER_PREFIX)}
    model.load_state_arrays(arrays, source=f"weights file {path}")
