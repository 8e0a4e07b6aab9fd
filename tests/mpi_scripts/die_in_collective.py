"""Rank 1 dies while the other ranks wait in a collective; the whole job must end, non-zero.

Usage: mpiexec -n K python -m mpi4py die_in_collective.py MODE   (MODE: exit | sigkill | raise)
"""
import os
import signal
import sys
import time

import numpy as np

from pydtnn.parallel.comm import MPIComm

mode = sys.argv[1]
comm = MPIComm()
buf = np.ones(1 << 16, dtype=np.float32)
comm.allreduce_sum_(buf)                      # everybody is alive and connected
print(f"rank {comm.rank} ready", flush=True)
if comm.rank == 1:
    time.sleep(0.5)                           # let the others block in the next collective
    if mode == "exit":
        os._exit(1)
    elif mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "raise":
        raise RuntimeError("rank 1 failed on purpose")
    raise SystemExit(f"unknown mode {mode}")
for _ in range(1000):                         # would hang forever without a dead-rank abort
    comm.allreduce_sum_(buf)
print(f"rank {comm.rank} was not stopped", flush=True)
