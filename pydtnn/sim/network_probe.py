"""Ping-pong and Allreduce sweeps, 4 KB .. 64 MB (run under mpiexec by `pydtnn.sim.calibrate`).

Rank 0 prints one JSON line: sizes (bytes), one-way ping-pong seconds between ranks 0 and 1, Allreduce
seconds (the slowest rank's median), and the number of processes. Each size is repeated until about its
share of the time budget (argv[1] seconds) is spent, at least 3 and at most 200 times; medians resist
the other jobs of a shared machine.
"""
import json
import sys
import time

import numpy as np
from mpi4py import MPI

SIZES = [4096 * 4 ** k for k in range(8)]          # 4 KB, 16 KB, ..., 64 MB


def main(budget):
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    share = budget / (2 * len(SIZES))
    pingpong, allreduce = [], []
    for n in SIZES:
        buf = np.ones(n // 4, np.float32)
        out = np.empty_like(buf)
        for kind, results in (("pp", pingpong), ("ar", allreduce)):
            times, t_start = [], time.perf_counter()
            while True:
                comm.Barrier()
                t0 = time.perf_counter()
                if kind == "ar":
                    comm.Allreduce(buf, out, op=MPI.SUM)
                elif rank == 0:
                    comm.Send(buf, dest=1)
                    comm.Recv(out, source=1)
                elif rank == 1:
                    comm.Recv(out, source=0)
                    comm.Send(buf, dest=0)
                dt = time.perf_counter() - t0
                times.append(dt / 2 if kind == "pp" else dt)
                more = len(times) < 3 or (time.perf_counter() - t_start < share and len(times) < 200)
                if not comm.bcast(more, root=0):
                    break
            med = float(np.median(times))
            results.append(comm.allreduce(med, op=MPI.MAX) if kind == "ar" else med)
    if rank == 0:
        print(json.dumps({"sizes": SIZES, "pingpong_s": pingpong, "allreduce_s": allreduce, "processes": size}))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0)
