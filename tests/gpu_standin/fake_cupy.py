"""The part of CuPy that PyDTNN's GPU backend and NCCL communicator use, standing in on the host.

`build_modules()` returns {module name: module} for sys.modules: `cupy`, `cupy.cuda`, `cupy.cuda.runtime`,
`cupy.cuda.nccl`. Array functions are NumPy's, taking and
returning `DeviceArray`s; creation functions copy host data (device memory never aliases a host array; a 0-d
host value is a fill kernel, as in CuPy's `_array_default`); every other function refuses host arrays as CuPy
does. Deliberately absent: `cupy.random` (the backend
must not depend on it: its state cannot be checkpointed) and `ElementwiseKernel` (all kernels are
RawModule source, which the stand-in compiles). The number of devices is $PYDTNN_STANDIN_DEVICES
(default 1); device i has PCI bus id 0000:0i:00.0.
Streams (thread-local current stream, `with stream:`), events and stream capture into `cupy.cuda.Graph`
are `graphs`' (see there what a capture refuses and allows); memory pools and `cupy.cuda.using_allocator`
are `memory_pools`'.
"""
from __future__ import annotations

import os
import types

import numpy as np

from . import counters, fake_nccl, graphs, memory_pools
from .device_memory import DeviceArray, count_h2d, device_call, refuse_host, to_base, wrap
from .host_kernels import RawModule

VERSION = "14.2.0"          # the CuPy the device machine has; parallel/nccl.py reads the major
CALLS: list[tuple] = []     # synchronizations and event records, for tests


def _device_count() -> int:
    return int(os.environ.get("PYDTNN_STANDIN_DEVICES", "1"))


class _State:
    current_device = 0


# ------------------------------------------------------------------------------------------ arrays

def _to_device(a, dtype=None, order="K", ndmin=0):
    """A fresh device copy of host data (or a device array, converted only when needed). As CuPy's
    `_array_default` (cupy/_core/core.pyx): a 0-d host value is a fill kernel with the value baked in, anything
    else a host-to-device copy (refused on a capturing stream)."""
    if isinstance(a, DeviceArray):
        return a if dtype is None or a.dtype == np.dtype(dtype) else a.astype(dtype)
    host = np.array(a, dtype=dtype, order=order, copy=True, ndmin=ndmin)
    if host.ndim == 0:
        device = DeviceArray(host.shape, host.dtype)
        device.fill(host[()])
        return device
    count_h2d(host)
    return wrap(host)


def asarray(a, dtype=None, order=None, *, blocking=False):
    return _to_device(a, dtype)


def array(a, dtype=None, copy=True, order="K", ndmin=0, *, blocking=False):
    if not isinstance(a, DeviceArray):
        return _to_device(a, dtype, order, ndmin)
    src = to_base(a)
    return wrap(graphs.fresh("launch", "copy", lambda: np.array(src, dtype=dtype, copy=True, order=order, ndmin=ndmin),
                             (src,)))


def ascontiguousarray(a, dtype=None):
    if isinstance(a, DeviceArray):
        if a.flags.c_contiguous and a.ndim >= 1 and (dtype is None or np.dtype(dtype) == a.dtype):
            return a                            # as CuPy: the same object, no copy
        src = to_base(a)
        return wrap(graphs.fresh("launch", "copy", lambda: np.ascontiguousarray(src, dtype=dtype), (src,)))
    return _to_device(np.ascontiguousarray(a, dtype=dtype))


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    if isinstance(a, DeviceArray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    return np.asarray(a, order=order)


def _numpy_function(name):
    f = getattr(np, name)

    def device_function(*args, **kwargs):
        refuse_host(f"cupy.{name}", args + tuple(kwargs.values()))
        return device_call(name, f, args, kwargs)
    device_function.__name__ = name
    return device_function


# ------------------------------------------------------------------------------ cuBLAS through CuPy

_CUBLAS_DTYPES = "efdFD"       # other dtypes: CuPy's own kernels (cupy/_core/_routines_linalg.pyx)
_VECTOR_PRODUCTS = {"dot", "matmul", "inner", "__matmul__", "__rmatmul__", "__imatmul__"}


def cublas_product(name, operands) -> bool:
    """Whether CuPy runs product `name` of `operands` (NumPy arrays: the device memory) through cuBLAS; raises
    as CuPy does where it would while the current stream captures.

    CuPy's products reach cuBLAS through cupy_backends/cuda/libs/cublas.pyx: setStream (CuPy v14.2.0), which
    every BLAS wrapper calls with the CURRENT stream and which raises NotImplementedError while that stream
    captures, before any CUDA work: the capture stays valid (an invalidated one raises streamIsCapturing's
    RuntimeError instead). Not cuBLAS (cupy/_core/_routines_linalg.pyx):
    integer and boolean products, a size-0 operand (`out.fill(0)`), vector . vector
    (`_tensordot_core_mul_sum`), and `vdot` (two flattened vectors)."""
    arrays = [o for o in operands if isinstance(o, np.ndarray)]
    if len(arrays) < 2 or np.result_type(*arrays).char not in _CUBLAS_DTYPES or any(a.size == 0 for a in arrays):
        return False
    if name == "vdot" or (name in _VECTOR_PRODUCTS and all(a.ndim == 1 for a in arrays)):
        return False
    if graphs.stream_is_capturing(get_current_stream()):          # CuPy's runtime.streamIsCapturing
        raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
    return True


# --------------------------------------------------------------------------------------- cupy.cuda

class Device:
    def __init__(self, device=None):
        self.id = _State.current_device if device is None else int(device)
        if not 0 <= self.id < _device_count():
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id} (stand-in)")

    def use(self):
        _State.current_device = self.id

    def __enter__(self):
        self._previous = _State.current_device
        self.use()
        return self

    def __exit__(self, *exc):
        _State.current_device = self._previous

    def synchronize(self):
        graphs.wait_device("Device.synchronize")
        counters.record("sync")
        CALLS.append(("synchronize", self.id))

    @property
    def pci_bus_id(self) -> str:
        return f"0000:{self.id:02X}:00.0"

    @property
    def compute_capability(self) -> str:
        return "90"


class _Clock:
    """The stand-in's device clock (ms): advanced by what the cuDNN stand-in executes, read by events."""
    now_ms = 0.0


def advance_clock(ms: float) -> None:
    _Clock.now_ms += float(ms)


class Stream:
    """`cupy.cuda.Stream`; `with stream:` makes it this thread's current stream (`Stream.null`: the legacy
    stream, current by default; `ptds=True`: the per-thread default stream, handle 2)."""
    _next_ptr = 0x5000
    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False):
        Stream._next_ptr += 0x10
        self.ptr = 0 if null else 2 if ptds else Stream._next_ptr
        self.non_blocking = bool(non_blocking) and not (null or ptds)
        self.device_id = _State.current_device

    def __enter__(self):
        graphs.enter_stream(self)
        return self

    def __exit__(self, *exc):
        graphs.exit_stream()

    def use(self):
        graphs.use_stream(self)
        return self

    def synchronize(self):
        graphs.wait_stream(self, "Stream.synchronize")
        counters.record("sync")
        CALLS.append(("stream_synchronize", self.ptr))

    @property
    def done(self):
        return graphs.stream_done(self)

    def wait_event(self, event):
        if not isinstance(event, Event):
            raise TypeError(f"Stream.wait_event takes an Event, got {type(event).__name__}")
        if not event.recorded:
            raise AssertionError("Stream.wait_event on an event never recorded (the wait orders nothing)")
        graphs.stream_waits(self, event)
        CALLS.append(("wait_event", self.ptr, id(event)))

    def begin_capture(self, mode=None):
        graphs.begin(self, mode)

    def end_capture(self):
        return graphs.end(self)

    def is_capturing(self):
        return graphs.stream_is_capturing(self)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self.recorded = False
        self.time_ms = None
        self.captured, self.frontier = None, None       # the capture it was last recorded in (graphs)

    def record(self, stream=None):
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"Event.record takes a Stream, got {type(stream).__name__}")
        stream = stream or get_current_stream()
        graphs.record_event(self, stream)
        self.recorded = True
        self.time_ms = _Clock.now_ms
        self.launched = counters.LAUNCHED[0]        # its place in the queue
        CALLS.append(("record", stream.ptr, id(self)))

    def synchronize(self):
        graphs.wait_event(self, "Event.synchronize")
        # kernels launched after this event's record: the wait leaves them queued (the device keeps working)
        queued = self.recorded and counters.LAUNCHED[0] > self.launched
        counters.record("sync_queued" if queued else "sync")

    @property
    def done(self):
        return graphs.event_done(self)


_NULL_STREAM = Stream.null = Stream(null=True)


def get_current_stream(device=None):
    return graphs.current_stream() or _NULL_STREAM


def get_elapsed_time(start, end):
    graphs.time_events(start, end)
    for e in (start, end):
        if not e.recorded or e.disable_timing:
            raise RuntimeError("get_elapsed_time needs two recorded events with timing (stand-in)")
    return end.time_ms - start.time_ms


def _runtime_module():
    rt = types.ModuleType("cupy.cuda.runtime")
    rt.getDeviceCount = _device_count
    def device_synchronize():
        graphs.wait_device("cudaDeviceSynchronize")
        counters.record("sync")
        CALLS.append(("deviceSynchronize",))
    rt.deviceSynchronize = device_synchronize
    rt.CUDARuntimeError = graphs.CUDARuntimeError
    rt.streamIsCapturing = graphs.stream_is_capturing       # takes a stream's handle
    rt.streamCaptureModeGlobal, rt.streamCaptureModeThreadLocal, rt.streamCaptureModeRelaxed = 0, 1, 2
    rt.streamLegacy, rt.streamPerThread = 1, 2
    rt.runtimeGetVersion = lambda: 13000
    rt.driverGetVersion = lambda: 13000
    rt.getDeviceProperties = lambda i: {"name": b"stand-in (host)", "uuid": bytes([int(i)] * 16),
                                        "multiProcessorCount": 132, "totalGlobalMem": 1 << 34}
    return rt


# -------------------------------------------------------------------------------------- the module

_CREATION = ("empty", "zeros", "ones", "full", "arange", "linspace", "eye", "identity")
_LIKE = ("empty_like", "zeros_like", "ones_like", "full_like")


class _CupyModule(types.ModuleType):
    """`cupy`: named functions here, else NumPy's function of that name on device arrays."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("random", "ElementwiseKernel", "ReductionKernel", "RawKernel", "fuse"):
            raise AttributeError(f"the CuPy stand-in has no cupy.{name} (the backend does not rely on it)")
        value = getattr(np, name, None)
        if value is None:
            raise AttributeError(f"module 'cupy' (stand-in) has no attribute {name!r}")
        if isinstance(value, (type, np.dtype, float, int)):
            return value                       # dtypes (cupy.float32), constants (cupy.pi)
        if callable(value) and not isinstance(value, types.ModuleType):
            fn = _numpy_function(name)
            setattr(self, name, fn)
            return fn
        raise AttributeError(f"module 'cupy' (stand-in) has no attribute {name!r}")


def _zeroed(a):
    a[...] = 0
    return a


def build_modules() -> dict:
    cupy = _CupyModule("cupy", __doc__)
    cupy.__version__ = VERSION
    cupy.__standin__ = True
    cupy.ndarray = DeviceArray
    cupy.asarray, cupy.array, cupy.ascontiguousarray, cupy.asnumpy = asarray, array, ascontiguousarray, asnumpy
    cupy.RawModule = RawModule
    cupy.get_default_memory_pool = lambda: memory_pools.DEFAULT_POOL
    for name in _CREATION + _LIKE:
        setattr(cupy, name, _numpy_function(name))

    def get_array_module(*arrays):
        return cupy if any(isinstance(a, DeviceArray) for a in arrays) else np
    cupy.get_array_module = get_array_module

    cuda = types.ModuleType("cupy.cuda")
    cuda.Device, cuda.Stream, cuda.Event = Device, Stream, Event
    cuda.get_current_stream, cuda.get_elapsed_time = get_current_stream, get_elapsed_time
    cuda.Graph, cuda.MemoryPool = graphs.Graph, memory_pools.MemoryPool
    cuda.using_allocator, cuda.set_allocator = memory_pools.using_allocator, memory_pools.set_allocator
    cuda.get_allocator = memory_pools.get_allocator
    cuda.graph = types.ModuleType("cupy.cuda.graph")
    cuda.graph.Graph = graphs.Graph
    cuda.runtime = _runtime_module()
    cuda.nccl = fake_nccl.build_module()
    cupy.cuda = cuda

    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = counters.empty_pinned
    cupyx.zeros_pinned = lambda shape, dtype=float, order="C": _zeroed(counters.empty_pinned(shape, dtype, order))
    return {"cupyx": cupyx, "cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": cuda.runtime, "cupy.cuda.nccl": cuda.nccl,
            "cupy.cuda.graph": cuda.graph}
