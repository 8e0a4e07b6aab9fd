"""Sizes that cannot fit in memory, refused with one line before anything is allocated."""
from __future__ import annotations

import os

import numpy as np

from pydtnn.errors import ConfigError


def physical_memory() -> int | None:
    """Bytes of RAM on this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fits(nbytes: float, what: str, hint: str, memory: int | None = None) -> None:
    memory = physical_memory() if memory is None else memory
    if memory and nbytes > memory:
        raise ConfigError(f"{what} needs about {gib(nbytes)}, more than this machine's {gib(memory)} of "
                          f"memory; {hint}")


def dataset_bytes(samples: int, input_shape) -> float:
    """Synthetic data are stored as uint8: one byte per value."""
    return float(samples) * float(np.prod(input_shape))


def activation_bytes(model, batch: int) -> float:
    """A lower bound of one training step's memory: every layer's output and its gradient, plus the input."""
    per_sample = float(np.prod(model.input_shape)) + sum(float(np.prod(layer.shape)) for layer in model.all_layers()
                                                         if layer.shape)
    return 2.0 * per_sample * float(batch) * model.dtype.itemsize
