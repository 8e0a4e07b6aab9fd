"""The speed probe (--balance static without --replica_speeds): every replica's samples/s, timed on a few
local steps that leave no trace (`TrainerStep.side_passes`), before training; the policy splits by it."""
from __future__ import annotations

import math
import time

from pydtnn.parallel import balance
from pydtnn.parallel.comm import raise_together
from pydtnn.targets import as_targets


def probe_speeds(step, comm, seed, global_batch, caps):
    """Samples/s of every replica (the same list on every rank). `step`: the Trainer's TrainerStep."""
    B, P = global_batch, comm.size
    b = max(1, min(B // P, min(caps) if caps else B))
    idx = step.dataset.train.epoch_order(seed, 0)[:b]
    x, labels = raise_together(comm, lambda: step.dataset.train.take(idx),
                               "another rank could not read the speed probe's samples")
    y = as_targets(labels, step.nclasses, step.model.dtype)
    once_more = lambda: step.local_gradients(x, y, 1.0, overlap=False)      # noqa: E731
    with step.side_passes():       # each rank times its own number of steps: no BatchNorm collectives
        once_more()                                    # first call: allocations, compilation
        t0 = time.perf_counter()
        once_more()
        once = max(time.perf_counter() - t0, 1e-6)
        k = max(5, min(100, math.ceil(0.3 / once)))   # at least ~0.3 s of timed steps: short probes are noisy
        return balance.probe_speeds(once_more, comm, k=k, samples_per_call=len(idx)).tolist()
