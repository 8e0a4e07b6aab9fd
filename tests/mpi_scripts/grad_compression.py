"""--grad_compression against the exact sum: one DataParallel step per configuration, rank 0 prints JSON.

For each of fp16 and bf16, blocking and overlapped (--non_blocking_mpi, buckets of 512 bytes so that the
buffer goes in several), every rank first computes its weighted gradient x_i = w_i g_i in a pass that does
not communicate, then runs the step (forward + backward again, the compressed reduction, the update). The
ranks gather their x_i; the exact sum g = sum_i x_i in float64 (rounded at most (P-1) 2^-53 sum_i |x_i|, which
the bound below adds) is compared with the step's reduced gradient g_hat:

    "worst"      max over elements of |g_hat - g| / bound, bound = GradCompression.error_bound + that rounding
                 (the bound holds elementwise when worst <= 1)
    "differs"    g_hat differs from the uncompressed reduction of the same x_i by the same calls (compression
                 happened; with "none" it must not: the reduction is the one without the option, bit for bit)
    "agree"      every rank holds the same g_hat, bit for bit
    "bytes"      the bytes the step's allreduce event and the reducer's bucket events report, and the
                 buffer's bytes in the model's dtype
    "overflow"   a weighted gradient element of 1e5 on rank 0 (above fp16's 65504): what every rank reduces

argv: dtype (float32|float64) sizes (b_0,b_1,...)
"""
import json
import sys

import numpy as np

from pydtnn import Model
from pydtnn.layers import FC, Conv2D, Flatten, Input, MaxPool2D
from pydtnn.observe.timeline import BUCKETS, Timeline
from pydtnn.observe.timing import ReplicaStats, StepTimer
from pydtnn.optimizers import SGD
from pydtnn.parallel import DataParallel
from pydtnn.parallel.comm import BucketedReducer, GradCompression, MPIComm
from pydtnn.targets import as_targets

dtype, sizes = sys.argv[1], [int(v) for v in sys.argv[2].split(",")]
comm = MPIComm()
P, B = comm.size, sum(sizes)
assert len(sizes) == P, f"{len(sizes)} sizes for {P} ranks"


def make_model():
    m = Model(backend="cpu", dtype=dtype, seed=3)
    m.add(Input(shape=(2, 8, 8)))
    m.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, activation="relu"))
    m.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    m.add(Flatten())
    m.add(FC(shape=(16,), activation="tanh"))
    m.add(FC(shape=(5,), activation="softmax"))
    return m


rng = np.random.default_rng(11)                      # the same global batch on every rank
X = rng.standard_normal((B, 2, 8, 8)).astype(dtype)
Y = rng.integers(0, 5, B)


def one_step(name, non_blocking):
    model = make_model()
    timeline = Timeline(comm.rank)
    dp = DataParallel(model, SGD(learning_rate=0.1), global_batch=B, comm=comm, sizes=sizes,
                      grad_compression=name, non_blocking=non_blocking, timer=StepTimer(ReplicaStats(), timeline))
    if non_blocking:                                 # several buckets in this small model
        dp.reducer = BucketedReducer(comm, model.grads, bucket_bytes=512, compression=dp.compression)
        dp.reducer.timeline = timeline
    x, y = dp.local_slice(X, Y)
    y = as_targets(y, 5, model.dtype)
    w = dp.weight(sizes)
    dp.forward_backward(x, y, w, overlap=False)      # x_i, without communicating
    mine = model.grads.copy()
    dp.step(x, y, w, sizes[comm.rank] / B)
    got = model.grads.copy()
    parts = comm.allgather(mine.astype(np.float64))  # (P, n): every replica's x_i, exactly
    exact, abs_sum = parts.sum(axis=0), np.abs(parts).sum(axis=0)
    bound = GradCompression(name).error_bound(abs_sum, P) + (P - 1) * 2.0 ** -53 * abs_sum
    # the uncompressed reduction of the same x_i by the calls the step makes without compression (an MPI may
    # sum a bucket in another order than the whole buffer: Open MPI does)
    plain = mine.copy()
    if non_blocking:
        comm.waitall([comm.iallreduce_sum_(plain[lo:hi]) for lo, hi in dp.reducer.bounds])
    else:
        comm.allreduce_sum_(plain)
    err = np.abs(got.astype(np.float64) - exact)
    events = [e for e in timeline.events if e.name == "allreduce"]
    buckets = [e.args["bytes"] for e in timeline.events if e.tid == BUCKETS]
    return {"worst": float(np.max(err / bound)) if name != "none" else None,   # none: no bound to hold
            "violations": int(np.sum(err > bound)),
            "differs": bool(not np.array_equal(got, plain)),
            "agree": bool(np.all(comm.allgather(got.astype(np.float64)) == got.astype(np.float64))),
            "nbuckets": dp.reducer.nbuckets if non_blocking else 0,
            "bytes": {"step": [e.args["bytes"] for e in events], "buckets": buckets,
                      "buffer": int(model.grads.nbytes)}}


def overflow(name):
    g = np.full(4, 1.0, dtype=dtype)
    if comm.rank == 0:
        g[1] = 1e5
    GradCompression(name).allreduce_sum_(comm, g)
    return [float(v) if np.isfinite(v) else str(v) for v in g]


out = {f"{name}/{'non_blocking' if nb else 'blocking'}": one_step(name, nb)
       for name in ("fp16", "bf16", "none") for nb in (False, True)}
out["overflow"] = {name: overflow(name) for name in ("fp16", "bf16")}
if comm.rank == 0:
    print(json.dumps(out))
