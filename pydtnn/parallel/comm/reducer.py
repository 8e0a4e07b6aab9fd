"""BucketedReducer: the gradient reduction overlapped with the backward pass (``--non_blocking_mpi``), over a
host buffer or a device buffer alike."""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.observe.timeline import BUCKETS
from pydtnn.parallel.comm.base import Communicator
from pydtnn.parallel.comm.compression import GradCompression

__all__ = ["BucketedReducer", "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 1 << 20  # 1 MiB: ResNet-20 (~1 MB fp32) in 2 buckets, ResNet-50 (~100 MB) in ~100


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

    With a ``compression`` (--grad_compression fp16 or bf16: `pydtnn.parallel.comm.compression`) each bucket is
    cast to the 16-bit format when it is started, reduced so, and cast back in ``finish()``; the buckets cut
    the buffer where they would without it (``bucket_bytes`` of the model's dtype), each sending 2 bytes an
    element.

    With a ``timeline`` (--tracing) recording this step, each bucket is an `allreduce` event on the
    "gradient buckets" track, from its start to the end of its wait in ``finish()`` (the buckets are then
    waited for one by one, in the order started), with the bytes it sent.
    """

    timeline = None

    def __init__(self, comm: Communicator, grad_buffer, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 compression: GradCompression | None = None):
        # a NumPy or a device (CuPy) buffer: the communicator reduces either (MPI through host copies)
        if getattr(grad_buffer, "ndim", None) != 1 or not grad_buffer.flags.c_contiguous:
            raise TypeError("BucketedReducer needs a flat, C-contiguous gradient buffer")
        bucket_bytes = int(bucket_bytes)
        if bucket_bytes < 1:
            raise ConfigError(f"bucket size must be >= 1 byte, got {bucket_bytes}")
        self.comm = comm
        self.buffer = grad_buffer
        self.bucket_bytes = bucket_bytes
        self.compression = compression if compression is not None else GradCompression("none")
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
        self._wires: list = []         # what each bucket in flight reduces (itself, or its 16-bit copy)
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
                request, wire = self.compression.iallreduce_sum_(self.comm, self.buffer[lo:hi])
                self._requests.append(request)
                self._wires.append(wire)
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
        wires, self._wires = self._wires, []
        timeline = self.timeline
        if requests and timeline is not None and timeline.active:
            for k, (request, t) in enumerate(zip(requests, self._started_at)):
                self.comm.waitall([request])
                timeline.add(f"bucket {k}", t, timeline.now(), "allreduce", BUCKETS,
                             bytes=self.compression.wire_nbytes(wires[k]))
        elif requests:
            self.comm.waitall(requests)
        if self.compression.active:        # the 16-bit sums back into the buffer
            for (lo, hi), wire in zip(self.bounds, wires):
                self.compression.unpack(wire, self.buffer[lo:hi])
        return self.buffer
