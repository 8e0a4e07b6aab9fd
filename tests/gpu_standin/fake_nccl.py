"""`cupy.cuda.nccl` of the stand-in, with CuPy 14's interface: `get_unique_id()` returns 128 `bytes`,
`NcclCommunicator(ndev, commId: bytes, rank)`; collectives take raw device pointers, a count, an NCCL
dtype and op and a stream pointer, and are checked against the stand-in's device allocations. With more
than one rank the reduction goes through MPI's COMM_WORLD (each test rank is one MPI process).
$PYDTNN_STANDIN_NCCL=missing imitates a CuPy without libnccl (`available = False`, as CuPy 14 sets it).
A collective goes to its stream through `graphs.launch` (uncounted): run now, or recorded by a capture of
that stream and run at each replay, as NCCL's collectives are captured on a device.
"""
from __future__ import annotations

import os
import types

import numpy as np

from . import device_memory, graphs

CALLS: list[tuple] = []


def _log_on_stream(name, stream):
    """Also in the CuPy stand-in's call log, in order with the events recorded and waited for."""
    from . import fake_cupy
    fake_cupy.CALLS.append(("nccl", name, int(stream)))

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_INT64 = 0, 1, 2, 4
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_BFLOAT16 = 9      # CuPy's cupy_backends/cuda/libs/nccl.pxd: ncclBfloat16 (NCCL >= 2.10)
NCCL_SUM = 0
_DTYPES = {NCCL_INT8: np.int8, NCCL_UINT8: np.uint8, NCCL_INT32: np.int32, NCCL_INT64: np.int64,
           NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
try:                   # CuPy 14 gives bf16 arrays ml_dtypes' dtype
    import ml_dtypes
    _DTYPES[NCCL_BFLOAT16] = ml_dtypes.bfloat16
except ImportError:
    pass


def _int(v, what):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(v).__name__}")
    return int(v)


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        if not isinstance(commId, bytes):
            raise TypeError(f"NcclCommunicator: commId must be bytes in CuPy 14, got {type(commId).__name__}")
        if len(commId) != 128:
            raise ValueError(f"NcclCommunicator: commId must be 128 bytes, got {len(commId)}")
        self.ndev, self.rank_ = _int(ndev, "ndev"), _int(rank, "rank")
        if not 0 <= self.rank_ < self.ndev:
            raise ValueError(f"rank {rank} outside 0..{ndev - 1}")
        CALLS.append(("init", self.ndev, self.rank_, commId))

    def _buffer(self, ptr, count, datatype, what):
        if datatype not in _DTYPES:
            raise ValueError(f"{what}: unknown NCCL datatype {datatype!r}")
        dtype = np.dtype(_DTYPES[datatype])
        count = _int(count, f"{what} count")
        owner = device_memory.dtype_at(ptr)
        if owner is not None and owner != dtype:
            raise AssertionError(f"{what}: NCCL datatype {dtype} on a device array of {owner}")
        return device_memory.find(_int(ptr, f"{what} pointer"), count * dtype.itemsize, what).view(dtype)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        _int(stream, "stream")
        if op != NCCL_SUM:
            raise ValueError(f"allReduce: the stand-in knows NCCL_SUM only, got {op!r}")
        send = self._buffer(sendbuf, count, datatype, "allReduce send")
        recv = self._buffer(recvbuf, count, datatype, "allReduce recv")
        CALLS.append(("allReduce", count, datatype))
        _log_on_stream("allReduce", stream)

        def run():
            if self.ndev > 1:
                from mpi4py import MPI
                from pydtnn.parallel.comm.half_sum import half_sum_args, is_half
                # NCCL adds 16-bit floats pairwise, each sum rounded to the format: as half_sum's MPI operation
                buffer, mpi_op = half_sum_args(MPI, recv) if is_half(recv) else (recv, MPI.SUM)
                if sendbuf != recvbuf:
                    recv[...] = send
                MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer, op=mpi_op)
            elif sendbuf != recvbuf:
                recv[...] = send
        graphs.launch("nccl", "allReduce", run, stream=int(stream), count=False)

    def bcast(self, buff, count, datatype, root, stream):
        _int(stream, "stream")
        buf = self._buffer(buff, count, datatype, "bcast")
        CALLS.append(("bcast", count, datatype, root))
        _log_on_stream("bcast", stream)
        if self.ndev > 1:
            from mpi4py import MPI
            root = _int(root, "root")
            graphs.launch("nccl", "bcast", lambda: MPI.COMM_WORLD.Bcast(buf, root=root), stream=int(stream),
                          count=False)

    def abort(self):
        CALLS.append(("abort",))

    def destroy(self):
        pass


def build_module():
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = os.environ.get("PYDTNN_STANDIN_NCCL") != "missing"
    for name, value in globals().items():
        if name.startswith("NCCL_"):
            setattr(nccl, name, value)
    if nccl.available:
        nccl.NcclCommunicator = NcclCommunicator
        nccl.get_unique_id = lambda: bytes(range(128))
        nccl.get_version = lambda: 22809
    return nccl
