"""Communicators: one interface over no communication (serial), MPI (mpi4py) and, later, NCCL.

Every communicator has

    rank, size                       this replica's index, number of replicas
    bcast_(array, root=0)            in place; returns ``array``
    allreduce_sum_(array)            in place (one blocking call); returns ``array``
    iallreduce_sum_(array)           in place, non-blocking; returns a request with ``wait()``
    waitall(requests) / testall(requests)
    allgather(value)                 float -> (P,) float64; 1-D array (same length everywhere) -> (P, n)
    weighted_mean(values, weight)    sum_i w_i v_i / sum_i w_i across replicas
    any_true(flag) -> bool           True on every rank when ``flag`` is true on any rank
    barrier(), abort(code)
    gather_object(obj, root=0)       pickled; for end-of-run reports only, never on a hot path

MPI goes through mpi4py's buffer methods (``Bcast``, ``Allreduce``, ``Iallreduce``, ``Allgather``). Device
arrays (CuPy) are staged through host memory by `to_host` / `from_host` in the MPI communicator (also for
``iallreduce_sum_``: the host copy is reduced, and ``wait()`` copies the result back); ``NCCLComm``
(parallel/nccl.py) reduces device buffers where they are.

`BucketedReducer` overlaps the gradient reduction with the backward pass (``--non_blocking_mpi``), over a
host buffer or a device buffer alike.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Sequence

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.runtime import environment as launcher

__all__ = ["Communicator", "SerialComm", "MPIComm", "BucketedReducer", "make_comm", "to_host", "from_host",
           "COMM_KINDS", "DEFAULT_BUCKET_BYTES", "raise_together", "agree_on_error"]

DEFAULT_BUCKET_BYTES = 1 << 20  # 1 MiB: ResNet-20 (~1 MB fp32) in 2 buckets, ResNet-50 (~100 MB) in ~100


# -------------------------------------------------------------------------------------- host staging

def to_host(array) -> np.ndarray:
    """A NumPy array holding ``array``'s values: the array itself for NumPy, a copy for CuPy-like
    arrays (anything with ``.get()``)."""
    if isinstance(array, np.ndarray):
        return array
    if hasattr(array, "get"):
        return array.get()
    return np.asarray(array)


def from_host(host: np.ndarray, out):
    """Write ``host`` back into ``out`` (no-op when ``out`` is that very NumPy array); returns ``out``."""
    if out is host:
        return out
    if isinstance(out, np.ndarray):
        out[...] = host
    elif hasattr(out, "set"):
        out.set(np.ascontiguousarray(host))
    else:
        out[...] = host
    return out


class _DoneRequest:
    """A request that has already completed (serial communicator, empty buffers)."""

    def wait(self):
        return None

    def test(self):
        return True


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


# ------------------------------------------------------------------------------------- the interface

class Communicator:
    """Base class: the interface every communicator implements (see the module docstring)."""

    kind = "base"

    @property
    def rank(self) -> int:
        raise NotImplementedError

    @property
    def size(self) -> int:
        raise NotImplementedError

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def bcast_(self, array, root: int = 0):
        raise NotImplementedError

    def allreduce_sum_(self, array):
        raise NotImplementedError

    def iallreduce_sum_(self, array):
        raise NotImplementedError

    def waitall(self, requests: Sequence) -> None:
        for r in requests:
            r.wait()

    def testall(self, requests: Sequence) -> bool:
        return all(r.test() for r in requests)

    def allgather(self, value) -> np.ndarray:
        raise NotImplementedError

    def weighted_mean(self, values, weight: float):
        raise NotImplementedError

    def any_true(self, flag) -> bool:
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def abort(self, code: int = 1):
        raise NotImplementedError

    def gather_object(self, obj, root: int = 0):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def _as_values(values):
    v = np.asarray(values, dtype=np.float64)
    return v, v.ndim == 0


def _check_gather_value(value):
    arr = np.asarray(value)
    if arr.ndim == 0:
        return np.asarray([float(arr)], dtype=np.float64), True
    if arr.ndim != 1:
        raise ValueError(f"allgather takes a number or a 1-D array, got shape {arr.shape}")
    return np.ascontiguousarray(arr), False


class SerialComm(Communicator):
    """One replica: rank 0 of 1; every collective is the identity."""

    kind = "serial"

    @property
    def rank(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return 1

    def bcast_(self, array, root: int = 0):
        if root != 0:
            raise ValueError(f"root {root} outside 0..0")
        return array

    def allreduce_sum_(self, array):
        return array

    def iallreduce_sum_(self, array):
        return _DoneRequest()

    def allgather(self, value) -> np.ndarray:
        arr, scalar = _check_gather_value(value)
        out = arr.copy()[None, ...]
        return out[:, 0] if scalar else out

    def weighted_mean(self, values, weight: float):
        v, scalar = _as_values(values)
        res = v.copy() if weight != 0 else np.full(v.shape, np.nan)
        return float(res) if scalar else res

    def any_true(self, flag) -> bool:
        return bool(flag)

    def barrier(self) -> None:
        return None

    def abort(self, code: int = 1):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - best effort before dying
                pass
        os._exit(int(code))

    def gather_object(self, obj, root: int = 0):
        return [obj]


class MPIComm(Communicator):
    """MPI through mpi4py buffer methods; ``mpi_comm`` defaults to ``MPI.COMM_WORLD``."""

    kind = "mpi"

    def __init__(self, mpi_comm=None):
        try:
            with warnings.catch_warnings():
                # mpi4py's own multi-line warning about another MPI's launcher; `make_comm` says it in one
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

    def allreduce_sum_(self, array):
        host = self._staged(array)
        self.comm.Allreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        return from_host(host, array)

    def iallreduce_sum_(self, array):
        """In place, non-blocking. A device array is copied to the host now (its values must be final), the
        copy is reduced, and the request's ``wait()`` (or ``waitall``) writes the sum back."""
        if not array.flags.c_contiguous:
            raise TypeError("iallreduce_sum_ needs a C-contiguous array (it is reduced in place)")
        if array.size == 0:
            return _DoneRequest()
        if isinstance(array, np.ndarray):
            return self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)
        host = np.ascontiguousarray(to_host(array))
        return _StagedRequest(self.comm.Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM), host, array)

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
        arr, scalar = _check_gather_value(value)
        out = np.empty((self._size,) + arr.shape, dtype=arr.dtype)
        self.comm.Allgather(arr, out)
        return out[:, 0] if scalar else out

    def weighted_mean(self, values, weight: float):
        v, scalar = _as_values(values)
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
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - best effort before dying
                pass
        from pydtnn.parallel.runtime.shutdown import abort
        abort(self.comm, int(code))

    def gather_object(self, obj, root: int = 0):
        return self.comm.gather(obj, root=root)

    def library(self) -> str:
        """The first line of the MPI library's version string (which MPI mpi4py loaded)."""
        return self.MPI.Get_library_version().strip().splitlines()[0]


def _make_nccl(**kwargs):
    # Imported here: a CPU-only install never imports CuPy. NCCLComm raises a one-line ConfigError where
    # CuPy, NCCL or a GPU is missing.
    from pydtnn.parallel.comm.nccl import NCCLComm
    return NCCLComm(**kwargs)


def _make_auto(**kwargs):
    # Under an MPI launcher, or when mpi4py was already initialized by the caller, use MPI if there is
    # more than one process; a plain `python script.py` never initializes MPI.
    if launcher.launched_by_mpi() or "mpi4py.MPI" in sys.modules:
        comm = MPIComm(**kwargs)
        expected = launcher.launcher_size()
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


def agree_on_error(comm: Communicator, error, elsewhere: str = "another rank met an error") -> None:
    """Every rank calls this at the same point with the PyDTNNError it met, or None. If any rank met one,
    every rank raises an error of the first failing rank's class: rank 0 (which prints) with that rank's
    message (prefixed "rank r: " when it is not rank 0's own), the others with their own or ``elsewhere``.
    One allgather when nothing failed; a gather of the messages only when something did."""
    from pydtnn.errors import ERROR_CLASSES, error_code
    codes = np.asarray(comm.allgather(float(error_code(error))))
    failing = np.flatnonzero(codes)
    if failing.size == 0:
        return
    first = int(failing[0])
    cls = ERROR_CLASSES[int(codes[first]) - 1]
    messages = comm.gather_object(None if error is None else str(error), root=0)
    if comm.rank == 0:
        raise error if first == 0 else cls(f"rank {first}: {messages[first]}")
    raise error if error is not None and type(error) is cls else cls(elsewhere)


def raise_together(comm: Communicator, work, elsewhere: str, *, rank0_only: bool = False):
    """Run ``work`` (on every rank, or with ``rank0_only`` on rank 0 alone, which writes or downloads) and
    return its result (None where it did not run). A PyDTNNError it raises on any rank is raised on every
    rank (`agree_on_error`), so that all ranks end together instead of some waiting in the next collective;
    ``work`` itself must not communicate."""
    from pydtnn.errors import PyDTNNError
    error = result = None
    if comm.rank == 0 or not rank0_only:
        try:
            result = work()
        except PyDTNNError as e:
            error = e
    if comm.size > 1:
        agree_on_error(comm, error, elsewhere)
    elif error is not None:
        raise error
    return result


def make_comm(kind: str = "auto", **kwargs) -> Communicator:
    """A communicator of ``kind``: ``"auto"`` (MPI when launched with more than one process, else
    serial), ``"serial"``, ``"mpi"`` (``mpi_comm=`` an mpi4py communicator) or ``"nccl"``."""
    try:
        factory = _FACTORIES[kind]
    except KeyError:
        raise ConfigError(f"communicator must be one of {', '.join(COMM_KINDS)}, got {kind!r}") from None
    return factory(**kwargs)


# ------------------------------------------------------------------------------- overlapped reduction

class BucketedReducer:
    """Sum-allreduce a flat gradient buffer in reverse-order buckets while backward is still running.

    Backward fills ``grad_buffer`` from its END towards its START (layers are stored in forward order).
    The buffer is cut, from the end, into buckets of ``bucket_bytes`` (the one at the start may be
    shorter): bucket k covers ``[max(0, n - (k+1)*e), n - k*e)`` with e = bucket_bytes // itemsize.

        reducer.start_step()        # before backward
        reducer.ready(lo)           # grad_buffer[lo:] is final: start every bucket it now covers
        reducer.finish()            # start what is left, wait for everything; the buffer is reduced

    The buffer may be a NumPy or a device array: buckets of a device buffer reduce on the device with
    NCCLComm, or through host copies with MPIComm (each bucket is copied out when it is started and back
    in ``finish()``).

    Buckets are always started in the same order (k = 0, 1, ...) on every rank, whatever the ``lo``
    values, so the sequence of collectives matches across ranks. With one replica nothing happens.

    With a ``timeline`` (--tracing) recording this step, each bucket is an `allreduce` event on the
    "gradient buckets" track, from its start to the end of its wait in ``finish()`` (the buckets are then
    waited for one by one, in the order started), with the bytes it reduced.
    """

    timeline = None

    def __init__(self, comm: Communicator, grad_buffer, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        # a NumPy or a device (CuPy) buffer: the communicator reduces either (MPI through host copies)
        if getattr(grad_buffer, "ndim", None) != 1 or not grad_buffer.flags.c_contiguous:
            raise TypeError("BucketedReducer needs a flat, C-contiguous gradient buffer")
        bucket_bytes = int(bucket_bytes)
        if bucket_bytes < 1:
            raise ConfigError(f"bucket size must be >= 1 byte, got {bucket_bytes}")
        self.comm = comm
        self.buffer = grad_buffer
        self.bucket_bytes = bucket_bytes
        n = grad_buffer.size
        elems = max(1, bucket_bytes // grad_buffer.itemsize)
        self.bounds: list[tuple[int, int]] = []
        hi = n
        while hi > 0:
            lo = max(0, hi - elems)
            self.bounds.append((lo, hi))
            hi = lo
        self._active = comm.size > 1
        self._requests: list = []
        self._next = 0
        self._started_at: list = []    # when each bucket in flight was started (tracing)
        self._covered = n

    @property
    def nbuckets(self) -> int:
        return len(self.bounds)

    @property
    def started(self) -> int:
        """How many buckets have been started in this step."""
        return self._next

    def start_step(self) -> None:
        if self._requests:
            raise RuntimeError("BucketedReducer.start_step() while reductions are in flight: call finish()")
        self._next = 0
        self._covered = self.buffer.size
        self._started_at = []

    def _start_until(self, covered: int) -> None:
        while self._next < len(self.bounds) and self.bounds[self._next][0] >= covered:
            lo, hi = self.bounds[self._next]
            if self._active:
                self._requests.append(self.comm.iallreduce_sum_(self.buffer[lo:hi]))
                if self.timeline is not None:
                    self._started_at.append(self.timeline.now())
            self._next += 1

    def ready(self, lo: int) -> None:
        """``grad_buffer[lo:]`` holds its final values for this step."""
        lo = max(0, int(lo))
        if lo >= self._covered:
            return
        self._covered = lo
        before = self._next
        self._start_until(lo)
        if self._requests and self._next == before:
            self.comm.testall(self._requests)   # let MPI progress the buckets already in flight

    def finish(self) -> np.ndarray:
        """Start the remaining buckets, wait for all of them; returns the reduced buffer."""
        self._covered = 0
        self._start_until(0)
        requests, self._requests = self._requests, []
        timeline = self.timeline
        if requests and timeline is not None and timeline.active:
            from pydtnn.observe.timeline import BUCKETS
            for k, (request, t) in enumerate(zip(requests, self._started_at)):
                self.comm.waitall([request])
                lo, hi = self.bounds[k]
                timeline.add(f"bucket {k}", t, timeline.now(), "allreduce", BUCKETS,
                             bytes=(hi - lo) * self.buffer.itemsize)
        elif requests:
            self.comm.waitall(requests)
        return self.buffer
