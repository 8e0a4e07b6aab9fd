"""Streams, CUDA graph capture and replay of the stand-in, as CuPy 14 and CUDA have them (its memory pools:
`memory_pools`).

Every rule here is a test in tests/backends/test_standin_graphs.py that names its source: CuPy v14.2.0's code
(cupy/_core/core.pyx, cupy/cuda/memory.pyx, cupy/cuda/stream.pyx, cupy_backends/cuda/api/runtime.pyx) and tests
(tests/cupy_tests/cuda_tests/test_graph.py), the CUDA Programming Guide's "CUDA Graphs" chapter ("Stream
Capture", "Cross-stream Dependencies and Events", "Prohibited and Unhandled Operations", "Invalidation"), the
CUDA Runtime API (cudaStreamBeginCapture, cudaThreadExchangeStreamCaptureMode).

Current stream: thread-local. `with stream:` makes it this thread's current stream (nesting restores;
`stream.use()` sets it); without one it is the null (legacy) stream. CuPy operations, kernels without
`stream=` and copies go to it; a cuDNN or cuBLAS call goes to its handle's stream.

Capture (`Stream.begin_capture(mode)` ... `end_capture()` -> `Graph`; mode None, CuPy's default, is relaxed):
- Work the capturing thread issues on a stream of the capture is RECORDED and NOT executed (kernels, CuPy
  operations that write memory, cuDNN, cuBLAS, NCCL). A fresh result is computed once (reading only, to
  learn its shape) and then POISONED (NaN; bytes 0x5A for integers and booleans); its node recomputes it from
  the same memory at replay. Host values (Python scalars, kernel arguments) are baked.
- CuPy's own guards raise before any CUDA call, and the capture stays valid: a copy to the host on a capturing
  stream (`get()`, `float()`, `int()`, `bool()`, `item()`, `tolist()`, repr, and what reads a count back:
  `nonzero`, boolean masks) raises RuntimeError "the current stream is capturing, so D2H transfers are
  disallowed"; a copy from the host (`set()`, `cupy.asarray`/`cupy.array` of a host array of one dimension or
  more, a host index array) "... H2D transfers ..."; `cupy.asarray` of a 0-d host value is a fill kernel
  (captured). The guard asks `cudaStreamIsCapturing`, which raises CUDARuntimeError
  "cudaErrorStreamCaptureImplicit" for the legacy stream while a BLOCKING stream captures (capture still
  valid), and RuntimeError "the stream was capturing, but an error has invalidated the capture sequence" once
  it is invalidated (`Stream.is_capturing()` too).
- CUDA refuses, and the capture is invalidated (`end_capture` ends it all the same and raises
  "cudaErrorStreamCaptureInvalidated"; work issued into it meanwhile raises that too): synchronizing a stream of
  the capture (CUDARuntimeError "cudaErrorStreamCaptureUnsupported") or querying it (`Stream.done` is False);
  synchronizing the device while any stream captures; synchronizing ("cudaErrorCapturedEvent"), querying
  (`Event.done` is False) or timing an event last recorded in a capture; a stream of the capture waiting for an
  event recorded outside it ("cudaErrorStreamCaptureIsolation"); any use of the legacy stream while a BLOCKING
  stream captures ("...Implicit"); a wait that would merge two captures ("...Merge").
- CUDA allows: recording an event on a stream of the capture (a captured event: no node, it orders the
  capture's streams); another stream waiting for a captured event joins the capture (a fork: what it is given
  is recorded into the same graph), and must be joined back before `end_capture` (the origin stream waits for
  an event recorded on it after its last work; else "cudaErrorStreamCaptureUnjoined"); `end_capture` on a
  forked stream raises "...Unmatched" and invalidates. In relaxed mode the capturing thread may wait for,
  query and time streams and events unrelated to the capture, and allocate (a pool miss is a cudaMalloc); in
  global or thread-local mode these "potentially unsafe" calls are refused ("...Unsupported", invalidating) on
  the capturing thread, and on every thread while a GLOBAL capture runs. `end_capture` from another thread than
  the one that began it is refused unless relaxed ("...WrongThread").
- The stand-in's own checks, AssertionError "stand-in: ..." (bugs a device would not report, not CUDA's
  refusals): a kernel the capturing thread issues on a stream outside the capture (it would run now, outside the
  graph); an allocation during the capture from the default pool or from no pool (the pool would hand the
  graph's memory to other arrays); a pool that served a capture allocating outside one; a replay that uses
  memory freed since the capture. For that last one every allocation a recorded node touches is remembered (the
  operands of CuPy operations, the pointers cuDNN, cuBLAS and NCCL are given, `.data` taken during the capture)
  and `Graph.launch` asks each `memory_pools.Block` whether it is lost: once no array holds it, it is back in
  its pool, which on a device hands it to other arrays that every replay then overwrites; only a pool that
  served a capture keeps such blocks for its graphs (until `free_all_blocks`).
- Counting (counters): a recorded node counts "captured" (name "kind:name"), never its own kind;
  `Graph.launch` counts one "graph_launch" and replays its nodes uncounted. Kernel, cuDNN and cuBLAS nodes
  follow `counters.SETTINGS["execute"]` at replay (dry: outputs zeroed), CuPy operations always compute; a
  cuDNN node advances the device clock when it runs.
Not modelled: `cupy.random` (the stand-in has none; CuPy refuses its RandomState draws, cuRAND, in a capture),
cuSOLVER and cuSPARSE, `MemoryPointer`'s synchronous copies, stream-ordered allocation (graph memory nodes),
`cudaThreadExchangeStreamCaptureMode`, host functions in graphs. Simplifications: one capture per thread;
work on a stream another thread captures, and a fork from another thread, are refused as not modelled, and so
is a wait for an event recorded in a capture that has ended; a RawKernel's arguments stay alive with the graph
that launched them (their freeing is not caught); a replay runs its nodes in issue order, whatever their stream.
"""
from __future__ import annotations

import threading

import numpy as np

from . import counters


class CUDARuntimeError(RuntimeError):
    """`cupy.cuda.runtime.CUDARuntimeError`; `status` names the cudaError_t."""

    def __init__(self, status: str, detail: str):
        self.status = status
        super().__init__(f"{status}: {detail} (stand-in)")


# ------------------------------------------------------------------------------------- current stream

_TLS = threading.local()        # .stream (None: the null stream), .saved (what `with` restores)


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

GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2         # cudaStreamCaptureMode


class _Capture:
    """One capture sequence: its origin stream and the streams forked into it, what it recorded, what memory
    its nodes use, and whether it was invalidated."""

    def __init__(self, stream, mode):
        self.ptr, self.mode, self.thread = stream.ptr, mode, threading.get_ident()
        self.relaxed = mode in (None, RELAXED)          # CuPy's begin_capture(mode=None) is relaxed
        self.blocking = not getattr(stream, "non_blocking", False)
        self.nodes: list[tuple[str, object]] = []        # ("kind:name", thunk) in issue order
        self.invalid = None                             # why the capture was invalidated
        self.active = True
        self.uses: dict[int, tuple[object, str]] = {}   # memory its nodes touch: id(block) -> (block, what)
        self.pending: list[tuple[object, str]] = []     # touched by work not yet recorded or run
        # the order among its streams: a clock ticks at each piece of work; per stream, the clock of its last
        # work (`last`) and, per stream, the latest work of that stream it has waited for (`seen`)
        self.clock = 0
        self.last = {self.ptr: 0}
        self.seen: dict[int, dict[int, int]] = {self.ptr: {}}

    def record(self, kind, name, thunk, ptr) -> None:
        counters.record("captured", f"{kind}:{name}")
        self.nodes.append((f"{kind}:{name}", thunk))
        self.tick(ptr)
        for block, what in self.pending:
            self.uses.setdefault(id(block), (block, f"{what} ({kind}:{name})"))
        self.pending.clear()

    def tick(self, ptr) -> None:
        self.clock += 1
        self.last[ptr] = self.clock

    def frontier(self, ptr) -> dict:
        """What an event recorded on stream `ptr` now orders: the work of each stream it follows."""
        return {**self.seen[ptr], ptr: self.last[ptr]}

    def follow(self, ptr, frontier) -> None:
        seen = self.seen.setdefault(ptr, {})
        for p, t in frontier.items():
            seen[p] = max(seen.get(p, -1), t)

    def unjoined(self) -> list:
        """Forked streams whose last work the origin stream has not waited for."""
        seen = self.seen[self.ptr]
        return [p for p, t in self.last.items() if p != self.ptr and seen.get(p, -1) < t]

    def fail(self, error):
        if self.invalid is None:
            self.invalid = str(error)
        return error


_CAPTURES: dict[int, _Capture] = {}     # handle of every stream in a capture (origin or forked) -> the capture
_LOCK = threading.Lock()


def thread_capture():
    """The capture this thread began (None when there is none: the common, fast case)."""
    if not _CAPTURES:
        return None
    me = threading.get_ident()
    return next((c for c in list(_CAPTURES.values()) if c.thread == me), None)


def capturing() -> bool:
    """Whether this thread has a capture in progress."""
    return thread_capture() is not None


def begin(stream, mode=None) -> None:
    """`Stream.begin_capture(mode)`."""
    if stream.ptr in (0, 1):
        raise RuntimeError("cannot capture on the default (legacy) stream")
    if mode not in (None, GLOBAL, THREAD_LOCAL, RELAXED):
        raise ValueError(f"begin_capture: unknown capture mode {mode!r}")
    with _LOCK:
        if stream.ptr in _CAPTURES:
            raise CUDARuntimeError("cudaErrorIllegalState", f"stream {stream.ptr:#x} is capturing already")
        if thread_capture() is not None:
            raise AssertionError("stand-in: one capture at a time per thread is modelled")
        _CAPTURES[stream.ptr] = _Capture(stream, mode)


def is_capturing(stream) -> bool:
    """Whether `stream` (anything with `.ptr`) is part of a capture; never raises (see `stream_is_capturing`)."""
    return stream.ptr in _CAPTURES


def stream_is_capturing(stream=None) -> bool:
    """CuPy's `runtime.streamIsCapturing(ptr)` (what `Stream.is_capturing()` and CuPy's transfer guards ask):
    the legacy stream while a blocking stream captures raises cudaErrorStreamCaptureImplicit without harming
    the capture; an invalidated capture raises RuntimeError."""
    if not _CAPTURES:
        return False
    ptr = _ptr(stream)
    if ptr == 0:
        if any(c.blocking for c in list(_CAPTURES.values())):
            raise CUDARuntimeError("cudaErrorStreamCaptureImplicit", "cudaStreamIsCapturing on the legacy stream "
                                   "while a blocking stream captures")
        return False
    cap = _CAPTURES.get(ptr)
    if cap is None:
        return False
    if cap.invalid is not None:
        raise RuntimeError("the stream was capturing, but an error has invalidated the capture sequence")
    return True


def refuse_transfer(direction: str, stream=None) -> None:
    """CuPy's guard in `MemoryPointer.copy_to_host_async` ("D2H") / `copy_from_host_async` ("H2D"): a copy
    on a capturing stream (None: the current one) raises before any CUDA call; the capture stays valid."""
    if _CAPTURES and stream_is_capturing(stream):
        raise RuntimeError(f"the current stream is capturing, so {direction} transfers are disallowed")


def end(stream) -> Graph:
    """`Stream.end_capture()`: the graph, or CUDARuntimeError for a capture invalidated on the way or left with
    a fork unjoined (ended all the same, so that the caller can clean up)."""
    with _LOCK:
        cap = _CAPTURES.get(stream.ptr)
        if cap is None:
            raise CUDARuntimeError("cudaErrorIllegalState", f"end_capture: stream {stream.ptr:#x} is not capturing")
        if cap.ptr != stream.ptr:
            raise cap.fail(CUDARuntimeError("cudaErrorStreamCaptureUnmatched", "end_capture on a stream forked into "
                                            "a capture, not the one that began it"))
        if not cap.relaxed and cap.thread != threading.get_ident():
            raise CUDARuntimeError("cudaErrorStreamCaptureWrongThread", "end_capture from another thread than "
                                   "the one that began the capture (not in relaxed mode)")
        for ptr in cap.last:
            del _CAPTURES[ptr]
        cap.active = False
    if cap.invalid is not None:
        raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated", f"the capture was invalidated by: {cap.invalid}")
    unjoined = cap.unjoined()
    if unjoined:
        raise CUDARuntimeError("cudaErrorStreamCaptureUnjoined", "stream(s) " + ", ".join(f"{p:#x}" for p in unjoined)
                               + " forked into the capture were not joined back to the stream that began it")
    return Graph(cap.nodes, cap.uses.values())


def _route(kind, name, stream, strict=True):
    """The capture that records work issued on `stream`, or None to run it now; raises where the work can
    go neither way. `strict`: work of this thread on another stream than its capture's is refused (a kernel
    there would run outside the graph); a copy may run there."""
    if not _CAPTURES:
        return None
    ptr, mine = _ptr(stream), thread_capture()
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
    if mine is not None:
        mine.pending.clear()                # that work runs now: what it touched is not the graph's
        if strict:
            raise mine.fail(AssertionError(
                f"stand-in: {kind} {name} issued on stream {ptr:#x} while this thread captures stream "
                f"{mine.ptr:#x}: it would run now, outside the graph (make the capturing stream current: "
                "`with stream:`)"))
    return None


def _implicit(what):
    """The legacy stream synchronizes with blocking streams: illegal while one captures."""
    blocking = [c for c in set(_CAPTURES.values()) if c.blocking]
    if blocking:
        error = CUDARuntimeError("cudaErrorStreamCaptureImplicit", f"{what} while a blocking stream captures")
        for c in blocking:
            c.fail(error)
        raise error


def launch(kind, name, run, stream=None, count=True, strict=True, uses=()):
    """Work that writes memory it is given (a kernel, an in-place operation, a copy), issued on `stream`
    (None: the current one): run now and counted as `kind` (unless `count` is False), or recorded by the
    capture of that stream. `uses`: the device memory (NumPy arrays) it reads or writes, besides pointers
    already looked up (`device_memory.find`). Returns what `run()` returns when it ran."""
    cap = _route(kind, name, stream, strict)
    if cap is None:
        if count:
            counters.record(kind, name)
        return run()
    note_uses(uses, "an operand")
    cap.record(kind, name, run, _ptr(stream))
    return None


def fresh(kind, name, compute, inputs=(), launches=None, stream=None):
    """A CuPy operation whose `compute()` returns NumPy results. Eager: computed, counted as `kind` where
    `launches(result)` says it launches a kernel (None: always). Captured: results in memory none of
    `inputs` owns are poisoned and recomputed from the same inputs at replay; views are free."""
    if thread_capture() is None:
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
    leaves_in = list(_leaves(inputs))
    owned = {id(_root(a)) for a in leaves_in}
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
    note_uses(leaves_in, "an operand")
    cap.record(kind, name, replay, _ptr(stream))
    return result


def note_uses(arrays, what) -> None:
    """Device memory (NumPy arrays, or views of it) that the work this thread issues next reads or writes:
    remembered by its capture if that work is recorded (`Graph.launch` checks it is still held)."""
    cap = thread_capture()
    if cap is None:
        return
    from .device_memory import block_of
    for a in arrays:
        block = block_of(a)
        if block is not None:
            cap.pending.append((block, what))


# ------------------------------------------------------------------------------------ waits and events

def wait_device(what) -> None:
    """A wait for the whole device (`cudaDeviceSynchronize`, a cudaFree): invalid while any stream captures
    ("a device or context handle when any associated stream is in capture mode")."""
    if _CAPTURES:
        error = CUDARuntimeError("cudaErrorStreamCaptureUnsupported", f"{what} during a stream capture")
        for c in set(_CAPTURES.values()):
            c.fail(error)
        raise error


def wait_stream(stream, what) -> None:
    """`Stream.synchronize()`: invalid on a stream of a capture; elsewhere only a potentially unsafe call."""
    if not _CAPTURES:
        return
    cap = _CAPTURES.get(_ptr(stream))
    if cap is not None:
        raise cap.fail(CUDARuntimeError("cudaErrorStreamCaptureUnsupported", f"{what} of a capturing stream"))
    if _ptr(stream) == 0:
        _implicit(what)
    unsafe(what)


def stream_done(stream) -> bool:
    """`Stream.done` (`cudaStreamQuery(...) == cudaSuccess`): CuPy returns the status without raising, so a
    query CUDA refuses reads False, and the capture it concerns is invalidated."""
    if not _CAPTURES:
        return True
    cap = _CAPTURES.get(_ptr(stream))
    if cap is not None:
        cap.fail(CUDARuntimeError("cudaErrorStreamCaptureUnsupported", "Stream.done of a capturing stream"))
        return False
    try:
        if _ptr(stream) == 0:
            _implicit("Stream.done of the legacy stream")
        unsafe("Stream.done")
    except CUDARuntimeError:
        return False
    return True


def record_event(event, stream) -> None:
    """`Event.record(stream)`: on a stream of a capture the event becomes a captured event (no node: what it
    orders is the capture's work so far on that stream); elsewhere it is an ordinary event."""
    event.captured, event.frontier = None, None
    if not _CAPTURES:
        return
    ptr = _ptr(stream)
    cap = _CAPTURES.get(ptr)
    if cap is None:
        if ptr == 0:
            _implicit("Event.record on the legacy stream")
        return
    if cap is not thread_capture():
        raise AssertionError("stand-in: an event recorded on a stream another thread captures (not modelled)")
    if cap.invalid is not None:
        raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated", f"Event.record into a capture invalidated by: "
                               f"{cap.invalid}")
    event.captured, event.frontier = cap, cap.frontier(ptr)


def stream_waits(stream, event) -> None:
    """`stream.wait_event(event)`: for a captured event, a stream outside the capture joins it (a fork) and a
    stream of the capture follows it (a join); for an event recorded outside any capture, a stream of a
    capture cannot wait (the dependency would cross the capture's boundary)."""
    src = event.captured
    if not _CAPTURES and src is None:
        return
    ptr = _ptr(stream)
    target = _CAPTURES.get(ptr)
    if src is not None:
        if not src.active:
            raise AssertionError("stand-in: a wait for an event last recorded in a capture that has ended "
                                 "(not modelled)")
        if src.invalid is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureInvalidated", f"a wait for an event of a capture "
                                   f"invalidated by: {src.invalid}")
        if target is None:
            if ptr == 0 or src is not thread_capture():
                raise AssertionError("stand-in: the legacy stream, or another thread, joining a capture (not "
                                     "modelled)")
            with _LOCK:
                _CAPTURES[ptr] = src                        # forked: what the stream is given is recorded
            src.blocking = src.blocking or not getattr(stream, "non_blocking", False)
            src.seen[ptr] = {}
            src.follow(ptr, event.frontier)
            src.tick(ptr)
        elif target is src:
            src.follow(ptr, event.frontier)
        else:
            error = CUDARuntimeError("cudaErrorStreamCaptureMerge", "a wait that would merge two captures")
            src.fail(error)
            raise target.fail(error)
        return
    if target is not None:
        raise target.fail(CUDARuntimeError("cudaErrorStreamCaptureIsolation", "a stream of a capture waits for "
                                           "an event recorded outside it (a dependency across its boundary)"))
    if ptr == 0:
        _implicit("a wait of the legacy stream")


def _captured_event(event, what):
    """The error for `what` on an event last recorded in a capture, that capture invalidated if still on."""
    error = CUDARuntimeError("cudaErrorCapturedEvent", f"{what} of an event last recorded in a capture")
    if event.captured.active:
        event.captured.fail(error)
    return error


def wait_event(event, what) -> None:
    """`Event.synchronize()`: invalid on a captured event; otherwise only a potentially unsafe call."""
    if getattr(event, "captured", None) is not None:
        raise _captured_event(event, what)
    if _CAPTURES:
        unsafe(what)


def event_done(event) -> bool:
    """`Event.done` (`cudaEventQuery(...) == cudaSuccess`): False where CUDA refuses the query (CuPy does not
    raise), the capture concerned invalidated."""
    if getattr(event, "captured", None) is not None:
        _captured_event(event, "Event.done")
        return False
    try:
        if _CAPTURES:
            unsafe("Event.done")
    except CUDARuntimeError:
        return False
    return True


def time_events(start, end) -> None:
    """`cupy.cuda.get_elapsed_time`: captured events have no time."""
    for e in (start, end):
        if getattr(e, "captured", None) is not None:
            raise _captured_event(e, "get_elapsed_time")


def unsafe(what) -> None:
    """A "potentially unsafe" call (cudaMalloc, a wait or query that is not the capture's): refused, and the
    capture invalidated, on the thread of a capture begun in global or thread-local mode, and on every thread
    while one in global mode runs (cudaThreadExchangeStreamCaptureMode); relaxed mode allows it."""
    if not _CAPTURES:
        return
    me = threading.get_ident()
    met = [c for c in set(_CAPTURES.values())
           if (c.thread == me and not c.relaxed) or (c.thread != me and c.mode == GLOBAL)]
    if met:
        error = CUDARuntimeError("cudaErrorStreamCaptureUnsupported", f"{what} (a potentially unsafe call) during a "
                                 "stream capture not in relaxed mode")
        for c in met:
            c.fail(error)
        raise error


class Graph:
    """`cupy.cuda.Graph`: what a capture recorded; `launch` replays it in order on the same memory."""

    def __init__(self, nodes, uses=()):
        self._nodes = list(nodes)
        self._uses = list(uses)                         # (block, what) of the memory its nodes touch
        self.kernels = [n for n, _ in self._nodes]      # "kind:name" of every node, in order (for tests)

    def launch(self, stream=None):
        """One "graph_launch" on `stream` (None: the current stream); recorded if that stream captures."""
        launch("graph_launch", "graph", self._replay, stream)

    def upload(self, stream=None):
        pass

    def _replay(self):
        for block, what in self._uses:
            lost = block.lost()
            if lost:
                raise AssertionError(
                    f"stand-in: a replay of this graph uses {what}: {block.nbytes} bytes at {block.address:#x}, "
                    f"{lost} since the capture; on a device that memory now belongs to whatever the pool gave it to "
                    "next, and every replay overwrites it (keep every buffer a graph uses alive as long as the graph)")
        for _, thunk in self._nodes:
            thunk()


def reset() -> list:
    """Captures left open dropped, this thread's stream and allocator back to the defaults (the end of a
    `gpu_standin.active()` block); returns the handles of the captures that were open."""
    with _LOCK:
        left = sorted(c.ptr for c in set(_CAPTURES.values()))
        for c in set(_CAPTURES.values()):
            c.active = False
        _CAPTURES.clear()
    _TLS.__dict__.clear()
    from . import memory_pools                  # (it imports this module)
    memory_pools.reset()
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
