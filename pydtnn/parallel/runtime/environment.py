"""What this process's environment says about the MPI job it belongs to, read before (or without) MPI.

The programs that start MPI jobs (mpiexec, srun) export the rank and the job size to every process they
start: Hydra (MPICH, Intel MPI) sets PMI_RANK / PMI_SIZE, Open MPI sets OMPI_COMM_WORLD_RANK / _SIZE, PMIx
process managers PMIX_RANK, MVAPICH MV2_COMM_WORLD_*, and srun SLURM_PROCID / SLURM_STEP_NUM_TASKS. Reading
them lets a mistake found before MPI starts be printed by rank 0 alone, and lets us notice an mpi4py bound
to a different MPI than the mpiexec that started the job (it would see a world of 1 in every process: N
silent sequential runs). In `launcher_rank` and `launcher_size`, "launcher" means that mpiexec or srun.
"""
from __future__ import annotations

import os

RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "PALS_RANKID")
SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
OTHER_MARKERS = ("HYDI_CONTROL_FD", "PMI_FD", "PMIX_NAMESPACE", "MPI_LOCALNRANKS")


def _int_var(names) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _in_slurm_step() -> bool:
    # Inside an sbatch script SLURM_PROCID is 0 and SLURM_NTASKS is the allocation: only a job step
    # started by srun (a numeric step id below Slurm's reserved batch/extern ids) is a launch.
    step = os.environ.get("SLURM_STEP_ID", "")
    return step.isdigit() and int(step) < 0xFFFFFFF0


def launcher_rank() -> int | None:
    """This process's rank as mpiexec (or srun) numbered it, or None when it was not started by one."""
    rank = _int_var(RANK_VARS)
    if rank is None and _in_slurm_step():
        rank = _int_var(("SLURM_PROCID",))
    return rank


def launcher_size() -> int | None:
    """How many processes mpiexec (or srun) started, or None when the environment does not say."""
    size = _int_var(SIZE_VARS)
    if size is None and _in_slurm_step():
        size = _int_var(("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    return size


def launched_by_mpi() -> bool:
    """Started by mpiexec or srun (even as a job of a single process)."""
    return (launcher_rank() is not None or launcher_size() is not None
            or any(k in os.environ for k in OTHER_MARKERS))


def launched_with_many_processes() -> bool:
    return (launcher_size() or 1) > 1
