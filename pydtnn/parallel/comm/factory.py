"""make_comm: the communicator a run asks for by name (``COMM_KINDS``)."""
from __future__ import annotations

import sys

from pydtnn.errors import ConfigError
from pydtnn.parallel.comm.base import Communicator
from pydtnn.parallel.comm.mpi import MPIComm
from pydtnn.parallel.comm.serial import SerialComm
from pydtnn.parallel.runtime import environment

__all__ = ["make_comm", "COMM_KINDS"]


def _make_nccl(**kwargs):
    # Imported here: a CPU-only install never imports CuPy. NCCLComm raises a one-line ConfigError where
    # CuPy, NCCL or a GPU is missing.
    from pydtnn.parallel.comm.nccl import NCCLComm
    return NCCLComm(**kwargs)


def _make_auto(**kwargs):
    # Under mpiexec (or srun), or when mpi4py was already initialized by the caller, use MPI if there is
    # more than one process; a plain `python script.py` never initializes MPI.
    if environment.launched_by_mpi() or "mpi4py.MPI" in sys.modules:
        comm = MPIComm(**kwargs)
        expected = environment.launcher_size()
        if comm.size == 1 and (expected or 1) > 1:
            raise ConfigError(f"the launcher started {expected} processes but mpi4py sees a world of 1 "
                              f"({comm.library()}): mpiexec and mpi4py use different MPIs; launch with the "
                              f"mpiexec of the MPI that mpi4py loads")
        if comm.size > 1:
            return comm
    return SerialComm()


_FACTORIES = {
    "auto": _make_auto,
    "serial": lambda **kw: SerialComm(),
    "mpi": lambda **kw: MPIComm(**kw),
    "nccl": _make_nccl,
}
COMM_KINDS = tuple(_FACTORIES)


def make_comm(kind: str = "auto", **kwargs) -> Communicator:
    """A communicator of ``kind``: ``"auto"`` (MPI when launched with more than one process, else
    serial), ``"serial"``, ``"mpi"`` (``mpi_comm=`` an mpi4py communicator) or ``"nccl"``."""
    try:
        factory = _FACTORIES[kind]
    except KeyError:
        raise ConfigError(f"communicator must be one of {', '.join(COMM_KINDS)}, got {kind!r}") from None
    return factory(**kwargs)
