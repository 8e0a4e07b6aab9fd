"""Each rank's backend, model and copy of the dataset, built from the flags (one step: see
`rank_data_and_model`)."""
from __future__ import annotations

import os
import types

import numpy as np

from pydtnn.errors import ConfigError


def build_data_and_model(config, comm):
    """Each rank's backend, model and copy of the dataset (`rank_data_and_model`), in one block that ends in
    a collective; then the ranks agree that their copies are the same data (`pydtnn.launch.data_agreement`)."""
    from pydtnn.launch.data_agreement import agree_on_data
    from pydtnn.parallel.comm import raise_together
    if config.p.download:
        _download_on_rank0(config.p, comm)
    local = raise_together(comm, lambda: rank_data_and_model(config.p, config.devices[comm.rank], comm.rank),
                           "another rank could not set up its device, model or data")
    agree_on_data(comm, local.dataset, config.p.dataset_name)      # each rank's copy: the same data
    return local


def rank_data_and_model(p, kind, rank):
    """This rank's model on its backend and its copy of the dataset, without communicating. Data and model
    are one step because their shapes flow either way: synthetic data is shaped like the model (a model
    file's shape is known only once it is built), a real dataset gives the model its shape and classes."""
    from pydtnn.datasets import load_dataset
    from pydtnn.models import build_model
    model, options = _new_model(p, kind, rank)
    if (p.model_name.endswith(".py") or os.sep in p.model_name) and not os.path.isfile(p.model_name):
        raise ConfigError(f"--model {p.model_name}: no such file")
    if p.use_synthetic_data and p.dataset_name == "bytes":
        raise ConfigError("--use_synthetic_data makes images; the bytes dataset is text (drop the flag)")
    if p.dataset_name == "synthetic" or p.use_synthetic_data:
        shape, ncls = _synthetic_model_shape(p)
        build_model(p.model_name, model, nclasses=ncls, input_shape=shape)
        dataset = _synthetic_data(p, model)
    else:
        dataset = load_dataset(p.dataset_name, train_path=p.dataset_train_path, test_path=p.dataset_test_path,
                               seed=p.seed, targets=p.targets, sequence_length=p.sequence_length,
                               **_augmentation(p))
        _check_classes_fit(p, dataset, model.dtype.itemsize)
        build_model(p.model_name, model, nclasses=dataset.nclasses,
                    input_shape=None if os.path.isfile(p.model_name) else dataset.input_shape)
    _check_model_matches_data(p, model, dataset)
    return types.SimpleNamespace(model=model, dataset=dataset, options=options)


def _new_model(p, kind, rank):
    """An empty Model on this rank's backend (``kind``: cpu or gpu), and the backend's options."""
    from pydtnn.backends import get_backend
    from pydtnn.model import Model
    options = ({"precision": p.precision, "auto_conv_alg": p.enable_cudnn_auto_conv_alg} if kind == "gpu" else
               {"conv_algorithm": "winograd" if p.enable_conv_winograd else p.conv_algorithm})
    model = Model(backend=get_backend(kind, p.dtype, p.seed, **options), seed=p.seed)
    model.backend.seed(p.seed * 1000003 + rank)          # dropout: an independent stream per replica
    return model, options


def _synthetic_model_shape(p):
    """(input shape, classes) to build the model with on synthetic data: those of the dataset that
    --use_synthetic_data imitates; else a registered model's default input; a model file's own (None)."""
    from pydtnn.datasets import KNOWN_SHAPES
    from pydtnn.models import default_input_shape
    if p.dataset_name != "synthetic":
        return KNOWN_SHAPES[p.dataset_name]
    if os.path.isfile(p.model_name):
        return None, None
    return default_input_shape(p.model_name), None


def _synthetic_data(p, model):
    """Learnable synthetic data shaped like the built model, refused before allocating if it cannot fit."""
    from pydtnn.datasets import load_dataset
    if p.synthetic_samples:
        from pydtnn.launch.limits import check_fits, dataset_bytes
        check_fits(dataset_bytes(p.synthetic_samples, model.input_shape),
                   f"--synthetic_samples {p.synthetic_samples}", "lower --synthetic_samples")
    return load_dataset("synthetic", input_shape=model.input_shape, nclasses=model.output_shape[0],
                        synthetic_samples=p.synthetic_samples, seed=p.seed, targets=p.targets, **_augmentation(p))


def _augmentation(p):
    return dict(validation_split=p.validation_split, test_as_validation=p.test_as_validation,
                normalize=p.normalize, flip_images=p.flip_images, flip_images_prob=p.flip_images_prob,
                crop_images=p.crop_images, crop_images_size=p.crop_images_size, crop_images_prob=p.crop_images_prob)


def _check_classes_fit(p, dataset, itemsize):
    """Labels that make more classes than a model could hold (a label of 2**40 is 2**40 + 1 classes) are
    refused before a model for them is built: at least the output layer's weights and gradients and one
    sample's one-hot targets, K values each (K per position for per-position labels)."""
    from pydtnn.launch.limits import check_fits
    if dataset.target_shape is not None and dataset.target_shape[-1:] != (dataset.nclasses,):
        return                                        # float targets: no classes
    per_position = int(np.prod(dataset.output_shape[:-1])) if len(dataset.output_shape) > 1 else 1
    check_fits((2.0 + per_position) * float(dataset.nclasses) * itemsize,
               f"dataset {p.dataset_name}: its largest label is {dataset.nclasses - 1}, so {dataset.nclasses} "
               f"classes; a model for them", "class labels must be 0 .. K-1")


def _check_model_matches_data(p, model, dataset):
    """The model takes the data's inputs and gives its targets' shape (one line naming both otherwise)."""
    if tuple(model.input_shape) != tuple(dataset.input_shape):
        raise ConfigError(f"model {p.model_name} takes inputs {model.input_shape} but dataset {p.dataset_name} "
                          f"has {dataset.input_shape}")
    if tuple(model.output_shape) != dataset.output_shape:
        what = (f"{dataset.nclasses} classes" if dataset.target_shape is None else
                f"targets of shape {dataset.output_shape}")
        hint = "; an autoencoder needs --targets inputs" if dataset.target_shape is None and \
            tuple(model.output_shape) == tuple(dataset.input_shape) else ""
        raise ConfigError(f"model {p.model_name} gives outputs of shape {tuple(model.output_shape)} but dataset "
                          f"{p.dataset_name} has {what}{hint}")


def _download_on_rank0(p, comm):
    """Only rank 0 downloads (two writers of one .part file would corrupt it); the others wait for it."""
    from pydtnn.datasets import load_dataset
    from pydtnn.parallel.comm import raise_together
    raise_together(comm, lambda: load_dataset(p.dataset_name, train_path=p.dataset_train_path,
                                              test_path=p.dataset_test_path, download=True),
                   "the dataset download failed on rank 0", rank0_only=True)
