"""Threads per replica: by default, the node's cores shared among the ranks on that node.

OpenBLAS starts as many threads as the machine has cores, in every process. With P ranks on one node
that is P times too many: they fight for the same cores, and timings, speed probes and dynamic balancing
turn to noise. So unless the user chose (``--threads_per_replica``, or a thread variable in the
environment), each rank takes the cores it may run on divided by the ranks that share them, at least 1.
The CPU backend's kernels follow OpenBLAS's thread count, so one limit sets both.
"""
from __future__ import annotations

import os

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> set[int]:
    """The cores this process may run on (its affinity mask: mpiexec's binding or a cgroup shows here)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def node_core_sets(comm) -> list[set[int]]:
    """The usable cores of every rank on this node (this rank's alone without MPI)."""
    mine = usable_cores()
    mpi_comm = getattr(comm, "comm", None)
    if getattr(comm, "kind", "") != "mpi" or mpi_comm is None:
        return [mine]
    node = mpi_comm.Split_type(comm.MPI.COMM_TYPE_SHARED)
    try:
        return [set(s) for s in node.allgather(sorted(mine))]
    finally:
        node.Free()


def default_threads(core_sets: list[set[int]], mine: set[int]) -> int:
    """Ranks bound to cores of their own keep them; ranks that share cores split them evenly."""
    shared = set().union(*core_sets)
    return max(1, min(len(mine), len(shared) // len(core_sets)))


def choose_threads(flag: int | None, comm) -> tuple[int | None, str]:
    """(threads to set, why). None: leave the count alone, it was the user's choice through a variable.
    A collective: every rank takes part whatever it chose (ranks may be started with different choices)."""
    sets = node_core_sets(comm)
    if flag:
        return flag, "--threads_per_replica"
    for var in THREAD_VARS:
        if os.environ.get(var, "").strip():
            return None, f"{var}={os.environ[var].strip()}"
    n = default_threads(sets, usable_cores())
    return n, f"default: {len(set().union(*sets))} cores / {len(sets)} rank(s) on this node"


def apply_threads(flag: int | None, comm) -> tuple[int, str]:
    """Set the BLAS (and so the kernels') thread count of this rank; returns (count in force, why)."""
    n, why = choose_threads(flag, comm)
    from threadpoolctl import threadpool_info, threadpool_limits
    if n is not None:
        threadpool_limits(n)
    counts = [pool["num_threads"] for pool in threadpool_info() if pool.get("user_api") == "blas"]
    return (counts[0] if counts else (n or 1)), why
