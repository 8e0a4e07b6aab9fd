"""Ending together: a PyDTNNError met on some ranks is raised on every rank, so that no rank waits for the
others in the next collective while they are already gone."""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ERROR_CLASSES, PyDTNNError, error_code
from pydtnn.parallel.comm.base import Communicator

__all__ = ["agree_on_error", "raise_together"]


def agree_on_error(comm: Communicator, error, elsewhere: str = "another rank met an error") -> None:
    """Every rank calls this at the same point with the PyDTNNError it met, or None. If any rank met one,
    every rank raises an error of the first failing rank's class: rank 0 (which prints) with that rank's
    message (prefixed "rank r: " when it is not rank 0's own), the others with their own or ``elsewhere``.
    One allgather when nothing failed; a gather of the messages only when something did."""
    codes = np.asarray(comm.allgather(float(error_code(error))))
    failing = np.flatnonzero(codes)
    if failing.size == 0:
        return
    first = int(failing[0])
    cls = ERROR_CLASSES[int(codes[first]) - 1]
    messages = comm.gather_object(None if error is None else str(error), root=0)
    if comm.rank == 0:
        raise error if first == 0 else cls(f"rank {first}: {messages[first]}")
    raise error if error is not None and type(error) is cls else cls(elsewhere)


def raise_together(comm: Communicator, work, elsewhere: str, *, rank0_only: bool = False):
    """Run ``work`` (on every rank, or with ``rank0_only`` on rank 0 alone, which writes or downloads) and
    return its result (None where it did not run). A PyDTNNError it raises on any rank is raised on every
    rank (`agree_on_error`), so that all ranks end together instead of some waiting in the next collective;
    ``work`` itself must not communicate."""
    error = result = None
    if comm.rank == 0 or not rank0_only:
        try:
            result = work()
        except PyDTNNError as e:
            error = e
    if comm.size > 1:
        agree_on_error(comm, error, elsewhere)
    elif error is not None:
        raise error
    return result
