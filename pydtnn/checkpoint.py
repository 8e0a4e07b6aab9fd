"""Weights files and full training checkpoints: NPZ, written atomically, read without pickle.

- Weights (`--weights_and_bias_filename` / `--save_weights_and_bias_filename`): one array per parameter
  and running statistic, keyed "layer_name/param" (NCHW shapes, the same on every backend).
- Checkpoints (`--resume`, model_checkpoint): the weights plus optimizer state under "optimizer/...",
  and a JSON document under "__meta__" (stored as uint8 bytes) holding the epoch, the step, the
  scheduler and balancer states, the RNG states and the flag values.

Writes go to a temporary file in the same folder, are fsynced, then renamed over the target: a crash
mid-write leaves the previous file intact.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile

import numpy as np

from pydtnn.errors import CheckpointError

META_KEY = "__meta__"
FORMAT = "pydtnn-checkpoint-1"


def atomic_savez(path: str, arrays: dict) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
    except OSError as e:
        raise CheckpointError(f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(folder, os.O_RDONLY)       # make the rename itself durable
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_npz(path: str, what="file") -> dict:
    """All arrays of an NPZ file, loaded with allow_pickle=False; one clear error for any problem."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{what} {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{what} {path} is corrupt or not an NPZ file ({type(e).__name__}: {e})") from None


def save_weights(path: str, model) -> None:
    atomic_savez(path, model.state_arrays())


def load_weights(path: str, model) -> None:
    arrays = read_npz(path, "weights file")
    arrays.pop(META_KEY, None)
    arrays = {k: v for k, v in arrays.items() if not k.startswith("optimizer/")}
    model.load_state_arrays(arrays, source=f"weights file {path}")


def save_checkpoint(path: str, model, optimizer, meta: dict) -> None:
    arrays = dict(model.state_arrays())
    opt_state = optimizer.state_dict()
    for key, value in opt_state.items():
        if hasattr(value, "shape"):
            arrays[f"optimizer/{key}"] = model.backend.to_numpy(value)
    meta = dict(meta, format=FORMAT, optimizer={k: v for k, v in opt_state.items() if not hasattr(v, "shape")},
                optimizer_name=optimizer.name, nparams=int(model.nparams))
    arrays[META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    atomic_savez(path, arrays)


def load_checkpoint(path: str, model, optimizer) -> dict:
    """Restore weights and optimizer state in place; returns the metadata dict."""
    arrays = read_npz(path, "checkpoint")
    if META_KEY not in arrays:
        raise CheckpointError(f"checkpoint {path} has no training state (a weights-only file? use "
                              f"--weights_and_bias_filename for those)")
    try:
        meta = json.loads(arrays.pop(META_KEY).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"checkpoint {path}: its metadata is corrupt") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: unknown format {meta.get('format')!r}")
    if meta.get("optimizer_name") != optimizer.name:
        raise CheckpointError(f"checkpoint {path} was written with optimizer {meta.get('optimizer_name')}, "
                              f"not {optimizer.name}")
    opt_arrays = {k.split("/", 1)[1]: arrays.pop(k) for k in list(arrays) if k.startswith("optimizer/")}
    model.load_state_arrays(arrays, source=f"checkpoint {path}")
    state = dict(meta["optimizer"], **opt_arrays)
    for key, value in opt_arrays.items():
        if value.shape != (model.nparams,):
            raise CheckpointError(f"checkpoint {path}: optimizer state {key} has shape {value.shape}, expected "
                                  f"({model.nparams},)")
    optimizer.load_state_dict(state, model.xp)
    return meta
