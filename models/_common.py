"""What the model families share: the `zoo` registration decorator and a few layer-pattern helpers.

A builder is a function `builder(model, nclasses=..., input_shape=None)` that `add`s layers, starting with
`Input`, to the `Model` it is given, and returns it. The `zoo` decorator records its default dataset, input
shape and number of classes, fills in `nclasses=None` / `input_shape=None` from them, checks both, and
rewrites a ShapeError (an input too small for the network) so that it names the model.
"""
from __future__ import annotations

import functools

from pydtnn.activations import Relu
from pydtnn.errors import ConfigError, ShapeError
from pydtnn.layers import FC, BatchNormalization, Conv2D, Input

DATASET_SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32), "imagenet": (3, 224, 224), "bytes": (64,)}
DATASET_CLASSES = {"mnist": 10, "cifar10": 10, "imagenet": 1000, "bytes": 256}

BUILDERS: dict = {}          # name -> decorated builder, in registration order (filled at import time)


def check_nclasses(nclasses, where):
    if isinstance(nclasses, bool) or not isinstance(nclasses, int) or nclasses < 1:
        raise ConfigError(f"{where}: nclasses must be a positive int, got {nclasses!r}")
    return nclasses


def check_input_shape(input_shape, where):
    try:
        shape = tuple(input_shape)
        ok = len(shape) in (1, 3) and all(not isinstance(d, bool) and int(d) == d and d > 0 for d in shape)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{where}: input_shape must be (C, H, W) (or (features,)) of positive ints, "
                          f"got {input_shape!r}")
    return tuple(int(d) for d in shape)


def zoo(dataset, input_shape=None):
    """Register a builder under its function name, with its default dataset and input shape."""
    default_shape = tuple(input_shape or DATASET_SHAPES[dataset])
    default_classes = DATASET_CLASSES[dataset]

    def decorate(fn):
        name = fn.__name__

        @functools.wraps(fn)
        def builder(model, nclasses=None, input_shape=None):
            nclasses = default_classes if nclasses is None else check_nclasses(nclasses, name)
            shape = default_shape if input_shape is None else check_input_shape(input_shape, name)
            try:
                fn(model, nclasses=nclasses, input_shape=shape)
            except ShapeError as e:
                raise ShapeError(f"model {name} with input shape {shape}: {e}") from e
            return model

        builder.model_name = name
        builder.dataset = dataset
        builder.default_input_shape = default_shape
        builder.default_nclasses = default_classes
        if name in BUILDERS:
            raise RuntimeError(f"model {name} registered twice")
        BUILDERS[name] = builder
        return builder
    return decorate


# --- layer patterns ---------------------------------------------------------------------------------
def add_input(model, input_shape):
    model.add(Input(shape=input_shape))


def add_classifier(model, nclasses):
    """The last layer of every zoo model: FC + Softmax (the categorical cross-entropy fuses with it)."""
    model.add(FC(shape=(nclasses,), activation="softmax"))


def conv_bn(nfilters, filter_shape, stride=1, padding=0, relu=True, init="he_normal", **kw):
    """[Conv2D (no bias), BatchNormalization (, Relu)] as a list of layers, for paths and `add_all`."""
    layers = [Conv2D(nfilters=nfilters, filter_shape=filter_shape, stride=stride, padding=padding,
                     use_bias=False, weights_initializer=init, **kw),
              BatchNormalization()]
    if relu:
        layers.append(Relu())
    return layers


def add_all(model, layers):
    for layer in layers:
        model.add(layer)
