"""Rank 1 never joins the barrier: the job hangs until run_mpi's timeout kills it.

Usage: mpiexec -n K python -m mpi4py hang.py TOKEN   (TOKEN lets the test find leftover processes)
"""
import time

from pydtnn.parallel.comm import MPIComm

comm = MPIComm()
print(f"rank {comm.rank} started", flush=True)
if comm.rank == 1:
    time.sleep(3600)
comm.barrier()
