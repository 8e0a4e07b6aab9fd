"""Model zoo: one builder module per family, registered by name (installed as `pydtnn.models`).

    from pydtnn import Model
    from pydtnn.models import build_model, list_models

    model = Model(backend="cpu")
    build_model("resnet50_imagenet", model)                     # 3x224x224, 1000 classes
    build_model("resnet50_imagenet", Model(), nclasses=100, input_shape=(3, 64, 64))
    build_model("path/to/my_model.py", Model())                 # a file defining create_model(model)

A builder is `builder(model, nclasses=None, input_shape=None)`: it `add`s the layers, starting with `Input`,
to the given Model and returns it. `nclasses` defaults to the family's dataset (10 for mnist / cifar10
names, 1000 for imagenet names), `input_shape` to the dataset's (C, H, W) (227 for AlexNet, 299 for
Inception v3 on ImageNet). Networks that end in global average pooling accept any input that survives
their strides; VGG / AlexNet size their first FC layer from the flattened features.
"""
from __future__ import annotations

import difflib
import inspect
import os

from pydtnn.errors import ConfigError, PyDTNNError
from pydtnn.plugins import importable_folder, one_line, user_code, user_function

from . import _common
from . import (alexnet, autoencoder, densenet, googlenet, inception, mobilenet, resnet, simple,  # noqa: F401
               transformers, vgg, vgg_small)

MODELS: dict = dict(_common.BUILDERS)       # name -> builder


def list_models() -> list[str]:
    """Every registered model name, sorted."""
    return sorted(MODELS)


def get_model_builder(name: str):
    """The builder registered as `name`; ConfigError (with close matches) for an unknown name."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), MODELS, n=6, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known models: {', '.join(list_models())}"
        raise ConfigError(f"unknown model {name!r}{hint} (or pass the path of a .py file defining "
                          f"create_model(model))") from None


def default_input_shape(name: str) -> tuple:
    """The per-sample input shape (C, H, W) a registered model is built for."""
    return get_model_builder(name).default_input_shape


def default_dataset(name: str) -> str:
    """The dataset a registered model is meant for: "mnist", "cifar10" or "imagenet"."""
    return get_model_builder(name).dataset


def default_nclasses(name: str) -> int:
    """The number of classes a registered model gets when none is given."""
    return get_model_builder(name).default_nclasses


def is_model_file(name_or_path) -> bool:
    """True when `name_or_path` names a Python file rather than a registered model."""
    text = os.fspath(name_or_path)
    return text.endswith(".py") or os.sep in text or (os.altsep is not None and os.altsep in text)


def load_model_file(path):
    """Import a user's model file and return its `create_model` function (ConfigError naming the file).

    The file's folder is importable while the file runs, so it may import modules beside it.
    """
    return user_function(path, "create_model", "model file", "create_model(model)")


def _build_from_file(path, model, nclasses, input_shape):
    create = load_model_file(path)
    path = os.path.abspath(os.fspath(path))
    try:
        params = inspect.signature(create).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {}
    if nclasses is not None and "nclasses" in params:
        kwargs["nclasses"] = _common.check_nclasses(nclasses, f"model file {path}")
    if input_shape is not None and "input_shape" in params:
        kwargs["input_shape"] = _common.check_input_shape(input_shape, f"model file {path}")
    label = f"model file {path}: create_model failed"
    try:
        # create_model may import lazily too; whatever it (or a layer of the user's) raises is one error line
        # and the user's own frames (`pydtnn.plugins.user_code`)
        with importable_folder(os.path.dirname(path)), user_code(label):
            create(model, **kwargs)
    except PyDTNNError as e:
        # a user's mistake the project detected (a shape that does not fit...): one line naming the file
        if str(e).startswith(label):
            raise
        raise type(e)(f"{label}: {type(e).__name__}: {one_line(e)}") from e
    if not model.layers:
        raise ConfigError(f"model file {path}: create_model added no layers to the model")
    if input_shape is not None and tuple(model.input_shape) != tuple(input_shape):
        raise ConfigError(f"model file {path} declares input shape {tuple(model.input_shape)}, but the data "
                          f"has shape {tuple(input_shape)}")
    if nclasses is not None and tuple(model.output_shape)[-1:] != (nclasses,):      # (T, classes): per position
        raise ConfigError(f"model file {path} gives outputs of shape {tuple(model.output_shape)}, but the "
                          f"data has {nclasses} classes")
    return model


def build_model(name_or_path, model, nclasses=None, input_shape=None):
    """Add the layers of a registered model, or of a user's .py file defining create_model(model), to `model`.

    For a registered name, `nclasses` / `input_shape` override the family's defaults. A user's file gets
    them as keyword arguments if its create_model accepts `nclasses` / `input_shape`; otherwise, when
    given, they are checked against what the file built. Returns the model.
    """
    if isinstance(name_or_path, (str, os.PathLike)) and is_model_file(name_or_path):
        return _build_from_file(name_or_path, model, nclasses, input_shape)
    builder = get_model_builder(name_or_path)
    return builder(model, nclasses=nclasses, input_shape=input_shape)


__all__ = ["MODELS", "build_model", "default_dataset", "default_input_shape", "default_nclasses",
           "get_model_builder", "is_model_file", "list_models", "load_model_file"]
