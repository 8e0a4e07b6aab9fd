"""A NaN loss on one rank stops every rank at the same step (any_true), status 2, no hang.

Usage: mpiexec -n K python -m mpi4py nan_stop.py BAD_RANK BAD_STEP
"""
import sys

import numpy as np

from pydtnn.parallel.comm import MPIComm

bad_rank, bad_step = int(sys.argv[1]), int(sys.argv[2])
comm = MPIComm()
grads = np.zeros(1000)
for step in range(100):
    loss = float("nan") if (comm.rank == bad_rank and step == bad_step) else 1.0 / (step + 1)
    grads[:] = loss
    comm.allreduce_sum_(grads)
    if comm.any_true(not np.isfinite(loss)):
        print(f"rank {comm.rank} stopped at step {step}", flush=True)
        sys.exit(2)
print(f"rank {comm.rank} never stopped", flush=True)
