"""BatchNorm under gradient accumulation (mpiexec -n 3, float64, DataParallel's own loop), against one process.

argv: local | sync
  local  3 replicas of 4 rows, no accumulation, each normalizing its own rows; rank 0 then trains one process
         on the 12 rows with 3 micro-batches of 4 (each normalized by its own statistics): the same weights.
  sync   3 replicas of 2, 4 and 6 rows with --sync_batchnorm and 2 micro-batches each (1+1, 2+2, 3+3 rows):
         micro-batch j of the step is the replicas' j-th micro-batches together (6 rows). Rank 0 then trains
         one process on the rows in that order (micro-batch 0's 6 rows, then micro-batch 1's) with 2
         micro-batches of 6: the same weights and running statistics.
Prints "diff PARAMS STATS MOVED": the largest relative difference of the weights and of the running statistics
from the one process's, and how far the one process's weights are from those of one pass on all 12 rows
(BatchNorm on the whole batch's statistics), which must not be small.
"""
import sys

import numpy as np
from mpi4py import MPI

from pydtnn import Model
from pydtnn.layers import FC, BatchNormalization, Conv2D, Flatten, Input, Relu
from pydtnn.optimizers import SGD
from pydtnn.parallel import DataParallel
from pydtnn.parallel.accumulation import micro_batch_bounds
from pydtnn.parallel.comm import MPIComm, SerialComm

mode = sys.argv[1]
B, STEPS = 12, 3


def model():
    m = Model(dtype="float64", seed=2)
    m.add(Input(shape=(2, 4, 4)))
    m.add(Conv2D(nfilters=3, filter_shape=(3, 3), padding=1))
    m.add(BatchNormalization(momentum=0.8))
    m.add(Relu())
    m.add(Flatten())
    m.add(FC(shape=(6,)))
    m.add(BatchNormalization(momentum=0.7))
    m.add(Relu())
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def train(comm, sizes, steps, sync, order=None):
    m = model()
    dp = DataParallel(m, SGD(learning_rate=0.1, momentum=0.9), global_batch=B, comm=comm, sizes=sizes,
                      sync_batchnorm=sync, accumulation_steps=steps)
    rng = np.random.default_rng(4)
    for _ in range(STEPS):
        x, labels = rng.standard_normal((B, 2, 4, 4)), rng.integers(0, 3, B)
        if order is not None:
            x, labels = x[order], labels[order]
        dp.train_step(*dp.local_slice(x, labels))
    stats = np.concatenate([a.ravel() for layer in m.all_layers() for a in layer.state_arrays().values()])
    return m.params.copy(), stats


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


comm = MPIComm(MPI.COMM_WORLD)
assert comm.size == 3
if mode == "local":
    params, stats = train(comm, [4, 4, 4], 1, False)
    serial_steps, order = 3, None
else:
    sizes, serial_steps = [2, 4, 6], 2
    params, stats = train(comm, sizes, 2, True)
    starts = np.cumsum([0] + sizes[:-1])
    order = np.concatenate([start + np.arange(lo, hi) for j in range(2)
                            for start, b in zip(starts, sizes) for lo, hi in [micro_batch_bounds(b, 2)[j]]])
    assert sorted(order.tolist()) == list(range(B))
if comm.rank == 0:
    ref_params, ref_stats = train(SerialComm(), [B], serial_steps, False, order)
    whole, _ = train(SerialComm(), [B], 1, False, order)
    print(f"diff {rel(params, ref_params):.3e} {rel(stats, ref_stats):.3e} {rel(whole, ref_params):.3e}", flush=True)
