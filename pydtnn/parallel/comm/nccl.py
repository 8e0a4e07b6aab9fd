"""NCCLComm: the communicator interface over NCCL (`cupy.cuda.nccl`) for replicas that all run on GPUs.

- CuPy buffers are reduced / broadcast by NCCL, in place, all on ONE stream of the communicator's (so NCCL
  collectives run in the order they are issued, on every rank), ordered against CuPy's current stream by
  events both ways: a collective first waits for the work queued so far on the current stream; a blocking
  call (`allreduce_sum_`, `bcast_`) then makes the current stream wait for it, so later work on that
  stream, and any copy to the host, sees the result.
- `iallreduce_sum_` returns a request whose `wait()` synchronizes with its collective (so gradient buckets
  reduce while backward goes on, as `BucketedReducer` does with `--non_blocking_mpi`).
- Host values (NumPy arrays, numbers) and everything that is not a hot path (allgather, weighted_mean,
  any_true, barrier, gather_object) go through an inner `MPIComm`.
- Set-up, so that every rank ends with the same one-line ConfigError when it cannot start, instead of some
  ranks waiting for the others in a collective: each rank chooses its device (the local rank's, made
  current FIRST: `pydtnn.backends.gpu.device.use_device`) and checks CuPy's NCCL; then, through the MPI
  communicator, the ranks agree on the outcome (an allgather of error messages); then they compare their
  devices (host name + PCI bus id) and refuse to start when two share one; then rank 0 creates the NCCL
  unique id (`bytes` in CuPy >= 14, a tuple of ints before) and broadcasts it with its outcome, and every
  rank joins. A failure inside NCCL's own initialization is raised by the rank that saw it (the others are
  inside NCCL then, where no agreement can reach them: the job's error handling ends them).
- CuPy 14 imports `cupy.cuda.nccl` even without libnccl and sets `nccl.available = False`: that is a
  one-line ConfigError here, not an AttributeError later.

NCCL allows one rank per GPU: replicas that share a GPU, or mix GPUs and CPUs, reduce through MPI.

NOT RUN ON HARDWARE: written on a machine without a GPU; only the ConfigError path runs here.
"""
from __future__ import annotations

import socket
from typing import Sequence

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.comm.base import Communicator
from pydtnn.parallel.comm.mpi import MPIComm

NCCL_HINT = ("the NCCL communicator needs the GPU backend (CuPy with cupy.cuda.nccl, and an NVIDIA GPU): "
             "pip install '.[gpu]'")
_UNIQUE_ID_BYTES = 128       # NCCL_UNIQUE_ID_BYTES


def unique_id_to_bytes(uid) -> bytes:
    """NCCL's unique id as 128 bytes: CuPy >= 14 returns bytes, older CuPy a tuple of (signed) chars."""
    raw = bytes(uid) if isinstance(uid, (bytes, bytearray)) else bytes((int(v) & 0xFF) for v in uid)
    if len(raw) != _UNIQUE_ID_BYTES:
        raise RuntimeError(f"NCCL unique id has {len(raw)} bytes, expected {_UNIQUE_ID_BYTES}")
    return raw


def unique_id_for_cupy(raw: bytes, cupy_version: str):
    """The id as `NcclCommunicator` takes it: bytes in CuPy >= 14, a tuple of signed chars before."""
    major = int(str(cupy_version).split(".")[0])
    if major >= 14:
        return bytes(raw)
    return tuple(int(v) for v in np.frombuffer(raw, dtype=np.int8))


def shared_devices(identities) -> list[tuple[list[int], object]]:
    """[(ranks, identity)] for every device identity that more than one rank holds."""
    ranks = {}
    for rank, ident in enumerate(identities):
        ranks.setdefault(tuple(ident) if isinstance(ident, list) else ident, []).append(rank)
    return [(r, ident) for ident, r in ranks.items() if len(r) > 1]


def _bfloat16():
    """ml_dtypes' bfloat16, the dtype CuPy 14 gives bf16 arrays; None without ml_dtypes."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def _device_identity(cupy, device: int):
    """(host, PCI bus id) of `device`: equal for two ranks exactly when they would share one GPU."""
    try:
        bus = str(cupy.cuda.Device(device).pci_bus_id)
    except Exception:  # noqa: BLE001 - a CuPy without pci_bus_id: the device's UUID is as unique
        bus = bytes(cupy.cuda.runtime.getDeviceProperties(device)["uuid"]).hex()
    return (socket.gethostname(), bus.lower())


class _NCCLRequest:
    """An iallreduce in flight on the communicator's NCCL stream (`event` None: nothing to reduce)."""

    def __init__(self, event, array):
        self.event, self.array = event, array       # the array stays alive until the reduction is done

    def wait(self):
        if self.event is not None:
            self.event.synchronize()
        self.array = None

    def test(self) -> bool:
        return self.event is None or bool(self.event.done)


class NCCLComm(Communicator):
    kind = "nccl"

    def __init__(self, mpi_comm=None, device=None):
        opened, why = None, None
        try:
            opened = self._open(device)
        except ConfigError as e:
            why = str(e)
        try:
            self.mpi = MPIComm(mpi_comm)
        except ConfigError:
            if why:
                raise ConfigError(why) from None       # this rank's own reason first (no MPI to agree through)
            raise
        self._agree(why)
        self.cp, self.device, self.nccl = opened
        self._refuse_shared_gpus()
        self.comm = self._join()
        self.stream = self.cp.cuda.Stream(non_blocking=True)      # every NCCL collective runs here
        nccl = self.nccl
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                       np.dtype(np.float16): nccl.NCCL_FLOAT16, np.dtype(np.int32): nccl.NCCL_INT32,
                       np.dtype(np.int64): nccl.NCCL_INT64, np.dtype(np.uint8): nccl.NCCL_UINT8,
                       np.dtype(np.int8): nccl.NCCL_INT8}
        bf16 = _bfloat16()        # ncclBfloat16 (NCCL >= 2.10; CuPy's NCCL_BFLOAT16) for ml_dtypes' bfloat16
        if bf16 is not None and hasattr(nccl, "NCCL_BFLOAT16"):
            self._types[bf16] = nccl.NCCL_BFLOAT16

    @staticmethod
    def _open(device):
        """(cupy, device index, cupy.cuda.nccl) for this rank, its device chosen and made current; a one-line
        ConfigError where CuPy, a GPU or NCCL is missing."""
        from pydtnn.backends.gpu.device import GPU_HINT, use_device
        try:
            cupy, index = use_device(device)           # select the device before creating anything
            from cupy.cuda import nccl
        except ConfigError as e:
            raise ConfigError(str(e).replace(GPU_HINT, NCCL_HINT)) from None
        except ImportError as e:
            raise ConfigError(f"{NCCL_HINT} ({' '.join(str(e).split())})") from None
        if not getattr(nccl, "available", True):
            raise ConfigError(f"{NCCL_HINT} (this CuPy finds no libnccl: pip install nvidia-nccl-cu13, or -cu12 "
                              "for CUDA 12)")
        return cupy, index, nccl

    def _agree(self, why):
        """Every rank raises the same ConfigError when any rank has a reason not to go on (`why`)."""
        reasons = self.mpi.comm.allgather(why)
        failed = [r for r, m in enumerate(reasons) if m]
        if not failed:
            return
        message = reasons[failed[0]]
        if self.mpi.size > 1:
            ranks = ", ".join(map(str, failed))
            message = f"{message} (NCCL set-up failed on rank{'s' if len(failed) > 1 else ''} {ranks} of {self.mpi.size})"
        raise ConfigError(message)

    def _join(self):
        """Rank 0 creates the NCCL unique id and broadcasts it with its outcome; every rank joins."""
        uid, why = None, None
        if self.mpi.rank == 0:
            try:
                uid = unique_id_to_bytes(self.nccl.get_unique_id())
            except Exception as e:  # noqa: BLE001 - NCCL's bootstrap (network, library): one line everywhere
                why = f"NCCL could not create its unique id on rank 0: {' '.join(f'{type(e).__name__}: {e}'.split())}"
        uid, why = self.mpi.comm.bcast((uid, why), root=0)
        if why:
            raise ConfigError(why)
        try:
            return self.nccl.NcclCommunicator(self.mpi.size, unique_id_for_cupy(uid, self.cp.__version__),
                                              self.mpi.rank)
        except Exception as e:  # noqa: BLE001 - e.g. a CUDA error on this rank's device
            raise ConfigError(f"NCCL initialization failed on rank {self.mpi.rank}: "
                              f"{' '.join(f'{type(e).__name__}: {e}'.split())}") from None

    def _refuse_shared_gpus(self):
        """Every rank raises the same ConfigError when two ranks would share a GPU (NCCL would end in
        "Duplicate GPU detected" after the ranks have hung in its set-up)."""
        shared = shared_devices(self.mpi.comm.allgather(_device_identity(self.cp, self.device)))
        if shared:
            ranks, (host, bus) = shared[0]
            raise ConfigError(f"NCCL needs one GPU per rank, but ranks {', '.join(map(str, ranks))} share the GPU "
                              f"at PCI bus {bus} on {host}: run one rank per GPU, or drop --enable_nccl (MPI "
                              "then reduces through host buffers)")

    @property
    def rank(self) -> int:
        return self.mpi.rank

    @property
    def size(self) -> int:
        return self.mpi.size

    # --- device buffers -----------------------------------------------------------------------------
    def _on_device(self, array) -> bool:
        return isinstance(array, self.cp.ndarray)

    def _nccl_type(self, array):
        try:
            return self._types[array.dtype]
        except KeyError:
            raise TypeError(f"NCCL cannot reduce arrays of dtype {array.dtype}") from None

    def _collective(self, fn, blocking):
        """Run `fn(stream pointer)` on the NCCL stream after the work queued on the current stream; returns
        the event recorded after it (the current stream waits for it when `blocking`)."""
        current = self.cp.cuda.get_current_stream()
        ready = self.cp.cuda.Event(disable_timing=True)
        ready.record(current)
        self.stream.wait_event(ready)
        fn(self.stream.ptr)
        done = self.cp.cuda.Event(disable_timing=True)
        done.record(self.stream)
        if blocking:
            current.wait_event(done)
        return done

    def bcast_(self, array, root: int = 0):
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} outside 0..{self.size - 1}")
        if not self._on_device(array):
            return self.mpi.bcast_(array, root=root)
        buf = array if array.flags.c_contiguous else self.cp.ascontiguousarray(array)
        if buf.size:
            kind = self._nccl_type(buf)
            self._collective(lambda s: self.comm.bcast(buf.data.ptr, buf.size, kind, root, s), blocking=True)
        if buf is not array:
            array[...] = buf
        return array

    def allreduce_sum_(self, array):
        if not self._on_device(array):
            return self.mpi.allreduce_sum_(array)
        buf = array if array.flags.c_contiguous else self.cp.ascontiguousarray(array)
        if buf.size:
            kind = self._nccl_type(buf)
            self._collective(lambda s: self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, kind,
                                                           self.nccl.NCCL_SUM, s), blocking=True)
        if buf is not array:
            array[...] = buf
        return array

    def iallreduce_sum_(self, array):
        if not self._on_device(array):
            return self.mpi.iallreduce_sum_(array)
        if not array.flags.c_contiguous:
            raise TypeError("iallreduce_sum_ needs a C-contiguous array (it is reduced in place)")
        if not array.size:
            return _NCCLRequest(None, array)
        kind = self._nccl_type(array)
        done = self._collective(lambda s: self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, kind,
                                                              self.nccl.NCCL_SUM, s), blocking=False)
        return _NCCLRequest(done, array)

    def waitall(self, requests: Sequence) -> None:
        for r in requests:
            r.Wait() if hasattr(r, "Wait") else r.wait()

    def testall(self, requests: Sequence) -> bool:
        return all(bool(r.Test()) if hasattr(r, "Test") else r.test() for r in requests)

    # --- host values: MPI ---------------------------------------------------------------------------
    def allgather(self, value) -> np.ndarray:
        return self.mpi.allgather(value)

    def weighted_mean(self, values, weight: float):
        return self.mpi.weighted_mean(values, weight)

    def any_true(self, flag) -> bool:
        return self.mpi.any_true(flag)

    def barrier(self) -> None:
        self.stream.synchronize()
        self.cp.cuda.get_current_stream().synchronize()
        self.mpi.barrier()

    def abort(self, code: int = 1):
        try:
            self.comm.abort()
        except Exception:  # noqa: BLE001 - best effort before MPI_Abort
            pass
        self.mpi.abort(code)

    def gather_object(self, obj, root: int = 0):
        return self.mpi.gather_object(obj, root=root)
