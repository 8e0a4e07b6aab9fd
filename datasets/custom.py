"""`--dataset FILE.py`: a researcher's own data, from a file that defines `create_dataset(seed)`.

`create_dataset(seed)` returns a :class:`pydtnn.datasets.Dataset`, or arrays `(x_train, y_train)` or
`(x_train, y_train, x_test, y_test)` (see :func:`.arrays.from_arrays`; memory-mapped arrays are read a batch
at a time). Every rank calls it with the same seed, so it must give every rank the same data. The protocol
is on docs/datasets.md.
"""
from __future__ import annotations

import os

from pydtnn.errors import ConfigError, DatasetError, PyDTNNError
from pydtnn.plugins import importable_folder, one_line, user_code, user_function

from .arrays import from_arrays
from .base import Dataset

SPLIT_INTERFACE = ("__len__", "epoch_order", "take")


def is_dataset_file(name) -> bool:
    return os.fspath(name).endswith(".py")


def load_dataset_file(path, *, seed: int = 0, validation_split: float = 0.0,
                      test_as_validation: bool = False) -> Dataset:
    """The Dataset that the user's file at `path` creates (one-line errors naming the file)."""
    path = os.path.abspath(os.fspath(path))
    create = user_function(path, "create_dataset", "dataset file", "create_dataset(seed)")
    what = f"dataset file {path}"
    label = f"{what}: create_dataset failed"
    try:
        # whatever the user's code raises: one error line and the user's own frames (`pydtnn.plugins.user_code`)
        with importable_folder(os.path.dirname(path)), user_code(label):
            made = create(int(seed))
    except PyDTNNError as e:        # the project's own error raised inside: one line naming the file
        if str(e).startswith(label):
            raise
        raise type(e)(f"{label}: {type(e).__name__}: {one_line(e)}") from e
    if isinstance(made, Dataset):
        if validation_split or test_as_validation:
            raise ConfigError(f"{what} returns a Dataset: it defines its own val split, so --validation_split "
                              f"and --test_as_validation do not apply (return arrays to use them)")
        for split_name in ("train", "val", "test"):
            split = getattr(made, split_name)
            missing = [m for m in SPLIT_INTERFACE if split is not None and not hasattr(split, m)]
            if missing:
                raise DatasetError(f"{what}: its Dataset's {split_name} split lacks {', '.join(missing)}")
        if made.train is None or len(made.train) < 1:
            raise DatasetError(f"{what}: its Dataset has no training samples")
        return made
    if isinstance(made, (tuple, list)) and len(made) in (2, 4):
        name = os.path.splitext(os.path.basename(path))[0]
        try:
            return from_arrays(*made, name=name, validation_split=validation_split,
                               test_as_validation=test_as_validation)
        except PyDTNNError as e:
            raise type(e)(f"{what}: {one_line(e)}") from e
    raise DatasetError(f"{what}: create_dataset returned {type(made).__name__}; return a pydtnn.datasets.Dataset, "
                       f"(x_train, y_train) or (x_train, y_train, x_test, y_test)")
