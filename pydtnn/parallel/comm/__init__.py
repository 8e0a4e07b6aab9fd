"""Communicators: one interface over no communication (serial), MPI (mpi4py) and NCCL.

    base.py        the `Communicator` interface (its methods are listed there) and the host staging of
                   device arrays (`to_host`, `from_host`)
    serial.py      `SerialComm`: one replica, every collective the identity
    mpi.py         `MPIComm`: mpi4py's buffer methods; device arrays staged through host memory
    nccl.py        `NCCLComm`: device buffers reduced where they are; host values through an inner MPIComm
    factory.py     `make_comm(kind)` and `COMM_KINDS` ("auto", "serial", "mpi", "nccl")
    agreement.py   `raise_together`, `agree_on_error`: an error met on some ranks is raised on all of them
    reducer.py     `BucketedReducer`: the gradient reduction overlapped with the backward pass
                   (``--non_blocking_mpi``)
    compression.py `GradCompression`: the weighted gradient reduced in 16 bits (``--grad_compression``), and
                   the bound on the error that costs
    half_sum.py    the SUM of 16-bit floats as an MPI operation (MPI has none)

The communicators import only `base` (MPIComm also `half_sum`; NCCLComm also `mpi`, which it goes through for
host values); the factory imports the kinds, NCCLComm only when asked for one, so a CPU-only install never
imports CuPy.
"""
from pydtnn.parallel.comm.agreement import agree_on_error, raise_together
from pydtnn.parallel.comm.base import Communicator, from_host, to_host
from pydtnn.parallel.comm.compression import GRAD_COMPRESSIONS, GradCompression
from pydtnn.parallel.comm.factory import COMM_KINDS, make_comm
from pydtnn.parallel.comm.mpi import MPIComm
from pydtnn.parallel.comm.reducer import DEFAULT_BUCKET_BYTES, BucketedReducer
from pydtnn.parallel.comm.serial import SerialComm

__all__ = ["Communicator", "SerialComm", "MPIComm", "BucketedReducer", "make_comm", "to_host", "from_host",
           "COMM_KINDS", "DEFAULT_BUCKET_BYTES", "raise_together", "agree_on_error", "GradCompression",
           "GRAD_COMPRESSIONS"]
