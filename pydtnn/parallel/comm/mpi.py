"""MPIComm: the communicator over MPI, through mpi4py's buffer methods (``Bcast``, ``Allreduce``,
``Iallreduce``, ``Allgather``).

Device arrays (CuPy) are staged through host memory by `to_host` / `from_host`, also for
``iallreduce_sum_``: the host copy is reduced, and the request's ``wait()`` copies the result back.
A sum of 16-bit floats (``--grad_compression``) goes through `half_sum`'s own MPI operation.
"""
from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.comm.base import Communicator, DoneRequest, as_values, check_gather_value, from_host, to_host
from pydtnn.parallel.comm.half_sum import half_sum_args, is_half
from pydtnn.parallel.runtime.shutdown import abort as abort_job, flush_output

__all__ = ["MPIComm"]


class _StagedRequest:
    """An MPI Iallreduce of a device array's host copy; ``wait()`` completes it and copies the result back
    into the device array (the MPI communicator's waitall/testall see the MPI request inside)."""

    def __init__(self, request, host: np.ndarray, array):
        self.request, self.host, self.array = request, host, array

    def finish(self):
        if self.array is not None:
            from_host(self.host, self.array)
            self.host = self.array = None

    def wait(self):
        self.request.Wait()
        self.finish()

    def test(self) -> bool:
        return self.array is None or bool(self.request.Test())


class MPIComm(Communicator):
    """MPI through mpi4py buffer methods; ``mpi_comm`` defaults to ``MPI.COMM_WORLD``."""

    kind = "mpi"

    def __init__(self, mpi_comm=None):
        try:
            with warnings.catch_warnings():
                # mpi4py's own multi-line warning about another MPI's mpiexec; `make_comm` says it in one
                warnings.filterwarnings("ignore", message="suspicious MPI execution environment")
                from mpi4py import MPI
        except (ImportError, RuntimeError, OSError) as e:      # mpi4py found no MPI library to load
            raise ConfigError(f"mpi4py cannot load an MPI library ({e}): load your cluster's MPI, or install "
                              f"one from PyPI with pip install 'pydtnn[mpich]'") from None
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self._rank = self.comm.Get_rank()
        self._size = self.comm.Get_size()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    # Blocking collectives work on any array: a non-contiguous or device array goes through a
    # contiguous host copy that is written back afterwards.
    def _staged(self, array):
        host = to_host(array)
        if not host.flags.c_contiguous:
            host = np.ascontiguousarray(host)
        return host

    def bcast_(self, array, root: int = 0):
        if not 0 <= root < self._size:
            raise ValueError(f"root {root} outside 0..{self._size - 1}")
        host = self._staged(array)
        self.comm.Bcast(host, root=root)
        return from_host(host, array)

    def _sum_args(self, host):
        """(buffer, op) of a SUM of ``host``: MPI's own SUM, or the 16-bit floats' (`half_sum`)."""
        return half_sum_args(self.MPI, host) if is_half(host) else (host, self.MPI.SUM)

    def allreduce_sum_(self, array):
        host = self._staged(array)
        self.comm.Allreduce(self.MPI.IN_PLACE, *self._sum_args(host))
        return from_host(host, array)

    def iallreduce_sum_(self, array):
        """In place, non-blocking. A device array is copied to the host now (its values must be final), the
        copy is reduced, and the request's ``wait()`` (or ``waitall``) writes the sum back."""
        if not array.flags.c_contiguous:
            raise TypeError("iallreduce_sum_ needs a C-contiguous array (it is reduced in place)")
        if array.size == 0:
            return DoneRequest()
        if isinstance(array, np.ndarray):
            return self.comm.Iallreduce(self.MPI.IN_PLACE, *self._sum_args(array))
        host = np.ascontiguousarray(to_host(array))
        return _StagedRequest(self.comm.Iallreduce(self.MPI.IN_PLACE, *self._sum_args(host)), host, array)

    def _mpi_requests(self, requests):
        return [r.request if isinstance(r, _StagedRequest) else r for r in requests
                if isinstance(r, (self.MPI.Request, _StagedRequest))]

    def waitall(self, requests: Sequence) -> None:
        mpi = self._mpi_requests(requests)
        if mpi:
            self.MPI.Request.Waitall(mpi)
        for r in requests:
            if isinstance(r, _StagedRequest):
                r.finish()

    def testall(self, requests: Sequence) -> bool:
        mpi = self._mpi_requests(requests)
        return bool(self.MPI.Request.Testall(mpi)) if mpi else True

    def allgather(self, value) -> np.ndarray:
        arr, scalar = check_gather_value(value)
        out = np.empty((self._size,) + arr.shape, dtype=arr.dtype)
        self.comm.Allgather(arr, out)
        return out[:, 0] if scalar else out

    def weighted_mean(self, values, weight: float):
        v, scalar = as_values(values)
        flat = v.reshape(-1)
        weight = float(weight)
        buf = np.empty(flat.size + 1, dtype=np.float64)
        if weight != 0:
            buf[:-1] = flat * weight
        else:
            buf[:-1] = 0.0   # a replica without samples contributes nothing (not even its NaNs)
        buf[-1] = weight
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        total = buf[-1]
        res = (buf[:-1] / total) if total != 0 else np.full(flat.size, np.nan)
        res = res.reshape(v.shape)
        return float(res) if scalar else res

    def any_true(self, flag) -> bool:
        buf = np.array([1 if flag else 0], dtype=np.int32)
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.MAX)
        return bool(buf[0])

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1):
        flush_output()
        abort_job(self.comm, int(code))

    def gather_object(self, obj, root: int = 0):
        return self.comm.gather(obj, root=root)

    def library(self) -> str:
        """The first line of the MPI library's version string (which MPI mpi4py loaded)."""
        return self.MPI.Get_library_version().strip().splitlines()[0]
