"""The communicator interface, and what its implementations share: host staging of device arrays, the
request of a collective with nothing to do, the checks of allgather's and weighted_mean's arguments.

Every communicator has

    rank, size                       this replica's index, number of replicas
    bcast_(array, root=0)            in place; returns ``array``
    allreduce_sum_(array)            in place (one blocking call); returns ``array``; float16 and bfloat16
                                     arrays too (--grad_compression: MPI through `half_sum`, NCCL natively)
    iallreduce_sum_(array)           in place, non-blocking; returns a request with ``wait()``
    waitall(requests) / testall(requests)
    allgather(value)                 float -> (P,) float64; 1-D array (same length everywhere) -> (P, n)
    weighted_mean(values, weight)    sum_i w_i v_i / sum_i w_i across replicas
    any_true(flag) -> bool           True on every rank when ``flag`` is true on any rank
    barrier(), abort(code)
    gather_object(obj, root=0)       pickled; for end-of-run reports only, never on a hot path
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["Communicator", "to_host", "from_host"]


# -------------------------------------------------------------------------------------- host staging

def to_host(array) -> np.ndarray:
    """A NumPy array holding ``array``'s values: the array itself for NumPy, a copy for CuPy-like
    arrays (anything with ``.get()``)."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "get"):
        return array.get()
    return np.asarray(array)


def from_host(host: np.ndarray, out):
    """Write ``host`` back into ``out`` (no-op when ``out`` is that very NumPy array); returns ``out``."""
    if out is host:
        return out
    if isinstance(out, np.ndarray):
        out[...] = host
    elif hasattr(out, "set"):
        out.set(np.ascontiguousarray(host))
    else:
        out[...] = host
    return out


class DoneRequest:
    """A request that has already completed (serial communicator, empty buffers)."""

    def wait(self):
        return None

    def test(self):
        return True


# ------------------------------------------------------------------------------------- the interface

class Communicator:
    """Base class: the interface every communicator implements (see the module docstring)."""

    kind = "base"

    @property
    def rank(self) -> int:
        raise NotImplementedError

    @property
    def size(self) -> int:
        raise NotImplementedError

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def bcast_(self, array, root: int = 0):
        raise NotImplementedError

    def allreduce_sum_(self, array):
        raise NotImplementedError

    def iallreduce_sum_(self, array):
        raise NotImplementedError

    def waitall(self, requests: Sequence) -> None:
        for r in requests:
            r.wait()

    def testall(self, requests: Sequence) -> bool:
        return all(r.test() for r in requests)

    def allgather(self, value) -> np.ndarray:
        raise NotImplementedError

    def weighted_mean(self, values, weight: float):
        raise NotImplementedError

    def any_true(self, flag) -> bool:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def abort(self, code: int = 1):
        raise NotImplementedError

    def gather_object(self, obj, root: int = 0):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


# ------------------------------------------------------------------------- shared by the implementations

def as_values(values):
    """``weighted_mean``'s values as float64, and whether they were one number."""
    v = np.asarray(values, dtype=np.float64)
    return v, v.ndim == 0


def check_gather_value(value):
    """``allgather``'s value as a 1-D contiguous array, and whether it was one number."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        return np.asarray([float(arr)], dtype=np.float64), True
    if arr.ndim != 1:
        raise ValueError(f"allgather takes a number or a 1-D array, got shape {arr.shape}")
    return np.ascontiguousarray(arr), False

