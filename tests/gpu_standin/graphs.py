"""Streams, CUDA graph capture and replay, and memory pools of the stand-in, with CuPy 14's API.

What a real capture does, so that graph bugs show on the host:
- Current stream: thread-local. `with stream:` makes it this thread's current stream (nesting restores;
  `stream.use()` sets it); without one it is the null (legacy) stream. CuPy operations, kernels without
  `stream=` and blocking copies go to it; a cuDNN execution goes to its handle's stream.
- Capture (`Stream.begin_capture()` ... `end_capture()` -> `Graph`): work the capturing thread issues on
  the capturing stream is RECORDED and NOT executed (kernels, CuPy operations that write memory, cuBLAS,
  cuDNN, NCCL, asynchronous pinned copies). A fresh result is computed once (reading only, to learn its
  shape) and then POISONED (NaN; bytes 0x5A for integers and booleans); its node recomputes it from the same
  memory at replay. Host values (Python scalars, kernel arguments, pinned memory's address) are baked.
- What a capture refuses, with CUDARuntimeError "cudaErrorStreamCaptureUnsupported" ("...Implicit" where
  the legacy stream is involved): a synchronization (device, stream, event), a blocking copy to the host
  (`get()`, `float()`, `item()`, repr...) or from pageable memory (`cupy.asarray(host)`, `set()`, host index
  arrays), an event recorded on the capturing stream, `get_elapsed_time`, a result shaped by device values
  (`nonzero`, boolean masks...); a wait for an event recorded before the capture: "...Isolation". A kernel
  the capturing thread issues on ANOTHER stream would run now, outside the graph: AssertionError. Each
  invalidates the capture: `end_capture` ends it all the same and raises "cudaErrorStreamCaptureInvalidated"
  (so does work issued into it meanwhile). Other threads run as usual (CuPy captures in relaxed mode),
  except that, as on a device, nothing may wait for the whole device or sync the capturing stream, and the
  legacy stream is unusable while a BLOCKING stream captures.
- Memory: a DeviceArray allocated by the capturing thread must come from a private `MemoryPool` (`with
  using_allocator(pool.malloc)`): the default pool (or raw cudaMalloc) would hand the graph's memory to other
  arrays after the capture. A pool that served a capture must not serve allocations outside one either.
  AssertionErrors.
- Counting (counters): a recorded node counts "captured" (name "kind:name"), never its own kind;
  `Graph.launch` counts one "graph_launch" and replays its nodes uncounted. Kernel and cuDNN nodes follow
  `counters.SETTINGS["execute"]` at replay (dry: outputs zeroed), CuPy operations always compute; a cuDNN
  node advances the device clock when it runs.
Simplifications: a graph keeps every array its nodes touch alive (a device would not: memory from the
default pool freed after the capture is not caught); one capture per thread; work issued on a stream
another thread captures, and events recorded inside a capture (fork/join), are refused as not modelled;
the capturing thread may not wait for streams or events unrelated to the capture, nor time events (CUDA's
relaxed mode would let it).
"""
from __future__ import annotations

import contextlib
import threading
import weakref

import numpy as np

from . import counters


class CUDARuntimeError(RuntimeError):
    """`cupy.cuda.runtime.CUDARuntimeError`; `status` names the cudaError_t."""

    def __init__(self, status: str, detail: str):
        self.status = status
        super().__init__(f"{status}: {detail} (stand-in)")


# ------------------------------------------------------------------------------------- current stream

_TLS = threading.local()        # .stream (None: the null stream), .saved (what `with` restores), .allocator


def current_stream():
    """This thread's current stream object, None for the null stream."""
    return getattr(_TLS, "stream", None)


def enter_stream(stream) -> None:
    _TLS.__dict__.setdefault("saved", []).append(current_stream())
    _TLS.stream = stream


def exit_stream() -> None:
    _TLS.stream = _TLS.saved.pop()


def use_stream(stream) -> None:
    _TLS.stream = stream


def _ptr(stream) -> int:
    """A stream's handle: None is this thread's current stream, an int is a handle already."""
    if stream is None:
        stream = current_stream()
        return 0 if stream is None else stream.ptr
    return stream if isinstance(stream, int) else stream.ptr


# -------------------------------------------------------------------------------------------- capture

class _Capture:
    def __init__(self, stream, mode):
        self.ptr, self.mode, self.thread = stream.ptr, mode, threading.get_ident()
        self.blocking = not getattr(stream, "non_blocking", False)
        self.nodes: list[tuple[str, object]] = []        # ("kind:name", thunk) in issue order
        self.invalid = None                             # why the capture was invalidated

    def record(self, kind, name, thunk) -> None:
        counters.record("captured", f"{kind}:{name}")
        self.nodes.append((f"{kind}:{name}", thunk))

    def fail(self, error):
        if self.invalid is None:
            self.invalid = str(error)
        return error


_CAPTURES: dict[int, _Capture] = {}     # stream handle -> its capture in progress
_LOCK = threading.Lock()


def _mine():
    """The capture this thread began (None when there is none: the common, fast case)."""
    if not _CAPTURES:
        return None
    me = threading.get_ident()
    return next((c for c in list(_CAPTURES.values()) if c.thread == me), None)


def capturing() -> bool:
    """Whether this thread has a capture in progress."""
    return _mine() is not None


def begin(stream, mode=None) -> None:
    """`Stream.begin_capture(mode)`."""
    if stream.ptr in (0, 1):
        raise RuntimeError("cannot capture on the default (legacy) stream")
    if mode not in (None, 0, 1, 2):
        raise ValueError(f"begin_capture: unknown capture mode {mode!r}")
    with _LOCK:
        if stream.ptr in _CAPTURES:
            raise CUDARuntimeError("cudaErrorIllegalState", f"stream {stream.ptr:#x} is capturing already")
        if _mine() is not None:
            raise AssertionError("stand-in: one capture at a time per thread is modelled")
        _CAPTURES[stream.ptr] = _Capture(stream, mode)


def is_capturing(stream) -> bool:
    return stream.ptr in _CAPTURES


def end(stream) -> Graph:
    """`Stream.end_capture()`: the graph, or CUDARuntimeError for a capture invalidated on the way (ended
    all the same, so that the caller can clean up)."""
    with _LOCK:
        cap = _CAPTURES.get(stream.ptr)
        if cap is None:
            raise CUDARuntimeError("cudaErrorIllegalState", f"end_capture: stream {stream.ptr:#x} is not capturing")
        if cap.thread != threading.get_ident():
            raise CUDARuntimeError("cudaErrorStreamCaptureWrongThread", "end_capture from another thread than "
                                   "the one that began the capture")
        del _CAPTURES[stream.ptr]
    if cap.invalid is not None:
        raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated", f"the capture was invalidated by: {cap.invalid}")
    return Graph(cap.nodes)


def _route(kind, name, stream, strict=True):
    """The capture that records work issued on `stream`, or None to run it now; raises where the work can
    go neither way. `strict`: work of this thread on another stream than its capture's is refused (a kernel
    there would run outside the graph); a copy may run there."""
    if not _CAPTURES:
        return None
    ptr, mine = _ptr(stream), _mine()
    target = _CAPTURES.get(ptr)
    if target is not None:
        if target is not mine:
            raise AssertionError(f"stand-in: {kind} {name} issued on stream {ptr:#x}, which another thread "
                                 "captures (not modelled)")
        if target.invalid is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated", f"{kind} {name} issued into a capture "
                                   f"invalidated by: {target.invalid}")
        return target
    if ptr == 0:
        _implicit(f"{kind} {name} on the legacy stream")
    if mine is not None and strict:
        raise mine.fail(AssertionError(
            f"stand-in: {kind} {name} issued on stream {ptr:#x} while this thread captures stream {mine.ptr:#x}: "
            "it would run now, outside the graph (make the capturing stream current: `with stream:`)"))
    return None


def _implicit(what):
    """The legacy stream synchronizes with blocking streams: illegal while one captures."""
    blocking = [c for c in list(_CAPTURES.values()) if c.blocking]
    if blocking:
        error = CUDARuntimeError("cudaErrorStreamCaptureImplicit", f"{what} while a blocking stream captures")
        for c in blocking:
            c.fail(error)
        raise error


def launch(kind, name, run, stream=None, count=True, strict=True):
    """Work that writes memory it is given (a kernel, an in-place operation, a copy), issued on `stream`
    (None: the current one): run now and counted as `kind` (unless `count` is False), or recorded by the
    capture of that stream. Returns what `run()` returns when it ran."""
    cap = _route(kind, name, stream, strict)
    if cap is None:
        if count:
            counters.record(kind, name)
        return run()
    cap.record(kind, name, run)
    return None


def fresh(kind, name, compute, inputs=(), launches=None, stream=None):
    """A CuPy operation whose `compute()` returns NumPy results. Eager: computed, counted as `kind` where
    `launches(result)` says it launches a kernel (None: always). Captured: results in memory none of
    `inputs` owns are poisoned and recomputed from the same inputs at replay; views are free."""
    if _mine() is None:
        result = compute()
        if launches is None or launches(result):
            _route(kind, name, stream)
            counters.record(kind, name)
        return result
    try:
        with np.errstate(all="ignore"):
            result = _materialize(compute())
    except Exception as e:
        e.add_note("stand-in: computed at capture only to learn the result's shape; what this capture "
                   "produced so far holds poison (NaN, 0x5A bytes) until the graph is launched")
        raise
    owned = {id(_root(a)) for a in _leaves(inputs)}
    leaves = list(_leaves(result))
    made = [i for i, r in enumerate(leaves) if id(_root(r)) not in owned]
    if not made:
        return result                       # a view of its inputs: no kernel
    cap = _route(kind, name, stream)
    for i in made:
        poison(leaves[i])

    def replay():
        again = list(_leaves(_materialize(compute())))
        for i in made:
            leaves[i][...] = again[i]
    cap.record(kind, name, replay)
    return result


NO_STREAM = -1      # forbid(stream=NO_STREAM): a wait tied to no stream (an event's, timing)


def forbid(what, stream=None, thread=True, device=False):
    """A call that cannot be part of a capture (a wait, a blocking copy, an event record): CUDARuntimeError
    where one meets it, invalidating that capture. `stream`: the stream it runs on (None: the current one,
    NO_STREAM: none); `thread`: refused on the capturing thread whatever the stream; `device`: waits for the
    whole device (refused while any stream captures)."""
    if not _CAPTURES:
        return
    ptr = _ptr(stream)
    met = list(_CAPTURES.values()) if device else [c for c in [_CAPTURES.get(ptr)] if c is not None]
    if not met and ptr == 0:
        _implicit(what)
    mine = _mine()
    if not met and thread and mine is not None:
        met = [mine]
    if met:
        code = "cudaErrorStreamCaptureImplicit" if ptr == 0 and not device else "cudaErrorStreamCaptureUnsupported"
        error = CUDARuntimeError(code, f"{what} during a stream capture")
        for c in met:
            c.fail(error)
        raise error


def waited(stream) -> None:
    """`stream.wait_event(event)`: an event from before a capture cannot order captured work."""
    cap = _CAPTURES.get(_ptr(stream)) if _CAPTURES else None
    if cap is not None:
        raise cap.fail(CUDARuntimeError("cudaErrorStreamCaptureIsolation", "the capturing stream waits for an "
                                        "event recorded outside the capture (a dependency across its boundary)"))


class Graph:
    """`cupy.cuda.Graph`: what a capture recorded; `launch` replays it in order on the same memory."""

    def __init__(self, nodes):
        self._nodes = list(nodes)
        self.kernels = [n for n, _ in self._nodes]      # "kind:name" of every node, in order (for tests)

    def launch(self, stream=None):
        """One "graph_launch" on `stream` (None: the current stream); recorded if that stream captures."""
        launch("graph_launch", "graph", self._replay, stream)

    def upload(self, stream=None):
        pass

    def _replay(self):
        for _, thunk in self._nodes:
            thunk()


def reset() -> list:
    """Captures left open dropped, this thread's stream and allocator back to the defaults (the end of a
    `gpu_standin.active()` block); returns the handles of the captures that were open."""
    with _LOCK:
        left = sorted(_CAPTURES)
        _CAPTURES.clear()
    _TLS.__dict__.clear()
    _PROCESS[0] = DEFAULT_POOL.malloc
    return left


# --------------------------------------------------------------------------------------- poison, leaves

POISON_BYTE = 0x5A


def poison(a: np.ndarray) -> None:
    """Fill with what no computation gives by chance: NaN, or bytes 0x5A for integers and booleans."""
    if a.dtype.kind in "fc":
        a[...] = np.nan
    else:
        np.copyto(a, np.frombuffer(bytes([POISON_BYTE]) * a.dtype.itemsize, dtype=a.dtype).reshape(()),
                  casting="no")


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _leaves(x):
    """The NumPy arrays in x (nested in tuples, lists and dicts)."""
    if isinstance(x, np.ndarray):
        yield x
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)


def _materialize(x):
    """NumPy scalars as 0-d arrays (what the device result is: memory a replay can write)."""
    if isinstance(x, np.generic):
        return np.array(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_materialize(v) for v in x)
    return x


# --------------------------------------------------------------------------------------------- memory

_ROUND = 512        # CuPy's pools round sizes up to this


class MemoryPool:
    """`cupy.cuda.MemoryPool`: bookkeeping of the memory it serves (which pool serves an allocation is
    `using_allocator`'s); a freed block stays cached until `free_all_blocks`."""

    def __init__(self, allocator=None):
        self._used, self._free = 0, []          # bytes held by live arrays; sizes of cached free blocks
        self._lock = threading.Lock()
        self.served_capture = False             # memory of a graph: never to serve outside a capture

    def malloc(self, size):
        """Device memory of `size` bytes from this pool (a MemoryPointer that keeps it alive)."""
        from . import device_memory
        a = np.empty(max(int(size), 1), np.uint8)
        _serve(self, a)
        device_memory._register(a)
        counters.record("alloc")
        ptr = device_memory.MemoryPointer(a.__array_interface__["data"][0])
        ptr.mem = a
        return ptr

    def _take(self, a: np.ndarray) -> None:
        size = -(-max(a.nbytes, 1) // _ROUND) * _ROUND
        with self._lock:
            if size in self._free:
                self._free.remove(size)
            self._used += size
        weakref.finalize(a, self._give_back, size)

    def _give_back(self, size):
        with self._lock:
            self._used -= size
            self._free.append(size)

    def used_bytes(self) -> int:
        return self._used

    def free_bytes(self) -> int:
        return sum(self._free)

    def total_bytes(self) -> int:
        return self._used + sum(self._free)

    def n_free_blocks(self) -> int:
        return len(self._free)

    def free_all_blocks(self, stream=None) -> None:
        forbid("MemoryPool.free_all_blocks (cudaFree waits for the device)", stream=NO_STREAM, device=True)
        with self._lock:
            self._free.clear()


DEFAULT_POOL = MemoryPool()     # what cupy.get_default_memory_pool() returns
_RAW = object()                 # using_allocator(None): cudaMalloc itself, no pool
_PROCESS = [DEFAULT_POOL.malloc]        # set_allocator's


@contextlib.contextmanager
def using_allocator(allocator=None):
    """`cupy.cuda.using_allocator`: this thread allocates with `allocator` inside the block (None: raw
    cudaMalloc, no pool)."""
    saved = getattr(_TLS, "allocator", None)
    _TLS.allocator = _RAW if allocator is None else allocator
    try:
        yield
    finally:
        _TLS.allocator = saved


def set_allocator(allocator=None) -> None:
    _PROCESS[0] = _RAW if allocator is None else allocator


def get_allocator():
    allocator = getattr(_TLS, "allocator", None) or _PROCESS[0]
    return None if allocator is _RAW else allocator


def allocated(a: np.ndarray) -> None:
    """A DeviceArray's fresh memory `a`: served by this thread's allocator (checked against captures)."""
    pool = getattr(get_allocator(), "__self__", None)
    _serve(pool if isinstance(pool, MemoryPool) else None, a)


def _serve(pool, a) -> None:
    mine = _mine()
    if mine is not None:
        if pool is None or pool is DEFAULT_POOL:
            raise mine.fail(AssertionError(
                "stand-in: allocation during capture from the default pool (or not from a MemoryPool): after "
                "the capture the pool could hand the graph's memory to other arrays (allocate inside "
                "`cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc)`)"))
        pool.served_capture = True
    elif pool is not None and pool.served_capture:
        raise AssertionError("stand-in: a MemoryPool that served a capture allocates outside any capture: it "
                             "could hand the graph's memory to other arrays")
    if pool is not None:
        pool._take(a)
