"""Building `mpiexec -n K python -m mpi4py script ...` command lines (experiments, tests).

The mpiexec beside this Python comes first (the `mpich` wheel installs one into the virtual environment),
then the one on PATH, so a system Open MPI works too. `python -m mpi4py` makes a rank that dies end the
whole job instead of leaving the others waiting in a collective.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pydtnn.errors import ConfigError


@functools.lru_cache(maxsize=None)
def find_mpiexec() -> str:
    local = Path(os.path.normpath(sys.executable)).parent / "mpiexec"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise ConfigError("no mpiexec beside the Python interpreter nor on PATH (pip install mpich)")
    return found


@functools.lru_cache(maxsize=None)
def is_open_mpi(mpiexec: str) -> bool:
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    text = out.stdout + out.stderr
    return "Open MPI" in text or "OpenRTE" in text or "open-mpi" in text.lower()


def _mpiexec_options(mpiexec: str) -> list[str]:
    if not is_open_mpi(mpiexec):
        return []
    options = ["--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        options.append("--allow-run-as-root")
    return options


def mpi_command(nprocs: int, script_path, args=()) -> list[str]:
    """The full command line. Open MPI also gets --oversubscribe (and --allow-run-as-root as root), and
    --bind-to none: pinned to one core each, ranks of a one-machine experiment cannot move away from other
    load on that core, which then shows up as noise in their compute and waiting times."""
    return mpmd_command([(nprocs, script_path, args)])


def mpmd_command(programs) -> list[str]:
    """One job of several programs (MPMD): ``[(nprocs, script_path, args), ...]`` become
    ``mpiexec -n K1 python -m mpi4py s1 args1 : -n K2 ...``; the ranks are numbered in that order."""
    mpiexec = find_mpiexec()
    cmd = [mpiexec, *_mpiexec_options(mpiexec)]
    for i, (nprocs, script_path, args) in enumerate(programs):
        if i:
            cmd.append(":")
        cmd += ["-n", str(int(nprocs)), os.path.normpath(sys.executable), "-m", "mpi4py", str(script_path),
                *map(str, args)]
    return cmd
