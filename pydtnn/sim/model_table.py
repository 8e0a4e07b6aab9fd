"""What the simulator needs to know about a model, without running it: its top-level layers in forward
order, the gradient bytes of each, the channels of its BatchNormalization layers (sync-BN's small
collectives), and rough forward FLOPs and bytes per sample (the roofline mode).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LayerInfo", "build", "describe", "random_batch"]


@dataclass
class LayerInfo:
    name: str
    type: str
    param_bytes: int
    bn_channels: int
    flops: float          # forward FLOPs per sample
    bytes: float          # forward bytes moved per sample (input + output + parameters)


def build(model_name: str, dtype: str = "float32", input_shape=None, nclasses=None):
    """The model as the launcher builds it (CPU backend, synthetic data's default input shape; a model file,
    `--model FILE.py` as the launcher's, its own)."""
    from pydtnn.backends import get_backend
    from pydtnn.model import Model
    from pydtnn.models import build_model, default_input_shape, is_model_file
    model = Model(backend=get_backend("cpu", dtype, 0), seed=0)
    shape = input_shape if input_shape is not None or is_model_file(model_name) else default_input_shape(model_name)
    build_model(model_name, model, nclasses=nclasses, input_shape=shape)
    model.forward(np.zeros((1,) + tuple(model.input_shape), model.dtype), training=False)   # packs the buffers
    return model


def random_batch(model, b: int, rng):
    """(x, y) of b samples to time a pass with: normal inputs (token ids for a model that embeds them) and
    one-hot targets."""
    x = rng.standard_normal((b,) + tuple(model.input_shape)).astype(model.dtype)
    if getattr(model.layers[0], "ids", False):
        x = rng.integers(0, 2, size=x.shape)
    y = np.zeros((b,) + tuple(model.output_shape), model.dtype)
    y.reshape(b, -1)[:, 0] = 1.0
    return x, y


def _leaves(layer):
    subs = getattr(layer, "sublayers", None)
    if callable(subs):
        kids = list(subs())
        if kids:
            return [leaf for k in kids for leaf in _leaves(k)]
    return [layer]


def _flops(layer) -> float:
    """2 multiply-adds per weight per output position for convolutions and dense layers; a few
    operations per output element for the rest (activations, pooling, normalization)."""
    out = float(np.prod(layer.shape)) if layer.shape is not None else 0.0
    w = getattr(layer, "weights", None)
    if w is not None and getattr(w, "ndim", 0) >= 2:
        positions = out / layer.shape[0] if len(layer.shape) > 1 else 1.0
        if len(layer.shape) > 1 and w.ndim == 2:          # a dense layer on a sequence: positions first
            positions = out / layer.shape[-1]
        return 2.0 * float(w.size) * positions
    return 4.0 * out


def describe(model) -> list[LayerInfo]:
    itemsize = model.dtype.itemsize
    rows = []
    for layer in model.layers:
        leaves = _leaves(layer)
        bn = sum(int(l.shape[0]) for l in leaves if type(l).__name__ == "BatchNormalization")
        flops = sum(_flops(l) for l in leaves)
        moved = sum((float(np.prod(l.in_shape or ())) + float(np.prod(l.shape or ())) + l.nparams) * itemsize
                    for l in leaves)
        rows.append(LayerInfo(layer.name, type(layer).__name__, int(layer.nparams) * itemsize, bn, flops, moved))
    return rows
