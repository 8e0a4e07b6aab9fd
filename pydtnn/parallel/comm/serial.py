"""SerialComm: one replica, no communication (a single process, or `--parallel sequential`)."""
from __future__ import annotations

import os

import numpy as np

from pydtnn.parallel.comm.base import Communicator, DoneRequest, as_values, check_gather_value
from pydtnn.parallel.runtime.shutdown import flush_output

__all__ = ["SerialComm"]


class SerialComm(Communicator):
    """One replica: rank 0 of 1; every collective is the identity."""

    kind = "serial"

    @property
    def rank(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return 1

    def bcast_(self, array, root: int = 0):
        if root != 0:
            raise ValueError(f"root {root} outside 0..0")
        return array

    def allreduce_sum_(self, array):
        return array

    def iallreduce_sum_(self, array):
        return DoneRequest()

    def allgather(self, value) -> np.ndarray:
        arr, scalar = check_gather_value(value)
        out = arr.copy()[None, ...]
        return out[:, 0] if scalar else out

    def weighted_mean(self, values, weight: float):
        v, scalar = as_values(values)
        res = v.copy() if weight != 0 else np.full(v.shape, np.nan)
        return float(res) if scalar else res

    def any_true(self, flag) -> bool:
        return bool(flag)

    def barrier(self) -> None:
        return None

    def abort(self, code: int = 1):
        flush_output()
        os._exit(int(code))

    def gather_object(self, obj, root: int = 0):
        return [obj]
