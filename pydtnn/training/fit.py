"""`Model.fit`'s entry into the training loop: arrays (or a Dataset) in, a Keras-like history dict out.

`pydtnn.model.Model.fit` imports this module lazily, inside `fit`: the loop builds on the model, never the
reverse at import time.
"""
from __future__ import annotations

import numpy as np

from pydtnn.clipping import check_max_norm
from pydtnn.datasets import ArraySplit, Dataset
from pydtnn.errors import ConfigError, ShapeError
from pydtnn.optimizers import SGD
from pydtnn.targets import targets_for_outputs
from pydtnn.training.loop import Trainer


def fit(model, x, y=None, *, epochs, batch_size, optimizer, loss, metrics, validation_data, shuffle, verbose,
        callbacks, clip_grad_norm, comm):
    """`Model.fit` (whose docstring says what each argument means) on the launcher's Trainer."""
    check_max_norm(clip_grad_norm)
    if isinstance(x, Dataset):
        if y is not None or validation_data is not None:
            raise ConfigError("Model.fit(dataset): the Dataset holds the targets and its val split; give "
                              "neither y nor validation_data")
        data = x
        if not shuffle:
            raise ConfigError("Model.fit(dataset): a Dataset's train split sets its own order; shuffle=False "
                              "applies to arrays")
    else:
        if y is None:
            raise ConfigError("Model.fit(x, y): give the targets y, or a pydtnn.datasets.Dataset as x")
        val = None
        if validation_data is not None:
            xv, yv = validation_data
            val = _array_split(model, xv, yv, "validation_data", shuffle=False)
        data = Dataset(name="arrays", input_shape=tuple(model.input_shape), nclasses=model.output_shape[-1],
                       train=_array_split(model, x, y, "train", shuffle), val=val)
    trainer = Trainer(model, data, optimizer or SGD(), loss=loss, metrics=metrics, global_batch=batch_size,
                      seed=model.seed, progress=False, eval_batch_size=batch_size, callbacks=callbacks,
                      log=print if verbose else (lambda msg: None), clip_grad_norm=clip_grad_norm, comm=comm)
    rows = trainer.fit(epochs)
    keys = ["loss", *metrics] + ([f"val_{k}" for k in ["loss", *metrics]] if data.val is not None else [])
    return {k: [row[k] for row in rows] for k in keys}


def _array_split(model, x, y, name, shuffle):
    x = x if hasattr(x, "shape") else np.asarray(x)      # a memory-mapped x stays mapped
    y = targets_for_outputs(y, model.output_shape, model.dtype)
    if len(x) != len(y):
        raise ShapeError(f"{name}: {len(x)} inputs but {len(y)} targets")
    if len(x) == 0:
        raise ShapeError(f"{name}: no samples")
    return ArraySplit(x, y, nclasses=model.output_shape[-1], name=name, shuffle=shuffle)
