"""How much k processes on one node slow each other's compute (run under ``mpiexec -n k`` by
`pydtnn.sim.calibrate`).

Every rank builds the model, warms up, then runs synchronized steps, as the trainer's are: one
``compute_gradients`` on its own batch, then a barrier (a step waits for its slowest replica). Kept is
the period of a step, barrier to barrier, so time a rank spends descheduled counts wherever it falls;
rank 0 prints one JSON line with the mean period over blocks of steps (the first block left out). Run alone (k = 1) it is the
reference; at k = cores it holds the node's shared caches and memory bandwidth, and beyond the cores
the time-slicing between busy processes (MPI's waits poll, so a waiting rank keeps its core busy, as in
a real step).

    argv: MODEL BATCH SECONDS
"""
import json
import sys
import time

import numpy as np
from mpi4py import MPI


def main(model_name, batch, budget):
    from pydtnn.sim import model_table
    comm = MPI.COMM_WORLD
    model = model_table.build(model_name)
    rng = np.random.default_rng(comm.Get_rank())
    x, y = model_table.random_batch(model, batch, rng)
    model.compute_gradients(x, y, "categorical_cross_entropy")          # warm-up: buffers, compiled kernels
    block = 4                     # steps per timed block: a time slice (ms) spans several small steps
    periods, t_start = [], time.perf_counter()
    comm.Barrier()
    while True:
        t0 = time.perf_counter()
        for _ in range(block):
            model.compute_gradients(x, y, "categorical_cross_entropy")
            comm.Barrier()
        periods.append((time.perf_counter() - t0) / block)
        more = len(periods) < 5 or (time.perf_counter() - t_start < budget and len(periods) < 100)
        if not comm.bcast(more, root=0):
            break
    if comm.Get_rank() == 0:
        print(json.dumps({"processes": comm.Get_size(), "batch": batch, "steps": block * len(periods),
                          "step_s": float(np.mean(periods[1:]))}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
