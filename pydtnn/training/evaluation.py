"""Loss and metrics over a whole split in inference mode, shared among the replicas, weighted by samples."""
from __future__ import annotations

import numpy as np

from pydtnn.errors import PyDTNNError
from pydtnn.parallel.comm import agree_on_error
from pydtnn.targets import as_targets


def evaluate_split(model, split, comm, loss, metric_names, metric_fns, batch_size):
    """Each rank takes its contiguous part of `split` in batches of `batch_size`. One SUM-allreduce gives
    every rank the same means; a rank that cannot read its part (a corrupt shard of a lazily read split)
    makes every rank raise."""
    n = len(split)
    mine = np.array_split(np.arange(n), comm.size)[comm.rank]
    sums = np.zeros(3 + len(metric_fns))       # loss, metrics, samples, and a flag: a read failed
    error = None
    for start in range(0, len(mine), batch_size):
        idx = mine[start:start + batch_size]
        try:
            x, labels = split.take(idx)
        except PyDTNNError as e:
            error, sums[-1] = e, 1.0
            break
        y = model.backend.asarray(as_targets(labels, model.output_shape[-1], model.dtype))
        y_pred = model.forward(x, training=False)
        values = model.backend.read_scalars([loss(y_pred, y)[0]] + [f(y_pred, y) for f in metric_fns])
        sums[:-2] += values * len(idx)
        sums[-2] += len(idx)
    comm.allreduce_sum_(sums)
    if sums[-1] > 0:
        agree_on_error(comm, error, "another rank could not read its part of the evaluation data")
    return {name: v / max(sums[-2], 1) for name, v in zip(["loss", *metric_names], sums[:-2])}
