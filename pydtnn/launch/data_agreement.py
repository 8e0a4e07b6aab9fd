"""Every rank loaded the same dataset: its sample counts, shapes, input type and classes agree, in one
collective before training, or every rank stops with one line naming what differs and each rank's value.

Each rank reads its own copy (a dataset file, a node's files). Copies that differ would otherwise hang the
first step (ranks with other sample counts run other numbers of steps) or end in an MPI "message sizes do
not match" stack (other shapes or classes give other buffer sizes).
"""
from __future__ import annotations

from pydtnn.errors import DatasetError
from pydtnn.launch.agreement import values_by_rank


def describe(dataset) -> list[tuple[str, str]]:
    """(what, value) pairs that every rank's copy must share, in the order a difference is reported."""
    def size(split):
        return "none" if split is None else str(len(split))
    dtype = getattr(dataset.train, "dtype", None)
    return [("training samples", size(dataset.train)), ("validation samples", size(dataset.val)),
            ("test samples", size(dataset.test)), ("input shape", str(tuple(dataset.input_shape))),
            ("input type", "unknown" if dtype is None else str(dtype)), ("classes", str(dataset.nclasses)),
            ("target shape", str(tuple(dataset.output_shape)))]


def agree_on_data(comm, dataset, name) -> None:
    """One allgather of every rank's description; the first difference is one DatasetError on every rank."""
    if comm.size == 1:
        return
    everyone = comm.comm.allgather(describe(dataset))
    for i, (what, _) in enumerate(everyone[0]):
        values = [mine[i][1] for mine in everyone]
        if len(set(values)) > 1:
            raise DatasetError(f"the ranks loaded different data from --dataset {name}: {what} "
                               f"{values_by_rank(values)} (every rank needs the same dataset: the same file "
                               f"and seed, or identical copies on every node)")
