"""Dataset loaders: mnist, cifar10, imagenet (NPZ shards), synthetic.

>>> from pydtnn.datasets import load_dataset
>>> ds = load_dataset("synthetic", input_shape=(1, 28, 28), nclasses=10, synthetic_samples=512)
>>> order = ds.train.epoch_order(seed=0, epoch=0)      # the same on every rank
>>> x, y = ds.train.take(order[:64], epoch=0)           # float32 NCHW normalized, int64 labels

Splits keep raw uint8 images; :meth:`Split.take` gathers, augments (train split, when ``epoch`` is given)
and normalizes a batch. See :mod:`.base` for the augmentation and normalization details, and the loader
modules for the file formats: :mod:`.mnist`, :mod:`.cifar10`, :mod:`.imagenet`, :mod:`.synthetic`,
:mod:`.download`; a researcher's own arrays or file: :mod:`.arrays`, :mod:`.custom`.
"""

from __future__ import annotations

import math
import os

from pydtnn.errors import ConfigError, DatasetError

from . import cifar10, imagenet, mnist, synthetic, text
from .arrays import ArraySplit, from_arrays
from .base import NORMALIZATION, Augmentation, Dataset, Split, check_fraction
from .custom import is_dataset_file, load_dataset_file
from .download import default_cache_dir, download_dataset, fetch, ways_to_get

__all__ = ["load_dataset", "from_arrays", "load_dataset_file", "Dataset", "Split", "ArraySplit", "Augmentation", "NORMALIZATION", "DATASETS",
           "KNOWN_SHAPES", "fetch", "download_dataset", "default_cache_dir"]

DATASETS = ("mnist", "cifar10", "imagenet", "synthetic", "bytes")

# Per-sample shape and number of classes of the real datasets (ImageNet: upstream's 227 x 227 shards;
# the actual shape is read from the shards). Useful to build a synthetic stand-in of the same shape.
KNOWN_SHAPES = {
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "imagenet": ((3, 227, 227), 1000),
}


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _folder(name: str, train_path, download: bool, cache_dir) -> str:
    if train_path is not None:
        folder = os.fspath(train_path)
    elif download:
        folder = download_dataset(name, cache_dir)
    else:
        folder = os.path.join(cache_dir or default_cache_dir(), name)
    if not os.path.isdir(folder):
        raise DatasetError(f"{folder}: {name} dataset folder not found: {ways_to_get(name, train_path is not None)}")
    return folder


def _load_mnist(train_dir: str, test_dir: str, test_explicit: bool, path_given: bool):
    """(train source, test source or None, pool_mode)."""
    def present(folder, which):
        return [s for s in mnist.FILES[which] if mnist.find_file(folder, s)]

    if mnist.has_pair(train_dir, "train"):
        train, pool = mnist.load_pair(train_dir, "train"), False
    elif present(train_dir, "train"):
        mnist.load_pair(train_dir, "train")          # raises, naming the missing file
        raise AssertionError("unreachable")
    elif present(train_dir, "test"):
        train, pool = mnist.load_pair(train_dir, "test"), True   # t10k-only folder: the pool
    else:
        raise DatasetError(f"{train_dir}: no MNIST files here (expected train-images-idx3-ubyte[.gz] and "
                           f"train-labels-idx1-ubyte[.gz], or the t10k pair): {ways_to_get('mnist', path_given)}")
    if pool and _same_folder(train_dir, test_dir):
        test = None                                   # the t10k pair is the training pool, not a test set
    elif test_explicit or present(test_dir, "test"):
        test = mnist.load_pair(test_dir, "test")
    else:
        test = None
    return train, test, pool


def _load_cifar10(train_dir: str, test_dir: str, test_explicit: bool, path_given: bool):
    if not cifar10.has_any(train_dir):               # an empty folder; a partial one names its missing file
        raise DatasetError(f"{train_dir}: no CIFAR-10 files here (expected data_batch_1.bin ... data_batch_5.bin, "
                           f"or their {cifar10.ARCHIVE_FOLDER} folder): {ways_to_get('cifar10', path_given)}")
    train = cifar10.load_files(train_dir, "train")
    folder = cifar10.resolve_folder(test_dir)
    if test_explicit or any(os.path.isfile(os.path.join(folder, f)) for f in cifar10.TEST_FILES):
        test = cifar10.load_files(test_dir, "test")
    else:
        test = None
    return train, test


def load_dataset(name: str, *, train_path=None, test_path=None, validation_split: float = 0.0,
                 test_as_validation: bool = False, normalize: bool = True, flip_images: bool = False,
                 flip_images_prob: float = 0.5, crop_images: bool = False, crop_images_size: int = 16,
                 crop_images_prob: float = 0.5, input_shape=None, nclasses=None, synthetic_samples=None,
                 seed: int = 0, download: bool = False, cache_dir=None, targets: str = "labels",
                 sequence_length: int = 64) -> Dataset:
    """Load ``name`` (mnist | cifar10 | imagenet | synthetic | bytes, or a user's ``FILE.py`` defining
    ``create_dataset(seed)``: see :mod:`.custom`) as a :class:`Dataset`.

    - ``train_path`` / ``test_path``: folders. mnist and cifar10 default to ``<cache>/<name>``
      (``cache_dir``, else ``$PYDTNN_CACHE``, else ``~/.cache/pydtnn``), and ``test_path`` defaults to
      ``train_path`` (the test split is None when its files are absent). imagenet needs ``train_path``
      (a folder of ``*.npz`` shards); ``test_path`` is another such folder, or None.
    - MNIST from a folder that holds only ``t10k-images-idx3-ubyte[.gz]`` and ``t10k-labels-idx1-ubyte[.gz]``:
      those 10,000 images are the training pool and ``test`` is None; ``validation_split=0.2`` then trains on
      the first 8,000 and holds out the last 2,000 as ``val``. ``test_as_validation`` is refused there
      (there is no independent test set).
    - ``validation_split``: fraction in [0, 1) of the train set held out as ``val`` (the LAST samples,
      deterministic). ``test_as_validation``: ``val`` is the test split. Not both.
    - ``normalize``: pixels / 255, then per-channel standardization with the published constants
      (:data:`NORMALIZATION`); False gives [0, 1].
    - ``flip_images*`` / ``crop_images*``: train-time augmentation (see :class:`Augmentation`), applied by
      ``train.take(indices, epoch=e)``; a pure function of (seed, epoch, sample index).
    - ``input_shape`` / ``nclasses``: the shape of the synthetic dataset (default (1, 28, 28), 10 classes);
      for a real dataset, a check (imagenet: ``nclasses`` defaults to 1000 and bounds the labels).
    - ``synthetic_samples``: number of synthetic training samples (test: a fifth of it).
    - ``seed``: synthetic data and augmentation. ``download``: fetch missing mnist/cifar10 files into the
      cache (see :func:`download_dataset`).
    - ``targets``: "labels" (class labels, the default) or "inputs" (each image is its own target: an
      autoencoder's; the model's output shape is then the input shape).
    - bytes: a text file (``train_path``, default the public-domain text shipped in the package) cut into
      sequences of ``sequence_length`` bytes, each with the next byte of every position as its targets
      (a byte-level language model); ``validation_split`` holds out the last sequences. See :mod:`.text`.
    """
    if isinstance(name, (str, os.PathLike)) and is_dataset_file(name):
        if targets != "labels" or flip_images or crop_images:
            raise ConfigError(f"dataset file {name}: its arrays are used as they are; targets, flips and crops "
                              f"are the file's to make")
        return load_dataset_file(name, seed=seed, validation_split=validation_split,
                                 test_as_validation=test_as_validation)
    key = str(name).lower()
    if key not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}, or a .py file "
                          f"defining create_dataset(seed)")
    validation_split = check_fraction("validation_split", validation_split)
    if key == "bytes":
        if targets != "labels":
            raise ConfigError("the bytes dataset's targets are the next bytes; it takes no targets option")
        if test_as_validation:
            raise ConfigError("the bytes dataset has no test split: use validation_split")
        return text.load_bytes(train_path, sequence_length, validation_split)
    if targets not in Split.TARGETS:
        raise ConfigError(f"targets must be one of {', '.join(Split.TARGETS)}, got {targets!r}")
    flip_images_prob = check_fraction("flip_images_prob", flip_images_prob, upper_open=False)
    crop_images_prob = check_fraction("crop_images_prob", crop_images_prob, upper_open=False)
    if validation_split > 0 and test_as_validation:
        raise ConfigError("validation_split and test_as_validation are mutually exclusive; choose one")
    try:
        crop_images_size = int(crop_images_size)
    except (TypeError, ValueError):
        raise ConfigError(f"crop_images_size must be an integer, got {crop_images_size!r}") from None
    if crop_images and crop_images_size < 1:
        raise ConfigError(f"crop_images_size must be >= 1, got {crop_images_size}")
    if input_shape is not None:
        input_shape = tuple(int(d) for d in input_shape)

    pool_mode = False
    if key == "synthetic":
        train_src, test_src, k = synthetic.make_sources(input_shape, nclasses, synthetic_samples, seed=seed)
    else:
        if key == "imagenet":
            if train_path is None:
                raise ConfigError(f"imagenet needs a folder of NPZ shards (keys x, y), and has no download: "
                                  f"{ways_to_get('imagenet', False)}")
            k = 1000 if nclasses is None else int(nclasses)
            if k < 1:
                raise ConfigError(f"nclasses must be >= 1, got {nclasses}")
            train_src = imagenet.ShardSource(os.fspath(train_path), k, ways_to_get("imagenet", True))
            test_src = imagenet.ShardSource(os.fspath(test_path), k) if test_path is not None else None
            if test_src is not None and test_src.input_shape != train_src.input_shape:
                raise DatasetError(f"{test_path}: test shards hold {test_src.input_shape} images, the train "
                                   f"shards {train_src.input_shape}")
        else:
            k = 10
            if nclasses is not None and int(nclasses) != k:
                raise ConfigError(f"{key} has 10 classes, nclasses={nclasses} was given")
            train_dir = _folder(key, train_path, download, cache_dir)
            test_dir = os.fspath(test_path) if test_path is not None else train_dir
            if test_path is not None and not os.path.isdir(test_dir):
                raise DatasetError(f"{test_dir}: {key} test folder not found")
            given = train_path is not None
            if key == "mnist":
                train_src, test_src, pool_mode = _load_mnist(train_dir, test_dir, test_path is not None, given)
            else:
                train_src, test_src = _load_cifar10(train_dir, test_dir, test_path is not None, given)
        if input_shape is not None and input_shape != train_src.input_shape:
            raise ConfigError(f"{key} images are {train_src.input_shape}, input_shape={input_shape} "
                              f"was given")
    shape = train_src.input_shape
    if test_src is not None and test_src.input_shape != shape:
        raise DatasetError(f"{key}: test images are {test_src.input_shape}, train images {shape}")

    if test_as_validation and test_src is None:
        why = (" (this MNIST folder holds only the t10k pair, which is the training pool; "
               "use validation_split)") if pool_mode else ""
        raise ConfigError(f"test_as_validation needs a test set, and {key} has none here{why}")
    if crop_images and crop_images_size > min(shape[1:]):
        raise ConfigError(f"crop_images_size {crop_images_size} exceeds the {shape[1]}x{shape[2]} images")

    n = len(train_src)
    nval = 0
    if validation_split > 0:
        nval = max(1, int(math.floor(n * validation_split + 0.5)))
        if nval >= n:
            raise ConfigError(f"validation_split={validation_split} leaves no training sample of {n}")
    mean, std = NORMALIZATION[key] if normalize else (None, None)
    aug = Augmentation(seed=int(seed), flip=bool(flip_images), flip_prob=flip_images_prob,
                       crop=bool(crop_images), crop_size=crop_images_size, crop_prob=crop_images_prob)
    common = dict(nclasses=k, mean=mean, std=std, targets=targets)
    train = Split(train_src, 0, n - nval, augmentation=aug, name="train", **common)
    val = Split(train_src, n - nval, n, name="val", **common) if nval else None
    test = Split(test_src, name="test", **common) if test_src is not None else None
    if test_as_validation:
        val = test
    return Dataset(name=key, input_shape=shape, nclasses=k, train=train, val=val, test=test,
                   target_shape=shape if targets == "inputs" else None)
